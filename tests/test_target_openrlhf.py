"""OpenRLHF through its adapter: the experience maker's `get_advantages_and_returns`, called unbound
from the wheel at each pin, the score placed by OpenRLHF's own `compute_reward`, judged by the oracle.

The verdicts asserted here were derived by reading OpenRLHF's code (identical in 0.3.6.post1 and
0.11.2 for the padded path):

* `values = action_mask * values; rewards = action_mask * rewards`, then a plain GAE loop over
  every position: the `dense` contract. Finite poison is multiplied away (the seed case gives the
  fixed numbers [0.95, 1.0]); NaN * 0 is NaN, so non-finite poison leaks.
* `compute_reward` puts the score at the last action-mask token (`eos_indices`), so an observation
  tail never loses it.
* The outputs are not multiplied by the mask: in a gap, A carries the later advantage (masked-zero
  fails; nothing in OpenRLHF documents otherwise). No whitening inside the function.

Release pins download wheels (network marker).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math

import pytest
import torch

from maskfuzz.fuzz.engine import fuzz_target
from maskfuzz.oracles.case import Case
from maskfuzz.oracles.kinds.dispatch import judge
from maskfuzz.oracles.strategies import Sizes
from maskfuzz.targets.adapters.base import NotPresent
from maskfuzz.targets.openrlhf import calls as openrlhf_calls
from maskfuzz.targets.openrlhf import declare as openrlhf
from maskfuzz.targets.runtime.session import SetupError, open_target

NEWEST, OLDEST = "0.11.2", "0.3.6.post1"
DECLARED = openrlhf.SPEC.declared()

SEED = Case.build(trainable=[[1, 1, 0]], token_rewards=[[0, 1, 0]], values=[[0, 0, 100]], gamma=1.0, lam=0.95)
GAP = Case.build(trainable=[[1, 0, 0, 1]], values=[[0.5, 9, 9, 0.25]], score=[1.0], gamma=0.9, lam=0.8)  # example 2
OBS_TAIL = Case.build(trainable=[[1, 1, 1, 0, 0]], attention=[[1, 1, 1, 1, 1]], score=[1.0], gamma=0.0, lam=0.9)


def verdicts(run, case: Case, declared=DECLARED, only=None) -> dict:
    return {v.property: v for v in judge(run, case, declared, only=only)}


@contextlib.contextmanager
def opened(ref: str):
    """open_target, skipping (with the reason) when the package index cannot be reached."""
    try:
        with open_target(ref) as h:
            yield h
    except SetupError as exc:
        if "no network" in str(exc) or "cannot reach" in str(exc):
            pytest.skip(f"{ref}: {exc}")
        raise


@pytest.fixture(scope="module")
def newest():
    with opened(f"openrlhf@{NEWEST}") as h:
        yield h


@pytest.fixture(scope="module")
def oldest():
    with opened(f"openrlhf@{OLDEST}") as h:
        yield h


@pytest.fixture(params=["newest", "oldest"])
def pinned(request):
    return request.getfixturevalue(request.param)


@pytest.mark.network
def test_the_method_is_found_on_its_class_at_each_pin(pinned):
    owner = "NaiveExperienceMaker" if pinned.pin == OLDEST else "RemoteExperienceMaker"
    where = f"openrlhf/trainer/ppo_utils/experience_maker.py::{owner}.get_advantages_and_returns"
    assert pinned.info["where"].endswith(where), pinned.info["where"]
    assert any("compute_reward" in n for n in pinned.info["notes"]), pinned.info["notes"]
    assert pinned.resolved == f"openrlhf=={pinned.pin}"


@pytest.mark.network
def test_finite_poison_is_multiplied_away(pinned):
    adv, ret = pinned.run(SEED)
    assert adv[0].tolist() == pytest.approx([0.95, 1.0, 0.0], rel=1e-6)  # the seed report's fixed numbers
    assert ret[0].tolist() == pytest.approx([0.95, 1.0, 0.0], rel=1e-6)
    v = verdicts(pinned.run, SEED)
    for prop in ("no-crash", "poison", "reference", "row-independence", "masked-zero", "deterministic"):
        assert v[prop].status == "pass", v[prop]


@pytest.mark.network
def test_a_gap_is_dense_and_its_masked_advantages_are_not_zero(pinned):
    adv, ret = pinned.run(GAP)
    # semantics.md example 2, contract dense: A = [-0.103424, ., ., 0.75], Ret = [0.396576, ., ., 1.0]
    assert [adv[0, 0].item(), adv[0, 3].item()] == pytest.approx([-0.103424, 0.75], rel=1e-5)
    assert [ret[0, 0].item(), ret[0, 3].item()] == pytest.approx([0.396576, 1.0], rel=1e-5)
    # in the gap the carry stays: A_2 = gamma * V_3 + gamma * lam * A_3 = 0.225 + 0.54, A_1 = 0.72 * A_2
    assert adv[0, 1] != 0 and adv[0, 2] != 0
    v = verdicts(pinned.run, GAP)
    assert v["reference"].status == "pass" and v["poison"].status == "pass"
    assert v["masked-zero"].failed and v["masked-zero"].positions == [[0, 1], [0, 2]]
    # judged as compressed, the same outputs are wrong: each gap token costs a decay step
    compressed = dataclasses.replace(DECLARED, contract="compressed")
    v = verdicts(pinned.run, GAP, compressed, only=("reference", "gap-invariance"))
    assert v["reference"].failed and v["gap-invariance"].failed


@pytest.mark.network
def test_the_score_on_an_observation_tail_is_kept(pinned):
    adv, _ = pinned.run(OBS_TAIL)
    assert adv[0].tolist() == [0.0, 0.0, 1.0, 0.0, 0.0]  # compute_reward: last action-mask token
    v = verdicts(pinned.run, OBS_TAIL)
    assert v["score-kept"].status == v["reference"].status == v["masked-zero"].status == "pass"


@pytest.mark.network
def test_nan_poison_leaks(pinned):
    case = SEED.replace(values=[[0, 0, float("nan")]])
    adv, _ = pinned.run(case)
    assert torch.isnan(adv[0, :2]).all()  # action_mask * values: NaN * 0 = NaN
    assert verdicts(pinned.run, case)["poison-nonfinite"].failed


@pytest.mark.network
def test_fuzzing_the_newest_release_finds_nan_leak_and_masked_carry_only(newest):
    res = fuzz_target(
        newest.run, newest.declared, target="openrlhf", pin=NEWEST, max_examples=30, seed=0, sizes=Sizes(3, 8)
    )
    found = {f.property for f in res.findings}
    assert found == {"poison-nonfinite", "masked-zero"}, found
    assert res.checked["poison"] > 0 and res.checked["score-kept"] > 0 and res.checked["reference"] > 0
    carry = res.finding("masked-zero")
    # a masked position before a trained token: the carry of the later advantage
    ((b, t),) = carry.verdict.positions[:1]
    assert not carry.case.trainable[b, t] and carry.case.trainable[b, t + 1 :].any()


# ---------------------------------------------------------------------------------------------
# Pins without the method, and a changed signature: `load` on fake trees, in this process.
# ---------------------------------------------------------------------------------------------
@pytest.fixture
def fake_tree(fake_package):
    """A function writing a fake openrlhf tree with the given experience_maker.py (None: no such module)."""
    return lambda experience_maker: fake_package("openrlhf/trainer/ppo_utils", "experience_maker.py", experience_maker)


def test_a_tree_without_the_method_is_a_skip(fake_tree):
    root = fake_tree("class RemoteExperienceMaker:\n    def make_experience(self):\n        pass\n")
    with pytest.raises(NotPresent, match="get_advantages_and_returns"):
        openrlhf_calls.load(root, None)


def test_a_tree_without_the_module_is_a_skip(fake_tree):
    with pytest.raises(NotPresent, match="experience_maker"):
        openrlhf_calls.load(fake_tree(None), None)


def test_a_changed_signature_fails_loudly(fake_tree):
    root = fake_tree(
        """
        class RemoteExperienceMaker:
            def get_advantages_and_returns(self, values, rewards, mask, gamma, lam):
                pass
        """
    )
    with pytest.raises(RuntimeError, match="expected \\(self, values, rewards, action_mask, gamma, lambd\\)"):
        openrlhf_calls.load(root, None)


# ---------------------------------------------------------------------------------------------
# The pipeline domain: every narrowing cited, and each one rejects a case of its kind.
# ---------------------------------------------------------------------------------------------
_INF = float("inf")
_OUTSIDE = {  # narrowed field -> (a case outside it, what rejects() says)
    "dtypes": (Case.build(trainable=[[1, 1]], dtype="bfloat16"), "dtype bfloat16"),
    "leading_mask": (Case.build(trainable=[[0, 1]], attention=[[1, 1]]), "starts with real non-trainable"),
    "left_padding": (Case.build(trainable=[[0, 1]], attention=[[0, 1]]), "left-padded"),
    "all_masked_rows": (Case.build(trainable=[[1, 1], [0, 0]]), "no trainable token"),
    # a masked real token (padding follows masked_rewards / masked_values: Domain.padding_rewards / padding_values)
    "masked_rewards": (Case.build(trainable=[[1, 0]], attention=[[1, 1]], token_rewards=[[0, 2]]), "non-trainable"),
    "masked_values": (Case.build(trainable=[[1, 0]], attention=[[1, 1]], values=[[0, 3]]), "critic values"),
    "nonfinite_poison": (Case.build(trainable=[[1, 0]], attention=[[1, 0]], values=[[0, _INF]]), "NaN / inf"),
    "truncated_padded": (
        Case.build(trainable=[[1, 0], [1, 1]], attention=[[1, 0], [1, 1]], truncated=[True, False]),
        "followed by padding",
    ),
}
_INSIDE = Case.build(trainable=[[1, 1, 0], [1, 1, 1]], attention=[[1, 1, 0], [1, 1, 1]], score=[1.0, -1.0])


@pytest.mark.parametrize("pin", [p.rev for p in openrlhf.SPEC.pins])
def test_the_pipeline_domain_is_cited_and_rejects_what_it_narrows(pin):
    dom = openrlhf.SPEC.pipeline_at(pin)
    assert dom is not None
    assert dom.cited() == []
    assert all(pin in why for why in dom.restrictions().values()), dom.restrictions()
    assert dom.rejects(_INSIDE) is None
    narrowed = dom.restrictions()
    assert narrowed, f"{pin}: nothing narrowed"
    for name in narrowed:
        case, says = _OUTSIDE[name]
        reason = dom.rejects(case)
        assert reason is not None and says in reason, (pin, name, reason)
    # what stays permissive: a gap between actions is a pipeline input at every pin, and at 0.11.2
    # a prompt token before the first action (leading mask) is one too
    assert dom.rejects(GAP.replace(values=GAP.values * GAP.trainable)) is None
    lead = _OUTSIDE["leading_mask"][0]
    assert (dom.rejects(lead) is None) == (pin == NEWEST)


# ---------------------------------------------------------------------------------------------
# Entries beyond GAE (targets/openrlhf/calls_kinds.py) at the newest release: the experience
# maker's real compute_advantages_and_returns (group_norm / dr_grpo / rloo / reinforce),
# compute_approx_kl (kl-k1/k2/k3) and masked_mean. Values below are hand-computed from the code.
# ---------------------------------------------------------------------------------------------
from kind_support import handle_cache, verdicts_by_property  # noqa: E402


@pytest.fixture(scope="module")
def entry():
    with handle_cache(lambda name: opened(f"openrlhf:{name}@{NEWEST}")) as get:
        yield get


kind_verdicts = verdicts_by_property


# two groups interleaved (ids are labels); row 2 starts with a masked prompt token
GROUPS = Case.build(
    trainable=[[1, 1], [1, 1], [0, 1], [1, 1]],
    attention=[[1, 1]] * 4,
    score=[1.0, 0.0, 3.0, 2.0],
    group=[7, 4, 7, 4],
)


@pytest.mark.network
def test_group_norm_rloo_dr_grpo_by_hand(entry):
    # group 7: scores 1, 3 (mean 2, unbiased std sqrt 2); group 4: scores 0, 2 (mean 1, std sqrt 2)
    (adv,) = entry("group_norm").run(GROUPS)
    z = 1 / (2**0.5 + 1e-9)
    assert adv[:, 1].tolist() == pytest.approx([-z, -z, z, z], rel=1e-6)
    # the carried return sits on the masked prompt token before the action (masked_zero is not promised)
    assert adv[2, 0].item() == pytest.approx(z, rel=1e-6)
    (adv,) = entry("dr_grpo").run(GROUPS)
    assert adv[:, 1].tolist() == pytest.approx([-1.0, -1.0, 1.0, 1.0])
    (adv,) = entry("rloo").run(GROUPS)  # r - (sum - r) / (n - 1)
    assert adv[:, 1].tolist() == pytest.approx([-2.0, -2.0, 2.0, 2.0])
    for name in ("group_norm", "dr_grpo", "rloo"):
        v = kind_verdicts(entry(name), GROUPS)
        for prop in ("no-crash", "reference", "permutation", "group-isolation", "affine"):
            assert v[prop].status == "pass", (name, v[prop])


@pytest.mark.network
def test_an_empty_row_counts_in_its_group(entry):
    """A row without action tokens still enters its group's mean and std (experience_maker.py:256-274: the
    statistics read the rewards alone). Issue 24: a variant, declared empty_rows="counted", not a defect (nor is
    such a row produced at 0.11.2: the agent keeps room for a generated token, utils/agent.py:61-75, 94-97)."""
    case = Case.build(trainable=[[1], [1], [0]], attention=[[1], [1], [1]], score=[1.0, 0.0, 5.0], group=[0, 0, 0])
    (adv,) = entry("group_norm").run(case)
    std = (((1 - 2) ** 2 + (0 - 2) ** 2 + (5 - 2) ** 2) / 2) ** 0.5
    assert adv[:2, 0].tolist() == pytest.approx([(1 - 2) / std, (0 - 2) / std], rel=1e-6)
    assert openrlhf.SPEC.for_entry("group_norm").variant["empty_rows"] == "counted"
    v = kind_verdicts(entry("group_norm"), case)
    assert v["reference"].status == "pass"  # the declared variant: the empty row counts, as OpenRLHF counts it


@pytest.mark.network
def test_unequal_groups_are_a_documented_error(entry):
    case = GROUPS.replace(group=torch.tensor([0, 0, 0, 1]))
    v = kind_verdicts(entry("group_norm"), case)
    assert v["no-crash"].status == "pass" and "GroupShapeError" in v["no-crash"].message


@pytest.mark.network
def test_compute_approx_kl_by_hand(entry):
    case = Case.build(
        trainable=[[1, 1, 0]], dtype="float32", extra={"logp": [[-1.0, -30.0, 0.0]], "ref_logp": [[-1.5, -1.0, 0.0]]}
    )
    d = [0.5, -29.0]
    (k1,) = entry("kl-k1").run(case)
    assert k1[0, :2].tolist() == pytest.approx([0.5, -10.0])  # every estimate clamped to [-10, 10]
    (k2,) = entry("kl-k2").run(case)
    assert k2[0, :2].tolist() == pytest.approx([0.125, 10.0])
    (k3,) = entry("kl-k3").run(case)
    import math

    assert k3[0, :2].tolist() == pytest.approx([math.exp(-d[0]) - 1 + d[0], 10.0], rel=1e-6)
    for name in ("kl-k1", "kl-k2", "kl-k3"):
        v = kind_verdicts(entry(name), case)
        assert v["reference"].status == "pass" and v["poison"].status == "pass", name


@pytest.mark.network
def test_masked_mean_by_hand(entry):
    case = Case.build(trainable=[[1, 0, 1]], extra={"x": [[1.0, 100.0, 2.0]]})
    (out,) = entry("masked_mean").run(case)
    assert out[0].tolist() == pytest.approx([1.5, 1.5, 1.5])
    nan = case.replace(extra={"x": torch.tensor([[1.0, float("nan"), 2.0]], dtype=torch.float64)})
    assert torch.isnan(entry("masked_mean").run(nan)[0]).all()  # (t * mask): NaN * 0 = NaN
    assert kind_verdicts(entry("masked_mean"), nan)["poison-nonfinite"].failed


@pytest.mark.network
def test_reinforce_returns_then_whitening_by_hand(entry):
    case = Case.build(trainable=[[0, 1, 1]], attention=[[1, 1, 1]], score=[1.0], gamma=0.5, lam=1.0, dtype="float32")
    adv, ret = entry("reinforce").run(case)
    assert ret[0].tolist() == pytest.approx([0.25, 0.5, 1.0])  # dense: the masked head is a transition too
    # whitened over the two action tokens (biased var 0.0625, rstd 4): [.., -1, 1]; the head is not masked
    assert adv[0].tolist() == pytest.approx([-2.0, -1.0, 1.0])
    # the variance floor var.clamp(min=1e-8), not eps added under the sqrt: declared (Whitening.floor), so it passes
    tiny = case.replace(score=torch.tensor([0.0154], dtype=torch.float64), gamma=0.0)
    v = verdicts(entry("reinforce").run, tiny, entry("reinforce").declared)
    assert v["reference"].status == "pass"


def _fuzz(h, name, n=40):
    return fuzz_target(h.run, h.declared, target="openrlhf", pin=NEWEST, max_examples=n, seed=0, sizes=Sizes(4, 6))


@pytest.mark.network
@pytest.mark.parametrize(
    "name, failing",
    [
        ("group_norm", {"reference", "pad-invariance", "affine", "poison-nonfinite"}),
        ("rloo", {"reference", "pad-invariance", "affine", "poison-nonfinite"}),
        ("kl-k3", set()),
        ("masked_mean", {"poison-nonfinite"}),
    ],
)
def test_short_fuzz_of_the_entries(entry, name, failing):
    res = _fuzz(entry(name), name)
    found = {f.property for f in res.findings}
    assert found <= failing, found
    assert res.checked["reference"] > 0 and res.checked["poison"] > 0


@pytest.mark.parametrize("name", [e for e in openrlhf.SPEC.entries[1:] if e not in ("value-loss", "gae-kl")])
def test_each_entry_declares_a_cited_pipeline(name):
    spec = openrlhf.SPEC.for_entry(name)
    kinds = ("group-advantage", "kl", "normalization", "returns", "loss-aggregation", "policy-loss", "token-reward")
    assert spec.kind in kinds
    assert spec.pipeline is not None and spec.pipeline.cited() == [], spec.pipeline.restrictions()
    # the losses multiply by the mask (dL/dl is 0 there); the other kinds do not mask their outputs
    assert spec.masked_zero is (spec.kind in ("loss-aggregation", "policy-loss")) and spec.masked_zero_why


# ---------------------------------------------------------------------------------------------
# loss-aggregation: models/loss.py::aggregate_loss over one optimizer step (calls_kinds.load_aggregate), the
# normalisers from loss_utils._optimizer_step_loss_norm, DeepSpeed's 1 / gas per micro-batch.
# ---------------------------------------------------------------------------------------------
AGG = ("agg-token-mean", "agg-seq-mean-token-mean")
# 2 x 3, row 0 two tokens, row 1 one; 9 under the mask; one row per micro-batch (gas 2)
TWO_MB = Case.build(trainable=[[1, 1, 0], [1, 0, 0]], extra={"loss": [[1.0, 2.0, 9.0], [4.0, 9.0, 9.0]]}, split=[0, 1])


@pytest.mark.network
def test_aggregate_loss_by_hand_over_two_micro_batches(entry):
    # token: batch_num_tokens = 3 / gas 2; each micro-batch sum / 1.5 * dp 1, then / gas: 3/1.5/2 + 4/1.5/2 = 7/3
    loss, grad = entry("agg-token-mean").run(TWO_MB)
    assert loss[0, 0].item() == pytest.approx(7 / 3, rel=1e-6)
    assert grad.flatten().tolist() == pytest.approx([1 / 3, 1 / 3, 0.0, 1 / 3, 0.0, 0.0], rel=1e-6)
    # sample: global_batch_size = 2 non-empty rows / gas 2: 1.5 / 1 / 2 + 4 / 1 / 2 = 2.75, the mean of row means
    loss, grad = entry("agg-seq-mean-token-mean").run(TWO_MB)
    assert loss[0, 0].item() == pytest.approx(2.75, rel=1e-6)
    assert grad.flatten().tolist() == pytest.approx([0.25, 0.25, 0.0, 0.5, 0.0, 0.0], rel=1e-6)
    # two ranks, one micro-batch each: dp_size 2 cancels the rank average
    loss, _ = entry("agg-token-mean").run(TWO_MB.replace(ranks=2))
    assert loss[0, 0].item() == pytest.approx(7 / 3, rel=1e-6)
    for name in AGG:
        h = entry(name)
        assert h.info["where"] == "openrlhf/models/loss.py::aggregate_loss"
        v = kind_verdicts(h, TWO_MB)
        for prop in ("reference", "split-invariance", "pad-invariance", "poison", "permutation", "masked-zero"):
            assert v[prop].status == "pass", (name, prop, v[prop])


@pytest.mark.network
def test_aggregate_loss_an_all_masked_step_is_nan(entry):
    """No clamp on the step's normalisers (loss.py:32, 39 divide by batch_num_tokens / global_batch_size,
    loss_utils.py:77 gives 0 for a step without an action token): 0 / 0 = NaN loss and gradient. Issue 24: a
    robustness fact, not a defect: universal:no-crash speaks of pipeline input, and OpenRLHF 0.11.2 builds no row
    without an action token (the agent keeps room for one, utils/agent.py:61-75, 94-97; the window is cut to the same
    max_len, samples_generator.py:245, 261-263), let alone a step of them (test_an_all_masked_step_is_a_fact)."""
    empty = Case.build(trainable=[[0, 0]], extra={"loss": [[1.0, 2.0]]})
    for name in AGG:
        loss, grad = entry(name).run(empty)
        assert torch.isnan(loss).all() and torch.isnan(grad).all()
        assert kind_verdicts(entry(name), empty)["empty-step"].failed
    nan = TWO_MB.replace(extra={"loss": torch.tensor([[1.0, 2.0, math.nan], [4.0, 9.0, 9.0]], dtype=torch.float64)})
    assert kind_verdicts(entry("agg-token-mean"), nan)["poison-nonfinite"].failed  # loss * loss_mask: NaN * 0


@pytest.mark.network
@pytest.mark.parametrize("name", AGG)
def test_short_fuzz_of_the_aggregation_entries(entry, name):
    res = fuzz_target(
        entry(name).run, entry(name).declared, target="openrlhf", pin=NEWEST, max_examples=40, seed=0, sizes=Sizes(4, 6)
    )
    found = {f.property for f in res.findings}
    assert found <= {"empty-step", "poison-nonfinite"}, found
    assert res.checked["split-invariance"] > 0 and res.checked["reference"] > 0


@pytest.mark.network
def test_aggregation_entries_skip_before_aggregate_loss():
    from maskfuzz.targets.openrlhf import calls_kinds
    from maskfuzz.targets.runtime.session import Skip

    assert set(calls_kinds.AGGREGATE) == set(AGG) and set(AGG) <= set(openrlhf.SPEC.entries)
    with pytest.raises(Skip, match="aggregate_loss"):
        with opened(f"openrlhf:agg-token-mean@{OLDEST}"):
            pass


@pytest.mark.network
def test_value_loss_by_hand():
    """ValueLoss(0.5) over a step of two micro-batches with OpenRLHF's own step normalisers: the token mean of
    0.5 max((clip - R)^2, (v - R)^2) over the step's 3 tokens."""
    from maskfuzz.targets.runtime.session import open_target

    case = Case.build(
        trainable=[[1, 1, 0], [1, 0, 0]],
        extra={"v": [[1.0, 3.0, 9.0], [0.0, 9.0, 9.0]], "v_old": [[0.75, 0.0, 0.0], [2.0, 0.0, 0.0]],
               "ret": [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]},
        split=[0, 1],
    )  # fmt: skip
    with open_target("openrlhf:value-loss@0.11.2") as h:
        loss, grad = h.run(case)
        assert loss[0, 0].item() == pytest.approx((0.5 * 1.0 + 0.5 * 9.0 + 0.5 * 1.5**2) / 3, rel=1e-6)
        assert grad[0, :2].tolist() == pytest.approx([1 / 3, 1.0], rel=1e-6) and grad[1, 0].item() == 0.0


# ---------------------------------------------------------------------------------------------
# Options and truncated rows (oracles/options.py) at the newest release: each declared option's
# non-default value through the real code, by hand, and a fuzz that checks every option value.
# ---------------------------------------------------------------------------------------------
CLIP, STOP = openrlhf.CLIP_RANGE, openrlhf.STOP_PROPERLY
ONE = Case.build(trainable=[[1, 1]], values=[[1.0, 2.0]], score=[3.0], gamma=0.5, lam=1.0, dtype="float64")
CUT = dict(truncated=torch.tensor([True]), bootstrap=torch.tensor([4.0], dtype=torch.float64))


def _passes(h, case, props=("no-crash", "reference")):
    v = verdicts(h.run, case, h.declared)
    for prop in props:
        assert v[prop].status == "pass", (prop, v[prop])


@pytest.mark.network
def test_gae_options_by_hand(newest):
    # V = [1, 2], gamma 0.5, lam 1, score 3 at the last token:
    # default:   delta_1 = 3 - 2 = 1;  delta_0 = 0 + 0.5 * 2 - 1 = 0;  A = [0.5, 1]
    # clip 1:    r = 1, delta_1 = -1;                                   A = [-0.5, -1]
    # cut row, stop-properly 0: r = 0, delta_1 = -2;                    A = [-1, -2]
    # cut row, defaults: terminal (no bootstrap, score kept), the 4.0 never read: A = [0.5, 1]
    assert newest.run(ONE)[0][0].tolist() == pytest.approx([0.5, 1.0])
    clipped = ONE.replace(options={CLIP: 1.0})
    assert newest.run(clipped)[0][0].tolist() == pytest.approx([-0.5, -1.0])
    stopped = ONE.replace(options={STOP: 0.0}, **CUT)
    assert newest.run(stopped)[0][0].tolist() == pytest.approx([-1.0, -2.0])
    assert newest.run(ONE.replace(options={STOP: 0.0}))[0][0].tolist() == pytest.approx([0.5, 1.0])  # ended row
    cut = ONE.replace(**CUT)
    assert newest.run(cut)[0][0].tolist() == pytest.approx([0.5, 1.0])
    for case in (clipped, stopped, cut):
        _passes(newest, case)
    assert newest.declared.truncation.terminal and "experience_maker.py:377,381" in newest.declared.truncation.cite


@pytest.mark.network
def test_an_option_absent_at_an_old_pin_is_a_documented_error(oldest):
    v = verdicts(oldest.run, ONE.replace(options={STOP: 0.0}, **CUT), oldest.declared)
    assert v["no-crash"].status == "pass" and "OptionNotAtPin" in v["no-crash"].message


@pytest.mark.network
def test_outcome_entries_options_by_hand(entry):
    # group_norm, groups {1, 3} and {0, 2}; row 2 (score 3) cut, stop-properly 0: its score is 0, so group 7 is
    # {1, 0}: mean 0.5, unbiased std sqrt(0.5); A = +-0.5 / 0.7071 = +-0.7071 (row 0 +, row 2 -); group 4 as before
    cut = GROUPS.replace(truncated=torch.tensor([False, False, True, False]), options={STOP: 0.0})
    (adv,) = entry("group_norm").run(cut)
    z = 0.5 / (0.5**0.5 + 1e-9)
    w = 1 / (2**0.5 + 1e-9)
    assert adv[:, 1].tolist() == pytest.approx([z, -w, -z, w], rel=1e-6)
    (adv,) = entry("group_norm").run(GROUPS.replace(truncated=cut.truncated))  # defaults: the cut row is ended
    assert adv[:, 1].tolist() == pytest.approx([-w, -w, w, w], rel=1e-6)
    # reinforce, scores 3 and -0.5 over two one-token rows, clip 1: r = [1, -0.5], biased var 0.5625, rstd 4/3:
    # A = [(1 - 0.25) * 4/3, (-0.5 - 0.25) * 4/3] = [1, -1]
    two = Case.build(trainable=[[1], [1]], score=[3.0, -0.5], gamma=1.0, lam=1.0, dtype="float32")
    adv, ret = entry("reinforce").run(two.replace(options={CLIP: 1.0}))
    assert ret[:, 0].tolist() == pytest.approx([1.0, -0.5]) and adv[:, 0].tolist() == pytest.approx([1.0, -1.0])
    for name, case in (("group_norm", cut), ("reinforce", two.replace(options={CLIP: 1.0, STOP: 0.0}))):
        v = kind_verdicts(entry(name), case)
        assert v["no-crash"].status == "pass" and v["reference"].status == "pass", (name, v["reference"])


@pytest.mark.network
def test_value_clip_by_hand(entry):
    # one token, v = 1, v_old = 0, R = 0: clip 0.2 -> v_c = 0.2, max(0.04, 1) / 2 = 0.5;
    # v = 0.1: v_c = v (inside), 0.005. Two rows, one micro-batch: (0.5 + 0.005) / 2 = 0.2525
    case = Case.build(
        trainable=[[1], [1]],
        extra={"v": [[1.0], [0.1]], "v_old": [[0.0], [0.0]], "ret": [[3.0], [0.0]]},
        options={openrlhf.VALUE_CLIP: 0.2},
    )
    # row 0 with R = 3: v_c = 0.2, max((0.2 - 3)^2, (1 - 3)^2) = 7.84 -> 3.92; row 1: 0.005; mean 1.9625
    loss, _ = entry("value-loss").run(case)
    assert loss[0, 0].item() == pytest.approx((3.92 + 0.005) / 2, rel=1e-5)
    loss, _ = entry("value-loss").run(case.replace(options={}))  # clip 0.5: v_c = 0.5, 6.25 vs 4 -> 3.125
    assert loss[0, 0].item() == pytest.approx((3.125 + 0.005) / 2, rel=1e-5)
    assert kind_verdicts(entry("value-loss"), case)["reference"].status == "pass"


def _assert_options_covered(res):
    assert res.options_checked, "no option space"
    for name, per in res.options_checked.items():
        assert all(n > 0 for n in per.values()), (name, per)


@pytest.mark.network
def test_fuzzing_with_options_checks_every_value(newest):
    res = fuzz_target(
        newest.run, newest.declared, target="openrlhf", pin=NEWEST, max_examples=20, seed=1, sizes=Sizes(3, 5)
    )
    assert res.options_checked, "no option space"
    for name, per in res.options_checked.items():
        assert all(n > 0 for n in per.values()), (name, per)
    assert res.truncated_checked > 0
    # no tool error: only the known defects (NaN through the mask, the masked carry), no crash, no reference miss
    assert {f.property for f in res.findings} <= {"poison-nonfinite", "masked-zero"}, [
        (f.property, f.verdict.message) for f in res.findings
    ]


# ---------------------------------------------------------------------------------------------
# policy-loss: models/loss.py::PolicyLoss (0.11.2:116-259) at the CLI defaults (clip 0.2 / 0.2, no dual clip,
# token-mean; ppo_actor.py:76-86), the step's global normalisers, DeepSpeed's 1 / gas (calls_kinds.load_policy).
# ---------------------------------------------------------------------------------------------
# row 0: r = 1 (A 1: l -1, slope -1); r = e^0.5 > 1.2 with A 1 (the clip binds: l -1.2, slope 0);
# row 1: r = e^0.5 with A -1 (outside the range, the unclipped term is the max: l e^0.5, slope e^0.5);
# r = e^-0.1 inside with A 2 (l -2 e^-0.1, slope the same); 100 under the mask; one row per micro-batch (gas 2)
POLICY = Case.build(
    trainable=[[1, 1, 0], [1, 1, 0]],
    extra={
        "logp": [[-1.0, -0.5, 100.0], [-0.5, -1.1, 100.0]],
        "old_logp": [[-1.0, -1.0, 100.0], [-1.0, -1.0, 100.0]],
        "adv": [[1.0, 1.0, 100.0], [-1.0, 2.0, 100.0]],
    },
    split=[0, 1],
    dtype="float64",
)


def test_policy_loss_entry_is_declared_with_the_cli_defaults():
    d = openrlhf.SPEC.declared("policy-loss")
    assert openrlhf.SPEC.kind_of("policy-loss") == "policy-loss"
    assert d.variant == {
        "clip_low": 0.2,
        "clip_high": 0.2,
        "dual_clip": None,
        "advantages": "token",
        "mode": "token-mean",
    }
    spec = openrlhf.SPEC.for_entry("policy-loss")
    assert spec.masked_zero and spec.pipeline.cited() == [], spec.pipeline.restrictions()
    assert {o.name for o in spec.options} == {openrlhf.DUAL_CLIP, openrlhf.LOSS_AGG_MODE}


@pytest.mark.network
def test_policy_loss_by_hand(entry):
    h = entry("policy-loss")
    assert h.info["where"] == "openrlhf/models/loss.py::PolicyLoss"
    loss, grad = h.run(POLICY)  # the step's token mean over 4 tokens, whatever the split
    r = math.exp(0.5)
    assert loss[0, 0].item() == pytest.approx((-1.0 - 1.2 + r - 2 * math.exp(-0.1)) / 4, rel=1e-9)
    assert grad.flatten().tolist() == pytest.approx([-0.25, 0.0, 0.0, r / 4, -2 * math.exp(-0.1) / 4, 0.0], rel=1e-9)
    v = kind_verdicts(h, POLICY)
    for prop in ("reference", "split-invariance", "pad-invariance", "poison", "permutation", "masked-zero"):
        assert v[prop].status == "pass", (prop, v[prop])
    # dual clip 3 (actor.dual_clip): row 1's first token is capped at -3 A = 3 only above it; e^0.5 < 3, unchanged;
    # seq-mean-token-mean (actor.loss_agg_mode): row means (-2.2 / 2, (e^0.5 - 2 e^-0.1) / 2), averaged
    seq = POLICY.replace(options={openrlhf.LOSS_AGG_MODE: "seq-mean-token-mean", openrlhf.DUAL_CLIP: 3.0})
    loss, _ = h.run(seq)
    assert loss[0, 0].item() == pytest.approx((-1.1 + (r - 2 * math.exp(-0.1)) / 2) / 2, rel=1e-9)
    assert kind_verdicts(h, seq)["reference"].status == "pass"
    # a NaN under the mask: loss * loss_mask (models/loss.py:32) keeps it, NaN * 0 = NaN
    logp = POLICY.extra["logp"].clone()
    logp[0, 2] = math.nan
    nan = POLICY.replace(extra={**POLICY.extra, "logp": logp})
    assert torch.isnan(h.run(nan)[0]).all() and kind_verdicts(h, nan)["poison-nonfinite"].failed


@pytest.mark.network
def test_policy_loss_short_fuzz(entry):
    """Only the two known defects of aggregate_loss (above): an all-masked step divides 0 by batch_num_tokens = 0
    (models/loss.py:32, empty-step) and NaN under the mask survives `loss * loss_mask` (models/loss.py:32): in the
    loss (poison-nonfinite) and, a NaN advantage there, in the gradient (masked-zero: 0 * NaN in the backward of
    the product). The pipeline never puts NaN under the mask (actor.py:298 log-probs times the action mask)."""
    h = entry("policy-loss")
    res = fuzz_target(h.run, h.declared, target="openrlhf", pin=NEWEST, max_examples=15, seed=0, sizes=Sizes(4, 6))
    found = {f.property for f in res.findings}
    assert {"empty-step", "poison-nonfinite"} <= found, found
    assert found <= {"empty-step", "poison-nonfinite", "masked-zero"}, [
        (f.property, f.verdict.message) for f in res.findings
    ]
    for f in res.findings:
        if f.property == "masked-zero":  # only ever with a non-finite value under the mask
            dead = ~f.case.trainable
            assert any(not torch.isfinite(x[dead]).all() for x in f.case.extra.values()), f.verdict.message
    assert res.checked["reference"] > 0 and res.checked["split-invariance"] > 0


# ---------------------------------------------------------------------------------------------
# KL in the reward (`oracles/kinds/gae/kl_reward.py`): make_experience's compute_approx_kl (k1, clamped to [-10, 10],
# models/utils.py:93-113), compute_reward with kl_coef = --algo.kl.init_coef 0.01 (utils.py:144-157), then
# get_cumulative_returns + the batch whitening ("reinforce-kl", through compute_advantages_and_returns) or
# get_advantages_and_returns ("gae-kl"). Two rows: row 0 starts with a masked prompt token whose log-prob is
# NaN, row 1 ends in a masked token with real log-probs. Log-ratios d: row 0 [NaN, 0.5, -1], row 1 [0, 1, -2].
# ---------------------------------------------------------------------------------------------
KL_CASE = Case.build(
    trainable=[[0, 1, 1], [1, 1, 0]],
    attention=[[1, 1, 1]] * 2,
    score=[1.0, 2.0],
    gamma=1.0,
    lam=1.0,
    dtype="float32",
    extra={"logp": [[math.nan, -1.0, -2.0], [-0.5, -0.5, -3.0]], "ref_logp": [[-1.0, -1.5, -1.0], [-0.5, -1.5, -1.0]]},
)
# r' = -0.01 d at action tokens, the score at the last one: row 0 [., -0.005, 1 + 0.01], row 1 [0, 2 - 0.01, .];
# dense returns (reverse sums of rewards * action_mask); the masked tail's KL (-0.01 * -2) is multiplied away
KL_RETURNS = [[1.005, 1.01], [1.99, 1.99, 0.0]]


def _kl_clean(case: Case) -> Case:
    logp = case.extra["logp"].clone()
    logp[0, 0] = -1.0  # a real log-prob of the sampled token (the pipeline's domain)
    return case.replace(extra={**case.extra, "logp": logp})


@pytest.mark.network
def test_gae_kl_by_hand_and_the_masked_nan_log_prob():
    with opened(f"openrlhf:gae-kl@{NEWEST}") as h:
        adv, ret = h.run(KL_CASE)
        # values 0, gamma = lam = 1: A = returns; the NaN KL of the masked head only reaches the head itself
        # (rewards = action_mask * rewards keeps NaN * 0 = NaN, experience_maker.py:378, and the loop runs backwards)
        assert ret[0, 1:].tolist() == pytest.approx(KL_RETURNS[0], rel=1e-6) and math.isnan(ret[0, 0].item())
        assert ret[1].tolist() == pytest.approx(KL_RETURNS[1], rel=1e-6) and adv[1].tolist() == ret[1].tolist()
        assert kind_verdicts(h, _kl_clean(KL_CASE))["reference"].status == "pass"
        # the same NaN on a masked tail token flows back into the row's action tokens (api only: the pipeline's
        # log-probs are finite and multiplied by the action mask, actor.py:298)
        tail = KL_CASE.extra["logp"].clone()
        tail[1, 2] = math.nan
        nan = KL_CASE.replace(extra={**KL_CASE.extra, "logp": tail})
        assert torch.isnan(h.run(nan)[1][1]).all() and kind_verdicts(h, nan)["poison-nonfinite"].failed
        # short fuzz: only NaN through the mask (compute_approx_kl takes no mask, utils.py:69-113; the reward's
        # rewards * action_mask keeps NaN, experience_maker.py:378) and the unmasked outputs the default entry shows
        # (masked-zero: A in gaps and before the first action carries the later advantage, :377-388)
        res = fuzz_target(h.run, h.declared, target="openrlhf", pin=NEWEST, max_examples=20, seed=0, sizes=Sizes(4, 6))
        found = {f.property for f in res.findings}
        assert found <= {"poison-nonfinite", "masked-zero"}, [(f.property, f.verdict.message) for f in res.findings]
        assert res.checked["reference"] > 0


@pytest.mark.network
def test_reinforce_kl_by_hand_and_the_masked_nan_log_prob(entry):
    h = entry("reinforce-kl")
    adv, ret = h.run(KL_CASE)
    assert ret[0, 1:].tolist() == pytest.approx(KL_RETURNS[0], rel=1e-6)
    assert ret[1].tolist() == pytest.approx(KL_RETURNS[1], rel=1e-6)
    # the whitening sums advantages * action_mask over the batch (experience_maker.py:330): the masked NaN return
    # of row 0's head makes every advantage NaN (api only, as above)
    assert torch.isnan(adv).all() and kind_verdicts(h, KL_CASE)["poison-nonfinite"].failed
    adv, ret = h.run(_kl_clean(KL_CASE))
    assert ret[0].tolist() == pytest.approx([1.005, 1.005, 1.01], rel=1e-6)
    acts = torch.tensor([1.005, 1.01, 1.99, 1.99], dtype=torch.float64)
    mean, var = acts.mean(), acts.var(unbiased=False)  # biased, floor 1e-8 (experience_maker.py:330-333)
    want = ((ret.double() - mean) / var.sqrt()).tolist()
    assert adv.tolist() == [pytest.approx(row, rel=1e-5) for row in want]
    assert kind_verdicts(h, _kl_clean(KL_CASE))["reference"].status == "pass"
    res = fuzz_target(h.run, h.declared, target="openrlhf", pin=NEWEST, max_examples=20, seed=0, sizes=Sizes(4, 6))
    found = {f.property for f in res.findings}
    assert found <= {"poison-nonfinite"}, [(f.property, f.verdict.message) for f in res.findings]
    assert res.checked["reference"] > 0


# ---------------------------------------------------------------------------------------------
# The promise model (issue 24; docs/audit/openrlhf.md, "Promise audit"): which findings are defects (a universal
# invariant or OpenRLHF's own words at the pin) and which are facts, as `fuzz.triage.judge_finding` decides them.
# ---------------------------------------------------------------------------------------------
from maskfuzz.fuzz.engine import Finding  # noqa: E402
from maskfuzz.fuzz.triage import judge_finding  # noqa: E402
from maskfuzz.oracles.promises import broken  # noqa: E402

MIDDLE = "0.6.3"
# the pipeline witness of corpus entry 34ca51fe1b71880f (a fuzz at seed 0 finds it at 0.3.6.post1 and 0.6.3): a gap
# left by a pad id sampled inside the response (models/actor.py:164 / :192), the critic's value under it
GAP_WITNESS = Case.build(trainable=[[1, 0, 1]], attention=[[1, 1, 1]], values=[[0.0, 100.0, 0.0]], score=[1.0])
# the recorded case of 34ca51fe1b71880f: the masked head is left padding, which no pin's pipeline builds
CORPUS_34CA = Case.build(
    trainable=[[0, 1]], attention=[[0, 1]], token_rewards=[[100.0, 0.0]], values=[[100.0, 0.0]], score=[1.0]
)


def triaged(handle, case: Case, prop: str, run=None) -> Finding:
    """`case`'s failure of `prop` on `handle` (or on `run`, a changed implementation of the same entry), judged as
    a finding: root cause, reach (no search: the case itself or its projection), promise or fact."""
    run = run or handle.run
    v = next(v for v in judge(run, case, handle.declared) if v.property == prop)
    assert v.failed, v
    f = Finding(target="openrlhf", pin=handle.pin, resolved="", property=prop, case=case, verdict=v)
    judge_finding(run, f, handle.declared, examples=0)
    return f


@pytest.mark.network
@pytest.mark.parametrize(
    "pin, promise",
    [
        (OLDEST, "upstream:openrlhf/trainer/ppo_utils/replay_buffer.py:200-207"),
        (MIDDLE, "upstream:openrlhf/trainer/ppo_utils/replay_buffer.py:223-237"),
        (NEWEST, None),
    ],
)
def test_the_masked_carry_is_a_defect_where_the_replay_buffer_reads_it(pin, promise):
    """get_advantages_and_returns leaves the later advantage in a gap (no output mask). At 0.3.6.post1 and 0.6.3
    ReplayBuffer.normalize sums every advantage, masked ones included, into the whitening mean: a consumer that reads
    them unmasked, the declared promise; the gap is a pipeline input there (a pad id sampled inside a response), so
    the defect has reach pipeline. At 0.11.2 the whitening and the policy loss are masked
    (experience_maker.py:326-337, models/loss.py:32-36): a semantics fact."""
    with opened(f"openrlhf@{pin}") as h:
        f = triaged(h, GAP_WITNESS, "masked-zero")
        if promise is None:
            assert not f.is_defect and f.fact == "semantics"
            return
        assert f.is_defect and f.promise.id == promise and f.reach == "pipeline", (f.promise, f.reach_how)
        old = triaged(
            h, CORPUS_34CA, "masked-zero"
        )  # the corpus case: the same promise, no pipeline witness of its own
        assert old.is_defect and old.promise.id == promise and old.reach == "api"


@pytest.mark.network
def test_nan_under_the_mask_is_a_robustness_fact(pinned):
    """Corpus entry 804a4b4cc336e9ad (retired): NaN * 0 keeps a NaN in `rewards = action_mask * rewards`, but the
    pipeline's masked rewards are 0 (the KL is masked, the score sits on the last action token) and its values are
    finite value-head outputs: universal:poison-nonfinite is broken by nothing the pipeline builds."""
    case = Case.build(trainable=[[1, 1, 0]], attention=[[1, 1, 0]], values=[[0.0, 0.0, math.nan]], gamma=1.0, lam=0.95)
    f = triaged(pinned, case, "poison-nonfinite")
    assert not f.is_defect and f.fact == "robustness"


@pytest.mark.network
def test_an_all_masked_step_is_a_fact(entry):
    empty = Case.build(trainable=[[0, 0]], attention=[[1, 1]], extra={"loss": [[1.0, 2.0]]})
    for name in AGG:
        f = triaged(entry(name), empty, "empty-step")
        assert not f.is_defect and f.fact == "robustness", (name, f.why_fact)


@pytest.mark.parametrize(
    "name, pin, prop, promise",
    [
        ("default", OLDEST, "reference", "upstream:openrlhf/trainer/ppo_utils/experience_maker.py:181-191"),
        ("default", MIDDLE, "telescoping", "upstream:openrlhf/trainer/ppo_utils/experience_maker.py:589-599"),
        ("default", NEWEST, "reference", "upstream:openrlhf/trainer/ppo_utils/experience_maker.py:351-361"),
        ("gae-kl", NEWEST, "reference", "upstream:openrlhf/trainer/ppo_utils/experience_maker.py:351-361"),
        ("kl-k3", NEWEST, "reference", "upstream:openrlhf/models/utils.py:77-87"),
        ("agg-token-mean", NEWEST, "split-invariance", "upstream:openrlhf/models/loss.py:19-27"),
        ("agg-seq-mean-token-mean", NEWEST, "reference", "upstream:openrlhf/models/loss.py:19-27"),
        ("value-loss", NEWEST, "split-invariance", "upstream:openrlhf/models/loss.py:19-27"),
        ("policy-loss", NEWEST, "reference", "upstream:openrlhf/models/loss.py:19-27"),
    ],
)
def test_openrlhf_promises_name_its_words_at_each_pin(name, pin, prop, promise):
    declared = openrlhf.SPEC.declared(None if name == "default" else name, pin)
    p = broken(prop, "unexplained", declared.promises, reach="api", kind=declared.kind)
    assert p is not None and p.id == promise, (p, promise)


def test_entries_without_words_declare_no_promise():
    """The group estimators, masked_mean and reinforce state no formula: their findings stay facts."""
    for name in ("group_norm", "dr_grpo", "rloo", "masked_mean", "reinforce", "reinforce-kl"):
        assert openrlhf.SPEC.for_entry(name).promises == (), name
    assert openrlhf.SPEC.declared(None, NEWEST).promises[-1].id.endswith("experience_maker.py:351-361")  # no consumer


@pytest.mark.network
def test_a_non_global_token_mean_is_a_defect_naming_aggregate_loss(entry):
    """agg-token-mean: a normaliser that is not the step's global token count (here OpenRLHF's own aggregation with
    its loss and gradient scaled by 1.5) breaks aggregate_loss' docstring (models/loss.py:19-27)."""
    h = entry("agg-token-mean")
    wrong = lambda *a, **k: tuple(x * 1.5 for x in h.run(*a, **k))  # noqa: E731
    f = triaged(h, TWO_MB, "reference", run=wrong)
    assert f.is_defect and f.promise.id == "upstream:openrlhf/models/loss.py:19-27", (f.promise, f.fact)
    assert kind_verdicts(h, TWO_MB)["reference"].status == "pass"

"""NeMo-RL through its adapter: `GeneralizedAdvantageEstimator.compute_advantage` compiled from the source at
each pin, called the way the PPO loop calls it (`mask = token_mask * sample_mask`), judged by the oracle.

Verdicts derived by reading nemo_rl/algorithms/advantage_estimator.py:

* `_compute_gae` carries `next_values` and `last_gae_lam` over positions with mask 0 (carry-forward masking):
  the compressed contract, so the seed's masked padding slot, a gap and an observation tail are all handled
  (spec examples 1-3 hold), and `_build_token_level_rewards` puts the score on the last mask=1 token.
* The carry is multiplicative (`values[:, t] * m + (1 - m) * next_values`, `token_level_rewards * mask`):
  NaN poison (values, or NaN log-probs in the KL reward) reaches the trainable outputs. An infinite log-prob
  is clamped by `calculate_kl` first and stays harmless.
* Returns are `advantages + values` everywhere (masked positions hold the carried advantage plus the poison
  value); advantages are `masked_fill`ed to 0.

Promise model (issue 24, docs/audit/nemo-rl.md "Promise audit"): the estimator's class docstring says the
accumulators are preserved at masked positions (advantage_estimator.py:318-321 at 7ea, :279-282 at 857b), so the NaN
leak is a defect naming it (reach api, low: the PPO loop builds no NaN under the mask); its own unit test
(test_gae_carry_forward_interior_gap) and the terminal-reward comment are promises that hold.

NeMo-RL is git only: the checks at pins need MASKFUZZ_REPOS=nemo-rl=/path/to/a-clone-or-mirror and skip
without it; the KL scale, the registry entry and the loud failures on fake source trees run everywhere.
"""

from __future__ import annotations

import math

import pytest
import torch

from maskfuzz.fuzz.engine import fuzz_target
from maskfuzz.fuzz.triage import retriage
from maskfuzz.oracles.case import Case
from maskfuzz.oracles.kinds.dispatch import judge
from maskfuzz.targets import registry
from maskfuzz.targets.adapters.base import NotPresent
from maskfuzz.targets.adapters.extract import BlockNotFound
from maskfuzz.targets.nemo_rl import calls as nemo_rl_calls
from maskfuzz.targets.nemo_rl import declare as nemo_rl
from maskfuzz.targets.runtime.repos import parse_repos
from maskfuzz.targets.runtime.session import Skip, open_target

HEAD_PIN, FIRST_PIN, BEFORE_PIN = (p.rev for p in nemo_rl.SPEC.pins)

RAW = {nemo_rl.NORMALIZE: False}  # the worked examples below are unwhitened (the PPO default whitens)
SEED = Case.build(
    trainable=[[1, 1, 0]], token_rewards=[[0, 1, 0]], values=[[0, 0, 100]], gamma=1.0, lam=0.95, options=RAW
)
GAP = Case.build(trainable=[[1, 0, 0, 1]], values=[[0.5, 9, 9, 0.25]], score=[1.0], gamma=0.9, lam=0.8, options=RAW)
TAIL = Case.build(
    trainable=[[1, 1, 1, 0, 0]], attention=[[1, 1, 1, 1, 1]], score=[1.0], gamma=0.0, lam=0.9, options=RAW
)


def verdicts(run, case: Case) -> dict:
    return {v.property: v for v in judge(run, case, nemo_rl.SPEC.declared())}


def triaged(h, case: Case, prop: str) -> dict:
    """The failure of `prop` on `case` triaged as the corpus replay does at the handle's pin: class, promise, reach."""
    v = next(v for v in judge(h.run, case, h.declared) if v.property == prop)
    assert v.failed, (prop, v.status, v.message)
    return retriage(h.run, v.case or case, v, h.declared, h.spec.id)


CARRY = {HEAD_PIN: "advantage_estimator.py:318-321", FIRST_PIN: "advantage_estimator.py:279-282"}


def _open(pin: str):
    repos = parse_repos(None)
    if "nemo-rl" not in repos:
        pytest.skip("NeMo-RL is git only: set MASKFUZZ_REPOS=nemo-rl=/path/to/NeMo-RL-clone-or-mirror to test it")
    return open_target(f"nemo-rl@{pin}", repos=repos)


@pytest.fixture(scope="module", params=[HEAD_PIN, FIRST_PIN])
def pinned(request):
    with _open(request.param) as h:
        yield h


@pytest.fixture(scope="module")
def head():
    with _open(HEAD_PIN) as h:
        yield h


# ---------------------------------------------------------------------------------------------
# The spec's worked examples at main and at the commit that added the estimator.
# ---------------------------------------------------------------------------------------------
@pytest.mark.needs_mirror
def test_masked_padding_slot_with_poisoned_value(pinned):
    assert pinned.info["where"] == (
        "nemo_rl/algorithms/advantage_estimator.py::GeneralizedAdvantageEstimator.compute_advantage"
    )
    assert pinned.info["stand_ins_used"] == []  # nothing of nemo_rl is imported
    adv, ret = pinned.run(SEED)
    assert adv[0].tolist() == pytest.approx([0.95, 1.0, 0.0], rel=1e-6)
    assert ret[0].tolist() == pytest.approx([0.95, 1.0, 100.0], rel=1e-6)  # returns are not masked
    v = verdicts(pinned.run, SEED)
    for prop in ("no-crash", "poison", "reference", "masked-zero", "row-independence", "deterministic"):
        assert v[prop].status == "pass", (prop, v[prop].message)


@pytest.mark.needs_mirror
def test_gap_is_skipped(pinned):
    adv, ret = pinned.run(GAP)
    assert adv[0].tolist() == pytest.approx([0.265, 0.0, 0.0, 0.75], rel=1e-6)
    assert [ret[0, 0].item(), ret[0, 3].item()] == pytest.approx([0.765, 1.0], rel=1e-6)
    v = verdicts(pinned.run, GAP)
    for prop in ("reference", "gap-invariance", "poison", "masked-zero"):
        assert v[prop].status == "pass", (prop, v[prop].message)


@pytest.mark.needs_mirror
def test_observation_tail_keeps_the_score(pinned):
    adv, _ = pinned.run(TAIL)
    assert adv[0].tolist() == [0.0, 0.0, 1.0, 0.0, 0.0]
    assert verdicts(pinned.run, TAIL)["score-kept"].status == "pass"


@pytest.mark.needs_mirror
def test_large_token_rewards_pass_the_kl_clamp_unchanged(head):
    case = Case.build(
        trainable=[[1, 1, 0, 1]],
        token_rewards=[[100.0, -37.5, 1e30, 0.25]],
        values=[[1.0, 2.0, -5.0, 4.0]],
        score=[2.0],
        gamma=0.9,
        lam=0.8,
        options=RAW,
    )
    v = verdicts(head.run, case)
    assert v["reference"].status == "pass" and v["poison"].status == "pass"


@pytest.mark.needs_mirror
@pytest.mark.parametrize(
    "field, poison, leaks",
    [
        ("values", math.nan, True),
        ("values", math.inf, True),
        ("token_rewards", math.nan, True),
        ("token_rewards", math.inf, False),
    ],  # an infinite log-prob ratio is clamped by calculate_kl
)
def test_nonfinite_poison(head, field, poison, leaks):
    fields = {"values": [[0.5, 0.25, 0.0]], "token_rewards": [[0.0, 0.0, 0.0]]}
    fields[field][0][2] = poison
    case = Case.build(trainable=[[1, 1, 0]], score=[1.0], gamma=1.0, lam=0.9, options=RAW, **fields)
    adv, _ = head.run(case)
    assert math.isnan(adv[0, 0].item()) == leaks
    assert adv[0, 2].item() == 0.0  # masked_fill selects, whatever the carry holds
    assert verdicts(head.run, case)["poison-nonfinite"].failed == leaks


@pytest.mark.needs_mirror
def test_nan_carry_breaks_the_carry_forward_promise(pinned):
    """The class docstring: 'at masked positions the running accumulators (next_values, last_gae_lam) are preserved
    from the last valid token'. NaN * 0 in `values[:, t] * m + (1 - m) * next_values` does not preserve them: a
    defect naming that docstring at both pins; api (the PPO loop holds no NaN under the mask), low (non-finite)."""
    case = Case.build(trainable=[[1, 1, 0]], values=[[0.5, 0.25, math.nan]], score=[1.0], gamma=1.0, lam=0.9)
    t = triaged(pinned, case, "poison-nonfinite")
    assert (t["class"], t["mechanism"]) == ("defect", "nan-through-mask")
    assert t["promise"] == f"upstream:nemo_rl/algorithms/{CARRY[pinned.pin]}" and "preserved" in t["promise_text"]
    assert (t["reach"], t["severity"]) == ("api", "low")


@pytest.mark.needs_mirror
def test_own_promises_hold_on_the_gap_the_poison_and_the_tail(pinned):
    """NeMo-RL's own unit test (test_gae_carry_forward_interior_gap: a 999 value in an interior gap must not move the
    valid advantages) and the terminal-reward comment (the score lands on an assistant token when the sequence ends
    on a non-assistant message) are declared at their pins; both hold there."""
    ids = [p.id for p in pinned.declared.promises]
    test = {HEAD_PIN: "334-374", FIRST_PIN: "327-367"}[pinned.pin]
    tail = {HEAD_PIN: "396-400", FIRST_PIN: "357-361"}[pinned.pin]
    assert ids == [
        f"upstream:nemo_rl/algorithms/{CARRY[pinned.pin]}",
        f"upstream:tests/unit/algorithms/test_ppo.py:{test}",
        f"upstream:nemo_rl/algorithms/advantage_estimator.py:{tail}",
    ]
    gap = Case.build(trainable=[[1, 1, 0, 1, 1]], values=[[0.1, 0.2, 999.0, 0.4, 0.5]], score=[1.0], options=RAW)
    v = verdicts(pinned.run, gap)
    assert v["gap-invariance"].status == v["poison"].status == v["reference"].status == "pass"
    assert verdicts(pinned.run, TAIL)["score-kept"].status == "pass"
    assert not nemo_rl.SPEC.declared("grpo", pinned.pin).promises  # the GAE entry's words only


@pytest.mark.needs_mirror
def test_before_the_estimator_existed_is_not_present():
    with pytest.raises(Skip, match="no GeneralizedAdvantageEstimator"):
        with _open(BEFORE_PIN):
            pass


@pytest.mark.needs_mirror
def test_short_fuzz_finds_only_nan_poison(pinned):
    result = fuzz_target(
        pinned.run,
        pinned.declared,
        target="nemo-rl",
        pin=pinned.pin,
        max_examples=80,
        seed=0,
        derandomize=True,
        shrink=False,
    )
    failed = {p for p, n in result.failed.items() if n}
    # no-crash: the default whitening of an all-equal float16 batch: rsqrt(0 + 1e-8) with 1e-8 flushed to 0 in
    # float16 is inf, times 0 is NaN (half precision only; the PPO loop's values are float32). At 857b, when the
    # draw has overlong filtering on and a cut row: the filtered row still enters the whitening (ppo.py:1244),
    # fixed at 7ea (see test_gae_options_and_overlong_filtering_by_hand)
    allowed = {"poison-nonfinite", "no-crash"} | ({"reference"} if pinned.pin.startswith("857b") else set())
    assert "poison-nonfinite" in failed and failed <= allowed, failed
    for f in result.findings:
        if f.property == "reference":
            assert f.case.options.get(nemo_rl.OVERLONG) and bool(f.case.truncated_rows().any()), f.verdict.message
    assert result.checked["gap-invariance"] and result.checked["poison"] and result.checked["score-kept"]
    # every value of both options was judged, and cut rows were drawn
    for name, per in result.options_checked.items():
        assert all(n > 0 for n in per.values()), (name, per)
    assert set(result.options_checked) == {nemo_rl.NORMALIZE, nemo_rl.OVERLONG} and result.truncated_checked > 0
    assert not any("is not an option" in f.verdict.message for f in result.findings)  # no tool error


# ---------------------------------------------------------------------------------------------
# Without a mirror.
# ---------------------------------------------------------------------------------------------
def test_registry_entry():
    spec = registry.get("nemo-rl")
    assert spec is nemo_rl.SPEC and spec.contract == "compressed" and spec.whitening == nemo_rl.WHITEN
    assert spec.masked_zero and spec.declared().truncation.terminal
    assert spec.stand_ins == () and spec.domain.restrictions() == {}


def test_pipeline_domain_is_cited_and_rejects_what_the_ppo_loop_never_builds():
    spec = nemo_rl.SPEC
    pipe = spec.pipeline
    assert pipe.cited() == [] and set(pipe.restrictions()) == {"dtypes", "left_padding", "nonfinite_poison"}
    assert spec.pipeline_at(HEAD_PIN) is pipe and spec.pipeline_at(FIRST_PIN) is nemo_rl.PIPELINE[FIRST_PIN]
    # what the PPO loop produces, cited per pin: the observation appended to every sample after each turn
    # (rollouts.py:1019 / :530), the prompt and tool turns masked, the critic's values at every token, the KL term
    # at every position; 7ea also masks whole rows (advantage_mask = token_mask * sample_mask, ppo.py:266)
    common = {
        "leading_mask",
        "masked_real_tail",
        "gaps",
        "masked_values",
        "masked_rewards",
        "token_rewards",
        "truncated_rows",
        "truncated_padded",
    }
    assert set(pipe.produces) == common | {"all_masked_rows"}
    assert set(spec.pipeline_at(FIRST_PIN).produces) == common
    for pin in (HEAD_PIN, FIRST_PIN):
        assert all(pin in why and ".py:" in why for why in spec.pipeline_at(pin).produces.values())
        assert spec.pipeline_at(pin).cited() == []
    assert "rollouts.py:977-1019" in pipe.produces["masked_real_tail"]
    # what the multi-turn PPO loop does build: a leading prompt, a tool gap, an observation tail, an all-masked
    # row (sample_mask 0), critic values and KL rewards under the mask, float32 and float64
    multi = Case.build(
        trainable=[[0, 1, 0, 1, 0], [0, 0, 0, 0, 0]],
        token_rewards=[[0.5, -0.1, 0.2, 0.0, 3.0]] * 2,
        values=[[7.0, 1.0, -2.0, 0.5, 9.0]] * 2,
        score=[1.0, 0.0],
    )
    assert pipe.rejects(multi) is None and pipe.rejects(multi.replace(dtype="float64")) is None
    assert "dtype bfloat16" in pipe.rejects(Case.build(trainable=[[1, 1]], dtype="bfloat16"))  # dtypes
    assert "left-padded" in pipe.rejects(Case.build(trainable=[[0, 1, 1]], attention=[[0, 1, 1]]))  # left_padding
    nan_value = Case.build(trainable=[[1, 1, 0]], values=[[0.5, 0.25, math.nan]])
    assert "NaN / inf" in pipe.rejects(nan_value)  # nonfinite_poison
    assert spec.domain.rejects(nan_value) is None  # the api domain is unchanged


def test_kl_scale_is_a_power_of_two_from_trainable_rewards_only():
    small = Case.build(trainable=[[1, 0]], token_rewards=[[-8.0, 1e30]])
    assert nemo_rl_calls._kl_scale(small) == 1.0  # the masked 1e30 is poison: it is clamped and masked by NeMo-RL
    big = Case.build(trainable=[[1, 1]], token_rewards=[[100.0, -3.0]])
    assert nemo_rl_calls._kl_scale(big) == 16.0 and 100.0 / 16.0 <= 8.0
    assert nemo_rl_calls._kl_scale(Case.build(trainable=[[0, 0]])) == 1.0


def _tree(tmp_path, text: str):
    path = tmp_path / "nemo_rl" / "algorithms" / "advantage_estimator.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return tmp_path


def test_tree_without_the_module_is_not_present(tmp_path):
    with pytest.raises(NotPresent, match="advantage_estimator is not present"):
        nemo_rl_calls.load(tmp_path, None)


def test_module_without_the_class_is_not_present(tmp_path):
    with pytest.raises(NotPresent, match="no GeneralizedAdvantageEstimator"):
        nemo_rl_calls.load(_tree(tmp_path, "class GRPOAdvantageEstimator:\n    pass\n"), None)


def test_class_reading_a_heavy_package_fails_loudly(tmp_path):
    body = (
        "from transformers import AutoTokenizer\n"
        "class GeneralizedAdvantageEstimator:\n"
        "    def compute_advantage(self, mask):\n"
        "        return AutoTokenizer(mask)\n"
    )
    with pytest.raises(BlockNotFound, match="AutoTokenizer"):
        nemo_rl_calls.load(_tree(tmp_path, body), None)


# ---------------------------------------------------------------------------------------------
# Kinds beyond GAE (targets/nemo_rl/calls_kinds.py): GRPOAdvantageEstimator compiled from the checkout.
#
# * valid_mask is all ones (advantage_estimator.py:85): a row without a trainable token counts in its group.
# * calculate_baseline_and_std_per_prompt multiplies a float32 torch.eye / torch.ones matrix with the rewards
#   (utils.py:147-168): rewards in any other dtype raise "addmv input tensors must have the same dtype".
# ---------------------------------------------------------------------------------------------
def _kind_handle(entry: str):
    repos = parse_repos(None)
    if "nemo-rl" not in repos:
        pytest.skip("git-only: set MASKFUZZ_REPOS=nemo-rl=/path/to/NeMo-RL-clone-or-mirror")
    return open_target(f"nemo-rl:{entry}@7ea279abfbeb", repos=repos)


def _kind_verdicts(handle, case: Case) -> dict:
    from maskfuzz.oracles.kinds.judge import judge as kind_judge

    return {v.property: v for v in kind_judge(handle.run, case, handle.declared.configured(case))}


def test_kind_entries_are_declared():
    spec = nemo_rl.SPEC
    assert spec.entries == (
        "default",
        "grpo",
        "rloo",
        "grpo-loo",
        "agg-token-level",
        "agg-sequence-level",
        "value-loss",
        "kl",
        "whiten",
        "policy-loss",
    )
    assert spec.declared("kl").variant == {"estimator": "k3", "clamp_d": (-20.0, 20.0), "clamp": (-10.0, 10.0)}
    assert spec.declared("whiten").variant["eps_place"] == "var" and spec.declared("whiten").kind == "normalization"
    assert spec.declared("value-loss").variant == {"clip": 0.2, "half": True, "mode": "token-mean"}
    # global_valid_seqs = sum(sample_mask) counts rows without a trained token (data.py:409): the variant
    assert spec.declared("agg-token-level").variant == {"mode": "token-mean", "empty_rows": "counted"}
    assert spec.declared("agg-sequence-level").variant == {"mode": "seq-mean-token-mean", "empty_rows": "counted"}
    assert spec.declared("grpo").variant["singleton"] == "zero" and spec.declared("rloo").variant["estimator"] == "rloo"
    # valid_mask = ones (advantage_estimator.py:85), the mask "Used only for expanding advantages" (:75-76)
    assert all(spec.declared(e).variant["empty_rows"] == "counted" for e in ("grpo", "rloo", "grpo-loo"))
    for entry in spec.entries:  # no sample_mask 0 row in a group of its own: no padding rows anywhere
        assert not spec.declared(entry).domain.padding_rows


def test_grpo_and_rloo_hand_computed():
    with _kind_handle("grpo") as h:
        assert h.info["where"] == "nemo_rl/algorithms/advantage_estimator.py::GRPOAdvantageEstimator.compute_advantage"
        case = Case.build(trainable=[[1, 1]] * 4, score=[1, 0, 2, 5], group=[4, 4, 1, 4])
        (adv,) = h.run(case)
        s = math.sqrt(7) + 1e-6  # group 4: 1, 0, 5: mean 2, unbiased std sqrt(14 / 2)
        assert adv[:, 0].tolist() == pytest.approx([-1 / s, -2 / s, 0.0, 3 / s], rel=1e-5)  # singleton: 0
        v = _kind_verdicts(h, case)
        assert v["reference"].status == "pass" and v["group-isolation"].status == "pass"
        masked = Case.build(trainable=[[1, 1], [1, 1], [0, 0]], score=[1, 0, 7], group=[0, 0, 0])
        # the loss-masked row counts in the group: the declared variant (empty_rows "counted"), not a finding
        assert _kind_verdicts(h, masked)["reference"].status == "pass"
        with pytest.raises(Exception, match="same dtype"):
            h.run(case.replace(dtype="bfloat16"))
        result = fuzz_target(
            h.run,
            h.declared,
            target="nemo-rl:grpo",
            pin="7ea279abfbeb",
            max_examples=40,
            seed=0,
            derandomize=True,
            shrink=False,
        )
        bad = {p for p, n in result.failed.items() if n}
        # permutation may fail through rounding alone: the one-pass variance cancels at large offsets (precision)
        assert "no-crash" in bad and not bad & {"poison", "group-isolation", "deterministic"}, bad
    with _kind_handle("rloo") as h:
        case = Case.build(trainable=[[1, 1]] * 4, score=[1, 0, 2, 5], group=[4, 4, 1, 4])
        (adv,) = h.run(case)
        assert adv[:, 0].tolist() == pytest.approx([1 - 2.5, 0 - 3.0, 0.0, 5 - 0.5])
        assert _kind_verdicts(h, case)["reference"].status == "pass"


def test_grpo_with_the_leave_one_out_baseline_and_std_hand_computed():
    """NeMo-RL's defaults (use_leave_one_out_baseline and normalize_rewards): group [1, 0, 3] divides
    by the others' unbiased std (+1e-6); group [5, 2, 2] leaves row 0 raw (others equal, std 0);
    a group of two has no std of the others: the raw difference."""
    with _kind_handle("grpo-loo") as h:
        case = Case.build(trainable=[[1]] * 8, score=[1, 0, 3, 1, 0, 5, 2, 2], group=[0, 0, 0, 1, 1, 2, 2, 2])
        (adv,) = h.run(case)
        expected = [
            -0.5 / (math.sqrt(4.5) + 1e-6),  # others 0, 3: mean 1.5, std sqrt(4.5)
            -2.0 / (math.sqrt(2.0) + 1e-6),  # others 1, 3
            2.5 / (math.sqrt(0.5) + 1e-6),  # others 1, 0
            1.0,
            -1.0,
            3.0,
            -1.5 / (math.sqrt(4.5) + 1e-6),
            -1.5 / (math.sqrt(4.5) + 1e-6),
        ]
        assert adv[:, 0].tolist() == pytest.approx(expected, rel=1e-5)
        assert _kind_verdicts(h, case)["reference"].status == "pass"


# ---------------------------------------------------------------------------------------------
# Loss aggregation: ClippedPGLossFn's actor_loss block (masked_mean with global_normalization_factor) compiled from
# the pin, with the worker's global_valid_toks / global_valid_seqs and `loss * dp_size` (calls_kinds.load_loss).
# row 0: 2 tokens (losses 1, 3), row 1: 1 token (loss 2), row 2: none; 100 under the mask; micro-batches {0}, {1, 2}
# ---------------------------------------------------------------------------------------------
AGG_STEP = Case.build(
    trainable=[[1, 1, 0], [1, 0, 0], [0, 0, 0]],
    extra={"loss": [[1.0, 3.0, 100.0], [2.0, 100.0, 100.0], [100.0, 100.0, 100.0]]},
    split=[0, 1, 1],
)
AGG_FUZZ = {  # entry -> properties that fail on a short fuzz (all others pass)
    "agg-token-level": {"poison-nonfinite"},  # sum(values * mask): NaN * 0
    # global_valid_seqs = sum(sample_mask) counts the rows without a trained token (data.py:409): the declared
    # variant now; in float16 the inner masked_mean of an empty row divides by 0 + 1e-8 and its backward 1 / 1e-8
    # overflows to inf, times the 0 mask: NaN gradient (empty-step, masked-zero); NeMo-RL's losses are float32
    "agg-sequence-level": {"poison-nonfinite", "empty-step", "masked-zero"},
}


@pytest.mark.needs_mirror
def test_agg_token_level_is_the_global_token_mean():
    with _kind_handle("agg-token-level") as h:
        assert h.info["where"].startswith("nemo_rl/algorithms/loss/loss_functions.py::ClippedPGLossFn.__call__")
        loss, grad = h.run(AGG_STEP)
        assert loss[0, 0].item() == pytest.approx(2.0)  # 4 / 3 + 2 / 3, both over global_valid_toks = 3
        assert grad.flatten().tolist() == pytest.approx([1 / 3, 1 / 3, 0, 1 / 3, 0, 0, 0, 0, 0])
        v = _kind_verdicts(h, AGG_STEP)
        assert all(v[p].status == "pass" for p in ("reference", "poison", "split-invariance")), v


@pytest.mark.needs_mirror
def test_agg_sequence_level_counts_the_empty_row():
    with _kind_handle("agg-sequence-level") as h:
        loss, grad = h.run(AGG_STEP)
        # row means 2 and 2 over global_valid_seqs = 3 sample_mask rows, the empty one included: 4/3, not 2
        assert loss[0, 0].item() == pytest.approx(4.0 / 3.0)
        assert grad[0].tolist() == pytest.approx([1 / 6, 1 / 6, 0]) and grad[1, 0].item() == pytest.approx(1 / 3)
        v = _kind_verdicts(h, AGG_STEP)
        # counting the empty row is the declared variant (empty_rows "counted"): the reference holds
        assert all(v[p].status == "pass" for p in ("reference", "split-invariance", "poison")), v


@pytest.mark.needs_mirror
@pytest.mark.parametrize("entry", list(AGG_FUZZ))
def test_agg_short_fuzz(entry):
    with _kind_handle(entry) as h:
        res = fuzz_target(
            h.run,
            h.declared,
            target=f"nemo-rl:{entry}",
            pin="7ea279abfbeb",
            max_examples=60,
            seed=0,
            derandomize=True,
            shrink=False,
        )
        failed = {p for p, n in res.failed.items() if n}
        if entry == "agg-token-level":
            # token_level_loss=False is the sequence-level aggregation: its findings, and only under that option
            assert AGG_FUZZ[entry] <= failed <= AGG_FUZZ["agg-sequence-level"], failed
            for f in res.findings:
                assert f.property == "poison-nonfinite" or f.case.options.get(nemo_rl.TOKEN_LEVEL) is False, f
        else:
            # masked-zero only on the float16 empty-row draws (see AGG_FUZZ)
            assert AGG_FUZZ[entry] - {"masked-zero"} <= failed <= AGG_FUZZ[entry], failed
        assert res.checked["split-invariance"] > 0
        for name, per in res.options_checked.items():
            assert all(n > 0 for n in per.values()), (name, per)


# ---------------------------------------------------------------------------------------------
# Value loss: MseValueLossFn.__call__ compiled from the pin, cliprange 0.2, scale 1, with the value worker's
# global_valid_toks and `loss * dp_size` (calls_kinds.load_value). Micro-batches {0}, {1}, both over 2 tokens.
# row 0: v 1.1, v_old 1, R 0: inside the clip range, l = 0.5 * 1.21, dl/dv = 1.1;
# row 1: v 2, v_old 1, R 3: clipped to 1.2, (1.2 - 3)^2 = 3.24 > (2 - 3)^2 = 1, l = 1.62, dl/dv = 0; 50 under the mask
# ---------------------------------------------------------------------------------------------
VALUE_STEP = Case.build(
    trainable=[[1, 0], [1, 0]],
    extra={"v": [[1.1, 50.0], [2.0, 50.0]], "v_old": [[1.0, 0.0], [1.0, 0.0]], "ret": [[0.0, 9.0], [3.0, 9.0]]},
    split=[0, 1],
)


@pytest.mark.needs_mirror
def test_value_loss_hand_computed_global_token_mean():
    with _kind_handle("value-loss") as h:
        assert h.info["where"] == "nemo_rl/algorithms/loss/loss_functions.py::MseValueLossFn.__call__"
        loss, grad = h.run(VALUE_STEP)
        assert loss[0, 0].item() == pytest.approx((0.605 + 1.62) / 2, rel=1e-5)
        assert grad.flatten().tolist() == pytest.approx([0.55, 0.0, 0.0, 0.0], rel=1e-5)
        assert {p for p, v in _kind_verdicts(h, VALUE_STEP).items() if v.failed} == set()
        res = fuzz_target(
            h.run,
            h.declared,
            target="nemo-rl:value-loss",
            pin="7ea279abfbeb",
            max_examples=40,
            seed=0,
            derandomize=True,
            shrink=False,
        )
        failed = {p for p, n in res.failed.items() if n}
        # sum(loss * mask) keeps NaN under the mask: the loss (poison-nonfinite) and its gradient (masked-zero)
        assert failed == {"poison-nonfinite", "masked-zero"}, failed
        # the global token count makes the step split-invariant (one micro-batch per row, on two ranks too)
        for split, ranks in (([0, 1], 1), ([0, 1], 2)):
            cut = VALUE_STEP.replace(split=split, ranks=ranks)
            assert _kind_verdicts(h, cut)["split-invariance"].status == "pass"


@pytest.mark.needs_mirror
def test_value_loss_not_present_before_ppo():
    repos = parse_repos(None)
    if "nemo-rl" not in repos:
        pytest.skip("git-only: set MASKFUZZ_REPOS=nemo-rl=/path/to/NeMo-RL-clone-or-mirror")
    with pytest.raises(Skip, match="MseValueLossFn is not present"):
        with open_target(f"nemo-rl:value-loss@{BEFORE_PIN}", repos=repos):
            pass


# ---------------------------------------------------------------------------------------------
# Options and truncation, by hand. Two rows, V = 0, gamma = lam = 1, scores 1 and 3; row 1 cut by the length limit.
# unwhitened: A = [[1, 1], [3, -]]. whitened (default): trained values 1, 1, 3: mean 5/3, unbiased var
# ((2/3)^2 * 2 + (4/3)^2) / 2 = 4/3: A = (1 - 5/3) / sqrt(4/3) = -0.57735, (3 - 5/3) / sqrt(4/3) = 1.1547.
# ppo.overlong_filtering: the cut row's loss_multiplier is 0; 7ea multiplies it into the estimator's mask, so the
# row is all-masked: A = [[1, 1], [0, 0]] (unwhitened). 857b hands the estimator token_mask alone: the cut row keeps
# its advantage and enters the whitening statistics (the reference, row masked, disagrees).
# ---------------------------------------------------------------------------------------------
CUT = Case.build(
    trainable=[[1, 1], [1, 0]],
    score=[1.0, 3.0],
    gamma=1.0,
    lam=1.0,
    dtype="float64",
    truncated=[False, True],
    bootstrap=[0.0, 5.0],
)


@pytest.mark.needs_mirror
def test_gae_options_and_overlong_filtering_by_hand(pinned):
    raw, _ = pinned.run(CUT.replace(options=RAW))
    assert raw.flatten().tolist() == pytest.approx([1.0, 1.0, 3.0, 0.0])  # terminal: the bootstrap 5 is never read
    white, _ = pinned.run(CUT)
    assert white.flatten().tolist() == pytest.approx([-0.57735, -0.57735, 1.1547, 0.0], abs=1e-4)
    filtered, _ = pinned.run(CUT.replace(options={**RAW, nemo_rl.OVERLONG: True}))
    # the filtered row's own advantages are never trained (no expected value there): unwhitened, both pins pass;
    # whitened (the default), 857b's statistics still count the filtered row, so the kept row gets -0.577, not 0
    raw_v = {
        x.property: x for x in judge(pinned.run, CUT.replace(options={**RAW, nemo_rl.OVERLONG: True}), pinned.declared)
    }
    white_v = {x.property: x for x in judge(pinned.run, CUT.replace(options={nemo_rl.OVERLONG: True}), pinned.declared)}
    assert raw_v["reference"].status == "pass"
    if pinned.pin.startswith("7ea"):
        assert filtered.tolist() == [[1.0, 1.0], [0.0, 0.0]] and white_v["reference"].status == "pass"
    else:
        assert filtered.tolist() == [[1.0, 1.0], [3.0, 0.0]] and white_v["reference"].failed
        assert white_v["reference"].observed == pytest.approx([-0.5773503, -0.5773503])


@pytest.mark.needs_mirror
def test_grpo_normalize_rewards_off_by_hand():
    with _kind_handle("grpo") as h:
        # group 4: 1, 0, 5: mean 2, no std division: -1, -2, 3; the singleton group 1: 0
        case = Case.build(trainable=[[1, 1]] * 4, score=[1, 0, 2, 5], group=[4, 4, 1, 4])
        off = case.replace(options={nemo_rl.NORMALIZE_REWARDS: False})
        (adv,) = h.run(off)
        assert adv[:, 0].tolist() == [-1.0, -2.0, 0.0, 3.0]
        assert _kind_verdicts(h, off)["reference"].status == "pass"


@pytest.mark.needs_mirror
def test_agg_options_and_overlong_filtering_by_hand():
    cut = AGG_STEP.replace(truncated=torch.tensor([True, False, False]))
    with _kind_handle("agg-token-level") as h:
        # token_level_loss=False: row means 2 and 2 over global_valid_seqs = 3 (the empty row counted): 4/3
        loss, _ = h.run(AGG_STEP.replace(options={nemo_rl.TOKEN_LEVEL: False}))
        assert loss[0, 0].item() == pytest.approx(4.0 / 3.0)
        # overlong filtering: row 0 (cut) leaves: loss 2 over 1 token = 2, all the gradient on row 1
        on = cut.replace(options={nemo_rl.GRPO_OVERLONG: True})
        loss, grad = h.run(on)
        assert loss[0, 0].item() == pytest.approx(2.0) and grad.flatten().tolist() == [0, 0, 0, 1, 0, 0, 0, 0, 0]
        assert _kind_verdicts(h, on)["reference"].status == "pass"
        loss, _ = h.run(cut)  # filtering off: the cut row is trained like any other (4 / 3 + 2 / 3)
        assert loss[0, 0].item() == pytest.approx(2.0)
    with _kind_handle("agg-sequence-level") as h:
        # row 1's mean 2 over global_valid_seqs = sum(sample_mask) = 2 (rows 1 and the empty row 2): 1
        loss, grad = h.run(cut.replace(options={nemo_rl.GRPO_OVERLONG: True}))
        assert loss[0, 0].item() == pytest.approx(1.0) and grad[0].tolist() == [0.0, 0.0, 0.0]


@pytest.mark.needs_mirror
def test_value_loss_overlong_filtering_by_hand():
    with _kind_handle("value-loss") as h:
        # row 1 cut and filtered: row 0 alone, l = 0.605 over 1 token, dl/dv = 2 * 0.5 * 1.1 = 1.1
        on = VALUE_STEP.replace(truncated=torch.tensor([False, True]), options={nemo_rl.OVERLONG: True})
        loss, grad = h.run(on)
        assert loss[0, 0].item() == pytest.approx(0.605, rel=1e-5)
        assert grad.flatten().tolist() == pytest.approx([1.1, 0.0, 0.0, 0.0], rel=1e-5)
        assert _kind_verdicts(h, on)["reference"].status == "pass"


@pytest.mark.needs_mirror
def test_grpo_at_the_first_pin_reads_a_dict_config():
    """857b's GRPOAdvantageEstimator reads estimator_config["normalize_rewards"] (a TypedDict), 7ea reads attributes:
    the adapter's config answers both. Same case as above, normalize_rewards off: -1, -2, 0, 3."""
    repos = parse_repos(None)
    if "nemo-rl" not in repos:
        pytest.skip("git-only: set MASKFUZZ_REPOS=nemo-rl=/path/to/NeMo-RL-clone-or-mirror")
    with open_target(f"nemo-rl:grpo@{FIRST_PIN}", repos=repos) as h:
        case = Case.build(trainable=[[1, 1]] * 4, score=[1, 0, 2, 5], group=[4, 4, 1, 4])
        (adv,) = h.run(case.replace(options={nemo_rl.NORMALIZE_REWARDS: False}))
        assert adv[:, 0].tolist() == [-1.0, -2.0, 0.0, 3.0]
        (adv,) = h.run(case)
        s = math.sqrt(7) + 1e-6
        assert adv[:, 0].tolist() == pytest.approx([-1 / s, -2 / s, 0.0, 3 / s], rel=1e-5)


# ---------------------------------------------------------------------------------------------
# KL: the per-token KL-to-reference term of ClippedPGLossFn.__call__ compiled from the pin (its calculate_kl from
# the source), reference_policy_kl_penalty 1 (calls_kinds.load_kl). logr = ref - logp, d = logp - ref:
#   d = 0.5:  k3 exp(-0.5) - 1 + 0.5 = 0.1065307;  k1 0.5;  k2 0.125
#   d = -28:  logr 28 clamped to 20 (input clamp): k3 exp(20) - 1 - 20 = 4.85165e8 -> output clamp 10; k1 -20 -> -10;
#             unclamped: k2 28^2 / 2 = 392, k3 exp(28) - 29
#   d = 39.5: logr -39.5 -> -20: k3 exp(-20) - 1 + 20 = 19.0000000021 -> 10; k1 20 -> 10; unclamped k2 780.125
#   a NaN logp at the masked position: NaN there (no mask inside; the reduction's masked_mean masks)
# ---------------------------------------------------------------------------------------------
KL_CASE = Case.build(
    trainable=[[1, 1, 1, 0]],
    extra={"logp": [[-1.0, -30.0, -0.5, 50.0]], "ref_logp": [[-1.5, -2.0, -40.0, 0.0]]},
    dtype="float64",
)
KL_EXPECTED = [  # (options, the three trainable values)
    ({}, [math.exp(-0.5) - 0.5, 10.0, 10.0]),
    ({nemo_rl.KL_TYPE: "k1"}, [0.5, -10.0, 10.0]),
    ({nemo_rl.KL_TYPE: "k2", nemo_rl.KL_IN_CLAMP: None, nemo_rl.KL_OUT_CLAMP: None}, [0.125, 392.0, 780.125]),
    ({nemo_rl.KL_OUT_CLAMP: None}, [math.exp(-0.5) - 0.5, math.exp(20) - 21, 19 + math.exp(-20)]),
    ({nemo_rl.KL_IN_CLAMP: None, nemo_rl.KL_OUT_CLAMP: None}, [math.exp(-0.5) - 0.5, math.exp(28) - 29, 38.5]),
]


def _kind_at(entry: str, pin: str):
    repos = parse_repos(None)
    if "nemo-rl" not in repos:
        pytest.skip("git-only: set MASKFUZZ_REPOS=nemo-rl=/path/to/NeMo-RL-clone-or-mirror")
    return open_target(f"nemo-rl:{entry}@{pin}", repos=repos)


@pytest.mark.needs_mirror
@pytest.mark.parametrize("pin", [HEAD_PIN, FIRST_PIN])
def test_kl_term_by_hand_under_every_option(pin):
    with _kind_at("kl", pin) as h:
        assert h.info["where"] == (
            "nemo_rl/algorithms/loss/loss_functions.py::ClippedPGLossFn.__call__ (KL-to-reference term, per token)"
        )
        for options, expected in KL_EXPECTED:
            case = KL_CASE.replace(options=options)
            (kl,) = h.run(case)
            assert kl[0, :3].tolist() == pytest.approx(expected, rel=1e-9), options
            v = _kind_verdicts(h, case)
            assert all(v[p].status == "pass" for p in ("reference", "poison", "pad-invariance")), (options, v)
        nan = KL_CASE.replace(extra={**KL_CASE.extra, "logp": torch.tensor([[-1.0, -30.0, -0.5, float("nan")]])})
        (kl,) = h.run(nan)
        assert torch.isnan(kl[0, 3]) and kl[0, :3].tolist() == pytest.approx(KL_EXPECTED[0][1], rel=1e-9)
        assert _kind_verdicts(h, nan)["poison-nonfinite"].status == "pass"  # NaN stays at its masked position


@pytest.mark.needs_mirror
def test_kl_short_fuzz_finds_nothing():
    with _kind_handle("kl") as h:
        res = fuzz_target(
            h.run, h.declared, target="nemo-rl:kl", pin=HEAD_PIN, max_examples=100, seed=0, derandomize=True
        )
        assert not res.findings, [(f.property, f.message) for f in res.findings]
        assert res.checked["reference"] > 0
        for name, per in res.options_checked.items():
            assert all(n > 0 for n in per.values()), (name, per)


# ---------------------------------------------------------------------------------------------
# Normalization: GeneralizedAdvantageEstimator._reward_whiten compiled from the pin, with the mask the PPO loop
# hands the estimator (7ea: int64 token_mask * float32 sample_mask; 857b: int64 token_mask).
# x trained 1, 2 | 3: mean 6 / 3 = 2, unbiased var (1 + 0 + 1) / 2 = 1, (x - 2) * rsqrt(1 + 1e-8): -1, 0 | 1;
# the masked 9 and 7 are whitened too (7, 5), 0 -> -2 (the caller masked_fills them afterwards).
# ---------------------------------------------------------------------------------------------
WHITEN_CASE = Case.build(trainable=[[1, 1, 0], [1, 0, 0]], extra={"x": [[1.0, 2.0, 9.0], [3.0, 7.0, 0.0]]})


@pytest.mark.needs_mirror
@pytest.mark.parametrize("pin", [HEAD_PIN, FIRST_PIN])
def test_whiten_by_hand(pin):
    with _kind_at("whiten", pin) as h:
        assert (
            h.info["where"] == "nemo_rl/algorithms/advantage_estimator.py::GeneralizedAdvantageEstimator._reward_whiten"
        )
        (out,) = h.run(WHITEN_CASE)
        assert out.flatten().tolist() == pytest.approx([-1.0, 0.0, 7.0, 1.0, 5.0, -2.0], abs=1e-6)
        assert _kind_verdicts(h, WHITEN_CASE)["reference"].status == "pass"
        # NaN under the mask: sum(values * mask) keeps NaN * 0 (utils.py:224 at 7ea), every output NaN
        nan = WHITEN_CASE.replace(extra={"x": torch.tensor([[1.0, 2.0, float("nan")], [3.0, 7.0, 0.0]])})
        (out,) = h.run(nan)
        assert torch.isnan(out).all()
        assert _kind_verdicts(h, nan)["poison-nonfinite"].failed
        # constant advantages: sum(mask) + 1e-8 is float32 (int64 / float32 mask), so the 1e-8 rounds away and
        # x - mean is exactly 0, even for float64 advantages; in float16 the statistics are float32 0-dim tensors,
        # so rsqrt(0 + 1e-8) stays finite
        for dtype in ("float64", "float16"):
            flat = Case.build(trainable=[[1, 1]], extra={"x": [[256.0, 256.0]]}, dtype=dtype)
            (out,) = h.run(flat)
            assert out.tolist() == [[0.0, 0.0]], dtype


@pytest.mark.needs_mirror
def test_whiten_short_fuzz_finds_only_nan_through_the_mask():
    with _kind_handle("whiten") as h:
        res = fuzz_target(
            h.run, h.declared, target="nemo-rl:whiten", pin=HEAD_PIN, max_examples=40, seed=0, derandomize=True
        )
        failed = {p for p, n in res.failed.items() if n}
        assert failed == {"poison-nonfinite"}, failed
        assert res.checked["affine"] > 0 and res.checked["reference"] > 0


def test_kl_and_whiten_loaders_fail_loudly_on_other_shapes(tmp_path):
    from maskfuzz.targets.nemo_rl import calls_kinds as nemo_rl_kinds

    loss = tmp_path / "nemo_rl" / "algorithms" / "loss" / "loss_functions.py"
    loss.parent.mkdir(parents=True)
    # a KL term that no longer goes through calculate_kl: not the code the entry judges
    loss.write_text(
        "class ClippedPGLossFn:\n"
        "    def __call__(self, x):\n"
        "        if self.reference_policy_kl_penalty != 0:\n"
        "            kl = x * 2\n"
        "        return kl\n"
    )
    with pytest.raises(BlockNotFound, match="calculate_kl"):
        nemo_rl_kinds.load_kl(tmp_path, "kl")
    _tree(
        tmp_path, "class GeneralizedAdvantageEstimator:\n    def _reward_whiten(self, x, m):\n        return self.a\n"
    )
    with pytest.raises(BlockNotFound, match="attribute of `self`"):
        nemo_rl_kinds.load_whiten(tmp_path, "whiten")
    _tree(tmp_path, "class GeneralizedAdvantageEstimator:\n    pass\n")
    with pytest.raises(NotPresent, match="_reward_whiten is not present"):
        nemo_rl_kinds.load_whiten(tmp_path, "whiten")


# ---------------------------------------------------------------------------------------------
# Policy loss: ClippedPGLossFn.__call__ whole, with its __init__ on ClippedPGLossConfig's defaults read from the pin
# (ratio_clip 0.2 / 0.2, no dual clip, token_level_loss), reference_policy_kl_penalty 0 (calls_kinds.load_policy).
# r = exp(logp - old_logp), l = max(-A r, -A clamp(r, 0.8, 1.2)), token-mean over the 5 trained tokens of the step
# (global_valid_toks), micro-batches {0}, {1}:
#   (0, 0) r = 1, A = 1: l = -1, dl/dlogp = -1;  (0, 1) r = e^0.3 = 1.35, A = 1: the clip binds, l = -1.2, slope 0;
#   (1, 0) r = e^-0.3 = 0.74, A = 1: below the range but the unclipped term is the max, l = -r, slope -r;
#   (1, 1) r = e^1.5 = 4.48, A = -1: l = r, slope r (ratio_clip_c = 3: l = 3, slope 0);  (1, 2) A = 0: 0, slope 0.
#   (0, 2) masked: 100 there changes nothing; NaN there reaches the loss (masked_mean sums values * mask).
# ---------------------------------------------------------------------------------------------
def _policy_step(masked: float = 100.0) -> Case:
    return Case.build(
        trainable=[[1, 1, 0], [1, 1, 1]],
        extra={
            "logp": [[-1.0, -0.7, masked], [-1.3, 0.5, -1.0]],
            "old_logp": [[-1.0, -1.0, -1.0], [-1.0, -1.0, -1.0]],
            "adv": [[1.0, 1.0, masked], [1.0, -1.0, 0.0]],
        },
        split=[0, 1],
        dtype="float64",
    )


def test_policy_loss_declares_the_default_configuration():
    d = nemo_rl.SPEC.declared("policy-loss")
    assert d.kind == "policy-loss"
    assert d.variant == {
        "clip_low": 0.2,
        "clip_high": 0.2,
        "dual_clip": None,
        "advantages": "token",
        "mode": "token-mean",
        "empty_rows": "counted",
    }
    assert [o.name for o in d.options] == [nemo_rl.TOKEN_LEVEL, nemo_rl.RATIO_CLIP_C, nemo_rl.GRPO_OVERLONG]


@pytest.mark.needs_mirror
@pytest.mark.parametrize("pin", [HEAD_PIN, FIRST_PIN, BEFORE_PIN])
def test_policy_loss_hand_computed(pin):
    lo, hi = math.exp(-0.3), math.exp(1.5)
    with _kind_at("policy-loss", pin) as h:
        assert h.info["where"] == "nemo_rl/algorithms/loss/loss_functions.py::ClippedPGLossFn.__call__"
        loss, grad = h.run(_policy_step())
        assert loss[0, 0].item() == pytest.approx((-1.0 - 1.2 - lo + hi + 0.0) / 5, rel=1e-12)
        assert grad.flatten().tolist() == pytest.approx([-0.2, 0.0, 0.0, -lo / 5, hi / 5, 0.0], rel=1e-12)
        assert {p for p, v in _kind_verdicts(h, _policy_step()).items() if v.failed} == set()
        # ratio_clip_c = 3 (option): the A < 0 token is capped at -A c = 3, its slope 0
        dual = _policy_step().replace(options={nemo_rl.RATIO_CLIP_C: 3.0})
        loss, grad = h.run(dual)
        assert loss[0, 0].item() == pytest.approx((-1.0 - 1.2 - lo + 3.0) / 5, rel=1e-12)
        assert grad[1, 1].item() == 0.0 and _kind_verdicts(h, dual)["reference"].status == "pass"
        # a NaN under the mask: masked_mean's sum(values * mask) (nemo_rl/algorithms/utils.py:224 at 7ea) is NaN
        loss, grad = h.run(_policy_step(math.nan))
        assert math.isnan(loss[0, 0].item()) and math.isnan(grad[0, 2].item())
        assert grad[1].tolist() == pytest.approx([-lo / 5, hi / 5, 0.0], rel=1e-12)


@pytest.mark.needs_mirror
def test_policy_loss_short_fuzz():
    with _kind_at("policy-loss", HEAD_PIN) as h:
        res = fuzz_target(
            h.run,
            h.declared,
            target="nemo-rl:policy-loss",
            pin=HEAD_PIN,
            max_examples=15,
            seed=0,
            derandomize=True,
            shrink=False,
        )
        failed = {p for p, n in res.failed.items() if n}
        # clip_loss is masked by multiplication: masked_mean(importance_weights * clip_loss, mask) = sum(values *
        # mask) (loss_functions.py:678-683, utils.py:224 at 7ea), so NaN under the mask, or a masked log-ratio
        # whose exp overflows (r = inf, -A r = +-inf or NaN, times 0), reaches the loss and the gradient
        assert failed == POLICY_FUZZ, failed
        assert res.checked["reference"] > 0  # split-invariance: the hand case (two micro-batches)


POLICY_FUZZ = {"poison-nonfinite", "masked-zero"}  # the 100-example CLI run adds no-crash / empty-step (overflow)

"""verl through its adapter: `compute_gae_advantage_return` from the wheel (or commit) at each pin,
the score placed by verl's own reward manager, judged by the oracle.

The verdicts asserted here were derived by reading verl's code:

* 0.1 ... 0.4.1 (`core_algos.py`): a plain GAE loop over every position; the mask (`eos_mask`, later
  `response_mask`) only enters `masked_whiten`. A value or reward at a masked position bootstraps
  into the trained tokens (poison leaks; the seed report's [5.7, 6.0] in the returns), and each
  masked gap token is a transition (with masked values and rewards zero: the `dense` contract).
* 0.5.0 ... 0.9.1 (#2337): `nextvalues` and `lastgaelam` are carried through masked positions, so
  finite poison never matters and a gap costs nothing (the `compressed` contract) -- but the
  carry is `x * mask + (1 - mask) * carry`, and NaN * 0 is NaN: non-finite poison leaks.
* Every pin: the reward manager writes the score at `valid_response_length - 1`, the last
  *attended* response token. With an observation tail (real, masked) that is a masked position:
  0.5+ skips it (the score is lost at any gamma), 0.4.1 keeps it out of reach at gamma = 0.
* `masked_var(unbiased=True)` raises ValueError for fewer than two masked-in elements: declared.

Release pins download wheels (network marker); the git pins need MASKFUZZ_REPOS=verl=/path.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import re

import pytest
import torch

from maskfuzz.fuzz.engine import fuzz_target
from maskfuzz.fuzz.triage import judge_finding, retriage
from maskfuzz.oracles.case import Case
from maskfuzz.oracles.kinds.dispatch import judge
from maskfuzz.oracles.kinds.gae.reference import reference
from maskfuzz.oracles.promises import broken
from maskfuzz.oracles.strategies import Sizes
from maskfuzz.oracles.verdict import TargetFailure
from maskfuzz.oracles.whitening import masked_whiten
from maskfuzz.targets.adapters.base import NotPresent
from maskfuzz.targets.runtime.repos import parse_repos
from maskfuzz.targets.runtime.session import SetupError, open_target
from maskfuzz.targets.verl import calls as verl_calls
from maskfuzz.targets.verl import declare as verl

OLD, NEW = "0.4.1", "0.9.1"  # the last plain-loop release and the newest (masked carry) release
MASKING = "0332866857d541f5bd4f46ee4d9bd782a6354aa3"  # #2337 "mask out observation token in GAE"
BEFORE = "11ee5125d269d657f1edf101d627b4b599eaceae"  # its parent
DECLARED = verl.SPEC.declared()

# The seed report's case: a masked padding slot with a poisoned value.
SEED = Case.build(trainable=[[1, 1, 0]], token_rewards=[[0, 1, 0]], values=[[0, 0, 100]], gamma=1.0, lam=0.95)
# semantics.md example 2 (a gap of real tokens with poisoned values), plus an all-trainable row so
# that the batch whitening is not degenerate.
GAP = Case.build(
    trainable=[[1, 0, 0, 1], [1, 1, 1, 1]],
    values=[[0.5, 9, 9, 0.25], [0.1, 0.2, 0.3, 0.4]],
    score=[1.0, 0.5],
    gamma=0.9,
    lam=0.8,
)
# semantics.md example 3: an observation tail at gamma = 0; and the same row with a padding tail.
OBS_TAIL = Case.build(trainable=[[1, 1, 1, 0, 0]], attention=[[1, 1, 1, 1, 1]], score=[1.0], gamma=0.0, lam=0.9)
PAD_TAIL = OBS_TAIL.replace(attention=OBS_TAIL.trainable.clone())


def verdicts(run, case: Case, declared=DECLARED, only=None) -> dict:
    return {v.property: v for v in judge(run, case, declared, only=only)}


@contextlib.contextmanager
def opened(ref: str, repos=None):
    """open_target, skipping (with the reason) when the package index cannot be reached."""
    try:
        with open_target(ref, repos=repos) as h:
            yield h
    except SetupError as exc:
        if "no network" in str(exc) or "cannot reach" in str(exc):
            pytest.skip(f"{ref}: {exc}")
        raise


@pytest.fixture(scope="module")
def old():
    with opened(f"verl@{OLD}") as h:
        yield h


@pytest.fixture(scope="module")
def new():
    with opened(f"verl@{NEW}") as h:
        yield h


# ---------------------------------------------------------------------------------------------
# Release pins.
# ---------------------------------------------------------------------------------------------
@pytest.mark.network
def test_the_function_and_the_reward_manager_come_from_the_wheel(old, new):
    for h in (old, new):
        assert h.info["where"] == "verl/trainer/ppo/core_algos.py::compute_gae_advantage_return"
        assert any("NaiveRewardManager" in n for n in h.info["notes"]), h.info["notes"]
        assert "torch_npu" not in h.info["stand_ins_used"]  # deny-listed: stays missing
        assert h.resolved == f"verl=={h.pin}"


def triaged(h, case: Case, prop: str) -> dict:
    """The triage of `case`'s failure of `prop` at the handle's pin (fuzz.triage.retriage: promise, reach, class)."""
    (v,) = [v for v in judge(h.run, case, h.declared, only=(prop,)) if v.property == prop]
    assert v.failed, v
    return retriage(h.run, v.case or case, v, h.declared, "verl")


@pytest.mark.network
def test_seed_poison_leaks_before_2337_and_not_after(old, new):
    _, ret = old.run(SEED)
    assert ret[0, :2].tolist() == pytest.approx([5.7, 6.0], rel=1e-6)  # the seed report's buggy numbers
    v = verdicts(old.run, SEED)
    assert v["poison"].failed and v["poison"].output == "returns"
    assert v["reference"].failed
    # the row twin adds a clean padding column (what verl's padding holds): nothing there for the plain loop to read
    assert v["row-independence"].status == v["deterministic"].status == "pass"
    # ... but 0.4.1's critics multiply their values by the attention (dp_critic.py:183-184, megatron_critic.py:122-123),
    # the GAE mask at this pin: no value at padding reaches the function, so the leak is a robustness fact here
    t = triaged(old, SEED, "poison")
    assert t["class"] == "robustness" and t["mechanism"] == "masked-value-bootstrap", t

    _, ret = new.run(SEED)
    assert ret[0, :2].tolist() == pytest.approx([0.95, 1.0], rel=1e-6)  # the fixed numbers
    v = verdicts(new.run, SEED)
    for prop in ("no-crash", "poison", "reference", "row-independence", "deterministic"):
        assert v[prop].status == "pass", v[prop]
    assert v["masked-zero"].status == "n/a"  # documented: whitening makes masked positions non-zero


@pytest.mark.network
def test_a_gap_is_compressed_from_2337_and_dense_before(old, new):
    v = verdicts(new.run, GAP)
    for prop in ("poison", "gap-invariance", "reference", "row-independence"):
        assert v[prop].status == "pass", v[prop]
    _, ret = new.run(GAP)
    assert [ret[0, 0].item(), ret[0, 3].item()] == pytest.approx([0.765, 1.0], rel=1e-6)  # compressed Ret

    v = verdicts(old.run, GAP)
    assert v["poison"].failed and v["gap-invariance"].failed and v["reference"].failed
    # With zeros under the mask, the plain loop of 0.4.1 is exactly the dense contract, whitened.
    clean = GAP.replace(values=GAP.values * GAP.trainable)
    adv, ret = old.run(clean)
    ref_adv, ref_ret = reference(clean, "dense")
    ref_adv = masked_whiten(ref_adv, clean.trainable, verl.SPEC.whitening)
    live = clean.trainable
    assert torch.allclose(adv.double()[live], ref_adv[live], rtol=1e-5, atol=1e-5)
    assert torch.allclose(ret.double()[live], ref_ret[live], rtol=1e-6, atol=1e-6)
    dense = dataclasses.replace(DECLARED, contract="dense")
    assert verdicts(old.run, clean, dense, only=("reference",))["reference"].status == "pass"
    assert verdicts(new.run, clean, dense, only=("reference",))["reference"].failed


@pytest.mark.network
@pytest.mark.parametrize("which", ["old", "new"])
def test_the_score_on_an_observation_tail_is_lost(which, request):
    h = request.getfixturevalue(which)
    adv, _ = h.run(OBS_TAIL)
    # verl's reward manager put the score on position 4 (the last attended token, masked); the
    # trained tokens see only zeros, which whiten to zeros
    assert adv[0, :3].tolist() == [0.0, 0.0, 0.0]
    v = verdicts(h.run, OBS_TAIL)
    assert v["score-kept"].failed and v["score-kept"].positions == [[0, 2]]
    assert v["reference"].failed
    # the same row ending in padding: the score lands on the last trained token and is kept
    v = verdicts(h.run, PAD_TAIL)
    assert v["score-kept"].status == "pass" and v["reference"].status == "pass"


@pytest.mark.network
@pytest.mark.parametrize("which", ["old", "new"])
def test_nan_poison_leaks_at_every_pin(which, request):
    h = request.getfixturevalue(which)
    case = SEED.replace(values=[[0, 0, float("nan")]])
    adv, _ = h.run(case)
    assert torch.isnan(adv[0, :2]).all()  # 0.9.1: values * mask with NaN * 0 = NaN
    assert verdicts(h.run, case)["poison-nonfinite"].failed


@pytest.mark.network
def test_too_few_trained_tokens_is_a_documented_error(new):
    for case, text in (
        (Case.build(trainable=[[1, 0]], score=[1.0]), "sum of the mask is one"),
        (Case.build(trainable=[[0, 0]], score=[1.0]), "At least one element"),
    ):
        with pytest.raises(TargetFailure, match=text):  # verl's masked_var ValueError, declared
            new.run(case)
        # the judge treats a case whose declared whitening is undefined as n/a for every property
        v = verdicts(new.run, case)
        assert v["no-crash"].status == "n/a" and "whitening is undefined" in v["no-crash"].message, v["no-crash"]


@pytest.mark.network
def test_fuzzing_the_newest_release_finds_the_lost_score_and_nan_leak_only(new):
    res = fuzz_target(new.run, new.declared, target="verl", pin=NEW, max_examples=80, seed=0, sizes=Sizes(3, 8))
    found = {f.property for f in res.findings}
    assert "poison-nonfinite" in found
    assert found & {"score-kept", "telescoping", "reference"}, found
    assert not found & {"poison", "gap-invariance", "row-independence", "no-crash", "deterministic"}, found
    assert res.checked["poison"] > 0 and res.checked["gap-invariance"] > 0
    for f in res.findings:
        if f.property in ("score-kept", "telescoping", "reference"):
            # every such finding has a row whose real tokens go on after its last trained token
            case = f.case
            pos = torch.arange(case.shape[1])
            last = torch.where(case.trainable, pos, torch.full_like(pos, -1)).max(dim=1).values
            assert (case.attention & (pos > last[:, None])).any(), f.case.summary()


@pytest.mark.network
def test_the_seed_leak_is_a_pipeline_defect_at_the_first_release():
    """0.1's FSDP critic returns raw model outputs at padding (dp_critic.py:54-55, cited as produced): the seed
    report's case is inside the pipeline domain and breaks the universal poison promise, high."""
    seed_pad = SEED.replace(attention=SEED.trainable.clone(), token_rewards=torch.tensor([[0.0, 1.0, 0.0]]))
    with opened("verl@0.1") as h:
        assert h.declared.pipeline.produced_only().rejects(seed_pad) is None
        t = triaged(h, seed_pad, "poison")
        assert t["class"] == "defect" and t["promise"] == "universal:poison", t
        assert t["reach"] == "pipeline" and t["severity"] == "high", t


@pytest.mark.slow
@pytest.mark.network
@pytest.mark.parametrize(
    ("pin", "mask_arg", "compressed"), [("0.1", "eos_mask", False), ("0.5.0", "response_mask", True)]
)
def test_the_first_release_and_the_first_release_with_2337(pin, mask_arg, compressed):
    with opened(f"verl@{pin}") as h:
        assert any(repr(mask_arg) in n for n in h.info["notes"]), h.info["notes"]
        v = verdicts(h.run, GAP)
        for prop in ("poison", "gap-invariance", "reference"):
            assert (v[prop].status == "pass") is compressed, v[prop]
        assert verdicts(h.run, OBS_TAIL)["score-kept"].failed


# ---------------------------------------------------------------------------------------------
# Git pins: #2337 and its parent (needs a local mirror).
# ---------------------------------------------------------------------------------------------
@pytest.mark.network
@pytest.mark.needs_mirror
def test_2337_is_where_the_gap_becomes_compressed():
    repos = parse_repos(None)
    if "verl" not in repos:
        pytest.skip("set MASKFUZZ_REPOS=verl=/path/to/a/verl/clone to check the git pins")
    with opened(f"verl@{BEFORE}", repos) as before:
        v = verdicts(before.run, GAP)
        assert v["gap-invariance"].failed and v["poison"].failed
    with opened(f"verl@{MASKING}", repos) as after:
        assert after.resolved == MASKING
        v = verdicts(after.run, GAP)
        assert v["gap-invariance"].status == v["poison"].status == v["reference"].status == "pass"


# ---------------------------------------------------------------------------------------------
# Pins without the function, and a changed signature: `load` on fake trees, in this process (a
# worker costs seconds to start; the fake `verl` is removed from sys.modules afterwards).
# ---------------------------------------------------------------------------------------------
@pytest.fixture
def fake_tree(fake_package):
    """A function writing a fake verl tree with the given core_algos.py (None: no such module)."""
    return lambda core_algos: fake_package("verl/trainer/ppo", "core_algos.py", core_algos)


def test_a_tree_without_the_function_is_a_skip(fake_tree):
    root = fake_tree("def compute_grpo_outcome_advantage(*a):\n    pass\n")
    with pytest.raises(NotPresent, match="compute_gae_advantage_return"):
        verl_calls.load(root, None)


def test_a_tree_without_core_algos_is_a_skip(fake_tree):
    with pytest.raises(NotPresent, match="verl.trainer.ppo.core_algos"):
        verl_calls.load(fake_tree(None), None)


def test_a_changed_signature_fails_loudly(fake_tree):
    root = fake_tree("def compute_gae_advantage_return(rewards, values, mask, gamma, lam):\n    pass\n")
    with pytest.raises(RuntimeError, match="expected .*response_mask/eos_mask"):
        verl_calls.load(root, None)


def test_pipeline_domain_cites_every_narrowing_and_rejects_what_verl_never_builds():
    """Per pin, every narrowed field cites file:line and rejects one concrete case of its own kind."""
    examples = {  # narrowed field -> (a case outside it, words of the rejection)
        "dtypes": (Case.build(trainable=[[1, 1]], dtype="float64"), "dtype"),
        "gaps": (Case.build(trainable=[[1, 0, 1]]), "gap"),
        "masked_real_tail": (Case.build(trainable=[[1, 1, 0]]), "ends in real non-trainable"),
        "leading_mask": (Case.build(trainable=[[0, 1, 1]]), "starts with real non-trainable"),
        "left_padding": (Case.build(trainable=[[0, 1]], attention=[[0, 1]]), "left-padded"),
        "all_masked_rows": (Case.build(trainable=[[1, 1], [0, 0]]), "no trainable token"),
        "masked_rewards": (
            Case.build(trainable=[[1, 1, 0]], attention=[[1, 1, 0]], token_rewards=[[0, 0, 2]]),
            "token rewards at non-trainable",
        ),
        "masked_values": (
            Case.build(trainable=[[1, 1, 0]], attention=[[1, 1, 0]], values=[[0, 0, 100]]),
            "critic values at non-trainable",
        ),
        "nonfinite_poison": (
            Case.build(trainable=[[1, 1, 0]], attention=[[1, 1, 0]], values=[[0, 0, float("nan")]]),
            "NaN / inf",
        ),
        "empty_rows": (Case.build(trainable=[[1, 1], [0, 0]], attention=[[1, 1], [0, 0]]), "is empty"),
        # the critics zero padding (0.5.0 on) while the Megatron critic keeps a tool token's value
        "padding_values": (
            Case.build(trainable=[[1, 1, 0]], attention=[[1, 1, 0]], values=[[0, 0, 100]]),
            "critic values at non-trainable positions (padding)",
        ),
        "padding_rewards": (
            Case.build(trainable=[[1, 1, 0]], attention=[[1, 1, 0]], token_rewards=[[0, 0, 2]]),
            "token rewards at non-trainable positions (padding)",
        ),
    }
    expected = {
        "0.1": {
            "dtypes",
            "empty_rows",
            "gaps",
            "masked_real_tail",
            "leading_mask",
            "left_padding",
            "all_masked_rows",
            "masked_rewards",
            "nonfinite_poison",
        },
        "0.4.1": {
            "dtypes",
            "empty_rows",
            "gaps",
            "masked_real_tail",
            "leading_mask",
            "left_padding",
            "all_masked_rows",
            "masked_rewards",
            "masked_values",
            "nonfinite_poison",
        },
        "0.5.0": {"dtypes", "left_padding", "masked_rewards", "nonfinite_poison", "padding_values"},
        MASKING: {"dtypes", "left_padding", "masked_rewards", "nonfinite_poison", "padding_values"},
        BEFORE: {"dtypes", "left_padding", "masked_rewards", "nonfinite_poison", "padding_values"},
        "0.9.1": {"dtypes", "left_padding", "nonfinite_poison", "padding_values", "padding_rewards"},
    }
    assert {p.rev for p in verl.SPEC.pins} == set(expected)
    for pin, narrowed in expected.items():
        dom = verl.SPEC.pipeline_at(pin)
        assert dom is not None and dom.cited() == [], (pin, dom and dom.cited())
        assert set(dom.restrictions()) == narrowed, pin
        for name in narrowed:
            case, words = examples[name]
            why = dom.rejects(case)
            assert why is not None and words in why, (pin, name, why)
        # what verl's own pipeline builds at every pin: a right-padded float32 batch, a padding tail
        assert dom.rejects(PAD_TAIL) is None, pin
    # multi-turn (agent loop / sglang) masks reach GAE from #2124 on: gaps and observation tails are allowed
    for pin in ("0.5.0", "0.9.1", MASKING, BEFORE):
        assert verl.SPEC.pipeline_at(pin).rejects(OBS_TAIL) is None
        assert verl.SPEC.pipeline_at(pin).rejects(GAP) is None
    # 0.1's FSDP critic does not mask values: the seed report's padding value is a pipeline input there
    # (its masked token reward is not: the KL is masked), and 0.4.1's critics zero it
    seed_pad = SEED.replace(attention=SEED.trainable.clone(), token_rewards=torch.tensor([[0.0, 1.0, 0.0]]))
    assert verl.SPEC.pipeline_at("0.1").rejects(seed_pad) is None
    assert "critic values" in verl.SPEC.pipeline_at("0.4.1").rejects(seed_pad)


# the features each pin's own code is cited to produce (Domain.produces): what a pipeline witness may use
PRODUCED = {
    "0.1": {"masked_values", "token_rewards", "truncated_rows"},
    "0.4.1": {"token_rewards", "truncated_rows"},
    "0.5.0": {"gaps", "masked_real_tail", "masked_values", "token_rewards", "truncated_rows"},
    MASKING: {"gaps", "masked_real_tail", "masked_values", "token_rewards"},
    BEFORE: {"gaps", "masked_real_tail", "masked_values", "token_rewards"},
    "0.9.1": {
        "gaps",
        "masked_real_tail",
        "leading_mask",
        "all_masked_rows",
        "masked_values",
        "masked_rewards",
        "token_rewards",
        "truncated_rows",
    },
}


def test_production_citations_name_the_producing_lines_and_bound_the_witnesses():
    """Every production citation names the pin and a file:line; a feature nobody cited is no witness's."""
    for pin, feats in PRODUCED.items():
        dom = verl.SPEC.pipeline_at(pin)
        assert set(dom.produces) == feats, pin
        for f, cite in dom.produces.items():
            assert f"verl {pin[:9]}" in cite and re.search(r"[\w/.-]+\.py:\d+", cite), (pin, f, cite)
        only = dom.produced_only()
        # an observation tail with critic values under it: multi-turn pins build it (sglang / agent loop / rollout
        # correction), 0.1 and 0.4.1 never (mask == attention)
        tail = OBS_TAIL.replace(values=torch.tensor([[0.0, 0.0, 0.0, 5.0, 5.0]]))
        assert (only.rejects(tail) is None) is (pin not in ("0.1", "0.4.1")), (pin, only.rejects(tail))
        # a reward under the mask: only 0.9.1's KL in the reward, masked before the rollout correction rejects a token
        masked_reward = PAD_TAIL.replace(attention=OBS_TAIL.attention, token_rewards=torch.tensor([[0, 0, 0, 0.5, 0]]))
        assert (only.rejects(masked_reward) is None) is (pin == "0.9.1"), (pin, only.rejects(masked_reward))
    # 0.4.1's GRPO branch gets the sglang multi-turn loss_mask (ray_trainer.py:242-247) and the KL masked with the
    # attention (:158-159): tails and rewards under the mask reach compute_grpo_outcome_advantage, not the other
    # estimators
    grpo = verl.SPEC.declared("grpo", "0.4.1").pipeline
    assert {"gaps", "masked_real_tail", "masked_rewards"} <= set(grpo.produces)
    assert grpo.produced_only().rejects(OBS_TAIL) is None
    assert verl.SPEC.declared("rloo", "0.4.1").pipeline.produced_only().rejects(OBS_TAIL) is not None


# ---------------------------------------------------------------------------------------------
# The kinds beyond GAE at the newest release (targets/verl/calls_kinds.py): group advantages,
# KL estimators, masked whitening and REINFORCE++ returns, each through verl's own function.
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def kinds_at_new():
    """entry -> an open 0.9.1 target of that entry, opened on first use (a worker costs seconds)."""
    with contextlib.ExitStack() as stack:
        handles: dict = {}

        def get(entry: str):
            if entry not in handles:
                handles[entry] = stack.enter_context(opened(f"verl:{entry}@{NEW}"))
            return handles[entry]

        yield get


# two rows of prompt 0 (scores 1 and 0) and a singleton prompt 1 (score 2), right-padded
GROUPS = Case.build(
    trainable=[[1, 1, 0], [1, 0, 0], [1, 1, 1]],
    attention=[[1, 1, 0], [1, 0, 0], [1, 1, 1]],
    score=[1.0, 0.0, 2.0],
    group=[0, 0, 1],
)
_S = 0.5 / (0.5**0.5 + 1e-6)  # (r - mean) / (unbiased std + 1e-6) in a group of {1, 0}


@pytest.mark.network
@pytest.mark.parametrize(
    ("entry", "rows"),
    [
        ("grpo", [_S, -_S, 2.0 / (1 + 1e-6)]),  # singleton: mean 0, std 1 (core_algos.py:316-317)
        ("grpo-vectorized", [_S, -_S, 2.0 / (1 + 1e-6)]),  # group_mean_std's singleton rule, the same
        ("drgrpo", [0.5, -0.5, 2.0]),  # norm_adv_by_std_in_grpo=False: r - mean
        ("rloo", [1.0, -1.0, 2.0]),  # n / (n - 1) (r - mean); a singleton keeps its score
        ("rloo-vectorized", [1.0, -1.0, 0.0]),  # ... but the vectorised twin zeroes it (core_algos.py:864)
        ("opo", [1 / 3, -2 / 3, 2.0]),  # baseline (2 * 1 + 1 * 0) / 3 tokens; a singleton's is 0
        ("gpg", [0.75, -0.75, 3.0]),  # alpha = 3 rows / 2 non-zero scores, times r - mean (0 for a singleton)
    ],
)
def test_group_advantages_by_hand(kinds_at_new, entry, rows):
    h = kinds_at_new(entry)
    assert h.declared.kind == "group-advantage"
    (adv,) = h.run(GROUPS)
    expect = torch.tensor(rows, dtype=torch.float64)[:, None] * GROUPS.trainable
    assert torch.allclose(adv.double(), expect, rtol=1e-6, atol=1e-7), adv
    assert verdicts(h.run, GROUPS, h.declared)["reference"].status == "pass"


@pytest.mark.network
def test_the_vectorised_rloo_and_its_loop_disagree_on_a_singleton(kinds_at_new):
    h = kinds_at_new("rloo-vectorized")
    assert h.declared.twin is not None and h.declared.twin_label.startswith("verl:rloo@")
    v = verdicts(h.run, GROUPS, h.declared)
    assert v["twin"].failed and v["reference"].status == "pass"  # each matches its own declared rule
    assert (
        verdicts(kinds_at_new("grpo-vectorized").run, GROUPS, kinds_at_new("grpo-vectorized").declared)["twin"].status
        == "pass"
    )


@pytest.mark.network
def test_reinforce_plus_plus_baseline_shapes_then_whitens_over_the_tokens(kinds_at_new):
    h = kinds_at_new("reinforce++-baseline")
    assert h.declared.variant == {"std": None, "whiten_tokens": True, "empty_rows": "counted"}
    # r - mean_g: 0.5, -0.5 and the singleton's 2 (mean 0), on 2 + 1 + 3 trained tokens, then whitened over them
    (adv,) = h.run(GROUPS)
    toks = torch.tensor([0.5, 0.5, -0.5, 2.0, 2.0, 2.0], dtype=torch.float64)
    white = (toks - toks.mean()) / (toks.var() + 1e-8).sqrt()
    assert torch.allclose(adv[GROUPS.trainable].double(), white, rtol=1e-5, atol=1e-6), adv
    assert verdicts(h.run, GROUPS, h.declared)["reference"].status == "pass"


@pytest.mark.network
def test_grpo_counts_rows_without_trained_tokens_and_sums_rewards_under_the_mask(kinds_at_new):
    h = kinds_at_new("grpo")
    # row 2 has real tokens but none trained (rollout-correction rejection, rollout_corr_helper.py:1061): its
    # score 3 still enters prompt 0's mean and std, so rows 0 and 1 get (r - 4/3) / sqrt(7/3) instead of +-0.7071
    rejected = Case.build(
        trainable=[[1, 1, 0], [1, 0, 0], [0, 0, 0]],
        attention=[[1, 1, 0], [1, 0, 0], [1, 1, 0]],
        score=[1.0, 0.0, 3.0],
        group=[0, 0, 0],
    )
    (adv,) = h.run(rejected)
    std = (7.0 / 3.0) ** 0.5
    assert adv[:2, 0].tolist() == pytest.approx([(1 - 4 / 3) / std, (0 - 4 / 3) / std], rel=1e-5)
    # a variant, not padding: the entry declares empty_rows="counted" (every row of the uid enters, core_algos.py:
    # 312-313), so the reference agrees; the "excluded" variant is the one that differs
    assert h.declared.variant["empty_rows"] == "counted"
    assert verdicts(h.run, rejected, h.declared)["reference"].status == "pass"
    excluded = dataclasses.replace(h.declared, variant={**h.declared.variant, "empty_rows": "excluded"})
    assert verdicts(h.run, rejected, excluded, only=("reference",))["reference"].failed
    # the unmasked token_level_rewards.sum(dim=-1) (core_algos.py:304) keeps a score the reward manager wrote on a
    # masked last token (a token the rollout correction rejected): row 0 still gets +0.7071
    tail = Case.build(trainable=[[1, 0], [1, 1]], attention=[[1, 1], [1, 1]], score=[1.0, 0.0], group=[0, 0])
    (adv,) = h.run(tail)
    assert adv[0, 0].item() == pytest.approx(_S, rel=1e-6) and adv[0, 1].item() == 0.0
    assert verdicts(h.run, tail, h.declared)["reference"].status == "pass"
    # ... and so it also sums a reward under the mask: row 0's rejected token keeps its KL term (0.9.1 masks the KL
    # in the reward with the rollout's mask, ray_trainer.py:103, before the rejection rewrites response_mask, :1658)
    leak = tail.replace(token_rewards=torch.tensor([[0.0, 100.0], [0.0, 0.0]]))
    (adv,) = h.run(leak)
    assert adv[0, 0].item() == pytest.approx(50.5 / (101 / 2**0.5 + 1e-6), rel=1e-6)  # scores 101 and 0
    solo = Case.build(trainable=[[1, 0]], attention=[[1, 1]], token_rewards=[[0.0, 100.0]], score=[0.0], group=[0])
    (adv,) = h.run(solo)
    assert adv[0, 0].item() == pytest.approx(100.0 / (1 + 1e-6), rel=1e-6)
    v = verdicts(h.run, solo, h.declared)
    assert v["poison"].failed and v["reference"].failed
    assert v["masked-zero"].status == "pass"
    # a defect at 0.9.1, where the pipeline puts that reward under the mask (use_kl_in_reward with a token-level
    # rollout_rs: the tail and the masked reward are both cited as produced) ...
    t = triaged(h, solo, "poison")
    assert t["class"] == "defect" and t["promise"] == "universal:poison" and t["reach"] == "pipeline", t
    # ... a robustness fact at 0.5.0, where the KL is masked with the rollout's own mask (ray_trainer.py:179) and the
    # reward managers write only the score: no non-score reward under the mask
    with opened("verl:grpo@0.5.0") as h5:
        t = triaged(h5, solo, "poison")
        assert t["class"] == "robustness" and t["mechanism"] == "masked-reward-leak", t


@pytest.mark.network
@pytest.mark.parametrize("entry", ["grpo", "rloo-vectorized"])
def test_fuzzing_group_advantages_finds_the_leak_not_the_counted_empty_rows(kinds_at_new, entry):
    h = kinds_at_new(entry)
    res = fuzz_target(h.run, h.declared, target="verl", pin=NEW, max_examples=40, seed=0, sizes=Sizes(4, 6))
    found = {f.property for f in res.findings}
    assert "poison" in found, found
    # masked-zero: NaN under the mask stays NaN at masked positions (the mask product), low severity;
    # pad-invariance: the padding column's poisoned reward summed into the score (the same unmasked sum)
    allowed = {"poison", "poison-nonfinite", "pad-invariance", "affine", "reference", "masked-zero"}
    if entry == "rloo-vectorized":
        allowed.add("twin")  # it zeroes a singleton, its loop twin keeps the score
    assert found <= allowed, found
    for f in res.findings:
        # the shrunk leak may sit at padding, which 0.9.1 zeroes: the witness is searched under rejected tokens
        judge_finding(h.run, f, h.declared, examples=40 if f.property == "poison" else 0)
        # rows without a trained token are the declared variant (empty_rows="counted"): no finding is about them
        assert f.mechanism in (
            "masked-reward-leak",
            "masked-statistics",
            "nan-through-mask",
            "implementations-disagree",
        )
        if f.property == "poison":
            assert f.promise is not None and f.promise.id == "universal:poison", f.why_fact
        if f.mechanism == "nan-through-mask":  # NaN is never in verl's pipeline: a robustness fact
            assert f.promise is None and f.fact == "robustness"
    assert res.checked["permutation"] > 0 and res.checked["group-isolation"] > 0


KL = Case.build(
    trainable=[[1, 1, 0]],
    attention=[[1, 1, 1]],
    extra={"logp": [[-1.0, -30.0, float("nan")]], "ref_logp": [[-1.5, -2.0, 0.0]]},
)


@pytest.mark.network
def test_kl_estimators_by_hand(kinds_at_new):
    (k1,) = kinds_at_new("kl-k1").run(KL)
    assert k1[0, :2].tolist() == pytest.approx([0.5, -28.0])
    h = kinds_at_new("kl-low_var_kl")
    (k3,) = h.run(KL)
    # d = 0.5: exp(-0.5) - 1 + 0.5; d = -28 is clamped to -20 (core_algos.py:2242), then the estimate to 10 (:2245)
    assert k3[0, :2].tolist() == pytest.approx([math.exp(-0.5) - 0.5, 10.0], rel=1e-6)
    assert torch.isnan(k3[0, 2])  # no mask inside: the caller multiplies by response_mask (masked_zero=False)
    res = fuzz_target(h.run, h.declared, target="verl", pin=NEW, max_examples=30, seed=0, sizes=Sizes(3, 6))
    assert not res.findings, [f.property for f in res.findings]


@pytest.mark.network
def test_masked_whiten_by_hand_and_fuzzed(kinds_at_new):
    h = kinds_at_new("whiten")
    case = Case.build(trainable=[[1, 1, 0], [1, 0, 0]], extra={"x": [[1.0, 2.0, float("inf")], [3.0, 7.0, 0.0]]})
    (out,) = h.run(case)
    # mean 2, unbiased var 1: (x - 2) / sqrt(1 + 1e-8); masked_sum zeroes non-finite values outside the mask
    assert out[0, :2].tolist() == pytest.approx([-1.0, 0.0], abs=1e-6) and out[1, 0].item() == pytest.approx(1.0)
    assert out[1, 1].item() == pytest.approx(5.0, rel=1e-6)  # masked positions are whitened too, never zeroed
    res = fuzz_target(h.run, h.declared, target="verl", pin=NEW, max_examples=30, seed=0, sizes=Sizes(3, 6))
    assert not res.findings, [f.property for f in res.findings]


@pytest.mark.network
def test_reinforce_plus_plus_carries_through_gaps_but_loses_a_score_on_an_observation_tail(kinds_at_new):
    h = kinds_at_new("reinforce++")
    adv, ret = h.run(GAP.replace(values=torch.zeros(2, 4), lam=1.0))
    # row 0 trains positions 0 and 3: the compressed return 0.9 * 1.0 at position 0 (the gap costs nothing)
    assert [ret[0, 0].item(), ret[0, 3].item()] == pytest.approx([0.9, 1.0], rel=1e-6)
    assert ret[0, 1].item() == ret[0, 2].item() == 0.0
    _, ret = h.run(OBS_TAIL.replace(lam=1.0, gamma=1.0))
    assert ret[0].tolist() == [0.0] * 5  # the score on position 4 (masked) never enters the carry
    res = fuzz_target(h.run, h.declared, target="verl", pin=NEW, max_examples=40, seed=0, sizes=Sizes(3, 6))
    found = {f.property for f in res.findings}
    assert found & {"score-kept", "telescoping", "reference"}, found
    assert not found & {"poison", "gap-invariance", "row-independence", "no-crash", "deterministic"}, found


@pytest.mark.network
def test_remax_subtracts_the_greedy_baseline_and_loses_a_score_on_an_observation_tail(kinds_at_new):
    """compute_remax_outcome_advantage (core_algos.py:764-765): rewards [1, 2] and score 3 on the
    last token, baseline 4: returns [6, 5], advantages [2, 1]; a gap position keeps the return of the
    later tokens (masked-nonzero, low); a score verl places on a masked tail is lost (score-lost)."""
    h = kinds_at_new("remax")
    case = Case.build(trainable=[[1, 1]], token_rewards=[[1.0, 2.0]], score=[3.0], extra={"baseline": [[4.0, 4.0]]})
    adv, ret = h.run(case)
    assert adv.tolist() == [[2.0, 1.0]] and ret.tolist() == [[6.0, 5.0]]
    assert not any(v.failed for v in judge(h.run, case, h.declared))
    gap = Case.build(trainable=[[1, 0, 1]], score=[1.0], extra={"baseline": [[0.0] * 3]})
    assert {v.property for v in judge(h.run, gap, h.declared) if v.failed} == {"masked-zero"}
    tail = Case.build(trainable=[[1, 0]], score=[1.0], extra={"baseline": [[0.0, 0.0]]})
    assert h.run(tail)[0].tolist() == [[0.0, 0.0]]  # the reference: [1, 0]
    assert {v.property for v in judge(h.run, tail, h.declared) if v.failed} == {"reference"}


# ---------------------------------------------------------------------------------------------
# Loss aggregation (agg_loss over one optimizer step, calls_kinds.load_loss): 0.9.1 passes the
# step's global normalisers, 0.5.0 normalises each micro-batch and scales it by its row share.
# ---------------------------------------------------------------------------------------------
# row 0: 2 tokens (losses 1, 3), row 1: 1 token (loss 2), row 2: no trainable token; 100 under the mask
STEP = Case.build(
    trainable=[[1, 1, 0], [1, 0, 0], [0, 0, 0]],
    extra={"loss": [[1.0, 3.0, 100.0], [2.0, 100.0, 100.0], [100.0, 100.0, 100.0]]},
    split=[0, 1, 1],
)


@pytest.mark.network
def test_agg_loss_with_global_normalisers_by_hand(kinds_at_new):
    loss, grad = kinds_at_new("agg-token-mean").run(STEP)
    assert loss[0, 0].item() == pytest.approx(6.0 / 3.0)  # sum over the step / 3 tokens, whatever the split
    assert grad[0, :2].tolist() == pytest.approx([1 / 3, 1 / 3]) and grad[0, 2].item() == 0.0
    # seq-mean-token-mean: (2 + 2) over global_batch_size = the step's 3 rows, the empty one included
    # (ray_trainer.py:1352-1362 at 0.9.1): 4/3, not 2 over the 2 rows with a trained token. verl's design (#4510: "use
    # total batch size consistently"): the declared variant empty_rows="counted", which the reference agrees with
    h = kinds_at_new("agg-seq-mean-token-mean")
    assert h.declared.variant["empty_rows"] == "counted"
    loss, grad = h.run(STEP)
    assert loss[0, 0].item() == pytest.approx(4.0 / 3.0)
    v = verdicts(h.run, STEP, h.declared)
    assert v["reference"].status == v["split-invariance"].status == v["poison"].status == "pass", v
    excluded = dataclasses.replace(h.declared, variant={**h.declared.variant, "empty_rows": "excluded"})
    assert verdicts(h.run, STEP, excluded, only=("reference",))["reference"].failed


@pytest.mark.network
def test_agg_loss_before_global_normalisers_depends_on_the_split():
    with opened("verl:agg-token-mean@0.5.0") as h:
        loss, _ = h.run(STEP)
        # micro-batch 0: mean 2 over row share 1/3; micro-batch 1: mean 2 (its one token) over share 2/3
        assert loss[0, 0].item() == pytest.approx(2.0 * 1 / 3 + 2.0 * 2 / 3)
        uneven = STEP.replace(extra={"loss": [[1.0, 3.0, 0.0], [5.0, 0.0, 0.0], [0.0, 0.0, 0.0]]})
        v = verdicts(h.run, uneven, h.declared)
        assert v["split-invariance"].failed  # 2 * 1/3 + 5 * 2/3 against the step's 9/3


@pytest.mark.network
def test_fuzzing_agg_token_mean_finds_only_the_empty_step(kinds_at_new):
    h = kinds_at_new("agg-token-mean")
    res = fuzz_target(h.run, h.declared, target="verl", pin=NEW, max_examples=60, seed=0, sizes=Sizes(4, 6))
    found = {f.property for f in res.findings}
    assert found == {"empty-step"}, found  # batch_num_tokens = 0: 0 / 0 (core_algos.py:1175), no clamp
    assert res.checked["split-invariance"] > 0 and res.checked["pad-invariance"] > 0


@pytest.mark.network
def test_value_loss_by_hand_and_its_nan_gradient_under_the_mask(kinds_at_new):
    h = kinds_at_new("value-loss")
    assert h.declared.kind == "value-loss"
    # inside the clip range (0.5), far from R, moved towards R beyond the range (the clipped square wins)
    case = Case.build(
        trainable=[[1, 1, 1, 0]],
        extra={"v": [[1.0, 3.0, 0.0, float("inf")]], "v_old": [[0.75, 0.0, 2.0, 0.0]], "ret": [[0.0, 0.0, 0.0, 0.0]]},
    )
    loss, grad = h.run(case)
    assert loss[0, 0].item() == pytest.approx((0.5 + 4.5 + 0.5 * 1.5**2) / 3)
    assert grad[0, :3].tolist() == pytest.approx([1 / 3, 1.0, 0.0])
    # the square of a masked inf is masked by torch.where inside agg_loss: 0 * inf is a NaN gradient there
    assert torch.isnan(grad[0, 3])
    v = verdicts(h.run, case, h.declared)
    assert v["masked-zero"].failed and v["poison-nonfinite"].status == "pass"
    finite = case.replace(extra={**case.extra, "v": torch.tensor([[1.0, 3.0, 0.0, 7.0]], dtype=torch.float64)})
    v = verdicts(h.run, finite, h.declared)
    assert all(v[p].status == "pass" for p in ("clip-bound", "reference", "poison", "masked-zero")), v


@pytest.mark.network
def test_grpo_passk_by_hand_and_its_documented_singleton_error(kinds_at_new):
    h = kinds_at_new("grpo-passk")
    case = Case.build(trainable=[[1, 1], [1, 0], [1, 1]], score=[1.0, 0.0, 3.0], group=[0, 0, 0])
    (adv,) = h.run(case)
    # the best row (score 3) gets (3 - 1) / (unbiased std of {1, 0, 3} + 1e-6); the others 0
    assert adv[2].tolist() == pytest.approx([2 / ((7 / 3) ** 0.5 + 1e-6)] * 2, rel=1e-5)
    assert adv[:2].abs().sum().item() == 0
    v = verdicts(h.run, case, h.declared)
    assert v["reference"].status == "pass" and v["permutation"].status == "pass"
    single = Case.build(trainable=[[1]], score=[1.0], group=[0])
    assert verdicts(h.run, single, h.declared)["no-crash"].status == "pass"  # the documented ValueError


# ---------------------------------------------------------------------------------------------
# Options (oracles/options.py) and truncated rows at the newest release, through verl's own code.
# ---------------------------------------------------------------------------------------------
NORM_STD = "algorithm.norm_adv_by_std_in_grpo"


def _entry_options(h) -> set:
    return {o.name for o in h.declared.options}


@pytest.mark.network
def test_norm_adv_by_std_in_grpo_false_is_dr_grpo_by_hand(kinds_at_new):
    h = kinds_at_new("grpo")
    assert _entry_options(h) == {NORM_STD} and "keyword" in h.info["notes"][0]
    # GROUPS: prompt 0 scores {1, 0} -> r - mean = +-0.5 (no std); the singleton keeps its 2 (mean 0)
    case = GROUPS.replace(options={NORM_STD: False})
    (adv,) = h.run(case)
    assert adv[:, 0].tolist() == pytest.approx([0.5, -0.5, 2.0])
    assert verdicts(h.run, case, h.declared)["reference"].status == "pass"
    # grpo_passk reads the key from the AlgoConfig (core_algos.py:500): scores {1, 0, 3} in one group; the best row
    # gets r_max - r_second = 3 - 1 = 2, not divided by std({1, 0, 3}) + 1e-6 = sqrt(7/3) + 1e-6
    h = kinds_at_new("grpo-passk")
    case = Case.build(trainable=[[1, 1], [1, 0], [1, 1]], score=[1.0, 0.0, 3.0], group=[0, 0, 0])
    (adv,) = h.run(case.replace(options={NORM_STD: False}))
    assert adv[2].tolist() == pytest.approx([2.0, 2.0]) and adv[:2].abs().sum().item() == 0
    assert verdicts(h.run, case.replace(options={NORM_STD: False}), h.declared)["reference"].status == "pass"


@pytest.mark.network
def test_grpo_vectorized_ignores_norm_adv_by_std_in_grpo_from_the_trainer(kinds_at_new):
    """compute_advantage hands grpo_vectorized the AlgoConfig as `config` and no keyword (ray_trainer.py:250-279 at
    0.9.1); the function reads norm_adv_by_std_in_grpo only as its keyword (core_algos.py:340, 353): False is lost."""
    h = kinds_at_new("grpo-vectorized")
    case = GROUPS.replace(options={NORM_STD: False})
    (adv,) = h.run(case)
    # still (r - mean) / (std + 1e-6) = +-0.5 / (sqrt(0.5) + 1e-6) = +-0.70711, not the Dr.GRPO +-0.5
    assert adv[:2, 0].tolist() == pytest.approx([_S, -_S], rel=1e-6)
    v = verdicts(h.run, case, h.declared)
    assert v["reference"].failed and v["twin"].failed  # its loop twin, given the keyword, returns +-0.5
    assert verdicts(h.run, GROUPS, h.declared)["reference"].status == "pass"  # the default is right
    # two defects: the twin (universal, on a case the pipeline builds: no mask feature, n responses per prompt side by
    # side, as the trainer repeats each prompt) and the documented option ignored (the AlgoConfig docstring,
    # algorithm.py:630, covers the variant mismatch)
    case = Case.build(trainable=[[1, 1]] * 4, score=[1.0, 0.0, 2.0, 0.0], group=[0, 0, 1, 1], options={NORM_STD: False})
    t = triaged(h, case, "twin")
    assert t["class"] == "defect" and t["promise"] == "universal:twin" and t["reach"] == "pipeline", t
    t = triaged(h, case, "reference")
    assert t["class"] == "defect" and t["mechanism"] == "variant-mismatch", t
    assert t["promise"] == "upstream:verl/trainer/config/algorithm.py:630", t


VLOSS = Case.build(
    trainable=[[1, 1, 1, 0]],
    extra={"v": [[1.0, 3.0, 0.0, 7.0]], "v_old": [[0.75, 0.0, 2.0, 0.0]], "ret": [[0.0, 0.0, 0.0, 0.0]]},
)


@pytest.mark.network
@pytest.mark.parametrize(
    ("options", "loss", "grad"),
    [
        # clip 0.2: v_c = 0.95, 0.2, 1.8; max of squares 1, 9, 3.24; 0.5 * 13.24 / 3 tokens
        ({"critic.cliprange_value": 0.2}, 0.5 * 13.24 / 3, [1 / 3, 1.0, 0.0]),
        # clip 10: v_c = v everywhere; squares 1, 9, 0; 0.5 * 10 / 3
        ({"critic.cliprange_value": 10.0}, 0.5 * 10.0 / 3, [1 / 3, 1.0, 0.0]),
        # clip 0.5 (v_c = 1, 0.5, 1.5: squares 1, 9, 2.25), token-sum: 0.5 * 12.25, gradient (v - R) where unclipped
        ({"critic.loss_agg_mode": "token-sum"}, 0.5 * 12.25, [1.0, 3.0, 0.0]),
        # one row: seq-mean-token-mean = token-mean = 0.5 * 12.25 / 3
        ({"critic.loss_agg_mode": "seq-mean-token-mean"}, 0.5 * 12.25 / 3, [1 / 3, 1.0, 0.0]),
    ],
)
def test_value_loss_options_by_hand(kinds_at_new, options, loss, grad):
    h = kinds_at_new("value-loss")
    assert _entry_options(h) == {"critic.cliprange_value", "critic.loss_agg_mode"}
    case = VLOSS.replace(options=options)
    got, g = h.run(case)
    assert got[0, 0].item() == pytest.approx(loss, rel=1e-6)
    assert g[0, :3].tolist() == pytest.approx(grad, rel=1e-6, abs=1e-7)
    assert verdicts(h.run, case, h.declared)["reference"].status == "pass"


@pytest.mark.network
def test_a_truncated_row_is_terminal_for_gae_and_reinforce_plus_plus(new, kinds_at_new):
    assert new.declared.truncation is not None and new.declared.truncation.terminal
    # row 0 cut by the length limit (bootstrap 4 offered), row 1 ended. gamma 0.5, lam 1, V = [1, 2], score 1:
    # zero bootstrap (nextvalues = 0, core_algos.py:245): delta_1 = 1 - 2 = -1, delta_0 = 0.5 * 2 - 1 = 0,
    # A = [-0.5, -1], returns A + V = [0.5, 1.0] (with bootstrap 4 they would be [1.5, 3.0])
    case = Case.build(
        trainable=[[1, 1], [1, 1]],
        values=[[1.0, 2.0], [0.5, 0.5]],
        score=[1.0, 0.0],
        gamma=0.5,
        lam=1.0,
        truncated=[True, False],
        bootstrap=[4.0, 0.0],
    )
    _, ret = new.run(case)
    assert ret[0].tolist() == pytest.approx([0.5, 1.0])
    assert verdicts(new.run, case)["reference"].status == "pass"
    # REINFORCE++: running_return = 0 (core_algos.py:718): returns [0.5 * 1, 1] = [0.5, 1.0], no 0.5 * 4 added
    h = kinds_at_new("reinforce++")
    assert h.declared.truncation is not None and h.declared.truncation.terminal
    rpp = case.replace(values=torch.zeros(2, 2))
    _, ret = h.run(rpp)
    assert ret[0].tolist() == pytest.approx([0.5, 1.0])
    assert verdicts(h.run, rpp, h.declared)["reference"].status == "pass"


@pytest.mark.network
def test_short_fuzz_with_options_checks_every_value(kinds_at_new):
    h = kinds_at_new("value-loss")
    # no shrinking and no non-finite poison (the NaN-gradient leak is known, test above): the option space is the point
    kw = dict(max_examples=60, seed=0, sizes=Sizes(3, 5), shrink=False, nonfinite=False)
    res = fuzz_target(h.run, h.declared, target="verl:value-loss", pin=NEW, **kw)
    assert set(res.options_checked) == {"critic.cliprange_value", "critic.loss_agg_mode"}
    for name, per in res.options_checked.items():
        assert all(n > 0 for n in per.values()), (name, per)
    for f in res.findings:  # verdicts on verl's math, never the adapter refusing an option
        text = f.verdict.message
        assert not any(w in text for w in ("option", "adapter", "CaseError", "NotImplementedError")), text


# ---------------------------------------------------------------------------------------------
# Policy loss (compute_policy_loss_vanilla over one step, calls_kinds.load_policy): the actor
# config's defaults, clip 0.2 both sides, dual clip 3.0, token-mean with the step's normalisers.
# ---------------------------------------------------------------------------------------------
_L15 = math.log(1.5)
# one row, four trained tokens and a masked NaN log-prob: r = 1 (A = 2); r = 1.5, A = 1 (the clip binds: -1.2);
# r = 1.5, A = -1 (outside the range, but the unclipped 1.5 is the max: not binding); r = e^1.5, A = -1 (the dual
# clip binds: min(4.48, -A * 3) = 3); old log-probs -1
POLICY = Case.build(
    trainable=[[1, 1, 1, 1, 0]],
    extra={
        "old_logp": [[-1.0] * 5],
        "logp": [[-1.0, -1.0 + _L15, -1.0 + _L15, 0.5, float("nan")]],
        "adv": [[2.0, 1.0, -1.0, -1.0, 5.0]],
    },
)
POLICY_FINITE = POLICY.replace(extra={**POLICY.extra, "logp": torch.nan_to_num(POLICY.extra["logp"], nan=7.0)})
POLICY_LOSS_OPTIONS = {"actor.clip_ratio_low", "actor.clip_ratio_high", "actor.clip_ratio_c", "actor.loss_agg_mode"}


def test_policy_loss_is_declared_with_the_actor_config_defaults():
    d = verl.SPEC.declared("policy-loss")
    assert d.kind == "policy-loss"
    # actor.py:159-164 at 0.9.1: clip_ratio_low = clip_ratio_high = 0.2, clip_ratio_c = 3.0, loss_agg_mode token-mean
    assert d.variant == {
        "clip_low": 0.2,
        "clip_high": 0.2,
        "dual_clip": 3.0,
        "advantages": "token",
        "mode": "token-mean",
        # what the seq-mean modes divide by at 0.9.1: global_batch_size, every row of the mini-batch
        "empty_rows": "counted",
    }
    assert {o.name for o in d.options} == POLICY_LOSS_OPTIONS
    assert {o.name: o.default for o in d.options}["actor.clip_ratio_c"] == 3.0


def test_declared_promises_cover_what_verl_says_at_each_pin():
    """verl's own words, per pin: a finding they cover is a defect naming them (oracles.promises.broken)."""
    gae = {pin: verl.SPEC.declared(None, pin).promises for pin in ("0.1", "0.4.1", "0.5.0", "0.9.1", MASKING, BEFORE)}
    # "# skip values and TD-error on observation tokens" from #2337 on: a gap's decay or a masked value / reward that
    # reached a trained advantage would break it, even on an input the pipeline never builds
    for pin, line in (("0.5.0", 232), (MASKING, 197), ("0.9.1", 254)):
        for mech in ("extra-decay", "masked-value-bootstrap", "masked-reward-leak"):
            p = broken("gap-invariance" if mech == "extra-decay" else "reference", mech, gae[pin], reach="api")
            assert p is not None and p.id == f"upstream:verl/trainer/ppo/core_algos.py:{line}", (pin, mech, p)
        assert broken("poison", "masked-value-bootstrap", gae[pin], reach="api").id.startswith("upstream:")
    # before #2337 the loop is dense by design: the gap's decay is a semantics fact, a masked value a robustness fact
    # on api input (the universal poison needs a pipeline witness)
    for pin in ("0.1", "0.4.1", BEFORE):
        assert broken("gap-invariance", "extra-decay", gae[pin], reach="pipeline") is None, pin
        assert broken("poison", "masked-value-bootstrap", gae[pin], reach="api") is None, pin
    # NaN through the mask product is no promise of verl's anywhere (robustness on input the pipeline never builds)
    assert broken("poison-nonfinite", "nan-through-mask", gae["0.9.1"], reach="api") is None
    # the loss over a step: the DAPO page (0.4.1, 0.5.0) and agg_loss's docstring (0.9.1)
    for entry in ("policy-loss", "agg-token-mean"):
        for pin, pid in (
            ("0.4.1", "upstream:docs/algo/dapo.md:118"),
            ("0.5.0", "upstream:docs/algo/dapo.md:120"),
            ("0.9.1", "upstream:verl/trainer/ppo/core_algos.py:1150"),
        ):
            p = broken("reference", "split-normaliser", verl.SPEC.declared(entry, pin).promises, reach="api")
            assert p is not None and p.id == pid, (entry, pin, p)
    # agg_loss's docstring promises the seq-mean entries' invariance at 0.9.1 only; none before the global normalisers
    assert broken("reference", "split-normaliser", verl.SPEC.declared("agg-seq-mean-token-sum", "0.9.1").promises)
    assert not verl.SPEC.declared("agg-seq-mean-token-sum", "0.5.0").promises
    # the documented option grpo_vectorized ignores; the other group entries promise nothing beyond the universal
    p = broken("reference", "variant-mismatch", verl.SPEC.declared("grpo-vectorized", "0.9.1").promises)
    assert p is not None and p.id == "upstream:verl/trainer/config/algorithm.py:630"
    for entry in ("grpo", "rloo", "reinforce++", "whiten", "kl-k1"):
        assert not verl.SPEC.declared(entry, "0.9.1").promises, entry  # the GAE entry's words are not theirs


@pytest.mark.network
def test_policy_loss_by_hand(kinds_at_new):
    h = kinds_at_new("policy-loss")
    assert h.info["where"] == "verl/trainer/ppo/core_algos.py::compute_policy_loss_vanilla"
    loss, grad = h.run(POLICY)
    # token-mean over 4 tokens: (-2 - 1.2 + 1.5 + 3) / 4; dL/dlogp = -A r / 4 where unclipped, 0 where a clip binds
    assert loss[0, 0].item() == pytest.approx(1.3 / 4, rel=1e-6)
    assert grad[0].tolist() == pytest.approx([-0.5, 0.0, 0.375, 0.0, 0.0], abs=1e-7)
    v = verdicts(h.run, POLICY, h.declared)
    assert all(v[p].status == "pass" for p in ("no-crash", "poison-nonfinite", "masked-zero")), v
    finite = POLICY_FINITE
    v = verdicts(h.run, finite, h.declared)
    assert all(v[p].status == "pass" for p in ("reference", "poison", "pad-invariance", "masked-zero")), v
    # a NaN advantage under the mask: the masked loss is dropped by masked_sum's torch.where (torch_functional.py:290),
    # but the backward of -advantages * ratio (core_algos.py:1342) is 0 * NaN at that position: a NaN gradient
    nan_adv = finite.replace(
        extra={**finite.extra, "adv": torch.tensor([[2.0, 1.0, -1.0, -1.0, math.nan]], dtype=torch.float64)}
    )
    loss, grad = h.run(nan_adv)
    assert loss[0, 0].item() == pytest.approx(1.3 / 4, rel=1e-6) and math.isnan(grad[0, 4].item())
    v = verdicts(h.run, nan_adv, h.declared)
    assert v["masked-zero"].failed and v["poison-nonfinite"].status == "pass"


@pytest.mark.network
@pytest.mark.parametrize(
    ("options", "loss", "grad"),
    [
        # clip_ratio_high 0.28: r = 1.5 still clipped, now at 1.28 (-1.28); the rest as the default
        ({"actor.clip_ratio_high": 0.28}, (-2 - 1.28 + 1.5 + 3) / 4, [-0.5, 0.0, 0.375, 0.0]),
        # dual clip 10: the fourth token's e^1.5 = 4.48 is under the cap -A * 10, so unclipped (slope -A r / 4)
        ({"actor.clip_ratio_c": 10.0}, (-2 - 1.2 + 1.5 + math.exp(1.5)) / 4, [-0.5, 0.0, 0.375, math.exp(1.5) / 4]),
        # token-sum: the same per-token losses, summed
        ({"actor.loss_agg_mode": "token-sum"}, -2 - 1.2 + 1.5 + 3, [-2.0, 0.0, 1.5, 0.0]),
    ],
)
def test_policy_loss_options_by_hand(kinds_at_new, options, loss, grad):
    h = kinds_at_new("policy-loss")
    case = POLICY_FINITE.replace(options=options)
    got, g = h.run(case)
    assert got[0, 0].item() == pytest.approx(loss, rel=1e-6)
    assert g[0, :4].tolist() == pytest.approx(grad, rel=1e-6, abs=1e-7)
    assert verdicts(h.run, case, h.declared)["reference"].status == "pass"


@pytest.mark.network
def test_fuzzing_the_policy_loss_finds_the_empty_step_and_the_nan_gradient_only(kinds_at_new):
    h = kinds_at_new("policy-loss")
    kw = dict(max_examples=15, seed=0, sizes=Sizes(3, 5), shrink=False)
    res = fuzz_target(h.run, h.declared, target="verl:policy-loss", pin=NEW, options={}, **kw)
    found = {f.property for f in res.findings}
    # empty-step: batch_num_tokens = 0 is 0 / 0 (core_algos.py:1175); masked-zero: 0 * NaN in the backward of
    # -advantages * ratio (:1342) where a NaN advantage sits under the mask
    assert found == {"empty-step", "masked-zero"}, found
    assert res.checked["reference"] > 0 and res.checked["split-invariance"] > 0 and res.checked["pad-invariance"] > 0


@pytest.mark.network
def test_policy_loss_before_global_normalisers_depends_on_the_split(kinds_at_new):
    # r = 1, A = 1 on three tokens: row 0 (one token) alone in micro-batch 0, row 1 (two tokens) in micro-batch 1
    case = Case.build(
        trainable=[[1, 0], [1, 1]],
        extra={"old_logp": [[0.0, 0.0], [0.0, 0.0]], "logp": [[0.0, 0.0], [0.0, 0.0]], "adv": [[1.0, 0.0], [1.0, 1.0]]},
        split=[0, 1],
    )
    _, grad = kinds_at_new("policy-loss").run(case)  # 0.9.1: batch_num_tokens = 3 for every micro-batch
    assert grad[0, 0].item() == pytest.approx(-1 / 3) and grad[1].tolist() == pytest.approx([-1 / 3, -1 / 3])
    with opened("verl:policy-loss@0.5.0") as h:
        # compute_policy_loss's token-mean over the micro-batch, times its row share 1/2 (dp_actor.py:467 at 0.5.0)
        _, grad = h.run(case)
        assert grad[0, 0].item() == pytest.approx(-1 / 2) and grad[1].tolist() == pytest.approx([-1 / 4, -1 / 4])
        v = verdicts(h.run, case, h.declared)
        assert v["split-invariance"].failed and v["reference"].failed
        # verl's own words at 0.5.0 make it a defect: token-mean is "the (policy gradient) loss across all the tokens
        # in all the sequences in a mini-batch" (docs/algo/dapo.md:120); no scope="micro-batch" variant is declared
        assert "scope" not in h.declared.variant
        t = triaged(h, case, "split-invariance")
        assert t["class"] == "defect" and t["promise"] == "upstream:docs/algo/dapo.md:120", t
        assert "all the tokens in all the sequences in a mini-batch" in t["promise_text"]


# ---------------------------------------------------------------------------------------------
# KL in the reward (`oracles/kinds/gae/kl_reward.py`), "reinforce++-kl": the trainer's apply_kl_penalty
# (ray_trainer.py:78-117
# at 0.9.1, compiled from the pin's source) with kl_penalty "kl" (logprob - ref_logprob) and the fixed controller
# (algorithm.kl_ctrl.kl_coef 0.001), then compute_reinforce_plus_plus_outcome_advantage. Row 0 starts with a
# masked token whose log-prob is NaN; row 1 ends in padding. Log-ratios d: row 0 [NaN, 0.5, -1], row 1 [0, 1, .].
# ---------------------------------------------------------------------------------------------
KL_CASE = Case.build(
    trainable=[[0, 1, 1], [1, 1, 0]],
    attention=[[1, 1, 1], [1, 1, 0]],
    score=[1.0, 2.0],
    gamma=1.0,
    lam=1.0,
    extra={"logp": [[math.nan, -1.0, -2.0], [-0.5, -0.5, -3.0]], "ref_logp": [[-1.0, -1.5, -1.0], [-0.5, -1.5, -1.0]]},
)


@pytest.mark.network
def test_reinforce_plus_plus_kl_by_hand_and_the_masked_nan_log_prob(kinds_at_new):
    h = kinds_at_new("reinforce++-kl")
    adv, ret = h.run(KL_CASE)
    # token_level_rewards = scores - 0.001 * d * response_mask (ray_trainer.py:103-106), the score on the last
    # attended token: row 0 [., -0.0005, 1 + 0.001], row 1 [0, 2 - 0.001, 0]; the compressed returns
    assert ret[0, 1:].tolist() == pytest.approx([1.0005, 1.001], rel=1e-6)  # float32
    assert ret[1].tolist() == pytest.approx([1.999, 1.999, 0.0], rel=1e-6)
    # kld * response_mask keeps the NaN (ray_trainer.py:103): returns[:, 0] = NaN * 0 (core_algos.py:724) and the
    # advantage there NaN * 0 (:729); masked_whiten's statistics (torch_functional.py) and every trained position stay
    # finite, so only the masked output shows it: masked-zero, NaN kept at a masked advantage, which the loss's
    # `adv * mask` would carry (api only: the pipeline's log-probs are finite)
    nan_adv = adv
    assert math.isnan(ret[0, 0].item()) and math.isnan(adv[0, 0].item()) and torch.isfinite(adv.flatten()[1:]).all()
    failed = [v for v in judge(h.run, KL_CASE, h.declared) if v.failed]
    assert [(v.property, v.positions) for v in failed] == [("masked-zero", [[0, 0]])]  # no trained output moves
    logp = KL_CASE.extra["logp"].clone()
    logp[0, 0] = -1.0  # a real log-prob under the mask: the KL there is multiplied away
    clean = KL_CASE.replace(extra={**KL_CASE.extra, "logp": logp})
    adv, ret = h.run(clean)
    assert ret[0].tolist() == pytest.approx([0.0, 1.0005, 1.001], rel=1e-6)
    # masked_whiten (unbiased, eps 1e-8 under the sqrt) times the mask (core_algos.py:728-729)
    want = masked_whiten(ret.double(), clean.trainable, verl.SPEC.whitening) * clean.trainable
    assert adv.tolist() == [pytest.approx(row, rel=1e-5, abs=1e-6) for row in want.tolist()]
    assert nan_adv.flatten()[1:].tolist() == adv.flatten()[1:].tolist()
    assert not [v.property for v in judge(h.run, clean, h.declared) if v.failed]


@pytest.mark.network
def test_reinforce_plus_plus_kl_short_fuzz(kinds_at_new):
    """What the reinforce++ entry shows (a score the reward manager puts on a masked observation tail is dropped:
    naive.py:153 writes it at valid_response_length - 1, core_algos.py:724-726 skip masked positions) plus NaN
    through the mask (kld * response_mask, ray_trainer.py:103, api only: into trained outputs and kept at masked
    advantages); nothing else."""
    h = kinds_at_new("reinforce++-kl")
    res = fuzz_target(h.run, h.declared, target="verl", pin=NEW, max_examples=20, seed=0, sizes=Sizes(3, 6))
    found = {f.property for f in res.findings}
    assert found <= {"poison-nonfinite", "masked-zero", "reference", "score-kept", "telescoping"}, found
    for f in res.findings:  # NaN only ever reaches through a non-finite log-prob under the mask (outside the pipeline)
        if f.property in ("poison-nonfinite", "masked-zero"):
            assert h.declared.pipeline.rejects(f.case) is not None
    assert res.checked["reference"] > 0

"""ROLL through its adapter: `compute_advantage` (GAE branch) and `agentic_compute_advantage`, called on a real
DataProto / TensorDict with the score placed by ROLL's own `compute_token_reward`, judged by the oracle.

Verdicts derived by reading ROLL's code (roll/utils/functionals.py, roll/pipeline/agentic/utils.py):

* c09bc8bc9f43 (seed report 000) and main 8eb27cc2dc34: the GAE branch stores `values * response_mask` in the
  batch but hands the *unmasked* `values` to `compute_gae_advantage_return`, whose `nextvalues = values[:, t+1]`
  bootstraps a masked slot into the tokens before it: the seed's case gives [5.7, 6.0, 0] (float32
  5.699999809265137), not [0.95, 1.0, 0]. Token rewards are multiplied by the mask, so only values leak.
* 090ac94658ad (PR #447 head, not merged) masks the values first: [0.95, 1.0, 0], the dense reference. The
  agentic copy of the same branch is not touched by that PR and still leaks there.
* `expand_to_token_level` puts the score on the last *attended* token (argmax of position_ids * attention):
  when the row ends in real non-trainable tokens (an observation tail) the score lands on a masked slot and
  `token_level_rewards * response_mask` drops it: score lost at every pin.
* Masking is multiplicative everywhere (`* response_mask`, `compute_approx_kl(...) * action_mask`): NaN poison
  reaches the trainable outputs at every pin.

ROLL is git only: these tests need MASKFUZZ_REPOS=roll=/path/to/a-ROLL-clone-or-mirror; without it they skip.
The checks of the registry entry and of a tree without ROLL run everywhere.
"""

from __future__ import annotations

import math

import pytest

from fuzz.engine import fuzz_target
from fuzz.repos import parse_repos
from oracles.case import Case
from oracles.properties import judge
from targets import registry
from targets.adapters import roll
from targets.client import LoadSpec, Worker, WorkerSkip
from targets.session import open_target

SEED_PIN, HEAD_PIN, FIX_PIN = "c09bc8bc9f43", "8eb27cc2dc34", "090ac94658ad"

# The seed report's case and the spec's worked examples 2 and 3.
SEED = Case.build(trainable=[[1, 1, 0]], token_rewards=[[0, 1, 0]], values=[[0, 0, 100]], gamma=1.0, lam=0.95)
GAP = Case.build(trainable=[[1, 0, 0, 1]], values=[[0.5, 9, 9, 0.25]], score=[1.0], gamma=0.9, lam=0.8)
TAIL = Case.build(trainable=[[1, 1, 1, 0, 0]], attention=[[1, 1, 1, 1, 1]], score=[1.0], gamma=0.0, lam=0.9)
LEAKED = [5.699999809265137, 6.0]  # float32: 0.95 * 6 and 1 + 100 - 0.95 * 100
FIXED = [0.949999988079071, 1.0]


def verdicts(run, case: Case) -> dict:
    return {v.property: v for v in judge(run, case, roll.SPEC.declared())}


def _open(ref: str):
    repos = parse_repos(None)
    if "roll" not in repos:
        pytest.skip("ROLL is git only: set MASKFUZZ_REPOS=roll=/path/to/ROLL-clone-or-mirror to test it")
    return open_target(ref, repos=repos)


@pytest.fixture(scope="module")
def seed_pin():
    with _open(f"roll@{SEED_PIN}") as h:
        yield h


@pytest.fixture(scope="module")
def head():
    with _open(f"roll@{HEAD_PIN}") as h:
        yield h


@pytest.fixture(scope="module")
def fixed():
    with _open(f"roll@{FIX_PIN}") as h:
        yield h


@pytest.fixture(scope="module")
def agentic_fixed():
    with _open(f"roll:agentic@{FIX_PIN}") as h:
        yield h


# ---------------------------------------------------------------------------------------------
# The seed report through ROLL's real code.
# ---------------------------------------------------------------------------------------------
@pytest.mark.needs_mirror
@pytest.mark.parametrize("pin", ["seed_pin", "head"])
def test_seed_case_leaks_the_masked_value(pin, request):
    h = request.getfixturevalue(pin)
    assert h.info["where"] == "roll/utils/functionals.py::compute_advantage"
    assert "tensordict" not in h.info["stand_ins_used"]  # the batch is a real TensorDict
    adv, ret = h.run(SEED)
    assert adv[0].tolist() == LEAKED + [0.0]
    assert ret[0, :2].tolist() == LEAKED
    v = verdicts(h.run, SEED)
    assert v["poison"].failed and v["poison"].observed == LEAKED
    assert v["poison"].expected == pytest.approx([0.95, 1.0], rel=1e-6)
    assert v["reference"].failed and v["reference"].observed == LEAKED
    for prop in ("no-crash", "masked-zero", "row-independence", "deterministic"):
        assert v[prop].status == "pass", (prop, v[prop].message)


@pytest.mark.needs_mirror
def test_fix_commit_masks_values_before_gae(fixed):
    adv, ret = fixed.run(SEED)
    assert adv[0].tolist() == FIXED + [0.0]
    assert ret[0].tolist() == FIXED + [0.0]  # the fix also returns advantages + masked values
    v = verdicts(fixed.run, SEED)
    for prop in ("poison", "reference", "masked-zero", "row-independence", "deterministic", "no-crash"):
        assert v[prop].status == "pass", (prop, v[prop].message)


@pytest.mark.needs_mirror
def test_agentic_copy_is_not_fixed_by_the_pr(agentic_fixed):
    assert agentic_fixed.info["where"] == "roll/pipeline/agentic/utils.py::agentic_compute_advantage"
    adv, _ = agentic_fixed.run(SEED)
    assert adv[0].tolist() == LEAKED + [0.0]
    assert verdicts(agentic_fixed.run, SEED)["poison"].failed


# ---------------------------------------------------------------------------------------------
# Hand-made cases at the fixed pin (where only the score placement and NaN remain).
# ---------------------------------------------------------------------------------------------
@pytest.mark.needs_mirror
def test_gap_is_a_zero_value_transition(fixed):
    adv, ret = fixed.run(GAP)
    # dense: each masked token is a decay step with a zero bootstrap (spec example 2)
    assert [adv[0, 0].item(), adv[0, 3].item()] == pytest.approx([-0.103424, 0.75], rel=1e-5)
    assert [ret[0, 0].item(), ret[0, 3].item()] == pytest.approx([0.396576, 1.0], rel=1e-5)
    v = verdicts(fixed.run, GAP)
    assert v["reference"].status == "pass" and v["poison"].status == "pass"
    assert v["gap-invariance"].status == "n/a"  # declared dense: gaps are meant to cost a step


@pytest.mark.needs_mirror
@pytest.mark.parametrize("pin", ["head", "fixed"])
def test_observation_tail_loses_the_score(pin, request):
    h = request.getfixturevalue(pin)
    adv, _ = h.run(TAIL)
    assert adv.abs().max().item() == 0.0  # the score sat on the masked last real token
    v = verdicts(h.run, TAIL)
    assert v["score-kept"].failed and v["score-kept"].positions == [[0, 2]]
    assert v["score-kept"].expected == [1.0] and v["score-kept"].observed == [0.0]
    # the same row ending in padding keeps its score: the placement follows attention, not the mask
    padded = TAIL.replace(attention=TAIL.trainable)
    assert h.run(padded)[0][0].tolist() == [0.0, 0.0, 1.0, 0.0, 0.0]
    assert verdicts(h.run, padded)["score-kept"].status == "pass"


@pytest.mark.needs_mirror
def test_token_rewards_arrive_through_the_kl_term_unclamped(fixed):
    case = Case.build(
        trainable=[[1, 1, 1, 1]],
        token_rewards=[[100.0, -37.5, 0.25, 3.0]],
        values=[[1.0, -2.0, 0.5, 4.0]],
        score=[2.0],
        gamma=0.9,
        lam=0.8,
    )
    v = verdicts(fixed.run, case)
    assert v["all-trainable"].status == "pass" and v["reference"].status == "pass"


@pytest.mark.needs_mirror
@pytest.mark.parametrize("poison", ["values", "token_rewards"])
def test_nan_poison_is_multiplied_in(fixed, poison):
    fields = {"values": [[0.5, 0.25, 0.0]], "token_rewards": [[0.0, 0.0, 0.0]]}
    fields[poison] = [[fields[poison][0][0], fields[poison][0][1], math.nan]]
    case = Case.build(trainable=[[1, 1, 0]], score=[1.0], gamma=1.0, lam=0.9, **fields)
    adv, _ = fixed.run(case)
    assert math.isnan(adv[0, 0].item()) and math.isnan(adv[0, 1].item())
    assert verdicts(fixed.run, case)["poison-nonfinite"].failed


# ---------------------------------------------------------------------------------------------
# A short fuzz per pin: which properties fail.
# ---------------------------------------------------------------------------------------------
CLEAN = {"no-crash", "row-independence", "masked-zero", "deterministic", "all-trainable"}


@pytest.mark.needs_mirror
@pytest.mark.parametrize("pin, leaks", [("head", True), ("fixed", False)])
def test_short_fuzz(pin, leaks, request):
    h = request.getfixturevalue(pin)
    result = fuzz_target(h.run, h.declared, target="roll", pin=h.pin, max_examples=200, seed=0, derandomize=True,
                         shrink=False)
    failed = {p for p, n in result.failed.items() if n}
    # the lost score shows as score-kept (gamma = 0) and reference; NaN poison at every pin
    assert {"score-kept", "reference", "poison-nonfinite"} <= failed, failed
    assert ("poison" in failed) == leaks, failed
    assert not failed & CLEAN, failed


# ---------------------------------------------------------------------------------------------
# Without a mirror: the registry entry and a tree without ROLL.
# ---------------------------------------------------------------------------------------------
def test_registry_entry():
    spec = registry.get("roll")
    assert spec is roll.SPEC and spec.contract == "dense" and spec.whitening is None and spec.masked_zero
    assert [p.rev for p in spec.pins] == [SEED_PIN, HEAD_PIN, FIX_PIN]
    assert spec.entries == ("default", "agentic")
    assert "tensordict" not in spec.stand_ins and "torch_npu" in spec.deny


def test_domain_excludes_float64_and_left_padding():
    domain = roll.SPEC.domain
    assert "float32" in domain.rejects(SEED.replace(dtype="float64"))
    assert "left-padded" in domain.rejects(Case.build(trainable=[[0, 1, 1]], attention=[[0, 1, 1]]))
    assert domain.rejects(TAIL) is None and domain.rejects(GAP) is None
    assert set(domain.restrictions()) == {"dtypes", "left_padding"}


def test_pipeline_domains_cite_and_reject():
    """RLVR: one contiguous right-padded response, finite inputs; agentic: turns with gaps, the KL masked by the
    same mask the advantage reads. Every narrowing cites a ROLL file:line at every pin."""
    rlvr = {pin: roll.SPEC.for_entry("default").pipeline_at(pin) for pin in (SEED_PIN, HEAD_PIN, FIX_PIN)}
    agentic = {pin: roll.SPEC.for_entry("agentic").pipeline_at(pin) for pin in (SEED_PIN, HEAD_PIN, FIX_PIN)}
    assert rlvr[SEED_PIN] is roll.SPEC.pipeline and agentic[HEAD_PIN] is not rlvr[HEAD_PIN]
    for pin in (SEED_PIN, HEAD_PIN, FIX_PIN):
        dom, agt = rlvr[pin], agentic[pin]
        assert dom.cited() == [] and agt.cited() == []
        assert all(pin in why for why in dom.restrictions().values())
        assert set(dom.restrictions()) == {"gaps", "masked_real_tail", "left_padding", "nonfinite_poison"}
        assert set(agt.restrictions()) == {"left_padding", "masked_rewards", "nonfinite_poison"}
        # the seed report's case with its masked slot as padding (a critic value under it) is in both pipelines
        padded = SEED.replace(attention=SEED.trainable.clone())
        assert dom.rejects(padded) is None and agt.rejects(padded) is None
        assert "gap" in dom.rejects(GAP) and agt.rejects(GAP) is None
        assert "ends in real non-trainable" in dom.rejects(TAIL) and agt.rejects(TAIL) is None
        left = Case.build(trainable=[[0, 1, 1]], attention=[[0, 1, 1]])
        assert "left-padded" in dom.rejects(left) and "left-padded" in agt.rejects(left)
        nan = Case.build(trainable=[[1, 1, 0]], attention=[[1, 1, 0]], values=[[0, 0, math.nan]])
        assert "NaN" in dom.rejects(nan) and "NaN" in agt.rejects(nan)
        kl_under_mask = Case.build(trainable=[[1, 1, 0]], attention=[[1, 1, 0]], token_rewards=[[0, 0, 5]])
        assert dom.rejects(kl_under_mask) is None and "non-trainable" in agt.rejects(kl_under_mask)


def test_tree_without_roll_is_not_present(tmp_path):
    (tmp_path / "roll" / "utils").mkdir(parents=True)
    (tmp_path / "roll" / "__init__.py").write_text("")
    (tmp_path / "roll" / "utils" / "__init__.py").write_text("")
    spec = roll.SPEC
    worker = Worker(LoadSpec(spec.adapter, str(tmp_path), None, spec.stand_ins, spec.deny, spec.own))
    with pytest.raises(WorkerSkip, match="roll.utils.functionals is not present"):
        worker.start()
    worker.close()

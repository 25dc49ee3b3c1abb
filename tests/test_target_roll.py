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

Promise model (issue 24, docs/audit/roll.md "Promise audit"): the value leak is a defect (universal:poison) with a
pipeline witness, the padding slot's critic value that ROLL's critic produces (base_worker.py forward_func_values)
and compute_advantage passes unmasked; the lost score and the NaN are robustness facts (no ROLL pipeline ends a
response on a masked token or holds NaN under the mask); the agentic REINFORCE's one reward per turn is a semantics
fact (its docstring says it accumulates from each segment's last position).

ROLL is git only: these tests need MASKFUZZ_REPOS=roll=/path/to/a-ROLL-clone-or-mirror; without it they skip.
The checks of the registry entry and of a tree without ROLL run everywhere.
"""

from __future__ import annotations

import math
import sys
import time

import pytest
import torch

from maskfuzz.fuzz.engine import fuzz_target
from maskfuzz.fuzz.triage import retriage
from maskfuzz.oracles.case import Case
from maskfuzz.oracles.kinds.dispatch import judge
from maskfuzz.targets import registry
from maskfuzz.targets.roll import calls_kinds as roll_kinds
from maskfuzz.targets.roll import declare as roll
from maskfuzz.targets.runtime.client import LoadSpec, Worker, WorkerSkip
from maskfuzz.targets.runtime.repos import parse_repos
from maskfuzz.targets.runtime.session import open_target

SEED_PIN, HEAD_PIN, FIX_PIN = "c09bc8bc9f43", "8eb27cc2dc34", "090ac94658ad"

# The seed report's case and the spec's worked examples 2 and 3.
SEED = Case.build(trainable=[[1, 1, 0]], token_rewards=[[0, 1, 0]], values=[[0, 0, 100]], gamma=1.0, lam=0.95)
GAP = Case.build(trainable=[[1, 0, 0, 1]], values=[[0.5, 9, 9, 0.25]], score=[1.0], gamma=0.9, lam=0.8)
TAIL = Case.build(trainable=[[1, 1, 1, 0, 0]], attention=[[1, 1, 1, 1, 1]], score=[1.0], gamma=0.0, lam=0.9)
LEAKED = [5.699999809265137, 6.0]  # float32: 0.95 * 6 and 1 + 100 - 0.95 * 100
FIXED = [0.949999988079071, 1.0]


def verdicts(run, case: Case) -> dict:
    return {v.property: v for v in judge(run, case, roll.SPEC.declared())}


def triaged(h, case: Case, prop: str) -> dict:
    """The failure of `prop` on `case` triaged as the corpus replay does at the handle's pin (reach without a search:
    the case itself or its projection into the pipeline domain): class, promise, reach, severity."""
    v = next(v for v in judge(h.run, case, h.declared) if v.property == prop)
    assert v.failed, (prop, v.status, v.message)
    return retriage(h.run, v.case or case, v, h.declared, h.spec.id)


# the seed report's case as the RLVR pipeline builds it: the masked slot is padding after the response, holding the
# critic's value of the last real token (forward_func_values, values = output_tensor[:, :-1])
SEED_PADDED = SEED.replace(attention=SEED.trainable.clone())


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
    # the leak is inside the row: since padding twins add a padding column only as non-sample padding (zero
    # critic value, as the pipeline builds it), the row twin no longer re-finds it; poison and reference do
    for prop in ("no-crash", "masked-zero", "deterministic", "row-independence"):
        assert v[prop].status == "pass", (prop, v[prop].message)


@pytest.mark.needs_mirror
@pytest.mark.parametrize("pin", ["seed_pin", "head"])
def test_seed_report_is_a_pipeline_defect(pin, request):
    """Seed report 000 survives the promise model: universal:poison, reach pipeline through the cited production of
    masked critic values (the padding slot after the response holds the critic's value of the last real token,
    base_worker.py:676 / :691, and compute_advantage hands it to GAE unmasked, functionals.py:819-822 / :1163-1166)."""
    h = request.getfixturevalue(pin)
    pipe = h.declared.pipeline
    assert pipe.rejects(SEED_PADDED) is None and pipe.unproduced(SEED_PADDED) == []
    assert "base_worker.py:" in pipe.produces["masked_values"] and "unmasked" in pipe.produces["masked_values"]
    t = triaged(h, SEED_PADDED, "poison")
    assert (t["class"], t["mechanism"], t["promise"]) == ("defect", "masked-value-bootstrap", "universal:poison")
    assert (t["reach"], t["severity"]) == ("pipeline", "high")
    # the seed's own case (its masked slot a real token, an observation tail) is no RLVR batch: api only
    assert triaged(h, SEED, "poison")["class"] == "robustness"


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
    # a defect in the agentic pipeline too: its critic values reach agentic_compute_advantage unmasked
    # (agentic/utils.py:503-507 at this pin)
    t = triaged(agentic_fixed, SEED_PADDED, "poison")
    assert (t["class"], t["promise"], t["reach"], t["severity"]) == ("defect", "universal:poison", "pipeline", "high")


@pytest.mark.needs_mirror
def test_pr447_test_is_a_promise_at_its_head_only(fixed):
    """PR #447's own regression test (tests/utils/test_functionals.py:66-93 at 090ac94658ad) promises that a masked
    critic value does not move compute_advantage's GAE advantages; it exists at that head only, where it holds."""
    ids = {pin: [p.id for p in roll.SPEC.declared("default", pin).promises] for pin in (SEED_PIN, HEAD_PIN, FIX_PIN)}
    assert ids == {SEED_PIN: [], HEAD_PIN: [], FIX_PIN: ["upstream:tests/utils/test_functionals.py:66-93"]}
    assert [p.id for p in roll.SPEC.declared("default-kl", FIX_PIN).promises] == ids[FIX_PIN]
    assert verdicts(fixed.run, SEED)["poison"].status == "pass"  # the promise is kept at its pin


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
    # a robustness fact, not a defect: RLVR never ends a response on a masked real token (postprocess_generate,
    # functionals.py:1287-1292 / :936-941), and score-kept speaks of what the pipeline builds
    t = triaged(h, TAIL, "score-kept")
    assert (t["class"], t["mechanism"], t["reach"]) == ("robustness", "score-lost", "api")


@pytest.mark.needs_mirror
def test_agentic_observation_tail_is_no_pipeline_input(agentic_fixed):
    """The agentic copy drops the same score, but every env manager shipped at the pins ends a sample on a response
    token (traj_env_manager.py:289-290 pops the trailing observation, ...): a robustness fact."""
    assert "ends in real non-trainable" in agentic_fixed.declared.pipeline.rejects(TAIL)
    t = triaged(agentic_fixed, TAIL, "score-kept")
    assert (t["class"], t["mechanism"], t["reach"]) == ("robustness", "score-lost", "api")


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
    # a robustness fact: critic values and log-prob differences are finite in the pipeline (nonfinite_poison narrowed)
    t = triaged(fixed, case, "poison-nonfinite")
    assert (t["class"], t["mechanism"]) == ("robustness", "nan-through-mask")


# ---------------------------------------------------------------------------------------------
# A short fuzz per pin: which properties fail.
# ---------------------------------------------------------------------------------------------
CLEAN = {"no-crash", "deterministic", "all-trainable"}  # row-independence: also the leak (a probe value in its padding)


@pytest.mark.needs_mirror
@pytest.mark.parametrize("pin, leaks", [("head", True), ("fixed", False)])
def test_short_fuzz(pin, leaks, request):
    h = request.getfixturevalue(pin)
    result = fuzz_target(
        h.run, h.declared, target="roll", pin=h.pin, max_examples=200, seed=0, derandomize=True, shrink=False
    )
    failed = {p for p, n in result.failed.items() if n}
    # the lost score shows as score-kept (gamma = 0) and reference; NaN poison at every pin
    assert {"score-kept", "reference", "poison-nonfinite"} <= failed, failed
    assert ("poison" in failed) == leaks, failed
    assert not failed & CLEAN, failed
    assert "row-independence" not in failed or leaks, failed
    # NaN under the mask also stays at the masked advantages: `advantages * response_mask` (functionals.py:1184 at
    # 8eb27cc2dc34) keeps NaN * 0; masked-zero fails only on NaN-poisoned cases
    if "masked-zero" in failed:
        assert result.finding("masked-zero").case.has_nonfinite_poison()


# ---------------------------------------------------------------------------------------------
# Without a mirror: the registry entry and a tree without ROLL.
# ---------------------------------------------------------------------------------------------
def test_registry_entry():
    spec = registry.get("roll")
    assert spec is roll.SPEC and spec.contract == "dense" and spec.whitening is None and spec.masked_zero
    assert [p.rev for p in spec.pins] == [SEED_PIN, HEAD_PIN, FIX_PIN]
    assert spec.entries == ("default", "agentic", *roll_kinds.KIND_ENTRIES, "default-kl")
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
        assert set(agt.restrictions()) == {"left_padding", "masked_real_tail", "masked_rewards", "nonfinite_poison"}
        # every production is cited at this pin with a file:line; the features each pipeline builds
        assert all(pin in why and ".py:" in why for d in (dom, agt) for why in d.produces.values())
        assert set(dom.produces) == {
            "masked_values",
            "leading_mask",
            "all_masked_rows",
            "masked_rewards",
            "token_rewards",
            "truncated_rows",
            "truncated_padded",
        }
        assert set(agt.produces) == {
            "gaps",
            "leading_mask",
            "empty_rows",
            "masked_values",
            "token_rewards",
            "truncated_rows",
            "truncated_padded",
        }
        assert "traj_env_manager.py:" in agt.why["masked_real_tail"] and "pops" in agt.why["masked_real_tail"]
        # the seed report's case with its masked slot as padding (a critic value under it) is in both pipelines
        padded = SEED.replace(attention=SEED.trainable.clone())
        assert dom.rejects(padded) is None and agt.rejects(padded) is None
        assert "gap" in dom.rejects(GAP) and agt.rejects(GAP) is None
        assert "ends in real non-trainable" in dom.rejects(TAIL) and "ends in real non-trainable" in agt.rejects(TAIL)
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


# ---------------------------------------------------------------------------------------------
# Entries beyond GAE (targets/roll/calls_kinds.py), at main 8eb27cc2dc34 (the math is the same at every pin).
#
# Verdicts derived by reading ROLL's code (roll/utils/functionals.py, roll/pipeline/agentic/utils.py at 8eb27cc2dc34):
# * grpo: reward_norm (:564-600) reshapes to (-1, n_sample) and divides by torch.std + 1e-6 (:586, :593); a group
#   of one (num_return_sequences_in_group defaults to 1, rlvr_config.py:95-96) has std NaN (no-crash); rows that
#   get_sample_level_mask zeroes still count in their group (reference / pad-invariance); the score sits on the
#   last attended token, so an observation tail loses it (api only in RLVR); NaN under the mask passes the KL
#   product kld * mask (:209) and the reverse cumsum (poison-nonfinite, api only).
# * agentic-grpo: agentic_reward_norm (agentic/utils.py:100-153) zeroes a singleton group (declared); an all-masked
#   row (a placeholder rollout, agent_native_env_manager.py:433-477: score 0, same traj_group_id) counts in its
#   group (pad-invariance, pipeline); the observation tail loses the score (pipeline).
# * kl entries: compute_approx_kl (:181-211) is exact, zeros by `* action_mask`, which NaN breaks (masked-zero).
# * whiten: masked_whiten (:364-370) matches the two-pass reference; NaN under the mask leaks (values * mask).
# * agentic-reinforce (contract `segment`: one discount per turn, a turn's reward the sum of its tokens' rewards):
#   compute_agentic_reinforce_return (agentic/utils.py:391-455) reads only the reward at the last token of each
#   segment (:447), so a token-level KL reward inside a turn is dropped (reference, turn-reward-lost); the
#   observation tail loses the score (score-kept / reference, score-lost).
# ---------------------------------------------------------------------------------------------
from kind_support import failed_properties, handle_cache  # noqa: E402

kind_failed = failed_properties


@pytest.fixture(scope="module")
def kinds_open():
    with handle_cache(lambda entry: _open(f"roll:{entry}@{HEAD_PIN}")) as get:
        yield get


def test_kind_entries_are_declared_with_cited_pipelines():
    spec = roll.SPEC
    assert spec.entries[:2] == ("default", "agentic")
    kinds = {e: spec.kind_of(e) for e in spec.entries[2:]}
    assert kinds == {
        "grpo": "group-advantage",
        "agentic-grpo": "group-advantage",
        "kl": "kl",
        "kl-abs": "kl",
        "kl-mse": "kl",
        "kl-k3": "kl",
        "whiten": "normalization",
        "agentic-reinforce": "returns",
        "agentic-reinforce-kl": "returns",
        "agg-token-mean": "loss-aggregation",
        "agg-seq-mean-token-sum": "loss-aggregation",
        "agg-seq-mean-token-mean": "loss-aggregation",
        "agg-seq-mean-token-sum-norm": "loss-aggregation",
        "value-loss": "value-loss",
        "policy-loss": "policy-loss",
        "default-kl": "gae",
    }
    for entry in kinds:
        if entry.startswith("agg-") or entry in (
            "value-loss",
            "policy-loss",
        ):  # losses: no pipeline domain researched (reach api)
            assert spec.for_entry(entry).pipeline is None
            continue
        for pin in (SEED_PIN, HEAD_PIN, FIX_PIN):
            dom = spec.for_entry(entry).pipeline_at(pin)
            assert dom is not None and dom.cited() == [], (entry, pin)
    assert spec.for_entry("agentic-grpo").variant == {"singleton": "zero", "empty_rows": "counted"}
    assert spec.for_entry("grpo").variant == {"empty_rows": "counted"}
    assert spec.for_entry("kl-k3").variant == {"estimator": "k3", "clamp": (-10.0, 10.0)}
    ret = spec.for_entry("agentic-reinforce")
    assert ret.contract == "segment" and not ret.domain.critic and not ret.pipeline_at(HEAD_PIN).critic
    assert spec.for_entry("grpo").documented_errors == (r"GroupShapeError", r"TruncationShapeError")


def test_groups_are_ordered_into_equal_contiguous_blocks():
    order, n = roll_kinds.contiguous_groups(torch.tensor([7, 3, 7, 3]))
    assert order.tolist() == [0, 2, 1, 3] and n == 2
    with pytest.raises(roll_kinds.GroupShapeError, match="sizes"):
        roll_kinds.contiguous_groups(torch.tensor([0, 0, 1]))


@pytest.mark.needs_mirror
def test_grpo_normalises_per_reshaped_group(kinds_open):
    h = kinds_open("grpo")
    assert "reward_norm" in h.info["where"]
    case = Case.build(
        trainable=[[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 0]],
        attention=[[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 0]],
        score=[1, 2, 0, 4],
        group=[0, 1, 0, 1],  # interleaved: the adapter orders them into blocks of n = 2
    )
    (adv,) = h.run(case)
    a = 0.5 / (0.5**0.5 + 1e-6)  # group 0: (r - 0.5) / (unbiased std + 1e-6)
    b = 1.0 / (2**0.5 + 1e-6)  # group 1: (r - 3) / (sqrt(2) + 1e-6)
    assert adv.flatten().tolist() == pytest.approx([a, a, 0, -b, -b, -b, -a, 0, 0, b, b, 0], rel=1e-6)
    assert kind_failed(h, case) == set()
    with pytest.raises(Exception, match="GroupShapeError"):
        h.run(Case.build(trainable=[[1]] * 3, score=[1, 2, 3], group=[0, 0, 1]))


@pytest.mark.needs_mirror
def test_grpo_group_of_one_is_nan(kinds_open):
    h = kinds_open("grpo")
    case = Case.build(trainable=[[1, 1]], attention=[[1, 1]], score=[1.0], group=[0])
    (adv,) = h.run(case)  # num_return_sequences 1: torch.std of one element is NaN
    assert torch.isnan(adv).all() and "no-crash" in kind_failed(h, case)


@pytest.mark.needs_mirror
def test_grpo_counts_a_sample_masked_row_in_its_group(kinds_open):
    h = kinds_open("grpo")
    # row 2 has real tokens but get_sample_level_mask zeroed its final mask: ROLL still counts its reward
    case = Case.build(trainable=[[1, 1], [1, 1], [0, 0]], attention=[[1, 1]] * 3, score=[2, 0, 4], group=[0, 0, 0])
    (adv,) = h.run(case)
    assert adv[:, 0].tolist() == pytest.approx([0.0, -2 / (2 + 1e-6), 0.0], rel=1e-6)  # mean 2, std 2
    # counting it is the variant ROLL implements (reward_postprocess normalises every row's score): declared
    # empty_rows "counted", so the reference holds; excluding the row is another variant, not a promise
    assert kind_failed(h, case) == set()


@pytest.mark.needs_mirror
def test_grpo_loses_the_score_behind_an_observation_tail(kinds_open):
    h = kinds_open("grpo")
    case = Case.build(trainable=[[1, 1], [1, 0]], attention=[[1, 1], [1, 1]], score=[0.0, 1.0], group=[0, 0])
    (adv,) = h.run(case)
    # row 1's score sits on its masked last attended token and is multiplied away: its group sees it, it does not
    a = 0.5 / (0.5**0.5 + 1e-6)
    assert adv.flatten().tolist() == pytest.approx([-a, -a, 0.0, 0.0], rel=1e-6)
    assert "reference" in kind_failed(h, case)


@pytest.mark.needs_mirror
def test_agentic_grpo_groups_by_id_and_zeroes_singletons(kinds_open):
    h = kinds_open("agentic-grpo")
    assert "agentic_reward_norm" in h.info["where"]
    case = Case.build(trainable=[[1, 1]] * 5, attention=[[1, 1]] * 5, score=[1, 2, 0, 4, 1], group=[5, 3, 5, 3, 9])
    (adv,) = h.run(case)
    a = 0.5 / (0.5**0.5 + 1e-6)
    b = 1.0 / (2**0.5 + 1e-6)
    assert adv[:, 0].tolist() == pytest.approx([a, -b, -a, b, 0.0], rel=1e-6)
    assert kind_failed(h, case) == set()  # pad-invariance adds a padding column, never a sample of a group
    # a placeholder rollout (all masked, score 0) in the singleton's group turns it into a group of two: the
    # variant agentic_reward_norm implements (every row of the traj_group_id counts), declared empty_rows "counted"
    placeholder = Case.build(trainable=[[1, 1], [0, 0]], attention=[[1, 1], [0, 0]], score=[1.0, 0.0], group=[9, 9])
    (adv,) = h.run(placeholder)
    assert adv[0].tolist() == pytest.approx([a, a], rel=1e-6)
    assert kind_failed(h, placeholder) == set()


@pytest.mark.needs_mirror
@pytest.mark.parametrize(
    "entry, expect",
    [
        ("kl", [0.5, -20.0, 0.0]),
        ("kl-abs", [0.5, 20.0, 0.0]),
        ("kl-mse", [0.125, 200.0, 0.0]),
        ("kl-k3", [math.exp(-0.5) - 0.5, 10.0, 0.0]),  # exp(20) - 21 clamped to 10
    ],
)
def test_kl_estimators_multiply_by_the_mask(kinds_open, entry, expect):
    h = kinds_open(entry)
    assert h.info["where"] == "roll/utils/functionals.py::compute_approx_kl"
    case = Case.build(trainable=[[1, 1, 0]], extra={"logp": [[-1.0, -21.0, 5.0]], "ref_logp": [[-1.5, -1.0, 0.0]]})
    (kl,) = h.run(case)
    assert kl[0].tolist() == pytest.approx(expect, rel=1e-5)
    assert kind_failed(h, case) == set()
    nan = case.replace(
        extra={"logp": torch.tensor([[-1.0, -21.0, math.nan]], dtype=torch.float64), "ref_logp": case.extra["ref_logp"]}
    )
    (kl,) = h.run(nan)
    assert math.isnan(kl[0, 2].item()) and kind_failed(h, nan) == {"masked-zero"}  # NaN * 0


@pytest.mark.needs_mirror
def test_whiten_two_pass_unbiased(kinds_open):
    h = kinds_open("whiten")
    assert h.info["where"] == "roll/utils/functionals.py::masked_whiten"
    case = Case.build(trainable=[[1, 1, 0], [1, 0, 1]], extra={"x": [[1.0, 2.0, 9.0], [3.0, 5.0, 4.0]]})
    (out,) = h.run(case)
    s = (5 / 3 + 1e-8) ** 0.5  # unbiased variance of 1, 2, 3, 4; eps inside the rsqrt
    assert out.flatten().tolist() == pytest.approx([-1.5 / s, -0.5 / s, 6.5 / s, 0.5 / s, 2.5 / s, 1.5 / s], rel=1e-5)
    assert kind_failed(h, case) == set()
    nan = case.replace(extra={"x": torch.tensor([[1.0, 2.0, math.nan], [3.0, 5.0, 4.0]], dtype=torch.float64)})
    assert torch.isnan(h.run(nan)[0]).all() and "poison-nonfinite" in kind_failed(h, nan)


@pytest.mark.needs_mirror
def test_agentic_reinforce_reads_one_reward_per_segment(kinds_open):
    h = kinds_open("agentic-reinforce")
    assert "compute_agentic_reinforce_return" in h.info["where"]
    case = Case.build(
        trainable=[[1, 1, 0, 1, 1]],
        attention=[[1] * 5],
        token_rewards=[[0.5, 0.25, 3, 0.125, 0]],
        score=[1.0],
        gamma=0.5,
    )
    adv, ret = h.run(case)
    # segments [0, 2) and [3, 5): G = r[4] + score = 1, then r[1] + 0.5 * 1; r[0] and r[3] are never read, the
    # masked 3 is multiplied away; every token of a segment gets its segment's value
    assert ret[0].tolist() == pytest.approx([0.75, 0.75, 0.0, 1.0, 1.0])
    assert adv[0].tolist() == ret[0].tolist()
    # segment reference: turn sums 0.75 and 1.125, G = 1.125 and 0.75 + 0.5 * 1.125: [1.3125, 1.3125, -, 1.125, 1.125]
    assert kind_failed(h, case) == {"reference"}
    # a semantics fact, not a defect: the docstring (agentic/utils.py:395-396) says each segment accumulates from its
    # last position, which is what :447 reads; nothing of ROLL promises a per-turn sum
    t = triaged(h, case, "reference")
    assert (t["class"], t["mechanism"]) == ("semantics", "turn-reward-lost")
    assert not roll.SPEC.declared("agentic-reinforce", HEAD_PIN).promises
    # gamma = 1: the dropped token rewards (0.5 and 0.125) still show: [1.875, 1.875, -, 1.125, 1.125] expected
    flat = case.replace(gamma=1.0)
    assert h.run(flat)[1][0].tolist() == pytest.approx([1.25, 1.25, 0.0, 1.0, 1.0])
    assert kind_failed(h, flat) == {"reference"}
    # one-token turns: nothing to drop, the segment reference holds
    single = Case.build(trainable=[[1, 0, 1]], token_rewards=[[0.5, 3, 0.25]], score=[1.0], gamma=0.5)
    assert h.run(single)[1][0].tolist() == pytest.approx([1.125, 0.0, 1.25])
    assert kind_failed(h, single) == set()


ROLL_KIND_FUZZ = {  # entry -> (properties that must fail, properties that may fail)
    "grpo": ({"no-crash", "poison-nonfinite"}, {"pad-invariance", "affine", "masked-zero", "reference"}),
    "agentic-grpo": ({"poison-nonfinite"}, {"affine", "masked-zero", "reference"}),
    "kl-k3": ({"masked-zero"}, set()),
    "whiten": ({"poison-nonfinite"}, set()),
    # reference: turn-reward-lost (agentic/utils.py:447) and score-lost behind an observation tail
    "agentic-reinforce": ({"reference"}, {"score-kept"}),
}


@pytest.mark.needs_mirror
@pytest.mark.parametrize("entry", list(ROLL_KIND_FUZZ))
def test_kind_short_fuzz(kinds_open, entry):
    h = kinds_open(entry)
    must, may = ROLL_KIND_FUZZ[entry]
    t0 = time.monotonic()
    res = fuzz_target(
        h.run, h.declared, target=f"roll:{entry}", pin=h.pin, max_examples=40, seed=0, derandomize=True, shrink=False
    )
    print(f"\n[roll:{entry}] fuzz 40: {time.monotonic() - t0:.1f} s", file=sys.stderr)
    failed = {p for p, n in res.failed.items() if n}
    assert must <= failed <= must | may, failed


# ---------------------------------------------------------------------------------------------
# Loss aggregation: agg_loss (roll/utils/functionals.py:228-282 at 8eb27cc2dc34) with the strategy's global
# batch_num_tokens / global_valid_samples, each micro-batch loss * dp_size (roll_kinds.load_loss).
# row 0: 2 tokens (losses 1, 3), row 1: 1 token (loss 2), row 2: none; 100 under the mask; micro-batches {0}, {1, 2}
# ---------------------------------------------------------------------------------------------
AGG_STEP = Case.build(
    trainable=[[1, 1, 0], [1, 0, 0], [0, 0, 0]],
    extra={"loss": [[1.0, 3.0, 100.0], [2.0, 100.0, 100.0], [100.0, 100.0, 100.0]]},
    split=[0, 1, 1],
)


@pytest.mark.needs_mirror
def test_agg_token_mean_sums_the_masked_losses(kinds_open):
    h = kinds_open("agg-token-mean")
    assert h.info["where"] == "roll/utils/functionals.py::agg_loss"
    loss, grad = h.run(AGG_STEP)
    # (loss_mat * weights).sum() / batch_num_tokens (:252-255): every entry, masked ones included, over 3 tokens
    assert loss[0, 0].item() == pytest.approx(606.0 / 3.0)
    assert grad.flatten().tolist() == pytest.approx([1 / 3] * 9)
    assert {"reference", "poison", "masked-zero"} <= kind_failed(h, AGG_STEP)
    clean = AGG_STEP.replace(extra={"loss": [[1.0, 3.0, 0.0], [2.0, 0.0, 0.0], [0.0, 0.0, 0.0]]})
    assert h.run(clean)[0][0, 0].item() == pytest.approx(2.0)  # zeros under the mask: the global token mean
    assert "split-invariance" not in kind_failed(h, clean)


@pytest.mark.needs_mirror
@pytest.mark.parametrize("entry, value", [("agg-seq-mean-token-sum", 3.0), ("agg-seq-mean-token-mean", 2.0)])
def test_agg_seq_means_over_the_global_valid_samples(kinds_open, entry, value):
    h = kinds_open(entry)
    loss, grad = h.run(AGG_STEP)
    # rows with a trained token: (4 + 2) / 2 and (2 + 2) / 2; masked_sum / masked_mean multiply by the mask
    assert loss[0, 0].item() == pytest.approx(value)
    assert grad[0, 2].item() == 0.0 and grad[2].tolist() == [0.0, 0.0, 0.0]
    assert kind_failed(h, AGG_STEP) == set()


@pytest.mark.needs_mirror
def test_agg_seq_mean_token_sum_norm_divides_by_the_width_not_the_rows(kinds_open):
    h = kinds_open("agg-seq-mean-token-sum-norm")
    loss, grad = h.run(AGG_STEP)
    # sum of the masked row sums / loss_mask.shape[-1] (:268-276): 6 / 3, every trained token weighted 1/3;
    # the Dr.GRPO reference with constant 32 is 6 / (2 rows * 32)
    assert loss[0, 0].item() == pytest.approx(2.0)
    assert grad[0, :2].tolist() == pytest.approx([1 / 3, 1 / 3])
    assert {"reference", "pad-invariance"} <= kind_failed(h, AGG_STEP)


ROLL_AGG_FUZZ = {  # entry -> properties that fail on a short fuzz (all others pass)
    # the unmasked numerator: masked losses leak into the loss, an all-masked step sums them over 1 token (a padding
    # column holds a zero loss, as the pipeline builds it, so pad-invariance holds; poison finds the leak)
    "agg-token-mean": {"reference", "poison", "poison-nonfinite", "masked-zero", "empty-step"},
    "agg-seq-mean-token-sum": {"poison-nonfinite"},  # NaN * 0 in masked_sum
    "agg-seq-mean-token-mean": {"poison-nonfinite"},
    "agg-seq-mean-token-sum-norm": {"reference", "pad-invariance", "poison-nonfinite"},
}


@pytest.mark.needs_mirror
@pytest.mark.parametrize("entry", list(ROLL_AGG_FUZZ))
def test_agg_short_fuzz(kinds_open, entry):
    h = kinds_open(entry)
    t0 = time.monotonic()
    res = fuzz_target(
        h.run, h.declared, target=f"roll:{entry}", pin=h.pin, max_examples=60, seed=0, derandomize=True, shrink=False
    )
    print(f"\n[roll:{entry}] fuzz 60: {time.monotonic() - t0:.1f} s", file=sys.stderr)
    failed = {p for p, n in res.failed.items() if n}
    assert failed == ROLL_AGG_FUZZ[entry], failed
    assert res.checked["split-invariance"] > 0


# ---------------------------------------------------------------------------------------------
# Value loss: CriticWorker.loss_func (roll/pipeline/base_worker.py:652-688 at 8eb27cc2dc34) compiled from the pin,
# value_clip 0.5, 0.5 * masked_mean(max(surr1, surr2), response_mask, dim=-1).mean() per micro-batch, each
# micro-batch loss * (mini_steps * dp_size) / gradient_accumulation_steps (roll_kinds.load_value).
# row 0: v 1.25, v_old 1, R 0: inside the clip range, l = 0.5 * 1.5625, dl/dv = 1.25;
# row 1: v 2, v_old 1, R 3: clipped to 1.5, (1.5 - 3)^2 = 2.25 > (2 - 3)^2 = 1, l = 1.125, dl/dv = 0; 50 under the mask
# ---------------------------------------------------------------------------------------------
VALUE_STEP = Case.build(
    trainable=[[1, 0], [1, 0]],
    extra={"v": [[1.25, 50.0], [2.0, 50.0]], "v_old": [[1.0, 0.0], [1.0, 0.0]], "ret": [[0.0, 9.0], [3.0, 9.0]]},
)


@pytest.mark.needs_mirror
def test_value_loss_hand_computed(kinds_open):
    h = kinds_open("value-loss")
    assert h.info["where"] == "roll/pipeline/base_worker.py::CriticWorker.loss_func"
    assert roll.SPEC.for_entry("value-loss").variant == {
        "clip": 0.5,
        "half": True,
        "mode": "seq-mean-token-mean",
        "empty_rows": "counted",  # masked_mean(dim=-1) gives an empty row 0 and `.mean()` counts it
    }
    loss, grad = h.run(VALUE_STEP)
    assert loss[0, 0].item() == pytest.approx((0.78125 + 1.125) / 2)
    assert grad.flatten().tolist() == pytest.approx([0.625, 0.0, 0.0, 0.0])
    assert kind_failed(h, VALUE_STEP) == set()  # pad-invariance: a padding column, never a new row
    # two micro-batches: each is its own row mean, and loss_scale makes the step their sum (not their mean)
    split = VALUE_STEP.replace(split=torch.tensor([0, 1]))
    assert h.run(split)[0][0, 0].item() == pytest.approx(0.78125 + 1.125)
    assert "split-invariance" in kind_failed(h, split)
    # an all-masked row counts in the row mean: masked_mean(dim=-1) gives it 0, `.mean()` divides by 3 rows
    empty = Case.build(
        trainable=[[1, 0], [1, 0], [0, 0]],
        extra={
            k: v + [[7.0, 7.0]]
            for k, v in {
                "v": [[1.25, 50.0], [2.0, 50.0]],
                "v_old": [[1.0, 0.0], [1.0, 0.0]],
                "ret": [[0.0, 9.0], [3.0, 9.0]],
            }.items()
        },
    )
    assert h.run(empty)[0][0, 0].item() == pytest.approx((0.78125 + 1.125) / 3)
    assert kind_failed(h, empty) == set()  # the declared variant: empty rows counted


@pytest.mark.needs_mirror
def test_value_loss_split_breaks_the_loss_scale_promise(kinds_open):
    """apply_loss_scale's help (roll/configs/worker_config.py:234-239 at 8eb27cc2dc34) promises gradients 'equivalent
    to computing the loss on the full global batch at once with the global denominator'; the critic's per-micro-batch
    row mean times DP x GA is the sum of the micro-batch means: a defect naming that promise (api: the loss entries
    have no pipeline domain; a uniform rescale on equal micro-batches: medium)."""
    h = kinds_open("value-loss")
    split = VALUE_STEP.replace(split=torch.tensor([0, 1]))
    t = triaged(h, split, "split-invariance")
    assert (t["class"], t["promise"]) == ("defect", "upstream:roll/configs/worker_config.py:234-239")
    assert "global denominator" in t["promise_text"] and (t["reach"], t["severity"]) == ("api", "medium")
    for pin in (SEED_PIN, FIX_PIN):  # the same words at the older pins, two lines higher
        ids = [p.id for p in roll.SPEC.declared("value-loss", pin).promises]
        assert ids == ["upstream:roll/configs/worker_config.py:218-223"]
    # the actor's loss takes the global normalisers: the same promise holds there
    for entry in ("policy-loss", "agg-token-mean", "agg-seq-mean-token-mean"):
        assert [p.id for p in roll.SPEC.declared(entry, HEAD_PIN).promises] == [t["promise"]]


@pytest.mark.needs_mirror
def test_value_loss_short_fuzz(kinds_open):
    h = kinds_open("value-loss")
    t0 = time.monotonic()
    res = fuzz_target(
        h.run, h.declared, target="roll:value-loss", pin=h.pin, max_examples=40, seed=0, derandomize=True, shrink=False
    )
    print(f"\n[roll:value-loss] fuzz 40: {time.monotonic() - t0:.1f} s", file=sys.stderr)
    failed = {p for p, n in res.failed.items() if n}
    # per-micro-batch row means summed (split-invariance), empty rows counted (reference, pad-invariance),
    # NaN * 0 in masked_mean (poison-nonfinite, and a NaN gradient under the mask: masked-zero)
    # (the empty rows counted are the declared variant now: reference and pad-invariance hold)
    must = {"poison-nonfinite"}
    assert must <= failed <= must | {"masked-zero", "split-invariance"}, failed


# ---------------------------------------------------------------------------------------------
# Options and truncated rows (docs/kinds/roll.md "Options and truncation"), through ROLL's real code at main.
# Two rows, gamma 1, lam 1, V = 0: row 0 trainable [1, 1] with score 1 gets A = [1, 1], row 1 trainable [1, 0]
# (attention [1, 0]) with score 0 gets A = [0, .]. whiten_advantages: masked_whiten over {1, 1, 0}: mean 2/3,
# Bessel variance ((1/3)^2 * 2 + (2/3)^2) / 2 = 1/3, so (1 - 2/3) * sqrt(3) = 1/sqrt(3) = 0.57735 and
# (0 - 2/3) * sqrt(3) = -2/sqrt(3) = -1.1547 (eps 1e-8 negligible); 0 under the mask.
# ---------------------------------------------------------------------------------------------
WHITE = [3**-0.5, 3**-0.5, -2 * 3**-0.5, 0.0]  # flattened
TWO_ROWS = dict(trainable=[[1, 1], [1, 0]], attention=[[1, 1], [1, 0]], gamma=1.0, lam=1.0)


@pytest.mark.needs_mirror
@pytest.mark.parametrize("entry", ["default", "agentic"])
def test_whiten_advantages_by_hand(kinds_open, entry):
    h = kinds_open(entry)
    assert [o.name for o in h.declared.options][0] == "whiten_advantages"
    case = Case.build(**TWO_ROWS, score=[1.0, 0.0], options={"whiten_advantages": True})
    adv, _ = h.run(case)
    assert adv.flatten().tolist() == pytest.approx(WHITE, rel=1e-5)
    assert h.run(case.replace(options={}))[0].tolist() == [[1.0, 1.0], [0.0, 0.0]]
    assert kind_failed(h, case) <= {"poison"}  # only the masked-value leak of the GAE branch (above)


# max_len_mask: row 0 (two tokens, the limit) is cut, row 1 (one token) ended; scores 1 and 2. ROLL's
# get_sample_level_mask zeroes the row whose length equals responses.shape[-1] (= 2): A = [[0, 0], [2, 0]]; without
# the option the cut row is terminal (zero bootstrap): [[1, 1], [2, 0]].
CUT = Case.build(**TWO_ROWS, score=[1.0, 2.0], truncated=[True, False], bootstrap=[4.0, 0.0])


@pytest.mark.needs_mirror
def test_max_len_mask_drops_the_cut_row(kinds_open):
    h = kinds_open("default")
    assert h.declared.truncation.terminal and "functionals.py:530" in h.declared.truncation.cite
    masked = CUT.replace(options={"max_len_mask": True})
    assert h.run(masked)[0].tolist() == [[0.0, 0.0], [2.0, 0.0]]
    assert h.run(CUT)[0].tolist() == [[1.0, 1.0], [2.0, 0.0]]
    assert kind_failed(h, masked) <= {"poison"} and kind_failed(h, CUT) <= {"poison"}  # the known value leak
    # cut rows of two lengths are no ROLL batch (one generation limit): a documented error
    two = masked.replace(truncated=torch.tensor([True, True]), bootstrap=torch.tensor([0.0, 0.0], dtype=torch.float64))
    with pytest.raises(Exception, match="TruncationShapeError"):
        h.run(two)
    assert kind_failed(h, two) == set()


# grpo + max_len_mask: one group, scores [1, 0, 2], row 2 cut (two tokens, the limit). ROLL masks row 2 but
# reward_norm still takes its score into the group: mean 1, unbiased std 1, A = [0, -1 / (1 + 1e-6), 0]. The
# reference leaves the masked row out of the statistics: mean 0.5, std sqrt(0.5), A = [0.7071, -0.7071, 0].
@pytest.mark.needs_mirror
def test_grpo_max_len_mask_keeps_the_masked_row_in_the_group(kinds_open):
    h = kinds_open("grpo")
    case = Case.build(
        trainable=[[1, 0], [1, 0], [1, 1]],
        attention=[[1, 0], [1, 0], [1, 1]],
        score=[1.0, 0.0, 2.0],
        group=[0, 0, 0],
        truncated=[False, False, True],
        bootstrap=[0.0, 0.0, 0.0],
        options={"max_len_mask": True},
    )
    (adv,) = h.run(case)
    assert adv.flatten().tolist() == pytest.approx([0.0, 0.0, -1 / (1 + 1e-6), 0.0, 0.0, 0.0], abs=1e-6)
    # the declared variant (empty_rows "counted": reward_norm takes every row's score) is what ROLL computes
    assert kind_failed(h, case) == set()


# grpo + whiten_advantages: group [1, 0], rows [1, 1] and [1, 0]: a = 0.5 / (sqrt(0.5) + 1e-6) on row 0's tokens,
# -a on row 1's; whitening {a, a, -a}: mean a/3, Bessel std 2a/sqrt(3): 1/sqrt(3) and -2/sqrt(3) as above.
@pytest.mark.needs_mirror
@pytest.mark.parametrize("entry", ["grpo", "agentic-grpo"])
def test_grpo_whiten_advantages_by_hand(kinds_open, entry):
    h = kinds_open(entry)
    case = Case.build(**TWO_ROWS, score=[1.0, 0.0], group=[0, 0], options={"whiten_advantages": True})
    (adv,) = h.run(case)
    assert adv.flatten().tolist() == pytest.approx(WHITE, rel=1e-5)
    assert kind_failed(h, case) <= {"pad-invariance"}  # the property's all-masked row counts in a group (known)


# agentic-grpo reward_normalization.norm_std_type, scores [1, 0, 2, 4] in groups [0, 0, 1, 1], one token each:
# "none": r - mean_g = [0.5, -0.5, -1, 1]; "batch": the same over the unbiased std of all four scores,
# sqrt(8.75 / 3) = 1.70783 (+ 1e-6): [0.29277, -0.29277, -0.58554, 0.58554].
@pytest.mark.needs_mirror
@pytest.mark.parametrize(
    "std, expected",
    [("none", [0.5, -0.5, -1.0, 1.0]), ("batch", [x / ((8.75 / 3) ** 0.5 + 1e-6) for x in (0.5, -0.5, -1.0, 1.0)])],
)
def test_agentic_grpo_norm_std_type_by_hand(kinds_open, std, expected):
    h = kinds_open("agentic-grpo")
    case = Case.build(
        trainable=[[1]] * 4,
        score=[1.0, 0.0, 2.0, 4.0],
        group=[0, 0, 1, 1],
        options={"reward_normalization.norm_std_type": std},
    )
    (adv,) = h.run(case)
    assert adv.flatten().tolist() == pytest.approx(expected, rel=1e-5)
    assert kind_failed(h, case) == set()


# agentic-reinforce + whiten_advantages: one segment per row, every token gets the score: [1, 1] and [0, .], whitened
# as above; the returns are not whitened.
@pytest.mark.needs_mirror
def test_agentic_reinforce_whiten_advantages_by_hand(kinds_open):
    h = kinds_open("agentic-reinforce")
    case = Case.build(**TWO_ROWS, score=[1.0, 0.0], options={"whiten_advantages": True})
    adv, ret = h.run(case)
    assert adv.flatten().tolist() == pytest.approx(WHITE, rel=1e-5)
    assert ret.tolist() == [[1.0, 1.0], [0.0, 0.0]]
    assert kind_failed(h, case) == set()


# value_clip on VALUE_STEP (rows: v 1.25 / v_old 1 / R 0 and v 2 / v_old 1 / R 3; row mean of 2 rows):
# "none" (ROLL's None, the unclipped branch): l = 0.5 * 1.5625 and 0.5 * 1, dl/dv = 1.25 / 2 and -1 / 2;
# 0.2: row 0 clipped to 1.2, 1.44 < 1.5625 so plain; row 1 clipped to 1.2, (1.2 - 3)^2 = 3.24 > 1: l = 1.62, grad 0.
@pytest.mark.needs_mirror
@pytest.mark.parametrize(
    "clip, loss, grad", [("none", (0.78125 + 0.5) / 2, [0.625, 0.0, -0.5, 0.0]), (0.2, (0.78125 + 1.62) / 2, None)]
)
def test_value_clip_by_hand(kinds_open, clip, loss, grad):
    h = kinds_open("value-loss")
    case = VALUE_STEP.replace(options={"value_clip": clip})
    got_loss, got_grad = h.run(case)
    assert got_loss[0, 0].item() == pytest.approx(loss)
    assert got_grad.flatten().tolist() == pytest.approx(grad or [0.625, 0.0, 0.0, 0.0])
    assert kind_failed(h, case) == set()


@pytest.mark.needs_mirror
def test_default_short_fuzz_covers_every_option_value(kinds_open):
    h = kinds_open("default")
    t0 = time.monotonic()
    res = fuzz_target(
        h.run, h.declared, target="roll:default", pin=h.pin, max_examples=60, seed=0, derandomize=True, shrink=False
    )
    print(f"\n[roll:default] options fuzz 60: {time.monotonic() - t0:.1f} s", file=sys.stderr)
    for name, per in res.options_checked.items():
        assert set(per) == {"false", "true"} and all(n > 0 for n in per.values()), (name, per)
    assert res.truncated_checked > 0
    failed = {p for p, n in res.failed.items() if n}
    assert not failed & CLEAN, failed  # no crash (no tool error) under every option
    assert "row-independence" not in failed or "poison" in failed, failed  # only the value leak (probe in the padding)
    if "masked-zero" in failed:  # masked positions 0 under every option, but NaN * response_mask stays NaN
        assert res.finding("masked-zero").case.has_nonfinite_poison()


# ---------------------------------------------------------------------------------------------
# Policy loss: the RLVR actor's inline loss (roll/pipeline/rlvr/actor_worker.py:52-122, the same at the three pins)
# compiled from the source text with ROLL's defaults (pg_clip 0.2, no dual clip, loss_agg_mode seq-mean-token-mean,
# roll_kinds.load_policy). r = exp(logp - old_logp), l = -min(r A, clamp(r, 0.8, 1.2) A); rows 0 (2 tokens) and 1
# (3 tokens) each their token mean, over global_valid_samples = 2; micro-batches {0}, {1}:
#   (0, 0) r = 1, A = 1: l = -1;  (0, 1) r = e^0.3, A = 1: the clip binds, l = -1.2, slope 0;
#   (1, 0) r = e^-0.3, A = 1: the unclipped term, l = -r;  (1, 1) r = e^1.5, A = -1: l = r (dual_clip_loss:
#   -max(-l, (1 + 2 * 0.2) A) = 1.4, slope 0);  (1, 2) A = 0.  (0, 2) masked: 100 changes nothing, NaN leaks.
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
    d = roll.SPEC.for_entry("policy-loss")
    assert d.kind == "policy-loss"
    assert d.variant == {
        "clip_low": 0.2,
        "clip_high": 0.2,
        "dual_clip": None,
        "advantages": "token",
        "mode": "seq-mean-token-mean",
    }
    assert [o.name for o in d.options] == ["dual_clip_loss"]
    assert roll_kinds.POLICY_CONFIG["loss_agg_mode"] == "seq-mean-token-mean"


@pytest.mark.needs_mirror
@pytest.mark.parametrize("pin", [HEAD_PIN, SEED_PIN])
def test_policy_loss_hand_computed(pin):
    from maskfuzz.oracles.kinds.judge import judge as kind_judge

    lo, hi = math.exp(-0.3), math.exp(1.5)
    with _open(f"roll:policy-loss@{pin}") as h:
        assert h.info["where"] == "roll/pipeline/rlvr/actor_worker.py::ActorWorker.loss_func (policy loss)"
        case = _policy_step()
        loss, grad = h.run(case)
        assert loss[0, 0].item() == pytest.approx((-1.1 + (hi - lo) / 3) / 2, rel=1e-12)
        assert grad.flatten().tolist() == pytest.approx([-0.25, 0.0, 0.0, -lo / 6, hi / 6, 0.0], rel=1e-12)
        assert {v.property for v in kind_judge(h.run, case, h.declared.configured(case)) if v.failed} == set()
        # dual_clip_loss: the constant is 1 + 2 * pg_clip = 1.4 (actor_worker.py:86), not the paper's 3
        dual = case.replace(options={"dual_clip_loss": True})
        loss, grad = h.run(dual)
        assert loss[0, 0].item() == pytest.approx((-1.1 + (1.4 - lo) / 3) / 2, rel=1e-12)
        assert grad[1, 1].item() == 0.0
        assert {v.property for v in kind_judge(h.run, dual, h.declared.configured(dual)) if v.failed} == set()
        # NaN under the mask: agg_loss's masked_mean sums tensor * mask (roll/utils/functionals.py:285-288 at 8eb)
        loss, grad = h.run(_policy_step(math.nan))
        assert math.isnan(loss[0, 0].item()) and math.isnan(grad[0, 2].item())
        assert grad[1].tolist() == pytest.approx([-lo / 6, hi / 6, 0.0], rel=1e-12)


@pytest.mark.needs_mirror
def test_policy_loss_short_fuzz(kinds_open):
    h = kinds_open("policy-loss")
    res = fuzz_target(
        h.run, h.declared, target="roll:policy-loss", pin=h.pin, max_examples=15, seed=0, derandomize=True, shrink=False
    )
    failed = {p for p, n in res.failed.items() if n}
    # the loss is masked by multiplication (masked_mean: (tensor * mask).sum, functionals.py:285-288 at 8eb), so NaN
    # under the mask reaches the loss and the gradient (poison-nonfinite, masked-zero), and so does a masked
    # log-ratio whose exp overflows in float32 (logp 100, old_logp 0: r = inf, -A r * 0 = NaN: no-crash on finite
    # inputs; actor_worker.py:72, :80-83); the CLI run adds empty-step (the same overflow in an all-masked step)
    # empty-step: the same overflow in an all-masked step, when hypothesis' example database replays it
    assert POLICY_FUZZ <= failed <= POLICY_FUZZ | {"empty-step"}, failed
    assert res.checked["reference"] > 0  # split-invariance: the hand case (two micro-batches)


POLICY_FUZZ = {"poison-nonfinite", "masked-zero", "no-crash"}


# ---------------------------------------------------------------------------------------------
# KL in the reward (`oracles.kinds.gae.kl_reward`): default-kl and agentic-reinforce-kl feed ROLL's own
# compute_token_reward
# (roll/utils/functionals.py:615-627 at 8eb27cc2dc34) with old_log_probs = logp, ref_log_probs = ref_logp,
# kl_penalty "kl" (k1, base_config.py:527-528) and FixedKLController(init_kl_coef = 0.2, base_config.py:535-536):
# token_level_rewards = score on the last attended token - 0.2 * (logp - ref) * response_mask.
# Row 0: d = [1, 0, 1] -> r = [-0.2, 0, -0.2] + score 1 at the end; row 1 (one padding slot): d = [0.5, -1] ->
# [-0.1, 0.2] + score 2. V = 0, gamma = lam = 1: the returns are the reverse sums.
# ---------------------------------------------------------------------------------------------
def _kl_case(masked: float) -> Case:
    return Case.build(
        trainable=[[1, 1, 1], [1, 1, 0]],
        attention=[[1, 1, 1], [1, 1, 0]],
        score=[1.0, 2.0],
        gamma=1.0,
        lam=1.0,
        extra={
            "logp": [[-1.0, -0.5, -0.25], [-1.0, -2.0, masked]],
            "ref_logp": [[-2.0, -0.5, -1.25], [-1.5, -1.0, -1.0]],
        },
    )


KL_RETURNS = [[0.6, 0.8, 0.8], [2.1, 2.2, 0.0]]


def test_kl_entries_declare_the_kl_reward():
    spec = roll.SPEC
    for entry in ("default-kl", "agentic-reinforce-kl"):
        d = spec.for_entry(entry)
        assert d.variant == {"kl_reward": {"coef": 0.2, "estimator": "k1", "clamp_d": None, "clamp": None}}
        assert not d.domain.token_rewards and d.domain.masked_logprobs  # api: any masked log-prob
        for pin in (SEED_PIN, HEAD_PIN, FIX_PIN):
            dom = d.pipeline_at(pin)
            assert dom.cited() == [] and not dom.masked_logprobs and not dom.token_rewards, (entry, pin)
    assert spec.kind_of("default-kl") == "gae" and spec.for_entry("agentic-reinforce-kl").contract == "segment"


@pytest.mark.needs_mirror
def test_default_kl_folds_the_kl_into_gae(kinds_open):
    h = kinds_open("default-kl")
    assert h.info["where"].endswith("compute_advantage")
    adv, ret = h.run(_kl_case(-3.0))  # a real masked log-prob: kld * response_mask is 0 there
    assert ret.tolist() == [pytest.approx(r, abs=1e-6) for r in KL_RETURNS]
    assert adv.tolist() == ret.tolist()  # V = 0
    # the KL is exact; only the poison twin's masked critic value leaks at this pin (the seed report's defect,
    # compute_advantage hands the unmasked values to GAE, functionals.py:1157-1170 at 8eb)
    assert kind_failed(h, _kl_case(-3.0)) == {"poison"}
    # a NaN masked log-prob: compute_approx_kl's `log_ratio * action_mask` (functionals.py:209) keeps it, the GAE
    # loop over every position carries it into row 1 (api only: the pipeline's log-probs are finite)
    adv, _ = h.run(_kl_case(math.nan))
    assert adv[0].tolist() == pytest.approx(KL_RETURNS[0], abs=1e-6) and torch.isnan(adv[1]).all()
    assert "poison-nonfinite" in kind_failed(h, _kl_case(math.nan))


@pytest.mark.needs_mirror
def test_agentic_reinforce_kl_drops_the_kl_inside_a_turn(kinds_open):
    h = kinds_open("agentic-reinforce-kl")
    adv, ret = h.run(_kl_case(math.nan))
    # one turn per row: compute_agentic_reinforce_return reads the last token's reward only (agentic/utils.py:447):
    # row 0 gets -0.2 + 1, row 1 0.2 + 2; the segment reference sums the turn: 0.6 and 2.1. The NaN is never read.
    assert ret.tolist() == [pytest.approx(r, abs=1e-6) for r in [[0.8, 0.8, 0.8], [2.2, 2.2, 0.0]]]
    assert adv.tolist() == ret.tolist()
    assert kind_failed(h, _kl_case(-3.0)) == {"reference"}
    # one-token turns keep their KL: turns [0] and [2], r = [-0.2, -0.1] + score 0.5; G = 0.4, then -0.2 + 0.5 * 0.4
    single = Case.build(
        trainable=[[1, 0, 1]],
        score=[0.5],
        gamma=0.5,
        extra={"logp": [[-1.0, math.nan, -1.0]], "ref_logp": [[-2.0, -1.0, -1.5]]},
    )
    assert h.run(single)[1][0].tolist() == pytest.approx([0.0, 0.0, 0.4], abs=1e-6)
    assert kind_failed(h, single) == set()


ROLL_KL_FUZZ = {  # entry -> (properties that must fail, properties that may fail) on 20 examples, seed 0
    # poison: the masked critic value bootstraps into GAE (functionals.py:1157-1170 at 8eb, the seed report's
    # defect); poison-nonfinite: NaN through kld * mask (:209) and the GAE over every position; reference: the score
    # on the last attended token is lost behind a masked tail (expand_to_token_level :553, * response_mask :1160;
    # api in RLVR)
    # masked-zero: NaN * mask; row-independence: the row twin's padding column carries a probe critic value (the leak)
    "default-kl": ({"poison"}, {"poison-nonfinite", "reference", "masked-zero", "row-independence"}),
    # reference: the KL inside a turn is dropped (agentic/utils.py:447) and the score behind a masked tail is lost
    "agentic-reinforce-kl": ({"reference"}, set()),
}


@pytest.mark.needs_mirror
@pytest.mark.parametrize("entry", list(ROLL_KL_FUZZ))
def test_kl_short_fuzz(kinds_open, entry):
    h = kinds_open(entry)
    must, may = ROLL_KL_FUZZ[entry]
    res = fuzz_target(
        h.run, h.declared, target=f"roll:{entry}", pin=h.pin, max_examples=20, seed=0, derandomize=True, shrink=False
    )
    failed = {p for p, n in res.failed.items() if n}
    assert must <= failed <= must | may, failed

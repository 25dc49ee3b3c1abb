"""miles through its adapter: `get_advantages_and_returns_batch` from the release wheel and from git
pins on either side of PR #1827, judged by the oracle.

The verdicts asserted here were derived by reading miles' code:

* miles-rl 0.0.2 (`miles/utils/ppo_utils.py`): GAE over every response token; the loss mask never
  reaches it. The PPO caller (`miles/backends/training_utils/loss.py::compute_advantages_and_returns`)
  adds the scalar reward to the last response token (`k[-1] += reward`). So values and KL rewards
  under the mask leak (poison), a masked observation tail at gamma = 0 takes the score away from the
  last trainable token (score-kept), masked positions get non-zero advantages, and a sample with an
  empty response crashes (`k[-1]` of an empty tensor: IndexError). Padding does not exist in the
  per-sample lists, so a masked *padding* slot is harmless (the seed report 000's case passes).
* 6ccdc7da6 (first parent of PR #1827): the function takes `terminal_rewards` and adds them at the
  last response token (`full_rewards[i, L - 1]`), still no mask: the same verdicts, and an empty
  response is guarded (`if L > 0`).
* 3d2e0e411 (PR #1827): GAE over the trainable subsequence, score at the last trainable token,
  zeros elsewhere: the compressed contract; no property fails.

The wheel downloads from PyPI (network marker); git pins need MASKFUZZ_REPOS=miles=/path.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
import torch

from maskfuzz.oracles.case import Case
from maskfuzz.oracles.kinds.dispatch import judge
from maskfuzz.targets.miles import calls as miles_calls
from maskfuzz.targets.miles import declare as miles
from maskfuzz.targets.runtime.client import LoadSpec, Worker, WorkerSkip
from maskfuzz.targets.runtime.repos import parse_repos
from maskfuzz.targets.runtime.session import Skip, open_target
from maskfuzz.targets.slime.calls import Samples
from tests.test_target_slime import KL_REWARD, KL_REWARD_FINITE

FIX = "3d2e0e411"  # PR #1827: run PPO GAE over trainable tokens only
BEFORE = "6ccdc7da6"  # its first parent
MPU_ERA = "8a988dc3d"  # Jan 2026: the function and the caller still ask megatron.core.mpu
NO_BATCHED_GAE = "10c816338"  # "a new start" (Oct 2025): no get_advantages_and_returns_batch yet

# The seed's cases (report 003 and semantics.md). Expected numbers are computed by hand below.
OBS_TAIL = Case.build(trainable=[[1, 1, 1, 0, 0]], score=[1.0], gamma=0.0, lam=0.95)  # observation tail, gamma 0
GAP = Case.build(trainable=[[1, 0, 0, 1]], values=[[0.5, 9, 9, 0.25]], score=[1.0], gamma=0.9, lam=0.8)
ALL_MASKED = Case.build(
    trainable=[[1, 1, 1], [0, 0, 0]], values=[[0.1, 0.2, 0.3], [5, 5, 5]], score=[1.0, 2.0], gamma=0.9, lam=0.9
)
TELESCOPE = Case.build(
    trainable=[[1, 0, 1, 0]], token_rewards=[[0.5, 3, 0.25, 2]], values=[[0.1, 7, 0.2, 9]], score=[1.0], gamma=1, lam=1
)
PADDED = Case.build(  # seed report 000: a masked *padding* slot with a poisoned value
    trainable=[[1, 1, 0]], attention=[[1, 1, 0]], token_rewards=[[0, 1, 0]], values=[[0, 0, 100]], gamma=1, lam=0.95
)
PLAIN = Case.build(
    trainable=[[1, 1, 1], [1, 1, 1]],
    token_rewards=[[0.5, 0.1, 0.25], [0, 0, 1]],
    values=[[0.1, 0.3, 0.2], [1, 2, 3]],
    score=[1.0, -1.0],
    gamma=0.9,
    lam=0.7,
)
EMPTY_RESPONSE = Case.build(  # the second sample's response is empty (padding only)
    trainable=[[1, 1], [0, 0]], attention=[[1, 1], [0, 0]], score=[1.0, 1.0], gamma=0.9, lam=0.9
)
NEW_HOME = "miles/backends/training_utils/loss_hub/math_utils.py::get_advantages_and_returns_batch"
SEED_CASES = {"observation tail": OBS_TAIL, "gap": GAP, "all-masked row": ALL_MASKED, "gamma=lam=1": TELESCOPE}


def failed(run, case: Case) -> set[str]:
    return {v.property for v in judge(run, case, miles.SPEC.declared()) if v.failed}


def verdicts(run, case: Case) -> dict:
    return {v.property: v for v in judge(run, case, miles.SPEC.declared())}


# ---------------------------------------------------------------------------------------------
# Offline: the registry entry and the adapter's own logic.
# ---------------------------------------------------------------------------------------------
def test_spec_declares_compressed_and_its_narrowing_with_reasons():
    spec = miles.SPEC
    assert spec.contract == "compressed" and "fla" in spec.deny and "miles" in spec.own
    assert spec.entries[:2] == ("default", "vanilla")  # then the kinds beyond GAE
    assert [p.rev for p in spec.pins] == ["0.0.2", BEFORE, FIX]
    assert [p.rev for p in spec.default_pins] == ["0.0.2"]  # release pins only: no git access needed
    restrictions = spec.domain.restrictions()
    assert set(restrictions) == {"dtypes"} and "float32" in restrictions["dtypes"]
    assert "float64" not in spec.domain.dtypes


@dataclass(frozen=True)
class _GroupInfo:
    rank: int
    size: int
    group: object


@dataclass
class _GroupedState:  # the layout since a827e072c (GroupInfo per parallel dimension)
    cp: _GroupInfo
    tp: _GroupInfo
    is_pp_last_stage: bool = True


@dataclass
class _FlatState:  # the Jan 2026 layout (ranks, sizes and groups as separate fields)
    cp_rank: int
    cp_size: int
    dp_src_rank: int
    dp_cp_group: object
    vpp_size: int = 1


def test_trivial_parallel_state_fills_both_layouts_as_one_rank():
    grouped = miles_calls.trivial_parallel_state(SimpleNamespace(ParallelState=_GroupedState, GroupInfo=_GroupInfo))
    assert grouped.cp == _GroupInfo(0, 1, None) and grouped.tp == _GroupInfo(0, 1, None)
    flat = miles_calls.trivial_parallel_state(SimpleNamespace(ParallelState=_FlatState))
    assert (flat.cp_rank, flat.cp_size, flat.dp_src_rank, flat.dp_cp_group, flat.vpp_size) == (0, 1, 0, None, 1)

    @dataclass
    class Unknown:
        mystery: float

    with pytest.raises(RuntimeError, match="mystery"):
        miles_calls.trivial_parallel_state(SimpleNamespace(ParallelState=Unknown))


def test_needs_mpu_reads_the_import_not_the_word(tmp_path):
    path = tmp_path / "miles" / "utils" / "ppo_utils.py"
    path.parent.mkdir(parents=True)
    path.write_text("def compute_approx_kl(): pass  # compute, not mpu.\n")
    assert not miles_calls.needs_mpu(tmp_path)
    path.write_text("def f():\n    from megatron.core import mpu\n    return mpu.get_context_parallel_world_size()\n")
    assert miles_calls.needs_mpu(tmp_path)


def test_samples_drop_padding_and_scatter_back():
    case = Case.build(
        trainable=[[0, 1, 1, 0], [0, 0, 0, 0], [1, 0, 0, 0]],
        attention=[[1, 1, 1, 0], [0, 0, 0, 0], [1, 1, 0, 0]],
        values=[[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]],
        score=[1.0, 2.0, 3.0],
    )
    s = Samples.from_case(case, "cpu")
    assert s.spans == [(0, 3), (0, 0), (0, 2)] and s.response_lengths == [3, 0, 2]
    assert s.total_lengths == [4, 1, 3] and s.scores == [1.0, 2.0, 3.0]
    assert [m.tolist() for m in s.loss_masks] == [[0, 1, 1], [], [1, 0]] and s.loss_masks[0].dtype == torch.int
    assert s.values[2].tolist() == [9.0, 10.0]
    left = Case.build(trainable=[[0, 0, 1, 1]], attention=[[0, 1, 1, 1]])  # left padding, a leading mask
    sl = Samples.from_case(left, "cpu")
    assert sl.spans == [(1, 4)] and sl.loss_masks[0].tolist() == [0, 1, 1]
    out = sl.scatter(left, [torch.tensor([7.0, 8.0, 9.0])])
    assert out.tolist() == [[0.0, 7.0, 8.0, 9.0]]
    with pytest.raises(RuntimeError, match="shape"):
        sl.scatter(left, [torch.tensor([1.0])])


def test_a_tree_without_the_function_is_not_present(tmp_path):
    (tmp_path / "miles").mkdir()
    (tmp_path / "miles" / "__init__.py").write_text("")
    spec = miles.SPEC
    with pytest.raises(WorkerSkip, match="function not present at this pin.*miles.utils.ppo_utils"):
        Worker(LoadSpec(spec.adapter, str(tmp_path), None, spec.stand_ins, spec.deny, spec.own)).start()


# ---------------------------------------------------------------------------------------------
# The release wheel miles-rl 0.0.2 (through the PPO caller).
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def wheel():
    with open_target("miles@0.0.2") as h:
        yield h


@pytest.mark.network
def test_wheel_runs_the_old_location_through_its_caller(wheel):
    assert wheel.resolved == "miles-rl==0.0.2"
    assert wheel.info["where"] == (
        "miles/utils/ppo_utils.py::get_advantages_and_returns_batch via "
        "miles/backends/training_utils/loss.py::compute_advantages_and_returns"
    )
    notes = " | ".join(wheel.info["notes"])
    assert "set_parallel_state" in notes and "last response token" in notes
    assert "miles" not in wheel.info["stand_ins_used"] and "fla" not in wheel.info["stand_ins_used"]


@pytest.mark.network
def test_wheel_loses_the_score_behind_an_observation_tail(wheel):
    adv, ret = wheel.run(OBS_TAIL)
    # gamma = 0: every advantage is its own TD error; the score sits on the last *response* token
    assert adv.tolist() == [[0.0, 0.0, 0.0, 0.0, 1.0]]
    assert failed(wheel.run, OBS_TAIL) == {"score-kept", "masked-zero", "reference"}


@pytest.mark.network
def test_wheel_lets_masked_values_leak_across_a_gap(wheel):
    adv, _ = wheel.run(GAP)
    # every token a transition (gamma * lam = 0.72), the score on the last token, the 9s bootstrap
    a3 = 0.75
    a2 = 0.9 * 0.25 - 9 + 0.72 * a3
    a1 = 0.9 * 9 - 9 + 0.72 * a2
    a0 = 0.9 * 9 - 0.5 + 0.72 * a1
    assert adv[0].tolist() == pytest.approx([a0, a1, a2, a3], rel=1e-5)
    v = verdicts(wheel.run, GAP)
    assert {p for p, x in v.items() if x.failed} == {"poison", "gap-invariance", "masked-zero", "reference"}
    assert v["deterministic"].status == "pass" and v["row-independence"].status == "pass"


@pytest.mark.network
def test_wheel_gives_an_all_masked_row_advantages(wheel):
    adv, _ = wheel.run(ALL_MASKED)
    assert (adv[1] != 0).all()  # the row has no trainable token, yet its score and values drive GAE
    v = verdicts(wheel.run, ALL_MASKED)
    assert v["masked-zero"].failed and v["row-independence"].status == "pass" and v["reference"].status == "pass"


@pytest.mark.network
def test_wheel_telescopes_over_masked_rewards(wheel):
    adv, _ = wheel.run(TELESCOPE)
    assert adv[0, 0].item() == pytest.approx(0.5 + 3 + 0.25 + 2 + 1 - 0.1, rel=1e-6)  # masked rewards counted
    assert {"telescoping", "poison", "reference"} <= failed(wheel.run, TELESCOPE)


@pytest.mark.network
def test_wheel_ignores_a_padding_slot_and_agrees_without_masks(wheel):
    adv, ret = wheel.run(PADDED)
    assert ret[0].tolist() == pytest.approx([0.95, 1.0, 0.0], rel=1e-6)
    assert failed(wheel.run, PADDED) == {"gap-invariance"}  # only a real masked token in between hurts
    assert failed(wheel.run, PLAIN) == {"gap-invariance"}  # all-trainable and reference pass


@pytest.mark.network
def test_wheel_crashes_on_an_empty_response(wheel):
    v = verdicts(wheel.run, EMPTY_RESPONSE)
    assert v["no-crash"].failed and "IndexError" in v["no-crash"].message


@pytest.mark.network
@pytest.mark.slow  # a second worker: ~20 s
def test_wheel_vanilla_entry_is_the_serial_loop_with_the_same_verdicts(wheel):
    with open_target("miles:vanilla@0.0.2") as h:
        assert any("chunked=False" in n for n in h.info["notes"])
        a_chunked, _ = wheel.run(GAP)
        a_serial, _ = h.run(GAP)
        assert a_serial[0].tolist() == pytest.approx(a_chunked[0].tolist(), rel=1e-5)
        assert failed(h.run, OBS_TAIL) == {"score-kept", "masked-zero", "reference"}


# ---------------------------------------------------------------------------------------------
# Git pins on either side of PR #1827 (need a miles clone or mirror).
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def repos():
    found = parse_repos(None)
    if "miles" not in found:
        pytest.skip("git pins: set MASKFUZZ_REPOS=miles=/path/to/miles-clone-or-mirror to test miles at commits")
    return found


@pytest.fixture(scope="module")
def before(repos):
    with open_target(f"miles@{BEFORE}", repos=repos) as h:
        yield h


@pytest.fixture(scope="module")
def fixed(repos):
    with open_target(f"miles@{FIX}", repos=repos) as h:
        yield h


@pytest.mark.needs_mirror
def test_pinned_before_is_the_first_parent_of_the_fix(repos):
    from maskfuzz.targets.runtime import gitrepo

    repo = gitrepo.open_local(repos["miles"])
    fix = repo.commit(gitrepo.rev_parse(repo, FIX))
    assert fix.parents[0].hexsha.startswith(BEFORE) and "(#1827)" in fix.summary


@pytest.mark.needs_mirror
def test_both_sides_call_the_new_location_directly(before, fixed):
    for h in (before, fixed):
        assert h.info["where"] == NEW_HOME
        assert "called directly; the function places terminal_rewards itself" in h.info["notes"]
    assert "the function takes no loss mask" in before.info["notes"] and "loss_masks passed" in fixed.info["notes"]


@pytest.mark.needs_mirror
@pytest.mark.parametrize("name", list(SEED_CASES))
def test_the_seed_cases_fail_before_pr_1827_and_pass_after(before, fixed, name):
    case = SEED_CASES[name]
    assert failed(before.run, case), f"{name}: no finding before #1827"
    assert failed(fixed.run, case) == set(), f"{name}: a finding after #1827"


@pytest.mark.needs_mirror
def test_the_fix_places_the_score_on_the_last_trainable_token(before, fixed):
    assert before.run(OBS_TAIL)[0].tolist() == [[0.0, 0.0, 0.0, 0.0, 1.0]]
    assert fixed.run(OBS_TAIL)[0].tolist() == [[0.0, 0.0, 1.0, 0.0, 0.0]]
    adv, ret = fixed.run(GAP)  # semantics.md worked example 2
    assert adv[0].tolist() == pytest.approx([0.265, 0.0, 0.0, 0.75], rel=1e-6)
    assert ret[0].tolist() == pytest.approx([0.765, 0.0, 0.0, 1.0], rel=1e-6)
    assert failed(before.run, EMPTY_RESPONSE) == {"gap-invariance"}  # `if L > 0` guards the empty response


@pytest.mark.needs_mirror
def test_short_fuzz_finds_the_bug_before_and_nothing_after(before, fixed):
    from maskfuzz.fuzz.engine import fuzz_target

    t0 = time.monotonic()
    bad = fuzz_target(
        before.run,
        before.declared,
        target="miles",
        pin=BEFORE,
        max_examples=150,
        seed=0,
        properties=("poison", "score-kept"),
    )
    t1 = time.monotonic()
    good = fuzz_target(fixed.run, fixed.declared, target="miles", pin=FIX, max_examples=60, seed=0)
    t2 = time.monotonic()
    print(f"\n[miles] fuzz {BEFORE}: {t1 - t0:.1f} s, {FIX}: {t2 - t1:.1f} s", file=sys.stderr)
    assert {f.property for f in bad.findings} == {"poison", "score-kept"}
    assert good.findings == [], [(f.property, f.case.summary(), f.verdict.message) for f in good.findings]


@pytest.mark.needs_mirror
def test_vanilla_entry_after_the_fix_passes_the_seed_cases(repos):
    with open_target(f"miles:vanilla@{FIX}", repos=repos) as h:
        for name, case in SEED_CASES.items():
            assert failed(h.run, case) == set(), name


@pytest.mark.needs_mirror
def test_mpu_era_pin_keeps_the_score_through_the_single_rank_state(repos):
    # the caller binds `mpu` at import and adds the score only on CP rank 0: were mpu the inert
    # stand-in, the score would vanish silently (all zeros here)
    with open_target(f"miles@{MPU_ERA}", repos=repos) as h:
        assert any("megatron.core.mpu" in n for n in h.info["notes"])
        assert h.run(OBS_TAIL)[0].tolist() == [[0.0, 0.0, 0.0, 0.0, 1.0]]


@pytest.mark.needs_mirror
def test_a_commit_before_batched_gae_is_a_skip(repos):
    with pytest.raises(Skip, match="get_advantages_and_returns_batch"):
        with open_target(f"miles@{NO_BATCHED_GAE}", repos=repos):
            pass


def test_vanilla_is_not_present_where_the_flag_is_missing(tmp_path):
    # the flag exists at every registered pin: check the reason on a tree whose function has none
    pkg = tmp_path / "miles" / "utils"
    pkg.mkdir(parents=True)
    for d in (tmp_path / "miles", pkg):
        (d / "__init__.py").write_text("")
    (pkg / "ppo_utils.py").write_text(
        "def get_advantages_and_returns_batch(total_lengths, response_lengths, values_list, rewards_list,"
        " terminal_rewards, gamma, lambd):\n    raise AssertionError('never called')\n"
    )
    spec = miles.SPEC
    with pytest.raises(WorkerSkip, match="no `chunked` flag"):
        Worker(LoadSpec(spec.adapter, str(tmp_path), "vanilla", spec.stand_ins, spec.deny, spec.own)).start()


def test_pipeline_domain_cites_every_narrowing_and_rejects_what_miles_never_builds():
    spec = miles.SPEC
    for pin in ("0.0.2", "6ccdc7da6", "3d2e0e411"):
        dom = spec.pipeline_at(pin)
        assert dom is not None and dom.cited() == []
        assert sorted(dom.restrictions()) == ["dtypes", "empty_rows", "left_padding", "nonfinite_poison"]
        ok = Case.build(trainable=[[1, 0, 1, 0], [0, 0, 0, 0]], token_rewards=[[0, 2, 0, 3], [0] * 4], score=[1, 2])
        assert dom.rejects(ok) is None  # gaps, a masked tail, an all-masked row, masked KL are all reachable
        assert "left-padded" in dom.rejects(Case.build(trainable=[[0, 1]], attention=[[0, 1]]))
        assert "NaN / inf" in dom.rejects(Case.build(trainable=[[1, 0]], token_rewards=[[0.0, float("nan")]]))
        assert "dtype" in dom.rejects(Case.build(trainable=[[1, 1]], dtype="float64"))
    # --true-on-policy-mode keeps bf16 value logits in the 0.0.2 wheel; the git pins upcast them
    bf16 = Case.build(trainable=[[1, 1]], dtype="bfloat16")
    assert spec.pipeline_at("0.0.2").rejects(bf16) is None
    assert "dtype" in spec.pipeline_at("3d2e0e411").rejects(bf16)
    assert spec.pipeline_at("6ccdc7da6123456") is miles.PIPELINE_GIT


# ---------------------------------------------------------------------------------------------
# Entries beyond GAE (targets/miles/calls_kinds.py), from the release wheel miles-rl 0.0.2.
#
# Verdicts derived by reading the wheel:
# * grpo: RolloutManager._post_process_rewards (miles/ray/rollout.py:640-665) normalises in float32
#   per group of n_samples_per_prompt, or over the WHOLE batch when the sample count is not
#   n_samples_per_prompt * rollout_batch_size (:651-655): unequal groups mix (group-isolation);
#   rows whose loss mask is all zero (remove_sample, :701-702, after the normalisation) still count
#   (pad-invariance); a singleton group has an unbiased std of NaN (no-crash). get_grpo_returns
#   broadcasts the scalar to every response token, masked ones included.
# * kl / kl-k3 / kl-low-var: compute_approx_kl (miles/utils/ppo_utils.py:65-104) is exact.
# * whiten: distributed_masked_whiten (miles/utils/distributed_utils.py:96-154) takes a one-pass
#   float32 variance E[x^2] - mean^2: constant advantages (0.9 x 7) give a negative variance and
#   NaN everywhere (no-crash), large offsets lose the variance (affine, reference); NaN under the
#   mask leaks through values * mask (poison-nonfinite, api only).
# * reinforce++: get_reinforce_plus_plus_returns (miles/utils/ppo_utils.py:370-435) never masks the
#   KL (-kl_coef * kl at every response token, :412) so masked KL reaches earlier returns (poison,
#   telescoping, reference), and asserts on a fully masked row (:414), which remove_sample builds.
# ---------------------------------------------------------------------------------------------
from kind_support import failed_properties, handle_cache  # noqa: E402

KIND_PIN = "0.0.2"


kind_failed = failed_properties


@pytest.fixture(scope="module")
def kinds_open():
    with handle_cache(lambda entry: open_target(f"miles:{entry}@{KIND_PIN}")) as get:
        yield get


def test_kind_entries_are_declared_with_cited_pipelines():
    spec = miles.SPEC
    assert spec.entries[:2] == ("default", "vanilla")
    kinds = {e: spec.kind_of(e) for e in spec.entries[2:]}
    assert kinds == {
        "grpo": "group-advantage",
        "kl": "kl",
        "kl-k2": "kl",
        "kl-k3": "kl",
        "kl-low-var": "kl",
        "whiten": "normalization",
        "reinforce++": "returns",
        "agg-seq-mean-token-mean": "loss-aggregation",
        "agg-token-mean": "loss-aggregation",
        "value-loss": "value-loss",
        "policy-loss": "policy-loss",
        "policy-gspo": "policy-loss",
        "gae-kl": "gae",
        "reinforce++-kl": "returns",
    }
    for entry in kinds:
        for pin in ("0.0.2", "3d2e0e411"):
            dom = spec.for_entry(entry).pipeline_at(pin)
            assert dom is not None and dom.cited() == [], (entry, pin)
        if spec.kind_of(entry) != "loss-aggregation":
            assert "float64" not in spec.for_entry(entry).domain.dtypes
    assert spec.for_entry("reinforce++").contract == "dense" and not spec.for_entry("reinforce++").domain.critic
    assert spec.for_entry("kl-low-var").variant == {"estimator": "low_var_kl", "clamp": (-10.0, 10.0)}


@pytest.mark.network
def test_grpo_normalises_per_group_and_broadcasts_to_masked_tokens(kinds_open):
    h = kinds_open("grpo")
    assert "RolloutManager._post_process_rewards" in h.info["where"]
    case = Case.build(trainable=[[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 0]], score=[1, 0, 2, 4], group=[0, 0, 1, 1])
    (adv,) = h.run(case)
    a = 0.5 / (0.5**0.5 + 1e-6)  # (r - mean) / (unbiased std + 1e-6), both groups
    assert adv.flatten().tolist() == pytest.approx([a] * 3 + [-a] * 3 + [-a] * 3 + [a] * 3, rel=1e-6)  # masked too
    # pad-invariance adds no sample to a group any more (kinds.md); an all-masked row counted in its group is miles'
    # documented variant (empty_rows "counted", the filter's help, W miles/utils/arguments.py:1546)
    assert kind_failed(h, case) == set()
    # unequal groups: the sample count is not n * groups, so the whole batch is one group
    mixed = Case.build(trainable=[[1]] * 4, score=[1, 2, 3, 10], group=[0, 0, 0, 1])
    (adv,) = h.run(mixed)
    std = (50 / 3) ** 0.5
    assert adv[:, 0].tolist() == pytest.approx([(r - 4) / (std + 1e-6) for r in (1, 2, 3, 10)], rel=1e-6)
    assert {"group-isolation", "reference"} <= kind_failed(h, mixed)
    (adv,) = h.run(Case.build(trainable=[[1]], score=[1.0], group=[0]))  # n_samples_per_prompt 1
    assert torch.isnan(adv).all()


@pytest.mark.network
@pytest.mark.parametrize(
    "entry, expect",
    [
        ("kl", [0.5, -20.0]),
        ("kl-k2", [0.125, 200.0]),  # (log r)^2 / 2, unclamped
        ("kl-k3", [math.exp(-0.5) - 0.5, math.exp(20) - 21]),
        ("kl-low-var", [math.exp(-0.5) - 0.5, 10.0]),
    ],
)
def test_kl_estimators(kinds_open, entry, expect):
    h = kinds_open(entry)
    assert "compute_approx_kl" in h.info["where"] and any("_torchdynamo_orig_callable" in n for n in h.info["notes"])
    case = Case.build(trainable=[[1, 1, 0]], extra={"logp": [[-1.0, -21.0, 5.0]], "ref_logp": [[-1.5, -1.0, 0.0]]})
    (kl,) = h.run(case)
    assert kl[0, :2].tolist() == pytest.approx(expect, rel=1e-5)
    assert kl.dtype == torch.float32 and kl[0, 2] != 0  # no mask
    assert kind_failed(h, case) == set()


@pytest.mark.network
def test_whiten_one_pass_float32_variance(kinds_open):
    h = kinds_open("whiten")
    case = Case.build(trainable=[[1, 1, 0], [1, 0, 1]], extra={"x": [[1.0, 2.0, 9.0], [3.0, 5.0, 4.0]]})
    (out,) = h.run(case)
    s = (5 / 3 + 1e-8) ** 0.5  # unbiased variance of 1, 2, 3, 4; eps inside
    assert out.flatten().tolist() == pytest.approx([-1.5 / s, -0.5 / s, 6.5 / s, 0.5 / s, 2.5 / s, 1.5 / s], rel=1e-5)
    assert kind_failed(h, case) == set()
    constant = Case.build(trainable=[[1] * 7], extra={"x": [[0.9] * 7]})  # E[x^2] - mean^2 < 0 in float32
    (out,) = h.run(constant)
    assert torch.isnan(out).all() and "no-crash" in kind_failed(h, constant)


@pytest.mark.network
def test_reinforce_pp_returns_keep_masked_kl_and_assert_on_a_removed_sample(kinds_open):
    h = kinds_open("reinforce++")
    case = Case.build(trainable=[[1, 0, 1, 0]], token_rewards=[[0.5, 3, 0.25, 2]], score=[1.0], gamma=0.5)
    adv, ret = h.run(case)
    # dense over every token, the masked KL rewards (3 and 2) included, the score at the last trainable token
    g3 = 2.0
    g2 = 0.25 + 1 + 0.5 * g3
    g1 = 3 + 0.5 * g2
    g0 = 0.5 + 0.5 * g1
    assert adv[0].tolist() == pytest.approx([g0, g1, g2, g3]) and ret[0].tolist() == adv[0].tolist()
    assert {"poison", "reference"} <= kind_failed(h, case)
    removed = Case.build(trainable=[[1, 1], [0, 0]], score=[1.0, 1.0])
    with pytest.raises(Exception, match="fully masked"):
        h.run(removed)


MILES_KIND_FUZZ = {  # entry -> (properties that must fail, properties that may fail)
    # the whole-batch fallback of unequal groups mixes them (group-isolation); no twin adds a sample to a group
    "grpo": ({"group-isolation"}, {"no-crash", "affine", "reference"}),
    "kl": (set(), set()),
    "kl-k2": (set(), set()),
    "kl-k3": (set(), set()),
    "kl-low-var": (set(), set()),
    "whiten": ({"no-crash"}, {"poison-nonfinite", "pad-invariance", "permutation", "affine", "reference"}),
    "reinforce++": ({"poison"}, {"no-crash", "poison-nonfinite", "telescoping", "reference"}),
}


@pytest.mark.network
@pytest.mark.parametrize("entry", list(MILES_KIND_FUZZ))
def test_kind_short_fuzz(kinds_open, entry):
    from maskfuzz.fuzz.engine import fuzz_target

    h = kinds_open(entry)
    must, may = MILES_KIND_FUZZ[entry]
    t0 = time.monotonic()
    res = fuzz_target(h.run, h.declared, target=f"miles:{entry}", pin=KIND_PIN, max_examples=40, seed=0)
    print(f"\n[miles:{entry}] fuzz 40: {time.monotonic() - t0:.1f} s", file=sys.stderr)
    found = {f.property for f in res.findings}
    assert must <= found <= must | may, found


# ---------------------------------------------------------------------------------------------
# loss-aggregation from the wheel: loss_function (miles/backends/training_utils/loss.py:972) with
# get_sum_of_sample_mean's reducer (cp_utils.py:92), Megatron scaling. Verdicts by reading the wheel:
# the per-sample mean divides by global_batch_size, the step's samples, removed ones included
# (:1048-1056); --calculate-per-token-loss counts an all-masked sample as one token (:1003); NaN under
# the mask leaks through x * mask (cp_utils.py:110, :118). Split-invariant: the denominators are per step.
# ---------------------------------------------------------------------------------------------
LOSS_2x3 = dict(trainable=[[1, 1, 0], [1, 0, 0]], extra={"loss": [[1.0, 2.0, 9.0], [4.0, 9.0, 9.0]]}, split=[0, 1])
LOSS_REMOVED = dict(trainable=[[1, 1], [0, 0]], extra={"loss": [[1.0, 3.0], [5.0, 5.0]]}, split=[0, 1])


@pytest.mark.network
@pytest.mark.parametrize("ranks", [1, 2])
def test_loss_per_sample_mean_over_two_micro_batches(kinds_open, ranks):
    h = kinds_open("agg-seq-mean-token-mean")
    assert h.info["where"] == "miles/backends/training_utils/loss.py::loss_function"
    loss, grad = h.run(Case.build(**LOSS_2x3, ranks=ranks))
    assert float(loss[0, 0]) == pytest.approx(2.75)
    assert grad.flatten().tolist() == pytest.approx([0.25, 0.25, 0.0, 0.5, 0.0, 0.0])
    loss, grad = h.run(Case.build(**LOSS_REMOVED))  # the removed sample still counts: (2 + 0) / 2
    assert float(loss[0, 0]) == pytest.approx(1.0) and grad[0].tolist() == pytest.approx([0.25, 0.25])


@pytest.mark.network
def test_loss_per_token_counts_a_removed_sample_as_one_token(kinds_open):
    h = kinds_open("agg-token-mean")
    loss, grad = h.run(Case.build(**LOSS_2x3, ranks=2))
    assert float(loss[0, 0]) == pytest.approx(7.0 / 3.0) and grad[0, 0].item() == pytest.approx(1.0 / 3.0)
    loss, _ = h.run(Case.build(**LOSS_REMOVED))
    assert float(loss[0, 0]) == pytest.approx(4.0 / 3.0)


@pytest.mark.network
@pytest.mark.parametrize("entry", ["agg-seq-mean-token-mean", "agg-token-mean"])
def test_loss_short_fuzz(kinds_open, entry):
    from maskfuzz.fuzz.engine import fuzz_target

    h = kinds_open(entry)
    t0 = time.monotonic()
    res = fuzz_target(h.run, h.declared, target=f"miles:{entry}", pin=KIND_PIN, max_examples=20, seed=0)
    print(f"\n[miles:{entry}] fuzz 20: {time.monotonic() - t0:.1f} s", file=sys.stderr)
    found = {f.property for f in res.findings}
    # the removed sample counted is `reference` (a defect: the filter's help, W arguments.py:1545); pad-invariance adds
    # a padding column only; split-invariance, permutation, empty-step hold
    must = {"reference"}
    assert must <= found <= must | {"poison-nonfinite"}, found


# ---------------------------------------------------------------------------------------------
# Options and truncated rows: --disable-grpo-std-normalization read by the rollout's
# _post_process_rewards (0.0.2 miles/ray/rollout.py:659); a cut row is terminal in GAE (#1827's
# docstring at 3d2e0e411, math_utils.py:624-626; 0.0.2 pads with zero values, ppo_utils.py:582-583, 702).
# ---------------------------------------------------------------------------------------------
def test_options_and_truncation_are_declared_with_citations():
    spec = miles.SPEC
    trunc = spec.declared("default").truncation
    assert trunc.terminal and "math_utils.py:624-626" in trunc.cite and "#1827" in trunc.cite
    assert spec.declared("default").options == () and spec.declared("grpo").truncation is None
    (opt,) = spec.declared("grpo").options
    assert (opt.name, opt.values, opt.default) == ("grpo_std_normalization", (True, False), True)
    assert "rollout.py:659" in opt.cite and opt.effect == {False: {"variant": {"std": None, "singleton": "zero"}}}


@pytest.mark.network
def test_grpo_without_std_normalization_is_dr_grpo(kinds_open):
    h = kinds_open("grpo")
    case = Case.build(
        trainable=[[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 0]],
        score=[1, 0, 2, 4],
        group=[0, 0, 1, 1],
        options={"grpo_std_normalization": False},
    )
    (adv,) = h.run(case)
    # r - mean_g only: [1, 0] -> +-0.5, [2, 4] -> -+1, broadcast to every response token
    assert adv.flatten().tolist() == [0.5] * 3 + [-0.5] * 3 + [-1.0] * 3 + [1.0] * 3
    assert kind_failed(h, case) == set()  # no twin adds an all-masked sample to a group any more


@pytest.mark.network
def test_grpo_short_fuzz_checks_both_std_settings(kinds_open):
    from maskfuzz.fuzz.engine import fuzz_target

    h = kinds_open("grpo")
    t0 = time.monotonic()
    res = fuzz_target(
        h.run, h.declared, target="miles:grpo", pin=KIND_PIN, max_examples=24, seed=0, properties=("reference",)
    )
    print(f"\n[miles:grpo] options fuzz 24: {time.monotonic() - t0:.1f} s", file=sys.stderr)
    assert set(res.options_checked) == {"grpo_std_normalization"}
    assert all(n > 0 for n in res.options_checked["grpo_std_normalization"].values()), res.options_checked
    for f in res.findings:  # verdicts on miles' math, never the adapter refusing an option
        assert "option" not in f.verdict.message, f.verdict.message


@pytest.mark.needs_mirror
def test_a_cut_row_is_terminal_after_the_fix(fixed):
    # V = [1, 2], score 1, gamma 0.5, lam 1, bootstrap 4 (never read): delta_1 = 1 - 2 = -1,
    # delta_0 = 0 + 0.5 * 2 - 1 = 0: A = [0 + 0.5 * -1, -1] = [-0.5, -1]; behind a masked tail too
    cut = Case.build(
        trainable=[[1, 1, 0]],
        values=[[1.0, 2.0, 9.0]],
        score=[1.0],
        gamma=0.5,
        lam=1.0,
        truncated=[True],
        bootstrap=[4.0],
    )
    assert fixed.run(cut)[0][0].tolist() == pytest.approx([-0.5, -1.0, 0.0])
    assert failed(fixed.run, cut) == set()


# ---------------------------------------------------------------------------------------------
# value-loss from the wheel: the critic's --loss-type value_loss (miles/backends/megatron_utils/actor.py:356)
# through loss_function, which dispatches to value_loss_function (miles/backends/training_utils/loss.py:863,
# :1018-1019). Verdicts by reading the wheel: max((v_c - R)^2, (v - R)^2), no 1/2 (:900-904), the actor's reducer
# and normalisers: a removed sample counts in global_batch_size (:1048-1056) or as one token with
# --calculate-per-token-loss (:1003); NaN under the mask leaks through x * mask (cp_utils.py:110).
# ---------------------------------------------------------------------------------------------
# row 0: v - v_old = 0.1 inside the clip 0.2: (1 - 0)^2 = 1, dl/dv = 2; v = 0.5 with v_old = 2 is clipped to
# v_c = 1.8: max(1.8^2, 0.5^2) = 3.24, dl/dv = 0 (the clamp saturates); row 1: v = v_old = -1, R = 1: 4, dl/dv = -4.
# per-sample mean: ((1 + 3.24) / 2 + 4) / 2 = 3.06, grads 2 / 4 = 0.5, 0, -4 / 2 = -2;
# per-token: 8.24 / 3, grads 2 / 3, 0, -4 / 3; --value-clip 10: the second token is inside the clip, 0.25 and
# dl/dv = 1: ((1 + 0.25) / 2 + 4) / 2 = 2.3125, grads 0.5, 0.25, -2.
VALUE_STEP = Case.build(
    trainable=[[1, 1, 0], [1, 0, 0]],
    extra={
        "v": [[1.0, 0.5, 100.0], [-1.0, 7.0, 7.0]],
        "v_old": [[0.9, 2.0, 100.0], [-1.0, 7.0, 7.0]],
        "ret": [[0.0, 0.0, 0.0], [1.0, 0.0, 0.0]],
    },
    split=[0, 1],
    dtype="float32",
)
# row 0 of VALUE_STEP next to a removed sample: 2.12 / 2 = 1.06 (global_batch_size counts it); per-token
# 4.24 / (2 + clamp_min(0, 1)) = 1.41333; the reference is 2.12
VALUE_REMOVED = Case.build(
    trainable=[[1, 1], [0, 0]],
    extra={"v": [[1.0, 0.5], [5.0, 5.0]], "v_old": [[0.9, 2.0], [5.0, 5.0]], "ret": [[0.0, 0.0], [0.0, 0.0]]},
    split=[0, 1],
    dtype="float32",
)


def test_value_loss_is_declared_with_its_options():
    d = miles.SPEC.declared("value-loss")
    assert d.kind == "value-loss" and d.variant == {"clip": 0.2, "half": False, "mode": "seq-mean-token-mean"}
    assert [(o.name, o.default) for o in d.options] == [
        ("value_clip", 0.2),
        ("calculate_per_token_loss", False),
        ("rollout_temperature", 1.0),
    ]
    assert d.options[2].effect == {} and "loss.py:80" in d.options[2].cite  # the critic must not see it
    assert "arguments.py:890" in d.options[0].cite and "loss.py:900-901" in d.options[0].cite
    assert d.options[1].effect == {True: {"variant": {"mode": "token-mean"}}}
    assert miles.SPEC.for_entry("value-loss").domain.dtypes == ("float32",)


@pytest.mark.network
def test_value_loss_by_hand(kinds_open):
    from kind_support import verdicts_by_property

    h = kinds_open("value-loss")
    assert h.info["where"] == (
        "miles/backends/training_utils/loss.py::value_loss_function via miles/backends/training_utils/loss.py::"
        "loss_function"
    )
    for ranks in (1, 2):
        loss, grad = h.run(VALUE_STEP.replace(ranks=ranks))
        assert float(loss[0, 0]) == pytest.approx(3.06, rel=1e-6)
        assert grad.flatten().tolist() == pytest.approx([0.5, 0.0, 0.0, -2.0, 0.0, 0.0], rel=1e-6)
    v = verdicts_by_property(h, VALUE_STEP)
    for prop in ("reference", "clip-bound", "split-invariance", "poison", "permutation", "empty-step"):
        assert v[prop].status == "pass", (prop, v[prop].message)
    per_token = VALUE_STEP.replace(options={"calculate_per_token_loss": True})
    loss, grad = h.run(per_token)
    assert float(loss[0, 0]) == pytest.approx(8.24 / 3, rel=1e-6)
    assert grad.flatten().tolist() == pytest.approx([2 / 3, 0.0, 0.0, -4 / 3, 0.0, 0.0], rel=1e-6)
    wide = VALUE_STEP.replace(options={"value_clip": 10.0})
    loss, grad = h.run(wide)
    assert float(loss[0, 0]) == pytest.approx(2.3125, rel=1e-6)
    assert grad.flatten().tolist() == pytest.approx([0.5, 0.25, 0.0, -2.0, 0.0, 0.0], rel=1e-6)
    for case in (per_token, wide):
        assert "reference" not in kind_failed(h, case)
    assert float(h.run(VALUE_REMOVED)[0][0, 0]) == pytest.approx(1.06, rel=1e-6)
    removed_pt = VALUE_REMOVED.replace(options={"calculate_per_token_loss": True})
    assert float(h.run(removed_pt)[0][0, 0]) == pytest.approx(4.24 / 3, rel=1e-6)
    assert {"reference"} <= kind_failed(h, VALUE_REMOVED)


# --rollout-temperature 0.7: the wheel's get_responses divides every logit by it (loss.py:80), the value logits
# too, so the predictions are v / 0.7 (worked out in tests/test_target_slime.py, TEMPERATURE): L = ((100/49 + 3.24)
# / 2 + 289/49) / 2, grads 50/49, 0, -170/49. PR #1190 (cc93d97c4, in both git pins) divides only when
# logits.size(-1) > 1 (G loss_hub/logit_processors.py:55): the T = 1 numbers.
TEMPERATURE = {"rollout_temperature": 0.7}


@pytest.mark.network
def test_value_loss_rollout_temperature_reaches_the_critic_in_the_wheel(kinds_open):
    h = kinds_open("value-loss")
    hot = VALUE_STEP.replace(options=TEMPERATURE)
    loss, grad = h.run(hot)
    assert float(loss[0, 0]) == pytest.approx(((100 / 49 + 3.24) / 2 + 289 / 49) / 2, rel=1e-6)
    assert grad.flatten().tolist() == pytest.approx([50 / 49, 0.0, 0.0, -170 / 49, 0.0, 0.0], rel=1e-5)
    assert "reference" in kind_failed(h, hot)


@pytest.mark.needs_mirror
def test_value_loss_at_the_git_pin_ignores_the_temperature(repos):
    """3d2e0e411's loss.py imports the pydantic event logger (miles/utils/audit_utils/event_logger): without
    pydantic the git pins do not load (as for the agg entries)."""
    import importlib.util

    if importlib.util.find_spec("pydantic") is None:
        pytest.skip("miles' git pins import pydantic on the way to loss_function: pip install pydantic to run this")
    with open_target(f"miles:value-loss@{FIX}", repos=repos) as h:
        assert h.info["where"].startswith("miles/backends/training_utils/loss_hub/losses.py::value_loss_function")
        for opts in ({}, TEMPERATURE):
            loss, grad = h.run(VALUE_STEP.replace(options=opts))
            assert float(loss[0, 0]) == pytest.approx(3.06, rel=1e-6)
            assert grad.flatten().tolist() == pytest.approx([0.5, 0.0, 0.0, -2.0, 0.0, 0.0], rel=1e-6)
        assert "reference" not in kind_failed(h, VALUE_STEP.replace(options=TEMPERATURE))


@pytest.mark.network
def test_value_loss_short_fuzz(kinds_open):
    from maskfuzz.fuzz.engine import fuzz_target

    h = kinds_open("value-loss")
    t0 = time.monotonic()
    res = fuzz_target(h.run, h.declared, target="miles:value-loss", pin=KIND_PIN, max_examples=12, seed=0)
    print(f"\n[miles:value-loss] fuzz 12: {time.monotonic() - t0:.1f} s", file=sys.stderr)
    found = {f.property for f in res.findings}
    # reference: the removed sample counted, or --rollout-temperature reaching the value head (loss.py:80), which also
    # breaks clip-bound (both defects: the filter's help, the temperature's help); split-invariance, permutation hold
    must = {"reference"}
    assert must <= found <= must | {"clip-bound", "poison-nonfinite", "masked-zero"}, found  # no no-crash


# ---------------------------------------------------------------------------------------------
# policy-loss: the actor's --loss-type policy_loss (the default) through loss_function, which dispatches to
# policy_loss_function (0.0.2 miles/backends/training_utils/loss.py:565, :1016-1017): ppo_kl = old - logp (:659),
# ppo_kl and the advantages zeroed off the loss mask with nan_to_num (:669-679), compute_policy_loss(ppo_kl,
# advantages, eps_clip, eps_clip_high) (:681, miles/utils/ppo_utils.py:178-201), sum_of_sample_mean, / the step's
# samples (:1048-1056). --eps-clip 0.2, --eps-clip-high = eps_clip (arguments.py:882-883, :2051-2052); :681 never
# passes eps_clip_c, so --eps-clip-c (arguments.py:884-889) is silently ignored.
# ---------------------------------------------------------------------------------------------
# row 0: r = 1, A = 1: l = -1, dl/dlogp = -1; r = e^0.5, A = 1: the clip binds at 1.2, l = -1.2, 0; r = e^-0.5, A = 1:
# the low clip does not bind (-r > -0.8), l = -e^-0.5, slope -e^-0.5; 7 (NaN) under the mask. row 1: r = e^0.5,
# A = -1: the unclipped term is the larger, l = e^0.5, slope e^0.5; r = 1, A = 2: -2, -2.
# per-sample mean: ((-1 - 1.2 - e^-0.5) / 3 + (e^0.5 - 2) / 2) / 2; grads / (3 * 2) and / (2 * 2)
POLICY_EXTRA = {
    "logp": [[-1.0, -0.5, -1.5, 7.0], [-0.5, -2.0, 0.0, 0.0]],
    "old_logp": [[-1.0, -1.0, -1.0, -1.0], [-1.0, -2.0, 0.0, 0.0]],
    "adv": [[1.0, 1.0, 1.0, 5.0], [-1.0, 2.0, 0.0, 0.0]],
}
POLICY_STEP = Case.build(trainable=[[1, 1, 1, 0], [1, 1, 0, 0]], extra=POLICY_EXTRA, split=[0, 1], dtype="float32")
POLICY_NAN = POLICY_STEP.replace(  # NaN log-probs under the mask (a case with non-finite poison is judged for it alone)
    extra={**POLICY_STEP.extra, "logp": torch.where(POLICY_STEP.trainable, POLICY_STEP.extra["logp"], float("nan"))}
)
_E, _EI = math.exp(0.5), math.exp(-0.5)
POLICY_LOSS = ((-1 - 1.2 - _EI) / 3 + (_E - 2) / 2) / 2
POLICY_GRAD = [-1 / 6, 0.0, -_EI / 6, 0.0, _E / 4, -0.5, 0.0, 0.0]
# row 1's first token at r = e^1.5 (logp 0.5): with A = -1 the unclipped term e^1.5 = 4.48 is above the dual clip's
# -c A = 3 (--eps-clip-c 3): 3, slope 0, if the clip reached compute_policy_loss
POLICY_DUAL = Case.build(
    trainable=[[1, 1, 1, 0], [1, 1, 0, 0]],
    extra={**POLICY_EXTRA, "logp": [POLICY_EXTRA["logp"][0], [0.5, -2.0, 0.0, 0.0]]},
    split=[0, 1],
    dtype="float32",
    options={"eps_clip_c": 3.0},
)


def test_policy_loss_is_declared_with_the_default_clip_and_its_options():
    d = miles.SPEC.declared("policy-loss")
    assert d.kind == "policy-loss" and d.variant == {
        "clip_low": 0.2,
        "clip_high": 0.2,
        "dual_clip": None,
        "advantages": "token",
        "mode": "seq-mean-token-mean",
    }
    assert [(o.name, o.default) for o in d.options] == [
        ("eps_clip_high", None),
        ("eps_clip_c", None),
        ("calculate_per_token_loss", False),
    ]
    assert "arguments.py:883" in d.options[0].cite and "loss.py:681" in d.options[1].cite
    assert d.options[1].effect == {3.0: {"variant": {"dual_clip": 3.0}}}
    assert miles.SPEC.for_entry("policy-loss").domain.dtypes == ("float32",)


@pytest.mark.network
def test_policy_loss_by_hand(kinds_open):
    from kind_support import verdicts_by_property

    h = kinds_open("policy-loss")
    assert h.info["where"] == (
        "miles/backends/training_utils/loss.py::policy_loss_function via miles/backends/training_utils/loss.py::"
        "loss_function"
    )
    for ranks in (1, 2):
        for case in (POLICY_STEP, POLICY_NAN):  # NaN under the mask zeroed by nan_to_num (loss.py:669-679)
            loss, grad = h.run(case.replace(ranks=ranks))
            assert float(loss[0, 0]) == pytest.approx(POLICY_LOSS, rel=1e-6)
            assert grad.flatten().tolist() == pytest.approx(POLICY_GRAD, rel=1e-6, abs=1e-7)
    v = verdicts_by_property(h, POLICY_STEP)
    for prop in ("reference", "poison", "split-invariance", "permutation", "masked-zero"):
        assert v[prop].status == "pass", (prop, v[prop].message)
    assert "poison-nonfinite" not in kind_failed(h, POLICY_NAN)
    per_token = POLICY_STEP.replace(options={"calculate_per_token_loss": True})  # the token mean over 5 tokens
    loss, grad = h.run(per_token)
    assert float(loss[0, 0]) == pytest.approx((-1 - 1.2 - _EI + _E - 2) / 5, rel=1e-6)
    assert grad.flatten().tolist() == pytest.approx([g * (6 if i < 4 else 4) / 5 for i, g in enumerate(POLICY_GRAD)])
    high = POLICY_STEP.replace(options={"eps_clip_high": 0.28})  # the binding clip moves to 1.28
    assert float(h.run(high)[0][0, 0]) == pytest.approx(((-1 - 1.28 - _EI) / 3 + (_E - 2) / 2) / 2, rel=1e-6)
    for case in (per_token, high):
        assert "reference" not in kind_failed(h, case)
    # --eps-clip-c 3 never reaches compute_policy_loss (loss.py:681 passes eps_clip, eps_clip_high only): the
    # unclipped e^1.5 stays, where the dual clip gives 3
    loss, grad = h.run(POLICY_DUAL)
    assert float(loss[0, 0]) == pytest.approx(((-1 - 1.2 - _EI) / 3 + (math.exp(1.5) - 2) / 2) / 2, rel=1e-6)
    assert grad[1, 0].item() == pytest.approx(math.exp(1.5) / 4, rel=1e-6)
    assert "reference" in kind_failed(h, POLICY_DUAL)


@pytest.mark.network
def test_policy_loss_short_fuzz(kinds_open):
    from maskfuzz.fuzz.engine import fuzz_target

    h = kinds_open("policy-loss")
    t0 = time.monotonic()
    res = fuzz_target(h.run, h.declared, target="miles:policy-loss", pin=KIND_PIN, max_examples=12, seed=0)
    print(f"\n[miles:policy-loss] fuzz 12: {time.monotonic() - t0:.1f} s", file=sys.stderr)
    found = {f.property for f in res.findings}
    # the removed sample counted by global_batch_size (loss.py:1048-1056), as for value-loss; --eps-clip-c drawn:
    # ignored (loss.py:681). nan_to_num (:669-679) keeps NaN under the mask out: no poison-nonfinite
    must = set()  # the removed sample counted is `reference` (test_policy_loss_by_hand); 12 examples may miss it
    assert must <= found <= must | {"reference"}, found


# The git pins (6ccdc7da6, 3d2e0e411, HEAD 31f1ca961): policy_loss_function and its compute_policy_loss import live
# in loss_hub/losses.py (:62, :19), the log-softmax calculate_log_probs_and_entropy is called in
# loss_hub/logit_processors.py (import :7, call :178 in get_log_probs_and_entropy, which losses.py imports at :13);
# #1729 (9525fc77f, an ancestor of every git pin) passes eps_clip_c (losses.py:180-182, HEAD :207-209): dual clip on.
POLICY_HEAD = "31f1ca961"
POLICY_GIT_WHERE = (
    "miles/backends/training_utils/loss_hub/losses.py::policy_loss_function via miles/backends/training_utils/loss.py::"
    "loss_function"
)


def _fake_module(name: str, **attrs):
    import types

    mod = types.ModuleType(name)
    for key, value in attrs.items():
        if callable(value):
            value.__module__ = name
        setattr(mod, key, value)
    sys.modules[name] = mod
    return mod


def test_policy_stand_ins_bind_where_each_function_is_called():
    from maskfuzz.targets.miles.calls_kinds import bind_policy_stand_ins, token_log_probs

    def compiled(*a):
        return "compiled"

    def plain(*a):
        return "eager"

    compiled._torchdynamo_orig_callable = plain
    try:
        # 0.0.2: one module (loss.py) defines get_log_probs_and_entropy and calls both
        def get_lp_w(*a):
            return None

        w = _fake_module("_mf_w_loss", get_log_probs_and_entropy=get_lp_w, compute_policy_loss=compiled)
        w.calculate_log_probs_and_entropy = lambda *a: None
        notes = bind_policy_stand_ins(w)
        assert w.calculate_log_probs_and_entropy is token_log_probs and w.compute_policy_loss is plain
        assert "called in _mf_w_loss" in notes[0]

        # git: the log-softmax is called in logit_processors, compute_policy_loss in losses
        def get_lp_g(*a):
            return None

        lp = _fake_module("_mf_g_lp", get_log_probs_and_entropy=get_lp_g)
        lp.calculate_log_probs_and_entropy = lambda *a: None
        g = _fake_module("_mf_g_losses", compute_policy_loss=compiled)
        g.get_log_probs_and_entropy = lp.get_log_probs_and_entropy
        notes = bind_policy_stand_ins(g)
        assert lp.calculate_log_probs_and_entropy is token_log_probs and g.compute_policy_loss is plain
        assert not hasattr(g, "calculate_log_probs_and_entropy")
        assert "called in _mf_g_lp" in notes[0] and "called in _mf_g_losses" in notes[1]
        # a caller without the log-softmax is not present
        del lp.calculate_log_probs_and_entropy
        with pytest.raises(Exception, match="_mf_g_lp has no calculate_log_probs_and_entropy"):
            bind_policy_stand_ins(g)
    finally:
        for name in ("_mf_w_loss", "_mf_g_lp", "_mf_g_losses"):
            sys.modules.pop(name, None)


@pytest.mark.needs_mirror
@pytest.mark.parametrize("pin", [POLICY_HEAD, FIX, BEFORE])
def test_policy_loss_by_hand_at_the_git_pins(repos, pin):
    """The hand example of test_policy_loss_by_hand (r = 1, a binding clip, a non-binding low clip, A < 0 unclipped,
    a masked 7 / NaN) through the real policy_loss_function at the git pins, and the dual clip #1729 wired."""
    import importlib.util

    from kind_support import verdicts_by_property

    if importlib.util.find_spec("pydantic") is None:
        pytest.skip("miles' git pins import pydantic on the way to loss_function: pip install pydantic to run this")
    with open_target(f"miles:policy-loss@{pin}", repos=repos) as h:
        assert h.info["where"] == POLICY_GIT_WHERE
        notes = "\n".join(h.info["notes"]) if isinstance(h.info["notes"], list) else h.info["notes"]
        assert "called in miles.backends.training_utils.loss_hub.logit_processors" in notes
        assert "called in miles.backends.training_utils.loss_hub.losses" in notes
        for ranks in (1, 2):
            for case in (POLICY_STEP, POLICY_NAN):  # masked 7 / NaN zeroed by nan_to_num (HEAD losses.py:196-205)
                loss, grad = h.run(case.replace(ranks=ranks))
                assert float(loss[0, 0]) == pytest.approx(POLICY_LOSS, rel=1e-6)
                assert grad.flatten().tolist() == pytest.approx(POLICY_GRAD, rel=1e-6, abs=1e-7)
        v = verdicts_by_property(h, POLICY_STEP)
        for prop in ("reference", "poison", "split-invariance", "permutation", "masked-zero"):
            assert v[prop].status == "pass", (prop, v[prop].message)
        assert "poison-nonfinite" not in kind_failed(h, POLICY_NAN)
        high = POLICY_STEP.replace(options={"eps_clip_high": 0.28})  # the binding clip moves to 1.28
        assert float(h.run(high)[0][0, 0]) == pytest.approx(((-1 - 1.28 - _EI) / 3 + (_E - 2) / 2) / 2, rel=1e-6)
        # --eps-clip-c 3 reaches compute_policy_loss (#1729): row 1's first token e^1.5 * 1 is capped at -c A = 3,
        # slope 0 (0.0.2 keeps e^1.5, test_policy_loss_by_hand)
        loss, grad = h.run(POLICY_DUAL)
        assert float(loss[0, 0]) == pytest.approx(((-1 - 1.2 - _EI) / 3 + (3 - 2) / 2) / 2, rel=1e-6)
        assert grad[1, 0].item() == 0.0
        assert grad.flatten().tolist() == pytest.approx([-1 / 6, 0.0, -_EI / 6, 0.0, 0.0, -0.5, 0.0, 0.0], rel=1e-6)
        for case in (high, POLICY_DUAL):
            assert "reference" not in kind_failed(h, case)


# ---------------------------------------------------------------------------------------------
# KL in the reward (gae-kl, reinforce++-kl) through the trainer's compute_advantages_and_returns (W
# miles/backends/training_utils/loss.py:291, G :19) with log_probs / ref_log_probs, kl_loss_type k1, kl_coef 0.1.
# Verdicts by reading miles: compute_approx_kl = logp - ref at every response token (W miles/utils/ppo_utils.py:81-84);
# * ppo at 0.0.2 / 6ccdc7da6: `k *= -kl_coef` unmasked, the score on the last response token (W loss.py:349-355;
#   G advantages.py:59-77 + the function's `full_rewards[i, L - 1]`), GAE without the mask: the masked KL leaks
#   (gap-invariance, reference); at 3d2e0e411 (#1827) GAE over the trainable subsequence drops it: no finding;
# * reinforce_plus_plus: `token_level_rewards = -kl_coef * full_kl_response`, NOT masked (W ppo_utils.py:412, G
#   math_utils.py:486), discounted over every response token (W :420-423): a tool token's KL reaches the returns of
#   the tokens before it (poison, reference: masked-reward-leak, reach pipeline); the assert on a fully masked row
#   (W :414, no-crash).
# ---------------------------------------------------------------------------------------------
# the cases of slime's KL tests (the same trainer code path): row 0 a NaN log-prob under the mask, row 1 a masked tail
# whose KL is -2 (k1)


def test_kl_reward_entries_are_declared_with_the_trainer_defaults():
    spec = miles.SPEC
    for entry, kind, contract in (("gae-kl", "gae", "compressed"), ("reinforce++-kl", "returns", "dense")):
        d = spec.declared(entry)
        assert (d.kind, d.contract) == (kind, contract)
        assert d.variant == {"kl_reward": {"coef": 0.1, "estimator": "k1", "clamp_d": None, "clamp": None}}
        assert not d.domain.token_rewards and "float64" not in d.domain.dtypes
        for pin in ("0.0.2", BEFORE, FIX):
            dom = spec.declared(entry, pin).pipeline
            assert dom.cited() == [] and not dom.masked_logprobs and not dom.token_rewards, (entry, pin)


def _kl_reward_by_hand(h_rpp, h_gae, fixed: bool) -> None:
    case = Case.build(**KL_REWARD)
    # row 1: kl = logp - ref = [0.5, 0, -2]; r = -0.1 kl = [-0.05, 0, 0.2]
    adv, ret = h_rpp.run(case)
    # the masked KL 0.2 kept, the score at the last trainable token: G = [-0.05 + 0.5 * 2.1, 2 + 0.5 * 0.2, 0.2]
    assert adv[1].tolist() == pytest.approx([1.0, 2.1, 0.2], rel=1e-6) and torch.equal(adv[1], ret[1])
    assert torch.isnan(adv[0, :2]).all() and adv[0, 2].item() == pytest.approx(1.1, rel=1e-6)  # the serial loop
    assert {"poison", "reference"} <= kind_failed(h_rpp, KL_REWARD_FINITE)
    adv, ret = h_gae.run(case)
    if fixed:  # #1827: the trainable subsequence, score at the last trainable token: the reference
        assert adv.flatten().tolist() == pytest.approx([0.5, 0.0, 1.1, 0.95, 2.0, 0.0], rel=1e-6)
        assert kind_failed(h_gae, KL_REWARD_FINITE) == set()
    else:  # every response token a step, the masked KL kept, the score on the last (masked) response token
        assert adv[1].tolist() == pytest.approx([0.5, 1.1, 2.2], rel=1e-6) and torch.isnan(adv[0]).all()
        assert {"reference", "masked-zero"} <= kind_failed(h_gae, KL_REWARD_FINITE)


@pytest.mark.network
def test_kl_reward_by_hand_at_the_wheel():
    with open_target("miles:reinforce++-kl@0.0.2") as rpp, open_target("miles:gae-kl@0.0.2") as gae:
        _kl_reward_by_hand(rpp, gae, fixed=False)


@pytest.mark.needs_mirror
def test_kl_reward_by_hand_after_pr_1827(repos):
    with (
        open_target(f"miles:reinforce++-kl@{FIX}", repos=repos) as rpp,
        open_target(f"miles:gae-kl@{FIX}", repos=repos) as gae,
    ):
        _kl_reward_by_hand(rpp, gae, fixed=True)


MILES_KL_FUZZ = {  # (entry, pin) -> (must fail, may fail) in 20 unshrunk examples
    # GAE without the mask (W loss.py:356-358): masked values and KL leak (poison, reference, gap-invariance,
    # masked-zero); `k[-1]` of an empty response (W loss.py:354, no-crash, api); NaN under the mask (api)
    ("gae-kl", "0.0.2"): ({"poison"}, {"reference", "gap-invariance", "masked-zero", "no-crash", "poison-nonfinite"}),
    # the unmasked KL (W ppo_utils.py:412) leaks (poison, reference); the assert on a removed sample (:414)
    ("reinforce++-kl", "0.0.2"): ({"poison"}, {"reference", "no-crash", "poison-nonfinite"}),
    ("gae-kl", FIX): (set(), set()),  # #1827: the KL of a masked token is dropped with the token
}


@pytest.mark.parametrize(
    "entry,pin",
    [
        pytest.param(e, p, marks=pytest.mark.network if p == "0.0.2" else pytest.mark.needs_mirror)
        for e, p in MILES_KL_FUZZ
    ],
)
def test_kl_reward_short_fuzz(entry, pin):
    from maskfuzz.fuzz.engine import fuzz_target

    repos = parse_repos(None)
    if pin != "0.0.2" and "miles" not in repos:
        pytest.skip("git pins: set MASKFUZZ_REPOS=miles=/path/to/miles-clone-or-mirror to test miles at commits")
    must, may = MILES_KL_FUZZ[(entry, pin)]
    with open_target(f"miles:{entry}@{pin}", repos=repos) as h:
        t0 = time.monotonic()
        res = fuzz_target(h.run, h.declared, target=f"miles:{entry}", pin=pin, max_examples=20, seed=0, shrink=False)
        print(f"\n[miles:{entry}@{pin}] fuzz 20 (unshrunk): {time.monotonic() - t0:.1f} s", file=sys.stderr)
    found = {f.property for f in res.findings}
    assert must <= found <= must | may, found


# ---------------------------------------------------------------------------------------------
# The promise model (issue 24): what miles' own code produces (Domain.produces) and what it promises at each pin
# (Promise, quoted with file:line; W = the 0.0.2 wheel, G = the git pins). A finding is a defect only where it breaks a
# universal invariant with a witness built from produced features, or one of miles' own promises.
# ---------------------------------------------------------------------------------------------
from maskfuzz.oracles.promises import broken  # noqa: E402
from tests.test_target_slime import PRODUCED, triaged  # noqa: E402

_PINS = ("0.0.2", BEFORE, FIX)


def test_pipeline_domains_cite_what_miles_produces():
    import re

    for pin in _PINS:
        tag = "miles-rl 0.0.2" if pin == "0.0.2" else "miles 6ccdc7da6 / 3d2e0e411"
        for entry in miles.SPEC.entries:
            dom = miles.SPEC.for_entry(entry).pipeline_at(pin)
            for feature, cite in dom.produces.items():
                assert re.search(r"[\w/.-]+\.\w+:\d+", cite) and cite.startswith(tag), (entry, pin, feature)
        usable = miles.SPEC.pipeline_at(pin).produced_only()
        assert all(getattr(usable, f) for f in PRODUCED), pin
        loss = miles.SPEC.for_entry("agg-token-mean").pipeline_at(pin).produced_only()
        assert loss.uneven_splits and loss.all_masked_rows and not loss.nonfinite_poison and loss.dtypes == ("float32",)
    # the wheel's bf16 / fp16 value logits (--true-on-policy-mode) stay: the narrowing cites loss.py:69-70, 81-85
    assert miles.SPEC.pipeline_at("0.0.2").produced_only().dtypes == ("float32", "bfloat16", "float16")
    tail = Case.build(trainable=[[1, 0]], token_rewards=[[0.0, 100.0]], values=[[0.0, 100.0]], score=[1.0])
    assert miles.SPEC.pipeline_at(BEFORE).unproduced(tail) == []


MILES_PROMISES = {  # (entry, pin) -> promise ids
    ("default", "0.0.2"): ["upstream:miles/backends/training_utils/loss.py:297-299"],
    ("default", BEFORE): ["upstream:miles/backends/training_utils/loss.py:26-28"],
    ("default", FIX): ["upstream:miles/backends/training_utils/loss.py:26-28",
                       "upstream:miles/backends/training_utils/loss_hub/math_utils.py:615-619",
                       "upstream:miles/backends/training_utils/loss_hub/math_utils.py:620-621",
                       "upstream:miles/backends/training_utils/loss_hub/math_utils.py:627"],
    ("kl", "0.0.2"): ["upstream:miles/utils/ppo_utils.py:72-73"],
    ("reinforce++-kl", BEFORE): ["upstream:miles/backends/training_utils/loss.py:26-28",
                                 "upstream:miles/backends/training_utils/loss_hub/math_utils.py:456"],
    ("agg-seq-mean-token-mean", "0.0.2"): ["upstream:miles/utils/arguments.py:1545"],
    ("agg-token-mean", FIX): ["upstream:miles/utils/arguments.py:2070",
                              "upstream:docs/user-guide/training-script-walkthrough.md:217-219"],
    ("value-loss", "0.0.2"): ["upstream:miles/utils/arguments.py:1545", "upstream:miles/utils/arguments.py:304-307"],
    ("policy-loss", "0.0.2"): ["upstream:miles/utils/arguments.py:884-889", "upstream:miles/utils/arguments.py:1545"],
}  # fmt: skip


def test_promises_are_declared_per_pin_and_cover_what_they_say():
    spec = miles.SPEC
    for (entry, pin), ids in MILES_PROMISES.items():
        assert [p.id for p in spec.declared(entry, pin).promises] == ids, (entry, pin)
    at = lambda e, pin: spec.declared(e, pin).promises  # noqa: E731
    # #1827's docstring makes the compressed contract miles' own from 3d2e0e411: a regression there is a defect
    assert broken("gap-invariance", "extra-decay", at("default", FIX)).id.endswith("math_utils.py:615-619")
    assert broken("masked-zero", "masked-nonzero", at("default", FIX)).id.endswith("math_utils.py:627")
    assert broken("score-kept", "score-lost", at("default", FIX), reach="api").id.endswith("math_utils.py:620-621")
    # before it, the dense GAE's extra decay and the masked advantages are semantics facts
    assert broken("gap-invariance", "extra-decay", at("default", BEFORE)) is None
    assert broken("masked-zero", "masked-nonzero", at("default", "0.0.2")) is None
    assert broken("reference", "unexplained", at("kl", BEFORE)).id.endswith("math_utils.py:146-147")
    assert broken("reference", "variant-mismatch", at("policy-loss", "0.0.2")).id.endswith("arguments.py:884-889")
    assert broken("reference", "masked-statistics", at("agg-seq-mean-token-mean", BEFORE)).id.endswith(
        "arguments.py:2070"
    )
    assert broken("reference", "variant-mismatch", at("grpo", "0.0.2")) is None  # grpo's variants are semantics
    assert spec.declared("grpo").variant == {"empty_rows": "counted"}


def _lines(text: str, lines: str) -> str:
    lo, _, hi = lines.partition("-")
    out = []
    for line in text.splitlines()[int(lo) - 1 : int(hi or lo)]:
        line = line.strip().lstrip("#").strip()
        out.append(line[1:] if line.startswith('"') else line)
    return " ".join(" ".join(out).split())


@pytest.mark.network
def test_every_wheel_promise_quotes_the_words_at_its_line():
    from maskfuzz.targets.runtime.acquire import acquire

    root = acquire(miles.SPEC, "0.0.2").root
    for entry in miles.SPEC.entries:
        for p in miles.SPEC.declared(entry, "0.0.2").promises:
            path, lines = p.id.removeprefix("upstream:").rsplit(":", 1)
            text = (root / path).read_text(encoding="utf-8")
            assert " ".join(p.text.split()) in _lines(text, lines), (entry, p.id)


@pytest.mark.needs_mirror
def test_every_git_promise_quotes_the_words_at_its_line(repos):
    import subprocess

    for entry in miles.SPEC.entries:
        for pin in (BEFORE, FIX):
            for p in miles.SPEC.declared(entry, pin).promises:
                path, lines = p.id.removeprefix("upstream:").rsplit(":", 1)
                text = subprocess.run(["git", "-C", str(repos["miles"]), "show", f"{pin}:{path}"], check=True,
                                      capture_output=True, text=True).stdout  # fmt: skip
                assert " ".join(p.text.split()) in _lines(text, lines), (entry, pin, p.id)


@pytest.mark.network
def test_the_wheel_gae_leaks_are_defects_with_a_cited_pipeline_witness(wheel):
    leak = Case.build(trainable=[[1, 0]], token_rewards=[[0.0, 100.0]], values=[[0.0, 100.0]], score=[1.0])
    f = triaged(wheel, leak, "poison")
    assert (f.promise.id, f.mechanism, f.reach, f.severity) == (
        "universal:poison", "masked-value-bootstrap", "pipeline", "high"
    ), f.reach_how  # fmt: skip
    f = triaged(wheel, leak.replace(gamma=0.0), "score-kept")
    assert (f.promise.id, f.reach) == ("universal:score-kept", "pipeline")
    f = triaged(wheel, leak.replace(gamma=0.0), "masked-zero")
    assert f.promise is None and f.fact == "semantics"  # the policy loss zeroes masked advantages (loss.py:675-679)


@pytest.mark.network
def test_the_wheel_kinds_break_their_promises(kinds_open):
    # 39af16296080970b: --eps-clip-c parsed, never passed (W loss.py:681)
    f = triaged(kinds_open("policy-loss"), POLICY_DUAL, "reference")
    assert (f.promise.id, f.mechanism, f.reach) == ("upstream:miles/utils/arguments.py:884-889", "variant-mismatch",
                                                    "pipeline")  # fmt: skip
    # a removed sample counted by global_batch_size (W loss.py:1048-1058)
    f = triaged(kinds_open("agg-seq-mean-token-mean"), Case.build(**LOSS_REMOVED), "reference")
    assert (f.promise.id, f.severity) == ("upstream:miles/utils/arguments.py:1545", "medium")
    f = triaged(kinds_open("value-loss"), VALUE_REMOVED, "reference")
    assert f.promise.id == "upstream:miles/utils/arguments.py:1545"
    # --rollout-temperature reaches the value head (W loss.py:80)
    f = triaged(kinds_open("value-loss"), VALUE_STEP.replace(options=TEMPERATURE), "reference")
    assert (f.promise.id, f.mechanism) == ("upstream:miles/utils/arguments.py:304-307", "unexplained")
    # REINFORCE++ keeps the KL of masked tokens (W ppo_utils.py:412) and asserts on a removed sample (:414)
    h = kinds_open("reinforce++")
    leak = Case.build(trainable=[[1, 0, 1, 0]], token_rewards=[[0.5, 3, 0.25, 2]], score=[1.0], gamma=0.5)
    f = triaged(h, leak, "poison")
    assert (f.promise.id, f.mechanism, f.reach) == ("universal:poison", "masked-reward-leak", "pipeline")
    f = triaged(h, Case.build(trainable=[[1, 1], [0, 0]], score=[1.0, 1.0]), "no-crash")
    assert (f.promise.id, f.reach, f.severity) == ("universal:no-crash", "pipeline", "medium")


@pytest.mark.needs_mirror
def test_reinforce_pp_kl_masked_kl_is_a_defect_at_every_pin(repos):
    # 8b35656a945cb3ee's pipeline witness: a masked tail token whose log-prob is 10 nats off the reference's
    witness = Case.build(trainable=[[1, 0]], score=[1.0], extra={"logp": [[0.0, -10.0]], "ref_logp": [[0.0, 0.0]]})
    for pin in _PINS:
        with open_target(f"miles:reinforce++-kl@{pin}", repos=repos) as h:
            f = triaged(h, witness, "reference")
            assert (f.promise.id, f.mechanism, f.reach) == ("universal:poison", "masked-reward-leak", "pipeline"), pin

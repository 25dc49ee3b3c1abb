"""slime through its adapter: `slime/utils/ppo_utils.py::get_advantages_and_returns_batch` reached
through its PPO caller, with `megatron.core.mpu` answering as one rank, judged by the oracle.

The verdicts asserted here were derived by reading slime's code (HEAD 624b824a8 and 166441911):
`compute_advantages_and_returns` adds the scalar reward to the last response token
(`token_level_rewards[-1] += reward`) and calls GAE over every response token without the loss
mask. So masked values and rewards leak (poison), the score is lost behind a masked observation
tail at gamma = 0 (score-kept), masked positions get non-zero advantages, an empty response crashes
(`[-1]` of an empty tensor), and rows without masks are plain GAE. slime has no PyPI release: every
target test needs MASKFUZZ_REPOS=slime=/path (skipped otherwise); the adapter's own logic is
tested offline.
"""

from __future__ import annotations

import sys
import time
import types

import pytest
import torch

from maskfuzz.oracles.case import Case
from maskfuzz.oracles.kinds.dispatch import judge
from maskfuzz.targets.adapters.base import NotPresent
from maskfuzz.targets.runtime.client import LoadSpec, Worker, WorkerLoadError, WorkerSkip
from maskfuzz.targets.runtime.repos import parse_repos
from maskfuzz.targets.runtime.session import open_target
from maskfuzz.targets.slime import calls as slime_calls
from maskfuzz.targets.slime import declare as slime

HEAD = "624b824a8"
OLDER = "166441911"

OBS_TAIL = Case.build(trainable=[[1, 1, 1, 0, 0]], score=[1.0], gamma=0.0, lam=0.95)
GAP = Case.build(trainable=[[1, 0, 0, 1]], values=[[0.5, 9, 9, 0.25]], score=[1.0], gamma=0.9, lam=0.8)
ALL_MASKED = Case.build(
    trainable=[[1, 1, 1], [0, 0, 0]], values=[[0.1, 0.2, 0.3], [5, 5, 5]], score=[1.0, 2.0], gamma=0.9, lam=0.9
)
MASKED_REWARD = Case.build(  # a KL reward under the mask reaches the trainable token before it
    trainable=[[1, 0]], token_rewards=[[0.0, 4.0]], values=[[0.5, 0.0]], gamma=0.5, lam=0.5
)
PLAIN = Case.build(
    trainable=[[1, 1, 1], [1, 1, 1]],
    token_rewards=[[0.5, 0.1, 0.25], [0, 0, 1]],
    values=[[0.1, 0.3, 0.2], [1, 2, 3]],
    score=[1.0, -1.0],
    gamma=0.9,
    lam=0.7,
)
EMPTY_RESPONSE = Case.build(
    trainable=[[1, 1], [0, 0]], attention=[[1, 1], [0, 0]], score=[1.0, 1.0], gamma=0.9, lam=0.9
)


def failed(run, case: Case) -> set[str]:
    return {v.property for v in judge(run, case, slime.SPEC.declared()) if v.failed}


def triaged(h, case: Case, prop: str):
    """`case`'s failure of `prop` on the open target `h`, triaged as replay does it (the case, its projection into
    the pipeline domain; no witness search): its mechanism, reach, promise and severity."""
    from maskfuzz.fuzz.engine import Finding
    from maskfuzz.fuzz.triage import judge_finding

    verdict = next(v for v in judge(h.run, case, h.declared, only=(prop,)) if v.property == prop)
    assert verdict.failed, (prop, verdict.message)
    f = Finding(target="slime", pin="", resolved="", property=prop, case=case, verdict=verdict)
    judge_finding(h.run, f, h.declared, examples=0)
    return f


# ---------------------------------------------------------------------------------------------
# Offline: the registry entry and the adapter's own logic.
# ---------------------------------------------------------------------------------------------
def test_spec_declares_compressed_git_pins_and_float64_left_out_with_the_reason():
    spec = slime.SPEC
    assert spec.contract == "compressed" and spec.package is None and "fla" in spec.deny
    assert [p.rev for p in spec.pins] == [HEAD, OLDER] and all(p.kind == "git" for p in spec.pins)
    assert spec.domain.restrictions() == {"dtypes": slime.FLOAT64_WHY}
    assert "megatron" in spec.stand_ins and "slime" not in spec.stand_ins


def test_rollout_data_expresses_token_rewards_as_k1_kl_exactly():
    case = Case.build(trainable=[[1, 0, 1]], token_rewards=[[0.1, -3.0, 1e-7]], values=[[1, 2, 3]], score=[2.0])
    s = slime_calls.Samples.from_case(case, "cpu")
    data = slime_calls.rollout_data(s)
    args = slime_calls.caller_args(0.9, 0.8)
    # what the caller computes: -kl_coef * (log_probs - ref_log_probs) with kl_loss_type k1
    kl = data["log_probs"][0].float() - data["ref_log_probs"][0].float()
    assert torch.equal(-args.kl_coef * kl, case.inputs()["token_rewards"][0])
    assert args.kl_loss_type == "k1" and args.normalize_advantages is False and (args.gamma, args.lambd) == (0.9, 0.8)
    assert data["rewards"] == [2.0] and data["loss_masks"][0].tolist() == [1, 0, 1]


def test_caller_args_answer_none_for_unknown_switches_and_record_them():
    slime_calls.CallerArgs.unknown.clear()
    args = slime_calls.caller_args(1.0, 1.0)
    assert args.some_new_feature_flag is None and args.use_opd is False
    assert slime_calls.CallerArgs.unknown == {"some_new_feature_flag"}
    slime_calls.CallerArgs.unknown.clear()


def test_vanilla_rebinds_the_caller_and_needs_the_flag():
    def gae(total_lengths, response_lengths, values_list, rewards_list, gamma, lambd, chunked=True):
        return chunked

    caller_module = types.ModuleType("fake_loss")
    caller_module.get_advantages_and_returns_batch = gae
    assert slime_calls.bind_flavour([caller_module], gae, "default") == []
    notes = slime_calls.bind_flavour([caller_module], gae, "vanilla")
    assert caller_module.get_advantages_and_returns_batch(1, 2, 3, 4, 5, 6) is False and "fake_loss" in notes[0]

    def no_flag(total_lengths, response_lengths, values_list, rewards_list, gamma, lambd):
        return None

    with pytest.raises(NotPresent, match="no `chunked` flag"):
        slime_calls.bind_flavour([caller_module], no_flag, "vanilla")
    with pytest.raises(NotPresent, match="unknown entry"):
        slime_calls.entry_name("chunky")


def _fake_slime(root, loss_body: str) -> None:
    """A slime-shaped tree: the real function is never reached by these tests."""
    for pkg in ("slime", "slime/utils", "slime/backends", "slime/backends/megatron_utils"):
        (root / pkg).mkdir(parents=True, exist_ok=True)
        (root / pkg / "__init__.py").write_text("")
    (root / "slime/utils/ppo_utils.py").write_text(
        "def get_advantages_and_returns_batch(total_lengths, response_lengths, values_list, rewards_list, gamma,"
        " lambd, chunked=True):\n    raise AssertionError('not reached')\n"
    )
    (root / "slime/backends/megatron_utils/loss.py").write_text(loss_body)


def test_the_caller_sees_the_single_rank_mpu_and_a_broken_caller_fails_at_load(tmp_path):
    # the caller reports what mpu answered through rollout_data; the smoke run at load reads it
    _fake_slime(
        tmp_path,
        "from megatron.core import mpu\n"
        "def compute_advantages_and_returns(args, rollout_data):\n"
        "    assert mpu.__maskfuzz_state__ and mpu.get_context_parallel_world_size() == 1\n"
        "    assert mpu.get_context_parallel_rank() == 0 and mpu.is_pipeline_last_stage()\n"
        "    rollout_data['advantages'] = [v * 0 for v in rollout_data['values']]\n"
        "    rollout_data['returns'] = rollout_data['advantages']\n",
    )
    spec = slime.SPEC
    with Worker(LoadSpec(spec.adapter, str(tmp_path), None, spec.stand_ins, spec.deny, spec.own)) as w:
        assert w.info["stand_ins_used"] == ["megatron"]
        adv, ret = w(PLAIN)
        assert adv.shape == (2, 3) and not adv.any()
    _fake_slime(tmp_path, "def compute_advantages_and_returns(args, rollout_data):\n    pass\n")
    with pytest.raises(WorkerLoadError, match="without setting rollout_data"):
        Worker(LoadSpec(spec.adapter, str(tmp_path), None, spec.stand_ins, spec.deny, spec.own)).start()


def test_a_tree_without_the_function_is_not_present(tmp_path):
    (tmp_path / "slime").mkdir()
    (tmp_path / "slime" / "__init__.py").write_text("")
    spec = slime.SPEC
    with pytest.raises(WorkerSkip, match="slime.utils.ppo_utils"):
        Worker(LoadSpec(spec.adapter, str(tmp_path), None, spec.stand_ins, spec.deny, spec.own)).start()


# ---------------------------------------------------------------------------------------------
# The real code at git pins (needs a slime clone or mirror).
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def repos():
    found = parse_repos(None)
    if "slime" not in found:
        pytest.skip("slime has no release: set MASKFUZZ_REPOS=slime=/path/to/slime-clone-or-mirror")
    return found


@pytest.fixture(scope="module", params=[HEAD, OLDER])
def pinned(request, repos):
    with open_target(f"slime@{request.param}", repos=repos) as h:
        yield h


@pytest.mark.needs_mirror
def test_loads_through_the_caller_with_the_mpu_state(pinned):
    assert pinned.info["where"] == (
        "slime/utils/ppo_utils.py::get_advantages_and_returns_batch via "
        "slime/backends/megatron_utils/loss.py::compute_advantages_and_returns"
    )
    assert "megatron" in pinned.info["stand_ins_used"] and "slime" not in pinned.info["stand_ins_used"]
    assert any("megatron.core.mpu answers CP size 1" in n for n in pinned.info["notes"])


@pytest.mark.needs_mirror
def test_score_goes_to_the_last_response_token(pinned):
    assert pinned.run(OBS_TAIL)[0].tolist() == [[0.0, 0.0, 0.0, 0.0, 1.0]]
    assert failed(pinned.run, OBS_TAIL) == {"score-kept", "masked-zero", "reference"}


@pytest.mark.needs_mirror
def test_masked_values_and_rewards_leak(pinned):
    assert {"poison", "gap-invariance", "masked-zero", "reference"} == failed(pinned.run, GAP)
    adv, _ = pinned.run(MASKED_REWARD)
    # A0 = 0 + 0.5 * V1 - V0 + 0.25 * A1, A1 = 4 - 0 (the masked reward): 0 - 0.5 + 1 = 0.5
    assert adv[0].tolist() == pytest.approx([0.5, 4.0], rel=1e-6)
    assert "poison" in failed(pinned.run, MASKED_REWARD)


@pytest.mark.needs_mirror
def test_all_masked_row_is_trained_on_but_independent(pinned):
    adv, _ = pinned.run(ALL_MASKED)
    assert (adv[1] != 0).all()
    assert failed(pinned.run, ALL_MASKED) == {"masked-zero", "gap-invariance"}


@pytest.mark.needs_mirror
def test_rows_without_masks_are_plain_gae_and_an_empty_response_crashes(pinned):
    assert failed(pinned.run, PLAIN) == {"gap-invariance"}
    v = {x.property: x for x in judge(pinned.run, EMPTY_RESPONSE, slime.SPEC.declared())}
    assert v["no-crash"].failed and "IndexError" in v["no-crash"].message


@pytest.mark.needs_mirror
def test_vanilla_entry_agrees_with_the_chunked_default(repos):
    with open_target(f"slime@{HEAD}", repos=repos) as chunked, open_target(f"slime:vanilla@{HEAD}", repos=repos) as h:
        assert any("chunked=False" in n for n in h.info["notes"])
        for case in (GAP, PLAIN, OBS_TAIL):
            serial, scan = h.run(case)[0].flatten().tolist(), chunked.run(case)[0].flatten().tolist()
            assert serial == pytest.approx(scan, rel=1e-5, abs=1e-6)


@pytest.mark.needs_mirror
def test_short_fuzz_at_head_finds_the_leak_and_the_lost_score(repos):
    from maskfuzz.fuzz.engine import fuzz_target

    with open_target(f"slime@{HEAD}", repos=repos) as h:
        t0 = time.monotonic()
        result = fuzz_target(
            h.run, h.declared, target="slime", pin=HEAD, max_examples=150, seed=0, properties=("poison", "score-kept")
        )
        print(f"\n[slime] fuzz {HEAD}: {time.monotonic() - t0:.1f} s, {result.examples} examples", file=sys.stderr)
    assert {f.property for f in result.findings} == {"poison", "score-kept"}


def test_pipeline_domain_cites_every_narrowing_and_rejects_what_slime_never_builds():
    for pin in (HEAD, OLDER):
        dom = slime.SPEC.pipeline_at(pin)
        assert dom is not None and dom.cited() == []
        assert sorted(dom.restrictions()) == ["dtypes", "empty_rows", "left_padding", "nonfinite_poison"]
        assert pin in dom.why["dtypes"]
        ok = Case.build(trainable=[[1, 0, 1, 0]], token_rewards=[[0, 2, 0, 3]], values=[[1, 9, 1, 9]], score=[1.0])
        assert dom.rejects(ok) is None  # gaps, a masked tail, masked KL and masked values are all reachable
        assert dom.rejects(ALL_MASKED) is None
        assert "dtype" in dom.rejects(Case.build(trainable=[[1, 1]], dtype="bfloat16"))
        assert "left-padded" in dom.rejects(Case.build(trainable=[[0, 1]], attention=[[0, 1]]))
        inf = Case.build(trainable=[[1, 0]], values=[[0.0, float("inf")]])
        assert "NaN / inf" in dom.rejects(inf)
    assert slime.SPEC.pipeline_at(OLDER) is slime.PIPELINE_166441911


# ---------------------------------------------------------------------------------------------
# Entries beyond GAE (targets/slime/calls_kinds.py) at HEAD 624b824a8 (need the mirror).
#
# Verdicts derived by reading slime:
# * grpo: RolloutManager._post_process_rewards (slime/ray/rollout.py:608-633) normalises in float32
#   per group of n_samples_per_prompt, or over the whole batch when the sample count is not
#   n_samples_per_prompt * rollout_batch_size (:619-623): unequal groups mix (group-isolation); rows
#   with an all-zero loss mask (remove_sample, :680-681) still count (pad-invariance); a singleton
#   group has std NaN (no-crash). get_grpo_returns broadcasts to every response token.
# * kl / kl-k3 / kl-low-var: compute_approx_kl (slime/utils/ppo_utils.py:11-51) is exact.
# * whiten: distributed_masked_whiten (slime/utils/distributed_utils.py:111-171): one-pass float32
#   variance, NaN for constant advantages (0.9 x 7), large offsets lose the variance.
# * reinforce++: get_reinforce_plus_plus_returns (slime/utils/ppo_utils.py:371-445) masks the KL
#   (:416, unlike miles) so finite masked KL does not leak; NaN under the mask spreads through the
#   chunked matmul (api only); a fully masked row asserts (:415), which remove_sample builds.
# ---------------------------------------------------------------------------------------------
import math  # noqa: E402

from kind_support import failed_properties, handle_cache, verdicts_by_property  # noqa: E402

kind_failed = failed_properties


@pytest.fixture(scope="module")
def kinds_open(repos):
    with handle_cache(lambda entry: open_target(f"slime:{entry}@{HEAD}", repos=repos)) as get:
        yield get


def test_kind_entries_are_declared_with_cited_pipelines():
    spec = slime.SPEC
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
        "agg-rollout-mean": "loss-aggregation",
        "value-loss": "value-loss",
        "policy-loss": "policy-loss",
        "policy-gspo": "policy-loss",
        "gae-kl": "gae",
        "reinforce++-kl": "returns",
    }
    for entry in kinds:
        for pin in (HEAD, "166441911"):
            dom = spec.for_entry(entry).pipeline_at(pin)
            assert dom is not None and dom.cited() == [], (entry, pin)
    assert spec.for_entry("reinforce++").contract == "dense"


@pytest.mark.needs_mirror
def test_grpo_groups_by_count_else_the_whole_batch(kinds_open):
    h = kinds_open("grpo")
    assert h.info["where"].startswith("slime/ray/rollout.py:608::RolloutManager._post_process_rewards")
    case = Case.build(trainable=[[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 0]], score=[1, 0, 2, 4], group=[0, 0, 1, 1])
    (adv,) = h.run(case)
    a = 0.5 / (0.5**0.5 + 1e-6)
    assert adv.flatten().tolist() == pytest.approx([a] * 3 + [-a] * 3 + [-a] * 3 + [a] * 3, rel=1e-6)
    mixed = Case.build(trainable=[[1]] * 4, score=[1, 2, 3, 10], group=[0, 0, 0, 1])
    (adv,) = h.run(mixed)
    std = (50 / 3) ** 0.5
    assert adv[:, 0].tolist() == pytest.approx([(r - 4) / (std + 1e-6) for r in (1, 2, 3, 10)], rel=1e-6)
    assert {"group-isolation", "reference"} <= kind_failed(h, mixed)


@pytest.mark.needs_mirror
def test_kl_low_var_clamps_and_k3_does_not(kinds_open):
    case = Case.build(trainable=[[1, 1, 0]], extra={"logp": [[-1.0, -21.0, 5.0]], "ref_logp": [[-1.5, -1.0, 0.0]]})
    for entry, expect in (
        ("kl", [0.5, -20.0]),
        ("kl-k2", [0.125, 200.0]),  # (log r)^2 / 2, unclamped
        ("kl-k3", [math.exp(-0.5) - 0.5, math.exp(20) - 21]),
        ("kl-low-var", [math.exp(-0.5) - 0.5, 10.0]),
    ):
        h = kinds_open(entry)
        (kl,) = h.run(case)
        assert kl[0, :2].tolist() == pytest.approx(expect, rel=1e-5), entry
        assert kind_failed(h, case) == set(), entry


@pytest.mark.needs_mirror
def test_whiten_nan_on_constant_advantages(kinds_open):
    h = kinds_open("whiten")
    case = Case.build(trainable=[[1, 1, 0], [1, 0, 1]], extra={"x": [[1.0, 2.0, 9.0], [3.0, 5.0, 4.0]]})
    (out,) = h.run(case)
    s = (5 / 3 + 1e-8) ** 0.5
    assert out.flatten().tolist() == pytest.approx([-1.5 / s, -0.5 / s, 6.5 / s, 0.5 / s, 2.5 / s, 1.5 / s], rel=1e-5)
    (out,) = h.run(Case.build(trainable=[[1] * 7], extra={"x": [[0.9] * 7]}))
    assert torch.isnan(out).all()


@pytest.mark.needs_mirror
def test_reinforce_pp_masks_the_kl_but_asserts_on_a_removed_sample(kinds_open):
    h = kinds_open("reinforce++")
    case = Case.build(trainable=[[1, 0, 1, 0]], token_rewards=[[0.5, 3, 0.25, 2]], score=[1.0], gamma=0.5)
    adv, _ = h.run(case)
    # masked KL dropped, masked tokens still steps (dense): G3 = 0, G2 = 1.25, G1 = 0.625, G0 = 0.8125
    assert adv[0].tolist() == pytest.approx([0.5 + 0.5 * 0.625, 0.625, 1.25, 0.0])
    # no twin adds a sample to the batch any more (pad-invariance adds a padding column only, kinds.md): nothing fails
    assert kind_failed(h, case) == set()
    removed = Case.build(trainable=[[1, 1], [0, 0]], score=[1.0, 1.0])
    with pytest.raises(Exception, match="fully masked"):
        h.run(removed)
    # the crash is a defect: a removed sample (remove_sample, slime/ray/rollout.py:680-681) is cited as produced
    f = triaged(h, removed, "no-crash")
    assert (f.promise.id, f.reach, f.severity) == ("universal:no-crash", "pipeline", "medium"), f.reach_how


SLIME_KIND_FUZZ = {  # entry -> (must fail, may fail)
    # the whole-batch fallback of unequal groups mixes them (group-isolation); all-masked rows counted in their group
    # are slime's documented variant (empty_rows "counted", arguments.py:1437), and pad-invariance adds no sample
    "grpo": ({"group-isolation"}, {"no-crash", "affine", "reference"}),
    "kl-low-var": (set(), set()),
    "whiten": ({"no-crash"}, {"poison-nonfinite", "pad-invariance", "permutation", "affine", "reference"}),
    "reinforce++": ({"no-crash"}, {"poison-nonfinite"}),
}


@pytest.mark.needs_mirror
@pytest.mark.parametrize("entry", list(SLIME_KIND_FUZZ))
def test_kind_short_fuzz(kinds_open, entry):
    from maskfuzz.fuzz.engine import fuzz_target

    h = kinds_open(entry)
    must, may = SLIME_KIND_FUZZ[entry]
    t0 = time.monotonic()
    res = fuzz_target(h.run, h.declared, target=f"slime:{entry}", pin=HEAD, max_examples=40, seed=0)
    print(f"\n[slime:{entry}] fuzz 40: {time.monotonic() - t0:.1f} s", file=sys.stderr)
    found = {f.property for f in res.findings}
    assert must <= found <= must | may, found


# ---------------------------------------------------------------------------------------------
# loss-aggregation: loss_function with get_sum_of_sample_mean's reducer, Megatron's scaling, one step.
# Verdicts derived by reading slime (624b824a8): the per-sample mean divides by step_global_batch_size,
# the step's rollout count, so a removed (all-masked) sample still counts (loss.py:1353-1359,
# dp_schedule.py:137-141); --calculate-per-token-loss counts an all-masked sample as one token
# (num_tokens = sum(clamp_min(mask.sum(), 1)), loss.py:1317); NaN under the mask leaks through x * mask
# (cp_utils.py:76, :86). Everything is split-invariant: the denominators are per step.
# ---------------------------------------------------------------------------------------------
TWO_BY_THREE = dict(trainable=[[1, 1, 0], [1, 0, 0]], extra={"loss": [[1.0, 2.0, 9.0], [4.0, 9.0, 9.0]]})
REMOVED = dict(trainable=[[1, 1], [0, 0]], extra={"loss": [[1.0, 3.0], [5.0, 5.0]]}, split=[0, 1])


def _loss_run(h, **kw):
    loss, grad = h.run(Case.build(**kw))
    return float(loss[0, 0]), grad


def test_loss_entries_declare_canonical_modes():
    spec = slime.SPEC
    modes = {e: spec.for_entry(e).variant for e in slime.LOSS_ENTRIES}
    assert modes == {
        "agg-seq-mean-token-mean": {"mode": "seq-mean-token-mean"},
        "agg-token-mean": {"mode": "token-mean"},
        "agg-rollout-mean": {"mode": "prompt-mean"},
    }


@pytest.mark.needs_mirror
@pytest.mark.parametrize("ranks", [1, 2])
def test_per_sample_mean_over_two_micro_batches(kinds_open, ranks):
    h = kinds_open("agg-seq-mean-token-mean")
    assert h.info["where"] == "slime/backends/megatron_utils/loss.py::loss_function"
    loss, grad = _loss_run(h, **TWO_BY_THREE, split=[0, 1], ranks=ranks)
    assert loss == pytest.approx((1.5 + 4.0) / 2)  # mean over samples of each sample's token mean
    assert grad.flatten().tolist() == pytest.approx([0.25, 0.25, 0.0, 0.5, 0.0, 0.0])
    # a removed sample: step_global_batch_size still counts it, (2 + 0) / 2 instead of 2
    loss, grad = _loss_run(h, **REMOVED)
    assert loss == pytest.approx(1.0) and grad[0].tolist() == pytest.approx([0.25, 0.25])
    assert kind_failed(h, Case.build(**REMOVED)) >= {"reference"}


@pytest.mark.needs_mirror
def test_per_token_loss_counts_a_removed_sample_as_one_token(kinds_open):
    h = kinds_open("agg-token-mean")
    loss, grad = _loss_run(h, **TWO_BY_THREE, split=[0, 1], ranks=2)
    assert loss == pytest.approx(7.0 / 3.0) and grad[0, 0].item() == pytest.approx(1.0 / 3.0)
    loss, grad = _loss_run(h, **REMOVED)
    assert loss == pytest.approx(4.0 / 3.0) and grad[0].tolist() == pytest.approx([1 / 3, 1 / 3])


@pytest.mark.needs_mirror
def test_rollout_mean_pools_the_samples_of_one_rollout(kinds_open):
    h = kinds_open("agg-rollout-mean")
    assert "rollout_mask_sums" in " ".join(h.info["notes"])
    loss, grad = _loss_run(h, **TWO_BY_THREE, group=[7, 7], split=[0, 1])  # one rollout: its token mean
    assert loss == pytest.approx(7.0 / 3.0) and grad[1, 0].item() == pytest.approx(1.0 / 3.0)
    loss, _ = _loss_run(h, **TWO_BY_THREE, group=[0, 1], split=[0, 1])  # two rollouts: the per-sample mean
    assert loss == pytest.approx(2.75)


@pytest.mark.needs_mirror
def test_rollout_mean_is_not_present_at_the_older_pin(repos):
    with pytest.raises(Exception, match="no per-rollout denominators"):
        with open_target(f"slime:agg-rollout-mean@{OLDER}", repos=repos):
            pass


SLIME_LOSS_FUZZ = {  # entry -> (must fail, may fail)
    # the removed sample counted by the step's denominators is `reference` (a defect, arguments.py:1434); pad-invariance
    # adds a padding column only, never a sample (kinds.md), so it no longer fails
    "agg-seq-mean-token-mean": ({"reference"}, {"poison-nonfinite"}),
    "agg-token-mean": ({"reference"}, {"poison-nonfinite"}),
    "agg-rollout-mean": (set(), {"poison-nonfinite", "reference"}),
}


@pytest.mark.needs_mirror
@pytest.mark.parametrize("entry", list(SLIME_LOSS_FUZZ))
def test_loss_short_fuzz(kinds_open, entry):
    from maskfuzz.fuzz.engine import fuzz_target

    h = kinds_open(entry)
    must, may = SLIME_LOSS_FUZZ[entry]
    t0 = time.monotonic()
    res = fuzz_target(h.run, h.declared, target=f"slime:{entry}", pin=HEAD, max_examples=20, seed=0)
    print(f"\n[slime:{entry}] fuzz 20: {time.monotonic() - t0:.1f} s", file=sys.stderr)
    found = {f.property for f in res.findings}
    assert must <= found <= must | may, found  # split-invariance, permutation, empty-step hold


# ---------------------------------------------------------------------------------------------
# Options and truncated rows (read at 624b824a8): --normalize-advantages whitens in the caller
# (loss.py:819, distributed_masked_whiten: Bessel, eps 1e-8 under the rsqrt); the rollout reads
# --disable-grpo-std-normalization and --advantage-estimator (rollout.py:613-627); a cut row is terminal
# in GAE (zero value after the last response token, ppo_utils.py:531-538, 707-710).
# ---------------------------------------------------------------------------------------------
def test_options_and_truncation_are_declared_with_citations():
    spec = slime.SPEC
    assert [o.name for o in spec.declared("default").options] == ["normalize_advantages"]
    assert spec.declared("default").truncation.terminal and "ppo_utils.py:531" in spec.truncation.cite
    grpo = spec.declared("grpo")
    assert [o.name for o in grpo.options] == ["advantage_estimator", "grpo_std_normalization", "normalize_advantages"]
    assert grpo.truncation is None and spec.declared("kl").options == () and spec.declared("whiten").options == ()
    assert [o.name for o in spec.declared("reinforce++").options] == ["normalize_advantages"]
    for entry in spec.entries:
        for opt in spec.declared(entry).options:
            assert ".py:" in opt.cite and (opt.effect or opt.name == "rollout_temperature"), (entry, opt.name)


@pytest.mark.needs_mirror
def test_gae_normalize_advantages_whitens_and_a_cut_row_is_terminal(repos):
    with open_target(f"slime@{HEAD}", repos=repos) as h:
        # two one-token rows, V = 0, scores +1 / -1, gamma = lam = 1: A = [1], [-1]; whitened with
        # mean 0 and unbiased var (1 + 1) / (2 - 1) = 2: +-1 / sqrt(2 + 1e-8) = +-0.70710678
        two = Case.build(trainable=[[1], [1]], values=[[0.0], [0.0]], score=[1.0, -1.0], gamma=1.0, lam=1.0)
        adv, ret = h.run(two.replace(options={"normalize_advantages": True}))
        assert adv[:, 0].tolist() == pytest.approx([0.70710678, -0.70710678], rel=1e-6)
        assert ret[:, 0].tolist() == [1.0, -1.0]  # the returns are not whitened
        assert "reference" not in kind_failed(h, two.replace(options={"normalize_advantages": True}))
        # a cut row, V = [1, 2], score 1, gamma 0.5, lam 1, bootstrap 4 (never read): terminal,
        # delta_1 = 1 - 2 = -1, delta_0 = 0.5 * 2 - 1 = 0: A = [0 + 0.5 * -1, -1] = [-0.5, -1]
        cut = Case.build(
            trainable=[[1, 1]], values=[[1.0, 2.0]], score=[1.0], gamma=0.5, lam=1.0, truncated=[True], bootstrap=[4.0]
        )
        assert h.run(cut)[0][0].tolist() == pytest.approx([-0.5, -1.0])
        assert kind_failed(h, cut) == {"gap-invariance"}  # as PLAIN: the inserted masked token leaks


@pytest.mark.needs_mirror
def test_grpo_options_through_the_rollout_and_the_caller(kinds_open):
    h = kinds_open("grpo")
    case = Case.build(trainable=[[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 0]], score=[1, 0, 2, 4], group=[0, 0, 1, 1])
    # Dr.GRPO / REINFORCE++-baseline: r - mean_g only: [1, 0] -> +-0.5, [2, 4] -> -+1
    for opts in ({"grpo_std_normalization": False}, {"advantage_estimator": "reinforce_plus_plus_baseline"}):
        (adv,) = h.run(case.replace(options=opts))
        assert adv[:, 0].tolist() == [0.5, -0.5, -1.0, 1.0], opts
        assert kind_failed(h, case.replace(options=opts)) == set()  # no twin adds a sample to a group any more
    # cispo takes grpo's path (rollout.py:614, :627, loss.py:763): grpo's output, judged by its reference
    cispo = case.replace(options={"advantage_estimator": "cispo"})
    assert h.run(cispo)[0].tolist() == h.run(case)[0].tolist()
    assert kind_failed(h, cispo) == set()
    # a group of one without the std: r - mean_g = 0 (the effect's singleton="zero")
    single = Case.build(trainable=[[1]], score=[1000.0], group=[0], options={"grpo_std_normalization": False})
    assert h.run(single)[0].tolist() == [[0.0]] and "reference" not in kind_failed(h, single)
    # + --normalize-advantages: the token advantages 0.5 x2, -0.5 x3, -1 x1, 1 x2 whitened over the 8
    # trainable tokens: mean 0.5 / 8 = 0.0625, unbiased var (4.25 - 8 * 0.0625^2) / 7 = 0.602678...
    opts = {"advantage_estimator": "reinforce_plus_plus_baseline", "normalize_advantages": True}
    (adv,) = h.run(case.replace(options=opts))
    s = ((4.25 - 8 * 0.0625**2) / 7 + 1e-8) ** 0.5
    assert adv[:, 0].tolist() == pytest.approx([(r - 0.0625) / s for r in (0.5, -0.5, -1.0, 1.0)], rel=1e-5)
    assert kind_failed(h, case.replace(options=opts)) == set()


@pytest.mark.needs_mirror
def test_grpo_never_draws_cispo_where_the_pin_lacks_it(repos):
    with open_target(f"slime:grpo@{OLDER}", repos=repos) as h:
        (opt,) = [o for o in h.declared.options if o.name == "advantage_estimator"]
        assert "cispo" not in opt.values and "reinforce_plus_plus_baseline" in opt.values
        assert any("cispo not drawn, absent at this pin" in n for n in h.info["notes"]), h.info["notes"]


@pytest.mark.needs_mirror
def test_reinforce_pp_normalize_advantages_whitens_the_returns(kinds_open):
    h = kinds_open("reinforce++")
    case = Case.build(
        trainable=[[1, 0, 1, 0]],
        token_rewards=[[0.5, 3, 0.25, 2]],
        score=[1.0],
        gamma=0.5,
        options={"normalize_advantages": True},
    )
    adv, ret = h.run(case)
    # returns [0.8125, 0.625, 1.25, 0] (as above); trainable 0.8125 and 1.25: mean 1.03125, unbiased
    # var 2 * 0.21875^2 = 0.095703125; every position whitened: (G - 1.03125) / sqrt(var + 1e-8)
    s = (0.095703125 + 1e-8) ** 0.5
    assert adv[0].tolist() == pytest.approx([(g - 1.03125) / s for g in (0.8125, 0.625, 1.25, 0.0)], rel=1e-5)
    assert ret[0].tolist() == pytest.approx([0.8125, 0.625, 1.25, 0.0])
    assert kind_failed(h, case) == set()  # no twin adds an all-masked sample any more (kinds.md, pad-invariance)


@pytest.mark.needs_mirror
def test_short_fuzz_with_options_checks_every_value(kinds_open):
    from maskfuzz.fuzz.engine import fuzz_target

    h = kinds_open("grpo")
    t0 = time.monotonic()
    res = fuzz_target(
        h.run, h.declared, target="slime:grpo", pin=HEAD, max_examples=24, seed=0, properties=("reference",)
    )
    print(f"\n[slime:grpo] options fuzz 24: {time.monotonic() - t0:.1f} s", file=sys.stderr)
    for name, per in res.options_checked.items():
        assert all(n > 0 for n in per.values()), (name, per)
    assert set(res.options_checked) == {"advantage_estimator", "grpo_std_normalization", "normalize_advantages"}
    for f in res.findings:  # verdicts on slime's math, never the adapter refusing an option
        assert "option" not in f.verdict.message and "adapter" not in f.verdict.message, f.verdict.message
    assert {f.property for f in res.findings} <= {"reference"}


# ---------------------------------------------------------------------------------------------
# value-loss: train_critic's --loss-type value_loss (actor.py:407) through loss_function, which dispatches to
# value_loss_function (loss.py:1176; 166441911 :658). Verdicts by reading slime (624b824a8): max((v_c - R)^2,
# (v - R)^2) with no 1/2 (:1212-1216), reduced by the actor's sum_of_sample_mean, then divided by
# step_global_batch_size (:1353-1359): a removed (all-masked) sample still counts, as for agg-seq-mean-token-mean;
# --calculate-per-token-loss counts it as one token (:1317); NaN under the mask leaks through x * mask
# (cp_utils.py:76). The denominators are per step: split-invariant; the clip binds only through max (clip-bound).
# ---------------------------------------------------------------------------------------------
# row 0: v - v_old = 0.1 inside the clip 0.2: (1 - 0)^2 = 1, dl/dv = 2 (1 - 0) = 2; v = 0.5, v_old = 2 is clipped
# to v_c = 1.8: max(1.8^2, 0.5^2) = 3.24, dl/dv = 0 (the clamp saturates); row 1: v = v_old = -1, R = 1: 4,
# dl/dv = 2 (-1 - 1) = -4; 100 and 7 under the mask.
# per-sample mean: ((1 + 3.24) / 2 + 4) / 2 = 3.06; grads 2 / (2 * 2) = 0.5, 0, -4 / 2 = -2
# per-token: (1 + 3.24 + 4) / 3 = 2.74667; grads 2 / 3, 0, -4 / 3
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
# a removed sample next to row 0 of VALUE_STEP: its per-sample mean 2.12 over the 2 samples of the step, 1.06;
# per-token: 4.24 / (2 + clamp_min(0, 1)) = 1.41333; the reference is 2.12 either way
VALUE_REMOVED = Case.build(
    trainable=[[1, 1], [0, 0]],
    extra={"v": [[1.0, 0.5], [5.0, 5.0]], "v_old": [[0.9, 2.0], [5.0, 5.0]], "ret": [[0.0, 0.0], [0.0, 0.0]]},
    split=[0, 1],
    dtype="float32",
)


def _value_by_hand(h):
    assert h.info["where"] == (
        "slime/backends/megatron_utils/loss.py::value_loss_function via slime/backends/megatron_utils/loss.py::"
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
    assert "reference" not in kind_failed(h, per_token)
    # --value-clip 10: row 0's second token is inside the clip, (0.5 - 0)^2 = 0.25, dl/dv = 1:
    # ((1 + 0.25) / 2 + 4) / 2 = 2.3125; grads 2 / 4, 1 / 4, -2
    wide = VALUE_STEP.replace(options={"value_clip": 10.0})
    loss, grad = h.run(wide)
    assert float(loss[0, 0]) == pytest.approx(2.3125, rel=1e-6)
    assert grad.flatten().tolist() == pytest.approx([0.5, 0.25, 0.0, -2.0, 0.0, 0.0], rel=1e-6)
    assert "reference" not in kind_failed(h, wide)
    loss, _ = h.run(VALUE_REMOVED)
    assert float(loss[0, 0]) == pytest.approx(1.06, rel=1e-6)
    loss, _ = h.run(VALUE_REMOVED.replace(options={"calculate_per_token_loss": True}))
    assert float(loss[0, 0]) == pytest.approx(4.24 / 3, rel=1e-6)
    assert {"reference"} <= kind_failed(h, VALUE_REMOVED)


def test_value_loss_is_declared_with_its_options():
    d = slime.SPEC.declared("value-loss")
    assert d.kind == "value-loss" and d.variant == {"clip": 0.2, "half": False, "mode": "seq-mean-token-mean"}
    clip, per_token, temperature = d.options
    assert [(o.name, o.default) for o in d.options] == [
        ("value_clip", 0.2),
        ("calculate_per_token_loss", False),
        ("rollout_temperature", 1.0),
    ]
    assert temperature.effect == {} and "loss.py:69-70" in temperature.cite  # the critic must not see it
    assert "arguments.py:907" in clip.cite and "loss.py:1212-1213" in clip.cite
    assert per_token.effect == {True: {"variant": {"mode": "token-mean"}}}
    assert slime.SPEC.for_entry("value-loss").domain.dtypes == ("float32",)


@pytest.mark.needs_mirror
@pytest.mark.parametrize("pin", [HEAD, OLDER])
def test_value_loss_by_hand(repos, pin):
    with open_target(f"slime:value-loss@{pin}", repos=repos) as h:
        _value_by_hand(h)


# --rollout-temperature 0.7 (the rollout's sampling temperature): 166441911's get_responses divides the value logits
# too (loss.py:69-70), so the predictions are v / 0.7: row 0: 10/7 vs old 0.9 is clipped to 1.1, max(1.21, 100/49)
# = 100/49 (unclipped), dl/dv = 2 (10/7) / 0.7 = 200/49; 5/7 vs old 2 -> 1.8: 3.24, 0; row 1: -10/7 vs -1 -> -1.2,
# R = 1: max(4.84, (17/7)^2 = 289/49) = 289/49, dl/dv = 2 (-17/7) / 0.7 = -340/49.
# L = ((100/49 + 3.24) / 2 + 289/49) / 2 = 4.2691837, grads 200/49 / 4 = 50/49, 0, -340/49 / 2 = -170/49.
# #1928 (d9d149dce) passes apply_temperature=False (loss.py:643 at 624b824a8): the T = 1 numbers, 3.06.
TEMPERATURE = {"rollout_temperature": 0.7}


@pytest.mark.needs_mirror
def test_value_loss_rollout_temperature_reached_the_critic_before_1928(repos):
    hot = VALUE_STEP.replace(options=TEMPERATURE)
    with open_target(f"slime:value-loss@{OLDER}", repos=repos) as h:
        loss, grad = h.run(hot)
        assert float(loss[0, 0]) == pytest.approx(((100 / 49 + 3.24) / 2 + 289 / 49) / 2, rel=1e-6)
        assert grad.flatten().tolist() == pytest.approx([50 / 49, 0.0, 0.0, -170 / 49, 0.0, 0.0], rel=1e-5)
        assert "reference" in kind_failed(h, hot)
    with open_target(f"slime:value-loss@{HEAD}", repos=repos) as h:
        loss, grad = h.run(hot)
        assert float(loss[0, 0]) == pytest.approx(3.06, rel=1e-6)
        assert "reference" not in kind_failed(h, hot)


@pytest.mark.needs_mirror
def test_value_loss_short_fuzz(kinds_open):
    from maskfuzz.fuzz.engine import fuzz_target

    h = kinds_open("value-loss")
    t0 = time.monotonic()
    res = fuzz_target(h.run, h.declared, target="slime:value-loss", pin=HEAD, max_examples=12, seed=0)
    print(f"\n[slime:value-loss] fuzz 12: {time.monotonic() - t0:.1f} s", file=sys.stderr)
    found = {f.property for f in res.findings}
    must = {"reference"}  # the removed sample counted; split-invariance, permutation, clip-bound hold
    assert must <= found <= must | {"poison-nonfinite", "masked-zero"}, found  # no no-crash: no tool error


# ---------------------------------------------------------------------------------------------
# policy-loss: the actor's --loss-type policy_loss (the default, arguments.py:915-918) through loss_function, which
# dispatches to policy_loss_function (loss.py:934, :1328-1329; 166441911 :442, :809-810): ppo_kl = old - logp (:1033),
# compute_policy_loss(ppo_kl, advantages, eps_clip, eps_clip_high, eps_clip_c=args.eps_clip_c) (:1038-1044;
# 166441911 :535 without eps_clip_c), sum_of_sample_mean (x_i * loss_mask_i, cp_utils.py:76), / step_global_batch_size
# (:1353-1359). Nothing masks ppo_kl or the advantages before the reducer: a NaN log-prob under the mask gives a NaN
# token loss, and NaN * 0 = NaN. --eps-clip 0.2, --eps-clip-high = eps_clip (arguments.py:899-900, :1876-1877).
# ---------------------------------------------------------------------------------------------
# row 0: r = 1, A = 1: l = -1, dl/dlogp = -1; r = e^0.5, A = 1: the clip binds at 1.2, l = -1.2, 0; r = e^-0.5, A = 1:
# the low clip does not bind (-r > -0.8), l = -e^-0.5, slope -e^-0.5; masked. row 1: r = e^0.5, A = -1: the unclipped
# term is the larger, l = e^0.5, slope e^0.5; r = 1, A = 2: -2, -2.
# per-sample mean: ((-1 - 1.2 - e^-0.5) / 3 + (e^0.5 - 2) / 2) / 2; grads / (3 * 2) and / (2 * 2)
POLICY_EXTRA = {
    "logp": [[-1.0, -0.5, -1.5, 7.0], [-0.5, -2.0, 0.0, 0.0]],
    "old_logp": [[-1.0, -1.0, -1.0, -1.0], [-1.0, -2.0, 0.0, 0.0]],
    "adv": [[1.0, 1.0, 1.0, 5.0], [-1.0, 2.0, 0.0, 0.0]],
}
POLICY_STEP = Case.build(trainable=[[1, 1, 1, 0], [1, 1, 0, 0]], extra=POLICY_EXTRA, split=[0, 1], dtype="float32")
POLICY_NAN = POLICY_STEP.replace(
    extra={**POLICY_STEP.extra, "logp": torch.where(POLICY_STEP.trainable, POLICY_STEP.extra["logp"], float("nan"))}
)
_E, _EI = math.exp(0.5), math.exp(-0.5)
POLICY_LOSS = ((-1 - 1.2 - _EI) / 3 + (_E - 2) / 2) / 2
POLICY_GRAD = [-1 / 6, 0.0, -_EI / 6, 0.0, _E / 4, -0.5, 0.0, 0.0]
# row 1's first token at r = e^1.5 (logp 0.5): with A = -1 the unclipped term e^1.5 = 4.48 is above the dual clip's
# -c A = 3 (--eps-clip-c 3): l = 3, slope 0 where the clip reaches compute_policy_loss (HEAD :1043), not at 166441911
POLICY_DUAL = Case.build(
    trainable=[[1, 1, 1, 0], [1, 1, 0, 0]],
    extra={**POLICY_EXTRA, "logp": [POLICY_EXTRA["logp"][0], [0.5, -2.0, 0.0, 0.0]]},
    split=[0, 1],
    dtype="float32",
    options={"eps_clip_c": 3.0},
)
DUAL_BINDS = ((-1 - 1.2 - _EI) / 3 + (3.0 - 2) / 2) / 2
DUAL_IGNORED = ((-1 - 1.2 - _EI) / 3 + (math.exp(1.5) - 2) / 2) / 2


def test_policy_loss_is_declared_with_the_default_clip_and_its_options():
    d = slime.SPEC.declared("policy-loss")
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
    assert "arguments.py:900" in d.options[0].cite and "loss.py:1043" in d.options[1].cite
    assert d.options[1].effect == {3.0: {"variant": {"dual_clip": 3.0}}}
    assert slime.SPEC.for_entry("policy-loss").domain.dtypes == ("float32",)


@pytest.mark.needs_mirror
@pytest.mark.parametrize("pin", [HEAD, OLDER])
def test_policy_loss_by_hand(repos, pin):
    with open_target(f"slime:policy-loss@{pin}", repos=repos) as h:
        assert h.info["where"] == (
            "slime/backends/megatron_utils/loss.py::policy_loss_function via slime/backends/megatron_utils/loss.py::"
            "loss_function"
        )
        for ranks in (1, 2):
            loss, grad = h.run(POLICY_STEP.replace(ranks=ranks))
            assert float(loss[0, 0]) == pytest.approx(POLICY_LOSS, rel=1e-6)
            assert grad.flatten().tolist() == pytest.approx(POLICY_GRAD, rel=1e-6, abs=1e-7)
        v = verdicts_by_property(h, POLICY_STEP)
        for prop in ("reference", "poison", "split-invariance", "permutation", "masked-zero"):
            assert v[prop].status == "pass", (prop, v[prop].message)
        # NaN under the mask: the token loss is NaN and (x_i * loss_mask_i).sum() keeps it (cp_utils.py:76)
        loss, grad = h.run(POLICY_NAN)
        assert math.isnan(float(loss[0, 0])) and math.isnan(grad[0, 3].item())
        per_token = POLICY_STEP.replace(options={"calculate_per_token_loss": True})  # the token mean over 5 tokens
        loss, grad = h.run(per_token)
        assert float(loss[0, 0]) == pytest.approx((-1 - 1.2 - _EI + _E - 2) / 5, rel=1e-6)
        assert grad.flatten().tolist() == pytest.approx(
            [g * (6 if i < 4 else 4) / 5 for i, g in enumerate(POLICY_GRAD)]
        )
        high = POLICY_STEP.replace(options={"eps_clip_high": 0.28})  # the binding clip moves to 1.28
        assert float(h.run(high)[0][0, 0]) == pytest.approx(((-1 - 1.28 - _EI) / 3 + (_E - 2) / 2) / 2, rel=1e-6)
        for case in (per_token, high):
            assert "reference" not in kind_failed(h, case)
        # --eps-clip-c 3: HEAD passes it (loss.py:1043), 166441911 drops it (loss.py:535)
        loss, grad = h.run(POLICY_DUAL)
        if pin == HEAD:
            assert float(loss[0, 0]) == pytest.approx(DUAL_BINDS, rel=1e-6) and grad[1, 0].item() == 0.0
            assert "reference" not in kind_failed(h, POLICY_DUAL)
        else:
            assert float(loss[0, 0]) == pytest.approx(DUAL_IGNORED, rel=1e-6)
            assert grad[1, 0].item() == pytest.approx(math.exp(1.5) / 4, rel=1e-6)
            assert "reference" in kind_failed(h, POLICY_DUAL)


@pytest.mark.needs_mirror
def test_policy_loss_short_fuzz(kinds_open):
    from maskfuzz.fuzz.engine import fuzz_target

    h = kinds_open("policy-loss")
    t0 = time.monotonic()
    res = fuzz_target(h.run, h.declared, target="slime:policy-loss", pin=HEAD, max_examples=12, seed=0)
    print(f"\n[slime:policy-loss] fuzz 12: {time.monotonic() - t0:.1f} s", file=sys.stderr)
    found = {f.property for f in res.findings}
    # the removed sample counted by step_global_batch_size (loss.py:1353-1359), as for value-loss (pad-invariance,
    # reference); the mask applied by multiplication after compute_policy_loss, nothing masked before it (:1033-1044,
    # cp_utils.py:76): NaN under the mask, or a masked log-ratio > 88.7 whose float32 exp overflows, gives
    # inf * 0 = NaN (poison-nonfinite, no-crash, empty-step, masked-zero)
    must = set()  # the removed sample counted is `reference` (test_policy_loss_by_hand); 12 examples may miss it
    may = {"reference", "poison-nonfinite", "no-crash", "empty-step", "masked-zero"}
    assert must <= found <= must | may, found


# ---------------------------------------------------------------------------------------------
# KL in the reward (gae-kl, reinforce++-kl): the trainer's compute_advantages_and_returns (loss.py:704 at
# 624b824a8, :222 at 166441911) with log_probs / ref_log_probs, kl_loss_type k1, kl_coef 0.1. Verdicts by reading
# slime: compute_approx_kl(log_probs, ref_log_probs, "k1") = logp - ref at every response token (ppo_utils.py:28-31);
# ppo shapes -kl_coef * kl unmasked and adds the score to the last RESPONSE token (loss.py:772-777), then GAE over
# every response token without the mask: the KL of a masked token leaks (gap-invariance, reference, masked-reward-
# leak at reach pipeline: the actor's and the reference's log-probs of a tool token differ); reinforce_plus_plus
# masks the KL by multiplication (ppo_utils.py:416: finite masked KL dropped, NaN * 0 = NaN) and asserts on a fully
# masked row (:415).
# ---------------------------------------------------------------------------------------------
_NAN = float("nan")
KL_REWARD = dict(  # row 0: a NaN log-prob under the mask; row 1: a masked tail whose KL is -2 (k1)
    trainable=[[1, 0, 1], [1, 1, 0]],
    score=[1.0, 2.0],
    gamma=0.5,
    lam=1.0,
    extra={"logp": [[-1.0, _NAN, -2.0], [-0.5, -1.0, -3.0]], "ref_logp": [[-1.5, -1.0, -1.0], [-1.0, -1.0, -1.0]]},
)
KL_REWARD_FINITE = Case.build(**{**KL_REWARD, "extra": {**KL_REWARD["extra"], "logp": [[-1.0, -7.0, -2.0]] * 2}})


def test_kl_reward_entries_are_declared_with_the_trainer_defaults():
    spec = slime.SPEC
    for entry, kind, contract in (("gae-kl", "gae", "compressed"), ("reinforce++-kl", "returns", "dense")):
        d = spec.declared(entry, HEAD)
        assert (d.kind, d.contract) == (kind, contract)
        assert d.variant == {"kl_reward": {"coef": 0.1, "estimator": "k1", "clamp_d": None, "clamp": None}}
        assert not d.domain.token_rewards and "float64" not in d.domain.dtypes
        for pin in (HEAD, OLDER):
            dom = spec.declared(entry, pin).pipeline
            assert dom.cited() == [] and not dom.masked_logprobs and not dom.token_rewards, (entry, pin)
    assert spec.declared("gae-kl").truncation is not None and spec.declared("reinforce++-kl").truncation is None


@pytest.mark.needs_mirror
@pytest.mark.parametrize("pin", [HEAD, OLDER])
def test_kl_reward_by_hand(repos, pin):
    case = Case.build(**KL_REWARD)
    # row 1: kl = logp - ref = [0.5, 0, -2]; r = -0.1 kl = [-0.05, 0, 0.2]
    with open_target(f"slime:reinforce++-kl@{pin}", repos=repos) as h:
        adv, ret = h.run(case)
        # masked KL dropped (ppo_utils.py:416), the score at the last trainable token: G = [-0.05 + 0.5 * 2, 2, 0]
        assert adv[1].tolist() == pytest.approx([0.95, 2.0, 0.0], rel=1e-6) and torch.equal(adv[1], ret[1])
        # NaN * loss_mask (ppo_utils.py:416) reaches every earlier return (HEAD's chunked matmul, :430, every one)
        assert torch.isnan(adv[0, :2]).all()
        assert kind_failed(h, KL_REWARD_FINITE) == set()  # no twin adds an all-masked sample any more
    with open_target(f"slime:gae-kl@{pin}", repos=repos) as h:
        adv, ret = h.run(case)
        # every response token a step, the masked KL 0.2 kept and the score on the last response token (masked):
        # r = [-0.05, 0, 2.2], V = 0, lam 1 -> A = [0.5, 1.1, 2.2]; the reference is [0.95, 2.0, 0]
        assert adv[1].tolist() == pytest.approx([0.5, 1.1, 2.2], rel=1e-6) and torch.equal(adv[1], ret[1])
        assert torch.isnan(adv[0]).all()
        assert {"reference", "masked-zero"} <= kind_failed(h, KL_REWARD_FINITE)


SLIME_KL_FUZZ = {  # entry -> (must fail, may fail) in 20 unshrunk examples at HEAD
    # GAE without the loss mask (loss.py:779-781): masked values and the masked KL (:772-777) leak (poison, reference,
    # gap-invariance, masked-zero); an empty response crashes on token_level_rewards[-1] (:777, no-crash, api); NaN
    # under the mask (poison-nonfinite, api)
    "gae-kl": ({"poison"}, {"reference", "gap-invariance", "masked-zero", "no-crash", "poison-nonfinite"}),
    # the assert on a fully masked row (ppo_utils.py:415, no-crash), NaN * loss_mask (:416, poison-nonfinite)
    "reinforce++-kl": ({"no-crash"}, {"poison-nonfinite"}),
}


@pytest.mark.needs_mirror
@pytest.mark.parametrize("entry", list(SLIME_KL_FUZZ))
def test_kl_reward_short_fuzz(repos, entry):
    from maskfuzz.fuzz.engine import fuzz_target

    must, may = SLIME_KL_FUZZ[entry]
    with open_target(f"slime:{entry}@{HEAD}", repos=repos) as h:
        t0 = time.monotonic()
        res = fuzz_target(h.run, h.declared, target=f"slime:{entry}", pin=HEAD, max_examples=20, seed=0, shrink=False)
        print(f"\n[slime:{entry}] fuzz 20 (unshrunk): {time.monotonic() - t0:.1f} s", file=sys.stderr)
    found = {f.property for f in res.findings}
    assert must <= found <= must | may, found


# ---------------------------------------------------------------------------------------------
# The promise model (issue 24): what slime's own code produces (Domain.produces) and what it promises at each pin
# (Promise, quoted with file:line). A finding is a defect only where it breaks a universal invariant with a witness
# built from produced features, or one of slime's own promises; everything else is a fact.
# ---------------------------------------------------------------------------------------------
from maskfuzz.oracles.promises import broken  # noqa: E402

PRODUCED = ("gaps", "masked_real_tail", "leading_mask", "all_masked_rows", "masked_rewards", "token_rewards",
            "masked_values", "truncated_rows")  # fmt: skip


def test_pipeline_domains_cite_what_slime_produces():
    import re

    for pin in (HEAD, OLDER):
        for entry in slime.SPEC.entries:
            dom = slime.SPEC.for_entry(entry).pipeline_at(pin)
            for feature, cite in dom.produces.items():
                assert re.search(r"[\w/.-]+\.\w+:\d+", cite) and f"slime {pin}" in cite, (entry, pin, feature)
        usable = slime.SPEC.pipeline_at(pin).produced_only()
        assert all(getattr(usable, f) for f in PRODUCED), pin
        assert not usable.uneven_splits and usable.dtypes == ("float32",)  # GAE takes no split; float32 cited
        loss = slime.SPEC.for_entry("agg-token-mean").pipeline_at(pin).produced_only()
        assert loss.uneven_splits and loss.all_masked_rows and loss.gaps and not loss.nonfinite_poison
    # the GAE witness of the corpus: a response ending on an observation with a critic value and a KL reward under it
    tail = Case.build(trainable=[[1, 0]], token_rewards=[[0.0, 100.0]], values=[[0.0, 100.0]], score=[1.0])
    assert slime.SPEC.pipeline_at(HEAD).unproduced(tail) == []


EXPECTED_PROMISES = {  # entry -> promise ids at HEAD (166441911: the same words at their own lines)
    "default": ["upstream:slime/backends/megatron_utils/loss.py:710-712"],
    "grpo": ["upstream:slime/backends/megatron_utils/loss.py:710-712"],
    "kl": ["upstream:slime/utils/ppo_utils.py:19-20"],
    "reinforce++": ["upstream:slime/backends/megatron_utils/loss.py:710-712", "upstream:slime/utils/ppo_utils.py:381"],
    "agg-seq-mean-token-mean": ["upstream:slime/utils/arguments.py:1434", "upstream:docs/en/get_started/usage.md:206"],
    "agg-rollout-mean": ["upstream:slime/utils/arguments.py:1434", "upstream:slime/utils/types.py:102-105"],
    "value-loss": ["upstream:slime/utils/arguments.py:1434", "upstream:docs/en/get_started/usage.md:206"],
    "policy-loss": ["upstream:slime/utils/arguments.py:901-906", "upstream:slime/utils/arguments.py:1434",
                    "upstream:docs/en/get_started/usage.md:206"],
}  # fmt: skip


def test_promises_are_declared_per_pin_and_cover_what_they_say():
    spec = slime.SPEC
    for entry, ids in EXPECTED_PROMISES.items():
        assert [p.id for p in spec.declared(entry, HEAD).promises] == ids, entry
    assert [p.id for p in spec.declared("value-loss", OLDER).promises] == [
        "upstream:slime/utils/arguments.py:1242",
        "upstream:slime/utils/arguments.py:219-222",  # --rollout-temperature reached the critic before #1928
        "upstream:docs/en/get_started/usage.md:190",
    ]
    assert spec.declared("agg-rollout-mean", OLDER).promises[-1].id == "upstream:slime/utils/arguments.py:1242"
    # what each promise turns into a defect, and what stays a fact
    at = lambda e, pin=HEAD: spec.declared(e, pin).promises  # noqa: E731
    assert broken("reference", "unexplained", at("kl")).id.endswith("ppo_utils.py:19-20")
    assert broken("all-trainable", "precision", at("reinforce++")).id.endswith("ppo_utils.py:381")
    assert broken("reference", "masked-statistics", at("whiten")).id.endswith("loss.py:710-712")
    assert broken("reference", "masked-statistics", at("agg-seq-mean-token-mean")).id.endswith("arguments.py:1434")
    assert broken("reference", "variant-mismatch", at("policy-loss", OLDER)).id.endswith("arguments.py:735-740")
    assert broken("masked-zero", "masked-nonzero", at("default")) is None  # no consumer reads masked advantages
    assert broken("reference", "variant-mismatch", at("grpo")) is None  # grpo's variants are semantics
    assert spec.declared("grpo").variant == {"empty_rows": "counted"}  # arguments.py:1437: the documented design


def _quoted(root_or_repo, pin: str, path: str, lines: str) -> str:
    import subprocess

    text = subprocess.run(
        ["git", "-C", str(root_or_repo), "show", f"{pin}:{path}"], check=True, capture_output=True, text=True
    ).stdout.splitlines()
    lo, _, hi = lines.partition("-")
    out = []
    for line in text[int(lo) - 1 : int(hi or lo)]:
        line = line.strip().lstrip("#").strip()
        out.append(line[1:] if line.startswith('"') else line)
    return " ".join(" ".join(out).split())


@pytest.mark.needs_mirror
def test_every_promise_quotes_the_words_at_its_line(repos):
    for entry in slime.SPEC.entries:
        for pin in (HEAD, OLDER):
            for p in slime.SPEC.declared(entry, pin).promises:
                path, lines = p.id.removeprefix("upstream:").rsplit(":", 1)
                words = " ".join(p.text.split())
                assert words in _quoted(repos["slime"], pin, path, lines), (entry, pin, p.id)


@pytest.mark.needs_mirror
def test_the_gae_leaks_are_defects_with_a_cited_pipeline_witness(pinned):
    # the corpus cases: a response ending on an observation whose KL reward and critic value leak (poison), the score
    # on that observation (score-kept); the masked advantage is a semantics fact (no consumer reads it unmasked)
    leak = Case.build(trainable=[[1, 0]], token_rewards=[[0.0, 100.0]], values=[[0.0, 100.0]], score=[1.0])
    f = triaged(pinned, leak, "poison")
    assert (f.promise.id, f.mechanism, f.reach, f.severity) == (
        "universal:poison", "masked-value-bootstrap", "pipeline", "high"
    ), f.reach_how  # fmt: skip
    lost = leak.replace(gamma=0.0)
    f = triaged(pinned, lost, "score-kept")
    assert (f.promise.id, f.reach) == ("universal:score-kept", "pipeline")
    f = triaged(pinned, lost, "masked-zero")
    assert f.promise is None and f.fact == "semantics"
    f = triaged(pinned, Case.build(trainable=[[1, 1], [0, 0]], attention=[[1, 1], [0, 0]], score=[1.0, 1.0]),
                "no-crash")  # fmt: skip
    assert f.promise is None and f.fact == "robustness"  # an empty response: slime never builds one


@pytest.mark.needs_mirror
def test_the_masked_kl_in_gae_is_a_defect(repos):
    # 5ffcd4b4d5dd6a65: the gap twin's masked token carries the KL of a log-prob 0.1 nats off the reference
    case = Case.build(trainable=[[1, 1]], score=[1.0], gamma=1.0, lam=1.0,
                      extra={"logp": [[-0.1, -0.1]], "ref_logp": [[0.0, 0.0]]})  # fmt: skip
    for pin in (HEAD, OLDER):
        with open_target(f"slime:gae-kl@{pin}", repos=repos) as h:
            f = triaged(h, case, "gap-invariance")
            assert (f.promise.id, f.mechanism, f.reach) == ("universal:poison", "masked-reward-leak", "pipeline")


@pytest.mark.needs_mirror
def test_a_removed_sample_counted_in_the_loss_breaks_the_filter_promise(kinds_open, repos):
    removed = Case.build(**REMOVED)
    f = triaged(kinds_open("agg-seq-mean-token-mean"), removed, "reference")
    assert (f.promise.id, f.mechanism, f.severity) == ("upstream:slime/utils/arguments.py:1434", "masked-statistics",
                                                       "medium")  # fmt: skip  # step_global_batch_size: a rescale
    # clamp_min(loss_mask.sum(), 1) counts it as one token: no neighbouring variant, the documented formula breaks
    f = triaged(kinds_open("agg-token-mean"), removed, "reference")
    assert f.promise.id == "upstream:docs/en/get_started/usage.md:206"
    f = triaged(kinds_open("value-loss"), VALUE_REMOVED, "reference")
    assert (f.promise.id, f.mechanism) == ("upstream:slime/utils/arguments.py:1434", "variant-mismatch")
    with open_target(f"slime:agg-seq-mean-token-mean@{OLDER}", repos=repos) as h:  # args.global_batch_size
        assert triaged(h, removed, "reference").promise.id == "upstream:slime/utils/arguments.py:1242"


@pytest.mark.needs_mirror
def test_the_older_pin_breaks_the_dual_clip_and_the_temperature_promises(repos):
    with open_target(f"slime:policy-loss@{OLDER}", repos=repos) as h:
        f = triaged(h, POLICY_DUAL, "reference")  # --eps-clip-c parsed, never passed (loss.py:535)
        assert (f.promise.id, f.mechanism) == ("upstream:slime/utils/arguments.py:735-740", "variant-mismatch")
    with open_target(f"slime:value-loss@{OLDER}", repos=repos) as h:
        f = triaged(h, VALUE_STEP.replace(options=TEMPERATURE), "reference")  # the value logits divided by T
        assert (f.promise.id, f.mechanism) == ("upstream:slime/utils/arguments.py:219-222", "unexplained")

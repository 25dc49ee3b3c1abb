"""The kinds beyond GAE (oracles/kinds): references against hand-computed values, the loop against
the vectorised form, each reference soaked against every property of its kind, and the mutant zoo
(tests/kind_zoo.py), each mutant caught by its property."""

from __future__ import annotations

import math

import kind_zoo as zoo
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from maskfuzz.fuzz.engine import fuzz_target
from maskfuzz.oracles.case import Case
from maskfuzz.oracles.declared import Declared
from maskfuzz.oracles.domain import Domain
from maskfuzz.oracles.kinds import (
    ALL_PROPERTIES,
    KINDS,
    group_advantage,
    kl,
    loss_aggregation,
    normalization,
    policy_loss,
    value_loss,
)
from maskfuzz.oracles.kinds.dispatch import judge
from maskfuzz.oracles.kinds.gae.properties import expected_outputs
from maskfuzz.oracles.kinds.strategies import kind_cases
from maskfuzz.oracles.strategies import Sizes

pytestmark = pytest.mark.xdist_group("kinds")

GROUPS = Case.build(
    trainable=[[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 0, 0]], score=[1.0, 0.0, 3.0, 5.0], group=[7, 7, 3, 7]
)


def _rows(variant):
    return [round(float(x), 6) for x in group_advantage.row_advantages_loop(GROUPS, variant)]


def test_leave_one_out_std_by_hand():
    """NeMo-RL's leave-one-out baseline with normalize_rewards: (r_i - mean of the others) over the
    unbiased std of the others (+ 1e-6) where it is above 0, else the raw difference."""
    case = Case.build(
        trainable=[[1]] * 8, score=[1.0, 0.0, 3.0, 1.0, 0.0, 5.0, 2.0, 2.0], group=[0, 0, 0, 1, 1, 2, 2, 2]
    )
    v = {"estimator": "rloo", "loo_std": True}
    got = group_advantage.row_advantages_loop(case, v).tolist()
    expected = [
        (1 - 1.5) / (math.sqrt(4.5) + 1e-6),  # others 0, 3
        (0 - 2.0) / (math.sqrt(2.0) + 1e-6),  # others 1, 3
        (3 - 0.5) / (math.sqrt(0.5) + 1e-6),  # others 1, 0
        1.0,  # a group of two: one other row, no std: the raw difference
        -1.0,
        3.0,  # others 2, 2: no variation, not sharpened
        (2 - 3.5) / (math.sqrt(4.5) + 1e-6),
        (2 - 3.5) / (math.sqrt(4.5) + 1e-6),
    ]
    assert got == pytest.approx(expected, rel=1e-12)
    assert group_advantage.row_advantages(case, v).tolist() == pytest.approx(expected, rel=1e-12)
    with pytest.raises(ValueError, match="rloo estimator only"):
        group_advantage.options({"loo_std": True})


def test_group_advantage_by_hand():
    # group 7 counts rows 0 and 1 (row 3 has no trainable token): scores 1, 0, mean 0.5, unbiased std sqrt(0.5)
    s = math.sqrt(0.5)
    assert _rows({}) == [round(0.5 / (s + 1e-6), 6), round(-0.5 / (s + 1e-6), 6), round(3 / (1 + 1e-6), 6), 0.0]
    assert _rows({"std": None}) == [0.5, -0.5, 3.0, 0.0]  # Dr.GRPO; a singleton keeps its score ("raw")
    assert _rows({"estimator": "rloo"}) == [1.0, -1.0, 3.0, 0.0]  # r_i - mean of the others
    assert _rows({"std": "biased", "singleton": "zero"}) == [
        round(0.5 / (0.5 + 1e-6), 6),
        round(-0.5 / (0.5 + 1e-6), 6),
        0.0,
        0.0,
    ]
    assert _rows({"eps_place": "var", "eps": 0.5}) == [
        round(0.5 / math.sqrt(1.0), 6),
        round(-0.5, 6),
        round(3 / math.sqrt(1.5), 6),
        0.0,
    ]
    assert _rows({"eps_place": "floor", "eps": 0.9}) == [round(0.5 / 0.9, 6), round(-0.5 / 0.9, 6), 3.0, 0.0]
    # std over the batch (rows 0, 1, 2: scores 1, 0, 3, mean 4/3, unbiased var 7/3), mean per group
    sb = math.sqrt(7 / 3) + 1e-6
    assert _rows({"std_level": "batch"}) == [round(0.5 / sb, 6), round(-0.5 / sb, 6), 0.0, 0.0]
    # REINFORCE++-baseline: Dr.GRPO shaping (0.5, -0.5, 3 for the singleton) broadcast to the 6 trainable tokens
    # (0.5, 0.5, -0.5, 3, 3, 3), then whitened over them (unbiased, eps 1e-8 under the sqrt)
    toks = [0.5, 0.5, -0.5, 3.0, 3.0, 3.0]
    m = sum(toks) / 6
    sd = math.sqrt(sum((x - m) ** 2 for x in toks) / 5 + 1e-8)
    white = group_advantage.reference(GROUPS, {"std": None, "whiten_tokens": True})["advantages"]
    assert white[0, :2].tolist() == pytest.approx([(0.5 - m) / sd] * 2) and white[2, 0] == pytest.approx((3 - m) / sd)
    assert white[0, 2] == 0 and white[3].abs().sum() == 0
    # the empty row counted (a framework that documents it): scores 1, 0, 5, mean 2, var 7
    assert _rows({"empty_rows": "counted"}) == [
        round(-1 / (math.sqrt(7) + 1e-6), 6),
        round(-2 / (math.sqrt(7) + 1e-6), 6),
        round(3 / (1 + 1e-6), 6),
        round(3 / (math.sqrt(7) + 1e-6), 6),
    ]
    # OPO: group 7's baseline weighted by trained tokens, (2 * 1 + 1 * 0) / 3; the singleton keeps its score
    assert _rows({"estimator": "opo"}) == [round(1 / 3, 6), round(-2 / 3, 6), 3.0, 0.0]
    # GPG: alpha = 3 counted rows / 2 with a non-zero score, times r - mean_g (the singleton's mean is 0)
    assert _rows({"estimator": "gpg", "std": None}) == [0.75, -0.75, 4.5, 0.0]
    # Pass@k: only group 7's best row gets (r_max - r_second) / (std + eps); a singleton has no second ("zero")
    assert _rows({"estimator": "passk", "singleton": "zero"}) == [round(1 / (s + 1e-6), 6), 0.0, 0.0, 0.0]
    assert _rows({"estimator": "passk", "std": None, "singleton": "zero"}) == [1.0, 0.0, 0.0, 0.0]
    adv = group_advantage.reference(GROUPS)["advantages"]
    assert adv[0, 2] == 0 and adv[3].abs().sum() == 0 and adv[0, 0] == adv[0, 1]
    with pytest.raises(ValueError, match="unknown group-advantage option"):
        group_advantage.options({"epsilon": 1e-6})


# rows: 2 tokens (group 7), 1 token (group 7), 3 tokens (group 3), empty (group 7); l at masked = 100
LOSSES = Case.build(
    trainable=[[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 0, 0]],
    group=[7, 7, 3, 7],
    extra={"loss": [[1.0, 3.0, 100.0], [2.0, 100.0, 100.0], [4.0, 5.0, 6.0], [100.0, 100.0, 100.0]]},
    dtype="float64",
)


@pytest.mark.parametrize(
    "variant, loss, weight",
    [  # weight: dL/dl at (0, 0), (1, 0), (2, 0); sum(l m) = 21 over N = 6 tokens, R = 3 non-empty rows
        ({}, 21 / 6, (1 / 6, 1 / 6, 1 / 6)),
        ({"mode": "token-sum"}, 21.0, (1.0, 1.0, 1.0)),
        ({"mode": "seq-mean-token-sum"}, (4 + 2 + 15) / 3, (1 / 3, 1 / 3, 1 / 3)),
        ({"mode": "seq-mean-token-mean"}, (2 + 2 + 5) / 3, (1 / 6, 1 / 3, 1 / 9)),
        ({"mode": "seq-mean-token-mean", "empty_rows": "counted"}, (2 + 2 + 5) / 4, (1 / 8, 1 / 4, 1 / 12)),
        ({"mode": "seq-mean-token-sum-norm", "constant": 4}, 21 / 12, (1 / 12, 1 / 12, 1 / 12)),
        ({"mode": "prompt-mean"}, ((1 + 3 + 2) / 3 + 15 / 3) / 2, (1 / 6, 1 / 6, 1 / 6)),
    ],
)
def test_loss_aggregation_by_hand(variant, loss, weight):
    for vectorised in (False, True):
        ref = loss_aggregation.reference(LOSSES, variant, vectorised=vectorised)
        assert torch.allclose(ref["loss"], torch.full((4, 3), loss, dtype=torch.float64)), (variant, ref["loss"])
        got = (float(ref["grad"][0, 0]), float(ref["grad"][1, 0]), float(ref["grad"][2, 0]))
        assert got == pytest.approx(weight), (variant, got)
        assert bool((ref["grad"][~LOSSES.trainable] == 0).all()) and bool((ref["grad"][3] == 0).all())


def test_loss_aggregation_of_a_k3_term_by_hand():
    """transform="k3": the aggregated value is expm1(l) - l, the gradient w expm1(l)."""
    case = Case.build(trainable=[[1, 1, 0]], extra={"loss": [[0.5, -1.0, 9.0]]}, dtype="float64")
    for vectorised in (False, True):
        ref = loss_aggregation.reference(case, {"transform": "k3"}, vectorised=vectorised)
        want = ((math.expm1(0.5) - 0.5) + (math.expm1(-1.0) + 1.0)) / 2
        assert ref["loss"][0, 0].item() == pytest.approx(want)
        assert ref["grad"][0].tolist() == pytest.approx([math.expm1(0.5) / 2, math.expm1(-1.0) / 2, 0.0])


def test_loss_aggregation_scoped_to_micro_batches_by_hand():
    """scope="micro-batch": micro-batch {0, 2} (rank 0) and {1} (rank 1), one each: token means 2 and 2 (rows 0
    and 2: losses 1, 3, 4, 5, 6 over 5 tokens = 19/5; row 1: 2), each over 1 micro-batch, averaged over 2 ranks."""
    split = LOSSES.replace(split=[0, 1, 0, 1], ranks=2)
    for vectorised in (False, True):
        ref = loss_aggregation.reference(split, {"scope": "micro-batch"}, vectorised=vectorised)
        assert ref["loss"][0, 0].item() == pytest.approx((19 / 5 + 2.0) / 2)
        assert ref["grad"][0, 0].item() == pytest.approx(1 / 10) and ref["grad"][1, 0].item() == pytest.approx(1 / 2)
    whole = loss_aggregation.reference(LOSSES, {"scope": "micro-batch"})  # no split: the step itself
    assert whole["loss"][0, 0].item() == pytest.approx(21 / 6)


def test_loss_aggregation_empty_step_and_microbatches():
    empty = LOSSES.replace(trainable=torch.zeros(4, 3, dtype=torch.bool))
    for mode in ("token-mean", "seq-mean-token-mean", "prompt-mean"):
        ref = loss_aggregation.reference(empty, {"mode": mode})
        assert bool((ref["loss"] == 0).all()) and bool((ref["grad"] == 0).all())
    split = LOSSES.replace(split=[3, 0, 3, 1], ranks=2)
    mbs = [(rank, rows.tolist()) for rank, rows in loss_aggregation.microbatches(split)]
    assert mbs == [(0, [1]), (1, [3]), (0, [0, 2])]
    with pytest.raises(ValueError, match="needs its constant"):
        loss_aggregation.options({"mode": "seq-mean-token-sum-norm"})


def test_the_step_driver_sums_microbatches_and_averages_ranks():
    """targets/adapters/loss_step.py: a global token mean with the dp multiplier (verl's form) over
    a split on two ranks equals the whole step; a per-micro-batch mean does not."""
    split = LOSSES.replace(split=[0, 1, 2, 1], ranks=2)
    whole = zoo.agg_correct(LOSSES)
    cut = zoo.agg_correct(split)
    assert torch.allclose(whole[0], cut[0]) and torch.allclose(whole[1], cut[1])
    assert float(cut[0][0, 0]) == pytest.approx(21 / 6)
    local = zoo.agg_per_microbatch_normaliser(split)
    assert float(local[0][0, 0]) != pytest.approx(21 / 6)


def _all_reduced_token_mean(rows, loss, mask, step, _once={}):  # noqa: B006 - per forked rank, one step each
    """A token mean whose normaliser is this rank's token count all-reduced over the gloo group once per
    step (as a framework that calls torch.distributed computes it before its micro-batch loop), times
    the ranks that average the gradients."""
    import torch.distributed as dist

    if id(step.case) not in _once:
        mine = [r for k, r in loss_aggregation.microbatches(step.case) if k == step.rank]
        tokens = torch.stack([step.mask[r].sum() for r in mine]).sum().to(torch.float64)
        dist.all_reduce(tokens)
        _once[id(step.case)] = tokens
    tokens = _once[id(step.case)]
    return torch.where(mask > 0, loss, torch.zeros_like(loss)).sum() / tokens.to(loss.dtype) * step.ranks


def test_the_gloo_step_driver_runs_the_collectives_on_real_ranks():
    """run_step_gloo: two forked ranks in a gloo group; an aggregator that all-reduces its normaliser
    itself gives the whole step's token mean and gradient, which the in-process driver (no process
    group) cannot run at all; a rank's exception reaches the caller with its type."""
    from maskfuzz.targets.adapters.loss_step import run_step, run_step_gloo

    split = LOSSES.replace(split=[0, 1, 2, 1], ranks=2)
    loss, grad = run_step_gloo(split, "cpu", _all_reduced_token_mean)
    whole = zoo.agg_correct(LOSSES)
    assert float(loss[0, 0]) == pytest.approx(21 / 6) and torch.allclose(grad, whole[1])
    with pytest.raises(ValueError, match="process group"):
        run_step(split, "cpu", _all_reduced_token_mean)

    def fails_on_rank_1(rows, loss, mask, step):
        if step.rank == 1:
            raise ZeroDivisionError("rank 1 has nothing to divide by")
        return _all_reduced_token_mean(rows, loss, mask, step)

    with pytest.raises(ZeroDivisionError, match="rank 1 has nothing"):
        run_step_gloo(split, "cpu", fails_on_rank_1, timeout=60)


def test_split_invariance_reports_what_the_global_normalisers_are_worth():
    """token-mean over rows [1, 2] (micro-batch 0) and [4, masked] (micro-batch 1): the whole step is
    7/3; each micro-batch normalised by itself and accumulated over 2 steps gives (1.5 + 4) / 2 =
    2.75, a relative change of (2.75 - 7/3) / (7/3) = 5/28, reported beside the passing verdict."""
    case = Case.build(
        trainable=[[1, 1], [1, 0]], extra={"loss": [[1.0, 2.0], [4.0, 0.0]]}, split=[0, 1], dtype="float64"
    )
    declared = Declared(kind="loss-aggregation", variant={"mode": "token-mean"})
    (verdict,) = [v for v in judge(zoo.agg_correct, case, declared) if v.property == "split-invariance"]
    assert verdict.status == "pass"
    assert verdict.info["relative_loss_change_without_global_normalisers"] == pytest.approx(5 / 28)
    (failed,) = [
        v for v in judge(zoo.agg_per_microbatch_normaliser, case, declared) if v.property == "split-invariance"
    ]
    assert failed.failed and "would move the loss by a relative 0.179" in failed.message


def test_value_loss_by_hand():
    """Three tokens, clip 0.5: inside the range (both squares equal), far from R (the plain square wins),
    moved towards R beyond the range (the clipped square wins: no gradient)."""
    case = Case.build(
        trainable=[[1, 1, 1, 0]],
        extra={"v": [[1.0, 3.0, 0.0, 9.0]], "v_old": [[0.75, 0.0, 2.0, 9.0]], "ret": [[0.0, 0.0, 0.0, 9.0]]},
        dtype="float64",
    )
    per = [0.5 * 1.0, 0.5 * 9.0, 0.5 * 1.5**2]  # v_c = 1.0, 0.5, 1.5
    for vectorised in (False, True):
        ref = value_loss.reference(case, {}, vectorised=vectorised)
        assert ref["loss"][0, 0].item() == pytest.approx(sum(per) / 3)
        assert ref["grad"][0].tolist() == pytest.approx([1.0 / 3, 3.0 / 3, 0.0, 0.0])
    plain = value_loss.reference(case, {}, clipped=False)
    assert plain["loss"][0, 0].item() == pytest.approx((0.5 + 4.5 + 0.0) / 3)
    torchrl_like = value_loss.reference(case, {"half": False, "clip": 10.0})
    assert torchrl_like["loss"][0, 0].item() == pytest.approx((1.0 + 9.0 + 0.0) / 3)


def test_policy_loss_by_hand():
    """Four tokens, clip 0.2, dual clip 3: r = 1 (the closed form -A), A > 0 with r beyond 1.2 (the clip
    binds: no gradient), A < 0 with r below 0.8 (the clipped term wins: no gradient), A < 0 with r = e^2
    (the dual clip caps -A r at -3 A: no gradient); a masked NaN changes nothing."""
    nan = float("nan")
    case = Case.build(
        trainable=[[1, 1, 1, 1, 0]],
        extra={
            "logp": [[-1.0, math.log(1.5) - 1.0, math.log(0.5) - 1.0, 1.0, nan]],
            "old_logp": [[-1.0, -1.0, -1.0, -1.0, nan]],
            "adv": [[2.0, 1.0, -1.0, -1.0, nan]],
        },
        dtype="float64",
    )
    per = [-2.0, -1.2, 0.8, 3.0]
    for vectorised in (False, True):
        ref = policy_loss.reference(case, {"dual_clip": 3.0}, vectorised=vectorised)
        assert ref["loss"][0, 0].item() == pytest.approx(sum(per) / 4)
        assert ref["grad"][0].tolist() == pytest.approx([-2.0 / 4, 0.0, 0.0, 0.0, 0.0])
    plain = policy_loss.reference(case, {})  # no dual clip: the last token is -A r = e^2, slope e^2
    assert plain["loss"][0, 0].item() == pytest.approx((-2.0 - 1.2 + 0.8 + math.exp(2.0)) / 4)
    assert plain["grad"][0, 3].item() == pytest.approx(math.exp(2.0) / 4)
    wide = policy_loss.reference(case, {"clip_high": 0.6})  # 1.5 is inside [0.8, 1.6]: -A r, slope -A r
    assert wide["grad"][0, 1].item() == pytest.approx(-1.5 / 4)
    rows = policy_loss.reference(case.replace(score=torch.tensor([-1.0])), {"advantages": "row"})
    assert rows["grad"][0, 0].item() == pytest.approx(1.0 / 4)  # A = -1 at r = 1


def test_kl_estimators_by_hand():
    case = Case.build(
        trainable=[[1, 1, 0]], extra={"logp": [[-1.0, -2.0, float("nan")]], "ref_logp": [[-1.5, -1.0, 0.0]]}
    )
    want = {  # d = logp - ref = 0.5, -1
        "k1": [0.5, -1.0],
        "abs": [0.5, 1.0],
        "mse": [0.125, 0.5],
        "low_var_kl": [math.exp(-0.5) - 1 + 0.5, math.e - 1 - 1],
    }
    for est, vals in want.items():
        got = kl.reference(case, {"estimator": est})["kl"]
        assert got[0, :2].tolist() == pytest.approx(vals) and got[0, 2] == 0
    clamped = kl.reference(case, {"estimator": "k3", "clamp": (-0.5, 0.5)})["kl"]
    assert clamped[0, 1] == 0.5
    assert kl.reference(case, {"estimator": "k1", "clamp_d": (-0.25, 0.25)})["kl"][0, :2].tolist() == [0.25, -0.25]


def test_normalization_by_hand():
    case = Case.build(trainable=[[1, 1, 0], [1, 0, 1]], extra={"x": [[1.0, 2.0, 9.0], [3.0, 0.0, 4.0]]}, group=[0, 1])
    # batch: 1, 2, 3, 4: mean 2.5, unbiased var 5/3
    out = normalization.reference(case, {"eps": 0.0})["out"]
    assert out[0, 0] == pytest.approx(-1.5 / math.sqrt(5 / 3)) and out[0, 2] == 0
    biased = normalization.reference(case, {"eps": 0.0, "unbiased": False})["out"]
    assert biased[1, 2] == pytest.approx(1.5 / math.sqrt(1.25))
    shifted = normalization.reference(case, {"eps": 0.0, "shift_mean": False})["out"]
    assert shifted[0, 0] == pytest.approx(-1.5 / math.sqrt(5 / 3) + 2.5)
    rows = normalization.reference(case, {"level": "row", "eps": 0.0})["out"]  # each row: two values
    assert rows[0, :2].tolist() == pytest.approx([-math.sqrt(0.5), math.sqrt(0.5)])
    std_eps = normalization.reference(case, {"eps": 1.0, "eps_place": "std"})["out"]
    assert std_eps[0, 0] == pytest.approx(-1.5 / (math.sqrt(5 / 3) + 1.0))
    floor = normalization.reference(case, {"eps": 4.0, "eps_place": "floor"})["out"]  # max(5/3, 4) = 4
    assert floor[0, 0] == pytest.approx(-1.5 / 2.0)
    mean = normalization.reference(case, {"output": "mean"})["out"]
    assert mean[1, 0] == 2.5 and mean[1, 1] == 0
    one = Case.build(trainable=[[1, 0]], extra={"x": [[1.0, 0.0]]})
    assert normalization.reference(one) is None  # an unbiased variance of one position is undefined


VARIANTS = {
    "group-advantage": [
        {},
        {"std": None},
        {"estimator": "rloo"},
        {"estimator": "rloo", "loo_std": True},
        {"std": "biased", "eps_place": "var", "singleton": "zero"},
        {"empty_rows": "counted"},
        {"eps_place": "floor", "eps": 1e-3},
        {"std_level": "batch", "eps": 1e-4, "singleton": "zero"},
        {"std": None, "whiten_tokens": True},
        {"estimator": "opo"},
        {"estimator": "gpg", "std": None},
        {"estimator": "passk", "singleton": "zero"},
        {"estimator": "passk", "std": None, "singleton": "zero"},
    ],
    "kl": [{"estimator": e} for e in ("k1", "abs", "k2", "k3")]
    + [{"estimator": "k3", "clamp": (-10.0, 10.0)}]
    + [{"estimator": "k3", "ratio": "token"}, {"estimator": "k3", "ratio": "token", "ratio_level": "sequence"}],
    "loss-aggregation": [
        {},
        {"mode": "token-sum"},
        {"mode": "seq-mean-token-sum"},
        {"mode": "seq-mean-token-mean"},
        {"mode": "seq-mean-token-sum-norm", "constant": 16},
        {"mode": "prompt-mean"},
        {"mode": "seq-mean-token-mean", "empty_rows": "counted"},
        {"transform": "k3"},
        {"scope": "micro-batch"},
        {"mode": "seq-mean-token-mean", "scope": "micro-batch"},
    ],
    "value-loss": [{}, {"half": False, "clip": 0.2}, {"mode": "seq-mean-token-mean"}],
    "policy-loss": [
        {},
        {"dual_clip": 3.0, "clip_high": 0.28},
        {"advantages": "row", "mode": "seq-mean-token-mean"},
        {"mode": "token-sum", "clip_low": 0.1},
    ],
    "normalization": [
        {"eps_place": "floor", "eps": 1e-3},
        {},
        {"level": "row"},
        {"level": "group", "unbiased": False},
        {"shift_mean": False, "eps_place": "std"},
        {"output": "mean"},
    ],
}
PAIRS = [(k, v) for k, vs in VARIANTS.items() for v in vs]


@pytest.mark.parametrize("kind,variant", PAIRS, ids=[f"{k}-{i}" for k, vs in VARIANTS.items() for i in range(len(vs))])
def test_loop_and_vectorised_references_agree(kind, variant):
    mod = KINDS[kind].module

    @settings(max_examples=60, deadline=None, database=None)
    @given(kind_cases(kind, sizes=Sizes(12, 64), nonfinite=False), st.just(0))
    def check(case, _):
        loop = mod.reference(case.replace(dtype="float64"), variant)
        vec = mod.reference(case.replace(dtype="float64"), variant, vectorised=True)
        assert (loop is None) == (vec is None)
        if loop is None:
            return
        for name in loop:
            assert torch.allclose(loop[name], vec[name], rtol=1e-9, atol=1e-9, equal_nan=True), name

    check()


def _reference_target(kind, variant):
    mod = KINDS[kind].module

    def run(case):
        ref = mod.reference(case, variant, vectorised=True)
        if ref is None:
            raise ValueError("undefined")
        return tuple(ref[n].to(case.torch_dtype) for n in mod.OUTPUTS)

    return run


SOAK = 150


@pytest.mark.parametrize("kind,variant", PAIRS, ids=[f"{k}-{i}" for k, vs in VARIANTS.items() for i in range(len(vs))])
def test_each_reference_passes_every_property_of_its_kind(kind, variant):
    """The reference as a target (vectorised, rounded to the case's dtype): SOAK examples, zero failures."""
    declared = Declared(kind=kind, variant=variant, masked_zero=True, documented_errors=("ValueError: undefined",))
    result = fuzz_target(
        _reference_target(kind, variant), declared, target="reference", max_examples=SOAK, sizes=Sizes(8, 32)
    )
    assert result.findings == [], [(f.property, f.verdict.message, f.case) for f in result.findings]
    assert result.generated >= SOAK
    batch_level = kind == "normalization" and normalization.options(variant)["level"] == "batch"
    batch_std = kind == "group-advantage" and (
        variant.get("std_level") == "batch" or variant.get("whiten_tokens") or variant.get("estimator") == "gpg"
    )
    never = {"group-isolation"} if batch_level or batch_std else set()  # n/a: no group-level statistic
    never.add("twin")  # the reference alone has no second implementation
    if variant.get("scope") == "micro-batch":
        never.add("split-invariance")  # n/a: a documented per-micro-batch normaliser
    assert all(result.checked[p] > 0 for p in KINDS[kind].properties if p not in never), result.checked


@pytest.mark.parametrize("fn", list(zoo.CATCHES), ids=lambda f: f.__name__)
def test_each_kind_mutant_is_caught_by_its_property(fn):
    kind, variant, want = zoo.CATCHES[fn]
    declared = Declared(kind=kind, variant=variant, masked_zero=True)
    result = fuzz_target(fn, declared, target=fn.__name__, max_examples=200, sizes=Sizes(6, 16))
    found = {f.property for f in result.findings}
    if not want:
        assert not found, [(f.property, f.verdict.message, f.case) for f in result.findings]
    assert set(want) <= found, (want, found)
    assert found <= set(ALL_PROPERTIES)


def test_a_crashing_twin_is_a_no_crash_finding_on_the_twin():
    def crash_on_two_groups(case):
        if case.group is not None and len(case.group.unique()) == 1 and case.shape[0] > 1:
            raise IndexError("one group only")
        return zoo.grpo_correct(case)

    case = Case.build(trainable=[[1], [1], [1]], score=[1.0, 2.0, 0.0], group=[0, 0, 1])
    declared = Declared(kind="group-advantage", masked_zero=True)
    verdicts = {v.property: v for v in judge(crash_on_two_groups, case, declared)}
    assert verdicts["no-crash"].failed and verdicts["no-crash"].case is not None
    assert verdicts["group-isolation"].status == "n/a"


def test_kind_findings_are_diagnosed_and_grouped_into_defects():
    """A masked reward summed into the score breaks `poison` only where the pipeline can put a reward under
    the mask: with a pipeline that writes only the score it is a robustness fact, no defect. Counting the
    rows without a trainable token is a variant (empty_rows='counted'): a semantics fact, never padding."""
    from maskfuzz.fuzz.triage import triage
    from maskfuzz.oracles.domain import Domain
    from maskfuzz.oracles.kinds.dispatch import diagnose

    declared = Declared(kind="group-advantage", variant=zoo.GA, masked_zero=True, own_inputs=True)
    biased = Case.build(trainable=[[1], [1], [1]], score=[0.0, 1.0, 3.0], group=[0, 0, 0])
    d = diagnose(zoo.grpo_biased_std, biased, declared, "reference")
    assert d.mechanism == "variant-mismatch" and "std='biased'" in d.evidence
    result = fuzz_target(zoo.grpo_unmasked_reward_sum, declared, target="zoo", max_examples=120, sizes=Sizes(6, 8))
    defects = triage(result, zoo.grpo_unmasked_reward_sum, declared, witness_examples=0)
    leak = next(f for f in result.findings if f.property == "poison")
    assert leak.mechanism == "masked-reward-leak" and leak.severity == "high" and leak.reach == "pipeline"
    assert leak.promise.id == "universal:poison" and len(defects) < len(result.findings)
    # a pipeline whose rewards are never non-zero under the mask cannot build the leak: a robustness fact
    scores_only = Domain(
        masked_rewards=False, why={"masked_rewards": "reward.py:1 score at the last token"},
        produces={"all_masked_rows": "filter.py:3"},
    )  # fmt: skip
    piped = Declared(kind="group-advantage", variant=zoo.GA, masked_zero=True, pipeline=scores_only)
    defects = triage(result, zoo.grpo_unmasked_reward_sum, piped, witness_examples=20)
    leak = next(f for f in result.findings if f.property == "poison")
    assert leak.reach == "api" and leak.promise is None and leak.fact == "robustness", leak.why_fact
    assert not any(d.mechanism == "masked-reward-leak" for d in defects)
    assert any(f.mechanism == "masked-reward-leak" and f.kind == "robustness" for f in result.facts)
    counted = fuzz_target(zoo.grpo_counts_empty_rows, piped, target="zoo", max_examples=120, sizes=Sizes(6, 8))
    assert counted.finding("pad-invariance") is None  # the padding twin adds no sample to a group
    triage(counted, zoo.grpo_counts_empty_rows, piped, witness_examples=20)
    ref = counted.finding("reference")
    assert ref.mechanism == "variant-mismatch" and "empty_rows='counted'" in ref.evidence, ref.evidence
    assert ref.promise is None and ref.fact == "semantics"


def test_cancellation_at_a_large_offset_is_precision_not_grouping():
    """A one-pass variance (E[x^2] - E[x]^2) breaks permutation and pad-invariance at large
    offsets through rounding alone: centring the inputs makes the property hold, so the root
    cause is `precision`, never statistics over masked rows or mixed groups."""
    from maskfuzz.oracles.kinds.dispatch import diagnose

    declared = Declared(kind="normalization", variant=zoo.WH, masked_zero=True)
    x = torch.tensor([[1000.0 + i % 3 for i in range(11)], [1001.0 - i % 2 for i in range(11)]])
    case = Case.build(trainable=torch.ones(2, 11), extra={"x": x})
    verdicts = {v.property: v for v in judge(zoo.whiten_one_pass, case, declared)}
    failing = [p for p in ("permutation", "pad-invariance", "reference") if verdicts[p].failed]
    assert failing, verdicts
    for prop in failing:
        assert diagnose(zoo.whiten_one_pass, case, declared, prop).mechanism == "precision"
    assert not any(v.failed for v in judge(zoo.whiten_correct, case, declared))


def test_a_row_weighted_by_its_place_is_row_order_not_group_mixing():
    """`permutation` names two mechanisms: a statistic that crosses group boundaries (it holds again with every
    row in one group) and an output that depends on where a row sits in the batch (it still fails). A policy loss
    that weighs each row by its index has no group to mix: its root cause is `row-order`."""
    from maskfuzz.oracles.kinds.dispatch import diagnose

    def by_place(logp, old, adv):
        place = torch.arange(1, logp.shape[0] + 1, dtype=logp.dtype)[:, None]
        return zoo._ppo(logp, old, adv) * place

    weighted = zoo._policy(by_place)  # the row index of its micro-batch: a one-micro-batch step here
    declared = Declared(kind="policy-loss", variant=zoo.PL)
    extra = {"logp": [[-0.5, -0.2], [-0.1, -0.3]], "old_logp": [[-0.4, -0.2], [-0.1, -0.3]], "adv": [[1.0, 1.0]] * 2}
    case = Case.build(trainable=[[1, 1], [1, 1]], extra=extra, group=[0, 1], dtype="float64")
    assert next(v for v in judge(weighted, case, declared) if v.property == "permutation").failed
    found = diagnose(weighted, case, declared, "permutation")
    assert found.mechanism == "row-order", found
    assert not next(v for v in judge(zoo.policy_correct, case, declared) if v.property == "permutation").failed

    ga = Declared(kind="group-advantage", variant=zoo.GA, masked_zero=True)
    mixed = Case.build(trainable=[[1]] * 6, score=[0.0, 1.0, 3.0, 2.0, 7.0, 4.0], group=[0, 0, 1, 1, 1, 1])
    assert next(v for v in judge(zoo.grpo_fixed_group_size, mixed, ga) if v.property == "permutation").failed
    assert diagnose(zoo.grpo_fixed_group_size, mixed, ga, "permutation").mechanism == "group-mixing"


def test_a_score_lost_on_an_observation_tail_is_diagnosed_as_such():
    from maskfuzz.oracles.kinds.dispatch import diagnose

    declared = Declared(kind="group-advantage", variant=zoo.GA, masked_zero=True)
    case = Case.build(trainable=[[1, 1], [1, 0]], attention=[[1, 1], [1, 1]], score=[0.0, 1.0], group=[0, 0])
    assert diagnose(zoo.grpo_score_on_last_attended, case, declared, "reference").mechanism == "score-lost"


RETURNS_ZOO = {  # GAE mutants that are returns bugs too, judged as the `returns` kind (V = 0, lam = 1)
    "mask_ignored": ("dense", {"poison"}),  # KL under the mask summed into the returns
    "score_on_last_real_token": ("dense", {"score-kept"}),  # the outcome lost on an observation tail
    "extra_decay_per_masked_token": ("compressed", {"gap-invariance"}),  # a decay per masked token
    "correct_compressed": ("compressed", set()),
}


@pytest.mark.parametrize("name", list(RETURNS_ZOO))
def test_the_returns_kind_catches_its_mutants(name):
    import mutant_zoo

    from maskfuzz.oracles.domain import Domain

    contract, want = RETURNS_ZOO[name]
    fn = getattr(mutant_zoo, name)
    declared = Declared(contract=contract, kind="returns", domain=Domain(critic=False))
    result = fuzz_target(mutant_zoo.as_run(fn), declared, target=name, max_examples=200, sizes=Sizes(6, 16))
    found = {f.property for f in result.findings}
    assert want <= found if want else not found, found
    assert all(f.case.lam == 1.0 and not f.case.values.any() for f in result.findings)  # drawn without a critic


def test_a_clean_twin_that_crashes_under_nan_poison_is_a_no_crash_finding():
    def crash_when_clean(case):
        if not case.has_nonfinite_poison():
            raise RuntimeError("crashes on the clean twin")
        return zoo.k3_correct(case)

    case = Case.build(trainable=[[1, 0]], extra={"logp": [[-1.0, float("nan")]], "ref_logp": [[-1.0, -1.0]]})
    verdicts = {v.property: v for v in judge(crash_when_clean, case, Declared(kind="kl", masked_zero=True))}
    assert verdicts["no-crash"].failed and verdicts["no-crash"].case is not None
    assert verdicts["poison-nonfinite"].status == "n/a"


def test_the_twin_property_compares_two_implementations_of_one_computation():
    import dataclasses

    from maskfuzz.oracles.kinds.dispatch import diagnose

    base = Declared(kind="group-advantage", variant=zoo.GA, masked_zero=True)
    case = Case.build(trainable=[[1], [1], [1]], score=[0.0, 1.0, 3.0], group=[0, 0, 0])
    alone = {v.property: v for v in judge(zoo.grpo_correct, case, base)}
    assert alone["twin"].status == "n/a"  # no second implementation declared
    paired = dataclasses.replace(base, twin=zoo.grpo_biased_std, twin_label="zoo:biased")
    verdicts = {v.property: v for v in judge(zoo.grpo_correct, case, paired)}
    assert verdicts["twin"].failed and "zoo:biased" in verdicts["twin"].message
    assert diagnose(zoo.grpo_correct, case, paired, "twin").mechanism == "implementations-disagree"
    same = dataclasses.replace(base, twin=zoo.grpo_correct, twin_label="zoo:same")
    assert {v.property: v for v in judge(zoo.grpo_correct, case, same)}["twin"].status == "pass"


@pytest.mark.parametrize("fn", [zoo.agg_per_microbatch_normaliser, zoo.value_min_not_max], ids=lambda f: f.__name__)
def test_loss_kind_findings_round_trip_through_the_corpus(fn, tmp_path):
    """A loss-aggregation / value-loss finding (outputs loss, grad; a split on ranks) is saved, read back
    bit for bit, and fails again when replayed."""
    from maskfuzz.fuzz import corpus

    kind, variant, want = zoo.CATCHES[fn]
    declared = Declared(kind=kind, variant=variant, masked_zero=True)
    result = fuzz_target(fn, declared, target="zoo", pin="local", max_examples=200, sizes=Sizes(6, 16))
    finding = next(f for f in result.findings if f.property == want[0])
    path = corpus.record(finding, tmp_path).path
    entry = corpus.load(path)
    assert entry.case.split is None or torch.equal(entry.case.split, finding.case.split)
    assert entry.case.ranks == finding.case.ranks and entry.verdict.output in ("loss", "grad")
    verdict = next(v for v in judge(fn, entry.case, declared) if v.property == want[0])
    assert verdict.failed, verdict


REMAX = Declared(
    kind="returns",
    variant={"baseline": "per-row"},
    domain=Domain(critic=False, discount=False, why={"critic": "ReMax", "discount": "ReMax"}),
)


def test_remax_returns_minus_the_row_baseline_by_hand():
    """Rewards [1, 2] plus score 3 at the last trainable token, gamma 1: returns [6, 5]; the greedy
    rollout's reward 4 is subtracted: advantages [2, 1]; 0 under the mask."""
    case = Case.build(
        trainable=[[1, 1, 0]],
        token_rewards=[[1.0, 2.0, 0.0]],
        score=[3.0],
        extra={"baseline": [[4.0, 4.0, 4.0]]},
        dtype="float64",
    )
    adv, ret = expected_outputs(case, REMAX)
    assert adv.tolist() == [[2.0, 1.0, 0.0]] and ret.tolist() == [[6.0, 5.0, 0.0]]
    assert "discount" in REMAX.domain.rejects(case.replace(gamma=0.5))


def _remax_correct(case: Case):
    adv, ret = expected_outputs(case, REMAX)
    return adv.to(case.torch_dtype), ret.to(case.torch_dtype)


def _remax_baseline_forgotten(case: Case):
    """Mutant: the returns, no baseline subtracted."""
    adv, ret = expected_outputs(case, Declared(kind="returns", domain=REMAX.domain))
    return adv.to(case.torch_dtype), ret.to(case.torch_dtype)


def _remax_baseline_everywhere(case: Case):
    """Mutant: the baseline subtracted at every position, masked ones included."""
    adv, ret = _remax_correct(case)
    return adv - case.extra["baseline"].to(adv.dtype) * (~case.trainable), ret


@pytest.mark.parametrize(
    "run, prop",
    [(_remax_correct, None), (_remax_baseline_forgotten, "reference"), (_remax_baseline_everywhere, "masked-zero")],
)
def test_remax_mutants_are_caught_and_the_correct_one_passes(run, prop):
    result = fuzz_target(run, REMAX, target="remax-zoo", max_examples=150, seed=0)
    if prop is None:
        assert not result.findings, [(f.property, f.verdict.message) for f in result.findings]
        assert result.checked["reference"] > 0 and result.checked["gap-invariance"] > 0
    else:
        assert result.finding(prop) is not None, {p: n for p, n in result.failed.items() if n}


def test_a_crash_from_masked_values_alone_is_nan_through_mask_not_a_degenerate_input():
    """A masked log-ratio of 100 overflows exp in float32 and inf * 0 is NaN through a mask product:
    the crash goes away with the masked inputs at 0, so it is `nan-through-mask` (low); an empty step
    that divides 0 by 0 stays `crash-degenerate` (low: a degenerate configuration)."""
    from maskfuzz.oracles.kinds.dispatch import diagnose
    from maskfuzz.oracles.severity import grade

    case = Case.build(
        trainable=[[1, 0]], extra={"logp": [[0.0, 0.0]], "old_logp": [[0.0, -100.0]], "adv": [[1.0, 0.0]]}
    )
    declared = Declared(kind="policy-loss", variant=zoo.PL, masked_zero=True)
    (crash,) = [v for v in judge(zoo.policy_mask_by_multiply, case, declared) if v.property == "no-crash"]
    assert crash.failed
    found = diagnose(zoo.policy_mask_by_multiply, case, declared, "no-crash")
    assert found.mechanism == "nan-through-mask" and grade(found.mechanism, "no-crash", "pipeline") == "low", found
    losses = Case.build(trainable=[[1, 0]], extra={"loss": [[1.0, 0.0]]})
    agg = Declared(kind="loss-aggregation", variant={}, masked_zero=True)
    found = diagnose(zoo.agg_nan_on_empty_step, losses, agg, "empty-step")
    assert found.mechanism == "crash-degenerate", found
    # an all-empty step is a degenerate configuration (low); a crash on a step that trains is medium
    assert grade(found.mechanism, "empty-step", "pipeline", degenerate=True) == "low"
    assert grade(found.mechanism, "no-crash", "pipeline") == "medium"


def test_kl_ratio_weighted_k3_by_hand():
    """ratio="token": k3 times exp(logp - old_logp) per trained token; the masked NaN stays out. d = logp - ref = 0.5,
    -1; x = logp - old = 0.25, -2. ratio="sequence": one weight per row, exp of the masked mean of x ((0.25 - 2) / 2);
    an old_logp that is absent means old = logp (ratio 1)."""
    nan = float("nan")
    case = Case.build(
        trainable=[[1, 1, 0]],
        extra={"logp": [[-1.0, -2.0, nan]], "ref_logp": [[-1.5, -1.0, 0.0]], "old_logp": [[-1.25, 0.0, nan]]},
    )
    k3 = [math.exp(-0.5) - 1 + 0.5, math.e - 1 - 1]
    token = kl.reference(case, {"estimator": "k3", "ratio": "token"})["kl"]
    assert token[0, :2].tolist() == pytest.approx([k3[0] * math.exp(0.25), k3[1] * math.exp(-2.0)]) and token[0, 2] == 0
    seq = {"estimator": "k3", "ratio": "token", "ratio_level": "sequence"}
    w = math.exp((0.25 - 2.0) / 2)
    assert kl.reference(case, seq)["kl"][0, :2].tolist() == pytest.approx([k3[0] * w, k3[1] * w])
    assert kl.reference(case, {"estimator": "k3", "ratio_level": "sequence"})["kl"][0, :2].tolist() == pytest.approx(k3)
    for variant in ({"estimator": "k3", "ratio": "token"}, seq):
        vec = kl.reference(case, variant, vectorised=True)["kl"]
        assert torch.allclose(vec, kl.reference(case, variant)["kl"], rtol=1e-12, atol=0)
    on_policy = case.replace(extra={n: x for n, x in case.extra.items() if n != "old_logp"})
    assert kl.reference(on_policy, seq)["kl"][0, :2].tolist() == pytest.approx(k3)
    assert kl.peak(case, seq) == pytest.approx(w) and kl.peak(case, {"estimator": "k3"}) == 0.0
    assert bool((kl.condition(case, seq)[0, :2] > 0).all()) and kl.condition(case, seq)[0, 2] == 0
    with pytest.raises(ValueError, match="ratio"):
        kl.options({"ratio": "row"})


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_kl_ratio_loop_and_vectorised_agree(level):
    """40 random cases with drawn old log-probs (ratios 1 to e^+-20): loop and vectorised references agree."""
    variant = {"estimator": "k3", "ratio": "token", "ratio_level": level}

    @settings(max_examples=40, deadline=None, database=None)
    @given(kind_cases("kl", sizes=Sizes(6, 16), nonfinite=True), st.just(0))
    def check(case, _):
        assert "old_logp" in case.extra
        loop = kl.reference(case.replace(dtype="float64"), variant)["kl"]
        vec = kl.reference(case.replace(dtype="float64"), variant, vectorised=True)["kl"]
        assert torch.allclose(loop, vec, rtol=1e-9, atol=1e-9), (loop, vec)

    check()


def test_a_loader_that_cuts_equal_micro_batches_gets_only_equal_splits():
    """`Domain.uneven_splits=False` (a loader that cuts equal-row micro-batches, as many on each rank): the
    strategy draws only such splits, so split-invariance judges what the framework's loader builds."""
    from hypothesis import given, settings

    from maskfuzz.oracles.domain import Domain, even_split
    from maskfuzz.oracles.kinds.strategies import kind_cases

    seen = []

    @settings(max_examples=150, database=None, deadline=None)
    @given(kind_cases("loss-aggregation", Domain(uneven_splits=False, why={"uneven_splits": "loader.py:1"})))
    def draw(case):
        if case.split is not None:
            seen.append(case)
            assert even_split(case), (case.split.tolist(), case.ranks)

    draw()
    assert len(seen) > 20 and any(len(c.split.unique()) > 1 for c in seen)


def test_prompt_mean_counts_empty_prompts_when_its_variant_counts_empty_rows():
    from maskfuzz.oracles.kinds import loss_aggregation as la

    loss = [[1.0, 2.0], [0, 0], [4.0, 0]]
    case = Case.build(trainable=[[1, 1], [0, 0], [1, 0]], group=[0, 1, 2], extra={"loss": loss})
    for rows, want in (("excluded", (1.5 + 4.0) / 2), ("counted", (1.5 + 4.0) / 3)):
        v = {"mode": "prompt-mean", "empty_rows": rows}
        for vec in (False, True):
            assert la.reference(case, v, vectorised=vec)["loss"][0, 0].item() == pytest.approx(want)


def test_groups_of_one_size_side_by_side_are_drawn_where_the_rollout_lays_them_out_so():
    """`Domain.ragged_groups=False` (n responses per prompt, next to each other): only regular groups are drawn,
    and a ragged layout is a feature a pipeline witness may use only where it is cited as produced."""
    from hypothesis import given, settings

    from maskfuzz.oracles.domain import Domain, regular_groups
    from maskfuzz.oracles.kinds.strategies import kind_cases

    seen = []

    @settings(max_examples=120, database=None, deadline=None)
    @given(kind_cases("group-advantage", Domain(ragged_groups=False, why={"ragged_groups": "rollout.py:1"})))
    def draw(case):
        seen.append(case)
        assert regular_groups(case), case.group.tolist()

    draw()
    assert any(len(c.group.unique()) > 1 for c in seen)
    ragged = Case.build(trainable=[[1]] * 4, group=[0, 0, 0, 1])
    assert "ragged_groups" in Domain().features(ragged) and Domain().produced_only().rejects(ragged)

"""The properties: references satisfy all that apply; wrong estimators are caught with the right
positions and numbers; `dense` breaks gap-invariance exactly where the spec says."""

from __future__ import annotations

import mutant_zoo as zoo
import pytest
import torch
from hypothesis import given, settings

from maskfuzz.oracles.case import Case
from maskfuzz.oracles.declared import Declared
from maskfuzz.oracles.kinds.dispatch import judge
from maskfuzz.oracles.kinds.gae.reference import reference
from maskfuzz.oracles.kinds.gae.strategies import cases
from maskfuzz.oracles.strategies import Sizes
from maskfuzz.oracles.verdict import PROPERTIES, TargetFailure
from maskfuzz.oracles.whitening import Whitening, masked_whiten


def ref_run(contract: str, whitening: Whitening | None = None):
    def run(case: Case):
        adv, ret = reference(case, contract)
        if whitening is not None:
            adv = masked_whiten(adv, case.trainable, whitening)
        return adv.to(case.torch_dtype), ret.to(case.torch_dtype)

    return run


def failures(verdicts):
    return {v.property: v for v in verdicts if v.failed}


@pytest.mark.parametrize("contract", ["compressed", "dense"])
@settings(max_examples=120, deadline=None)
@given(data=cases(sizes=Sizes(6, 40)))
def test_reference_contracts_satisfy_every_property_that_applies(contract, data):
    verdicts = judge(ref_run(contract), data, Declared(contract))
    assert not failures(verdicts), {p: v.message for p, v in failures(verdicts).items()}
    assert [v.property for v in verdicts] == list(PROPERTIES)


@settings(max_examples=60, deadline=None)
@given(data=cases(sizes=Sizes(4, 24)))
def test_whitened_reference_satisfies_the_properties_when_declared(data):
    spec = Whitening(unbiased=True, eps=1e-8)
    declared = Declared("compressed", whitening=spec, masked_zero=False, documented_errors=("whitening needs",))
    assert not failures(judge(ref_run("compressed", spec), data, declared))


def test_dense_breaks_gap_invariance_exactly_at_a_gap():
    declared = Declared("compressed")
    gap = Case.build(trainable=[[1, 0, 1]], values=[[0.5, 0, 0.25]], score=[1], gamma=0.9, lam=0.8)
    v = failures(judge(ref_run("dense"), gap, declared))
    assert set(v) == {"gap-invariance", "reference"}
    assert v["gap-invariance"].positions == [[0, 0]]  # only the token before the gap moves
    # no gap: dense and compressed agree, and the inserted-gap twin is compared only where it applies
    contiguous = Case.build(trainable=[[1, 1, 0]], values=[[0.5, 0.25, 9]], score=[1], gamma=0.9, lam=0.8)
    v = failures(judge(ref_run("dense"), contiguous, declared))
    assert set(v) == {"gap-invariance"}  # inserting a gap into a contiguous row is where dense decays
    single = Case.build(trainable=[[0, 1, 0]], values=[[3, 0.25, 9]], score=[1], gamma=0.9, lam=0.8)
    assert not failures(judge(ref_run("dense"), single, declared))
    gap_checked = {v.property: v.status for v in judge(ref_run("dense"), single, declared)}
    assert gap_checked["gap-invariance"] == "n/a"


def test_value_bootstrap_is_caught_with_the_seed_numbers():
    seed = Case.build(trainable=[[1, 1, 0]], token_rewards=[[0, 1, 0]], values=[[0, 0, 100]], gamma=1, lam=0.95)
    v = failures(judge(zoo.as_run(zoo.values_masked_for_storage_only), seed, Declared("dense")))
    assert v["reference"].positions == [[0, 0], [0, 1]]
    assert v["reference"].expected == pytest.approx([0.95, 1.0])
    assert v["reference"].observed == pytest.approx([5.7, 6.0], rel=1e-6)
    assert v["poison"].positions == [[0, 0], [0, 1]]


def test_score_on_the_last_real_token_is_caught_at_the_last_trainable_token():
    tail = Case.build(trainable=[[1, 1, 1, 0, 0]], attention=[[1, 1, 1, 1, 1]], score=[1], gamma=0, lam=0.95)
    v = failures(judge(zoo.as_run(zoo.score_on_last_real_token), tail, Declared("dense")))
    assert v["score-kept"].positions == [[0, 2]]
    assert v["score-kept"].expected == [1.0] and v["score-kept"].observed == [0.0]


def test_ignored_mask_is_caught_by_poison_at_the_leaking_positions():
    case = Case.build(trainable=[[1, 0, 1, 1]], values=[[0, 7, 0, 0]], gamma=0.5, lam=0.5, score=[1])
    v = failures(judge(zoo.as_run(zoo.mask_ignored), case, Declared("dense")))
    assert v["poison"].positions == [[0, 0]]  # the value 7 bootstraps into position 0 only


def test_nonfinite_poison_is_reported_separately():
    case = Case.build(trainable=[[1, 0]], values=[[0, float("nan")]], gamma=0.9, lam=0.9, score=[1])
    v = failures(judge(zoo.as_run(zoo.nan_leaks_through_multiply), case, Declared("dense")))
    assert set(v) == {"poison-nonfinite", "masked-zero"}  # `adv * mask` keeps the NaN under the mask too
    assert v["poison-nonfinite"].positions == [[0, 0]] and v["masked-zero"].positions == [[0, 1]]


def test_a_nan_kept_at_a_masked_advantage_fails_masked_zero():
    """Right at every trainable position, NaN * 0 under the mask: the loss's `adv * mask` would carry it."""

    def right_but_nan_under_the_mask(**kw):
        adv, ret = zoo.correct_dense(**kw)
        keep = kw["values"] * (1 - kw["trainable"])  # 0, or NaN where a masked value is NaN
        return adv + keep * 0, ret

    case = Case.build(trainable=[[1, 0, 1]], values=[[0, float("nan"), 0]], gamma=0.9, lam=0.9, score=[1])
    v = failures(judge(zoo.as_run(right_but_nan_under_the_mask), case, Declared("dense")))
    assert set(v) == {"masked-zero"} and v["masked-zero"].positions == [[0, 1]]
    assert not failures(judge(zoo.as_run(right_but_nan_under_the_mask), case, Declared("dense", masked_zero=False)))


def test_finite_poison_that_overflows_is_a_poison_leak_not_a_crash():
    case = Case.build(trainable=[[1, 0]], values=[[0, 1e6]], gamma=1.0, lam=0.5, score=[1])

    def overflow(c: Case):
        x = c.inputs()
        nxt = x["values"].roll(-1, dims=1) * 1e33  # cancels exactly below, unless it overflows
        adv = (x["score"][:, None] + nxt - nxt) * x["trainable"]
        return adv, adv

    v = failures(judge(overflow, case, Declared("dense")))
    assert "poison" in v and "no-crash" not in v


def test_poison_above_the_dtype_cap_overflowing_is_not_judged():
    """An overflow of legitimate arithmetic on huge finite poison is not a leak (old corpus
    entries hold 1e30 and 3e38; the strategies stay under poison_cap)."""
    case = Case.build(trainable=[[1, 0]], values=[[0, 3e38]], gamma=1.0, lam=0.5, score=[1])

    def squares(c: Case):
        x = c.inputs()
        sq = (x["values"] ** 2).sum(dim=1, keepdim=True)  # whitening-like arithmetic over every position
        adv = (x["score"][:, None] + sq - sq) * x["trainable"]
        return adv, adv

    verdicts = judge(squares, case, Declared("dense"))
    assert not failures(verdicts)
    assert all(v.status == "n/a" and "poison cap" in v.message for v in verdicts)


def test_exceptions_are_no_crash_verdicts_unless_documented():
    case = Case.build(trainable=[[0, 0]])

    def boom(c: Case):
        raise ValueError("At least one element in the mask has to be 1.")

    assert failures(judge(boom, case, Declared("dense")))["no-crash"].message.startswith("raised ValueError")
    documented = Declared("dense", documented_errors=(r"At least one element in the mask",))
    assert not failures(judge(boom, case, documented))

    def died(c: Case):
        raise TargetFailure("crash", "the worker process died")

    assert "crash" in failures(judge(died, case, documented))["no-crash"].message


def test_wrong_output_shape_is_a_no_crash_failure():
    case = Case.build(trainable=[[1, 1]])
    v = failures(judge(lambda c: (torch.zeros(1, 3), torch.zeros(1, 3)), case, Declared("dense")))
    assert "shape [1, 3], expected [1, 2]" in v["no-crash"].message


# -- judge mechanics: the judge is never the cause of a failure ------------------------------------
def test_a_crashing_twin_is_no_crash_on_the_twin_not_the_property_that_built_it():
    base = Case.build(trainable=[[1, 1]], values=[[0.5, 0.25]], gamma=0.9, lam=0.9, score=[1])
    inner = ref_run("compressed")

    def crash_on_three_rows_or_gaps(c: Case):
        if c.shape[0] > 1 or c.shape[1] > 2:
            raise IndexError("index 3 is out of bounds")
        return inner(c)

    verdicts = {v.property: v for v in judge(crash_on_three_rows_or_gaps, base, Declared("compressed"))}
    assert verdicts["row-independence"].status == "n/a" and verdicts["gap-invariance"].status == "n/a"
    crash = verdicts["no-crash"]
    assert crash.failed and "IndexError" in crash.message
    assert crash.case is not None and crash.case.shape != base.shape  # the twin's own case


def test_poison_nonfinite_ignores_positions_non_finite_in_the_clean_twin_too():
    case = Case.build(trainable=[[1, 1, 0]], values=[[0, 0, float("nan")]], gamma=0.9, lam=0.9, score=[1])

    def nan_everywhere(c: Case):  # non-finite whatever the poison: not the poison's doing
        x = c.inputs()
        out = torch.full_like(x["values"], float("nan"))
        return out, out

    v = {x.property: x for x in judge(nan_everywhere, case, Declared("compressed"))}
    assert v["poison-nonfinite"].status == "n/a" and "clean twin" in v["poison-nonfinite"].message


def test_gap_twin_inserts_a_clean_token():
    from maskfuzz.oracles.kinds.gae.properties import with_inserted_gap

    case = Case.build(trainable=[[1, 1]], values=[[0.5, 0.25]])
    twin, p = with_inserted_gap(case)
    assert p == 1 and float(twin.values[0, 1]) == 0.0 and float(twin.token_rewards[0, 1]) == 0.0


def test_undefined_whitening_makes_every_property_not_applicable():
    case = Case.build(trainable=[[1, 0]], values=[[0.0, 7.0]], score=[1])

    def leaky(c: Case):  # leaks and crashes would both be reported if the case were judged
        raise ZeroDivisionError("std of one element")

    verdicts = judge(leaky, case, Declared("compressed", whitening=Whitening(unbiased=True, eps=1e-8)))
    assert all(v.status == "n/a" for v in verdicts), [v.to_dict() for v in verdicts if v.status != "n/a"]


def test_nonfinite_findings_shrink_to_two_positions():
    from maskfuzz.fuzz.engine import fuzz_target

    run = zoo.as_run(zoo.nan_leaks_through_multiply)
    result = fuzz_target(run, Declared("dense"), target="zoo", max_examples=300, properties=("poison-nonfinite",))
    finding = result.finding("poison-nonfinite")
    assert finding is not None and finding.case.shape[0] * finding.case.shape[1] <= 2, finding.case

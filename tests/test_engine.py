"""The engine against the mutant zoo: every mutant found by the property that should catch it,
the correct references clean, shrinking small, target failures turned into verdicts."""

from __future__ import annotations

import mutant_zoo as zoo
import pytest
import torch

from maskfuzz.fuzz.engine import fuzz_target
from maskfuzz.oracles.case import Case
from maskfuzz.oracles.declared import Declared
from maskfuzz.oracles.strategies import Sizes
from maskfuzz.oracles.verdict import TargetFailure

MUTANTS = list(zoo.CATCHES.items())


@pytest.mark.parametrize("mutant,want", MUTANTS, ids=[m.__name__ for m, _ in MUTANTS])
def test_every_mutant_is_caught_by_its_property(mutant, want):
    declared, prop = want
    result = fuzz_target(
        zoo.as_run(mutant),
        declared,
        target=mutant.__name__,
        max_examples=400,
        seed=0,
        derandomize=True,
        shrink=False,
        properties=(prop,),
    )
    assert [f.property for f in result.findings] == [prop], f"{mutant.__name__}: {prop} not found in {result.generated}"


@pytest.mark.parametrize("fn,declared", list(zoo.CORRECT.items()), ids=lambda x: getattr(x, "__name__", ""))
def test_correct_references_produce_no_finding(fn, declared):
    result = fuzz_target(zoo.as_run(fn), declared, target=fn.__name__, max_examples=150, seed=1, derandomize=True)
    assert result.findings == [], [(f.property, f.verdict.message, f.case.summary()) for f in result.findings]
    assert result.checked["reference"] > 50 and result.checked["poison"] > 20


def test_value_bootstrap_mutant_shrinks_to_one_short_row():
    declared, _ = zoo.CATCHES[zoo.values_masked_for_storage_only]
    result = fuzz_target(
        zoo.as_run(zoo.values_masked_for_storage_only),
        declared,
        target="m",
        max_examples=200,
        seed=0,
        derandomize=True,
        properties=("poison",),
    )
    finding = result.finding("poison")
    assert finding is not None
    b, t = finding.case.shape
    assert b == 1 and t <= 3, finding.case.summary()
    # the shrunk case holds the leak: a trainable token followed by a poisoned masked slot
    assert finding.verdict.positions and finding.verdict.expected != finding.verdict.observed


def test_target_failures_are_verdicts_not_crashes():
    calls = {"n": 0}

    def flaky_crash(case: Case):
        calls["n"] += 1
        if case.shape[1] > 4:
            raise TargetFailure("crash", "worker died")
        adv = torch.zeros(case.shape, dtype=case.torch_dtype)
        return adv, adv

    result = fuzz_target(flaky_crash, Declared("dense"), target="t", max_examples=60, seed=3, derandomize=True)
    crash = result.finding("no-crash")
    assert crash is not None and "worker died" in crash.verdict.message
    assert crash.case.shape[1] == 5  # shrunk to the smallest length that crashes


def test_budget_runs_batches_until_spent():
    ticks = iter(range(0, 10_000))
    result = fuzz_target(
        zoo.as_run(zoo.correct_dense),
        Declared("dense"),
        target="t",
        max_examples=10_000,
        budget=2.5,
        batch=5,
        clock=lambda: float(next(ticks)),
        sizes=Sizes(2, 8),
    )
    assert 5 <= result.generated < 10_000
    assert result.findings == []


@pytest.mark.parametrize("mutant,prop", list(zoo.KL_CATCHES.items()), ids=lambda x: getattr(x, "__name__", x))
def test_kl_in_reward_mutants_are_caught(mutant, prop):
    result = fuzz_target(
        mutant, zoo._KL_DECLARED, target=mutant.__name__, max_examples=300, seed=0, derandomize=True, shrink=False
    )
    assert prop in [f.property for f in result.findings], (mutant.__name__, result.generated)


def test_kl_in_reward_correct_has_no_finding():
    result = fuzz_target(
        zoo.KL_CORRECT, zoo._KL_DECLARED, target="kl_reward_correct", max_examples=150, seed=1, derandomize=True
    )
    assert result.findings == [], [(f.property, f.verdict.message, f.case.summary()) for f in result.findings]
    assert result.checked["reference"] > 50 and result.checked["poison"] > 20

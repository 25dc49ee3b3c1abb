"""Call recipes of discovered config choices (AReaL's NormConfig levels, OpenRLHF's reinforce_baseline and
flash_reinforce): each runs the framework's own code from its release wheel, invariants only, and declares the
invariants its design does not promise, with the upstream line; the judge skips those with the reason and still
judges the others (a leak of poison under the mask is caught)."""

from __future__ import annotations

import contextlib
import dataclasses

import pytest
import torch

from maskfuzz.oracles.case import Case
from maskfuzz.oracles.declared import Declared
from maskfuzz.oracles.kinds.dispatch import judge
from maskfuzz.targets import discovery
from maskfuzz.targets.runtime.session import SetupError, open_target

AREAL = "areal:reward-norm:reward_norm.mean_level=batch@1.0.4"
OPENRLHF = "openrlhf:adv:reinforce_baseline@0.11.2"


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


def _case(poison: float = 0.0) -> Case:
    """Two prompt groups of two contiguous rows, float32; the last position of every row masked, carrying
    `poison` as a token reward there (a leak of it is what `poison` catches)."""
    b, t = 4, 3
    trainable = torch.tensor([[True, True, False]] * b)
    rewards = torch.where(trainable, torch.zeros(b, t, dtype=torch.float64), torch.full((b, t), poison))
    return Case(
        attention=torch.ones(b, t, dtype=torch.bool),
        trainable=trainable,
        token_rewards=rewards,
        values=torch.zeros(b, t, dtype=torch.float64),
        score=torch.tensor([1.0, 0.0, 0.5, 2.0], dtype=torch.float64),
        gamma=1.0,
        lam=1.0,
        dtype="float32",
        group=torch.tensor([0, 0, 1, 1]),
    )


def _verdicts(run, case: Case, declared: Declared) -> dict:
    return {v.property: v for v in judge(run, case, declared)}


def _leaky(run):
    """A mutant of the real entry: the masked token rewards (poison) added to every trainable position."""

    def leak(case: Case):
        (adv,) = run(case)
        masked = torch.where(case.trainable, 0.0, case.token_rewards).sum().to(adv.dtype)
        return (torch.where(case.trainable, adv + masked, adv),)

    return leak


def test_the_recipes_declare_what_their_design_does_not_promise():
    areal = discovery.overrides("areal", "reward-norm:reward_norm.mean_level=batch")
    assert areal["reference"] is False and [p for p, _ in areal["not_promised"]] == ["group-isolation"]
    assert "1.0.4 areal/utils/data.py:1383" in areal["not_promised"][0][1]
    assert '"batch": normalize across entire batch' in areal["not_promised"][0][1]
    # no batch level: group-isolation stays a promise, judged
    assert discovery.overrides("areal", "reward-norm:reward_norm.mean_level=none")["not_promised"] == ()
    flash = discovery.overrides("openrlhf", "adv:flash_reinforce")
    (prop, why), *_ = flash["not_promised"]
    assert prop == "group-isolation" and "cli/train_ppo_ray.py:520" in why
    # a choice without a recipe keeps the plain invariants-only fields
    assert discovery.overrides("areal", "kl:k9")["not_promised"] == ()


@pytest.mark.parametrize("ref", [AREAL, OPENRLHF])
def test_a_recipe_runs_the_wheel_skips_what_is_not_promised_and_still_catches_a_leak(ref):
    with opened(ref) as h:
        assert not h.declared.reference
        assert any(n.startswith("not promised: group-isolation: ") for n in h.info["notes"]), h.info["notes"]
        case = _case()
        got = _verdicts(h.run, case, h.declared)
        iso = got["group-isolation"]
        assert iso.status == "n/a" and iso.message.startswith("not promised: "), iso
        line = "areal/utils/data.py:1383" if ref == AREAL else "openrlhf/trainer/ppo_utils/experience_maker.py:324"
        assert line in iso.message, iso.message
        assert got["reference"].status == "n/a"  # invariants only
        for prop in ("no-crash", "permutation", "deterministic"):
            assert got[prop].status == "pass", got[prop]
        # the kept invariants are still judged: poison under the mask that reaches the output is caught
        poisoned = _case(poison=7.0)
        assert _verdicts(h.run, poisoned, h.declared)["poison"].status == "pass"
        assert _verdicts(_leaky(h.run), poisoned, h.declared)["poison"].failed
        # and the skip is the declared one's: without it, the whole-batch statistic reads as a group leak
        other = dataclasses.replace(h.declared, not_promised=(), variant={})
        assert _verdicts(h.run, case, other)["group-isolation"].failed


def test_a_recipe_without_a_batch_level_judges_group_isolation():
    with opened("areal:reward-norm:reward_norm.mean_level=none@1.0.4") as h:
        assert not any(n.startswith("not promised") for n in h.info["notes"])
        iso = _verdicts(h.run, _case(), h.declared)["group-isolation"]
        assert iso.status == "pass", iso

"""Clip-Cov and KL-Cov (the Entropy-Mechanism losses) through their call recipe (`adapters.cov_selection`): the real
functions of verl's and SkyRL's release wheels select tokens over the valid ones, the selection is seen in the
gradient, a seeded call draws the same tokens, and the judge sets aside only what their design does not promise."""

from __future__ import annotations

import contextlib

import pytest
import torch

from maskfuzz.oracles.case import Case
from maskfuzz.oracles.kinds.dispatch import judge
from maskfuzz.targets import discovery
from maskfuzz.targets.adapters import cov_selection
from maskfuzz.targets.runtime.session import SetupError, open_target

PINS = {"verl": "0.9.1", "skyrl": "0.3.1"}
REFS = [f"{fw}:policy-loss:{name}@{pin}" for fw, pin in PINS.items() for name in cov_selection.NAMES]


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
    """2 rows x 4, the last position masked (holding `poison` in every input). Row 0 has advantage 2, row 1 -2 (mean
    0); log-prob deviations from the valid mean are (1, 1.2, 0.8) and (-1, -1.1, -0.8), so every valid covariance is
    in Clip-Cov's (lb, ub) = (1, 5) and KL-Cov's largest, 2.4, is at (0, 1) alone; old = logp - 0.1 (ratio 1.105,
    inside every clip range: no token is clipped by the PPO ratio)."""
    valid = torch.tensor([[True, True, True, False]] * 2)
    logp = torch.tensor([[-1.0, -0.8, -1.2, 0.0], [-3.0, -3.1, -2.8, 0.0]], dtype=torch.float64)
    adv = torch.tensor([[2.0] * 4, [-2.0] * 4], dtype=torch.float64)
    extra = {n: torch.where(valid, x, torch.full_like(x, poison)) for n, x in
             (("logp", logp), ("old_logp", logp - 0.1), ("adv", adv))}  # fmt: skip
    return Case.build(trainable=valid, extra=extra, dtype="float64")


def test_the_recipes_are_listed_callable_and_declare_their_selection():
    for fw in PINS:
        clip = discovery.overrides(fw, "policy-loss:clip_cov")
        assert clip["reference"] is False
        assert [p for p, _ in clip["not_promised"]] == ["deterministic", "permutation", "split-invariance"]
        assert "torch.randperm(len(top_k_idx))" in clip["not_promised"][0][1]
        kl = discovery.overrides(fw, "policy-loss:kl_cov")
        assert [p for p, _ in kl["not_promised"]] == ["permutation", "split-invariance"]  # topk is deterministic
        assert "ties in the covariance fall to position" in kl["not_promised"][0][1]
        assert discovery.overrides(fw, "policy-loss:gspo")["not_promised"] == ()  # no recipe: plain fields


def test_seeded_draws_the_same_and_leaves_the_callers_rng_alone():
    torch.manual_seed(123)
    before = torch.get_rng_state()
    draw = cov_selection.seeded(lambda n: torch.randperm(n))
    first, second = draw(50), draw(50)
    assert torch.equal(first, second)
    assert torch.equal(torch.get_rng_state(), before)
    assert not torch.equal(torch.randperm(50), first)  # the caller's own stream goes on, not the recipe's


@pytest.mark.parametrize("ref", REFS)
def test_the_real_loss_selects_over_valid_tokens_and_the_judge_keeps_the_invariants(ref):
    with opened(ref) as h:
        assert not h.declared.reference
        assert any("call recipe" in n for n in h.info["notes"]), h.info["notes"]
        case = _case()
        loss, grad = h.run(case)
        live = grad[case.trainable]
        if ref.split(":")[2].startswith("clip_cov"):
            # one random candidate (clip_num = max(int(0.0002 * 6), 1)) has its loss zeroed: its gradient is 0
            assert int((live == 0).sum()) == 1, grad
        else:
            # the one largest covariance, (0, 1), gets + ppo_kl_coef * |logp - old|: its gradient moves off its row's
            assert grad[0, 0] == pytest.approx(float(grad[0, 2])) and grad[0, 1] != pytest.approx(float(grad[0, 0]))
        again = h.run(case)
        assert torch.equal(again[1], grad)  # seeded: the same tokens drawn on the same batch
        got = {v.property: v for v in judge(h.run, case, h.declared)}
        for prop, _ in h.declared.not_promised:
            assert got[prop].status == "n/a" and got[prop].message.startswith("not promised: "), got[prop]
        for prop in ("no-crash", "pad-invariance", "masked-zero"):
            assert got[prop].status == "pass", got[prop]
        poisoned = {v.property: v for v in judge(h.run, _case(poison=-7.0), h.declared)}
        assert poisoned["poison"].status == "pass", poisoned["poison"]
        assert torch.equal(h.run(_case(poison=-7.0))[1][case.trainable], live)

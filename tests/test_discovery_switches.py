"""slime's and miles' `switch:` entries that read more than the plain policy loss: --use-rollout-logprobs (the old
log-probs taken from the rollout engine: the case's drawn `rollout_logp`) and --use-kl-loss / --use-unbiased-kl
(a KL loss to the reference, whose log-probs the worker sets to the old ones, at the coefficient of slime's example):
each runs the framework's own loss code and its gradient moves off the plain policy loss's where its option says."""

from __future__ import annotations

import pytest
import torch

from maskfuzz.oracles.case import Case
from maskfuzz.oracles.kinds.dispatch import judge
from maskfuzz.targets.adapters import trainer_options as to
from maskfuzz.targets.runtime.repos import parse_repos
from maskfuzz.targets.runtime.session import open_target

SWITCHES = ("use_rollout_logprobs", "use_kl_loss", "use_unbiased_kl")


def _case() -> Case:
    """2 rows x 3, the last token of row 0 masked; logp != old everywhere (the KL to ref = old is not 0), and the
    rollout engine's log-probs differ from the old ones (a ratio against them is not the trainer's)."""
    logp = [[-1.0, -0.4, -2.0], [-0.3, -1.2, -0.6]]
    extra = {
        "logp": logp,
        "old_logp": [[-1.1, -0.5, -2.0], [-0.2, -1.0, -0.9]],
        "rollout_logp": [[-1.3, -0.2, -2.0], [-0.6, -1.1, -0.5]],
        "adv": [[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]],
    }
    return Case.build(trainable=[[1, 1, 0], [1, 1, 1]], extra=extra, dtype="float32")


def _grad(ref: str, repos: dict, case: Case) -> tuple[torch.Tensor, dict]:
    with open_target(ref, repos=repos, timeout=120) as h:
        _, grad = h.run(case)
        verdicts = {v.property: v for v in judge(h.run, case, h.declared)}
        return grad, verdicts


def test_the_kl_switches_are_set_with_the_example_s_kl_loss():
    assert to.WITH["use_kl_loss"] == {"use_kl_loss": True, "kl_loss_coef": 0.001, "kl_loss_type": "low_var_kl"}
    assert to.WITH["use_unbiased_kl"]["use_kl_loss"] is True  # read only inside `if args.use_kl_loss:`
    assert not set(SWITCHES) & set(to.needs("x.py"))  # none listed any more


def _check(target: str, pin: str, repos: dict) -> None:
    case = _case()
    base, _ = _grad(f"{target}:policy-loss@{pin}", repos, case)
    live = case.trainable
    grads = {}
    for dest in SWITCHES:
        grad, verdicts = _grad(f"{target}:switch:{dest}@{pin}", repos, case)
        for prop in ("no-crash", "poison", "pad-invariance", "permutation", "deterministic"):
            assert verdicts[prop].status == "pass", (dest, verdicts[prop])
        assert not torch.allclose(grad[live], base[live]), dest  # the option reaches the gradient
        grads[dest] = grad
    # the KL's gradient is 0.001-scaled: small, and the unbiased weight moves it again
    assert torch.allclose(grads["use_kl_loss"][live], base[live], atol=1e-2)
    assert not torch.equal(grads["use_unbiased_kl"][live], grads["use_kl_loss"][live])


def test_miles_switches_run_the_wheel_s_loss():
    _check("miles", "0.0.2", {})


def test_slime_switches_at_the_mirror_head():
    repos = parse_repos(None)
    if "slime" not in repos:
        pytest.skip("slime is git only: set MASKFUZZ_REPOS=slime=/path/to/slime-clone-or-mirror to run its switches")
    _check("slime", "624b824a8", repos)

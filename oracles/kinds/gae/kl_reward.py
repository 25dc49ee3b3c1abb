"""KL in the reward: the per-token KL penalty a `gae` / `returns` target folds into its rewards.

A declared variant `kl_reward = {"coef": c, "estimator": ..., "clamp_d": ..., "clamp": ...}` says
the target computes, from `case.extra["logp"]` and `case.extra["ref_logp"]` [B, T] (log-probs of the
policy that sampled and of the reference policy; anything at masked positions),

    r'_t = token_rewards_t - c * k(logp_t - ref_logp_t)   at trainable positions t,

with `k` the estimator of the `kl` kind (`oracles.kinds.kl`, its clamps included), and then runs its
recursion on r' (the score joins at the last trainable token as usual). Masked positions keep their
reward: the recursion selects them out, so a KL term under the mask is poison like any other.
"""

from __future__ import annotations

import dataclasses

import torch

from maskfuzz.oracles.case import Case
from maskfuzz.oracles.kinds import kl
from maskfuzz.oracles.options import reference_case as configured_case

KEY = "kl_reward"
EXTRAS = ("logp", "ref_logp")  # per-token inputs: poisoned under the mask, cleaned by the poison twins


def options(variant: dict) -> tuple[float, dict]:
    """(coef, the `kl` kind's variant) of a `kl_reward` variant; ValueError names a bad key."""
    spec = dict(variant)
    coef = float(spec.pop("coef", 0.0))
    return coef, kl.options(spec)


def shaped(case: Case, variant: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """(r' float64 [B, T], its rounding in units of the dtype's u [B, T]) for `case` under `variant`."""
    missing = [n for n in EXTRAS if n not in case.extra]
    if missing:
        raise ValueError(f"a kl_reward target reads extra {missing}: the case has {sorted(case.extra)}")
    coef, spec = options(variant)
    penalty = kl.reference(case, spec, vectorised=True)["kl"]
    live = case.trainable
    rewards = torch.where(live, case.token_rewards - coef * penalty, case.token_rewards)
    rounding = torch.where(live, abs(coef) * kl.condition(case, spec), torch.zeros_like(penalty))
    return rewards, rounding


def fold(case: Case, variant: dict | None) -> Case:
    """`case` with the KL penalty folded into its token rewards (exact float64) and its rounding in
    `meta["reward_rounding"]`; `case` itself without a `kl_reward` variant."""
    if not variant:
        return case
    rewards, rounding = shaped(case, variant)
    return dataclasses.replace(case, token_rewards=rewards, meta={"reward_rounding": rounding})


def reference_case(case: Case, declared) -> Case:
    """The inputs GAE's float64 reference sees for `case` under `declared`: the KL in the reward folded
    in (a new object, so `changes_reference` holds), then the score map and truncation semantics
    (`oracles.options.reference_case`); `case` itself when nothing changes anything."""
    if declared.variant.get(KEY):
        case = fold(case, declared.variant[KEY])
    return configured_case(case, declared)


def changes_reference(case: Case, declared) -> bool:
    """Whether the configuration makes the reference's inputs differ from the case's own (the
    closed-form properties, stated on the raw case, do not apply then)."""
    return reference_case(case, declared) is not case

"""The policy loss's inputs for `oracles.kinds.strategies.kind_cases`: log-ratios from 0 (r = 1, the closed
form) across both clip edges, advantages of either sign per token and per row (the score), so every branch
of the clip and the dual clip is taken; `finish` keeps masked log-probs log-probabilities where the domain
has no masked log-probs of any value. Only where the domain's function takes them (`Domain.rollout_logprobs`),
the rollout engine's log-probs `rollout_logp`: `old_logp` plus a mismatch from none to past the bounds a truncated
importance weight exp(old_logp - rollout_logp) is cut at (0.999..1.002 to 0.5..5), drawn after every other input
so that the draws of a domain without them are unchanged."""

from __future__ import annotations

import torch
from hypothesis import event
from hypothesis import strategies as st

from maskfuzz.oracles.case import quantize
from maskfuzz.oracles.domain import LOGRATIO_SPAN, Domain
from maskfuzz.oracles.kinds.policy_loss import ROLLOUT
from maskfuzz.oracles.kinds.strategies import Drawn, values

# rollout_logp - old_logp: the engine's mismatch, from none to exp(-2) .. exp(2) importance weights
MISMATCH = (0.0, 0.0, 1e-3, -1e-3, 0.01, -0.01, 0.1, -0.1, 0.7, -0.7, 2.0, -2.0)


def inputs(draw, d: Drawn) -> None:
    shape, extra = d.shape, d.extra
    extra["old_logp"] = -values(draw, shape, "old_logp", pool=(0.0, 0.5, 1.0, 3.0), offsets=(0.0, 0.0, 10.0)).abs()
    ratios = (0.0, 0.0, 0.05, -0.05, 0.15, -0.15, 0.3, -0.3, 1.5, -1.5, 3.0, -3.0)
    if draw(st.booleans()):  # each token its own log-ratio from the pool: every clip branch in one row
        event("log-ratio: mixed")
        g = torch.Generator().manual_seed(draw(st.integers(0, 2**32 - 1)))
        r = torch.tensor(ratios, dtype=torch.float64)[torch.randint(0, len(ratios), shape, generator=g)]
    else:
        r = values(draw, shape, "log-ratio", pool=ratios, offsets=(0.0,))
    # both are log-probabilities (<= 0): a positive log-prob moves both down, the log-ratio r kept
    shift = (extra["old_logp"] + r).clamp(min=0.0)
    extra["old_logp"] = extra["old_logp"] - shift
    extra["logp"] = extra["old_logp"] + r
    extra["adv"] = values(draw, shape, "adv", pool=(0.0, 1.0, -1.0, 0.5, -2.0, 3.0))
    d.score = values(draw, (d.b_rows,), "row advantage", pool=(0.0, 1.0, -1.0, 0.5, -2.0))
    if d.domain.rollout_logprobs:  # last: a domain without them draws exactly what it drew before
        extra[ROLLOUT] = rollout_logp(draw, extra["old_logp"])


def rollout_logp(draw, old: torch.Tensor) -> torch.Tensor:
    """[B, T] float64: `old` plus the engine's mismatch (`MISMATCH`: none, one for the batch, one per row, or one per
    token), kept a log-probability (<= 0)."""
    mode = draw(st.sampled_from(["none", "const", "per-row", "mixed"]))
    event(f"rollout mismatch: {mode}")
    pool = torch.tensor(MISMATCH, dtype=torch.float64)
    if mode == "none":
        m = torch.zeros_like(old)
    elif mode == "const":
        m = torch.full_like(old, draw(st.sampled_from(MISMATCH)))
    elif mode == "per-row":
        m = torch.tensor([draw(st.sampled_from(MISMATCH)) for _ in range(old.shape[0])], dtype=torch.float64)
        m = m[:, None].expand(old.shape).clone()
    else:
        g = torch.Generator().manual_seed(draw(st.integers(0, 2**32 - 1)))
        m = pool[torch.randint(0, len(MISMATCH), old.shape, generator=g)]
    return (old + m).clamp(max=0.0)


def finish(extra: dict, dead: torch.Tensor, dtype: str, domain: Domain) -> dict:
    """After the poison: masked log-probs stay log-probabilities where the domain says so."""
    if domain.masked_logprobs:
        return extra
    lp, old, drawn_old = extra["logp"], extra["old_logp"], extra["old_logp"]
    fix = dead & torch.isfinite(lp) & torch.isfinite(old)
    old = quantize(torch.where(fix, -old.abs(), old), dtype)
    step = (lp - extra["old_logp"]).clamp(-LOGRATIO_SPAN, LOGRATIO_SPAN)
    lp = quantize(torch.where(fix, (old + step).clamp(max=0.0), lp), dtype)
    far = fix & ((lp - old).abs() > LOGRATIO_SPAN)  # the dtype rounded a large log-prob: the same one
    extra["logp"], extra["old_logp"] = torch.where(far, old, lp), old
    if ROLLOUT in extra:  # the engine's log-prob too, as far from the old one as it was drawn (within the span)
        rl = extra[ROLLOUT]
        near = torch.isfinite(drawn_old) & torch.isfinite(old)  # else (a non-finite old one) only its sign
        step = torch.where(near, rl - drawn_old, torch.zeros_like(rl)).clamp(-LOGRATIO_SPAN, LOGRATIO_SPAN)
        fixed = torch.where(near, (old + step).clamp(max=0.0), -rl.abs())
        extra[ROLLOUT] = quantize(torch.where(dead & torch.isfinite(rl), fixed, rl), dtype)
    return extra

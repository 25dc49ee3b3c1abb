"""Kind `policy-loss`: the clipped PPO / GRPO policy objective of one optimizer step.

Input (a `Case`): `extra["logp"]` the current policy's log-probs (what the gradient is taken
with respect to), `extra["old_logp"]` the rollout policy's, and the advantages: `extra["adv"]`
per token (`advantages="token"`, PPO with a critic) or the row's `score` broadcast over its
tokens (`advantages="row"`, the GRPO family's per-sequence advantage); all [B, T], anything at
masked positions. Optional, only where the target's domain says its function takes it (`Domain.rollout_logprobs`):
`extra["rollout_logp"]` [B, T], the rollout (inference) engine's log-probs of the sampled tokens, near `old_logp`
at trainable positions (the trainer and the engine disagree by a small mismatch), anything under the mask; a
rollout / importance-sampling correction reads it. The float64 reference below makes no such correction and never
reads it (an entry with one is judged against the universal invariants only). `trainable` is the loss mask,
`group` / `split` / `ranks` as for `loss-aggregation`. Per token, with r = exp(logp - old_logp), A the advantage,
e_l / e_h the clip range and c the dual-clip constant:

    l = max(-A r, -A clamp(r, 1 - e_l, 1 + e_h))
    l = min(l, -A c)            where A < 0 and dual-clip is on (c > 1)

and L the step's aggregate of l by the `mode` of `loss_aggregation` (token-mean by default).
Outputs ([B, T]): `loss` (L broadcast) and `grad` = dL/dlogp, which is w (-A r) where the
unclipped term is the maximum or r is inside the clip range, 0 where a clip binds (w the token's
aggregation weight). At logp = old_logp the loss is -sum(w A): the closed form `reference` checks
on every case drawn with r = 1.
"""

from __future__ import annotations

import math

import torch

import maskfuzz.oracles.kinds.loss_aggregation as agg
from maskfuzz.oracles.case import Case
from maskfuzz.oracles.tolerance import SAFETY, UNIT_ROUNDOFF

OUTPUTS = ("loss", "grad")
ZERO_OUTPUTS = ("grad",)
# the variant's choices a semantics card infers and a diagnosis tries as neighbours: the aggregation's and the clip's
DIMENSIONS = {**agg.DIMENSIONS, "dual_clip": [None, 3.0], "clip_high": [None, 0.28], "advantages": ["token", "row"]}
# the per-token inputs, poisoned under the mask (`KindSpec.poisoned`); `rollout_logp` only where it is drawn
INPUTS = ("logp", "old_logp", "adv", "rollout_logp")
ROLLOUT = "rollout_logp"
DEFAULTS = {"clip_low": 0.2, "clip_high": None, "dual_clip": None, "advantages": "token", **agg.DEFAULTS}


def options(variant: dict | None) -> dict:
    """The variant with defaults (clip_high None: the same as clip_low); unknown keys rejected."""
    out = dict(DEFAULTS)
    for key, value in (variant or {}).items():
        if key not in DEFAULTS:
            raise ValueError(f"unknown policy-loss option {key!r}; known: {sorted(DEFAULTS)}")
        out[key] = value
    agg.options({k: out[k] for k in agg.DEFAULTS})  # validates the aggregation
    if out["clip_high"] is None:
        out["clip_high"] = out["clip_low"]
    if not (0 <= out["clip_low"] < 1 and out["clip_high"] >= 0):
        raise ValueError(f"the clip range must be 0 <= clip_low < 1 and clip_high >= 0, got {out}")
    if out["dual_clip"] is not None and not out["dual_clip"] > 1:
        raise ValueError(f"the dual-clip constant must be > 1, got {out['dual_clip']!r}")
    if out["advantages"] not in ("token", "row"):
        raise ValueError(f"advantages must be 'token' or 'row', got {out['advantages']!r}")
    return out


def _agg(v: dict) -> dict:
    return {k: v[k] for k in agg.DEFAULTS}


def advantages(case: Case, v: dict) -> torch.Tensor:
    """[B, T] float64: the per-token advantages, or the row's score broadcast (`advantages="row"`)."""
    if v["advantages"] == "row":
        return case.score[:, None].expand(case.shape).clone()
    return case.extra["adv"]


def _terms(case: Case, v: dict) -> dict[str, torch.Tensor]:
    """The per-token pieces at trainable positions (0 elsewhere)."""
    live = case.trainable
    zero = torch.zeros(case.shape, dtype=torch.float64)
    logp = torch.where(live, case.extra["logp"], zero)
    old = torch.where(live, case.extra["old_logp"], zero)
    a = torch.where(live, advantages(case, v), zero)
    r = torch.exp(logp - old)
    lo, hi = 1.0 - float(v["clip_low"]), 1.0 + float(v["clip_high"])
    plain, clipped = -a * r, -a * r.clamp(lo, hi)
    inside = (r >= lo) & (r <= hi)
    return {"live": live, "a": a, "r": r, "plain": plain, "clipped": clipped, "inside": inside, "zero": zero}


def per_token(case: Case, v: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """(l, dl/dlogp) [B, T] in float64 at trainable positions (0 elsewhere), by plain loops."""
    b_rows, t_len = case.shape
    loss = [[0.0] * t_len for _ in range(b_rows)]
    grad = [[0.0] * t_len for _ in range(b_rows)]
    lo, hi = 1.0 - float(v["clip_low"]), 1.0 + float(v["clip_high"])
    adv = advantages(case, v)
    for b, t in case.trainable.nonzero().tolist():
        a = float(adv[b, t])
        d = float(case.extra["logp"][b, t]) - float(case.extra["old_logp"][b, t])
        r = math.exp(d) if d < 709.0 else math.inf
        plain, clipped = -a * r, -a * min(max(r, lo), hi)
        value, slope = (plain, -a * r) if plain >= clipped or lo <= r <= hi else (clipped, 0.0)
        if v["dual_clip"] is not None and a < 0 and -a * float(v["dual_clip"]) < value:
            value, slope = -a * float(v["dual_clip"]), 0.0
        loss[b][t], grad[b][t] = value, slope
    return torch.tensor(loss, dtype=torch.float64), torch.tensor(grad, dtype=torch.float64)


def per_token_vectorised(case: Case, v: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """(l, dl/dlogp) as `per_token`, with tensor operations (the independent form)."""
    x = _terms(case, v)
    value = torch.maximum(x["plain"], x["clipped"])
    slope = torch.where((x["plain"] >= x["clipped"]) | x["inside"], -x["a"] * x["r"], x["zero"])
    if v["dual_clip"] is not None:
        cap = -x["a"] * float(v["dual_clip"])
        binds = (x["a"] < 0) & (cap < value)
        value, slope = torch.where(binds, cap, value), torch.where(binds, x["zero"], slope)
    return torch.where(x["live"], value, x["zero"]), torch.where(x["live"], slope, x["zero"])


def reference(case: Case, variant: dict | None = None, vectorised: bool = False) -> dict[str, torch.Tensor]:
    """loss (broadcast) and grad = dL/dlogp in float64: loops, or the vectorised form."""
    v = options(variant)
    tok, dtok = (per_token_vectorised if vectorised else per_token)(case, v)
    w = agg.reference(case.replace(dtype="float64", extra={"loss": tok}), _agg(v), vectorised=vectorised)["grad"]
    if vectorised:
        total = float((w * tok).sum())
    else:
        total = 0.0
        for b, t in case.trainable.nonzero().tolist():
            total += float(w[b, t]) * float(tok[b, t])
    return {"loss": torch.full(case.shape, total, dtype=torch.float64), "grad": w * dtok}


def condition(case: Case, variant: dict | None = None) -> dict[str, torch.Tensor]:
    """In units of u: the aggregation's own rounding plus that of r = exp(logp - old_logp), whose
    relative error is about (|logp| + |old_logp| + 2) u; where two branches tie within rounding
    (the unclipped and the clipped term, or the dual clip) either branch's slope is correct."""
    v = options(variant)
    x = _terms(case, v)
    live, zero = x["live"], x["zero"]
    tok, _ = per_token_vectorised(case, v)
    sub = case.replace(dtype="float64", extra={"loss": tok})
    base = agg.condition(sub, _agg(v))
    w = agg.reference(sub, _agg(v), vectorised=True)["grad"]
    mag = sum(torch.where(live, case.extra[n], zero).abs() for n in ("logp", "old_logp")) + 2.0
    term = (x["a"] * x["r"]).abs() * mag
    u = UNIT_ROUNDOFF[case.dtype]
    near = lambda p, q: live & ((p - q).abs() <= 8.0 * u * mag * torch.maximum(p.abs(), q.abs()))  # noqa: E731
    ambiguous = torch.where(near(x["plain"], x["clipped"]) & ~x["inside"], (x["a"] * x["r"]).abs(), zero)
    if v["dual_clip"] is not None:
        cap = -x["a"] * float(v["dual_clip"])
        tie = near(torch.maximum(x["plain"], x["clipped"]), cap) & (x["a"] < 0)
        ambiguous = torch.maximum(ambiguous, torch.where(tie, (x["a"] * x["r"]).abs(), zero))
    # a ratio at a clip boundary: inside in float64 may be outside in the dtype, and clamp's slope there is 1 or 0
    lo, hi = 1.0 - float(v["clip_low"]), 1.0 + float(v["clip_high"])
    gap = torch.minimum((x["r"] - lo).abs(), (x["r"] - hi).abs())
    edge = live & (gap <= 8.0 * u * mag * x["r"])
    ambiguous = torch.maximum(ambiguous, torch.where(edge, (x["a"] * x["r"]).abs(), zero))
    return {
        "loss": base["loss"] + float((w * term).sum()) * 8.0,
        "grad": base["grad"] + w * term * 8.0 + w * ambiguous / (SAFETY * u),
    }


def peak(case: Case, variant: dict | None = None) -> float:
    """The largest intermediate a correct implementation forms: sum of |A| r."""
    x = _terms(case, options(variant))
    return float(torch.where(x["live"], (x["a"] * x["r"]).abs(), x["zero"]).sum())

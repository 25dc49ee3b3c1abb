"""Kind `value-loss`: the clipped critic loss of one optimizer step, aggregated like a policy loss.

Input (a `Case`): `extra["v"]` the critic's predictions, `extra["v_old"]` the values at rollout
time, `extra["ret"]` the returns, all [B, T] (anything at masked positions), `trainable` the loss
mask, and `split` / `ranks` as for `loss-aggregation`. Per token, with c the clip range:

    v_c = v_old + clamp(v - v_old, -c, c)
    l   = h * max((v - R)^2, (v_c - R)^2)          (h = 1/2 by default; torchrl's l2 has h = 1)

and L the step's aggregate of l by the `mode` of `loss_aggregation` (token-mean by default).
Outputs ([B, T]): `loss` (L broadcast) and `grad` = dL/dv. The property `clip-bound` checks the
framework against itself: L is never below the unclipped loss h (v - R)^2 aggregated, and equals
it when v_old = v (the clip range then never binds: an infinite clip range).
"""

from __future__ import annotations

import torch

import maskfuzz.oracles.kinds.loss_aggregation as agg
from maskfuzz.oracles.case import Case
from maskfuzz.oracles.tolerance import SAFETY, UNIT_ROUNDOFF

OUTPUTS = ("loss", "grad")
ZERO_OUTPUTS = ("grad",)
# the variant's choices a semantics card infers and a diagnosis tries as neighbours: the aggregation's, and the half
DIMENSIONS = {**agg.DIMENSIONS, "half": [True, False]}
DEFAULTS = {"clip": 0.5, "half": True, **agg.DEFAULTS}


def options(variant: dict | None) -> dict:
    out = dict(DEFAULTS)
    for key, value in (variant or {}).items():
        if key not in DEFAULTS:
            raise ValueError(f"unknown value-loss option {key!r}; known: {sorted(DEFAULTS)}")
        out[key] = value
    agg.options({k: out[k] for k in agg.DEFAULTS})  # validates the aggregation
    if not out["clip"] > 0:
        raise ValueError(f"the clip range must be positive, got {out['clip']!r}")
    return out


def _agg(v: dict) -> dict:
    return {k: v[k] for k in agg.DEFAULTS}


def per_token(case: Case, v: dict, clipped: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """(l, dl/dv) [B, T] in float64 at trainable positions (0 elsewhere)."""
    live = case.trainable
    zero = torch.zeros(case.shape, dtype=torch.float64)
    pred = torch.where(live, case.extra["v"], zero)
    old = torch.where(live, case.extra["v_old"], zero)
    ret = torch.where(live, case.extra["ret"], zero)
    h = 0.5 if v["half"] else 1.0
    plain = (pred - ret) ** 2
    if not clipped:
        return torch.where(live, h * plain, zero), torch.where(live, 2 * h * (pred - ret), zero)
    c = float(v["clip"])
    delta = pred - old
    inside = delta.abs() < c
    vc = old + delta.clamp(-c, c)
    clip_sq = (vc - ret) ** 2
    loss = h * torch.maximum(plain, clip_sq)
    d_plain = 2 * h * (pred - ret)
    d_clip = torch.where(inside, 2 * h * (vc - ret), zero)
    grad = torch.where(plain >= clip_sq, d_plain, d_clip)
    return torch.where(live, loss, zero), torch.where(live, grad, zero)


def reference(case: Case, variant: dict | None = None, vectorised: bool = False, clipped: bool = True) -> dict:
    """loss (broadcast) and grad = dL/dv in float64; `clipped=False` is the unclipped loss."""
    v = options(variant)
    tok, dtok = per_token(case, v, clipped)
    w = agg.reference(case.replace(dtype="float64", extra={"loss": tok}), _agg(v), vectorised=vectorised)["grad"]
    if vectorised:
        total = float((w * tok).sum())
    else:
        total = 0.0
        for b, t in case.trainable.nonzero().tolist():
            total += float(w[b, t]) * float(tok[b, t])
    return {"loss": torch.full(case.shape, total, dtype=torch.float64), "grad": w * dtok}


def condition(case: Case, variant: dict | None = None) -> dict[str, torch.Tensor]:
    v = options(variant)
    live = case.trainable
    zero = torch.zeros(case.shape, dtype=torch.float64)
    mag = sum(torch.where(live, case.extra[n].abs(), zero) for n in ("v", "v_old", "ret"))
    tok, _ = per_token(case, v)
    base = agg.condition(case.replace(dtype="float64", extra={"loss": tok}), _agg(v))
    w = agg.reference(case.replace(dtype="float64", extra={"loss": tok}), _agg(v), vectorised=True)["grad"]
    # squares of differences: the rounding of (v - R) in the dtype scales with |v| + |R|, then doubles
    wide = float((w * mag * mag).sum()) * 8.0
    # where the plain and the clipped squares tie in the dtype, max() may route the gradient either
    # way (or split it): a correct implementation can give either branch's derivative there
    pred, old, ret = (torch.where(live, case.extra[n], zero) for n in ("v", "v_old", "ret"))
    c = float(v["clip"])
    vc = old + (pred - old).clamp(-c, c)
    plain, clip_sq = (pred - ret) ** 2, (vc - ret) ** 2
    u = UNIT_ROUNDOFF[case.dtype]
    tie = live & ((plain - clip_sq).abs() <= 8.0 * u * torch.maximum(plain, clip_sq))
    h = 0.5 if v["half"] else 1.0
    d_plain = 2 * h * (pred - ret)
    d_clip = torch.where((pred - old).abs() < c, 2 * h * (vc - ret), zero)
    ambiguous = torch.where(tie, w * (d_plain - d_clip).abs() / (SAFETY * u), zero)
    return {"loss": base["loss"] + wide, "grad": base["grad"] + w * mag * 8.0 + ambiguous}


def peak(case: Case, variant: dict | None = None) -> float:
    live = case.trainable
    zero = torch.zeros(case.shape, dtype=torch.float64)
    mag = sum(torch.where(live, case.extra[n].abs(), zero) for n in ("v", "v_old", "ret"))
    return float((mag * mag).sum())

"""Kind `normalization`: masked mean / variance / whitening of a [B, T] tensor.

Input (a `Case`): `extra["x"]` [B, T] (anything at masked positions), `trainable` the mask,
`group[b]` for group-level statistics. Output: `out[b, t]` at trainable positions.

Variants (`Declared.variant`):

    level       "batch" (default) | "row" | "group"      which positions share a statistic
    unbiased    True (default): var = sum (x - mean)^2 / (n - 1); False: / n
    eps         1e-8
    eps_place   "var" (default): (x - mean) / sqrt(var + eps) | "std": (x - mean) / (std + eps)
                | "floor": (x - mean) / sqrt(max(var, eps))  (`var.clamp(min=eps).rsqrt()`)
    shift_mean  True (default); False adds the mean back (verl's masked_whiten(shift_mean=False))
    output      "whiten" (default) | "mean" (the statistic broadcast to the trainable positions)

Statistics are two-pass float64 sums over the trainable positions of the level. A level with
fewer than two positions (unbiased) or none is undefined: `reference` returns None there.
"""

from __future__ import annotations

import math

import torch

from maskfuzz.oracles.case import Case

OUTPUTS = ("out",)
# the variant's choices a semantics card infers and a diagnosis tries as neighbours, with their candidates
DIMENSIONS = {"unbiased": [True, False], "eps_place": ["var", "std", "floor"], "shift_mean": [True, False]}
DEFAULTS = {"level": "batch", "unbiased": True, "eps": 1e-8, "eps_place": "var", "shift_mean": True, "output": "whiten"}


def options(variant: dict | None) -> dict:
    out = dict(DEFAULTS)
    for key, value in (variant or {}).items():
        if key not in DEFAULTS:
            raise ValueError(f"unknown normalization option {key!r}; known: {sorted(DEFAULTS)}")
        out[key] = value
    if out["level"] not in ("batch", "row", "group") or out["eps_place"] not in ("var", "std", "floor"):
        raise ValueError(f"unknown normalization variant {out}")
    if out["output"] not in ("whiten", "mean"):
        raise ValueError(f"unknown normalization output {out['output']!r}")
    return out


def units(case: Case, level: str) -> torch.Tensor:
    """[B] int64: the statistic each row belongs to (0 for the batch, the row, or its group)."""
    b_rows = case.shape[0]
    if level == "batch":
        return torch.zeros(b_rows, dtype=torch.int64)
    if level == "row":
        return torch.arange(b_rows)
    groups = case.group if case.group is not None else torch.zeros(b_rows, dtype=torch.int64)
    return torch.unique(groups, return_inverse=True)[1]


def defined(case: Case, variant: dict | None = None) -> bool:
    """Whether every unit that has trainable positions has enough of them for its statistic."""
    v = options(variant)
    need = 2 if (v["unbiased"] and v["output"] == "whiten") else 1
    unit = units(case, v["level"])
    counts = torch.zeros(int(unit.max()) + 1, dtype=torch.int64).index_add_(0, unit, case.trainable.sum(dim=1))
    return bool(((counts == 0) | (counts >= need)).all()) and bool(counts.sum() > 0)


def reference(case: Case, variant: dict | None = None, vectorised: bool = False) -> dict[str, torch.Tensor] | None:
    """out [B, T] at trainable positions, 0 elsewhere; None where a statistic is undefined."""
    v = options(variant)
    if not defined(case, v):
        return None
    x, live = case.extra["x"], case.trainable
    unit = units(case, v["level"])
    out = torch.zeros(case.shape, dtype=torch.float64)
    if vectorised:
        k = int(unit.max()) + 1
        w = live.to(torch.float64)
        xs = torch.where(live, x, torch.zeros_like(x))
        n = torch.zeros(k, dtype=torch.float64).index_add_(0, unit, w.sum(1))
        mean = (torch.zeros(k, dtype=torch.float64).index_add_(0, unit, xs.sum(1)) / n.clamp(min=1))[unit][:, None]
        ss = torch.zeros(k, dtype=torch.float64).index_add_(0, unit, (((xs - mean) * w) ** 2).sum(1))
        var = (ss / (n - 1 if v["unbiased"] else n).clamp(min=1))[unit][:, None]
        res = _finish(x, mean, var, v)
        return {"out": torch.where(live, res, out)}
    for u in unit.unique().tolist():
        rows = (unit == u).nonzero().flatten().tolist()
        pos = [(b, t) for b in rows for t in range(case.shape[1]) if bool(live[b, t])]
        if not pos:
            continue
        vals = [float(x[b, t]) for b, t in pos]
        n = len(vals)
        mean = sum(vals) / n
        var = sum((y - mean) ** 2 for y in vals) / max(1, (n - 1) if v["unbiased"] else n)
        for (b, t), y in zip(pos, vals):
            f64 = torch.float64
            out[b, t] = float(
                _finish(torch.tensor(y, dtype=f64), torch.tensor(mean, dtype=f64), torch.tensor(var, dtype=f64), v)
            )
    return {"out": out}


def _finish(x, mean, var, v: dict):
    if v["output"] == "mean":
        return mean.expand_as(x) if isinstance(x, torch.Tensor) else mean
    if v["eps_place"] == "floor":
        denom = var.clamp(min=v["eps"]).sqrt()
    else:
        denom = (var + v["eps"]).sqrt() if v["eps_place"] == "var" else var.sqrt() + v["eps"]
    w = (x - mean) / denom
    return w if v["shift_mean"] else w + mean


def condition(case: Case, variant: dict | None = None) -> torch.Tensor:
    """[B, T]: rounding of a dtype two-pass implementation in units of u: max |x| of the unit over
    its scale (the cancellation in x - mean), plus |w|, times log2 of the count."""
    v = options(variant)
    x, live = case.extra["x"], case.trainable
    unit = units(case, v["level"])
    cond = torch.zeros(case.shape, dtype=torch.float64)
    for u in unit.unique().tolist():
        rows = unit == u
        sel = live & rows[:, None]
        n = int(sel.sum())
        if n == 0:
            continue
        vals = x[sel]
        big = float(vals.abs().max())
        if v["output"] == "mean":
            scale = big
        else:
            var = float(((vals - vals.mean()) ** 2).sum()) / max(1, n - 1 if v["unbiased"] else n)
            s = math.sqrt(var + v["eps"]) if v["eps_place"] != "std" else math.sqrt(var) + v["eps"]
            scale = big / s + (big if not v["shift_mean"] else 0.0)
        cond[rows] = (scale + 1.0) * (2.0 + math.log2(n))
    return cond


def peak(case: Case, variant: dict | None = None) -> float:
    """The largest intermediate a two-pass implementation forms: the sum of |x| or of the squared
    deviations over a unit (beyond the dtype's range, an overflow is the dtype's, not a defect)."""
    v = options(variant)
    x, live = case.extra["x"], case.trainable
    unit = units(case, v["level"])
    out = 0.0
    for u in unit.unique().tolist():
        vals = x[live & (unit == u)[:, None]]
        if vals.numel():
            out = max(out, float(vals.abs().sum()), float(((vals - vals.mean()) ** 2).sum()))
    return out


def centred(case: Case, v: dict) -> tuple[Case, float] | None:
    """(`case` with `x` centred on its mean over trainable positions, the largest such |x|) where a shift
    changes nothing in exact arithmetic (shift-mean whitening), else None: the diagnosis's probe for
    cancellation at a large offset (`oracles.kinds.diagnosis`)."""
    if not (v["shift_mean"] and v["output"] == "whiten"):
        return None
    live = case.trainable
    x = case.extra["x"]
    if not live.any():
        return None
    return case.replace(extra={**case.extra, "x": torch.where(live, x - x[live].mean(), x)}), float(x[live].abs().max())

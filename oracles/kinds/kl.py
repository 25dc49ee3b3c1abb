"""Kind `kl`: per-token KL estimators between the policy and the reference policy.

Input (a `Case`): `extra["logp"]`, `extra["ref_logp"]` [B, T] log-probabilities (anything at
masked positions), `trainable` the response mask. Output: `kl[b, t]` at trainable positions
(masked positions are the framework's business unless it promises zeros).

With d = logp - ref_logp (the log-ratio of the policy to the reference):

    k1 / "kl"           d
    abs                 |d|
    k2 / "mse"          d^2 / 2
    k3 / "low_var_kl"   exp(-d) - 1 + d          (>= 0; the unbiased low-variance estimator)

Variants (`Declared.variant`): `estimator` (one of the names above), `clamp_d` (lo, hi) applied
to d first, `clamp` (lo, hi) applied to the estimate (verl clamps k3 to [-10, 10]).
"""

from __future__ import annotations

import math

import torch

from maskfuzz.oracles.case import Case

OUTPUTS = ("kl",)
ESTIMATORS = {"k1": "k1", "kl": "k1", "abs": "abs", "k2": "k2", "mse": "k2", "k3": "k3", "low_var_kl": "k3"}
DEFAULTS = {"estimator": "k1", "clamp_d": None, "clamp": None}


def options(variant: dict | None) -> dict:
    out = dict(DEFAULTS)
    for key, value in (variant or {}).items():
        if key not in DEFAULTS:
            raise ValueError(f"unknown kl option {key!r}; known: {sorted(DEFAULTS)}")
        out[key] = value
    if out["estimator"] not in ESTIMATORS:
        raise ValueError(f"unknown KL estimator {out['estimator']!r}; known: {sorted(ESTIMATORS)}")
    return out


def estimate(d: float, v: dict) -> float:
    """One token's estimate from its log-ratio `d` (the scalar reference)."""
    if v["clamp_d"] is not None:
        d = min(max(d, v["clamp_d"][0]), v["clamp_d"][1])
    name = ESTIMATORS[v["estimator"]]
    if name == "k1":
        k = d
    elif name == "abs":
        k = abs(d)
    elif name == "k2":
        k = 0.5 * d * d
    else:
        k = math.expm1(-d) + d if -d < 709.0 else math.inf
    if v["clamp"] is not None:
        k = min(max(k, v["clamp"][0]), v["clamp"][1])
    return k


def reference(case: Case, variant: dict | None = None, vectorised: bool = False) -> dict[str, torch.Tensor]:
    """kl [B, T]: the estimate at trainable positions, 0 elsewhere (a loop, or vectorised)."""
    v = options(variant)
    d = case.extra["logp"] - case.extra["ref_logp"]
    live = case.trainable
    if vectorised:
        x = d if v["clamp_d"] is None else d.clamp(*v["clamp_d"])
        name = ESTIMATORS[v["estimator"]]
        k = {"k1": x, "abs": x.abs(), "k2": 0.5 * x * x}.get(name)
        if k is None:
            k = torch.expm1(-x) + x
        if v["clamp"] is not None:
            k = k.clamp(*v["clamp"])
        return {"kl": torch.where(live, k, torch.zeros_like(k))}
    out = torch.zeros(case.shape, dtype=torch.float64)
    for b, t in live.nonzero().tolist():
        out[b, t] = estimate(float(d[b, t]), v)
    return {"kl": out}


def condition(case: Case, variant: dict | None = None) -> torch.Tensor:
    """[B, T]: rounding of a dtype implementation in units of u: the log-probs' magnitude (the
    difference cancels) times the estimator's slope there."""
    v = options(variant)
    lp, rp = case.extra["logp"], case.extra["ref_logp"]
    live = case.trainable
    mag = torch.where(live, lp.abs() + rp.abs(), torch.zeros_like(lp))
    d = torch.where(live, lp - rp, torch.zeros_like(lp))
    slope = {"k1": 1.0, "abs": 1.0, "k2": d.abs(), "k3": (torch.exp(-d) - 1).abs() + 1.0}
    s = slope[ESTIMATORS[v["estimator"]]]
    return (mag + 1.0) * (s if isinstance(s, torch.Tensor) else torch.full_like(mag, s)) * 4.0

"""Kind `kl`: per-token KL estimators between the policy and the reference policy.

Input (a `Case`): `extra["logp"]`, `extra["ref_logp"]` [B, T] log-probabilities (anything at
masked positions), `trainable` the response mask; with a `ratio` variant also
`extra["old_logp"]` [B, T], the log-probs of the policy that sampled the tokens (anything at
masked positions; absent = on-policy, old = logp, ratio 1). Output: `kl[b, t]` at trainable
positions (masked positions are the framework's business unless it promises zeros).

With d = logp - ref_logp (the log-ratio of the policy to the reference):

    k1 / "kl"           d
    abs                 |d|
    k2 / "mse"          d^2 / 2
    k3 / "low_var_kl"   exp(-d) - 1 + d          (>= 0; the unbiased low-variance estimator)

Variants (`Declared.variant`): `estimator` (one of the names above), `clamp_d` (lo, hi) applied
to d first, `clamp` (lo, hi) applied to the estimate (verl clamps k3 to [-10, 10]), and `ratio`,
the importance-sampling correction of an off-policy KL (TRL GRPO's `use_bias_correction_kl`,
`per_token_kl * coef_1`): the estimate times w, with x = logp - old_logp,

    None         w = 1 (default: no weighting)
    "token"      w[b, t] = exp(x[b, t])
    "sequence"   w[b, t] = exp(sum_t' x[b, t'] m[b, t'] / max(sum_t' m[b, t'], 1)), the masked row mean of
                 the log-ratio (m = trainable); a row without a trainable token has no output to weigh

unclamped (TRL does not clamp the KL's coef_1). `ratio_level` ("token" | "sequence", default None)
overrides the level of a `ratio` that is on, so a framework's on/off option and its level option
compose (TRL's `importance_sampling_level`); it does nothing while `ratio` is None.
"""

from __future__ import annotations

import math

import torch

from maskfuzz.oracles.case import Case

OUTPUTS = ("kl",)
# the variant's choices a semantics card infers and a diagnosis tries as neighbours, with their candidates
DIMENSIONS = {"estimator": ["k1", "abs", "k2", "k3"]}
ESTIMATORS = {"k1": "k1", "kl": "k1", "abs": "abs", "k2": "k2", "mse": "k2", "k3": "k3", "low_var_kl": "k3"}
RATIOS = (None, "token", "sequence")
DEFAULTS = {"estimator": "k1", "clamp_d": None, "clamp": None, "ratio": None, "ratio_level": None}


def options(variant: dict | None) -> dict:
    out = dict(DEFAULTS)
    for key, value in (variant or {}).items():
        if key not in DEFAULTS:
            raise ValueError(f"unknown kl option {key!r}; known: {sorted(DEFAULTS)}")
        out[key] = value
    if out["estimator"] not in ESTIMATORS:
        raise ValueError(f"unknown KL estimator {out['estimator']!r}; known: {sorted(ESTIMATORS)}")
    for key in ("ratio", "ratio_level"):
        if out[key] not in RATIOS:
            raise ValueError(f"unknown kl {key} {out[key]!r}; known: {list(RATIOS)}")
    return out


def level(v: dict) -> str | None:
    """The level of the importance weight in force: None (no weight), "token" or "sequence"."""
    return (v["ratio_level"] or v["ratio"]) if v["ratio"] is not None else None


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


def _old(case: Case) -> torch.Tensor:
    return case.extra.get("old_logp", case.extra["logp"])


def log_weights(case: Case, v: dict) -> torch.Tensor:
    """[B, T] log of the importance weight (vectorised; 0 at masked positions and without a ratio)."""
    live = case.trainable
    zero = torch.zeros(case.shape, dtype=torch.float64)
    how = level(v)
    if how is None:
        return zero
    x = torch.where(live, case.extra["logp"] - _old(case), zero)
    if how == "sequence":
        n = live.sum(-1, keepdim=True).clamp(min=1).to(torch.float64)
        x = (x.sum(-1, keepdim=True) / n).expand(case.shape)
    return torch.where(live, x, zero)


def _loop_weights(case: Case, v: dict) -> list[list[float]]:
    """The importance weight per position as a plain loop (1 where there is none)."""
    b_rows, t_len = case.shape
    how = level(v)
    out = [[1.0] * t_len for _ in range(b_rows)]
    if how is None:
        return out
    lp, old, live = case.extra["logp"].tolist(), _old(case).tolist(), case.trainable.tolist()
    for b in range(b_rows):
        xs = [lp[b][t] - old[b][t] for t in range(t_len) if live[b][t]]
        if how == "sequence":
            w = math.exp(math.fsum(xs) / len(xs)) if xs else 1.0
            out[b] = [w] * t_len
        else:
            for t in range(t_len):
                if live[b][t]:
                    out[b][t] = math.exp(lp[b][t] - old[b][t])
    return out


def reference(case: Case, variant: dict | None = None, vectorised: bool = False) -> dict[str, torch.Tensor]:
    """kl [B, T]: the estimate (times the importance weight) at trainable positions, 0 elsewhere (a
    loop, or vectorised)."""
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
        if level(v) is not None:
            k = k * torch.exp(log_weights(case, v))
        return {"kl": torch.where(live, k, torch.zeros_like(k))}
    out = torch.zeros(case.shape, dtype=torch.float64)
    w = _loop_weights(case, v)
    for b, t in live.nonzero().tolist():
        out[b, t] = estimate(float(d[b, t]), v) * w[b][t]
    return {"kl": out}


def peak(case: Case, variant: dict | None = None) -> float:
    """The largest intermediate a correct implementation forms beyond the estimate: the importance
    weight (0 without one)."""
    v = options(variant)
    if level(v) is None or not bool(case.trainable.any()):
        return 0.0
    return float(torch.exp(log_weights(case, v))[case.trainable].max())


def condition(case: Case, variant: dict | None = None) -> torch.Tensor:
    """[B, T]: rounding of a dtype implementation in units of u: the log-probs' magnitude (the
    difference cancels) times the estimator's slope there; with an importance weight w, that times
    w plus |estimate| w times the rounding of the weight's log-ratio (|logp| + |old_logp| + 1, a
    sequence weight's masked row mean of them times the log of the row length)."""
    v = options(variant)
    lp, rp = case.extra["logp"], case.extra["ref_logp"]
    live = case.trainable
    mag = torch.where(live, lp.abs() + rp.abs(), torch.zeros_like(lp))
    d = torch.where(live, lp - rp, torch.zeros_like(lp))
    slope = {"k1": 1.0, "abs": 1.0, "k2": d.abs(), "k3": (torch.exp(-d) - 1).abs() + 1.0}
    s = slope[ESTIMATORS[v["estimator"]]]
    cond = (mag + 1.0) * (s if isinstance(s, torch.Tensor) else torch.full_like(mag, s)) * 4.0
    how = level(v)
    if how is None:
        return cond
    zero = torch.zeros_like(lp)
    w = torch.where(live, torch.exp(log_weights(case, v)), zero)
    k = reference(case, {**v, "ratio": None}, vectorised=True)["kl"].abs()
    wmag = torch.where(live, lp.abs() + _old(case).abs(), zero) + 1.0
    if how == "sequence":
        n = live.sum(-1, keepdim=True).clamp(min=1).to(torch.float64)
        wmag = (torch.where(live, wmag, zero).sum(-1, keepdim=True) / n * (torch.log2(n) + 2.0)).expand(case.shape)
    return torch.where(live, w * (cond + 4.0 * k * wmag), zero)

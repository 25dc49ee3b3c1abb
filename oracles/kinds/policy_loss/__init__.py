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
With `ratio="sequence"` or `"sequence-mean"` (GSPO, arXiv 2507.18071) r is the row's sequence ratio
s_b = exp(min(mean over the row's trainable tokens of (logp - old_logp), seq_log_ratio_max)) at every trainable
token of row b (`seq_log_ratio_max` None: no cap; verl and SkyRL cap the log at 10). The two differ in the gradient
only: "sequence" is GSPO-token's straight-through form log s_bt = logp_t - sg(logp_t) + sg(log s_b) (verl
core_algos.py:1583-1590 at 0.9.1, SkyRL ppo_utils.py:701-709 at 0.3.1), so token t's slope is its own
w_t dl_t/dlog s; "sequence-mean" takes the gradient through the mean (slime's compute_gspo_kl, TRL's sequence
level), so every trainable token k of the row gets (1/n_b) sum_t w_t dl_t/dlog s. Where A and w are constant in
the row the two agree; per-token advantages tell them apart. A capped log ratio has slope 0.
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
RATIOS = ("token", "sequence", "sequence-mean")
DEFAULTS = {
    "clip_low": 0.2,
    "clip_high": None,
    "dual_clip": None,
    "advantages": "token",
    "ratio": "token",
    "seq_log_ratio_max": None,
    **agg.DEFAULTS,
}


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
    if out["ratio"] not in RATIOS:
        raise ValueError(f"ratio must be one of {RATIOS}, got {out['ratio']!r}")
    if out["seq_log_ratio_max"] is not None and out["ratio"] == "token":
        raise ValueError("seq_log_ratio_max caps a sequence ratio; the token ratio has none")
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
    n = live.sum(-1)
    if v["ratio"] == "token":
        log_r, capped = logp - old, torch.zeros(case.shape, dtype=torch.bool)
        mag = (logp.abs() + old.abs()) + 2.0
    else:  # the row's mean log-ratio over its trainable tokens, broadcast (0 on a row without one)
        mean = (logp - old).sum(-1) / n.clamp(min=1)
        cap = v["seq_log_ratio_max"]
        capped = (
            (mean > cap)[:, None].expand(case.shape) if cap is not None else torch.zeros(case.shape, dtype=torch.bool)
        )
        mean = mean.clamp(max=cap) if cap is not None else mean
        log_r = mean[:, None].expand(case.shape)
        # the mean's rounding: each difference's plus the sum's, log2 n deep
        row_mag = (logp.abs() + old.abs()).sum(-1) / n.clamp(min=1) * (torch.log2(n.clamp(min=1).double()) + 1.0)
        mag = row_mag[:, None].expand(case.shape) + 2.0
    r = torch.exp(log_r)
    lo, hi = 1.0 - float(v["clip_low"]), 1.0 + float(v["clip_high"])
    plain, clipped = -a * r, -a * r.clamp(lo, hi)
    inside = (r >= lo) & (r <= hi)
    return {
        "live": live, "a": a, "r": r, "plain": plain, "clipped": clipped, "inside": inside, "zero": zero,
        "n": n, "capped": capped, "mag": torch.where(live, mag, zero),
    }  # fmt: skip


def _row_log_ratios(case: Case, v: dict) -> list[tuple[float, bool]]:
    """(log s_b, capped) per row by loops: the mean log-ratio over the row's trainable tokens, capped."""
    out = []
    for b, row in enumerate(case.trainable.tolist()):
        ts = [t for t, on in enumerate(row) if on]
        total = 0.0
        for t in ts:
            total += float(case.extra["logp"][b, t]) - float(case.extra["old_logp"][b, t])
        mean = total / max(len(ts), 1)
        cap = v["seq_log_ratio_max"]
        out.append((min(mean, cap), True) if cap is not None and mean > cap else (mean, False))
    return out


def per_token(case: Case, v: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """(l, dl/dlog r) [B, T] in float64 at trainable positions (0 elsewhere), by plain loops; r the token's ratio
    or its row's sequence ratio (`ratio`)."""
    b_rows, t_len = case.shape
    loss = [[0.0] * t_len for _ in range(b_rows)]
    grad = [[0.0] * t_len for _ in range(b_rows)]
    lo, hi = 1.0 - float(v["clip_low"]), 1.0 + float(v["clip_high"])
    adv = advantages(case, v)
    rows = _row_log_ratios(case, v) if v["ratio"] != "token" else None
    for b, t in case.trainable.nonzero().tolist():
        a = float(adv[b, t])
        if rows is None:
            d, capped = float(case.extra["logp"][b, t]) - float(case.extra["old_logp"][b, t]), False
        else:
            d, capped = rows[b]
        r = math.exp(d) if d < 709.0 else math.inf
        plain, clipped = -a * r, -a * min(max(r, lo), hi)
        value, slope = (plain, -a * r) if plain >= clipped or lo <= r <= hi else (clipped, 0.0)
        if v["dual_clip"] is not None and a < 0 and -a * float(v["dual_clip"]) < value:
            value, slope = -a * float(v["dual_clip"]), 0.0
        loss[b][t], grad[b][t] = value, 0.0 if capped else slope
    return torch.tensor(loss, dtype=torch.float64), torch.tensor(grad, dtype=torch.float64)


def per_token_vectorised(case: Case, v: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """(l, dl/dlog r) as `per_token`, with tensor operations (the independent form)."""
    x = _terms(case, v)
    value = torch.maximum(x["plain"], x["clipped"])
    slope = torch.where((x["plain"] >= x["clipped"]) | x["inside"], -x["a"] * x["r"], x["zero"])
    if v["dual_clip"] is not None:
        cap = -x["a"] * float(v["dual_clip"])
        binds = (x["a"] < 0) & (cap < value)
        value, slope = torch.where(binds, cap, value), torch.where(binds, x["zero"], slope)
    slope = torch.where(x["capped"], x["zero"], slope)
    return torch.where(x["live"], value, x["zero"]), torch.where(x["live"], slope, x["zero"])


def _through_mean(case: Case, g: torch.Tensor, vectorised: bool) -> torch.Tensor:
    """`ratio="sequence-mean"`: each trainable token of row b gets (1/n_b) sum_t g[b, t] (d log s_b / d logp_k =
    1/n_b), 0 elsewhere."""
    live = case.trainable
    if vectorised:
        row = g.sum(-1) / live.sum(-1).clamp(min=1)
        return torch.where(live, row[:, None].expand(case.shape), torch.zeros_like(g))
    out = torch.zeros_like(g)
    for b, mask in enumerate(live.tolist()):
        ts = [t for t, on in enumerate(mask) if on]
        total = 0.0
        for t in ts:
            total += float(g[b, t])
        for t in ts:
            out[b, t] = total / len(ts)
    return out


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
    grad = w * dtok
    if v["ratio"] == "sequence-mean":
        grad = _through_mean(case, grad, vectorised)
    return {"loss": torch.full(case.shape, total, dtype=torch.float64), "grad": grad}


def condition(case: Case, variant: dict | None = None) -> dict[str, torch.Tensor]:
    """In units of u: the aggregation's own rounding plus that of r = exp(logp - old_logp), whose
    relative error is about (|logp| + |old_logp| + 2) u (a sequence ratio: the row's mean of |logp| + |old_logp|
    times log2 n + 1, plus 2); where two branches tie within rounding
    (the unclipped and the clipped term, or the dual clip) either branch's slope is correct."""
    v = options(variant)
    x = _terms(case, v)
    live, zero = x["live"], x["zero"]
    tok, _ = per_token_vectorised(case, v)
    sub = case.replace(dtype="float64", extra={"loss": tok})
    base = agg.condition(sub, _agg(v))
    w = agg.reference(sub, _agg(v), vectorised=True)["grad"]
    mag = x["mag"]
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
    grad = base["grad"] + w * term * 8.0 + w * ambiguous / (SAFETY * u)
    if v["ratio"] == "sequence-mean":  # the row's mean of the token bounds plus the row sum's own rounding
        n = x["n"].clamp(min=1).double()
        spread = (w * (x["a"] * x["r"]).abs()).sum(-1) / n * (torch.log2(n) + 1.0) * 8.0
        grad = torch.where(live, (grad.sum(-1) / n + spread)[:, None].expand(case.shape), zero)
    return {"loss": base["loss"] + float((w * term).sum()) * 8.0, "grad": grad}


def peak(case: Case, variant: dict | None = None) -> float:
    """The largest intermediate a correct implementation forms: sum of |A| r."""
    x = _terms(case, options(variant))
    return float(torch.where(x["live"], (x["a"] * x["r"]).abs(), x["zero"]).sum())

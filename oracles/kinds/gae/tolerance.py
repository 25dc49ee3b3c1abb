"""GAE's tolerance (`oracles.tolerance` states the policy): the per-position `bounds` of a GAE / returns target
against the float64 reference, from the running error bound of the recursion (and of the whitening)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from maskfuzz.oracles.case import Case
from maskfuzz.oracles.kinds.gae.reference import Recursion, discounted_suffix_sum, gae_packed, recursion
from maskfuzz.oracles.tolerance import FLOOR, SAFETY, UNIT_ROUNDOFF
from maskfuzz.oracles.whitening import Whitening


@dataclass(frozen=True)
class Bounds:
    """Allowed absolute deviation per position, float64 [B, T], for advantages and returns."""

    advantages: torch.Tensor
    returns: torch.Tensor


def bounds(
    case: Case,
    contract: str,
    ref_adv: torch.Tensor,
    ref_ret: torch.Tensor,
    whitening: Whitening | None = None,
    dtype: str | None = None,
    baseline: torch.Tensor | None = None,
) -> Bounds:
    """Per-position tolerances for comparing a target run in `dtype` (default: the case's) with
    the float64 reference `ref_adv`/`ref_ret` of `contract`. With `whitening`, `ref_adv` must be the
    whitened reference and the bound covers the whitening's error amplification too. With a
    per-row `baseline` [B] (ReMax: A = return - b), the advantage carries the return's error and the
    subtraction's rounding."""
    name = dtype or case.dtype
    u = UNIT_ROUNDOFF[name]
    rtol, atol = FLOOR[name]
    rec: Recursion = recursion(case, contract)
    c = case.gamma * case.lam
    adv_p, _ = gae_packed(rec.rewards, rec.values, case.gamma, case.lam)
    nxt_v = torch.zeros_like(rec.values)
    nxt_v[:, :-1] = rec.values[:, 1:]
    nxt_a = torch.zeros_like(adv_p)
    nxt_a[:, :-1] = adv_p[:, 1:]
    local = u * (rec.magnitude + case.gamma * nxt_v.abs() + rec.values.abs() + c * nxt_a.abs() + adv_p.abs())
    err_adv_p = discounted_suffix_sum(local, c)
    err_ret_p = err_adv_p + u * (2 * adv_p.abs() + 2 * rec.values.abs())
    err_adv = rec.scatter(err_adv_p)
    err_ret = rec.scatter(err_ret_p)
    if baseline is not None:
        err_adv = err_ret + u * (ref_ret.abs() + baseline.abs()[:, None]) * case.trainable
    if whitening is not None:
        err_adv = _whitened_error(case.trainable, rec.scatter(adv_p), err_adv, ref_adv, whitening, u)
    adv = atol + rtol * ref_adv.abs() + SAFETY * err_adv
    ret = atol + rtol * ref_ret.abs() + SAFETY * err_ret
    return Bounds(adv, ret)


def _whitened_error(
    mask: torch.Tensor, raw: torch.Tensor, err: torch.Tensor, ref_w: torch.Tensor, spec: Whitening, u: float
) -> torch.Tensor:
    """Propagate the unwhitened error bound `err` through mask-weighted whitening of `raw`."""
    n = int(mask.sum())
    if n == 0:
        return err
    sel = raw[mask]
    var = ((sel - sel.mean()) ** 2).mean() * (n / (n - 1) if spec.unbiased and n > 1 else 1.0)
    s = math.sqrt(float(var) + spec.eps)
    worst = float(err[mask].max())
    scale = float(sel.abs().max()) / s
    n_log = math.log2(n) + 1
    return (err + worst) / s + ref_w.abs() * worst / s + u * n_log * (ref_w.abs() + scale + 1.0)

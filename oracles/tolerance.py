"""The one tolerance policy of the suite.

A target computes in the case's dtype; the reference computes in float64 on the same (already
rounded) inputs. Position (b, t) of an observed output x agrees with the reference `ref` when

    |x - ref| <= atol + rtol * |ref| + SAFETY * E

* `rtol`, `atol`: the floor, torch's `assert_close` defaults for the dtype
  (fp64 1e-7/1e-7, fp32 1.3e-6/1e-5, bf16 1.6e-2/1e-5, fp16 1e-3/1e-5).
* `E`: a first-order running error bound of the recursion itself, so the tolerance widens with the
  length of the recursion and the magnitude of its inputs, and no further. With u the unit
  roundoff of the dtype and c = gamma * lam, over the sequence the contract runs on:

      e_k = u * (|r'_k| + gamma |v'_{k+1}| + |v'_k| + c |A'_{k+1}| + |A'_k|)
      E_k = e_k + c * E_{k+1}                  (advantages)
      E^ret_k = E_k + u * (|A'_k| + |v'_k| + |Ret'_k|)   (returns)

  A leak is a term that does not belong to this sum (a poisoned value, a lost score), so it does
  not widen E: a leak of size L is seen whenever L exceeds the rounding of the true inputs.
* Whitened targets: w = (A - mean) / s with s = sqrt(var + eps); an error d in A moves w by about
  (d_k + max d) / s + |w_k| max d / s, plus the whitening's own rounding u * (|w_k| + n_log).
* `SAFETY` covers evaluation orders other than a serial loop (chunked scans, convolutions).
* A target compared with itself on a perturbed twin also gets `self_slack`, rounding-sized in the
  target's own output magnitude (see there).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from maskfuzz.oracles.case import Case
from maskfuzz.oracles.reference import Recursion, Whitening, discounted_suffix_sum, gae_packed, recursion

UNIT_ROUNDOFF = {"float64": 2.0**-53, "float32": 2.0**-24, "bfloat16": 2.0**-8, "float16": 2.0**-11}
FLOOR = {  # (rtol, atol): torch.testing.assert_close defaults
    "float64": (1e-7, 1e-7),
    "float32": (1.3e-6, 1e-5),
    "bfloat16": (1.6e-2, 1e-5),
    "float16": (1e-3, 1e-5),
}
SAFETY = 8.0


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


def self_slack(dtype: str, *outputs: torch.Tensor) -> float:
    """Extra absolute slack when a target is compared with *itself* on a perturbed twin (row
    order, an inserted gap, a clean twin of a poisoned case): the two runs round differently in
    proportion to the target's own magnitudes, which can exceed the reference's (a whitening of
    large raw advantages, say). SAFETY * u * (log2 n + 1) * max |output|: rounding-sized, so a
    real coupling or leak (relative size >> u) still shows."""
    finite = [x[torch.isfinite(x)] for x in outputs if x.numel()]
    finite = [x for x in finite if x.numel()]
    if not finite:
        return 0.0
    scale = max(float(x.abs().max()) for x in finite)
    n = sum(x.numel() for x in finite)
    return SAFETY * UNIT_ROUNDOFF[dtype] * (math.log2(n) + 1) * scale


def mismatches(
    observed: torch.Tensor, expected: torch.Tensor, bound: torch.Tensor, where: torch.Tensor
) -> torch.Tensor:
    """bool [B, T]: positions in `where` at which `observed` lies outside `expected` +- `bound`.

    A non-finite observation never agrees (NaN compares false); nor does a finite one where the
    expectation is non-finite."""
    obs = observed.to(torch.float64)
    ok = (obs - expected).abs() <= bound
    ok = ok | ((obs == expected) & torch.isinf(expected))
    return where & ~ok


def kind_bound(dtype: str, ref: torch.Tensor, condition: torch.Tensor) -> torch.Tensor:
    """The bound of the kinds beyond GAE (`oracles.kinds`): the floor plus SAFETY * u * condition,
    where the kind's `condition` is the magnitude a correct implementation in `dtype` rounds at
    (the inputs' scale over the normaliser, times the log of the reduction length)."""
    rtol, atol = FLOOR[dtype]
    return atol + rtol * ref.abs() + SAFETY * UNIT_ROUNDOFF[dtype] * condition

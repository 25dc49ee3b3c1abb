"""The one tolerance policy of the suite.

A target computes in the case's dtype; the reference computes in float64 on the same (already
rounded) inputs. Position (b, t) of an observed output x agrees with the reference `ref` when

    |x - ref| <= atol + rtol * |ref| + SAFETY * E

* `rtol`, `atol`: the floor, torch's `assert_close` defaults for the dtype
  (fp64 1e-7/1e-7, fp32 1.3e-6/1e-5, bf16 1.6e-2/1e-5, fp16 1e-3/1e-5).
* `E`: a kind's own bound. For GAE (`oracles.kinds.gae.tolerance.bounds`) a first-order running error
  bound of the recursion itself, so the tolerance widens with the length of the recursion and the
  magnitude of its inputs, and no further. With u the unit
  roundoff of the dtype and c = gamma * lam, over the sequence the contract runs on:

      e_k = u * (|r'_k| + gamma |v'_{k+1}| + |v'_k| + c |A'_{k+1}| + |A'_k|)
      E_k = e_k + c * E_{k+1}                  (advantages)
      E^ret_k = E_k + u * (|A'_k| + |v'_k| + |Ret'_k|)   (returns)

  A leak is a term that does not belong to this sum (a poisoned value, a lost score), so it does
  not widen E: a leak of size L is seen whenever L exceeds the rounding of the true inputs.
* Whitened targets: w = (A - mean) / s with s = sqrt(var + eps); an error d in A moves w by about
  (d_k + max d) / s + |w_k| max d / s, plus the whitening's own rounding u * (|w_k| + n_log).
* The kinds beyond GAE: `kind_bound`, SAFETY * u times the kind's `condition` (`oracles.kinds`).
* `SAFETY` covers evaluation orders other than a serial loop (chunked scans, convolutions).
* A target compared with itself on a perturbed twin also gets `self_slack`, rounding-sized in the
  target's own output magnitude (see there).
"""

from __future__ import annotations

import math

import torch

UNIT_ROUNDOFF = {"float64": 2.0**-53, "float32": 2.0**-24, "bfloat16": 2.0**-8, "float16": 2.0**-11}
FLOOR = {  # (rtol, atol): torch.testing.assert_close defaults
    "float64": (1e-7, 1e-7),
    "float32": (1.3e-6, 1e-5),
    "bfloat16": (1.6e-2, 1e-5),
    "float16": (1e-3, 1e-5),
}
SAFETY = 8.0


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

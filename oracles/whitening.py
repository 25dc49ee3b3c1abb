"""Whitening, for targets that whiten inside: the promise (`Whitening`, part of `oracles.declared.Declared`)
and its float64 form (`masked_whiten`), shared by the kinds (GAE's whitened advantages, the judges)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Whitening:
    """Mask-weighted whitening over the whole batch, as a target does it inside.

    w = (x - mean) / sqrt(var + eps), mean and var over trainable positions only; var with the
    Bessel correction when `unbiased`; `shift_mean=False` adds the mean back; `floor=True` uses
    max(var, eps) instead of var + eps (OpenRLHF's `var.clamp(min=eps).rsqrt()`).
    """

    unbiased: bool = True
    eps: float = 1e-8
    shift_mean: bool = True
    floor: bool = False


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, spec: Whitening) -> torch.Tensor:
    """Whiten float64 `x` [B, T] with statistics over bool `mask` [B, T]. Unmasked positions are
    whitened too (they are what the target would emit there); poison never enters the stats."""
    sel = x[mask]
    n = sel.numel()
    if n == 0:
        raise ValueError("whitening needs at least one trainable position")
    mean = sel.mean()
    var = ((sel - mean) ** 2).mean()
    if spec.unbiased:
        if n == 1:
            raise ValueError("unbiased whitening needs at least two trainable positions")
        var = var * n / (n - 1)
    out = (x - mean) * torch.rsqrt(var.clamp(min=spec.eps) if spec.floor else var + spec.eps)
    return out + mean if not spec.shift_mean else out

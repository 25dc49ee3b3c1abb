"""How bad a defect is (`shared/design/kinds.md`, Severity), graded as a maintainer would.

    high    a wrong finite signal that changes the direction or the relative weight of samples
            or tokens, on pipeline input
    medium  a uniform rescale of one loss term (its weight against the other terms moves), or a
            crash on valid pipeline input
    low     non-finite leaks, degenerate configurations (groups of one, an all-empty step),
            precision only, outputs that nothing reads

An api-only finding is never high. Only defects (findings that break a promise) are graded.
"""

from __future__ import annotations

import torch

from maskfuzz.oracles.case import Case

LEVELS = ("high", "medium", "low")
_LOW = ("nan-through-mask", "precision", "nondeterminism")
# relative spread of observed / expected across positions that still counts as one factor
RESCALE_RTOL = 1e-3


def grade(mechanism: str, prop: str, reach: str, *, degenerate: bool = False, rescale: bool = False) -> str:
    """The severity of a defect explained by `mechanism` (see the module docstring)."""
    if mechanism in _LOW or degenerate:
        level = "low"
    elif mechanism == "crash-degenerate" or prop in ("no-crash", "empty-step") or rescale:
        level = "medium"
    else:
        level = "high"
    if reach != "pipeline" and level == "high":
        level = "medium"
    return level


def worst(levels) -> str:
    """The most severe of `levels` ('low' for none)."""
    levels = list(levels)
    return next((s for s in LEVELS if s in levels), "low")


def degenerate(case: Case, prop: str, grouped: bool) -> bool:
    """A degenerate configuration: an all-empty step (`empty-step`, or no trainable token at all),
    or, where rows form groups, only groups of one among the rows that train."""
    if prop == "empty-step" or not bool(case.trainable.any()):
        return True
    if grouped and case.group is not None:
        live = case.trainable.any(dim=1)
        ids = case.group[live].tolist()
        return all(ids.count(g) == 1 for g in ids)
    return False


def uniform_factor(expected: torch.Tensor, observed: torch.Tensor, where: torch.Tensor) -> float | None:
    """The one factor c > 0 with observed = c * expected at every position of `where` (c != 1), or
    None: a uniform rescale moves one loss term's weight, not the relative weight of its tokens."""
    e, o = expected[where], observed[where]
    nonzero = e != 0
    if not bool(nonzero.any()) or bool(((e == 0) & (o != 0)).any()):
        return None
    ratio = o[nonzero] / e[nonzero]
    if not bool(torch.isfinite(ratio).all()):
        return None
    c = float(ratio.mean())
    if c <= 0 or abs(c - 1.0) <= RESCALE_RTOL or float((ratio - c).abs().max()) > RESCALE_RTOL * abs(c):
        return None
    return c

"""What a reproducer checks, as data: the `Check` a script runs and compares, the way a check's tensors are
written into the script (masks as '0'/'1' rows, float rows, tolerances rounded up), and `Unsupported`, the
refusal every step of `maskfuzz repro` raises when no faithful reproducer can be written.

The bottom of the repro modules: the GAE checks (`fuzz/repro_checks.py`), the kinds' checks
(`fuzz/repro_kinds.py`), the source copier and the renderer all import it, and it imports none of them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from maskfuzz.oracles.case import Case


class Unsupported(Exception):
    """No faithful reproducer can be written (exit 2 with this reason)."""


@dataclass(frozen=True)
class Check:
    """`case` is what the script runs first (the triggering example), `twin` the second input of
    a two-run check; `data` is the script's CHECK; the strings say it in words for the report."""

    case: Case
    twin: Case | None
    data: dict
    expected_from: str  # where the expected numbers come from
    twin_is: str = ""  # how the twin differs from the case


def mask_rows(m: torch.Tensor) -> list[str]:
    return ["".join("1" if x else "0" for x in row) for row in m.tolist()]


def float_rows(x: torch.Tensor) -> list[list[float]]:
    return [[float(v) for v in row] for row in x.tolist()]


def _up(x: float) -> float:
    """`x` rounded up to three significant digits (tolerances read better; never tighter)."""
    if not math.isfinite(x) or x <= 0:
        return float(x)
    e = math.floor(math.log10(x)) - 2
    m = math.ceil(x / 10.0**e - 1e-9)
    y = float(f"{m}e{e}")
    while y < x:  # guard against the division rounding down
        m += 1
        y = float(f"{m}e{e}")
    return y


def rounded_tolerances(t: torch.Tensor) -> list[list[float]] | float:
    """Per-position tolerances, rounded up; one number when they are all the same."""
    rows = [[_up(float(v)) for v in row] for row in t.tolist()]
    flat = {v for row in rows for v in row}
    return flat.pop() if len(flat) == 1 else rows

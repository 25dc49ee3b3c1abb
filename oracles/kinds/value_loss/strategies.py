"""The value loss's inputs for `oracles.kinds.strategies.kind_cases`: returns, values and old values equal to,
near or far from the values (so the clip binds or not)."""

from __future__ import annotations

import torch
from hypothesis import event
from hypothesis import strategies as st

from maskfuzz.oracles.kinds.strategies import Drawn, values


def inputs(draw, d: Drawn) -> None:
    d.extra["ret"] = values(draw, d.shape, "returns", pool=(0.0, 1.0, -1.0, 0.5, 3.0))
    d.extra["v"] = values(draw, d.shape, "values", pool=(0.0, 1.0, -1.0, 0.25, 2.0))
    how = draw(st.sampled_from(["v_old = v", "near", "far"]))
    event(f"value-loss: {how}")
    step = {"v_old = v": 0.0, "near": 0.1, "far": 3.0}[how]
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**32 - 1)))
    d.extra["v_old"] = d.extra["v"] + step * torch.randn(d.shape, generator=g, dtype=torch.float64)

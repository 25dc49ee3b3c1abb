"""Normalization's input for `oracles.kinds.strategies.kind_cases`: `x` at offsets and scales."""

from __future__ import annotations

from maskfuzz.oracles.kinds.strategies import Drawn, values


def inputs(draw, d: Drawn) -> None:
    d.extra["x"] = values(draw, d.shape, "x")

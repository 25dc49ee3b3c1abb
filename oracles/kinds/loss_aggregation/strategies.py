"""Loss aggregation's input for `oracles.kinds.strategies.kind_cases`: a per-token `loss`."""

from __future__ import annotations

from maskfuzz.oracles.kinds.strategies import Drawn, values


def inputs(draw, d: Drawn) -> None:
    d.extra["loss"] = values(draw, d.shape, "loss", pool=(0.0, 1.0, -1.0, 0.5, 3.0, -2.0))

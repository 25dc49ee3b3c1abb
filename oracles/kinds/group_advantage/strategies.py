"""The group advantage's inputs for `oracles.kinds.strategies.kind_cases`: a score per row (offsets, tiny
scales, identical scores in a group), and poison in the token rewards where the domain allows it."""

from __future__ import annotations

import torch

from maskfuzz.oracles.kinds.strategies import Drawn, values
from maskfuzz.oracles.strategies import poison


def inputs(draw, d: Drawn) -> None:
    d.score = values(draw, (d.b_rows,), "score")
    where = d.domain.poison_regions(d.dead, d.attention)[1]
    if where.any():
        d.rewards = torch.where(where, poison(draw, d.dead, d.dtype, d.nonfinite), d.rewards)

"""How a framework's GAE function is called in an upstream-ready test (`fuzz/upstream_test.py`).

A framework opts in with a module of its folder, `targets/<framework>/upstream_recipe.py`, that defines
`RECIPE = Recipe(...)`: how the canonical case becomes the named tensors and the call. The helpers below are
the score placements the recipes share. Fuzzer side: importing a recipe imports no upstream code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from maskfuzz.oracles.case import Case

RECIPE_MODULE = "upstream_recipe"  # targets/<framework>/upstream_recipe.py


@dataclass(frozen=True)
class Recipe:
    """How a target's function is called: `tensors(case)` gives the named input tensors (in the
    order of the call), `call` the call expression over those names, gamma and lam."""

    tensors: Callable[[Case], dict[str, torch.Tensor]]
    call: str  # e.g. "{fn}(rewards, values, mask, {gamma}, {lam})"
    placement: str  # one comment line: where the score goes, after which upstream code
    squeeze: bool = False  # outputs are [B, T, 1]


def last(mask: torch.Tensor) -> torch.Tensor:
    """[B, T] bool: True at each row's last True position of `mask` [B, T] (none in an all-False row)."""
    pos = torch.arange(mask.shape[1]).expand(mask.shape)
    at = torch.where(mask, pos, torch.full_like(pos, -1)).max(dim=1).values
    return (pos == at[:, None]) & mask


def rewards_with_score(case: Case, at: torch.Tensor) -> torch.Tensor:
    """[B, T]: the case's token rewards with each row's score added where `at` [B, T] is True."""
    return case.token_rewards + torch.where(at, case.score[:, None], torch.zeros_like(case.token_rewards))

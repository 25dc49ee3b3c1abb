"""OpenRLHF's upstream-test recipe (`targets.adapters.upstream_recipe`): `get_advantages_and_returns`' call."""

from __future__ import annotations

from maskfuzz.oracles.case import Case
from maskfuzz.targets.adapters.upstream_recipe import Recipe, last, rewards_with_score


def _tensors(case: Case) -> dict:
    return {"values": case.values, "rewards": rewards_with_score(case, last(case.trainable)), "mask": case.trainable}


RECIPE = Recipe(
    _tensors,
    "{fn}(None, values, rewards, mask, {gamma}, {lam})",
    "score at the last action-mask token, where OpenRLHF's compute_reward puts it",
)

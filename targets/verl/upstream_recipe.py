"""verl's upstream-test recipe (`targets.adapters.upstream_recipe`): `compute_gae_advantage_return`'s call."""

from __future__ import annotations

from maskfuzz.oracles.case import Case
from maskfuzz.targets.adapters.upstream_recipe import Recipe, last, rewards_with_score


def _tensors(case: Case) -> dict:
    return {
        "rewards": rewards_with_score(case, last(case.attention)),
        "values": case.values,
        "mask": case.trainable.long(),
    }


RECIPE = Recipe(
    _tensors,
    "{fn}(rewards, values, mask, {gamma}, {lam})",
    "score at the last attended response token, where verl's NaiveRewardManager writes it",
)

"""SkyRL's upstream-test recipe (`targets.adapters.upstream_recipe`): the call of `compute_gae_advantage_return`,
on the inputs the worker-side adapter builds (`calls.framework_inputs`)."""

from __future__ import annotations

from maskfuzz.oracles.case import Case
from maskfuzz.targets.adapters.upstream_recipe import Recipe
from maskfuzz.targets.skyrl import calls


def _tensors(case: Case) -> dict:
    x = calls.framework_inputs(case, "cpu")
    return {"rewards": x["token_level_rewards"], "values": x["values"], "mask": x["response_mask"]}


RECIPE = Recipe(
    _tensors,
    "{fn}(token_level_rewards=rewards, values=values, response_mask=mask, gamma={gamma}, lambd={lam})",
    "score on the last real response token, as SkyRL's trainer places scalar rewards",
)

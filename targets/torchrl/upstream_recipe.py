"""torchrl's upstream-test recipe (`targets.adapters.upstream_recipe`): the call of `generalized_advantage_estimate`
(or its vec twin), on the inputs the worker-side adapter builds (`calls.framework_inputs`)."""

from __future__ import annotations

from maskfuzz.oracles.case import Case
from maskfuzz.targets.adapters.upstream_recipe import Recipe
from maskfuzz.targets.torchrl import calls


def _tensors(case: Case) -> dict:
    x = calls.framework_inputs(case, "cpu")
    return {k: x[k] for k in ("state_value", "next_state_value", "reward", "done", "terminated")}


RECIPE = Recipe(
    _tensors,
    "{fn}({gamma}, {lam}, state_value, next_state_value, reward, done, terminated)",
    "one trajectory per row, done = terminated at its last trainable token (score added there)",
    squeeze=True,
)

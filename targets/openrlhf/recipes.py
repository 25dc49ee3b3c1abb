"""Call recipes for OpenRLHF's advantage estimators that no hand-written entry runs (`discover.py`).

Both run through the real `compute_advantages_and_returns` exactly as the hand-written group entries do
(`calls_kinds.load_estimator`: one real Experience, strategy.args at the CLI defaults, the real
get_cumulative_returns), so they take those entries' declared api and pipeline domains, documented errors and
masked-output facts (`declare.ENTRY_OVERRIDES["dr_grpo"]`), with what their own design changes:

* `reinforce_baseline`: the group mean subtracted (0.11.2 openrlhf/trainer/ppo_utils/experience_maker.py:271-272,
  as dr_grpo), then every advantage whitened over every action token of the whole rollout batch (:324 "Normalize
  advantages across all experiences", mean and biased var over all action masks, rsqrt at :333; git 3c3be623
  :314-323): a row's advantage depends on every other group, so group-isolation is not its promise; the whitening
  casts to float32 (:326), so no float64 case is drawn (as for the hand-written `reinforce`).
* `flash_reinforce`: the reward minus the mean over the whole rollout batch (:275-278, "FlashREINFORCE: baseline =
  mean over the whole rollout batch (the single-rollout regime has no prompt group)"; cli/train_ppo_ray.py:520
  "reward minus the rollout-batch mean, no group, no whitening: the n_samples_per_prompt=1 estimator"): called with
  n_samples_per_prompt = 1 and experience.index = the row order (`calls_kinds.SINGLE_ROLLOUT`); group-isolation
  is not its promise.

The worker runs a recipe only where the pin's dispatcher still has the whole-batch statistic the not-promise rests
on (`discover.batch_designs`).
"""

from __future__ import annotations

import dataclasses

from maskfuzz.oracles.domain import Domain
from maskfuzz.targets.openrlhf.declare import ENTRY_OVERRIDES

_EM = "0.11.2 openrlhf/trainer/ppo_utils/experience_maker.py"
_CLI = "0.11.2 openrlhf/cli/train_ppo_ray.py"
_NO_F64 = ("float16", "bfloat16", "float32")
NOT_PROMISED = {
    "reinforce_baseline": (
        (
            "group-isolation",
            f'whitened over the whole rollout batch: "Normalize advantages across all experiences", {_EM}:324 (mean '
            "and var over every action token of every experience, rsqrt at :333; git 3c3be623 :314-323)",
        ),
    ),
    "flash_reinforce": (
        (
            "group-isolation",
            f'"reward minus the rollout-batch mean, no group, no whitening", {_CLI}:520; "baseline = mean over the '
            f'whole rollout batch (the single-rollout regime has no prompt group)", {_EM}:276-278',
        ),
    ),
}
# the kind's tolerance from the nearest variant (no reference is read): Dr.GRPO shaping, then the whitening
_VARIANT = {
    "reinforce_baseline": {"estimator": "grpo", "std": None, "empty_rows": "counted", "whiten_tokens": True},
    "flash_reinforce": {"estimator": "grpo", "std": None, "empty_rows": "counted", "std_level": "batch"},
}
_F32_WHY = (
    f"{_EM}:326 the whitening casts the advantages to float32 (.float()) by design: a float64 case would be judged "
    "at float64 tolerance on float32 statistics"
)


def recipe(name: str) -> dict | None:
    """The spec fields of the discovered estimator `name` (None when it has no recipe)."""
    if name not in NOT_PROMISED:
        return None
    base = ENTRY_OVERRIDES["dr_grpo"]
    fields = {k: base[k] for k in ("domain", "pipeline", "documented_errors", "masked_zero", "masked_zero_why")}
    if name == "reinforce_baseline":
        domain: Domain = fields["domain"]
        fields["domain"] = dataclasses.replace(domain, dtypes=_NO_F64, why={**domain.why, "dtypes": _F32_WHY})
        fields["masked_zero_why"] = ENTRY_OVERRIDES["reinforce"]["masked_zero_why"]
    return fields | dict(variant=_VARIANT[name], not_promised=NOT_PROMISED[name])

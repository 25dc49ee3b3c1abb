"""The pipeline domains of SkyRL's discovered entries: a discovered `adv:<name>` takes the pipeline domain of the
hand-written `grpo` entry, whose estimator the trainer's step calls with the same inputs, at the pins where the step
was read.

SkyRL's trainer has one dispatch for every estimator: `trainer.compute_advantages_and_returns` hands
`ppo_utils.compute_advantages_and_returns` the batch's `rewards`, `response_mask` (the response indicator), the uids,
the values and `cfg.trainer.algorithm`, which calls `AdvantageEstimatorRegistry.get(adv_estimator)` with them:

* 0.1.0: skyrl_train/trainer.py:798-808 -> skyrl_train/utils/ppo_utils.py:822-833.
* 0.3.1: skyrl_train/trainer.py:771-781 -> skyrl_train/utils/ppo_utils.py:1099-1111; with
  generator.step_wise_trajectories, :750-760 make the same call on the last steps, whatever the estimator.
* skyrl_train-v0.4.0: skyrl-train/skyrl_train/trainer.py:810-820 (:789 step-wise) -> utils/ppo_utils.py:1202-1214.
* a9564572eb8e: skyrl/train/trainer.py:1182-1192 (:1160 step-wise) -> skyrl/backends/skyrl_train/utils/
  ppo_utils.py:1448-1460.

`calls_discovered.load_adv` calls a registered estimator with the same inputs (`calls_kinds.outcome_inputs`, as the
hand-written `grpo` and `rloo`, which declare the one domain): their api domain and their pipeline domain at `PINS`;
at any other pin (`latest`, `main`) none: reach api.

`policy-loss:<name>` gets nothing: the worker takes every loss through `PolicyLossRegistry.get(policy_loss_type)`
(0.1.0 skyrl_train/workers/worker.py:578, 0.3.1 :611) on the same micro-batch, but the hand-written `policy-loss`
entry's own pipeline is not researched (None), so there is no domain to share.
"""

from __future__ import annotations

from maskfuzz.targets.adapters.trainer_options import pinned
from maskfuzz.targets.skyrl.declare import HEAD_PIN, SPEC

PINS = ("0.1.0", "0.3.1", "skyrl_train-v0.4.0", HEAD_PIN)  # where the dispatch was read (above)
# not `masked_zero` / `masked_zero_why` (they cite the sibling's own lines) nor `variant` (another estimator's math)
NAMES = ("domain", "pipeline", "pipeline_by_pin")
SIBLING_FIELDS: dict[str, dict] = {"adv": pinned(SPEC.entry_overrides["grpo"], NAMES, PINS)}

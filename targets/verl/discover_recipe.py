"""The pipeline domains of verl's discovered entries: a discovered `adv:<name>` takes the pipeline domain of the
hand-written entry whose trainer step calls its estimator with the same inputs, at the pins where that step was read.

`ray_trainer.compute_advantage` has three branches: GAE, GRPO, and the registry branch for every other estimator
(`get_adv_estimator_fn(adv_estimator)`), which passes `data.batch["response_mask"]`, `token_level_rewards`, the
algorithm config and the uids:

* 0.4.1: verl/trainer/ppo/ray_trainer.py:257-271. The GRPO branch alone swaps in the sglang multi-turn `loss_mask`
  (:242-247); the registry branch gets `response_mask = compute_response_mask(batch)`, the response's attention
  (:1012), and :477-479 assert multi-turn to GRPO: the hand-written `rloo` entry's 0.4.1 domain (registry branch),
  not `grpo`'s (`declare_pipeline.pipeline_grpo_0_4_1`).
* 0.5.0: ray_trainer.py:274-288, the same `data.batch["response_mask"]` the GRPO branch reads (:264), kept from the
  rollout (:1202-1203).
* 0.9.1: ray_trainer.py:248-279 (the GRPO branch reads the same tensor, :237); the v1 trainer hands every estimator
  but GRPO to this compute_advantage unchanged (verl/trainer/ppo/v1/utils.py:167-176, from
  v1/trainer_base.py:1775), after rollout correction rewrote the mask (v1/trainer_base.py:1770-1771).
* 0332866857d5 / 11ee5125d269: ray_trainer.py:267-270 / :269-272, the tensor the GRPO branch reads (:255 / :257).

So every `adv:<name>` takes the fields of `rloo`, a registry-branch estimator (`rloo`, `rloo-vectorized`, `opo`,
`gpg`, `grpo-passk`, `reinforce++-baseline` declare the one domain): its api domain (the score where verl's reward
manager writes it, as `calls_discovered.load_adv` places it) and its pipeline domain at `PINS`; at any other pin (0.1
has no estimator registry; `latest`, `main`) none: reach api. Except `adv:grpo`, which gets nothing:
`calls_discovered.load_adv` calls it as the registry branch would (`config=`), but the trainer never does; its own
branch calls it with `norm_adv_by_std_in_grpo` and no config (0.4.1 ray_trainer.py:249-254), a call the discovered
entry does not make (at 0.4.1 it crashes on `config`, which the trainer never passes); the hand-written `grpo` entry
is that call.

`policy-loss:<name>` gets nothing: every loss_mode is called on the same micro-batch inputs (0.4.1
verl/workers/actor/dp_actor.py:486-487, 0.5.0 :435-436 through get_policy_loss_fn; vanilla :474 / :422 through
compute_policy_loss; 0.9.1 verl/workers/utils/losses.py:103 for every mode), but the hand-written `policy-loss`
entry's own pipeline is not researched (None), so there is no domain to share.
"""

from __future__ import annotations

from maskfuzz.targets.adapters.trainer_options import pinned
from maskfuzz.targets.verl.declare_kinds import KIND_OVERRIDES as K
from maskfuzz.targets.verl.declare_pipeline import BEFORE_MASKING, MASKING_COMMIT

PINS = ("0.4.1", "0.5.0", "0.9.1", MASKING_COMMIT, BEFORE_MASKING)  # where compute_advantage was read (above)
# not `masked_zero_why` (it cites the sibling's own line) nor `variant` (another estimator's math)
NAMES = ("domain", "pipeline", "pipeline_by_pin")
_GPG_ALPHA = (
    "group-isolation",
    "m = torch.count_nonzero(scores); alpha = bsz / m.clamp(min=1): compute_gpg_outcome_advantage scales every "
    "advantage by the batch's count of non-zero scores (verl/trainer/ppo/core_algos.py:648-649 at 0.5.0, :810-811 "
    "at 0.9.1), GPG's design",
)
# entry or prefix -> the fields (`trainer_options.sibling_recipe` looks the entry up first)
SIBLING_FIELDS: dict[str, dict] = {
    "adv": pinned(K["rloo"], NAMES, PINS),
    "adv:grpo": {},  # not the trainer's call of it (above): reach api
    # GPG's scale is over the whole batch by design: `m = torch.count_nonzero(scores)`, `alpha = bsz / m.clamp(min=1)`
    # (core_algos.py:648-649 at 0.5.0, :810-811 at 0.9.1), so another group's scores move this group's advantages
    "adv:gpg": pinned(K["rloo"], NAMES, PINS) | dict(not_promised=(_GPG_ALPHA,)),
}

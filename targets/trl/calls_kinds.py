"""TRL entries beyond GAE: the group advantages of GRPOTrainer and RLOOTrainer, run from the source at the pin.

This module is the worker's entry for them (`load`, which `targets.registry.adapter_for` names); the calls are
split by idea: `calls_group.py` (group advantages), `calls_aggregate.py` (loss aggregation), `calls_kl.py` (kl),
`calls_policy.py` (policy loss), and what they share in `calls_common.py`.

TRL has no advantage function: the GRPO and RLOO advantages are inline in
`GRPOTrainer._generate_and_score_completions` (`trl/trainer/grpo_trainer.py`, 1.12.0:2778-2832) and
`RLOOTrainer._generate_and_score_completions` (`trl/trainer/rloo_trainer.py`, 1.12.0:1557-1595). As the PPO
entry does (`calls.py::_gae_block`), the adapter parses the trainer file, takes the sibling
statements of that method from the one after `rewards_per_func = self._calculate_rewards(...)` through the last
assignment of `advantages` before `process_slice = ...` (TRL's own `num_generations` line, the unscorable mask,
the weighted sum, the KL penalty of RLOO, the group statistics, `nan_to_num`), compiles them with their helpers
(`nanstd`) from the source at the pin (`extract.SourceTree`, no trl import), and runs only that block with its
own variable names bound:

* `rewards_per_func` [N, 1]: the case's scores in the case's dtype (one reward function, weight 1 as
  `self.reward_weights = torch.ones(len(reward_funcs), dtype=torch.float32)`).
* `self`: a namespace with only the attributes the block reads (checked: an unknown one is `BlockNotFound`):
  `num_generations` (= the group size), `multi_objective_aggregation = "sum_then_normalize"` (the default),
  `reward_weights`, `reward_funcs`, `scale_rewards` (the entry's, or the case's option on `grpo`), and for RLOO
  `beta` (0.05, TRL's default) and `reward_clip_range` (None) or the case's options, `normalize_advantages = False`.
* Options and cut rows (`Case.options`, `Case.truncated_rows()`): `mask_truncated_completions` runs TRL's own
  `if self.mask_truncated_completions:` statement of the same method (`truncation_block`) on completion ids built
  from the case (1, pad 0, EOS 2 as the last token of every row not cut), and the mask it leaves is RLOO's
  `completion_mask` here and the loss mask of the aggregation entries (before the step is split, so
  `num_items_in_batch` counts what TRL counts).
* `mode = "train"`, `device`; RLOO: `old_per_token_logps = 0`, `ref_per_token_logps = token_rewards` and
  `completion_mask = trainable` (int, as TRL builds it), so RLOO's `per_token_kl = old - ref` is
  `-token_rewards` and `rewards - beta * (per_token_kl * completion_mask).sum(-1)` adds the trained token rewards
  (0 in group-advantage cases, poison under the mask); `gather` (accelerate's all-gather) is the identity of a
  one-process run.

Groups. TRL has no group ids: `RepeatSampler` puts each prompt's `num_generations` completions next to each
other and the block reshapes the rewards `view(-1, num_generations)`. Effective groups of unequal size exist in
TRL through unscorable completions (every reward function returned None: a NaN row that the nan-aware statistics
skip and `nan_to_num` zeroes). The adapter lays the case's groups out contiguously with `num_generations` = the
largest group and fills the short groups with unscorable (NaN) rows, TRL's own mechanism, then reads the real
rows back. A pin without the unscorable handling (0.19.1: plain `.mean()` / `.std()`) takes equal groups only:
unequal ones are a documented `GroupShapeError`.

The output is one advantage per completion ([N]); the loss multiplies it into every token and masks there
(`advantages.unsqueeze(1)` with `(per_token_loss * mask)`), so the adapter broadcasts it to every position of
the row.

Loss aggregation (`agg-grpo`, `agg-bnpo`, `agg-dr_grpo`, `agg-dapo`, the `loss_type` values): TRL has no
aggregation function either; the normalisation is the `if self.loss_type ...: loss = ...` chain of
`GRPOTrainer._compute_loss` (1.16.0:3152-3184; 0.19.1:1404-1411), preceded where present by its
`mode = "train" if self.model.training else "eval"` line. `load_aggregate` takes exactly those statements from the
source at the pin, as above, binds `per_token_loss` (the case's loss of the micro-batch), the mask under the name
the block reads (`mask` / `completion_mask`, int64 as TRL pads it), `inputs["num_items_in_batch"]` and a namespace
`self`, and runs them once per micro-batch of the step (`loss_step.run_step`); see its docstring for the scaling.

KL (`kl-grpo`, `kl-ppo`): GRPO's `if self.beta != 0.0: ... per_token_kl = ...` statement of `_compute_loss` with the
`old_per_token_logps` / `log_ratio` ... `coef_1` lines it reads (`load_kl_grpo`), and the PPO trainer's padding
masks, INVALID_LOGPROB fills and `logr` / `kl` lines of `train()` (`load_kl_ppo`); see their docstrings.

Policy loss (`policy-grpo`): `GRPOTrainer._compute_loss` from `advantages = inputs["advantages"]` through the
`loss_type` chain, at GRPOConfig's defaults (loss_type "dapo", epsilon 0.2, beta 0), per micro-batch
(`load_policy`).
"""

from __future__ import annotations

from pathlib import Path

from maskfuzz.targets.adapters.base import Loaded
from maskfuzz.targets.trl.calls_aggregate import AGGREGATE, load_aggregate
from maskfuzz.targets.trl.calls_group import load_group
from maskfuzz.targets.trl.calls_kl import load_kl_grpo, load_kl_ppo
from maskfuzz.targets.trl.calls_policy import POLICY, load_policy


def load(root, entry: str) -> Loaded:
    """The entry of a kind beyond GAE (the worker loads it from here: targets.registry.adapter_for)."""
    if entry in AGGREGATE:
        return load_aggregate(Path(root), entry)
    if entry == "kl-grpo":
        return load_kl_grpo(Path(root))
    if entry == "kl-ppo":
        return load_kl_ppo(Path(root))
    if entry in POLICY:
        return load_policy(Path(root), entry)
    return load_group(Path(root), entry)


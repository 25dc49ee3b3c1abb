"""torchtune entries beyond GAE, each calling torchtune's own code at the pin, imported from the release wheel:

* normalization (`whiten`): `torchtune/rlhf/rewards.py::whiten(x, mask)` at its default `shift_mean=True`, the
  batch whitening `estimate_advantages` applies to the advantages; output [B, T].
* kl (`kl`): the `kl` output of `torchtune/rlhf/rewards.py::get_rewards_ppo(scores, logprobs, ref_logprobs,
  kl_coeff, valid_score_idxs)`, k1 `logprobs - ref_logprobs` per token (no mask argument).
* token-reward (`token-reward`): the `total_reward` output of `get_rewards_ppo(scores, logprobs, ref_logprobs,
  kl_coeff, valid_score_idxs)` with the case's KL as `logprobs` and 0 as `ref_logprobs` (kl = logprobs - ref_logprobs
  exactly), `kl_coeff` the recipe's 0.01, and `valid_score_idxs` the last trainable index (`calls.last_trainable_index`,
  as the GAE entry passes it): get_rewards_ppo takes the index from its caller ("scores and value estimates are
  defined for the last valid predicted token", rewards.py:64-66). Not torchtune's own
  `training.get_unmasked_sequence_lengths`: at 0.3.1 and 0.5.0 it is the count of unmasked tokens minus 1
  (pooling.py:40-43 there), the last index of a right-padded mask only (what the recipe builds), which on a mask
  with a leading masked token or a gap points at a masked position: that helper's precondition, not this entry's.
* policy-loss (`policy-loss`) and value-loss (`value-loss`): `torchtune/rlhf/loss/ppo.py::PPOLoss` at the PPO
  recipe's configuration (epsilon 0.2, value_clip_range 0.2), called per micro-batch with the loss mask as
  `padding_masks` / `value_padding_masks` (True = the position counts, ppo.py:65-68), the returned total loss
  divided by the accumulation steps as the recipe does (recipes/ppo_full_finetune_single_device.py:1118). The
  policy entry holds the value inputs at 0 (value loss 0, so the total is the policy loss); the value entry holds
  the advantages at 0 (policy loss -0) and `value_coeff=1.0` (the recipe's 0.1 only weights the term in the total,
  ppo.py:115), so the total is the value loss and its gradient the critic's.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import torch

from maskfuzz.oracles.case import Case
from maskfuzz.targets.adapters.base import Loaded, NotPresent, function_from, import_from
from maskfuzz.targets.adapters.loss_step import run_step
from maskfuzz.targets.torchtune.calls import last_trainable_index

_REWARDS = "torchtune.rlhf.rewards"
_LOSS = "torchtune.rlhf.loss.ppo"
# the PPO recipe's loss configuration (recipes/configs/mistral/7B_full_ppo_low_memory.yaml:172-175 at 0.6.1)
EPSILON = 0.2
VALUE_CLIP = 0.2


def _rel(root: Path, mod) -> str:
    return str(Path(inspect.getfile(mod)).resolve().relative_to(Path(root).resolve()))


def load_whiten(root: Path) -> Loaded:
    fn, where = function_from(root, [(_REWARDS, "whiten")])

    def run(case: Case, device: str):
        x = case.extra["x"].to(device=device, dtype=case.torch_dtype)
        return (fn(x, mask=case.trainable.to(device)),)

    return Loaded(run, where, ["whiten(x, mask=trainable) at its default shift_mean=True (the mean added back)"])


def load_kl(root: Path) -> Loaded:
    fn, where = function_from(root, [(_REWARDS, "get_rewards_ppo")])

    def run(case: Case, device: str):
        dt = case.torch_dtype
        lp = case.extra["logp"].to(device=device, dtype=dt)
        ref = case.extra["ref_logp"].to(device=device, dtype=dt)
        score = torch.zeros(case.shape[0], dtype=dt, device=device)
        _, kl, _ = fn(score, lp, ref, 0.01)  # kl_coeff only scales kl_reward (rewards.py:79-80 at 0.6.1)
        return (kl,)

    return Loaded(run, where, ["the kl output of get_rewards_ppo(0, logp, ref_logp, kl_coeff=0.01): no mask argument"])


KL_COEFF = 0.01  # recipes/configs/mistral/7B_full_ppo_low_memory.yaml:176 at 0.6.1


def load_token_reward(root: Path) -> Loaded:
    """get_rewards_ppo(score, kl, 0, KL_COEFF, valid_score_idxs=get_unmasked_sequence_lengths(~trainable))[0]."""
    fn, where = function_from(root, [(_REWARDS, "get_rewards_ppo")])

    def run(case: Case, device: str):
        dt = case.torch_dtype
        kl = case.extra["kl"].to(device=device, dtype=dt)
        score = case.score.to(device=device, dtype=dt)
        idx = last_trainable_index(case.trainable.to(device))
        total, _, _ = fn(score, kl, torch.zeros_like(kl), KL_COEFF, idx)
        return (total,)

    notes = [
        f"get_rewards_ppo(score, logprobs=kl, ref_logprobs=0, kl_coeff={KL_COEFF}, valid_score_idxs=the last "
        "trainable index): the score scatter-added there, the KL not masked"
    ]
    return Loaded(run, where, notes)


def _ppo_loss(root: Path):
    mod = import_from(root, _LOSS)
    cls = getattr(mod, "PPOLoss", None)
    fwd = list(inspect.signature(cls.forward).parameters) if cls is not None else []
    if cls is None or "padding_masks" not in fwd or "value_padding_masks" not in fwd:
        raise NotPresent(f"{_LOSS}.PPOLoss with padding_masks / value_padding_masks is not present at this pin")
    return cls, f"{_rel(root, mod)}::PPOLoss"


def load_policy(root: Path) -> Loaded:
    """PPOLoss(epsilon=0.2, value_clip_range=0.2)(old_logp, logp, adv, 0, 0, 0, padding_masks=mask,
    value_padding_masks=mask)[0] per micro-batch / accumulation steps; the gradient is taken w.r.t. logp."""
    cls, where = _ppo_loss(root)
    loss_fn = cls(epsilon=EPSILON, value_clip_range=VALUE_CLIP)

    def micro(rows, logp, mask, step):
        old = step.case.extra["old_logp"][rows].to(device=logp.device, dtype=logp.dtype)
        adv = step.case.extra["adv"][rows].to(device=logp.device, dtype=logp.dtype)
        zero = torch.zeros_like(logp)
        live = mask.bool()
        out = loss_fn(old, logp, adv, zero, zero, zero, padding_masks=live, value_padding_masks=live)
        return out[0] / step.rank_micro_batches  # recipes/ppo_full_finetune_single_device.py:1118

    def run(case: Case, device: str):
        return run_step(case, device, micro, leaf_name="logp")

    notes = [
        f"PPOLoss(epsilon={EPSILON}, value_clip_range={VALUE_CLIP}) per micro-batch, padding_masks = "
        "value_padding_masks = the loss mask; value inputs 0 (value loss 0): the total loss is the policy loss",
        "per-token advantages; / accumulation steps (the recipe's loss /= gradient_accumulation_steps)",
    ]
    return Loaded(run, where, notes)


def load_value(root: Path) -> Loaded:
    """PPOLoss(epsilon=0.2, value_clip_range=0.2, value_coeff=1.0)(0, 0, 0, v_old, v, ret, padding_masks=mask,
    value_padding_masks=mask)[0] per micro-batch / accumulation steps; the gradient is taken w.r.t. v."""
    cls, where = _ppo_loss(root)
    loss_fn = cls(epsilon=EPSILON, value_clip_range=VALUE_CLIP, value_coeff=1.0)

    def micro(rows, v, mask, step):
        old = step.case.extra["v_old"][rows].to(device=v.device, dtype=v.dtype)
        ret = step.case.extra["ret"][rows].to(device=v.device, dtype=v.dtype)
        zero = torch.zeros_like(v)
        live = mask.bool()
        out = loss_fn(zero, zero, zero, old, v, ret, padding_masks=live, value_padding_masks=live)
        return out[0] / step.rank_micro_batches  # recipes/ppo_full_finetune_single_device.py:1118

    def run(case: Case, device: str):
        return run_step(case, device, micro, leaf_name="v")

    notes = [
        f"PPOLoss(epsilon={EPSILON}, value_clip_range={VALUE_CLIP}, value_coeff=1.0) per micro-batch, "
        "value_padding_masks = padding_masks = the loss mask; log-probs and advantages 0 (policy loss -0)",
        "/ accumulation steps (the recipe's loss /= gradient_accumulation_steps)",
    ]
    return Loaded(run, where, notes)


def load(root: Path, entry: str) -> Loaded:
    """The entry of a kind beyond GAE (the worker loads it from here: targets.registry.adapter_for)."""
    loads = {
        "whiten": load_whiten,
        "kl": load_kl,
        "policy-loss": load_policy,
        "value-loss": load_value,
        "token-reward": load_token_reward,
    }
    if entry not in loads:
        raise ValueError(f"torchtune's calls_kinds has no entry {entry!r}")
    return loads[entry](root)

"""OpenRLHF's own batch code on a real rollout (worker side): the experience maker's path from `generate()` to
`get_advantages_and_returns`, everything OpenRLHF's except the critic's values, which enter at `HOOKED_BOUNDARY`.

The calls, in `NaiveExperienceMaker.make_experience`'s order (lines at 0.3.6.post1, inside the wheel):

1. `Actor.generate` (models/actor.py:108-139) runs the HF model's `generate()` (:133) and hands its sequences to
   `Actor.process_sequences(sequences, input_ids.size(1), eos_token_id, pad_token_id)` (:139, :141-167): the
   tiny LM's real `generate()` output is those sequences; `process_sequences` (called unbound: it never reads
   `self`) builds the attention and the action mask (an action is trainable when its state token is neither
   EOS nor pad, action 0 always; a row cut at the limit gets EOS written over its last token), as
   make_experience calls it (trainer/ppo_utils/experience_maker.py:120);
2. the hooked boundary: `value` = the fault's values (the critic's output, experience_maker.py:130), the
   actor / initial-model log-probs the KL term's inputs, `r` the rule score (the reward model's output, :133);
3. `compute_reward(r, kl_coef=1.0, action_log_probs, base_action_log_probs, action_mask)` (models/utils.py:29-58,
   called at experience_maker.py:135-141): the score clamped to [-10, 10] on the last action-mask token plus
   -kl_coef * KL * action_mask; then `get_advantages_and_returns(value, reward, action_mask, gamma, lambd)`
   (:142-148, :173-217), a method that never reads `self`, called unbound.

Layout: OpenRLHF's token-level tensors are the action window [B, A], A = the sequences' width - the prompt width
(the longest response of the generate() call: `sequence_length` is not a knob of this path); canonical position t
= action t, the token sequences[:, P + t] (`Batch.tokens`). Token rewards enter as OpenRLHF's only dense reward,
its KL in the reward: action_log_probs = -token_rewards, base_action_log_probs = 0, kl_coef 1, so compute_reward
adds exactly the token rewards where the action mask is 1 (`Batch.reward_mask`). Stand-ins: the OpenRLHF fuzzing
worker's (`targets.openrlhf.declare.SPEC.stand_ins`: deepspeed, transformers, peft, bitsandbytes... at import).
"""

from __future__ import annotations

import inspect
from pathlib import Path

import torch

from maskfuzz.targets.adapters.base import Loaded, import_from
from maskfuzz.targets.rollout.requests import Batch, BatchRequest

HOOKED_BOUNDARY = "after the real rollout, before critic values enter compute_reward / get_advantages_and_returns"
BOUNDARY_INPUTS = (
    "value [B, A]: the critic's values (the case's at valid actions, its poison under the mask)",
    "action_log_probs = -token_rewards, base_action_log_probs = 0 [B, A]: OpenRLHF's KL in the reward, kl_coef 1",
    "r [B]: the rule score of each row (the reward model's output)",
)
REPLACED_COMPONENT = None
_MAKER = "openrlhf.trainer.ppo_utils.experience_maker"
PRESERVED = (
    ("openrlhf.models.actor", "Actor.process_sequences"),
    ("openrlhf.models.utils", "compute_reward"),
    (_MAKER, "NaiveExperienceMaker.get_advantages_and_returns"),
)


def load(root: Path, entry: str | None) -> Loaded:
    """Import OpenRLHF's batch code from the checkout at `root`; `run(BatchRequest, device)` answers `(Batch,)`."""
    if entry not in (None, "default"):
        raise ValueError(f"OpenRLHF's real-rollout path covers the experience maker's GAE, not entry {entry!r}")
    fns, called = {}, []
    for module, dotted in PRESERVED:
        obj = import_from(root, module)
        for part in dotted.split("."):
            obj = getattr(obj, part)
        fns[dotted.split(".")[-1]] = obj
        where = Path(inspect.getfile(inspect.unwrap(obj))).resolve().relative_to(Path(root).resolve())
        called.append(f"{where}::{dotted}")
    params = set(inspect.signature(fns["compute_reward"]).parameters)
    if not {"log_probs", "log_probs_base", "action_mask"} <= params:
        # 0.4.x+ take the KL itself (kl=...) and a clip range: another call than make_experience's at 0.3.6
        raise RuntimeError(f"compute_reward has parameters {sorted(params)}; this module drives the 0.3.6 signature")

    def run(request: BatchRequest, device: str) -> tuple[Batch]:
        return (_step(request, fns, called),)

    notes = ["the experience maker's batch code on a real generation; critic values at the hooked boundary"]
    return Loaded(run, " -> ".join(c.split("::")[1] for c in called), notes)


def _step(request: BatchRequest, fns: dict, called: list) -> Batch:
    gen, fault = request.generation, request.fault
    p_len = gen.prompt_length
    sequences, attention, action_mask = fns["process_sequences"](
        None, gen.output.clone(), p_len, gen.eos_token_id, gen.pad_token_id
    )
    tokens = sequences[:, p_len:]
    batch = Batch(
        attention=attention[:, p_len:].bool().clone(),
        trainable=action_mask.bool().clone(),
        # a response without EOS from generate() (process_sequences then writes EOS over its last token)
        truncated=~(gen.output[:, p_len:] == gen.eos_token_id).any(dim=-1),
        stages={
            name: x.clone()
            for name, x in (("sequences", sequences), ("attention_mask", attention), ("action_mask", action_mask))
        },
        called=called[:1],
        tokens=tokens.clone(),
        reward_mask=action_mask.bool().clone(),
    )
    if fault is None:
        return batch
    # ---- the hooked boundary: the critic's values enter here, then OpenRLHF's code runs to the advantages
    value = fault.values.float().clone()
    reward, kl = fns["compute_reward"](
        fault.score.float().clone(),
        1.0,
        -fault.token_rewards.float(),
        torch.zeros_like(fault.token_rewards, dtype=torch.float32),
        action_mask=action_mask,
    )
    advantages, returns = fns["get_advantages_and_returns"](None, value, reward, action_mask, fault.gamma, fault.lam)
    batch.stages.update(value=value, reward=reward.clone(), kl=kl.clone())
    batch.advantages, batch.returns = advantages.clone(), returns.clone()
    batch.called = list(called)
    return batch

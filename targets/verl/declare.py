"""Adapter for verl: `verl/trainer/ppo/core_algos.py::compute_gae_advantage_return`.

The function takes `(token_level_rewards, values, <mask>, gamma, lam)`, all [B, T] over the
right-padded response window, and returns `(advantages, returns)`; the advantages are whitened
inside with `verl.utils.torch_functional.masked_whiten` over the mask (the whole batch). The mask
argument is `eos_mask` in 0.1 ... 0.3.x and `response_mask` from 0.4.0 (#878); the adapter reads
the signature at each pin and passes the name that pin uses.

Two behaviours across the releases (read at each pin, nothing is assumed):

* 0.1 ... 0.4.1: a plain GAE loop over all T positions; the mask is used for whitening only.
* 0.5.0 ... 0.9.1 (commit 0332866, #2337 "mask out observation token in GAE"): values and TD
  errors of masked ("observation") positions are skipped; the carry passes through them.

Score placement is verl's own code: the naive reward manager (`verl/workers/reward_manager/
naive.py::NaiveRewardManager.__call__` from 0.2, `verl/trainer/main_ppo.py::RewardManager` in
0.1) writes the score at `valid_response_length - 1`, with `valid_response_length` the number of
attended response tokens: the last *attended* response token, which is an observation token when
a multi-turn episode ends in a tool response. The adapter runs that code on a DataProto built from
the case, with a scorer that returns 1.0, to learn the position, and puts the case's score there
in the case's dtype (the manager's own tensor is float32, which would round a float64 score).

Pipeline domain: what verl's own trainer (`verl/trainer/ppo/ray_trainer.py`), rollouts, reward managers
and critics can hand the function, per pin (every narrowing cites file:line at that pin in `why`).
0.1 and 0.4.1 pass `attention_mask[:, -response_length:]` as the mask (ray_trainer.py:118 in 0.1;
compute_response_mask, set unconditionally at ray_trainer.py:1012 in 0.4.1, where multi-turn + GAE is also
asserted out), so the mask equals the attention of a right-padded response: no gaps, observation tails,
leading masked tokens or all-masked rows with real tokens. From the agent loop (#2124, so at both git pins)
and in 0.5.0 / 0.9.1 the rollout's own response_mask reaches GAE (tool tokens 0), so those shapes stay
allowed (sglang multi-turn truncates a response inside a tool turn; custom agent loops are a config option).
Everywhere: the run dtype is float32 (reward tensors are float32, 0.9.1 casts values with .float()), the
response window is right-padded, and values and rewards are finite critic / scorer outputs. Masked token
rewards: the KL penalty is multiplied by the mask and every built-in reward manager writes only the score at
the last attended token, so they are excluded up to 0.5.0; 0.9.1 loads external reward managers from config
(verl/trainer/ppo/reward.py:96-105), so it stays allowed there. Masked values: 0.1's FSDP critic does not
mask values (model outputs at padding), 0.4.1's critics zero them (mask == attention), 0.5.0 and the git pins'
Megatron critic masks with the attention only and 0.9.1 masks nothing but padding, so tool-token values stay.

Production citations (`Domain.produces`, what a pipeline witness may use): 0.1 the FSDP critic's values at padding and
the KL in the reward at trainable tokens; 0.4.1 the KL only (and, for the GRPO branch, the sglang multi-turn loss_mask
with its tool tokens and their unmasked KL, `_pipeline_grpo_0_4_1`); 0.5.0 and the git pins gaps and observation tails
(sglang multi-turn, the tool agent loop at 11ee5125d) with the Megatron critic's values under tool tokens; 0.9.1 the
tool agent loop's gaps, the engine critic's values under the mask, and rollout correction's rejection
sampling (`algorithm.rollout_correction.rollout_rs`), which masks tokens *after* the reward manager placed the score
and the KL in the reward was masked: tails holding the score, leading masks, all-masked rows and KL terms under the
mask. Nothing cites NaN / inf (values and rewards are finite everywhere) or a non-score reward under the mask before
0.9.1 (except 0.4.1's GRPO branch).
"""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path

import torch

from maskfuzz.oracles.case import Case
from maskfuzz.oracles.domain import Domain
from maskfuzz.oracles.promises import Promise
from maskfuzz.oracles.reference import Whitening
from maskfuzz.targets.adapters.base import Loaded, NotPresent, function_from, import_from
from maskfuzz.targets.registry import COMMON_HEAVY, Option, Pin, TargetSpec, Truncation

_GAE = ("verl.trainer.ppo.core_algos", "compute_gae_advantage_return")
# First commit whose GAE skips masked positions, and its parent (the last plain-loop commit).
_MASKING_COMMIT = "0332866857d541f5bd4f46ee4d9bd782a6354aa3"
_BEFORE_MASKING = "11ee5125d269d657f1edf101d627b4b599eaceae"

# --- pipeline domains (what verl's own rollout / reward / KL / critic code hands the function) ---
_RIGHT_PADDED_0_1 = (
    "verl 0.1: verl/trainer/ppo/rollout/vllm_rollout/vllm_rollout.py:184 pads the response on the right "
    "(pad_sequence_to_length) and :199 builds its attention with get_eos_mask"
)
_MASK_IS_ATTENTION_0_1 = (
    "verl 0.1: verl/trainer/ppo/ray_trainer.py:118 passes response_mask = attention_mask[:, -response_length:] "
    "as eos_mask, so trainable == attention over a right-padded response"
)
_MASK_IS_ATTENTION_0_4_1 = (
    "verl 0.4.1: verl/trainer/ppo/ray_trainer.py:1012 sets response_mask = compute_response_mask(batch) "
    "unconditionally (:181-196, attention_mask[:, -response_length:]; the chat scheduler's mask is overwritten) "
    "and :477-479 asserts multi-turn with tools is GRPO-only, so trainable == attention over the response"
)
_NO_EMPTY_0_1 = (
    _MASK_IS_ATTENTION_0_1 + "; verl/utils/torch_functional.py:145-147 get_eos_mask always keeps position 0, "
    "so every row has a trainable token"
)
_NO_EMPTY_0_4_1 = (
    _MASK_IS_ATTENTION_0_4_1 + "; verl/utils/torch_functional.py:239-240 get_response_mask always keeps position 0 "
    "(verl/workers/rollout/vllm_rollout/vllm_rollout_spmd.py:339), so every row has a trainable token"
)
_NONFINITE = (
    "values are critic outputs ({critic}) and rewards are the scorer's float placed by the reward manager "
    "({reward}) minus a KL of finite log-probs; nothing in the pipeline writes NaN / inf at masked positions"
)
_KL_IN_REWARD_0_4_1 = (
    "verl 0.4.1: verl/trainer/ppo/ray_trainer.py:1097-1098 (algorithm.use_kl_in_reward) applies apply_kl_penalty: "
    "token_level_scores - beta * kld * response_mask (:163-167), a KL term at every trainable position"
)


def _pipeline_0_1() -> Domain:
    return Domain(
        dtypes=("float32",),
        empty_rows=False,
        gaps=False,
        masked_real_tail=False,
        leading_mask=False,
        left_padding=False,
        all_masked_rows=False,
        masked_rewards=False,
        nonfinite_poison=False,
        why={
            "dtypes": (
                "verl 0.1: verl/trainer/main_ppo.py:46 builds the reward tensor as float32 and "
                "verl/trainer/ppo/critic/dp_critic.py:49-55 runs the critic under bf16 autocast, so GAE runs in float32"
            ),
            "gaps": _MASK_IS_ATTENTION_0_1,
            "masked_real_tail": _MASK_IS_ATTENTION_0_1,
            "leading_mask": _MASK_IS_ATTENTION_0_1,
            "left_padding": _RIGHT_PADDED_0_1,
            "all_masked_rows": _NO_EMPTY_0_1,
            "masked_rewards": (
                "verl 0.1: verl/trainer/ppo/ray_trainer.py:87-93 multiplies the KL by the response mask and "
                "verl/trainer/main_ppo.py:75 writes the score at valid_response_length - 1 (a trainable token, "
                "the mask being the attention)"
            ),
            "nonfinite_poison": _NONFINITE.format(
                critic="verl 0.1: verl/trainer/ppo/critic/dp_critic.py:54-56 output.logits",
                reward="verl/trainer/main_ppo.py:75",
            ),
            "empty_rows": _NO_EMPTY_0_1,
        },
        produces={
            # the seed report: the FSDP critic's values at padding are raw model outputs, and the plain loop reads them
            "masked_values": (
                "verl 0.1: verl/trainer/ppo/critic/dp_critic.py:54-55 returns the critic's output.logits over the "
                "response window, padding included, never masked; verl/trainer/ppo/ray_trainer.py:450-451 adds them to "
                "the batch and :114, :123-127 hand data.batch['values'] to compute_gae_advantage_return"
            ),
            "token_rewards": (
                "verl 0.1: verl/trainer/ppo/ray_trainer.py:468-470 calls apply_kl_penalty every step: "
                "token_level_scores - beta * kld * response_mask (:90-99, with the reference policy), a KL term at "
                "every trainable position"
            ),
            "truncated_rows": (
                "verl 0.1: verl/trainer/ppo/rollout/vllm_rollout/vllm_rollout.py:108 samples with "
                "max_tokens=config.response_length: a response that reaches the limit has no EOS and fills the window"
            ),
        },
    )


def _pipeline_0_4_1() -> Domain:
    return Domain(
        dtypes=("float32",),
        empty_rows=False,
        gaps=False,
        masked_real_tail=False,
        leading_mask=False,
        left_padding=False,
        all_masked_rows=False,
        masked_rewards=False,
        masked_values=False,
        nonfinite_poison=False,
        why={
            "dtypes": (
                "verl 0.4.1: verl/workers/reward_manager/naive.py:53 builds the reward tensor as float32 and "
                "verl/workers/critic/dp_critic.py:65 runs the critic under bf16 autocast, so GAE runs in float32"
            ),
            "gaps": _MASK_IS_ATTENTION_0_4_1,
            "masked_real_tail": _MASK_IS_ATTENTION_0_4_1,
            "leading_mask": _MASK_IS_ATTENTION_0_4_1,
            "left_padding": (
                "verl 0.4.1: verl/workers/rollout/vllm_rollout/vllm_rollout_spmd.py:307 right-pads the response "
                "(pad_2d_list_to_length) and :339 builds its attention with get_response_mask"
            ),
            "all_masked_rows": _NO_EMPTY_0_4_1,
            "masked_rewards": (
                "verl 0.4.1: verl/trainer/ppo/ray_trainer.py:164 multiplies the KL by the response mask; the reward "
                "managers write only the score at the last attended token (verl/workers/reward_manager/naive.py:95, "
                "dapo.py:118, prime.py:166, batch.py:104), a trainable token since mask == attention"
            ),
            "masked_values": (
                "verl 0.4.1: verl/workers/critic/dp_critic.py:183-184 and "
                "verl/workers/critic/megatron_critic.py:122-123 multiply values by "
                "attention_mask[:, -response_length:], the same mask GAE gets at this pin"
            ),
            "nonfinite_poison": _NONFINITE.format(
                critic="verl 0.4.1: verl/workers/critic/dp_critic.py:109-123",
                reward="verl/workers/reward_manager/naive.py:95",
            ),
            "empty_rows": _NO_EMPTY_0_4_1,
        },
        produces={
            "token_rewards": _KL_IN_REWARD_0_4_1,
            "truncated_rows": (
                "verl 0.4.1: verl/workers/rollout/vllm_rollout/vllm_rollout_spmd.py:177 samples with "
                "max_tokens=config.response_length: a response that reaches the limit has no EOS and fills the window"
            ),
        },
    )


def _pipeline_multi_turn(pin: str, naive: str, kl: str, padding: str, critic: str, produces: dict) -> Domain:
    """The agent-loop era (the rollout's own response_mask reaches GAE): masks may have gaps, observation
    tails, leading masked tokens and empty rows; narrowed are dtype, padding side, masked rewards (<= 0.5.0)
    and non-finite poison. `produces`: what the pin's own rollout, critic and KL code is cited to build."""
    return Domain(
        dtypes=("float32",),
        left_padding=False,
        masked_rewards=False,
        nonfinite_poison=False,
        padding_values=False,
        why={
            "dtypes": (
                f"verl {pin}: {naive} builds the reward tensor as float32 (rm_scores likewise); the critic's bf16 "
                "values are promoted, so GAE runs in float32"
            ),
            "padding_values": (
                f"verl {pin}: {critic} multiply the values by the response's attention (Megatron) or by the "
                "response mask (FSDP): a padding position holds 0, while a tool token keeps its value (Megatron)"
            ),
            "left_padding": f"verl {pin}: {padding} pads responses on the right",
            "masked_rewards": (
                f"verl {pin}: {kl} multiplies the KL by data.batch['response_mask'] (the rollout's own mask) and the "
                f"built-in reward managers write only the score at valid_response_length - 1 ({naive}); reward "
                "managers come from the registry only (verl/trainer/ppo/reward.py get_reward_manager_cls)"
            ),
            "nonfinite_poison": _NONFINITE.format(critic=critic, reward=naive),
        },
        produces=produces,
    )


# What the multi-turn pins' own code builds (production citations, `Domain.produces`). The sglang multi-turn rollout
# (AsyncRolloutRequest, verl/workers/rollout/schemas.py) appends assistant messages with loss_mask=True and tool
# responses / interaction turns with loss_mask=False, all attended, and hands response_loss_mask on as the batch's
# response_mask, which the trainer keeps for the estimators ("if 'response_mask' not in batch"). The Megatron critic
# masks its values with the attention only, so a tool token keeps its value. The reward manager writes the score at
# valid_response_length - 1, the last *attended* token: on a response that ends in a tool turn, a masked one.
_SGLANG_0_5_0 = (
    "verl 0.5.0: verl/workers/rollout/schemas.py:477-483 appends a tool response with loss_mask=False and :406 an "
    "assistant message with loss_mask=True (verl/workers/rollout/sglang_rollout/sglang_rollout.py:854-860, then "
    "back to RUNNING); sglang_rollout.py:1207 hands response_loss_mask on as response_mask, which "
    "verl/trainer/ppo/ray_trainer.py:1202-1203 keeps for compute_advantage"
)
_PRODUCES_0_5_0 = {
    "gaps": (
        _SGLANG_0_5_0 + "; also verl/experimental/agent_loop/tool_agent_loop.py:77 (assistant tokens 1) and :121 "
        "(tool response tokens 0) in one loop"
    ),
    "masked_real_tail": (
        "verl 0.5.0: verl/workers/rollout/sglang_rollout/sglang_rollout.py:854-859 appends the tool response "
        "(loss_mask=False, schemas.py:477-483) and stops when the request reaches max_model_len, :970-973 likewise "
        "after an interaction's user turn, and schemas.py:661-675 cut the response at max_response_len, inside a "
        "tool response too: the response ends on masked, attended tokens, where naive.py:98 writes the score "
        "(response_mask via sglang_rollout.py:1207)"
    ),
    "masked_values": (
        "verl 0.5.0: verl/workers/critic/megatron_critic.py:131-132 multiplies the values by "
        "attention_mask[:, -response_length:] only (the Megatron critic; verl/trainer/main_ppo.py:152-158 pairs it "
        "with the Megatron AsyncActorRolloutRefWorker, verl/workers/megatron_workers.py:655): tool tokens keep "
        "their values"
    ),
    "token_rewards": (
        "verl 0.5.0: verl/trainer/ppo/ray_trainer.py:1289 (algorithm.use_kl_in_reward) applies apply_kl_penalty: "
        "token_level_scores - beta * kld * response_mask (:176-182), a KL term at every trainable position"
    ),
    "truncated_rows": (
        "verl 0.5.0: verl/workers/rollout/vllm_rollout/vllm_rollout_spmd.py:194 samples with "
        "max_tokens=config.response_length: a response that reaches the limit has no EOS and fills the window"
    ),
}
_PIPELINE_0_5_0 = _pipeline_multi_turn(
    "0.5.0",
    naive="verl/workers/reward_manager/naive.py:54,98 (dapo.py:124, prime.py:174, batch.py:104)",
    kl="verl/trainer/ppo/ray_trainer.py:170-179",
    padding="verl/experimental/agent_loop/agent_loop.py:343 (padding_side='right')",
    critic="verl/workers/critic/dp_critic.py:185-186, verl/workers/critic/megatron_critic.py:131-132",
    produces=_PRODUCES_0_5_0,
)


def _produces_git(rev: str) -> dict:
    """The production citations at the two git pins (#2337 and its parent), read at each."""
    pin = f"verl {rev[:9]}"
    sglang = (
        f"{pin}: verl/workers/rollout/sglang_rollout/sglang_rollout.py:844-848 appends a tool response "
        "(verl/workers/rollout/schemas.py:341, loss_mask=False) and stops at max_model_len, :944-946 likewise after "
        "an interaction's user turn, and schemas.py:484-494 cut the response at max_response_len; "
        "sglang_rollout.py:1144 hands response_loss_mask on as response_mask"
    )
    common = {
        "masked_values": (
            f"{pin}: verl/workers/critic/megatron_critic.py:131-132 multiplies the values by "
            "attention_mask[:, -response_length:] only (the Megatron critic, with the Megatron "
            "AsyncActorRolloutRefWorker, verl/workers/megatron_workers.py:664): tool tokens keep their values"
        ),
        "token_rewards": (
            f"{pin}: verl/trainer/ppo/ray_trainer.py:161-173 (apply_kl_penalty, algorithm.use_kl_in_reward): "
            "token_level_scores - beta * kld * response_mask, a KL term at every trainable position"
        ),
    }
    if rev == _BEFORE_MASKING:
        # multi_turn.enable asserts GRPO (ray_trainer.py:535-537), but the agent loop is picked per sample by
        # agent_name (agent_loop.py:218-247) and reads its tools from multi_turn.tool_config_path (tool_agent_loop.py:
        # 106-107), so GAE gets the tool agent loop's mask with multi_turn.enable left False
        loop = (
            f"{pin}: verl/experimental/agent_loop/tool_agent_loop.py:135 (assistant tokens 1) and :169 (tool response "
            "tokens 0) in one loop, agent_loop.py:287-301 the response_mask of the batch (kept by "
            "ray_trainer.py:1172-1173); the agent loop is chosen per sample by agent_name (agent_loop.py:218-247), "
            "whatever multi_turn.enable (whose GRPO-only assert, ray_trainer.py:535-537, the agent loop does not need)"
        )
        return {
            **common,
            "gaps": loop,
            "masked_real_tail": (
                f"{pin}: verl/experimental/agent_loop/tool_agent_loop.py:168-176 appends the tool response with mask 0 "
                "and stops at max_user_turns or response_length: the response ends on it (agent_loop.py:287-301), "
                "where naive.py:98 writes the score; " + sglang + " (GRPO only at this pin)"
            ),
        }
    return {
        **common,
        "gaps": (
            f"{pin}: verl/experimental/agent_loop/tool_agent_loop.py:135 (assistant tokens 1) and :179 (tool response "
            "tokens 0) in one loop, agent_loop.py:287-301 the batch's response_mask (kept by ray_trainer.py:1167)"
        ),
        # the tool agent loop no longer ends on a tool turn (tool_agent_loop.py:173-176, "the EOS token reward can't
        # be propagated to previous token in GAE"); the sglang multi-turn rollout still does
        "masked_real_tail": sglang + "; naive.py:98 writes the score on the last attended token, a masked one",
    }


def _pipeline_git(rev: str) -> Domain:
    return _pipeline_multi_turn(
        rev[:12],
        naive="verl/workers/reward_manager/naive.py:54,98",
        kl="verl/trainer/ppo/ray_trainer.py:161-170",
        padding="verl/experimental/agent_loop/agent_loop.py:269 (padding_side='right')",
        critic="verl/workers/critic/dp_critic.py:195, verl/workers/critic/megatron_critic.py:132",
        produces=_produces_git(rev),
    )


def _pipeline_0_9_1() -> Domain:
    return Domain(
        dtypes=("float32",),
        left_padding=False,
        nonfinite_poison=False,
        padding_values=False,
        padding_rewards=False,
        why={
            "dtypes": (
                "verl 0.9.1: verl/trainer/ppo/ray_trainer.py:1262 casts the critic's values with .float() and "
                "verl/workers/reward_manager/naive.py:98 builds the reward tensor as float32"
            ),
            "padding_values": (
                "verl 0.9.1: verl/trainer/ppo/ray_trainer.py:1261 no_padding_2_padding pads each response's values with "
                "zeros (verl/workers/utils/padding.py:138, F.pad): a padding position holds 0"
            ),
            "padding_rewards": (
                "verl 0.9.1: verl/trainer/ppo/ray_trainer.py:103-106 multiplies the KL by response_mask, 0 at padding, "
                "and verl/workers/reward_manager/naive.py:153 writes the score at an attended token"
            ),
            "left_padding": (
                "verl 0.9.1: verl/experimental/agent_loop/agent_loop.py:763-779 pads responses and the response "
                "mask on the right"
            ),
            "nonfinite_poison": _NONFINITE.format(
                critic="verl 0.9.1: verl/workers/engine/fsdp/transformer_impl.py:1600-1644, padding filled by "
                "no_padding_2_padding in verl/trainer/ppo/ray_trainer.py:1261",
                reward="verl/workers/reward_manager/naive.py:153",
            ),
        },
        produces=_PRODUCES_0_9_1,
    )


# 0.9.1: rollout correction's rejection sampling rewrites response_mask after the reward manager placed the score and
# after the KL in the reward, before any estimator reads it (ray_trainer.py:1639-1667; v1 trainer_base.py:1754-1775).
_ROLLOUT_RS = (
    "verl 0.9.1: with algorithm.rollout_correction.rollout_rs (verl/trainer/config/algorithm.py:104-116), "
    "verl/trainer/ppo/rollout_corr_helper.py:412 multiplies response_mask by the keep mask, written back at :1061 by "
    "compute_rollout_correction_and_add_to_batch, which verl/trainer/ppo/ray_trainer.py:1658 (v1: "
    "verl/trainer/ppo/v1/trainer_base.py:1771) runs before compute_advantage (:1667; v1 :1775)"
)
_PRODUCES_0_9_1 = {
    "gaps": (
        "verl 0.9.1: verl/experimental/agent_loop/tool_agent_loop.py:386-397 merges a tool response with mask 0 "
        "(verl/utils/tokenizer/continuous_token.py:412-413) and :274-282 the next assistant turn with mask 1 "
        "(continuous_token.py:399-400); agent_loop.py:767-779 pads it into the batch's response_mask"
    ),
    "masked_real_tail": (
        _ROLLOUT_RS + "; a token-level option (token_k1/k2/k3, rollout_corr_helper.py:312-322) rejects any token, the "
        "response's last one too, where verl/workers/reward_manager/naive.py:153 (agent_loop.py:1096-1098) wrote the "
        "score at valid_response_length - 1: the response ends on a masked, attended token holding the score"
    ),
    "leading_mask": _ROLLOUT_RS + "; a token-level option (rollout_corr_helper.py:312-322) rejects the first token too",
    "all_masked_rows": (
        _ROLLOUT_RS + "; a sequence-level option (seq_sum_* / seq_mean_* / seq_max_*, rollout_corr_helper.py:340, 359, "
        "371) rejects every token of a row"
    ),
    "masked_values": (
        "verl 0.9.1: verl/workers/engine/fsdp/transformer_impl.py:1629-1640 returns values at every attended token "
        "and verl/trainer/ppo/ray_trainer.py:1252-1262 only fills padding (no_padding_2_padding): tool tokens and "
        "tokens the rollout correction rejects keep the critic's values"
    ),
    # the KL in the reward is masked with the mask *before* the rejection: a rejected token keeps its KL term
    "masked_rewards": (
        "verl 0.9.1: verl/trainer/ppo/ray_trainer.py:1639-1642 (algorithm.use_kl_in_reward) writes "
        "token_level_scores - beta * kld * response_mask (:103-106) with the rollout's mask; then "
        + _ROLLOUT_RS
        + ": a token the rejection masks keeps its KL term in token_level_rewards"
    ),
    "token_rewards": (
        "verl 0.9.1: verl/trainer/ppo/ray_trainer.py:1639-1642 (algorithm.use_kl_in_reward) applies apply_kl_penalty: "
        "token_level_scores - beta * kld * response_mask (:103-106), a KL term at every trainable position"
    ),
    "truncated_rows": (
        "verl 0.9.1: verl/experimental/agent_loop/single_turn_agent_loop.py:96-97 and tool_agent_loop.py:195-196 cut "
        "the response at rollout.response_length: a response that reaches the limit has no EOS and fills the window"
    ),
}


# --- verl's own words about the GAE entry (`Promise`): #2337 on, compute_gae_advantage_return says it skips what sits
# at observation (masked) tokens, and verl's own test checks that masked values do not move the advantages. Before
# #2337 (0.1, 0.4.1, 11ee5125d) the docstring only calls the mask an "[EOS] mask" and the loop is dense: its gap
# decay is a semantics fact there, the behaviour change of 0332866.
_SKIP_OBSERVATION = "# skip values and TD-error on observation tokens"
_SKIP_COVERS = (
    "gap-invariance",
    "mechanism:extra-decay",
    "mechanism:masked-value-bootstrap",
    "mechanism:masked-reward-leak",
)
_SKIP_NOTE = (
    "the reverse loop carries nextvalues and lastgaelam through masked positions (the two lines below the comment): "
    "a masked token's value and TD error (its reward included) never enter a trained advantage, and a gap costs no "
    "decay"
)
_GAE_TEST = (
    '"""Test multi-turn GAE skip observation tokens.""" ... response_mask = torch.tensor([[0, 0, 1, 1, 1, 0, 0, 1, 1, '
    "0, 0]], dtype=torch.float) ... adv1, ret1 = compute_gae_advantage_return(rewards, values1, response_mask, gamma, "
    "lam) ... assert torch.equal(adv1, adv2)"
)
_GAE_TEST_NOTE = (
    "verl's own test_multi_turn_compute_gae_advantage_return: values1 and values2 differ only at masked positions "
    "(random there), the advantages must be bitwise equal"
)
GAE_PROMISES = (
    Promise("upstream:verl/trainer/ppo/core_algos.py:232", _SKIP_OBSERVATION, _SKIP_COVERS, _SKIP_NOTE, ("0.5.0",)),
    Promise(
        "upstream:verl/trainer/ppo/core_algos.py:197", _SKIP_OBSERVATION, _SKIP_COVERS, _SKIP_NOTE, (_MASKING_COMMIT,)
    ),
    Promise("upstream:verl/trainer/ppo/core_algos.py:254", _SKIP_OBSERVATION, _SKIP_COVERS, _SKIP_NOTE, ("0.9.1",)),
    Promise(
        "upstream:tests/trainer/ppo/test_core_algos_on_cpu.py:134-187",
        _GAE_TEST,
        ("mechanism:masked-value-bootstrap",),
        _GAE_TEST_NOTE,
        ("0.5.0", _MASKING_COMMIT),
    ),
    Promise(
        "upstream:tests/trainer/ppo/test_core_algos_on_cpu.py:144-197",
        _GAE_TEST,
        ("mechanism:masked-value-bootstrap",),
        _GAE_TEST_NOTE,
        ("0.9.1",),
    ),
)

# --- verl's own words about the loss over a step. Before the global normalisers, the DAPO page promises what
# token-mean means: the mean over every token of the mini-batch (one optimizer step, ppo_mini_batch_size, cut into
# micro-batches for gradient accumulation, verl/workers/actor/dp_actor.py:380-389 at 0.5.0), which the dp_actor's
# per-micro-batch agg_loss does not compute (dp_actor.py:465-469). From 0.7.0 agg_loss takes the step's normalisers
# and its docstring promises split invariance (the legacy dp_actor, the default worker until #5604, passed none).
_DAPO_TOKEN_MEAN = (
    "Setting `loss_agg_mode` to `token-mean` will mean the (policy gradient) loss across all the tokens in all the "
    "sequences in a mini-batch."
)
_DAPO_NOTE = (
    "actor.loss_agg_mode defaults to token-mean (verl/trainer/config/actor/actor.yaml:63 at 0.5.0, ppo_trainer.yaml "
    "at 0.4.1); a mini-batch is one optimizer step, cut into micro-batches of ppo_micro_batch_size_per_gpu (or by "
    "token budget with use_dynamic_bsz): the step's loss must not depend on the cut. The page speaks of token-mean "
    "only: a split finding of another actor.loss_agg_mode is covered too (a promise cannot name an option value)"
)
TOKEN_MEAN_PROMISES = (
    Promise(
        "upstream:docs/algo/dapo.md:118",
        _DAPO_TOKEN_MEAN,
        ("split-invariance", "mechanism:split-normaliser"),
        _DAPO_NOTE,
        ("0.4.1",),
    ),
    Promise(
        "upstream:docs/algo/dapo.md:120",
        _DAPO_TOKEN_MEAN,
        ("split-invariance", "mechanism:split-normaliser"),
        _DAPO_NOTE,
        ("0.5.0",),
    ),
)
AGG_LOSS_PROMISE = Promise(
    "upstream:verl/trainer/ppo/core_algos.py:1150",
    "Aggregate the loss across global batch to ensure the loss is invariant to fsdp/megatron parallelism.",
    ("split-invariance", "mechanism:split-normaliser"),
    "agg_loss's docstring at 0.9.1: with dp_size, batch_num_tokens and global_batch_size of the step (ppo_loss, "
    "verl/workers/utils/losses.py:65-68) every micro-batch and rank normalises by the step",
    ("0.9.1",),
)
# --- the AlgoConfig docstring of the option grpo_vectorized ignores (the trainer passes it inside config only)
NORM_STD_DOC_PROMISE = Promise(
    "upstream:verl/trainer/config/algorithm.py:630",
    "norm_adv_by_std_in_grpo (bool): Whether to normalize advantages by std (specific to GRPO).",
    ("mechanism:variant-mismatch",),
    "compute_advantage hands grpo_vectorized this AlgoConfig as `config` and no keyword (ray_trainer.py:250-279 at "
    "0.9.1); compute_grpo_vectorized_outcome_advantage reads norm_adv_by_std_in_grpo only as its keyword "
    "(core_algos.py:340, 353), so False still divides by the std",
    ("0.9.1",),
)


# --- the kinds beyond GAE (targets/adapters/verl_kinds.py; line numbers are 0.9.1's unless a pin is named) ---
_MASKED_VAR_ERRORS = (
    # verl/utils/torch_functional.py::masked_var (unbiased) with < 2 masked elements in the batch
    r"ValueError: At least one element in the mask has to be 1",
    r"ValueError: The sum of the mask is one, which can cause a division by zero",
)


def _without(dom: Domain | None, *names: str) -> Domain | None:
    """`dom` with the narrowings `names` lifted (fields that do not apply to a kind, e.g. critic values)."""
    if dom is None:
        return None
    full = Domain()
    why = {k: v for k, v in dom.why.items() if k not in names}
    return dataclasses.replace(dom, **{n: getattr(full, n) for n in names}, why=why)


def _per_pin(*names: str) -> dict:
    """The GAE entry's per-pin pipeline domains with the narrowings `names` lifted."""
    pins = {
        "0.1": _pipeline_0_1(),
        "0.4.1": _pipeline_0_4_1(),
        "0.9.1": _pipeline_0_9_1(),
        _MASKING_COMMIT: _pipeline_git(_MASKING_COMMIT),
        _BEFORE_MASKING: _pipeline_git(_BEFORE_MASKING),
    }
    out = {}
    for pin, dom in pins.items():
        dom = _without(dom, *names)
        if not dom.all_masked_rows:  # 0.1 / 0.4.1: get_eos_mask / get_response_mask keep position 0 of every row
            dom = dataclasses.replace(dom, empty_rows=False, why={**dom.why, "empty_rows": dom.why["all_masked_rows"]})
        out[pin] = dom
    return out


_GROUP_API = Domain(
    left_padding=False,
    why={
        "left_padding": (
            "the score goes where verl's reward manager writes it, attention_mask[prompt_length:].sum() - 1 "
            "(verl/workers/reward_manager/naive.py:129-153 at 0.9.1), the last real token only for a right-padded "
            "response window"
        ),
    },
)
_GROUP_MASKED_ZERO = "core_algos.py:329 (0.9.1) multiplies the broadcast advantage by response_mask"


# Every group estimator enters *every* row of `index` into its group's statistics, trained or not: the scores are
# token_level_rewards.sum(dim=-1) of each row and the loop over range(bsz) appends each to its uid's list (0.9.1
# core_algos.py:304-313 grpo, :350-352 grpo_vectorized via group_mean_std over all rows, :562-570 reinforce++-baseline,
# :612-620 rloo, :665-673 opo, :810-811 gpg's alpha over the batch, :858-864 rloo_vectorized; the same loops at 0.4.1
# and 0.5.0). A row without a trainable token (every token rejected by rollout correction, 0.9.1) is a sample the
# policy produced, and counting its reward in the GRPO / RLOO baseline is the unbiased choice: the variant
# `empty_rows="counted"`, checked at 0.4.1, 0.5.0 and 0.9.1 (docs/audit/verl.md), never a defect by itself.
_COUNTED = {"empty_rows": "counted"}


def _group(variant: dict, masked_zero_line: str) -> dict:
    return dict(
        kind="group-advantage",
        variant={**variant, **_COUNTED},
        masked_zero=True,
        masked_zero_why=masked_zero_line,
        whitening=None,
        documented_errors=(),
        domain=_GROUP_API,
        # GRPO / RLOO get the same response_mask and token_level_rewards as GAE (ray_trainer.py:235-281 at 0.9.1);
        # critic values do not enter
        pipeline=_without(_PIPELINE_0_5_0, "masked_values"),
        pipeline_by_pin=_per_pin("masked_values"),
        # an outcome score: no bootstrap, no truncation input (the GAE entry's semantics are not inherited)
        truncation=None,
    )


def _pipeline_grpo_0_4_1() -> Domain:
    """0.4.1's GRPO branch with multi-turn: compute_advantage hands compute_grpo_outcome_advantage the sglang rollout's
    loss_mask (ray_trainer.py:242-247), not the attention the other estimators get (:1012), and the KL in the reward
    is masked with the attention (apply_kl_penalty is called without multi_turn, :1098 -> :158-159), so a tool token
    keeps its KL term. Multi-turn with tools is GRPO-only at this pin (:477-479)."""
    sglang = "verl/workers/rollout/sglang_rollout/sglang_rollout.py"
    mask = (
        f"{sglang}:1044-1046, :1051, :1061 hand the request's response_loss_mask on as loss_mask, which "
        "verl/trainer/ppo/ray_trainer.py:242-247 passes to compute_grpo_outcome_advantage with "
        "rollout.multi_turn.enable (:1114)"
    )
    return Domain(
        dtypes=("float32",),
        left_padding=False,
        nonfinite_poison=False,
        why={
            "dtypes": _pipeline_0_4_1().why["dtypes"],
            "left_padding": (
                f"verl 0.4.1: {sglang}:1031-1033 and :1044-1046 pad the response and its loss mask on the right"
            ),
            "nonfinite_poison": _pipeline_0_4_1().why["nonfinite_poison"],
        },
        produces={
            "gaps": (
                "verl 0.4.1: verl/workers/rollout/schemas.py:256 appends a tool response with loss_mask=False and "
                f":243 the next assistant message with loss_mask=True ({sglang}:802, :808 back to RUNNING); " + mask
            ),
            "masked_real_tail": (
                f"verl 0.4.1: {sglang}:802-807 appends the tool response (loss_mask=False, schemas.py:256) and stops "
                "at max_model_len, and schemas.py:369-377 cut the response at max_response_len, inside a tool response "
                "too; naive.py:95 writes the score at the last attended token, a masked one; " + mask
            ),
            "masked_rewards": (
                "verl 0.4.1: verl/trainer/ppo/ray_trainer.py:1097-1098 calls apply_kl_penalty without multi_turn, so "
                ":158-159 mask the KL with attention_mask[:, -response_length:] and :163-167 leave the KL of every "
                "tool token (attended, loss_mask 0) in token_level_rewards, which compute_grpo_outcome_advantage "
                "sums unmasked"
            ),
            "token_rewards": _KL_IN_REWARD_0_4_1,
        },
    )


def _kl(variant: dict) -> dict:
    return dict(
        kind="kl",
        variant=variant,
        masked_zero=False,
        masked_zero_why=(
            "kl_penalty takes no mask (core_algos.py:2188-2213 at 0.9.1); its callers mask: apply_kl_penalty "
            "multiplies by response_mask (verl/trainer/ppo/ray_trainer.py:100-103) and the KL loss aggregates with "
            "agg_loss(loss_mask=response_mask) (verl/workers/utils/losses.py:135-138)"
        ),
        whitening=None,
        documented_errors=(),
        domain=Domain(),
        pipeline=None,  # not researched: every finding is reach: api
        pipeline_by_pin={},
        truncation=None,
    )


def _kl_logprobs(dom: Domain) -> Domain:
    """`dom` for an entry with the KL in the reward: masked log-probs are the rollout's real log-probs (old_log_probs
    and ref_log_prob are computed for every response token by the actor and the reference model)."""
    why = {
        **dom.why,
        "masked_logprobs": "old_log_probs and ref_log_prob are log-softmax outputs of the actor and of "
        "the reference model at every response token, under the mask as elsewhere",
    }
    return dataclasses.replace(dom, masked_logprobs=False, why=why)


_WHITEN_MASKED_ZERO = (
    "masked_whiten returns (values - mean) * rsqrt(var + 1e-8) at every position (verl/utils/torch_functional.py:343 "
    "at 0.9.1), masked positions included; its callers multiply by the mask (core_algos.py:466, 582, 729)"
)


def _loss(variant: dict) -> dict:
    return dict(
        kind="loss-aggregation",
        variant=variant,
        masked_zero=True,  # dL/dl at masked positions: masked_sum zeroes them (torch_functional.py:273-291)
        masked_zero_why="",
        whitening=None,
        documented_errors=(),
        domain=Domain(),
        pipeline=None,  # not researched: every finding is reach: api
        pipeline_by_pin={},
        truncation=None,
    )


# --- options (oracles/options.py): the real config keys that change an entry's masked math, read at 0.9.1 (the
# same lines at HEAD 1dda039b9). `algorithm.norm_adv_by_std_in_grpo` (AlgoConfig, verl/trainer/config/
# algorithm.py:658, default True) reaches the three GRPO estimators by three different routes:
_NORM_STD_DOC = (
    "whether to normalize advantages by std (specific to GRPO): True divides r - mean_g by std_g + epsilon (GRPO), "
    "False keeps r - mean_g (Dr.GRPO, the docstring at core_algos.py:294-297)"
)
_NORM_STD_FALSE = {False: {"variant": {"std": None}}}
# GRPO: the trainer reads the key (ray_trainer.py:1663-1664; v1/trainer_base.py:1782) and compute_advantage passes
# it as the keyword of compute_grpo_outcome_advantage (ray_trainer.py:240-245), which reads it at core_algos.py:325
NORM_STD_GRPO = Option(
    "algorithm.norm_adv_by_std_in_grpo",
    (True, False),
    True,
    "verl/trainer/ppo/ray_trainer.py:244 (0.9.1; read at :1663, v1/trainer_base.py:1782; used at core_algos.py:325)",
    _NORM_STD_DOC,
    effect=_NORM_STD_FALSE,
)
# grpo_vectorized is dispatched through the registry branch of compute_advantage, which passes the algorithm config
# (config=AlgoConfig, ray_trainer.py:250-279) and no keyword; the function reads the key only as its keyword
# (core_algos.py:340, 353), never from config: the documented meaning is still Dr.GRPO for False
NORM_STD_GRPO_VECTORIZED = Option(
    "algorithm.norm_adv_by_std_in_grpo",
    (True, False),
    True,
    "verl/trainer/ppo/ray_trainer.py:254 (0.9.1: config=AlgoConfig is all the registry branch passes; "
    "core_algos.py:340, 353 read only the keyword norm_adv_by_std_in_grpo)",
    _NORM_STD_DOC,
    effect=_NORM_STD_FALSE,
)
# grpo_passk reads it from the config the registry branch passes (core_algos.py:500); False: the raw r_max - r_second
NORM_STD_PASSK = Option(
    "algorithm.norm_adv_by_std_in_grpo",
    (True, False),
    True,
    "verl/trainer/ppo/core_algos.py:500 (0.9.1: config.get('norm_adv_by_std_in_grpo', True); used at :524)",
    _NORM_STD_DOC,
    effect=_NORM_STD_FALSE,
)
# the critic's loss: value_loss(config: CriticConfig) passes config.cliprange_value and config.loss_agg_mode to
# compute_value_loss (verl/workers/utils/losses.py:191-192 at 0.9.1); defaults 0.5 and "token-mean"
# (verl/workers/config/critic.py:93-94; the trainer yaml sets the critic's loss_agg_mode from the actor's)
CLIPRANGE_VALUE = Option(
    "critic.cliprange_value",
    (0.5, 0.2, 10.0),
    0.5,
    "verl/workers/utils/losses.py:191 (0.9.1; default verl/workers/config/critic.py:93)",
    "PPO value function clipping range: v_old + clamp(v - v_old, -c, c) enters max((v - R)^2, (v_c - R)^2)",
    effect={0.2: {"variant": {"clip": 0.2}}, 10.0: {"variant": {"clip": 10.0}}},
)
_CRITIC_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean")
CRITIC_LOSS_AGG_MODE = Option(
    "critic.loss_agg_mode",
    _CRITIC_MODES,
    "token-mean",
    "verl/workers/utils/losses.py:192 (0.9.1; default verl/workers/config/critic.py:94; agg_loss "
    "core_algos.py:1170-1204)",
    "how the per-token value losses of the step are aggregated (agg_loss); seq-mean-token-sum-norm is not declared: "
    "its default loss_scale_factor=None divides by the padded width (core_algos.py:1190-1192)",
    effect={m: {"variant": {"mode": m}} for m in _CRITIC_MODES[1:]},
)
# the actor's policy loss: ppo_loss hands compute_policy_loss_vanilla the ActorConfig (verl/workers/utils/
# losses.py:104-112 at 0.9.1), which reads clip_ratio_low / clip_ratio_high (core_algos.py:1321-1322) and
# clip_ratio_c (:1323-1325) from it and aggregates with config.loss_agg_mode (losses.py:99); defaults 0.2, 0.2, 3.0,
# "token-mean"
# (verl/workers/config/actor.py:159-164, actor.yaml:39, 42, 83, 86)
_POLICY_CLIPS = (0.2, 0.1, 0.28)  # 0.28: the DAPO clip-higher value of verl's recipes
CLIP_RATIO_LOW = Option(
    "actor.clip_ratio_low",
    _POLICY_CLIPS,
    0.2,
    "verl/trainer/ppo/core_algos.py:1321 (0.9.1; default verl/workers/config/actor.py:159)",
    "lower clip range: the ratio is clamped to [1 - clip_ratio_low, 1 + clip_ratio_high]",
    effect={c: {"variant": {"clip_low": c}} for c in _POLICY_CLIPS[1:]},
)
CLIP_RATIO_HIGH = Option(
    "actor.clip_ratio_high",
    _POLICY_CLIPS,
    0.2,
    "verl/trainer/ppo/core_algos.py:1322 (0.9.1; default verl/workers/config/actor.py:160)",
    "upper clip range (DAPO clip-higher): the ratio is clamped to [1 - clip_ratio_low, 1 + clip_ratio_high]",
    effect={c: {"variant": {"clip_high": c}} for c in _POLICY_CLIPS[1:]},
)
_DUAL_CLIPS = (3.0, 1.5, 10.0)
CLIP_RATIO_C = Option(
    "actor.clip_ratio_c",
    _DUAL_CLIPS,
    3.0,
    "verl/trainer/ppo/core_algos.py:1323-1325 (0.9.1; default verl/workers/config/actor.py:163)",
    "lower bound of the ratio for dual-clip PPO: where A < 0 the loss is at most -A * clip_ratio_c",
    effect={c: {"variant": {"dual_clip": c}} for c in _DUAL_CLIPS[1:]},
)
ACTOR_LOSS_AGG_MODE = Option(
    "actor.loss_agg_mode",
    _CRITIC_MODES,
    "token-mean",
    "verl/workers/utils/losses.py:99 (0.9.1; default verl/workers/config/actor.py:164; agg_loss "
    "core_algos.py:1170-1204)",
    "how the per-token policy losses of the step are aggregated (agg_loss); seq-mean-token-sum-norm is not declared: "
    "its default loss_scale_factor=None divides by the padded width (core_algos.py:1190-1192)",
    effect={m: {"variant": {"mode": m}} for m in _CRITIC_MODES[1:]},
)
# No truncation notion anywhere in verl's advantage code: a row cut by the response length (no EOS) is handed on like
# an ended one. compute_gae_advantage_return starts its reverse loop with nextvalues = 0 and lastgaelam = 0
# (core_algos.py:245-246 at 0.9.1, the same at HEAD; :223-224 in 0.5.0) and carries nextvalues through masked
# positions (:255), so the value after a row's last trained token is 0: terminal. 0.1 / 0.4.1 use 0.0 after the
# window's last position only (nextvalues = values[:, t + 1] ... else 0.0, core_algos.py:97 in 0.1, :187 in 0.4.1): a
# cut row that fills the window is terminal there too, one followed by padding reads the padding's value (the plain
# loop's known leak, judged by the poison property, not a truncation semantics).
GAE_TRUNCATION = Truncation(
    cite="verl/trainer/ppo/core_algos.py:245 (0.9.1): nextvalues = 0 before the reverse loop, carried through masked "
    "positions (:255); no EOS / truncation input (the signature at :216-222), so a cut row gets a zero bootstrap"
)
# compute_reinforce_plus_plus_outcome_advantage: running_return = 0 before its reverse loop (core_algos.py:718)
REINFORCE_PP_TRUNCATION = Truncation(
    cite="verl/trainer/ppo/core_algos.py:718 (0.9.1): running_return = 0 before the reverse loop, carried through "
    "masked positions (:726); no truncation input, so a cut row's return has no bootstrap"
)


# compute_reinforce_plus_plus_outcome_advantage: a discounted return carried through masked positions
# (core_algos.py:718-726 at 0.9.1, #7300 "carry running_return through observation spans"): the compressed
# contract; 0.4.1 ... 0.7.0 reset the carry at every masked position ("Reset after EOS"). The advantages are
# masked_whiten(returns, response_mask) * response_mask (:728-729); the returns are not whitened.
_REINFORCE_PP = dict(
    kind="returns",
    contract="compressed",
    whitening=Whitening(unbiased=True, eps=1e-8),
    masked_zero=True,
    masked_zero_why="core_algos.py:729 (0.9.1) multiplies the whitened advantages by response_mask",
    documented_errors=_MASKED_VAR_ERRORS,
    domain=Domain(
        dtypes=("float32", "float64"),
        left_padding=False,
        critic=False,
        why={
            "dtypes": "as the GAE entry: verl's token_level_rewards are float32 (reward managers) or wider",
            "left_padding": _GROUP_API.why["left_padding"],
            "critic": "compute_reinforce_plus_plus_outcome_advantage takes no values (core_algos.py:694-695)",
        },
    ),
    pipeline=_without(_PIPELINE_0_5_0, "masked_values"),
    # the same rewards and response_mask as GAE (ray_trainer.py:248-281 at 0.9.1); no critic values
    pipeline_by_pin=_per_pin("masked_values"),
    truncation=REINFORCE_PP_TRUNCATION,
)


# the GRPO branch of compute_advantage gets the multi-turn loss_mask at 0.4.1 (_pipeline_grpo_0_4_1); elsewhere as GAE
_GRPO_PIPELINE_BY_PIN = {**_per_pin("masked_values"), "0.4.1": _pipeline_grpo_0_4_1()}

KIND_OVERRIDES: dict[str, dict] = {
    # compute_grpo_outcome_advantage: torch.std, unbiased (core_algos.py:321); (s - mean) / (std + epsilon), eps
    # outside the std (:326), epsilon=1e-6 by default and never passed by ray_trainer.py:240-245; a singleton gets
    # mean 0 and std 1 (:316-317): s / (1 + eps), the "raw" rule. Empty rows enter the statistics (the scores are
    # an unmasked sum over every row, :304-312): not documented, so the variant stays canonical ("excluded").
    "grpo": {
        **_group({"estimator": "grpo", "std": "unbiased", "eps": 1e-6, "eps_place": "std"}, _GROUP_MASKED_ZERO),
        "options": (NORM_STD_GRPO,),
        "pipeline_by_pin": _GRPO_PIPELINE_BY_PIN,
    },
    # norm_adv_by_std_in_grpo=False: s - mean (:328), documented as Dr.GRPO in the docstring (:296-297);
    # a singleton keeps its raw score (mean 0, :316)
    "drgrpo": {
        **_group({"estimator": "grpo", "std": None}, _GROUP_MASKED_ZERO),
        "pipeline_by_pin": _GRPO_PIPELINE_BY_PIN,
    },
    # group_mean_std(scores, g, eps=0.0) (:352; verl/utils/groupwise.py:163-219): unbiased two-pass variance over
    # count - 1 (groupwise.py:208-209), singleton mean 0 / std 1 (:215-218); (s - mean) / (std + epsilon) (:354)
    "grpo-vectorized": {
        **_group(
            {"estimator": "grpo", "std": "unbiased", "eps": 1e-6, "eps_place": "std"},
            "core_algos.py:357 (0.9.1) multiplies the broadcast advantage by response_mask",
        ),
        # group_mean_std documents float32 statistics ("Returns: mean_g: (G,) float32", groupwise.py:186-189) and
        # casts the scores to float32 (groupwise.py:191): a float64 batch gets float32 precision by design
        "domain": dataclasses.replace(
            _GROUP_API,
            dtypes=("float16", "bfloat16", "float32"),
            why={
                **_GROUP_API.why,
                "dtypes": "verl/utils/groupwise.py:186-191 (0.9.1): group_mean_std casts the scores to float32 and "
                "documents float32 statistics",
            },
        ),
        "options": (NORM_STD_GRPO_VECTORIZED,),
        "promises": (NORM_STD_DOC_PROMISE,),
        "twin_of": "grpo",  # the loop it vectorises: the `twin` property compares them on every case
    },
    # n / (n - 1) (s - mean) (:630-633); a singleton keeps its raw score (:623, the loop skips n == 1)
    "rloo": _group({"estimator": "rloo"}, "core_algos.py:634 (0.9.1) multiplies by response_mask"),
    # (c s - sum_g) / max(c - 1, 1) * (c > 1) (:864): a singleton gets 0
    "rloo-vectorized": {
        **_group({"estimator": "rloo", "singleton": "zero"}, "core_algos.py:866 (0.9.1) multiplies by response_mask"),
        "twin_of": "rloo",  # the loop keeps a singleton's score (:623), this one zeroes it: the twin property shows it
    },
    # compute_reinforce_plus_plus_baseline_outcome_advantage (core_algos.py:536-584 at 0.9.1): s - mean_g over the
    # unmasked score sums, a singleton gets mean 0 (:572-573), broadcast * response_mask (:581), then
    # masked_whiten(scores, response_mask) * response_mask (:582): unbiased, eps 1e-8 under the sqrt
    "reinforce++-baseline": {
        **_group({"std": None, "whiten_tokens": True}, "core_algos.py:582 (0.9.1) multiplies by response_mask"),
        "documented_errors": _MASKED_VAR_ERRORS,
    },
    # kl_penalty_forward (core_algos.py:2216-2251 at 0.9.1): "kl"/"k1" d, "abs" |d|, "mse"/"k2" d^2 / 2
    "kl-k1": _kl({"estimator": "k1"}),
    "kl-abs": _kl({"estimator": "abs"}),
    "kl-k2": _kl({"estimator": "k2"}),
    # "low_var_kl"/"k3": kl = clamp(ref - logp, -20, 20) (:2242), exp(kl) - kl - 1 clamped to [-10, 10] (:2245);
    # both clamps are in the code "for numerical stability" (:2241)
    "kl-low_var_kl": _kl({"estimator": "low_var_kl", "clamp_d": (-20.0, 20.0), "clamp": (-10.0, 10.0)}),
    # "k3+": the k3 forward value with the k2 gradient, straight-through (:2199-2213); the value is k3's
    "kl-k3+": _kl({"estimator": "k3", "clamp_d": (-20.0, 20.0), "clamp": (-10.0, 10.0)}),
    # masked_whiten(values, mask): mean = masked_sum / (mask.sum() + 1e-8) (torch_functional.py:308), unbiased
    # Bessel n / (n - 1) (:324-325), (x - mean) * rsqrt(var + 1e-8) (:343): eps inside the sqrt, batch level
    "whiten": dict(
        kind="normalization",
        variant={"level": "batch", "unbiased": True, "eps": 1e-8, "eps_place": "var", "shift_mean": True},
        masked_zero=False,
        masked_zero_why=_WHITEN_MASKED_ZERO,
        whitening=None,
        documented_errors=_MASKED_VAR_ERRORS,
        domain=Domain(),
        pipeline=None,  # not researched: every finding is reach: api
        pipeline_by_pin={},
        truncation=None,
    ),
    # masked_mean(values, mask) with axis=None: masked_sum / (mask.sum() + 1e-8) (torch_functional.py:294-308)
    "masked-mean": dict(
        kind="normalization",
        variant={"level": "batch", "output": "mean"},
        masked_zero=False,
        masked_zero_why="masked_mean returns one 0-dim statistic (torch_functional.py:308 at 0.9.1); the adapter "
        "broadcasts it to every position",
        whitening=None,
        documented_errors=(),
        domain=Domain(),
        pipeline=None,
        pipeline_by_pin={},
        truncation=None,
    ),
    "reinforce++": _REINFORCE_PP,  # above
    # KL in the reward (`oracles/kl_reward.py`) before compute_reinforce_plus_plus_outcome_advantage, as the trainer
    # runs it with algorithm.use_kl_in_reward=True (ray_trainer.py:1638-1642 at 0.9.1; verl_kinds.load_returns_kl):
    # apply_kl_penalty (:78-117) takes kl_penalty(old_log_probs, ref_log_prob, algorithm.kl_penalty="kl") =
    # logprob - ref_logprob, no clamp (core_algos.py:2228-2229 kl_penalty_forward; ppo_trainer.yaml:105), multiplies
    # it by response_mask (:103) and subtracts kl_ctrl.value * kld from token_level_scores (:104-106); kl_ctrl is
    # FixedKLController(algorithm.kl_ctrl.kl_coef = 0.001) (ppo_trainer.yaml:114-117, algorithm.py:37;
    # get_kl_controller core_algos.py:193-211). The rest is the reinforce++ entry.
    "reinforce++-kl": dict(
        _REINFORCE_PP,
        variant={"kl_reward": {"coef": 0.001, "estimator": "k1", "clamp_d": None, "clamp": None}},
        pipeline=_kl_logprobs(_REINFORCE_PP["pipeline"]),
        pipeline_by_pin={pin: _kl_logprobs(dom) for pin, dom in _REINFORCE_PP["pipeline_by_pin"].items()},
    ),
    # compute_remax_outcome_advantage: returns = reverse cumsum of rewards * mask (undiscounted), advantages =
    # returns - reward_baselines * mask (core_algos.py:764-765 at 0.9.1); reward_baselines is the greedy rollout's
    # reward of the row (ray_trainer.py:1493-1530)
    "remax": dict(
        kind="returns",
        contract="compressed",
        variant={"baseline": "per-row"},
        whitening=None,  # ReMax does not whiten (core_algos.py:763-767)
        masked_zero=True,
        domain=Domain(
            dtypes=("float32", "float64"),
            left_padding=False,
            critic=False,
            discount=False,
            why={
                "dtypes": "as the GAE entry: verl's token_level_rewards are float32 (reward managers) or wider",
                "left_padding": _GROUP_API.why["left_padding"],
                "critic": "compute_remax_outcome_advantage takes no values (core_algos.py:735-741)",
                "discount": "compute_remax_outcome_advantage has no gamma: an undiscounted cumsum (core_algos.py:764)",
            },
        ),
        pipeline=_without(_PIPELINE_0_5_0, "masked_values"),
        pipeline_by_pin=_per_pin("masked_values"),
        truncation=Truncation(
            cite="verl/trainer/ppo/core_algos.py:764 (0.9.1): the reverse cumsum starts at 0 after the window; no "
            "truncation input, so a cut row's return has no bootstrap"
        ),
    ),
    # compute_opo_outcome_advantage: r - sum_g(len r) / sum_g(len), len = response_mask.sum(-1) (core_algos.py:664,
    # 683 at 0.9.1); a singleton's baseline is 0 (:679); every row of the index enters (empty ones with len 0)
    "opo": _group(
        {"estimator": "opo"}, "core_algos.py:688 (0.9.1) multiplies the broadcast advantage by response_mask"
    ),
    # compute_gpg_outcome_advantage: alpha = bsz / count_nonzero(scores) over the batch (:810-811), then
    # alpha * (r - mean_g) / f_norm, f_norm = 1 (:826-827); a singleton's mean is 0; no std in the advantage
    "gpg": _group(
        {"estimator": "gpg", "std": None},
        "core_algos.py:828 (0.9.1) multiplies the broadcast advantage by response_mask",
    ),
    # compute_grpo_passk_outcome_advantage: the group's best row gets (r_max - r_second) / (torch.std + epsilon)
    # (core_algos.py:519-528 at 0.9.1), every other row 0; a group of one raises (:516-519), documented in the
    # docstring ("Pass@k requires at least 2 samples per group")
    "grpo-passk": {
        **_group(
            {"estimator": "passk", "std": "unbiased", "eps": 1e-6, "eps_place": "std", "singleton": "zero"},
            "core_algos.py:529 (0.9.1) multiplies the broadcast advantage by response_mask",
        ),
        "documented_errors": (r"ValueError: Pass@k requires at least 2 samples per group",),
        "options": (NORM_STD_PASSK,),
    },
    # agg_loss (core_algos.py:1140-1206 at 0.9.1) over a step, with verl's global normalisers (verl_kinds.load_loss)
    "agg-token-mean": {**_loss({"mode": "token-mean"}), "promises": (*TOKEN_MEAN_PROMISES, AGG_LOSS_PROMISE)},
    "agg-token-sum": {**_loss({"mode": "token-sum"}), "promises": (AGG_LOSS_PROMISE,)},
    # the seq-mean modes count every row of the step: 0.9.1 divides by global_batch_size = the mini-batch's rows
    # (ray_trainer.py:1352-1362, core_algos.py:1188, :1202), 0.4.1 / 0.5.0 by torch.mean over the micro-batch's rows
    # (core_algos.py:705 at 0.5.0); #4510 made "use total batch size consistently" its stated design (reverted in
    # #4769 for the legacy engine only). The "# exclude fully masked sequences" comment (:1183) is the numerator's
    # seq_mask, and the denominator when no global size is passed.
    "agg-seq-mean-token-sum": {
        **_loss({"mode": "seq-mean-token-sum", **_COUNTED}),
        "promises": (AGG_LOSS_PROMISE,),
    },
    "agg-seq-mean-token-mean": {
        **_loss({"mode": "seq-mean-token-mean", **_COUNTED}),
        "promises": (AGG_LOSS_PROMISE,),
    },
    # loss_scale_factor set to a constant, as actor.yaml:90 asks (its default null divides by the padded width)
    "agg-seq-mean-token-sum-norm": {
        **_loss({"mode": "seq-mean-token-sum-norm", "constant": 32, **_COUNTED}),
        "promises": (AGG_LOSS_PROMISE,),
    },
    # compute_value_loss: 0.5 * agg_loss(max((v - R)^2, (clip(v, v_old +- 0.5) - R)^2)) (core_algos.py:2171-2183)
    # critic.cliprange_value and critic.loss_agg_mode change the clip range and the aggregation (the options above)
    # empty_rows counted: what the seq-mean options divide by (as the agg-seq-mean-* entries); token-mean ignores it
    "value-loss": {
        **_loss({"clip": 0.5, "mode": "token-mean", **_COUNTED}),
        "kind": "value-loss",
        "options": (CLIPRANGE_VALUE, CRITIC_LOSS_AGG_MODE),
        # value_loss hands compute_value_loss the step's normalisers (verl/workers/utils/losses.py:161-166, #6957)
        "promises": (AGG_LOSS_PROMISE,),
    },
    # compute_policy_loss_vanilla (core_algos.py:1285-1376 at 0.9.1; compute_policy_loss at 0.4.1 / 0.5.0):
    # max(-A r, -A clamp(r, 0.8, 1.2)), min with -A * 3.0 where A < 0 (:1336-1361; log-ratio clamped to [-20, 20],
    # :1338), agg_loss token-mean with the step's normalisers (:1367-1369); the defaults of the actor config
    # (actor.py:159-164). The options above.
    # empty_rows counted: as value-loss. Scope "step" at every pin: 0.4.1 / 0.5.0 normalise each micro-batch by itself
    # (dp_actor.py:465-469 at 0.5.0) although the DAPO page promises the mini-batch's token mean (TOKEN_MEAN_PROMISES):
    # that split dependence is a defect, not a variant
    "policy-loss": {
        **_loss(
            {
                "clip_low": 0.2,
                "clip_high": 0.2,
                "dual_clip": 3.0,
                "advantages": "token",
                "mode": "token-mean",
                **_COUNTED,
            }
        ),
        "kind": "policy-loss",
        "options": (CLIP_RATIO_LOW, CLIP_RATIO_HIGH, CLIP_RATIO_C, ACTOR_LOSS_AGG_MODE),
        "promises": (*TOKEN_MEAN_PROMISES, AGG_LOSS_PROMISE),
        # actor.loss_agg_mode=token-sum at 0.4.1 / 0.5.0: agg_loss has no such mode there and says so
        # (core_algos.py:555 at 0.4.1, :717 at 0.5.0); 0.9.1 has it (:1176-1180)
        "documented_errors": (r"ValueError: Invalid loss_agg_mode: token-sum",),
    },
}

# The GAE entry's promises (GAE_PROMISES, the SPEC's) are about compute_gae_advantage_return only: an entry of another
# kind declares its own or none
for _overrides in KIND_OVERRIDES.values():
    _overrides.setdefault("promises", ())


SPEC = TargetSpec(
    id="verl",
    first_run=('default', 'grpo', 'policy-loss'),
    adapter="maskfuzz.targets.adapters.verl",
    own=("verl",),
    contract="compressed",
    git_url="https://github.com/volcengine/verl.git",
    package="verl",
    # "default" is GAE (compute_gae_advantage_return); the others are the kinds beyond GAE (verl_kinds.py)
    entries=("default", *KIND_OVERRIDES),
    entry_overrides=KIND_OVERRIDES,
    # GAE: no option of verl's changes compute_gae_advantage_return's math (whitening is unconditional,
    # core_algos.py:262 at 0.9.1); a cut row is terminal (GAE_TRUNCATION); the other entries set their own
    truncation=GAE_TRUNCATION,
    promises=GAE_PROMISES,
    pins=(
        Pin("0.1", "first release; mask argument named eos_mask; plain GAE loop"),
        Pin("0.4.1", "last release before #2337: plain GAE loop, mask used only for whitening", default=True),
        Pin("0.5.0", "first release with #2337 (GAE skips values and TD errors of masked tokens)", default=True),
        Pin("0.9.1", "newest release", default=True),
        Pin(_MASKING_COMMIT, "#2337 [algo] feat: mask out observation token in GAE", kind="git"),
        Pin(_BEFORE_MASKING, "parent of #2337: last commit with the plain GAE loop", kind="git"),
    ),
    # verl_F.masked_whiten: (x - masked_mean) * rsqrt(masked_var(unbiased=True) + 1e-8), shift_mean=True,
    # identical in 0.1 ... 0.9.1 (0.4+ divides the mean by mask.sum() + 1e-8, a 1e-8 relative change).
    whitening=Whitening(unbiased=True, eps=1e-8),
    masked_zero=False,
    masked_zero_why=(
        "compute_gae_advantage_return whitens the whole [B, T] advantage tensor, so masked positions hold "
        "(carry - mean) / std, never zeroed (0.5+ also carries lastgaelam through masked positions on purpose); "
        "verl's own test tests/trainer/ppo/test_core_algos_on_cpu.py::test_multi_turn_compute_gae_advantage_return "
        "multiplies returns by response_mask before comparing, and the policy loss aggregates with response_mask"
    ),
    documented_errors=(
        # verl/utils/torch_functional.py::masked_var (unbiased) with < 2 masked elements in the batch
        r"ValueError: At least one element in the mask has to be 1",
        r"ValueError: The sum of the mask is one, which can cause a division by zero",
    ),
    # Missing heavy packages imported at module level by verl, none touched by the GAE math or the
    # reward manager's placement: pkg_resources (verl/__init__.py 0.4.x, an NPU version check),
    # pandas (verl/protocol.py), orjson (verl/utils/tracking.py, 0.9), psutil (memory utilities).
    stand_ins=COMMON_HEAVY + ("pkg_resources", "pandas", "orjson", "psutil"),
    deny=("torch_npu",),
    domain=Domain(
        dtypes=("float32", "float64"),
        left_padding=False,
        why={
            "dtypes": (
                "verl's token_level_rewards are float32 by construction (the reward managers build the score tensor "
                "with torch.zeros_like(responses, dtype=torch.float32); apply_kl_penalty subtracts a float32 KL), so "
                "the TD errors are float32 or wider even when the critic runs in bf16; a case run wholly in bf16 or "
                "fp16 is not an input verl produces (in fp16, finite poison would overflow the masked TD error)"
            ),
            "left_padding": (
                "verl's response window is right-padded (prompts are left-padded, responses right-padded); "
                "the reward manager places the score at attention_mask[prompt_length:].sum() - 1, which is only "
                "the last real token when the response starts at position 0"
            ),
        },
    ),
    pipeline=_PIPELINE_0_5_0,
    pipeline_by_pin={
        "0.1": _pipeline_0_1(),
        "0.4.1": _pipeline_0_4_1(),
        "0.9.1": _pipeline_0_9_1(),
        _MASKING_COMMIT: _pipeline_git(_MASKING_COMMIT),
        _BEFORE_MASKING: _pipeline_git(_BEFORE_MASKING),
    },
    notes=(
        "Contract: compressed, what verl intends since #2337 (0.5.0): 'skip values and TD-error on observation "
        "tokens' (core_algos.py); its test checks that values at masked positions do not change the outputs. "
        "0.1 ... 0.4.1 run a plain GAE loop over every position and use the mask only for whitening; 0.4.x relied on "
        "the critic (dp_critic.py: values = values * response_mask) and apply_kl_penalty (kld * response_mask) to "
        "zero masked values and rewards upstream (0.1's FSDP critic does not mask values: the seed report is a "
        "pipeline input there); see pipeline_by_pin for what each pin's pipeline feeds the function. "
        "Masks are passed as int64, as verl's "
        "pipeline does (attention_mask slices; agent_loop.py builds response_mask with dtype=torch.int64). "
        "The score goes where verl's reward manager puts it (last attended response token), so with a masked "
        "observation tail it lands on a masked position: 0.5+ then drops it (lastgaelam is not updated there)."
    ),
)


class _NoTokenizer:
    """The reward manager decodes ids to text for its scorer and for printing; our scorer ignores text."""

    def decode(self, *args, **kwargs) -> str:
        return ""

    def batch_decode(self, ids, *args, **kwargs) -> list[str]:
        return ["" for _ in ids]


def _marker_score(*args, **kwargs) -> float:
    """The scorer handed to verl's reward manager: 1.0 for every row, so the non-zero entry of the
    reward tensor it returns marks the position its placement code chose."""
    return 1.0


def _score_placer(root: Path):
    """verl's own score placement at this pin: a function (attention [B, T] bool) -> bool [B, T]
    marking, per row, the position where the reward manager writes the score; and where it lives."""
    from verl import DataProto  # the pin's own DataProto (verl/protocol.py)

    try:
        naive = import_from(root, "verl.workers.reward_manager.naive")
        manager = naive.NaiveRewardManager(tokenizer=_NoTokenizer(), num_examine=0, compute_score=_marker_score)
        where = "verl/workers/reward_manager/naive.py::NaiveRewardManager.__call__"
    except NotPresent:
        # 0.1: the manager is a class in main_ppo.py that picks its scorer by data source through the
        # module-level _select_rm_score_fn; we point that at the marker scorer (the placement is untouched).
        main_ppo = import_from(root, "verl.trainer.main_ppo")
        if not hasattr(main_ppo, "RewardManager"):
            raise NotPresent("no reward manager at this pin (verl.workers.reward_manager.naive, verl.trainer.main_ppo)")
        main_ppo._select_rm_score_fn = lambda data_source: _marker_score
        manager = main_ppo.RewardManager(tokenizer=_NoTokenizer(), num_examine=0)
        where = "verl/trainer/main_ppo.py::RewardManager.__call__"

    def place(attention: torch.Tensor) -> torch.Tensor:
        b_rows, t_len = attention.shape
        prompt = torch.ones(b_rows, 1, dtype=torch.long)  # one real prompt token per row
        data = DataProto.from_dict(
            tensors={
                "prompts": prompt,
                "responses": torch.zeros(b_rows, t_len, dtype=torch.long),
                "attention_mask": torch.cat([prompt, attention.to(torch.long)], dim=1),
            },
            non_tensors={
                "data_source": ["maskfuzz"] * b_rows,
                "reward_model": [{"ground_truth": ""} for _ in range(b_rows)],
            },
        )
        out = manager(data)
        reward = out["reward_tensor"] if isinstance(out, dict) else out
        return reward != 0

    return place, where


def load(root: Path, entry: str | None) -> Loaded:
    if entry not in (None, "default"):
        raise ValueError(f"verl's GAE adapter loads the entry 'default'; {entry!r} loads from verl_kinds")
    gae, where = function_from(root, [_GAE])
    params = list(inspect.signature(gae).parameters)
    mask_arg = next((p for p in ("response_mask", "eos_mask") if p in params), None)
    expected = {"token_level_rewards", "values", "gamma", "lam"}
    if mask_arg is None or not expected <= set(params):
        # a changed signature must fail loudly, never be called with guessed names
        raise RuntimeError(f"{where} has parameters {params}; expected {sorted(expected)} and response_mask/eos_mask")
    place, place_where = _score_placer(root)

    def run(case: Case, device: str) -> tuple[torch.Tensor, torch.Tensor]:
        dt = case.torch_dtype
        at_score = place(case.attention).to(device)
        score = case.score.to(device=device, dtype=dt)
        rewards = case.token_rewards.to(device=device, dtype=dt)
        rewards = rewards + torch.where(at_score, score[:, None], torch.zeros((), dtype=dt, device=device))
        adv, ret = gae(
            token_level_rewards=rewards,
            values=case.values.to(device=device, dtype=dt),
            **{mask_arg: case.trainable.to(device=device, dtype=torch.long)},
            gamma=case.gamma,
            lam=case.lam,
        )
        return adv, ret

    notes = [
        f"called with mask argument {mask_arg!r} (int64, as verl passes it)",
        f"score placed by verl's {place_where} (last attended response token), moved into the case's dtype",
    ]
    return Loaded(run, where, notes)

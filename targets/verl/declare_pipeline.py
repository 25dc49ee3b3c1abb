"""verl's pipeline domains: what verl's own trainer, rollouts, reward managers and critics hand the GAE entry at
each pin (every narrowing cites file:line at that pin in `why`, every production citation in `produces`), and
the helpers that derive the other kinds' pipelines from them. The SPEC that uses them is `declare.py`."""

from __future__ import annotations

import dataclasses

from maskfuzz.oracles.domain import Domain

# First commit whose GAE skips masked positions, and its parent (the last plain-loop commit).
MASKING_COMMIT = "0332866857d541f5bd4f46ee4d9bd782a6354aa3"
BEFORE_MASKING = "11ee5125d269d657f1edf101d627b4b599eaceae"

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


def pipeline_0_1() -> Domain:
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


def pipeline_0_4_1() -> Domain:
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
PIPELINE_0_5_0 = _pipeline_multi_turn(
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
    if rev == BEFORE_MASKING:
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


def pipeline_git(rev: str) -> Domain:
    return _pipeline_multi_turn(
        rev[:12],
        naive="verl/workers/reward_manager/naive.py:54,98",
        kl="verl/trainer/ppo/ray_trainer.py:161-170",
        padding="verl/experimental/agent_loop/agent_loop.py:269 (padding_side='right')",
        critic="verl/workers/critic/dp_critic.py:195, verl/workers/critic/megatron_critic.py:132",
        produces=_produces_git(rev),
    )


def pipeline_0_9_1() -> Domain:
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
                "verl 0.9.1: verl/trainer/ppo/ray_trainer.py:1261 no_padding_2_padding pads each response's values "
                "with zeros (verl/workers/utils/padding.py:138, F.pad): a padding position holds 0"
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


# --- the GAE pipelines, narrowed for the kinds beyond GAE (declare_kinds.py)
def without(dom: Domain | None, *names: str) -> Domain | None:
    """`dom` with the narrowings `names` lifted (fields that do not apply to a kind, e.g. critic values)."""
    if dom is None:
        return None
    full = Domain()
    why = {k: v for k, v in dom.why.items() if k not in names}
    return dataclasses.replace(dom, **{n: getattr(full, n) for n in names}, why=why)


def per_pin(*names: str) -> dict:
    """The GAE entry's per-pin pipeline domains with the narrowings `names` lifted."""
    pins = {
        "0.1": pipeline_0_1(),
        "0.4.1": pipeline_0_4_1(),
        "0.9.1": pipeline_0_9_1(),
        MASKING_COMMIT: pipeline_git(MASKING_COMMIT),
        BEFORE_MASKING: pipeline_git(BEFORE_MASKING),
    }
    out = {}
    for pin, dom in pins.items():
        dom = without(dom, *names)
        if not dom.all_masked_rows:  # 0.1 / 0.4.1: get_eos_mask / get_response_mask keep position 0 of every row
            dom = dataclasses.replace(dom, empty_rows=False, why={**dom.why, "empty_rows": dom.why["all_masked_rows"]})
        out[pin] = dom
    return out


def pipeline_grpo_0_4_1() -> Domain:
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
            "dtypes": pipeline_0_4_1().why["dtypes"],
            "left_padding": (
                f"verl 0.4.1: {sglang}:1031-1033 and :1044-1046 pad the response and its loss mask on the right"
            ),
            "nonfinite_poison": pipeline_0_4_1().why["nonfinite_poison"],
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

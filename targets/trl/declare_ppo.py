"""TRL's PPO entries as declared (`train`, `compute_advantages`): their api and pipeline domains, options and
truncation, and the entry overrides of the old standalone `compute_advantages` (see `declare.py`'s docstring)."""

from __future__ import annotations

from maskfuzz.oracles.domain import Domain
from maskfuzz.targets.registry import Option, Truncation

_RESPONSE_ONLY = (
    "TRL derives its masks from sequence_lengths (the first pad token of the generated response): "
    "a response is one run of tokens followed by padding, every token before the first pad is trained on"
)


def _train_pipeline(
    f: str, resp: str, trunc: str, seq: str, value: str, pmask: str, fill: str, gen: str, ref: str, kl: str, eos: str
) -> Domain:
    """The pipeline domain of the `train` block at one pin, each reason citing that pin's lines: `f` the trainer
    file, `trunc` truncate_response's fill ("path.py:N"), the others line numbers in `f` (`gen` the generation
    config's max_new_tokens = response_length, `ref` the reference log-probs, `kl` the KL reward, `eos` the EOS
    filter).

    Produced (`produces`, issue 24): the KL reward at every trained token; raw reference log-probs (the adapter's
    carrier of token rewards) under the padding and in a row that trains nothing, which the block fills itself; a
    row whose first response token is the pad token (sequence_length = -1: no trained token); rows cut by
    response_length. Not cited as produced: masked critic values. The value model does output a value at every pad
    slot ({value}), but the block zeroes every one past sequence_lengths + 1 by selection ({fill}) and keeps the one
    at sequence_lengths + 1 on purpose: TRL's terminal state after the last token, whose value it trains (vf_loss
    over ~padding_mask_p1) and where it puts the score. That value is not poison (kinds.md, Truncation: poison is a
    bootstrap from a position whose value is never trained), so no masked value that is poison reaches GAE, and a
    witness may not use one."""
    prefix = f"{f}:{pmask} padding_mask = idx > sequence_lengths, with {f}:{seq} sequence_length = first pad token - 1"
    first_pad = (
        f"{f}:{seq} sequence_length = first_true_indices(postprocessed_response == pad_token_id) - 1 is -1 for a "
        "response whose first token is the pad token (a model that stops at once where pad_token == eos_token: "
        f"truncate_response keeps that stop token, {trunc}): padding_mask is all True, the row trains nothing"
    )
    return Domain(
        gaps=False,
        masked_real_tail=False,
        leading_mask=False,
        left_padding=False,
        nonfinite_poison=False,
        truncated_padded=False,
        why={
            "truncated_padded": f"{f}:{gen} max_new_tokens = args.response_length: a row cut by the length limit has "
            "response_length tokens, the widest a response can be (batch_generation pads the chunks to the widest): "
            "it fills the window, no padding follows it",
            "gaps": prefix + ": the trained tokens are a prefix of the response, nothing masks a token inside it",
            "masked_real_tail": prefix + "; after the stop token the response is filled with pad "
            f"({trunc} truncate_response): every position after the prefix is padding to TRL",
            "leading_mask": prefix + ": position 0 is trained whenever the row has a trained token",
            "left_padding": f"{f}:{resp} response = query_response[:, context_length:]: the window starts at the "
            "first generated token; generation pads finished rows on the right (queries are left-padded, outside)",
            "nonfinite_poison": f"{f}:{fill} logprobs / ref_logprobs filled with INVALID_LOGPROB under padding_mask "
            "and values filled with 0 beyond sequence_lengths + 1 (masked_fill selects, NaN cannot survive); the "
            f"one masked input kept, the value at sequence_lengths + 1, is the value model's output ({f}:{value} "
            "get_reward on query_response): finite",
        },
        produces={
            "token_rewards": f"{f}:{kl} non_score_reward = -args.kl_coef * kl: the KL reward at every trained token",
            "padding_rewards": f"{f}:{ref} ref_logprob over every position of the generated response, padding "
            f"included (the block fills it with INVALID_LOGPROB under padding_mask, {f}:{fill})",
            "masked_rewards": f"{f}:{ref} ref_logprob at every generated token, the ones of a row that trains nothing "
            f"(its first token the pad) too (filled with INVALID_LOGPROB under padding_mask, {f}:{fill})",
            "all_masked_rows": first_pad,
            "empty_rows": first_pad + " (to TRL the response is empty)",
            "truncated_rows": f"{f}:{gen} max_new_tokens = args.response_length: a response that reaches it has no "
            f"EOS ({f}:{eos} contain_eos_token)",
        },
    )


TRAIN_DOMAIN = Domain(  # the PPO entries' api domain: TRL's masks come from sequence_lengths
    gaps=False,
    masked_real_tail=False,
    leading_mask=False,
    left_padding=False,
    why={
        "gaps": _RESPONSE_ONLY + "; there is no token mask that could leave a gap",
        "masked_real_tail": _RESPONSE_ONLY + "; no real token after the response can be masked",
        "leading_mask": "the response window starts at the first generated token, which is trained on",
        "left_padding": "responses are right-padded (queries are left-padded, outside the window)",
    },
)
NEW_FILE = "trl/experimental/ppo/ppo_trainer.py"  # 1.12.0 and the git pin: the same lines
TRAIN_PIPELINE = _train_pipeline(
    NEW_FILE, "701", f"{NEW_FILE}:187", "727", "729-732", "764", "765-769", "621", "712-714", "775", "757"
)
TRAIN_PIPELINE_BY_PIN = {
    "0.19.1": _train_pipeline(
        "trl/trainer/ppo_trainer.py",
        "438",
        "trl/trainer/utils.py:1374",
        "464",
        "466-469",
        "501",
        "502-506",
        "364",
        "449-451",
        "512",
        "494",
    ),
    "0.11.4": _train_pipeline(
        "trl/trainer/ppov2_trainer.py",
        "347",
        "trl/trainer/utils.py:1240",
        "371",
        "373-376",
        "408",
        "409-413",
        "275",
        "356-358",
        "417",
        "401",
    ),
}

# ---- options and truncation of the PPO entries (docs/kinds/trl.md, "Options and truncation")
# missing_eos_penalty (PPOConfig, default None; 1.12.0 ppo_config.py:172-179): "Penalty applied to the score when the
# model fails to generate an EOS token": a row without EOS, i.e. cut by the length limit, gets score - p. "none"
# stands for TRL's None (the adapter passes None).
MISSING_EOS = Option(
    "missing_eos_penalty",
    ("none", 1.0),
    "none",
    f"{NEW_FILE}:757-759 (0.19.1 trl/trainer/ppo_trainer.py:494-496, 0.11.4 trl/trainer/ppov2_trainer.py:401-403)",
    "penalty subtracted from the score of a completion without an EOS token (one cut by response_length)",
    effect={1.0: {"truncation": {"score": ("add", -1.0)}}},
)
# train(): a cut row fills the window (pipeline truncated_padded=False); the recursion bootstraps with 0.0 after the
# window's last position and the score goes to the last token (actual_end = sequence_lengths when
# sequence_lengths + 1 is past the window): TRL treats a cut row as ended
TRAIN_TRUNCATION = Truncation(
    cite=f"{NEW_FILE}:791 nextvalues = ... else 0.0 after the window and 778-779 score at sequence_lengths when "
    "sequence_lengths + 1 == response_length (0.19.1 trl/trainer/ppo_trainer.py:528, 0.11.4 "
    "trl/trainer/ppov2_trainer.py:433): a row cut by the length limit is terminal, unless missing_eos_penalty"
)
# old PPOTrainer.step (0.11.4): score_clip clamps the scores to [-c, c] before compute_rewards ("none" = None)
SCORE_CLIP = Option(
    "score_clip",
    ("none", 1.0),
    "none",
    "trl/trainer/ppo_trainer.py:694-697 (0.11.4; trl/trainer/ppo_config.py score_clip, default None)",
    "score clipping: torch.clip(scores, -score_clip, score_clip) in step() before the rewards are built",
    effect={1.0: {"score_map": (("clip", 1.0),)}},
)
OLD_TRUNCATION = Truncation(
    cite="trl/trainer/ppo_trainer.py:1176, 1183 (0.11.4): values * mask and nextvalues = 0.0 past the window: the "
    "value after a row's last mask token is 0 whatever ended it; step() takes no EOS or truncation flag"
)

# The old PPOTrainer.step (0.11.4): trl/trainer/ppo_trainer.py and the value-head wrapper.
OLD_PIPELINE = Domain(
    dtypes=("float32", "float64"),
    nonfinite_poison=False,
    why={
        "dtypes": "the recursion runs in float32: logits are cast to float32 by the value-head wrapper "
        "(trl/models/modeling_value_head.py:186-188), which model and ref_model must be "
        "(trl/trainer/ppo_trainer.py:209-211, 241-256), so logprobs and the KL reward are float32 "
        "(trl/trainer/ppo_trainer.py:1031, 1138-1146: the score is added in place); half-precision values are "
        "promoted by the float32 rewards (trl/trainer/ppo_trainer.py:1184); float64 kept for float64 values",
        "nonfinite_poison": "values and logprobs at masked (query, pad, response_masks = 0) positions are the "
        "models' outputs on real or pad tokens (trl/trainer/ppo_trainer.py:1022, 1031; value head "
        "trl/models/modeling_value_head.py:184): finite",
    },
    # What TRL 0.11.4's own code hands compute_advantages (issue 24). The response masks of a tool-using run come from
    # TRL's TextEnvironment (trl/environment/base_environment.py): a tool's output is a system segment whose mask is
    # 0 between the model's segments, and the run can stop on one. Not cited: all-masked rows (every history starts
    # with a model segment of at least one token, generated_tokens starts at 1 (:42) and append_segment refuses an
    # empty one (:99-100); only a caller's all-zero response_masks row has none, the api) and empty rows (the query
    # is always in the window).
    produces={
        "gaps": "trl/environment/base_environment.py:324-330 a tool's output appended as a system segment, masked 0 "
        "(:111-112), between two model segments (:281-290 the turn loop); passed as response_masks, "
        "trl/trainer/ppo_trainer.py:1048-1049 masks[j, start:end] *= response_masks",
        "masked_real_tail": "trl/environment/base_environment.py:281-290 the turn loop stops at max_turns right "
        "after step() appended a tool's output (:324-330, masked 0 at :111-112): the response ends on masked tokens",
        "leading_mask": "trl/trainer/ppo_trainer.py:1046 masks[j, :start] = 0: the window is query + response "
        "(:970-973 prepare_model_inputs), the query tokens lead every row masked",
        "left_padding": "trl/trainer/ppo_trainer.py:1042-1043 start += attention_mask[j, :].nonzero()[0] (offset "
        "left padding) for a batch the data collator or pad_across_processes (:718-728, pad_first) padded on the left",
        "masked_rewards": "trl/trainer/ppo_trainer.py:1031 logprobs of every position of query + response, and "
        ":1138-1140 kl and non_score_reward at every position (compute_rewards does not mask them)",
        "token_rewards": "trl/trainer/ppo_trainer.py:1140 non_score_reward = -self.kl_ctl.value * kl at every "
        "trained token",
        "masked_values": "trl/trainer/ppo_trainer.py:1022 logits, _, values = model(**input_kwargs): the value head "
        "at every position, query and padding included",
        "truncated_rows": "trl/environment/base_environment.py:402-404 a history longer than max_length is ended "
        "with truncated = True",
        "truncated_padded": "trl/trainer/ppo_trainer.py:970-973 each query + response is padded to the longest of "
        "the batch: a cut response behind a short query is followed by padding",
    },
)

# Declarations that differ for the old standalone compute_advantages (TargetSpec.entry_overrides).
PPO_OVERRIDES: dict[str, dict] = {
    "train": {"options": (MISSING_EOS,), "truncation": TRAIN_TRUNCATION},
    "compute_advantages": {
        "options": (SCORE_CLIP,),
        "truncation": OLD_TRUNCATION,
        "masked_zero": False,
        "masked_zero_why": (
            "compute_advantages ends with masked_whiten(advantages, mask) over every position and no masked "
            "fill: masked positions hold -mean/std; the loss (masked_mean over mask) ignores them"
        ),
        # the old PPOTrainer.step takes response_masks, so gaps and masked tails are expressible
        "domain": Domain(),
        "notes": "old PPOTrainer: compute_rewards puts the score at mask.nonzero()[-1] (last trainable token)",
        # step(response_masks=...) over query + response: everything but dtype and NaN is reachable
        "pipeline": OLD_PIPELINE,
        "pipeline_by_pin": {},
    },
}

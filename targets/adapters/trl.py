"""Adapter for TRL (huggingface/trl): the GAE of its PPO trainers, taken from the source at the pin.

Entries `train` and `compute_advantages` (below), plus the group-advantage entries `grpo`, `dr-grpo` and `rloo`:
the inline advantage blocks of GRPOTrainer / RLOOTrainer._generate_and_score_completions, run from the source at
the pin by `targets/adapters/trl_kinds.py` (declarations in ENTRY_OVERRIDES; see docs/kinds/trl.md); the
loss-aggregation entries `agg-*` (GRPO's `loss_type` chain) and the kl entries `kl-grpo` (GRPO's per-token k3 KL
to the reference) and `kl-ppo` (the PPO trainer's k1 / k3 KL estimator), and the policy-loss entry `policy-grpo`
(GRPOTrainer._compute_loss's clipped objective and loss_type chain at GRPOConfig's defaults), from the same trainers'
source.

* `train` (default): TRL's PPO has no advantage function; the GAE is inline in
  `PPOTrainer.train()` (`trl/experimental/ppo/ppo_trainer.py` from 0.26, `trl/trainer/ppo_trainer.py`
  0.12-0.25, `PPOv2Trainer.train()` in `trl/trainer/ppov2_trainer.py` up to 0.12). The adapter parses
  that file, finds the loop by its structure (`for t in reversed(range(...))` assigning
  `lastgaelam`, inside `train`), and runs the sibling statements from `response_idxs = ...` (the
  padding masks, TRL's KL reward, the score placed at `sequence_lengths + 1`, the optional reward
  whitening) through the last assignment of `advantages` / `returns` after the loop (whitening,
  masked fill). `sequence_lengths` come from TRL's own line
  `sequence_length = first_true_indices(postprocessed_response == pad_token_id) - 1`, also taken
  from `train()`. Helpers the block calls (`masked_whiten`, `first_true_indices`,
  `INVALID_LOGPROB`) are compiled from their own files at the pin (see `extract`).
* `compute_advantages`: the standalone `PPOTrainer.compute_advantages(values, rewards, mask)` of
  the old PPO trainer (`trl/trainer/ppo_trainer.py`, up to 0.11.x), with its score placement
  `PPOTrainer.compute_rewards` (score at the last mask token) and `_kl_penalty`, each compiled
  from the class at the pin and called with `self` a namespace carrying the attributes they read.

Conversion (both entries). The canonical response window is TRL's response tensor; a row's
response is its trainable run (tokens 1, pad 0). Token rewards enter where TRL makes its only
per-token reward, the KL penalty: `logprobs = 0`, `ref_logprobs = token_rewards`, estimator k1 and
`kl_coef = 1`, so `-kl_coef * (logprobs - ref_logprobs)` is exactly `token_rewards`; TRL's own
masking (`INVALID_LOGPROB` fill at padding) then zeroes them where it does. `whiten_rewards` is
False (TRL's default). No trl module is imported, so no stand-ins are needed.

Options and cut rows (docs/kinds/trl.md, "Options and truncation"). `train`: the block starts at TRL's
`contain_eos_token = ...` / `if self.args.missing_eos_penalty ...` filter, run with the case's
`missing_eos_penalty` ("none" = None) and `postprocessed_responses` = tokens 1, pad 0 and EOS 2 as the last token
of every row that is not truncated (`Case.truncated_rows()`); a cut row is terminal (zero bootstrap after the
window, which it fills). `compute_advantages`: step()'s `if self.config.score_clip ...` statement runs on the
scores first.

If the file and trainer class exist but the block is not found, `load` raises `BlockNotFound` (a
load error that names the file); with no PPO trainer at all (trl >= 1.13) it raises `NotPresent`.

Pipeline domain (`SPEC.pipeline` for 1.12.0 and the git pin, `pipeline_by_pin` for 0.19.1 and 0.11.4: the same
facts at each pin's own lines; the `compute_advantages` entry overrides both). `train`: the window is the generated
response (`query_response[:, context_length:]`, right-padded by generation and by `truncate_response`), and what the
policy trains on is `padding_mask = idx > sequence_lengths` with `sequence_length` the first pad token - 1: always a
prefix of the window, so no gaps, no leading mask, no masked real tail, no left padding. An all-masked row is
reachable (a first response token equal to the pad token, e.g. pad == eos, gives `sequence_length = -1`). The block
is handed the raw logprob / ref-logprob / critic tensors at every position and masks them itself (`INVALID_LOGPROB`
fill under padding_mask, values zeroed beyond sequence_lengths + 1), so masked token rewards and masked values stay
permissive; the value kept at the first pad slot is the value model's output there, which TRL trains
(`vf_loss` over `~padding_mask_p1`) and into which it puts the score. Non-finite poison is narrowed: every masked
input the block does not replace by selection is a finite value-model output. Dtypes stay permissive (the policy,
reference, value and reward models are the user's, in any dtype). `compute_advantages` (0.11.4): `step()` takes
user responses and optional `response_masks` over the whole query + response sequence, left- or right-padded, so
gaps, tails, leading (query) masks, left padding and all-masked rows are all reachable, and the KL and values are
non-zero under the mask; narrowed are dtypes (logits are cast to float32 by the value-head wrapper, so the rewards
and the recursion are float32, float64 only with float64 values) and non-finite poison (model outputs).
"""

from __future__ import annotations

import ast
import dataclasses
import types
from pathlib import Path

import torch

from maskfuzz.oracles.case import Case
from maskfuzz.oracles.domain import Domain
from maskfuzz.oracles.promises import Promise
from maskfuzz.oracles.properties import Declared
from maskfuzz.oracles.reference import Whitening
from maskfuzz.targets.adapters.base import Loaded, NotPresent
from maskfuzz.targets.adapters.extract import (
    Block,
    BlockNotFound,
    SourceTree,
    assigned_names,
    attribute_reads,
    block_free_names,
    find_class,
    find_gae_loop,
    find_method,
    stored_names,
)
from maskfuzz.targets.registry import Option, Pin, TargetSpec, Truncation

PACKAGES = ("trl",)  # the framework's own packages: followed in its source, never imported
# entry points, the first is the default
ENTRIES = (
    "train",
    "compute_advantages",
    "grpo",
    "dr-grpo",
    "grpo-batch",
    "rloo",
    "agg-grpo",
    "agg-bnpo",
    "agg-dr_grpo",
    "agg-dapo",
    "kl-grpo",
    "kl-ppo",
    "policy-grpo",
)
PAD_ID = 0  # pad token id given to TRL's own sequence-length line; response tokens are 1
TRAIN_FILES: tuple[tuple[str, str], ...] = (  # (file, class) in the order they are looked at
    ("trl/experimental/ppo/ppo_trainer.py", "PPOTrainer"),
    ("trl/trainer/ppo_trainer.py", "PPOTrainer"),
    ("trl/trainer/ppov2_trainer.py", "PPOv2Trainer"),
)
OLD_FILE, OLD_CLASS = "trl/trainer/ppo_trainer.py", "PPOTrainer"
BLOCK_INPUTS = (
    "responses",
    "postprocessed_responses",
    "sequence_lengths",
    "logprobs",
    "ref_logprobs",
    "values",
    "scores",
    "args",
    "self",
)
ARGS_SET = ("gamma", "lam", "kl_coef", "kl_estimator", "whiten_rewards")
# what the EOS filter before the block reads from `self` (self.args.missing_eos_penalty, the tokenizer's eos id)
SELF_READS = ("args", "processing_class", "tokenizer")
EOS_ID = 2  # eos token id: the last token of an ended row (TRL's truncate_response keeps the stop token)

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
ENTRY_OVERRIDES: dict[str, dict] = {
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


# ---- group-advantage entries (targets/adapters/trl_kinds.py): the inline advantage blocks of GRPOTrainer and
# RLOOTrainer._generate_and_score_completions. Lines are at 1.12.0 (1.16.0 / git f2cd577 in brackets).
_GR = "trl/trainer/grpo_trainer.py"
_RL = "trl/trainer/rloo_trainer.py"
_UT = "trl/trainer/utils.py"
_GC = "trl/trainer/grpo_config.py"
GIT = "f2cd57710ae345ea6428ae95363267fcf38a3dc8"  # the git pin (SPEC.pins)


def _upstream(path: str, lines: dict, text: str, covers: tuple, note: str) -> tuple[Promise, ...]:
    """One Promise per pin group of TRL's own words (`text`, quoted) at `path`: `lines` maps the line (range) to the
    pins whose file has those words there (issue 24: a promise names its file and line at the pins that say it)."""
    return tuple(
        Promise(id=f"upstream:{path}:{at}", text=text, covers=covers, note=note, pins=tuple(pins))
        for at, pins in lines.items()
    )


# GRPOConfig's docstring of scale_rewards (1.16.0 grpo_config.py:227-236; 1.12.0 :233-242; git :234-243; a bool at
# 0.19.1, :154-158): the scaling of the group-centred rewards, TRL's formula for the `grpo` entries (the docs page at
# the git pin writes it out, docs/source/grpo_trainer.md:70).
_SCALE_GROUP = (
    '`True` or `"group"` (default): rewards are scaled by the standard deviation within each group, ensuring unit '
    "variance within a group."
)
_SCALE_BATCH = (
    '`"batch"`: rewards are scaled by the standard deviation across the entire batch, as recommended in the [PPO '
    "Lite paper](https://huggingface.co/papers/2508.08221)."
)
_SCALE_NONE = '`False` or `"none"`: no scaling is applied.'
_GROUP_NOTE = (
    "GRPOConfig documents the advantage of the scale_rewards setting; the block computes it over the group's "
    "rewards (the declared variant: unbiased nanstd, 1e-4 added to the std, a group of one scorable row 0)"
)
GRPO_PROMISES = (
    *_upstream(
        _GC,
        {"230-231": ("1.16.0",), "236-237": ("1.12.0",), "237-238": (GIT,)},
        _SCALE_GROUP,
        ("reference",),
        _GROUP_NOTE,
    ),
    *_upstream(
        _GC,
        {"155-156": ("0.19.1",)},
        "If `True` (default), the rewards are normalized by the standard deviation, ensuring they have unit variance.",
        ("reference",),
        _GROUP_NOTE,
    ),
    *_upstream(
        "docs/source/grpo_trainer.md",
        {"70": (GIT,)},
        "$$\\hat{A}_{i,t} = \\frac{r_i - \\text{mean}(\\mathbf{r})}{\\text{std}(\\mathbf{r})}$$",
        ("reference",),
        "the GRPO docs page at the pin: the group-normalised advantage of every completion",
    ),
)
DR_GRPO_PROMISES = (
    *_upstream(_GC, {"234": ("1.16.0",), "240": ("1.12.0",), "241": (GIT,)}, _SCALE_NONE, ("reference",), _GROUP_NOTE),
    *_upstream(_GC, {"156-157": ("0.19.1",)}, "If `False`, no scaling is applied.", ("reference",), _GROUP_NOTE),
)
GRPO_BATCH_PROMISES = _upstream(
    _GC, {"232-233": ("1.16.0",), "238-239": ("1.12.0",), "239-240": (GIT,)}, _SCALE_BATCH, ("reference",), _GROUP_NOTE
)
# RLOOTrainer's own comment on its baseline (1.16.0 rloo_trainer.py:1682-1684; 1.12.0 :1589-1591; git :1544-1546) and
# the RLOO docs page at the git pin (docs/source/rloo_trainer.md:93-104)
_RLOO_COMMENT = (
    "RLOO advantages computation. The leave-one-out baseline averages over scorable siblings only: nansum drops "
    "unscorable rewards and the divisor is (scorable count − 1). A group with a single scorable completion yields "
    "0/0 = NaN, and unscorable rows stay NaN; both are zeroed by nan_to_num below."
)
RLOO_PROMISES = (
    *_upstream(
        _RL,
        {"1682-1684": ("1.16.0",), "1589-1591": ("1.12.0",), "1544-1546": (GIT,)},
        _RLOO_COMMENT,
        ("reference",),
        "the trainer's comment states the leave-one-out formula and its singleton rule (the declared variant)",
    ),
    *_upstream(
        "docs/source/rloo_trainer.md",
        {"93-104": (GIT,)},
        "we calculate a baseline as the average reward of all other samples in the same batch, excluding the current "
        "sample. [...] b_i = \\frac{1}{G-1} \\sum_{j \\neq i} r_j [...] A_i = r_i - b_i",
        ("reference",),
        "the RLOO docs page at the pin",
    ),
)
_NOT_MASKED = (
    "the block gives one advantage per completion ([N]); the loss broadcasts it over the tokens and masks the "
    "per-token loss ({f}), so masked positions of the broadcast row are not zero; the adapter broadcasts it"
)
_TRUNC = (
    "all-masked rows: mask_truncated_completions=True zeroes the completion_mask of a truncated completion "
    "({f}) while its reward still enters the group statistics"
)


def _group_override(variant: dict, est: str, domain: Domain, pipeline: Domain, loss: str, promises: tuple = ()) -> dict:
    return dict(
        kind="group-advantage",
        # the statistics read the rewards alone (GRPO 1.12.0 grpo_trainer.py:2785-2793 nanmean / nanstd over
        # rewards.view(-1, num_generations); RLOO rloo_trainer.py:1582-1597 over grouped_rewards): a completion without
        # a trained token, e.g. one cleared by mask_truncated_completions, is a sample of its group by design
        variant={**variant, "empty_rows": "counted"},
        promises=promises,
        contract="dense",
        whitening=None,
        masked_zero=False,
        masked_zero_why=_NOT_MASKED.format(f=loss),
        documented_errors=(r"GroupShapeError",),
        domain=domain,
        pipeline=pipeline,
        pipeline_by_pin={},
        notes=(
            f"{est}: TRL groups are positional (view(-1, num_generations)); the adapter lays the case's groups out "
            "contiguously and fills short groups with unscorable (NaN) completions, TRL's own way of shortening a "
            "group (0.19.1 has none: unequal groups are a GroupShapeError there). "
            + _TRUNC.format(f=f"{_GR}:2506-2510 [2488-2492 / 2417-2421]" if est == "GRPO" else f"{_RL}:1422-1426")
        ),
    )


_F32_REWARDS = (
    "{f} rewards_per_func = torch.zeros(len(prompts), len(self.reward_funcs), device=device): float32 rewards, "
    "weighted by float32 reward_weights ({w})"
)
_GRPO_ONLY_SCORE = (
    f"{_GR}:2778-2832 [2756-2810 / 2676-2730]: the advantage block reads only rewards_per_func [N, F] (one scalar "
    "per completion and reward function); there is no per-token input that could carry anything under the mask"
)
_GRPO_DOMAIN = Domain(
    token_rewards=False,
    masked_rewards=False,
    nonfinite_poison=False,
    why={"token_rewards": _GRPO_ONLY_SCORE, "masked_rewards": _GRPO_ONLY_SCORE, "nonfinite_poison": _GRPO_ONLY_SCORE},
)
# What GRPO's / RLOO's own code builds (issue 24): a completion whose completion_mask mask_truncated_completions
# cleared (no trained token), and completions cut by max_completion_length. Not cited: masks inside a completion
# (the advantage block reads no mask), empty rows (a completion has at least its EOS or one generated token).
_GRPO_PRODUCES = {
    "all_masked_rows": f"{_GR}:2506-2510 [2488-2492 / 2417-2421] (0.19.1: 1199-1202) mask_truncated_completions=True "
    "zeroes the completion_mask of a completion whose last token is neither EOS nor pad",
    "truncated_rows": f"{_GR}:1123 [1156 / 1110] max_new_tokens = max_completion_length: a completion that reaches it "
    "has no EOS",
}
_GRPO_PIPELINE = dataclasses.replace(
    _GRPO_DOMAIN,
    dtypes=("float32",),
    why={
        **_GRPO_DOMAIN.why,
        "dtypes": _F32_REWARDS.format(f=f"{_GR}:1634 [1581 / 1614]", w=f"{_GR}:542 [576 / 536]"),
    },
    produces=_GRPO_PRODUCES,
)
_RLOO_PIPELINE = Domain(
    dtypes=("float32",),
    nonfinite_poison=False,
    why={
        "dtypes": _F32_REWARDS.format(f=f"{_RL}:1072 [1150 / 1055]", w=f"{_RL}:462 [503 / 456]"),
        "nonfinite_poison": f"{_RL}:1503-1513 [1600 / 1458] old_per_token_logps (and the reference's) are the "
        "models' log-softmax at every completion position, padding included: finite under the mask",
    },
    # the adapter's token rewards are RLOO's per-token KL (old - ref, summed under completion_mask): non-zero at trained
    # tokens; under the padding both log-probs are the models' log-softmax there (the nonfinite_poison reason)
    produces={
        "token_rewards": f"{_RL}:1576-1580 [1669-1673 / 1531-1535] per_token_kl = old_per_token_logps - "
        "ref_per_token_logps, summed under completion_mask into the reward",
        "masked_rewards": f"{_RL}:1503-1513 [1600 / 1458] old and reference log-probs at every completion position, "
        "padding included: their difference is non-zero under the mask before the completion_mask product",
        "all_masked_rows": f"{_RL}:1422-1426 [1519-1523 / 1387-1391] mask_truncated_completions=True zeroes a "
        "truncated completion's completion_mask",
        "truncated_rows": f"{_RL}:691 [788 / 681] max_new_tokens = max_completion_length: a completion that reaches it "
        "has no EOS",
    },
)
_GRPO_LOSS = f"{_GR}:3148 [3059 / 3030] advantages.unsqueeze(1), {_GR}:3248 [3159 / 3130] (per_token_loss * mask)"
_RLOO_LOSS = (
    f"{_RL}:1736 [1830 / 1691] per_sequence_loss1 = coef_1 * advantages, the log-probs summed under "
    f"completion_mask ({_RL}:1728 [1822 / 1683])"
)
GROUP_ENTRIES = ("grpo", "dr-grpo", "grpo-batch", "rloo")
ENTRY_OVERRIDES.update(
    {
        # scale_rewards="group" (the default, grpo_config.py:782-783): advantages = (r - nanmean_g) / (nanstd_g +
        # 1e-4) (grpo_trainer.py:2807-2809); nanstd is unbiased (utils.py:879-881 count / (count - 1)) and NaN for
        # a group of one scorable row (utils.py:880), which nan_to_num turns into 0 (grpo_trainer.py:2832)
        "grpo": _group_override(
            {"estimator": "grpo", "std": "unbiased", "eps": 1e-4, "eps_place": "std", "singleton": "zero"},
            "GRPO",
            _GRPO_DOMAIN,
            _GRPO_PIPELINE,
            _GRPO_LOSS,
            # no promise attached: see DEFERRED_PROMISES
        ),
        # scale_rewards="none" (Dr. GRPO): advantages = r - nanmean_g (grpo_trainer.py:2807-2808); a group of one
        # scorable row gives r - r = 0
        "dr-grpo": _group_override(
            {"estimator": "grpo", "std": None, "singleton": "zero"},
            "GRPO",
            _GRPO_DOMAIN,
            _GRPO_PIPELINE,
            _GRPO_LOSS,
            DR_GRPO_PROMISES,
        ),
        # scale_rewards="batch": (r - nanmean_g) / (nanstd(all rewards) + 1e-4) (grpo_trainer.py:2796-2800,
        # 2807-2809), a batch of one scorable row NaN, zeroed by nan_to_num (2832)
        "grpo-batch": _group_override(
            {
                "estimator": "grpo",
                "std": "unbiased",
                "eps": 1e-4,
                "eps_place": "std",
                "singleton": "zero",
                "std_level": "batch",
            },
            "GRPO",
            _GRPO_DOMAIN,
            _GRPO_PIPELINE,
            _GRPO_LOSS,
            GRPO_BATCH_PROMISES,
        ),
        # leave-one-out over the scorable rows: r - (nansum_g - r) / (count_g - 1) (rloo_trainer.py:1592-1597);
        # one scorable row gives 0 / 0 = NaN, zeroed by nan_to_num (1606; the comment at 1589-1591 says so);
        # normalize_advantages=False (rloo_config.py:524-525)
        "rloo": _group_override(
            {"estimator": "rloo", "singleton": "zero"}, "RLOO", Domain(), _RLOO_PIPELINE, _RLOO_LOSS
        ),
    }
)
# TRL's words for the `grpo` and `rloo` entries are real promises covering `reference`, but they are not attached yet:
# both entries take mask_truncated_completions, and the kinds judge compares a row that option clears at the row's
# original positions (oracles/kinds/judge.py:87 `live = case.trainable`, against the reference of reference_case,
# which zeroes the cleared row), where TRL's broadcast advantage is never read (the loss mask is cleared,
# masked_zero=False). Attached, that comparison would file a false defect naming TRL's words (a fuzz at 1.12.0 found
# one: B=4, the only trained row cut). Attach them once the judge compares on the reference case's mask.
DEFERRED_PROMISES = {
    "grpo": GRPO_PROMISES + GRPO_BATCH_PROMISES + DR_GRPO_PROMISES,  # its scale_rewards option takes all three
    "rloo": RLOO_PROMISES,
}


# ---- loss-aggregation entries (targets/adapters/trl_kinds.py::load_aggregate): the `if self.loss_type ...` chain
# of GRPOTrainer._compute_loss. Lines at 1.16.0 (1.12.0 / git f2cd577 / 0.19.1 in brackets).
_AGG_CHAIN = f"{_GR}:3152-3184 [3241-3273 / 3123-3150 / 1404-1411]"
# What GRPOTrainer's own code builds for the loss (issue 24), lines at 1.16.0 (1.12.0 / git f2cd577): the loss mask
# completion_mask * tool_mask (:2497 [2515 / 2426]) with the tool's result tokens 0 between the model's (:2154 [2189 /
# 2112]); a completion that ends on a tool result when the post-tool generation is cut to nothing by
# max_completion_length (:2139-2143 [2174-2178 / 2097-2101]); a truncated completion's mask cleared by
# mask_truncated_completions (:2488-2492 [2506-2510 / 2417-2421]); completions cut by max_new_tokens (:1156 [1123 /
# 1110]). 0.19.1 has no tool mask: its own domain below. Not cited: leading masks and empty rows (a completion starts
# with a generated token and has one), dtypes (the model's, not researched: float32 witnesses only).
_AGG_PRODUCES = {
    "gaps": f"{_GR}:2154 [2189 / 2112] tool_mask += [0] * tool_length + [1] * post_tool_length: a tool's result "
    f"masked between generated tokens, the loss mask completion_mask * tool_mask ({_GR}:2497 [2515 / 2426])",
    "masked_real_tail": f"{_GR}:2139-2143 [2174-2178 / 2097-2101] the post-tool generation cut to fit "
    "max_completion_length (to nothing when the tool's result fills it): the completion ends on the masked tool result "
    f"(:2154 [2189 / 2112])",
    "all_masked_rows": f"{_GR}:2488-2492 [2506-2510 / 2417-2421] mask_truncated_completions=True zeroes a truncated "
    "completion's completion_mask",
    "truncated_rows": f"{_GR}:1156 [1123 / 1110] max_new_tokens = max_completion_length: a completion that reaches "
    "it has no EOS",
}
_AGG_PIPELINE = Domain(
    left_padding=False,
    uneven_splits=False,
    why={
        "left_padding": f"{_GR}:2460 completion_mask = pad(..., padding_side='right'): completions are right-padded",
        "uneven_splits": (
            f"{_GR}:1544 splits the generation batch with split_tensor_dict (trl/trainer/utils.py:1057-1089): "
            "chunk_size = rows // num_chunks, equal chunks on every process"
        ),
    },
    produces=_AGG_PRODUCES,
)  # dtypes stay open: selective_log_softmax keeps the model's dtype (trl/trainer/utils.py:582-594)
_AGG_PIPELINE_0191 = dataclasses.replace(
    _AGG_PIPELINE,
    produces={
        "all_masked_rows": f"0.19.1: {_GR}:1200-1202 mask_truncated_completions=True zeroes the completion_mask of "
        "a completion without EOS",
        "truncated_rows": f"0.19.1: {_GR}:683 max_new_tokens = max_completion_length: a completion that reaches it "
        "has no EOS",
    },
)
# The api domain of the loss entries: TRL cuts each optimizer step into equal micro-batches (split_tensor_dict:
# chunk_size = rows // num_chunks, 1.16.0 trl/trainer/utils.py:1077, git :913; called in _prepare_inputs, 1.16.0
# grpo_trainer.py:1544 [1.12.0 :1597 / git :1577], each chunk per_device_train_batch_size rows on every process), so
# split-invariance draws only the shapes the loader builds.
_EQUAL_SPLITS = Domain(
    uneven_splits=False,
    why={
        "uneven_splits": f"{_GR}:1544 [1597 / 1577; 0.19.1 :992] _prepare_inputs cuts the generation batch with "
        "split_tensor_dict (trl/trainer/utils.py:1077 [git :913; 0.19.1 :223] chunk_size = rows // num_chunks): equal "
        "micro-batches on every process"
    },
)


def _agg_override(variant: dict, notes: str, promises: tuple = ()) -> dict:
    return dict(
        kind="loss-aggregation",
        variant=variant,
        contract="dense",
        whitening=None,
        masked_zero=True,  # d/dl of (per_token_loss * mask).sum(...) is the mask: 0 at masked positions
        masked_zero_why=f"{_AGG_CHAIN}: every loss_type sums per_token_loss * mask",
        documented_errors=(),
        domain=_EQUAL_SPLITS,
        pipeline=_AGG_PIPELINE,
        pipeline_by_pin={"0.19.1": _AGG_PIPELINE_0191},
        notes=notes,
        promises=promises,
    )


# GRPOConfig's docstring of loss_type (1.16.0 grpo_config.py:237-252; 1.12.0 :243-258; git :244-259; 0.19.1
# :159-171, no dapo): the normaliser of each loss_type in TRL's words
_LT = {"1.16.0": 0, "1.12.0": 6, GIT: 7}  # line offset of the same words from 1.16.0


def _lt(first: int, last: int, text: str, covers: tuple, old: tuple[int, int] | None = None, old_text: str = ""):
    lines = {f"{first + d}-{last + d}" if last > first else f"{first + d}": (pin,) for pin, d in _LT.items()}
    out = _upstream(_GC, lines, text, covers, "GRPOConfig.loss_type's documented normaliser")
    if old:
        at = f"{old[0]}-{old[1]}" if old[1] > old[0] else f"{old[0]}"
        out += _upstream(
            _GC, {at: ("0.19.1",)}, old_text or text, covers, "GRPOConfig.loss_type's documented normaliser"
        )
    return out


_LT_GRPO = '`"grpo"`: Aggregates token-level losses by normalizing over sequence length.'
_LT_DR = (
    '`"dr_grpo"`: Aggregates token-level losses by normalizing with a global constant. This method was introduced in '
    "the [Dr. GRPO paper](https://huggingface.co/papers/2503.20783) to eliminate length bias. The value of the "
    "constant corresponds to `max_completion_length`."
)
_LT_DAPO = (
    '`"dapo"` (default): Aggregates token-level losses by normalizing with the number of active token in the global '
    "accumulated batch."
)
_LT_BNPO = (
    '`"bnpo"`: Aggregates token-level losses by normalizing with the number of active token in the local batch. Note '
    "that normalization is performed over the local batch only, so results may slightly vary depending on the local "
    "batch size, despite a constant effective batch size."
)
AGG_GRPO_PROMISES = _lt(240, 240, _LT_GRPO, ("reference",), (162, 162))
AGG_DR_GRPO_PROMISES = _lt(243, 245, _LT_DR, ("reference", "split-invariance"), (169, 171))
AGG_DAPO_PROMISES = _lt(246, 247, _LT_DAPO, ("reference", "split-invariance"))
AGG_BNPO_PROMISES = _lt(
    249,
    251,
    _LT_BNPO,
    ("reference",),
    (165, 167),
    '`"bnpo"`: Aggregates token-level losses by normalizing number of active token in the local batch. Note that '
    "normalization is performed over the local batch only, so results may slightly vary depending on the local batch "
    "size, despite a constant effective batch size.",
)


AGG_ENTRIES = ("agg-grpo", "agg-bnpo", "agg-dr_grpo", "agg-dapo")
ENTRY_OVERRIDES.update(
    {
        # grpo: mean over the micro-batch's rows of sum(l m) / sum(m).clamp(1), / GA (grpo_trainer.py:3153-3157):
        # "normalizing over sequence length" (grpo_config.py:240). By design its .mean() counts every completion of
        # the micro-batch, one without a trained token too (:3154; the docs page at the git pin writes the loss as
        # 1/G sum_i 1/|o_i| sum_t, docs/source/grpo_trainer.md:118): empty_rows="counted"; and it passes no global
        # normaliser, each micro-batch is normalised by its own rows (:3154-3157): scope="micro-batch"
        "agg-grpo": _agg_override(
            {"mode": "seq-mean-token-mean", "empty_rows": "counted", "scope": "micro-batch"},
            "loss_type='grpo': per-micro-batch mean of row token means over all rows of the micro-batch, / GA",
            AGG_GRPO_PROMISES,
        ),
        # bnpo: sum(l m) / sum(m).clamp(1) / GA (grpo_trainer.py:3158-3162); documented as the local (micro-)batch
        # token count, grpo_config.py:249-252 ("results may slightly vary depending on the local batch size"):
        # scope="micro-batch", the declared design
        "agg-bnpo": _agg_override(
            {"mode": "token-mean", "scope": "micro-batch"},
            "loss_type='bnpo': per-micro-batch token mean / GA, documented as local (grpo_config.py:249-252)",
            AGG_BNPO_PROMISES,
        ),
        # dr_grpo: sum(l m) / (per_token_loss.size(0) * max_completion_length) / GA (grpo_trainer.py:3163-3167):
        # "normalizing with a global constant ... max_completion_length" (grpo_config.py:243-245), so every row
        # counts, empty or not (empty_rows="counted"); max_completion_length at its default 512 (grpo_config.py:70)
        "agg-dr_grpo": _agg_override(
            {"mode": "seq-mean-token-sum-norm", "constant": 512, "empty_rows": "counted"},
            "loss_type='dr_grpo': sum / (rows of the micro-batch * max_completion_length) / GA",
            AGG_DR_GRPO_PROMISES,
        ),
        # dapo: sum(l m) / (num_items_in_batch.clamp(1) / num_processes * GA / steps_per_generation)
        # (grpo_trainer.py:3168-3174), num_items_in_batch the generation batch's tokens over all ranks (:2498):
        # "normalizing with the number of active token in the global accumulated batch" (grpo_config.py:246-247)
        "agg-dapo": _agg_override(
            {"mode": "token-mean"},
            "loss_type='dapo': the global token mean through num_items_in_batch (absent before 0.2x: a skip)",
            AGG_DAPO_PROMISES,
        ),
    }
)


# ---- options and truncation of the group-advantage and loss-aggregation entries, cited at 1.16.0 (the newest release)
SCALE_REWARDS = Option(
    "scale_rewards",
    ("group", "batch", "none"),
    "group",
    f"{_GR}:2767-2788 (1.16.0; self.scale_rewards = args.scale_rewards :833, grpo_config.py:789 default 'group'; a "
    "bool at 0.19.1, True = 'group', False = 'none': 'batch' is OptionNotAtPin there)",
    "scale the group-centred rewards by the group's std ('group'), the batch's std ('batch') or not at all ('none', "
    "Dr. GRPO)",
    effect={"none": {"variant": {"std": None}}, "batch": {"variant": {"std_level": "batch"}}},
)
RLOO_BETA = Option(
    "beta",
    (0.05, 0.0),
    0.05,
    f"{_RL}:1664-1673 (1.16.0; rloo_config.py:502 default 0.05)",
    "KL coefficient: rewards - beta * (per_token_kl * completion_mask).sum(-1); the KL of a group-advantage case is 0 "
    "at every trained token, so a correct implementation gives the same advantages for every beta (0.0 skips the KL)",
)
RLOO_CLIP = Option(
    "reward_clip_range",
    ("none", 1.0),
    "none",
    f"{_RL}:1659-1661 (1.16.0; rloo_config.py:538 default None)",
    "clamp the summed reward to [min, max] before the KL and the baseline; c stands for (-c, c), 'none' for None",
    effect={1.0: {"score_map": (("clip", 1.0),)}},
)
MASK_TRUNCATED = Option(
    "mask_truncated_completions",
    (False, True),
    False,
    f"{_GR}:2487-2495 (1.16.0; grpo_config.py:836 default False; 1.12.0 :2506-2513, 0.19.1 :1199-1202)",
    "zero the completion_mask of a completion whose last token is neither EOS nor pad (cut by max_completion_length); "
    "num_items_in_batch is counted after (:2497-2498)",
    effect={True: {"truncation": {"row": "masked"}}},
)
AGG_TRUNCATION = Truncation(
    cite=f"{_GR}:2488 (1.16.0): with mask_truncated_completions=False (the default) a cut completion keeps its "
    "completion_mask and enters the loss as an ended one"
)
# the group entries: the same flag on GRPOTrainer / RLOOTrainer clears a cut completion's completion_mask; the
# documented meaning ("excluded from the loss calculation", grpo_config.py:268-271) is the row masked, so a correct
# implementation leaves it out of its siblings' statistics too (empty_rows "excluded"); TRL keeps its reward there
MASK_TRUNCATED_RLOO = dataclasses.replace(
    MASK_TRUNCATED, cite=f"{_RL}:1518-1523 (1.16.0; rloo_config.py:542 default False)"
)
GROUP_TRUNCATION = {
    "grpo": Truncation(
        cite=f"{_GR}:2488 (1.16.0): with mask_truncated_completions=False a cut completion is scored and trained as "
        "an ended one"
    ),
    "rloo": Truncation(
        cite=f"{_RL}:1519 (1.16.0): with mask_truncated_completions=False a cut completion is scored and trained as "
        "an ended one"
    ),
}
ENTRY_OVERRIDES["grpo"]["options"] = (SCALE_REWARDS, MASK_TRUNCATED)
ENTRY_OVERRIDES["grpo"]["truncation"] = GROUP_TRUNCATION["grpo"]
ENTRY_OVERRIDES["grpo"]["documented_errors"] = (r"GroupShapeError", r"OptionNotAtPin")
ENTRY_OVERRIDES["rloo"]["options"] = (RLOO_BETA, RLOO_CLIP, MASK_TRUNCATED_RLOO)
ENTRY_OVERRIDES["rloo"]["truncation"] = GROUP_TRUNCATION["rloo"]
for _name in AGG_ENTRIES:
    ENTRY_OVERRIDES[_name]["options"] = (MASK_TRUNCATED,)
    ENTRY_OVERRIDES[_name]["truncation"] = AGG_TRUNCATION


# ---- kl entries (targets/adapters/trl_kinds.py::load_kl_grpo / load_kl_ppo; docs/kinds/trl.md, "KL")
# kl-grpo: `per_token_kl = exp(ref - logp) - (ref - logp) - 1` (grpo_trainer.py:3100-3102 at 1.16.0; 1.12.0
# :3189-3191, git f2cd577 :3071-3073, 0.19.1 :1379-1381) is k3 of d = logp - ref (exp(-d) - 1 + d), no clamp.
# `* coef_1` when use_bias_correction_kl (:3104-3105; absent at 0.19.1), coef_1 = exp(logp - old) from :3083-3095
# (git f2cd577 :3075-3076, :3054-3066): the kl variant's ratio="token" (ratio_level="sequence" under
# importance_sampling_level="sequence"), old = the case's old_logp bound as inputs["old_per_token_logps"].
# Computed at every position; masked by the loss (`per_token_loss * mask`, :3153-3184) and the metric (:3268).
_KL_GRPO_PIPELINE = Domain(
    left_padding=False,
    nonfinite_poison=False,
    why={
        "left_padding": f"{_GR}:2460 completion_mask = pad(..., padding_side='right'): completions are right-padded",
        "nonfinite_poison": f"{_GR}:1494-1499 labels = -100 where attention_mask == 0 and log_probs of the fused LM "
        f"head, which are zero where the label is -100 ({_UT}:1512-1513): policy and reference log-probs under the "
        "padding are 0, finite (the policy and the reference go through the same _get_per_token_logps_and_entropies)",
    },
    # the loss mask it is read under: tool results inside and at the end of a completion, truncated completions
    # cleared (issue 24; the loss entries' citations)
    produces=_AGG_PRODUCES,
)
_KL_GRPO_PIPELINE_0191 = dataclasses.replace(_KL_GRPO_PIPELINE, produces=_AGG_PIPELINE_0191.produces)
# GRPO's KL in TRL's words: the docs page's estimator (git docs/source/grpo_trainer.md:85-86; 0.19.1 :87-88) and the
# importance-ratio correction of use_bias_correction_kl (1.16.0 grpo_config.py:351-352; 1.12.0 :357-358; git
# :359-361, its own words there)
_KL_DOC = (
    "$$\\mathbb{D}_{\\text{KL}}\\left[\\pi_\\theta \\|\\pi_{\\text{ref}}\\right] = \\frac{\\pi_{\\text{ref}}"
    "(o_{i,t} \\mid q, o_{i,<t})}{\\pi_\\theta(o_{i,t} \\mid q, o_{i,<t})} - \\log \\frac{\\pi_{\\text{ref}}(o_{i,t} "
    "\\mid q, o_{i,<t})}{\\pi_\\theta(o_{i,t} \\mid q, o_{i,<t})} - 1,"
)
KL_GRPO_PROMISES = (
    *_upstream(
        "docs/source/grpo_trainer.md",
        {"85-86": (GIT,), "87-88": ("0.19.1",)},
        _KL_DOC,
        ("reference",),
        "the GRPO docs page at the pin: the per-token estimator (k3 of d = logp - ref_logp)",
    ),
    *_upstream(
        _GC,
        {"351-352": ("1.16.0",), "357-358": ("1.12.0",)},
        "Whether to multiply the KL term by the importance sampling ratio, so that the KL gradient becomes the "
        "unbiased reverse-KL gradient",
        ("reference",),
        "the use_bias_correction_kl option (the kl variant's ratio)",
    ),
    *_upstream(
        _GC,
        {"359-361": (GIT,)},
        "Whether to use the unbiased KL divergence estimator with importance sampling correction. This corrects the KL "
        "divergence estimate by multiplying it with the importance sampling ratio.",
        ("reference",),
        "the use_bias_correction_kl option (the kl variant's ratio)",
    ),
)
# PPOConfig.kl_estimator (1.12.0 trl/experimental/ppo/ppo_config.py:94-98; git :95-99; 0.19.1 trl/trainer/ppo_config.py
# :50-54); 0.11.4 has no estimator (k1 only)
_KL_EST = (
    "Which estimator for KL-Divergence to use from [Approximating KL "
    "Divergence](http://joschu.net/blog/kl-approx.html). "
    'Defaults to "k1", a straightforward, unbiased estimator. Can be set to "k3", an unbiased estimator with lower '
    'variance which "appears to be a strictly better estimator".'
)
KL_PPO_PROMISES = (
    *_upstream(
        "trl/experimental/ppo/ppo_config.py",
        {"95-98": ("1.12.0",), "96-99": (GIT,)},
        _KL_EST,
        ("reference",),
        "PPOConfig.kl_estimator: the estimators of Schulman's note, k1 = d and k3 = exp(-d) - 1 + d",
    ),
    *_upstream(
        "trl/trainer/ppo_config.py",
        {"51-54": ("0.19.1",)},
        _KL_EST,
        ("reference",),
        "PPOConfig.kl_estimator: the estimators of Schulman's note, k1 = d and k3 = exp(-d) - 1 + d",
    ),
)
USE_BIAS_CORRECTION_KL = Option(
    "use_bias_correction_kl",
    (True, False),
    True,
    f"{_GR}:3104-3105 (1.16.0; grpo_config.py:972-973 default True; 1.12.0 default True, git f2cd577 default False; "
    "absent at 0.19.1: OptionNotAtPin)",
    "multiply the per-token KL by the importance ratio coef_1 = exp(logp - old_logp) (:3083-3095, unclamped); the "
    "adapter binds old_per_token_logps from the case's old_logp (:3065), so coef_1 is a real ratio (with TRL's "
    "default old = logp.detach(), num_iterations = 1, :3066, it is 1)",
    effect={True: {"variant": {"ratio": "token"}}},
)
IMPORTANCE_SAMPLING_LEVEL = Option(
    "importance_sampling_level",
    ("token", "sequence"),
    "token",
    f"{_GR}:3084-3093 (1.16.0; grpo_config.py:760-761 default 'token'; absent at 0.19.1: OptionNotAtPin)",
    "coef_1 per token or per sequence (exp((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)), :3087-3088); "
    "it weighs the KL only under use_bias_correction_kl (the kl variant's ratio_level)",
    effect={"sequence": {"variant": {"ratio_level": "sequence"}}},
)
# kl-ppo: `logr = ref_logprobs - logprobs; kl = -logr if args.kl_estimator == "k1" else (logr.exp() - 1) - logr`
# (trl/experimental/ppo/ppo_trainer.py:773-774 at 1.12.0 and f2cd577; 0.19.1 trl/trainer/ppo_trainer.py:510-511;
# 0.11.4 ppov2_trainer.py:416 `kl = logprobs - ref_logprobs`, k1 only): k1 = d, k3 = exp(-d) - 1 + d, d = logp - ref.
# Under padding_mask both log-probs are INVALID_LOGPROB = 1.0 (:765-766), so logr = 0 and kl = 0 there.
KL_ESTIMATOR = Option(
    "kl_estimator",
    ("k1", "k3"),
    "k1",
    f"{NEW_FILE}:774 (1.12.0; ppo_config.py:243-251 default 'k1', checked at ppo_trainer.py:404-408; 0.19.1 "
    "trl/trainer/ppo_trainer.py:511; absent at 0.11.4: OptionNotAtPin)",
    "the per-token KL estimator of the KL reward: k1 = logp - ref, k3 = exp(ref - logp) - 1 - (ref - logp)",
    effect={"k3": {"variant": {"estimator": "k3"}}},
)


def _kl_override(variant: dict, masked_zero: bool, why: str, domain: Domain, pipeline: Domain | None, **kw) -> dict:
    return dict(
        kind="kl",
        variant=variant,
        contract="dense",
        whitening=None,
        masked_zero=masked_zero,
        masked_zero_why=why,
        documented_errors=(r"OptionNotAtPin",),
        domain=domain,
        pipeline=pipeline,
        truncation=None,
        **kw,
    )


KL_ENTRIES = ("kl-grpo", "kl-ppo")
ENTRY_OVERRIDES.update(
    {
        "kl-grpo": _kl_override(
            {"estimator": "k3"},
            False,
            f"{_GR}:3100-3105 (1.16.0) computes per_token_kl at every position; the loss masks it "
            "(per_token_loss * mask, :3153-3184) and so does the KL metric (global_masked_mean, :3259-3268)",
            Domain(),
            _KL_GRPO_PIPELINE,
            pipeline_by_pin={"0.19.1": _KL_GRPO_PIPELINE_0191},
            options=(USE_BIAS_CORRECTION_KL, IMPORTANCE_SAMPLING_LEVEL),
            promises=KL_GRPO_PROMISES,
        ),
        "kl-ppo": _kl_override(
            {"estimator": "k1"},
            True,
            f"{NEW_FILE}:765-766 (1.12.0) fill logprobs and ref_logprobs with INVALID_LOGPROB = 1.0 under "
            "padding_mask: logr = 0 there, and both k1 and k3 of 0 are 0",
            TRAIN_DOMAIN,
            TRAIN_PIPELINE,
            pipeline_by_pin=TRAIN_PIPELINE_BY_PIN,
            options=(KL_ESTIMATOR,),
            promises=KL_PPO_PROMISES,
        ),
    }
)


# ---- policy-loss (targets/adapters/trl_kinds.py::load_policy; docs/kinds/trl.md, "Policy loss"): GRPOTrainer.
# _compute_loss from `advantages = inputs["advantages"]` (1.16.0 grpo_trainer.py:3055; 1.12.0 :3144; git f2cd577
# :3026) through the loss_type chain (:3184 [3273 / 3150]). Per token (1.16.0): coef_1 = exp(logp - old) (:3083,
# :3095), coef_2 = clamp(coef_1, 1 - epsilon_low, 1 + epsilon_high) (:3113), per_token_loss = -min(coef_1 A,
# coef_2 A) (:3118-3120) = max(-A r, -A clamp(r)); A one per completion, unsqueezed (:3055-3059). Defaults of
# GRPOConfig (1.16.0 grpo_config.py): loss_type "dapo" (:801-802; 1.12.0 :794-795; f2cd577 :791-792), so the
# aggregation is the dapo branch sum(l m) / (num_items_in_batch / num_processes * GA / steps_per_generation)
# (grpo_trainer.py:3168-3174): the global token mean of agg-dapo; epsilon 0.2 (:693-695), epsilon_high None ->
# epsilon (grpo_trainer.py:945-946), delta None (:697-698: no two-sided clip), beta 0.0 (:681-682: no KL term).
_POLICY_CITE = f"{_GR}:3055-3184 (1.16.0)"
_POLICY_PIPELINE = Domain(
    left_padding=False,
    uneven_splits=False,
    nonfinite_poison=False,
    masked_logprobs=False,
    why={
        "masked_logprobs": "per_token_logps and old_per_token_logps are log-softmax outputs of the policy before and "
        "after an update, under the mask as elsewhere",
        **_AGG_PIPELINE.why,
        "nonfinite_poison": _KL_GRPO_PIPELINE.why["nonfinite_poison"]
        + "; old_per_token_logps come from the same function (or are per_token_logps.detach(), :3065-3066) and the "
        "advantage is one finite number per completion (nan_to_num, :2832 at 1.12.0)",
    },
    produces=_AGG_PRODUCES,
)
# the clipped objective and its dapo normaliser in TRL's words (GRPOConfig.epsilon, 1.16.0 grpo_config.py:178-179;
# 1.12.0 :184-185; git :185-186; GRPOConfig.loss_type "dapo", the loss entries' promise)
POLICY_PROMISES = (
    *_upstream(
        _GC,
        {"178-179": ("1.16.0",), "184-185": ("1.12.0",), "185-186": (GIT,)},
        "epsilon (`float`, *optional*, defaults to `0.2`): Epsilon value for clipping.",
        ("reference",),
        "the clip range of the ratio (clip_low = clip_high = epsilon at the defaults)",
    ),
    *AGG_DAPO_PROMISES,
)
EPSILON_HIGH = Option(
    "epsilon_high",
    (0.2, 0.28),
    0.2,
    f"{_GR}:946 (1.16.0; grpo_config.py:705-706 default None = epsilon; DAPO recommends 0.28, :184-186)",
    "the upper clip bound 1 + epsilon_high of coef_2",
    effect={0.28: {"variant": {"clip_high": 0.28}}},
)
DELTA = Option(
    "delta",
    ("none", 3.0),
    "none",
    f"{_GR}:3115-3116 (1.16.0; grpo_config.py:697-698 default None)",
    "two-sided GRPO: coef_1 = clamp(coef_1, max=delta) before -min(coef_1 A, coef_2 A); with delta > 1 + "
    "epsilon_high it caps -A r at -A delta where A < 0 (the dual clip) and changes nothing where A > 0",
    effect={3.0: {"variant": {"dual_clip": 3.0}}},
)
POLICY_ENTRIES = ("policy-grpo",)
ENTRY_OVERRIDES["policy-grpo"] = dict(
    kind="policy-loss",
    variant={"clip_low": 0.2, "clip_high": 0.2, "dual_clip": None, "advantages": "row", "mode": "token-mean"},
    contract="dense",
    whitening=None,
    masked_zero=True,  # d/dlogp of (per_token_loss * mask).sum() / normalizer is 0 where mask is 0 (finite inputs)
    masked_zero_why=f"{_GR}:3168-3174 (1.16.0): the dapo branch sums per_token_loss * mask",
    documented_errors=(r"OptionNotAtPin",),
    domain=_EQUAL_SPLITS,
    pipeline=_POLICY_PIPELINE,
    pipeline_by_pin={},
    promises=POLICY_PROMISES,
    options=(EPSILON_HIGH, DELTA, MASK_TRUNCATED),
    truncation=AGG_TRUNCATION,
    notes=(
        "GRPOTrainer._compute_loss at its defaults (loss_type='dapo', epsilon=0.2, beta=0): the per-row advantage "
        "broadcast over the completion, the clipped ratio objective and the dapo global token mean through "
        "num_items_in_batch; 0.19.1 has no 'dapo' (its default is 'bnpo'): a skip there"
    ),
)


SPEC = TargetSpec(
    id="trl",
    first_run=('train', 'grpo', 'policy-grpo'),
    adapter="maskfuzz.targets.adapters.trl",
    own=PACKAGES,
    contract="dense",
    git_url="https://github.com/huggingface/trl.git",
    package="trl",
    pins=(
        Pin("1.12.0", "newest release with a PPO trainer (trl/experimental/ppo; 1.13.0 dropped it)", default=True),
        Pin(
            "0.11.4",
            "last 0.11: PPOv2Trainer.train inline GAE and the old standalone compute_advantages",
            default=True,
        ),
        Pin("0.19.1", "PPOTrainer in trl/trainer/ppo_trainer.py with the k1/k3 KL estimator"),
        Pin("f2cd57710ae345ea6428ae95363267fcf38a3dc8", "git main as mirrored (v1.9.0-26, Jul 2026)", kind="git"),
        Pin("1.16.0", "newest release: ships no PPO trainer at all (skips with that reason)"),
    ),
    entries=ENTRIES,
    # train(): `advantages = masked_whiten(advantages, ~padding_mask)`; masked_var is unbiased
    # (Bessel mask_sum / (mask_sum - 1)) and masked_whiten adds 1e-8 under the rsqrt.
    whitening=Whitening(unbiased=True, eps=1e-8),
    masked_zero=True,  # train(): `advantages = torch.masked_fill(advantages, padding_mask, 0)`
    # masked_var raises this ValueError when no token of the batch is trained on
    documented_errors=(r"ValueError: The sum of the mask is zero",),
    stand_ins=(),  # no trl module is imported: the block and its helpers are compiled from source
    domain=TRAIN_DOMAIN,
    pipeline=TRAIN_PIPELINE,  # module docstring, "Pipeline domain"
    pipeline_by_pin=TRAIN_PIPELINE_BY_PIN,
    entry_overrides=ENTRY_OVERRIDES,
    notes=(
        "train(): TRL places the score at sequence_lengths + 1 (the first pad slot) and keeps the value there "
        "(padding_mask_p1), while the policy trains on positions <= sequence_lengths (padding_mask)."
    ),
)


def spec_for(entry: str | None) -> TargetSpec:
    """SPEC with the declarations of `entry` applied (the registry holds one SPEC per target)."""
    return SPEC.for_entry(_entry(entry))


def declared_for(entry: str | None) -> Declared:
    return SPEC.declared(_entry(entry))


def _entry(entry: str | None) -> str:
    if entry in (None, "", "default"):
        return ENTRIES[0]
    if entry not in ENTRIES:
        raise ValueError(f"trl has no entry {entry!r}; entries: {', '.join(ENTRIES)}")
    return entry


def load(root: Path, entry: str | None) -> Loaded:
    entry = _entry(entry)
    tree = SourceTree(Path(root), PACKAGES)
    if entry == "train":
        return _load_train(tree)
    return _load_compute_advantages(tree)


# ---------------------------------------------------------------------------------------------
# Entry `train`: the inline block of PPOTrainer.train().
# ---------------------------------------------------------------------------------------------
def _trainers(tree: SourceTree) -> list[tuple[Path, ast.FunctionDef, str]]:
    """Each (file, train FunctionDef, "Class.train") of a PPO trainer class with a train() method."""
    out = []
    for rel, cls_name in TRAIN_FILES:
        path = Path(tree.root, rel)
        if not path.is_file():
            continue
        cls = find_class(tree.file(path).tree, cls_name)
        method = find_method(cls, "train") if cls is not None else None
        if method is not None:
            out.append((path, method, f"{cls_name}.train"))
    return out


def _load_train(tree: SourceTree) -> Loaded:
    trainers = _trainers(tree)
    if not trainers:
        looked = ", ".join(f"{rel}::{cls}.train" for rel, cls in TRAIN_FILES)
        raise NotPresent(f"no PPO trainer at this pin (trl >= 1.13 ships none); looked for {looked}")
    for path, train, qual in trainers:
        located = find_gae_loop(train)
        if located is not None:
            break
    else:
        where = ", ".join(f"{tree.rel(p)}::{q}" for p, _, q in trainers)
        raise BlockNotFound(
            f"trl: {where} exist(s) but no GAE loop (`for t in reversed(range(...))` assigning lastgaelam) was found "
            "in train(); the adapter must learn the new shape before this pin can be tested"
        )
    stmts, loop_at = located
    rel = tree.rel(path)
    block = _gae_block(tree, path, rel, stmts, loop_at)
    seq = _sequence_length_block(tree, path, rel, train)

    def run(case: Case, device: str) -> tuple[torch.Tensor, torch.Tensor]:
        x = case.inputs(device)
        tokens = response_tokens(case).to(device)
        tok = types.SimpleNamespace(pad_token_id=PAD_ID, eos_token_id=EOS_ID)
        seq_ns = seq.run(**{name: tokens if name == "postprocessed_response" else tok for name in seq.bound})
        penalty = case.options.get("missing_eos_penalty", "none")
        args = types.SimpleNamespace(
            gamma=case.gamma,
            lam=case.lam,
            kl_coef=1.0,
            kl_estimator="k1",
            whiten_rewards=False,
            missing_eos_penalty=None if penalty == "none" else penalty,  # "none": TRL's default None
        )
        me = types.SimpleNamespace(args=args, processing_class=tok, tokenizer=tok)
        values = dict(
            responses=tokens,
            postprocessed_responses=tokens,
            sequence_lengths=seq_ns["sequence_length"],
            logprobs=torch.zeros_like(x["values"]),
            ref_logprobs=x["token_rewards"].clone(),
            values=x["values"].clone(),
            scores=x["score"].clone(),
            args=args,
            self=me,
        )
        out = run_block(block, {name: values[name] for name in block.bound})
        return out["advantages"], out["returns"]

    notes = [
        f"block {rel}:{block.first_line}-{block.last_line} of {qual} run from source "
        f"(from `response_idxs = ...` through the masked fill of advantages)",
        f"sequence_lengths from {rel}:{seq.first_line} (TRL's first_true_indices line, pad_token_id={PAD_ID})",
        "token_rewards enter as ref_logprobs with logprobs = 0, kl_coef = 1, kl_estimator = 'k1'; "
        "whiten_rewards = False",
        f"responses: token 1, pad {PAD_ID}, eos {EOS_ID} on the last token of every row that is not truncated; "
        "missing_eos_penalty from the case's options ('none' = None), applied by TRL's own EOS filter in the block",
        "helpers compiled from source: " + ", ".join(sorted(tree.provenance)),
    ]
    if tree.unresolved:
        notes.append("unresolved (unused) names: " + "; ".join(f"{k}: {v}" for k, v in sorted(tree.unresolved.items())))
    return Loaded(run, f"{rel}::{qual} (lines {block.first_line}-{block.last_line})", notes)


def response_tokens(case: Case) -> torch.Tensor:
    """TRL's postprocessed response of each row: 1 at its tokens, PAD_ID after them and EOS_ID as the last token of a
    row that ended (with stop_token set, truncate_response keeps the stop token and pads after it, so the EOS is the
    last trained token); a truncated row (cut by response_length) has no EOS."""
    live = case.trainable
    tokens = torch.where(live, 1, PAD_ID).long()
    ended = live.any(dim=1) & ~case.truncated_rows()
    last = live.shape[1] - 1 - live.flip(1).int().argmax(dim=1)
    rows = ended.nonzero().flatten()
    tokens[rows, last[rows]] = EOS_ID
    return tokens


def run_block(block: Block, values: dict) -> dict:
    """`Block.run` for a block that binds `self` (a keyword `Block.run` itself takes)."""
    missing = set(block.bound) - set(values)
    if missing:
        raise TypeError(f"the block needs {sorted(missing)} bound")
    ns = dict(block.globals)
    ns.update(values)
    exec(block.code, ns)  # noqa: S102 - the framework's own source, the code under test
    return ns


def _gae_block(tree: SourceTree, path: Path, rel: str, stmts: list[ast.stmt], loop_at: int) -> Block:
    """The statements from the padding masks through the final advantages of train()."""
    start = None
    for first_name in ("response_idxs", "padding_mask"):
        start = next((i for i in range(loop_at - 1, -1, -1) if first_name in stored_names(stmts[i])), None)
        if start is not None:
            break
    if start is None:
        raise BlockNotFound(
            f"trl: {rel}:{stmts[loop_at].lineno}: no `response_idxs`/`padding_mask` assignment before the GAE loop"
        )
    # "Response Processing 3": `contain_eos_token = ...` and `if self.args.missing_eos_penalty is not None: scores[...]
    # -= ...` right before the masks: the missing_eos_penalty option, applied by TRL's own statements
    near = range(start - 1, max(start - 4, -1), -1)
    eos_at = next((i for i in near if "contain_eos_token" in stored_names(stmts[i])), None)
    if eos_at is None:
        raise BlockNotFound(
            f"trl: {rel}:{stmts[start].lineno}: no `contain_eos_token = ...` (the missing_eos_penalty filter) right "
            "before the masks of the GAE block"
        )
    start = eos_at
    end = loop_at
    while end + 1 < len(stmts) and stored_names(stmts[end + 1]) & {"advantages", "returns"}:
        end += 1
    block = stmts[start : end + 1]
    after = set().union(*(stored_names(s) for s in stmts[loop_at + 1 : end + 1])) if end > loop_at else set()
    if not {"advantages", "returns"} <= after:
        raise BlockNotFound(
            f"trl: {rel}:{stmts[loop_at].lineno}: the GAE loop is not followed by assignments of advantages and returns"
        )
    free = block_free_names(block)
    needed = {"sequence_lengths", "values", "scores"}
    if not needed <= free or "padding_mask" not in set().union(*(assigned_names(s) for s in block)):
        raise BlockNotFound(
            f"trl: {rel}:{block[0].lineno}-{block[-1].end_lineno}: the block does not read {sorted(needed - free)} "
            "or does not build padding_mask; it is not the masking + GAE block the adapter knows"
        )
    unknown_args = sorted(set().union(*(attribute_reads(s, "args") for s in block)) - set(ARGS_SET))
    if unknown_args:
        reads = ", ".join(f"args.{a}" for a in unknown_args)
        raise BlockNotFound(f"trl: the block at {rel}:{block[0].lineno} reads {reads}, which the adapter does not set")
    unknown_self = sorted(set().union(*(attribute_reads(s, "self") for s in block)) - set(SELF_READS))
    if unknown_self:
        reads = ", ".join(f"self.{a}" for a in unknown_self)
        raise BlockNotFound(f"trl: the block at {rel}:{block[0].lineno} reads {reads}, which the adapter does not set")
    self_args = set().union(*(attribute_reads(s, "self.args") for s in block))
    if self_args - {"missing_eos_penalty"}:
        raise BlockNotFound(
            f"trl: the block at {rel}:{block[0].lineno} reads self.args.{sorted(self_args - {'missing_eos_penalty'})}"
        )
    bound = [n for n in BLOCK_INPUTS if n in free]
    extra = sorted(n for n in free - set(BLOCK_INPUTS) if n in {"accelerator", "model"})
    if extra:
        raise BlockNotFound(
            f"trl: the block at {rel}:{block[0].lineno} reads {extra}; the adapter binds only {BLOCK_INPUTS}"
        )
    return tree.block(path, block, bound)


def _sequence_length_block(tree: SourceTree, path: Path, rel: str, train: ast.FunctionDef) -> Block:
    """TRL's `sequence_length = first_true_indices(... == pad_token_id) - 1` line of train()."""
    for node in ast.walk(train):
        if isinstance(node, ast.Assign) and "sequence_length" in stored_names(node):
            calls = {
                c.func.id for c in ast.walk(node.value) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)
            }
            if "first_true_indices" in calls:
                free = block_free_names([node])
                bound = sorted(free & {"postprocessed_response", "processing_class", "tokenizer"})
                if "postprocessed_response" not in bound:
                    raise BlockNotFound(
                        f"trl: {rel}:{node.lineno}: the sequence-length line does not read postprocessed_response"
                    )
                return tree.block(path, [node], bound)
    raise BlockNotFound(f"trl: {rel}: train() has no `sequence_length = first_true_indices(...)` line")


# ---------------------------------------------------------------------------------------------
# Entry `compute_advantages`: the old PPOTrainer's methods (up to 0.11.x).
# ---------------------------------------------------------------------------------------------
CONFIG_SET = ("gamma", "lam", "whiten_rewards", "kl_penalty")


def _load_compute_advantages(tree: SourceTree) -> Loaded:
    path = Path(tree.root, OLD_FILE)
    cls = find_class(tree.file(path).tree, OLD_CLASS) if path.is_file() else None
    method = find_method(cls, "compute_advantages") if cls is not None else None
    if method is None:
        raise NotPresent(
            f"no {OLD_FILE}::{OLD_CLASS}.compute_advantages at this pin (the standalone method exists up to 0.11.x)"
        )
    rel = tree.rel(path)
    if find_gae_loop(method) is None:
        raise BlockNotFound(
            f"trl: {rel}::{OLD_CLASS}.compute_advantages has no GAE loop (lastgaelam over reversed(range(...)))"
        )
    nodes = {}
    for name in ("compute_advantages", "compute_rewards", "_kl_penalty"):
        node = find_method(cls, name)
        if node is None:
            raise BlockNotFound(
                f"trl: {rel}::{OLD_CLASS} has compute_advantages but no {name}; "
                "the adapter needs TRL's own score placement"
            )
        nodes[name] = node
    config_reads = set()
    for node in nodes.values():
        config_reads |= {
            n.attr
            for n in ast.walk(node)
            if isinstance(n, ast.Attribute)
            and isinstance(n.value, ast.Attribute)
            and n.value.attr == "config"
            and isinstance(n.value.value, ast.Name)
            and n.value.value.id == "self"
        }
    if config_reads - set(CONFIG_SET):
        unknown = sorted(config_reads - set(CONFIG_SET))
        raise BlockNotFound(f"trl: {rel}::{OLD_CLASS} methods read self.config.{unknown}, not set by the adapter")
    fns = {name: tree.function(path, node) for name, node in nodes.items()}
    clip = _score_clip_block(tree, path, rel, cls)

    def run(case: Case, device: str) -> tuple[torch.Tensor, torch.Tensor]:
        x = case.inputs(device)
        score_clip = case.options.get("score_clip", "none")
        config = types.SimpleNamespace(
            gamma=case.gamma,
            lam=case.lam,
            whiten_rewards=False,
            kl_penalty="kl",
            score_clip=None if score_clip == "none" else score_clip,  # "none": TRL's default None
        )
        me = types.SimpleNamespace(config=config, kl_ctl=types.SimpleNamespace(value=1.0))
        me._kl_penalty = types.MethodType(fns["_kl_penalty"], me)
        # step(): the score clipping statement, TRL's own, on the scores before compute_rewards
        scores = run_block(clip, {"scores": x["score"].clone(), "self": me})["scores"]
        # masks are integer in TRL (derived from the attention mask)
        mask = case.trainable.to(device).long()
        logprobs, ref_logprobs = torch.zeros_like(x["values"]), x["token_rewards"].clone()
        rewards, _, _ = fns["compute_rewards"](me, scores, logprobs, ref_logprobs, mask)
        _, advantages, returns = fns["compute_advantages"](me, x["values"].clone(), rewards, mask)
        return advantages, returns

    notes = [
        f"{rel}::{OLD_CLASS}.compute_rewards -> compute_advantages compiled from source (lines "
        f"{nodes['compute_rewards'].lineno}, {nodes['compute_advantages'].lineno}), self = namespace with "
        "config.{gamma, lam, whiten_rewards=False, kl_penalty='kl'}, kl_ctl.value = 1.0, _kl_penalty (TRL's own)",
        "token_rewards enter as ref_logprobs with logprobs = 0 (kl = logprob - ref_logprob, reward = -kl); "
        "mask = trainable as long",
        f"score_clip from the case's options ('none' = None) through step()'s own clipping statement ({rel}:"
        f"{clip.first_line}-{clip.last_line})",
        "helpers compiled from source: " + ", ".join(sorted(tree.provenance)),
    ]
    return Loaded(run, f"{rel}::{OLD_CLASS}.compute_advantages", notes)


def _score_clip_block(tree: SourceTree, path: Path, rel: str, cls: ast.ClassDef) -> Block:
    """The `if self.config.score_clip is not None: ...` statement of the old PPOTrainer.step()."""
    step = find_method(cls, "step")
    for node in step.body if step is not None else []:
        if isinstance(node, ast.If) and "score_clip" in {
            n.attr for n in ast.walk(node.test) if isinstance(n, ast.Attribute)
        }:
            free = block_free_names([node])
            if not {"scores", "self"} <= free:
                raise BlockNotFound(f"trl: {rel}:{node.lineno}: the score_clip statement does not read scores")
            return tree.block(path, [node], ["scores", "self"])
    raise BlockNotFound(f"trl: {rel}::{OLD_CLASS}.step has no `if self.config.score_clip ...` statement")

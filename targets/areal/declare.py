"""Adapter for AReaL (inclusionAI/AReaL): `PPOActor._compute_advantages(data)`, AReaL's own score
placement, KL reward and masked GAE in one method.

Where: `areal/trainer/ppo/actor.py::PPOActor._compute_advantages` (1.0.x and git main),
`areal/engine/ppo/actor.py::PPOActor.compute_advantages` (0.3 - 0.5, mutates `data` and may
return None). The method is found by name and checked by structure (a `for t in
reversed(range(...))` loop assigning `lastgaelam`); it is compiled from the file at the pin and
called with `self` a namespace holding exactly the attributes it reads. `areal.trainer.ppo.actor`
itself is not imported: it pulls in AReaL's controller / RPC / logging stack (colorlog, aiohttp,
...), whose import-time set-up fails with stand-ins. `KLEstimator` is AReaL's own class, compiled
from `areal/utils/data.py` at the pin.

Entry `default-kl` (KL in the reward, `oracles.kinds.gae.kl_reward`): the same call with `logprobs` / `ref_logp`
from the case's `logp` / `ref_logp` (0 on the prompt and padding) and `kl_ctl = KL_CTL` (0.1, the default), so
the method's own KL reward is the whole token reward (`KL_VARIANT`, cited below `_KIND_OVERRIDES`).

`self` (the attributes `__init__` derives from `PPOActorConfig`, with its defaults unless said):
  config.overlong_reward_penalty = False, config.use_decoupled_loss = False,
  config.recompute_logprob = False (old log-probs come rolled from `data["logprobs"]`),
  reward_bias, reward_scaling, reward_clip, mask_no_eos_with_zero from `case.options` (`OPTIONS`, defaults
  0.0, 1.0, 20.0, False), reward_norm = None, adv_norm = None (the defaults),
  kl_estimator = KLEstimator("k1") (default), kl_ctl = a power of two (see below; default 0.1),
  discount = gamma, gae_lambda = lam.

`data` is laid out as AReaL's rollout batches are: per row, P = 2 prompt tokens, then the
response, then right padding, in one [B, L] tensor with L = P + T (the batch is as wide as its
longest row):
  input_ids      1 on prompt and real response tokens, 0 on padding
  attention_mask prompt + the real window tokens (bool)
  loss_mask      1 on trainable window tokens (token coordinates)
  logprobs       0 (token coordinates; the method rolls them by -1)
  ref_logp       token_rewards / kl_ctl at rolled index P - 1 + k (log-prob coordinates: index t
                 scores token t + 1, as AReaL's engines return them), float32 like AReaL's logprobs
  values         the window values at rolled index P - 1 + k; at the index of a row's last real
                 token (the critic value of the state after it) the case's bootstrap value for a row
                 as wide as the batch (column L - 1) or a truncated row; 0 elsewhere
  rewards        the score [B]
Window position k is rolled index P - 1 + k (the action that produces response token k). AReaL has
no EOS / truncation flag: a row "has no EOS" when it is as wide as the batch (`seqlens ==
attn_mask.shape[1]`), and then bootstraps from `values[:, max_seqlen - 1]`. The adapter hands it
nothing else: a truncated row that fills the window is such a row; a truncated row followed by
padding is not (AReaL treats it as ended), and an ended row that fills the window is taken for a
cut one (its bootstrap slot holds `case.bootstrap_values()`, 0 for an ended row, so only the
`mask_no_eos_with_zero` score drop shows it). With old log-probs 0 the KL reward is
`-kl_ctl * clamp(0 - ref_logp, -10, 10)`, which is exactly `token_rewards` while |token_rewards| /
kl_ctl <= 10; kl_ctl is the smallest power of two (>= 1) that keeps it there, so the division is
exact.

Pipeline domain (`SPEC.pipeline` for 1.0.4 and git main, whose cited files are identical;
`SPEC.pipeline_by_pin` for v0.3.4, the same facts at other lines). Every workflow builds one row as
prompt (loss_mask 0) + output (loss_mask 1) with `attention_mask` all ones, and batches are right-padded with 0
(`concat_padded_tensors`). `areal/workflow/multi_turn.py:105` (v0.3.4 :103) appends each retry's feedback prompt with
loss_mask 0 (gaps; the prompt itself is the leading mask); AReaL's own `examples/tir/tir_workflow.py:171-173, 241`
(v0.3.4 :156-158, 226) appends tool output with loss_mask 0 and stops on `max_turns` / `max_length` right after it,
so a row can end in real masked tokens (the score then sits on a masked slot: the corpus' score-kept / telescoping /
reference entries are reachable); `len(context_ids) >= max_len` before the first turn and empty completions
(skipped when dumping, `areal/infra/workflow_executor.py:896-898`, git main :893-895) give rows with no trainable
token. Values are the critic's at every real position (not zeroed at the prompt) in the engine dtype (`dtype`,
default bfloat16; float16/float32 by config), ref log-probs are non-zero at the prompt, and `kl_ctl` (default 0.1)
makes token rewards: dtypes, masked values and rewards stay permissive. Narrowed: left padding (right-padded
rows) and non-finite poison (critic outputs and ref log-probs are finite; padding is filled with 0.0; rollout
log-probs are 0.0 on the prompt). Truncated rows: both kinds are reachable. A cut row fills the batch when its
prompt + max_new_tokens is the longest; one with a shorter prompt than another row is followed by padding (prompts
differ in length, `areal/workflow/rlvr.py:165-175`), so `truncated_padded` stays allowed.
"""

from __future__ import annotations

import dataclasses

from maskfuzz.oracles.domain import Domain
from maskfuzz.oracles.options import Option, Truncation
from maskfuzz.oracles.promises import Promise
from maskfuzz.targets.areal.calls import KL_CTL, OPTION_DEFAULTS, PACKAGES
from maskfuzz.targets.areal.calls_kinds import POLICY_OPTION_DEFAULTS
from maskfuzz.targets.registry import Pin, TargetSpec

# The actor's options that touch this entry's math (1.0.4 lines; git main cbff54d64 in brackets). Each effect is
# what the option means (PPOActorConfig help, 1.0.4 areal/api/cli_args.py:1484-1510), stated on the reference.
OPTIONS = (
    Option(
        "actor.reward_bias",
        (0.0, -0.5),
        OPTION_DEFAULTS["actor.reward_bias"],
        "areal/trainer/ppo/actor.py:168 (git main :202)",
        "Reward bias (cli_args.py:1487): added to the outcome score before the scaling",
        effect={-0.5: {"score_map": (("add", -0.5),)}},
    ),
    Option(
        "actor.reward_scaling",
        (1.0, 2.0),
        OPTION_DEFAULTS["actor.reward_scaling"],
        "areal/trainer/ppo/actor.py:168 (git main :202)",
        "Reward scaling factor (cli_args.py:1484-1486): multiplies the biased score",
        effect={2.0: {"score_map": (("mul", 2.0),)}},
    ),
    Option(
        "actor.reward_clip",
        (20.0, 1.0),
        OPTION_DEFAULTS["actor.reward_clip"],
        "areal/trainer/ppo/actor.py:169-171 (git main :203-205)",
        "Reward clipping threshold (cli_args.py): the biased, scaled score clipped to [-clip, clip]; on by default",
        effect={20.0: {"score_map": (("clip", 20.0),)}, 1.0: {"score_map": (("clip", 1.0),)}},
    ),
    Option(
        "actor.mask_no_eos_with_zero",
        (False, True),
        OPTION_DEFAULTS["actor.mask_no_eos_with_zero"],
        "areal/trainer/ppo/actor.py:207-212 (git main :260-265)",
        "Mask truncated generations (no EOS token) (cli_args.py:1503-1508): the outcome reward of a row cut by the "
        "length limit is replaced by 0",
        effect={True: {"truncation": {"score": "zero"}}},
    ),
)
# A row without EOS bootstraps from the critic value after its last token: `nextvalues = values[:, max_seqlen - 1] *
# seq_no_eos_mask` (1.0.4 areal/trainer/ppo/actor.py:223; git main areal/trainer/ppo/gae.py:22), its score kept.
TRUNCATION = Truncation(
    score="kept",
    bootstrap="value",
    row="kept",
    cite="areal/trainer/ppo/actor.py:200-201, 223 (git main actor.py:251-252, gae.py:22): seq_no_eos_mask = seqlens "
    "== attn_mask.shape[1]; nextvalues = values[:, max_seqlen - 1] * seq_no_eos_mask",
)

V034 = "b0ebd07b61d01122cf21579295c61863c969d3b1"
MAIN = "4aef98d8d818af55b43621aaadba047ae10f4e77"
# What AReaL's own code produces (`Domain.produces`, issue 24): the workflows, AReaL's tool-integrated-reasoning
# example (examples/tir, trained with PPOTrainer at 1.0.4: examples/tir/train_tir.py:55), the critic, the batching.
# 1.0.4 and git 4aef98d8 share every cited file but the inference engine's (remote_inf_engine.py). Not cited:
# masked_rewards (the KL reward is 0 under the mask: ref_logp *= loss_mask; old_logp *= loss_mask, actor.py:195-196),
# all_masked_rows (masked real tokens come only after an output), left padding and NaN / inf (narrowed), dtypes
# other than float32 (the rewards are float32, actor.py:202, so the recursion is float32 whatever the critic's dtype).
_PRODUCES_1 = {
    "leading_mask": "areal/workflow/rlvr.py:167 loss_mask = [0] * resp.input_len + [1] * resp.output_len: the prompt "
    "is part of the row at loss mask 0, before the output",
    "gaps": "areal/workflow/multi_turn.py:105 each retry's feedback prompt at loss mask 0 between two outputs; "
    "examples/tir/tir_workflow.py:241 tool responses at loss mask 0 between outputs",
    "masked_real_tail": "examples/tir/tir_workflow.py:171-172 the loop stops on max_turns / max_length right after "
    "a tool response, appended at loss mask 0 at :241: the row ends in real masked tokens",
    "empty_rows": "examples/tir/tir_workflow.py:172 a prompt already at max_length breaks before the first turn: "
    "the row is the prompt alone, no response token",
    "token_rewards": "areal/trainer/ppo/actor.py:202 rewards = -self.kl_ctl * self.kl_estimator(old_logp, ref_logp) "
    "at every loss-mask position (kl_ctl default 0.1, areal/api/cli_args.py:1522)",
    "masked_values": "areal/trainer/ppo/critic.py:35-40 the critic's engine forward gives a value at every token, "
    "prompt and tool tokens included",
    "truncated_rows": "areal/infra/remote_inf_engine.py:849-852 (git 4aef98d8 :787-790) generation stops at "
    "max_new_tokens without EOS and the workflow keeps the row (areal/workflow/rlvr.py:165-167)",
    "truncated_padded": "areal/utils/data.py:241-297 concat_padded_tensors pads every row to the batch's longest: a "
    "cut row with a shorter prompt is followed by padding (areal/workflow/rlvr.py:165-175)",
}
_PRODUCES_034 = {
    "leading_mask": "v0.3.4: areal/workflow/rlvr.py:85 loss_mask = [0] * resp.input_len + [1] * resp.output_len",
    "gaps": "v0.3.4: areal/workflow/multi_turn.py:103 feedback prompts at loss mask 0 between outputs; "
    "examples/tir/tir_workflow.py:226 tool responses at loss mask 0",
    "masked_real_tail": "v0.3.4: examples/tir/tir_workflow.py:156-157 the loop stops on max_turns / max_length right "
    "after a tool response at loss mask 0 (:226); trained with FSDPPPOActor (examples/tir/train_tir.py:59)",
    "empty_rows": "v0.3.4: examples/tir/tir_workflow.py:157 a prompt already at max_length breaks before the first "
    "turn",
    "token_rewards": "v0.3.4: areal/engine/ppo/actor.py:115 rewards = -self.kl_ctl * self.kl_estimator(old_logp, "
    "ref_logp)",
    "masked_values": "v0.3.4: areal/engine/ppo/critic.py:20-25 the critic's engine forward at every token",
    "truncated_rows": "v0.3.4: areal/engine/sglang_remote.py:226 generation stops at max_new_tokens without EOS "
    "(areal/workflow/rlvr.py:83-85 keeps the row)",
    "truncated_padded": "v0.3.4: areal/utils/data.py:152-217 concat_padded_tensors pads rows to the longest",
}
# AReaL's own words about the GAE loop: masked tokens are skipped (the compressed contract), so a masked value
# must not bootstrap and an inserted masked token must change nothing
_SKIP = "# Skip tokens that do not contribute to the loss"
_SKIP_NOTE = "the loop carries nextvalues / lastgaelam over loss_mask 0 positions right below this comment"
GAE_PROMISES = (
    Promise(
        "upstream:areal/trainer/ppo/actor.py:228",
        _SKIP,
        covers=("gap-invariance", "mechanism:masked-value-bootstrap"),
        note=_SKIP_NOTE,
        pins=("1.0.4", MAIN),
    ),
    Promise(
        "upstream:areal/engine/ppo/actor.py:141",
        _SKIP,
        covers=("gap-invariance", "mechanism:masked-value-bootstrap"),
        note=_SKIP_NOTE + " (v0.3.4)",
        pins=(V034,),
    ),
)
# the engines normalise every micro-batch's loss by the step's token count over all micro-batches and ranks
LOSS_PROMISES = (
    Promise(
        "upstream:areal/engine/core/train_engine.py:37-38",
        "This aggregates the loss weights from all micro-batches and reduces them across the data parallel group to "
        "get a global normalization factor.",
        covers=("split-invariance",),
        note="compute_total_loss_weight's docstring; the actor and critic losses are weighted by "
        "loss_mask.count_nonzero() over it (calls_kinds.load_value / load_policy)",
        pins=("1.0.4", MAIN),
    ),
)

SPEC = TargetSpec(
    id="areal",
    first_run=('default', 'grpo', 'policy-loss'),
    adapter="maskfuzz.targets.areal.calls",
    own=PACKAGES,
    # the loop skips masked tokens: `nextvalues` and `lastgaelam` are carried over positions with
    # loss_mask 0 ("Skip tokens that do not contribute to the loss")
    contract="compressed",
    git_url="https://github.com/inclusionAI/AReaL.git",
    package="areal",
    pins=(
        Pin("1.0.4", "the only release on PyPI (method identical to git main)", default=True),
        Pin("4aef98d8d818af55b43621aaadba047ae10f4e77", "git main as mirrored (May 2026)", kind="git"),
        Pin(
            "b0ebd07b61d01122cf21579295c61863c969d3b1",
            "v0.3.4: areal/engine/ppo/actor.py::PPOActor.compute_advantages",
            kind="git",
        ),
    ),
    whitening=None,  # adv_norm defaults to None (PPOActorConfig); the adapter keeps it off
    options=OPTIONS,
    truncation=TRUNCATION,
    masked_zero=False,
    masked_zero_why=(
        "the loop keeps lastgaelam where loss_mask is 0, so a masked position holds the advantage of the next "
        "trainable token (0 after the last one); AReaL's loss multiplies by loss_mask"
    ),
    stand_ins=(),  # no areal module is imported: the method and KLEstimator are compiled from source
    domain=Domain(
        dtypes=("float32", "bfloat16", "float16"),
        left_padding=False,
        why={
            "dtypes": "KLEstimator casts log-probs to float32 and the rewards tensor is float32, so float64 inputs "
            "are rounded to float32 before the recursion",
            "left_padding": "AReaL rows are prompt + response, right-padded: the response window starts right "
            "after the prompt",
        },
    ),
    pipeline=Domain(
        left_padding=False,
        nonfinite_poison=False,
        why={
            "left_padding": "rows are prompt + output with attention_mask all ones (areal 1.0.4: "
            "areal/workflow/rlvr.py:165-175, areal/workflow/multi_turn.py:127-133) and batches are right-padded: "
            "concat_padded_tensors -> _pad_cat_dim0 pads dims 1.. on the right (areal/utils/data.py:204-238, "
            "241-297; concat_batch areal/utils/data.py:369-390 under batched_call, areal/trainer/ppo/actor.py:143)",
            "nonfinite_poison": "values are critic forward outputs (areal/trainer/ppo/critic.py:35-40), set per "
            "trajectory (areal/trainer/rl_trainer.py:633-635; git main :595-597), padded with 0.0 "
            "(areal/engine/core/train_engine.py:140-144, areal/utils/data.py:544-555) and by concat_padded_tensors "
            "pad_value 0.0 (areal/utils/data.py:241-297); ref_logp is a ref-engine forward padded the same way "
            "(areal/trainer/rl_trainer.py:650-652; git main :612-614); rollout log-probs are 0.0 on the prompt "
            "(areal/workflow/rlvr.py:166, areal/workflow/multi_turn.py:104); no NaN/inf is written at a masked "
            "position",
        },
        produces=_PRODUCES_1,
    ),
    pipeline_by_pin={
        "b0ebd07b61d01122cf21579295c61863c969d3b1": Domain(
            left_padding=False,
            nonfinite_poison=False,
            why={
                "left_padding": "v0.3.4: rows are prompt + output with attention_mask all ones "
                "(areal/workflow/rlvr.py:83-113, areal/workflow/multi_turn.py:103-126); concat_padded_tensors "
                "appends the padding on the right (areal/utils/data.py:152-220, torch.cat at :217)",
                "nonfinite_poison": "v0.3.4: values are PPOCritic.compute_values, an engine forward "
                "(areal/engine/ppo/critic.py:20-25; absent -> zeros, areal/engine/ppo/actor.py:128-129) "
                "unpacked and padded with 0.0 (areal/engine/base_hf_engine.py:603-607, areal/utils/data.py:318-328); "
                "batches padded with pad_value 0.0 (areal/utils/data.py:152-217); rollout log-probs are 0.0 on "
                "the prompt (areal/workflow/rlvr.py:84); ref_logp is zeros (areal/engine/ppo/actor.py:107) or a "
                "ref-engine forward padded the same way (examples/countdown/train.py:328)",
            },
            produces=_PRODUCES_034,
        ),
    },
    notes=(
        "score at attention length - 2 in rolled coordinates = the last real (attended) response token, not the "
        "last trainable one; adv_norm (off by default) is not exercised"
    ),
)


# The entries beyond GAE (targets/areal/calls_kinds.py). Normalization returns `.float()` and KLEstimator
# casts to float32 (1.0.4 areal/utils/data.py:1496 and :1636-1650): float64 inputs come back rounded to float32.
_F32 = Domain(
    dtypes=("float32", "bfloat16", "float16"),
    why={"dtypes": "Normalization returns (x_centered / (std + eps)).float() and KLEstimator computes in float32"},
)
# NormConfig options of reward_norm / adv_norm (1.0.4 areal/api/cli_args.py:43-79; read in Normalization.__init__,
# areal/utils/data.py:1386-1394, git main :1390-1398). Values are JSON scalars: "none" stands for YAML null.
_NORM_UNBIASED = "Whether to use unbiased standard deviation computation (cli_args.py:64-69)"
_NORM_EPS = "The eps when dividing by standard deviation (cli_args.py:70-75): (x - mean) / (std + eps)"
GRPO_OPTIONS = (
    Option(
        "actor.reward_norm.std_unbiased",
        (True, False),
        True,
        "areal/utils/data.py:1392, 1485 (git main :1396, 1527)",
        _NORM_UNBIASED,
        effect={False: {"variant": {"std": "biased"}}},
    ),
    Option(
        "actor.reward_norm.std_level",
        ("group", "none"),
        "group",  # NormConfig's own default is "batch"; the entry is the GRPO configuration (group / group)
        "areal/utils/data.py:1470-1493 (git main :1512-1535)",
        "Standard deviation level; None for no std normalization (cli_args.py:57-63): r - mean_g (Dr.GRPO)",
        effect={"none": {"variant": {"std": None}}},
    ),
    Option(
        "actor.reward_norm.eps",
        (1e-5, 0.1),
        1e-5,
        "areal/utils/data.py:1394, 1405, 1496 (git main :1398, 1538)",
        _NORM_EPS,
        effect={0.1: {"variant": {"eps": 0.1}}},
    ),
)
ADV_NORM_OPTIONS = (
    Option(
        "actor.adv_norm.std_unbiased",
        (True, False),
        True,
        "areal/utils/data.py:1392, 1460 (git main :1396, 1502)",
        _NORM_UNBIASED,
        effect={False: {"variant": {"unbiased": False}}},
    ),
    Option(
        "actor.adv_norm.eps",
        (1e-5, 0.1),
        1e-5,
        "areal/utils/data.py:1394, 1405, 1496 (git main :1398, 1538)",
        _NORM_EPS,
        effect={0.1: {"variant": {"eps": 0.1}}},
    ),
)
VALUE_OPTIONS = (
    Option(
        "critic.eps_clip",
        (0.5, 0.2),
        0.5,
        "areal/trainer/ppo/critic.py:70, 121 (PPOCriticConfig.eps_clip, areal/api/cli_args.py:1659-1661; git main "
        ":1996)",
        "Clipping factor for value loss: the value is clipped to old_value +- eps_clip",
        effect={0.2: {"variant": {"clip": 0.2}}},
    ),
)
# PPOActorConfig's policy-ratio clips (1.0.4 areal/api/cli_args.py:1460-1475; git 4aef98d8 :1396-1411; git main
# cbff54d64 :1683-1698), passed by the actor to grpo_loss_fn (1.0.4 areal/trainer/ppo/actor.py:350-352; git main
# :468-470) and on to ppo_actor_loss_fn (1.0.4 :468-479; git main :615-626); read in functional.py (1.0.4 / git
# 4aef98d8 areal/utils/functional/functional.py:516-532, git main :545-561). None is YAML null (off by default).
POLICY_OPTIONS = (
    Option(
        "actor.eps_clip",
        (0.2, 0.1),
        POLICY_OPTION_DEFAULTS["actor.eps_clip"],
        "areal/utils/functional/functional.py:516-520 (git main :545-549); cli_args.py:1460-1462 (git main :1683-1685)",
        "Clipping factor for policy ratio (cli_args.py:1460-1462): the ratio clamped to [1 - eps_clip, 1 + eps_clip], "
        "the upper bound eps_clip_higher when that is set",
        effect={0.1: {"variant": {"clip_low": 0.1}}},
    ),
    Option(
        "actor.eps_clip_higher",
        (None, 0.28),
        POLICY_OPTION_DEFAULTS["actor.eps_clip_higher"],
        "areal/utils/functional/functional.py:519 (git main :548); cli_args.py:1463-1468 (git main :1686-1691)",
        "Clipping factor (higher value) for policy ratio (cli_args.py:1463-1468): None = eps_clip; when set, eps_clip "
        "is the lower value",
        effect={0.28: {"variant": {"clip_high": 0.28}}},
    ),
    Option(
        "actor.c_clip",
        (None, 3.0),
        POLICY_OPTION_DEFAULTS["actor.c_clip"],
        "areal/utils/functional/functional.py:526-532 (git main :555-561); cli_args.py:1469-1474 (git main :1692-1697)",
        "Dual clipping factor for policy ratio, must be > 1.0; None disables dual clipping (cli_args.py:1469-1474): "
        "min(pg_loss, sign(A) c_clip A), which binds only where A < 0",
        effect={3.0: {"variant": {"dual_clip": 3.0}}},
    ),
)
_KIND_OVERRIDES = {
    # reward_norm on the [B] scores (1.0.4 areal/trainer/ppo/actor.py:172-173; git main :211-212), NormConfig
    # group / group as AReaL's GRPO examples set it; Normalization (1.0.4 areal/utils/data.py:1378-1597):
    # unbiased std around the group mean (:1591, areal/api/cli_args.py:64-65 std_unbiased=True), eps=1e-5 added to
    # the std (:1496, areal/api/cli_args.py:70-71); a singleton (group_size 1): mean = x, std = 1 -> 0 (:1475-1479)
    # Every row of a group counts by design (empty_rows "counted"): reward_norm sees the [B] scores and no loss mask
    # (1.0.4 areal/trainer/ppo/actor.py:172-173), so a row with no trainable token keeps its place in the statistics.
    "grpo": dict(
        kind="group-advantage",
        variant={"estimator": "grpo", "std": "unbiased", "eps": 1e-5, "eps_place": "std", "singleton": "zero",
                 "empty_rows": "counted"},  # fmt: skip
        contract="dense",
        whitening=None,
        masked_zero=False,
        masked_zero_why="Normalization returns one value per row ([B] scores); the adapter broadcasts it to every "
        "position (the actor adds it at the last token, 1.0.4 areal/trainer/ppo/actor.py:211)",
        # the adapter's own refusal of a case AReaL cannot be given: groups are contiguous slices of one
        # group_size (1.0.4 areal/utils/data.py:1424, :1468) or, at git main, of the given group_sizes
        documented_errors=(r"ValueError: areal: Normalization\(group\)",),
        domain=_F32,
        options=GRPO_OPTIONS,
        truncation=None,  # reward_norm sees the [B] scores only: no notion of a cut row
    ),
    # adv_norm(advantages, loss_mask) (1.0.4 areal/trainer/ppo/actor.py:238-239), NormConfig defaults batch /
    # batch: masked mean, unbiased masked std (areal/utils/data.py:1591), (x - mean) * loss_mask / (std + 1e-5)
    # (:1452, :1496)
    "adv-norm": dict(
        kind="normalization",
        variant={"level": "batch", "unbiased": True, "eps": 1e-5, "eps_place": "std", "shift_mean": True},
        whitening=None,
        masked_zero=True,  # x_centered * loss_mask (1.0.4 areal/utils/data.py:1452)
        documented_errors=(),
        domain=_F32,
        options=ADV_NORM_OPTIONS,
        truncation=None,
    ),
    **{
        f"kl-{k}": dict(
            kind="kl",
            # KLEstimator(k) with apply_clamp=True clamps every estimator's output to [-10, 10]
            # (1.0.4 areal/utils/data.py:1655)
            variant={"estimator": k, "clamp": (-10.0, 10.0)},
            whitening=None,
            masked_zero=True,  # the actor multiplies both log-probs by loss_mask first (1.0.4 actor.py:194-195)
            documented_errors=(),
            domain=_F32,
            options=(),  # the estimator is the entry; kl_ctl scales the reward, not the estimate
            truncation=None,
        )
        for k in ("k1", "k2", "k3")
    },
    # ppo_actor_loss_fn's micro-batch token mean (1.0.4 areal/utils/functional/functional.py:483, :542) scaled by
    # the engine's loss_mask.count_nonzero() weights over the step (compute_total_loss_weight, 1.0.4
    # areal/engine/core/train_engine.py:30-64; fsdp_engine.py:2120): the global token mean. An all-masked step
    # fails the engine's `assert total_weight > 0, "Global total loss weight must be positive after all_reduce"`
    # (train_engine.py:62-64; v0.3.4 `assert total_loss_weight != 0`, fsdp_engine.py:397): a deliberate check,
    # declared as the entry's documented error.
    "agg-token-mean": dict(
        kind="loss-aggregation",
        variant={"mode": "token-mean"},
        masked_zero=True,  # torch.where(loss_mask, pg_loss, 0) (functional.py:542 at 1.0.4)
        masked_zero_why="",
        whitening=None,
        documented_errors=(r"AssertionError",),
        domain=Domain(why={}),
        promises=LOSS_PROMISES,
        pipeline=None,  # not researched as a Domain: every finding is reach api
        pipeline_by_pin={},
        options=(),
        truncation=None,
    ),
    # ppo_critic_loss_fn (1.0.4 areal/utils/functional/functional.py:714-777): 0.5 * max((v - R)^2, (v_c - R)^2)
    # (_mse_loss :710-711, :754-762), the micro-batch token mean (:771-774) scaled by the engine's count_nonzero
    # weights (calls_kinds.load_value): the global token mean, as for the actor. eps_clip 0.5 (PPOCriticConfig,
    # 1.0.4 areal/api/cli_args.py:1659-1661). An all-masked step fails the engine's total-weight assertion
    # (train_engine.py:62-64; v0.3.4 fsdp_engine.py:397), declared as for agg-token-mean.
    "value-loss": dict(
        kind="value-loss",
        variant={"clip": 0.5, "half": True, "mode": "token-mean"},
        masked_zero=True,  # torch.where(loss_mask, value_loss, 0) (functional.py:773 at 1.0.4)
        masked_zero_why="",
        whitening=None,
        documented_errors=(r"AssertionError",),
        domain=Domain(
            dtypes=("float32", "bfloat16", "float16"),
            why={
                "dtypes": "ppo_critic_loss_fn asserts float32 inputs (1.0.4 areal/utils/functional/functional.py:"
                "740-742) and the critic's ppo_loss_fn casts them with .float() (1.0.4 areal/trainer/ppo/critic.py:"
                "112-114): the loss runs in float32 whatever the critic's dtype",
            },
        ),
        promises=LOSS_PROMISES,
        pipeline=None,  # not researched as a Domain: every finding is reach api
        pipeline_by_pin={},
        options=VALUE_OPTIONS,
        truncation=None,
    ),
    # ppo_actor_loss_fn (1.0.4 areal/utils/functional/functional.py:429-559; git 4aef98d8 the same lines; git main
    # cbff54d64 :452-590; v0.3.4 areal/utils/functional.py:141-200) as grpo_loss_fn calls it (1.0.4
    # areal/trainer/ppo/actor.py:468-479): ratio = where(loss_mask, exp(logp - prox_logp), 0) (:509), clamp to
    # [1 - eps_clip, 1 + (eps_clip_higher or eps_clip)] (:516-520), max(-A r, -A clip(r)) (:522-525), dual clip
    # min(., sign(A) c_clip A) only when c_clip is set (:526-532), the micro-batch token mean
    # where(loss_mask, pg_loss, 0).sum() / (count_nonzero or 1) (:483, :542), scaled by the engine's
    # count_nonzero weights as agg-token-mean (calls_kinds.load_policy). Defaults (PPOActorConfig, 1.0.4
    # areal/api/cli_args.py:1460-1475; git 4aef98d8 :1396-1411; git main :1683-1698): eps_clip 0.2,
    # eps_clip_higher None (= eps_clip), c_clip None (no dual clip). use_decoupled_loss False (1.0.4 :1549-1554):
    # prox_logp = old_logp (actor.py:187-191), so the ratio is exp(logp - old_logp).
    "policy-loss": dict(
        kind="policy-loss",
        # clip_high None: eps_clip_higher None, "use eps_clip" (functional.py:519), also under actor.eps_clip
        variant={"clip_low": 0.2, "clip_high": None, "dual_clip": None, "advantages": "token", "mode": "token-mean"},
        masked_zero=True,  # torch.where(loss_mask, pg_loss, 0) (functional.py:542 at 1.0.4)
        masked_zero_why="",
        whitening=None,
        documented_errors=(r"AssertionError",),  # the engine's total weight > 0 check, as agg-token-mean
        domain=Domain(why={}),
        promises=LOSS_PROMISES,
        pipeline=None,  # not researched as a Domain: every finding is reach api
        pipeline_by_pin={},
        options=POLICY_OPTIONS,
        truncation=None,
    ),
}
# ---- KL in the reward (`oracles.kinds.gae.kl_reward`): `default-kl` is the GAE entry with real log-probs. The method
# makes
# every token reward itself: `ref_logp *= loss_mask; old_logp *= loss_mask` (1.0.4 areal/trainer/ppo/actor.py:195-196;
# git 4aef98d8 the same lines; git main cbff54d64 :246-247; v0.3.4 areal/engine/ppo/actor.py:108-109), then
# `rewards = -self.kl_ctl * self.kl_estimator(old_logp, ref_logp)` (1.0.4 :202; cbff54d64 :253; v0.3.4 :115), old_logp
# the rollout log-probs rolled by -1 (:188). kl_ctl = config.kl_ctl, default 0.1, kl_estimator = KLEstimator(
# config.kl_estimator), default "k1" (actor.py:52-53, cli_args.py:1522-1525 at 1.0.4; 4aef98d8 cli_args.py:1458-1461;
# v0.3.4 engine/ppo/actor.py:35-36, cli_args.py:379-382). KLEstimator("k1"): log_probs.float() - log_probs_base.float()
# (1.0.4 areal/utils/data.py:1635-1636), then apply_clamp (default True, :1603) clamps the estimate to [-10, 10]
# (:1655; 4aef98d8 :1655; cbff54d64 :1697; v0.3.4 :1363).
KL_VARIANT = {"kl_reward": {"coef": KL_CTL, "estimator": "k1", "clamp_d": None, "clamp": (-10.0, 10.0)}}
_KL_LINES = {  # pin: (file, kl reward line, the mask products)
    None: ("areal/trainer/ppo/actor.py", "202", "195-196"),
    "b0ebd07b61d01122cf21579295c61863c969d3b1": ("areal/engine/ppo/actor.py", "115", "108-109"),
}


def kl_reward_domain(base: Domain, pin: str | None, pipeline: bool = True) -> Domain:
    """`base` for `default-kl`: no token reward but the KL one; in a pipeline domain masked log-probs are real
    log-probs (self-evident), the api domain keeps them any number."""
    rel, line, mask = _KL_LINES.get(pin, _KL_LINES[None])
    at = "v0.3.4: " if pin else "1.0.4 / git 4aef98d8: "
    why = {
        **base.why,
        "token_rewards": f"{at}{rel}:{line} rewards = -self.kl_ctl * self.kl_estimator(old_logp, ref_logp) is "
        f"the only token reward (log-probs * loss_mask first, :{mask}); the score joins at seqlens - 2",
    }
    if not pipeline:
        return dataclasses.replace(base, token_rewards=False, why=why)
    why["masked_logprobs"] = "logprobs / ref_logp are log-probs of the sampled tokens at every position"
    return dataclasses.replace(base, token_rewards=False, masked_logprobs=False, why=why)


_KIND_OVERRIDES["default-kl"] = dict(
    kind="gae",
    variant=dict(KL_VARIANT),
    promises=GAE_PROMISES,
    domain=kl_reward_domain(SPEC.domain, None, pipeline=False),
    pipeline=kl_reward_domain(SPEC.pipeline, None),
    pipeline_by_pin={pin: kl_reward_domain(dom, pin) for pin, dom in SPEC.pipeline_by_pin.items()},
)
SPEC = dataclasses.replace(
    SPEC,
    entries=("default", *_KIND_OVERRIDES),
    entry_overrides={"default": dict(promises=GAE_PROMISES), **_KIND_OVERRIDES},
)

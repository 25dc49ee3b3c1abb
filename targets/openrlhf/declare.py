"""Adapter for OpenRLHF: `openrlhf/trainer/ppo_utils/experience_maker.py::get_advantages_and_returns`.

`get_advantages_and_returns(self, values, rewards, action_mask, gamma, lambd)` is a method of the
experience maker (`NaiveExperienceMaker` in 0.3.6-0.6.2, `RemoteExperienceMaker` from 0.6.3) that never
uses `self` on padded [B, T] tensors (only its packed-list branch, 0.5-0.6, recurses through it),
so the adapter calls it unbound with `self=None`. It multiplies values and rewards by the action
mask and runs a plain GAE loop over every position of the window: the `dense` contract. It does not
whiten (the experience maker whitens afterwards, over all experiences) and does not mask its
outputs.

Score placement is OpenRLHF's own `openrlhf/models/utils.py::compute_reward`: the score goes to
`eos_indices = T - 1 - action_mask.fliplr().argmax(1)`, the last action-mask token (T - 1 for a row
without action tokens). The adapter runs it with a marker score of 1.0 and zero KL to learn the
position and puts the case's score there in the case's dtype, because compute_reward also clips the
score (up to 0.4.x: `r.clamp(-10, 10)`; from 0.5.0: optional `reward_clip_range`) and, up to 0.4.x, computes the KL
term from two log-prob tensors: neither is masking behaviour, and both would blur the comparison.

Pipeline domain. At 0.3.6.post1 and 0.6.3 the response window comes from `Actor.process_sequences`:
the action mask marks actions whose state token is neither EOS nor pad and forces position 0 on, and
the response is right-padded, so no row is left-padded, starts masked or is empty (the packed path of
0.6.3 passes no mask at all). The KL term is multiplied by the action mask before it enters the
reward and the score sits on the last action token, so token rewards under the mask are 0. Critic
values under the mask are raw critic outputs (the function masks them itself). Gaps and a masked
real tail stay possible there only through a pad or EOS id sampled mid-response (the mask is built
per token). From 0.6.3 the log-probs are float32 and the reward tensor float32, so the loop runs in
float32 (bf16 critic values are promoted). At 0.11.2 the window is the whole sample from its second
token (`action_mask[1:]` over prompt + actions + environment feedback, right-padded): prompt tokens
lead every row, multi-turn agents give gaps and an observation tail; critic values and action
log-probs are multiplied by the action mask in the models, so values and KL rewards under the mask
are 0. Values come from a linear value head and the KL from float32 log-prob differences (clamped to
[-10, 10] at 0.11.2): nothing non-finite reaches the masked positions. Every restriction cites its line
in `pipeline` / `pipeline_by_pin`.

Options and truncated rows (`_OPT_*`, `_TRUNC_*` below; docs/kinds/openrlhf.md "Options and truncation"):
`reward.clip_range` c reaches the framework as compute_reward(reward_clip_range=(-c, c)), which then places
the clamped score; `reward.stop_properly_penalty_coef` as OpenRLHF's own apply_length_penalties on the
score with the case's truncated rows (Experience.truncated). A cut row is otherwise treated as ended (zero
value after the window). Neither option exists at 0.3.6.post1 (nor the penalty at 0.6.3): a non-default
value there raises `OptionNotAtPin`, a documented error.
"""

from __future__ import annotations

import dataclasses

from maskfuzz.oracles.domain import Domain
from maskfuzz.oracles.promises import Promise
from maskfuzz.oracles.whitening import Whitening
from maskfuzz.targets.openrlhf.calls import CLIP_RANGE, STOP_OFF, STOP_PROPERLY
from maskfuzz.targets.openrlhf.calls_kinds import DUAL_CLIP, LOSS_AGG_MODE, VALUE_CLIP
from maskfuzz.targets.openrlhf.declare_token_reward import token_reward_entry
from maskfuzz.targets.registry import COMMON_HEAVY, Option, Pin, TargetSpec, Truncation

# ---- options and truncated rows (oracles/options.py); lines at 0.11.2 inside the wheel -------------------------
CLIP_DEFAULT = 10.0  # --reward.clip_range -10 10 (cli/train_ppo_ray.py:474)

_OPTION_ERRORS = (r"OptionNotAtPin",)
_OPT_CLIP = Option(
    CLIP_RANGE,
    (CLIP_DEFAULT, 1.0),
    CLIP_DEFAULT,
    "0.11.2: openrlhf/models/utils.py:141-142 (read at openrlhf/trainer/ppo_utils/experience_maker.py:289; "
    "--reward.clip_range -10 10 at openrlhf/cli/train_ppo_ray.py:474)",
    "value c is --reward.clip_range -c c: compute_reward clamps the outcome reward r to the range before placing it "
    "at the last action token. The default (10) is not applied by the adapter (the clip range is opened wide): "
    "the core cannot declare a score map for the default configuration and fuzzed scores exceed 10.",
    effect={1.0: {"score_map": (("clip", 1.0),)}},
)
_OPT_STOP = Option(
    STOP_PROPERLY,
    (STOP_OFF, 0.0),
    STOP_OFF,
    "0.11.2: openrlhf/trainer/ppo_utils/length_penalty.py:140-144,97-103 (called from "
    "openrlhf/trainer/ppo_utils/experience_maker.py:247; flag set from finish_reason == 'length' at "
    "openrlhf/trainer/ppo_utils/samples_generator.py:278,307)",
    "ProRL stop-properly penalty: the reward of a truncated sample is scaled by the coefficient (0 drops it); "
    "1.0 stands for the CLI default None (off). Negative values (a fixed reward) and 0 < c < 1 are not modelled.",
    effect={0.0: {"truncation": {"score": "zero"}}},
)
_OPT_VALUE_CLIP = Option(
    VALUE_CLIP,
    (0.5, 0.2, 5.0),
    0.5,
    "0.11.2: openrlhf/cli/train_ppo_ray.py:409 (default 0.5), openrlhf/trainer/ray/ppo_critic.py:257,60 "
    "ValueLoss(value_clip), openrlhf/models/loss.py:282-284",
    "PPO value clip range: v_clipped = old + clamp(v - old, -c, c), loss max((v_clipped - R)^2, (v - R)^2) / 2",
    effect={0.2: {"variant": {"clip": 0.2}}, 5.0: {"variant": {"clip": 5.0}}},
)
# a cut row (finish_reason == "length") is treated as ended unless the stop-properly penalty is on
_TRUNC_GAE = Truncation(
    cite="0.11.2: openrlhf/trainer/ppo_utils/experience_maker.py:377,381 values = action_mask * values and "
    "nextvalues = 0.0 after the window: V after a cut row's last action token is 0 (no bootstrap); "
    "openrlhf/models/utils.py:154-155 the reward goes to the last action token, EOS or not; the truncated flag "
    "is read only by the stop-properly penalty (openrlhf/trainer/ppo_utils/length_penalty.py:140)"
)
_TRUNC_OUTCOME = Truncation(
    cite="0.11.2: openrlhf/trainer/ppo_utils/experience_maker.py:410,418 get_cumulative_returns starts from a "
    "zero return after the window (no bootstrap); openrlhf/models/utils.py:154-155 the reward goes to the last "
    "action token; the truncated flag is read only by the stop-properly penalty "
    "(openrlhf/trainer/ppo_utils/length_penalty.py:140)"
)

# The pipeline domain at each pin (module docstring, "Pipeline domain"). Paths are inside the release wheel.
_FINITE_036 = (
    "0.3.6.post1: openrlhf/models/model.py:258-268 values are the critic's linear value head, unmasked and "
    "finite; openrlhf/models/utils.py:25-26,39-42 rewards are a log-prob difference times the action mask "
    "plus the score clamped to [-10, 10]"
)
_PIPELINE_036 = Domain(
    leading_mask=False,
    truncated_padded=False,
    left_padding=False,
    all_masked_rows=False,
    masked_rewards=False,
    nonfinite_poison=False,
    why={
        "leading_mask": "0.3.6.post1: openrlhf/models/actor.py:163-165 action_mask[:, 0] = 1 (the first action "
        "always counts)",
        "left_padding": "0.3.6.post1: openrlhf/trainer/ppo_utils/experience_maker.py:364-387 responses are "
        "right-padded; openrlhf/models/actor.py:165 position 0 is always an action",
        "all_masked_rows": "0.3.6.post1: openrlhf/models/actor.py:165 action_mask[:, 0] = 1, so every row has an "
        "action (HF path: openrlhf/models/actor.py:139 uses the same process_sequences)",
        "masked_rewards": "0.3.6.post1: openrlhf/models/utils.py:25-26 kl = log_ratio * action_mask; "
        "openrlhf/models/utils.py:53-56 the score goes to the last action-mask token",
        "nonfinite_poison": _FINITE_036,
        "truncated_padded": "0.3.6.post1: openrlhf/trainer/ppo_utils/experience_maker.py:370-383 responses are "
        "right-padded to the longest output of the batch; a row cut by max_new_tokens is the longest, so no padding "
        "follows it",
    },
    # what OpenRLHF's own code builds at this pin (issue 24); not cited: dtypes (the models' own, not researched:
    # float32 witnesses only) and empty rows (action_mask[:, 0] = 1 gives every row an action)
    produces={
        "gaps": "0.3.6.post1: openrlhf/models/actor.py:164 action_mask = state_seq.ne(eos_token_id) & "
        "state_seq.ne(pad_token_id), token by token: a pad (or eos) id sampled inside a response masks the action "
        "after it while the response goes on (generation stops at eos only)",
        "masked_real_tail": "0.3.6.post1: openrlhf/models/actor.py:164 the same per-token mask: a pad id sampled right "
        "before the final EOS masks that EOS action, so the row ends on a masked real token",
        "token_rewards": "0.3.6.post1: openrlhf/models/utils.py:39-40 kl = (log_probs - log_probs_base) * action_mask, "
        "kl_reward = -kl_coef * kl: a KL reward at every action token",
        "masked_values": "0.3.6.post1: openrlhf/models/model.py:258-268 the critic's value head at every position, "
        "not masked (get_advantages_and_returns multiplies them by the mask, "
        "openrlhf/trainer/ppo_utils/experience_maker.py:206)",
        "truncated_rows": "0.3.6.post1: openrlhf/trainer/ppo_utils/experience_maker.py:350 max_tokens = "
        "max_new_tokens: a response that reaches it has no EOS",
    },
)
_PIPELINE_063 = Domain(
    dtypes=("float32",),
    leading_mask=False,
    truncated_padded=False,
    left_padding=False,
    all_masked_rows=False,
    masked_rewards=False,
    nonfinite_poison=False,
    why={
        "dtypes": "0.6.3: openrlhf/models/actor.py:226 logits to float32, openrlhf/models/utils.py:24,77 "
        "kl = log_probs.float() - ... and the reward is zeros_like(kl): rewards are float32, so "
        "openrlhf/trainer/ppo_utils/experience_maker.py:626-635 runs in float32 (bf16 values promoted)",
        "leading_mask": "0.6.3: openrlhf/models/actor.py:191-193 action_mask[:, 0] = 1; packed samples "
        "(openrlhf/trainer/ppo_utils/experience_maker.py:874) pass no mask",
        "left_padding": "0.6.3: openrlhf/trainer/ppo_utils/experience_maker.py:792-812 responses are "
        "right-padded; openrlhf/models/actor.py:193 position 0 is always an action",
        "all_masked_rows": "0.6.3: openrlhf/models/actor.py:193 action_mask[:, 0] = 1; packed: "
        "openrlhf/trainer/ppo_utils/experience_maker.py:858 num_actions = max(1, output_len)",
        "masked_rewards": "0.6.3: openrlhf/trainer/ppo_utils/experience_maker.py:415-420 with "
        "openrlhf/models/utils.py:23-47 the log ratio is multiplied by action_mask before k1/k2/k3 (all 0 there); "
        "openrlhf/models/utils.py:76-79 the score goes to the last action-mask token",
        "nonfinite_poison": "0.6.3: openrlhf/models/model.py:289-303 values are the critic's linear value head "
        "(finite); openrlhf/models/utils.py:23-47 rewards are a masked float32 log-prob difference",
        "truncated_padded": "0.6.3: openrlhf/trainer/ppo_utils/experience_maker.py:798-812 responses are "
        "right-padded to the longest output of the batch; a row cut by max_new_tokens is the longest, so no padding "
        "follows it",
    },
    # what OpenRLHF's own code builds at this pin (issue 24); not cited: empty rows (action_mask[:, 0] = 1)
    produces={
        "gaps": "0.6.3: openrlhf/models/actor.py:192 action_mask = state_seq.ne(eos_token_id) & "
        "state_seq.ne(pad_token_id), token by token: a pad (or eos) id sampled inside a response masks the action "
        "after it while the response goes on (generation stops at eos only)",
        "masked_real_tail": "0.6.3: openrlhf/models/actor.py:192 the same per-token mask: a pad id sampled right "
        "before the final EOS masks that EOS action, so the row ends on a masked real token",
        "token_rewards": "0.6.3: openrlhf/models/utils.py:23-26 k1 = log_ratio * action_mask (k2 / k3 :33-46) and "
        ":66 kl_reward = -kl_coef * kl: a KL reward at every action token",
        "masked_values": "0.6.3: openrlhf/models/model.py:289-303 the critic's value head at every position, not "
        "masked (get_advantages_and_returns multiplies them by the mask, "
        "openrlhf/trainer/ppo_utils/experience_maker.py:626)",
        "truncated_rows": "0.6.3: openrlhf/trainer/ppo_utils/experience_maker.py:747 max_tokens = max_new_tokens: a "
        "response that reaches it has no EOS",
    },
)
# What OpenRLHF 0.11.2's own rollout builds (issue 24), shared by every entry whose window is the experience's action
# mask: the window is the sample from its second token (prompt tokens lead it, masked), a multi-turn agent appends
# the environment's feedback between actions and after the last one (utils/agent.py), the KL reward sits on every
# action token, a vLLM "length" finish marks a cut row, and right padding follows a shorter sample. Not cited:
# all-masked and empty rows (the agent keeps room for at least one generated token, utils/agent.py:61-75, 94-97, and
# the window is cut to the same max_len it budgets, samples_generator.py:245/261-263, so an action span is never cut
# away), dtypes other than float32 (narrowed), uneven micro-batches (the adapters run the default loader's path).
_AGENT = "0.11.2: openrlhf/utils/agent.py"
_SG = "0.11.2: openrlhf/trainer/ppo_utils/samples_generator.py"
_PRODUCES_0112 = {
    "gaps": f"{_AGENT}:108-111 each action's token range, :154 observation + action + environment feedback: the "
    f"feedback tokens sit between two actions, outside every range ({_SG}:257-258 action_mask[start:end] = 1)",
    "masked_real_tail": f"{_AGENT}:154 the environment feedback of the last step is appended before the loop ends "
    f"(:168-169 if done: break): the sample ends on masked feedback tokens ({_SG}:257-258)",
    "leading_mask": f"{_SG}:253-263 action_mask = zeros over the whole observation, 1 on the action ranges only, "
    "then [1:truncate_length]: the prompt tokens lead every row masked",
    "token_rewards": "0.11.2: openrlhf/models/utils.py:144 kl_reward = -kl_coef * kl on the KL of every action token "
    "(openrlhf/trainer/ppo_utils/experience_maker.py:205-210 compute_approx_kl, :284-290 compute_reward)",
    "truncated_rows": f"{_AGENT}:106 is_truncated = finish_reason == 'length' ({_SG}:278, 307 Experience.truncated)",
    "truncated_padded": "0.11.2: openrlhf/trainer/ppo_utils/experience.py:113 zero_pad_sequences(..., side='right'): "
    "a cut sample shorter than the longest of the batch is followed by padding",
}
_PIPELINE_0112 = Domain(
    dtypes=("float32",),
    left_padding=False,
    masked_rewards=False,
    masked_values=False,
    nonfinite_poison=False,
    why={
        "dtypes": "0.11.2: openrlhf/models/actor.py:267 logits to float32; openrlhf/models/utils.py:93 "
        "log_ratio in float32; openrlhf/models/model.py:312 values * action_mask.float() is float32; "
        "openrlhf/trainer/ppo_utils/experience_maker.py:244 rewards promoted to at least float32",
        "left_padding": "0.11.2: openrlhf/trainer/ppo_utils/samples_generator.py:253-263 the window is the "
        "sample from its second token; openrlhf/trainer/ppo_utils/experience.py:113 batches are right-padded",
        "masked_rewards": "0.11.2: openrlhf/models/actor.py:298 action log-probs (actor and reference) times "
        "action_mask, so openrlhf/models/utils.py:93-113 gives kl 0 there for k1/k2/k3; "
        "openrlhf/models/utils.py:154-157 the score goes to the last action-mask token",
        "masked_values": "0.11.2: openrlhf/models/model.py:312 action_values = values[...] * action_mask.float()",
        "nonfinite_poison": "0.11.2: openrlhf/models/model.py:302-312 values are the critic's linear value head "
        "(finite) times the mask; openrlhf/models/utils.py:93-113 the KL is a float32 log-prob difference "
        "clamped to [-10, 10]",
    },
    produces=_PRODUCES_0112,
)

# ---- OpenRLHF's own words (issue 24): the promises beyond the universal invariants, each at the pins whose file
# says it (paths inside the release wheel = the repository's)
_GAE_DOC = (
    "Function that computes advantages and returns from rewards and values. Calculated as in the original PPO paper: "
    "https://arxiv.org/abs/1707.06347 Note that rewards may include a KL divergence loss term. Advantages looks like "
    "this: Adv1 =  R1 + γ * λ * R2     + γ^2 * λ^2 * R3       + ... - V1 + γ * (1 - λ) V2 + γ^2 * λ * (1 - λ) V3 + "
    "... Returns looks like this: Ret1 =  R1 + γ * λ * R2     + γ^2 * λ^2 * R3       + ... + γ * (1 - λ) V2 + γ^2 * "
    "λ * (1 - λ) V3 + ..."
)
_EMF = "openrlhf/trainer/ppo_utils/experience_maker.py"
GAE_PROMISES = tuple(
    Promise(
        id=f"upstream:{_EMF}:{lines}",
        text=_GAE_DOC,
        covers=("reference", "telescoping"),
        note="get_advantages_and_returns' docstring: GAE over every position of the window it is given, the rewards "
        "and values it masks (values = action_mask * values) as zero transitions: the dense recursion",
        pins=(pin,),
    )
    for pin, lines in (("0.3.6.post1", "181-191"), ("0.6.3", "589-599"), ("0.11.2", "351-361"))
)
# ReplayBuffer.normalize, the consumer of get_advantages_and_returns' output at 0.3.6.post1 (called at
# trainer/ppo_trainer.py:187) and 0.6.3 (trainer/ray/ppo_actor.py:213): the whitening mean sums every advantage
# of every item, masked positions included, over the action-token count (remove_padding_in_sequences cuts only as
# many trailing positions as the item has masked ones, replay_buffer.py:116-117 at 0.3.6.post1, so a gap's
# advantage stays in the item)
MASKED_ZERO_PROMISES = (
    Promise(
        id="upstream:openrlhf/trainer/ppo_utils/replay_buffer.py:200-207",
        text="items_vector = torch.cat(items).float().flatten() [...] sum_and_count = "
        "torch.tensor([items_vector.sum(), action_masks_vector.sum()], device=items_vector.device) [...] mean = "
        "all_sum / all_count",
        covers=("masked-zero",),
        note="ReplayBuffer.normalize (called at openrlhf/trainer/ppo_trainer.py:187) reads the advantages at masked "
        "positions without masking: the whitening mean of every advantage of the batch moves with them",
        pins=("0.3.6.post1",),
    ),
    Promise(
        id="upstream:openrlhf/trainer/ppo_utils/replay_buffer.py:223-237",
        text="items_vector = torch.cat(items).float().flatten() [...] sum_and_count = "
        "torch.tensor([items_vector.sum(), num_actions], device=items_vector.device) [...] mean = all_sum / all_count",
        covers=("masked-zero",),
        note="ReplayBuffer.normalize (called at openrlhf/trainer/ray/ppo_actor.py:213) reads the advantages at masked "
        "positions without masking: the whitening mean of every advantage of the batch moves with them",
        pins=("0.6.3",),
    ),
)
# compute_approx_kl's docstring (0.11.2 models/utils.py:77-78, 87): Schulman's estimators
KL_PROMISES = (
    Promise(
        id="upstream:openrlhf/models/utils.py:77-87",
        text="Compute the approximate KL divergence between two distributions. Schulman blog: "
        "http://joschu.net/blog/kl-approx.html [...] kl_estimator: k1 / k2 / k3 (Schulman). Selects the forward value.",
        covers=("reference",),
        note="the estimator the entry names, of Schulman's note (the declared clamps are the code's, :108, :113)",
        pins=("0.11.2",),
    ),
)
# aggregate_loss' docstring (0.11.2 models/loss.py:19-27) and the step normalisers' (utils/loss_utils.py:81-89)
AGG_PROMISES = (
    Promise(
        id="upstream:openrlhf/models/loss.py:19-27",
        text="- ``token_level_loss=True``  -> per-token: masked-sum / global token count. - ``token_level_loss=False`` "
        "-> per-sample: sum of per-sequence token-means / global sample count. ``batch_num_tokens`` (token mode) and "
        "``global_batch_size`` (sample mode) carry the *global* batch totals so the loss is invariant to "
        "data-parallel sharding; ``dp_size`` compensates for the gradient averaging that DeepSpeed/DDP applies "
        "across DP ranks.",
        covers=("reference", "split-invariance"),
        note="aggregate_loss: the global token mean / the mean of non-empty rows' token means (seq_mask, :36 "
        '"exclude fully masked sequences"), whatever the sharding',
        pins=("0.11.2",),
    ),
    Promise(
        id="upstream:openrlhf/utils/loss_utils.py:81-89",
        text="We group ``data_iter`` into windows of gas micro-batches (feed order matches DeepSpeed's accumulation "
        "boundaries) and give every micro-batch in a window the same global normalizers, so the loss is one mean over "
        "the whole step rather than a mean of per-micro-batch means (which differ when micro-batch token counts are "
        "uneven).",
        covers=("split-invariance",),
        note="iter_grad_accum_global_norm, which the actor and the critic drive their micro-batches with "
        "(trainer/ray/ppo_actor.py:186-189)",
        pins=("0.11.2",),
    ),
)
POLICY_PROMISES = AGG_PROMISES + (
    Promise(
        id="upstream:openrlhf/cli/train_ppo_ray.py:445-446",
        text="Policy-loss aggregation: token-mean (global token mean) or seq-mean-token-mean (every sequence weighs "
        "the same).",
        covers=("reference",),
        note="--actor.loss_agg_mode's help: the aggregation of the policy loss",
        pins=("0.11.2",),
    ),
)


# ---- entries beyond GAE (targets/openrlhf/calls_kinds.py); lines are at 0.11.2 ----------------------
_EM = "0.11.2: openrlhf/trainer/ppo_utils/experience_maker.py"
_UT = "0.11.2: openrlhf/models/utils.py"
_FP32_KL = f"{_UT}:93 log_ratio = log_probs.float() - ...; {_UT}:155 the shaped reward is cast to kl.dtype (float32)"
_NO_LEFT_PAD = (
    "0.11.2: openrlhf/trainer/ppo_utils/samples_generator.py:253-263 the window is the sample from its second "
    "token; openrlhf/trainer/ppo_utils/experience.py:113 batches are right-padded"
)
_LOGP_MASKED = (
    "0.11.2: openrlhf/models/actor.py:298 action log-probs (actor and reference) are multiplied by the action "
    "mask, so the KL under the mask is 0 and finite"
)
_PIPELINE_GROUP = Domain(
    dtypes=("float32",),
    left_padding=False,
    masked_rewards=False,
    nonfinite_poison=False,
    why={
        "dtypes": _FP32_KL,
        "left_padding": _NO_LEFT_PAD,
        "masked_rewards": _LOGP_MASKED + f" ({_UT}:93-113 k1/k2/k3 of 0 - 0 is 0)",
        "nonfinite_poison": _LOGP_MASKED,
    },
    produces=_PRODUCES_0112,  # the window of the GAE entry at 0.11.2: the same experiences
)
_PIPELINE_LOGP = Domain(
    dtypes=("float32",),
    left_padding=False,
    nonfinite_poison=False,
    why={
        "dtypes": "0.11.2: openrlhf/models/actor.py:267 logits to float32, so action log-probs are float32",
        "left_padding": _NO_LEFT_PAD,
        "nonfinite_poison": _LOGP_MASKED,
    },
    # the action mask the KL is read under (masked_mean) or later multiplied by: the experiences' window
    produces={k: _PRODUCES_0112[k] for k in ("gaps", "masked_real_tail", "leading_mask")},
)
_NOT_MASKED = (
    f"{_EM}:390-421 get_cumulative_returns masks the rewards, not its output: a masked position before the last "
    "action token (prompt / observation tokens of the window) carries the later return, and the trainer uses it "
    f"as the advantage ({_EM}:317)"
)
_GROUP_ERRORS = (r"GroupShapeError",)
_GROUP_NOTE = (
    "OpenRLHF has no group ids: rewards are scattered to prompt order by experience.index and reshaped to "
    "(-1, n_samples_per_prompt) (experience_maker.py:252-256); the adapter numbers each group's rows in order of "
    "appearance, and unequal group sizes or n == 1 (asserted away by cli/train_ppo_ray.py:656-659) are a "
    "documented GroupShapeError."
)


def _group_entry(variant: dict) -> dict:
    return dict(
        kind="group-advantage",
        # experience_maker.py:256-274 the group statistics read the rewards alone, reshaped (-1, n_samples_per_prompt):
        # a sample without an action token is a sample of its group by design
        variant={**variant, "empty_rows": "counted"},
        # OpenRLHF states no formula for its group estimators (cli/train_ppo_ray.py:514-520 only names them)
        promises=(),
        domain=Domain(),
        pipeline=_PIPELINE_GROUP,
        pipeline_by_pin={},
        masked_zero=False,
        masked_zero_why=_NOT_MASKED,
        documented_errors=_GROUP_ERRORS + _OPTION_ERRORS,
        whitening=None,
        notes=_GROUP_NOTE,
        # --reward.clip_range clamps the SHAPED reward (after the group baseline, experience_maker.py:258-289),
        # which no score map expresses: not declared (the adapter keeps it wide)
        options=(_OPT_STOP,),
        truncation=_TRUNC_OUTCOME,
    )


_NO_F64 = ("float16", "bfloat16", "float32")
_F32_WHY = (
    "compute_approx_kl computes in float32 by design (log_probs.float() - log_probs_base.float(), "
    "openrlhf/models/utils.py:93 at 0.11.2): a float64 case would be judged at float64 tolerance on float32 arithmetic"
)


def _kl_entry(variant: dict) -> dict:
    return dict(
        kind="kl",
        variant=variant,
        domain=Domain(dtypes=_NO_F64, why={"dtypes": _F32_WHY}),
        pipeline=_PIPELINE_LOGP,
        pipeline_by_pin={},
        masked_zero=False,
        masked_zero_why=f"{_UT}:69-75 compute_approx_kl takes no mask; the loss / reward apply it later",
        whitening=None,
        notes="compute_approx_kl computes in float32 (log_probs.float(), utils.py:93) and clamps every estimate.",
        options=(),  # --algo.kl.estimator is the entry; unbiased_gradient changes the gradient only (utils.py:115)
        truncation=None,
        promises=KL_PROMISES,
    )


_CLAMP10 = (-10.0, 10.0)
ENTRY_OVERRIDES = {
    # experience_maker.py:273-274: (r - mean_g) / (r.std(-1) + 1e-9), torch.std unbiased, eps outside the std
    "group_norm": _group_entry({"estimator": "grpo", "std": "unbiased", "eps": 1e-9}),
    # experience_maker.py:271-272: r - mean_g
    "dr_grpo": _group_entry({"estimator": "grpo", "std": None}),
    # experience_maker.py:268-270: r - (sum_g - r) / (n - 1)
    "rloo": _group_entry({"estimator": "rloo"}),
    # utils.py:98 k1 = log_ratio; utils.py:113 every estimate clamped to [-10, 10]
    "kl-k1": _kl_entry({"estimator": "k1", "clamp": _CLAMP10}),
    # utils.py:104 k2 = log_ratio**2 / 2; utils.py:113 clamp
    "kl-k2": _kl_entry({"estimator": "k2", "clamp": _CLAMP10}),
    # utils.py:108-109 log_ratio clamped at min -10 before exp(-lr) - 1 + lr; utils.py:113 clamp
    "kl-k3": _kl_entry({"estimator": "k3", "clamp_d": (-10.0, float("inf")), "clamp": _CLAMP10}),
    "masked_mean": dict(
        kind="normalization",
        # utils.py:199-202 (t * mask).sum(dim) / mask.sum(dim); called with dim=-1 (experience_maker.py:215-216)
        variant={"level": "row", "output": "mean"},
        domain=Domain(),
        pipeline=_PIPELINE_LOGP,
        pipeline_by_pin={},
        masked_zero=False,
        masked_zero_why=f"{_UT}:199-202 masked_mean returns one value per row; the adapter broadcasts it to the row",
        whitening=None,
        notes="masked_mean(kl, action_mask, dim=-1) as experience_maker.py:215 calls it.",
        options=(),
        truncation=None,
        promises=(),  # no docstring (utils.py:199-202)
    ),
    "reinforce": dict(
        kind="returns",
        contract="dense",
        # experience_maker.py:326-338: mean and var over all action tokens, var biased (/ num_actions), rstd =
        # var.clamp(min=1e-8).rsqrt() (a floor, not an added eps), advantages cast to float32 first (327)
        whitening=Whitening(unbiased=False, eps=1e-8, floor=True),
        domain=Domain(
            dtypes=_NO_F64,
            critic=False,
            why={
                "critic": f"{_EM}:305-317 reinforce takes no values",
                "dtypes": f"{_EM}:327 the whitening casts the advantages to float32 (.float()) by design: a float64 "
                "case would be judged at float64 tolerance on float32 statistics",
            },
        ),
        pipeline=dataclasses.replace(
            _PIPELINE_GROUP,
            critic=False,
            why={**_PIPELINE_GROUP.why, "critic": f"{_EM}:305-317 reinforce takes no critic values"},
        ),
        pipeline_by_pin={},
        masked_zero=False,
        masked_zero_why=f"{_EM}:338 the whitened advantages are not multiplied by the mask; " + _NOT_MASKED,
        notes="reinforce: compute_reward places the score at the last action token, get_cumulative_returns "
        "(dense: every position a transition), then the batch whitening of compute_advantages_and_returns.",
        documented_errors=_OPTION_ERRORS,
        # --algo.advantage.no_std_norm (experience_maker.py:331-335: rstd = 1, the mean still subtracted) is not
        # expressible by Whitening: not declared
        options=(_OPT_CLIP, _OPT_STOP),
        truncation=_TRUNC_OUTCOME,
        # get_cumulative_returns' docstring (experience_maker.py:396-407) names the returns, not the whitened
        # advantages the entry judges; the whitening has no words of its own
        promises=(),
    ),
}

# ---- loss-aggregation entries (calls_kinds.load_aggregate): models/loss.py::aggregate_loss at 0.11.2 ----------
_LS = "0.11.2: openrlhf/models/loss.py"
_PIPELINE_AGG = Domain(
    dtypes=("float32",),
    left_padding=False,
    nonfinite_poison=False,
    why={
        "dtypes": "0.11.2: openrlhf/models/actor.py:267 logits to float32, so the action log-probs and the "
        "PolicyLoss per-token loss (models/loss.py:116-248) that aggregate_loss receives are float32",
        "left_padding": _NO_LEFT_PAD,
        "nonfinite_poison": _LOGP_MASKED + "; the ratio there is exp(0) = 1 and the advantage a finite number, so "
        "the per-token loss under the mask is finite",
    },
    # the loss mask is the experience's action mask (trainer/ray/ppo_actor.py:186-189 lambda e: e.action_mask). Not
    # cited: uneven micro-batches (the default loader cuts equal ones, DataLoader(batch_size=sample_batch_size,
    # drop_last=True), trainer/ray/ppo_actor.py:163-170; dynamic batching, :155-156, builds uneven ones with the
    # replay buffer's own normalisers, a path the adapter does not run), an all-masked step (see _PRODUCES_0112)
    produces={k: _PRODUCES_0112[k] for k in ("gaps", "masked_real_tail", "leading_mask")},
)


def _agg_entry(mode: str, why: str) -> dict:
    return dict(
        kind="loss-aggregation",
        variant={"mode": mode},
        masked_zero=True,  # d/dl of (loss * loss_mask).sum() is the mask: 0 at masked positions
        masked_zero_why=f"{_LS}:32,35 every mode multiplies the loss by loss_mask before summing",
        documented_errors=(),
        whitening=None,
        domain=Domain(),
        pipeline=_PIPELINE_AGG,
        pipeline_by_pin={},
        notes=why,
        options=(),  # --actor.loss_agg_mode is the entry
        truncation=None,
        # the api domain keeps uneven micro-batches: OpenRLHF's normalisers are documented as the step's, whatever its
        # split (loss.py:19-27, loss_utils.py:81-89), and dynamic batching (ppo_actor.py:155-156) cuts uneven ones
        promises=AGG_PROMISES,
    )


ENTRY_OVERRIDES.update(
    {
        # loss.py:29-32: (loss * loss_mask).sum() / batch_num_tokens * dp_size, the step's action tokens
        # (loss_utils.py:72) as the trainer passes them; --actor.loss_agg_mode token-mean (cli/train_ppo_ray.py:441-444)
        "agg-token-mean": _agg_entry(
            "token-mean", "aggregate_loss(token_level_loss=True): the global token mean of the optimizer step"
        ),
        # loss.py:34-39: per-row token mean (count + 1e-8), rows without a token excluded (seq_mask, :36; the step's
        # global_batch_size counts non-empty rows, loss_utils.py:73): canonical empty_rows="excluded"
        "agg-seq-mean-token-mean": _agg_entry(
            "seq-mean-token-mean",
            "aggregate_loss(token_level_loss=False): mean over the step's non-empty rows of each row's token mean",
        ),
        # ValueLoss(clip_eps=--critic.value_clip 0.5, cli/train_ppo_ray.py:409; ppo_critic.py:60): 0.5 *
        # aggregate_loss(max((clip - R)^2, (v - R)^2), token level) (loss.py:262-298), the critic's own step normalisers
        # (ppo_critic.py:99-104 iter_grad_accum_global_norm, as the actor)
        "value-loss": {
            **_agg_entry("token-mean", "ValueLoss(0.5) with the step's global normalisers, / gas"),
            "kind": "value-loss",
            "variant": {"clip": 0.5, "mode": "token-mean"},
            "options": (_OPT_VALUE_CLIP,),
            "pipeline": None,  # the critic's inputs are not researched: every finding is reach: api
        },
    }
)

# ---- policy-loss (calls_kinds.load_policy): models/loss.py::PolicyLoss at 0.11.2 ------------------------------
_OPT_DUAL_CLIP = Option(
    DUAL_CLIP,
    (None, 3.0),
    None,
    "0.11.2: openrlhf/cli/train_ppo_ray.py:408 (default None), trainer/ray/ppo_actor.py:79 PolicyLoss(dual_clip), "
    "openrlhf/models/loss.py:203-212",
    "Dual-clip PPO: for a negative advantage the per-token loss is capped at -c A (max(min(surr1, surr2), c A))",
    effect={3.0: {"variant": {"dual_clip": 3.0}}},
)
_OPT_LOSS_AGG = Option(
    LOSS_AGG_MODE,
    ("token-mean", "seq-mean-token-mean"),
    "token-mean",
    "0.11.2: openrlhf/cli/train_ppo_ray.py:440-447 (default token-mean), trainer/ray/ppo_actor.py:80 "
    "token_level_loss = loss_agg_mode == 'token-mean', openrlhf/models/loss.py:29-39",
    "Policy-loss aggregation: the step's global token mean, or the mean over the step's non-empty rows of each row's "
    "token mean",
    effect={"seq-mean-token-mean": {"variant": {"mode": "seq-mean-token-mean"}}},
)
_PIPELINE_POLICY = Domain(
    dtypes=("float32",),
    left_padding=False,
    nonfinite_poison=False,
    masked_logprobs=False,
    why={
        "masked_logprobs": "action log-probs and the stored old ones are log-softmax outputs of the actor before and "
        "after an update, under the mask as elsewhere",
        "dtypes": "0.11.2: openrlhf/models/actor.py:267 logits to float32, so the action log-probs PolicyLoss gets "
        "(trainer/ray/ppo_actor.py:291-310) and the stored old log-probs are float32",
        "left_padding": _NO_LEFT_PAD,
        "nonfinite_poison": _LOGP_MASKED + " (old and current alike); the advantages under the mask are finite GAE / "
        "return outputs of finite rewards and values (see the GAE pipeline)",
    },
    produces=_PIPELINE_AGG.produces,  # the action mask of the experiences, as the aggregation entries
)
ENTRY_OVERRIDES["policy-loss"] = dict(
    kind="policy-loss",
    # PolicyLoss built at trainer/ray/ppo_actor.py:76-86: clip_eps_low / clip_eps_high = eps_clip_low_high, which is
    # (eps_clip, eps_clip) = (0.2, 0.2) unless set (cli/train_ppo_ray.py:406-407, :633-634); dual_clip None (:408);
    # token_level_loss from --actor.loss_agg_mode token-mean (:440-447); policy_loss_type ppo (:439); is_correction
    # off (:260-267). Per-token advantages (Experience.advantages, GAE / returns per action token).
    variant={"clip_low": 0.2, "clip_high": 0.2, "dual_clip": None, "advantages": "token", "mode": "token-mean"},
    # d/dlogp of (loss * loss_mask).sum() (models/loss.py:32, :35): 0 at masked positions (the log-ratio is clamped
    # to [-20, 20], loss.py:187, so the masked per-token loss is finite); NaN: poison-nonfinite
    masked_zero=True,
    masked_zero_why=f"{_LS}:249-256 PolicyLoss hands the per-token loss to aggregate_loss, which multiplies it by the "
    "action mask before summing (:32, :35)",
    documented_errors=(),
    whitening=None,
    domain=Domain(),
    pipeline=_PIPELINE_POLICY,
    pipeline_by_pin={},
    notes="PolicyLoss (ppo, clip 0.2 / 0.2, no dual clip, token-mean) with the step's global normalisers, / gas; "
    "log-ratio clamped to [-20, 20] before exp (models/loss.py:187)",
    options=(_OPT_DUAL_CLIP, _OPT_LOSS_AGG),
    truncation=None,
    promises=POLICY_PROMISES,
)


# ---- KL in the reward (calls_kinds.load_estimator / load_gae_kl; `oracles/kinds/gae/kl_reward.py`); lines at 0.11.2
# ------
# make_experience: kl = compute_approx_kl(action_log_probs, base_action_log_probs, kl_estimator=--algo.kl.estimator)
# (experience_maker.py:205-210; default k1, cli/train_ppo_ray.py:449-451): k1 = the log-ratio in float32
# (utils.py:93, 96), clamped to [-10, 10] (utils.py:113); compute_reward(r, kl_ctl.value, kl, action_mask, clip)
# (experience_maker.py:284-290): reward = r at the last action token - kl_coef * kl (utils.py:144-157), kl_coef =
# --algo.kl.init_coef 0.01 (cli/train_ppo_ray.py:438; ppo_trainer.py:176 FixedKLController(init_coef) without
# --algo.kl.target).
# 0.6.3: compute_approx_kl(..., action_mask, kl_estimator) multiplies the log-ratio by the mask and does not clamp
# (0.6.3 utils.py:23-48): another variant (clamp None), so the entries skip that pin (NotPresent, with the reason).
_KL_REWARD = {"coef": 0.01, "estimator": "k1", "clamp_d": None, "clamp": (-10.0, 10.0)}
_ONLY_KL = (
    f"{_UT}:144-157 compute_reward builds the per-token reward from the score at the last action token and "
    "-kl_coef * kl only: OpenRLHF has no other token reward (the adapter passes none)"
)
_LOGP_REAL = (
    "action_log_probs and base_action_log_probs are log-softmax outputs of the actor and of the initial model "
    "(0.11.2: openrlhf/models/actor.py:298 then multiplies them by the action mask, so 0 there)"
)


def _kl_pipeline(dom: Domain) -> Domain:
    why = {**dom.why, "masked_logprobs": _LOGP_REAL, "token_rewards": _ONLY_KL}
    return dataclasses.replace(dom, masked_logprobs=False, token_rewards=False, why=why)


ENTRY_OVERRIDES["reinforce-kl"] = {
    **ENTRY_OVERRIDES["reinforce"],
    "variant": {"kl_reward": _KL_REWARD},
    "domain": dataclasses.replace(
        ENTRY_OVERRIDES["reinforce"]["domain"],
        token_rewards=False,
        why={**ENTRY_OVERRIDES["reinforce"]["domain"].why, "token_rewards": _ONLY_KL},
    ),
    "pipeline": _kl_pipeline(ENTRY_OVERRIDES["reinforce"]["pipeline"]),
    "notes": "reinforce with the KL in the reward: compute_approx_kl (k1, clamped to [-10, 10]) as make_experience "
    "computes it, compute_reward with kl_coef 0.01 (--algo.kl.init_coef), get_cumulative_returns, the batch whitening.",
}
ENTRY_OVERRIDES["gae-kl"] = dict(
    kind="gae",
    contract="dense",
    variant={"kl_reward": _KL_REWARD},
    whitening=None,  # get_advantages_and_returns' own output, as the default entry (the batch whitening follows)
    masked_zero=True,
    masked_zero_why="",
    documented_errors=(),
    domain=Domain(
        dtypes=_NO_F64,
        token_rewards=False,
        why={"dtypes": _F32_WHY + " (compute_reward's reward is zeros_like(kl), float32)", "token_rewards": _ONLY_KL},
    ),
    pipeline=_kl_pipeline(_PIPELINE_0112),
    pipeline_by_pin={},
    notes="the default entry (get_advantages_and_returns, dense) after compute_approx_kl (k1) and compute_reward "
    "(kl_coef 0.01, the score at the last action token, clip range opened wide); skipped at 0.3.6.post1 (the KL is "
    "computed inside compute_reward) and 0.6.3 (no clamp of the estimate: another variant).",
    options=(),
    truncation=_TRUNC_GAE,
    promises=GAE_PROMISES,  # the default entry's function and its docstring (0.11.2)
)

ENTRY_OVERRIDES["token-reward"] = token_reward_entry(_PIPELINE_LOGP)  # compute_reward itself (declare_token_reward.py)


SPEC = TargetSpec(
    id="openrlhf",
    first_run=('default', 'group_norm', 'policy-loss'),
    adapter="maskfuzz.targets.openrlhf.calls",
    own=("openrlhf",),
    contract="dense",
    git_url="https://github.com/OpenRLHF/OpenRLHF.git",
    package="openrlhf",
    pins=(
        Pin("0.3.6.post1", "oldest release on PyPI (NaiveExperienceMaker; compute_reward clamps r to [-10, 10])"),
        Pin("0.6.3", "first release with the method on RemoteExperienceMaker (split from BaseExperienceMaker)"),
        Pin("0.11.2", "newest release", default=True),
    ),
    whitening=None,
    masked_zero=True,
    masked_zero_why="",
    documented_errors=_OPTION_ERRORS,
    options=(_OPT_CLIP, _OPT_STOP),
    truncation=_TRUNC_GAE,
    promises=GAE_PROMISES + MASKED_ZERO_PROMISES,
    # Missing packages imported at module level by OpenRLHF and never used by the GAE loop or by
    # compute_reward: bitsandbytes, loralib (0.3.x models), tqdm, requests (remote reward models),
    # pylatexenc (math grading), aiohttp (agent utils), torchdata (deepspeed utils, 0.11).
    stand_ins=COMMON_HEAVY + ("bitsandbytes", "loralib", "tqdm", "requests", "pylatexenc", "aiohttp", "torchdata"),
    notes=(
        "Contract: dense. The function masks values and rewards by multiplication (values = action_mask * values) "
        "and runs the plain loop over all T positions, so each non-action token is a zero-value, zero-reward "
        "transition; this is what OpenRLHF intends for multi-turn rollouts too (samples_generator.py builds "
        "action_mask from the action ranges, observation tokens between them are 0). The action mask is passed as a "
        "bool tensor, as Experience.action_mask is. Multiplying does not remove NaN (NaN * 0 = NaN). Outputs are "
        "not multiplied by the mask: advantages in gaps and before the first action token carry the later "
        "advantage; nothing in OpenRLHF documents that, so masked_zero stays promised."
    ),
    pipeline=_PIPELINE_0112,
    pipeline_by_pin={"0.3.6.post1": _PIPELINE_036, "0.6.3": _PIPELINE_063},
    entries=("default", *ENTRY_OVERRIDES),
    entry_overrides=ENTRY_OVERRIDES,
)


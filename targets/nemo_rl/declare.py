"""Adapter for NeMo-RL (github.com/NVIDIA-NeMo/RL, git only).

Target: `nemo_rl/algorithms/advantage_estimator.py::GeneralizedAdvantageEstimator.compute_advantage` (which calls
`_build_token_level_rewards` and `_compute_gae`), present since 857b11522 (2026-06-11, "PPO with MCore").

Why the source is executed rather than imported: importing `nemo_rl.algorithms.advantage_estimator` pulls in
`nemo_rl.algorithms.utils` -> `nemo_rl.models.policy` (asserts `transformers.__version__ < 5.12`) and
`nemo_rl.utils.logger` (`torch.utils.tensorboard` checks `tensorboard.__version__`), and declares pydantic models
with class keywords (`BaseModel, extra="allow"`). Inert stand-ins have no `__version__` and cannot be pydantic
bases, so the module cannot be imported without the real transformers, tensorboard and pydantic. The adapter
therefore compiles the estimator class from the pinned source file, plus exactly the helpers it uses
(`calculate_kl`, `masked_mean`, `masked_var` from `nemo_rl/algorithms/utils.py`), each with its real file name and
line numbers, with annotations dropped (`targets.adapters.extract.SourceTree`). Every other name the class reads
must be torch/numpy/stdlib; any other dependency fails the load loudly (BlockNotFound) instead of being guessed.

How a canonical case becomes NeMo-RL's inputs (the PPO loop in `nemo_rl/algorithms/ppo.py`):

    mask      [B, T]  the trainable mask: the loop passes `token_mask * sample_mask` over the whole flat sequence
                      (prompt, turns, padding); NeMo-RL has no separate attention input, so real and padding
                      non-trainable positions look the same to it
    values    [B, T]  the case's values; rewards [B] the score (placed by NeMo-RL on the last mask=1 token)
    logprobs  [B, T]  `-token_rewards / c`, reference_logprobs = 0, with `use_kl_in_reward=True`, k1 KL and
                      `reference_policy_kl_penalty = c`: NeMo-RL's only dense reward is `-c * kl`, which is then
                      exactly the canonical token reward. `calculate_kl` clamps at +-10, so `c` is the smallest
                      power of two (>= 1) keeping |r / c| <= 8 at trainable positions; powers of two keep it exact.
    estimator config as the framework's own unit tests build it (tests/unit/algorithms/test_ppo.py): gae_gamma,
    gae_lambda, normalize_advantages=False, no VAPO decoupling (gae_lambda_value/policy None, alpha 0).

Pipeline domain (`SPEC.pipeline`, the same facts at 7ea279abf and 857b11522; each reason cites both pins' lines).
The PPO loop (`nemo_rl/algorithms/ppo.py`, 7ea: 1464-1596, 857b: 1127-1250) gives the estimator the whole flat
sequence: `token_loss_mask` is 1 on assistant messages only, so prompt, tool/environment messages and padding are
masked; multi-turn rollouts (`max_rollout_turns`) make gaps, leading masks and observation tails; rows whose
`sample_mask` is 0 (overlong filtering; 7ea multiplies it into the mask) are all-masked. Values are the critic's at
every position (prompt positions included, not zeroed), and the KL term is computed at every position before
`token_level_rewards * mask`; `use_kl_in_reward` is a config option, so token and masked rewards stay permissive.
Narrowed: dtypes (rewards and values are float32, so the recursion runs in float32 or wider), left padding
(right-padded batches) and non-finite poison (critic values finite and zero-padded; logprobs finite or selected to
0 outside the mask under top-k/top-p; calculate_kl clamps +-inf, so only NaN logprobs could leak and none are made).
"""

from __future__ import annotations

import dataclasses

from maskfuzz.oracles.domain import Domain
from maskfuzz.oracles.promises import Promise
from maskfuzz.oracles.whitening import Whitening
from maskfuzz.targets.nemo_rl.calls import NORMALIZE, OVERLONG, PACKAGES
from maskfuzz.targets.nemo_rl.calls_kinds import (
    GRPO_OVERLONG,
    KL_IN_CLAMP,
    KL_OUT_CLAMP,
    KL_TYPE,
    NORMALIZE_REWARDS,
    RATIO_CLIP_C,
    TOKEN_LEVEL,
)
from maskfuzz.targets.registry import Option, Pin, TargetSpec, Truncation

# _reward_whiten: masked_mean, masked_var(unbiased=True) over the mask, (x - mean) * rsqrt(var + 1e-8)
# (nemo_rl/algorithms/advantage_estimator.py:345-358; nemo_rl/algorithms/utils.py:260-274)
WHITEN = Whitening(unbiased=True, eps=1e-8)
GAE_OPTIONS = (
    Option(
        NORMALIZE,
        (True, False),
        True,
        "nemo_rl/algorithms/advantage_estimator.py:332 (applied :493-494; default True nemo_rl/algorithms/ppo.py:202)",
        "normalize advantages globally across the batch (the whitening over the mask), then zero the masked positions",
        effect={False: {"whitening": None}},
    ),
    Option(
        OVERLONG,
        (False, True),
        False,
        "nemo_rl/algorithms/ppo.py:1464-1471 (857b: :1127-1134)",
        "a truncated sample's loss_multiplier (sample_mask) is set to 0: the row is dropped from training",
        effect={True: {"truncation": {"row": "masked"}}},
    ),
)

_PIPELINE_WHY = {
    "dtypes": "the GAE arithmetic is promoted to >= float32: token_level_rewards take rewards.dtype "
    "(nemo_rl/algorithms/advantage_estimator.py:383, 857b: :344) and total_reward is float32 "
    "(7ea: nemo_rl/experience/rollouts.py:872; 857b: nemo_rl/experience/rollouts.py:382); values are cast "
    "to float32 (7ea: nemo_rl/models/automodel/train.py:1091; 857b: "
    "nemo_rl/models/value/workers/megatron_value_worker.py:106-107); float64 kept (an env may return "
    "float64 rewards), half precision never reaches the recursion",
    "left_padding": "flat sequences are right-padded: 'Padding is always applied to the right side' "
    "(7ea: nemo_rl/data/llm_message_utils.py:269; 857b: nemo_rl/data/llm_message_utils.py:249) via "
    "pad_sequence (7ea: nemo_rl/distributed/batched_data_dict.py:323; 857b: :161)",
    "nonfinite_poison": "values are finite critic outputs, padding columns filled with 0.0 "
    "(7ea: nemo_rl/models/value/workers/dtensor_value_worker_v2.py:516-518; 857b: "
    "nemo_rl/models/value/workers/megatron_value_worker.py:861); prev_logprobs are full-vocab log_softmax "
    "zeroed past input_lengths (7ea: nemo_rl/models/automodel/train.py:789; 857b: :741) and, under "
    "top-k/top-p, -inf replaced by selection outside the mask (7ea: nemo_rl/algorithms/utils.py:254-255; "
    "857b: nemo_rl/algorithms/utils.py:237); reference logprobs use no top-k/top-p "
    "(7ea: nemo_rl/models/policy/workers/dtensor_policy_worker_v2.py:1034; 857b: :1017); "
    "calculate_kl clamps +-inf "
    "(7ea: nemo_rl/algorithms/utils.py:73-74, 98-99; 857b: nemo_rl/algorithms/utils.py:66, 81)",
}


def _pipeline(rev: str, ln: dict) -> Domain:
    """The PPO loop's inputs to the estimator at `rev` (`ln`: that pin's lines), every feature it builds cited in
    `produces` (`Domain.produces`): the flat sequence of every message with token_loss_mask 1 on assistant messages
    only, the environment's observation appended to every sample after each turn (so each ends on one), the
    critic's values at every position, the KL term at every position under use_kl_in_reward."""
    at = f"NeMo-RL {rev}: "
    loss_mask = f"nemo_rl/algorithms/ppo.py:{ln['tlm']} token_loss_mask 1 on assistant messages, 0 on every other"
    produces = {
        "leading_mask": f"{at}{loss_mask} (system / user prompt); nemo_rl/algorithms/ppo.py:{ln['flat']} "
        "batched_message_log_to_flat_message concatenates the message log from the prompt on",
        "masked_real_tail": f"{at}nemo_rl/experience/rollouts.py:{ln['obs']} run_multi_turn_rollout appends the "
        "environment's observation to every active sample's message log after each turn, done or not ('This must "
        f"happen BEFORE filtering based on done flags'); {loss_mask}",
        "gaps": f"{at}nemo_rl/experience/rollouts.py:{ln['turns']} turns continue for samples not done "
        f"(max_rollout_turns, passed at nemo_rl/algorithms/ppo.py:{ln['mrt']}): assistant, observation, assistant; "
        f"{loss_mask}",
        "masked_values": f"{at}nemo_rl/algorithms/ppo.py:{ln['values']} train_data['values'] = "
        "value_model.get_values(train_data): the critic's value at every token of the flat sequence (prompt and "
        f"observation tokens too; 0.0 only past the input length), handed to the estimator at :{ln['adv']}",
        "masked_rewards": f"{at}nemo_rl/algorithms/advantage_estimator.py:{ln['kl']} with use_kl_in_reward the KL "
        "term -kl_coef * kl is computed at every position of prev_logprobs / reference_policy_logprobs (all "
        f"tokens), before token_level_rewards * mask (:{ln['rmask']})",
        "token_rewards": f"{at}nemo_rl/algorithms/advantage_estimator.py:{ln['kl']} use_kl_in_reward: "
        "token_level_rewards = -kl_coef * kl at every response token",
        "truncated_rows": f"{at}nemo_rl/experience/rollouts.py:{ln['cut']} a response that hits max_tokens without "
        f"a stop token marks the sample truncated (read only by overlong filtering, nemo_rl/algorithms/ppo.py:"
        f"{ln['overlong']})",
        "truncated_padded": f"{at}nemo_rl/algorithms/ppo.py:{ln['flat']} batched_message_log_to_flat_message pads "
        "every sample to the batch's longest on the right: a cut sample shorter than the longest is followed by "
        "padding",
    }
    if "sample" in ln:  # 7ea: the estimator's mask is token_mask * sample_mask
        produces["all_masked_rows"] = (
            f"{at}nemo_rl/algorithms/ppo.py:{ln['sample']} advantage_mask = token_mask * sample_mask, with "
            "sample_mask = loss_multiplier zeroed for a truncated sample under overlong_filtering "
            f"(:{ln['overlong']}): "
            "a row of real tokens with no trainable one"
        )
    return Domain(
        dtypes=("float32", "float64"),
        left_padding=False,
        nonfinite_poison=False,
        why=dict(_PIPELINE_WHY),
        produces=produces,
    )


PIPELINE = {
    "7ea279abfbeb": _pipeline(
        "7ea279abfbeb",
        dict(
            tlm="1474-1481",
            flat="1488-1503",
            obs="977-1019",
            turns="893, 1027-1034",
            mrt="1437",
            values="1517-1519",
            adv="1587-1596",
            kl="388-394",
            rmask="408",
            cut="943-947",
            overlong="1464-1471",
            sample="266",
        ),
    ),
    "857b11522612": _pipeline(
        "857b11522612",
        dict(
            tlm="1137-1144",
            flat="1151-1166",
            obs="495-530",
            turns="404",
            mrt="1101",
            values="1180-1182",
            adv="1241-1250",
            kl="349-355",
            rmask="369",
            cut="458-462",
            overlong="1127-1134",
        ),
    ),
}

# The estimator's own words at each pin (one Promise per line range and pin group).
_CARRY = (
    "The GAE loop uses carry-forward masking: at masked positions the running accumulators (next_values, "
    "last_gae_lam) are preserved from the last valid token rather than being zeroed.  This correctly skips over "
    "non-response tokens (padding, separators in multi-turn) without introducing phantom TD errors."
)
_CARRY_NOTE = (
    "the class docstring of GeneralizedAdvantageEstimator: what a masked position holds (a value, a reward, NaN "
    "included) must not reach the accumulators, which it says are preserved there; the inserted masked token of "
    "gap-invariance is such a separator"
)
_TEST = (
    "Verifies that a masked position in the middle of a response does not corrupt the GAE accumulators: the "
    "advantages at the valid tokens must match the case where the gap is simply removed from the sequence. ... "
    "The value at the gap is deliberately huge (999) to make any leakage into the accumulators obvious. ... "
    "torch.testing.assert_close(adv_with_gap[0][valid_positions], adv_no_gap[0])"
)
_TEST_NOTE = "NeMo-RL's own unit test test_gae_carry_forward_interior_gap (finite masked values, a gap inside a row)"
_TERMINAL = (
    "Place terminal reward at the last response token (last mask=1 position) for each sample. Using mask (not a "
    "separate `lengths` tensor) ensures the reward lands on an assistant token even in multi-turn scenarios where "
    "the sequence may end with a non-assistant message."
)
_TERMINAL_NOTE = "_build_token_level_rewards: the score reaches the last trainable token behind an observation tail"
GAE_PROMISES = (
    Promise(
        "upstream:nemo_rl/algorithms/advantage_estimator.py:318-321",
        _CARRY,
        covers=("gap-invariance", "poison", "poison-nonfinite"),
        note=_CARRY_NOTE,
        pins=("7ea279abfbeb",),
    ),
    Promise(
        "upstream:nemo_rl/algorithms/advantage_estimator.py:279-282",
        _CARRY,
        covers=("gap-invariance", "poison", "poison-nonfinite"),
        note=_CARRY_NOTE,
        pins=("857b11522612",),
    ),
    Promise(
        "upstream:tests/unit/algorithms/test_ppo.py:334-374",
        _TEST,
        covers=("gap-invariance", "poison"),
        note=_TEST_NOTE,
        pins=("7ea279abfbeb",),
    ),
    Promise(
        "upstream:tests/unit/algorithms/test_ppo.py:327-367",
        _TEST,
        covers=("gap-invariance", "poison"),
        note=_TEST_NOTE,
        pins=("857b11522612",),
    ),
    Promise(
        "upstream:nemo_rl/algorithms/advantage_estimator.py:396-400",
        _TERMINAL,
        covers=("score-kept",),
        note=_TERMINAL_NOTE,
        pins=("7ea279abfbeb",),
    ),
    Promise(
        "upstream:nemo_rl/algorithms/advantage_estimator.py:357-361",
        _TERMINAL,
        covers=("score-kept",),
        note=_TERMINAL_NOTE,
        pins=("857b11522612",),
    ),
)

SPEC = TargetSpec(
    id="nemo-rl",
    first_run=('default', 'grpo', 'policy-loss'),
    adapter="maskfuzz.targets.nemo_rl.calls",
    own=PACKAGES,
    # carry-forward masking: at masked positions next_values and last_gae_lam keep the last trainable token's,
    # so a gap costs nothing and the score sits on the last mask=1 token: the trainable-subsequence GAE.
    contract="compressed",
    git_url="https://github.com/NVIDIA-NeMo/RL.git",
    pins=(
        Pin("7ea279abfbeb", "main at the mirror snapshot (2026-08-22)", kind="git"),
        Pin("857b11522612", "PR #2530 'PPO with MCore' (2026-06-11): GeneralizedAdvantageEstimator added", kind="git"),
        Pin("f6e91870a807", "parent of 857b11522612: no GeneralizedAdvantageEstimator yet (not present)", kind="git"),
    ),
    # normalize_advantages=True: PPOConfig's default (ppo.py:202) and examples/configs/ppo_math_1B.yaml:47; the option
    # NORMALIZE=False (NeMo-RL's unit tests) turns it off
    whitening=WHITEN,
    options=GAE_OPTIONS,
    # a cut row is an ended row: _compute_gae starts next_values at 0 (no bootstrap after the last mask=1 token) and
    # nothing but overlong_filtering reads `truncated`
    truncation=Truncation(
        cite="nemo_rl/algorithms/advantage_estimator.py:526-529 (next_values = zeros: no bootstrap); "
        "nemo_rl/algorithms/ppo.py:1464-1471 (truncated read only under overlong_filtering)"
    ),
    masked_zero=True,  # compute_advantage ends with masked_fill(advantages, ~mask, 0)
    stand_ins=(),  # nothing of nemo_rl is imported (see the module docstring), so nothing is stood in for
    domain=Domain(),  # mask, values, score and token rewards are independent inputs in any dtype; no narrowing
    # the PPO loop's own inputs (module docstring, "Pipeline domain"), per pin with what it produces (`_pipeline`)
    pipeline=PIPELINE["7ea279abfbeb"],
    pipeline_by_pin={"857b11522612": PIPELINE["857b11522612"]},
    notes="source of GeneralizedAdvantageEstimator executed from the pin (its module needs real transformers, "
    "tensorboard and pydantic to import); token rewards through its KL-in-reward term",
)


# The entries beyond GAE (targets/nemo_rl/calls_kinds.py): GRPOAdvantageEstimator.compute_advantage
# (7ea: nemo_rl/algorithms/advantage_estimator.py:57-98) over calculate_baseline_and_std_per_prompt
# (7ea: nemo_rl/algorithms/utils.py:104-198). The default config (grpo.py:247, :253: leave-one-out baseline AND
# normalize_rewards) divides by the leave-one-out std of the other rows, which no group-advantage variant
# describes: not an entry. valid_mask is all ones (advantage_estimator.py:85; 857b :67) and the mask is "Used only
# for expanding advantages to token-level shape" (its docstring, :75-76; 857b :57-58): by design every row counts in
# its group's statistics, a trainable token or not: empty_rows "counted".
_GROUP_MASKED = (
    "advantages.expand(mask.shape): the row's advantage at every position, the mask used only for its shape "
    "(7ea: nemo_rl/algorithms/advantage_estimator.py:98; docstring :75-76); the loss multiplies by the token mask"
)
_GRPO_OPTIONS = (
    Option(
        NORMALIZE_REWARDS,
        (True, False),
        True,
        "nemo_rl/algorithms/advantage_estimator.py:67 (applied :90-96; default True nemo_rl/algorithms/grpo.py:247)",
        "divide the group-centred reward by the group's std (+1e-6) where the std is non-zero; off: r - mean_g",
        effect={False: {"variant": {"std": None}}},
    ),
)
_GRPO_OVERLONG = Option(
    GRPO_OVERLONG,
    (False, True),
    False,
    "nemo_rl/algorithms/grpo.py:3136-3145 (default False :280)",
    "a truncated sample's loss_multiplier (sample_mask) is set to 0: the row leaves the loss and its normalisers",
    effect={True: {"truncation": {"row": "masked"}}},
)
# without overlong filtering a cut row is trained like any other: nothing else reads `truncated`
_KEPT = Truncation(cite="nemo_rl/algorithms/grpo.py:3136-3145 (truncated read only under overlong_filtering)")
_PPO_KEPT = Truncation(cite="nemo_rl/algorithms/ppo.py:1464-1471 (truncated read only under overlong_filtering)")
_KIND_OVERRIDES = {
    # use_leave_one_out_baseline=False: baseline = group mean (utils.py:150-153, :163-168); std = sqrt((E[r^2] -
    # mean^2) * n / (n - 1)), unbiased (:186-192); divided by (std + 1e-6) only where std > 0 (:90-95);
    # a group with <= 1 valid row: baseline = reward, advantage 0 (utils.py:155-158)
    "grpo": dict(
        kind="group-advantage",
        variant={
            "estimator": "grpo",
            "std": "unbiased",
            "eps": 1e-6,
            "eps_place": "std",
            "singleton": "zero",
            "empty_rows": "counted",
        },
        options=_GRPO_OPTIONS,
        truncation=None,
        whitening=None,
        masked_zero=False,
        masked_zero_why=_GROUP_MASKED,
        domain=Domain(why={}),
        pipeline=None,  # not researched for these entries: every finding is reach api
        pipeline_by_pin={},
    ),
    # use_leave_one_out_baseline=True, normalize_rewards=False: r - (sum of the others) / (n - 1)
    # (utils.py:147-148, :159-168); a singleton group: advantage 0 (:155-158)
    "rloo": dict(
        kind="group-advantage",
        variant={"estimator": "rloo", "singleton": "zero", "empty_rows": "counted"},
        # normalize_rewards=True with the leave-one-out baseline is the entry grpo-loo
        options=(),
        truncation=None,
        whitening=None,
        masked_zero=False,
        masked_zero_why=_GROUP_MASKED,
        domain=Domain(why={}),
        pipeline=None,
        pipeline_by_pin={},
    ),
    # use_leave_one_out_baseline=True and normalize_rewards=True, NeMo-RL's defaults (grpo.py:247, :253): the
    # baseline and the std both leave the row out (baseline_mask_matrix = 1 - eye, utils.py:147-148, :159-192;
    # std unbiased over the others, nan_to_num(0) below two others, :186-194); divided by (std + 1e-6) only where
    # std > 0 (advantage_estimator.py:90-95); a group with <= 1 valid row: advantage 0 (utils.py:155-158)
    "grpo-loo": dict(
        kind="group-advantage",
        variant={"estimator": "rloo", "loo_std": True, "eps": 1e-6, "singleton": "zero", "empty_rows": "counted"},
        options=(),
        truncation=None,
        whitening=None,
        masked_zero=False,
        masked_zero_why=_GROUP_MASKED,
        domain=Domain(why={}),
        pipeline=None,
        pipeline_by_pin={},
    ),
}


def _loss(variant: dict, options: tuple = (_GRPO_OVERLONG,), truncation: Truncation = _KEPT) -> dict:
    return dict(
        kind="loss-aggregation",
        variant=variant,
        options=options,
        truncation=truncation,
        masked_zero=True,  # masked_mean is sum(values * mask) / factor (nemo_rl/algorithms/utils.py:219-224 at 7ea)
        masked_zero_why="",
        whitening=None,
        documented_errors=(),
        domain=Domain(why={}),
        pipeline=None,  # not researched as a Domain: every finding is reach api
        pipeline_by_pin={},
    )


# ClippedPGLossFn's actor_loss aggregation (7ea: nemo_rl/algorithms/loss/loss_functions.py:397, :678-693; 857b:
# :286, :558-570; f6e9: :279, :551-563) with the worker's global_valid_toks / global_valid_seqs (calls_kinds.
# load_loss). token_level_loss=True (the default, loss_functions.py:114; grpo_math_1B.yaml): masked_mean over
# token_mask * sample_mask with the global token count = token-mean. token_level_loss=False: the per-row
# masked_mean over token_mask, then masked_mean over sample_mask with global_valid_seqs = seq-mean-token-mean.
# global_valid_seqs = sum(sample_mask) counts rows whose token_mask is empty (7ea: nemo_rl/models/automodel/data.py:
# 409): by design the sequence-level mean counts them (a row's per-token masked_mean is 0), empty_rows "counted"
# (token-mean counts tokens only, so the key matters only where token_level_loss=False selects the sequence mean).
_TOKEN_LEVEL = Option(
    TOKEN_LEVEL,
    (True, False),
    True,
    "nemo_rl/algorithms/loss/loss_functions.py:262-264 (default True :114)",
    "token-level loss: the global token mean; off: each sequence's token mean, averaged over the valid sequences",
    effect={False: {"variant": {"mode": "seq-mean-token-mean"}}},
)
_KIND_OVERRIDES["agg-token-level"] = _loss(
    {"mode": "token-mean", "empty_rows": "counted"}, (_TOKEN_LEVEL, _GRPO_OVERLONG)
)
_KIND_OVERRIDES["agg-sequence-level"] = _loss({"mode": "seq-mean-token-mean", "empty_rows": "counted"})
# MseValueLossFn (7ea: nemo_rl/algorithms/loss/loss_functions.py:1218-1341; 857b: :1091-1213; absent at f6e9): 0.5 *
# scale * masked_mean(max((v - R)^2, (clamp(v, v_old - c, v_old + c) - R)^2), token_mask * sample_mask,
# global_normalization_factor=global_valid_toks) (:1254-1271), the value worker's global normalisers
# (calls_kinds.load_value). cliprange 0.2 (examples/configs/ppo_math_1B.yaml:88; the class default None turns
# clipping off), half: the literal 0.5; token-mean over the step.
_KIND_OVERRIDES["value-loss"] = dict(
    _loss({"clip": 0.2, "half": True, "mode": "token-mean"}, (GAE_OPTIONS[1],), _PPO_KEPT),
    kind="value-loss",
    masked_zero=True,  # masked_mean multiplies the per-token loss by the mask (utils.py:219-224 at 7ea)
)
# The KL-to-reference term of ClippedPGLossFn.__call__ (7ea: nemo_rl/algorithms/loss/loss_functions.py:468-503;
# 857b: :357-389), per token, before its reduction (calls_kinds.load_kl): `reference_policy_kl_penalty *
# calculate_kl(logprobs=curr_logprobs_unfiltered, logprobs_reference=reference_policy_logprobs, kl_type=...,
# input_clamp_value=..., output_clamp_value=...)`. calculate_kl (7ea: nemo_rl/algorithms/utils.py:42-101; 857b:
# :41-83): logr = ref - logp (:72), clamped to +-input_clamp_value (:73-81), k1 -logr = d (:83-84), k2 logr^2 / 2
# = d^2 / 2 (:86-87), k3 exp(logr) - 1 - logr = exp(-d) - 1 + d (:89-90), clamped to +-output_clamp_value
# (:98-99): the kind's estimators with d = logp - ref. Defaults k3, 20, 10 (ClippedPGLossConfig, loss_functions.py:
# 131-133; 857b :112-114; examples/configs/grpo_math_1B.yaml:83-85). The reduction is the actor loss's own
# (masked_mean over token_mask * sample_mask with global_valid_toks, or the sequence-level pair, :505-515; 857b
# :391-401): the agg-token-level / agg-sequence-level entries judge that aggregation.
_KL_OPTIONS = (
    Option(
        KL_TYPE,
        ("k3", "k1", "k2"),
        "k3",
        "nemo_rl/algorithms/loss/loss_functions.py:243 (used :499; default k3 :131; 857b :210, :385, :112)",
        "Schulman's KL approximation: k1 -log r, k2 (log r)^2 / 2, k3 exp(log r) - 1 - log r, log r = ref - logp",
        effect={"k1": {"variant": {"estimator": "k1"}}, "k2": {"variant": {"estimator": "k2"}}},
    ),
    Option(
        KL_IN_CLAMP,
        (20.0, None),
        20.0,
        "nemo_rl/algorithms/loss/loss_functions.py:244 (used :500; default :132; 857b :211, :386, :113); "
        "null in examples/configs/recipes/llm/mopd-qwen3-1.7b-3n8g-megatron-pack.yaml:17",
        "clamp the log-ratio to [-v, v] before the estimate (utils.py:73-81); None: no clamp",
        effect={None: {"variant": {"clamp_d": None}}},
    ),
    Option(
        KL_OUT_CLAMP,
        (10.0, None),
        10.0,
        "nemo_rl/algorithms/loss/loss_functions.py:245 (used :501; default :133; 857b :212, :387, :114); "
        "null in examples/configs/recipes/llm/mopd-qwen3-1.7b-3n8g-megatron-pack.yaml:18",
        "clamp the per-token estimate to [-v, v] (utils.py:98-99); None: no clamp",
        effect={None: {"variant": {"clamp": None}}},
    ),
)
_KIND_OVERRIDES["kl"] = dict(
    kind="kl",
    variant={"estimator": "k3", "clamp_d": (-20.0, 20.0), "clamp": (-10.0, 10.0)},
    options=_KL_OPTIONS,
    truncation=None,
    whitening=None,
    masked_zero=False,
    masked_zero_why="the per-token term is computed at every position (loss_functions.py:496-503 at 7ea); its "
    "reduction masks it: masked_mean(kl, token_mask * sample_mask, ...) (:505-515; utils.py:224)",
    documented_errors=(),
    domain=Domain(why={}),
    pipeline=None,  # not researched as a Domain: every finding is reach api
    pipeline_by_pin={},
)
# GeneralizedAdvantageEstimator._reward_whiten(rewards, mask) (7ea: nemo_rl/algorithms/advantage_estimator.py:345-358;
# 857b: :306-319), the advantage whitening of normalize_advantages (:493-494; 857b :454-455): mean = masked_mean
# (sum(x * mask) / (sum(mask) + 1e-8), utils.py:212-224), var = masked_var(unbiased=True): masked_mean((x - mean)^2)
# * n / (n - 1) (utils.py:260-274), (x - mean) * rsqrt(var + 1e-8): batch level, eps inside the sqrt. The only
# caller passes shift_mean at its default True (:494). The one whitening helper NeMo-RL has: utils.py has no
# masked_whiten; Reinforce++ / RawReward whiten inline inside compute_advantage (:262-265, :293-297).
_KIND_OVERRIDES["whiten"] = dict(
    kind="normalization",
    variant={"level": "batch", "unbiased": True, "eps": 1e-8, "eps_place": "var", "shift_mean": True},
    options=(),
    truncation=None,
    whitening=None,
    masked_zero=False,
    masked_zero_why="_reward_whiten whitens every position (advantage_estimator.py:354 at 7ea); its caller then "
    "zeroes the masked ones: masked_fill(advantages, ~mask, 0) (:495)",
    documented_errors=(),
    domain=Domain(why={}),
    pipeline=None,
    pipeline_by_pin={},
)
# ClippedPGLossFn.__call__ whole (7ea: nemo_rl/algorithms/loss/loss_functions.py:374-788; 857b: :263-668; f6e9:
# :256-644), its __init__ run on ClippedPGLossConfig's defaults read from the pin (calls_kinds.load_policy):
# ratio_clip_min = ratio_clip_max = 0.2, ratio_clip_c None (no dual clip), token_level_loss True (7ea:
# loss_functions.py:114, :122-125; 857b / f6e9: :95, :103-106; examples/configs/grpo_math_1B.yaml:86-88 at 7ea,
# :62-64 at 857b / f6e9): max(-A r, -A clamp(r, 0.8, 1.2)) (7ea :537-552; 857b :423-435) aggregated by masked_mean
# over token_mask * sample_mask with global_valid_toks (7ea :678-683; 857b :558-563; f6e9 :551-556): token-mean over
# the step; the advantages are per token (data["advantages"][:, 1:], 7ea :385). reference_policy_kl_penalty is set to
# 0 (the default 0.01 adds the KL term, judged by the `kl` entry), importance-sampling correction off (default,
# 7ea :140, 857b :121).
_DUAL_CLIP = Option(
    RATIO_CLIP_C,
    (None, 3.0),
    None,
    "nemo_rl/algorithms/loss/loss_functions.py:125 (used :554-561; 857b :106, :438-445); 3: 'usually set to 3 "
    "empirically' (:124)",
    "dual clip: where A < 0 the per-token loss is min(max(-A r, -A clamp(r)), -A c)",
    effect={3.0: {"variant": {"dual_clip": 3.0}}},
)
_KIND_OVERRIDES["policy-loss"] = dict(
    _loss(
        {
            "clip_low": 0.2,
            "clip_high": 0.2,
            "dual_clip": None,
            "advantages": "token",
            "mode": "token-mean",
            "empty_rows": "counted",  # as agg-token-level: the sequence mean of token_level_loss=False counts them
        },
        (_TOKEN_LEVEL, _DUAL_CLIP, _GRPO_OVERLONG),
    ),
    kind="policy-loss",
    masked_zero=True,  # masked_mean multiplies the per-token loss by the mask (utils.py:219-224 at 7ea)
)
# the estimator's own words are the GAE entry's promises (the kind entries call other code)
SPEC = dataclasses.replace(
    SPEC,
    entries=("default", *_KIND_OVERRIDES),
    entry_overrides={"default": {"promises": GAE_PROMISES}, **_KIND_OVERRIDES},
)



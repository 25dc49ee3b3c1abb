"""miles (the declaration the fuzzer reads; the worker's calls are `calls.py` and `calls_kinds.py`):
`get_advantages_and_returns_batch`, in its old home `miles/utils/ppo_utils.py`
(the PyPI wheel `miles-rl==0.0.2`, and git up to f38996d00) and its new one
`miles/backends/training_utils/loss_hub/math_utils.py`.

The function's inputs are per-sample lists without padding (`total_lengths`, `response_lengths`,
`values_list`, `rewards_list`, later `terminal_rewards`, `qkv_format`, `max_seq_lens`, and from
PR #1827 (3d2e0e411) `loss_masks`). Where the score goes is the framework's own code, and it moved:

* up to PR #1720 (6875694c5): the PPO caller `compute_advantages_and_returns(args, rollout_data)`
  (`miles/backends/training_utils/loss.py`, earlier `miles/backends/megatron_utils/loss.py`) adds
  the scalar reward to the *last response token* of the KL rewards (`k[-1] += reward`) and calls
  the function without any mask. The adapter goes through that caller, as slime's adapter does.
* from PR #1720: the function takes `terminal_rewards` and adds them itself: at the last response
  token (`full_rewards[i, L - 1]`) until PR #1827, at the last *trainable* token of the compressed
  subsequence from PR #1827 on. The adapter calls the function directly, as the framework's own
  tests do (`tests/fast/backends/training_utils/test_ppo_gae_masks.py`).

State: the function reads the context-parallel size from miles' parallel state. The adapter
provides it the way the framework's tests do at each pin: `set_parallel_state(ParallelState(...))`
with every group trivial (`GroupInfo(rank=0, size=1, group=None)`; in the older flat layout, ranks
0, sizes 1, groups None); passed as the `parallel_state` argument where the function takes one
(Jan-Feb 2026); and, for the oldest pins that still ask `megatron.core.mpu`, the single-rank
`mpu` of the slime adapter. `fla` is deny-listed: miles probes it, and a stand-in would change
what it runs.

Pipeline domain (`SPEC.pipeline` at the git pins, `pipeline_by_pin["0.0.2"]` for the wheel): what
miles' own rollout and PPO path hand the function. Narrowed: no left padding (per-sample lists of
exactly `response_lengths[i]` tokens), no non-finite poison (critic outputs and log-prob differences;
tool tokens carry log-prob 0.0), and at the git pins dtypes to float32 (values upcast `.float()`,
KL `.float()`); the 0.0.2 wheel keeps bf16 / fp16, which `--true-on-policy-mode` gives its value
logits. Reachable, so permissive: gaps and observation tails (`multi_turn` generate appends tool
responses with loss_mask 0 and can stop after one), leading masked tokens
(`--mask-offpolicy-in-partial-rollout`), all-masked rows (`remove_sample`), KL rewards and critic
values at every response token.
Each is cited in the domain's `produces` with the line that builds it; miles' own promises (its
docstrings, flag help, docs, PR #1827's contract at 3d2e0e411) are declared per entry and pin before `SPEC`.

Mapping of the canonical case is slime's (`targets.slime.calls.Samples`): a row's real tokens
are the sample's response, padding (left or right) is dropped, `trainable` is `loss_masks[i]`
(torch.int), token rewards are the per-token rewards (through the caller: as KL), the score is
the terminal reward; outputs are scattered back, 0 at padding.
"""

from __future__ import annotations

import dataclasses

from maskfuzz.oracles.domain import Domain
from maskfuzz.oracles.promises import Promise
from maskfuzz.targets.miles.calls_kinds import KIND_ENTRIES, LOSS_ENTRIES, POLICY_ENTRIES, VALUE_ENTRIES
from maskfuzz.targets.registry import COMMON_HEAVY, Option, Pin, TargetSpec, Truncation
from maskfuzz.targets.slime.calls import KL_COEF
from maskfuzz.targets.slime.declare import FLOAT64_WHY

_TB = "miles/backends/training_utils"
PIPELINE_GIT = Domain(
    dtypes=("float32",),
    left_padding=False,
    empty_rows=False,
    nonfinite_poison=False,
    why={
        "dtypes": f"miles 6ccdc7da6 / 3d2e0e411: critic values are upcast, {_TB}/loss_hub/logit_processors.py:254 "
        f"`.float()`; token rewards are -kl_coef * KL with KL cast `.float()` ({_TB}/loss_hub/math_utils.py:155) "
        f"or float32 zeros ({_TB}/loss.py:57); GAE runs in values dtype ({_TB}/loss_hub/math_utils.py:641 at "
        "6ccdc7da6, :668 at 3d2e0e411)",
        "empty_rows": "miles 6ccdc7da6 / 3d2e0e411: miles/utils/arguments.py:2921-2929 keeps "
        "rollout_max_prompt_len <= rollout_max_context_len - 1 'so that there is at least one generated token to "
        "compute loss'; a zero-length response is not an input the rollout intends",
        "left_padding": "miles 6ccdc7da6 / 3d2e0e411: per-sample unpadded lists, loss_masks[i] has exactly "
        "response_lengths[i] entries (miles/ray/rollout/train_data_conversion.py:78-87) and values are cut per "
        f"response ({_TB}/loss_hub/logit_processors.py:243-254); there is no padding at all",
        "nonfinite_poison": "miles 6ccdc7da6 / 3d2e0e411: values are value-head outputs "
        f"({_TB}/loss_hub/logit_processors.py:243-254), token rewards -kl_coef * (log-prob differences) "
        f"({_TB}/loss_hub/advantages.py:59-65, {_TB}/loss_hub/math_utils.py:155); tool tokens get rollout "
        "log-prob 0.0 (miles/rollout/generate_utils/tool_call_utils.py:64): nothing non-finite under the mask",
    },
    # what miles' own code at the git pins produces (`Domain.produces`): a pipeline witness may use only these
    produces={
        "gaps": "miles 6ccdc7da6 / 3d2e0e411: miles/rollout/generate_hub/multi_turn.py:93 appends a tool response with "
        "loss_mask 0 (miles/rollout/generate_utils/tool_call_utils.py:63), then the next turn's tokens with loss_mask "
        "1 (multi_turn.py:72, update_sample_from_response(update_loss_mask=True), "
        "miles/rollout/generate_utils/generate_endpoint_utils.py:102-105)",
        "masked_real_tail": "miles 6ccdc7da6 / 3d2e0e411: the turn loop (miles/rollout/generate_hub/multi_turn.py:53) "
        "ends a turn on the tool response (:93); when generate_max_turns runs out, or the context is full (:56-61, "
        "compute_request_payload returns None, generate_endpoint_utils.py:62-63), the response ends on it",
        "leading_mask": "miles 6ccdc7da6 / 3d2e0e411: miles/rollout/sglang_rollout.py:268-269 (--partial-rollout with "
        "--mask-offpolicy-in-partial-rollout zeroes the loss mask of a resumed response), the new tokens trainable "
        "(:237-238)",
        "all_masked_rows": "miles 6ccdc7da6 / 3d2e0e411: miles/ray/rollout/train_data_conversion.py:85-86 "
        "(remove_sample: loss_mask [0] * response_length, the sample kept)",
        "masked_values": f"miles 6ccdc7da6 / 3d2e0e411: {_TB}/loss_hub/logit_processors.py:243-254 (get_values: the "
        "value head at every response token) through forward_only(get_values) (miles/backends/megatron_utils/actor.py:"
        "384-391); the value loss reduces under loss_mask only, so the values under tool tokens are never trained",
        "masked_rewards": f"miles 6ccdc7da6 / 3d2e0e411: {_TB}/loss.py:54-65 (compute_approx_kl at every response "
        f"token when --kl-coef != 0), {_TB}/loss_hub/advantages.py:62-65 (k *= -kl_coef, unmasked); a tool token's KL "
        "is not 0: ref_log_probs are the reference model's at every response token (miles/backends/megatron_utils/"
        "actor.py:441-450; loaded when kl_coef != 0, miles/ray/placement_group.py:157), log_probs the actor's "
        f"recompute (actor.py:473-478) or, with --use-rollout-logprobs ({_TB}/loss.py:41), the rollout's 0.0 of a tool "
        "token (miles/rollout/generate_utils/tool_call_utils.py:64); 3d2e0e411 (#1827) drops them inside GAE",
        "token_rewards": f"miles 6ccdc7da6 / 3d2e0e411: {_TB}/loss_hub/advantages.py:62-65 (-kl_coef * KL at every "
        "response token, trainable ones included, when --kl-coef != 0)",
        "truncated_rows": "miles 6ccdc7da6 / 3d2e0e411: miles/utils/types.py:281-283 (finish_reason 'length' -> "
        "TRUNCATED) and miles/rollout/generate_utils/generate_endpoint_utils.py:62-63 (the context full)",
    },
)
PIPELINE_0_0_2 = Domain(
    dtypes=("float32", "bfloat16", "float16"),
    left_padding=False,
    empty_rows=False,
    nonfinite_poison=False,
    why={
        "dtypes": "miles-rl 0.0.2: value logits are asserted float32 only outside --true-on-policy-mode "
        f"({_TB}/loss.py:69-70); in that mode they are cast to bf16 / fp16 ({_TB}/loss.py:81-85) and "
        "get_advantages_and_returns_batch runs in values dtype (miles/utils/ppo_utils.py:558); never float64",
        "empty_rows": "miles-rl 0.0.2: miles/utils/arguments.py:2199-2207 keeps rollout_max_prompt_len <= "
        "rollout_max_context_len - 1 'so that there is at least one generated token to compute loss'",
        "left_padding": "miles-rl 0.0.2: per-sample unpadded lists, loss_masks[i] has exactly response_lengths[i] "
        f"entries (miles/ray/rollout.py:695-703), values cut per response ({_TB}/loss.py:232-272); no padding",
        "nonfinite_poison": f"miles-rl 0.0.2: values are value-head outputs ({_TB}/loss.py:264-272), token "
        f"rewards -kl_coef * (log-prob differences) ({_TB}/loss.py:346-355, miles/utils/ppo_utils.py:81); tool "
        "tokens get rollout log-prob 0.0 (miles/rollout/generate_utils/tool_call_utils.py:64)",
    },
    produces={
        "gaps": "miles-rl 0.0.2: miles/rollout/generate_hub/multi_turn.py:75 appends a tool response with loss_mask 0 "
        "(miles/rollout/generate_utils/tool_call_utils.py:63), then the next turn's tokens with loss_mask 1 "
        "(multi_turn.py:60, miles/rollout/generate_utils/generate_endpoint_utils.py:93-96)",
        "masked_real_tail": "miles-rl 0.0.2: the turn loop (miles/rollout/generate_hub/multi_turn.py:46) ends a turn "
        "on the tool response (:75); when generate_max_turns runs out, or the context is full (:49-54, "
        "miles/rollout/generate_utils/generate_endpoint_utils.py:48-49), the response ends on it",
        "leading_mask": "miles-rl 0.0.2: miles/rollout/sglang_rollout.py:242-243 (--partial-rollout with "
        "--mask-offpolicy-in-partial-rollout zeroes the loss mask of a resumed response), the new tokens trainable "
        "(:213-214)",
        "all_masked_rows": "miles-rl 0.0.2: miles/ray/rollout.py:701-702 (remove_sample: loss_mask [0] * "
        "response_length, the sample kept)",
        "masked_values": f"miles-rl 0.0.2: {_TB}/loss.py:262-272 (get_values: the value head at every response token) "
        "through forward_only(get_values) (miles/backends/megatron_utils/actor.py:340-349); the value loss reduces "
        "under loss_mask only, so the values under tool tokens are never trained",
        "masked_rewards": f"miles-rl 0.0.2: {_TB}/loss.py:326-337 (compute_approx_kl at every response token when "
        "--kl-coef != 0), :349-355 (k *= -kl_coef, unmasked, the score added at the last response token); a tool "
        "token's KL is not 0: ref_log_probs are the reference model's at every response token "
        "(miles/backends/megatron_utils/actor.py:386-396; loaded when kl_coef != 0, miles/ray/placement_group.py:144), "
        f"log_probs the actor's recompute (actor.py:397-410) or, with --use-rollout-logprobs ({_TB}/loss.py:313), the "
        "rollout's 0.0 of a tool token (miles/rollout/generate_utils/tool_call_utils.py:64)",
        "token_rewards": f"miles-rl 0.0.2: {_TB}/loss.py:349-353 (-kl_coef * KL at every response token, trainable "
        "ones included, when --kl-coef != 0)",
        "truncated_rows": "miles-rl 0.0.2: miles/utils/types.py:235-237 (finish_reason 'length' -> TRUNCATED) and "
        "miles/rollout/generate_utils/generate_endpoint_utils.py:48-49 (the context full)",
    },
)


# ---------------------------------------------------------------------------------------------
# Entries beyond GAE (loaders in targets/miles/calls_kinds.py). Lines: `W` = miles-rl 0.0.2,
# `G` = the git pins 6ccdc7da6 / 3d2e0e411 (same lines at both).
# ---------------------------------------------------------------------------------------------
_MU = f"{_TB}/loss_hub/math_utils.py"
F32_WHY = {
    "grpo": "the group statistics run on torch.tensor(raw_rewards, dtype=torch.float) (W miles/ray/rollout.py:650, "
    "G miles/ray/rollout/train_data_conversion.py:161) and the broadcast on float32 rewards and KL "
    f"(W {_TB}/loss.py:341, G {_TB}/loss_hub/advantages.py:53): the case's dtype reaches nothing",
    "kl": "compute_approx_kl casts both inputs .float() (W miles/utils/ppo_utils.py:81, G "
    f"{_MU}:155): a float64 case would only measure that cast",
    "whiten": "distributed_masked_whiten packs its sums into a float32 tensor (miles/utils/distributed_utils.py:"
    "124-128 at every pin); the advantages it whitens are float32 (rewards and KL float32, W "
    f"{_TB}/loss.py:341, G {_TB}/loss_hub/advantages.py:53)",
    "reinforce++": "the scores are a float32 tensor and the KL float32 (W "
    f"{_TB}/loss.py:361, compute_approx_kl .float() W miles/utils/ppo_utils.py:81, G {_MU}:155)",
}


def _kinds_pipeline(why_dtypes: str, dtypes: tuple[str, ...] = ("float32",)) -> dict:
    """Pipeline domains of a kind entry at the wheel and at the git pins: the GAE narrowings
    (per-sample lists, no padding, no empty response, nothing non-finite) with the entry's dtypes."""

    def narrow(base: Domain) -> Domain:
        return dataclasses.replace(base, dtypes=dtypes, why={**base.why, "dtypes": why_dtypes})

    return {"pipeline": narrow(PIPELINE_GIT), "pipeline_by_pin": {"0.0.2": narrow(PIPELINE_0_0_2)}}


_NO_F64 = ("float32", "bfloat16", "float16")
KIND_OVERRIDES: dict = {
    "grpo": dict(
        kind="group-advantage",
        # estimator grpo, std unbiased (torch .std(), W miles/ray/rollout.py:660), eps 1e-6 outside the std
        # (W :661, G train_data_conversion.py:188-189): the defaults. Singletons (n_samples_per_prompt 1)
        # give std NaN: no rule, left canonical. Rows whose loss mask is all zero (remove_sample) count in their
        # group's statistics by design: "Note: This attribute does not determine whether the sample participates in
        # advantage normalization." (the --rollout-sample-filter-path help, W miles/utils/arguments.py:1546,
        # G :2071): empty_rows "counted".
        variant={"empty_rows": "counted"},
        domain=Domain(dtypes=("float32",), why={"dtypes": F32_WHY["grpo"]}),
        masked_zero=False,
        masked_zero_why="get_grpo_returns broadcasts the normalised scalar over every response token, "
        f"torch.ones_like(kl[i]) * rewards[i] (W miles/utils/ppo_utils.py:366, G {_MU}:442); the loss masks it",
        **_kinds_pipeline(F32_WHY["grpo"]),
    ),
    **{
        name: dict(
            kind="kl",
            variant=variant,
            domain=Domain(dtypes=_NO_F64, why={"dtypes": F32_WHY["kl"]}),
            masked_zero=False,
            masked_zero_why="compute_approx_kl takes no mask (W miles/utils/ppo_utils.py:65-104, G "
            f"{_MU}:139-180); the KL loss masks it after (W {_TB}/loss.py:794-798)",
            **_kinds_pipeline(
                "log-probs are float32 from the logits (W miles/utils/ppo_utils.py:81 casts anyway); " + F32_WHY["kl"],
                _NO_F64,
            ),
        )
        for name, variant in (
            ("kl", {"estimator": "k1"}),  # --kl-loss-type default k1 (W miles/utils/arguments.py:917)
            # k2 = log_ratio**2 / 2, unclamped (W miles/utils/ppo_utils.py:85-86, G math_utils.py:159-160)
            ("kl-k2", {"estimator": "k2"}),
            ("kl-k3", {"estimator": "k3"}),  # k3 unclamped (W miles/utils/ppo_utils.py:100-102 clamps low_var_kl only)
            # low_var_kl: the estimate clamped to [-10, 10] (W miles/utils/ppo_utils.py:101-102,
            # G math_utils.py:177-178); G also clamps -d to [-20, 20] and NaN to 0 first
            # (_safe_clamp_log_ratio, G math_utils.py:21-28), which changes no clamped finite output
            ("kl-low-var", {"estimator": "low_var_kl", "clamp": (-10.0, 10.0)}),
        )
    },
    "whiten": dict(
        kind="normalization",
        # batch level, unbiased (Bessel when n >= 2, miles/utils/distributed_utils.py:144-146), eps 1e-8
        # inside the rsqrt (:149), shift_mean True (normalize_advantages, W loss.py:449-453): the defaults
        variant={},
        domain=Domain(dtypes=_NO_F64, why={"dtypes": F32_WHY["whiten"]}),
        masked_zero=False,
        masked_zero_why="(values - global_mean) * rsqrt(var + eps) at every position "
        "(miles/utils/distributed_utils.py:149); the loss masks it",
        documented_errors=(r"ValueError: The global mask sum across all participating GPUs is zero",),
        **_kinds_pipeline(F32_WHY["whiten"]),
    ),
    "reinforce++": dict(
        kind="returns",
        # every response token is a step: G_t = r_t + gamma G_{t+1} over range(len) (W miles/utils/ppo_utils.py:
        # 420-423, G math_utils.py:494-497), the score added at the last loss_mask == 1 token (W :415-416)
        contract="dense",
        whitening=None,  # --normalize-advantages is off by default (W miles/utils/arguments.py:970)
        domain=Domain(critic=False, dtypes=_NO_F64, why={"dtypes": F32_WHY["reinforce++"]}),
        masked_zero=False,
        masked_zero_why="the returns are kept at every response token (W miles/utils/ppo_utils.py:423, G "
        f"{_MU}:497); the loss masks them",
        **_kinds_pipeline(F32_WHY["reinforce++"]),
    ),
}


# loss-aggregation (loaders: calls_kinds.load_loss): loss_function (W miles/backends/training_utils/loss.py:972,
# G :96) with its own reducer get_sum_of_sample_mean (cp_utils.py:92 at every pin), Megatron path.
_LOSS_PIPE_WHY = {
    "left_padding": PIPELINE_GIT.why["left_padding"],
    "empty_rows": PIPELINE_GIT.why["empty_rows"],
}


# micro-batches of different row counts: what miles' loader cuts with --use-dynamic-batch-size (the same number of
# them on every rank after the all-reduce MAX); the api domain stays permissive
_UNEVEN = {
    "git": f"miles 6ccdc7da6 / 3d2e0e411: {_TB}/data.py:495 (--use-dynamic-batch-size: get_seqlen_balanced_partitions("
    "samples, num_mbs, equal_size=False): micro-batches of different row counts, the same number on every rank, "
    ":477)",
    "0.0.2": f"miles-rl 0.0.2: {_TB}/data.py:415 (--use-dynamic-batch-size: get_seqlen_balanced_partitions(samples, "
    "num_mbs, equal_size=False), the same number on every rank, :397)",
}
_ROLLOUT_FEATURES = ("gaps", "masked_real_tail", "leading_mask", "all_masked_rows")


def _loss_produces(base: Domain, pin: str) -> dict:
    """What the loss entries' pipeline produces: the rollout's masks and the loader's micro-batches."""
    return {**{k: base.produces[k] for k in _ROLLOUT_FEATURES}, "uneven_splits": _UNEVEN[pin]}


def _loss(mode: str, why: str) -> dict:
    pipe = Domain(
        left_padding=False, empty_rows=False, why=dict(_LOSS_PIPE_WHY), produces=_loss_produces(PIPELINE_GIT, "git")
    )
    return dict(
        kind="loss-aggregation",
        # the documented modes (G docs/user-guide/training-script-walkthrough.md:218: per sample
        # "mean(sum(sample_i) / len(sample_i))" by default, per token with --calculate-per-token-loss); empty
        # rows excluded: a removed sample "will not participate in loss calculation" (W miles/utils/arguments.py:1542,
        # G :2067), so the canonical variant, and the denominators that count it are reported
        variant={"mode": mode},
        masked_zero=True,
        masked_zero_why=why,
        documented_errors=(),
        whitening=None,
        domain=Domain(),
        pipeline=pipe,
        pipeline_by_pin={
            "0.0.2": Domain(
                left_padding=False,
                empty_rows=False,
                why={k: PIPELINE_0_0_2.why[k] for k in ("left_padding", "empty_rows")},
                produces=_loss_produces(PIPELINE_0_0_2, "0.0.2"),
            )
        },
    )


_REDUCER_MASK = "(x_i * loss_mask_i).sum() (miles/backends/training_utils/cp_utils.py:110, :118 at every pin)"
KIND_OVERRIDES["agg-seq-mean-token-mean"] = _loss("seq-mean-token-mean", _REDUCER_MASK)
KIND_OVERRIDES["agg-token-mean"] = _loss("token-mean", _REDUCER_MASK)

# value-loss (loader: calls_kinds.load_value): loss_function with --loss-type value_loss, the critic's (W
# miles/backends/megatron_utils/actor.py:356), dispatched to value_loss_function (W miles/backends/training_utils/
# loss.py:863, G loss_hub/losses.py:370; HEAD 31f1ca961 :399): max((v_c - R)^2, (v - R)^2) with v_c = old +
# clamp(v - old, -value_clip, value_clip) and NO factor 1/2 (W loss.py:900-904, G losses.py:407-411), reduced by
# the same get_sum_of_sample_mean as the actor's loss: the per-sample token mean (seq-mean-token-mean, the
# documented default, G docs/user-guide/training-script-walkthrough.md:218), the token mean with
# --calculate-per-token-loss (the option below). Empty rows excluded, as for the agg entries.
VALUE_CLIP_OPTION = Option(
    "value_clip",
    (0.2, 0.5, 10.0),
    0.2,
    "W miles/backends/training_utils/loss.py:900-901, G loss_hub/losses.py:407-408 (args.value_clip; --value-clip "
    "W miles/utils/arguments.py:890, G :1121, default 0.2)",
    "the clip for value loss (the flag's help): v_c = old + clamp(v - old, -c, c) enters max((v_c - R)^2, (v - R)^2)",
    effect={0.5: {"variant": {"clip": 0.5}}, 10.0: {"variant": {"clip": 10.0}}},
)
PER_TOKEN_LOSS_OPTION = Option(
    "calculate_per_token_loss",
    (False, True),
    False,
    "W miles/backends/training_utils/loss.py:1003-1011, 1049-1065 (G loss.py:127-135, 164-180): the reducer "
    "get_sum_of_sample_mean (cp_utils.py:92) and the normaliser; --calculate-per-token-loss W miles/utils/"
    "arguments.py:868, G :1099 (store_true)",
    "on: sum(sum(sample_i)) / sum(len(sample_i)) over the step (G docs/user-guide/training-script-walkthrough.md:218) "
    "instead of the per-sample mean",
    effect={True: {"variant": {"mode": "token-mean"}}},
)
# --rollout-temperature reaches the critic at W: get_responses divides every logit by it, value logits included
# (W miles/backends/training_utils/loss.py:80, called by get_values :264-271); PR #1190 (cc93d97c4, before both git
# pins) guards it to logits.size(-1) > 1 (G loss_hub/logit_processors.py:55). The flag is "the temperature for the
# inference engine during rollout" (W miles/utils/arguments.py:304-308): no effect on the value loss is declared.
ROLLOUT_TEMPERATURE_OPTION = Option(
    "rollout_temperature",
    (1.0, 0.7),
    1.0,
    "W miles/backends/training_utils/loss.py:80 (get_responses, on the value logits through get_values :264-271); "
    "G loss_hub/logit_processors.py:55 (policy logits only); --rollout-temperature W miles/utils/arguments.py:304, "
    "G :386, default 1.0",
    "the temperature for the inference engine during rollout (the flag's help): it samples the rollout, the critic's "
    "values must not see it (no effect on the value-loss reference)",
)
_VALUE_F32 = {
    "dtypes": "value logits must be float32: W asserts it outside --true-on-policy-mode (miles/backends/"
    f"training_utils/loss.py:69-70); G accepts float32 or bf16 and upcasts each chunk .float() ({_TB}/loss_hub/"
    "logit_processors.py:45, :254), and the old values are the same function's float32 outputs: the loss runs in "
    "float32 (float64 fails the assertion)"
}


def _value_pipeline(base: Domain, pin: str) -> Domain:
    return Domain(
        dtypes=("float32",),
        left_padding=False,
        empty_rows=False,
        nonfinite_poison=False,
        why={
            "left_padding": base.why["left_padding"],
            "empty_rows": base.why["empty_rows"],
            "dtypes": f"miles {pin}: " + _VALUE_F32["dtypes"] + "; W's --true-on-policy-mode bf16 / fp16 cast "
            "(loss.py:81-85) is not modelled",
            "nonfinite_poison": f"miles {pin}: old values are the critic's own value-head outputs at every response "
            "token (forward_only(get_values), W miles/backends/megatron_utils/actor.py:341-349) and the returns "
            "GAE's advantages + values of finite KL rewards (" + base.produces["masked_values"] + "): nothing "
            "non-finite under the mask",
        },
        produces=_loss_produces(base, "0.0.2" if pin == "0.0.2" else "git"),
    )


KIND_OVERRIDES["value-loss"] = dict(
    kind="value-loss",
    variant={"clip": VALUE_CLIP_OPTION.default, "half": False, "mode": "seq-mean-token-mean"},
    masked_zero=True,
    masked_zero_why=_REDUCER_MASK,
    documented_errors=(),
    whitening=None,
    domain=Domain(dtypes=("float32",), why=dict(_VALUE_F32)),
    pipeline=_value_pipeline(PIPELINE_GIT, "6ccdc7da6 / 3d2e0e411"),
    pipeline_by_pin={"0.0.2": _value_pipeline(PIPELINE_0_0_2, "0.0.2")},
    options=(VALUE_CLIP_OPTION, PER_TOKEN_LOSS_OPTION, ROLLOUT_TEMPERATURE_OPTION),
)

# policy-loss (loader: calls_kinds.load_policy): loss_function with --loss-type policy_loss (the argparse default),
# dispatched to policy_loss_function (W miles/backends/training_utils/loss.py:565, dispatch :1016-1017): ppo_kl = old -
# logp, zeroed with nan_to_num off the loss mask together with the advantages (:669-679), compute_policy_loss(ppo_kl,
# advantages, args.eps_clip, args.eps_clip_high) (:681; miles/utils/ppo_utils.py:178-201: max(-A r, -A clamp(r, 1 -
# eps_clip, 1 + eps_clip_high)), dual clip only when eps_clip_c is passed, which :681 never does), reduced by
# get_sum_of_sample_mean (cp_utils.py:92-121): the per-sample token mean by default, the token mean with
# --calculate-per-token-loss. Defaults: --eps-clip 0.2 (W miles/utils/arguments.py:882), --eps-clip-high None set to
# eps_clip (:883, :2051-2052), --eps-clip-c None (:884-889). Advantages per token (batch["advantages"], :596).
# G (6ccdc7da6 / 3d2e0e411; HEAD 31f1ca961 the same layout): policy_loss_function in loss_hub/losses.py:62 (dispatch
# get_loss_function), masking :169-178 (HEAD :196-205), compute_policy_loss(ppo_kl, advantages, eps_clip, eps_clip_high,
# eps_clip_c) :180-182 (HEAD :207-209; #1729 9525fc77f wired eps_clip_c), compute_policy_loss in
# loss_hub/math_utils.py:253-277; the log-softmax is called in loss_hub/logit_processors.py:178
# (calls_kinds.bind_policy_stand_ins binds each in the module that calls it).
EPS_CLIP_HIGH_OPTION = Option(
    "eps_clip_high",
    (None, 0.28),
    None,
    "W miles/backends/training_utils/loss.py:681 (args.eps_clip_high; --eps-clip-high miles/utils/arguments.py:883, "
    "default None = eps_clip, :2051-2052); G loss_hub/losses.py:180-182 (HEAD 31f1ca961 :207-209; --eps-clip-high "
    "3d2e0e411 arguments.py:1114, :2693-2694)",
    "PPO clip upper range (the flag's help): r is clamped to [1 - eps_clip, 1 + eps_clip_high] (DAPO's clip-higher)",
    effect={0.28: {"variant": {"clip_high": 0.28}}},
)
EPS_CLIP_C_OPTION = Option(
    "eps_clip_c",
    (None, 3.0),
    None,
    "--eps-clip-c W miles/utils/arguments.py:884-889 (default None); compute_policy_loss's eps_clip_c "
    "(miles/utils/ppo_utils.py:183, :191-197), which policy_loss_function never passes (W loss.py:681); G passes it "
    "(#1729 9525fc77f: loss_hub/losses.py:180-182, HEAD 31f1ca961 :207-209; math_utils.py:267-275)",
    "lower bound of the value for Dual-clip PPO (the flag's help, arXiv 1912.09729): where A < 0 the token loss is "
    "min(l, -c A)",
    effect={3.0: {"variant": {"dual_clip": 3.0}}},
)


def _policy_pipeline(base: Domain, pin: str) -> Domain:
    return Domain(
        dtypes=("float32",),
        left_padding=False,
        empty_rows=False,
        nonfinite_poison=False,
        masked_logprobs=False,
        why={
            "masked_logprobs": "log-probs and old log-probs are the actor's log-softmax before and after an update, "
            "under the mask as elsewhere",
            "left_padding": base.why["left_padding"],
            "empty_rows": base.why["empty_rows"],
            "dtypes": f"miles {pin}: "
            + (
                "policy logits must be float32 outside --true-on-policy-mode (W miles/backends/training_utils/"
                "loss.py:69-70, get_responses), so the log-probs are float32"
                if pin == "0.0.2"
                else "policy logits are float32 or bf16 outside --true-on-policy-mode (G miles/backends/training_utils/"
                "loss_hub/logit_processors.py:45) and calculate_log_probs_and_entropy computes the log-probs on a "
                "float32 copy (G loss_hub/math_utils.py:973, :983), so the log-probs are float32"
            )
            + "; the old log-probs are the same function's outputs (forward_only(get_log_probs_and_entropy))",
            "nonfinite_poison": f"miles {pin}: old log-probs are the actor's own log-softmax at every response token "
            "(W miles/backends/megatron_utils/actor.py compute_log_prob), masked tool tokens included, and the "
            "advantages GAE / GRPO outputs over finite rewards (" + base.produces["masked_values"] + "): nothing "
            "non-finite under the mask",
        },
        produces=_loss_produces(base, "0.0.2" if pin == "0.0.2" else "git"),
    )


KIND_OVERRIDES["policy-loss"] = dict(
    kind="policy-loss",
    variant={
        "clip_low": 0.2,
        "clip_high": 0.2,
        "dual_clip": None,
        "advantages": "token",
        "mode": "seq-mean-token-mean",
    },
    masked_zero=True,
    masked_zero_why=_REDUCER_MASK + "; W also zeroes ppo_kl and the advantages off the mask (loss.py:669-679)",
    documented_errors=(),
    whitening=None,
    domain=Domain(
        dtypes=("float32",),
        why={
            "dtypes": "policy logits must be float32: W asserts it outside --true-on-policy-mode (miles/backends/"
            "training_utils/loss.py:69-70, get_responses); float64 fails the assertion"
        },
    ),
    pipeline=_policy_pipeline(PIPELINE_GIT, "6ccdc7da6 / 3d2e0e411"),
    pipeline_by_pin={"0.0.2": _policy_pipeline(PIPELINE_0_0_2, "0.0.2")},
    options=(EPS_CLIP_HIGH_OPTION, EPS_CLIP_C_OPTION, PER_TOKEN_LOSS_OPTION),
)

# ---------------------------------------------------------------------------------------------
# Options and truncation.
# ---------------------------------------------------------------------------------------------
# A cut row is terminal. PR #1827 documents it (3d2e0e411, miles/backends/training_utils/loss_hub/math_utils.py:
# 624-626: "Truncated sequences use the same zero bootstrap as terminated ones: the value after the last trainable
# token is taken as 0 and the observed terminal reward is still applied"); the earlier pins pad with zero values
# and take 0 after the last response token (0.0.2 miles/utils/ppo_utils.py:582-583, 702; serial loop :511).
GAE_TRUNCATION = Truncation(
    cite="miles/backends/training_utils/loss_hub/math_utils.py:624-626 at 3d2e0e411 (#1827: zero bootstrap for "
    "truncated rows); 0.0.2 miles/utils/ppo_utils.py:582-583, 702 (zero value after the last response token)"
)
GRPO_STD_NORMALIZATION = Option(
    "grpo_std_normalization",
    (True, False),
    True,
    "miles/ray/rollout.py:659 at 0.0.2 (--disable-grpo-std-normalization, miles/utils/arguments.py:972); "
    "git 6ccdc7da6 / 3d2e0e411: miles/ray/rollout/train_data_conversion.py:187 (arguments.py:1206)",
    "off: Dr.GRPO (arXiv 2503.20783, the flag's help): the group mean is subtracted, no division by the std",
    effect={False: {"variant": {"std": None, "singleton": "zero"}}},
)
for _name in KIND_OVERRIDES:
    KIND_OVERRIDES[_name].setdefault("options", ())
    KIND_OVERRIDES[_name].setdefault("truncation", None)  # no notion of a cut row outside GAE
KIND_OVERRIDES["grpo"]["options"] = (GRPO_STD_NORMALIZATION,)

# ---------------------------------------------------------------------------------------------
# KL in the reward (`oracles/kinds/gae/kl_reward.py`): the trainer's own KL, shaping and estimator, in its order,
# through
# compute_advantages_and_returns (W miles/backends/training_utils/loss.py:291, G loss.py:19): compute_approx_kl(
# log_probs[i], ref_log_probs[i], kl_loss_type=args.kl_loss_type) per sample at every response token unless
# kl_coef == 0 (W loss.py:326-337, G loss.py:54-65), then
# * ppo: `k *= -args.kl_coef` at every response token; W adds the score at the last response token (`k[-1] +=
#   reward`, loss.py:349-355) and calls get_advantages_and_returns_batch without a mask (:356-358); G hands the
#   shaped KL and the scores as terminal_rewards to get_advantages_and_returns_batch (loss_hub/advantages.py:59-77),
#   which places the score itself (6ccdc7da6: the last response token, no mask; 3d2e0e411 (#1827): the last
#   trainable token, loss_masks passed, :74);
# * reinforce_plus_plus: get_reinforce_plus_plus_returns(kl=kl, kl_coef=args.kl_coef, ...) (W loss.py:360-370,
#   G advantages.py:78-88): `token_level_rewards = -kl_coef * full_kl_response`, NOT masked, the score at the last
#   loss_mask == 1 token, G_t = r_t + gamma G_{t+1} over every response token (W miles/utils/ppo_utils.py:412-423,
#   G loss_hub/math_utils.py:486-497).
# The estimator: --kl-loss-type default "k1" (W miles/utils/arguments.py:917-921, G :1148-1152), k1 =
# log_probs.float() - log_probs_base.float() unclamped (W miles/utils/ppo_utils.py:81-84, G math_utils.py:155-158;
# only low_var_kl is clamped). The coefficient: --kl-coef "KL penalty coefficient for reward shaping" (W
# arguments.py:892-896, G :1123-1127), default 0.00; 0.1 here.
KL_REWARD_VARIANT = {"kl_reward": {"coef": KL_COEF, "estimator": "k1", "clamp_d": None, "clamp": None}}
KL_REWARD_ENTRIES = ("gae-kl", "reinforce++-kl")
_KL_ONLY_GIT = (
    "miles 6ccdc7da6 / 3d2e0e411: the per-token rewards are only -kl_coef * KL "
    f"({_TB}/loss_hub/advantages.py:62-65; reinforce++ {_MU}:486); the rollout's reward is one scalar per sample "
    "(the terminal reward)"
)
_KL_ONLY_WHEEL = (
    f"miles-rl 0.0.2: the per-token rewards are only -kl_coef * KL ({_TB}/loss.py:349-355; reinforce++ "
    "miles/utils/ppo_utils.py:412); the rollout's reward is one scalar per sample"
)
_KL_LOGPROBS = (
    "log_probs are the actor's own log-softmax of the sampled tokens at every response token (tool tokens "
    "included), ref_log_probs the reference model's: log-probabilities under the mask as elsewhere"
)


def _kl_pipeline(base: Domain, only: str, dtypes: tuple[str, ...] | None = None, why_dtypes: str = "") -> Domain:
    """A KL-in-the-reward entry's pipeline: the entry's own, with no token reward beyond the KL and masked
    log-probs that are log-probabilities."""
    why = {**base.why, "token_rewards": only, "masked_logprobs": _KL_LOGPROBS}
    if dtypes is not None:
        why["dtypes"] = why_dtypes
    return dataclasses.replace(base, dtypes=dtypes or base.dtypes, token_rewards=False, masked_logprobs=False, why=why)


_KL_API_WHY = (
    "miles' per-token rewards are only the KL the trainer computes from log_probs / ref_log_probs "
    f"({_TB}/loss_hub/advantages.py:62-65 at the git pins): the case's token rewards are 0"
)
KL_OVERRIDES = {
    "gae-kl": dict(
        kind="gae",
        variant=KL_REWARD_VARIANT,
        domain=Domain(
            dtypes=("float32", "bfloat16", "float16"),
            token_rewards=False,
            why={
                "dtypes": "the PPO caller computes the KL .float() (W miles/utils/ppo_utils.py:81, G "
                f"{_MU}:155); float64 is left out as for the GAE entries",
                "token_rewards": _KL_API_WHY,
            },
        ),
        pipeline=_kl_pipeline(PIPELINE_GIT, _KL_ONLY_GIT),
        pipeline_by_pin={"0.0.2": _kl_pipeline(PIPELINE_0_0_2, _KL_ONLY_WHEEL)},
    ),
    "reinforce++-kl": dict(
        KIND_OVERRIDES["reinforce++"],
        variant=KL_REWARD_VARIANT,
        domain=Domain(
            critic=False,
            token_rewards=False,
            dtypes=_NO_F64,
            why={"dtypes": F32_WHY["reinforce++"], "token_rewards": _KL_API_WHY},
        ),
        pipeline=_kl_pipeline(PIPELINE_GIT, _KL_ONLY_GIT, ("float32",), F32_WHY["reinforce++"]),
        pipeline_by_pin={"0.0.2": _kl_pipeline(PIPELINE_0_0_2, _KL_ONLY_WHEEL, ("float32",), F32_WHY["reinforce++"])},
    ),
}

# ---------------------------------------------------------------------------------------------
# The framework's own words (`oracles.promises.Promise`), quoted, one per line range and pin group (W = the 0.0.2
# wheel, G = the git pins 6ccdc7da6 / 3d2e0e411, the same lines at both unless said). miles is slime's fork: the
# same words, at miles' own files and lines.
# ---------------------------------------------------------------------------------------------
_W, _G = ("0.0.2",), ("6ccdc7da6", "3d2e0e411")
WHITEN_PROMISES = (
    Promise(
        f"upstream:{_TB}/loss.py:297-299",
        "When `args.normalize_advantages` is True, advantages are whitened across the data-parallel group using "
        "masked statistics.",
        covers=("mechanism:masked-statistics",),
        note="compute_advantages_and_returns' docstring: the whitening mean and variance are over loss_mask 1 tokens",
        pins=_W,
    ),
    Promise(
        f"upstream:{_TB}/loss.py:26-28",
        "When `args.normalize_advantages` is True, advantages are whitened across the data-parallel group using "
        "masked statistics.",
        covers=("mechanism:masked-statistics",),
        note="compute_advantages_and_returns' docstring: the whitening mean and variance are over loss_mask 1 tokens",
        pins=_G,
    ),
)
# PR #1827 (3d2e0e411): get_advantages_and_returns_batch's docstring states the compressed contract
_GAE_1827 = f"upstream:{_MU}"
GAE_1827_PROMISES = (
    Promise(
        f"{_GAE_1827}:615-619",
        "Masked tokens (`loss_mask == 0`, e.g. tool/env observations in multi-turn rollouts) are not MDP transitions. "
        "GAE runs on the subsequence of trainable tokens, so masked tokens carry no reward (including KL shaping), "
        "contribute no value delta, and the GAE carry crosses them without extra `gamma * lambd` decay.",
        covers=("reference", "gap-invariance", "telescoping", "mechanism:extra-decay"),
        note="#1827's docstring: the compressed contract the entry is judged against",
        pins=("3d2e0e411",),
    ),
    Promise(
        f"{_GAE_1827}:620-621",
        "The terminal reward is added at the last trainable token, not the last response token.",
        covers=("score-kept", "mechanism:score-lost"),
        note="#1827's docstring: the score's placement",
        pins=("3d2e0e411",),
    ),
    Promise(
        f"{_GAE_1827}:627",
        "This function outputs zero advantages and returns at masked positions.",
        covers=("masked-zero",),
        note="#1827's docstring: the function itself promises zeros at masked positions (whatever its consumers do)",
        pins=("3d2e0e411",),
    ),
)
# REINFORCE++: the function says which paper it implements; the paper has no mask, so it covers the unmasked case
REINFORCE_PP_PROMISES = (
    Promise(
        "upstream:miles/utils/ppo_utils.py:380",
        "Calculates discounted returns for REINFORCE++ (https://arxiv.org/pdf/2501.03262)",
        covers=("all-trainable",),
        note="get_reinforce_plus_plus_returns' docstring; with every token trainable no mask applies",
        pins=_W,
    ),
    Promise(
        f"upstream:{_MU}:456",
        "Calculates discounted returns for REINFORCE++ (https://arxiv.org/pdf/2501.03262)",
        covers=("all-trainable",),
        note="get_reinforce_plus_plus_returns' docstring; with every token trainable no mask applies",
        pins=_G,
    ),
)
KL_PROMISES = (
    Promise(
        "upstream:miles/utils/ppo_utils.py:72-73",
        "Compute the approximate KL divergence between two distributions. Schulman blog: "
        "http://joschu.net/blog/kl-approx.html",
        covers=("reference",),
        note="compute_approx_kl's docstring names the blog's estimators (k1, k2, k3)",
        pins=_W,
    ),
    Promise(
        f"upstream:{_MU}:146-147",
        "Compute the approximate KL divergence between two distributions. Schulman blog: "
        "http://joschu.net/blog/kl-approx.html",
        covers=("reference",),
        note="compute_approx_kl's docstring names the blog's estimators (k1, k2, k3)",
        pins=_G,
    ),
)
# --rollout-sample-filter-path: a removed sample (remove_sample, loss mask zeroed) is excluded from the loss; the
# step's denominators count it (global_batch_size, W loss.py:1048-1058, G :158-173; num_tokens clamp_min(., 1), W :1003,
# G :127)
_FILTER_TEXT = "To exclude a sample from the loss, set `sample.remove_sample = True`."
_FILTER_NOTE = (
    "--rollout-sample-filter-path's help: a removed sample (its loss mask zeroed, W miles/ray/rollout.py:701-702, G "
    "miles/ray/rollout/train_data_conversion.py:85-86) is excluded from the loss, so no denominator may count it; "
    "empty_rows='counted' or 'the loss equals the mode's over every position' is that sample counted"
)
FILTER_PROMISES = (
    Promise(
        "upstream:miles/utils/arguments.py:1545",
        _FILTER_TEXT,
        covers=("mechanism:masked-statistics", "mechanism:variant-mismatch"),
        note=_FILTER_NOTE,
        pins=_W,
    ),
    Promise(
        "upstream:miles/utils/arguments.py:2070",
        _FILTER_TEXT,
        covers=("mechanism:masked-statistics", "mechanism:variant-mismatch"),
        note=_FILTER_NOTE,
        pins=_G,
    ),
)
# the documented reducers (the git docs; the wheel ships none)
DOCS_LOSS_PROMISE = Promise(
    "upstream:docs/user-guide/training-script-walkthrough.md:217-219",
    "The default reduction is per-sample mean: `mean(sum(sample_i) / len(sample_i))`. Add "
    "`--calculate-per-token-loss` to switch to `sum(sum(sample_i)) / sum(len(sample_i))`",
    covers=("reference",),
    note="the walkthrough's 'Per-sample vs. per-token loss': the reducer of every loss term over the step",
    pins=_G,
)
EPS_CLIP_C_PROMISES = (
    Promise(
        "upstream:miles/utils/arguments.py:884-889",
        "lower bound of the value for Dual-clip PPO from https://arxiv.org/pdf/1912.09729",
        covers=("mechanism:variant-mismatch",),
        note="--eps-clip-c's help: set, the token loss where A < 0 is min(l, -c A); 0.0.2's policy_loss_function "
        "never passes it (W loss.py:681), fixed by #1729 (9525fc77f); a loss equal to the variant without the dual "
        "clip (variant-mismatch, dual_clip=None) breaks it",
        pins=_W,
    ),
    Promise(
        "upstream:miles/utils/arguments.py:1115-1120",
        "lower bound of the value for Dual-clip PPO from https://arxiv.org/pdf/1912.09729",
        covers=("mechanism:variant-mismatch",),
        note="--eps-clip-c's help (passed to compute_policy_loss at these pins, loss_hub/losses.py:180-182)",
        pins=_G,
    ),
)
TEMPERATURE_PROMISE = Promise(
    "upstream:miles/utils/arguments.py:304-307",
    "the temperature for the inference engine during rollout.",
    covers=("mechanism:unexplained",),
    note="--rollout-temperature's help at 0.0.2: it is the inference engine's; 0.0.2's get_responses divides the value "
    "logits by it too (W loss.py:80, through get_values :262-272), so a value loss that moves with it breaks it (the "
    "diagnosis has no mechanism for an option that must have no effect: unexplained); #1190 (cc93d97c4) guards it",
    pins=_W,
)
KIND_OVERRIDES["grpo"]["promises"] = WHITEN_PROMISES
KIND_OVERRIDES["whiten"]["promises"] = WHITEN_PROMISES
for _name in ("kl", "kl-k2", "kl-k3", "kl-low-var"):
    KIND_OVERRIDES[_name]["promises"] = KL_PROMISES
KIND_OVERRIDES["reinforce++"]["promises"] = WHITEN_PROMISES + REINFORCE_PP_PROMISES
KL_OVERRIDES["reinforce++-kl"]["promises"] = WHITEN_PROMISES + REINFORCE_PP_PROMISES
KL_OVERRIDES["gae-kl"]["promises"] = WHITEN_PROMISES + GAE_1827_PROMISES
for _name in ("agg-seq-mean-token-mean", "agg-token-mean"):
    KIND_OVERRIDES[_name]["promises"] = FILTER_PROMISES + (DOCS_LOSS_PROMISE,)
KIND_OVERRIDES["value-loss"]["promises"] = FILTER_PROMISES + (TEMPERATURE_PROMISE, DOCS_LOSS_PROMISE)
# eps-clip-c first: it and the filter both cover variant-mismatch (a dual clip off, a removed sample counted); a case
# with --eps-clip-c set is what the dual clip's finding is, and a removed sample counted in such a case is misnamed
KIND_OVERRIDES["policy-loss"]["promises"] = EPS_CLIP_C_PROMISES + FILTER_PROMISES + (DOCS_LOSS_PROMISE,)
# --advantage-estimator gspo (calls_kinds.POLICY_SETTINGS): ppo_kl = the masked row mean of old - logp, the gradient
# through the mean (miles/utils/ppo_utils.py:148-174, loss.py:647-653 at 0.0.2): "sequence-mean".
# The filter's promise first: a counted empty row, what GSPO's draws meet first, is a removed sample counted
_GSPO_PROMISES = FILTER_PROMISES + EPS_CLIP_C_PROMISES + (DOCS_LOSS_PROMISE,)
_GSPO_VARIANT = {**KIND_OVERRIDES["policy-loss"]["variant"], "ratio": "sequence-mean"}
KIND_OVERRIDES["policy-gspo"] = dict(KIND_OVERRIDES["policy-loss"], variant=_GSPO_VARIANT, promises=_GSPO_PROMISES)

SPEC = TargetSpec(
    id="miles",
    first_run=('default', 'grpo', 'policy-loss'),
    adapter="maskfuzz.targets.miles.calls",
    own=("miles",),
    contract="compressed",
    git_url="https://github.com/radixark/miles.git",
    package="miles-rl",
    pins=(
        Pin("0.0.2", "only usable release (May 2026), old location miles/utils/ppo_utils.py", default=True),
        Pin("6ccdc7da6", "first parent of PR #1827: GAE over every response token, no loss mask", kind="git"),
        Pin("3d2e0e411", "PR #1827: run PPO GAE over trainable tokens only", kind="git"),
    ),
    entries=(
        "default",
        "vanilla",
        *KIND_ENTRIES,
        *LOSS_ENTRIES,
        *VALUE_ENTRIES,
        *POLICY_ENTRIES,
        *KL_REWARD_ENTRIES,
    ),
    stand_ins=COMMON_HEAVY + ("httpx",),
    deny=("fla",),
    domain=Domain(
        dtypes=("float32", "bfloat16", "float16"),
        why={
            "dtypes": "pins before PR #1720 are reached through the PPO caller, which "
            + FLOAT64_WHY
            + " (one domain per target, so float64 is left out at every pin)"
        },
    ),
    pipeline=PIPELINE_GIT,
    pipeline_by_pin={"0.0.2": PIPELINE_0_0_2},
    notes=(
        "contract: compressed. PR #1827 documents it (GAE over the trainable subsequence, zero "
        "bootstrap after the last trainable token, score on the last trainable token, 0 at masked "
        "positions, all-masked rows dropped) and its tests pin it. Earlier pins took no mask at all "
        "and document no masked semantics; they are judged against the same contract so that the "
        "history is comparable and bisection finds #1827 as the fix. Entries: default = as the PPO "
        "path calls it (chunked_gae where the `chunked` flag exists); vanilla = chunked=False. "
        "Beyond GAE (targets/miles/calls_kinds.py): grpo, kl, kl-k2, kl-k3, kl-low-var, whiten, reinforce++, agg-*, "
        "value-loss, policy-loss; KL in the reward: gae-kl (this adapter), reinforce++-kl."
    ),
    entry_overrides={**KIND_OVERRIDES, **KL_OVERRIDES},
    truncation=GAE_TRUNCATION,
    promises=WHITEN_PROMISES + GAE_1827_PROMISES,
)

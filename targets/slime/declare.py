"""Adapter for slime: `slime/utils/ppo_utils.py::get_advantages_and_returns_batch`, reached through
its PPO caller `slime/backends/megatron_utils/loss.py::compute_advantages_and_returns`.

How slime gets a batch into GAE (read at HEAD 624b824a8, at 166441911 and at 8c912177c, where batched
GAE appeared; pins before about Dec 2025 import triton, yaml, pandas, ... on the way to the caller and
are not registered):

* Inputs are per-sample lists, no padding: `response_lengths[i]` tokens of response (assistant and
  tool/observation tokens alike), `values[i]` and per-token KL of shape [response_lengths[i]],
  `loss_masks[i]` (torch.int, 1 = trainable) and a scalar `rewards[i]`.
* The caller turns KL into token rewards (`-kl_coef * kl`) and adds the scalar reward to the *last
  response token* (`token_level_rewards[-1] += reward`), then calls
  `get_advantages_and_returns_batch(total_lengths, response_lengths, values, rewards, gamma, lambd)`:
  GAE over every response token, the loss mask is never passed. That placement is slime's own code,
  so the adapter calls the caller rather than placing the score itself.
* `get_advantages_and_returns_batch` imports `megatron.core.mpu` inside the call and asks it for
  the context-parallel size; the caller asks for the CP rank and whether this is the last
  pipeline stage. The adapter provides that *state* as a small `megatron.core.mpu` module (CP size
  1, CP rank 0, last pipeline stage), exactly the stub slime's own tests install
  (`tests/_cp_dist_helpers.py`, `tests/test_advantage_whiten_cp.py`). megatron is not the code
  under test; any other use of it would raise AttributeError, loudly.

Mapping of the canonical case (B x T, see oracles/case.py): a row's real tokens (its `attention`
run) are the sample's response; padding, left or right, does not exist in slime's per-sample lists
and is dropped; `trainable` on the run is `loss_masks[i]`; `values` and `token_rewards` on the run
are `values[i]` and the token rewards; the score is `rewards[i]`. Token rewards enter as slime's
KL (`log_probs = 0`, `ref_log_probs = token_rewards`, `kl_loss_type = "k1"`, `kl_coef = 1`, so
`-kl_coef * (0 - r) = r` exactly). Outputs come back per sample and are scattered to the real
positions; padding positions are 0.

Pipeline domain (`SPEC.pipeline` at 624b824a8, `pipeline_by_pin` for 166441911: same facts, other
lines): what slime's own rollout and PPO caller hand the function. Narrowed: dtypes to float32 (the
value head is asserted float32, KL is cast `.float()`), no left padding (per-sample lists of exactly
`response_lengths[i]` tokens; there is no padding at all), no non-finite poison (values are critic
outputs, rewards log-prob differences; tool tokens carry log-prob 0.0). Everything else is reachable
and stays permissive: gaps and observation tails (tool tokens appended with loss_mask 0 by
`Sample.append_response_tokens(trainable=False)` and the search-r1 / retool generators), leading
masked tokens (`--mask-offpolicy-in-partial-rollout`), all-masked rows (`remove_sample`), KL rewards
and critic values at every response token, unmasked.
Each of these is cited in the domain's `produces` with the line that builds it (a pipeline witness may
use only those, `Domain.produced_only`); slime's own promises are declared per entry and pin (`Promise`,
the section before `SPEC`).

This module is the declaration; the calls the worker runs are `calls.py` (GAE, and the shared machinery:
mpu state, per-sample lists, caller arguments, which also serves the miles adapter, miles being a fork of
slime whose older pins run the same caller) and `calls_kinds.py` (the other kinds).
"""

from __future__ import annotations

import dataclasses

from maskfuzz.oracles.domain import Domain
from maskfuzz.oracles.promises import Promise
from maskfuzz.oracles.whitening import Whitening
from maskfuzz.targets.registry import COMMON_HEAVY, Option, Pin, TargetSpec, Truncation
from maskfuzz.targets.slime.calls import KL_COEF, KL_ESTIMATOR

FLOAT64_WHY = (
    "the PPO caller computes per-token rewards as KL in float32 (compute_approx_kl casts with "
    ".float()), so a float64 case would only measure that rounding"
)


def slime_pipeline(pin: str, lines: dict) -> Domain:
    """slime's pipeline domain at `pin`; `lines` holds the pin's line numbers for each citation
    (the facts are the same at both registered pins, the lines are not)."""
    g = lines
    return Domain(
        dtypes=("float32",),
        left_padding=False,
        empty_rows=False,
        nonfinite_poison=False,
        why={
            "empty_rows": f"slime {pin}: slime/utils/arguments.py:{g['one_token']} keeps rollout_max_prompt_len <= "
            "rollout_max_context_len - 1 'so that there is at least one generated token to compute loss', and "
            f"prompts longer are filtered (slime/rollout/data_source.py:{g['filter']})",
            "dtypes": f"slime {pin}: critic values are value-head logits asserted float32 "
            f"(slime/backends/megatron_utils/loss.py:{g['assert_fp32']}, get_values "
            f"slime/backends/megatron_utils/loss.py:{g['values']}); token rewards are -kl_coef * KL with KL "
            f"cast .float() (slime/utils/ppo_utils.py:28) or float32 zeros "
            f"(slime/backends/megatron_utils/loss.py:{g['kl_zeros']}); GAE runs in values dtype "
            f"(slime/utils/ppo_utils.py:{g['gae_dtype']})",
            "left_padding": f"slime {pin}: per-sample unpadded lists, loss_masks[i] has exactly "
            f"response_lengths[i] entries (slime/ray/rollout.py:{g['masks']}) and values/KL are cut per "
            f"response (slime/backends/megatron_utils/loss.py:{g['values']}); there is no padding at all",
            "nonfinite_poison": f"slime {pin}: values are value-head outputs "
            f"(slime/backends/megatron_utils/loss.py:{g['values']}), token rewards differences of "
            f"log-probs (slime/utils/ppo_utils.py:28, slime/backends/megatron_utils/loss.py:{g['caller']}); "
            "tool tokens get rollout log-prob 0.0, so nothing non-finite sits under the mask by construction",
        },
        # what slime's own code at the pin produces (`Domain.produces`): a pipeline witness may use only these
        produces={
            "gaps": f"slime {pin}: {g['gaps']}",
            "masked_real_tail": f"slime {pin}: {g['tail']}",
            "leading_mask": f"slime {pin}: slime/rollout/sglang_rollout.py:{g['partial']} (--partial-rollout with "
            "--mask-offpolicy-in-partial-rollout sets the loss mask of a resumed response to zeros), then the new "
            f"tokens are appended trainable (slime/rollout/sglang_rollout.py:{g['append']})",
            "all_masked_rows": f"slime {pin}: slime/ray/rollout.py:{g['remove']} (a sample with remove_sample set "
            "keeps its tokens and gets loss_mask [0] * response_length; it stays in the batch)",
            "masked_values": f"slime {pin}: slime/backends/megatron_utils/loss.py:{g['values']} (get_values: the "
            f"value head at every response token) through forward_only(get_values) "
            f"(slime/backends/megatron_utils/actor.py:{g['critic']}); the value loss reduces under loss_masks "
            "only, so the values under tool tokens are never trained",
            "masked_rewards": f"slime {pin}: slime/backends/megatron_utils/loss.py:{g['kl']} "
            "(compute_approx_kl(log_probs, ref_log_probs) at every response token when --kl-coef != 0) and "
            f":{g['caller']} (token rewards -kl_coef * kl, unmasked); a tool token's KL is not 0: ref_log_probs are "
            f"the reference model's at every response token (slime/backends/megatron_utils/actor.py:{g['ref']}; "
            f"loaded when kl_coef != 0, slime/ray/placement_group.py:{g['with_ref']}), log_probs the actor's "
            f"recompute (slime/backends/megatron_utils/actor.py:{g['recompute']}) or, with --use-rollout-logprobs, "
            f"the rollout's 0.0 of a tool token ({g['zero_logp']})",
            "token_rewards": f"slime {pin}: slime/backends/megatron_utils/loss.py:{g['caller']} (-kl_coef * kl at "
            "every response token, trainable ones included, when --kl-coef != 0)",
            "truncated_rows": f"slime {pin}: slime/utils/types.py:{g['truncated']} (finish_reason 'length' -> "
            "Sample.Status.TRUNCATED, carried to the trainer by slime/ray/rollout.py)",
        },
    )


PIPELINE_HEAD = slime_pipeline(
    "624b824a8",
    {
        "assert_fp32": 128,
        "values": "607-649",
        "kl_zeros": 746,
        "gae_dtype": 508,
        "masks": "671-683",
        "caller": "770-780",
        "gaps": "slime/agent/trajectory.py:204-211 (a later turn's prompt tail, the tool output, appended with "
        "loss_mask 0, then the turn's response with loss_mask 1); examples/search-r1/generate_with_search.py:244 "
        "(an observation appended with trainable=False, loss_mask 0 by slime/utils/types.py:292), then the next "
        "turn's tokens trainable (:220-225)",
        "tail": "examples/search-r1/generate_with_search.py:179, 244 (each turn of the max_turns loop ends by "
        "appending the observation with trainable=False: when the turns run out the response ends on it; the "
        "multi-turn recipe of docs/en/get_started/quick_start.md:503-520 has the same shape)",
        "partial": "232-233",
        "append": "212-219",
        "remove": "680-681",
        "critic": "403",
        "kl": "743-754",
        "ref": "435-446",
        "with_ref": "178",
        "recompute": "473-490",
        "zero_logp": "slime/utils/types.py:281",
        "truncated": "410-412",
        "one_token": "2027-2035",
        "filter": "75",
    },
)
PIPELINE_166441911 = slime_pipeline(
    "166441911",
    {
        "assert_fp32": 59,
        "values": "175-216",
        "kl_zeros": 259,
        "gae_dtype": 404,
        "masks": "355-367",
        "caller": "278-288",
        "gaps": "examples/search-r1/generate_with_search.py:214-217 (an observation appended with loss_mask 0), then "
        "the next turn's tokens with loss_mask 1 (:197-200); examples/retool/generate_with_retool.py:313, :294",
        "tail": "examples/search-r1/generate_with_search.py:160, 214-217 (each turn of the max_turns loop ends by "
        "appending the observation with loss_mask 0: when the turns run out the response ends on it); "
        "examples/retool/generate_with_retool.py:232, 313",
        "partial": "203-204",
        "append": "168-175",
        "remove": "364-365",
        "critic": "365-372",
        "kl": "256-268",
        "ref": "403-408",
        "with_ref": "151",
        "recompute": "417-422",
        "zero_logp": "examples/search-r1/generate_with_search.py:220-221",
        "truncated": "164-166",
        "one_token": "1692-1700",
        "filter": "69",
    },
)


# ---------------------------------------------------------------------------------------------
# Options and truncation (lines at 624b824a8; 166441911 where it differs).
# ---------------------------------------------------------------------------------------------
NORMALIZE_ADVANTAGES = Option(
    "normalize_advantages",
    (False, True),
    False,
    "slime/backends/megatron_utils/loss.py:819 (--normalize-advantages, slime/utils/arguments.py:1004; "
    "166441911: loss.py:333)",
    "advantages are whitened across the data-parallel(-with-context-parallel) group using masked statistics "
    "(compute_advantages_and_returns' docstring, loss.py:710-712): distributed_masked_whiten, Bessel-corrected "
    "variance, epsilon 1e-8 under the rsqrt, shift_mean=True (slime/utils/distributed_utils.py:111-171)",
    effect={True: {"whitening": Whitening(unbiased=True, eps=1e-8, shift_mean=True)}},
)
# slime has no notion of a cut row in its math: the rollout's `truncated` flag (slime/ray/rollout.py:664) is
# carried to the trainer (:791) and read by nothing but metrics; GAE pads the per-sample lists with zero values
# and takes the value after the last response token as 0 (slime/utils/ppo_utils.py:531-538, chunked_gae :707-710,
# vanilla_gae :600; 166441911: the serial loop's `nextvalues = ... else 0.0`, :355): a cut row is terminal.
GAE_TRUNCATION = Truncation(
    cite="slime/utils/ppo_utils.py:531-538, 707-710 (zero value after the last response token; the rollout's "
    "`truncated` flag, slime/ray/rollout.py:664, never reaches GAE)"
)


# ---------------------------------------------------------------------------------------------
# Entries beyond GAE (loaders in targets/slime/calls_kinds.py); lines at 624b824a8.
# ---------------------------------------------------------------------------------------------
# = miles' calls_kinds.KIND_ENTRIES
KIND_ENTRIES = ("grpo", "kl", "kl-k2", "kl-k3", "kl-low-var", "whiten", "reinforce++")
_F32 = {
    "grpo": "the group statistics run on torch.tensor(raw_rewards, dtype=torch.float) (slime/ray/rollout.py:618) "
    "and the broadcast on float32 rewards and KL (slime/backends/megatron_utils/loss.py:746, 764): the case's "
    "dtype reaches nothing",
    "kl": "compute_approx_kl casts both inputs .float() (slime/utils/ppo_utils.py:28): a float64 case would only "
    "measure that cast",
    "whiten": "distributed_masked_whiten packs its sums into a float32 tensor (slime/utils/distributed_utils.py:"
    "140-145); the advantages it whitens are float32 (slime/backends/megatron_utils/loss.py:746, 764, 784)",
    "reinforce++": "the scores are a float32 tensor and the KL float32 (slime/backends/megatron_utils/loss.py:784, "
    "compute_approx_kl .float() slime/utils/ppo_utils.py:28)",
}
_NO_F64 = ("float32", "bfloat16", "float16")


def _kinds_pipeline(why_dtypes: str, dtypes: tuple[str, ...] = ("float32",)) -> dict:
    """Pipeline domains of a kind entry: the GAE narrowings (per-sample lists, no padding, no empty
    response, nothing non-finite) with the entry's dtypes."""

    def narrow(base: Domain) -> Domain:
        return dataclasses.replace(base, dtypes=dtypes, why={**base.why, "dtypes": why_dtypes})

    return {"pipeline": narrow(PIPELINE_HEAD), "pipeline_by_pin": {"166441911": narrow(PIPELINE_166441911)}}


KIND_OVERRIDES: dict = {
    "grpo": dict(
        kind="group-advantage",
        # estimator grpo, std unbiased (torch .std(), slime/ray/rollout.py:628), eps 1e-6 outside the std (:629):
        # the defaults. Singletons give std NaN (no rule, left canonical). Rows with an all-zero loss mask
        # (remove_sample, slime/ray/rollout.py:680-681) count in their group's statistics by design: the filter's
        # help says "This attribute does not determine whether the sample participates in advantage
        # normalization." (slime/utils/arguments.py:1437; 166441911 :1245), and _post_process_rewards runs on every
        # sample before the loss masks are read (rollout.py:642 before :680): empty_rows "counted".
        variant={"empty_rows": "counted"},
        domain=Domain(dtypes=("float32",), why={"dtypes": _F32["grpo"]}),
        masked_zero=False,
        masked_zero_why="get_grpo_returns broadcasts the normalised scalar over every response token, "
        "torch.ones_like(kl[i]) * rewards[i] (slime/utils/ppo_utils.py:367); the loss masks it",
        **_kinds_pipeline(_F32["grpo"]),
    ),
    **{
        name: dict(
            kind="kl",
            variant=variant,
            domain=Domain(dtypes=_NO_F64, why={"dtypes": _F32["kl"]}),
            masked_zero=False,
            masked_zero_why="compute_approx_kl takes no mask (slime/utils/ppo_utils.py:11-51)",
            **_kinds_pipeline(_F32["kl"], _NO_F64),
        )
        for name, variant in (
            ("kl", {"estimator": "k1"}),  # --kl-loss-type default k1 (slime/utils/arguments.py:934-939)
            ("kl-k2", {"estimator": "k2"}),  # k2 = log_ratio**2 / 2, unclamped (slime/utils/ppo_utils.py:32-33)
            ("kl-k3", {"estimator": "k3"}),  # k3 unclamped (slime/utils/ppo_utils.py:48-49 clamps low_var_kl only)
            ("kl-low-var", {"estimator": "low_var_kl", "clamp": (-10.0, 10.0)}),  # slime/utils/ppo_utils.py:48-49
        )
    },
    "whiten": dict(
        kind="normalization",
        # batch level, unbiased (Bessel when n >= 2, slime/utils/distributed_utils.py:161-163), eps 1e-8 inside
        # the rsqrt (:166), shift_mean True (loss.py:871-875): the defaults
        variant={},
        domain=Domain(dtypes=_NO_F64, why={"dtypes": _F32["whiten"]}),
        masked_zero=False,
        masked_zero_why="(values - global_mean) * rsqrt(var + eps) at every position "
        "(slime/utils/distributed_utils.py:166); the loss masks it",
        documented_errors=(r"ValueError: The global mask sum across all participating GPUs is zero",),
        **_kinds_pipeline(_F32["whiten"]),
    ),
    "reinforce++": dict(
        kind="returns",
        # every response token is a step: chunked_discounted_returns over the right-padded rows
        # (slime/utils/ppo_utils.py:430, 610-692), KL masked (:416), the score at the last loss_mask == 1 token (:419)
        contract="dense",
        whitening=None,  # --normalize-advantages is off by default (slime/utils/arguments.py:1004)
        domain=Domain(critic=False, dtypes=_NO_F64, why={"dtypes": _F32["reinforce++"]}),
        masked_zero=False,
        masked_zero_why="the returns are kept at every response token (slime/utils/ppo_utils.py:432-442); "
        "the loss masks them",
        **_kinds_pipeline(_F32["reinforce++"]),
    ),
}


# loss-aggregation (loaders: calls_kinds.load_loss): loss_function (slime/backends/megatron_utils/loss.py:1283 at
# 624b824a8, :767 at 166441911) with its own reducer get_sum_of_sample_mean (cp_utils.py:47 / :53), Megatron path
LOSS_ENTRIES = ("agg-seq-mean-token-mean", "agg-token-mean", "agg-rollout-mean")  # = calls_kinds.SLIME_LOSS_ENTRIES
VALUE_ENTRIES = ("value-loss",)  # = calls_kinds.VALUE_ENTRIES (value_loss_function through loss_function)
POLICY_ENTRIES = ("policy-loss", "policy-gspo")  # = calls_kinds.POLICY_ENTRIES (policy_loss_function, loss_function)


def _loss_pipeline(base: Domain, pin: str, fp32: str) -> Domain:
    """The loss entries' pipeline at `pin`: per-sample lists (no padding), a response of one token at least,
    float32 per-token losses, nothing non-finite under the mask."""
    return Domain(
        dtypes=("float32",),
        left_padding=False,
        empty_rows=False,
        nonfinite_poison=False,
        why={
            "left_padding": base.why["left_padding"],
            "empty_rows": base.why["empty_rows"],
            "dtypes": f"slime {pin}: the per-token losses (pg, KL, entropy) come from log-probs of logits asserted "
            f"float32 (slime/backends/megatron_utils/loss.py:{fp32}, get_log_probs_and_entropy)",
            "nonfinite_poison": f"slime {pin}: the per-token losses are computed at every response token from the "
            f"actor's float32 log-probs (slime/backends/megatron_utils/loss.py:{fp32}) and old log-probs the actor "
            "recomputes; masked tool tokens carry ordinary log-probs, nothing non-finite by construction",
        },
        produces={
            **{k: base.produces[k] for k in ("gaps", "masked_real_tail", "leading_mask", "all_masked_rows")},
            "uneven_splits": f"slime {pin}: {_UNEVEN[pin]}",
        },
    )


# micro-batches of different row counts: what slime's loader cuts with --use-dynamic-batch-size (every rank runs the
# same number of them); the api domain stays permissive (the static path's fixed micro_batch_size is one shape of many)
_UNEVEN = {
    "624b824a8": "slime/utils/dp_schedule.py:65-76 (--use-dynamic-batch-size: a step's samples packed first-fit by "
    "tokens, first_fit_pack, or balanced with equal_size=False: micro-batches of different row counts; every rank "
    "runs the same number of them, :26-27)",
    "166441911": "slime/backends/megatron_utils/data.py:334-344 (--use-dynamic-batch-size: "
    "get_seqlen_balanced_partitions(samples, num_mbs, equal_size=False): micro-batches of different row counts, "
    "the same number on every rank after the all-reduce MAX, :321-322)",
}


def _loss(mode: str) -> dict:
    return dict(
        kind="loss-aggregation",
        # the documented modes (docs/en/get_started/usage.md:206 at 624b824a8): "mean(sum(sample_i) /
        # len(sample_i))" per sample by default, "sum(sum(sample_i)) / sum(len(sample_i))" with
        # --calculate-per-token-loss; the per-rollout mean over samples sharing Sample.rollout_id
        # (slime/utils/types.py:99-106, slime/ray/rollout.py:688-700). Empty rows excluded: a removed sample
        # "will not participate in loss calculation" (slime/utils/arguments.py:1434), so the canonical
        # variant, and denominators that count it are reported.
        variant={"mode": mode},
        masked_zero=True,
        masked_zero_why="(x_i * loss_mask_i).sum() (slime/backends/megatron_utils/cp_utils.py:76, :86 at 624b824a8; "
        ":70, :78 at 166441911)",
        documented_errors=(),
        whitening=None,
        domain=Domain(),
        pipeline=_loss_pipeline(PIPELINE_HEAD, "624b824a8", "535"),
        pipeline_by_pin={"166441911": _loss_pipeline(PIPELINE_166441911, "166441911", "134")},
    )


KIND_OVERRIDES["agg-seq-mean-token-mean"] = _loss("seq-mean-token-mean")
KIND_OVERRIDES["agg-token-mean"] = _loss("token-mean")
KIND_OVERRIDES["agg-rollout-mean"] = _loss("prompt-mean")  # groups = rollouts (Sample.rollout_id)

# value-loss (loader: calls_kinds.load_value): loss_function with --loss-type value_loss, the critic's (actor.py:407;
# 166441911 :380), dispatched to value_loss_function (loss.py:1176, :1330-1331; 166441911 :658, :811):
# max((v_c - R)^2, (v - R)^2), v_c = old + clamp(v - old, -value_clip, value_clip), NO factor 1/2 (:1212-1216;
# 166441911 :695-699), reduced by the actor's get_sum_of_sample_mean: the per-sample token mean by default
# (seq-mean-token-mean, docs/en/get_started/usage.md:206), the token mean with --calculate-per-token-loss (the
# option below); samples carry no rollout_id in the critic's data (one rollout per sample). Empty rows excluded,
# as for the agg entries (a removed sample "will not participate in loss calculation", arguments.py:1434).
VALUE_CLIP_OPTION = Option(
    "value_clip",
    (0.2, 0.5, 10.0),
    0.2,
    "slime/backends/megatron_utils/loss.py:1212-1213 (args.value_clip; --value-clip slime/utils/arguments.py:907, "
    "default 0.2; 166441911: loss.py:695-696, arguments.py:741)",
    "the clip for value loss (the flag's help): v_c = old + clamp(v - old, -c, c) enters max((v_c - R)^2, (v - R)^2)",
    effect={0.5: {"variant": {"clip": 0.5}}, 10.0: {"variant": {"clip": 10.0}}},
)
PER_TOKEN_LOSS_OPTION = Option(
    "calculate_per_token_loss",
    (False, True),
    False,
    "slime/backends/megatron_utils/loss.py:1317-1325, 1353-1365 (the reducer of get_sum_of_sample_mean, "
    "cp_utils.py:47, and the normaliser; --calculate-per-token-loss slime/utils/arguments.py:879, store_true; "
    "166441911: loss.py:796-803, 827-836, arguments.py:719)",
    "on: sum(sum(sample_i)) / sum(len(sample_i)) over the step (docs/en/get_started/usage.md:206) instead of the "
    "per-sample mean",
    effect={True: {"variant": {"mode": "token-mean"}}},
)

# --rollout-temperature reached the critic at 166441911: get_responses divided every logit by it, value logits
# included (loss.py:69-70, called by get_values :200-207); #1928 (d9d149dce, "fix: avoid applying rollout
# temperature to critic values") passes apply_temperature=False (loss.py:133, 643 at 624b824a8). The flag is "the
# temperature for the inference engine during rollout" (arguments.py:343-346): no effect on the value loss.
ROLLOUT_TEMPERATURE_OPTION = Option(
    "rollout_temperature",
    (1.0, 0.7),
    1.0,
    "slime/backends/megatron_utils/loss.py:133, 643 (get_values passes apply_temperature=False; --rollout-temperature "
    "slime/utils/arguments.py:343, default 1.0); 166441911: loss.py:69-70 divides the value logits too (get_values "
    ":200-207), arguments.py:219",
    "the temperature for the inference engine during rollout (the flag's help): it samples the rollout, the critic's "
    "values must not see it (no effect on the value-loss reference; #1928 removed it from the value path)",
)


def _value_pipeline(base: Domain, pin: str, fp32: str) -> Domain:
    """The loss entries' pipeline, with old values and returns: nothing non-finite under the mask."""
    dom = _loss_pipeline(base, pin, fp32)
    why = dict(dom.why)
    why["dtypes"] = (
        f"slime {pin}: the value head's output is asserted float32 (slime/backends/megatron_utils/loss.py:{fp32}, "
        "get_responses) and the old values are the same get_values' float32 outputs"
    )
    why["nonfinite_poison"] = (
        f"slime {pin}: old values are the critic's value-head outputs at every response token (forward_only(get_values)"
        f", slime/backends/megatron_utils/actor.py:{'403' if pin == '624b824a8' else '365-373'}) and the returns "
        "GAE's advantages + values over finite KL rewards (" + base.produces["masked_values"] + ")"
    )
    return dataclasses.replace(dom, why=why)


KIND_OVERRIDES["value-loss"] = dict(
    kind="value-loss",
    variant={"clip": VALUE_CLIP_OPTION.default, "half": False, "mode": "seq-mean-token-mean"},
    masked_zero=True,
    masked_zero_why="(x_i * loss_mask_i).sum() (slime/backends/megatron_utils/cp_utils.py:76, :86 at 624b824a8; "
    ":70, :78 at 166441911)",
    documented_errors=(),
    whitening=None,
    domain=Domain(
        dtypes=("float32",),
        why={
            "dtypes": "get_responses asserts float32 value-head output (slime/backends/megatron_utils/loss.py:128; "
            "166441911 :59): float64 and half precision fail the assertion"
        },
    ),
    pipeline=_value_pipeline(PIPELINE_HEAD, "624b824a8", "128"),
    pipeline_by_pin={"166441911": _value_pipeline(PIPELINE_166441911, "166441911", "59")},
    options=(VALUE_CLIP_OPTION, PER_TOKEN_LOSS_OPTION, ROLLOUT_TEMPERATURE_OPTION),
)

# policy-loss (loader: calls_kinds.load_policy): loss_function with --loss-type policy_loss (the default, slime/utils/
# arguments.py:915-918), dispatched to policy_loss_function (loss.py:934, :1328-1329; 166441911 :442, :809-810):
# ppo_kl = old - logp (:1033; 166441911 :533), compute_policy_loss(ppo_kl, advantages, eps_clip, eps_clip_high,
# eps_clip_c=args.eps_clip_c) (:1038-1044; slime/utils/ppo_utils.py compute_policy_loss: max(-A r, -A clamp(r, 1 -
# eps_clip, 1 + eps_clip_high)), min with -c A where A < 0 when eps_clip_c is set); 166441911 calls it WITHOUT
# eps_clip_c (:535). No masking before the reducer: sum_of_sample_mean's (x_i * loss_mask_i).sum(). Defaults:
# --eps-clip 0.2 (arguments.py:899; 166441911 :733), --eps-clip-high None set to eps_clip (:900, :1876-1877; 166441911
# :734, :1565-1566), --eps-clip-c None (:901-906; :735-740). Advantages per token (batch["advantages"], :964).
EPS_CLIP_HIGH_OPTION = Option(
    "eps_clip_high",
    (None, 0.28),
    None,
    "slime/backends/megatron_utils/loss.py:1042 (args.eps_clip_high; --eps-clip-high slime/utils/arguments.py:900, "
    "default None = eps_clip, :1876-1877; 166441911: loss.py:535, arguments.py:734, :1565-1566)",
    "PPO clip upper range (the flag's help): r is clamped to [1 - eps_clip, 1 + eps_clip_high] (DAPO's clip-higher)",
    effect={0.28: {"variant": {"clip_high": 0.28}}},
)
EPS_CLIP_C_OPTION = Option(
    "eps_clip_c",
    (None, 3.0),
    None,
    "slime/backends/megatron_utils/loss.py:1043 (eps_clip_c=args.eps_clip_c; --eps-clip-c slime/utils/arguments.py:"
    "901-906, default None); 166441911: arguments.py:735-740, but loss.py:535 never passes it to compute_policy_loss",
    "lower bound of the value for Dual-clip PPO (the flag's help, arXiv 1912.09729): where A < 0 the token loss is "
    "min(l, -c A)",
    effect={3.0: {"variant": {"dual_clip": 3.0}}},
)


def _policy_pipeline(base: Domain, pin: str, fp32: str) -> Domain:
    """The loss entries' pipeline, with old log-probs and advantages: nothing non-finite under the mask."""
    dom = _loss_pipeline(base, pin, fp32)
    why = dict(dom.why)
    why["dtypes"] = (
        f"slime {pin}: the policy logits are asserted float32 (slime/backends/megatron_utils/loss.py:{fp32}), so "
        "the log-probs are float32, and the old log-probs are the same function's outputs"
    )
    why["nonfinite_poison"] = (
        f"slime {pin}: old log-probs are the actor's own log-softmax at every response token (forward_only("
        "get_log_probs_and_entropy), masked tool tokens included) and the advantages GAE / GRPO outputs over finite "
        "rewards (" + base.produces["masked_values"] + "): nothing non-finite under the mask"
    )
    why["masked_logprobs"] = (
        "log-probs and old log-probs are the actor's log-softmax before and after an update, under the mask as "
        "elsewhere"
    )
    return dataclasses.replace(dom, masked_logprobs=False, why=why)


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
    masked_zero_why="(x_i * loss_mask_i).sum() (slime/backends/megatron_utils/cp_utils.py:76, :86 at 624b824a8; "
    ":70, :78 at 166441911)",
    documented_errors=(),
    whitening=None,
    domain=Domain(
        dtypes=("float32",),
        why={
            "dtypes": "get_log_probs_and_entropy asserts float32 logits (slime/backends/megatron_utils/loss.py:535; "
            "166441911 get_responses :59): float64 and half precision fail the assertion"
        },
    ),
    pipeline=_policy_pipeline(PIPELINE_HEAD, "624b824a8", "535"),
    pipeline_by_pin={"166441911": _policy_pipeline(PIPELINE_166441911, "166441911", "59")},
    options=(EPS_CLIP_HIGH_OPTION, EPS_CLIP_C_OPTION, PER_TOKEN_LOSS_OPTION),
)

GRPO_STD_NORMALIZATION = Option(
    "grpo_std_normalization",
    (True, False),
    True,
    "slime/ray/rollout.py:627 (--disable-grpo-std-normalization, slime/utils/arguments.py:1005-1010; "
    "166441911: rollout.py:322)",
    "off: Dr.GRPO (arXiv 2503.20783, the flag's help): the group mean is subtracted, no division by the std",
    effect={False: {"variant": {"std": None, "singleton": "zero"}}},
)
ADVANTAGE_ESTIMATOR = Option(
    "advantage_estimator",
    ("grpo", "reinforce_plus_plus_baseline", "cispo"),
    "grpo",
    "slime/ray/rollout.py:613-627 (group mean, std only for grpo/gspo/cispo) and "
    "slime/backends/megatron_utils/loss.py:795-803 (get_reinforce_plus_plus_baseline_advantages); "
    "--advantage-estimator slime/utils/arguments.py:940-957; cispo takes grpo's path (rollout.py:614, :627, "
    "loss.py:763 at 624b824a8; absent at 166441911: not drawn there); gspo too, not listed",
    "REINFORCE++-baseline: the group baseline (mean) subtracted, no std, broadcast to every token "
    "(get_reinforce_plus_plus_baseline_advantages' docstring, slime/utils/ppo_utils.py:454-466); arguments.py:"
    "1848-1852 require --normalize-advantages with it",
    effect={"reinforce_plus_plus_baseline": {"variant": {"std": None, "singleton": "zero"}}},
)
GRPO_NORMALIZE_ADVANTAGES = dataclasses.replace(
    NORMALIZE_ADVANTAGES,
    effect={True: {"variant": {"whiten_tokens": True}}},  # the same whitening, over the token advantages
)
for _name in KIND_OVERRIDES:
    KIND_OVERRIDES[_name].setdefault("options", ())
    KIND_OVERRIDES[_name].setdefault("truncation", None)  # no notion of a cut row outside GAE
KIND_OVERRIDES["grpo"]["options"] = (ADVANTAGE_ESTIMATOR, GRPO_STD_NORMALIZATION, GRPO_NORMALIZE_ADVANTAGES)
# reinforce++: arguments.py:1848-1852 assert --normalize-advantages for this estimator; the argparse default
# (False) is kept as the default, so the unwhitened returns stay comparable with the earlier verdicts
KIND_OVERRIDES["reinforce++"]["options"] = (NORMALIZE_ADVANTAGES,)

# ---------------------------------------------------------------------------------------------
# KL in the reward (`oracles/kinds/gae/kl_reward.py`): the trainer's own KL, shaping and estimator, in its order.
# compute_advantages_and_returns (slime/backends/megatron_utils/loss.py:704 at 624b824a8, :222 at 166441911)
# computes `compute_approx_kl(log_probs[i], ref_log_probs[i], kl_loss_type=args.kl_loss_type)` per sample at every
# response token (:743-754; 166441911 :256-268), unless kl_coef == 0; then
# * ppo: `token_level_rewards = per_token_kl * -args.kl_coef`, the score on the LAST RESPONSE token
#   (`token_level_rewards[-1] += reward`), GAE over every response token, no mask (:769-781; 166441911 :276-288);
# * reinforce_plus_plus: get_reinforce_plus_plus_returns(kl=kl, kl_coef=args.kl_coef, ...) masks the KL
#   (`-kl_coef * (kl * loss_mask)`), the score at the last loss_mask == 1 token (slime/utils/ppo_utils.py:415-419;
#   166441911 :255-259), then the discounted returns (:430).
# The estimator: --kl-loss-type default "k1" (slime/utils/arguments.py:934-939; 166441911 :768-773), k1 =
# log_probs.float() - log_probs_base.float() unclamped (slime/utils/ppo_utils.py:28-31, the same lines at 166441911;
# only low_var_kl is clamped, :48-49). The coefficient: --kl-coef "KL penalty coefficient for reward shaping"
# (slime/utils/arguments.py:909-913; 166441911 :743-747), default 0.00 (shaping off); no shipped script sets a
# non-zero value (they pass --kl-coef 0.00, e.g. scripts/run-glm4.7-30B-A3B.sh:92), so 0.1 (calls.KL_COEF, with
# calls.KL_ESTIMATOR the k1 the caller is configured with).
KL_REWARD_VARIANT = {"kl_reward": {"coef": KL_COEF, "estimator": KL_ESTIMATOR, "clamp_d": None, "clamp": None}}
KL_REWARD_ENTRIES = ("gae-kl", "reinforce++-kl")
_KL_ONLY = {
    "624b824a8": "slime 624b824a8: the per-token rewards are only -kl_coef * KL (slime/backends/megatron_utils/"
    "loss.py:772-777) or, for reinforce++, -kl_coef * masked KL (slime/utils/ppo_utils.py:416-417); the rollout's "
    "reward is one scalar per sample (rollout_data['rewards'], loss.py:734)",
    "166441911": "slime 166441911: the per-token rewards are only -kl_coef * KL (slime/backends/megatron_utils/"
    "loss.py:279-284) or, for reinforce++, -kl_coef * masked KL (slime/utils/ppo_utils.py:256-257); the rollout's "
    "reward is one scalar per sample",
}
_KL_LOGPROBS = (
    "log_probs are the actor's own log-softmax of the sampled tokens at every response token (tool tokens "
    "included), ref_log_probs the reference model's: log-probabilities under the mask as elsewhere"
)


def _kl_pipeline(base: Domain, pin: str, dtypes: tuple[str, ...] | None = None, why_dtypes: str = "") -> Domain:
    """A KL-in-the-reward entry's pipeline: the entry's own, with no token reward beyond the KL and masked
    log-probs that are log-probabilities."""
    why = {**base.why, "token_rewards": _KL_ONLY[pin], "masked_logprobs": _KL_LOGPROBS}
    if dtypes is not None:
        why["dtypes"] = why_dtypes
    return dataclasses.replace(base, dtypes=dtypes or base.dtypes, token_rewards=False, masked_logprobs=False, why=why)


_KL_API_WHY = (
    "slime's per-token rewards are only the KL the trainer computes from log_probs / ref_log_probs "
    "(slime/backends/megatron_utils/loss.py:772-777 at 624b824a8): the case's token rewards are 0"
)
KL_OVERRIDES = {
    "gae-kl": dict(
        kind="gae",
        variant=KL_REWARD_VARIANT,
        domain=Domain(
            dtypes=("float32", "bfloat16", "float16"),
            token_rewards=False,
            why={"dtypes": FLOAT64_WHY, "token_rewards": _KL_API_WHY},
        ),
        pipeline=_kl_pipeline(PIPELINE_HEAD, "624b824a8"),
        pipeline_by_pin={"166441911": _kl_pipeline(PIPELINE_166441911, "166441911")},
        options=(NORMALIZE_ADVANTAGES,),
        truncation=GAE_TRUNCATION,
    ),
    "reinforce++-kl": dict(
        KIND_OVERRIDES["reinforce++"],
        variant=KL_REWARD_VARIANT,
        domain=Domain(
            critic=False,
            token_rewards=False,
            dtypes=_NO_F64,
            why={"dtypes": _F32["reinforce++"], "token_rewards": _KL_API_WHY},
        ),
        pipeline=_kl_pipeline(PIPELINE_HEAD, "624b824a8", ("float32",), _F32["reinforce++"]),
        pipeline_by_pin={"166441911": _kl_pipeline(PIPELINE_166441911, "166441911", ("float32",), _F32["reinforce++"])},
    ),
}


# ---------------------------------------------------------------------------------------------
# The framework's own words (`oracles.promises.Promise`), quoted, one per line range and pin group. A finding that no
# universal invariant covers is a defect only where one of these covers it (shared/design/kinds.md, "Promises").
# ---------------------------------------------------------------------------------------------
def _at(pins: dict, make) -> tuple:
    """One Promise per pin group: `pins` maps a pin to its line(s), `make(pin, line)` builds the Promise."""
    return tuple(make(pin, line) for pin, line in pins.items())


# --normalize-advantages (the caller's docstring): the whitening statistics are masked
WHITEN_PROMISES = _at(
    {"624b824a8": "710-712", "166441911": "228-230"},
    lambda pin, line: Promise(
        f"upstream:slime/backends/megatron_utils/loss.py:{line}",
        "When `args.normalize_advantages` is True, advantages are whitened across the "
        + ("data-parallel-with-context-parallel group" if pin == "624b824a8" else "data-parallel group")
        + " using masked statistics.",
        covers=("mechanism:masked-statistics",),
        note="compute_advantages_and_returns' docstring: with --normalize-advantages the whitening mean and variance "
        "are over the trainable (loss_mask 1) tokens only (distributed_masked_whiten(all_advs, all_masks))",
        pins=(pin,),
    ),
)
# REINFORCE++: the function says which paper it implements; the paper has no mask, so it covers the unmasked case
REINFORCE_PP_PROMISES = _at(
    {"624b824a8": "381", "166441911": "221"},
    lambda pin, line: Promise(
        f"upstream:slime/utils/ppo_utils.py:{line}",
        "Calculates discounted returns for REINFORCE++ (https://arxiv.org/pdf/2501.03262)",
        covers=("all-trainable",),
        note="get_reinforce_plus_plus_returns' docstring: G_t = sum_i gamma^(i-t) r_i with r_t = r(x, y) at the "
        "end of the response minus beta KL_t (the paper); with every token trainable no mask applies",
        pins=(pin,),
    ),
)
# --rollout-sample-filter-path: a removed sample (remove_sample, its loss mask zeroed at rollout.py:680-681) does not
# take part in the loss; the step's denominators count it (step_global_batch_size, loss.py:1353-1359; 166441911
# args.global_batch_size, :826-830; num_tokens clamp_min(., 1), :1317 / :796)
FILTER_PROMISES = _at(
    {"624b824a8": "1434", "166441911": "1242"},
    lambda pin, line: Promise(
        f"upstream:slime/utils/arguments.py:{line}",
        "This function determines whether a sample will participate in loss calculation.",
        covers=("mechanism:masked-statistics", "mechanism:variant-mismatch"),
        note="--rollout-sample-filter-path's help: a sample it removes (remove_sample, loss mask zeroed, "
        "slime/ray/rollout.py:680-681 / :364-365) takes no part in the loss, so no denominator may count it; "
        "empty_rows='counted' or 'the loss equals the mode's over every position' is that sample counted",
        pins=(pin,),
    ),
)
# the documented reducers (docs/en/get_started/usage.md): per-sample mean by default, per-token with the flag
DOCS_LOSS_PROMISES = _at(
    {"624b824a8": "206", "166441911": "190"},
    lambda pin, line: Promise(
        f"upstream:docs/en/get_started/usage.md:{line}",
        "By default, slime calculates loss on a per-sample basis, i.e., `mean(sum(sample_i) / len(sample_i))`. "
        "Enable this flag to calculate loss on a per-token basis, i.e., `sum(sum(sample_i)) / sum(len(sample_i))`.",
        covers=("reference",),
        note="the --calculate-per-token-loss entry of the usage guide: the reducer of every loss term over the step "
        "(agg-seq-mean-token-mean / agg-token-mean are that reducer alone)",
        pins=(pin,),
    ),
)
# Sample.rollout_id (624b824a8 only: the per-rollout denominators do not exist at 166441911)
ROLLOUT_ID_PROMISE = Promise(
    "upstream:slime/utils/types.py:102-105",
    "Compact / subagent paths that split one rollout execution into multiple training samples should set the same "
    "``rollout_id`` on every sibling, so loss aggregation averages within the rollout instead of over-counting it.",
    covers=("reference",),
    note="the comment on Sample.rollout_id: samples sharing a rollout_id are averaged as one rollout (the "
    "prompt-mean variant over the case's group ids)",
    pins=("624b824a8",),
)
# --eps-clip-c: the dual clip; 166441911 parses it and never passes it (loss.py:535), fixed by #2247 (78156c53c)
EPS_CLIP_C_PROMISES = _at(
    {"624b824a8": "901-906", "166441911": "735-740"},
    lambda pin, line: Promise(
        f"upstream:slime/utils/arguments.py:{line}",
        "lower bound of the value for Dual-clip PPO from https://arxiv.org/pdf/1912.09729",
        covers=("mechanism:variant-mismatch",),
        note="--eps-clip-c's help: set, the token loss where A < 0 is min(l, -c A); a loss equal to the variant "
        "without the dual clip breaks it (the diagnosis names variant-mismatch, dual_clip=None)",
        pins=(pin,),
    ),
)
# --rollout-temperature samples the rollout; 166441911's get_responses divides the value logits by it too (loss.py:
# 69-70 via get_values :200-207), fixed by #1928 (d9d149dce) with tests/test_value_temperature.py
TEMPERATURE_PROMISE = Promise(
    "upstream:slime/utils/arguments.py:219-222",
    "the temperature for the inference engine during rollout.",
    covers=("mechanism:unexplained",),
    note="--rollout-temperature's help at 166441911: it is the inference engine's; a value loss that moves with it "
    "(the critic's logits divided by it) breaks it; the diagnosis has no mechanism for an option that must have no "
    "effect (unexplained)",
    pins=("166441911",),
)
# compute_approx_kl's docstring names the estimators it implements (the same lines at both pins)
KL_PROMISE = Promise(
    "upstream:slime/utils/ppo_utils.py:19-20",
    "Compute the approximate KL divergence between two distributions. Schulman blog: "
    "http://joschu.net/blog/kl-approx.html",
    covers=("reference",),
    note="k1 = log r, k2 = (log r)^2 / 2, k3 = r - 1 - log r with r = p_base / p (the blog's estimators); the "
    "low_var_kl clamp is the declared variant (ppo_utils.py:48-49)",
)
for _name in ("kl", "kl-k2", "kl-k3", "kl-low-var"):
    KIND_OVERRIDES[_name]["promises"] = (KL_PROMISE,)
# default and vanilla: the SPEC's promises (WHITEN_PROMISES); gae-kl, grpo, whiten, reinforce++(-kl) their own
KL_OVERRIDES["gae-kl"]["promises"] = WHITEN_PROMISES
KIND_OVERRIDES["grpo"]["promises"] = WHITEN_PROMISES
KIND_OVERRIDES["whiten"]["promises"] = WHITEN_PROMISES
KIND_OVERRIDES["reinforce++"]["promises"] = WHITEN_PROMISES + REINFORCE_PP_PROMISES
KL_OVERRIDES["reinforce++-kl"]["promises"] = WHITEN_PROMISES + REINFORCE_PP_PROMISES
for _name in ("agg-seq-mean-token-mean", "agg-token-mean"):
    KIND_OVERRIDES[_name]["promises"] = FILTER_PROMISES + DOCS_LOSS_PROMISES
KIND_OVERRIDES["agg-rollout-mean"]["promises"] = FILTER_PROMISES + (ROLLOUT_ID_PROMISE,)
KIND_OVERRIDES["value-loss"]["promises"] = FILTER_PROMISES + (TEMPERATURE_PROMISE,) + DOCS_LOSS_PROMISES
# eps-clip-c before the filter: both cover variant-mismatch (a dual clip off, a removed sample counted), and a case
# with --eps-clip-c set is what the dual clip's finding is; a removed sample counted in such a case is misnamed
KIND_OVERRIDES["policy-loss"]["promises"] = EPS_CLIP_C_PROMISES + FILTER_PROMISES + DOCS_LOSS_PROMISES
# --advantage-estimator gspo (calls_kinds.POLICY_SETTINGS): ppo_kl = the masked row mean of old - logp, the gradient
# through the mean (slime/utils/ppo_utils.py:95-121, loss.py:964-972 at v0.3.1): "sequence-mean".
# The filter's promise first: a counted empty row, what GSPO's draws meet first, is a removed sample counted
_GSPO_PROMISES = FILTER_PROMISES + EPS_CLIP_C_PROMISES + DOCS_LOSS_PROMISES
_GSPO_VARIANT = {**KIND_OVERRIDES["policy-loss"]["variant"], "ratio": "sequence-mean"}
KIND_OVERRIDES["policy-gspo"] = dict(KIND_OVERRIDES["policy-loss"], variant=_GSPO_VARIANT, promises=_GSPO_PROMISES)

SPEC = TargetSpec(
    id="slime",
    first_run=('default', 'grpo', 'policy-loss'),
    adapter="maskfuzz.targets.slime.calls",
    own=("slime",),
    contract="compressed",
    git_url="https://github.com/THUDM/slime.git",
    pins=(
        Pin("624b824a8", "HEAD of the snapshot (Aug 2026): chunked_gae, score on the last response token", kind="git"),
        Pin("166441911", "Jan 2026 (#1372): the older chunked_gae, mpu inside the call", kind="git"),
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
        why={"dtypes": FLOAT64_WHY},
    ),
    pipeline=PIPELINE_HEAD,
    pipeline_by_pin={"166441911": PIPELINE_166441911},
    notes=(
        "contract: slime never passes the loss mask to GAE (every response token is a transition and "
        "the score sits on the last response token); it documents no masked semantics. It is judged "
        "against `compressed`, the semantics its fork miles adopted and documented in PR #1827, so the "
        "two are comparable; the universal properties do not depend on this choice. Entries: default "
        "= as the PPO caller calls it (chunked_gae where the `chunked` flag exists); vanilla = "
        "chunked=False (absent where the function has no such flag). Beyond GAE "
        "(targets/slime/calls_kinds.py): grpo, kl, kl-k2, kl-k3, kl-low-var, whiten, reinforce++, agg-*, value-loss, "
        "policy-loss; KL in the reward: gae-kl (calls.py), reinforce++-kl."
    ),
    entry_overrides={**KIND_OVERRIDES, **KL_OVERRIDES},
    options=(NORMALIZE_ADVANTAGES,),
    truncation=GAE_TRUNCATION,
    promises=WHITEN_PROMISES,
)

"""verl's entries beyond GAE as the fuzzer reads them (`KIND_OVERRIDES`, one per entry: kind, variant, domains,
options, promises, truncation), the options that change their masked math and verl's own words about the loss
over a step. The loaders are `calls_kinds.py`; the SPEC that lists the entries is `declare.py`."""

from __future__ import annotations

import dataclasses

from maskfuzz.oracles.domain import Domain
from maskfuzz.oracles.promises import Promise
from maskfuzz.oracles.whitening import Whitening
from maskfuzz.targets.registry import Option, Truncation
from maskfuzz.targets.verl.declare_pipeline import PIPELINE_0_5_0, per_pin, pipeline_grpo_0_4_1, without

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


# --- the kinds beyond GAE (loaders: targets/verl/calls_kinds.py; line numbers are 0.9.1's unless a pin is named) ---
_MASKED_VAR_ERRORS = (
    # verl/utils/torch_functional.py::masked_var (unbiased) with < 2 masked elements in the batch
    r"ValueError: At least one element in the mask has to be 1",
    r"ValueError: The sum of the mask is one, which can cause a division by zero",
)


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
        pipeline=without(PIPELINE_0_5_0, "masked_values"),
        pipeline_by_pin=per_pin("masked_values"),
        # an outcome score: no bootstrap, no truncation input (the GAE entry's semantics are not inherited)
        truncation=None,
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
# GSPO (loss_mode "gspo", compute_policy_loss_gspo core_algos.py:1545-1614 at 0.9.1) at its example's clip ratios and
# aggregation (examples/gspo_trainer/run_qwen3_8b_fsdp.sh:23-24, :102 at v0.9.0); the actor defaults are the neighbours
_GSPO_EXAMPLE = "examples/gspo_trainer/run_qwen3_8b_fsdp.sh:23-24, :102 (v0.9.0)"
GSPO_CLIP_LOW = dataclasses.replace(
    CLIP_RATIO_LOW, values=(3e-4, 0.2), default=3e-4, cite=f"core_algos.py:1575 (0.9.1; {_GSPO_EXAMPLE})",
    effect={0.2: {"variant": {"clip_low": 0.2}}},
)  # fmt: skip
GSPO_CLIP_HIGH = dataclasses.replace(
    CLIP_RATIO_HIGH, values=(4e-4, 0.2), default=4e-4, cite=f"core_algos.py:1576 (0.9.1; {_GSPO_EXAMPLE})",
    effect={0.2: {"variant": {"clip_high": 0.2}}},
)  # fmt: skip
GSPO_LOSS_AGG_MODE = dataclasses.replace(
    ACTOR_LOSS_AGG_MODE, default="seq-mean-token-mean", cite=f"core_algos.py:1605-1607 (0.9.1; {_GSPO_EXAMPLE})",
    effect={m: {"variant": {"mode": m}} for m in _CRITIC_MODES if m != "seq-mean-token-mean"},
)  # fmt: skip


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
    pipeline=without(PIPELINE_0_5_0, "masked_values"),
    # the same rewards and response_mask as GAE (ray_trainer.py:248-281 at 0.9.1); no critic values
    pipeline_by_pin=per_pin("masked_values"),
    truncation=REINFORCE_PP_TRUNCATION,
)


# the GRPO branch of compute_advantage gets the multi-turn loss_mask at 0.4.1 (declare_pipeline.pipeline_grpo_0_4_1);
# elsewhere as GAE
_GRPO_PIPELINE_BY_PIN = {**per_pin("masked_values"), "0.4.1": pipeline_grpo_0_4_1()}

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
    # KL in the reward (`oracles/kinds/gae/kl_reward.py`) before compute_reinforce_plus_plus_outcome_advantage, as the
    # trainer
    # runs it with algorithm.use_kl_in_reward=True (ray_trainer.py:1638-1642 at 0.9.1; calls_kinds.load_returns_kl):
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
        pipeline=without(PIPELINE_0_5_0, "masked_values"),
        pipeline_by_pin=per_pin("masked_values"),
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
    # agg_loss (core_algos.py:1140-1206 at 0.9.1) over a step, with verl's global normalisers (calls_kinds.load_loss)
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
    # compute_policy_loss_gspo: s = exp(min(masked row mean of logp - old, 10)) straight-through per token
    # (core_algos.py:1583-1590 at 0.9.1), max(-A s, -A clamp(s, 1 - low, 1 + high)) (:1595-1597), no dual clip,
    # agg_loss with the step's normalisers (:1605-1607); a row without a trainable token has mean 0 (clamp(min=1),
    # :1583) and adds nothing. empty_rows counted: as policy-loss
    "policy-gspo": {
        **_loss(
            {
                "clip_low": 3e-4,
                "clip_high": 4e-4,
                "dual_clip": None,
                "advantages": "token",
                "ratio": "sequence",
                "seq_log_ratio_max": 10.0,
                "mode": "seq-mean-token-mean",
                **_COUNTED,
            }
        ),
        "kind": "policy-loss",
        "options": (GSPO_CLIP_LOW, GSPO_CLIP_HIGH, GSPO_LOSS_AGG_MODE),
        "promises": (AGG_LOSS_PROMISE,),
    },
}

# The GAE entry's promises (GAE_PROMISES, the SPEC's) are about compute_gae_advantage_return only: an entry of another
# kind declares its own or none
for _overrides in KIND_OVERRIDES.values():
    _overrides.setdefault("promises", ())

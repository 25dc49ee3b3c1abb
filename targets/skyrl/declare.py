"""Adapter for SkyRL: `compute_gae_advantage_return(token_level_rewards, values, response_mask, gamma, lambd)`.

Where the function lives (the repository is a monorepo; the importable package sits in a subdirectory):

    skyrl/backends/skyrl_train/utils/ppo_utils.py           git, 2026-02-15 .. HEAD   (package `skyrl`)
    skyrl/skyrl/backends/skyrl_train/utils/ppo_utils.py     git, 2026-02-12 .. 02-15  (nested package dir)
    skyrl-train/skyrl_train/utils/ppo_utils.py              git, 2025-06 .. 2026-03   (package `skyrl_train`)
    skyrl_train/utils/ppo_utils.py                          PyPI `skyrl-train` 0.1.0 .. 0.3.1 wheels

How SkyRL feeds it (read at the pins; `skyrl_train/trainer.py` in releases, `skyrl/train/trainer.py` at HEAD):

* `response_mask` is the response indicator (1 for every real response token, observations
  included; 0 for padding), *not* the loss mask: `trainer.compute_advantages_and_returns` passes
  `data["response_mask"]`. The canonical `attention` is that mask; `trainable` is SkyRL's
  `loss_mask`, which the GAE function never sees.
* A scalar reward is placed on the last token of the response: `postprocess_generator_output` does
  `per_token_reward = [0.0] * len(response); per_token_reward[-1] = float(reward)`. That is the
  last *real* token (an observation tail keeps the score on the observation). The line lives in a
  trainer method that needs ray and a full config, so the adapter applies the same one-line rule and
  `load` checks that the pin's trainer source still contains it (fails loudly if it changed).
* Dense shaping (the KL penalty) is added to those rewards; `convert_prompts_responses_to_batch_tensors`
  leaves rewards 0 at padding, so the case's token rewards reach SkyRL at real tokens only.
* Values are the critic's outputs at every response position, padding included (the value head
  runs on pad tokens unless sample packing re-pads with zeros): passed as the case gives them.

The function runs plain GAE over every position and whitens the advantages inside with
`masked_whiten(advantages, response_mask)` (unbiased variance, eps 1e-8, mean shifted out).

Pipeline domain (`SPEC.pipeline` for the release layouts 0.1.0, 0.3.1 and skyrl_train-v0.4.0;
`SPEC.pipeline_by_pin` for git main). SkyRLGymGenerator builds multi-turn responses whose loss mask is 0 on
observation and chat-template tokens: gaps, leading template tokens and masked real tails (0.1.0 keeps the
final observation in the response; later pins strip it but mask an appended EOS, and the score or turn reward
sits on that last, masked token), and zero-variance / overlong filtering zeroes whole loss masks while
`response_mask` stays 1 (all-masked rows). Critic values are unmasked value-head outputs at every position
(trained only under the loss mask), per-step rewards may sit on masked tokens, and KL-in-reward is a config
option, so values, masked rewards and token rewards stay permissive. Narrowed: dtypes (rewards are a float32
tensor, values bf16 or float32, so the recursion runs in float32), left padding at the release pins (the
response window is right-padded; git main right-aligns it, so left padding is allowed there) and non-finite
poison (value-head outputs, zero-filled float rewards and a clamped, masked KL are finite).
"""

from __future__ import annotations

import dataclasses

from maskfuzz.oracles.domain import Domain
from maskfuzz.oracles.promises import Promise
from maskfuzz.oracles.whitening import Whitening
from maskfuzz.targets.registry import COMMON_HEAVY, Option, Pin, TargetSpec, Truncation
from maskfuzz.targets.skyrl.calls import KL_COEF, KL_TYPE
from maskfuzz.targets.skyrl.calls_kinds import LOSS_REDUCTION, MAX_SEQ_LEN, NORM_BY_STD, OVERLONG, POLICY_LOSS_TYPE

HEAD_PIN = "a9564572eb8e"
_RELEASE_PPO = "0.3.1: skyrl_train/utils/ppo_utils.py"
_HEAD_PPO = "skyrl/backends/skyrl_train/utils/ppo_utils.py"
_MASKED_ERRORS = (
    r"ValueError: At least one element in the mask has to be 1",
    r"ValueError: The sum of the mask is one",
)


# What SkyRL's generator and trainer produce at each pin group (`Domain.produces`): every citation names the
# upstream line that builds the input. Not cited anywhere, on purpose:
# * masked_rewards: the generator does put turn rewards on loss-masked tokens (the appended EOS of a turn that
#   ended on a stop string: 0.3.1 skyrl_gym_generator.py:313-318 masked at :83, the reward at response_end_idx
#   :895, :385, :497), but that is SkyRL's own reward placement, summed or discounted into the trained tokens by
#   design (the trainer's own score goes to per_token_reward[-1] the same way, trainer.py:702), not poison; the
#   judge would call it a leak (no variant says "rewards under the response mask are rewards"), so no witness
#   may use it: what masked rewards do is a semantics fact.
# * leading_mask at 0.3.1 / v0.4.0 / main, empty_rows, nonfinite poison, truncated rows: no producing line found.
_REL = "0.3.1: skyrl_train/"
_V040 = "skyrl_train-v0.4.0: skyrl-train/skyrl_train/"
_MAIN = "a9564572eb8e: skyrl/"
_PRODUCES = {
    "0.1.0": {
        "gaps": "0.1.0: skyrl_train/generators/skyrl_gym_generator.py:463-468 each turn's template tokens around the "
        "model output get loss mask 0, :486 observation tokens get 0, between trained turns",
        "leading_mask": "0.1.0: skyrl_train/generators/skyrl_gym_generator.py:98 the multi-turn prompt is templated "
        "without the generation prompt, :463 so the response opens on generation-prompt tokens at loss mask 0",
        "masked_real_tail": "0.1.0: skyrl_train/generators/skyrl_gym_generator.py:465-467 the template tokens after "
        "the last turn's output at loss mask 0, :159 the response keeps every token after the prompt (a final "
        "observation too, :486)",
        "all_masked_rows": "0.1.0: skyrl_train/generators/utils.py:122-125 apply_overlong_filtering zeroes a whole "
        "loss mask (called at skyrl_train/generators/skyrl_gym_generator.py:252, :334); response_mask stays 1",
        "token_rewards": "0.1.0: skyrl_train/trainer.py:1027 use_kl_in_reward: custom_rewards - kl * kl_loss_coef, "
        "the KL at loss-mask positions",
        "masked_values": "0.1.0: skyrl_train/models.py:560-574 the value head runs on every position and "
        "action_values is the whole response window (observation / template tokens included)",
    },
    "0.3.1": {
        "gaps": _REL + "generators/skyrl_gym_generator.py:83-85 observation ids get loss mask 0, appended per turn "
        "at :894-897 between trained turns",
        "masked_real_tail": _REL + "generators/skyrl_gym_generator.py:313-318 an EOS appended after a stop string, "
        "loss-masked at :83; the response ends on it (response_end_idx :895, cut at :418-419)",
        "all_masked_rows": _REL + "trainer.py:693-697 zero_variance_filter sets a whole loss mask to 0; "
        "generators/utils.py:229-232 apply_overlong_filtering (called at skyrl_gym_generator.py:639, :757); "
        "response_mask stays 1",
        "token_rewards": _REL + "generators/skyrl_gym_generator.py:484-498 turn rewards at each turn's last "
        "generated token; trainer.py:1026 use_kl_in_reward: rewards - kl * kl_loss_coef at loss-mask positions",
        "masked_values": _REL + "model_wrapper.py:500-514 the value head runs on every position and action_values "
        "is the whole response window (observation tokens, a masked EOS; padding too without sample packing, "
        ":502-506)",
    },
    "skyrl_train-v0.4.0": {
        "gaps": _V040 + "generators/skyrl_gym_generator.py:73-87 observation ids get loss mask 0, appended per turn "
        "at :907-909 between trained turns",
        "masked_real_tail": _V040 + "generators/skyrl_gym_generator.py:326-330 an EOS appended after a stop "
        "string, loss-masked at :85; the response ends on it (response_end_idx :907, cut at :430)",
        "all_masked_rows": _V040 + "trainer.py:732-737 zero_variance_filter sets a whole loss mask to 0; "
        "generators/utils.py:274 apply_overlong_filtering (called at skyrl_gym_generator.py:651, :769)",
        "token_rewards": _V040 + "generators/skyrl_gym_generator.py:496-510 turn rewards at each turn's last "
        "generated token; trainer.py:1007 use_kl_in_reward: rewards - kl * kl_loss_coef",
        "masked_values": _V040 + "model_wrapper.py:481-495 the value head runs on every position and action_values "
        "is the whole response window",
    },
    "a9564572eb8e": {
        "gaps": _MAIN + "train/generators/skyrl_gym_generator.py:104-118 observation ids get loss mask 0, appended "
        "per turn at :1117-1119 between trained turns",
        "masked_real_tail": _MAIN + "train/generators/skyrl_gym_generator.py:439-443 an EOS appended after a stop "
        "string, loss-masked at :116; the response ends on it (response_end_idx :1117, cut at :550-551)",
        "left_padding": _MAIN + "train/dataset/preprocess.py:201-202 the response window is right-aligned "
        "(response_mask 0 before a shorter response), :211, :217 loss masks and rewards likewise",
        "all_masked_rows": _MAIN + "train/trainer.py:1086-1101 zero_variance_filter sets a whole loss mask to 0; "
        "train/generators/utils.py:349 apply_overlong_filtering (called at skyrl_gym_generator.py:796, :964)",
        "token_rewards": _MAIN + "train/generators/skyrl_gym_generator.py:629-643 turn rewards at each turn's last "
        "generated token; train/trainer.py:1436 use_kl_in_reward: rewards - kl * kl_loss_coef",
        "masked_values": _MAIN + "backends/skyrl_train/workers/model_wrapper.py:491-505 the value head runs on every "
        "position and action_values is the whole response window",
    },
}
_NO_CRITIC = ("masked_values",)  # outcome estimators and batch statistics take no critic values


_MASKS = ("gaps", "leading_mask", "masked_real_tail", "left_padding", "all_masked_rows")  # the mask shapes only
RELEASE_PINS = ("0.1.0", "skyrl_train-v0.4.0")  # release layouts with a domain of their own (0.3.1: `pipeline`)


def produces(pin: str, critic: bool = True, keys: tuple[str, ...] | None = None) -> dict:
    """What SkyRL's own code at `pin` produces (`_PRODUCES`), without the critic's values where none is read,
    restricted to `keys` where given."""
    return {
        k: v for k, v in _PRODUCES[pin].items() if (critic or k not in _NO_CRITIC) and (keys is None or k in keys)
    }


def _by_pin(make) -> dict:
    """`pipeline` and `pipeline_by_pin` of an entry: `make(pin)` at 0.3.1 and at each other pin."""
    return dict(pipeline=make("0.3.1"), pipeline_by_pin={pin: make(pin) for pin in (*RELEASE_PINS, HEAD_PIN)})


def _outcome_pipeline(head: bool, critic: bool = True, pin: str = "0.3.1") -> Domain:  # critic=False: returns kind
    """What SkyRL's trainer hands an outcome estimator at `pin`: float32 rewards, right-padded (releases), finite."""
    if head or pin == HEAD_PIN:
        return Domain(
            dtypes=("float32",),
            nonfinite_poison=False,
            critic=critic,
            produces=produces(HEAD_PIN, critic=False),
            why={
                "dtypes": "rewards are packed as np.float32 (skyrl/train/dataset/preprocess.py:214-220)",
                "nonfinite_poison": "rewards are zero-initialised float32 (skyrl/train/dataset/preprocess.py:214-217) "
                "and the KL penalty added to them is clamped and routed to 0 under the loss mask "
                "(skyrl/backends/skyrl_train/utils/ppo_utils.py:115-125)",
                "critic": "outcome estimators take no values (skyrl/backends/skyrl_train/utils/ppo_utils.py:1225-1229)",
            },
        )
    return Domain(
        dtypes=("float32",),
        left_padding=False,
        nonfinite_poison=False,
        critic=critic,
        produces=produces(pin, critic=False),
        why={
            "dtypes": "rewards are a float32 tensor (0.3.1: skyrl_train/dataset/preprocess.py:118)",
            "left_padding": "the response window is right-padded: output_attention_mask = [1] * len + [0] * pad "
            "(0.3.1: skyrl_train/dataset/preprocess.py:101)",
            "nonfinite_poison": "rewards are a zero-initialised float tensor (0.3.1: skyrl_train/dataset/preprocess.py:"
            "118-122); the KL penalty added to them is clamped and multiplied by the loss mask "
            "(0.3.1: skyrl_train/utils/ppo_utils.py:115-126)",
            "critic": "outcome estimators take no values (0.3.1: skyrl_train/utils/ppo_utils.py:911-916)",
        },
    )


_OUTCOME_MASKED = (
    "the estimator multiplies by response_mask, SkyRL's response indicator, not the loss mask "
    f"({_RELEASE_PPO}:1077 grpo, :992 rloo, :939 reinforce++; the trainer passes data['response_mask'], "
    "0.3.1: skyrl_train/trainer.py:771-775): observation / masked-tail tokens keep the row's advantage; "
    "the policy loss reads advantages only under loss_mask (0.3.1: skyrl_train/utils/ppo_utils.py:593)"
)


_NORM_BY_STD = Option(
    NORM_BY_STD,
    (True, False),
    True,
    "skyrl_train/trainer.py:747 (0.3.1; passed :759, applied skyrl_train/utils/ppo_utils.py:1073-1075; default "
    "skyrl_train/config/ppo_base_config.yaml:118)",
    "divide the group-centred score by the group's std (+ epsilon); off: Dr. GRPO, score - group mean",
    effect={False: {"variant": {"std": None}}},
)
# compute_approx_kl's estimators (0.3.1 skyrl_train/utils/ppo_utils.py:104-120): k3 clamps the log-ratio to
# [-20, 20] and the estimate to [-10, 10]; k1, k2, abs are unclamped
_KL_EFFECT = {
    "k1": {"variant": {"estimator": "k1", "clamp_d": None, "clamp": None}},
    "k2": {"variant": {"estimator": "k2", "clamp_d": None, "clamp": None}},
    "abs": {"variant": {"estimator": "abs", "clamp_d": None, "clamp": None}},
}
_KL_TYPE = Option(
    KL_TYPE,
    ("k3", "k1", "k2", "abs"),
    "k3",
    "skyrl_train/trainer.py:1015 (0.3.1; compute_approx_kl skyrl_train/utils/ppo_utils.py:91-127; default "
    "skyrl_train/config/ppo_base_config.yaml:103)",
    "the KL estimator of the KL loss / KL-in-reward term",
    effect=_KL_EFFECT,
)


def _group(variant: dict, options: tuple = ()) -> dict:
    return dict(
        kind="group-advantage",
        variant=variant,
        options=options,
        contract="dense",
        whitening=None,
        masked_zero=False,
        masked_zero_why=_OUTCOME_MASKED,
        documented_errors=(),
        domain=Domain(why={}),
        **_by_pin(lambda pin: _outcome_pipeline(False, pin=pin)),
    )


def _kl(estimator: str, variant: dict) -> dict:
    return dict(
        kind="kl",
        variant={"estimator": estimator, **variant},
        whitening=None,
        # kld * loss_mask (0.3.1: skyrl_train/utils/ppo_utils.py:125-126); torch.where(mask, kld * mask, 0)
        # at git main (skyrl/backends/skyrl_train/utils/ppo_utils.py:121-124)
        masked_zero=True,
        documented_errors=(),
        domain=Domain(why={}),
        # not narrowed: log-probs of any dtype, anything at masked positions; the loss masks are the generator's
        **_by_pin(lambda pin: Domain(produces=produces(pin, keys=_MASKS), why={})),
    )


_OVERLONG = Option(
    OVERLONG,
    (False, True),
    False,
    "skyrl_train/generators/skyrl_gym_generator.py:638-639, :756-757 (0.3.1; apply_overlong_filtering "
    "skyrl_train/generators/utils.py:216-232; default skyrl_train/config/ppo_base_config.yaml:310)",
    "DAPO overlong filtering: every loss-mask token of a response that does not end with EOS (truncated) is zeroed",
    effect={True: {"truncation": {"row": "masked"}}},
)
# without the filter a cut row's loss mask is kept as it is: nothing else in the loss path reads the cut
_LOSS_KEPT = Truncation(
    cite="skyrl_train/generators/skyrl_gym_generator.py:756-757 (0.3.1: the loss mask changes only under "
    "apply_overlong_filtering)"
)

# ---- SkyRL's own promises (oracles.promises.Promise): quoted, with the file:line and the pins that say them ---------
_V040_REPO = "skyrl-train/skyrl_train/"


def _said(path: str, line: int, text: str, covers: tuple, note: str, pins: tuple) -> Promise:
    return Promise(id=f"upstream:{path}:{line}", text=text, covers=covers, note=note, pins=pins)


# loss_reduction, mode by mode: the reduce_loss comments in the wheels, the config docs page at skyrl_train-v0.4.0, the
# config dataclass's help at git main ("applied per mini-batch": the optimizer step's micro-batches together)
_MODE_WORDS = {
    "token_mean": (
        ("skyrl_train/utils/ppo_utils.py", 617, "0.1.0"),
        ("skyrl_train/utils/ppo_utils.py", 888, "0.3.1"),
        "sum over *all* valid tokens, divide by total valid-token count",
        ("skyrl-train/docs/configuration/config.rst", 485, "skyrl_train-v0.4.0"),
        "``token_mean``: computes average loss over all valid tokens in the batch. Used in `DAPO "
        "<https://dapo-sia.github.io/>`_.",
        ("skyrl/train/config/config.py", 877, HEAD_PIN),
        'Type of loss reduction to use, applied per mini-batch by rescaling advantages: - ``"token_mean"``: average '
        "loss over all valid tokens in the batch, as in DAPO (https://dapo-sia.github.io/).",
    ),
    "sequence_mean": (
        ("skyrl_train/utils/ppo_utils.py", 620, "0.1.0"),
        ("skyrl_train/utils/ppo_utils.py", 891, "0.3.1"),
        "per-sequence token-mean (dim=-1), then batch-mean",
        ("skyrl-train/docs/configuration/config.rst", 486, "skyrl_train-v0.4.0"),
        "``sequence_mean``: computes per-sequence avg token loss, then averages over the batch.",
        ("skyrl/train/config/config.py", 881, HEAD_PIN),
        '``"sequence_mean"``: per-sequence average token loss, then averaged over the batch.',
    ),
    "seq_mean_token_sum_norm": (
        ("skyrl_train/utils/ppo_utils.py", 623, "0.1.0"),
        ("skyrl_train/utils/ppo_utils.py", 894, "0.3.1"),
        "per-sequence token-sum, normalized by the max sequence length, then batch mean",
        ("skyrl-train/docs/configuration/config.rst", 487, "skyrl_train-v0.4.0"),
        "``seq_mean_token_sum_norm``: computes the sum of token losses for each sequence, normalizes by the max "
        "sequence length (computed as ``cfg.generator.max_input_length + cfg.generator.sampling_params."
        "max_generate_length``), and then averages over the batch.",
        ("skyrl/train/config/config.py", 882, HEAD_PIN),
        '``"seq_mean_token_sum_norm"``: sum of token losses per sequence, normalized by ``max_seq_len``, then averaged '
        "over the batch, as in Dr. GRPO (https://arxiv.org/abs/2503.20783).",
    ),
}
_STEP_NOTE = (
    "the batch is the step the optimizer takes (the worker accumulates accumulation_steps micro-batches before "
    "optim_step, 0.3.1 skyrl_train/workers/worker.py:741-742); git main fixed token_mean to it in #1296 "
    "('fix `token_mean` reduction strategy', bf243b8d6)"
)


def mode_promises(mode: str, covers: tuple) -> tuple[Promise, ...]:
    """What SkyRL says `loss_reduction=mode` computes, at each pin where it says it."""
    w = _MODE_WORDS[mode]
    (p0, l0, pin0), (p1, l1, pin1), code_text, (pd, ld, pind), doc_text, (pm, lm, pinm), main_text = w
    return (
        _said(p0, l0, code_text, covers, _STEP_NOTE, (pin0,)),
        _said(p1, l1, code_text, covers, _STEP_NOTE, (pin1,)),
        _said(pd, ld, doc_text, covers, _STEP_NOTE, (pind,)),
        _said(pm, lm, main_text, covers, _STEP_NOTE, (pinm,)),
    )


# a consumer that reads the GAE advantages at masked positions without a mask: with
# trainer.algorithm.advantage_batch_normalize (default false) the trainer normalises every advantage of the batch by
# a mean over all [B, T] positions, padding included (0.3.1 trainer.py:264-265; git main inline, trainer.py:1477-1481);
# GAE's masked_whiten leaves (0 - mean) * rstd at padding (0.3.1 ppo_utils.py:172, :1025), so the masked advantages
# move the trained ones. The outcome estimators multiply by response_mask (0 at padding) and are not declared.
_BATCH_MEAN_NOTE = (
    "with trainer.algorithm.advantage_batch_normalize the trainer shifts every advantage by this mean over all [B, T] "
    "positions (0.3.1 skyrl_train/trainer.py:264-265), so a non-zero masked advantage moves the trained ones"
)
MASKED_READ = (
    _said("skyrl_train/utils/ppo_utils.py", 143, "mean: float = advantages.mean()", ("masked-zero",),
          _BATCH_MEAN_NOTE, ("0.1.0",)),  # fmt: skip
    _said("skyrl_train/utils/ppo_utils.py", 142, "mean: float = advantages.mean()", ("masked-zero",),
          _BATCH_MEAN_NOTE, ("0.3.1",)),  # fmt: skip
    _said(_V040_REPO + "utils/ppo_utils.py", 139, "mean: float = advantages.mean()", ("masked-zero",),
          _BATCH_MEAN_NOTE, ("skyrl_train-v0.4.0",)),  # fmt: skip
    _said("skyrl/train/trainer.py", 1479, "mean = advantages.mean()", ("masked-zero",),
          _BATCH_MEAN_NOTE + " (git main: inline in the trainer)", (HEAD_PIN,)),  # fmt: skip
)

# the loaders cut equal-row micro-batches: the mini-batch per GPU is a multiple of the micro-batch (asserted at
# config validation) and the iterator chunks it by micro_train_batch_size_per_gpu
_EQUAL_SPLITS = (
    "micro-batches have equal row counts: validate_batch_sizes asserts policy_mini_batch_size_per_gpu % "
    "micro_train_batch_size_per_gpu == 0 and the train batch a multiple of the mini-batch (0.3.1 "
    "skyrl_train/utils/utils.py:100-103, :113-117; critic :137-140, :148; 0.1.0 skyrl_train/utils/utils.py:72, :83; "
    "git main skyrl/train/utils/utils.py:112, :125), and BatchIterator chunks by that size (0.3.1 "
    "skyrl_train/workers/worker_utils.py:31)"
)
LOSS_DOMAIN = Domain(uneven_splits=False, why={"uneven_splits": _EQUAL_SPLITS})


def _agg(
    mode: str, constant: int | None = None, errors: tuple[str, ...] = (), extra: dict | None = None,
    promises: tuple = (),
) -> dict:  # fmt: skip
    variant = {"mode": mode} if constant is None else {"mode": mode, "constant": constant}
    variant.update(extra or {})
    return dict(
        kind="loss-aggregation",
        variant=variant,
        # dL/dl is 0 at masked positions: every path multiplies by loss_mask (0.3.1 masked_mean
        # skyrl_train/utils/ppo_utils.py:85-88 and :899; git main reduce_loss :1145-1149); NaN: poison-nonfinite
        masked_zero=True,
        masked_zero_why="",
        options=(_OVERLONG,),
        truncation=_LOSS_KEPT,
        whitening=None,
        documented_errors=errors,
        domain=LOSS_DOMAIN,
        pipeline=None,  # not researched: every finding is reach: api
        pipeline_by_pin={},
        promises=promises,
    )


_KIND_OVERRIDES = {
    # compute_grpo_outcome_advantage (0.3.1: skyrl_train/utils/ppo_utils.py:1029-1079; git main
    # skyrl/backends/skyrl_train/utils/ppo_utils.py:1343-1393): every option at the reference's default --
    # torch.std is unbiased (:1063), eps=1e-6 added to the std (:1073), a singleton gets mean 0, std 1 (:1059-1061).
    # Every row of a uid counts in its group by design (empty_rows "counted"): the estimators get response_mask, the
    # response indicator, never the loss mask (0.3.1 skyrl_train/trainer.py:771-775), so a row whose loss mask was
    # zeroed (zero_variance_filter, trainer.py:693-697; overlong filtering) keeps its score in the group. The score is
    # token_level_rewards.sum(-1) over the whole response (:1053), masked positions included: SkyRL's turn rewards
    # (generators/skyrl_gym_generator.py:484-498) are summed by design; the docstring ("operating only on Outcome
    # reward (with only one scalar reward for each response)", :1039) states an input assumption, not a masking
    # promise: what masked rewards do is a semantics fact (masked_rewards is not cited as produced, see _PRODUCES)
    "grpo": _group(
        {"estimator": "grpo", "std": "unbiased", "eps": 1e-6, "eps_place": "std", "singleton": "raw",
         "empty_rows": "counted"},
        (_NORM_BY_STD,),
    ),  # fmt: skip
    # grpo_norm_by_std=False: scores - mean (0.3.1: skyrl_train/utils/ppo_utils.py:1074-1075)
    "dr-grpo": _group({"estimator": "grpo", "std": None, "singleton": "raw", "empty_rows": "counted"}),
    # compute_rloo_outcome_advantage (0.3.1: skyrl_train/utils/ppo_utils.py:945-995; git main :1259-1309):
    # (s - mean) * n / (n - 1) (:983-986); a singleton gets 0 (:987-990); rows counted as grpo's
    "rloo": _group({"estimator": "rloo", "singleton": "zero", "empty_rows": "counted"}),
    # compute_reinforce_plus_plus_outcome_advantage (0.3.1: skyrl_train/utils/ppo_utils.py:910-942; git main
    # :1224-1256): G_t = r_t + gamma G_{t+1} over every response position (reset after response_mask == 0),
    # then masked_whiten(returns, response_mask) (:938, unbiased, eps 1e-8 inside the sqrt) times response_mask
    "reinforce++": dict(
        kind="returns",
        variant={},
        contract="dense",
        whitening=Whitening(unbiased=True, eps=1e-8, shift_mean=True),
        masked_zero=False,
        masked_zero_why=_OUTCOME_MASKED,
        documented_errors=_MASKED_ERRORS,  # masked_var raises them on purpose (0.3.1: ppo_utils.py:157-164)
        domain=Domain(critic=False, why={"critic": "REINFORCE++ takes no values: returns kind"}),
        **_by_pin(lambda pin: _outcome_pipeline(False, critic=False, pin=pin)),
    ),
    # compute_approx_kl (0.3.1: skyrl_train/utils/ppo_utils.py:91-127; git main :88-126); the config default is
    # k3 (0.3.1 ppo_base_config.yaml:103). k3: kl = base - logp clamped to [-20, 20] (:117), i.e. d in [-20, 20],
    # then exp(kl) - kl - 1 clamped to [-10, 10] (:120)
    "kl-k3": dict(_kl("k3", {"clamp_d": (-20.0, 20.0), "clamp": (-10.0, 10.0)}), options=(_KL_TYPE,)),
    "kl-k1": _kl("k1", {}),  # log_probs - log_probs_base (:108)
    "kl-k2": _kl("k2", {}),  # 0.5 * d.square() (:112)
    "kl-abs": _kl("abs", {}),  # d.abs() (:110)
    # normalize_advantages_dict (0.3.1: skyrl_train/utils/ppo_utils.py:130-148; trainer.py:264-265 when
    # advantage_batch_normalize): one batch statistic; var = sum((a - mean)^2 * mask) / sum(mask) is biased
    # (:144-145); rstd = clamp(var, min=1e-8).rsqrt() (:145) -- the nearest expressible placement is eps 1e-8
    # inside the sqrt (equal for var >> 1e-8). The mean is advantages.mean() over every position (:141), padding
    # included: not documented, so the reference keeps the masked mean and the judge reports it.
    "batch-norm": dict(
        kind="normalization",
        variant={"level": "batch", "unbiased": False, "eps": 1e-8, "eps_place": "var", "shift_mean": True},
        whitening=None,
        masked_zero=False,
        masked_zero_why="(advantages - mean) * rstd at every position (0.3.1: skyrl_train/utils/ppo_utils.py:147)",
        documented_errors=(),
        domain=Domain(why={}),
        # the advantages at masked positions are the estimators' (GAE's masked_whiten shifts padding too, 0.3.1
        # ppo_utils.py:172, :1025): poison in `x` needs no feature; the masks are the generator's
        **_by_pin(
            lambda pin: Domain(
                dtypes=("float32",),
                nonfinite_poison=False,
                produces=produces(pin, keys=_MASKS),
                why={
                    "dtypes": "advantages come from the estimators on float32 rewards "
                    "(0.3.1: skyrl_train/dataset/preprocess.py:118)",
                    "nonfinite_poison": "advantages are estimator outputs on finite rewards "
                    "(0.3.1: skyrl_train/dataset/preprocess.py:118-122), whitened or multiplied by response_mask "
                    "(0.3.1: skyrl_train/utils/ppo_utils.py:939, :1077)",
                },
            )
        ),
    ),
    # Loss aggregation (calls_kinds.load_aggregation): releases and skyrl_train-v0.4.0 call
    # reduce_loss(loss, loss_mask, loss_reduction, max_seq_len) per micro-batch (0.3.1: skyrl_train/utils/ppo_utils.py:
    # 881-906; v0.4.0: skyrl-train/skyrl_train/utils/ppo_utils.py:984-1009); git main pre-scales the advantages
    # per mini-batch (apply_loss_reduction_to_advantages_minibatch, ppo_utils.py:1152-1216) and sums (reduce_loss
    # :1145-1149). Mode docs: 0.3.1 ppo_utils.py:888-897 comments, git main skyrl/train/config/config.py:876-891.
    # token_mean: "sum over *all* valid tokens, divide by total valid-token count" (0.3.1 :888); git main "as in DAPO".
    # SkyRL's words promise the step's token mean (`mode_promises`): the releases' mean of micro-batch means /
    # accumulation_steps breaks them (split-invariance), fixed at git main by the pre-scaling
    "agg-token-mean": _agg("token-mean", promises=mode_promises("token_mean", ("split-invariance", "reference"))),
    # sequence_mean: "per-sequence token-mean (dim=-1), then batch-mean" (0.3.1 :891). A row without a trainable token
    # counts in the batch mean by design: masked_mean(loss, loss_mask, dim=-1) divides by mask.sum().clamp(min=1)
    # and .mean() takes every row (0.3.1 :85-88, :892; git main divides by batch_size, ppo_utils.py:1199)
    "agg-sequence-mean": _agg(
        "seq-mean-token-mean",
        extra={"empty_rows": "counted"},
        promises=mode_promises("sequence_mean", ("split-invariance",)),
    ),
    # seq_mean_token_sum_norm: "per-sequence token-sum, normalized by the max sequence length, then batch mean"
    # (0.3.1 :894-897); max_seq_len = max_input_length + max_generate_length (0.3.1 skyrl_train/utils/utils.py:278),
    # set explicitly at git main (config.py:883-885, 933): the constant is MAX_SEQ_LEN. Every row counts in the
    # batch mean by design (torch.mean(seq_losses), 0.3.1 :903; git main batch_size, :1203)
    "agg-seq-mean-token-sum-norm": _agg(
        "seq-mean-token-sum-norm",
        MAX_SEQ_LEN,
        extra={"empty_rows": "counted"},
        promises=mode_promises("seq_mean_token_sum_norm", ("split-invariance",)),
    ),
    # prompt_mean (git main only): token mean within each prompt, then the mean over prompts (config.py:886-889,
    # ppo_utils.py:1205-1215); prompts are contiguous uid runs, compute_prompt_boundaries asserts it
    # (skyrl/train/dataset/preprocess.py:286-313, docstring :290-292). num_prompts = len(prompt_boundaries) (:1212)
    # counts a prompt without a trainable token: empty_rows "counted" says so (the reference's prompt-mean counts
    # only prompts with a token whatever empty_rows says: a semantics fact, see docs/audit/skyrl.md)
    "agg-prompt-mean": _agg(
        "prompt-mean",
        errors=(r"AssertionError: uid .* appears in non-contiguous positions",),
        extra={"empty_rows": "counted"},
        promises=(
            _said(
                "skyrl/train/config/config.py",
                886,
                '``"prompt_mean"``: average token loss within each prompt group (all '
                "``generator.n_samples_per_prompt`` responses sampled for a prompt), then averaged over prompts.",
                ("split-invariance",),
                "the loss reduction is 'applied per mini-batch by rescaling advantages' (config.py:877): the step",
                (HEAD_PIN,),
            ),
        ),
    ),
    # ppo_critic_loss (0.3.1 skyrl_train/utils/ppo_utils.py:178-196; git main skyrl/backends/skyrl_train/utils/
    # ppo_utils.py:156-174): 0.5 * masked_mean(max((v_c - R)^2, (v - R)^2), loss_mask, dim=-1).mean() per micro-batch,
    # / accumulation steps (calls_kinds.load_value). value_clip 0.2 (0.3.1 ppo_base_config.yaml:137; git main
    # skyrl/train/config/config.py:921). The row mean counts empty rows by design (masked_mean's clamp(min=1), :85-88,
    # then .mean() over every row, :195: empty_rows "counted"); it is taken per micro-batch, and the micro-batches
    # have equal row counts (LOSS_DOMAIN), so the step's counted row mean is what the worker accumulates.
    "value-loss": dict(
        kind="value-loss",
        variant={"clip": 0.2, "half": True, "mode": "seq-mean-token-mean", "empty_rows": "counted"},
        masked_zero=True,  # (loss * loss_mask) in masked_mean (0.3.1 ppo_utils.py:88); NaN: poison-nonfinite
        masked_zero_why="",
        options=(_OVERLONG,),
        truncation=_LOSS_KEPT,
        whitening=None,
        documented_errors=(),
        domain=LOSS_DOMAIN,
        pipeline=None,  # not researched: every finding is reach: api
        pipeline_by_pin={},
    ),
}

# ---- policy-loss (calls_kinds.load_policy) ----------------------------------------------------------------------
_POLICY_LOSS_TYPE = Option(
    POLICY_LOSS_TYPE,
    ("regular", "dual_clip"),
    "regular",
    "0.3.1: skyrl_train/workers/worker.py:611 PolicyLossRegistry.get(policy_loss_type) (default "
    "skyrl_train/config/ppo_base_config.yaml:116; both names are ppo_policy_loss, "
    "skyrl_train/utils/ppo_utils.py:555-557; dual clip :573-576 with clip_ratio_c 3.0, ppo_base_config.yaml:127)",
    "dual_clip: for a negative advantage the per-token loss is min(-A c, the clipped loss), c = clip_ratio_c",
    effect={"dual_clip": {"variant": {"dual_clip": 3.0}}},
)
_LOSS_REDUCTION = Option(
    LOSS_REDUCTION,
    ("token_mean", "sequence_mean", "seq_mean_token_sum_norm"),
    "token_mean",
    "0.3.1: skyrl_train/utils/ppo_utils.py:567-572, :593 reduce_loss(loss, loss_mask, config.loss_reduction) "
    "(default skyrl_train/config/ppo_base_config.yaml:117); git main: the advantage pre-scaling "
    "(skyrl/train/trainer.py:1497-1504)",
    "the policy loss's aggregation (the agg-* entries' modes)",
    effect={  # every row counts in the batch mean of these modes (see agg-sequence-mean)
        "sequence_mean": {"variant": {"mode": "seq-mean-token-mean", "empty_rows": "counted"}},
        "seq_mean_token_sum_norm": {
            "variant": {"mode": "seq-mean-token-sum-norm", "constant": MAX_SEQ_LEN, "empty_rows": "counted"}
        },
    },
)
_F32_RATIO = (
    "the ratio is exponentiated in float32 by design: _safe_exp_delta casts the log-ratio to float32, clamps it to "
    "[-20, 20] and exponentiates (0.3.1 skyrl_train/utils/ppo_utils.py:547-552, :566; git main "
    "skyrl/backends/skyrl_train/utils/torch_utils.py:187-192, ppo_utils.py:567): a float64 case would be judged at "
    "float64 tolerance on a float32 ratio"
)
# ppo_policy_loss (0.3.1 skyrl_train/utils/ppo_utils.py:555-594; git main skyrl/backends/skyrl_train/utils/
# ppo_utils.py:557-587) at cfg.trainer.algorithm's defaults: policy_loss_type "regular" (0.3.1 ppo_base_config.yaml:116;
# git main skyrl/train/config/config.py:853), eps_clip_low / eps_clip_high 0.2 (0.3.1 yaml:124-125; git main
# config.py:906-909), no dual clip (clip_ratio_c 3.0 is read only by "dual_clip", ppo_utils.py:573), loss_reduction
# token_mean (0.3.1 yaml:117; git main config.py:876). Advantages per token (the estimators' [B, T] outputs).
_KIND_OVERRIDES["policy-loss"] = dict(
    kind="policy-loss",
    variant={"clip_low": 0.2, "clip_high": 0.2, "dual_clip": None, "advantages": "token", "mode": "token-mean"},
    # loss * loss_mask in reduce_loss (0.3.1 masked_mean ppo_utils.py:88; git main :1149); NaN: poison-nonfinite
    masked_zero=True,
    masked_zero_why="",
    options=(_POLICY_LOSS_TYPE, _LOSS_REDUCTION, _OVERLONG),
    truncation=_LOSS_KEPT,
    whitening=None,
    documented_errors=(),
    domain=dataclasses.replace(
        LOSS_DOMAIN, dtypes=("float16", "bfloat16", "float32"), why={**LOSS_DOMAIN.why, "dtypes": _F32_RATIO}
    ),
    pipeline=None,  # not researched: every finding is reach: api
    pipeline_by_pin={},
    # the default loss_reduction token_mean: SkyRL's words for the step's token mean (as agg-token-mean); the other
    # modes are split-invariant on the equal-row micro-batches the loader cuts
    promises=mode_promises("token_mean", ("split-invariance",)),
)
# policy-dual-clip: the same ppo_policy_loss with policy_loss_type "dual_clip" (the registry's second name, 0.3.1
# ppo_utils.py:555-556, dual clip :579-582; git main :556-557, :573-576) and clip_ratio_c 3.0 (0.3.1
# ppo_base_config.yaml:127; v0.4.0 skyrl-train/skyrl_train/config/ppo_base_config.yaml:120; git main config.py:910)
_KIND_OVERRIDES["policy-dual-clip"] = dict(
    _KIND_OVERRIDES["policy-loss"],
    variant={**_KIND_OVERRIDES["policy-loss"]["variant"], "dual_clip": 3.0},
    options=(_LOSS_REDUCTION, _OVERLONG),
)
# gspo_policy_loss (0.3.1 skyrl_train/utils/ppo_utils.py:665-719, GSPO-token): log s = masked_mean(logp - old) per row
# (:701), straight-through per token and clamped at 10 (:707-709), the plain exp in the case's dtype (no float32
# cast), -min(s A, clamp(s, 1 - eps_clip_low, 1 + eps_clip_high) A) (:713-715), eps 0.2 / 0.2 (ppo_base_config.yaml:
# 124-125), reduce_loss at sequence_mean (every row counts in the batch mean, as agg-sequence-mean)
_KIND_OVERRIDES["policy-gspo"] = dict(
    _KIND_OVERRIDES["policy-loss"],
    variant={
        "clip_low": 0.2, "clip_high": 0.2, "dual_clip": None, "advantages": "token", "ratio": "sequence",
        "seq_log_ratio_max": 10.0, "mode": "seq-mean-token-mean", "empty_rows": "counted",
    },  # fmt: skip
    # loss_reduction not an option here: GSPO asks for sequence_mean (ppo_utils.py:687-694 at 0.3.1), and the other
    # reductions' words are not those of mode_promises("sequence_mean") (token_mean's split dependence is the
    # policy-loss entry's finding, ppo_utils.py:888)
    options=(_OVERLONG,),
    domain=LOSS_DOMAIN,
    promises=mode_promises("sequence_mean", ("split-invariance",)),
)
_KIND_ENTRIES = tuple(_KIND_OVERRIDES)

# The GAE entry's pipeline at the release layouts (0.3.1 `pipeline`; 0.1.0 and skyrl_train-v0.4.0 by pin, with
# what each pin's generator produces) and at git main
_GAE_RELEASE = Domain(
    dtypes=("float32",),
    left_padding=False,
    nonfinite_poison=False,
    why={
        "dtypes": "rewards are a float32 tensor (0.3.1: skyrl_train/dataset/preprocess.py:118; 0.1.0: :120; "
        "v0.4.0: skyrl-train/skyrl_train/dataset/preprocess.py:118), values come from the critic under "
        "bf16 autocast (0.3.1: skyrl_train/workers/worker.py:962-966), and the fp32 rewards promote "
        "`delta` to float32 (0.3.1: skyrl_train/utils/ppo_utils.py:1019; 0.1.0: :748)",
        "left_padding": "the response window is right-padded: output_attention_mask = [1] * len + [0] * pad "
        "(0.3.1: skyrl_train/dataset/preprocess.py:101; 0.1.0: :103; "
        "v0.4.0: skyrl-train/skyrl_train/dataset/preprocess.py:101)",
        "nonfinite_poison": "values are value-head outputs, padding zero-filled under sample packing "
        "(0.3.1: skyrl_train/model_wrapper.py:500-508; 0.1.0: skyrl_train/models.py:560-568); rewards are a "
        "zero-initialised float tensor (0.3.1: skyrl_train/dataset/preprocess.py:118-122); the KL penalty is "
        "clamped and multiplied by the loss mask (0.3.1: skyrl_train/utils/ppo_utils.py:115-126)",
    },
)
_GAE_HEAD = Domain(
    dtypes=("float32",),
    nonfinite_poison=False,
    why={
        "dtypes": "rewards are packed as np.float32 (skyrl/train/dataset/preprocess.py:214-220), values "
        "come from the critic under bf16 autocast (skyrl/backends/skyrl_train/workers/worker.py:1550), "
        "and the fp32 rewards promote `delta` to float32 (skyrl/backends/skyrl_train/utils/ppo_utils.py:1333)",
        "nonfinite_poison": "values are value-head outputs, padding zero-filled under sample packing "
        "(skyrl/backends/skyrl_train/workers/model_wrapper.py:491-499); rewards are zero-initialised "
        "float32 (skyrl/train/dataset/preprocess.py:214-217); the KL penalty is clamped and masked positions "
        "routed to 0 with torch.where (skyrl/backends/skyrl_train/utils/ppo_utils.py:115-125)",
    },
)

SPEC = TargetSpec(
    id="skyrl",
    first_run=('default', 'grpo', 'policy-loss'),
    adapter="maskfuzz.targets.skyrl.calls",
    own=("skyrl", "skyrl_train", "skyrl_gym"),
    contract="dense",
    git_url="https://github.com/NovaSky-AI/SkyRL.git",
    package="skyrl-train",
    pins=(
        Pin("0.3.1", "latest skyrl-train release on PyPI (wheel tagged for Python 3.12, pure Python)", default=True),
        Pin("0.1.0", "first skyrl-train release on PyPI"),
        Pin(
            "a9564572eb8e",
            "main at the mirror snapshot (2026-08-21): the skyrl/backends/skyrl_train layout",
            kind="git",
        ),
        Pin("skyrl_train-v0.4.0", "last tagged skyrl-train release in the old skyrl-train/ layout", kind="git"),
    ),
    whitening=Whitening(unbiased=True, eps=1e-8, shift_mean=True),
    # masked-zero is judged: the function whitens and returns every response position (masked_whiten shifts and
    # scales all of [B, T]); the policy loss reads advantages only under loss_mask (0.3.1: skyrl_train/utils/
    # ppo_utils.py:593 and reduce_loss :881-899; git main: skyrl/backends/skyrl_train/utils/ppo_utils.py:586), but the
    # batch normalisation reads them all unmasked (MASKED_READ, declared by the default and gae-kl entries)
    masked_zero=True,
    masked_zero_why="",
    documented_errors=(
        # masked_var raises these itself, on purpose, when the response mask has < 2 tokens
        r"ValueError: At least one element in the mask has to be 1",
        r"ValueError: The sum of the mask is one",
    ),
    # jaxtyping only annotates; loguru logs; the rest serve config, tinker and gym modules the import chain
    # pulls in at HEAD (skyrl.train.config imports skyrl_gym, which imports pandas and requests)
    stand_ins=COMMON_HEAVY + ("jaxtyping", "loguru", "yaml", "pydantic", "cloudpathlib", "pandas", "requests"),
    domain=Domain(
        # Every canonical input has a SkyRL counterpart: multi-turn responses carry observation
        # tokens (loss_mask 0) anywhere in the response, padding sits right (releases) or left (HEAD)
        # of the response window, and zero-variance filtering zeroes whole loss masks.
        why={},
    ),
    pipeline=dataclasses.replace(_GAE_RELEASE, produces=produces("0.3.1")),
    pipeline_by_pin={
        **{pin: dataclasses.replace(_GAE_RELEASE, produces=produces(pin)) for pin in RELEASE_PINS},
        HEAD_PIN: dataclasses.replace(_GAE_HEAD, produces=produces(HEAD_PIN)),
    },
    # the wheels say Requires-Python ==3.12.* but are pure Python (py3-none-any) and import on 3.11
    pip_args=("--python-version", "3.12"),
    notes=(
        "contract: the loop walks every response position as a transition, unmasked (adapted from TRL's "
        "loop, whose callers zero masked values first): 'dense' is what it computes when masked values and "
        "rewards are 0. response_mask is SkyRL's response indicator (canonical attention), not the loss mask."
    ),
    entries=("default", *_KIND_ENTRIES),
    entry_overrides=_KIND_OVERRIDES,
)


# ---------------------------------------------------------------------------------------------
# KL in the reward (`oracles/kinds/gae/kl_reward.py`), with `trainer.algorithm.use_kl_in_reward` (0.3.1
# skyrl_train/config/ppo_base_config.yaml:107, default false; git main skyrl/train/config/config.py:830). The trainer's
# order (0.3.1 skyrl_train/trainer.py:248-259; git main skyrl/train/trainer.py:424-434): the per-token rewards with the
# score on the last real token (convert_to_training_input), then `apply_reward_kl_penalty` (0.3.1 trainer.py:1000-1030;
# 0.1.0 :1001-1028 on data["custom_rewards"]; v0.4.0 skyrl-train/skyrl_train/trainer.py:981; git main
# skyrl/train/trainer.py:1409-1437): `kl = compute_approx_kl(action_log_probs, base_action_log_probs,
# loss_mask=loss_mask, kl_estimator_type=...)`, `rewards = rewards - kl * max(0, kl_loss_coef)` with kl_loss_coef the
# reward KL controller's value (get_kl_controller: FixedKLController(kl_coef=kl_loss_coef) for the default kl_ctrl.type
# "fixed", 0.3.1 skyrl_train/utils/ppo_utils.py:70-72, git main :73-75; set at trainer.py:186-187 / :310-311), then
# compute_advantages_and_returns (GAE or REINFORCE++ on those rewards, as the default / reinforce++ entries call them).
# compute_approx_kl (0.3.1 skyrl_train/utils/ppo_utils.py:91-127, git main :88-126): k3 (the default,
# ppo_base_config.yaml:103, git main config.py:828) clamps d = logp - ref to [-20, 20] and the estimate to [-10, 10]
# (:115-122; git main :112-118); the estimate is multiplied by the loss mask (0.3.1 :125-126: NaN * 0 stays NaN) or
# routed to 0 under it (git main :125, torch.where). The coefficient: kl_loss_coef, default 0.001 (0.3.1
# ppo_base_config.yaml:109; git main config.py:836), the shipped value, used here (calls.KL_COEF).
_KL_CLAMPS = {"k3": {"clamp_d": (-20.0, 20.0), "clamp": (-10.0, 10.0)}}


def kl_reward_variant(estimator: str) -> dict:
    """The `kl_reward` variant of apply_reward_kl_penalty with SkyRL's estimator `estimator` (its clamps)."""
    clamps = _KL_CLAMPS.get(estimator, {"clamp_d": None, "clamp": None})
    return {"kl_reward": {"coef": KL_COEF, "estimator": estimator, **clamps}}


KL_REWARD_ENTRIES = ("gae-kl", "reinforce++-kl")
KL_REWARD_TYPE = Option(
    KL_TYPE,
    ("k3", "k1", "k2", "abs"),
    "k3",
    "skyrl_train/trainer.py:1015 (0.3.1, apply_reward_kl_penalty; compute_approx_kl skyrl_train/utils/ppo_utils.py:"
    "91-127; default skyrl_train/config/ppo_base_config.yaml:103; git main skyrl/train/trainer.py:1425, config.py:828)",
    "the KL estimator of the KL-in-reward term (k3 clamped as compute_approx_kl clamps it; k1, k2, abs unclamped)",
    effect={e: {"variant": kl_reward_variant(e)} for e in ("k1", "k2", "abs")},
)
_KL_LOGPROBS = (
    "action_log_probs are the policy's log-softmax of the sampled tokens at every response position, "
    "base_action_log_probs the reference model's: log-probabilities under the loss mask as elsewhere"
)


def _kl_pipe(dom: Domain) -> Domain:
    return dataclasses.replace(dom, masked_logprobs=False, why={**dom.why, "masked_logprobs": _KL_LOGPROBS})


KL_OVERRIDES = {
    "gae-kl": dict(
        kind="gae",
        variant=kl_reward_variant("k3"),
        options=(KL_REWARD_TYPE,),
        pipeline=_kl_pipe(SPEC.pipeline),
        pipeline_by_pin={pin: _kl_pipe(dom) for pin, dom in SPEC.pipeline_by_pin.items()},
    ),
    "reinforce++-kl": dict(
        _KIND_OVERRIDES["reinforce++"],
        variant=kl_reward_variant("k3"),
        options=(KL_REWARD_TYPE,),
        pipeline=_kl_pipe(_KIND_OVERRIDES["reinforce++"]["pipeline"]),
        pipeline_by_pin={pin: _kl_pipe(d) for pin, d in _KIND_OVERRIDES["reinforce++"]["pipeline_by_pin"].items()},
    ),
}
# the GAE entries' advantages are read at masked positions by the batch normalisation (MASKED_READ)
KL_OVERRIDES["gae-kl"]["promises"] = MASKED_READ
SPEC = dataclasses.replace(
    SPEC,
    entries=(*SPEC.entries, *KL_REWARD_ENTRIES),
    entry_overrides={"default": dict(promises=MASKED_READ), **_KIND_OVERRIDES, **KL_OVERRIDES},
)

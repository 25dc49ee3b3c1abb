"""SkyRL's masked math beyond GAE: loaders for the entries of `targets.skyrl.declare.SPEC`.

Every loader imports SkyRL's own function from `ppo_utils` at the pin (the wheel's
`skyrl_train/utils/ppo_utils.py`, git main's `skyrl/backends/skyrl_train/utils/ppo_utils.py`) and
feeds it what SkyRL's trainer feeds it:

* outcome estimators (`grpo`, `dr-grpo`, `rloo`, `reinforce++`) get `token_level_rewards` with the
  scalar score on the last *real* response token (`per_token_reward[-1] = float(reward)`, the rule
  `targets.skyrl.calls` checks in the trainer) plus the case's token rewards at real tokens (0 at
  padding), `response_mask` = the response indicator (canonical `attention`, never the loss mask:
  0.3.1 skyrl_train/trainer.py:771-775) and `index` = the row's uid (np.ndarray of str,
  0.3.1 skyrl_train/trainer.py:741);
* `compute_approx_kl` gets the policy and reference log-probs with `loss_mask` = canonical
  `trainable` (0.3.1 skyrl_train/trainer.py:1011-1016, skyrl_train/workers/worker.py:680-685);
* loss aggregation (`agg-*`): `reduce_loss` per micro-batch at the releases, the advantage pre-scaling of
  git main then its summing `reduce_loss` (see `load_aggregation`);
* `value-loss`: `ppo_critic_loss(values, old_values, returns, config, loss_mask)` per micro-batch, divided by
  the accumulation steps, as the critic worker drives it (see `load_value`);
* `policy-loss`: `ppo_policy_loss` (PolicyLossRegistry "regular") per micro-batch with `cfg.trainer.algorithm` at its
  defaults, reduced as the `agg-*` entries (see `load_policy`);
* `normalize_advantages_dict` gets a dict with `advantages` = canonical `x` and `response_mask` =
  canonical `attention` (it reads nothing else; 0.3.1 skyrl_train/trainer.py:264-265).
"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from maskfuzz.oracles.case import Case
from maskfuzz.oracles.kinds.loss_aggregation import microbatches
from maskfuzz.targets.adapters.base import Loaded, NotPresent, function_from
from maskfuzz.targets.adapters.extract import SourceTree
from maskfuzz.targets.adapters.loss_step import run_step
from maskfuzz.targets.skyrl.calls import KL_COEF, KL_TYPE, framework_inputs, import_roots, kl_penalty

_MODULES = ("skyrl_train.utils.ppo_utils", "skyrl.backends.skyrl_train.utils.ppo_utils")

# entry -> (function name, keyword arguments beyond the inputs)
OUTCOME = {
    "grpo": ("compute_grpo_outcome_advantage", {"grpo_norm_by_std": True}),
    "dr-grpo": ("compute_grpo_outcome_advantage", {"grpo_norm_by_std": False}),
    "rloo": ("compute_rloo_outcome_advantage", {}),
}
KL = {"kl-k3": "k3", "kl-k1": "k1", "kl-k2": "k2", "kl-abs": "abs"}
RETURNS = {"reinforce++": "compute_reinforce_plus_plus_outcome_advantage"}
NORMALIZATION = {"batch-norm": "normalize_advantages_dict"}
# entry -> SkyRL's `loss_reduction` name
AGGREGATION = {
    "agg-token-mean": "token_mean",
    "agg-sequence-mean": "sequence_mean",
    "agg-seq-mean-token-sum-norm": "seq_mean_token_sum_norm",
    "agg-prompt-mean": "prompt_mean",
}
VALUE = ("value-loss",)
VALUE_CLIP = 0.2  # algorithm.value_clip default (0.3.1 skyrl_train/config/ppo_base_config.yaml:137; git main
# skyrl/train/config/config.py:921)
ENTRIES = (*OUTCOME, *RETURNS, *KL, *NORMALIZATION, *AGGREGATION, *VALUE)
MAX_SEQ_LEN = 32  # the constant of seq_mean_token_sum_norm, `algorithm.max_seq_len`, as a user sets it


# options the loads read (their Option declarations are in declare.py)
NORM_BY_STD = "trainer.algorithm.grpo_norm_by_std"


OVERLONG = "generator.apply_overlong_filtering"
_OVERLONG_MODULES = ("skyrl_train.generators.utils", "skyrl.train.generators.utils")
_EOS, _TOKEN = 2, 1  # token ids of the stand-in responses: only the last one's being EOS matters


def _overlong_fn(root: Path):
    """SkyRL's `apply_overlong_filtering(loss_masks, response_ids, eos_token_id)` (git main: `(loss_masks,
    stop_reasons)`, a9564572eb8e skyrl/train/generators/skyrl_gym_generator.py:796, :964) compiled from the pin's source
    (0.3.1 skyrl_train/generators/utils.py:216-232; git main skyrl/train/generators/utils.py:349): its module
    imports the generator stack (skyrl_gym, inference engines), the function itself only builtins."""
    for base in [*import_roots(Path(root)), Path(root)]:
        tree = SourceTree(base, ("skyrl_train", "skyrl"))
        for module in _OVERLONG_MODULES:
            path = tree.module_file(module)
            if path is None:
                continue
            node = next(
                (n for n in tree.file(path).tree.body if getattr(n, "name", None) == "apply_overlong_filtering"), None
            )
            if node is not None:
                return tree.function(path, node)
    raise NotPresent("apply_overlong_filtering is not present at this pin (generators/utils.py)")


def _filtered(case: Case, overlong) -> Case:
    """The case with the generator's loss masks after `apply_overlong_filtering` when the option is on: a response
    ends in EOS unless it was cut by the length limit (`case.truncated_rows()`), as the generator decodes it."""
    if not case.options.get(OVERLONG, False):
        return case
    cut = case.truncated_rows().tolist()
    masks = [[int(x) for x in row] for row in case.trainable.tolist()]
    responses = [[_TOKEN] * (len(m) - 1) + [_TOKEN if c else _EOS] for m, c in zip(masks, cut)]
    if list(inspect.signature(overlong).parameters)[1] == "stop_reasons":  # git main: the engine's stop reasons
        out = overlong(masks, ["length" if c else "stop" for c in cut])
    else:  # releases: the decoded response ends in EOS unless it was cut
        out = overlong(masks, responses, _EOS)
    return case.replace(trainable=torch.tensor(out, dtype=torch.bool))


def _function(root: Path, name: str):
    for extra in reversed(import_roots(Path(root))):
        if str(extra) not in sys.path:
            sys.path.insert(0, str(extra))
    return function_from(root, [(m, name) for m in _MODULES])


def outcome_inputs(case: Case, device: str) -> dict:
    """token_level_rewards / response_mask / index as SkyRL's trainer builds them."""
    x = framework_inputs(case, device)
    groups = case.group if case.group is not None else torch.zeros(case.shape[0], dtype=torch.int64)
    index = np.array([str(int(g)) for g in groups.tolist()])
    return {"token_level_rewards": x["token_level_rewards"], "response_mask": x["response_mask"], "index": index}


def load_kind(root: Path, entry: str) -> Loaded:
    if entry in OUTCOME:
        name, kw = OUTCOME[entry]
        fn, where = _function(root, name)

        def run(case: Case, device: str):
            args = dict(kw)
            if entry == "grpo":  # the trainer passes cfg.trainer.algorithm.grpo_norm_by_std (0.3.1 trainer.py:747)
                args["grpo_norm_by_std"] = case.options.get(NORM_BY_STD, True)
            adv, _ = fn(**outcome_inputs(case, device), **args)
            return (adv,)

        notes = [
            "score on the last real response token (trainer rule), token rewards at real tokens, 0 at padding",
            "response_mask = attention (SkyRL's response indicator), index = uids as np.ndarray of str",
            *(f"{k}={v}" for k, v in kw.items()),
        ]
        return Loaded(run=run, where=where, notes=notes)
    if entry in RETURNS:
        fn, where = _function(root, RETURNS[entry])

        def run_returns(case: Case, device: str):
            x = outcome_inputs(case, device)
            return fn(token_level_rewards=x["token_level_rewards"], response_mask=x["response_mask"], gamma=case.gamma)

        return Loaded(run=run_returns, where=where, notes=["response_mask = attention; score on the last real token"])
    if entry in KL:
        fn, where = _function(root, "compute_approx_kl")
        estimator = KL[entry]

        def run_kl(case: Case, device: str):
            dt = case.torch_dtype
            logp = case.extra["logp"].to(device=device, dtype=dt)
            ref = case.extra["ref_logp"].to(device=device, dtype=dt)
            mask = case.trainable.to(device=device, dtype=dt)
            # the trainer passes cfg.trainer.algorithm.kl_estimator_type (0.3.1 trainer.py:1015); an option of kl-k3
            kind = case.options.get(KL_TYPE, estimator) if entry == "kl-k3" else estimator
            return (fn(logp, ref, loss_mask=mask, kl_estimator_type=kind),)

        return Loaded(run=run_kl, where=where, notes=[f"kl_estimator_type={estimator!r}, loss_mask = trainable"])
    if entry in NORMALIZATION:
        try:
            fn, where = _function(root, NORMALIZATION[entry])
        except NotPresent as exc:
            raise NotPresent(
                "normalize_advantages_dict is not present at this pin (git main inlines the batch normalisation "
                "in skyrl/train/trainer.py:1477-1481; not extracted): " + str(exc)
            ) from None

        def run_norm(case: Case, device: str):
            dt = case.torch_dtype
            data = {
                "advantages": case.extra["x"].to(device=device, dtype=dt),
                "response_mask": case.attention.to(device=device, dtype=dt),
            }
            return (fn(data)["advantages"],)

        return Loaded(run=run_norm, where=where, notes=["a dict stands in for TrainingInputBatch (two keys read)"])
    raise NotPresent(f"skyrl has no entry {entry!r}; entries: default, {', '.join(ENTRIES)}")


def load_aggregation(root: Path, entry: str) -> Loaded:
    """SkyRL's loss reduction over one optimizer step, as its worker and trainer drive it.

    Releases (0.1.0, 0.3.1) and skyrl_train-v0.4.0: `reduce_loss(loss, loss_mask, loss_reduction, max_seq_len)`
    per micro-batch (0.3.1 skyrl_train/utils/ppo_utils.py:881-906, called by the policy losses, e.g.
    ppo_policy_loss :593 with `config.max_seq_len`). No global normaliser: the worker divides each micro-batch
    loss by `accumulation_steps = policy_mini_batch_size_per_gpu // micro_train_batch_size_per_gpu` before
    backward (0.3.1 skyrl_train/workers/worker.py:691-693, :722-726; 0.1.0 :735-737, :598-602) and steps the
    optimizer every accumulation_steps micro-batches (0.3.1 :741); v0.4.0 backpropagates each micro-batch as
    is and multiplies the gradients by 1 / micro-batches accumulated at optim_step
    (skyrl-train/skyrl_train/workers/worker.py:685, 929-934). Both are `/ Step.rank_micro_batches` here, the
    micro-batches of the rank in one optimizer step. FSDP / DeepSpeed average gradients over data-parallel
    ranks (the driver's rank mean). `loss_mask` float in the case's dtype (a float tensor in SkyRL:
    0.3.1 skyrl_train/dataset/preprocess.py:113-115).

    git main (skyrl/backends/skyrl_train/utils/ppo_utils.py): the trainer pre-scales the advantages of each
    mini-batch (= one optimizer step, all data-parallel ranks) with
    `apply_loss_reduction_to_advantages_minibatch(advantages, loss_mask, loss_reduction, micro_batch_size,
    max_seq_len, prompt_boundaries)` (:1152-1216; skyrl/train/trainer.py:1484-1504, prompt boundaries from
    `compute_prompt_boundaries(uids)`, trainer.py:954, rebased to the mini-batch, :1490-1496), and every policy
    loss ends in `reduce_loss(loss, loss_mask)` = sum(loss * loss_mask) (:1145-1149, e.g. ppo_policy_loss :586).
    The worker backpropagates `policy_loss * dp_size` per micro-batch, no accumulation divisor
    (skyrl/backends/skyrl_train/workers/worker.py:1081-1091: DP averaging then gives the sum). The scaling
    reaches the loss because the per-token policy loss is linear in the advantage (-ratio * A, ratio = 1 on the
    first on-policy pass). The construction: the case's per-token loss IS the advantage-scaled quantity, i.e.
    `advantages` = l (the per-token loss with ratio 1 and sign folded in); the whole step's advantages are the
    case's losses in the case's dtype with the micro-batch's rows replaced by the differentiable micro-batch
    slice (`index_put`), scaled by SkyRL's function over the whole step's loss mask (the function scales each
    row by a factor of the mask alone, so the other rows' values never enter this micro-batch's rows), and the
    micro-batch's rows of the result go through `reduce_loss` and `* dp_size` (`Step.ranks`). `uids` for
    prompt_mean: the case's group ids as str, through SkyRL's own `compute_prompt_boundaries`
    (skyrl/train/dataset/preprocess.py:286-313; None groups: one prompt per row); micro_batch_size (read by
    token_mean_legacy only) = the largest micro-batch; max_seq_len = MAX_SEQ_LEN for every mode, as the
    trainer passes `algorithm.max_seq_len` whatever the mode (trainer.py:1502)."""
    mode = AGGREGATION[entry]
    reduce_loss, where = _function(root, "reduce_loss")
    prescaled = "loss_reduction" not in inspect.signature(reduce_loss).parameters
    if not prescaled:
        if mode == "prompt_mean":
            raise NotPresent(
                f"{where} has no prompt_mean at this pin (modes: token_mean, sequence_mean, seq_mean_token_sum_norm)"
            )

        def micro(rows, loss, mask, step):
            out = reduce_loss(loss, mask, loss_reduction=mode, max_seq_len=MAX_SEQ_LEN)
            return out / step.rank_micro_batches

        notes = [
            f"reduce_loss(loss, loss_mask, {mode!r}, max_seq_len={MAX_SEQ_LEN}) per micro-batch",
            "no global normaliser: each micro-batch loss / accumulation steps (the rank's micro-batches)",
        ]
    else:
        scale, scale_where = _function(root, "apply_loss_reduction_to_advantages_minibatch")
        boundaries_fn = None
        if mode == "prompt_mean":
            boundaries_fn, _ = function_from(root, [("skyrl.train.dataset.preprocess", "compute_prompt_boundaries")])
        where = f"{scale_where} + reduce_loss"

        def micro(rows, loss, mask, step):
            case = step.case
            full = case.extra["loss"].to(device=loss.device, dtype=loss.dtype)
            adv = full.index_put((rows,), loss)  # the step's advantages, this micro-batch's rows differentiable
            prompts = None
            if boundaries_fn is not None:
                groups = case.group if case.group is not None else torch.arange(case.shape[0])
                prompts = boundaries_fn([str(int(g)) for g in groups.tolist()])
            largest = max(len(r) for _, r in microbatches(case))
            scaled = scale(
                advantages=adv,
                loss_mask=step.mask,
                loss_reduction=mode,
                micro_batch_size=largest,
                max_seq_len=MAX_SEQ_LEN,
                prompt_boundaries=prompts,
            )
            return reduce_loss(scaled[rows], mask) * step.ranks

        notes = [
            f"apply_loss_reduction_to_advantages_minibatch(advantages = per-token loss, loss_mask of the step, "
            f"{mode!r}, max_seq_len={MAX_SEQ_LEN}) over the whole step, then reduce_loss (a sum) per micro-batch "
            "times dp_size",
            "the per-token loss stands for the advantage-linear policy loss (ratio 1)",
        ]

    overlong = _overlong_fn(root)

    def run(case: Case, device: str):
        return run_step(_filtered(case, overlong), device, micro)

    return Loaded(run=run, where=where, notes=notes)


def load_value(root: Path, entry: str) -> Loaded:
    """SkyRL's critic loss over one optimizer step, as its critic worker drives it.

    `ppo_critic_loss(values, old_values, returns, config, loss_mask)` (0.3.1 skyrl_train/utils/ppo_utils.py:178-196;
    skyrl_train-v0.4.0 skyrl-train/skyrl_train/utils/ppo_utils.py:175-193; git main
    skyrl/backends/skyrl_train/utils/ppo_utils.py:156-174): with `config.value_clip` set, `max((v_c - R)^2,
    (v - R)^2)`, v_c = old + clamp(v - old, -clip, clip), then `masked_mean(loss, loss_mask, dim=-1).mean()` times
    0.5 -- each row's token mean (`(x * mask).sum(-1) / mask.sum(-1).clamp(min=1)`, 0.3.1 :85-88), then the mean
    over every row of the micro-batch, empty rows included. `config` is a namespace with `value_clip` = 0.2, the
    default (0.3.1 ppo_base_config.yaml:137; git main skyrl/train/config/config.py:921); loss_mask is float in the
    case's dtype (0.3.1 skyrl_train/dataset/preprocess.py:113-115).
    The critic worker: releases call it per micro-batch and backpropagate `loss / accumulation_steps`,
    accumulation_steps = critic_mini_batch_size_per_gpu // micro_train_batch_size_per_gpu (0.3.1
    skyrl_train/workers/worker.py:925-933, :993-996, optimizer step every accumulation_steps micro-batches :1009;
    0.1.0 :952-959); git main backpropagates each micro-batch loss as is and scales the gradients by
    1 / micro-batches accumulated at optim_step (skyrl/backends/skyrl_train/workers/worker.py:1490-1502,
    :1440-1441, :1522-1529; the default max_tokens_per_microbatch = 0 path), no dp_size factor for the critic.
    Both are `/ Step.rank_micro_batches`; FSDP averages gradients over data-parallel ranks (the driver's rank
    mean). No global normaliser: the per-micro-batch row mean is a mean of means, and the empty rows it
    counts are not documented, so the reference stays the canonical step sequence mean."""
    fn, where = _function(root, "ppo_critic_loss")
    config = SimpleNamespace(value_clip=VALUE_CLIP)

    def micro(rows, v, mask, step):
        old = step.case.extra["v_old"][rows].to(device=v.device, dtype=v.dtype)
        ret = step.case.extra["ret"][rows].to(device=v.device, dtype=v.dtype)
        loss, _ = fn(v, old, ret, config=config, loss_mask=mask)
        return loss / step.rank_micro_batches

    overlong = _overlong_fn(root)

    def run(case: Case, device: str):
        return run_step(_filtered(case, overlong), device, micro, leaf_name="v")

    notes = [
        f"ppo_critic_loss(values, old_values, returns, config.value_clip={VALUE_CLIP}, loss_mask float)",
        "per micro-batch: row token means, mean over the micro-batch's rows; / accumulation steps",
    ]
    return Loaded(run=run, where=where, notes=notes)


# entry -> (its function in ppo_utils, the policy_loss_type and loss_reduction it runs at unless the case's options say
# otherwise): "regular" and "dual_clip" (both names are ppo_policy_loss, 0.3.1 ppo_utils.py:555-556) at the config's
# defaults; "gspo" (0.3.1 ppo_utils.py:665-722) at the sequence_mean its docstring asks for (:687-694)
POLICY_RUNS = {
    "policy-loss": ("ppo_policy_loss", "regular", "token_mean"),
    "policy-dual-clip": ("ppo_policy_loss", "dual_clip", "token_mean"),
    "policy-gspo": ("gspo_policy_loss", "gspo", "sequence_mean"),
}
POLICY = tuple(POLICY_RUNS)
POLICY_LOSS_TYPE = "trainer.algorithm.policy_loss_type"
LOSS_REDUCTION = "trainer.algorithm.loss_reduction"


def _algorithm(loss_type: str, reduction: str):
    """`cfg.trainer.algorithm` at its defaults (0.3.1 skyrl_train/config/ppo_base_config.yaml:116-130; git main
    skyrl/train/config/config.py:821-935), the fields ppo_policy_loss reads: policy_loss_type "regular",
    loss_reduction "token_mean", eps_clip_low / eps_clip_high 0.2, clip_ratio_c 3.0 (read only by dual_clip),
    use_tis False with tis_imp_ratio_cap -1 (releases), off_policy_correction at its defaults (v0.4.0 and git main;
    every correction None), max_seq_len = MAX_SEQ_LEN as for the agg-* entries."""
    off = SimpleNamespace(
        tis_ratio_type=None,
        token_tis_ratio_clip_high=2.0,
        sequence_tis_ratio_clip_high=5.0,
        sequence_mask_metric=None,
        geo_mask_high=1.01,
        geo_mask_low=0.99,
        product_mask_high=2.0,
        product_mask_low=0.5,
        outlier_token_is_threshold_low=None,
        outlier_token_is_threshold_high=None,
        token_mask_is_threshold_low=None,
        token_mask_is_threshold_high=None,
    )
    return SimpleNamespace(
        policy_loss_type=loss_type,
        loss_reduction=reduction,
        eps_clip_low=0.2,
        eps_clip_high=0.2,
        clip_ratio_c=3.0,
        use_tis=False,
        tis_imp_ratio_cap=-1.0,
        off_policy_correction=off,
        max_seq_len=MAX_SEQ_LEN,
    )


def load_policy(root: Path, entry: str) -> Loaded:
    """SkyRL's "regular" policy loss over one optimizer step, as its policy worker drives it (`policy-dual-clip`:
    the same function with policy_loss_type "dual_clip", 0.3.1 ppo_utils.py:579-582, 0.1.0 :532-535, v0.4.0
    :572-575, git main :573-576: for A < 0 the loss is min(-A clip_ratio_c, the clipped loss)).

    The worker takes `PolicyLossRegistry.get(cfg.trainer.algorithm.policy_loss_type)` (0.3.1
    skyrl_train/workers/worker.py:611; "regular" and "dual_clip" are both `ppo_policy_loss`, ppo_utils.py:555-557)
    and calls it per micro-batch with the action log-probs, old log-probs, advantages, `config=cfg.trainer.algorithm`,
    `loss_mask` and `rollout_logprobs` (worker.py:657-664). `ppo_policy_loss(log_probs, old_log_probs, advantages,
    config, loss_mask, rollout_logprobs)`: 0.3.1 skyrl_train/utils/ppo_utils.py:555-594 (ratio
    `_safe_exp_delta(log_probs - old_log_probs, clip=20)`: the log-ratio clamped to [-20, 20] and exponentiated in
    float32, :547-552), 0.1.0 :510-547 (plain exp), v0.4.0 skyrl-train/skyrl_train/utils/ppo_utils.py:550-586, git
    main skyrl/backends/skyrl_train/utils/ppo_utils.py:557-587 (`safe_exp_delta`, torch_utils.py:187-192).

    Releases and v0.4.0: the loss ends in `reduce_loss(loss, loss_mask, loss_reduction, max_seq_len)` per
    micro-batch, divided by accumulation_steps (0.3.1 worker.py:691-693), as `load_aggregation`. git main: the
    trainer pre-scales the advantages of each mini-batch (`apply_loss_reduction_to_advantages_minibatch`,
    ppo_utils.py:1152-1216; skyrl/train/trainer.py:1484-1504), ppo_policy_loss sums with `reduce_loss(loss,
    loss_mask)` (:586, :1145-1149) and the worker backpropagates `policy_loss * dp_size` (worker.py:1081-1091):
    the adapter scales the whole step's advantages with SkyRL's function over the step's loss mask and hands the
    micro-batch's rows to ppo_policy_loss. `rollout_logprobs` None: the off-policy correction is off by default
    (TIS / masks None), and None is its identity (apply_off_policy_correction returns the loss unchanged). The KL
    loss (use_kl_loss, on by default at git main with coefficient 1e-3) and the entropy bonus are separate terms of
    the worker's scalar (0.3.1 worker.py:667-690): not included (the `kl-*` entries cover the estimator)."""
    name, loss_type, reduction = POLICY_RUNS[entry]
    fn, where = _function(root, name)
    reduce_loss, _ = _function(root, "reduce_loss")
    prescaled = "loss_reduction" not in inspect.signature(reduce_loss).parameters
    scale = None
    if prescaled:
        scale, scale_where = _function(root, "apply_loss_reduction_to_advantages_minibatch")
        where = f"{scale_where} + ppo_policy_loss"
    configs: dict = {}

    def micro(rows, logp, mask, step):
        case = step.case
        key = (case.options.get(POLICY_LOSS_TYPE, loss_type), case.options.get(LOSS_REDUCTION, reduction))
        config = configs.setdefault(key, _algorithm(*key))
        old = case.extra["old_logp"][rows].to(device=logp.device, dtype=logp.dtype)
        if scale is None:
            adv = case.extra["adv"][rows].to(device=logp.device, dtype=logp.dtype)
            loss, _ = fn(logp, old, adv, config=config, loss_mask=mask, rollout_logprobs=None)
            return loss / step.rank_micro_batches
        full = case.extra["adv"].to(device=logp.device, dtype=logp.dtype)
        largest = max(len(r) for _, r in microbatches(case))
        scaled = scale(
            advantages=full,
            loss_mask=step.mask,
            loss_reduction=config.loss_reduction,
            micro_batch_size=largest,
            max_seq_len=MAX_SEQ_LEN,
            prompt_boundaries=None,
        )
        loss, _ = fn(logp, old, scaled[rows], config=config, loss_mask=mask, rollout_logprobs=None)
        return loss * step.ranks

    overlong = _overlong_fn(root)

    def run(case: Case, device: str):
        return run_step(_filtered(case, overlong), device, micro, leaf_name="logp")

    notes = [
        f"{name} with cfg.trainer.algorithm at its defaults ({loss_type}, eps_clip 0.2 / 0.2, {reduction}, "
        f"max_seq_len={MAX_SEQ_LEN}); rollout_logprobs None (off-policy correction off by default); loss_mask float",
        "releases: per micro-batch reduce_loss / accumulation steps; git main: the step's advantages pre-scaled by "
        "apply_loss_reduction_to_advantages_minibatch, the summed loss times dp_size",
        "KL-loss and entropy terms of the worker's scalar not added",
    ]
    return Loaded(run=run, where=where, notes=notes)


def load_reinforce_kl(root: Path) -> Loaded:
    """REINFORCE++ with the KL in the reward, in the trainer's order: the score on the last real token, then
    `apply_reward_kl_penalty` (compiled from the trainer source: `calls.kl_penalty`), then
    compute_reinforce_plus_plus_outcome_advantage on the shaped rewards (as the reinforce++ entry calls it)."""
    fn, where = _function(root, RETURNS["reinforce++"])
    shape, shape_where = kl_penalty(root)

    def run(case: Case, device: str):
        x = outcome_inputs(case, device)
        rewards = shape(case, device, x["token_level_rewards"])
        return fn(token_level_rewards=rewards, response_mask=x["response_mask"], gamma=case.gamma)

    notes = [
        "score on the last real response token (trainer rule), token rewards at real tokens, 0 at padding",
        f"then {shape_where}: kl_estimator_type from the case's options (default k3), kl_loss_coef {KL_COEF}, "
        "loss_mask = trainable; response_mask = attention",
    ]
    return Loaded(run=run, where=f"{where} after {shape_where}", notes=notes)


def load(root: Path, entry: str) -> Loaded:
    """The entry of a kind beyond GAE (the worker loads it from here: targets.registry.adapter_for)."""
    if entry == "reinforce++-kl":
        return load_reinforce_kl(root)
    if entry in VALUE:
        return load_value(root, entry)
    if entry in POLICY:
        return load_policy(root, entry)
    if entry in AGGREGATION:
        return load_aggregation(root, entry)
    return load_kind(root, entry)

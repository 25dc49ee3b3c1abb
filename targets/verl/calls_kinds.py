"""verl's entries of the kinds beyond GAE (`shared/design/kinds.md`), each calling verl's own function at the pin.

* group-advantage: `verl/trainer/ppo/core_algos.py::compute_grpo_outcome_advantage` ("grpo"; "drgrpo" with
  `norm_adv_by_std_in_grpo=False`), `compute_grpo_vectorized_outcome_advantage` ("grpo-vectorized"),
  `compute_rloo_outcome_advantage` ("rloo"), `compute_rloo_vectorized_outcome_advantage` ("rloo-vectorized") and
  `compute_reinforce_plus_plus_baseline_outcome_advantage` ("reinforce++-baseline": group baseline, then a token
  whitening over the batch). `algorithm.norm_adv_by_std_in_grpo` (the case's options) reaches "grpo" as the keyword
  and "grpo-vectorized" / "grpo-passk" inside the `config` (AlgoConfig) the trainer's registry branch passes.
  Inputs as verl's `ray_trainer.compute_advantage` passes them: `token_level_rewards` [B, T] with the score placed
  by verl's own reward manager (the GAE calls' `score_placer`, calls.py: the last attended response token) on top of the
  case's token rewards, `response_mask` int64, `index` an object array of str uids (ray_trainer.py builds
  `np.array([str(uuid.uuid4()) ...], dtype=object)`), `epsilon` left at its default (the trainer never passes it).
* kl: `core_algos.py::kl_penalty(logprob, ref_logprob, kl_penalty)` with the estimator name of the entry.
* normalization: `verl/utils/torch_functional.py::masked_whiten(values, mask)` ("whiten") and `masked_mean`
  ("masked-mean", the batch mean broadcast).
* returns: `core_algos.py::compute_reinforce_plus_plus_outcome_advantage(token_level_rewards, response_mask,
  config)` ("reinforce++"); `config` is a namespace with `gamma`, the only field the function reads;
  `compute_remax_outcome_advantage(token_level_rewards, reward_baselines, response_mask)` ("remax"), the baseline
  the case's per-row `extra["baseline"]`.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from maskfuzz.oracles.case import Case
from maskfuzz.targets.adapters.base import Loaded, NotPresent, function_from, import_from
from maskfuzz.targets.adapters.extract import BlockNotFound, SourceTree, function_free_names
from maskfuzz.targets.adapters.loss_step import run_step
from maskfuzz.targets.verl.calls import score_placer

_CORE = "verl.trainer.ppo.core_algos"
_TF = "verl.utils.torch_functional"
AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def agg_modes(root: Path) -> tuple[tuple[str, ...], str]:
    """The loss_agg_mode strings `agg_loss` at this pin compares against (its source names each one; any other
    raises "Invalid loss_agg_mode"), and where it is."""
    fn, where = function_from(root, [(_CORE, "agg_loss")])
    text = inspect.getsource(fn)
    return tuple(m for m in AGG_MODES if f'"{m}"' in text or f"'{m}'" in text), where


def _absent_modes(root: Path, option: str) -> dict:
    present, where = agg_modes(root)
    gone = tuple(m for m in AGG_MODES if m not in present)
    return {option: (gone, f"{where} has modes {', '.join(present)}")} if gone else {}


# entry -> (function in core_algos, fixed keyword arguments)
GROUP = {
    "grpo": ("compute_grpo_outcome_advantage", {}),
    "drgrpo": ("compute_grpo_outcome_advantage", {"norm_adv_by_std_in_grpo": False}),
    "grpo-vectorized": ("compute_grpo_vectorized_outcome_advantage", {}),
    "rloo": ("compute_rloo_outcome_advantage", {}),
    "rloo-vectorized": ("compute_rloo_vectorized_outcome_advantage", {}),
    "reinforce++-baseline": ("compute_reinforce_plus_plus_baseline_outcome_advantage", {}),
    "opo": ("compute_opo_outcome_advantage", {}),
    "gpg": ("compute_gpg_outcome_advantage", {}),
    "grpo-passk": ("compute_grpo_passk_outcome_advantage", {}),
}
NORM_STD = "algorithm.norm_adv_by_std_in_grpo"
# entry -> how verl's compute_advantage (verl/trainer/ppo/ray_trainer.py:187-281 at 0.9.1) hands the function
# algorithm.norm_adv_by_std_in_grpo: "keyword" (the GRPO branch, :240-245), "config" (the registry branch passes
# config=<the algorithm config> and no keyword, :250-279: grpo_vectorized, grpo_passk)
NORM_STD_ROUTE = {"grpo": "keyword", "grpo-vectorized": "config", "grpo-passk": "config"}
# entry -> the name verl's config passes (`algorithm.kl_penalty`, `actor.kl_loss_type`)
KL = {"kl-k1": "kl", "kl-abs": "abs", "kl-k2": "mse", "kl-low_var_kl": "low_var_kl", "kl-k3+": "k3+"}
NORMALIZATION = {"whiten": "masked_whiten", "masked-mean": "masked_mean"}
RETURNS = {
    "reinforce++": "compute_reinforce_plus_plus_outcome_advantage",
    "remax": "compute_remax_outcome_advantage",
}
# entry -> (verl's loss_agg_mode, the loss_scale_factor a user sets for the -norm mode)
LOSS = {
    "agg-token-mean": ("token-mean", None),
    "agg-token-sum": ("token-sum", None),
    "agg-seq-mean-token-sum": ("seq-mean-token-sum", None),
    "agg-seq-mean-token-mean": ("seq-mean-token-mean", None),
    "agg-seq-mean-token-sum-norm": ("seq-mean-token-sum-norm", 32),
}
LOSS_SCALE_FACTOR = 32  # what a user sets (actor.yaml:90 at 0.9.1 asks for a constant); the default null is T
VALUE = {"value-loss": "compute_value_loss"}
# entry -> verl's policy_loss.loss_mode (the name ppo_loss hands get_policy_loss_fn, losses.py:101-103 at 0.9.1)
POLICY = {"policy-loss": "vanilla", "policy-gspo": "gspo"}
# loss_mode -> its function in core_algos (registered under that name, :1285 and :1545-1546 at 0.9.1)
POLICY_FUNCTIONS = {"vanilla": "compute_policy_loss_vanilla", "gspo": "compute_policy_loss_gspo"}
# entry -> the clip ratios and aggregation it runs at unless the case's options say otherwise: the actor config's
# defaults, and GSPO's example (examples/gspo_trainer/run_qwen3_8b_fsdp.sh:23-24, :102 at v0.9.0: clip 3e-4 / 4e-4,
# seq-mean-token-mean)
POLICY_DEFAULTS = {
    "policy-loss": {"low": 0.2, "high": 0.2, "mode": "token-mean"},
    "policy-gspo": {"low": 3e-4, "high": 4e-4, "mode": "seq-mean-token-mean"},
}
# the actor config's defaults (verl/workers/config/actor.py:158-164 at 0.9.1, actor.yaml:36-86; 0.5.0
# actor/actor.yaml:30-63; 0.4.1 ppo_trainer.yaml:175-208): clip 0.2 both sides, dual clip 3.0, token-mean
CLIP_RATIO = 0.2
CLIP_RATIO_C = 3.0
ACTOR_LOSS_AGG_MODE = "token-mean"
CLIPRANGE_VALUE = 0.5  # critic.cliprange_value's default (verl/workers/config/critic.py:93 at 0.9.1)
CRITIC_LOSS_AGG_MODE = "token-mean"  # critic.loss_agg_mode's default (critic.py:94)
# KL in the reward (`oracles/kinds/gae/kl_reward.py`): entry -> (the returns entry whose function follows,
# algorithm.kl_penalty)
RETURNS_KL = {"reinforce++-kl": ("reinforce++", "kl")}
# algorithm.kl_ctrl (type fixed, kl_coef 0.001): verl/trainer/config/ppo_trainer.yaml:114-117 at 0.9.1,
# KLControlConfig verl/trainer/config/algorithm.py:37; the trainer builds the controller with
# core_algos.get_kl_controller(config.algorithm.kl_ctrl) (ray_trainer.py:364-365)
KL_IN_REWARD_COEF = 0.001
ENTRIES = (*GROUP, *KL, *NORMALIZATION, *RETURNS, *LOSS, *VALUE, *POLICY, *RETURNS_KL)


def uids(group: torch.Tensor) -> np.ndarray:
    """verl's `index`: an object array of str uids, one per row (equal ids for one prompt)."""
    return np.array([f"uid-{int(g)}" for g in group.tolist()], dtype=object)


def _scored_rewards(case: Case, place, device: str) -> torch.Tensor:
    """The case's token rewards plus the score where verl's reward manager writes it, in the case's dtype."""
    dt = case.torch_dtype
    at_score = place(case.attention).to(device)
    score = case.score.to(device=device, dtype=dt)
    rewards = case.token_rewards.to(device=device, dtype=dt)
    return rewards + torch.where(at_score, score[:, None], torch.zeros((), dtype=dt, device=device))


def algo_config(root: Path, **fields):
    """The algorithm config verl's trainer passes as `config`: the pin's own `AlgoConfig` (a dict-like dataclass,
    verl/trainer/config/algorithm.py:620-658 at 0.9.1) where it has one, else a dict (the OmegaConf DictConfig of
    older trainers answers `.get` the same way)."""
    try:
        algorithm = import_from(root, "verl.trainer.config.algorithm")
    except NotPresent:
        return dict(fields)
    return algorithm.AlgoConfig(**fields) if hasattr(algorithm, "AlgoConfig") else dict(fields)


def load_group(root: Path, entry: str) -> Loaded:
    name, kwargs = GROUP[entry]
    route = NORM_STD_ROUTE.get(entry)
    fn, where = function_from(root, [(_CORE, name)])
    params = inspect.signature(fn).parameters
    needed = {"keyword": ("norm_adv_by_std_in_grpo",), "config": ("config",)}.get(route, ())
    missing = [p for p in ("token_level_rewards", "response_mask", "index", *kwargs, *needed) if p not in params]
    if "norm_adv_by_std_in_grpo" in missing:
        raise NotPresent(f"{where} has no norm_adv_by_std_in_grpo at this pin")
    if missing:
        raise RuntimeError(f"{where} has parameters {list(params)}; missing {missing}")
    place, place_where = score_placer(root)

    def run(case: Case, device: str) -> tuple[torch.Tensor]:
        rewards = _scored_rewards(case, place, device)
        mask = case.trainable.to(device=device, dtype=torch.long)
        call = dict(kwargs)
        norm = case.options.get(NORM_STD, True)
        if route == "keyword":
            call["norm_adv_by_std_in_grpo"] = norm
        elif route == "config":
            call["config"] = algo_config(root, norm_adv_by_std_in_grpo=norm)
        adv, _ = fn(token_level_rewards=rewards, response_mask=mask, index=uids(case.group), **call)
        return (adv,)

    how = {
        "keyword": f"{NORM_STD} passed as the keyword norm_adv_by_std_in_grpo (ray_trainer.py:244)",
        "config": f"{NORM_STD} set in the AlgoConfig passed as config, no keyword (ray_trainer.py:250-279)",
    }.get(route, f"called with {kwargs or 'its defaults'}")
    notes = [
        f"{how}; epsilon at its default (ray_trainer.compute_advantage passes none)",
        "index: object array of str uids, response_mask int64 (as verl's trainer passes them)",
        f"score placed by verl's {place_where} (last attended response token), moved into the case's dtype",
    ]
    return Loaded(run, where, notes)


def load_kl(root: Path, entry: str) -> Loaded:
    name = KL[entry]
    fn, where = function_from(root, [(_CORE, "kl_penalty")])
    probe = torch.zeros(1, 1)
    try:
        fn(probe, probe, name)
    except NotImplementedError:
        raise NotPresent(f"{where} has no estimator {name!r} at this pin (NotImplementedError)") from None

    def run(case: Case, device: str) -> tuple[torch.Tensor]:
        dt = case.torch_dtype
        logp = case.extra["logp"].to(device=device, dtype=dt)
        ref = case.extra["ref_logp"].to(device=device, dtype=dt)
        return (fn(logp, ref, name),)

    return Loaded(run, where, [f"kl_penalty(logprob, ref_logprob, {name!r}); no mask argument"])


def load_normalization(root: Path, entry: str) -> Loaded:
    name = NORMALIZATION[entry]
    fn, where = function_from(root, [(_TF, name)])

    def run(case: Case, device: str) -> tuple[torch.Tensor]:
        x = case.extra["x"].to(device=device, dtype=case.torch_dtype)
        mask = case.trainable.to(device=device, dtype=torch.long)
        out = fn(x, mask)
        if name == "masked_mean":  # a 0-dim statistic over the batch, broadcast to the positions
            out = out.expand(case.shape)
        return (out,)

    return Loaded(run, where, [f"{name}(values, mask) with an int64 mask, at its defaults"])


def load_returns(root: Path, entry: str) -> Loaded:
    fn, where = function_from(root, [(_CORE, RETURNS[entry])])
    params = inspect.signature(fn).parameters
    wanted = {"token_level_rewards", "response_mask"} | ({"reward_baselines"} if entry == "remax" else {"config"})
    if not wanted <= set(params):
        raise RuntimeError(f"{where} has parameters {list(params)}; expected {', '.join(sorted(wanted))}")
    place, place_where = score_placer(root)

    def run(case: Case, device: str) -> tuple[torch.Tensor, torch.Tensor]:
        rewards = _scored_rewards(case, place, device)
        mask = case.trainable.to(device=device, dtype=torch.long)
        if entry == "remax":  # the greedy rollout's reward per row, in the rewards' dtype ([B], ray_trainer.py:1525)
            base = case.extra["baseline"][:, 0].to(device=device, dtype=rewards.dtype)
            return fn(token_level_rewards=rewards, reward_baselines=base, response_mask=mask)
        adv, ret = fn(token_level_rewards=rewards, response_mask=mask, config=SimpleNamespace(gamma=case.gamma))
        return adv, ret

    notes = [
        "config: a namespace with gamma (the only field the function reads); response_mask int64",
        f"score placed by verl's {place_where} (last attended response token), moved into the case's dtype",
    ]
    return Loaded(run, where, notes)


def load(root: Path, entry: str) -> Loaded:
    if entry in GROUP:
        return load_group(root, entry)
    if entry in KL:
        return load_kl(root, entry)
    if entry in NORMALIZATION:
        return load_normalization(root, entry)
    if entry in RETURNS:
        return load_returns(root, entry)
    if entry in LOSS:
        return load_loss(root, entry)
    if entry in VALUE:
        return load_value(root, entry)
    if entry in POLICY:
        return load_policy(root, entry)
    if entry in RETURNS_KL:
        return load_returns_kl(root, entry)
    raise ValueError(f"verl has no entry {entry!r}")


def load_value(root: Path, entry: str) -> Loaded:
    """`core_algos.py::compute_value_loss(vpreds, returns, values, response_mask, cliprange_value,
    loss_agg_mode, ...)` (0.9.1 :2125-2185) over a step, the gradient taken with respect to vpreds.
    0.9.1 passes the step's normalisers as for the policy loss (verl/workers/utils/losses.py:147-205,
    the values of transformer_impl.py:729-735 and ray_trainer.py:1380-1389); 0.5.0's critic scales
    each micro-batch by its row share (verl/workers/critic/dp_critic.py:236, :238 by the accumulation
    steps). The clip range and the aggregation come from the case's options `critic.cliprange_value` (default 0.5)
    and `critic.loss_agg_mode` (default token-mean), the CriticConfig fields value_loss passes (losses.py:191-192)."""

    fn, where = function_from(root, [(_CORE, VALUE[entry])])
    params = inspect.signature(fn).parameters
    if "cliprange_value" not in params:
        raise NotPresent(f"{where} has no cliprange_value at this pin: parameters {list(params)}")
    global_info = all(p in params for p in ("dp_size", "batch_num_tokens", "global_batch_size"))

    def micro(rows, v, mask, step):
        dt = v.dtype
        old = step.case.extra["v_old"][rows].to(device=v.device, dtype=dt)
        ret = step.case.extra["ret"][rows].to(device=v.device, dtype=dt)
        # the critic config's fields, as value_loss(config) passes them (verl/workers/utils/losses.py:191-192)
        clip = step.case.options.get("critic.cliprange_value", CLIPRANGE_VALUE)
        mode = step.case.options.get("critic.loss_agg_mode", CRITIC_LOSS_AGG_MODE)
        if "loss_agg_mode" in params:
            kwargs = dict(loss_agg_mode=mode)
        elif mode != CRITIC_LOSS_AGG_MODE:
            raise NotImplementedError(f"{where} has no loss_agg_mode at this pin (critic.loss_agg_mode={mode!r})")
        else:
            kwargs = {}
        if global_info:
            kwargs.update(dp_size=step.ranks, batch_num_tokens=step.tokens, global_batch_size=step.rows)
        vf_loss, _ = fn(vpreds=v, returns=ret, values=old, response_mask=mask, cliprange_value=clip, **kwargs)
        return vf_loss if global_info else vf_loss * (len(rows) / step.rank_rows)

    def run(case: Case, device: str) -> tuple[torch.Tensor, torch.Tensor]:
        return run_step(case, device, micro, leaf_name="v")

    how = "global normalisers" if global_info else "per micro-batch, scaled by its row share"
    return Loaded(
        run,
        where,
        [f"critic.cliprange_value (default {CLIPRANGE_VALUE}) and critic.loss_agg_mode (default token-mean) from the "
         f"case's options, {how}"],
        absent_options=_absent_modes(root, "critic.loss_agg_mode") if "loss_agg_mode" in params else {},
    )  # fmt: skip


def load_loss(root: Path, entry: str) -> Loaded:
    """`core_algos.py::agg_loss` over one optimizer step, as verl's trainer drives it.

    With global normalisers (0.6 on; 0.9.1 `agg_loss(loss_mat, loss_mask, loss_agg_mode, dp_size,
    batch_num_tokens, global_batch_size, loss_scale_factor)`, core_algos.py:1140-1206): every
    micro-batch gets the step's `batch_num_tokens` (the loss_mask sum all-reduced over data-parallel
    ranks, verl/workers/engine/fsdp/transformer_impl.py:729-735), `global_batch_size` =
    ppo_mini_batch_size * rollout.n, the rows of the step (verl/trainer/ppo/ray_trainer.py:1352-1362)
    and `dp_size`; each micro-batch loss is backpropagated as it is (losses.py:57-144 return it,
    transformer_impl.py:740-765 call backward) and data-parallel averaging divides by dp_size.
    Before (0.4.1, 0.5.0 `agg_loss(loss_mat, loss_mask, loss_agg_mode)`): the micro-batch's own
    normaliser, scaled by its share of the rank's mini-batch, `loss * (rows / ppo_mini_batch_size)`
    (verl/workers/actor/dp_actor.py:509 at 0.4.1, :467 at 0.5.0; :511 / :469 divide by the
    accumulation steps, the same for equal micro-batches)."""

    mode, scale = LOSS[entry]
    fn, where = function_from(root, [(_CORE, "agg_loss")])
    params = inspect.signature(fn).parameters
    global_info = all(p in params for p in ("dp_size", "batch_num_tokens", "global_batch_size"))
    present, _ = agg_modes(root)
    if mode not in present:
        raise NotPresent(f"{where} has no loss_agg_mode {mode!r} at this pin (modes: {', '.join(present)})")
    if mode == "seq-mean-token-sum-norm" and "loss_scale_factor" not in params:
        raise NotPresent(
            f"{where} has no loss_scale_factor at this pin: seq-mean-token-sum-norm divides by the padded width "
            "loss_mask.shape[-1] (a known TODO in its comment), which no constant reference describes"
        )
    notes = [f"loss_agg_mode={mode!r}" + (f", loss_scale_factor={scale}" if scale else "")]

    def micro(rows, loss, mask, step):
        if global_info:
            kwargs = dict(dp_size=step.ranks, batch_num_tokens=step.tokens, global_batch_size=step.rows)
            if "loss_scale_factor" in params:
                kwargs["loss_scale_factor"] = scale
            return fn(loss_mat=loss, loss_mask=mask, loss_agg_mode=mode, **kwargs)
        return fn(loss_mat=loss, loss_mask=mask, loss_agg_mode=mode) * (len(rows) / step.rank_rows)

    def run(case: Case, device: str) -> tuple[torch.Tensor, torch.Tensor]:
        return run_step(case, device, micro)

    how = "global normalisers (dp_size, batch_num_tokens, global_batch_size)" if global_info else "per micro-batch"
    return Loaded(run, where, notes + [f"aggregated with {how}"])


def actor_config(root: Path, **fields):
    """The actor config verl's ppo_loss hands the policy loss: an instance of the pin's own `ActorConfig` (a
    dict-like dataclass, verl/workers/config/actor.py:104-221 at 0.9.1) with `fields` set and every other field
    read from the class's own defaults. Its __init__ is not run: the default factories and __post_init__ compare
    with omegaconf's MISSING (actor.py:197-198, optimizer.py:58), a stand-in here, and none of them enters the loss."""
    cls = import_from(root, "verl.workers.config.actor").ActorConfig
    config = cls.__new__(cls)
    for name, value in {**fields, "global_batch_info": {}}.items():
        object.__setattr__(config, name, value)
    return config


def _actor_defaults(root: Path) -> dict:
    """ActorConfig's class defaults of the keys the policy loss reads (a check that the declared variant is the
    pin's default configuration)."""
    cls = import_from(root, "verl.workers.config.actor").ActorConfig
    keys = ("clip_ratio", "clip_ratio_low", "clip_ratio_high", "clip_ratio_c", "loss_agg_mode", "loss_scale_factor")
    return {k: getattr(cls, k, None) for k in keys}


def load_policy(root: Path, entry: str) -> Loaded:
    """verl's vanilla PPO policy loss over one optimizer step, as the actor drives it per micro-batch.

    0.6 on (0.9.1 `core_algos.py::compute_policy_loss_vanilla(old_log_prob, log_prob, advantages, response_mask,
    loss_agg_mode, config, rollout_is_weights)`, :1285-1376, registered as "vanilla"): called as
    `verl/workers/utils/losses.py::ppo_loss` calls it (:104-112): `response_mask` bool (:93), `loss_agg_mode` =
    `config.loss_agg_mode` (:99), `config` the ActorConfig whose `global_batch_info` ppo_loss fills for each
    micro-batch (:65-68: dp_size, batch_num_tokens, global_batch_size, loss_scale_factor = config.loss_scale_factor)
    with the step's values (those of the agg-* entries: transformer_impl.py:729-735, ray_trainer.py:1352-1362),
    `rollout_is_weights` None (no rollout correction, the default). The returned pg_loss is the micro-batch's
    policy loss (entropy_coeff 0 and use_kl_loss False by default add nothing, :123-142), backpropagated as it is.
    Before (0.4.1, 0.5.0 `compute_policy_loss(old_log_prob, log_prob, advantages, response_mask, cliprange,
    cliprange_low, cliprange_high, clip_ratio_c, loss_agg_mode)`): the dp_actor passes the config's clip ratios
    and the batch's int64 response_mask
    (0.5.0 dp_actor.py:400-431, 0.4.1 :455-483) and scales the micro-batch loss by its share of the mini-batch
    (0.5.0 :467, 0.4.1 :509; :469 / :511 by the accumulation steps, the same for equal micro-batches).
    The clip ratios, the dual clip and the aggregation come from the case's options (the actor config's keys).
    `policy-gspo`: loss_mode "gspo", `compute_policy_loss_gspo` (:1545-1614 at 0.9.1, the same signature and call; no
    dual clip), at GSPO's example clip ratios and aggregation (`POLICY_DEFAULTS`)."""

    loss_mode = POLICY[entry]
    core = import_from(root, _CORE)
    vanilla = POLICY_FUNCTIONS[loss_mode]
    if loss_mode != "vanilla" and not hasattr(core, vanilla):
        raise NotPresent(f"{_CORE} has no {vanilla} (policy loss {loss_mode!r}) at this pin")
    if hasattr(core, vanilla):
        fn, where = function_from(root, [(_CORE, vanilla)])
        registry = getattr(core, "get_policy_loss_fn", None)
        if registry is not None and registry(loss_mode) is not fn:
            raise RuntimeError(f"{where} is not what get_policy_loss_fn({loss_mode!r}) returns at this pin")
        params = inspect.signature(fn).parameters
        if "config" not in params:
            raise RuntimeError(f"{where} has parameters {list(params)}; expected config")
        defaults = _actor_defaults(root)
        expected = dict(
            clip_ratio=CLIP_RATIO, clip_ratio_low=CLIP_RATIO, clip_ratio_high=CLIP_RATIO, clip_ratio_c=CLIP_RATIO_C,
            loss_agg_mode=ACTOR_LOSS_AGG_MODE, loss_scale_factor=None,
        )  # fmt: skip
        if defaults != expected:
            raise RuntimeError(f"ActorConfig's defaults at this pin are {defaults}, not the declared {expected}")
        modern = True
    else:
        fn, where = function_from(root, [(_CORE, "compute_policy_loss")])
        params = inspect.signature(fn).parameters
        missing = [p for p in ("cliprange_low", "cliprange_high", "clip_ratio_c", "loss_agg_mode") if p not in params]
        if missing:
            raise NotPresent(f"{where} has no {', '.join(missing)} at this pin: parameters {list(params)}")
        modern = False
    agg_params = inspect.signature(function_from(root, [(_CORE, "agg_loss")])[0]).parameters
    global_info = modern and all(p in agg_params for p in ("dp_size", "batch_num_tokens", "global_batch_size"))

    def micro(rows, logp, mask, step):
        dt = logp.dtype
        old = step.case.extra["old_logp"][rows].to(device=logp.device, dtype=dt)
        adv = step.case.extra["adv"][rows].to(device=logp.device, dtype=dt)
        o, at = step.case.options, POLICY_DEFAULTS[entry]
        low = o.get("actor.clip_ratio_low", at["low"])
        high = o.get("actor.clip_ratio_high", at["high"])
        dual = o.get("actor.clip_ratio_c", CLIP_RATIO_C)
        mode = o.get("actor.loss_agg_mode", at["mode"])
        if not modern:
            pg_loss, *_ = fn(
                old_log_prob=old, log_prob=logp, advantages=adv, response_mask=mask.to(torch.long),
                cliprange=CLIP_RATIO, cliprange_low=low, cliprange_high=high, clip_ratio_c=dual, loss_agg_mode=mode,
            )  # fmt: skip
            return pg_loss * (len(rows) / step.rank_rows)
        config = actor_config(
            root, clip_ratio=CLIP_RATIO, clip_ratio_low=low, clip_ratio_high=high, clip_ratio_c=dual, loss_agg_mode=mode
        )
        if global_info:  # ppo_loss, losses.py:65-68
            config.global_batch_info.update(
                dp_size=step.ranks, batch_num_tokens=step.tokens, global_batch_size=step.rows,
                loss_scale_factor=config.loss_scale_factor,
            )  # fmt: skip
        pg_loss = fn(
            old_log_prob=old, log_prob=logp, advantages=adv, response_mask=mask.to(torch.bool),
            loss_agg_mode=config.loss_agg_mode, config=config, rollout_is_weights=None,
        )[0]  # fmt: skip  # (pg_loss, metrics) at 0.9.1; (pg_loss, clipfrac, kl, clipfrac_lower) at 0.6.0
        return pg_loss if global_info else pg_loss * (len(rows) / step.rank_rows)

    def run(case: Case, device: str) -> tuple[torch.Tensor, torch.Tensor]:
        return run_step(case, device, micro, leaf_name="logp")

    how = (
        "the ActorConfig (verl/workers/config/actor.py) with global_batch_info set per micro-batch as ppo_loss does"
        if global_info
        else "per micro-batch, scaled by its row share as the dp_actor does"
    )
    at = POLICY_DEFAULTS[entry]
    notes = [
        f"loss_mode {loss_mode!r}: clip_ratio_low / clip_ratio_high (default {at['low']} / {at['high']}), clip_ratio_c "
        f"(default {CLIP_RATIO_C}; GSPO reads none) and loss_agg_mode (default {at['mode']}) from the case's options; "
        f"{how}",
        "rollout_is_weights None (no rollout correction); entropy_coeff 0 and use_kl_loss False (the defaults) add "
        "no term; "
        + (
            "log-ratio clamped to [-20, 20] inside verl"
            if loss_mode == "vanilla"
            else "the log sequence ratio clamped at 10 (core_algos.py:1590)"
        ),
    ]
    absent = _absent_modes(root, "actor.loss_agg_mode")
    fixed = _fixed_agg_mode(fn) if loss_mode != "vanilla" else None
    if fixed:  # the function passes agg_loss its own mode: the actor's option does not reach it
        mode, at = fixed
        absent = {"actor.loss_agg_mode": (tuple(m for m in AGG_MODES if m != mode), f"{at}: agg_loss gets {mode!r}")}
    return Loaded(run, where, notes, absent_options=absent)


def _fixed_agg_mode(fn) -> tuple[str, str] | None:
    """(mode, file:line) where `fn` calls agg_loss with a literal loss_agg_mode (verl 0.7.0's GSPO passes
    "seq-mean-token-mean", core_algos.py:1060-1061, whatever its own loss_agg_mode), else None."""
    import ast

    src, first = inspect.getsourcelines(fn)
    tree = ast.parse(inspect.cleandoc("".join(src)) if src[0].startswith(" ") else "".join(src))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "agg_loss":
            for kw in node.keywords:
                if kw.arg == "loss_agg_mode" and isinstance(kw.value, ast.Constant):
                    rel = "verl/" + inspect.getsourcefile(fn).split("/verl/", 1)[-1]
                    return kw.value.value, f"{rel}:{first + node.lineno - 1}"
    return None


def trainer_function(root: Path, name: str):
    """The top-level def `name` of verl/trainer/ppo/ray_trainer.py compiled from the pin's source (file and line
    numbers kept), and where it is. The module itself is not imported: it pulls in the whole distributed stack
    (torchdata, ray, the Megatron engine with a module-level megatron version check) that none of its small helpers
    touch. The names the def reads from `from verl... import x` lines of the file are the pin's real objects
    (imported as the other entries import them); torch is real; anything else fails loudly (BlockNotFound)."""
    import ast
    import builtins

    path = Path(root) / "verl" / "trainer" / "ppo" / "ray_trainer.py"
    if not path.is_file():
        raise NotPresent("verl/trainer/ppo/ray_trainer.py is not present at this pin")
    tree = SourceTree(Path(root), ("verl",))
    src = tree.file(path)
    node = next((n for n in src.tree.body if isinstance(n, ast.FunctionDef) and n.name == name), None)
    if node is None:
        raise NotPresent(f"verl/trainer/ppo/ray_trainer.py has no {name} at this pin")
    free = function_free_names(node)
    ns = tree.namespace(path)
    for imp in src.tree.body:
        if isinstance(imp, ast.ImportFrom) and not imp.level and (imp.module or "").split(".")[0] == "verl":
            for alias in imp.names:
                bound = alias.asname or alias.name
                if bound in free and bound not in ns:
                    mod = import_from(root, imp.module)
                    obj = getattr(mod, alias.name, None)
                    ns[bound] = obj if obj is not None else import_from(root, f"{imp.module}.{alias.name}")
    fn = tree.function(path, node)
    missing = sorted(n for n in free if n not in ns and not hasattr(builtins, n))
    if missing:
        raise BlockNotFound(f"verl/trainer/ppo/ray_trainer.py:{node.lineno} {name} reads unresolved names {missing}")
    return fn, f"verl/trainer/ppo/ray_trainer.py::{name} (line {node.lineno})"


def load_returns_kl(root: Path, entry: str) -> Loaded:
    """KL in the reward, as verl's trainer runs it with `algorithm.use_kl_in_reward=True`: the reward manager's
    scores (`score_placer`, plus the case's token rewards) as `token_level_scores`, then
    `ray_trainer.py::apply_kl_penalty(data, kl_ctrl, kl_penalty)` (0.9.1 :78-117: `core_algos.kl_penalty(old_log_probs,
    ref_log_prob)`, `* response_mask`, `token_level_scores - kl_ctrl.value * kld`; called at :1638-1642) on a
    DataProto, the controller from `core_algos.get_kl_controller` (type fixed, kl_coef 0.001), then the returns
    entry's function on `token_level_rewards` (compute_advantage, :248-281). Pins whose apply_kl_penalty reads the
    mask from the attention (0.1 ... 0.4.1: `attention_mask[:, -response_length:]`) get the case's trainable mask
    as the response part of attention_mask: there the trainer's response_mask is that slice (compute_response_mask)."""
    base, penalty = RETURNS_KL[entry]
    fn, where = function_from(root, [(_CORE, RETURNS[base])])
    apply, apply_where = trainer_function(root, "apply_kl_penalty")
    core = import_from(root, _CORE)
    params = inspect.signature(fn).parameters
    if not {"token_level_rewards", "response_mask", "config"} <= set(params):
        want = "token_level_rewards, response_mask, config"
        raise RuntimeError(f"{where} has parameters {list(params)}; expected {want}")
    place, place_where = score_placer(root)
    from verl import DataProto  # the pin's own DataProto (verl/protocol.py)

    def run(case: Case, device: str) -> tuple[torch.Tensor, torch.Tensor]:
        dt = case.torch_dtype
        scores = _scored_rewards(case, place, device)
        mask = case.trainable.to(device=device, dtype=torch.long)
        b_rows, t_len = case.shape
        prompt = torch.ones(b_rows, 1, dtype=torch.long, device=device)
        data = DataProto.from_dict(
            tensors={
                "responses": torch.zeros(b_rows, t_len, dtype=torch.long, device=device),
                "attention_mask": torch.cat([prompt, mask], dim=1),
                "response_mask": mask,
                "token_level_scores": scores,
                "old_log_probs": case.extra["logp"].to(device=device, dtype=dt),
                "ref_log_prob": case.extra["ref_logp"].to(device=device, dtype=dt),
            }
        )
        kl_ctrl = core.get_kl_controller(SimpleNamespace(type="fixed", kl_coef=KL_IN_REWARD_COEF))
        data, _ = apply(data, kl_ctrl=kl_ctrl, kl_penalty=penalty)
        rewards = data.batch["token_level_rewards"]
        adv, ret = fn(token_level_rewards=rewards, response_mask=mask, config=SimpleNamespace(gamma=case.gamma))
        return adv, ret

    notes = [
        f"{apply_where}(kl_penalty={penalty!r}) with get_kl_controller(type='fixed', "
        f"kl_coef={KL_IN_REWARD_COEF}), then {where}",
        f"token_level_scores: the score placed by verl's {place_where} plus the case's token rewards",
        "old_log_probs / ref_log_prob: the case's logp / ref_logp; response_mask int64 (also the response part of "
        "attention_mask, which apply_kl_penalty reads before 0.5.0)",
    ]
    # `where` names the judged function alone (maskfuzz repro writes it as an import); the chain is in the notes
    return Loaded(run, where, notes)

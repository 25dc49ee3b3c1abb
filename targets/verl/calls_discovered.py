"""The worker side of verl's discovered policy losses: `policy-loss:<name>` run through verl's own registry.

`load(root, entry)` reads the variant from the checkout (discover.py), imports the module that registers it and
takes `get_policy_loss_fn(name)` (verl/trainer/ppo/core_algos.py:70-85 at 0.9.1), the lookup the actor makes with
`actor.policy_loss.loss_mode` (verl/workers/utils/losses.py:101-103). Each micro-batch of the step is called as
ppo_loss calls the loss (losses.py:104-112): `response_mask` bool, `loss_agg_mode` token-mean, `config` the pin's
own `ActorConfig` at its class defaults (nested configs too; its __init__ is not run: the default factories and
__post_init__ compare with omegaconf's MISSING, a stand-in here) with `global_batch_info` set per micro-batch
(:65-68), `rollout_is_weights` None. The first element of what the loss returns is the micro-batch's policy
loss, backpropagated as it is (with global normalisers) or scaled by its row share (without).
"""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path
from types import SimpleNamespace

import torch

from maskfuzz.oracles.case import Case
from maskfuzz.targets.adapters import cov_selection
from maskfuzz.targets.adapters.base import Loaded, NotPresent, function_from, import_from
from maskfuzz.targets.adapters.loss_step import run_step
from maskfuzz.targets.adapters.selection import selection_problem
from maskfuzz.targets.verl.calls import score_placer
from maskfuzz.targets.verl.calls_kinds import algo_config, uids

_CORE = "verl.trainer.ppo.core_algos"
# what load passes (the common signature ppo_loss calls with, verl/workers/utils/losses.py:104-112 at 0.9.1); a
# required parameter outside it cannot be given
REQUIRED = ("old_log_prob", "log_prob", "advantages", "response_mask")
ACCEPTED = (*REQUIRED, "loss_agg_mode", "config", "rollout_is_weights", "rollout_log_probs")
LOSS_AGG_MODE = "token-mean"  # actor.loss_agg_mode's default (ActorConfig, verl/workers/config/actor.py)
# the Entropy-Mechanism recipe's settings (adapters.cov_selection): (actor fields, actor.policy_loss fields), as
# verl's example scripts set them (v0.5.0 recipe/entropy/7b_clip_cov.sh:17-21, 7b_kl_cov.sh:17-18 and :53-54; the
# same at v0.4.1); clip_ratio stays at its default 0.2 (ppo_trainer.yaml:175 at 0.4.1)
COV_SETTINGS = {
    "clip_cov": ({"clip_ratio_low": 1.0, "clip_ratio_high": 1.0}, {"clip_cov_ratio": 0.0002, "clip_cov_lb": 1.0,
                                                                   "clip_cov_ub": 5.0}),
    "kl_cov": ({"clip_ratio_low": 0.2, "clip_ratio_high": 0.2}, {"kl_cov_ratio": 0.002, "ppo_kl_coef": 1.0}),
}  # fmt: skip


def signature_problem(function: str, params: tuple[str, ...]) -> str:
    """Why a loss with these parameters cannot be called with the common signature ("" when it can)."""
    missing = [p for p in REQUIRED if p not in params]
    extra = [p for p in params if p not in ACCEPTED]
    if not missing and not extra:
        return ""
    wants = "lacks " + ", ".join(missing) if missing else "wants " + ", ".join(extra)
    return f"{function}{params} is not the common signature ({', '.join(ACCEPTED)}): {wants}"


# what compute_advantage's registry branch passes (ray_trainer.py:250-256 at 0.9.1)
ADV_PASSED = ("token_level_rewards", "response_mask", "config", "index")


def adv_problem(function: str, required: tuple[str, ...]) -> str:
    """Why an estimator cannot be judged as a group advantage ("" when it can): one that requires a critic's values
    is a GAE estimator, one without groups (no `index`: REINFORCE++, REMAX) a returns estimator, which no discovered
    entry calls yet (`adv:` entries are group advantages); any other input beyond what the trainer's branch passes is
    missing."""
    if "values" in required or "index" not in required:
        return (
            f"{function} requires {', '.join(required)}: a GAE or returns estimator, which no discovered entry "
            "calls yet (adv: entries are group advantages)"
        )
    extra = [p for p in required if p not in ADV_PASSED]
    if extra:
        return (
            f"{function} requires {', '.join(extra)}: inputs beyond what the group-advantage case holds "
            f"({', '.join(ADV_PASSED)})"
        )
    return ""


def _defaults(cls, depth: int = 0):
    """An instance of the dataclass `cls` holding its own field defaults (nested dataclass defaults built the same
    way), without running its __init__ / __post_init__."""
    obj = cls.__new__(cls)
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            value = f.default
        elif f.default_factory is not dataclasses.MISSING:
            value = _factory(f.default_factory, depth)
        else:
            continue
        object.__setattr__(obj, f.name, value)
    return obj


def _factory(factory, depth: int):
    if dataclasses.is_dataclass(factory) and isinstance(factory, type) and depth < 4:
        return _defaults(factory, depth + 1)
    try:
        return factory()
    except Exception:  # noqa: BLE001 - a default the loss never reads (an engine config needing omegaconf)
        return None


def _config(config_cls, name: str):
    """The actor config handed to loss `name`: the pin's ActorConfig at its class defaults, or, for a recipe at a
    pin without one (0.4.1, 0.5.0: the actor passes its omegaconf DictConfig, read by attribute), a namespace of
    the fields the loss reads; a recipe's settings set (`COV_SETTINGS`)."""
    actor, policy = COV_SETTINGS.get(name, ({}, {}))
    if config_cls is None:
        config = SimpleNamespace(clip_ratio=0.2, policy_loss=SimpleNamespace(loss_mode=name, **policy), **actor)
    else:
        config = _defaults(config_cls)
        for key, value in actor.items():
            object.__setattr__(config, key, value)
        for key, value in policy.items():
            object.__setattr__(config.policy_loss, key, value)
    object.__setattr__(config, "loss_agg_mode", LOSS_AGG_MODE)
    object.__setattr__(config, "global_batch_info", {})
    return config


def load(root: Path, entry: str) -> Loaded:
    prefix, _, name = entry.partition(":")
    if prefix == "adv":
        return load_adv(root, name)
    core = import_from(root, _CORE)  # the decorators run at import: the pin's registry is then complete
    registry = getattr(core, "POLICY_LOSS_REGISTRY", None)
    if registry is None or not hasattr(core, "get_policy_loss_fn"):
        raise NotPresent(f"{_CORE} has no policy-loss registry at this pin")
    if name not in registry:
        known = ", ".join(registry) or "none"
        raise NotPresent(f"no policy loss {name!r} is registered at this pin (registered: {known})")
    fn = core.get_policy_loss_fn(name)
    params = inspect.signature(fn).parameters
    file = Path(inspect.getsourcefile(fn)).resolve().relative_to(Path(root).resolve())
    at = f"{file}:{inspect.getsourcelines(fn)[1]}"
    where = f"{at} ({fn.__name__}, get_policy_loss_fn({name!r}))"
    recipe = name in COV_SETTINGS  # its selection declared, its draw seeded (adapters.cov_selection)
    why = signature_problem(fn.__name__, tuple(params)) or ("" if recipe else selection_problem(fn, root, False))
    if why:
        raise NotPresent(f"{at}: not callable outside the trainer: {why}")
    loss_fn = cov_selection.seeded(fn) if recipe else fn
    try:
        config_cls = import_from(root, "verl.workers.config.actor").ActorConfig
    except (NotPresent, AttributeError):
        config_cls = None
    if config_cls is None and not recipe:
        raise NotPresent(
            f"{where}: no ActorConfig dataclass at this pin (verl.workers.config.actor): the config the actor hands "
            "the loss is its omegaconf DictConfig, which cannot be built outside the trainer here"
        ) from None
    agg_params = inspect.signature(function_from(root, [(_CORE, "agg_loss")])[0]).parameters
    global_info = all(p in agg_params for p in ("dp_size", "batch_num_tokens", "global_batch_size"))

    def micro(rows, logp, mask, step):
        dt = logp.dtype
        old = step.case.extra["old_logp"][rows].to(device=logp.device, dtype=dt)
        adv = step.case.extra["adv"][rows].to(device=logp.device, dtype=dt)
        config = _config(config_cls, name)
        if global_info:  # ppo_loss, losses.py:65-68
            config.global_batch_info.update(
                dp_size=step.ranks, batch_num_tokens=step.tokens, global_batch_size=step.rows,
                loss_scale_factor=getattr(config, "loss_scale_factor", None),
            )  # fmt: skip
        kwargs = dict(old_log_prob=old, log_prob=logp, advantages=adv, response_mask=mask.to(torch.bool))
        optional = dict(loss_agg_mode=LOSS_AGG_MODE, config=config, rollout_is_weights=None, rollout_log_probs=None)
        kwargs.update({k: x for k, x in optional.items() if k in params})
        got = loss_fn(**kwargs)
        loss = got[0] if isinstance(got, (tuple, list)) else got
        return loss if global_info else loss * (len(rows) / step.rank_rows)

    def run(case: Case, device: str) -> tuple[torch.Tensor, torch.Tensor]:
        return run_step(case, device, micro, leaf_name="logp")

    _needs_no_setting(loss_fn, params, lambda: _config(config_cls, name), where)

    how = "global normalisers set per micro-batch as ppo_loss does" if global_info else "per micro-batch, row share"
    notes = [
        f"discovered: @register_policy_loss({name!r}) at {at}; invariants only (no float64 reference)",
        f"ActorConfig at its class defaults, loss_agg_mode {LOSS_AGG_MODE}, rollout_is_weights None; {how}",
    ]
    if recipe:
        shown = ", ".join(f"{k}={v}" for part in COV_SETTINGS[name] for k, v in part.items())
        base = "ActorConfig" if config_cls is not None else "a namespace of the fields it reads (no ActorConfig here)"
        notes[1] = f"call recipe: {base} with {shown}, each call under a CPU RNG seeded {cov_selection.SEED}; {how}"
    return Loaded(run, where, notes)


def _needs_no_setting(fn, params, new_config, where: str) -> None:
    """One call on a plain valid micro-batch (1 x 2, every token trained) with the config at its defaults: a
    variant that rejects its defaults (DRO: `dro_beta must be a positive value`) needs a setting a user makes, so
    it is listed with that reason instead of crashing on every case."""
    x = torch.zeros(1, 2)
    kwargs = dict(old_log_prob=x, log_prob=x, advantages=torch.ones(1, 2), response_mask=torch.ones(1, 2, dtype=bool))
    config = new_config()
    optional = dict(loss_agg_mode=LOSS_AGG_MODE, config=config, rollout_is_weights=None, rollout_log_probs=None)
    kwargs.update({k: v for k, v in optional.items() if k in params})
    try:
        fn(**kwargs)
    except ValueError as exc:
        raise NotPresent(f"{where}: needs a setting without a default to run: {exc}") from None
    except Exception:  # noqa: BLE001 - anything else is for the fuzzer to see and judge
        return


def _scored_rewards(case: Case, place, device: str) -> torch.Tensor:
    """The case's token rewards plus the score where verl's reward manager writes it (as calls_kinds does)."""
    dt = case.torch_dtype
    at_score = place(case.attention).to(device)
    score = case.score.to(device=device, dtype=dt)
    rewards = case.token_rewards.to(device=device, dtype=dt)
    return rewards + torch.where(at_score, score[:, None], torch.zeros((), dtype=dt, device=device))


def load_adv(root: Path, name: str) -> Loaded:
    """`adv:<name>`: `get_adv_estimator_fn(name)` (core_algos.py:137-150 at 0.9.1) called as
    `ray_trainer.compute_advantage`'s registry branch calls it (verl/trainer/ppo/ray_trainer.py:248-279):
    `token_level_rewards` with the score where verl's reward manager puts it, `response_mask` (the loss mask, int64),
    `config` the pin's AlgoConfig at its defaults, `index` the uids; as the hand-written group entries
    (`calls_kinds.load_group`)."""
    core = import_from(root, _CORE)
    registry = getattr(core, "ADV_ESTIMATOR_REGISTRY", None)
    if registry is None or not hasattr(core, "get_adv_estimator_fn"):
        raise NotPresent(f"{_CORE} has no advantage-estimator registry at this pin")
    if name not in registry:
        raise NotPresent(
            f"no advantage estimator {name!r} is registered at this pin (registered: {', '.join(registry)})"
        )
    fn = core.get_adv_estimator_fn(name)
    file = Path(inspect.getsourcefile(fn)).resolve().relative_to(Path(root).resolve())
    at = f"{file}:{inspect.getsourcelines(fn)[1]}"
    where = f"{at} ({fn.__name__}, get_adv_estimator_fn({name!r}))"
    params = inspect.signature(fn).parameters
    skip = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    required = tuple(n for n, p in params.items() if p.kind not in skip and p.default is inspect.Parameter.empty)
    why = adv_problem(fn.__name__, required) or selection_problem(fn, root, True)
    if why:
        raise NotPresent(f"{at}: not judged as a group advantage: {why}")
    place, place_where = score_placer(root)
    config = algo_config(root)

    def run(case: Case, device: str) -> tuple[torch.Tensor]:
        rewards = _scored_rewards(case, place, device)
        mask = case.trainable.to(device=device, dtype=torch.long)
        adv, _ = fn(token_level_rewards=rewards, response_mask=mask, config=config, index=uids(case.group))
        return (adv,)

    notes = [
        f"discovered: @register_adv_est -> {name!r} at {at}; invariants only (no float64 reference)",
        f"called as compute_advantage's registry branch calls it: config = AlgoConfig at its defaults, index = str "
        f"uids, response_mask int64, score placed by verl's {place_where}",
    ]
    return Loaded(run, where, notes)

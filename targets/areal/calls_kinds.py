"""AReaL's masked math beyond GAE: loaders for the entries of `targets.areal.declare.SPEC`.

`Normalization` and `KLEstimator` are AReaL's own classes, compiled from `areal/utils/data.py` at
the pin (`SourceTree`, as the GAE entry compiles the actor: importing `areal` pulls its controller
stack). `NormConfig` is stood in by a namespace with the six attributes `Normalization.__init__`
reads. Each entry feeds the class what `PPOActor._compute_advantages` feeds it:

* `grpo`: `reward_norm(reward_score)` on the [B] scores (1.0.4 areal/trainer/ppo/actor.py:172-173; git main
  :211-212 with `group_sizes=meta.traj_group_sizes`), config group / group as AReaL's GRPO examples set it.
  The release slices fixed-size contiguous groups (`range(bs // group_size)`); git main takes the sizes of
  contiguous groups. A case whose groups are not contiguous (or, at the release, not of one size) cannot be
  expressed: the adapter raises `ValueError("areal: ...")`, a documented error of the entry.
  The [B] output is broadcast to every position (the actor adds it at the last token and runs GAE).
* `adv-norm`: `adv_norm(advantages, loss_mask)` on [B, T] (1.0.4 actor.py:238-239; git main :313), config
  batch / batch (NormConfig defaults).
* `agg-token-mean` (loss-aggregation): `ppo_actor_loss_fn` (the PPO actor's per-micro-batch token mean) with
  the engine's micro-batch weights from `compute_total_loss_weight`, over one optimizer step (`load_loss`).
* `value-loss`: `ppo_critic_loss_fn` (the critic's per-micro-batch token mean) with the same engine weights,
  over one optimizer step, the gradient taken with respect to the critic's values (`load_value`).
* `policy-loss`: `ppo_actor_loss_fn` (the clipped PPO objective, proximal = old log-probs: decoupled PPO off)
  with the same engine weights, over one optimizer step, the gradient taken with respect to the current
  log-probs (`load_policy`).
* `kl-k1`, `kl-k2`, `kl-k3`: `KLEstimator(name)(old_logp, ref_logp)` after the actor's
  `ref_logp *= loss_mask; old_logp *= loss_mask` (1.0.4 actor.py:194-195; git main :245-246).
"""

from __future__ import annotations

import types
from pathlib import Path

import torch

from maskfuzz.oracles.case import Case
from maskfuzz.oracles.kinds.loss_aggregation import microbatches
from maskfuzz.targets.adapters.base import Loaded, NotPresent
from maskfuzz.targets.adapters.extract import SourceTree
from maskfuzz.targets.adapters.loss_step import run_step, run_step_gloo

DATA = "areal/utils/data.py"
NORM = {
    # entry -> NormConfig attributes (NormConfig defaults: eps 1e-5, std_unbiased True, mean_leave1out False)
    "grpo": dict(mean_level="group", mean_leave1out=False, std_level="group", std_unbiased=True, eps=1e-5),
    "adv-norm": dict(mean_level="batch", mean_leave1out=False, std_level="batch", std_unbiased=True, eps=1e-5),
}
# entry -> (option name prefix): the NormConfig fields a case's options override (targets/areal/declare.py
# GRPO_OPTIONS, ADV_NORM_OPTIONS); "none" is YAML null
PREFIX = {"grpo": "actor.reward_norm.", "adv-norm": "actor.adv_norm."}
KL = {"kl-k1": "k1", "kl-k2": "k2", "kl-k3": "k3"}
LOSS = ("agg-token-mean",)
VALUE = ("value-loss",)
POLICY = ("policy-loss",)
ENTRIES = (*NORM, *KL, *LOSS, *VALUE, *POLICY)
# where ppo_actor_loss_fn lives: 1.0.4 and git main, then v0.3.4
FUNCTIONAL = ("areal/utils/functional/functional.py", "areal/utils/functional.py")
TRAIN_ENGINE = "areal/engine/core/train_engine.py"


def blocks(group: torch.Tensor) -> list[int] | None:
    """The sizes of the contiguous runs of equal ids, or None when an id comes back after another."""
    sizes: list[int] = []
    seen: set[int] = set()
    prev = None
    for g in group.tolist():
        if g == prev:
            sizes[-1] += 1
            continue
        if g in seen:
            return None
        seen.add(g)
        sizes.append(1)
        prev = g
    return sizes


def norm_config(entry: str, case: Case, group_size: int) -> types.SimpleNamespace:
    """The NormConfig of `entry` under the case's options, as a namespace of the attributes
    `Normalization.__init__` reads (the trainer builds `Normalization(config.reward_norm)` /
    `Normalization(config.adv_norm)` from the same fields)."""
    cfg = dict(NORM[entry], group_size=group_size)
    for name, value in case.options.items():
        if name.startswith(PREFIX[entry]):
            cfg[name[len(PREFIX[entry]) :]] = None if value == "none" else value
    return types.SimpleNamespace(**cfg)


def _classes(root: Path) -> tuple[type, type, bool]:
    tree = SourceTree(Path(root), ("areal",))
    path = Path(root) / DATA
    if not path.is_file():
        raise NotPresent(f"{DATA} is not present at this pin")
    ns = tree.resolve(path, ["Normalization", "KLEstimator"])
    missing = [n for n in ("Normalization", "KLEstimator") if n not in ns]
    if missing:
        raise NotPresent(f"{DATA} has no {', '.join(missing)} at this pin")
    norm = ns["Normalization"]
    import inspect

    takes_sizes = "group_sizes" in inspect.signature(norm.__call__).parameters
    return norm, ns["KLEstimator"], takes_sizes


def normalization_class(root: Path) -> tuple[type, bool]:
    """AReaL's `Normalization` compiled from the pin, and whether its `__call__` takes `group_sizes` (git main)."""
    norm, _, takes_sizes = _classes(root)
    return norm, takes_sizes


def _no_all_reduce(tensor, group=None, **kw):
    """The all-reduce of a step whose micro-batches of every rank are already in the one list: a no-op."""
    return None


def _weight(mb: dict) -> torch.Tensor:
    """The actor's and the critic's `loss_weight_fn` (1.0.4 areal/trainer/ppo/actor.py:363, critic.py:72)."""
    return mb["loss_mask"].count_nonzero()


def _compiled_loss(root: Path, name: str):
    """(source tree, file, function) of the loss `name` compiled from the pin's functional module."""
    tree = SourceTree(Path(root), ("areal",))
    fpath = next((Path(root) / f for f in FUNCTIONAL if (Path(root) / f).is_file()), None)
    if fpath is None:
        raise NotPresent(f"none of {', '.join(FUNCTIONAL)} is present at this pin")
    ns = tree.resolve(fpath, [name])
    if name not in ns:
        raise NotPresent(f"{tree.rel(fpath)} has no {name} at this pin ({tree.unresolved})")
    return tree, fpath, ns[name]


def _total_weight(root: Path, tree: SourceTree):
    """(total(step, device), how): the step's total loss weight over every rank's micro-batches, by the pin's
    `compute_total_loss_weight` (1.0.4 areal/engine/core/train_engine.py:30-64): on the rank of a gloo group
    (`step_driver`) over that rank's micro-batches with AReaL's own `dist.all_reduce`, in one process over every
    rank's micro-batches with the all-reduce a no-op; summed and asserted non-zero inline where the engine has
    none (v0.3.4 fsdp_engine.py:390-398)."""
    import torch.distributed as dist

    total_fn = real_fn = None
    epath = Path(root) / TRAIN_ENGINE
    if epath.is_file():
        ens = tree.resolve(epath, ["compute_total_loss_weight"])
        if "compute_total_loss_weight" in ens:
            real_fn = f = ens["compute_total_loss_weight"]
            stub = types.SimpleNamespace(all_reduce=_no_all_reduce, ProcessGroup=object)
            total_fn = types.FunctionType(f.__code__, {**f.__globals__, "dist": stub}, f.__name__, f.__defaults__)

    once: dict = {}  # on a gloo rank: the step's total, all-reduced once before the micro-batch loop as the engine does

    def total(step, device) -> torch.Tensor:
        if real_fn is not None and dist.is_available() and dist.is_initialized():
            # a rank of a gloo group (loss_step.run_step_gloo, a forked process per step): its own micro-batches,
            # AReaL's own all-reduce, once per step (ranks with different micro-batch counts would mismatch it)
            if "total" not in once:
                mine = [r for k, r in microbatches(step.case) if k == step.rank]
                mbs = [{"loss_mask": step.mask[r.to(device)].bool()} for r in mine]
                once["total"] = real_fn(types.SimpleNamespace(mbs=mbs), _weight, None)
            return once["total"]
        mbs = [{"loss_mask": step.mask[r.to(device)].bool()} for _, r in microbatches(step.case)]
        if total_fn is not None:
            return total_fn(types.SimpleNamespace(mbs=mbs), _weight, None)
        out = torch.stack([_weight(mb) for mb in mbs]).sum().to(torch.float32)
        assert out != 0  # v0.3.4 fsdp_engine.py:390-398
        return out

    how = ("compute_total_loss_weight compiled from the pin (with ranks > 1: each rank a process of a CPU gloo group, "
           "AReaL's own all-reduce; else in one process, the all-reduce a no-op)"
           if total_fn is not None else "total weight summed inline as the v0.3.4 engine does")  # fmt: skip
    return total, how


def step_driver(root: Path):
    """`run_step`, or `run_step_gloo` for a step on more than one rank where the pin's engine all-reduces the
    loss weight with torch.distributed (compute_total_loss_weight): the collective then runs for real."""
    gloo = (Path(root) / TRAIN_ENGINE).is_file()

    def drive(case: Case, device: str, micro, leaf_name: str = "loss"):
        if gloo and case.ranks > 1:
            return run_step_gloo(case, device, micro, leaf_name=leaf_name)
        return run_step(case, device, micro, leaf_name=leaf_name)

    return drive


def load_loss(root: Path, entry: str) -> Loaded:
    """AReaL's PPO actor aggregation over one optimizer step, both halves compiled from the pin.

    The loss: `ppo_actor_loss_fn(logprobs, proximal_logprobs, old_logprobs, advantages, eps_clip, loss_mask)`
    (1.0.4 areal/utils/functional/functional.py:429-561; v0.3.4 areal/utils/functional.py:141-200) returns
    `where(loss_mask, pg_loss, 0).sum() / (loss_mask.count_nonzero() or 1)` (1.0.4 :483, :542), the micro-batch's
    own token mean. The per-token loss l enters as `advantages = -l` with all three log-probs 0: the ratio is
    `where(loss_mask, exp(0), 0)` (1.0.4 :509), so `pg_loss = max(-A * 1, -A * clamp(1)) = l` exactly (eps_clip 0.2,
    c_clip and rejection sampling None: the defaults). loss_mask is bool (`input_data["loss_mask"].bool()`,
    1.0.4 areal/trainer/ppo/actor.py:431).
    The weights: `loss_weight_fn = lambda x: x["loss_mask"].count_nonzero()` (1.0.4 actor.py:363);
    `compute_total_loss_weight(mb_list, loss_weight_fn, dp_group)` sums it over the micro-batches and all-reduces
    over data parallel, asserting it positive (1.0.4 areal/engine/core/train_engine.py:30-64); called here on the
    micro-batches of every rank at once with its `dist.all_reduce` a no-op. Each micro-batch loss is scaled by
    `local_weight / total_loss_weight * loss_multiplier`, `loss_multiplier = dp_size` (1.0.4
    areal/engine/fsdp_engine.py:2120, :790), and a micro-batch of weight 0 returns `logits.mean() * 0.0` (:2063-2064:
    0 here). v0.3.4 has no compute_total_loss_weight: the engine sums the weights inline, asserts `!= 0` and
    all-reduces (v0.3.4 areal/engine/fsdp_engine.py:390-398) and scales by `loss_weight_fn(mb) / total *
    dp_size` (:451-457); the adapter does that sum itself at that pin."""
    tree, fpath, loss_fn = _compiled_loss(root, "ppo_actor_loss_fn")
    total_weight, how = _total_weight(root, tree)

    def micro(rows, loss, mask, step):
        bool_mask = mask.bool()
        total = total_weight(step, loss.device)
        local = _weight({"loss_mask": bool_mask})
        if local == 0:  # fsdp_engine.py:2063-2064
            return torch.zeros((), dtype=loss.dtype, device=loss.device)
        zeros = torch.zeros_like(loss)
        out, _ = loss_fn(
            logprobs=zeros,
            proximal_logprobs=zeros,
            old_logprobs=zeros,
            advantages=-loss,
            eps_clip=0.2,
            loss_mask=bool_mask,
        )
        return out * (local / total * step.ranks)

    def run(case: Case, device: str):
        return step_driver(root)(case, device, micro)

    notes = [
        "ppo_actor_loss_fn compiled from the pin; advantages = -loss, log-probs 0 (ratio 1), bool loss_mask",
        f"loss_weight_fn = loss_mask.count_nonzero(); {how}",
        "micro-batch loss * local_weight / total_weight * dp_size; weight-0 micro-batch -> 0; ranks averaged",
    ]
    return Loaded(run, f"{tree.rel(fpath)}::ppo_actor_loss_fn", notes)


CRITIC_EPS_CLIP = 0.5  # PPOCriticConfig.eps_clip default "Clipping factor for value loss" (1.0.4 cli_args.py:1659-1661)
FSDP_ENGINE = "areal/engine/fsdp_engine.py"


def load_value(root: Path, entry: str) -> Loaded:
    """AReaL's PPO critic loss over one optimizer step, compiled from the pin.

    The loss: `ppo_critic_loss_fn(value, old_value, target_value, value_eps_clip, loss_mask)` (1.0.4
    areal/utils/functional/functional.py:714-777, git main 4aef98d8 the same lines; v0.3.4 areal/utils/functional.py:
    217-280): `0.5 * (x - R)^2` (`_mse_loss`, :710-711, the default loss_fn_type "mse"), `max(original, clipped)`
    with `old_value + clamp(value - old_value, -c, c)` (:754-762), then
    `where(loss_mask, value_loss, 0).sum() / loss_mask.count_nonzero()` (:771-774), the micro-batch's own token
    mean. The function asserts float32 inputs (:740-742); the critic's `ppo_loss_fn` casts value, values and returns
    with `.float()` and the mask with `.bool()` (1.0.4 areal/trainer/ppo/critic.py:112-115; v0.3.4
    areal/engine/ppo/critic.py:88-91), and `value_eps_clip = config.eps_clip` = 0.5 (PPOCriticConfig, 1.0.4
    areal/api/cli_args.py:1659-1661; v0.3.4 :437-438), passed at critic.py:66-73.
    The weights are the actor's (`load_loss`): `loss_weight_fn = lambda x: x["loss_mask"].count_nonzero()`
    (1.0.4 critic.py:72), `compute_total_loss_weight` over every rank's micro-batches (train_engine.py:30-64, its
    all-reduce a no-op here), each micro-batch loss scaled by `local_weight / total_loss_weight * dp_size`
    (fsdp_engine.py:2120, :790) and a weight-0 micro-batch returning `logits.mean() * 0.0` (:2063-2064; git main
    :1988). v0.3.4 sums the weights inline (`assert total_loss_weight != 0`, fsdp_engine.py:390-398), scales by
    `loss_weight_fn(mb) / total * dp_size` (:451-457) and has no weight-0 shortcut: such a micro-batch's loss is
    0 / 0 = NaN times 0 there, reproduced as is."""
    tree, fpath, loss_fn = _compiled_loss(root, "ppo_critic_loss_fn")
    total_weight, how = _total_weight(root, tree)
    fsdp = Path(root) / FSDP_ENGINE
    shortcut = fsdp.is_file() and "local_weight == 0" in fsdp.read_text(encoding="utf-8", errors="replace")

    def micro(rows, v, mask, step):
        dev = v.device
        bool_mask = mask.bool()
        total = total_weight(step, dev)
        local = _weight({"loss_mask": bool_mask})  # critic.py:72
        if shortcut and local == 0:  # fsdp_engine.py:2063-2064
            return v.float().mean() * 0.0
        old = step.case.extra["v_old"][rows].to(device=dev, dtype=v.dtype)
        ret = step.case.extra["ret"][rows].to(device=dev, dtype=v.dtype)
        clip = step.case.options.get("critic.eps_clip", CRITIC_EPS_CLIP)  # critic.py:70 passes config.eps_clip
        out, _ = loss_fn(value=v.float(), old_value=old.float(), target_value=ret.float(),
                         value_eps_clip=clip, loss_mask=bool_mask)  # fmt: skip
        return out * (local / total * step.ranks)

    def run(case: Case, device: str):
        return step_driver(root)(case, device, micro, leaf_name="v")

    notes = [
        f"ppo_critic_loss_fn compiled from the pin, eps_clip={CRITIC_EPS_CLIP}, mse; .float() inputs, .bool() mask",
        f"loss_weight_fn = loss_mask.count_nonzero(); {how}",
        "micro-batch loss * local_weight / total_weight * dp_size; ranks averaged; weight-0 micro-batch "
        + ("-> 0 (engine shortcut)" if shortcut else "not short-circuited (no shortcut at this pin)"),
    ]
    return Loaded(run, f"{tree.rel(fpath)}::ppo_critic_loss_fn", notes)


# PPOActorConfig defaults, eps_clip 0.2, eps_clip_higher None (= eps_clip), c_clip None (no dual clip), 1.0.4
# cli_args.py:1460-1475, overridden by case.options (declare.py's POLICY_OPTIONS take their defaults from here; a
# plain dict, so a standalone repro script copies no Option)
POLICY_OPTION_DEFAULTS = {"actor.eps_clip": 0.2, "actor.eps_clip_higher": None, "actor.c_clip": None}


def load_policy(root: Path, entry: str) -> Loaded:
    """AReaL's PPO actor objective over one optimizer step, compiled from the pin.

    The actor's `grpo_loss_fn` (1.0.4 areal/trainer/ppo/actor.py:408-479; git main cbff54d64 :527-626) reads
    `old_logp = input_data["logprobs"]`, `advantages = input_data["advantages"]`, `loss_mask =
    input_data["loss_mask"].bool()` (1.0.4 :429-431) and, with the defaults (no SAPO / CISPO, m2_threshold None,
    prox_logp_method "recompute"), calls `ppo_actor_loss_fn(logprobs, old_logprobs=old_logp, advantages, eps_clip,
    eps_clip_higher, loss_mask, c_clip, proximal_logprobs=prox_logp, rejection_sampling=None,
    importance_sampling_level="token")` (1.0.4 :468-479; git main :615-626). With use_decoupled_loss False and
    recompute_logprob False (PPOActorConfig defaults, 1.0.4 cli_args.py:1543-1554) `_compute_advantages` sets
    `data["prox_logp"] = old_logp` (1.0.4 actor.py:187-191; git main :240-242), so proximal_logprobs =
    old_logprobs here. The loss: `ratio = where(loss_mask, exp(logprobs - proximal_logprobs), 0)` (1.0.4
    areal/utils/functional/functional.py:509; git main :538), `clamp(ratio, 1 - eps_clip, 1 + (eps_clip if
    eps_clip_higher is None else eps_clip_higher))` (:516-520), `max(-A r, -A clipped)` (:522-525), dual clip only
    when c_clip is set (:526-532), `where(loss_mask, pg_loss, 0).sum() / (loss_mask.count_nonzero() or 1)`
    (:483, :542; git main :506, :571). v0.3.4 (areal/utils/functional.py:141-200) multiplies by
    `behav_imp_weight = where(loss_mask, exp(prox - old), 0)` = 1 here (behav_imp_weight_cap None, v0.3.4
    cli_args.py:398). eps_clip 0.2, eps_clip_higher None, c_clip None: PPOActorConfig (1.0.4 cli_args.py:1460-1475;
    git main :1683-1698; v0.3.4 :318-333), passed by the actor (1.0.4 actor.py:350-352; git main :468-470).
    The weights and their scaling are `load_loss`'s (count_nonzero, compute_total_loss_weight, `* local / total *
    dp_size`); a weight-0 micro-batch returns `logits.mean() * 0.0` (1.0.4 fsdp_engine.py:2063-2064), which does
    not depend on the log-probs: 0 here; v0.3.4 has no shortcut and calls the loss (0 / 1, times weight 0).
    Inputs the kind has not: `versions` (used only by the loglinear proximal approximation), entropy (detached,
    unused by the PPO loss), teacher log-probs (absent: no distillation term); the rollout importance weight is
    absent (rejection_sampling None)."""
    tree, fpath, loss_fn = _compiled_loss(root, "ppo_actor_loss_fn")
    total_weight, how = _total_weight(root, tree)
    fsdp = Path(root) / FSDP_ENGINE
    shortcut = fsdp.is_file() and "local_weight == 0" in fsdp.read_text(encoding="utf-8", errors="replace")

    def micro(rows, logp, mask, step):
        dev, dt = logp.device, logp.dtype
        cfg = {name: step.case.options.get(name, default) for name, default in POLICY_OPTION_DEFAULTS.items()}
        bool_mask = mask.bool()  # grpo_loss_fn: input_data["loss_mask"].bool()
        total = total_weight(step, dev)
        local = _weight({"loss_mask": bool_mask})  # actor.py: loss_weight_fn
        if shortcut and local == 0:  # fsdp_engine.py:2063-2064: logits.mean() * 0.0, no log-prob dependence
            return torch.zeros((), dtype=dt, device=dev)
        old = step.case.extra["old_logp"][rows.cpu()].to(device=dev, dtype=dt)
        adv = step.case.extra["adv"][rows.cpu()].to(device=dev, dtype=dt)
        out, _ = loss_fn(
            logprobs=logp,
            proximal_logprobs=old,  # use_decoupled_loss False: data["prox_logp"] = old_logp
            old_logprobs=old,
            advantages=adv,
            eps_clip=cfg["actor.eps_clip"],  # actor.py:350-352 passes config.eps_clip / _higher / c_clip
            loss_mask=bool_mask,
            eps_clip_higher=cfg["actor.eps_clip_higher"],
            c_clip=cfg["actor.c_clip"],
        )
        return out * (local / total * step.ranks)

    def run(case: Case, device: str):
        return step_driver(root)(case, device, micro, leaf_name="logp")

    notes = [
        "ppo_actor_loss_fn compiled from the pin: eps_clip, eps_clip_higher, c_clip from case.options over "
        f"{POLICY_OPTION_DEFAULTS}, proximal_logprobs = old_logprobs (decoupled loss off), bool loss_mask; "
        "rejection_sampling / importance_sampling_level left at their defaults (None / 'token')",
        f"loss_weight_fn = loss_mask.count_nonzero(); {how}",
        "micro-batch loss * local_weight / total_weight * dp_size; ranks averaged; weight-0 micro-batch "
        + ("-> 0 (engine shortcut)" if shortcut else "not short-circuited (no shortcut at this pin)"),
        "not passed (not in the kind): versions, entropy, teacher log-probs; no rollout importance weight",
    ]
    return Loaded(run, f"{tree.rel(fpath)}::ppo_actor_loss_fn", notes)


def load_kind(root: Path, entry: str) -> Loaded:
    if entry in POLICY:
        return load_policy(root, entry)
    if entry in VALUE:
        return load_value(root, entry)
    if entry in LOSS:
        return load_loss(root, entry)
    if entry not in ENTRIES:
        raise NotPresent(f"areal has no entry {entry!r}; entries: default, {', '.join(ENTRIES)}")
    norm_cls, kl_cls, takes_sizes = _classes(root)
    if entry in KL:
        est = kl_cls(KL[entry])  # apply_clamp=True, the actor's default

        def run_kl(case: Case, device: str):
            dt = case.torch_dtype
            mask = case.trainable.to(device=device, dtype=dt)
            old = case.extra["logp"].to(device=device, dtype=dt) * mask
            ref = case.extra["ref_logp"].to(device=device, dtype=dt) * mask
            return (est(old, ref),)

        return Loaded(
            run_kl,
            f"{DATA}::KLEstimator",
            [f"KLEstimator({KL[entry]!r}) compiled from source", "inputs multiplied by loss_mask as the actor does"],
        )
    if entry == "adv-norm":

        def run_adv(case: Case, device: str):
            norm = norm_cls(norm_config(entry, case, 1))
            dt = case.torch_dtype
            x = case.extra["x"].to(device=device, dtype=dt)
            return (norm(x, case.trainable.to(device=device, dtype=dt)),)

        return Loaded(run_adv, f"{DATA}::Normalization", ["NormConfig(batch, batch) as a namespace"])

    def run_grpo(case: Case, device: str):
        dt = case.torch_dtype
        group = case.group if case.group is not None else torch.zeros(case.shape[0], dtype=torch.int64)
        sizes = blocks(group)
        if sizes is None:
            raise ValueError("areal: Normalization(group) takes contiguous groups (rows of one prompt adjacent)")
        kw = {}
        if takes_sizes:
            kw["group_sizes"] = sizes
            size = sizes[0]
        else:
            if len(set(sizes)) != 1:
                raise ValueError("areal: Normalization(group) at this pin slices groups of one fixed group_size")
            size = sizes[0]
        norm = norm_cls(norm_config(entry, case, size))
        score = case.score.to(device=device, dtype=dt)
        out = norm(score, **kw)
        return (out[:, None].expand(case.shape),)

    how = "group_sizes = the contiguous block sizes" if takes_sizes else "group_size = the (one) block size"
    return Loaded(
        run_grpo,
        f"{DATA}::Normalization",
        [f"NormConfig(group, group) as a namespace; {how}", "the [B] output broadcast to every position"],
    )


load = load_kind  # the worker loads the entries of the other kinds from here (targets.registry.adapter_for)

"""AReaL's masked math beyond GAE: loaders for the entries of `targets.adapters.areal.SPEC`.

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
* `kl-k1`, `kl-k2`, `kl-k3`: `KLEstimator(name)(old_logp, ref_logp)` after the actor's
  `ref_logp *= loss_mask; old_logp *= loss_mask` (1.0.4 actor.py:194-195; git main :245-246).
"""

from __future__ import annotations

import types
from pathlib import Path

import torch

from maskfuzz.oracles.case import Case
from maskfuzz.targets.adapters.base import Loaded, NotPresent
from maskfuzz.targets.adapters.extract import SourceTree

DATA = "areal/utils/data.py"
NORM = {
    # entry -> NormConfig attributes (NormConfig defaults: eps 1e-5, std_unbiased True, mean_leave1out False)
    "grpo": dict(mean_level="group", mean_leave1out=False, std_level="group", std_unbiased=True, eps=1e-5),
    "adv-norm": dict(mean_level="batch", mean_leave1out=False, std_level="batch", std_unbiased=True, eps=1e-5),
}
KL = {"kl-k1": "k1", "kl-k2": "k2", "kl-k3": "k3"}
ENTRIES = (*NORM, *KL)


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


def load_kind(root: Path, entry: str) -> Loaded:
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

        return Loaded(run_kl, f"{DATA}::KLEstimator", [f"KLEstimator({KL[entry]!r}) compiled from source",
                                                       "inputs multiplied by loss_mask as the actor does"])
    cfg = NORM[entry]
    if entry == "adv-norm":
        norm = norm_cls(types.SimpleNamespace(group_size=1, **cfg))

        def run_adv(case: Case, device: str):
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
        norm = norm_cls(types.SimpleNamespace(group_size=size, **cfg))
        score = case.score.to(device=device, dtype=dt)
        out = norm(score, **kw)
        return (out[:, None].expand(case.shape),)

    how = "group_sizes = the contiguous block sizes" if takes_sizes else "group_size = the (one) block size"
    return Loaded(run_grpo, f"{DATA}::Normalization", [f"NormConfig(group, group) as a namespace; {how}",
                                                       "the [B] output broadcast to every position"])

load = load_kind  # the worker loads the entries of the other kinds from here (targets.registry.adapter_for)

"""The worker side of AReaL's discovered estimators (`discover.py`): a NormConfig level choice with a call recipe
(`recipes.py`) runs through AReaL's own `Normalization`, compiled from the pin as the hand-written `grpo` and
`adv-norm` entries compile it (`calls_kinds.normalization_class`); any other choice without a hand-written entry is a
skip that says why, or that it is not a value at this pin.

* `reward-norm:reward_norm.<field>=<choice>`: `Normalization(cfg)(scores)` on the [B] scores, as the actor calls
  `self.reward_norm(reward_score)` (1.0.4 areal/trainer/ppo/actor.py:172-173; git main :212 with `group_sizes`), the
  [B] output broadcast to every position (kind group-advantage).
* `adv-norm:adv_norm.<field>=<choice>`: `Normalization(cfg)(advantages, loss_mask)` on [B, T] as the actor calls
  `self.adv_norm(advantages, loss_mask)` (1.0.4 actor.py:238-239; git main :313 with `group_sizes`) (kind
  normalization).

`group_size` is the size of the case's contiguous groups where a level is "group" (1 otherwise, NormConfig's
default); at git main the contiguous block sizes are passed as `group_sizes` too, as the actor passes
`meta.traj_group_sizes`. A recipe that does not promise group-isolation because a level is "batch" runs only where
the pin's Normalization still says a batch level is over the entire batch (`recipes.BATCH_WORDS`)."""

from __future__ import annotations

import types
from pathlib import Path

import torch

from maskfuzz.oracles.case import Case
from maskfuzz.targets.adapters.base import Loaded, NotPresent
from maskfuzz.targets.areal.calls_kinds import blocks, normalization_class
from maskfuzz.targets.areal.discover import discover
from maskfuzz.targets.areal.recipes import BATCH_WORDS, DATA, LEVELS, config, grouped, not_promised


def _sizes(case: Case, takes_sizes: bool) -> list[int]:
    """The contiguous group sizes of `case` (a ValueError "areal: ..." where AReaL cannot be given them)."""
    group = case.group if case.group is not None else torch.zeros(case.shape[0], dtype=torch.int64)
    sizes = blocks(group)
    if sizes is None:
        raise ValueError("areal: Normalization(group) takes contiguous groups (rows of one prompt adjacent)")
    if not takes_sizes and len(set(sizes)) != 1:
        raise ValueError("areal: Normalization(group) at this pin slices groups of one fixed group_size")
    return sizes


def _words_at(root: Path) -> str:
    """file:line of `BATCH_WORDS` in the pin's Normalization ("" when they are gone)."""
    path = Path(root) / DATA
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines() if path.is_file() else []
    return next((f"{DATA}:{i}" for i, text in enumerate(lines, 1) if BATCH_WORDS in text), "")


def load_recipe(root: Path, name: str, citation: str) -> Loaded:
    norm_cls, takes_sizes = normalization_class(root)
    skipped = not_promised(name)
    words = _words_at(root)
    if skipped and not words:
        raise NotPresent(f"{citation}: {DATA} no longer says {BATCH_WORDS!r}: the recipe's not-promised "
                         "group-isolation rests on those words; not run")  # fmt: skip
    levels = LEVELS[name]
    use = name.partition(".")[0]

    def normalization(case: Case) -> tuple:
        kw: dict = {}
        size = 1
        if grouped(name):
            sizes = _sizes(case, takes_sizes)
            size = sizes[0]
            if takes_sizes:
                kw["group_sizes"] = sizes
        return norm_cls(types.SimpleNamespace(**config(name), group_size=size)), kw

    def run_reward(case: Case, device: str):
        norm, kw = normalization(case)
        out = norm(case.score.to(device=device, dtype=case.torch_dtype), **kw)
        return (out[:, None].expand(case.shape),)

    def run_adv(case: Case, device: str):
        norm, kw = normalization(case)
        dt = case.torch_dtype
        x = case.extra["x"].to(device=device, dtype=dt)
        return (norm(x, case.trainable.to(device=device, dtype=dt), **kw),)

    shown = ", ".join(f"{k}={'None' if v is None else repr(v)}" for k, v in levels.items())
    notes = [
        f"discovered: {citation}; invariants only (no float64 reference); call recipe NormConfig({shown}, "
        "mean_leave1out=False, std_unbiased=True, eps=1e-5) as a namespace",
        "group_size = the contiguous group size" + (", group_sizes = the block sizes" if takes_sizes else "")
        if grouped(name) else "group_size = 1 (NormConfig's default: no group level)",
        *(f"not promised: {prop}: {why} (at this pin: {words})" for prop, why in skipped),
    ]  # fmt: skip
    run = run_reward if use == "reward_norm" else run_adv
    return Loaded(run, f"{DATA}::Normalization", notes)


def load(root: Path, entry: str) -> Loaded:
    prefix, _, name = entry.partition(":")
    found = {v.name: v for v in discover(root) if v.prefix == prefix}
    if name not in found:
        known = ", ".join(found) or "none"
        raise NotPresent(f"no {prefix}:{name} is a config choice at this pin ({known})")
    v = found[name]
    if v.covered_by:
        raise NotPresent(f"{v.citation}: {name!r} is run by the hand-written entry {v.covered_by!r}")
    if name in LEVELS:
        return load_recipe(root, name, f"{v.registry} -> {name!r} at {v.citation}")
    raise NotPresent(f"{v.citation}: not callable outside the trainer: {v.reason}")

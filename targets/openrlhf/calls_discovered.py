"""The worker side of OpenRLHF's discovered estimators (`discover.py`): a choice with a call recipe
(`recipes.py`: reinforce_baseline, flash_reinforce) runs through the real `compute_advantages_and_returns` as the
hand-written group entries do (`calls_kinds.load_estimator`), where the pin's dispatcher still has the whole-batch
statistic its not-promised group-isolation rests on (`discover.batch_designs`); any other choice without a
hand-written entry is a skip that says why, or that it is not a choice at this pin."""

from __future__ import annotations

from pathlib import Path

from maskfuzz.targets.adapters.base import Loaded, NotPresent
from maskfuzz.targets.openrlhf.calls_kinds import SINGLE_ROLLOUT, load_estimator
from maskfuzz.targets.openrlhf.discover import FLAGS, batch_designs, discover
from maskfuzz.targets.openrlhf.recipes import NOT_PROMISED


def load_recipe(root: Path, name: str, citation: str) -> Loaded:
    design = batch_designs(root).get(name)
    if design is None:
        raise NotPresent(f"{citation}: the dispatcher has no whole-batch statistic for {name!r} at this pin: the "
                         "recipe's not-promised group-isolation rests on one; not run")  # fmt: skip
    loaded = load_estimator(root, name)
    group = "n_samples_per_prompt = 1, experience.index = row order" if name in SINGLE_ROLLOUT else "prompt groups"
    loaded.notes[:0] = [f"discovered: {citation}; invariants only (no float64 reference); call recipe: {group}"]
    loaded.notes += [f"not promised: {prop}: {why} (at this pin: {design})" for prop, why in NOT_PROMISED[name]]
    return loaded


def load(root: Path, entry: str) -> Loaded:
    prefix, _, name = entry.partition(":")
    found = {v.name: v for v in discover(root)} if prefix == "adv" else {}
    if name not in found:
        known = ", ".join(found) or "none"
        raise NotPresent(f"no advantage estimator {name!r} is a choice of {' / '.join(FLAGS)} at this pin ({known})")
    v = found[name]
    if v.covered_by:
        raise NotPresent(f"{v.citation}: {name!r} is run by the hand-written entry {v.covered_by!r}")
    if name in NOT_PROMISED:
        return load_recipe(root, name, f"{v.registry} -> {name!r} at {v.citation}")
    raise NotPresent(f"{v.citation}: not callable outside the trainer: {v.reason}")

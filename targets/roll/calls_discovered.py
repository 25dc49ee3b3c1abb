"""The worker side of ROLL's discovered estimators (`discover.py`): every value of `PPOConfig.adv_estimator` without
a hand-written entry is a skip that says why (no call recipe for it yet), or that it is not a value at this pin.
Nothing is run."""

from __future__ import annotations

from pathlib import Path

from maskfuzz.targets.adapters.base import Loaded, NotPresent
from maskfuzz.targets.roll.discover import CLASS, FIELD, discover  # only skips: never copied


def load(root: Path, entry: str) -> Loaded:
    prefix, _, name = entry.partition(":")
    found = {v.name: v for v in discover(root)} if prefix == "adv" else {}
    if name not in found:
        known = ", ".join(found) or "none"
        raise NotPresent(f"no advantage estimator {name!r} is a value of {CLASS}.{FIELD} at this pin ({known})")
    v = found[name]
    if v.covered_by:
        raise NotPresent(f"{v.citation}: {name!r} is run by the hand-written entry {v.covered_by!r}")
    raise NotPresent(f"{v.citation}: not callable outside the trainer: {v.reason}")

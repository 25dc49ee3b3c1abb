"""Adapter for openrlhf: NOT BUILT YET (the registry entry below is a placeholder)."""

from __future__ import annotations

from pathlib import Path

from targets.registry import Pin, TargetSpec, COMMON_HEAVY

SPEC = TargetSpec(
    id="openrlhf",
    adapter="targets.adapters.openrlhf",
    own=("openrlhf",),
    contract="dense",
    git_url="https://github.com/OpenRLHF/OpenRLHF.git",
    package="openrlhf",
    pins=(Pin("0.11.2", "newest release", default=True),),
    stand_ins=COMMON_HEAVY,
)


def load(root: Path, entry: str | None):
    raise NotImplementedError("the openrlhf adapter is not built yet")

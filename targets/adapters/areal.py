"""Adapter for areal: NOT BUILT YET (the registry entry below is a placeholder)."""

from __future__ import annotations

from pathlib import Path

from targets.registry import Pin, TargetSpec, COMMON_HEAVY

SPEC = TargetSpec(
    id="areal",
    adapter="targets.adapters.areal",
    own=("areal",),
    contract="dense",
    git_url="https://github.com/inclusionAI/AReaL.git",
    package="areal",
    stand_ins=COMMON_HEAVY,
)


def load(root: Path, entry: str | None):
    raise NotImplementedError("the areal adapter is not built yet")

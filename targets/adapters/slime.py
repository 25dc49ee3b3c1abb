"""Adapter for slime: NOT BUILT YET (the registry entry below is a placeholder)."""

from __future__ import annotations

from pathlib import Path

from targets.registry import Pin, TargetSpec, COMMON_HEAVY

SPEC = TargetSpec(
    id="slime",
    adapter="targets.adapters.slime",
    own=("slime",),
    contract="compressed",
    git_url="https://github.com/THUDM/slime.git",
    stand_ins=COMMON_HEAVY,
    deny=("fla",),
)


def load(root: Path, entry: str | None):
    raise NotImplementedError("the slime adapter is not built yet")

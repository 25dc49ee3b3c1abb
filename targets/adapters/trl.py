"""Adapter for trl: NOT BUILT YET (the registry entry below is a placeholder)."""

from __future__ import annotations

from pathlib import Path

from targets.registry import Pin, TargetSpec, COMMON_HEAVY

SPEC = TargetSpec(
    id="trl",
    adapter="targets.adapters.trl",
    own=("trl",),
    contract="dense",
    git_url="https://github.com/huggingface/trl.git",
    package="trl",
    stand_ins=COMMON_HEAVY,
)


def load(root: Path, entry: str | None):
    raise NotImplementedError("the trl adapter is not built yet")

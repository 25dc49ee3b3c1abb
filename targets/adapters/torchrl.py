"""Adapter for torchrl: NOT BUILT YET (the registry entry below is a placeholder)."""

from __future__ import annotations

from pathlib import Path

from targets.registry import Pin, TargetSpec, COMMON_HEAVY

SPEC = TargetSpec(
    id="torchrl",
    adapter="targets.adapters.torchrl",
    own=("torchrl",),
    contract="dense",
    git_url="https://github.com/pytorch/rl.git",
    package="torchrl",
    entries=("default", "vec"),
)


def load(root: Path, entry: str | None):
    raise NotImplementedError("the torchrl adapter is not built yet")

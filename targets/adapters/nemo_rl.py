"""Adapter for nemo-rl: NOT BUILT YET (the registry entry below is a placeholder)."""

from __future__ import annotations

from pathlib import Path

from targets.registry import Pin, TargetSpec, COMMON_HEAVY

SPEC = TargetSpec(
    id="nemo-rl",
    adapter="targets.adapters.nemo_rl",
    own=("nemo_rl",),
    contract="compressed",
    git_url="https://github.com/NVIDIA-NeMo/RL.git",
    stand_ins=COMMON_HEAVY,
)


def load(root: Path, entry: str | None):
    raise NotImplementedError("the nemo-rl adapter is not built yet")

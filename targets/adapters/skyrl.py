"""Adapter for skyrl: NOT BUILT YET (the registry entry below is a placeholder)."""

from __future__ import annotations

from pathlib import Path

from targets.registry import Pin, TargetSpec, COMMON_HEAVY

SPEC = TargetSpec(
    id="skyrl",
    adapter="targets.adapters.skyrl",
    own=("skyrl", "skyrl_train"),
    contract="compressed",
    git_url="https://github.com/NovaSky-AI/SkyRL.git",
    package="skyrl-train",
    stand_ins=COMMON_HEAVY,
)


def load(root: Path, entry: str | None):
    raise NotImplementedError("the skyrl adapter is not built yet")

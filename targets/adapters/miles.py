"""Adapter for miles: NOT BUILT YET (the registry entry below is a placeholder)."""

from __future__ import annotations

from pathlib import Path

from targets.registry import Pin, TargetSpec, COMMON_HEAVY

SPEC = TargetSpec(
    id="miles",
    adapter="targets.adapters.miles",
    own=("miles",),
    contract="compressed",
    git_url="https://github.com/radixark/miles.git",
    package="miles-rl",
    pins=(
        Pin("0.0.2", "only usable release (May 2026), old location miles/utils/ppo_utils.py", default=True),
        Pin("3d2e0e411", "PR #1827: run PPO GAE over trainable tokens only", kind="git"),
    ),
    stand_ins=COMMON_HEAVY,
    deny=("fla",),
)


def load(root: Path, entry: str | None):
    raise NotImplementedError("the miles adapter is not built yet")

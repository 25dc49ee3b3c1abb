"""Adapter for verl: NOT BUILT YET (the registry entry below is a placeholder)."""

from __future__ import annotations

from pathlib import Path

from oracles.reference import Whitening
from targets.registry import Pin, TargetSpec, COMMON_HEAVY

SPEC = TargetSpec(
    id="verl",
    adapter="targets.adapters.verl",
    own=("verl",),
    contract="compressed",
    git_url="https://github.com/volcengine/verl.git",
    package="verl",
    pins=(
        Pin("0.4.1", "last 0.4 release", default=True),
        Pin("0.9.1", "newest release", default=True),
    ),
    whitening=Whitening(unbiased=True, eps=1e-8),
    stand_ins=COMMON_HEAVY,
    deny=("torch_npu",),
)


def load(root: Path, entry: str | None):
    raise NotImplementedError("the verl adapter is not built yet")

"""Adapter for roll: NOT BUILT YET (the registry entry below is a placeholder)."""

from __future__ import annotations

from pathlib import Path

from targets.registry import Pin, TargetSpec, COMMON_HEAVY

SPEC = TargetSpec(
    id="roll",
    adapter="targets.adapters.roll",
    own=("roll",),
    contract="dense",
    git_url="https://github.com/alibaba/ROLL.git",
    pins=(Pin("c09bc8bc9f43", "the seed report 000: masked critic values bootstrap", kind="git"),),
    entries=("default", "agentic"),
    stand_ins=COMMON_HEAVY,
)


def load(root: Path, entry: str | None):
    raise NotImplementedError("the roll adapter is not built yet")

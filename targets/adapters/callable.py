"""Adapter for a user's own function with the canonical keyword signature

    fn(*, token_rewards, values, trainable, attention, score, gamma, lam) -> (advantages, returns)

imported as MODULE:FUNC from the current PYTHONPATH (and the working directory) in the worker.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

from maskfuzz.oracles.case import Case
from maskfuzz.targets.adapters.base import Loaded, NotPresent


def load(root: Path | None, entry: str | None) -> Loaded:
    if not entry or ":" not in entry:
        raise ValueError(f"--callable needs MODULE:FUNC, got {entry!r}")
    module, _, func = entry.partition(":")
    if "" not in sys.path:
        sys.path.insert(0, "")
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name == module or module.startswith(f"{exc.name}."):
            raise NotPresent(f"module {module!r} is not importable from PYTHONPATH ({exc})") from None
        raise
    fn = mod
    for part in func.split("."):
        fn = getattr(fn, part, None)
        if fn is None:
            raise NotPresent(f"{module} has no attribute {func!r}")

    def run(case: Case, device: str):
        return fn(**case.inputs(device))

    return Loaded(run, f"{getattr(mod, '__file__', module)}::{func}")

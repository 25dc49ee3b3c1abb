"""What every adapter provides. Adapters run inside a worker process, never in the fuzzer.

An adapter module exposes

    def load(root: pathlib.Path, entry: str | None) -> Loaded

`root` is the checkout (a git worktree or an unpacked wheel) whose directory is first on
`sys.path`; `load` imports the framework's real function from it once and returns a `Loaded`
whose `run(case, device)` converts the canonical case to the framework's own inputs (using the
framework's own score-placement code where it has any), calls the real function, and returns
canonical (advantages, returns) tensors of shape [B, T]. When the function is not present at
this pin, `load` raises `NotPresent` with the reason: a skip, never a pass.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from maskfuzz.oracles.case import Case

RunFn = Callable[[Case, str], "tuple[torch.Tensor, torch.Tensor]"]


class NotPresent(Exception):
    """The function under test does not exist at this pin (a skip with this reason)."""


@dataclass
class Loaded:
    run: RunFn
    where: str  # "path/in/checkout.py::function" actually called
    notes: list[str] = field(default_factory=list)  # state provided, source extracted, ...
    # option values the code at this pin does not have: name -> (values, why); never drawn (a tool error if drawn)
    absent_options: dict[str, tuple[tuple, str]] = field(default_factory=dict)


def import_from(root: Path, module: str):
    """Import `module` and insist it comes from `root`, so a site-packages copy is never tested.

    Raises NotPresent when the module does not exist at this pin."""
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        top = module.split(".")[0]
        if exc.name and (exc.name == module or module.startswith(exc.name + ".")) and exc.name.split(".")[0] == top:
            raise NotPresent(f"module {module} is not present at this pin") from None
        raise
    path = Path(inspect.getfile(mod)).resolve()
    if not path.is_relative_to(Path(root).resolve()):
        raise RuntimeError(f"{module} was imported from {path}, not from the checkout {root}")
    return mod


def function_from(root: Path, candidates: list[tuple[str, str]]) -> tuple[Callable, str]:
    """The first (module, attribute) of `candidates` present at this pin, and where it was found.

    Raises NotPresent naming every place looked at."""
    looked = []
    for module, attr in candidates:
        try:
            mod = import_from(root, module)
        except NotPresent:
            looked.append(f"{module} (no module)")
            continue
        obj = mod
        for part in attr.split("."):
            obj = getattr(obj, part, None)
            if obj is None:
                break
        if obj is None:
            looked.append(f"{module}.{attr} (no attribute)")
            continue
        rel = Path(inspect.getfile(mod)).resolve().relative_to(Path(root).resolve())
        return obj, f"{rel}::{attr}"
    raise NotPresent("function not present at this pin; looked for " + ", ".join(looked))

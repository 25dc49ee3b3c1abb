"""Open a real rollout of a target at a pin: the tiny LM's worker and the framework's batch-code worker.

    with open_rollout("roll@c09bc8bc9f43") as r:
        (gen,) = r.lm(RolloutRequest(seed=0))                       # targets.rollout.lm.Generation
        (batch,) = r.batch(BatchRequest(gen, sequence_length=...))  # targets.rollout.requests.Batch

Both are `targets.client.Worker`s (a crash or hang is a `TargetFailure`, the worker restarts). The LM worker
stands in for nothing (it needs the real `transformers`); the batch-code worker gets the target's own
stand-ins, deny-list and own packages, so the framework loads as it does under `maskfuzz fuzz`. Raises
`targets.session.SetupError` (no real-rollout path for the target, code that cannot be acquired or imported)
and `Skip` (the batch code is absent at the pin), their messages naming the target, the pin and what to do.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Mapping

from maskfuzz.targets import registry as registry_mod
from maskfuzz.targets.registry import TargetSpec
from maskfuzz.targets.rollout import ROLLOUT
from maskfuzz.targets.runtime.acquire import AcquireError, Checkout, acquire
from maskfuzz.targets.runtime.client import LoadSpec, Worker, WorkerLoadError, WorkerSkip
from maskfuzz.targets.runtime.repos import parse_repos
from maskfuzz.targets.runtime.session import SetupError, Skip, TargetRef, load_advice, parse_ref

LM_ADAPTER = "maskfuzz.targets.rollout.lm"


@dataclass
class Rollout:
    """Started workers of a real rollout: `lm` answers `RolloutRequest`s, `batch` answers `BatchRequest`s."""

    spec: TargetSpec
    ref: TargetRef
    checkout: Checkout
    lm: Worker
    batch: Worker
    module: str = ""  # the batch-code module (`batch_code`)
    info: dict = field(default_factory=dict)  # "lm" and "batch": each worker's load info (where, notes, stand-ins)

    def declaration(self):
        """The batch-code module itself, for its declarations (`HOOKED_BOUNDARY`, `BOUNDARY_INPUTS`,
        `REPLACED_COMPONENT`); it imports no framework code at module level."""
        return importlib.import_module(self.module)


def batch_code(ref: TargetRef) -> str | None:
    """The batch-code module of `ref`'s target, `targets/<framework>/rollout.py`, for its default entry (an
    entry named in the ref has none), or None when the folder has none."""
    return registry_mod.folder_module(ref.target, ROLLOUT) if ref.entry is None else None


@contextlib.contextmanager
def open_rollout(
    ref: TargetRef | str,
    repos: Mapping[str, Path] | None = None,
    timeout: float = 120.0,
    cache: Path | None = None,
    *,
    load_timeout: float = 300.0,
) -> Iterator[Rollout]:
    """Acquire `ref`'s code and start both workers for the duration of the block (`repos`: local clones or
    mirrors, None reads MASKFUZZ_REPOS; `timeout`: seconds one request may take)."""
    ref = parse_ref(ref) if isinstance(ref, str) else ref
    spec = registry_mod.get(ref.target)
    module = batch_code(ref)
    if module is None:
        named = f"{ref.target}:{ref.entry}" if ref.entry else ref.target
        raise SetupError(
            f"{ref}: no real-rollout path for {named} yet (covered: {', '.join(registry_mod.folders_with(ROLLOUT))}); "
            "`maskfuzz repro` reproduces the case at the function itself"
        )
    try:
        repos = parse_repos(None) if repos is None else repos
    except ValueError as exc:
        raise SetupError(f"MASKFUZZ_REPOS: {exc}") from None
    try:
        checkout = acquire(spec, ref.pin, repos, cache)
    except AcquireError as exc:
        raise SetupError(str(exc)) from None
    lm = Worker(LoadSpec(LM_ADAPTER, None), timeout=timeout, load_timeout=load_timeout)
    batch = Worker(
        LoadSpec(module, str(checkout.root), ref.entry, spec.stand_ins, spec.deny, spec.own),
        timeout=timeout,
        load_timeout=load_timeout,
    )
    try:
        info = {"lm": _start(lm, f"{ref}: the tiny LM", "pip install transformers"),
                "batch": _start_batch(batch, dataclasses.replace(spec, adapter=module), ref, checkout)}  # fmt: skip
        yield Rollout(spec, ref, checkout, lm, batch, module, info)
    finally:
        lm.close()
        batch.close()


def _start(worker: Worker, what: str, todo: str) -> dict:
    try:
        return dict(worker.start())
    except (WorkerSkip, WorkerLoadError) as exc:
        raise SetupError(f"{what} cannot load ({todo}); the worker said:\n{exc}") from None


def _start_batch(worker: Worker, spec: TargetSpec, ref: TargetRef, checkout: Checkout) -> dict:
    try:
        return dict(worker.start())
    except WorkerSkip as exc:
        raise Skip(f"{ref} ({checkout.resolved}): {exc}") from None
    except WorkerLoadError as exc:
        raise SetupError(load_advice(spec, ref, checkout.resolved, str(exc))) from None

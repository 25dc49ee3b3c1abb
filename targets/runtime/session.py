"""Open a target at a pin: parse `TARGET[:ENTRY][@PIN]`, acquire its code, start its worker.

    with open_target("verl@0.4.1") as h:
        adv, ret = h.run(case)          # h.run is a started targets.client.Worker (a Run)
        verdicts = judge(h.run, case, h.declared)

`open_target` raises `Skip` when the function under test is not present at the pin (a skip,
never a pass) and `SetupError` when the code cannot be acquired or imported; both messages name
the target and the pin, and a SetupError says what to do. The worker is closed when the block
ends, whatever happens inside it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Mapping

from maskfuzz.oracles.declared import Declared
from maskfuzz.oracles.kinds.gae.reference import CONTRACTS
from maskfuzz.oracles.options import without
from maskfuzz.targets import discovery
from maskfuzz.targets import registry as registry_mod
from maskfuzz.targets.registry import TargetSpec
from maskfuzz.targets.runtime.acquire import AcquireError, Checkout, acquire
from maskfuzz.targets.runtime.client import LoadSpec, Worker, WorkerLoadError, WorkerSkip
from maskfuzz.targets.runtime.repos import parse_repos

CALLABLE_ADAPTER = "maskfuzz.targets.adapters.callable"


class Skip(Exception):
    """The function under test is not present at this pin (report as a skip with this reason)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class SetupError(Exception):
    """The target cannot be set up (acquired or imported); the message says what to do."""


class RefError(SetupError, ValueError):
    """A target reference that does not parse or names no known target / entry."""


@dataclass(frozen=True)
class TargetRef:
    """`TARGET[:ENTRY][@PIN]`. `entry` None is the target's default entry."""

    target: str
    entry: str | None = None
    pin: str | None = None

    def __str__(self) -> str:
        entry = f":{self.entry}" if self.entry else ""
        pin = f"@{self.pin}" if self.pin else ""
        return f"{self.target}{entry}{pin}"


def parse_ref(text: str, specs: Mapping[str, TargetSpec] | None = None) -> TargetRef:
    """Parse `TARGET[:ENTRY][@PIN]` against the registry (or `specs`).

    The target id is case-insensitive; an entry must be one the spec lists (the spec's first
    entry is the default and is written as None); an omitted pin is the spec's first default pin (else its first pin).
    Raises RefError naming the known targets / entries."""
    specs = registry_mod.registry() if specs is None else specs
    text = text.strip()
    head, at, pin = text.partition("@")
    target, colon, entry = head.partition(":")
    target = target.strip().lower()
    if not target or (at and not pin.strip()) or (colon and not entry.strip()):
        raise RefError(f"cannot read target {text!r}: expected TARGET[:ENTRY][@PIN], e.g. verl@0.4.1, torchrl:vec")
    if target not in specs:
        raise RefError(f"unknown target {target!r} in {text!r}; known targets: {', '.join(sorted(specs))}")
    spec = specs[target]
    entry = entry.strip() or None
    if entry is not None and entry not in spec.entries and not discovery.is_discovered(target, entry):
        raise RefError(f"{target} has no entry {entry!r}; its entries: {', '.join(spec.entries)}")
    if entry == spec.entries[0]:
        entry = None  # one spelling for the default entry, so corpus keys do not split
    pin = pin.strip() or None
    if pin is None:
        if not spec.pins:
            raise RefError(f"{target} has no registered pins: name one, e.g. {target}@<commit> (--repo {target}=PATH)")
        pin = (spec.default_pins or spec.pins)[0].rev  # the first default pin, else the first pin
    return TargetRef(target, entry, pin)


@dataclass
class Handle:
    """An open target: its spec, the pin's checkout and a started worker (`run`)."""

    spec: TargetSpec
    ref: TargetRef
    pin: str
    checkout: Checkout | None
    resolved: str  # full commit hash, "PACKAGE==VERSION", or MODULE:FUNC for --callable
    run: Worker
    declared: Declared
    info: dict = field(default_factory=dict)  # where, notes, stand_ins_used (+ the checkout's info)

    @property
    def label(self) -> str:
        return str(self.ref)


def _default_repos() -> dict[str, Path]:
    try:
        return parse_repos(None)
    except ValueError as exc:
        raise SetupError(f"MASKFUZZ_REPOS: {exc}") from None


@contextlib.contextmanager
def open_target(
    ref: TargetRef | str,
    repos: Mapping[str, Path] | None = None,
    device: str = "cpu",
    timeout: float = 60.0,
    cache: Path | None = None,
    *,
    load_timeout: float = 300.0,
) -> Iterator[Handle]:
    """Acquire `ref`'s code and start its worker for the duration of the block.

    `repos` maps target ids to local clones / mirrors (`--repo`); None reads MASKFUZZ_REPOS.
    `timeout` bounds one call of the target (a longer call is a 'hang' verdict)."""
    if isinstance(ref, str):
        ref = parse_ref(ref)
    try:
        spec = registry_mod.get(ref.target)
    except KeyError as exc:
        raise RefError(exc.args[0]) from None
    if ref.pin is None:
        ref = parse_ref(str(ref))
    repos = _default_repos() if repos is None else repos
    try:
        checkout = acquire(spec, ref.pin, repos, cache)
    except AcquireError as exc:
        raise SetupError(str(exc)) from None
    worker = Worker(
        LoadSpec(
            spec.adapter_for(ref.entry), str(checkout.root), ref.entry, spec.stand_ins, spec.deny, spec.own, device
        ),
        timeout=timeout,
        load_timeout=load_timeout,
    )
    closers: list = []
    try:
        try:
            loaded = worker.start()
        except WorkerSkip as exc:
            raise Skip(f"{ref} ({checkout.resolved}): {exc}") from None
        except WorkerLoadError as exc:
            message = load_advice(spec, ref, checkout.resolved, str(exc))
            absent = checkout.info.get("absent")
            if absent:  # a mirror without some files: say so, it may be why the import failed
                shown = ", ".join(absent[:5])
                message += f"\n(the source repository lacks {len(absent)} file(s) of this commit: {shown})"
            raise SetupError(message) from None
        info = dict(loaded) | {"checkout": dict(checkout.info)}
        declared = spec.declared(ref.entry, ref.pin)
        absent = {k: (tuple(v), why) for k, (v, why) in (info.get("absent_options") or {}).items()}
        if absent:  # a mode the code at this pin lacks is never drawn: it would be a tool error, not a finding
            try:
                options, narrowed = without(declared.options, absent)
            except ValueError as exc:
                raise Skip(f"{ref} ({checkout.resolved}): {exc}") from None
            declared = dataclasses.replace(declared, options=options)
            info["notes"] = list(info.get("notes", [])) + narrowed
        twin_of = spec.for_entry(ref.entry).twin_of
        if twin_of is not None:
            label = f"{ref.target}:{twin_of}@{ref.pin}"
            twin = _open_twin(spec, ref, twin_of, checkout, device, timeout, load_timeout)
            if twin is not None:
                closers.append(twin.close)
            declared = dataclasses.replace(declared, twin=twin, twin_label=label)
            info["twin"] = label if twin is not None else f"{label} (does not load at this pin: twin is n/a)"
        yield Handle(spec, ref, ref.pin, checkout, checkout.resolved, worker, declared, info)
    finally:
        worker.close()
        for close in closers:
            close()


def _open_twin(spec, ref, entry: str, checkout, device: str, timeout: float, load_timeout: float):
    """A started worker for the twin entry, or None when it does not load at this pin."""
    twin = Worker(
        LoadSpec(spec.adapter_for(entry), str(checkout.root), entry, spec.stand_ins, spec.deny, spec.own, device),
        timeout=timeout,
        load_timeout=load_timeout,
    )
    try:
        twin.start()
    except (WorkerSkip, WorkerLoadError):
        twin.close()
        return None
    return twin


@contextlib.contextmanager
def open_callable(
    target: str,
    contract: str = "compressed",
    device: str = "cpu",
    timeout: float = 60.0,
    *,
    declared: Declared | None = None,
    path: Path | None = None,
    resolved: str | None = None,
    load_timeout: float = 300.0,
) -> Iterator[Handle]:
    """A user's function `MODULE:FUNC` (canonical keyword signature, see targets.adapters.callable)
    in a worker, judged against `contract` (or the full `declared` promise). `path` is put first on
    the worker's sys.path; otherwise the module comes from PYTHONPATH or the working directory.
    `resolved` is what `path` holds (the commit of a git checkout), reported as the handle's."""
    module, colon, func = target.partition(":")
    if not colon or not module or not func or not re.fullmatch(r"[\w.]+", module + "." + func):
        raise RefError(f"--callable expects MODULE:FUNC (e.g. mypkg.gae:compute), got {target!r}")
    if contract not in CONTRACTS:
        raise RefError(f"--contract must be one of {', '.join(CONTRACTS)}, got {contract!r}")
    declared = declared or Declared(contract=contract, own_inputs=True)
    spec = TargetSpec(id="callable", adapter=CALLABLE_ADAPTER, own=(module.split(".")[0],), contract=declared.contract)
    ref = TargetRef("callable", target, "local")
    worker = Worker(
        LoadSpec(CALLABLE_ADAPTER, str(path) if path else None, target, device=device),
        timeout=timeout,
        load_timeout=load_timeout,
    )
    try:
        try:
            loaded = worker.start()
        except WorkerSkip as exc:
            raise SetupError(f"--callable {target}: {exc} -- is the module on PYTHONPATH, with {func}?") from None
        except WorkerLoadError as exc:
            raise SetupError(f"--callable {target}: importing it failed:\n{_tail(str(exc))}") from None
        yield Handle(spec, ref, "local", None, resolved or target, worker, declared, dict(loaded))
    finally:
        worker.close()


def _tail(text: str, lines: int = 12) -> str:
    rows = [r for r in text.rstrip().splitlines() if r.strip()]
    return "\n".join("    " + r for r in rows[-lines:])


def load_advice(spec: TargetSpec, ref: TargetRef, resolved: str, error: str) -> str:
    """A SetupError message for a failed import: what failed (the traceback's last lines) and what to do."""
    where = f"{ref} ({resolved})"
    missing = re.findall(r"No module named '([\w.]+)'", error)
    if missing:
        name = missing[-1]
        top = name.split(".")[0]
        if top in spec.own:
            todo = (
                f"{name} is part of {spec.id} but is not in this checkout; the adapter may need another location "
                f"for this pin (targets/adapters/{spec.adapter.rsplit('.', 1)[-1]}.py)"
            )
        elif top in spec.deny:
            todo = f"{top} is deny-listed for {spec.id} (kept missing on purpose); the adapter must not need it here"
        else:
            todo = (
                f"if the masked math never touches {top}, add it to the stand_ins of {spec.adapter}.SPEC; "
                f"otherwise install it (pip install {top})"
            )
    elif "NotImplementedError" in error:
        todo = f"the adapter {spec.adapter} is not built yet"
    elif "loading took longer" in error:
        todo = "loading hung; raise the load timeout or check what the import waits for"
    else:
        todo = f"the adapter {spec.adapter} cannot load this pin; try another pin or fix the adapter for it"
    return f"{where}: cannot load the target: {todo}. The worker said:\n{_tail(error)}"

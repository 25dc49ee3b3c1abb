"""Replay corpus entries on their targets and classify each (entry, pin) against the ledger.

Used by `maskfuzz replay` (fuzz/commands/replay.py) and by the pytest collection of the corpus
(tests/test_corpus_entries.py). The target is reached through an *opener*: a callable
`opener(target, entry_point, pin, repos, device)` returning a context manager of a handle with
`.run` (a Run), `.declared` (oracles Declared) and `.resolved`. The default, `open_handle`, wraps
`targets.session.open_target`; tests inject fakes. An opener says a target is unavailable by
raising `Unavailable(reason)`; that becomes a skip with the reason, never a pass.

Outcome statuses:

    pass    the property holds, and the ledger does not expect a failure
    xfail   it fails, as the ledger expects
    fail    it fails unexpectedly (exit 1)
    fixed   the ledger expects a failure and it passes (exit 1: strict; update the ledger)
    skip    not checked: no CUDA device, the target cannot be set up, or the function is absent
    n/a     the property does not apply to the case at this pin / dtype (reason given)
    error   the replay itself broke (exit 1)
"""

from __future__ import annotations

import re
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from maskfuzz.fuzz import evidence
from maskfuzz.fuzz.corpus import LEDGER_NAME
from maskfuzz.fuzz.corpus_codec import CorpusError, Entry, encode_float
from maskfuzz.fuzz.ledger import Expectation, Ledger
from maskfuzz.fuzz.signature import signature
from maskfuzz.fuzz.triage import retriage as triage_again
from maskfuzz.oracles.declared import DEFAULT_KIND
from maskfuzz.oracles.kinds.dispatch import judge
from maskfuzz.oracles.verdict import Verdict
from maskfuzz.targets.registry import get, registry
from maskfuzz.targets.runtime import session

STATUSES = ("pass", "xfail", "fail", "fixed", "skip", "n/a", "error")
BAD = ("fail", "fixed", "error")
NO_CUDA = "no CUDA device"
_VERSION = re.compile(r"\d+(\.\d+)*([.-]?(post|dev|rc|a|b)\d*)*")

Opener = Callable[[str, "str | None", str, "dict | None", str], AbstractContextManager]


class Unavailable(Exception):
    """The target cannot be run at this pin: `kind` is 'absent' (the function is not there) or
    'setup' (the code cannot be acquired or imported; the reason says what to do)."""

    def __init__(self, reason: str, kind: str = "setup"):
        super().__init__(reason)
        self.reason = reason
        self.kind = kind


@contextmanager
def open_handle(
    target: str, entry_point: str | None, pin: str, repos: dict | None = None, device: str = "cpu"
) -> Iterator[Any]:
    """The default opener: `targets.session.open_target`, its Skip / SetupError as Unavailable."""
    with ExitStack() as stack:
        try:
            ref = session.parse_ref(f"{target}:{entry_point}@{pin}" if entry_point else f"{target}@{pin}")
            handle = stack.enter_context(session.open_target(ref, repos=repos, device=device))
        except session.Skip as exc:
            raise Unavailable(str(getattr(exc, "reason", None) or exc), "absent") from None
        except session.SetupError as exc:
            raise Unavailable(str(exc), "setup") from None  # its message names target and pin
        yield handle


class HandleCache:
    """Open targets by (target, entry point, pin), reused until evicted; at most `max_open` at a
    time (each is a worker process), least recently used closed first. An Unavailable is cached
    too, so a target that cannot be set up is tried once per session."""

    def __init__(self, opener: Opener | None = None, repos: dict | None = None, device: str = "cpu", max_open: int = 4):
        self.opener = opener or open_handle
        self.repos, self.device, self.max_open = repos, device, max_open
        self._open: OrderedDict[tuple, tuple[ExitStack, Any]] = OrderedDict()
        self._unavailable: dict[tuple, Unavailable] = {}

    def get(self, target: str, entry_point: str | None, pin: str) -> Any:
        key = (target, entry_point, pin)
        if key in self._unavailable:
            raise self._unavailable[key]
        if key in self._open:
            self._open.move_to_end(key)
            return self._open[key][1]
        while len(self._open) >= self.max_open:
            _, (stack, _h) = self._open.popitem(last=False)
            stack.close()
        stack = ExitStack()
        try:
            handle = stack.enter_context(self.opener(target, entry_point, pin, self.repos, self.device))
        except Unavailable as exc:
            stack.close()
            self._unavailable[key] = exc
            raise
        self._open[key] = (stack, handle)
        return handle

    def close(self) -> None:
        while self._open:
            _, (stack, _h) = self._open.popitem(last=False)
            stack.close()


@dataclass(frozen=True)
class Job:
    """One replay: `entry` at `pin` (on the entry's own target and entry point)."""

    entry: Entry
    pin: str
    expect: Expectation | None = None

    @property
    def name(self) -> str:
        return f"{self.entry.key}@{self.pin} {self.entry.property}-{self.entry.id}"


@dataclass
class Outcome:
    job: Job
    status: str
    message: str = ""
    resolved: str | None = None
    device: str = "cpu"
    dtype: str = ""
    seconds: float = 0.0
    verdict: Verdict | None = None
    triaged: dict | None = None  # failing outcomes: mechanism, evidence, severity, reach, reach_how

    def to_json(self) -> dict:
        e = self.job.entry
        return (self.triaged or {}) | {
            "id": e.id,
            "path": str(e.path) if e.path else None,
            "target": e.key,
            **_entry_kind(e.target, e.entry_point),
            "pin": self.job.pin,
            "resolved": self.resolved,
            "property": e.property,
            "device": self.device,
            "dtype": self.dtype,
            "status": self.status,
            "expected": self.job.expect.expect if self.job.expect else "passes",
            "ledger_reason": self.job.expect.reason if self.job.expect else None,
            "message": self.message,
            "seconds": round(self.seconds, 3),
            "verdict": _verdict_json(self.verdict) if self.verdict else None,
        }


def _entry_kind(target: str, entry: str | None) -> dict:
    """{"entry", "kind"} of a registered target's entry (the entry's own name for the default)."""
    spec = registry().get(target)
    if spec is None:
        return {"entry": entry or "", "kind": DEFAULT_KIND}
    return {"entry": spec.entry_name(entry), "kind": spec.kind_of(entry)}


def _verdict_json(v: Verdict) -> dict:
    d = v.to_dict()
    d["expected"] = [encode_float(x) for x in v.expected]  # strict JSON: NaN / inf as strings
    d["observed"] = [encode_float(x) for x in v.observed]
    return d


# ---------------------------------------------------------------------------------------------
# Planning.
# ---------------------------------------------------------------------------------------------
def ledger_for(entry: Entry, cache: dict[Path, Ledger] | None = None) -> Ledger:
    """The ledger of the corpus an entry file belongs to: `ledger.json` in its directory or the
    one above (`<root>/<target>/<file>` -> `<root>/ledger.json`); empty when there is none."""
    cache = {} if cache is None else cache
    if entry.path is None:
        return Ledger()
    for d in (entry.path.parent, entry.path.parent.parent):
        p = d / LEDGER_NAME
        if p.exists():
            if p not in cache:
                cache[p] = Ledger.load(p)
            return cache[p]
    return Ledger()


def plan(
    entries: Iterable[Entry],
    ledger: Callable[[Entry], Ledger] | Ledger | None = None,
    overrides: Iterable[tuple[str, str | None, str]] = (),
) -> list[Job]:
    """The (entry, pin) replays. By default an entry replays at its recorded pin and at every pin
    the ledger names for it. `overrides` (target, entry point or None, pin) replace those pins for
    the entries of that target (and entry point, when one is given); other entries keep theirs."""
    overrides = list(overrides)
    jobs = []
    for e in entries:
        led = ledger if isinstance(ledger, Ledger) else (ledger(e) if ledger else Ledger())
        mine = [pin for t, ep, pin in overrides if t == e.target and (ep is None or ep == (e.entry_point or "default"))]
        pins = mine or [e.pin] + led.pins(e.id, e.key)
        for pin in dict.fromkeys(pins):
            jobs.append(Job(e, pin, led.expectation(e.id, e.key, pin)))
    return jobs


def pin_kind(target: str, pin: str) -> str:
    """'release' or 'git': from the registry when it lists the pin, else by its look (a version
    number of a target with a PyPI package is a release)."""
    try:
        spec = get(target)
    except KeyError:
        return "git"
    known = spec.pin(pin)
    if known is not None:
        return known.kind
    return "release" if spec.package and _VERSION.fullmatch(pin) else "git"


# ---------------------------------------------------------------------------------------------
# Judging one entry and classifying the result.
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Judged:
    state: str  # "fail" | "pass" | "n/a"
    message: str
    verdict: Verdict | None


def judge_entry(run: Any, declared: Any, entry: Entry, device: str = "cpu", dtype: str | None = None) -> Judged:
    """Run the entry's case (in `dtype` when given) through `run` and judge the entry's property
    only. A crash of the base run fails the entry whatever its property: the case no longer
    reaches the check it was recorded for."""
    case = entry.case if dtype is None else entry.case.replace(dtype=dtype)
    why = declared.domain.rejects(case)
    if why:
        return Judged("n/a", f"outside the target's domain at this pin: {why}", None)
    verdicts = {v.property: v for v in judge(run, case, declared, device=device, only=(entry.property,))}
    v, crash = verdicts[entry.property], verdicts["no-crash"]
    if not v.failed and crash.failed:
        v = crash
    if v.failed:
        note = (
            ""
            if signature(entry.property, v, case) == entry.signature or dtype
            else " (fails differently than recorded)"
        )
        return Judged("fail", f"{v.property}: {v.message}{note}", v)
    if v.status == "n/a":
        return Judged("n/a", f"{v.property} does not apply: {v.message}", v)
    return Judged("pass", "", v)


def retriage(handle: Any, entry: Entry, verdict: Verdict, dtype: str | None) -> dict:
    """Root cause, reach, promise and severity recomputed at this pin (reach without a search: the
    case, the recorded witness or its projection into the pipeline domain)."""
    case = entry.case if dtype is None else entry.case.replace(dtype=dtype)
    case = verdict.case or case  # a twin (a crash, the poisoned case): the finding is about the twin's own case
    if not hasattr(handle.declared, "pipeline"):  # a fake handle of the tests without the triage fields
        return {}
    return triage_again(handle.run, case, verdict, handle.declared, entry.key, known=entry.witness)


def classify(state: str, expect: Expectation | None) -> str:
    """Strict expected-failure semantics (see fuzz/ledger.py)."""
    expected_fail = bool(expect and expect.fails)
    if state == "n/a":
        return "n/a"
    if state == "fail":
        return "xfail" if expected_fail else "fail"
    return "fixed" if expected_fail else "pass"


def describe(status: str, judged: Judged, expect: Expectation | None) -> str:
    if status == "xfail":
        return f"fails as expected ({expect.reason}): {judged.message}"
    if status == "fixed":
        return f"passes, but the ledger expects a failure ({expect.reason}): fixed? update corpus/ledger.json"
    return judged.message


def replay(
    jobs: list[Job],
    *,
    opener: Opener | None = None,
    repos: dict | None = None,
    device: str = "cpu",
    dtype: str | None = None,
    cuda_available: bool | None = None,
    progress: Callable[[int, int, Outcome], None] | None = None,
) -> list[Outcome]:
    """Replay `jobs`, opening each (target, entry point, pin) once (jobs are grouped so that one
    worker is open at a time). Outcomes come back in the order of `jobs`."""
    if device == "cuda" and cuda_available is None:
        import torch

        cuda_available = torch.cuda.is_available()
    order = sorted(range(len(jobs)), key=lambda i: (jobs[i].entry.target, jobs[i].entry.entry_point or "", jobs[i].pin))
    outcomes: dict[int, Outcome] = {}
    cache = HandleCache(opener, repos, device, max_open=1)
    try:
        for n, i in enumerate(order, 1):
            outcomes[i] = replay_one(jobs[i], cache, device=device, dtype=dtype, cuda_available=cuda_available)
            if progress:
                progress(n, len(jobs), outcomes[i])
    finally:
        cache.close()
    return [outcomes[i] for i in range(len(jobs))]


def replay_one(
    job: Job, cache: HandleCache, *, device: str = "cpu", dtype: str | None = None, cuda_available: bool = False
) -> Outcome:
    e = job.entry
    out = Outcome(job, "skip", device=device, dtype=dtype or e.case.dtype)
    if device == "cuda" and not cuda_available:
        out.message = NO_CUDA
        return out
    start = time.monotonic()
    try:
        handle = cache.get(e.target, e.entry_point, job.pin)
        out.resolved = getattr(handle, "resolved", None)
        judged = judge_entry(handle.run, handle.declared, e, device=device, dtype=dtype)
    except Unavailable as exc:
        out.message = f"{'not present' if exc.kind == 'absent' else 'cannot set up'}: {exc.reason}"
        return out
    except Exception as exc:  # noqa: BLE001 - a broken replay is reported, the others still run
        out.status, out.message = "error", f"replay raised {type(exc).__name__}: {exc}"
        out.seconds = time.monotonic() - start
        return out
    if judged.state == "fail" and judged.verdict is not None:
        out.triaged = evidence.applied(retriage(handle, e, judged.verdict, dtype), e.validation, out.resolved)
    out.seconds = time.monotonic() - start
    out.verdict = judged.verdict
    # the ledger speaks of the recorded dtype: at another one a result is plain pass / fail
    expect = job.expect if dtype is None or dtype == e.case.dtype else None
    out.status = classify(judged.state, expect)
    out.message = describe(out.status, judged, expect)
    if expect is None and job.expect is not None:
        out.message += f" (at {dtype}; the ledger's expectation is for {e.case.dtype})"
    return out


def exit_code(outcomes: Iterable[Outcome], unreadable: int = 0) -> int:
    """2 when some input was unreadable, else 1 when any outcome is fail / fixed / error, else 0."""
    if unreadable:
        return 2
    return 1 if any(o.status in BAD for o in outcomes) else 0


def counts(outcomes: Iterable[Outcome]) -> dict[str, int]:
    c = dict.fromkeys(STATUSES, 0)
    for o in outcomes:
        c[o.status] += 1
    return c


def _class_of(o: Outcome) -> str:
    """What a failing replay is at its pin: 'defect <promise>' or '<kind> fact' ('' for a pass)."""
    t = o.triaged or {}
    if not t.get("class"):
        return ""
    return f"defect {t.get('promise', '')}".strip() if t["class"] == "defect" else f"{t['class']} fact"


def summary(outcomes: list[Outcome], errors: list[CorpusError] = (), device: str = "cpu") -> str:
    """The table printed at the end of `maskfuzz replay`, then the counts and loud warnings."""
    rows = [("STATUS", "TARGET@PIN", "PROPERTY", "ID", "DTYPE", "TIME", "CLASS", "NOTE")]
    for o in outcomes:
        e = o.job.entry
        rows.append(
            (
                o.status.upper() if o.status in BAD else o.status,
                f"{e.key}@{o.job.pin}",
                e.property,
                e.id,
                o.dtype,
                f"{o.seconds:.1f}s",
                _class_of(o),
                o.message[:100],
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1] for r in rows]
    c = counts(outcomes)
    lines.append("")
    lines.append(f"{len(outcomes)} replay(s): " + ", ".join(f"{n} {s}" for s, n in c.items() if n))
    for err in errors:
        lines.append(f"UNREADABLE: {err}")
    if outcomes and c["skip"] == len(outcomes):
        lines.append(f"WARNING: every replay was SKIPPED: nothing was checked ({outcomes[0].message})")
    elif c["skip"]:
        lines.append(f"WARNING: {c['skip']} replay(s) SKIPPED, not checked (see NOTE)")
    if device == "cuda" and any(o.message == NO_CUDA for o in outcomes):
        lines.append(
            f"WARNING: --device cuda but {NO_CUDA}: {sum(o.message == NO_CUDA for o in outcomes)} replay(s) not run"
        )
    if c["fixed"]:
        lines.append("FIXED entries pass where the ledger expects a failure: update corpus/ledger.json")
    return "\n".join(lines)

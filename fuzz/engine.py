"""The fuzzing engine: draw cases inside a target's domain, judge each, let Hypothesis shrink.

`fuzz_target(run, declared, ...)` drives Hypothesis with `judge` as the test body. A failing case
raises an exception type of its own per property id, so Hypothesis' multi-bug tracking shrinks
each violated property separately; the last failing call for a property is its minimal example
(Hypothesis replays each minimal example once at the end). A target's exception, crash, hang or
non-finite output is a verdict (`no-crash`), never a crash of the tool.

With a time budget the search runs in batches of fresh seeds until the budget is spent; a
property already found is no longer raised, so later batches look for the others.
"""

from __future__ import annotations

import json
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hyp_seed
from hypothesis.errors import Flaky

from maskfuzz.fuzz.corpus_codec import case_to_json
from maskfuzz.fuzz.evidence import reach_evidence
from maskfuzz.fuzz.job_result import FindingRow
from maskfuzz.fuzz.option_strategies import configured
from maskfuzz.oracles.strategies import Sizes

try:
    _GROUP = BaseExceptionGroup  # Python >= 3.11
except NameError:  # pragma: no cover - Python 3.10 uses Hypothesis' backport
    from exceptiongroup import BaseExceptionGroup as _GROUP
from maskfuzz.oracles.case import Case
from maskfuzz.oracles.declared import Declared
from maskfuzz.oracles.kinds import ALL_KINDS, spec
from maskfuzz.oracles.kinds import properties as kind_properties
from maskfuzz.oracles.kinds.dispatch import judge
from maskfuzz.oracles.verdict import PROPERTIES, Run, Verdict


@dataclass
class Finding:
    """A shrunk counterexample: `case` violates `property` on `target`@`pin`."""

    target: str
    pin: str
    resolved: str
    property: str
    case: Case
    verdict: Verdict
    also: list[str] = field(default_factory=list)  # other properties the case violates
    seed: int | None = None
    # filled by fuzz.triage: the root cause, whether the framework's pipeline reaches it, the promise it
    # breaks and how bad (a defect), or what kind of fact it is and why it breaks no promise
    mechanism: str = ""
    evidence: str = ""
    severity: str = ""
    reach: str = ""
    reach_how: str = ""
    witness: Case | None = None
    defect: str = ""
    promise: Any = None  # oracles.promises.Promise, or None: a fact
    fact: str = ""  # "semantics" | "robustness" when it breaks no promise
    why_fact: str = ""
    judged: str = ""  # "invariants only": the entry has no float64 reference (a discovered variant)

    @property
    def is_defect(self) -> bool:
        return self.promise is not None

    def to_dict(self) -> dict:
        """The finding's JSON, as its job result's row writes it without the corpus file."""
        return {k: v for k, v in self.row().to_json().items() if k != "corpus_file"}

    def row(self, corpus_file: str | None = None) -> FindingRow:
        """This finding as a row of its job's result (`fuzz.job_result`), saved as `corpus_file`."""
        promise = self.promise.to_json() if self.promise is not None else {}
        return FindingRow(
            property=self.property,
            defect=self.defect,
            mechanism=self.mechanism,
            evidence=self.evidence,
            reach=self.reach,
            reach_evidence=reach_evidence(self.reach),
            severity=self.severity,
            reach_how=self.reach_how,
            klass="defect" if self.promise is not None else (self.fact or ""),
            promise=promise,
            why_not_a_defect=self.why_fact if self.promise is None else "",
            witness=None if self.witness is None or self.witness is self.case else case_to_json(self.witness),
            shape=tuple(self.case.shape),
            output=self.verdict.output,
            message=self.verdict.message,
            positions=tuple(tuple(p) for p in self.verdict.positions),
            expected=self.verdict.expected,
            observed=self.verdict.observed,
            also=tuple(self.also),
            options=dict(sorted(self.case.options.items())),
            case=case_to_json(self.case),
            corpus_file=corpus_file,
            judged=self.judged,
        )


@dataclass
class FuzzResult:
    target: str
    pin: str
    examples: int = 0  # test-case executions, shrinking included
    generated: int = 0  # executions before the first failure of each batch
    seconds: float = 0.0
    first_failure_s: float | None = None
    first_failure_at: dict[str, float] = field(default_factory=dict)  # property -> seconds to its first failure
    stopped: bool = False  # `stop_when` ended the search
    findings: list[Finding] = field(default_factory=list)
    facts: list = field(default_factory=list)  # fuzz.triage.Fact: findings that break no promise
    checked: dict[str, int] = field(default_factory=lambda: {p: 0 for p in PROPERTIES})
    failed: dict[str, int] = field(default_factory=lambda: {p: 0 for p in PROPERTIES})
    notes: list[str] = field(default_factory=list)
    # per option, per value (JSON text): examples judged under it; "truncated": examples with a cut row
    options_checked: dict[str, dict[str, int]] = field(default_factory=dict)
    truncated_checked: int = 0
    # pairs of non-default settings judged together ("name=value & name=value", "... & truncated")
    interactions_checked: dict[str, int] = field(default_factory=dict)
    info: dict[str, dict[str, float]] = field(default_factory=dict)  # property -> name -> the largest seen

    def finding(self, prop: str) -> Finding | None:
        return next((f for f in self.findings if f.property == prop), None)


class _StopSearch(BaseException):
    """Ends a search at once: Hypothesis re-raises BaseExceptions without shrinking."""


class PropertyViolation(AssertionError):
    """Base of the per-property exception types Hypothesis tracks as distinct bugs."""


_ALL_PROPERTIES = tuple(dict.fromkeys(p for kind in ALL_KINDS for p in kind_properties(kind)))
_VIOLATIONS = {p: type(f"Violation_{p.replace('-', '_')}", (PropertyViolation,), {}) for p in _ALL_PROPERTIES}

Progress = Callable[[FuzzResult], None]


def base_settings(max_examples: int, derandomize: bool = False, shrink: bool = True) -> settings:
    return settings(
        max_examples=max_examples,
        database=None,
        deadline=None,
        derandomize=derandomize,
        report_multiple_bugs=True,
        suppress_health_check=list(HealthCheck),
        phases=(Phase.explicit, Phase.generate) + ((Phase.shrink,) if shrink else ()),
        print_blob=False,
    )


def fuzz_target(
    run: Run,
    declared: Declared,
    *,
    target: str,
    pin: str = "",
    resolved: str = "",
    max_examples: int = 200,
    seed: int = 0,
    budget: float | None = None,
    sizes: Sizes = Sizes(),
    nonfinite: bool = True,
    device: str = "cpu",
    progress: Progress | None = None,
    clock: Callable[[], float] = time.monotonic,
    batch: int = 100,  # examples per seed when a budget is set
    derandomize: bool = False,
    shrink: bool = True,
    properties: tuple[str, ...] | None = None,
    stop_when: Callable[[FuzzResult], bool] | None = None,
    options: dict | None = None,
) -> FuzzResult:
    """Fuzz `run` against `declared` and return the shrunk findings, one per violated property.

    Hypothesis stops generating at a failure and shrinks it, so the search runs in batches with
    seeds seed, seed+1, ...: each batch stops raising the properties already found, until
    `max_examples` examples were generated (shrinking not counted) or, with `budget` (seconds,
    checked between batches of at most `batch` examples), until the budget is spent.
    `properties` restricts the checks (and the search ends when all of them are found);
    `stop_when(result)`, asked after every example, ends the search at once (benchmarks);
    `options` fixes the framework options of every case (otherwise they are drawn)."""
    props = kind_properties(declared.kind)
    result = FuzzResult(target, pin, checked={p: 0 for p in props}, failed={p: 0 for p in props})
    search = _Search(
        run=run,
        declared=declared,
        result=result,
        wanted=tuple(properties or props),
        device=device,
        clock=clock,
        progress=progress,
        stop_when=stop_when,
    )
    with _single_thread():
        strategy = draws(declared, sizes, nonfinite)
        if declared.options or declared.truncation is not None:
            strategy = configured(strategy, declared, fixed=options)
        for opt in declared.options:
            result.options_checked[opt.name] = {json.dumps(v): 0 for v in opt.values}
        search.loop(strategy, max_examples, seed, budget, batch, derandomize, shrink)
    result = search.result
    for prop in props:
        if prop in search.found:
            case, verdict, also, used_seed = search.found[prop]
            case, verdict = _simplest_configuration(
                run, declared, case, verdict, device, keep_options=options is not None
            )
            result.findings.append(Finding(target, pin, resolved, prop, case, verdict, also, used_seed))
    return result


def draws(declared: Declared, sizes: Sizes, nonfinite: bool):
    """The strategy of the cases of `declared`'s kind inside its api domain (options not yet drawn)."""
    return spec(declared.kind).cases(declared, sizes, nonfinite)


def _simplest_configuration(
    run: Run, declared: Declared, case: Case, verdict: Verdict, device: str, keep_options: bool = False
):
    """The shrunk case with every option it does not need back at its default (unless the options
    were fixed for the run: `keep_options`) and the truncation dropped when the property fails
    without it (the shrinker can stop at a local minimum that keeps an option): a finding names
    only the configuration it needs. Returns (case, verdict)."""
    if verdict.case is not None or (not case.options and case.truncated is None):
        return case, verdict  # a crashing twin's finding is about the twin: left as found

    def still_fails(candidate: Case) -> Verdict | None:
        try:
            out = judge(run, candidate, declared, device=device, only=(verdict.property,))
        except Exception:  # noqa: BLE001 - a candidate the judge cannot take keeps the original
            return None
        return next((v for v in out if v.property == verdict.property and v.failed and v.case is None), None)

    if case.truncated is not None:
        v = still_fails(case.replace(truncated=None, bootstrap=None))
        if v is not None:
            case, verdict = case.replace(truncated=None, bootstrap=None), v
    for name in sorted(case.options) if not keep_options else ():
        fewer = {k: x for k, x in case.options.items() if k != name}
        v = still_fails(case.replace(options=fewer))
        if v is not None:
            case, verdict = case.replace(options=fewer), v
    return case, verdict


@contextmanager
def _single_thread():
    """Oracle tensors are small: intra-op threads only add contention (10x slower under load)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@dataclass
class _Search:
    """One fuzzing search: the target, what it promises, and what was found so far."""

    run: Run
    declared: Declared
    result: FuzzResult
    wanted: tuple[str, ...]
    device: str
    clock: Callable[[], float]
    progress: Progress | None
    stop_when: Callable[[FuzzResult], bool] | None
    found: dict = field(default_factory=dict)  # property -> (case, verdict, also, seed), the smallest
    start: float = 0.0

    def loop(self, strategy, max_examples, seed, budget, batch, derandomize, shrink) -> None:
        """Batches of fresh seeds until the examples or the budget are spent (see fuzz_target)."""
        self.start = self.clock()
        batch_no = 0
        while True:
            todo = max_examples - self.result.generated
            if budget is not None:
                todo = min(todo, batch)
            if todo <= 0:
                break
            known = len(self.found)
            self.batch(strategy, seed + batch_no, base_settings(todo, derandomize, shrink))
            batch_no += 1
            if self.result.stopped or set(self.wanted) <= set(self.found):
                break
            if budget is not None and self.clock() - self.start >= budget:
                break
            if budget is None and len(self.found) == known:
                break  # a batch without a new finding ran to its end (or exhausted the strategy)
        self.result.seconds = self.clock() - self.start

    def batch(self, strategy, seed: int, hyp_settings: settings) -> None:
        """One Hypothesis search; each property not found yet raises its own exception type."""
        result = self.result
        raise_for = tuple(p for p in self.wanted if p not in self.found)
        latest: dict[str, tuple[Case, Verdict, list[str], int]] = {}
        state = {"failing": False}

        def body(case: Case) -> None:
            verdicts = judge(self.run, case, self.declared, device=self.device, only=self.wanted)
            result.examples += 1
            if not state["failing"]:
                result.generated += 1
            failing = [v for v in verdicts if v.failed]
            if any(v.status != "n/a" for v in verdicts):
                _count_configuration(result, self.declared, case)
            for v in verdicts:
                for name, x in v.info.items():
                    seen = result.info.setdefault(v.property, {})
                    seen[name] = max(seen.get(name, x), x)
                if v.status != "n/a":
                    result.checked[v.property] += 1
                if v.failed:
                    result.failed[v.property] += 1
                    result.first_failure_at.setdefault(v.property, self.clock() - self.start)
            if self.progress is not None:
                self.progress(result)
            if self.stop_when is not None and self.stop_when(result):
                result.stopped = True
                raise _StopSearch
            first = next((v for v in failing if v.property in raise_for), None)
            if first is None:
                return
            if result.first_failure_s is None:
                result.first_failure_s = self.clock() - self.start
            state["failing"] = True
            also = [v.property for v in failing if v is not first]
            # the last call is the shrunk example; a crashing twin is a finding about the twin's case
            latest[first.property] = (first.case or case, first, also, seed)
            raise _VIOLATIONS[first.property](f"{first.property}: {first.message}")

        test = hyp_seed(seed)(hyp_settings(given(strategy)(body)))
        try:
            test()
        except _StopSearch:
            pass
        except (PropertyViolation, Flaky, _GROUP) as exc:
            if isinstance(exc, Flaky):
                result.notes.append(f"seed {seed}: Hypothesis reported a flaky failure: {str(exc)[:200]}")
        for prop, rec in latest.items():
            old = self.found.get(prop)
            if old is None or _size(rec[0]) < _size(old[0]):
                self.found[prop] = rec


def _count_configuration(result: FuzzResult, declared: Declared, case: Case) -> None:
    for opt in declared.options:
        value = json.dumps(case.options.get(opt.name, opt.default))
        per = result.options_checked.setdefault(opt.name, {})
        per[value] = per.get(value, 0) + 1
    cut = case.truncated is not None and bool(case.truncated.any())
    if cut:
        result.truncated_checked += 1
    settings_ = [f"{k}={json.dumps(v)}" for k, v in sorted(case.options.items())] + (["truncated"] if cut else [])
    for i, a in enumerate(settings_):
        for b in settings_[i + 1 :]:
            key = f"{a} & {b}"
            result.interactions_checked[key] = result.interactions_checked.get(key, 0) + 1


def _size(case: Case) -> tuple[int, int]:
    b, t = case.shape
    return (b * t, int(case.trainable.sum()))

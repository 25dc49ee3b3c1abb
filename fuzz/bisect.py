"""Bisection of a target's history with one corpus case: the first revision whose verdict differs.

Modelled on syzkaller's `pkg/bisect`: the algorithm receives the history (`Repository`) and the
test environment (`Evaluator`) as interfaces, so it is tested with fakes and knows nothing of git,
wheels or workers. Verdicts are `good` (the property holds), `bad` (it fails) and `skip` (the
revision cannot be judged: the target does not import, the function is missing, the adapter cannot
run, or repeated runs disagree). A cause bisection (the case passes at `old`, fails at `new`) and a
fix bisection (fails at `old`, passes at `new`) are the same search: find the first revision in
(old, new] whose verdict equals new's. Skips next to the answer give an `inconclusive` result with
the candidate range, never a guess.

Probe choice: the median of the not yet tested, not skipped revisions strictly between the last
revision known to behave like `old` and the first known to behave like `new`. Without skips this
is the classic midpoint; after a skip the median moves to the skipped revision's neighbour,
alternating sides (git bisect's "probe next to it"). Each judged probe at least halves the
untested count, each skip removes one, so a bisection over N revisions makes at most
ceil(log2 N) + skips + 2 evaluations (the 2 are `old` and `new`).
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from typing import Callable, Protocol

GOOD, BAD, SKIP = "good", "bad", "skip"
VERDICTS = (GOOD, BAD, SKIP)

FOUND, INCONCLUSIVE, NO_CHANGE = "found", "inconclusive", "no-change"
CAUSE, FIX = "cause", "fix"


class BisectError(ValueError):
    """The bisection cannot start: an unknown revision, or `new` is not after `old`."""


@dataclass(frozen=True)
class Revision:
    """One point of a history: a commit (full hash) or a released version."""

    id: str  # full commit hash, or a version string such as "0.5.0"
    date: str = ""  # ISO 8601 commit date (or release date when known)
    subject: str = ""  # first line of the commit message ("" for a release)

    def short(self) -> str:
        return self.id[:12] if len(self.id) == 40 else self.id

    def to_dict(self) -> dict:
        return {"id": self.id, "date": self.date, "subject": self.subject}


@dataclass
class Outcome:
    """The verdict of one evaluation of the case at one revision."""

    verdict: str  # good | bad | skip
    reason: str = ""  # why skip / which property failed; "" for a plain pass
    seconds: float = 0.0  # wall time of the evaluation (all runs together)
    cpu: float = 0.0  # CPU seconds of this process and the processes it waited for (workers, git)
    runs: list[str] = field(default_factory=list)  # each run's verdict when repeated
    flaky: bool = False  # repeated runs disagreed (then verdict is skip)

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict must be one of {VERDICTS}, got {self.verdict!r}")

    def to_dict(self) -> dict:
        out = {"verdict": self.verdict, "reason": self.reason, "seconds": round(self.seconds, 3)}
        if self.cpu:
            out["cpu_seconds"] = round(self.cpu, 3)
        if self.runs:
            out["runs"] = list(self.runs)
        if self.flaky:
            out["flaky"] = True
        return out


class Repository(Protocol):
    """A linear history. `revisions(old, new)` lists (old, new], oldest first; with
    `first_parent` a git history follows first parents only (merges count as one step)."""

    def revisions(self, old: str, new: str, first_parent: bool = False) -> list[Revision]: ...

    def describe(self, rev: str) -> Revision: ...


class Evaluator(Protocol):
    """Judges the case at one revision: good / bad / skip. An evaluator that checks code out may
    have a `done(revision)` method: `bisect` calls it once after the revision's last run, so a
    repeated evaluation reuses one checkout and a long history never holds more than one."""

    def __call__(self, revision: Revision) -> Outcome: ...


@dataclass
class Tested:
    revision: Revision
    outcome: Outcome

    def to_dict(self) -> dict:
        return {"revision": self.revision.to_dict()} | self.outcome.to_dict()


@dataclass
class BisectResult:
    """What a bisection found. `commit` is the answer when `result == "found"`; `candidates`
    the revisions that may be it when inconclusive (the skipped ones and the first known to
    behave like `new`)."""

    result: str  # found | inconclusive | no-change
    kind: str | None  # cause | fix | None (no change, or old/new could not be judged)
    old: Revision
    new: Revision
    old_outcome: Outcome
    new_outcome: Outcome
    revisions: int  # N: how many revisions lie in (old, new]
    commit: Revision | None = None
    candidates: list[Revision] = field(default_factory=list)
    tested: list[Tested] = field(default_factory=list)  # in evaluation order, old and new first
    reason: str = ""

    @property
    def evaluations(self) -> int:
        return len(self.tested)

    @property
    def skips(self) -> int:
        return sum(t.outcome.verdict == SKIP for t in self.tested)

    @property
    def seconds(self) -> float:
        return sum(t.outcome.seconds for t in self.tested)

    @property
    def cpu(self) -> float:
        return sum(t.outcome.cpu for t in self.tested)

    def bound(self) -> int:
        """ceil(log2 N) + skips + 2: the most evaluations the search may make."""
        return evaluation_bound(self.revisions, self.skips)

    def to_dict(self, unit: str = "commit") -> dict:
        """JSON form; `unit` names the answer field: "commit" (git) or "version" (releases)."""
        answer = self.commit.to_dict() if self.commit else None
        return {
            "result": self.result,
            "kind": self.kind,
            unit: answer,
            "old": self.old.to_dict() | {"verdict": self.old_outcome.verdict},
            "new": self.new.to_dict() | {"verdict": self.new_outcome.verdict},
            "revisions": self.revisions,
            "candidates": [r.to_dict() for r in self.candidates],
            "evaluations": self.evaluations,
            "skips": self.skips,
            "bound": self.bound(),
            "seconds": round(self.seconds, 3),
            "seconds_per_evaluation": round(self.seconds / self.evaluations, 3) if self.evaluations else 0.0,
            "cpu_seconds": round(self.cpu, 3),
            "tested": [t.to_dict() for t in self.tested],
            "reason": self.reason,
        }


def evaluation_bound(n_revisions: int, skips: int) -> int:
    """ceil(log2 N) + skips + 2 (N >= 1 revisions in (old, new])."""
    return math.ceil(math.log2(max(n_revisions, 1))) + skips + 2


def repeated(evaluator: Evaluator, runs: int) -> Evaluator:
    """An evaluator that judges each revision `runs` times and keeps the verdict only when every
    run agrees; good and bad together give a skip labelled flaky. A skip in any run is a skip
    (the first skip's reason), and the remaining runs are not made."""
    if runs < 1:
        raise ValueError(f"runs must be >= 1, got {runs}")
    if runs == 1:
        return evaluator

    def judge(revision: Revision) -> Outcome:
        seen: list[Outcome] = []
        for _ in range(runs):
            out = evaluator(revision)
            seen.append(out)
            if out.verdict == SKIP:
                break
        verdicts = [o.verdict for o in seen]
        seconds = sum(o.seconds for o in seen)
        cpu = sum(o.cpu for o in seen)
        skip = next((o for o in seen if o.verdict == SKIP), None)
        if skip is not None:
            return Outcome(SKIP, skip.reason, seconds, cpu, verdicts)
        if len(set(verdicts)) > 1:
            counts = ", ".join(f"{v} x{verdicts.count(v)}" for v in (GOOD, BAD))
            return Outcome(SKIP, f"flaky: {runs} runs disagree ({counts})", seconds, cpu, verdicts, flaky=True)
        bad = next((o.reason for o in seen if o.reason), "")
        return Outcome(verdicts[0], bad, seconds, cpu, verdicts)

    return judge


def _cpu_now() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _timed(evaluator: Evaluator, revision: Revision, done: Callable[[Revision], None] | None = None) -> Outcome:
    """Judge `revision` (all its runs), then let the evaluator release what it holds for it
    (`done`); measures both in wall and CPU time (on a busy machine the wall time
    says little). An exception that escapes the evaluator is a skip: a broken revision must not
    abort a long bisection, and a failing clean-up must not change the verdict."""
    start, cpu = time.perf_counter(), _cpu_now()
    try:
        out = evaluator(revision)
    except Exception as exc:  # noqa: BLE001 - any failure to judge a revision is a skip
        out = Outcome(SKIP, f"evaluator raised {type(exc).__name__}: {exc}")
    if done is not None:
        try:
            done(revision)
        except Exception:  # noqa: BLE001 - see above
            pass
    out.seconds = time.perf_counter() - start
    out.cpu = _cpu_now() - cpu
    return out


def bisect(
    repository: Repository,
    evaluator: Evaluator,
    old: str,
    new: str,
    *,
    first_parent: bool = False,
    runs: int = 1,
    on_evaluated: Callable[[Revision, Outcome], None] | None = None,
) -> BisectResult:
    """Find the first revision in (old, new] whose verdict differs from old's.

    Evaluates `old` and `new` first: equal verdicts give `no-change`; a skip at either end gives
    `inconclusive` (there is no baseline to compare against). Otherwise `kind` is `cause` when the
    case passes at old and `fix` when it fails there. `on_evaluated` is called after every
    evaluation (progress output)."""
    revs = list(repository.revisions(old, new, first_parent=first_parent))
    if not revs:
        raise BisectError(f"no revisions in ({old}, {new}]: is {new} after {old}?")
    old_rev = repository.describe(old)
    new_rev = revs[-1]
    judge = repeated(evaluator, runs)
    tested: list[Tested] = []

    def evaluate(rev: Revision) -> Outcome:
        out = _timed(judge, rev, getattr(evaluator, "done", None))
        tested.append(Tested(rev, out))
        if on_evaluated is not None:
            on_evaluated(rev, out)
        return out

    old_out = evaluate(old_rev)
    new_out = evaluate(new_rev)
    base = dict(old=old_rev, new=new_rev, old_outcome=old_out, new_outcome=new_out, revisions=len(revs), tested=tested)
    for name, out in (("old", old_out), ("new", new_out)):
        if out.verdict == SKIP:
            return BisectResult(
                INCONCLUSIVE,
                None,
                candidates=revs,
                reason=f"the case cannot be judged at {name} ({out.reason}); choose another {name} revision",
                **base,
            )
    if old_out.verdict == new_out.verdict:
        return BisectResult(NO_CHANGE, None, reason=f"the case is {old_out.verdict} at both ends", **base)
    kind = CAUSE if old_out.verdict == GOOD else FIX
    target = new_out.verdict

    lo, hi = -1, len(revs) - 1  # revs[lo] behaves like old (-1 is old itself), revs[hi] like new
    skipped: set[int] = set()
    while True:
        untested = [i for i in range(lo + 1, hi) if i not in skipped]
        if not untested:
            break
        probe = untested[len(untested) // 2]
        out = evaluate(revs[probe])
        if out.verdict == SKIP:
            skipped.add(probe)
        elif out.verdict == target:
            hi = probe
        else:
            lo = probe

    base["kind"] = kind
    if hi - lo == 1:
        return BisectResult(FOUND, commit=revs[hi], **base)
    candidates = revs[lo + 1 : hi + 1]
    return BisectResult(
        INCONCLUSIVE,
        candidates=candidates,
        reason=f"{len(candidates) - 1} skipped revision(s) next to the answer; the first {target} revision is one of "
        f"{len(candidates)} candidates",
        **base,
    )


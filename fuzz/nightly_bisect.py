"""The nightly's automatic bisection: which upstream change made a finding appear or go away.

A moving pin (`@main`, `@latest`, a callable's `@HEAD`) resolves to another revision each night.
When a finding is **new** tonight at such a pin, or **fixed** tonight, the change lies between the
previous night's resolved revision and tonight's, and `maskfuzz bisect` finds it with the corpus
entry as the test:

    new        cause bisection: the entry (tonight's) at the previous night's revision, then tonight's
    fixed      fix bisection: the entry (the previous night's) at the previous night's revision, then tonight's
    behaviour  a dimension of a target's semantics card changed (`maskfuzz bisect --semantics`): the
               first revision where the code implements the other variant (a fact, not a defect)

`plan` decides from the two nights' coverage which findings can be bisected, and says why the
others cannot (the revision did not move, the previous night did not run the pin, no corpus entry,
no history to walk). `run` executes the jobs through an injected *runner* (by default the
`maskfuzz bisect` command in a subprocess, one log and one JSON per job), so the planning and the
report are tested with fakes. The bisection itself re-checks both ends: a new finding that already
fails at the previous night's revision is reported as "no change" (tonight's examples found an old
bug), never blamed on a commit.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

HEX40 = re.compile(r"[0-9a-f]{40}")
CAUSE, FIX, BEHAVIOUR = "cause", "fix", "behaviour"


@dataclass(frozen=True)
class Job:
    """One bisection: `case` between the previous night's revision `old` and tonight's `new`."""

    kind: str  # CAUSE for a new finding, FIX for a fixed one, BEHAVIOUR for a changed semantics card
    target: str  # the target key as in the report ("verl:grpo", "fakefw:compute")
    pin: str  # the pin as asked ("main", "latest", "HEAD")
    property: str  # the property; for BEHAVIOUR the card's dimension
    signature: str
    case: Path | None  # the corpus entry (None for BEHAVIOUR: the card draws its own cases)
    old: str  # commit hash or release version
    new: str
    unit: str  # "commit" | "version"
    callable: str = ""  # MODULE:FUNC of a --callable
    source: str = ""  # its git repository

    @property
    def name(self) -> str:
        """A file name for the job's log and JSON."""
        if self.case is None:
            return f"{self.kind}-" + re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{self.target}-{self.pin}-{self.property}")
        return f"{self.kind}-{self.case.stem}"

    def argv(self, json_path: Path, timeout: float) -> list[str]:
        """The `maskfuzz bisect` arguments (without the program) that run this job."""
        head = [str(self.case)] if self.case is not None else ["--semantics", self.property]
        args = ["bisect", *head, "--old", self.old, "--new", self.new, "--json", str(json_path)]
        if self.callable:
            return args + ["--callable", self.callable, "--source", self.source, "--timeout", str(timeout)]
        args += ["--target", self.target, "--timeout", str(timeout)]
        return args + (["--releases"] if self.unit == "version" else ["--commits"])


@dataclass
class Result:
    """What one bisection said, in the report's words."""

    job: Job
    status: str  # found | inconclusive | no-change | error
    summary: str  # one line: the commit / release, or why there is none
    revision: dict = field(default_factory=dict)  # {"id", "date", "subject"} when found
    evaluations: int = 0
    skips: int = 0
    revisions: int = 0
    seconds: float = 0.0
    json_path: Path | None = None
    log_path: Path | None = None

    def to_dict(self) -> dict:
        j = self.job
        return {
            "kind": j.kind,
            "target": j.target,
            "pin": j.pin,
            "property": j.property,
            "signature": j.signature,
            "case": None if j.case is None else str(j.case),
            "old": j.old,
            "new": j.new,
            "unit": j.unit,
            "status": self.status,
            "summary": self.summary,
            "revision": self.revision or None,
            "evaluations": self.evaluations,
            "skips": self.skips,
            "revisions": self.revisions,
            "seconds": round(self.seconds, 2),
        }


def revision_of(resolved: str) -> tuple[str, str] | None:
    """(revision, unit) of a resolved pin: a full commit hash, or 'PACKAGE==VERSION' -> the version."""
    resolved = (resolved or "").strip()
    if HEX40.fullmatch(resolved):
        return resolved, "commit"
    if "==" in resolved:
        return resolved.split("==", 1)[1], "version"
    return None


def plan(cmp, tonight, previous) -> tuple[list[Job], list[tuple[object, str, str]]]:
    """(jobs, not bisected) for the new and fixed findings of a comparison (`fuzz.report.compare`).
    `not bisected` holds (failure, state, reason) for every new / fixed finding without a job.
    One job per defect (root cause) and direction at a target@pin: the findings a defect explains
    share its bisection, and say so, instead of walking the same range again."""
    jobs, skipped = [], []
    if previous is None:
        return [], [(f, "new", "no previous night to compare with") for f in cmp.new]
    items = [(f, "new", CAUSE) for f in cmp.new] + [(f, "fixed", FIX) for f, _ in cmp.fixed]
    first: dict[tuple, object] = {}
    for f, state, kind in items:
        job, why = _job(f, kind, tonight, previous)
        key = (kind, f.identity.target, f.identity.pin, f.defect)
        if job is not None and key in first and f.triage.get("defect"):
            job, why = None, f"same defect ({f.defect}) as the {first[key].identity.property} finding: see its row"
        if job is None:
            skipped.append((f, state, why))
        else:
            first[key] = f
            jobs.append(job)
    jobs += behaviour_jobs(cmp, tonight, previous)
    return jobs, skipped


def behaviour_jobs(cmp, tonight, previous) -> list[Job]:
    """One job per changed card dimension at a pin whose revision moved (same unit at both nights); a
    change at an unmoved pin or across units is listed by the report without a job."""
    jobs = []
    for where, dim, _old, _new, r_old, r_new in getattr(cmp, "behaviour", ()):
        target, _, pin = where.rpartition("@")
        cov = tonight.coverage.get((target, pin))
        if cov is not None and cov.callable:  # `bisect --semantics` walks a registered target's history only
            continue
        a, b = revision_of(r_old), revision_of(r_new)
        if a is None or b is None or a == b or a[1] != b[1]:
            continue
        jobs.append(Job(BEHAVIOUR, target, pin, dim, "", None, a[0], b[0], a[1]))
    return jobs


def _job(f, kind: str, tonight, previous) -> tuple[Job | None, str]:
    i = f.identity
    now, before = tonight.coverage.get((i.target, i.pin)), previous.coverage.get((i.target, i.pin))
    if now is None or not now.resolved:
        return None, f"tonight's revision of {i.where} is not recorded"
    if before is None or not before.resolved:
        return None, f"the previous night did not run {i.where}"
    if before.status != "ok":
        return None, f"the previous night could not run {i.where} ({before.status})"
    a, b = revision_of(before.resolved), revision_of(now.resolved)
    if a is None or b is None:
        return None, f"{i.where} is no git or release pin ({before.resolved or now.resolved})"
    if a == b:
        what = "found by tonight's new examples" if kind == CAUSE else "not re-found by tonight's examples"
        return None, f"{i.where} is at the same revision as the previous night ({_short(b[0])}): {what}"
    if a[1] != b[1]:
        return None, f"{i.where} moved from a {a[1]} to a {b[1]} ({before.resolved} -> {now.resolved})"
    case = f.corpus_file
    if case is None or not Path(case).is_file():
        return None, "no corpus entry to bisect with"
    cov = now if now.callable else before
    job = Job(kind, i.target, i.pin, i.property, i.signature, Path(case), a[0], b[0], a[1], cov.callable, cov.source)
    if job.callable and not job.source:
        return None, f"{i.where} is a --callable without --source: no history to walk"
    return job, ""


def _short(rev: str) -> str:
    return rev[:12] if HEX40.fullmatch(rev) else rev


Runner = Callable[[list[str], Path, float], int]  # (maskfuzz arguments, log file, seconds) -> exit code


def subprocess_runner(args: list[str], log: Path, seconds: float) -> int:
    """Runs `maskfuzz ARGS` in a child process, its output into `log`; 124 when it runs past `seconds`."""
    cli = __name__.rsplit(".", 1)[0] + ".cli"
    with open(log, "w", encoding="utf-8") as out:
        try:
            return subprocess.run(
                [sys.executable, "-m", cli, *args], stdout=out, stderr=subprocess.STDOUT, timeout=seconds
            ).returncode
        except subprocess.TimeoutExpired:
            out.write(f"\nmaskfuzz bisect ran past {seconds:.0f} s and was stopped\n")
            return 124


def run(
    jobs: Iterable[Job],
    out_dir: Path,
    runner: Runner = subprocess_runner,
    *,
    call_timeout: float = 60.0,
    job_timeout: float = 1800.0,
    say: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True),
) -> list[Result]:
    """Run each job (`runner`), writing `out_dir/<job>.json` and `.log`; one Result per job, in order."""
    out_dir.mkdir(parents=True, exist_ok=True)
    results = []
    jobs = list(jobs)
    for n, job in enumerate(jobs, 1):
        js, log = out_dir / f"{job.name}.json", out_dir / f"{job.name}.log"
        js.unlink(missing_ok=True)
        say(f"bisect [{n}/{len(jobs)}] {job.kind} of {job.target}@{job.pin} {job.property}: {job.old} .. {job.new}")
        started = time.monotonic()
        code = runner(job.argv(js, call_timeout), log, job_timeout)
        res = read_result(job, js, log, code, time.monotonic() - started)
        say(f"  -> {res.status}: {res.summary}")
        results.append(res)
    return results


def read_result(job: Job, js: Path, log: Path, code: int, seconds: float) -> Result:
    """A Result from the bisect JSON (or, without one, from the exit code and the log's last line)."""
    try:
        d = json.loads(js.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        last = _last_line(log)
        why = f"ran past its time limit ({last})" if code == 124 else f"exit {code}: {last}"
        return Result(job, "error", f"no result: {why}", seconds=seconds, log_path=log)
    res = Result(
        job,
        d.get("result", "error"),
        "",
        evaluations=int(d.get("evaluations") or 0),
        skips=int(d.get("skips") or 0),
        revisions=int(d.get("revisions") or 0),
        seconds=float(d.get("seconds") or seconds),
        json_path=js,
        log_path=log,
    )
    if res.status == "found":
        c = d.get("commit") or d.get("version") or {}
        res.revision = {k: c.get(k, "") for k in ("id", "date", "subject")}
        what = {CAUSE: "introduced", FIX: "fixed", BEHAVIOUR: f"{job.property} changed"}[job.kind]
        res.summary = f"{what} by {_short(res.revision['id'])}" + "".join(
            f" {x}" for x in (res.revision["date"][:10], res.revision["subject"]) if x
        )
    else:
        old, new = (d.get("old") or {}).get("verdict"), (d.get("new") or {}).get("verdict")
        res.summary = str(d.get("reason") or res.status)
        if res.status == "no-change" and job.kind == CAUSE and old == "bad":
            res.summary = "already fails at the previous night's revision: tonight's examples found an older bug"
        elif res.status == "no-change" and job.kind == FIX and new == "bad":
            res.summary = "still fails at tonight's revision with this case: the fuzzer did not re-find it"
        if d.get("candidates"):
            res.summary += f" ({len(d['candidates'])} candidate {job.unit}s)"
    return res


def _last_line(log: Path) -> str:
    try:
        lines = [x for x in log.read_text(encoding="utf-8", errors="replace").splitlines() if x.strip()]
    except OSError:
        return "no log"
    return lines[-1][:300] if lines else "no output"

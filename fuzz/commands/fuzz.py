"""`maskfuzz fuzz`: fuzz targets (or a user's function) and report the shrunk findings.

    maskfuzz fuzz [TARGET[:ENTRY][@PIN] ...]
                  [--callable MODULE:FUNC[@REV] [--source REPO] --contract compressed|dense|segment]
                  [--max-examples N] [--budget SECONDS] [--seed N] [--profile dev|ci|nightly]
                  [--json PATH] [--junit PATH] [--corpus DIR] [--repo NAME=PATH ...] [--jobs N]

With no target and no --callable it fuzzes the default set: every registered release pin marked
default (no git access needed). A --callable is imported from the working directory or PYTHONPATH,
or with --source from a git repository at REV (default HEAD: a moving pin, resolved to its commit
when the run starts). Exit code 1 when there are defects (findings that break a promise), 0 when none, 2 on usage or
set-up errors.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

from maskfuzz.fuzz import profiles
from maskfuzz.fuzz.cli import UsageError, require_device
from maskfuzz.fuzz.commands.argtypes import positive_float, positive_int
from maskfuzz.fuzz.commands.preflight import missing_pins
from maskfuzz.fuzz.job_result import JobResult, RunResult
from maskfuzz.fuzz.profiles import run_share
from maskfuzz.oracles.declared import DEFAULT_KIND
from maskfuzz.oracles.kinds import properties as kind_properties
from maskfuzz.oracles.kinds.gae.reference import CONTRACTS
from maskfuzz.oracles.kinds.judge import NEEDS_REFERENCE, NOT_PROMISED
from maskfuzz.oracles.strategies import Sizes
from maskfuzz.targets.runtime.repos import parse_repos

FIRST_RUN_BUDGET = 60.0  # seconds of fuzzing, split across the first-run entries (`maskfuzz fuzz` alone)
FIRST_RUN_SIZES = Sizes(8, 64)  # the first run's batches: every layout and poison still drawn, shrunk fast


def register(sub) -> None:
    p = sub.add_parser(
        "fuzz",
        help="fuzz targets and report shrunk findings",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("targets", nargs="*", metavar="TARGET[:ENTRY][@PIN]")
    p.add_argument(
        "--callable",
        dest="callables",
        action="append",
        default=[],
        metavar="MODULE:FUNC",
        help="fuzz your own function with the canonical keyword signature (repeatable)",
    )
    p.add_argument(
        "--contract",
        choices=CONTRACTS,
        default="compressed",
        help="the contract a --callable intends (default: compressed)",
    )
    p.add_argument(
        "--source",
        metavar="REPO",
        help="the git repository a --callable is imported from, at the @REV of --callable (default HEAD)",
    )
    p.add_argument(
        "--profile", choices=tuple(profiles.PROFILES), help="dev (default), ci or nightly; or MASKFUZZ_PROFILE"
    )
    p.add_argument("--max-examples", type=positive_int, help="examples per target (overrides the profile)")
    p.add_argument(
        "--budget",
        type=positive_float,
        help="seconds of fuzzing for the whole run, split evenly across the entries (each gets budget x jobs / "
        f"entries; triage adds to it); overrides the profile. Default with no target: {FIRST_RUN_BUDGET:g}",
    )
    p.add_argument(
        "--all",
        dest="all_entries",
        action="store_true",
        help="with no target: every entry of every framework at the default pins (the default is the first-run set: "
        "at each framework's newest default release, its GAE or PPO-trainer entry, GRPO advantage and policy loss)",
    )
    p.add_argument(
        "--discovered",
        action="store_true",
        help="only the variants discovered at the pins of the frameworks named whole (with no target: every default "
        "pin) that no hand-written entry runs; the hand-written entries are left out",
    )
    p.add_argument("--seed", type=int, help="Hypothesis seed (default 0; the nightly profile uses the date, YYYYMMDD)")
    p.add_argument("--scale", action="store_true", help="draw up to 64 x 4096 instead of 16 x 256")
    p.add_argument("--no-nonfinite", action="store_true", help="draw no NaN / inf poison")
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    p.add_argument(
        "--timeout", type=positive_float, default=60.0, help="seconds one target call may take (a hang verdict)"
    )
    p.add_argument("--repo", action="append", default=[], metavar="NAME=PATH", help="local clone or mirror of a target")
    p.add_argument("--json", type=Path, help="write the results as JSON")
    p.add_argument("--junit", type=Path, help="write a JUnit XML report (a test per target x property)")
    p.add_argument("--corpus", type=Path, help="save every new finding to this corpus directory")
    p.add_argument(
        "--jobs", type=positive_int, help="fuzz this many targets in parallel processes (default: the CPU count)"
    )
    p.add_argument(
        "--option",
        dest="options",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="run every case with this framework option (VALUE as JSON, else a string; repeatable); "
        "`maskfuzz targets` lists each entry's options",
    )
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.set_defaults(func=main)


@dataclass
class Job:
    """One target to fuzz, with everything a separate process needs to do it."""

    label: str  # "verl@0.4.1" or "MODULE:FUNC"
    is_callable: bool
    contract: str
    repos: dict
    max_examples: int
    budget: float | None
    seed: int
    derandomize: bool
    scale: bool
    nonfinite: bool
    device: str
    timeout: float
    corpus: str | None
    quiet: bool
    extra: dict = field(default_factory=dict)
    source: str | None = None  # a --callable's git repository (--source)
    small: bool = False  # the first run: batches up to FIRST_RUN_SIZES (faster examples, faster shrinking)
    options: dict | None = None  # --option: the framework options every case runs with (None: drawn)


def main(args) -> int:
    try:
        repos = parse_repos(args.repo)
        profile = profiles.select(args.profile)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    require_device(args.device)
    _check_callables(args.callables, args.source)
    if args.all_entries and (args.targets or args.callables):
        raise UsageError("--all is for a run without targets (every entry at the default pins); name entries instead")
    if args.discovered and (args.callables or any(":" in t.partition("@")[0] for t in args.targets)):
        raise UsageError(
            "--discovered reads the variants of frameworks named whole (e.g. verl@0.9.1, or no target for every "
            "default pin); it takes no entry and no --callable"
        )
    first_run = not (args.targets or args.callables or args.all_entries or args.discovered or profile.name == "nightly")
    labels = resolve_labels(args.targets, args.callables, repos, first_run=first_run)
    left_out = _left_out(labels) if first_run else []
    fixed = _parse_options(args.options)
    if args.jobs is None:
        args.jobs = os.cpu_count() or 1
    if first_run and args.budget is None and args.max_examples is None:
        args.budget = FIRST_RUN_BUDGET
    if args.seed is None:  # a nightly run draws new cases each night, reproducibly
        args.seed = int(time.strftime("%Y%m%d")) if profile.name == "nightly" else 0
    max_examples = args.max_examples if args.max_examples is not None else profile.max_examples
    _check_outputs(args.json, args.junit, args.corpus)
    named = [(label.partition("@")[0].split(":")[0], label.partition("@")[2]) for label in labels
             if label not in args.callables and args.targets]  # fmt: skip
    problems = missing_pins(named, repos)
    if problems:
        raise UsageError("no such pin, nothing was run:\n  " + "\n  ".join(problems))
    # variants the frameworks register at each pin asked for whole (not the first run: its budget is fixed)
    discovered = {} if first_run else _discover(args.targets, args.callables, repos)
    found_labels = [label for found in discovered.values() for label in found.get("labels", [])]
    if args.discovered:  # no hand-written entry is left to report a pin that could not be read: say it here
        unread = [f"{k}: {v['error']}" for k, v in discovered.items() if v.get("error")]
        if unread or not found_labels:
            raise UsageError(
                "--discovered: nothing was run: "
                + ("; ".join(unread) if unread else "no variant without a hand-written entry at these pins (or no "
                   "framework named has a discover module)")
            )  # fmt: skip
        labels = []
    labels += [label for label in found_labels if label not in labels]
    # a budget (--budget, else the profile's) is the run's: each entry gets its share of the workers' time (at least a
    # second), so a night's wall time is its budget whatever the number of entries the pins register
    run_budget = args.budget if args.budget is not None else profile.budget
    budget = run_share(run_budget, args.jobs, len(labels)) if run_budget is not None else None
    results_dir = None
    if args.json is None and args.corpus is None:  # results always land where the user can act on them
        results_dir = Path.cwd() / "maskfuzz-results" / time.strftime("%Y%m%d-%H%M%S")
        args.json, args.corpus = results_dir / "results.json", results_dir / "corpus"
    jobs = [
        Job(
            label,
            label in args.callables,
            args.contract,
            {k: str(v) for k, v in repos.items()},
            max_examples,
            budget,
            args.seed,
            profile.derandomize,
            args.scale,
            not args.no_nonfinite,
            args.device,
            args.timeout,
            str(args.corpus) if args.corpus else None,
            args.quiet,
            source=str(Path(args.source).expanduser().resolve()) if args.source else None,
            small=first_run and not args.scale,
            options=fixed,
        )
        for label in labels
    ]
    _say(
        f"maskfuzz fuzz: {len(jobs)} target(s), profile {profile.name}, up to {max_examples} examples each"
        + (f", {budget:.0f} s of fuzzing each" if budget else "")
        + (f" ({run_budget:g} s over {args.jobs} job(s))" if run_budget is not None else "")
        + f", seed {args.seed}, {args.jobs} job(s)"
        + (f" (the first-run set, batches up to {FIRST_RUN_SIZES.max_b} x {FIRST_RUN_SIZES.max_t}; --all for every "
           "entry)" if first_run else "")
    )
    started = time.monotonic()
    results, left = _run_all(jobs, args.jobs, started)
    interrupted = bool(left)
    elapsed = time.monotonic() - started
    print(summary_table(results))
    print(framework_summary(results, results_dir))
    if interrupted:
        _say(f"interrupted after {elapsed:.1f} s: {len(results)} of {len(jobs)} target(s) finished; not run: "
             + ", ".join(left[:12]) + (f" and {len(left) - 12} more" if len(left) > 12 else ""))  # fmt: skip
    else:
        _say(f"done in {elapsed:.1f} s")
    run = RunResult(profile.name, args.seed, round(elapsed, 2), tuple(results), discovered, interrupted, tuple(left))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(run.to_json(), indent=1, allow_nan=True) + "\n")
        _say(f"wrote {args.json}")
    if args.junit:
        from maskfuzz.fuzz.junit import write_junit

        write_junit(run, args.junit)
        _say(f"wrote {args.junit}")
    _next_steps(results, results_dir, args.corpus)
    if left_out:
        _say(f"left out: {len(left_out)} more entries of the default pins ({_by_framework(left_out)}); "
             "`maskfuzz fuzz --all` covers every one")  # fmt: skip
    if interrupted:
        return 130
    if any(r.status == "error" for r in results):
        return 2
    return 1 if run.defects else 0


def _check_outputs(json_path: Path | None, junit: Path | None, corpus: Path | None) -> None:
    """Where the results go must be writable as asked before minutes of fuzzing (a --corpus that is a file
    once failed to save every finding at the end)."""
    for flag, path in (("--json", json_path), ("--junit", junit)):
        if path is not None and path.is_dir():
            raise UsageError(f"{flag} {path}: is a directory (expected a file path to write)")
    if corpus is not None and corpus.exists() and not corpus.is_dir():
        raise UsageError(f"--corpus {corpus}: exists and is not a directory (expected a corpus directory)")
    for flag, path in (("--json", json_path), ("--junit", junit), ("--corpus", corpus)):
        if path is None:
            continue
        parent = next((p for p in path.parents if p.exists()), None)  # an existing file is overwritten
        if parent is not None and (not parent.is_dir() or not os.access(parent, os.W_OK)):
            raise UsageError(f"{flag} {path}: cannot create it under {parent} (not a writable directory)")


def _run_all(jobs: list[Job], workers: int, started: float) -> tuple[list[JobResult], list[str]]:
    """Run every job (in `workers` processes), saying entries done / total and the time left after each.
    Returns the results in job order and the labels not run: on Ctrl-C what finished is kept (the caller
    writes it), and the rest is named."""
    done: dict[int, JobResult] = {}

    def tick(i: int, result: JobResult) -> None:
        done[i] = result
        spent = time.monotonic() - started
        left = spent / len(done) * (len(jobs) - len(done))
        status = "ran" if result.ran else result.status
        _say(f"[{len(done)}/{len(jobs)} entries, {spent:.0f} s, about {left:.0f} s left] {jobs[i].label}: {status}")

    try:
        if workers > 1 and len(jobs) > 1:
            with ProcessPoolExecutor(max_workers=workers) as pool:
                futures = {pool.submit(run_job, job): i for i, job in enumerate(jobs)}
                try:
                    for fut in as_completed(futures):
                        tick(futures[fut], fut.result())
                except KeyboardInterrupt:
                    pool.shutdown(wait=False, cancel_futures=True)
                    raise
        else:
            for i, job in enumerate(jobs):
                tick(i, run_job(job))
    except KeyboardInterrupt:
        pass
    return [done[i] for i in sorted(done)], [j.label for i, j in enumerate(jobs) if i not in done]


def _next_steps(results: list[JobResult], folder: Path | None, corpus: Path | None) -> None:
    """The last lines: where the results are and the commands that act on them."""
    if folder is not None:
        _say(f"results: {folder} (results.json, corpus/)")
    files = [(r, f) for r in results for f in r.findings if f.corpus_file]
    if not files:
        return
    r, f = min(files, key=lambda rf: ({"high": 0, "medium": 1, "low": 2}.get(rf[1].severity, 3), rf[1].shape))
    out = (folder or Path(".")) / "repro" / Path(f.corpus_file).stem
    if r.callable:  # repro imports it from where fuzz did (the working directory) or its --source
        where = f"--source {r.source}" if r.source else f"--path {Path.cwd()}"
        how = f"--callable {r.callable} --contract {r.contract or 'compressed'} {where}"
    else:
        how = "--target " + r.label
    _say(f"next: maskfuzz repro {f.corpus_file} {how} -o {out}")
    _say(f"      maskfuzz replay {corpus}")


def _parse_options(items: list[str]) -> dict | None:
    """--option NAME=VALUE ... as a dict (VALUE parsed as JSON, else kept as a string); None: none given."""
    if not items:
        return None
    out = {}
    for item in items:
        name, sep, raw = item.partition("=")
        if not sep or not name:
            raise UsageError(
                f"--option {item!r}: expected NAME=VALUE, e.g. --option algorithm.norm_adv_by_std_in_grpo=false"
            )
        try:
            out[name] = json.loads(raw)
        except json.JSONDecodeError:
            out[name] = raw
    return out


def _check_options(declared, options: dict) -> None:
    """--option against the target's option space: SetupError naming the space when it is not in it."""
    from maskfuzz.oracles.case import CaseError
    from maskfuzz.oracles.options import resolve
    from maskfuzz.targets.runtime.session import SetupError

    try:
        resolve(tuple(declared.options), options)
    except CaseError as exc:
        raise SetupError(f"--option: {exc}; `maskfuzz targets` lists each entry's options") from None


def _check_callables(callables: list[str], source: str | None) -> None:
    if source and not callables:
        raise UsageError("--source is the git repository of a --callable: give --callable MODULE:FUNC[@REV] too")
    if source and not Path(source).expanduser().is_dir():
        raise UsageError(f"--source {source}: no such directory (expected a git clone or mirror)")
    for c in callables:
        if "@" in c and not source:
            raise UsageError(f"--callable {c}: @REV needs --source REPO (the git repository to take REV from)")


def _version_key(rev: str) -> tuple:
    """'0.9.1' -> (0, 9, 1): release pins ordered by their numbers ('0.11.4' after '0.9.1')."""
    return tuple(int(x) for x in re.findall(r"\d+", rev))


def _left_out(labels: list[str]) -> list[str]:
    """Every entry at the default pins that a first run (`labels`) does not cover."""
    every = resolve_labels([], [], {})
    return [x for x in every if x not in set(labels)]


def _by_framework(labels: list[str]) -> str:
    counts: dict[str, int] = {}
    for x in labels:
        fw = x.split("@")[0].split(":")[0]
        counts[fw] = counts.get(fw, 0) + 1
    return ", ".join(f"{fw} {n}" for fw, n in counts.items())


def resolve_labels(targets: list[str], callables: list[str], repos: dict, first_run: bool = False) -> list[str]:
    """The entries to fuzz: each TARGET[:ENTRY][@PIN] (a framework alone means all its entries); with no
    target every entry at the default pins, or with `first_run` each framework's first-run entries there."""
    from maskfuzz.targets.registry import registry
    from maskfuzz.targets.runtime.session import RefError, parse_ref

    specs = registry()
    if not targets and not callables:
        if first_run:  # the newest default release of each framework, its first-run entries
            return [
                f"{spec.id}{'' if e == spec.entries[0] else ':' + e}@{newest}"
                for spec in specs.values()
                if spec.default_pins
                for newest in [max((p.rev for p in spec.default_pins), key=_version_key)]
                for e in spec.first_run_entries
            ]
        targets = [f"{spec.id}@{pin.rev}" for spec in specs.values() for pin in spec.default_pins]
    labels = []
    for text in targets:
        try:
            ref = parse_ref(text)
        except RefError as exc:
            raise UsageError(str(exc)) from None
        if ":" in text.partition("@")[0]:
            labels.append(str(ref))
            continue
        # a framework named without an entry means every entry of it (GAE and the other kinds)
        for i, entry in enumerate(specs[ref.target].entries):
            labels.append(f"{ref.target}{'' if i == 0 else ':' + entry}@{ref.pin}")
    return labels + list(callables)


def _discover(targets: list[str], callables: list[str], repos: dict) -> dict[str, dict]:
    """`target@pin` -> the variants its code registers there (`targets.discovery`, read after the code is
    acquired) and the labels of the discovered entries to fuzz, for every framework asked for whole (a target
    without an entry, or every default pin with no target). A pin whose code cannot be acquired gets its reason
    (its hand-written entries report the error)."""
    from maskfuzz.targets import discovery
    from maskfuzz.targets.registry import registry
    from maskfuzz.targets.runtime.acquire import AcquireError, acquire
    from maskfuzz.targets.runtime.session import RefError, parse_ref

    specs = registry()
    if callables and not targets:
        return {}
    if targets:
        asked = []
        for text in targets:
            if ":" in text.partition("@")[0]:
                continue  # an entry named: that entry alone
            try:
                ref = parse_ref(text)
            except RefError:
                continue
            asked.append((ref.target, ref.pin))
    else:
        asked = [(spec.id, pin.rev) for spec in specs.values() for pin in spec.default_pins]
    out: dict[str, dict] = {}
    for target, pin in dict.fromkeys(asked):
        if discovery.module_of(target) is None:
            continue
        key = f"{target}@{pin}"
        try:
            checkout = acquire(specs[target], pin, repos)
        except AcquireError as exc:
            out[key] = {"error": str(exc), "variants": [], "labels": []}
            continue
        variants = discovery.discover(target, checkout.root)
        out[key] = {
            "resolved": checkout.resolved,
            "variants": [v.to_json() for v in variants],
            "labels": [f"{target}:{e}@{pin}" for e in discovery.entries(variants)],
        }
        n = len(out[key]["labels"])
        _say(f"[{key}] discovered {len(variants)} registered variant(s) at {checkout.resolved}: {n} without a "
             "hand-written entry, fuzzed against invariants only")  # fmt: skip
    return out


def run_job(job: Job) -> JobResult:
    """Fuzz one target in this process and return its result (never raises for the target's sake: set-up
    problems become status 'error', an absent function 'skipped')."""
    from maskfuzz.fuzz.engine import fuzz_target
    from maskfuzz.fuzz.triage import triage
    from maskfuzz.targets.runtime.session import SetupError, Skip, open_callable, open_target

    ref_target, _, ref_pin = job.label.partition("@")
    # the result's fields as they become known (a frozen JobResult is made from them once, at the end)
    got: dict = {"target": job.label, "pin": ref_pin if not job.is_callable else "local", "notes": []}
    got["kind"], got["entry"] = _kind_of(job.label) if not job.is_callable else (DEFAULT_KIND, "")
    repos = {k: Path(v) for k, v in job.repos.items()}
    if job.is_callable:
        got.update(target=ref_target, callable=ref_target, contract=job.contract)
        if job.source:
            got["pin"], got["source"] = ref_pin or "HEAD", job.source
    try:
        if job.is_callable:
            root, resolved = _callable_checkout(job.source, ref_target, got["pin"]) if job.source else (None, None)
            opener = open_callable(ref_target, job.contract, job.device, job.timeout, path=root, resolved=resolved)
        else:
            opener = open_target(job.label, repos, job.device, job.timeout)
        with opener as handle:
            got["resolved"] = handle.resolved
            if not handle.declared.reference:  # a discovered variant: its kind's universal invariants only
                got["judged"] = "invariants only"
            got["where"] = handle.info.get("where", "")
            got["notes"] = list(handle.info.get("notes", []))
            restrictions = handle.declared.domain.restrictions()
            got["domain_restrictions"] = restrictions
            _say(
                f"[{job.label}] {handle.resolved}: {got['where']}"
                + (f" (not drawn: {', '.join(restrictions)})" if restrictions else "")
            )
            if job.options is not None:
                _check_options(handle.declared, job.options)
                got["fixed_options"] = job.options
            got["semantics"], got["card_tried"] = _card(handle, job), True
            progress = None if job.quiet else _progress_printer(job.label)
            result = fuzz_target(
                handle.run,
                handle.declared,
                target=ref_target,
                pin=got["pin"],
                resolved=handle.resolved,
                max_examples=job.max_examples,
                seed=job.seed,
                budget=job.budget,
                sizes=Sizes.scaled() if job.scale else FIRST_RUN_SIZES if job.small else Sizes(),
                nonfinite=job.nonfinite,
                device=job.device,
                progress=progress,
                derandomize=job.derandomize,
                options=job.options,
            )
            if result.findings:
                _say(f"[{job.label}] triage: root cause, reach and severity of {len(result.findings)} finding(s)")
            entry = handle.ref.entry if not job.is_callable else None
            defects = triage(result, handle.run, handle.declared, entry=entry, seed=job.seed)
            got["restarts"] = handle.run.restarts
    except Skip as exc:
        _say(f"[{job.label}] skipped: {exc.reason}")
        return _job_result(got, status="skipped", reason=exc.reason)
    except SetupError as exc:
        _say(f"[{job.label}] error: {exc}")
        return _job_result(got, status="error", reason=str(exc))
    got.update(
        defects=tuple(d.row() for d in defects),
        pipeline_declared=handle.declared.pipeline is not None,
        examples=result.examples,
        seconds=round(result.seconds, 2),
        checked=result.checked,
        failed=result.failed,
        first_failure_s=result.first_failure_s,
        information=result.info,
    )
    if handle.declared.options or handle.declared.truncation is not None:
        got["configuration"] = {
            "options": [o.to_json() for o in handle.declared.options],
            "truncation": None if handle.declared.truncation is None else handle.declared.truncation.to_json(),
            "options_checked": result.options_checked,
            "truncated_checked": result.truncated_checked,
            "interactions_checked": dict(sorted(result.interactions_checked.items())),
        }
    got["notes"] += result.notes
    got["facts"] = tuple(f.row() for f in result.facts)
    saved = _save_defects(defects, job, got["notes"]) if job.corpus else {}
    rows = []
    for finding in result.findings:
        rows.append(finding.row(saved.get(finding.mechanism) if finding.is_defect else None))
        what = (
            f"DEFECT {finding.property} ({finding.mechanism}, breaks {finding.promise.id}, reach {finding.reach}, "
            f"{finding.severity})"
            if finding.is_defect
            else f"{finding.fact.upper()} FACT {finding.property} ({finding.mechanism}: {finding.why_fact})"
        )
        _say(
            f"[{job.label}] {what}: {finding.verdict.message}; shrunk to B={finding.case.shape[0]} "
            f"T={finding.case.shape[1]}" + (f" -> {rows[-1].corpus_file}" if rows[-1].corpus_file else "")
        )
    return _job_result(got, findings=tuple(rows))


def _job_result(got: dict, **more) -> JobResult:
    return JobResult(**(got | more | {"notes": tuple(got["notes"])}))


def _save_defects(defects: list, job: Job, notes: list[str]) -> dict[str, str]:
    """One corpus entry per defect: its first finding (the property that names it), the other properties
    it explains in `also`. Returns mechanism -> the file. A defect that cannot be stored is still reported
    (with a note why)."""
    saved = {}
    for d in defects:
        head = d.findings[0]
        rep = dataclasses.replace(head, also=[p for p in d.properties if p != head.property])
        try:
            saved[d.mechanism] = _save(rep, Path(job.corpus))
        except Exception as exc:  # noqa: BLE001 - a finding that cannot be stored is still reported
            why = f"{type(exc).__name__}: {exc}"
            notes.append(f"{d.id}: not saved to the corpus: {why}")
            _say(f"[{job.label}] ERROR: the defect {d.id} could not be saved: {why}")
    return saved


def _card(handle, job: Job) -> dict | None:
    """The entry's semantics card (which variant its code implements, on clean cases), or None with a note
    when it cannot be inferred: a card is information, it never stops a fuzz job. Drawn with a fixed seed,
    whatever the night's: two nights' cards differ only where the code does."""
    from maskfuzz.fuzz.semantics import card

    try:
        return card(handle.run, handle.declared, job.label, seed=0).to_json()
    except Exception as exc:  # noqa: BLE001 - the card is a side dish: report why it is missing
        _say(f"[{job.label}] no semantics card: {type(exc).__name__}: {exc}")
        return None


def _callable_checkout(source: str, function: str, rev: str) -> tuple[Path, str]:
    """(worktree, full hash) of `rev` in a --callable's --source repository (cached like a target's clone)."""
    from maskfuzz.fuzz.bisect import BisectError
    from maskfuzz.fuzz.bisect_env import local_history
    from maskfuzz.targets.runtime import gitrepo
    from maskfuzz.targets.runtime.session import SetupError

    try:
        history = local_history(source, function.partition(":")[0].split(".")[0] or "callable")
        full = history.resolve(rev)
        return history.checkout(full), full
    except (BisectError, gitrepo.GitError) as exc:
        raise SetupError(f"--source {source} at {rev}: {exc}") from None


def _kind_of(label: str) -> tuple[str, str]:
    """(kind, entry name) of a registered TARGET[:ENTRY]@PIN label."""
    from maskfuzz.targets.registry import registry

    head = label.partition("@")[0]
    target, _, entry = head.partition(":")
    spec = registry().get(target)
    if spec is None:
        return DEFAULT_KIND, entry
    return spec.kind_of(entry or None), spec.entry_name(entry or None)


def _save(finding, root: Path) -> str:
    from maskfuzz.fuzz.corpus import record

    outcome = record(finding, root)
    return str(outcome.path)


def _progress_printer(label: str):
    state = {"last": 0.0}

    def show(result) -> None:
        now = time.monotonic()
        if now - state["last"] < 5.0:
            return
        state["last"] = now
        failing = sorted(p for p, n in result.failed.items() if n)
        _say(
            f"[{label}] {result.examples} examples"
            + (f", failing: {', '.join(failing)}" if failing else ", no failure yet")
        )

    return show


SHORT = {
    "no-crash": "crash",
    "poison-nonfinite": "nonfin",
    "poison": "poison",
    "score-kept": "score",
    "telescoping": "telesc",
    "all-trainable": "alltr",
    "gap-invariance": "gap",
    "row-independence": "rows",
    "masked-zero": "mzero",
    "deterministic": "determ",
    "reference": "ref",
    "pad-invariance": "pad",
    "permutation": "perm",
    "group-isolation": "groups",
    "affine": "affine",
    "twin": "twin",
    "split-invariance": "split",
    "empty-step": "empty",
    "clip-bound": "clip",
}


def framework_summary(results: list[JobResult], folder: Path | None = None) -> str:
    """The run's last block, read top-down: per framework its defects (promise, reach, severity and the command
    that reproduces each, most severe and pipeline first), its facts by kind, then what was skipped, each
    reason once."""
    rank = {"high": 0, "medium": 1, "low": 2}
    by: dict[str, list[JobResult]] = {}
    for r in results:
        by.setdefault(r.target.split("@")[0].split(":")[0], []).append(r)
    lines = ["", "Per framework:"]
    for fw, rs in by.items():
        ran = sum(r.ran for r in rs)
        pins = sorted({r.pin for r in rs})
        lines.append(f"{fw} ({', '.join(pins)}): {ran} of {len(rs)} entries ran")
        rows = []
        for r in rs:
            files = {f.defect: f.corpus_file for f in r.findings if f.corpus_file}
            for d in r.defects:
                where = files.get(d.id)
                out = (folder or Path(".")) / "repro" / Path(where).stem if where else None
                cmd = f"maskfuzz repro {where} --target {r.label} -o {out}" if where else f"maskfuzz fuzz {r.label}"
                rows.append((rank.get(d.severity, 3), d.reach != "pipeline", r.label, d, cmd))
        if rows:
            lines.append(f"  you are affected by {len(rows)} defect(s):")
            for _, _, label, d, cmd in sorted(rows, key=lambda x: x[:3]):
                lines.append(f"    {d.severity:<6} {d.reach:<8} {label}: breaks {d.promise_id} ({d.mechanism})")
                lines.append(f"           reproduce: {cmd}")
        else:
            lines.append("  no defect found")
        facts: dict[str, int] = {}
        for r in rs:
            for f in r.facts:
                facts[f.kind] = facts.get(f.kind, 0) + 1
        if facts:
            lines.append("  facts (no promise broken): " + ", ".join(f"{n} {k}" for k, n in sorted(facts.items())))
        reasons: dict[str, list[str]] = {}
        for r in rs:
            if not r.ran:
                text = r.reason.splitlines()[0] if r.reason else r.status
                text = text.split("): ", 1)[1] if "): " in text else text  # the label is said once, below
                reasons.setdefault(f"{r.status}: {text}", []).append(r.target.split("@")[0])
        for text, who in reasons.items():
            lines.append(f"  {len(who)} {'entry' if len(who) == 1 else 'entries'} {text[:200]} ({', '.join(who[:6])}"
                         + (f" and {len(who) - 6} more" if len(who) > 6 else "") + ")")  # fmt: skip
    return "\n".join(lines)


def summary_table(results: list[JobResult]) -> str:
    """target x property: failed/checked examples per cell ('-' never applicable); findings marked *."""
    width = max([len("target@pin")] + [len(r.target) for r in results]) + 2
    lines = ["", "Defects: the promise broken, root cause [reach, severity], the properties it explains, smallest case"]
    for r in results:
        for d in r.defects:
            b, t = d.shape
            lines.append(
                f"  {d.id}: breaks {d.promise_id} ({d.mechanism}) [{d.reach}, {d.severity}] "
                f"explains {', '.join(d.properties)}; B={b} T={t}"
            )
    if len(lines) == 2:
        lines.append("  none")
    facts = [f for r in results for f in r.facts]
    if facts:
        lines += ["", "Facts (no promise broken: semantics = the variant the code implements, robustness = input its "
                      "pipeline never builds)"]  # fmt: skip
        lines += [f"  {f.id}: {f.kind}: {f.evidence}" for f in facts]
    lines += ["", "Property findings (cells: failing/checked examples; * = shrunk finding)"]
    kinds = list(dict.fromkeys(r.kind for r in results))
    reasons: dict[str, int] = {}  # each reason once, below the table; a row names its number
    for kind in kinds:
        props = kind_properties(kind)
        head = "target@pin".ljust(width) + "status   examples " + " ".join(SHORT.get(p, p)[:9].rjust(9) for p in props)
        if len(kinds) > 1 or kind != DEFAULT_KIND:
            lines.append(f"kind {kind}:")
        lines += [head, "-" * len(head)]
        for r in (r for r in results if r.kind == kind):
            shown = "ran" if r.ran else "failed" if r.status == "error" else r.status
            row = r.target.ljust(width) + shown.ljust(9) + str(r.examples).rjust(8) + " "
            if not r.ran:
                text = r.reason.splitlines()[0] if r.reason else "(no reason given)"
                lines.append(row + f"reason {reasons.setdefault(text, len(reasons) + 1)}")
                continue
            found = {f.property for f in r.findings}
            cells = []
            for p in props:
                checked, failed = r.checked.get(p, 0), r.failed.get(p, 0)
                cell = "-" if not checked else f"{failed}/{checked}" + ("*" if p in found else "")
                if r.judged == "invariants only" and p in NEEDS_REFERENCE:
                    cell = "inv-only"  # no reference for the variant: not judged, never a pass
                if any(n.startswith(f"{NOT_PROMISED}{p}:") for n in r.notes):
                    cell = "not-prom"  # the variant's design does not promise it (the note says why)
                cells.append(cell.rjust(9))
            lines.append(row + " ".join(cells))
    unpromised = [(r.target, n) for r in results for n in r.notes if n.startswith(NOT_PROMISED)]
    if unpromised:
        lines += ["", "Not judged, by the variant's own design (not-prom):"] + [f"  {t}: {n}" for t, n in unpromised]
    if reasons:
        lines += ["", "Why those entries did not run:"] + [f"  reason {n}: {text}" for text, n in reasons.items()]
    n_find = sum(len(r.findings) for r in results)
    n_def = sum(len(r.defects) for r in results)
    n_fact = len(facts)
    n_skip = sum(r.status == "skipped" for r in results)
    n_err = sum(r.status == "error" for r in results)
    lines.append(
        f"{len(results)} target(s): {n_def} defect(s) and {n_fact} fact(s) from {n_find} property finding(s), "
        f"{n_skip} skipped, {n_err} error(s)"
    )
    return "\n".join(lines)


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)

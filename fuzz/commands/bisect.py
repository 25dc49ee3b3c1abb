"""`maskfuzz bisect CASE --old REV --new REV`: the first revision whose verdict on a corpus case differs.

`maskfuzz bisect --semantics DIMENSION --target T[:ENTRY] --old REV --new REV` bisects a behaviour
change instead (no case): the first revision where that dimension of the entry's semantics card
(`maskfuzz targets --semantics`) differs from its value at --old. A behaviour change is a fact about
the code, never a defect.

The case is judged (its property only) at `--old` and `--new`; when it passes at old and fails at
new the answer is the commit that caused the failure, when it fails at old and passes at new the
commit that fixed it. Revisions are git commits (a `--repo` clone or mirror, or the target's
upstream URL) or, for a target with releases and no `--repo`, its released versions between old
and new. A revision where the target cannot be set up, the function is missing or repeated runs
disagree is a skip; skips next to the answer make the result inconclusive with the candidate range.

Exit codes: 0 found, 1 inconclusive or no change, 2 usage / set-up error.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from maskfuzz.fuzz import corpus
from maskfuzz.fuzz.bisect import FIX, FOUND, INCONCLUSIVE, BisectError, BisectResult, Outcome, Revision, bisect
from maskfuzz.fuzz.commands.argtypes import positive_float, positive_int
from maskfuzz.fuzz.corpus_codec import CorpusError


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "bisect",
        help="find the commit or release that caused or fixed a corpus case's failure",
        description=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("case", metavar="CASE", nargs="?", help="a corpus file (JSON); none with --semantics")
    p.add_argument("--semantics", metavar="DIMENSION",
                   help="bisect a behaviour change: a dimension of the entry's semantics card (needs --target)")
    p.add_argument("--target", metavar="T[:ENTRY]", help="the target to bisect (default: the case's own target)")
    p.add_argument("--old", required=True, metavar="REV", help="the older end: commit, tag, branch or release version")
    p.add_argument("--new", required=True, metavar="REV", help="the newer end (must come after --old)")
    p.add_argument("--repo", action="append", default=[], metavar="NAME=PATH", help="local clone or mirror of a target")
    p.add_argument("--first-parent", action="store_true", help="follow first parents only (a merge is one step)")
    p.add_argument(
        "--runs", type=positive_int, default=1, metavar="N", help="judge each revision N times; disagreement is a skip"
    )
    p.add_argument("--json", metavar="PATH", help="write the result as JSON")
    p.add_argument("--property", metavar="P", help="the property to judge (default: the case's)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--releases", action="store_true", help="bisect released versions even with a --repo")
    mode.add_argument("--commits", action="store_true", help="bisect git commits even when old/new are versions")
    p.add_argument("--versions", metavar="V1,V2,...", help="the release list to use instead of asking the index")
    p.add_argument("--callable", metavar="MODULE:FUNC", help="bisect a function of your own instead of a target")
    p.add_argument("--source", metavar="PATH", help="with --callable: the git repository it is imported from")
    p.add_argument("--subdir", default="", metavar="DIR", help="with --callable: the folder of the repo on sys.path")
    p.add_argument("--contract", default="compressed", help="with --callable: compressed | dense")
    p.add_argument("--device", default="cpu")
    p.add_argument(
        "--timeout", type=positive_float, default=60.0, metavar="S", help="seconds one call of the target may take"
    )
    p.set_defaults(func=run)


def _usage(message: str) -> Exception:
    from maskfuzz.fuzz.cli import UsageError

    return UsageError(message)


def _load_case(path: str):
    try:
        return corpus.load(path)
    except CorpusError as exc:
        raise _usage(str(exc)) from None


def _split_target(text: str) -> tuple[str, str | None]:
    from maskfuzz.targets.runtime.session import RefError, parse_ref

    try:
        ref = parse_ref(text.split("@", 1)[0] + "@bisect")  # the pin is what we bisect: ignore it
    except RefError as exc:
        raise _usage(str(exc)) from None
    return ref.target, ref.entry


def setup(args, entry):
    """(history, evaluator, unit, description) for the arguments: git commits of a target, its
    releases, or a --callable function's repository."""
    from maskfuzz.fuzz import bisect_env
    from maskfuzz.targets.runtime.repos import parse_repos

    try:
        repos = parse_repos(args.repo)
    except ValueError as exc:
        raise _usage(str(exc)) from None

    if args.callable:
        from maskfuzz.oracles.declared import Declared

        if not args.source:
            raise _usage("--callable needs --source PATH (the git repository the function is imported from)")
        name = args.callable.partition(":")[0].split(".")[0] or "callable"
        history = bisect_env.CommitHistory(bisect_env.local_history(args.source, name))
        declared = Declared(contract=args.contract, own_inputs=True)
        evaluator = bisect_env.CallableEvaluator(
            entry,
            history.history,
            args.callable,
            declared,
            subdir=args.subdir,
            device=args.device,
            timeout=args.timeout,
        )
        return history, evaluator, "commit", f"{args.callable} in {args.source}"

    from maskfuzz.targets import registry
    from maskfuzz.targets.runtime import acquire

    target, target_entry = _split_target(args.target) if args.target else (entry.target, entry.entry_point)
    if target == "callable":
        raise _usage("this case was found on a --callable function: give --callable MODULE:FUNC --source REPO")
    try:
        spec = registry.get(target)
    except KeyError as exc:
        raise _usage(exc.args[0]) from None
    releases = args.releases or (
        not args.commits
        and spec.id not in repos
        and bool(spec.package)
        and acquire.is_version(args.old.removeprefix("=="))
        and acquire.is_version(args.new.removeprefix("=="))
    )
    if releases:
        if not spec.package:
            raise _usage(f"{spec.id} has no releases on PyPI; bisect commits with --repo {spec.id}=PATH")
        if args.versions:
            history = bisect_env.ReleaseHistory(args.versions.split(","), spec.package)
        else:
            ends = (args.old.removeprefix("=="), args.new.removeprefix("=="))
            pre = any(bisect_env.is_prerelease(v) for v in ends)
            history = bisect_env.ReleaseHistory.from_index(spec.package, pre=pre)
        args.old, args.new = args.old.removeprefix("=="), args.new.removeprefix("==")
        worktrees = None
        where = f"{spec.id} releases ({spec.package} on the package index)"
    else:
        try:
            cached = acquire.history(spec, repos)
        except acquire.AcquireError as exc:
            raise _usage(str(exc)) from None
        history = bisect_env.CommitHistory(cached)
        worktrees = bisect_env.Worktrees(cached)
        where = f"{spec.id} commits from {cached.source}"
    common = dict(
        target_entry=target_entry,
        repos=repos,
        releases=releases,
        device=args.device,
        timeout=args.timeout,
        worktrees=worktrees,
    )
    if getattr(args, "semantics", None):
        evaluator = bisect_env.SemanticsEvaluator(spec.id, args.semantics, **common)
    else:
        evaluator = bisect_env.TargetEvaluator(entry, spec.id, **common)
    return history, evaluator, "version" if releases else "commit", where


class _Entry:
    """The corpus entry with the property to judge replaced (`--property`)."""

    def __init__(self, entry, prop: str):
        self.case, self.property, self.target, self.entry_point = entry.case, prop, entry.target, entry.entry_point


def _line(rev: Revision) -> str:
    date = rev.date[:10] if rev.date else ""
    return " ".join(x for x in (rev.short(), date, rev.subject) if x)


def run(args) -> int:
    from maskfuzz.oracles.kinds import ALL_PROPERTIES as PROPERTIES

    if args.runs < 1:
        raise _usage(f"--runs must be at least 1, got {args.runs}")
    if args.semantics:
        from maskfuzz.oracles.kinds import KINDS
        from maskfuzz.oracles.kinds.semantics import MASKED, SCORE_TAIL

        known = sorted({d for k in KINDS.values() for d in k.dimensions} | {MASKED, SCORE_TAIL})
        if args.case or args.callable or args.property:
            raise _usage("--semantics bisects a card's dimension: give no CASE, --callable or --property")
        if not args.target:
            raise _usage("--semantics needs --target T[:ENTRY] (the entry whose card changed)")
        if args.semantics not in known:
            raise _usage(f"unknown semantics dimension {args.semantics!r}; known: {', '.join(known)}")
        entry, prop, what = None, args.semantics, f"semantics dimension {args.semantics!r}"
    else:
        if not args.case:
            raise _usage(
                "give a CASE (a corpus file), or --semantics DIMENSION --target T to bisect a behaviour change"
            )
        entry = _load_case(args.case)
        prop = args.property or entry.property
        if prop not in PROPERTIES:
            raise _usage(f"unknown property {prop!r}; known: {', '.join(PROPERTIES)}")
        entry = _Entry(entry, prop)
        what = f"property {prop}, case {args.case}"
    try:
        history, evaluator, unit, where = setup(args, entry)
    except BisectError as exc:
        raise _usage(str(exc)) from None

    print(f"bisecting {where}: {args.old} .. {args.new}, {what}", flush=True)
    warnings = []
    if not args.first_parent and hasattr(history, "merges"):
        try:
            n_merges = history.merges(args.old, args.new)
        except BisectError as exc:
            raise _usage(str(exc)) from None
        if n_merges:
            warnings.append(
                f"the range holds {n_merges} merge commit(s): without --first-parent the commits of merged branches "
                "are bisected in date order, which assumes each branch behaves like the mainline around it; "
                "--first-parent always gives a consistent answer (the merge that brought the change)"
            )
    for w in warnings:
        print(f"warning: {w}", flush=True)
    count = [0]

    def progress(rev: Revision, out: Outcome) -> None:
        count[0] += 1
        why = f"  ({out.reason})" if out.reason and out.verdict != "good" else ""
        took = f"{out.seconds:6.2f} s ({out.cpu:5.2f} s cpu)"
        print(f"  [{count[0]:2d}] {out.verdict:<4} {took}  {_line(rev)}{why}"[:400], flush=True)

    try:
        result = bisect(
            history,
            evaluator,
            args.old,
            args.new,
            first_parent=args.first_parent,
            runs=args.runs,
            on_evaluated=progress,
        )
    except BisectError as exc:
        raise _usage(str(exc)) from None
    finally:
        close = getattr(evaluator, "close", None)
        if close:
            close()
    _summary(result, unit, args.semantics)
    if args.json:
        data = result.to_dict(unit) | {
            "case": str(args.case) if args.case else None,
            "semantics": args.semantics,
            "target": getattr(evaluator, "target", "callable"),
            "property": prop,
            "history": where,
            "first_parent": args.first_parent,
            "runs": args.runs,
            "warnings": warnings,
        }
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    return 0 if result.result == FOUND else 1


def _summary(result: BisectResult, unit: str, dimension: str | None = None) -> None:
    n = max(result.evaluations, 1)
    stats = (
        f"{result.evaluations} evaluations ({result.skips} skipped) over {result.revisions} {unit}s, "
        f"bound {result.bound()}; {result.seconds:.1f} s, {result.seconds / n:.2f} s per evaluation "
        f"({result.cpu / n:.2f} s cpu)"
    )
    if result.result == FOUND and dimension:
        print(f"first {unit} where {dimension} changed (a behaviour change, not a defect): {result.new_outcome.reason}")
    elif result.result == FOUND:
        what = "fixed" if result.kind == FIX else "caused"
        print(f"first {unit} where the case's verdict changed ({result.kind}; it {what} the failure):")
    if result.result == FOUND:
        c = result.commit
        print("  " + "  ".join(x for x in (c.id, c.date, c.subject) if x))
    elif result.result == INCONCLUSIVE:
        print(f"inconclusive ({result.kind or 'no baseline'}): {result.reason}")
        for rev in result.candidates[:50]:
            print(f"  candidate {_line(rev)}")
        if len(result.candidates) > 50:
            print(f"  ... and {len(result.candidates) - 50} more")
    else:
        print(f"no change: {result.reason}")
    print(stats)
    sys.stdout.flush()

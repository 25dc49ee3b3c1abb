"""`maskfuzz repro CASE --target T@PIN -o DIR`: a standalone reproducer and a maintainer report.

    maskfuzz repro CASE [--target T[:ENTRY][@PIN]] [--repo NAME=PATH] -o DIR [--bisect JSON]
    maskfuzz repro CASE --callable MODULE:FUNC [--path DIR | --source REPO] [--contract compressed|dense|segment] -o DIR

Writes DIR/repro.py (plain Python + torch: `python repro.py /path/to/checkout` exits 1 while the
bug reproduces, 0 once it is fixed) and DIR/report.md. The target defaults to the case's own
target, entry point and pin. Before keeping the script, maskfuzz runs it on the pin's checkout and
judges the case there itself: the two must agree, or nothing is written.

Exit codes: 0 written, and the case fails at the pin; 1 written, but the case does not fail at
this pin (the script shows it fixed there); 2 no reproducer (unsupported target or property, set-up
error, or a script that could not run or disagreed with the judge; the reason is printed).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from maskfuzz.fuzz import corpus
from maskfuzz.fuzz.commands.argtypes import positive_float
from maskfuzz.fuzz.corpus import LEDGER_NAME
from maskfuzz.fuzz.corpus_codec import CorpusError
from maskfuzz.fuzz.ledger import Ledger
from maskfuzz.oracles.kinds.gae.reference import CONTRACTS


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "repro",
        help="write a standalone reproducer script and a markdown report for a corpus case",
        description=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("case", metavar="CASE", help="a corpus file (JSON)")
    p.add_argument("--target", metavar="T[:ENTRY][@PIN]", help="the target and pin (default: the case's own)")
    p.add_argument("--callable", metavar="MODULE:FUNC", help="reproduce on a function of your own instead")
    p.add_argument("--path", type=Path, metavar="DIR", help="with --callable: the directory it is imported from")
    p.add_argument(
        "--source",
        type=Path,
        metavar="REPO",
        help="with --callable: the git repository it is imported from, at the commit the case records (else HEAD)",
    )
    p.add_argument("--contract", default="compressed", choices=CONTRACTS, help="with --callable")
    p.add_argument("--repo", action="append", default=[], metavar="NAME=PATH", help="local clone or mirror of a target")
    p.add_argument("-o", "--out", required=True, type=Path, metavar="DIR", help="where repro.py and report.md go")
    p.add_argument("--bisect", type=Path, metavar="JSON", help="a `maskfuzz bisect --json` result for the report")
    p.add_argument("--device", default="cpu", help="run the check on cpu (default) or cuda")
    p.add_argument("--no-judge", action="store_true", help="do not cross-check the script with maskfuzz's judge")
    p.add_argument("--timeout", type=positive_float, default=600.0, metavar="S", help="seconds the script may take")
    p.set_defaults(func=run)


def _usage(message: str) -> Exception:
    from maskfuzz.fuzz.cli import UsageError

    return UsageError(message)


def run(args: argparse.Namespace) -> int:
    from maskfuzz.fuzz import repro as rp
    from maskfuzz.fuzz.cli import require_device

    require_device(args.device)
    args.out = args.out.resolve()  # the script runs inside it: a relative -o would be resolved twice
    try:
        entry = corpus.load(args.case)
    except CorpusError as exc:
        raise _usage(str(exc)) from None
    try:
        bisect = rp.bisect_of(entry, args.bisect)
    except ValueError as exc:
        raise _usage(str(exc)) from None
    target, setup = _callable(args, entry) if args.callable else _registered(args, entry)
    try:
        plan = rp.make_plan(entry, target)  # before fetching any code: an unsupported target says so at once
    except rp.Unsupported as exc:
        print(f"maskfuzz repro: no reproducer for {entry.property} on {target.label}: {exc}", file=sys.stderr)
        return 2
    env, judge = setup()
    print(f"maskfuzz repro: {entry.property} on {target.label} ({env.resolved or env.root})", flush=True)
    try:
        written = rp.produce(
            plan, args.out, env, judge=None if args.no_judge else judge, bisect=bisect, device=args.device,
            timeout=args.timeout,
        )
    except rp.ReproFailed as exc:
        print(f"maskfuzz repro: {exc}", file=sys.stderr)
        return 2
    message = (written.run.data or {}).get("message", "")
    judged = f"; maskfuzz's judge agrees ({written.judged})" if written.judged else ""
    print(f"wrote {written.script} and {written.report}")
    print(f"at {target.label}: {written.status} ({message}){judged}")
    print(f"rerun: python {written.script} {env.root}")
    _upstream_test(entry, target, env, written, args.out)
    if written.status != "reproduced":
        print(f"note: the case does not fail at {target.label}; the script exits 0 there", file=sys.stderr)
        return 1
    return 0


def _upstream_test(entry, target, env, written, out: Path) -> None:
    """DIR/test_<target>_<defect>.py, the test a maintainer can drop into the framework's suite."""
    from maskfuzz.fuzz import upstream_test

    info = getattr(written, "info", None) or {}
    mechanism = info.get("mechanism") or (entry.triage or {}).get("mechanism")
    if not upstream_test.supported(entry.target) or not mechanism or not info.get("where"):
        why = "no recipe for this target" if not upstream_test.supported(entry.target) else "the case passes here"
        print(f"no upstream test: {why} (repro.py covers it)", file=sys.stderr)
        return
    fix_pin = _fix_pin(entry)
    try:
        text = upstream_test.render(
            entry.case, target.declared, target=entry.target, pin=target.pin, resolved=env.resolved or "",
            where=info["where"], mechanism=mechanism, prop=entry.property, fix_pin=fix_pin, entry_id=entry.id,
        )
    except ValueError as exc:
        print(f"no upstream test: {exc}", file=sys.stderr)
        return
    path = out / upstream_test.filename(entry.target, mechanism, entry.id)
    path.write_text(text)
    # a test of a defect must fail where the defect is: run it at the pin before keeping it
    checked = upstream_test.check(path, written.script, env.root, crash_ok=entry.property == "no-crash")
    if checked.status != "fails":
        rejected = path.with_suffix(".rejected")
        path.rename(rejected)
        print(
            f"no upstream test: the generated test {checked.status} at {target.label} instead of failing "
            f"(kept as {rejected} for inspection):\n{checked.detail}",
            file=sys.stderr,
        )
        return
    fixed = f"; the ledger says it passes at {fix_pin}" if fix_pin else ""
    print(f"wrote {path} (pytest, imports only torch and {entry.target}); it fails at {target.label}{fixed}")
    for line in checked.detail.splitlines()[:3]:
        print(f"  {line}")


def _fix_pin(entry) -> str | None:
    """A pin the corpus ledger records as fixed ("passes", "fixed by ...") for this entry."""
    path = getattr(entry, "path", None)
    if path is None:
        return None
    ledger_path = Path(path).resolve().parent.parent / LEDGER_NAME
    try:
        ledger = Ledger.load(ledger_path)
    except Exception:  # noqa: BLE001 - a ledger that cannot be read names no fix
        return None
    for written, exp in ledger.entries.get(entry.id, {}).items():
        key, _, pin = written.partition("@")
        if key == entry.key and exp.expect == "passes" and "fixed" in exp.reason.lower():
            return pin
    return None


def _registered(args, entry):
    """(TargetInfo, setup) for a registered target; setup() acquires the pin's code and returns
    (Environment, judge)."""
    from maskfuzz.fuzz import repro as rp
    from maskfuzz.targets import registry
    from maskfuzz.targets.runtime.acquire import AcquireError, acquire
    from maskfuzz.targets.runtime.repos import parse_repos
    from maskfuzz.targets.runtime.session import RefError, parse_ref

    try:
        repos = parse_repos(args.repo)
    except ValueError as exc:
        raise _usage(str(exc)) from None
    text = args.target or f"{entry.key}@{entry.pin}"
    try:
        ref = parse_ref(text)
        spec = registry.get(ref.target)
    except (RefError, KeyError) as exc:
        raise _usage(f"--target {text}: {exc}") from None
    target = rp.TargetInfo.from_spec(spec, ref.entry, ref.pin)

    def judge() -> tuple[str, dict]:
        from maskfuzz.oracles.kinds.dispatch import judge as judge_case
        from maskfuzz.targets.runtime.session import SetupError, Skip, open_target

        try:
            with open_target(ref, repos=repos, device=args.device) as handle:
                verdicts = judge_case(handle.run, entry.case, target.declared, args.device, only=(entry.property,))
                info = dict(handle.info)
                if any(v.failed for v in verdicts):
                    from maskfuzz.oracles.kinds.dispatch import diagnose

                    info["mechanism"] = diagnose(handle.run, entry.case, target.declared, entry.property).mechanism
        except (Skip, SetupError) as exc:
            return f"n/a ({exc})", {}
        return next(v.status for v in verdicts if v.property == entry.property), info

    def setup():
        try:
            checkout = acquire(spec, ref.pin, repos)
        except AcquireError as exc:
            raise _usage(str(exc)) from None
        return rp.Environment(checkout.root, checkout.resolved, checkout.kind, dict(checkout.info)), judge

    return target, setup


def _callable(args, entry):
    """(TargetInfo, setup) for --callable MODULE:FUNC imported from --path (default: the working directory)."""
    from maskfuzz.fuzz import repro as rp
    from maskfuzz.oracles.declared import Declared

    if ":" not in args.callable:
        raise _usage(f"--callable expects MODULE:FUNC, got {args.callable!r}")
    if args.path and args.source:
        raise _usage("give --path DIR or --source REPO, not both")
    resolved = None
    if args.source:
        root, resolved = _source_checkout(args.source, args.callable, entry)
    else:
        root = (args.path or Path.cwd()).resolve()
    if not root.is_dir():
        raise _usage(f"--path {root} is not a directory")
    declared = Declared(contract=args.contract, own_inputs=True)
    target = rp.TargetInfo.of_callable(args.callable, declared)
    env = rp.Environment(root, resolved, "git" if resolved else "local", {})

    def judge() -> str:
        from maskfuzz.oracles.kinds.dispatch import judge as judge_case
        from maskfuzz.targets.runtime.session import SetupError, open_callable

        try:
            with open_callable(args.callable, declared=declared, device=args.device, path=root) as handle:
                verdicts = judge_case(handle.run, entry.case, declared, args.device, only=(entry.property,))
        except SetupError as exc:
            return f"n/a ({exc})"
        return next(v.status for v in verdicts if v.property == entry.property)

    return target, lambda: (env, judge)


def _source_checkout(source: Path, function: str, entry) -> tuple[Path, str]:
    """(worktree, full hash) in `source` of the commit the case was found at (its `resolved`), else HEAD."""
    import re

    from maskfuzz.fuzz.bisect import BisectError
    from maskfuzz.fuzz.bisect_env import local_history
    from maskfuzz.targets.runtime import gitrepo

    rev = entry.resolved if entry.resolved and re.fullmatch(r"[0-9a-f]{40}", entry.resolved) else "HEAD"
    try:
        history = local_history(source, function.partition(":")[0].split(".")[0] or "callable")
        full = history.resolve(rev)
        return history.checkout(full), full
    except (BisectError, gitrepo.GitError) as exc:
        raise _usage(f"--source {source} at {rev}: {exc}") from None

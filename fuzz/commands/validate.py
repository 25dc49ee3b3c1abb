"""`maskfuzz validate CASE --target T@PIN -o DIR`: re-run a corpus finding on a real rollout.

    maskfuzz validate CASE [--target T[:ENTRY][@PIN]] [--repo NAME=PATH] -o DIR [--max-seeds N]

A tiny causal LM built in code (no download) generates real responses; the framework's own batch code at the
pin turns them into its batch; the case's masks are searched among those batches (the generation decides
every response length and mask); the fault enters at one named boundary (ROLL: the critic's values under the
mask, before compute_advantage) and the step's outputs are judged against maskfuzz's float64 reference. Where the
framework pads every row to the longest row of its step (SkyRL), the whole pool runs as the step, the fault only on
the matching rows, and those rows are judged.
Writes DIR/validation.json (the record: recipe, scenario, buggy vs reference outputs) and DIR/validation.md.
The target defaults to the case's own target, entry point and pin.

With --record the verdict is stored in the corpus file itself (`validation`: target, resolved pin, built,
reproduced, the verdict line, the hooked boundary, the date), at the case's own pin only: a reproduced
validation makes the finding `reach: pipeline (executed)` in replay and reports (`fuzz.evidence`), one that
did not reproduce or built nothing is shown beside its cited reach.

Exit codes: 1 reproduced (the masked value moves valid-token outputs off the reference), 0 not reproduced,
2 cannot run (no real-rollout path for the target, set-up error, no batch of the real path holds the case's
masks; the reason is printed).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from maskfuzz.fuzz.commands.argtypes import positive_float, positive_int


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "validate",
        help="re-run a corpus case on a real rollout through the framework's own batch code",
        description=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("case", metavar="CASE", help="a corpus file (JSON)")
    p.add_argument("--target", metavar="T[:ENTRY][@PIN]", help="the target and pin (default: the case's own)")
    p.add_argument("--repo", action="append", default=[], metavar="NAME=PATH", help="local clone or mirror of a target")
    p.add_argument("-o", "--out", required=True, type=Path, metavar="DIR", help="where validation.json / .md go")
    p.add_argument("--max-seeds", type=positive_int, default=64, metavar="N", help="generation seeds to search")
    p.add_argument("--timeout", type=positive_float, default=120.0, metavar="S", help="seconds a worker call may take")
    p.add_argument("--record", action="store_true", help="store the verdict in the corpus file (its own pin only)")
    p.set_defaults(func=run)


def _cannot(message: str) -> int:
    print(f"maskfuzz validate: cannot run: {message}", file=sys.stderr)
    return 2


def _today() -> str:
    from datetime import datetime, timezone

    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _store(entry, validation: dict) -> None:
    import dataclasses

    from maskfuzz.fuzz import corpus

    corpus.rewrite(dataclasses.replace(entry, validation=validation))
    print(f"recorded in {entry.path}: built {validation['built']}, reproduced {validation['reproduced']}")


def run(args: argparse.Namespace) -> int:
    from maskfuzz.fuzz import corpus, evidence
    from maskfuzz.fuzz import validate as val
    from maskfuzz.fuzz.cli import UsageError
    from maskfuzz.oracles.verdict import TargetFailure
    from maskfuzz.targets import registry
    from maskfuzz.targets.rollout.session import open_rollout
    from maskfuzz.targets.runtime.repos import parse_repos
    from maskfuzz.targets.runtime.session import RefError, SetupError, Skip, parse_ref

    try:
        entry = corpus.load(args.case)
        repos = parse_repos(args.repo)
    except (corpus.CorpusError, ValueError) as exc:
        raise UsageError(str(exc)) from None
    text = args.target or f"{entry.key}@{entry.pin}"
    try:
        ref = parse_ref(text)
    except RefError as exc:
        raise UsageError(f"--target {text}: {exc}") from None
    if ref.target != entry.target:
        raise UsageError(f"--target {text}: the case is a {entry.target} finding, not one of {ref.target}")
    if args.out.exists() and not args.out.is_dir():
        raise UsageError(f"-o {args.out}: exists and is not a directory")
    if args.record and (ref.pin != entry.pin or ref.entry != entry.entry_point):
        raise UsageError(f"--record: {text} is not the case's own {entry.key}@{entry.pin}; record at its pin only")
    declared = registry.get(ref.target).declared(ref.entry, ref.pin)
    print(f"maskfuzz validate: {entry.key}/{entry.property}-{entry.id} on {ref} (a real rollout)", flush=True)
    try:
        with open_rollout(ref, repos=repos, timeout=args.timeout) as rollout:
            print(f"  {ref} = {rollout.checkout.resolved}; searching the case's masks in real batches", flush=True)
            record = val.validate(entry, rollout, declared, max_seeds=args.max_seeds)
    except (SetupError, Skip) as exc:
        return _cannot(str(exc))
    except val.NotBuilt as exc:
        if args.record:
            _store(entry, evidence.not_built(str(ref), entry.resolved or entry.pin, str(exc), date=_today()))
        return _cannot(str(exc))
    except val.CannotValidate as exc:
        return _cannot(str(exc))
    except TargetFailure as exc:
        return _cannot(f"a worker failed ({exc.kind}): {exc}")
    args.out.mkdir(parents=True, exist_ok=True)
    json_path, md_path = args.out / "validation.json", args.out / "validation.md"
    json_path.write_text(json.dumps(val.jsonable(record), indent=2, allow_nan=False) + "\n")
    md_path.write_text(val.markdown(record))
    print(f"  {record['verdict']['line']}")
    print(f"wrote {json_path} and {md_path}")
    if args.record:
        _store(entry, evidence.stored(record, date=_today()))
    return 1 if record["verdict"]["reproduced"] else 0

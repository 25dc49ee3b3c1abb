"""`maskfuzz replay`: re-run corpus entries on their targets and compare with the ledger.

    maskfuzz replay [PATHS...] [--target T@PIN ...] [--repo NAME=PATH] [--device cpu|cuda]
                    [--dtype D] [--ledger FILE] [--json PATH]

Exit status: 0 every replay as expected (pass / xfail / skip / n/a), 1 a replay failed
unexpectedly, an expected failure passed ("fixed": strict, the ledger is out of date) or a replay
broke, 2 unreadable input (a corpus file, the ledger, or a usage error). Skips (no CUDA device,
a target that cannot be set up at a pin) do not fail the run but are listed loudly.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TextIO

from maskfuzz.fuzz import replay as rp
from maskfuzz.fuzz.cli import UsageError, require_device
from maskfuzz.fuzz.commands.preflight import missing_pins
from maskfuzz.fuzz.corpus import load_all
from maskfuzz.fuzz.corpus_codec import CorpusError, Entry
from maskfuzz.fuzz.ledger import Ledger
from maskfuzz.oracles.case import CaseError, dtype_name
from maskfuzz.targets.runtime.repos import parse_repos

DEFAULT_CORPUS = Path(__file__).resolve().parents[2] / "corpus"


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "replay",
        help="replay corpus entries on their targets (CPU or CUDA)",
        description=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "paths",
        nargs="*",
        metavar="PATH",
        help="corpus files or directories (default: ./corpus or the repository's corpus/)",
    )
    p.add_argument(
        "--target",
        action="append",
        default=[],
        metavar="T@PIN",
        help="replay the entries of target T at PIN instead of their recorded pins "
        "(repeatable; T:ENTRY@PIN for one entry point)",
    )
    p.add_argument(
        "--repo",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="local clone or mirror for a git target (also MASKFUZZ_REPOS)",
    )
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--dtype", help="re-run every case in this dtype (float32, bfloat16, float16, float64)")
    p.add_argument("--ledger", type=Path, help="the known-findings ledger (default: ledger.json at each corpus root)")
    p.add_argument("--json", dest="json_path", type=Path, metavar="PATH", help="write the results as JSON")
    p.set_defaults(func=execute)


def parse_target(text: str) -> tuple[str, str | None, str]:
    """'verl@0.4.1' -> ('verl', None, '0.4.1'); 'torchrl:vec@0.14.1' -> ('torchrl', 'vec', '0.14.1')."""
    from maskfuzz.targets.registry import ADAPTER_MODULES

    name, sep, pin = text.partition("@")
    target, _, entry_point = name.partition(":")
    if not sep or not pin or not target:
        raise UsageError(f"--target expects TARGET@PIN (e.g. verl@0.4.1), got {text!r}")
    if target not in ADAPTER_MODULES:
        raise UsageError(f"--target {text!r}: unknown target {target!r}; known: {', '.join(sorted(ADAPTER_MODULES))}")
    return target, entry_point or None, pin


def execute(
    args: argparse.Namespace,
    *,
    opener: rp.Opener | None = None,
    cuda_available: bool | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    out, err = out or sys.stdout, err or sys.stderr
    require_device(args.device, cuda_available)
    overrides = [parse_target(t) for t in args.target]
    try:
        repos = parse_repos(args.repo)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    try:
        dtype = dtype_name(args.dtype) if args.dtype else None
    except CaseError as exc:
        raise UsageError(f"--dtype: {exc}") from None
    paths = [Path(p) for p in args.paths] or [_default_corpus()]
    missing = [p for p in paths if not p.exists()]
    if missing:
        raise UsageError(f"no such file or directory: {', '.join(map(str, missing))}")

    entries, errors = load_all(paths)
    ledger, ledger_errors = _ledgers(args.ledger, entries)
    errors = errors + ledger_errors
    for e in errors:
        print(f"unreadable: {e}", file=err)
    if ledger_errors:  # without the ledger every expectation would be wrong: replay nothing
        entries = []

    problems = missing_pins([(target, pin) for target, _, pin in overrides], repos)
    if problems:
        raise UsageError("--target names no such pin, nothing was replayed:\n  " + "\n  ".join(problems))
    jobs = rp.plan(entries, ledger, overrides)
    for target, _, pin in overrides:
        if not any(e.target == target for e in entries):
            print(f"note: --target {target}@{pin}: no corpus entry of target {target} to replay", file=err)
    if not jobs and not errors:
        print(f"no corpus entries under {', '.join(map(str, paths))}", file=err)

    def progress(n: int, total: int, o: rp.Outcome) -> None:
        label = o.status.upper() if o.status in rp.BAD else o.status
        print(
            f"[{n}/{total}] {o.job.name} {o.dtype} on {o.device}: {label} ({o.seconds:.1f}s) {o.message[:160]}",
            file=err,
            flush=True,
        )

    outcomes = rp.replay(
        jobs,
        opener=opener,
        repos=repos,
        device=args.device,
        dtype=dtype,
        cuda_available=cuda_available,
        progress=progress,
    )
    code = rp.exit_code(outcomes, unreadable=len(errors))
    print(rp.summary(outcomes, errors, args.device), file=out)
    for target, pin in _unset_overrides(overrides, outcomes):  # the pin asked for does not exist here: as `fuzz`
        print(f"maskfuzz replay: error: --target {target}@{pin}: no replay could set it up (see the notes above)",
              file=err)  # fmt: skip
        code = 2
    if args.json_path:
        report = {
            "format": "maskfuzz-replay",
            "version": 1,
            "device": args.device,
            "dtype": dtype,
            "exit_code": code,
            "counts": rp.counts(outcomes),
            "unreadable": [
                {"path": str(e.path) if e.path else None, "field": e.field, "error": str(e)} for e in errors
            ],
            "results": [o.to_json() for o in outcomes],
        }
        args.json_path.parent.mkdir(parents=True, exist_ok=True)
        args.json_path.write_text(json.dumps(report, indent=2, allow_nan=False) + "\n", encoding="utf-8")
    return code


def _unset_overrides(overrides: list, outcomes: list[rp.Outcome]) -> list[tuple[str, str]]:
    """The --target TARGET@PIN whose every replay failed to set up (an unknown release or commit)."""
    bad = []
    for target, _, pin in overrides:
        mine = [o for o in outcomes if o.job.entry.target == target and o.job.pin == pin]
        if mine and all(o.status == "skip" and o.message.startswith("cannot set up") for o in mine):
            bad.append((target, pin))
    return bad


def _default_corpus() -> Path:
    here = Path("corpus")
    if here.is_dir():
        return here
    if DEFAULT_CORPUS.is_dir():
        return DEFAULT_CORPUS
    raise UsageError("no corpus given and neither ./corpus nor the repository's corpus/ exists")


def _ledgers(explicit: Path | None, entries: list[Entry]):
    """The ledger lookup for `plan`, and the ledgers that could not be read."""
    if explicit is not None:
        try:
            return Ledger.load(explicit), []
        except CorpusError as exc:
            return Ledger(), [exc]
    cache: dict[Path, Ledger] = {}
    errors: list[CorpusError] = []
    for e in entries:  # read each ledger now, so an unreadable one is reported before any replay
        try:
            rp.ledger_for(e, cache)
        except CorpusError as exc:
            if all(str(exc) != str(x) for x in errors):
                errors.append(exc)
    return (lambda e: rp.ledger_for(e, cache)), errors

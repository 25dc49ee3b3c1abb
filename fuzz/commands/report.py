"""`maskfuzz report`: one night's results as a matrix and a diff against the previous night.

    maskfuzz report RESULTS... -o DIR [--previous PREVIOUS...] [--repro-dir DIR ...] [--corpus DIR ...]

RESULTS are `maskfuzz fuzz --json` and `maskfuzz replay --json` files (recognised by content).
PREVIOUS are the previous night's `report.json` (preferred: it carries findings not checked for a
night forward) or its result files. Writes DIR/report.md, DIR/report.html (self-contained) and
DIR/report.json (tomorrow's --previous), and copies the corpus entry and reproducer
(`<repro dir>/<corpus id>/report.md`) of every listed open finding into DIR.

A finding is the same across nights when (target with entry point, pin as asked, property,
failure signature) match. Exit 0 when the report was written (findings or not); 2 when an input
cannot be read (the message names the file).

With --bisect, a finding new tonight (or fixed tonight) at a pin whose resolved revision moved since
the previous night (@main, @latest, a --callable's @HEAD) is bisected between the two revisions with
its corpus entry; the report names the commit or release (hash, subject, date) with the evaluations
used, and links the reproducer and upstream test. Bisection logs go to DIR/bisect/.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from maskfuzz.fuzz.cli import UsageError
from maskfuzz.fuzz.commands.argtypes import positive_float


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "report",
        help="nightly report: target x property matrix, new / still failing / fixed since the previous night",
        description=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("results", nargs="+", type=Path, metavar="RESULTS", help="fuzz / replay --json files")
    p.add_argument("-o", "--output", type=Path, required=True, metavar="DIR", help="where to write the report")
    p.add_argument(
        "--previous",
        nargs="+",
        type=Path,
        default=[],
        metavar="PREVIOUS",
        help="the previous night's report.json (or its fuzz / replay --json files)",
    )
    p.add_argument(
        "--repro-dir",
        action="append",
        type=Path,
        default=[],
        metavar="DIR",
        help="reproducers: DIR/<corpus id>/report.md (repeatable)",
    )
    p.add_argument(
        "--corpus",
        action="append",
        type=Path,
        default=[],
        metavar="DIR",
        help="corpus roots to find entries in when a recorded path does not resolve (repeatable)",
    )
    p.add_argument(
        "--bisect",
        action="store_true",
        help="bisect each finding new or fixed tonight at a pin that moved since the previous night "
        "(maskfuzz bisect between the two nights' resolved revisions; git pins use MASKFUZZ_REPOS or the upstream URL)",
    )
    p.add_argument(
        "--bisect-timeout",
        type=positive_float,
        default=1800.0,
        metavar="S",
        help="seconds one bisection may take (1800)",
    )
    p.add_argument("--quiet", action="store_true", help="do not print the markdown report")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from functools import partial

    from maskfuzz.fuzz import nightly_bisect
    from maskfuzz.fuzz.report import ReportInputError, write_report

    bisect = partial(nightly_bisect.run, job_timeout=args.bisect_timeout) if args.bisect else None
    if args.bisect and not args.previous:
        print("--bisect: no --previous night given, so nothing can be bisected", file=sys.stderr)
    try:
        doc, cmp = write_report(args.results, args.output, args.previous, args.repro_dir, args.corpus, bisect=bisect)
    except ReportInputError as exc:
        raise UsageError(f"unreadable input: {exc}") from None
    if not args.quiet:
        print((args.output / "report.md").read_text(encoding="utf-8"))
    print(
        f"wrote {args.output / 'report.md'}, report.html, report.json: {len(cmp.new)} new, {len(cmp.still)} still "
        f"failing, {len(cmp.fixed)} fixed, {len(cmp.unknown)} unknown",
        file=sys.stderr,
    )
    return 0

"""`maskfuzz targets`: every known target, its contract, entries and pins, and which pins are
available offline (already in the cache, or resolvable from a local --repo).

`maskfuzz targets --semantics T[:ENTRY]@PIN` (repeatable) prints instead the semantics card of each
entry (every entry of T without one): which variant its code implements at the pin, inferred on
clean cases (`oracles.kinds.semantics`). A card states facts, never defects.
"""

from __future__ import annotations

import argparse
import json
import shutil

from maskfuzz.fuzz.commands.argtypes import positive_int
from maskfuzz.targets import listing
from maskfuzz.targets.registry import registry
from maskfuzz.targets.runtime import cache as cachemod


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "targets",
        help="list known targets, their pins and what is available offline",
        description="List every registered target: contract, entries, pins (* = default fuzz set) and whether "
        "each pin's code is available without a network.",
    )
    p.add_argument("--repo", action="append", metavar="NAME=PATH", default=[],
                   help="a local clone or bare mirror for target NAME (repeatable; also MASKFUZZ_REPOS)")
    p.add_argument("--json", action="store_true", help="print the listing as JSON")
    p.add_argument("--verbose", "-v", action="store_true",
                   help="add each target's api and pipeline domains, options and truncation, with citations")
    p.add_argument("--semantics", action="append", default=[], metavar="T[:ENTRY]@PIN",
                   help="print the semantics card of the entry (every entry of T without one) at PIN (repeatable)")
    p.add_argument("--cases", type=positive_int, default=None, help="clean cases per card (default 32)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from maskfuzz.fuzz.cli import UsageError
    from maskfuzz.targets.runtime.repos import parse_repos

    try:
        repos = parse_repos(args.repo)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    known = registry()
    unknown = sorted(set(repos) - set(known))
    if unknown:
        names, targets = ", ".join(unknown), ", ".join(sorted(known))
        raise UsageError(f"--repo names unknown target(s) {names}; known targets: {targets}")
    if getattr(args, "semantics", None):
        return _semantics(args, repos)
    cache = cachemod.cache_dir()
    data = listing.rows(repos, cache, known)
    if args.json:
        print(json.dumps({"cache": str(cache), "targets": data}, indent=1))
    else:
        print(listing.render(data, cache, verbose=args.verbose, width=_columns()))
    return 0


def _columns() -> int:
    """The terminal's width (COLUMNS, else the terminal, else 100), never below 60."""
    return max(60, shutil.get_terminal_size((100, 24)).columns)


def _semantics(args: argparse.Namespace, repos: dict) -> int:
    """Open each entry named by --semantics and print (or --json) its card; 2 when one cannot be opened."""
    from maskfuzz.fuzz import semantics
    from maskfuzz.fuzz.cli import UsageError
    from maskfuzz.fuzz.commands.fuzz import resolve_labels
    from maskfuzz.targets.runtime.session import SetupError, Skip, open_target

    for text in args.semantics:
        if "@" not in text:
            raise UsageError(f"--semantics {text!r}: name the pin too, e.g. verl:grpo@0.9.1")
    labels = resolve_labels(args.semantics, [], repos)
    cards, problems = [], []
    for label in labels:
        try:
            with open_target(label, repos, "cpu", 60.0) as handle:
                c = semantics.card(handle.run, handle.declared, label, n=args.cases or semantics.CASES)
                cards.append(c.to_json() | {"resolved": handle.resolved})
                if not args.json:
                    print("\n".join(c.lines()) + f"\n  resolved: {handle.resolved}\n")
        except Skip as exc:
            problems.append(f"{label}: skipped: {exc.reason}")
        except SetupError as exc:
            problems.append(f"{label}: cannot set up: {exc}")
    if args.json:
        print(json.dumps({"semantics": cards, "problems": problems}, indent=1))
    for line in problems:
        print(line, file=__import__("sys").stderr)
    return 2 if problems and not cards else 0

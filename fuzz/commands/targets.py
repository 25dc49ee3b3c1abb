"""`maskfuzz targets`: every known target, its contract, entries and pins, and which pins are
available offline (already in the cache, or resolvable from a local --repo)."""

from __future__ import annotations

import argparse
import json

from maskfuzz.targets import cache as cachemod
from maskfuzz.targets import listing
from maskfuzz.targets.registry import registry


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
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from maskfuzz.fuzz.cli import UsageError
    from maskfuzz.fuzz.repos import parse_repos

    try:
        repos = parse_repos(args.repo)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    known = registry()
    unknown = sorted(set(repos) - set(known))
    if unknown:
        names, targets = ", ".join(unknown), ", ".join(sorted(known))
        raise UsageError(f"--repo names unknown target(s) {names}; known targets: {targets}")
    cache = cachemod.cache_dir()
    data = listing.rows(repos, cache, known)
    if args.json:
        print(json.dumps({"cache": str(cache), "targets": data}, indent=1))
    else:
        print(listing.render(data, cache))
    return 0

"""Markdown tables of the variants each framework registers, from `maskfuzz fuzz --json` results.

    maskfuzz fuzz verl@0.9.1 skyrl@0.3.1 ... --discovered --json found.json   # the variants without an entry
    python scripts/discovered_tables.py found.json [more.json ...] > tables.md

Reads the `discovered` block of each file (every variant the code registers at a target@pin: its name, kind,
citation, whether it can be called outside its trainer and why not, the hand-written entry that runs it) and the
results of the entries that ran. Prints a summary, one row per target@pin: variants found, how many had no entry
before (no hand-written entry runs them), how each was judged (invariants only, a reference, listed with the
reason), the examples judged and the defects of the variants that had no entry before; then one table per
target@pin, a row per variant. A variant a hand-written entry covers shows that entry's row where the files have
it. Everything comes from the JSON; nothing is judged here.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from kinds_tables import cell, defects_cell, facts_cell  # noqa: E402

from maskfuzz.targets.registry import get  # noqa: E402


def load(paths: list[Path]) -> tuple[dict[str, dict], dict[str, dict]]:
    """(target@pin -> its `discovered` block, label -> the entry's result) over every file."""
    found, results = {}, {}
    for p in paths:
        data = json.loads(p.read_text(encoding="utf-8"))
        if "targets" not in data:
            raise SystemExit(f"{p}: not a `maskfuzz fuzz --json` file (no 'targets')")
        found |= data.get("discovered") or {}
        results |= {t["target"] if "@" in t["target"] else f"{t['target']}@{t['pin']}": t for t in data["targets"]}
    if not found:
        raise SystemExit("no `discovered` block in these files: name frameworks whole (verl@0.9.1), e.g. with "
                         "`maskfuzz fuzz ... --discovered --json FILE`")  # fmt: skip
    return found, results


def _label(where: str, entry: str) -> str:
    target, _, pin = where.partition("@")
    first = get(target).entries[0]
    return f"{target}@{pin}" if entry == first else f"{target}:{entry}@{pin}"


def _judged(v: dict, result: dict | None) -> str:
    if v["covered_by"]:
        return f"reference: hand-written `{v['covered_by']}`"
    if not v["callable"] or (result and result.get("status") == "skipped"):
        reason = v["reason"] or (result or {}).get("reason", "")
        return f"listed, not fuzzed: {reason}"
    return "invariants only"


def _examples(result: dict | None) -> str:
    if result is None:
        return "in its entry's run"
    return str(result.get("examples", 0)) if result.get("status") == "ok" else result.get("status", "?")


def summary(found: dict[str, dict], results: dict[str, dict]) -> list[str]:
    lines = [
        "| target@pin (resolved) | variants | no entry before | fuzzed, invariants only | run by a hand-written "
        "entry | listed with the reason | examples judged (no entry before) | defects (no entry before) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for where, block in found.items():
        if block.get("error"):
            lines.append(f"| {cell(where)} | cannot be read: {cell(block['error'])} | | | | | | |")
            continue
        new, fuzzed, covered, listed, examples, defects = 0, 0, 0, 0, 0, 0
        for v in block["variants"]:
            if v["covered_by"]:
                covered += 1
                continue
            new += 1
            result = results.get(_label(where, v["entry"]))
            if not v["callable"] or (result or {}).get("status") == "skipped":
                listed += 1
            elif result is not None and result.get("status") == "ok":
                fuzzed += 1
                examples += result.get("examples", 0)
                defects += len(result.get("defects", []))
        resolved = block.get("resolved") or ""
        short = resolved[:9] if len(resolved) == 40 else resolved
        lines.append(f"| {cell(where)} ({cell(short)}) | {len(block['variants'])} | {new} | {fuzzed} | {covered} | "
                     f"{listed} | {examples} | {defects} |")  # fmt: skip
    return lines


def pin_table(where: str, block: dict, results: dict[str, dict]) -> list[str]:
    lines = [
        f"### {where} (resolved {block.get('resolved') or '?'})",
        "",
        "| entry | kind | registered at | judged | examples | defects: promise, mechanism [reach, severity] | facts |",
        "|---|---|---|---|---|---|---|",
    ]
    for v in block["variants"]:
        result = results.get(_label(where, v["covered_by"] or v["entry"]))
        at = f"`{v['at']}` `{v['function']}`" if v.get("function") else f"`{v['at']}`"
        ran = result is not None and result.get("status") == "ok"
        defects, facts = (defects_cell(result), facts_cell(result)) if ran else ("-", "-")
        lines.append(f"| `{cell(v['entry'])}` | {v['kind']} | {cell(at)} | {cell(_judged(v, result))} | "
                     f"{_examples(result)} | {cell(defects)} | {cell(facts)} |")  # fmt: skip
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", nargs="+", type=Path, help="`maskfuzz fuzz --json` files")
    args = ap.parse_args(argv)
    found, results = load(args.results)
    out = summary(found, results)
    for where, block in found.items():
        if not block.get("error"):
            out += ["", *pin_table(where, block, results)]
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())

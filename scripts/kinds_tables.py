"""Markdown tables of `maskfuzz fuzz --json` results, for docs/kinds/README.md.

    python scripts/kinds_tables.py RESULTS.json [RESULTS.json ...] [--title TEXT] > tables.md
    python scripts/kinds_tables.py RESULTS.json ... --framework verl > docs/kinds/verl.md

Prints, for every target entry of the results: its defects (the promise each breaks, mechanism,
reach, severity) apart from its facts (semantics or robustness); the counts by severity and reach
and by fact kind; and the semantics cards of the group-advantage entries side by side (the GRPO
family across frameworks). With --framework, one framework's page: its entries with the promises
they declare (from the registry), then its rows of each results file and its semantics cards.
Everything comes from the JSON and the declarations; nothing is judged here.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

GROUP_DIMS = ("std", "eps_place", "singleton", "empty_rows", "std_level", "estimator", "masked outputs")


def cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def load(paths: list[Path]) -> list[dict]:
    out = []
    for p in paths:
        data = json.loads(p.read_text(encoding="utf-8"))
        if "targets" not in data:
            raise SystemExit(f"{p}: not a `maskfuzz fuzz --json` file (no 'targets')")
        out += data["targets"]
    return out


def entry_rows(targets: list[dict]) -> list[str]:
    lines = [
        "| target@pin (resolved) | kind | examples | defects: promise, mechanism [reach, severity] | facts |",
        "|---|---|---|---|---|",
    ]
    for t in targets:
        label = t["target"] if "@" in t["target"] else f"{t['target']}@{t['pin']}"
        resolved = t.get("resolved") or ""
        short = resolved[:9] if len(resolved) == 40 else resolved
        if t["status"] != "ok":
            reason = (t.get("reason") or "").splitlines()[0][:160] if t.get("reason") else ""
            lines.append(f"| {cell(label)} | {t.get('kind', '')} | - | {t['status']}: {cell(reason)} | |")
            continue
        lines.append(
            f"| {cell(label)} ({cell(short)}) | {t.get('kind', '')} | {t.get('examples', 0)} | "
            f"{cell(defects_cell(t))} | {cell(facts_cell(t))} |"
        )
    return lines


def defects_cell(t: dict) -> str:
    """An entry's defects as one cell: `promise: mechanism [reach, severity] (properties)`; "none"."""
    return "; ".join(
        f"{d.get('promise', '?')}: {d['mechanism']} [{d['reach']}, {d['severity']}] ({', '.join(d['properties'])})"
        for d in t.get("defects", [])
    ) or "none"


def facts_cell(t: dict) -> str:
    """An entry's facts as one cell: `kind: mechanism (properties)`; "-"."""
    return "; ".join(f"{f['kind']}: {f['mechanism']} ({', '.join(f['properties'])})" for f in t.get("facts", [])) or "-"


def defect_lines(targets: list[dict]) -> list[str]:
    """One bullet per defect: the promise quoted, and for a pipeline defect the features its witness uses with
    the upstream lines cited as producing each (the configuration a maintainer needs to meet it)."""
    lines = []
    for t in targets:
        label = t["target"] if "@" in t["target"] else f"{t['target']}@{t['pin']}"
        for d in t.get("defects", []):
            head = (
                f"- **{cell(label)}** {d['mechanism']} [{d['reach']}, {d['severity']}]: "
                f"breaks `{d.get('promise', '?')}` "
                f"\"{cell(d.get('promise_text', ''))}\""
            )
            opts = d.get("options") or {}
            if opts:
                head += "; options " + ", ".join(f"{k}={v}" for k, v in sorted(opts.items()))
            built = d.get("built_from") or {}
            if d["reach"] == "pipeline" and built:
                head += "; witness built from " + "; ".join(f"{f}: {cell(c)}" for f, c in built.items())
            elif d["reach"] == "pipeline" and "built_from" in d:
                head += "; witness uses no masking feature (any run of the entry)"
            lines.append(head)
    return lines or ["none"]


def counts(targets: list[dict]) -> list[str]:
    ok = [t for t in targets if t["status"] == "ok"]
    defects = [d for t in ok for d in t.get("defects", [])]
    facts = [f for t in ok for f in t.get("facts", [])]
    by = Counter((d["severity"], d["reach"]) for d in defects)
    kinds = Counter(f["kind"] for f in facts)
    promises = Counter(d.get("promise", "?") for d in defects)
    lines = [
        f"{len(targets)} target entries ({len(ok)} ran, {sum(t['status'] == 'skipped' for t in targets)} skipped, "
        f"{sum(t['status'] == 'error' for t in targets)} errors): {len(defects)} defects, {len(facts)} facts.",
        "",
        "| severity | pipeline | api |",
        "|---|---|---|",
    ]
    for sev in ("high", "medium", "low"):
        lines.append(f"| {sev} | {by[(sev, 'pipeline')]} | {by[(sev, 'api')]} |")
    lines += ["", "Facts by kind: " + (", ".join(f"{k} {n}" for k, n in sorted(kinds.items())) or "none") + "."]
    lines += ["", "Defects by promise: " + (", ".join(f"`{p}` {n}" for p, n in promises.most_common()) or "none") + "."]
    return lines


def group_cards(targets: list[dict]) -> list[str]:
    lines = [
        "| target@pin | declared variant agrees | " + " | ".join(GROUP_DIMS) + " |",
        "|---|---|" + "---|" * len(GROUP_DIMS),
    ]
    for t in targets:
        card = t.get("semantics") or {}
        if t["status"] != "ok" or card.get("kind") != "group-advantage":
            continue
        dims = {d["name"]: d for d in card.get("dimensions", [])}
        cells = []
        for name in GROUP_DIMS:
            d = dims.get(name)
            if d is None:
                cells.append("")
            elif not d["told"]:
                cells.append("not told")
            else:
                value = " \\| ".join("none" if v is None else str(v) for v in d["observed"]) or "none of ours"
                cells.append(value if d["as_declared"] else f"**{value}** (declared {d['declared']})")
        label = t["target"] if "@" in t["target"] else f"{t['target']}@{t['pin']}"
        agrees = "yes" if card.get("matches_declared") else "no"
        lines.append(f"| {cell(label)} | {agrees} | " + " | ".join(cell(c) for c in cells) + " |")
    return lines


def option_rows(targets: list[dict]) -> list[str]:
    """Per entry with options or truncation semantics: examples judged per option value and with a cut row."""
    lines = [
        "| target@pin | examples | examples per option value | truncation: examples with a cut row |",
        "|---|---|---|---|",
    ]
    for t in targets:
        conf = t.get("configuration")
        if t["status"] != "ok" or not conf:
            continue
        per = "; ".join(
            f"{name}: " + ", ".join(f"{v}={n}" for v, n in values.items())
            for name, values in (conf.get("options_checked") or {}).items()
        ) or "-"
        trunc = conf.get("truncation")
        cut = f"{trunc['semantics']}: {conf.get('truncated_checked', 0)}" if trunc else "-: 0"
        label = t["target"] if "@" in t["target"] else f"{t['target']}@{t['pin']}"
        lines.append(f"| {cell(label)} | {t.get('examples', 0)} | {cell(per)} | {cell(cut)} |")
    return lines


def card_rows(targets: list[dict]) -> list[str]:
    lines = ["| target@pin | kind | declared variant agrees | dimensions |", "|---|---|---|---|"]
    for t in targets:
        card = t.get("semantics") or {}
        if t["status"] != "ok" or not card:
            continue
        dims = []
        for d in card.get("dimensions", []):
            value = (" \\| ".join("none" if v is None else str(v) for v in d["observed"]) or "none of ours") if d[
                "told"] else "not told apart"
            flag = "" if d["as_declared"] or not d["told"] else f" (declared {d['declared']})"
            dims.append(f"{d['name']}: {value}{flag}")
        label = t["target"] if "@" in t["target"] else f"{t['target']}@{t['pin']}"
        agrees = "yes" if card.get("matches_declared") else "no"
        lines.append(f"| {cell(label)} | {card.get('kind', '')} | {agrees} | {cell('; '.join(dims))} |")
    return lines


def family_table(targets: list[dict], labels: list[str]) -> list[str]:
    """The group-advantage cards of `labels` (one entry per framework) side by side, then each one's defects."""
    by = {(t["target"] if "@" in t["target"] else f"{t['target']}@{t['pin']}"): t for t in targets}
    missing = [x for x in labels if x not in by]
    if missing:
        raise SystemExit(f"not in the results: {', '.join(missing)}")
    chosen = [by[x] for x in labels]
    lines = group_cards(chosen)
    notes = [(x, (t.get("semantics") or {}).get("note")) for x, t in zip(labels, chosen)]
    lines += [""] + [f"- {cell(x)}: {cell(n)}" for x, n in notes if n] if any(n for _, n in notes) else []
    lines += ["", "| target@pin | defects: promise, mechanism [reach, severity] | facts |", "|---|---|---|"]
    for label, t in zip(labels, chosen):
        defects = "; ".join(f"{d.get('promise', '?')}: {d['mechanism']} [{d['reach']}, {d['severity']}]"
                            for d in t.get("defects", [])) or "none"  # fmt: skip
        facts = "; ".join(f"{f['kind']}: {f['mechanism']}" for f in t.get("facts", [])) or "-"
        lines.append(f"| {cell(label)} | {cell(defects)} | {cell(facts)} |")
    return lines


def framework_page(name: str, files: list[tuple[Path, list[dict]]]) -> list[str]:
    """One framework's page: its entries and declared promises, then its rows per results file."""
    from maskfuzz.targets.registry import get

    spec = get(name)
    out = [
        f"# {name}: the masked math, entry by entry",
        "",
        f"Generated by `python scripts/kinds_tables.py ... --framework {name}` from `maskfuzz fuzz --json` results "
        "(every entry of the framework at the pins below). A **defect** breaks a promise (a universal invariant of "
        "masking, or {name}'s own words at the pin, quoted below); a **fact** breaks none: *semantics*, the variant "
        "the code implements, or *robustness*, an invariant on input {name}'s pipeline never builds "
        "(`shared/design/kinds.md`, \"Promises\"). The corpus audit, entry by entry with its upstream lines, is "
        f"`docs/audit/{name}.md`.".replace("{name}", name),
        "",
        "## Entries and the promises they declare",
        "",
        "| entry | kind | promises (id: the words; the pins that say them) |",
        "|---|---|---|",
    ]
    for entry in spec.entries:
        e = spec.for_entry(entry)
        words = "<br>".join(
            f"`{p.id}` ({', '.join(p.covers)}): \"{p.text}\"" + (f" [pins {', '.join(p.pins)}]" if p.pins else "")
            + (f" [options {p.options}]" if p.options else "")
            for p in e.promises
        ) or "none declared: only the universal invariants apply"
        out.append(f"| {entry} | {e.kind} | {cell(words)} |")
    out += [
        "",
        "## Options and truncation, as declared (`targets/adapters/`)",
        "",
        "| entry | option (values; default) | where the framework reads it | what it does |",
        "|---|---|---|---|",
    ]
    rows = 0
    for entry in spec.entries:
        e = spec.for_entry(entry)
        for o in e.options:
            values = ", ".join(map(str, o.values))
            out.append(f"| {entry} | `{o.name}` ({cell(values)}; {o.default}) | {cell(o.cite)} | {cell(o.doc)} |")
            rows += 1
        if e.truncation is not None:
            t = e.truncation
            what = f"score {t.score}, bootstrap {t.bootstrap}, row {t.row}" + (" (terminal)" if t.terminal else "")
            out.append(f"| {entry} | a row cut by the length limit | {cell(t.cite)} | {cell(what)} |")
            rows += 1
    if not rows:
        out.append("| - | none declared | | |")
    out += [
        "",
        f"The hand-written reading notes of this page before the promise model (how each entry calls {name}, what "
        "is not modelled) are in the history: `git log -p -- docs/kinds/" + name + ".md`; their verdicts "
        "(\"true defect\", \"design difference\") are superseded by the tables below and by the audit.",
    ]
    for path, targets in files:
        mine = [t for t in targets if t["target"].split("@")[0].split(":")[0] == name]
        if not mine:
            continue
        title = {"releases": "Newest releases (the default pins)", "head": "HEAD (`@main` of each mirror)"}
        out += ["", f"## {title.get(path.stem, path.stem)}", ""] + counts(mine) + [""] + entry_rows(mine)
        out += ["", "Defects with the promise they break and what their pipeline witness is built from:", ""]
        out += defect_lines(mine)
        out += ["", "Semantics cards:", ""] + card_rows(mine)
    return out + [""]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("results", nargs="+", type=Path)
    p.add_argument("--title", default="")
    p.add_argument("--framework", help="print this framework's page instead")
    p.add_argument(
        "--family",
        metavar="T:E@PIN,...",
        help="print the semantics cards of these group-advantage entries side by side, with their defects",
    )
    args = p.parse_args(argv)
    if args.framework:
        sys.stdout.write("\n".join(framework_page(args.framework, [(f, load([f])) for f in args.results])))
        return 0
    targets = load(args.results)
    if args.family:
        sys.stdout.write("\n".join(family_table(targets, args.family.split(","))) + "\n")
        return 0
    out = [f"### {args.title}", ""] if args.title else []
    out += counts(targets) + [""] + entry_rows(targets) + ["", "Semantics cards of the group advantages:", ""]
    out += group_cards(targets) + ["", "Options and truncated rows: coverage:", ""] + option_rows(targets) + [""]
    sys.stdout.write("\n".join(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

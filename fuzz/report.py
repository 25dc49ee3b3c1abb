"""The report of a run or a night: what failed, per framework first, as markdown, HTML and JSON.

`maskfuzz report RESULTS` reads the files the other commands write (`fuzz.nights`); with
`--previous` it compares them with the last night (new / still failing / fixed / unknown) and is
titled a nightly report, without it a run report. A previous `report.json` lists its open findings
(failing and unknown), so a finding not checked for a night is carried forward instead of being
forgotten, and its `history` (defects per framework, night by night) feeds the plot. The report
copies the corpus entry and reproducer (`<repro dir>/<corpus id>/`) of every open finding next to
itself, so the output directory is self-contained and its links work wherever it is unpacked.
"""

from __future__ import annotations

import json
import math
import re
import shutil
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable

from maskfuzz.fuzz import nightly_bisect
from maskfuzz.fuzz.evidence import CITED, EXECUTED, label
from maskfuzz.fuzz.nights import (
    FORMAT,
    PROPERTIES,
    VERSION,
    Comparison,
    Coverage,
    Failure,
    Identity,
    Night,
    ReportInputError,
    compare,
    first_line,
    load_night,
)
from maskfuzz.fuzz.report_page import Document, Link, Plot, Section, Table, render_html, render_markdown

__all__ = ["ReportInputError", "Identity", "load_night", "compare", "write_report", "build"]

DEFECT_FIELDS = ("id", "promise", "mechanism", "reach", "severity", "where", "properties", "smallest", "state")
FRAMEWORK_FIELDS = ("framework", "defects", "high", "medium", "low", "reach pipeline", "facts", "ran", "leading defect")
HISTORY_NIGHTS = 60  # nights of defects per framework a report.json carries for the plot
SEVERITY_RANK = {"high": 0, "medium": 1, "low": 2}


def framework_of(target: str) -> str:
    """`verl:grpo` -> `verl`."""
    return target.split(":", 1)[0]


def defects_per_framework(failing: Iterable[Failure]) -> dict[str, int]:
    """Distinct defects (by defect id) per framework among failing findings."""
    ids: dict[str, set] = defaultdict(set)
    for f in failing:
        ids[framework_of(f.identity.target)].add(f.defect)
    return {fw: len(v) for fw, v in sorted(ids.items())}


def history(previous: Night | None, cmp: Comparison, tonight: Night, now: str) -> list[dict]:
    """Defects per framework night by night, oldest first, ending with this one: a previous
    report's own history, else what the previous result files show, then tonight (every framework
    that ran, 0 where it has none); the last `HISTORY_NIGHTS`."""
    nights = []
    if previous is not None:
        nights = list(previous.history) or [{
            "generated": previous.date or "previous", "defects": defects_per_framework(previous.failures.values()),
        }]  # fmt: skip
    frameworks = {framework_of(c.target) for c in tonight.coverage.values() if c.status == "ok"}
    here = {fw: 0 for fw in sorted(frameworks)} | defects_per_framework(cmp.new + cmp.still)
    return (nights + [{"generated": now, "defects": here}])[-HISTORY_NIGHTS:]


def _history_plot(nights: list[dict]) -> Plot:
    names = sorted({fw for n in nights for fw in n["defects"]})
    return Plot(
        "Defects per framework, night by night (distinct defects failing; 0 where none or not run)",
        [n["generated"] for n in nights],
        {fw: [int(n["defects"].get(fw, 0)) for n in nights] for fw in names},
    )


def _severity(fs: list[Failure]) -> str:
    """A defect's severity: the highest of its findings'."""
    return min((f.severity for f in fs), key=lambda x: SEVERITY_RANK.get(x, 3))


def _on_pipeline(fs: list[Failure]) -> bool:
    """Whether any finding of a defect reaches it through the pipeline."""
    return any(f.triage.get("reach") == "pipeline" for f in fs)


def _evidence(fs: list[Failure]) -> str:
    """How a defect's pipeline reach is known: executed when any finding's input was rebuilt on a real rollout."""
    found = {f.triage.get("reach_evidence", "") for f in fs if f.triage.get("reach") == "pipeline"}
    return EXECUTED if EXECUTED in found else (CITED if found else "")


def _defect_rank(fs: list[Failure]) -> tuple[int, bool]:
    """Severity first, then pipeline reach before api: the order a maintainer reads defects in."""
    return SEVERITY_RANK.get(_severity(fs), 3), not _on_pipeline(fs)


def _framework_rows(tonight: Night, failing: list[Failure]) -> list[list]:
    """One row per framework: its defects by severity and reach, facts, what ran, the leading defect.
    Most high-severity defects first."""
    by_fw: dict[str, dict[str, list[Failure]]] = defaultdict(lambda: defaultdict(list))
    for f in failing:
        by_fw[framework_of(f.identity.target)][f.defect].append(f)
    covered: dict[str, list[Coverage]] = defaultdict(list)
    for (target, _), cov in tonight.coverage.items():
        covered[framework_of(target)].append(cov)
    facts: dict[str, int] = defaultdict(int)
    for fact in tonight.facts:
        facts[framework_of(fact["where"].partition("@")[0])] += 1
    rows = []
    for fw in sorted(set(covered) | set(by_fw)):
        defects = by_fw.get(fw, {})
        sev = [_severity(fs) for fs in defects.values()]
        pipeline = sum(_on_pipeline(fs) for fs in defects.values())
        ran_it = sum(_evidence(fs) == EXECUTED for fs in defects.values())
        lead = ""
        if defects:
            top = min(defects.values(), key=_defect_rank)
            t = next((f.triage for f in top if f.triage), {})
            lead = f"{t.get('promise', top[0].identity.property)}: {t.get('mechanism', first_line(top[0].message))}"
        covs = covered.get(fw, [])
        ran = sum(c.status == "ok" for c in covs)
        rows.append([
            fw, str(len(defects)), *(str(sev.count(s)) for s in ("high", "medium", "low")),
            f"{pipeline} ({ran_it} executed)" if ran_it else str(pipeline),
            str(facts.get(fw, 0)), f"{ran} of {len(covs)}", lead,
        ])  # fmt: skip
    rows.sort(key=lambda r: (-int(r[2]), -int(r[1]), r[0]))
    return rows


def cell_state(cov: Coverage | None, prop: str, n_findings: int) -> str:
    """One matrix cell: ok / FAIL (n) / FAIL (not shrunk) / skipped / error / n/a / - (see `MATRIX_LEGEND`)."""
    if cov is None or cov.status in ("skipped", "error"):
        return cov.status if cov else "-"
    if n_findings:
        return f"FAIL ({n_findings})"
    replayed = cov.replayed.get(prop, set())
    if cov.failed.get(prop, 0) or "failing" in replayed:
        return "FAIL (not shrunk)"
    if cov.checked.get(prop, 0) or "clean" in replayed:
        return "ok"
    if cov.fuzzed or "n/a" in replayed:
        return "n/a"
    return "-"


MATRIX_LEGEND = (
    "Cells: ok = checked tonight and holds; FAIL (n) = n distinct findings (by signature); FAIL (not shrunk) = "
    "failing examples without a shrunk finding; skipped / error = the target@pin did not run (reasons below); "
    "n/a = never applicable to the cases drawn; - = not checked (replay only)."
)


@dataclass
class Bisections:
    """The nightly bisections (`fuzz.nightly_bisect`): their results, and the new / fixed findings
    not bisected with the reason (failure, state, reason)."""

    results: list = field(default_factory=list)
    not_bisected: list = field(default_factory=list)


def build(
    tonight: Night,
    cmp: Comparison,
    out: Path,
    repro_dirs: Iterable[Path] = (),
    now: str = "",
    bisections: Bisections | None = None,
    nights: list[dict] | None = None,
) -> Document:
    """The report's content; copies corpus entries / reproducers of listed findings into `out`.
    A nightly report (with a previous night) shows new / still failing / fixed / unknown; a run
    report lists its findings. `nights` is the defects-per-framework history (`history`)."""
    nightly = cmp.had_previous
    repro_dirs = [Path(d) for d in repro_dirs]
    links = _Linker(out, repro_dirs, [*cmp.new, *cmp.still, *(f for f, _ in cmp.fixed)])
    per_cell: dict[tuple, int] = defaultdict(int)
    for ident in tonight.failures:
        per_cell[(ident.target, ident.pin, ident.property)] += 1
    rows = []
    for (target, pin), cov in tonight.coverage.items():
        cells = [cell_state(cov, p, per_cell[(target, pin, p)]) for p in PROPERTIES]
        examples = str(cov.examples) if cov.fuzzed else "-"
        rows.append([f"{target}@{pin}", _short_rev(cov.resolved or ""), examples, *cells])
    n = {s: sum(c.status == s for c in tonight.coverage.values()) for s in ("ok", "skipped", "error")}
    counts = f"{len(tonight.coverage)} target@pin(s): {n['ok']} ran, {n['skipped']} skipped, {n['error']} error(s). "
    if nightly:
        counts += (
            f"Findings failing tonight: {len(tonight.failures)} ({len(cmp.new)} new, {len(cmp.still)} still failing); "
            f"fixed since the previous night: {len(cmp.fixed)}; unknown (not checked tonight): {len(cmp.unknown)}."
        )
    else:
        counts += f"Findings that break a promise: {len(tonight.failures)}; facts: {len(tonight.facts)}."
    kinds = defaultdict(int)
    for _, k in tonight.files:
        kinds[k] += 1
    lines = [
        f"Generated {now} from {len(tonight.files)} result file(s) ("
        + ", ".join(f"{k}: {v}" for k, v in sorted(kinds.items()))
        + ").",
        "Previous night: "
        + (f"report generated {cmp.previous_date}." if cmp.previous_date else "result files given.")
        if nightly
        else "A single run: no previous night given (`--previous REPORT.json` compares two nights and lists what "
        "is new, still failing, fixed or unknown).",
        counts,
        "A finding's identity across nights: target (with entry point), pin as asked, property, failure signature.",
    ]
    nights = nights or [{"generated": now, "defects": defects_per_framework(cmp.new + cmp.still)}]

    def finding_rows(items: list[Failure], extra: str | None = None) -> list[list]:
        out_rows = []
        for f in items:
            i = f.identity
            row = [
                i.where,
                f.resolved,
                i.property,
                f.severity,
                i.signature,
                "x".join(map(str, f.shape)) if f.shape else "",
                first_line(f.message),
            ]
            if extra == "first_seen":
                row.append(f.first_seen or "")
            row += [links.corpus(f), links.repro(f)]
            out_rows.append(row)
        return out_rows

    head = ["target@pin", "resolved", "property", "severity", "signature", "B x T", "message"]
    state = {id(f): "new" for f in cmp.new} | {id(f): "still failing" for f in cmp.still}
    sections = [
        Section(
            "Defects per framework",
            "What each framework is affected by: distinct defects (findings that break a promise, grouped by root "
            "cause), by severity and reach, the facts (no promise broken), how many of its target@pins ran, and its "
            "leading defect (highest severity, pipeline reach first).",
            Table(list(FRAMEWORK_FIELDS), _framework_rows(tonight, cmp.new + cmp.still)),
            empty="no results",
            plot=_history_plot(nights),
        ),
        Section(
            "Defects",
            "Failing, grouped by root cause: one line per defect (mechanism, reach, severity, the "
            "properties it explains, the smallest case).",
            Table(
                ["defect", "promise", "mechanism", "reach", "severity", "target@pin", "properties", "smallest B x T",
                 "state"],
                _defect_rows(cmp.new + cmp.still, state),
            ),  # fmt: skip
        ),
        Section(
            "Behaviour changes",
            "A dimension of a target's semantics card that differs from the previous night's: what the code "
            "implements changed (a fact, never a defect), with the command that finds the commit or release.",
            Table(["target@pin", "dimension", "previous", "tonight", "resolved", "bisect"], _behaviour_rows(cmp)),
        ),
        Section(
            "Registered variants that appeared or disappeared",
            "Variants a framework registers by name (read from its code at the pin) that are new or gone since the "
            "previous night; a new one is fuzzed tonight against the invariants of its kind.",
            Table(["target@pin", "change", "entry", "kind", "at", "judged", "callable"], _variant_rows(cmp)),
        ),
        Section(
            "Facts",
            "Findings that break no promise: `semantics`, the variant the code implements differs from one of "
            "ours; `robustness`, an invariant fails only on input the framework's own pipeline never builds.",
            Table(
                ["target@pin", "kind", "mechanism", "properties", "what was seen", "why it is not a defect"],
                [[f["where"], f["kind"], f["mechanism"], ", ".join(f["properties"]), first_line(f["evidence"]),
                  first_line(f["why"])] for f in tonight.facts],
            ),  # fmt: skip
        ),
        Section(
            "Semantics",
            "Each target's semantics card: which variant its code implements, inferred on clean cases.",
            Table(["target@pin", "kind", "declared variant agrees", "dimensions"], _semantics_rows(tonight)),
        ),
        *([_bisect_section(bisections, links, out)] if bisections is not None else []),
        Section(
            "Matrix",
            MATRIX_LEGEND,
            Table(["target@pin", "resolved", "examples", *PROPERTIES], rows, "matrix"),
            empty="no results",
        ),
        *(_comparison_sections(cmp, head, finding_rows, links) if nightly else [Section(
            "Findings",
            "Every finding of this run that breaks a promise, one line per target@pin, property and signature.",
            Table(head + ["corpus", "repro"], finding_rows(cmp.new)),
        )]),  # fmt: skip
        Section(
            "Skipped / errors",
            "Target pins (or replays) that did not run tonight, with the reason.",
            Table(["target@pin", "status", "source", "reason"], _skip_rows(tonight.skips)),
        ),
    ]
    for s in sections:
        if s.title not in ("Matrix", "Defects per framework") and s.table is not None:
            s.title = f"{s.title} ({len(s.table.rows)})"
    return Document("maskfuzz nightly report" if nightly else "maskfuzz run report", lines, sections)


def _comparison_sections(cmp: Comparison, head: list[str], finding_rows, links: "_Linker") -> list[Section]:
    """A nightly report's diff against the previous night: new, still failing, fixed, unknown."""
    return [
        Section(
            "New",
            "Failing tonight, not open the previous night.",
            Table(head + ["corpus", "repro"], finding_rows(cmp.new)),
        ),
        Section(
            "Still failing",
            "Failing tonight and open the previous night.",
            Table(head + ["first seen", "corpus", "repro"], finding_rows(cmp.still, "first_seen")),
        ),
        Section(
            "Fixed since the previous night",
            "Open the previous night, checked tonight at the same target@pin, and no longer failing.",
            Table(
                ["target@pin", "property", "signature", "evidence", "corpus"],
                [
                    [f.identity.where, f.identity.property, f.identity.signature, why, links.corpus(f)]
                    for f, why in cmp.fixed
                ],
            ),
        ),
        Section(
            "Unknown: open, not checked tonight",
            "Open the previous night, but tonight gives no evidence either way; carried forward, never 'fixed'.",
            Table(
                ["target@pin", "property", "signature", "why", "last seen", "corpus"],
                [
                    [
                        f.identity.where,
                        f.identity.property,
                        f.identity.signature,
                        why,
                        f.last_seen or "",
                        links.corpus(f),
                    ]
                    for f, why in cmp.unknown
                ],
            ),
        ),
    ]


def _bisect_section(b: Bisections, links: "_Linker", out: Path) -> Section:
    """One row per new / fixed finding at a pin that moved since the previous night: the commit or
    release that introduced or fixed it, or why there is none."""
    rows = []
    for res in b.results:
        j = res.job
        f = _failure_for(links, j)
        rows.append([
            {"cause": "new", "fix": "fixed"}.get(j.kind, j.kind), f"{j.target}@{j.pin}", j.property,
            f"{_short_rev(j.old)} .. {_short_rev(j.new)}", res.status, res.summary,
            f"{res.evaluations} ({res.skips} skipped) over {res.revisions} {j.unit}s" if res.evaluations else "",
            links.repro(f) if f else "", links.upstream_test(f) if f else "",
            _out_link(res.log_path, out, "log"),
        ])  # fmt: skip
    for f, state, why in b.not_bisected:
        i = f.identity
        test = links.upstream_test(f)
        rows.append([state, i.where, i.property, "", "not bisected", why, "", links.repro(f), test, ""])
    return Section(
        "Bisected: the upstream change behind tonight's new and fixed findings",
        "A finding new (or fixed) tonight at a pin that moved since the previous night is bisected between the "
        "previous night's resolved revision and tonight's with its corpus entry (`maskfuzz bisect`); both ends are "
        "re-checked, so a finding that already failed before is never blamed on a commit.",
        Table(
            ["state", "target@pin", "property", "range", "result", "commit / release", "evaluations", "repro",
             "upstream test", "log"],
            rows,
        ),  # fmt: skip
    )


def _failure_for(links: "_Linker", job) -> Failure | None:
    return links.failures.get(Identity(job.target, job.pin, job.property, job.signature))


def _short_rev(rev: str) -> str:
    return rev[:12] if re.fullmatch(r"[0-9a-f]{40}", rev) else rev


def _out_link(path: Path | None, out: Path, text: str) -> Link | str:
    if path is None or not Path(path).is_file():
        return ""
    rel = _rel(path, out)
    return Link(text, rel) if rel and not rel.startswith("/") else str(path)


def _defect_json(row: dict) -> dict:
    """A defect row as report.json holds it: `reach` stays `pipeline` / `api`, how it is known beside it
    (`reach_evidence`, `reach_note`), as the table cell "pipeline (executed); note" says it in words; `promise`
    stays its id, `judged` beside it where the cell says "(invariants only)"."""
    cell, _, note = row["reach"].partition("; ")
    reach, _, evidence = cell.partition(" (")
    promise, _, judged = row["promise"].partition(" (")
    out = row | {"reach": reach, "reach_evidence": evidence.rstrip(")"), "promise": promise}
    return out | ({"reach_note": note} if note else {}) | ({"judged": judged.rstrip(")")} if judged else {})


def _defect_rows(failing: list[Failure], state: dict) -> list[list[str]]:
    groups: dict[str, list[Failure]] = defaultdict(list)
    for f in failing:
        groups[f.defect].append(f)
    rows = []
    for defect, fs in groups.items():
        t = next((f.triage for f in fs if f.triage), {})
        reach = label("pipeline", _evidence(fs)) if _on_pipeline(fs) else t.get("reach", "unknown")
        if notes := sorted({f.triage["reach_note"] for f in fs if f.triage.get("reach_note")}):
            # executed by one finding, a note is another finding's (a note never stands at a pin that reproduced)
            reach += f"; {'another finding: ' if _evidence(fs) == EXECUTED else ''}{notes[0]}"
        sev = _severity(fs)
        small = min((f for f in fs if f.shape), key=lambda f: f.shape[0] * f.shape[1], default=None)
        promise = next((f.triage["promise"] for f in fs if f.triage.get("promise")), "(not triaged)")
        if any(f.triage.get("judged") for f in fs):  # a discovered variant: no reference, its kind's invariants
            promise += " (invariants only)"
        rows.append([
            defect, promise, t.get("mechanism", "(not triaged)"), reach, sev,
            ", ".join(sorted({f.identity.where for f in fs})), ", ".join(sorted({f.identity.property for f in fs})),
            "x".join(map(str, small.shape)) if small else "", ", ".join(sorted({state.get(id(f), "") for f in fs})),
        ])  # fmt: skip
    rows.sort(key=lambda r: (SEVERITY_RANK.get(r[4], 3), not r[3].startswith("pipeline"), r[0]))
    return rows


def _variant_rows(cmp: "Comparison") -> list[list[str]]:
    return [
        [where, change, v.get("entry", ""), v.get("kind", ""), v.get("at", ""), v.get("judged", ""),
         "yes" if v.get("callable") else f"no: {v.get('reason', '')}"]
        for where, change, v in cmp.variants
    ]  # fmt: skip


def _behaviour_rows(cmp: "Comparison") -> list[list[str]]:
    """One row per changed dimension of a card, with the command that bisects it."""
    rows = []
    for where, dim, old, new, r_old, r_new in cmp.behaviour:
        target, _, pin = where.rpartition("@")
        revs = _bisect_ends(r_old, r_new)
        cmd = (
            f"maskfuzz bisect --semantics '{dim}' --target {target} --old {revs[0]} --new {revs[1]}"
            if revs else "the pin did not move: the same code gave another card (look at the cases)"
        )  # fmt: skip
        rows.append([where, dim, old, new, f"{_short_rev(r_old)} .. {_short_rev(r_new)}", cmd])
    return rows


def _bisect_ends(old: str, new: str) -> tuple[str, str] | None:
    """The two revisions to bisect between (commits, or versions of 'NAME==VERSION'); None when equal."""
    strip = lambda r: r.partition("==")[2] or r  # noqa: E731
    if not old or not new or strip(old) == strip(new):
        return None
    return strip(old), strip(new)


def _semantics_rows(tonight: "Night") -> list[list[str]]:
    """One row per target@pin: whether the declared variant agrees, then each dimension's value."""
    rows = []
    for where, card in sorted(tonight.semantics.items()):
        dims = []
        for d in card.get("dimensions", []):
            value = (" | ".join(map(str, d["observed"])) or "none of ours") if d["told"] else "not told apart"
            flag = "" if d.get("as_declared") or not d["told"] else f" (declared {d['declared']})"
            dims.append(f"{d['name']}: {value}{flag}")
        agrees = "yes" if card.get("matches_declared") else "no"
        rows.append([where, card.get("kind", ""), agrees, "; ".join(dims)])
    return rows


def _skip_rows(skips: list[tuple[str, str, str, str]]) -> list[list[str]]:
    """One row per (target@pin, status, source, first line of the reason); replays counted."""
    counts: dict[tuple, int] = defaultdict(int)
    for where, status, source, reason in skips:
        counts[(where, status, source, first_line(reason))] += 1
    return [[w, s, f"{src} ({n} entries)" if src == "replay" else src, r] for (w, s, src, r), n in counts.items()]


class _Linker:
    """Copies corpus entries and reproducers into the output folder and gives links relative to it."""

    def __init__(self, out: Path, repro_dirs: list[Path], failures: Iterable[Failure] = ()):
        self.out, self.repro_dirs = out, repro_dirs
        self.failures = {f.identity: f for f in failures}

    def corpus(self, f: Failure) -> Link | str:
        if f.corpus_file is None or not Path(f.corpus_file).is_file():
            return f.corpus_id or ""
        rel = Path("corpus") / f.identity.target.split(":", 1)[0] / Path(f.corpus_file).name
        dest = self.out / rel
        if Path(f.corpus_file).resolve() != dest.resolve():
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(f.corpus_file, dest)
        f.corpus_file = dest
        return Link(f.corpus_id or Path(f.corpus_file).stem, rel.as_posix())

    def repro(self, f: Failure) -> Link | str:
        if not f.corpus_id:
            return ""
        for d in self.repro_dirs:
            src = d / f.corpus_id
            if (src / "report.md").is_file():
                dest = self.out / "repro" / f.corpus_id
                if src.resolve() != dest.resolve():
                    shutil.copytree(src, dest, dirs_exist_ok=True)
                return Link("report", f"repro/{f.corpus_id}/report.md")
        return ""

    def upstream_test(self, f: Failure) -> Link | str:
        """The upstream test the reproducer wrote (`repro/<id>/test_*.py`), once `repro` copied it."""
        if not f.corpus_id or not self.repro(f):
            return ""
        tests = sorted((self.out / "repro" / f.corpus_id).glob("test_*.py"))
        return Link(tests[0].name, f"repro/{f.corpus_id}/{tests[0].name}") if tests else ""


# ---------------------------------------------------------------------------------------------
# The machine-readable report: tomorrow's --previous.
# ---------------------------------------------------------------------------------------------
def report_json(tonight: Night, cmp: Comparison, out: Path, now: str, bisections: Bisections | None = None) -> dict:
    """report.json: tonight's coverage, every classified finding, and the open set (failing tonight
    plus unknown, carried forward) that the next night compares against."""

    def item(f: Failure, state: str, why: str = "") -> dict:
        d = f.identity.to_json() | {
            "state": state,
            "severity": f.severity,
            "resolved": f.resolved,
            "message": f.message,
            "shape": f.shape,
            "corpus_id": f.corpus_id,
            "corpus_file": _rel(f.corpus_file, out),
            "first_seen": f.first_seen,
            "last_seen": f.last_seen,
            "defect": f.defect,
        } | {k: v for k, v in f.triage.items() if k != "severity"}
        if why:
            d["why"] = why
        if f.identity in bisected:
            d["bisection"] = bisected[f.identity]
        return d

    bisected = {}
    if bisections is not None:
        for res in bisections.results:
            j = res.job
            bisected[Identity(j.target, j.pin, j.property, j.signature)] = _bisection_json(res, out)
        for f, _, why in bisections.not_bisected:
            bisected[f.identity] = {"status": "not bisected", "summary": why}

    for f in cmp.new:
        f.first_seen = f.first_seen or now
    for f in cmp.new + cmp.still:
        f.last_seen = now
    items = (
        [item(f, "new") for f in cmp.new]
        + [item(f, "still-failing") for f in cmp.still]
        + [item(f, "fixed", why) for f, why in cmp.fixed]
        + [item(f, "unknown", why) for f, why in cmp.unknown]
    )
    return {
        "format": FORMAT,
        "version": VERSION,
        "generated": now,
        "inputs": [{"path": p, "kind": k} for p, k in tonight.files],
        "coverage": [
            {
                "target": c.target,
                "pin": c.pin,
                "status": c.status,
                "reason": c.reason,
                "resolved": c.resolved,
                "examples": c.examples,
                "checked": c.checked,
                "failed": c.failed,
            }
            | ({"source": c.source, "callable": c.callable} if c.source else {})
            for c in tonight.coverage.values()
        ],
        "defects": [
            _defect_json(dict(zip(DEFECT_FIELDS, row)))
            for row in _defect_rows(cmp.new + cmp.still, {id(f): "new" for f in cmp.new})
        ],
        "findings": items,
        "facts": tonight.facts,
        "semantics": tonight.semantics,
        "behaviour_changes": [
            dict(zip(("where", "dimension", "previous", "tonight", "previous_resolved", "resolved"), b))
            for b in cmp.behaviour
        ],
        "open": [d for d in items if d["state"] in ("new", "still-failing", "unknown")],
        "discovered": {where: {"variants": vs} for where, vs in tonight.discovered.items()},
        "variant_changes": [{"where": w, "change": c, **v} for w, c, v in cmp.variants],
    } | ({"bisections": list(bisected.values())} if bisections is not None else {})


def _bisection_json(res, out: Path) -> dict:
    return res.to_dict() | {
        "case": _rel(res.job.case, out),
        "json": _rel(res.json_path, out),
        "log": _rel(res.log_path, out),
    }


def strict_json(o: Any) -> Any:
    """`o` with every non-finite float as the string Python prints ("inf", "-inf", "nan"): report.json
    is strict JSON for any reader, while cards and evidence may hold a clamp bound of inf."""
    if isinstance(o, float) and not math.isfinite(o):
        return repr(o)
    if isinstance(o, dict):
        return {k: strict_json(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [strict_json(v) for v in o]
    return o


def _rel(p: Path | None, base: Path) -> str | None:
    if p is None:
        return None
    try:
        return Path(p).resolve().relative_to(base.resolve()).as_posix()
    except ValueError:
        return str(p)


def write_report(
    results: list[Path],
    out: Path,
    previous: list[Path] = (),
    repro_dirs: list[Path] = (),
    corpus_roots: list[Path] = (),
    now: str | None = None,
    bisect=None,
) -> tuple[Document, Comparison]:
    """Read, compare and write `out/report.md`, `out/report.html` and `out/report.json`.
    `bisect(jobs, folder) -> results` (e.g. `fuzz.nightly_bisect.run`) bisects the new and fixed
    findings at pins that moved since the previous night; None bisects nothing.
    Raises ReportInputError (naming the file) before writing anything when an input is unreadable."""
    now = now or datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    tonight = load_night(results, corpus_roots)
    prev = load_night(previous, corpus_roots, allow_report=True) if previous else None
    cmp = compare(tonight, prev)
    out.mkdir(parents=True, exist_ok=True)
    repro_dirs = list(repro_dirs) + (prev.repro_dirs if prev else [])  # tonight's first
    bisections = None
    if bisect is not None:
        jobs, not_bisected = nightly_bisect.plan(cmp, tonight, prev)
        bisections = Bisections(bisect(jobs, out / "bisect") if jobs else [], not_bisected)
    nights = history(prev, cmp, tonight, now)
    doc = build(tonight, cmp, out, repro_dirs, now, bisections, nights)
    (out / "report.md").write_text(render_markdown(doc), encoding="utf-8")
    (out / "report.html").write_text(render_html(doc), encoding="utf-8")
    frameworks = [dict(zip(FRAMEWORK_FIELDS, row)) for row in _framework_rows(tonight, cmp.new + cmp.still)]
    data = report_json(tonight, cmp, out, now, bisections) | {"frameworks": frameworks, "history": nights}
    (out / "report.json").write_text(json.dumps(strict_json(data), indent=1, allow_nan=False) + "\n", encoding="utf-8")
    return doc, cmp

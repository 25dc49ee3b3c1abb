"""The nightly report: one night's results as a target x property matrix, compared with the last night.

Inputs are the files the other commands write, recognised by their content:

    fuzz     `maskfuzz fuzz --json`: {"profile", "seed", "targets": [{"target", "pin", "status", "findings", ...}]}
    replay   `maskfuzz replay --json`: {"format": "maskfuzz-replay", "results": [...]}
    report   the `report.json` this module writes (only as the previous night)

A finding's identity across nights is

    (target key, pin as asked, property, signature)

- the target key includes the entry point ("torchrl:vec"), as in the corpus;
- the pin *as asked* ("0.4.1", "HEAD", "8eb27cc2dc34"), not the resolved commit: a moving pin
  (a branch) is one line of history, so "HEAD still fails" stays one finding from night to night;
  the resolved commit / wheel is shown next to it;
- the signature is `fuzz.corpus.signature(property, verdict, case)`, the one the corpus
  de-duplicates with (output, kinds of the positions involved, dtype class, failure kind).

Comparison (tonight = RESULTS, previous = PREVIOUS):

    new            fails tonight, was not open the previous night
    still failing  fails tonight and was open the previous night
    fixed          open the previous night, not failing tonight, and tonight *checked* it: its corpus
                   entry replayed clean at that pin, or the property held on every example fuzzed there
    unknown        open the previous night but not checked tonight: the target@pin was skipped,
                   errored or not run, the property never applied, or the property still fails with
                   another signature (the fuzzer shrank to a different bug; the old one is not cleared)

Only defects (findings that break a promise, `oracles.promises`) are findings here; a finding that
breaks none is a *fact* (semantics or robustness), listed apart and never "new" or "fixed". Each
target's semantics card (`oracles.semantics`) is shown, and a card that differs from the previous
night's is a *behaviour change* (with the command that bisects it), never a defect.

A previous `report.json` lists its open findings (failing and unknown), so a finding not checked
for a night is carried forward instead of being forgotten. The report copies the corpus entry and
reproducer (`<repro dir>/<corpus id>/`) of every open finding next to itself, so the output
directory is self-contained and its links work wherever it is unpacked.
"""

from __future__ import annotations

import html
import json
import re
import shutil
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable
from urllib.parse import quote

from maskfuzz.oracles.kinds import ALL_PROPERTIES as PROPERTIES
from maskfuzz.oracles.properties import SEVERITY, Verdict
from maskfuzz.oracles.semantics import changes as semantic_changes

FORMAT = "maskfuzz-report"
VERSION = 1
_CORPUS_NAME = re.compile(r"(?P<prop>[a-z-]+)-(?P<id>[0-9a-f]{16})\.json")
DEFECT_FIELDS = ("id", "promise", "mechanism", "reach", "severity", "where", "properties", "smallest", "state")
REPLAY_FAILING = ("fail", "xfail")  # the property fails at that pin (expected or not)
REPLAY_CLEAN = ("pass", "fixed")  # the entry replays without the failure


class ReportInputError(Exception):
    """An input file that cannot be used: the message names the file (and the field)."""

    def __init__(self, path: Path | str, message: str):
        self.path = Path(path)
        super().__init__(f"{path}: {message}")


# ---------------------------------------------------------------------------------------------
# The model: identities, failures, what was checked.
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True, order=True)
class Identity:
    """What makes a finding the same finding on another night (see the module docstring)."""

    target: str  # target key, with the entry point: "verl", "torchrl:vec"
    pin: str  # the pin as asked
    property: str
    signature: str

    @property
    def where(self) -> str:
        return f"{self.target}@{self.pin}"

    def sort_key(self) -> tuple:
        rank = PROPERTIES.index(self.property) if self.property in PROPERTIES else len(PROPERTIES)
        return (self.target, self.pin, rank, self.signature)

    def to_json(self) -> dict:
        return {"target": self.target, "pin": self.pin, "property": self.property, "signature": self.signature}


@dataclass
class Failure:
    """One failing finding of a night (from a fuzz finding, a failing replay or a previous report)."""

    identity: Identity
    resolved: str = ""
    message: str = ""
    shape: list | None = None
    source: str = "fuzz"  # "fuzz" | "replay" | "previous"
    corpus_id: str | None = None
    corpus_file: Path | None = None  # where the entry is readable now, if anywhere
    also: list = field(default_factory=list)
    first_seen: str | None = None
    last_seen: str | None = None
    triage: dict = field(default_factory=dict)  # defect, mechanism, severity, reach (fuzz / replay JSON)

    @property
    def severity(self) -> str:
        return self.triage.get("severity") or SEVERITY.get(self.identity.property, "high")

    @property
    def defect(self) -> str:
        """The defect id (`<target>/<mechanism>`); untriaged inputs group by property."""
        return self.triage.get("defect") or f"{self.identity.target}/{self.identity.property} (not triaged)"


@dataclass
class Coverage:
    """What a night did at one target@pin. `status` ok / skipped / error; `checked` and `failed`
    count fuzzed examples per property (empty for replay-only rows); `replayed[prop]` the replay
    states seen there ('failing', 'clean', 'n/a')."""

    target: str
    pin: str
    status: str = "ok"
    reason: str = ""
    resolved: str = ""
    examples: int = 0
    seconds: float = 0.0
    fuzzed: bool = False
    checked: dict = field(default_factory=dict)
    failed: dict = field(default_factory=dict)
    replayed: dict = field(default_factory=lambda: defaultdict(set))
    notes: list = field(default_factory=list)
    source: str = ""  # a --callable's git repository (`maskfuzz fuzz --source`)
    callable: str = ""  # its MODULE:FUNC

    @property
    def where(self) -> str:
        return f"{self.target}@{self.pin}"


@dataclass
class Night:
    """Everything read from one night's files."""

    failures: dict[Identity, Failure] = field(default_factory=dict)
    coverage: dict[tuple[str, str], Coverage] = field(default_factory=dict)
    clean: set[Identity] = field(default_factory=set)  # corpus entries that replayed clean tonight
    skips: list[tuple[str, str, str, str]] = field(default_factory=list)  # (where, status, source, reason)
    files: list[tuple[str, str]] = field(default_factory=list)  # (path, kind)
    date: str | None = None  # when the previous report was generated
    repro_dirs: list[Path] = field(default_factory=list)  # a previous report's copied reproducers
    facts: list[dict] = field(default_factory=list)  # findings that break no promise: where, kind, mechanism, ...
    semantics: dict[str, dict] = field(default_factory=dict)  # target@pin -> its semantics card (JSON)

    def add_failure(self, f: Failure) -> None:
        old = self.failures.get(f.identity)
        if old is None:
            self.failures[f.identity] = f
            return
        # the same finding from two sources (fuzzed and replayed): keep the first, fill its gaps
        old.corpus_id = old.corpus_id or f.corpus_id
        old.corpus_file = old.corpus_file or f.corpus_file
        old.resolved = old.resolved or f.resolved
        old.shape = old.shape or f.shape
        old.triage = old.triage or f.triage

    def cover(self, target: str, pin: str) -> Coverage:
        key = (target, pin)
        if key not in self.coverage:
            self.coverage[key] = Coverage(target, pin, status="")
        return self.coverage[key]


# ---------------------------------------------------------------------------------------------
# Reading the files.
# ---------------------------------------------------------------------------------------------
def read_json(path: Path) -> Any:
    """Parsed JSON (NaN / Infinity literals allowed: `maskfuzz fuzz --json` writes them)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ReportInputError(path, "no such file") from None
    except IsADirectoryError:
        raise ReportInputError(path, "is a directory, expected a JSON file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ReportInputError(path, f"cannot read: {exc}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ReportInputError(path, f"not valid JSON (truncated?): {exc.msg} at line {exc.lineno}") from None


def kind_of(data: Any) -> str | None:
    """'fuzz', 'replay', 'report' or None, from the content."""
    if not isinstance(data, dict):
        return None
    if data.get("format") == "maskfuzz-replay":
        return "replay"
    if data.get("format") == FORMAT:
        return "report"
    if isinstance(data.get("targets"), list) and "profile" in data:
        return "fuzz"
    return None


def load_night(paths: Iterable[Path], corpus_roots: Iterable[Path] = (), allow_report: bool = False) -> Night:
    """Read result files into one Night. Raises ReportInputError naming the first bad file."""
    night = Night()
    roots = [Path(r) for r in corpus_roots]
    for path in map(Path, paths):
        data = read_json(path)
        kind = kind_of(data)
        if kind is None:
            raise ReportInputError(
                path,
                "not a maskfuzz result: expected the JSON of `maskfuzz fuzz --json`, `maskfuzz replay --json`"
                + (" or a report.json of `maskfuzz report`" if allow_report else ""),
            )
        if kind == "report" and not allow_report:
            raise ReportInputError(path, "is a maskfuzz report (report.json): pass it with --previous")
        try:
            {"fuzz": _read_fuzz, "replay": _read_replay, "report": _read_report}[kind](data, path, night, roots)
        except ReportInputError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ReportInputError(path, f"malformed {kind} result: {type(exc).__name__}: {exc}") from None
        night.files.append((str(path), kind))
    return night


def _split_label(label: str, pin: str) -> str:
    """'torchrl:vec@0.14.1' with pin '0.14.1' -> 'torchrl:vec'; a callable label stays as it is."""
    suffix = f"@{pin}"
    return label[: -len(suffix)] if pin and label.endswith(suffix) else label


def _field(d: dict, key: str, kind: type | tuple, path: Path, where: str) -> Any:
    if not isinstance(d, dict) or key not in d:
        raise ReportInputError(path, f"field {where}{key!r} is missing")
    v = d[key]
    if not isinstance(v, kind):
        raise ReportInputError(path, f"field {where}{key!r}: expected {kind}, got {type(v).__name__}")
    return v


def _read_fuzz(data: dict, path: Path, night: Night, roots: list[Path]) -> None:
    from maskfuzz.fuzz.corpus import CorpusError, case_from_json, entry_id, signature

    for i, t in enumerate(data["targets"]):
        where = f"targets[{i}]."
        label = _field(t, "target", str, path, where)
        pin = str(t.get("pin") or "")
        key = _split_label(label, pin)
        status = _field(t, "status", str, path, where)
        cov = night.cover(key, pin)
        cov.resolved = t.get("resolved") or cov.resolved
        cov.source = t.get("source") or cov.source
        cov.callable = t.get("callable") or cov.callable
        cov.fuzzed = True
        if status == "ok":
            cov.status = "ok"
            cov.reason = ""
            cov.examples += int(t.get("examples") or 0)
            cov.seconds += float(t.get("seconds") or 0.0)
            for name in ("checked", "failed"):
                counts = getattr(cov, name)
                for prop, n in (t.get(name) or {}).items():
                    counts[prop] = counts.get(prop, 0) + int(n)
        else:
            if cov.status != "ok":
                cov.status, cov.reason = status, t.get("reason") or ""
            night.skips.append((f"{key}@{pin}", status, "fuzz", t.get("reason") or ""))
        cov.notes += [n for n in t.get("notes") or [] if n not in cov.notes]
        if isinstance(t.get("semantics"), dict):
            night.semantics[f"{key}@{pin}"] = t["semantics"] | {"resolved": t.get("resolved") or ""}
        for fact in t.get("facts") or []:
            night.facts.append(_fact(fact, f"{key}@{pin}", "fuzz"))
        for j, f in enumerate(_field(t, "findings", list, path, where)):
            fw = f"{where}findings[{j}]."
            prop = _field(f, "property", str, path, fw)
            if f.get("class") and f["class"] != "defect":  # a fact: listed with the target's facts, not a finding
                continue
            try:
                case = case_from_json(_field(f, "case", dict, path, fw), "case")
            except CorpusError as exc:
                raise ReportInputError(path, f"{fw}{exc}") from None
            verdict = Verdict(
                prop,
                "fail",
                str(f.get("message") or ""),
                str(f.get("output") or ""),
                [list(p) for p in f.get("positions") or []],
            )
            ident = Identity(key, pin, prop, signature(prop, verdict, case))
            corpus_file = f.get("corpus_file")
            cid = _corpus_id(corpus_file) or entry_id(case, key, prop)
            located = _locate(corpus_file, path, roots, key, prop, cid)
            if located is None and roots:  # replaced since by a smaller entry of the same signature
                located = _by_signature(roots, ident)
                if located is not None:
                    cid = _corpus_id(str(located)) or cid
            night.add_failure(Failure(
                ident, resolved=t.get("resolved") or "", message=verdict.message, shape=list(case.shape),
                source="fuzz", corpus_id=cid, corpus_file=located, also=list(f.get("also") or []),
                triage=_triage_of(f),
            ))  # fmt: skip


def _triage_of(d: dict) -> dict:
    keys = ("defect", "mechanism", "severity", "reach", "reach_evidence", "class", "promise", "promise_text")
    return {k: d[k] for k in keys if d.get(k)}


def _fact(d: dict, where: str, source: str) -> dict:
    """One fact of a night: where, its kind, mechanism, properties, what was seen, why it is no defect."""
    return {
        "where": where,
        "kind": d.get("kind") or d.get("class") or "fact",
        "mechanism": d.get("mechanism") or "",
        "properties": list(d.get("properties") or ([d["property"]] if d.get("property") else [])),
        "evidence": d.get("evidence") or "",
        "why": d.get("why_not_a_defect") or "",
        "source": source,
    }


def _read_replay(data: dict, path: Path, night: Night, roots: list[Path]) -> None:
    from maskfuzz.fuzz.corpus import CorpusError, load, signature

    for i, r in enumerate(_field(data, "results", list, path, "")):
        where = f"results[{i}]."
        key = _field(r, "target", str, path, where)
        pin = _field(r, "pin", str, path, where)
        prop = _field(r, "property", str, path, where)
        status = _field(r, "status", str, path, where)
        cid = str(r.get("id") or "")
        cov = night.cover(key, pin)
        cov.resolved = cov.resolved or r.get("resolved") or ""
        if status in ("skip", "error"):
            if not cov.status:
                cov.status = "skipped" if status == "skip" else "error"
                cov.reason = r.get("message") or ""
            night.skips.append(
                (f"{key}@{pin}", "skipped" if status == "skip" else "error", "replay", r.get("message") or "")
            )
            continue
        if cov.status != "ok":
            cov.status, cov.reason = "ok", ""
        located = _locate(r.get("path"), path, roots, key, prop, cid)
        entry = None
        if located is not None:
            try:
                entry = load(located)
            except CorpusError:
                entry = None
        if status in REPLAY_FAILING:
            v = r.get("verdict") or {}
            # what fails now: the entry's property, or no-crash when the base run crashed
            vprop = v.get("property") if v.get("property") in PROPERTIES else prop
            cov.replayed[vprop].add("failing")
            verdict = Verdict(
                vprop,
                "fail",
                str(v.get("message") or r.get("message") or ""),
                str(v.get("output") or ""),
                [list(p) for p in v.get("positions") or []],
            )
            if r.get("class") and r["class"] != "defect":  # the entry fails here as a fact: no finding
                night.facts.append(_fact(r, f"{key}@{pin}", f"replay of {cid}"))
                continue
            if entry is not None:
                case = entry.case
                if r.get("dtype") and r["dtype"] != case.dtype:
                    case = case.replace(dtype=r["dtype"])
                sig = signature(vprop, verdict, case)
            else:  # without the case the positions' kinds are unknown: the entry id stands in
                sig = f"{vprop}|corpus entry {cid} (file not found)"
            ident = Identity(key, pin, vprop, sig)
            night.add_failure(Failure(
                ident, resolved=r.get("resolved") or "", message=verdict.message or r.get("message") or "",
                shape=list(entry.case.shape) if entry else None, source="replay", corpus_id=cid or None,
                corpus_file=located, triage=_triage_of(r),
            ))  # fmt: skip
        elif status in REPLAY_CLEAN:
            cov.replayed[prop].add("clean")
            if entry is not None:
                night.clean.add(Identity(key, pin, prop, entry.signature))
        else:
            cov.replayed[prop].add("n/a")


def _read_report(data: dict, path: Path, night: Night, roots: list[Path]) -> None:
    night.date = data.get("generated")
    base = path.parent
    if (base / "repro").is_dir():
        night.repro_dirs.append(base / "repro")
    for i, o in enumerate(_field(data, "open", list, path, "")):
        where = f"open[{i}]."
        ident = Identity(*(_field(o, k, str, path, where) for k in ("target", "pin", "property", "signature")))
        cf = o.get("corpus_file")
        night.add_failure(Failure(
            ident, resolved=o.get("resolved") or "", message=o.get("message") or "", shape=o.get("shape"),
            source="previous", corpus_id=o.get("corpus_id"),
            corpus_file=(base / cf) if cf and (base / cf).is_file() else None,
            first_seen=o.get("first_seen"), last_seen=o.get("last_seen"), triage=_triage_of(o),
        ))  # fmt: skip
    for where, card in (data.get("semantics") or {}).items():
        if isinstance(card, dict):
            night.semantics[where] = card
    for c in data.get("coverage") or []:
        cov = night.cover(c["target"], c["pin"])
        cov.status, cov.reason, cov.resolved = c.get("status", ""), c.get("reason", ""), c.get("resolved", "")
        cov.source, cov.callable = c.get("source") or "", c.get("callable") or ""
        cov.examples = int(c.get("examples") or 0)
        cov.checked, cov.failed = dict(c.get("checked") or {}), dict(c.get("failed") or {})


def _corpus_id(corpus_file: str | None) -> str | None:
    if not corpus_file:
        return None
    m = _CORPUS_NAME.fullmatch(Path(corpus_file).name)
    return m.group("id") if m else None


def _by_signature(roots: list[Path], ident: Identity) -> Path | None:
    """The corpus entry that stands for this (target key, property, signature) in one of `roots`:
    `record` keeps one entry per signature, so a finding whose own file was replaced by a smaller
    case of the same signature is represented by that one."""
    from maskfuzz.fuzz.corpus import CorpusError, load

    for root in roots:
        for f in sorted((root / ident.target.split(":", 1)[0]).glob(f"{ident.property}-*.json")):
            try:
                e = load(f)
            except CorpusError:
                continue
            if e.key == ident.target and e.property == ident.property and e.signature == ident.signature:
                return f
    return None


def _locate(
    recorded: str | None, results: Path, roots: list[Path], key: str, prop: str, cid: str | None
) -> Path | None:
    """Where the corpus entry can be read now: the recorded path (as is, or relative to the results
    file's folder or the one above, as in an unpacked CI artifact), else `<root>/<target>/<prop>-<id>.json`."""
    candidates = []
    if recorded:
        p = Path(recorded)
        candidates.append(p)
        if not p.is_absolute():
            candidates += [results.parent / p, results.parent.parent / p]
        candidates += [r / key.split(":", 1)[0] / p.name for r in roots]
    if cid:
        candidates += [r / key.split(":", 1)[0] / f"{prop}-{cid}.json" for r in roots]
    return next((c for c in candidates if c.is_file()), None)


# ---------------------------------------------------------------------------------------------
# Comparing two nights.
# ---------------------------------------------------------------------------------------------
@dataclass
class Comparison:
    new: list[Failure]
    still: list[Failure]
    fixed: list[tuple[Failure, str]]  # (previous failure, evidence)
    unknown: list[tuple[Failure, str]]  # (previous failure, why it was not checked)
    had_previous: bool
    previous_date: str | None = None
    # (target@pin, dimension, the previous night's value, tonight's, previous resolved, tonight's resolved)
    behaviour: list[tuple[str, str, str, str, str, str]] = field(default_factory=list)


def compare(tonight: Night, previous: Night | None) -> Comparison:
    """Classify tonight's failures and the previous night's open findings (see the module docstring)."""
    prev = previous.failures if previous else {}
    new, still, fixed, unknown = [], [], [], []
    for ident in sorted(tonight.failures, key=Identity.sort_key):
        f = tonight.failures[ident]
        if ident in prev:
            f.first_seen = prev[ident].first_seen or prev[ident].last_seen
            f.corpus_file = f.corpus_file or prev[ident].corpus_file
            f.corpus_id = f.corpus_id or prev[ident].corpus_id
            still.append(f)
        else:
            new.append(f)
    for ident in sorted(set(prev) - set(tonight.failures), key=Identity.sort_key):
        old = prev[ident]
        verdict, why = _cleared(tonight, ident)
        (fixed if verdict else unknown).append((old, why))
    behaviour = []
    for where, card in sorted(tonight.semantics.items()):
        before = previous.semantics.get(where) if previous else None
        if before is not None:
            behaviour += [
                (where, dim, a, b, before.get("resolved", ""), card.get("resolved", ""))
                for dim, a, b in semantic_changes(before, card)
            ]
    return Comparison(
        new, still, fixed, unknown, previous is not None, previous.date if previous else None, behaviour
    )


def _cleared(tonight: Night, ident: Identity) -> tuple[bool, str]:
    """(fixed?, the evidence or the reason it is unknown) for a previous finding not failing tonight."""
    cov = tonight.coverage.get((ident.target, ident.pin))
    if cov is None:
        return False, f"{ident.where} was not run tonight"
    if cov.status != "ok":
        return False, f"{ident.where} {cov.status} tonight: {_first_line(cov.reason)}"
    if ident in tonight.clean:
        return True, "its corpus entry replays clean"
    prop = ident.property
    checked, failed = cov.checked.get(prop, 0), cov.failed.get(prop, 0)
    if cov.fuzzed and checked and not failed:
        return True, f"{prop} held on all {checked} example(s) fuzzed tonight"
    if failed or "failing" in cov.replayed.get(prop, ()):
        return False, f"{prop} still fails tonight with another signature (this one was not re-found)"
    return False, f"{prop} was not checked tonight (no applicable example, no replay)"


def _first_line(text: str) -> str:
    return (text or "").strip().splitlines()[0] if (text or "").strip() else "(no reason given)"


# ---------------------------------------------------------------------------------------------
# The document: sections of tables, rendered to markdown and to HTML from the same data.
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Link:
    text: str
    href: str


@dataclass
class Table:
    header: list[str]
    rows: list[list]
    kind: str = ""  # "matrix" colours its cells


@dataclass
class Section:
    title: str
    intro: str = ""
    table: Table | None = None
    empty: str = "none"


@dataclass
class Document:
    title: str
    lines: list[str]  # summary paragraph lines
    sections: list[Section]


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
) -> Document:
    """The report's content; copies corpus entries / reproducers of listed findings into `out`."""
    repro_dirs = [Path(d) for d in repro_dirs]
    links = _Linker(out, repro_dirs, [*cmp.new, *cmp.still, *(f for f, _ in cmp.fixed)])
    per_cell: dict[tuple, int] = defaultdict(int)
    for ident in tonight.failures:
        per_cell[(ident.target, ident.pin, ident.property)] += 1
    rows = []
    for (target, pin), cov in tonight.coverage.items():
        cells = [cell_state(cov, p, per_cell[(target, pin, p)]) for p in PROPERTIES]
        rows.append([f"{target}@{pin}", cov.resolved or "", str(cov.examples) if cov.fuzzed else "-", *cells])
    n = {s: sum(c.status == s for c in tonight.coverage.values()) for s in ("ok", "skipped", "error")}
    counts = (
        f"{len(tonight.coverage)} target@pin(s): {n['ok']} ok, {n['skipped']} skipped, {n['error']} error(s). "
        f"Findings failing tonight: {len(tonight.failures)} ({len(cmp.new)} new, {len(cmp.still)} still failing); "
        f"fixed since the previous night: {len(cmp.fixed)}; unknown (not checked tonight): {len(cmp.unknown)}."
    )
    kinds = defaultdict(int)
    for _, k in tonight.files:
        kinds[k] += 1
    lines = [
        f"Generated {now} from {len(tonight.files)} result file(s) ("
        + ", ".join(f"{k}: {v}" for k, v in sorted(kinds.items()))
        + ").",
        "Previous night: "
        + (
            (f"report generated {cmp.previous_date}." if cmp.previous_date else "result files given.")
            if cmp.had_previous
            else "none given: every finding tonight is listed as new."
        ),
        counts,
        "A finding's identity across nights: target (with entry point), pin as asked, property, failure signature.",
    ]

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
                _first_line(f.message),
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
            "Defects",
            "Failing tonight, grouped by root cause: one line per defect (mechanism, reach, severity, the "
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
            "Facts",
            "Findings that break no promise: `semantics`, the variant the code implements differs from one of "
            "ours; `robustness`, an invariant fails only on input the framework's own pipeline never builds.",
            Table(
                ["target@pin", "kind", "mechanism", "properties", "what was seen", "why it is not a defect"],
                [[f["where"], f["kind"], f["mechanism"], ", ".join(f["properties"]), _first_line(f["evidence"]),
                  _first_line(f["why"])] for f in tonight.facts],
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
        Section(
            "Skipped / errors",
            "Target pins (or replays) that did not run tonight, with the reason.",
            Table(["target@pin", "status", "source", "reason"], _skip_rows(tonight.skips)),
        ),
    ]
    for s in sections:
        if s.title != "Matrix" and s.table is not None:
            s.title = f"{s.title} ({len(s.table.rows)})"
    return Document("maskfuzz nightly report", lines, sections)


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


def _defect_rows(failing: list[Failure], state: dict) -> list[list[str]]:
    groups: dict[str, list[Failure]] = defaultdict(list)
    for f in failing:
        groups[f.defect].append(f)
    rank = {"high": 0, "medium": 1, "low": 2}
    rows = []
    for defect, fs in groups.items():
        t = next((f.triage for f in fs if f.triage), {})
        reach = "pipeline" if any(f.triage.get("reach") == "pipeline" for f in fs) else t.get("reach", "unknown")
        sev = min((f.severity for f in fs), key=lambda x: rank.get(x, 3))
        small = min((f for f in fs if f.shape), key=lambda f: f.shape[0] * f.shape[1], default=None)
        promise = next((f.triage["promise"] for f in fs if f.triage.get("promise")), "(not triaged)")
        rows.append([
            defect, promise, t.get("mechanism", "(not triaged)"), reach, sev,
            ", ".join(sorted({f.identity.where for f in fs})), ", ".join(sorted({f.identity.property for f in fs})),
            "x".join(map(str, small.shape)) if small else "", ", ".join(sorted({state.get(id(f), "") for f in fs})),
        ])  # fmt: skip
    rows.sort(key=lambda r: (rank.get(r[4], 3), r[3] != "pipeline", r[0]))
    return rows


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
        counts[(where, status, source, _first_line(reason))] += 1
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
# Rendering.
# ---------------------------------------------------------------------------------------------
def _md_text(s: str) -> str:
    """Text safe inside a markdown table cell: no pipes or newlines, no raw HTML."""
    s = str(s).replace("\\", "\\\\").replace("|", "\\|").replace("\r", " ").replace("\n", " ")
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _md_cell(c: Any) -> str:
    if isinstance(c, Link):
        return f"[{_md_text(c.text)}]({quote(c.href, safe='/.-_~')})"
    if isinstance(c, tuple):
        return " ".join(_md_cell(x) for x in c)
    return _md_text(c)


def render_markdown(doc: Document) -> str:
    out = [f"# {doc.title}", ""]
    out += [f"{_md_text(line)}  " for line in doc.lines]
    for s in doc.sections:
        out += ["", f"## {s.title}", ""]
        if s.intro:
            out += [_md_text(s.intro), ""]
        if s.table is None or not s.table.rows:
            out.append(f"_{s.empty}_")
            continue
        out.append("| " + " | ".join(_md_text(h) for h in s.table.header) + " |")
        out.append("|" + "|".join("---" for _ in s.table.header) + "|")
        for row in s.table.rows:
            out.append("| " + " | ".join(_md_cell(c) for c in row) + " |")
    return "\n".join(out) + "\n"


_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.5em; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
td.ok { background: #e6f4ea; } td.fail { background: #fce8e6; font-weight: bold; }
td.skipped, td.error { background: #eee; color: #666; } td.na { color: #999; }
p.empty { color: #777; font-style: italic; }
"""


def _css_class(text: str) -> str:
    if text.startswith("FAIL"):
        return "fail"
    return {"ok": "ok", "skipped": "skipped", "error": "error", "n/a": "na"}.get(text, "")


def _html_cell(c: Any) -> str:
    if isinstance(c, Link):
        return f'<a href="{html.escape(quote(c.href, safe="/.-_~"), quote=True)}">{html.escape(c.text)}</a>'
    if isinstance(c, tuple):
        return " ".join(_html_cell(x) for x in c)
    return html.escape(str(c))


def render_html(doc: Document) -> str:
    """One self-contained page (inline CSS, no scripts, no external assets); all text escaped."""
    out = [
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        f"<title>{html.escape(doc.title)}</title>",
        f"<style>{_CSS}</style>",
        "</head>",
        "<body>",
        f"<h1>{html.escape(doc.title)}</h1>",
    ]
    out += [f"<p>{html.escape(line)}</p>" for line in doc.lines]
    for s in doc.sections:
        out.append(f"<h2>{html.escape(s.title)}</h2>")
        if s.intro:
            out.append(f"<p>{html.escape(s.intro)}</p>")
        if s.table is None or not s.table.rows:
            out.append(f'<p class="empty">{html.escape(s.empty)}</p>')
            continue
        out.append("<table>")
        out.append("<thead><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in s.table.header) + "</tr></thead>")
        out.append("<tbody>")
        for row in s.table.rows:
            tds = []
            for k, c in enumerate(row):
                cls = _css_class(c) if s.table.kind == "matrix" and k >= 3 and isinstance(c, str) else ""
                tds.append((f'<td class="{cls}">' if cls else "<td>") + _html_cell(c) + "</td>")
            out.append("<tr>" + "".join(tds) + "</tr>")
        out.append("</tbody>")
        out.append("</table>")
    out += ["</body>", "</html>"]
    return "\n".join(out) + "\n"


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
            dict(zip(DEFECT_FIELDS, row)) for row in _defect_rows(cmp.new + cmp.still, {id(f): "new" for f in cmp.new})
        ],
        "findings": items,
        "facts": tonight.facts,
        "semantics": tonight.semantics,
        "behaviour_changes": [
            dict(zip(("where", "dimension", "previous", "tonight", "previous_resolved", "resolved"), b))
            for b in cmp.behaviour
        ],
        "open": [d for d in items if d["state"] in ("new", "still-failing", "unknown")],
    } | ({"bisections": list(bisected.values())} if bisections is not None else {})


def _bisection_json(res, out: Path) -> dict:
    return res.to_dict() | {
        "case": _rel(res.job.case, out),
        "json": _rel(res.json_path, out),
        "log": _rel(res.log_path, out),
    }


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
        from maskfuzz.fuzz import nightly_bisect

        jobs, not_bisected = nightly_bisect.plan(cmp, tonight, prev)
        bisections = Bisections(bisect(jobs, out / "bisect") if jobs else [], not_bisected)
    doc = build(tonight, cmp, out, repro_dirs, now, bisections)
    (out / "report.md").write_text(render_markdown(doc), encoding="utf-8")
    (out / "report.html").write_text(render_html(doc), encoding="utf-8")
    data = report_json(tonight, cmp, out, now, bisections)
    (out / "report.json").write_text(json.dumps(data, indent=1, allow_nan=False) + "\n", encoding="utf-8")
    return doc, cmp

"""One night's results, read from the files the other commands write, and compared with the last night.

Inputs are the files the other commands write, recognised by their content:

    fuzz     `maskfuzz fuzz --json`: {"profile", "seed", "targets": [{"target", "pin", "status", "findings", ...}]},
             read back through its type (`fuzz.job_result.RunResult.from_json`, which names a bad field)
    replay   `maskfuzz replay --json`: {"format": "maskfuzz-replay", "results": [...]}
    report   the `report.json` this module writes (only as the previous night)

A finding's identity across nights is

    (target key, pin as asked, property, signature)

- the target key includes the entry point ("torchrl:vec"), as in the corpus;
- the pin *as asked* ("0.4.1", "HEAD", "8eb27cc2dc34"), not the resolved commit: a moving pin
  (a branch) is one line of history, so "HEAD still fails" stays one finding from night to night;
  the resolved commit / wheel is shown next to it;
- the signature is `fuzz.signature.signature(property, verdict, case)`, the one the corpus
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
target's semantics card (`oracles.kinds.semantics`) is shown, and a card that differs from the previous
night's is a *behaviour change* (with the command that bisects it), never a defect.

A previous `report.json` lists its open findings (failing and unknown), so a finding not checked
for a night is carried forward instead of being forgotten.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from maskfuzz.fuzz.corpus import load
from maskfuzz.fuzz.corpus_codec import CorpusError, case_from_json, entry_id
from maskfuzz.fuzz.job_result import ResultFieldError, RunResult
from maskfuzz.fuzz.signature import signature
from maskfuzz.oracles.kinds import ALL_PROPERTIES as PROPERTIES
from maskfuzz.oracles.kinds.gae.properties import SEVERITY
from maskfuzz.oracles.kinds.semantics import changes as semantic_changes
from maskfuzz.oracles.verdict import Verdict

FORMAT = "maskfuzz-report"
VERSION = 1
_CORPUS_NAME = re.compile(r"(?P<prop>[a-z-]+)-(?P<id>[0-9a-f]{16})\.json")
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
    history: list[dict] = field(default_factory=list)  # a previous report's nights: {generated, defects}
    # target@pin (as asked) -> the variants the framework registers there (targets.discovery, JSON)
    discovered: dict[str, list[dict]] = field(default_factory=dict)

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
    try:
        run = RunResult.from_json(data)  # the one place its fields are checked
    except ResultFieldError as exc:
        raise ReportInputError(path, str(exc)) from None
    _read_discovered({"discovered": run.discovered}, night)
    for i, t in enumerate(run.targets):
        key = _split_label(t.target, t.pin)
        cov = night.cover(key, t.pin)
        cov.resolved = t.resolved or cov.resolved
        cov.source = t.source or cov.source
        cov.callable = t.callable or cov.callable
        cov.fuzzed = True
        if t.ran:
            cov.status = "ok"
            cov.reason = ""
            cov.examples += t.examples
            cov.seconds += t.seconds
            for name in ("checked", "failed"):
                counts = getattr(cov, name)
                for prop, n in getattr(t, name).items():
                    counts[prop] = counts.get(prop, 0) + n
        else:
            if cov.status != "ok":
                cov.status, cov.reason = t.status, t.reason
            night.skips.append((f"{key}@{t.pin}", t.status, "fuzz", t.reason))
        cov.notes += [n for n in t.notes if n not in cov.notes]
        if t.semantics is not None:
            night.semantics[f"{key}@{t.pin}"] = dict(t.semantics) | {"resolved": t.resolved}
        for fact in t.facts:
            night.facts.append(_fact(fact.to_json(), f"{key}@{t.pin}", "fuzz"))
        for j, f in enumerate(t.findings):
            if not f.is_defect:  # a fact: listed with the target's facts, not a finding
                continue
            try:
                case = case_from_json(dict(f.case or {}), "case")
            except CorpusError as exc:
                raise ReportInputError(path, f"targets[{i}].findings[{j}].{exc}") from None
            verdict = Verdict(f.property, "fail", f.message, f.output, [list(p) for p in f.positions])
            ident = Identity(key, t.pin, f.property, signature(f.property, verdict, case))
            cid = _corpus_id(f.corpus_file) or entry_id(case, key, f.property)
            located = _locate(f.corpus_file, path, roots, key, f.property, cid)
            if located is None and roots:  # replaced since by a smaller entry of the same signature
                located = _by_signature(roots, ident)
                if located is not None:
                    cid = _corpus_id(str(located)) or cid
            night.add_failure(Failure(
                ident, resolved=t.resolved, message=verdict.message, shape=list(case.shape), source="fuzz",
                corpus_id=cid, corpus_file=located, also=list(f.also), triage=_triage_of(f.to_json()),
            ))  # fmt: skip


def _triage_of(d: dict) -> dict:
    keys = ("defect", "mechanism", "severity", "reach", "reach_evidence", "reach_note", "class", "promise",
            "promise_text", "judged")
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


def _read_discovered(data: dict, night: Night) -> None:
    """The variants a fuzz run or a report lists per target@pin (`discovered`); a pin whose code could not be
    read lists none and is left out, so its variants never count as disappeared."""
    for where, found in (data.get("discovered") or {}).items():
        if isinstance(found, dict) and not found.get("error"):
            night.discovered[where] = [v for v in found.get("variants") or [] if isinstance(v, dict)]


def _read_report(data: dict, path: Path, night: Night, roots: list[Path]) -> None:
    night.date = data.get("generated")
    _read_discovered(data, night)
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
    for h in data.get("history") or []:
        if isinstance(h, dict) and isinstance(h.get("defects"), dict):
            night.history.append({"generated": str(h.get("generated") or ""), "defects": dict(h["defects"])})
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
    # (target@pin, "appeared" | "disappeared", the variant's JSON): registered variants that changed since the
    # previous night at a pin both nights read
    variants: list[tuple[str, str, dict]] = field(default_factory=list)


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
        new, still, fixed, unknown, previous is not None, previous.date if previous else None, behaviour,
        variant_changes(previous.discovered if previous else {}, tonight.discovered),
    )


def variant_changes(before: dict[str, list[dict]], now: dict[str, list[dict]]) -> list[tuple[str, str, dict]]:
    """(target@pin, "appeared" | "disappeared", variant) for every registered variant that changed between two
    nights, at the pins both nights read (a pin read one night only has no change to tell)."""
    out = []
    for where in sorted(set(before) & set(now)):
        old = {v.get("entry"): v for v in before[where]}
        new = {v.get("entry"): v for v in now[where]}
        out += [(where, "appeared", new[e]) for e in sorted(set(new) - set(old))]
        out += [(where, "disappeared", old[e]) for e in sorted(set(old) - set(new))]
    return out


def _cleared(tonight: Night, ident: Identity) -> tuple[bool, str]:
    """(fixed?, the evidence or the reason it is unknown) for a previous finding not failing tonight."""
    cov = tonight.coverage.get((ident.target, ident.pin))
    if cov is None:
        return False, f"{ident.where} was not run tonight"
    if cov.status != "ok":
        return False, f"{ident.where} {cov.status} tonight: {first_line(cov.reason)}"
    if ident in tonight.clean:
        return True, "its corpus entry replays clean"
    prop = ident.property
    checked, failed = cov.checked.get(prop, 0), cov.failed.get(prop, 0)
    if cov.fuzzed and checked and not failed:
        return True, f"{prop} held on all {checked} example(s) fuzzed tonight"
    if failed or "failing" in cov.replayed.get(prop, ()):
        return False, f"{prop} still fails tonight with another signature (this one was not re-found)"
    return False, f"{prop} was not checked tonight (no applicable example, no replay)"


def first_line(text: str) -> str:
    return (text or "").strip().splitlines()[0] if (text or "").strip() else "(no reason given)"



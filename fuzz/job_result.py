"""The typed result of a fuzz job and of a fuzz run, as `maskfuzz fuzz --json` writes them.

A job (`commands.fuzz.run_job`: one TARGET[:ENTRY]@PIN or --callable) gives a `JobResult`; a run gives a
`RunResult` (the job results with the profile, seed and time, what was discovered, what was not run). The
summary tables, the JUnit writer and the nightly report read their attributes; the JSON is written by
`to_json` and read back (a previous night's or another machine's results file) by `from_json`, the one place
that checks fields: a field that is missing or of the wrong type raises `ResultFieldError` naming it
(`targets[2].findings[0].'case'`), and the reader of the file adds the file's path.

`to_json` writes exactly the fields and shapes the job's dict had; a key written only in some cases stays
absent otherwise (`callable`, `contract`, `source` of a --callable; `judged` of a discovered variant;
`domain_restrictions`, `fixed_options`, `information`, `configuration` when there are any; `semantics` once the
card was tried, null when it could not be inferred; `restarts`, `pipeline_declared`, `first_failure_s` and
`facts` when the job ran). Reading is as lenient as the report always was: only the fields it cannot do
without are required (a job's `target`, `status` and `findings`, a finding's `property`, a defect finding's
`case`); the rest default, so the files of older versions still read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from maskfuzz.oracles.declared import DEFAULT_KIND


class ResultFieldError(ValueError):
    """A field of a fuzz result read from JSON that is missing or of the wrong type; `field` names it."""

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(f"field {field} {message}")


def _get(d: Mapping, key: str, kind: type | tuple, where: str, default: Any = None, required: bool = False) -> Any:
    """`d[key]` checked to be a `kind`; absent or null: `default` (or an error when `required`)."""
    if not isinstance(d, Mapping):
        raise ResultFieldError(where.removesuffix(".") or "(the top level)", f"expected an object, got "
                               f"{type(d).__name__}")  # fmt: skip
    value = d.get(key)
    if value is None:
        if required:
            raise ResultFieldError(f"{where}{key!r}", "is missing")
        return default
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind in (int, float)):
        names = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
        raise ResultFieldError(f"{where}{key!r}", f"expected {names}, got {type(value).__name__}")
    return value


def _counts(d: Mapping, key: str, where: str) -> dict[str, int]:
    raw = _get(d, key, dict, where, {})
    out = {}
    for prop, n in raw.items():
        if isinstance(n, bool) or not isinstance(n, (int, float)):
            raise ResultFieldError(f"{where}{key!r}[{prop!r}]", f"expected a count, got {type(n).__name__}")
        out[str(prop)] = int(n)
    return out


def _strings(d: Mapping, key: str, where: str) -> tuple[str, ...]:
    return tuple(str(x) for x in _get(d, key, list, where, []))


def _rows(d: Mapping, key: str, row: Any, where: str, required: bool = False) -> tuple:
    """The list `d[key]`, each item read by `row.from_json` with its place (`findings[2].`)."""
    items = _get(d, key, list, where, [], required=required)
    return tuple(row.from_json(x, f"{where}{key}[{i}].") for i, x in enumerate(items))


def _promise(d: Mapping) -> dict:
    """The promise block of a finding or defect (`oracles.promises.Promise.to_json`), as written."""
    return {k: d[k] for k in ("promise", "promise_text", "promise_note", "promise_options") if k in d}


@dataclass(frozen=True)
class FindingRow:
    """One shrunk property finding of a job (`engine.Finding` after triage), with its corpus file.
    `klass` is the JSON's `class`: "defect", a fact's kind ("semantics", "robustness"), or "" when untriaged
    (counted as a defect). `case` and `witness` are the canonical case JSON (`corpus_codec.case_to_json`)."""

    property: str
    defect: str = ""
    mechanism: str = ""
    evidence: str = ""
    reach: str = ""
    reach_evidence: str = ""
    severity: str = ""
    reach_how: str = ""
    klass: str = ""
    promise: Mapping[str, Any] = field(default_factory=dict)
    why_not_a_defect: str = ""
    witness: Mapping[str, Any] | None = None
    shape: tuple[int, ...] = ()
    output: str = ""
    message: str = ""
    positions: tuple[tuple[int, ...], ...] = ()
    expected: Any = None
    observed: Any = None
    also: tuple[str, ...] = ()
    options: Mapping[str, Any] = field(default_factory=dict)
    case: Mapping[str, Any] | None = None
    corpus_file: str | None = None
    judged: str = ""  # "invariants only" for a discovered variant's findings

    @property
    def is_defect(self) -> bool:
        """A finding that breaks a promise; an untriaged one counts as a defect."""
        return self.klass in ("", "defect")

    def to_json(self) -> dict:
        return {
            "property": self.property,
            "defect": self.defect,
            "mechanism": self.mechanism,
            "evidence": self.evidence,
            "reach": self.reach,
            "reach_evidence": self.reach_evidence,
            "severity": self.severity,
            "reach_how": self.reach_how,
            "class": self.klass,
            **self.promise,
            **({"why_not_a_defect": self.why_not_a_defect} if not self.promise and self.why_not_a_defect else {}),
            "witness": None if self.witness is None else dict(self.witness),
            "shape": list(self.shape),
            "output": self.output,
            "message": self.message,
            "positions": [list(p) for p in self.positions],
            "expected": self.expected,
            "observed": self.observed,
            "also": list(self.also),
            "options": dict(self.options),
            "case": None if self.case is None else dict(self.case),
            "corpus_file": self.corpus_file,
            **({"judged": self.judged} if self.judged else {}),
        }

    @classmethod
    def from_json(cls, d: Any, where: str = "") -> FindingRow:
        klass = str(_get(d, "class", str, where, ""))
        positions = _get(d, "positions", list, where, [])
        if not all(isinstance(p, (list, tuple)) for p in positions):
            raise ResultFieldError(f"{where}'positions'", "expected a list of index lists")
        return cls(
            property=_get(d, "property", str, where, required=True),
            defect=str(d.get("defect") or ""),
            mechanism=str(d.get("mechanism") or ""),
            evidence=str(d.get("evidence") or ""),
            reach=str(d.get("reach") or ""),
            reach_evidence=str(d.get("reach_evidence") or ""),
            severity=str(d.get("severity") or ""),
            reach_how=str(d.get("reach_how") or ""),
            klass=klass,
            promise=_promise(d),
            why_not_a_defect=str(d.get("why_not_a_defect") or ""),
            witness=_get(d, "witness", dict, where),
            shape=tuple(int(x) for x in _get(d, "shape", list, where, [])),
            output=str(d.get("output") or ""),
            message=str(d.get("message") or ""),
            positions=tuple(tuple(p) for p in positions),
            expected=d.get("expected"),
            observed=d.get("observed"),
            also=_strings(d, "also", where),
            options=_get(d, "options", dict, where, {}),
            case=_get(d, "case", dict, where, required=klass in ("", "defect")),
            corpus_file=_get(d, "corpus_file", str, where),
            judged=str(d.get("judged") or ""),
        )


@dataclass(frozen=True)
class DefectRow:
    """Findings of a job explained by one mechanism that break a promise (`triage.Defect.to_dict`)."""

    id: str
    mechanism: str = ""
    description: str = ""
    reach: str = ""
    reach_evidence: str = ""
    severity: str = ""
    properties: tuple[str, ...] = ()
    promise: Mapping[str, Any] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)
    built_from: Mapping[str, Any] = field(default_factory=dict)
    case: Mapping[str, Any] = field(default_factory=dict)

    @property
    def promise_id(self) -> str:
        return str(self.promise.get("promise", "?"))

    @property
    def shape(self) -> tuple[int, ...]:
        """The smallest case's B x T."""
        return tuple(self.case.get("shape") or ())

    def to_json(self) -> dict:
        return {
            "id": self.id,
            "mechanism": self.mechanism,
            "description": self.description,
            "reach": self.reach,
            "reach_evidence": self.reach_evidence,
            "severity": self.severity,
            "properties": list(self.properties),
            **self.promise,
            "options": dict(self.options),
            "built_from": dict(self.built_from),
            "case": dict(self.case),
        }

    @classmethod
    def from_json(cls, d: Any, where: str = "") -> DefectRow:
        return cls(
            id=_get(d, "id", str, where, required=True),
            mechanism=str(d.get("mechanism") or ""),
            description=str(d.get("description") or ""),
            reach=str(d.get("reach") or ""),
            reach_evidence=str(d.get("reach_evidence") or ""),
            severity=str(d.get("severity") or ""),
            properties=_strings(d, "properties", where),
            promise=_promise(d),
            options=_get(d, "options", dict, where, {}),
            built_from=_get(d, "built_from", dict, where, {}),
            case=_get(d, "case", dict, where, {}),
        )


@dataclass(frozen=True)
class FactRow:
    """Findings of a job explained by one mechanism that break no promise (`triage.Fact.to_dict`)."""

    id: str
    kind: str = "fact"  # "semantics" | "robustness"
    mechanism: str = ""
    description: str = ""
    properties: tuple[str, ...] = ()
    evidence: str = ""
    why_not_a_defect: str = ""
    options: Mapping[str, Any] = field(default_factory=dict)
    case: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {
            "id": self.id,
            "kind": self.kind,
            "mechanism": self.mechanism,
            "description": self.description,
            "properties": list(self.properties),
            "evidence": self.evidence,
            "why_not_a_defect": self.why_not_a_defect,
            "options": dict(self.options),
            "case": dict(self.case),
        }

    @classmethod
    def from_json(cls, d: Any, where: str = "") -> FactRow:
        return cls(
            id=str(_get(d, "id", str, where, "")),
            kind=str(d.get("kind") or d.get("class") or "fact"),
            mechanism=str(d.get("mechanism") or ""),
            description=str(d.get("description") or ""),
            properties=_strings(d, "properties", where) or ((str(d["property"]),) if d.get("property") else ()),
            evidence=str(d.get("evidence") or ""),
            why_not_a_defect=str(d.get("why_not_a_defect") or ""),
            options=_get(d, "options", dict, where, {}),
            case=_get(d, "case", dict, where, {}),
        )


@dataclass(frozen=True)
class JobResult:
    """What one fuzz job did at one target@pin: `status` ok (it ran), skipped (the code at the pin lacks the
    entry's mode, with the `reason`) or error (it could not be set up); what it judged (`examples`, per property
    `checked` and `failed`), its shrunk `findings` grouped into `defects` and `facts`, and where it ran."""

    target: str  # "verl:grpo@0.9.1" (the label), or a --callable's MODULE:FUNC
    pin: str = ""  # as asked; "local" for a --callable without --source
    resolved: str = ""  # the commit or wheel the pin resolved to
    status: str = "ok"
    reason: str = ""  # why skipped / the error
    examples: int = 0
    seconds: float = 0.0
    defects: tuple[DefectRow, ...] = ()
    findings: tuple[FindingRow, ...] = ()
    checked: Mapping[str, int] = field(default_factory=dict)
    failed: Mapping[str, int] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    where: str = ""  # the upstream function (file::name)
    kind: str = DEFAULT_KIND
    entry: str = ""
    callable: str = ""  # a --callable's MODULE:FUNC
    contract: str = ""  # the contract a --callable intends
    source: str = ""  # a --callable's git repository
    judged: str = ""  # "invariants only": a discovered variant without a reference
    domain_restrictions: Mapping[str, str] = field(default_factory=dict)  # input it cannot express -> why (not drawn)
    fixed_options: Mapping[str, Any] | None = None  # --option
    card_tried: bool = False  # the semantics card was tried: `semantics` is written (null when not inferred)
    semantics: Mapping[str, Any] | None = None
    restarts: int = 0  # worker restarts (the rest of this block is written when the job ran)
    pipeline_declared: bool = False
    first_failure_s: float | None = None
    information: Mapping[str, Mapping[str, float]] = field(default_factory=dict)  # property -> the largest seen
    configuration: Mapping[str, Any] | None = None  # options, truncation and what was judged under each
    facts: tuple[FactRow, ...] = ()

    @property
    def label(self) -> str:
        """TARGET[:ENTRY]@PIN (a --callable's label carries no pin)."""
        return self.target if "@" in self.target else f"{self.target}@{self.pin}"

    @property
    def ran(self) -> bool:
        return self.status == "ok"

    def to_json(self) -> dict:
        ran = self.status == "ok"
        return {
            "target": self.target,
            "pin": self.pin,
            "resolved": self.resolved,
            "status": self.status,
            "reason": self.reason,
            "examples": self.examples,
            "seconds": self.seconds,
            "defects": [d.to_json() for d in self.defects],
            "findings": [f.to_json() for f in self.findings],
            "checked": dict(self.checked),
            "failed": dict(self.failed),
            "notes": list(self.notes),
            "where": self.where,
            "kind": self.kind,
            "entry": self.entry,
            **({"callable": self.callable} if self.callable else {}),
            **({"contract": self.contract} if self.contract else {}),
            **({"source": self.source} if self.source else {}),
            **({"judged": self.judged} if self.judged else {}),
            **({"domain_restrictions": dict(self.domain_restrictions)} if self.domain_restrictions else {}),
            **({"fixed_options": dict(self.fixed_options)} if self.fixed_options is not None else {}),
            **({"semantics": None if self.semantics is None else dict(self.semantics)} if self.card_tried else {}),
            **(
                {
                    "restarts": self.restarts,
                    "pipeline_declared": self.pipeline_declared,
                    "first_failure_s": self.first_failure_s,
                }
                if ran
                else {}
            ),
            **({"information": {p: dict(v) for p, v in self.information.items()}} if self.information else {}),
            **({"configuration": dict(self.configuration)} if self.configuration is not None else {}),
            **({"facts": [f.to_json() for f in self.facts]} if ran else {}),
        }

    @classmethod
    def from_json(cls, d: Any, where: str = "") -> JobResult:
        """A job result read back from JSON (ResultFieldError naming the field when it cannot be)."""
        status = _get(d, "status", str, where, required=True)
        first = _get(d, "first_failure_s", (int, float), where)
        return cls(
            target=_get(d, "target", str, where, required=True),
            pin=str(d.get("pin") or ""),
            resolved=str(d.get("resolved") or ""),
            status=status,
            reason=str(d.get("reason") or ""),
            examples=int(_get(d, "examples", (int, float), where, 0)),
            seconds=float(_get(d, "seconds", (int, float), where, 0.0)),
            defects=_rows(d, "defects", DefectRow, where),
            findings=_rows(d, "findings", FindingRow, where, required=True),
            checked=_counts(d, "checked", where),
            failed=_counts(d, "failed", where),
            notes=_strings(d, "notes", where),
            where=str(d.get("where") or ""),
            kind=str(d.get("kind") or DEFAULT_KIND),
            entry=str(d.get("entry") or ""),
            callable=str(d.get("callable") or ""),
            contract=str(d.get("contract") or ""),
            source=str(d.get("source") or ""),
            judged=str(d.get("judged") or ""),
            domain_restrictions=_get(d, "domain_restrictions", dict, where, {}),
            fixed_options=_get(d, "fixed_options", dict, where),
            card_tried="semantics" in d,
            semantics=_get(d, "semantics", dict, where),
            restarts=int(_get(d, "restarts", (int, float), where, 0)),
            pipeline_declared=bool(d.get("pipeline_declared")),
            first_failure_s=None if first is None else float(first),
            information=_get(d, "information", dict, where, {}),
            configuration=_get(d, "configuration", dict, where),
            facts=_rows(d, "facts", FactRow, where),
        )


@dataclass(frozen=True)
class RunResult:
    """A `maskfuzz fuzz` run: its job results in job order, and what `--json` writes around them."""

    profile: str
    seed: int
    seconds: float
    targets: tuple[JobResult, ...] = ()
    discovered: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # target@pin -> variants, labels
    interrupted: bool = False
    not_run: tuple[str, ...] = ()  # the labels an interrupted run did not run

    @property
    def defects(self) -> bool:
        """Whether any job found a defect (a finding that breaks a promise)."""
        return any(t.defects for t in self.targets)

    def to_json(self) -> dict:
        return {
            "profile": self.profile,
            "seed": self.seed,
            "seconds": self.seconds,
            "targets": [t.to_json() for t in self.targets],
            **({"discovered": {k: dict(v) for k, v in self.discovered.items()}} if self.discovered else {}),
            **({"interrupted": True, "not_run": list(self.not_run)} if self.interrupted else {}),
        }

    @classmethod
    def from_json(cls, d: Any) -> RunResult:
        """A run read back from JSON (ResultFieldError naming the field when it cannot be)."""
        return cls(
            profile=_get(d, "profile", str, "", required=True),
            seed=_get(d, "seed", int, "", 0),
            seconds=float(_get(d, "seconds", (int, float), "", 0.0)),
            targets=_rows(d, "targets", JobResult, "", required=True),
            discovered=_get(d, "discovered", dict, "", {}),
            interrupted=bool(d.get("interrupted")),
            not_run=_strings(d, "not_run", ""),
        )

"""From property findings to defects a maintainer accepts: promise, root cause, reach and severity.

For each shrunk finding `triage` asks
  * which mechanism explains it (`oracles.kinds.dispatch.diagnose`, probes on the shrunk case);
  * whether the framework's own pipeline can produce it (`reach`): the case itself when it lies
    inside the target's pipeline domain, else its projection into that domain (finite poison
    instead of NaN, zeroed masked rewards, the pipeline's dtype), else a short search inside the
    pipeline domain for that property, re-shrunk there. A witness counts only when the same
    mechanism explains it and every feature it uses is cited as produced by the framework's code
    (`Domain.produced_only`). No pipeline domain declared, or no witness: `reach: api`;
  * which promise it breaks (`oracles.promises.broken`): a universal invariant of masking or the
    framework's own words at the pin. A finding that breaks none is a **fact** (a semantics fact:
    the variant the code implements; a robustness fact: an invariant on input the pipeline never
    builds), never a defect;
and groups the findings into defects (and facts) by mechanism: one line each, the promise it
breaks, the properties it explains, its reach (pipeline when any of its findings has a pipeline
witness), its worst severity (`oracles.severity.grade`) and its smallest case.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from maskfuzz.fuzz.corpus_codec import case_to_json
from maskfuzz.fuzz.engine import Finding, FuzzResult, fuzz_target
from maskfuzz.fuzz.evidence import reach_evidence
from maskfuzz.fuzz.job_result import DefectRow, FactRow
from maskfuzz.oracles.case import Case
from maskfuzz.oracles.declared import Declared
from maskfuzz.oracles.kinds import spec
from maskfuzz.oracles.kinds.dispatch import diagnose, judge
from maskfuzz.oracles.kinds.gae.properties import with_extra_row, with_inserted_gap
from maskfuzz.oracles.kinds.judge import clean_twin, with_padding
from maskfuzz.oracles.mechanisms import MECHANISMS
from maskfuzz.oracles.options import resolve
from maskfuzz.oracles.promises import Promise, broken, fact_kind
from maskfuzz.oracles.severity import degenerate, grade, worst
from maskfuzz.oracles.strategies import Sizes
from maskfuzz.oracles.verdict import Run

WITNESS_EXAMPLES = 80  # a pipeline search per finding: small, the case is usually projected instead


@dataclass(frozen=True)
class Reach:
    level: str  # "pipeline" | "api"
    witness: Case | None  # a pipeline-domain case violating the same property by the same mechanism
    how: str


@dataclass
class Defect:
    """Findings of one target explained by one mechanism that break a promise."""

    id: str  # "<target>[:<entry>]/<mechanism>"
    mechanism: str
    reach: str
    severity: str
    properties: list[str]
    case: Case  # the smallest case among its findings (the pipeline witness when reach is pipeline)
    findings: list[Finding] = field(default_factory=list)
    promise: Promise | None = None
    # pipeline witness: the features it uses -> the upstream lines that produce each (its configuration)
    built_from: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return self.row().to_json()

    def row(self) -> DefectRow:
        """This defect as a row of its job's result (`fuzz.job_result`)."""
        return DefectRow(
            id=self.id,
            mechanism=self.mechanism,
            description=MECHANISMS.get(self.mechanism, ""),
            reach=self.reach,
            reach_evidence=reach_evidence(self.reach),
            severity=self.severity,
            properties=tuple(self.properties),
            promise=self.promise.to_json() if self.promise else {},
            options=dict(sorted(self.case.options.items())),
            built_from=dict(self.built_from),
            case=case_to_json(self.case),
        )

    def line(self) -> str:
        b, t = self.case.shape
        promise = f" breaks {self.promise.id}" if self.promise else ""
        return (
            f"{self.id}: {MECHANISMS.get(self.mechanism, self.mechanism)}{promise} "
            f"[reach {self.reach}, severity {self.severity}] explains {', '.join(self.properties)}; "
            f"smallest case B={b} T={t}"
        )


@dataclass
class Fact:
    """Findings of one target explained by one mechanism that break no promise: what the code does
    (`kind` "semantics": the variant it implements) or how it behaves on input its own pipeline
    never builds ("robustness"). Reported, never called a defect, never filed in the corpus."""

    id: str
    kind: str  # "semantics" | "robustness"
    mechanism: str
    properties: list[str]
    case: Case
    evidence: str  # what the probe that decided the mechanism saw
    why: str  # why it is not a defect
    findings: list[Finding] = field(default_factory=list)

    def to_dict(self) -> dict:
        return self.row().to_json()

    def row(self) -> FactRow:
        """This fact as a row of its job's result (`fuzz.job_result`)."""
        return FactRow(
            id=self.id,
            kind=self.kind,
            mechanism=self.mechanism,
            description=MECHANISMS.get(self.mechanism, ""),
            properties=tuple(self.properties),
            evidence=self.evidence,
            why_not_a_defect=self.why,
            options=dict(sorted(self.case.options.items())),
            case=case_to_json(self.case),
        )

    def line(self) -> str:
        return f"{self.id}: {self.kind} fact: {self.evidence} ({self.why})"


def _violates(run: Run, case: Case, declared: Declared, prop: str) -> bool:
    """`case` violates `prop` by itself: a poison verdict counts only when the case carries the
    poison (the judge probes a clean case with poison of its own, which the pipeline may not make)."""
    dead = case.poison_mask()
    if prop == "poison" and not any(bool((x[dead] != 0).any()) for x in case.per_token().values()):
        return False
    return any(v.property == prop and v.failed for v in judge(run, case, declared, only=(prop,)))


def reach(
    run: Run,
    case: Case,
    prop: str,
    mechanism: str,
    declared: Declared,
    *,
    seed: int = 0,
    sizes: Sizes = Sizes(8, 64),
    examples: int = WITNESS_EXAMPLES,
    known: Case | None = None,
) -> Reach:
    """Can the framework's own pipeline produce a case violating `prop` through `mechanism`?
    `known`: a witness recorded earlier, tried first; `examples` = 0 searches nothing (replay)."""
    if declared.pipeline is None:
        if declared.own_inputs:
            return Reach("pipeline", case, "a function of the caller's own: every input of its api domain is theirs")
        return Reach("api", None, "the adapter declares no pipeline domain for this pin")
    # a witness is a valid input of the function first, and uses only what the pipeline is shown to produce
    pipe = declared.pipeline.within(declared.domain).produced_only()
    # judged as the pipeline would run it: the twins a property builds stay inside the pipeline too
    inside = dataclasses.replace(declared, domain=pipe)
    same = lambda c: diagnose(run, c, declared, prop).mechanism == mechanism  # noqa: E731

    def outside(c: Case) -> str | None:  # a twin-built property also needs its twin in the pipeline
        return pipe.rejects(c) or _twin_outside(c, prop, pipe, inside)

    why = outside(case)
    if why is None and _violates(run, case, inside, prop):
        return Reach("pipeline", case, "the shrunk case is inside the pipeline domain")
    why = why or "the property needed poison the pipeline does not make"
    if known is not None and outside(known) is None:
        try:
            if _violates(run, known, inside, prop) and same(known):
                return Reach("pipeline", known, "the recorded pipeline witness still violates it")
        except Exception:  # noqa: BLE001 - a witness the target cannot run any more is no witness
            pass
    projected = pipe.project(case)
    if projected is not None and outside(projected) is None:
        try:
            if _violates(run, projected, inside, prop) and same(projected):
                return Reach("pipeline", projected, f"projected into the pipeline domain (was: {why})")
        except Exception:  # noqa: BLE001 - a projection the target cannot run is no witness
            pass
    if examples <= 0:
        return Reach("api", None, f"outside the pipeline domain ({why}); no recorded or projected witness")
    found = fuzz_target(
        run,
        inside,
        target="reach",
        max_examples=examples,
        seed=seed,
        sizes=sizes,
        nonfinite=pipe.nonfinite_poison,
        properties=(prop,),
        options=dict(case.options),  # the witness runs the finding's configuration
    ).finding(prop)
    if found is None or outside(found.case) is not None:
        return Reach("api", None, f"outside the pipeline domain ({why}); no witness in {examples} examples inside it")
    if _violates(run, found.case, inside, prop) and same(found.case):
        return Reach("pipeline", found.case, f"found by a search inside the pipeline domain (the shrunk case: {why})")
    return Reach("api", None, f"outside the pipeline domain ({why}); no witness in {examples} examples inside it")


def _twin_outside(case: Case, prop: str, pipe, declared: Declared) -> str | None:
    """Why the twin a property builds lies outside the pipeline (the failure is on the twin)."""
    if prop == "gap-invariance":
        made = with_inserted_gap(case)
        twin = made[0] if made else None
    elif prop == "row-independence":
        twin = with_extra_row(case, declared.domain)[0]
    elif prop == "pad-invariance" and prop in spec(declared.kind).properties:  # a kind that pads (not GAE)
        twin = with_padding(case, spec(declared.kind), declared)
    else:
        return None
    why = pipe.rejects(twin) if twin is not None else None
    return f"the {prop} twin: {why}" if why else None


def triage(
    result: FuzzResult,
    run: Run,
    declared: Declared,
    *,
    entry: str | None = None,
    seed: int = 0,
    witness_examples: int = WITNESS_EXAMPLES,
) -> list[Defect]:
    """Diagnose, place and grade every finding of `result` (in place) and return its defects,
    most severe first; `result.facts` gets the findings that break no promise."""
    label = result.target + (f":{entry}" if entry and ":" not in result.target else "")
    defects: dict[str, list[Finding]] = {}
    facts: dict[str, list[Finding]] = {}
    for finding in result.findings:
        judge_finding(run, finding, declared, seed=seed, examples=witness_examples)
        finding.defect = f"{label}/{finding.mechanism}"
        (defects if finding.promise is not None else facts).setdefault(finding.mechanism, []).append(finding)
    # one root cause is one defect: its other properties go with it ("unexplained" names no root cause)
    for mechanism in (set(facts) & set(defects)) - {"unexplained"}:
        defects[mechanism] += facts.pop(mechanism)
    owner = {f.property: m for groups in (defects, facts) for m, members in groups.items() for f in members}
    out = []
    for mechanism, members in defects.items():
        piped = [f for f in members if f.reach == "pipeline" and f.promise is not None]
        pool = [f.witness for f in piped if f.witness is not None] or [f.case for f in members]
        out.append(
            Defect(
                id=f"{label}/{mechanism}",
                mechanism=mechanism,
                reach="pipeline" if piped else "api",
                severity=worst(f.severity for f in members if f.promise is not None),
                properties=_explained(members, mechanism, owner),
                case=min(pool, key=_area),
                findings=members,
                promise=_strongest(members),
            )
        )
        pipe = declared.configured(out[-1].case).pipeline
        if piped and pipe is not None:
            out[-1].built_from = pipe.citations(out[-1].case)
    result.facts = [
        Fact(
            id=f"{label}/{mechanism}",
            kind=members[0].fact,
            mechanism=mechanism,
            properties=_explained(members, mechanism, owner),
            case=min((f.case for f in members), key=_area),
            evidence=members[0].evidence,
            why=members[0].why_fact,
            findings=members,
        )
        for mechanism, members in facts.items()
    ]
    rank = {"high": 0, "medium": 1, "low": 2}
    out.sort(key=lambda d: (rank[d.severity], d.reach != "pipeline", d.id))
    return out


def judge_finding(run: Run, finding: Finding, declared: Declared, *, seed: int = 0, examples: int = WITNESS_EXAMPLES,
                  known: Case | None = None) -> None:  # fmt: skip
    """Fill in `finding`'s mechanism, reach, promise and severity (or why it is a fact). A finding
    that would break no promise even with a pipeline witness is a semantics fact: no witness search."""
    prop = finding.property
    finding.judged = "" if declared.reference else "invariants only"
    d = diagnose(run, finding.case, declared, prop)
    finding.mechanism, finding.evidence = d.mechanism, d.evidence
    cfg = declared.configured(finding.case)
    in_force = resolve(tuple(declared.options), finding.case.options)  # the words speak of some configurations
    promises = tuple(p for p in cfg.promises if p.under(in_force))
    if broken(prop, d.mechanism, promises, reach="pipeline", kind=cfg.kind) is None:
        finding.reach, finding.witness, finding.reach_how = "api", None, "not searched: no promise covers it"
        finding.promise, finding.severity = None, ""
        finding.fact = fact_kind(prop, d.mechanism)
        finding.why_fact = f"no universal invariant and none of the framework's own words cover {prop} ({d.mechanism})"
        return
    r = reach(run, finding.case, prop, d.mechanism, declared, seed=seed, examples=examples, known=known)
    finding.reach, finding.witness, finding.reach_how = r.level, r.witness, r.how
    finding.promise = broken(prop, d.mechanism, promises, reach=r.level, kind=cfg.kind)
    if finding.promise is None:
        finding.severity, finding.fact = "", fact_kind(prop, d.mechanism)
        finding.why_fact = f"the universal invariant speaks of pipeline input; {r.how}"
        return
    case = finding.witness if finding.witness is not None else finding.case
    finding.severity = grade(
        d.mechanism,
        prop,
        r.level,
        degenerate=_only_degenerate(run, case, declared, prop),
        rescale=finding.verdict.scale is not None,
    )


def _only_degenerate(run: Run, case: Case, declared: Declared, prop: str) -> bool:
    """Whether the failure needs a degenerate configuration: an all-empty step, or groups of one that
    the failure does not outlive once each trained row gets a partner in its group (a shrunk case is
    often a group of one by accident; the defect is graded by what it needs, not by its smallest case)."""
    grouped = spec(declared.kind).grouped
    if not degenerate(case, prop, grouped):
        return False
    if prop == "empty-step" or not bool(case.trainable.any()):
        return True
    live = case.trainable.any(dim=1).nonzero().flatten()
    mates = clean_twin(case.rows(live), spec(declared.kind))  # partners without the poison: it would cancel
    partners = mates.replace(score=mates.score + 1.0)
    try:
        return not _violates(run, case.with_rows(partners), declared, prop)
    except Exception:  # noqa: BLE001 - a twin the target cannot run tells nothing: keep what the case shows
        return True


def _area(c: Case) -> tuple:
    return (c.shape[0] * c.shape[1], c.shape)


def _explained(members: list[Finding], mechanism: str, owner: dict) -> list[str]:
    """The properties one mechanism explains: its findings', and the others each case also violates
    unless another mechanism owns them."""
    props = [f.property for f in members]
    for f in members:
        props += [p for p in f.also if p not in props and owner.get(p, mechanism) == mechanism]
    return props


def _strongest(members: list[Finding]) -> Promise | None:
    """The promise a defect names: the framework's own words where a finding breaks them, else the
    universal invariant of its first finding (the property priority order)."""
    promises = [f.promise for f in members if f.promise is not None]
    return next((p for p in promises if not p.universal), promises[0] if promises else None)


def retriage(run: Run, case: Case, verdict, declared: Declared, key: str, known: Case | None = None) -> dict:
    """The triage of a replayed failure at this pin, as the JSON of a finding: root cause, reach without
    a search (the case, the recorded witness `known` or its projection), the promise and severity, or why
    it is a fact."""
    f = Finding(target=key, pin="", resolved="", property=verdict.property, case=case, verdict=verdict)
    judge_finding(run, f, declared, examples=0, known=known)
    out = {
        "defect": f"{key}/{f.mechanism}",
        "mechanism": f.mechanism,
        "evidence": f.evidence,
        "severity": f.severity,
        "reach": f.reach,
        "reach_how": f.reach_how,
        "class": "defect" if f.is_defect else f.fact,
        **({"judged": f.judged} if f.judged else {}),
    }
    if f.is_defect:
        out |= f.promise.to_json() | {"reach_evidence": reach_evidence(f.reach)}
    else:
        out["why_not_a_defect"] = f.why_fact
    return out

"""From property findings to defects a maintainer accepts: root cause, reach and severity.

For each shrunk finding `triage` asks
  * which mechanism explains it (`oracles.diagnosis.diagnose`, probes on the shrunk case);
  * whether the framework's own pipeline can produce it (`reach`): the case itself when it lies
    inside the target's pipeline domain, else its projection into that domain (finite poison
    instead of NaN, zeroed masked rewards, the pipeline's dtype), else a short search inside the
    pipeline domain for that property, re-shrunk there. A witness counts only when the same
    mechanism explains it. No pipeline domain declared, or no witness: `reach: api`;
and groups the findings into defects by mechanism: one line each, the properties it explains,
its reach (pipeline when any of its findings has a pipeline witness), its worst severity and its
smallest case.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from maskfuzz.fuzz.engine import Finding, FuzzResult, fuzz_target
from maskfuzz.fuzz.strategies import Sizes
from maskfuzz.oracles.case import Case
from maskfuzz.oracles.diagnosis import MECHANISMS, diagnose, worst
from maskfuzz.oracles.properties import Declared, Run, judge

WITNESS_EXAMPLES = 80  # a pipeline search per finding: small, the case is usually projected instead


@dataclass(frozen=True)
class Reach:
    level: str  # "pipeline" | "api"
    witness: Case | None  # a pipeline-domain case violating the same property by the same mechanism
    how: str


@dataclass
class Defect:
    """Findings of one target explained by one mechanism."""

    id: str  # "<target>[:<entry>]/<mechanism>"
    mechanism: str
    reach: str
    severity: str
    properties: list[str]
    case: Case  # the smallest case among its findings (the pipeline witness when reach is pipeline)
    findings: list[Finding] = field(default_factory=list)

    def to_dict(self) -> dict:
        from maskfuzz.fuzz.corpus import case_to_json

        return {
            "id": self.id,
            "mechanism": self.mechanism,
            "description": MECHANISMS.get(self.mechanism, ""),
            "reach": self.reach,
            "severity": self.severity,
            "properties": self.properties,
            "case": case_to_json(self.case),
        }

    def line(self) -> str:
        b, t = self.case.shape
        return (
            f"{self.id}: {MECHANISMS.get(self.mechanism, self.mechanism)} "
            f"[reach {self.reach}, severity {self.severity}] explains {', '.join(self.properties)}; "
            f"smallest case B={b} T={t}"
        )


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
        return Reach("api", None, "the adapter declares no pipeline domain for this pin")
    pipe = declared.pipeline.within(declared.domain)  # a witness is a valid input of the function first
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
    from maskfuzz.oracles.properties import with_extra_row, with_inserted_gap

    if prop == "gap-invariance":
        made = with_inserted_gap(case)
        twin = made[0] if made else None
    elif prop == "row-independence":
        twin = with_extra_row(case, declared.domain)[0]
    elif prop == "pad-invariance" and declared.kind not in ("gae", "returns"):
        from maskfuzz.oracles.kinds import spec
        from maskfuzz.oracles.kinds.judge import with_padding

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
    most severe first."""
    label = result.target + (f":{entry}" if entry and ":" not in result.target else "")
    groups: dict[str, list[Finding]] = {}
    for finding in result.findings:
        d = diagnose(run, finding.case, declared, finding.property)
        finding.mechanism, finding.evidence, finding.severity = d.mechanism, d.evidence, d.severity
        r = reach(run, finding.case, finding.property, d.mechanism, declared, seed=seed, examples=witness_examples)
        finding.reach, finding.witness, finding.reach_how = r.level, r.witness, r.how
        finding.defect = f"{label}/{d.mechanism}"
        groups.setdefault(d.mechanism, []).append(finding)
    groups_of = {f.property: m for m, members in groups.items() for f in members}
    defects = []
    for mechanism, members in groups.items():
        piped = [f for f in members if f.reach == "pipeline"]
        pool = [f.witness for f in piped if f.witness is not None] or [f.case for f in members]
        props = [f.property for f in members]
        for f in members:  # properties the case also violates, unless another mechanism owns them
            props += [p for p in f.also if p not in props and groups_of.get(p, mechanism) == mechanism]
        defects.append(
            Defect(
                id=f"{label}/{mechanism}",
                mechanism=mechanism,
                reach="pipeline" if piped else "api",
                severity=worst(f.severity for f in members),
                properties=props,
                case=min(pool, key=lambda c: (c.shape[0] * c.shape[1], c.shape)),
                findings=members,
            )
        )
    rank = {"high": 0, "medium": 1, "low": 2}
    defects.sort(key=lambda d: (rank[d.severity], d.reach != "pipeline", d.id))
    return defects

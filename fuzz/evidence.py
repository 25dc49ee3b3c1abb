"""How a finding's reach is known (issue 27): run, or only cited.

`reach` is `pipeline` or `api` (`fuzz.triage`); for a pipeline finding `reach_evidence` says how that is known:

    executed  `maskfuzz validate` rebuilt the finding's input on a real rollout (a tiny LM's generations through
              the framework's own batch code at the pin, the fault only at the hooked boundary) and the step
              reproduced it: recorded with the corpus entry as its `validation`, at that resolved pin
    cited     the pipeline domain's citations (file:line at the pin) are the witness: nothing ran

A validation that ran and did not reproduce, or whose real path built no batch holding the case's masks
(`built: false`), leaves the evidence `cited` and is shown beside it (`note`): a claim the executed path does
not back. One function decides, so the fuzz JSON, the corpus, replay and the report say the same.
"""

from __future__ import annotations

from typing import Any

EXECUTED, CITED = "executed", "cited"
# a stored validation: what `maskfuzz validate --record` writes into a corpus entry
VALIDATION_FIELDS: dict[str, type | tuple[type, ...]] = {
    "target": str,  # T[:ENTRY]@PIN as validated
    "resolved": str,  # the resolved pin it ran at
    "built": bool,  # the real path built a batch holding the case's masks
    "reproduced": bool,  # ... and the step reproduced the finding there
    "line": str,  # the verdict in one line (what moved, or what was built instead)
    "hooked_boundary": str,  # where the fault entered ("" when nothing was built)
    "date": str,
}


class ValidationError(ValueError):
    """A stored validation that is not one: `field` names the key."""

    def __init__(self, message: str, field: str):
        self.field = field
        super().__init__(message)


def check(d: Any) -> dict:
    """`d` as a stored validation (every field of `VALIDATION_FIELDS`, of its type); ValidationError otherwise."""
    if not isinstance(d, dict):
        raise ValidationError(f"expected an object, got {type(d).__name__}", "validation")
    for key, typ in VALIDATION_FIELDS.items():
        if not isinstance(d.get(key), typ):
            raise ValidationError(f"expected {getattr(typ, '__name__', typ)}, got {d.get(key)!r}", f"validation.{key}")
    if d["reproduced"] and not d["built"]:
        raise ValidationError("reproduced on a batch that was not built", "validation.reproduced")
    return dict(d)


def same_rev(a: str, b: str) -> bool:
    """Two resolved pins name the same code (a full hash and its prefix, or equal `NAME==VERSION`)."""
    if a == b:
        return True
    short, long = sorted((a, b), key=len)
    return len(short) >= 7 and long.startswith(short) and "==" not in long


def executed(validation: dict | None, resolved: str | None = None) -> bool:
    """Whether `validation` reproduced the finding at `resolved` (None: at the pin it was recorded for)."""
    if not validation or not validation.get("reproduced"):
        return False
    return resolved is None or same_rev(validation["resolved"], resolved)


def reach_evidence(reach: str, validation: dict | None = None, resolved: str | None = None) -> str:
    """`executed`, `cited` or "" (reach api, nothing to evidence)."""
    if executed(validation, resolved):
        return EXECUTED
    return CITED if reach == "pipeline" else ""


def note(validation: dict | None, resolved: str | None = None) -> str:
    """What a validation that does not back the finding found ("" when none ran, or it reproduced)."""
    if not validation or executed(validation, resolved):
        return ""
    if resolved is not None and not same_rev(validation["resolved"], resolved):
        return ""
    what = "the real path did not build it" if not validation["built"] else "not reproduced on the real path"
    return f"{what} at {validation['target']}: {validation['line']}"


def applied(triage: dict | None, validation: dict | None, resolved: str | None = None) -> dict | None:
    """`triage` (a defect's JSON) with the reach the validation shows: a reproduced validation at this pin makes
    it `pipeline` / `executed`; one that did not back it adds `reach_note`. A fact (no promise) is left alone."""
    if not triage or triage.get("class", "defect") != "defect" or "promise" not in triage:
        return triage
    out = dict(triage)
    if executed(validation, resolved):
        out |= {"reach": "pipeline", "reach_evidence": EXECUTED,
                "reach_how": f"executed: {validation['target']} reproduced it on a real rollout"}  # fmt: skip
    elif why := note(validation, resolved):
        out["reach_note"] = why
    return out


def label(reach: str, evidence: str = "") -> str:
    """The reach as a report shows it: `pipeline (executed)`, `pipeline (cited)`, `api`."""
    return f"{reach} ({evidence})" if reach == "pipeline" and evidence else reach


def stored(record: dict, *, date: str) -> dict:
    """The validation to store with a corpus entry, from a `fuzz.validate` record."""
    verdict = record["verdict"]
    return check({
        "target": record["target"],
        "resolved": record["resolved"],
        "built": True,
        "reproduced": bool(verdict["reproduced"]),
        "line": verdict["line"],
        "hooked_boundary": record["recipe"].get("hooked_boundary", ""),
        "date": date,
    })  # fmt: skip


def not_built(target: str, resolved: str, why: str, *, date: str) -> dict:
    """The validation to store when the real path built no batch holding the case (`fuzz.validate.NotBuilt`)."""
    return check({"target": target, "resolved": resolved, "built": False, "reproduced": False, "line": why,
                  "hooked_boundary": "", "date": date})  # fmt: skip

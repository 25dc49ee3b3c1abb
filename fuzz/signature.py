"""The de-duplication identity: when two findings are one bug, as named rules.

A triaged finding is its root cause (`identity`: the target, the mechanism, the options it needs); an
untriaged one is its failure signature, built by `SIGNATURE_RULES` in order: the property, which output
failed, the kinds of the positions involved (`position_kind`), the dtype class (`DTYPE_CLASS`), the
failure kind of a crash (`failure_kind`), the options the case needs, a cut row. The corpus keeps one
entry per identity (`fuzz.corpus.record`); the nightly report follows a finding across nights by it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from maskfuzz.oracles.case import Case
from maskfuzz.oracles.verdict import Verdict

DTYPE_CLASS = {"float64": "f64", "float32": "f32", "bfloat16": "half", "float16": "half"}
_EXC_NAME = re.compile(r"\b([A-Za-z_][A-Za-z0-9_]*(?:Error|Exception|Exit|Interrupt))\b")


def position_kind(case: Case, b: int, t: int) -> str:
    """The structural role of position [b, t] in its row:

    padding          not a real token
    masked-real      a real token that is not trainable (observation, tool output, gap)
    last-trainable   the last trainable token of the row (where the score lands)
    before-gap       a trainable token followed by a non-trainable one, with more trainable later
    trainable        any other trainable token
    """
    if not bool(case.attention[b, t]):
        return "padding"
    row = case.trainable[b]
    if not bool(row[t]):
        return "masked-real"
    if not bool(row[t + 1 :].any()):
        return "last-trainable"
    return "trainable" if bool(row[t + 1]) else "before-gap"


def failure_kind(message: str) -> str:
    """For failures without positions (crashes, exceptions): 'crash', 'hang', the exception type
    named in the message, or 'nonfinite'; '' when the message names none of them."""
    rerun = message.startswith("perturbed rerun failed")
    text = message.split(":", 1)[1].strip() if rerun else message
    if re.match(r"(crash|hang)\b", text):
        kind = text.split(None, 1)[0].rstrip(":")
    elif (m := _EXC_NAME.search(text)) is not None:
        kind = m.group(1)
    elif "non-finite output" in text:
        kind = "nonfinite"
    else:
        kind = ""
    return f"rerun-{kind}" if rerun and kind else kind


# ---------------------------------------------------------------------------------------------
# The signature rules, in order: each gives its part of the signature, or None to leave it out.
# ---------------------------------------------------------------------------------------------
Rule = Callable[[str, Verdict, Case], "str | None"]


def property_rule(prop: str, verdict: Verdict, case: Case) -> str:
    """The property that failed."""
    return prop


def output_rule(prop: str, verdict: Verdict, case: Case) -> str:
    """Which output differs ('advantages', 'returns', ...); '-' for a failure without one (a crash)."""
    return verdict.output or "-"


def positions_rule(prop: str, verdict: Verdict, case: Case) -> str:
    """The kinds of the positions involved (`position_kind`), sorted, '+'-joined; '-' for none."""
    kinds = sorted({position_kind(case, int(b), int(t)) for b, t in verdict.positions})
    return "+".join(kinds) or "-"


def dtype_rule(prop: str, verdict: Verdict, case: Case) -> str:
    """The dtype class (`DTYPE_CLASS`): bfloat16 and float16 are one ("half")."""
    return DTYPE_CLASS[case.dtype]


def failure_rule(prop: str, verdict: Verdict, case: Case) -> str | None:
    """The failure kind of the message (`failure_kind`), when it names one."""
    kind = failure_kind(verdict.message)
    return kind or None


# a finding that needs an option or a cut row is its own claim, never merged with the default's
def options_rule(prop: str, verdict: Verdict, case: Case) -> str | None:
    """The options the case needs, 'options:k=v,...' sorted by name, when it has any."""
    if case.options:
        return "options:" + ",".join(f"{k}={v}" for k, v in sorted(case.options.items()))
    return None


def truncated_rule(prop: str, verdict: Verdict, case: Case) -> str | None:
    """'truncated' when a row of the case was cut by the length limit."""
    if case.truncated is not None and bool(case.truncated.any()):
        return "truncated"
    return None


SIGNATURE_RULES: tuple[tuple[str, Rule], ...] = (
    ("property", property_rule),
    ("output", output_rule),
    ("positions", positions_rule),
    ("dtype", dtype_rule),
    ("failure", failure_rule),
    ("options", options_rule),
    ("truncated", truncated_rule),
)


def signature(prop: str, verdict: Verdict, case: Case) -> str:
    """The failure signature used to de-duplicate findings of one (target, property):

        <property>|<output>|<kinds of the positions involved, sorted, '+'-joined>|<dtype class>[|<failure kind>]

    e.g. "poison|advantages|last-trainable+trainable|f32" or "no-crash|-|-|f32|IndexError".
    Two findings with the same signature are taken to be the same bug; `record` keeps the smaller.
    The dtype class groups bfloat16 and float16 ("half"): rounding bugs look alike in both.
    The parts are `SIGNATURE_RULES`, in order, '|'-joined; a rule that gives None adds no part.
    """
    parts = (rule(prop, verdict, case) for _, rule in SIGNATURE_RULES)
    return "|".join(part for part in parts if part is not None)


# ---------------------------------------------------------------------------------------------
# The identity of a corpus entry: its root cause once triaged, else its signature.
# ---------------------------------------------------------------------------------------------
def identity(entry: Any) -> tuple:
    """What makes two entries one defect: (target key, root cause, the options it needs) once triaged, so
    the properties one mechanism breaks are one entry (the others in `also`) while a failure that needs an
    option (another cause with the same mechanism's name) stays its own; else (target key, property,
    signature). `entry` is a corpus entry (`fuzz.corpus_codec.Entry`)."""
    mechanism = (entry.triage or {}).get("mechanism")
    if mechanism:
        return (entry.key, "mechanism", mechanism, tuple(sorted(entry.case.options)))
    return (entry.key, "signature", entry.property, entry.signature)

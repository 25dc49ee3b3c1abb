"""Framework options and truncated rows: what a configuration changes in the masked math.

An `Option` is one of a framework's real configuration keys that touches the masked math at a
pin (advantage whitening, the KL estimator, a std normaliser, reward clipping, EOS handling). It
names its values, its default, where the framework reads it (`cite`, file:line) and, per value,
its `effect`: the changes to the target's `Declared` promise that the reference applies in float64
(`variant` keys merge into the kind's variant; `whitening`, `truncation`, `score_map`, `contract`,
`masked_zero` replace). A case carries the options it was run with (`Case.options`, only the
values that differ from the defaults: `{}` is the default configuration).

A row is `truncated` when the length limit cut it (no EOS). `Truncation` is what the framework
does with such a row, with its citation; `reference_case` rewrites a case into the inputs the
float64 reference sees under that semantics and the options' score map:

    score_map   ops on the score, in order: ("add", b), ("mul", a), ("clip", c) = clamp to [-c, c]
    truncated rows, after the score map:
      score      "kept" | "zero" (the outcome reward of a cut row is dropped) | ("add", p) (a penalty)
      bootstrap  "none" (terminal: V after the last token is 0) | "value": V'_K = Case.bootstrap[b],
                 the critic value of the state after the last token, i.e. the last trainable
                 reward gains gamma * bootstrap (both contracts add the score there too)
      row        "kept" | "masked" (the row's loss mask is cleared: it contributes nothing)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch

# fuzz/repro_copier.py copies a definition with only the imports its code reads: `Option` and `Truncation` read none
from maskfuzz.oracles.case import Case, CaseError

SCORE_OPS = ("add", "mul", "clip")


@dataclass(frozen=True)
class Truncation:
    """What a target does with a row cut by the length limit (see the module docstring)."""

    score: Any = "kept"  # "kept" | "zero" | ("add", penalty)
    bootstrap: str = "none"  # "none" | "value"
    row: str = "kept"  # "kept" | "masked"
    cite: str = ""  # where the framework decides it, file:line at the pin

    def __post_init__(self) -> None:
        score = tuple(self.score) if isinstance(self.score, list) else self.score
        object.__setattr__(self, "score", score)
        if not (score in ("kept", "zero") or (isinstance(score, tuple) and len(score) == 2 and score[0] == "add")):
            raise ValueError(f"Truncation.score must be 'kept', 'zero' or ('add', p), got {self.score!r}")
        if self.bootstrap not in ("none", "value"):
            raise ValueError(f"Truncation.bootstrap must be 'none' or 'value', got {self.bootstrap!r}")
        if self.row not in ("kept", "masked"):
            raise ValueError(f"Truncation.row must be 'kept' or 'masked', got {self.row!r}")

    @property
    def terminal(self) -> bool:
        """A cut row is treated as ended: the reference is the same as for an ended row."""
        return self.score == "kept" and self.bootstrap == "none" and self.row == "kept"

    def describe(self) -> str:
        parts = []
        if self.score == "zero":
            parts.append("score dropped")
        elif isinstance(self.score, tuple):
            parts.append(f"score {self.score[1]:+g}")
        parts.append("bootstrap from the state value" if self.bootstrap == "value" else "zero bootstrap")
        if self.row == "masked":
            parts.append("row masked")
        return ", ".join(parts)

    def to_json(self) -> dict:
        return {
            "score": list(self.score) if isinstance(self.score, tuple) else self.score,
            "bootstrap": self.bootstrap,
            "row": self.row,
            "cite": self.cite,
            "semantics": self.describe(),
        }


@dataclass(frozen=True)
class Option:
    """One configuration key of a framework that changes the masked math.

    `values` are JSON scalars (None, JSON null, included: an option off by default), `default`
    among them; `effect[value]` is the dict of `Declared` changes that value makes (absent: none).
    `cite` is where the framework reads the key at the pin; `doc` says what it does in the
    framework's words."""

    name: str
    values: tuple
    default: Any
    cite: str
    doc: str = ""
    effect: dict = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        if self.default not in self.values:
            raise ValueError(f"option {self.name}: default {self.default!r} is not one of {self.values!r}")
        for value in self.effect:
            if value not in self.values:
                raise ValueError(f"option {self.name}: effect for {value!r}, which is not one of {self.values!r}")

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "values": list(self.values),
            "default": self.default,
            "cite": self.cite,
            "doc": self.doc,
        }


def without(space: tuple[Option, ...], absent: dict) -> tuple[tuple[Option, ...], list[str]]:
    """`space` without the values `absent` names (option -> (values, why): modes the code at a pin lacks), and a
    note per option narrowed. ValueError when an option's default is among them (the entry cannot run as
    configured by default: the caller skips it)."""
    out, notes = [], []
    for o in space:
        gone, why = absent.get(o.name, ((), ""))
        gone = [v for v in o.values if v in tuple(gone)]
        if not gone:
            out.append(o)
            continue
        if o.default in gone:
            raise ValueError(f"option {o.name}: its default {o.default!r} is absent at this pin ({why})")
        kept = tuple(v for v in o.values if v not in gone)
        effect = {v: e for v, e in o.effect.items() if v in kept}
        out.append(dataclasses.replace(o, values=kept, effect=effect))
        notes.append(f"option {o.name}: {', '.join(map(str, gone))} not drawn, absent at this pin ({why})")
    return tuple(out), notes


def resolve(space: tuple[Option, ...], chosen: dict) -> dict:
    """Every option of `space` with its value: `chosen` over the defaults. An option `space` does
    not have, or a value it does not take, is a CaseError that names the space."""
    by_name = {o.name: o for o in space}
    for name, value in chosen.items():
        if name not in by_name:
            known = ", ".join(sorted(by_name)) or "none"
            raise CaseError(f"option {name!r} is not an option of this target (its options: {known})")
        if value not in by_name[name].values or isinstance(value, bool) != isinstance(by_name[name].default, bool):
            raise CaseError(f"option {name}={value!r} is not one of {list(by_name[name].values)}")
    return {o.name: chosen.get(o.name, o.default) for o in space}


def apply(declared, chosen: dict):
    """`declared` (an `oracles.declared.Declared`) as it is under the options `chosen` (the
    defaults for the rest): each option's effect for its value, in the order of the space, so the
    effect of a default value (a clip that is on by default) is in force too."""
    values = resolve(declared.options, chosen)
    changes: dict = {}
    variant = dict(declared.variant)
    for opt in declared.options:
        for key, new in opt.effect.get(values[opt.name], {}).items():
            if key == "variant":
                variant.update(new)
            elif key == "truncation":
                base = changes.get("truncation", declared.truncation) or Truncation()
                changes["truncation"] = dataclasses.replace(base, **new) if isinstance(new, dict) else new
            elif key == "score_map":
                changes["score_map"] = tuple(changes.get("score_map", declared.score_map)) + tuple(new)
            else:
                changes[key] = new
    return dataclasses.replace(declared, variant=variant, **changes)


def map_score(score: torch.Tensor, ops: tuple) -> torch.Tensor:
    """`score` (float64 [B]) through the ops of a score map, in order."""
    for op, arg in ops:
        if op == "add":
            score = score + arg
        elif op == "mul":
            score = score * arg
        elif op == "clip":
            score = score.clamp(-arg, arg)
        else:
            raise ValueError(f"unknown score op {op!r}; expected one of {SCORE_OPS}")
    return score


def reference_case(case: Case, declared) -> Case:
    """The inputs the float64 reference sees for `case` under `declared`'s score map and truncation
    semantics; `case` itself when none changes anything. Values are exact float64 (no rounding to the
    case's dtype: the framework computes these in its own precision). A GAE / returns target's KL in the
    reward folds in first (`oracles.kinds.gae.kl_reward.reference_case`)."""
    trunc = declared.truncation or Truncation()
    cut = case.truncated
    active = cut is not None and bool(cut.any()) and not trunc.terminal
    if not declared.score_map and not active:
        return case
    score = map_score(case.score, tuple(declared.score_map))
    trainable = case.trainable
    if active:
        if trunc.score == "zero":
            score = torch.where(cut, torch.zeros_like(score), score)
        elif isinstance(trunc.score, tuple):
            score = torch.where(cut, score + trunc.score[1], score)
        if trunc.bootstrap == "value":
            score = torch.where(cut, score + case.gamma * case.bootstrap_values(), score)
        if trunc.row == "masked":
            trainable = trainable & ~cut[:, None]
    if torch.equal(score, case.score) and torch.equal(trainable, case.trainable):
        return case  # e.g. a clip that clips nothing: the closed-form properties still apply
    return dataclasses.replace(case, score=score, trainable=trainable)


def changes_reference(case: Case, declared) -> bool:
    """Whether the configuration makes the reference's inputs differ from the case's own (the
    closed-form properties, stated on the raw case, do not apply then)."""
    return reference_case(case, declared) is not case

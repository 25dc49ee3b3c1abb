"""Semantics cards: which variant an entry's code implements, inferred on clean cases.

A difference from one of our references is not a defect by itself (`oracles.promises`): it is a
fact about the code. A card states those facts for one entry at one pin, dimension by dimension
(`KindSpec.dimensions`, the `DIMENSIONS` of each kind's package: for a group advantage the std, eps
placement, singleton rule, whether rows without a trainable token count; for GAE the contract, what
happens to a score on a masked tail; for a loss its normaliser, scope and empty rows), each as the set of
candidate values that agree with the target on every clean case that tells them apart. A change of a
card between two pins or nights is a *behaviour change* (bisected like a finding, never called a defect).

Inference (`infer`) takes the target's outputs on clean cases (no poison, no NaN, options at their
defaults) and compares them with the float64 reference of each candidate, one dimension changed at a
time from the declared variant, within the judge's tolerance; where the declared variant itself
disagrees and no single change explains it, pairs of changes are tried, then it says plainly that
none of ours matches.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from maskfuzz.oracles.case import Case
from maskfuzz.oracles.declared import Declared
from maskfuzz.oracles.kinds import spec
from maskfuzz.oracles.kinds.gae.reference import last_trainable
from maskfuzz.oracles.kinds.judge import condition_of
from maskfuzz.oracles.options import reference_case
from maskfuzz.oracles.tolerance import kind_bound, mismatches

MASKED = "masked outputs"  # what outputs hold at masked positions on clean cases
SCORE_TAIL = "score on a masked tail"  # GAE / returns: whether a score behind an observation tail arrives

Outputs = dict[str, torch.Tensor]


@dataclass(frozen=True)
class Dimension:
    """One fact of a card: `observed` are the candidates that agree with the target on every clean case
    that tells the candidates apart (empty: none of ours); `told` whether any case told them apart."""

    name: str
    declared: Any
    observed: tuple
    told: bool = True
    evidence: str = ""

    @property
    def as_declared(self) -> bool:
        return self.declared in self.observed

    def value(self) -> str:
        """The observed value as a reader sees it."""
        if not self.told:
            return "not told apart by the cases"
        if not self.observed:
            return "none of ours"
        return " | ".join(_text(v) for v in self.observed)

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "declared": self.declared,
            "observed": list(self.observed),
            "told": self.told,
            "as_declared": self.as_declared,
            "evidence": self.evidence,
        }


@dataclass
class Card:
    """The semantics of one entry at one pin (see the module docstring)."""

    target: str  # "verl:grpo@0.9.1"
    kind: str
    dimensions: list[Dimension] = field(default_factory=list)
    cases: int = 0  # clean cases judged
    matches_declared: bool = True  # the declared variant agrees on every clean case
    variant: dict = field(default_factory=dict)  # the nearest variant of ours that agrees (declared if it does)
    note: str = ""

    def dimension(self, name: str) -> Dimension | None:
        return next((d for d in self.dimensions if d.name == name), None)

    def to_json(self) -> dict:
        return {
            "target": self.target,
            "kind": self.kind,
            "cases": self.cases,
            "matches_declared": self.matches_declared,
            "variant": {k: self.variant[k] for k in sorted(self.variant)},
            "dimensions": [d.to_json() for d in self.dimensions],
            "note": self.note,
        }

    def lines(self) -> list[str]:
        head = f"{self.target} ({self.kind}, {self.cases} clean case(s)): " + (
            "the declared variant agrees" if self.matches_declared else "differs from the declared variant"
        )
        out = [head]
        for d in self.dimensions:
            flag = "" if d.as_declared or not d.told else f"  (declared {_text(d.declared)})"
            out.append(f"  {d.name}: {d.value()}{flag}" + (f" — {d.evidence}" if d.evidence else ""))
        if self.note:
            out.append(f"  note: {self.note}")
        return out


def _text(v: Any) -> str:
    return "none" if v is None else str(v).lower() if isinstance(v, bool) else str(v)


def changes(old: dict, new: dict) -> list[tuple[str, str, str]]:
    """(dimension, old value, new value) for every dimension whose observed value differs between two
    cards' JSON (`Card.to_json`); a dimension the cases did not tell apart on either side is left out."""
    before = {d["name"]: d for d in old.get("dimensions", [])}
    out = []
    for d in new.get("dimensions", []):
        b = before.get(d["name"])
        if b is None or not (b["told"] and d["told"]):
            continue
        if sorted(map(str, b["observed"])) != sorted(map(str, d["observed"])):
            fmt = lambda x: " | ".join(map(_text, x["observed"])) or "none of ours"  # noqa: E731
            out.append((d["name"], fmt(b), fmt(d)))
    return out


# ---------------------------------------------------------------------------------------------
# Inference.
# ---------------------------------------------------------------------------------------------
def infer(run: Callable[[Case], Any], cases: list[Case], declared: Declared, target: str = "") -> Card:
    """The card of `run` (a target's Run: a case to its outputs) on clean `cases` (see the module docstring).
    Cases the target or the reference cannot take are left out (the card counts the rest)."""
    kind = declared.kind
    card = Card(target=target, kind=kind)
    score_tail = spec(kind).family.score_tail
    if score_tail:  # the variant on responses without an observation tail; the tail is a fact of its own
        tails, cases = cases, [without_tails(c) for c in cases]
    seen = _run_all(run, cases, kind)
    card.cases = len(seen)
    if not seen:
        card.note = "no clean case ran to a finite output: nothing to infer"
        return card
    space = spec(kind).dimensions
    base = spec(kind).card_variant(declared)
    memo: dict = {}

    def agrees(variant: dict) -> bool | None:
        key = tuple(sorted((k, repr(v)) for k, v in variant.items()))
        if key not in memo:
            memo[key] = _agrees_everywhere(seen, declared, variant)
        return memo[key]

    card.matches_declared = agrees(base) is True
    best = base
    if not card.matches_declared:
        best = _nearest(space, base, agrees) or base
        if best is base:
            card.note = "no variant of ours within two changes of the declared one agrees on every clean case"
            # say which cases fit none, and read the dimensions from the others (a whole-batch fallback on
            # unequal groups must not hide that every regular group is normalised as declared)
            misfit = [i for i, x in enumerate(seen) if _agrees_everywhere([x], declared, base) is False]
            if 0 < len(misfit) < len(seen):
                first = seen[misfit[0]][0]
                seen = [x for i, x in enumerate(seen) if i not in misfit]
                memo.clear()
                best = base if agrees(base) is True else _nearest(space, base, agrees) or base
                card.note = (
                    f"{len(misfit)} of {len(misfit) + len(seen)} clean case(s) fit no variant of ours within two "
                    f"changes of the declared one (the first: {_describe(first)}); the dimensions below are read "
                    f"from the other {len(seen)}"
                )
    card.variant = dict(best)
    for name, candidates in space.items():
        verdicts = {}  # candidate -> agrees (candidates undefined on every case left out)
        for value in [base[name]] * (name in base and base[name] not in candidates) + list(candidates):
            ok = agrees(dict(best, **{name: value}))
            if ok is not None:
                verdicts[repr(value)] = (value, ok)
        fits = [v for v, ok in verdicts.values() if ok]
        told = bool(verdicts)
        if len(fits) > 1 and not _distinct(seen, declared, best, name, fits):
            # equivalent here (clip_high None is clip_low): one value, told only if another was ruled out
            told = len(verdicts) > len(fits)
            fits = [base.get(name) if base.get(name) in fits else fits[0]]
        card.dimensions.append(Dimension(name, base.get(name), tuple(fits), told))
    card.dimensions.append(_masked_outputs(seen, kind, "zero" if declared.masked_zero else "non-zero"))
    if score_tail:
        tail = _score_on_tail(run, _run_all(run, tails, kind), declared)
        if tail is not None:
            card.dimensions.append(tail)
    return card


def _run_all(run, cases: list[Case], kind: str) -> list[tuple[Case, Outputs]]:
    """(case, outputs) for the cases the target runs to finite outputs at trainable positions."""
    seen = []
    for case in cases:
        try:
            out = _outputs(run, case, kind)
        except Exception:  # noqa: BLE001 - a case the target refuses tells nothing about its variant
            continue
        if all(bool(torch.isfinite(x[case.trainable]).all()) for x in out.values()):
            seen.append((case, out))
    return seen


def without_tails(case: Case) -> Case:
    """`case` with every row's real tokens after its last trainable one made padding."""
    pos = torch.arange(case.shape[1])
    last = torch.where(case.trainable, pos, torch.full_like(pos, -1)).max(dim=1).values
    keep = case.attention & ((pos[None, :] <= last[:, None]) | ~case.trainable.any(dim=1, keepdim=True))
    return case if bool((keep == case.attention).all()) else case.replace(attention=keep)


def kind_variant(declared: Declared) -> dict:
    """The declared variant of a statistic kind, with its defaults (`KindSpec.card_variant`)."""
    return dict(spec(declared.kind).module.options(declared.variant))


def _outputs(run, case: Case, kind: str) -> Outputs:
    got = run(case)
    names = spec(kind).outputs
    return {n: x.detach().to("cpu", torch.float64) for n, x in zip(names, got)}


def _reference(case: Case, declared: Declared, variant: dict) -> tuple[Outputs, Outputs] | None:
    """(reference outputs, bounds) of `variant` for `case`, or None where it is undefined."""
    return spec(declared.kind).card_reference(case, declared, variant)


def kind_reference(case: Case, declared: Declared, variant: dict) -> tuple[Outputs, Outputs] | None:
    """(float64 reference outputs, the judge's bounds) of a statistic kind's `variant` for `case`, each [B, T],
    or None where its statistic is undefined (`KindSpec.card_reference`)."""
    k = spec(declared.kind)
    try:
        v = k.module.options(variant)
        ref = k.module.reference(reference_case(case, declared), v)
    except ValueError:
        return None
    if ref is None:
        return None
    return ref, {n: kind_bound(case.dtype, ref[n], condition_of(k, case, v, n)) for n in ref}


def _agrees_everywhere(seen, declared: Declared, variant: dict) -> bool | None:
    """True when `variant`'s reference agrees with the target on every case where it is defined, False
    when it disagrees somewhere, None when it is defined on none."""
    defined = False
    for case, out in seen:
        got = _reference(case, declared, variant)
        if got is None:
            continue
        defined = True
        ref, bound = got  # the judge's own tolerance for `reference`
        if any(mismatches(out[n], ref[n], bound[n], case.trainable).any() for n in ref):
            return False
    return True if defined else None


def _describe(case: Case) -> str:
    """A clean case in a few words: its shape, its groups, its rows without a trainable token."""
    b, t = case.shape
    out = f"B={b} T={t}"
    if case.group is not None:
        sizes = torch.unique_consecutive(case.group, return_counts=True)[1].tolist()
        out += f", groups of {', '.join(map(str, sizes))} rows"
    empty = int((~case.trainable.any(dim=1)).sum())
    return out + (f", {empty} row(s) without a trainable token" if empty else "")


def _nearest(space: dict, base: dict, agrees) -> dict | None:
    """The variant one, then two, changes from `base` that agrees on every case (None: none)."""
    for n_changes in (1, 2):
        for keys in itertools.combinations(space, n_changes):
            for values in itertools.product(*(space[k] for k in keys)):
                other = dict(base, **dict(zip(keys, values)))
                if other != base and agrees(other):
                    return other
    return None


def _distinct(seen, declared: Declared, best: dict, name: str, fits: list) -> bool:
    """Whether any case gives references for two of the candidates that all agree farther apart than both
    tolerances together (else no output could tell them apart there: an ill-conditioned case, a group of
    identical scores, fits both)."""
    for case, _ in seen:
        refs = [_reference(case, declared, dict(best, **{name: v})) for v in fits]
        refs = [r for r in refs if r is not None]
        for (a, bound_a), (b, bound_b) in itertools.combinations(refs, 2):
            if any(mismatches(a[n], b[n], bound_a[n] + bound_b[n], case.trainable).any() for n in a):
                return True
    return False


def _masked_outputs(seen, kind: str, declared: str) -> Dimension:
    names = spec(kind).zero_outputs
    dead = [(case, out) for case, out in seen if bool((~case.trainable).any())]
    if not dead:
        return Dimension(MASKED, declared, (), told=False)
    nonzero = any(bool((out[n][~case.trainable] != 0).any()) for case, out in dead for n in names if n in out)
    evidence = f"over {', '.join(names)} at masked positions of {len(dead)} clean case(s)"
    return Dimension(MASKED, declared, ("non-zero",) if nonzero else ("zero",), True, evidence)


def _score_on_tail(run, seen, declared: Declared) -> Dimension | None:
    """Whether score + 1 reaches the return at the last trainable token of a row that ends on masked
    real tokens (an observation tail): 'kept' (+1 as the reference), 'lost' (0), 'decayed' (between), or
    'moved otherwise'."""
    for case, out in seen:
        last = last_trainable(case.trainable)
        pos = torch.arange(case.shape[1])
        lastpos = torch.where(case.trainable, pos, torch.full_like(pos, -1)).max(dim=1).values
        tail = case.attention & (pos[None, :] > lastpos[:, None]) & case.trainable.any(dim=1, keepdim=True)
        rows = tail.any(dim=1)
        if not rows.any():
            continue
        try:
            bumped = _outputs(run, case.replace(score=case.score + 1.0), declared.kind)
        except Exception:  # noqa: BLE001 - a case the target refuses tells nothing
            continue
        b = int(rows.nonzero()[0])
        t = int(last[b].nonzero()[0])
        moved = float(bumped["returns"][b, t] - out["returns"][b, t])
        if abs(moved - 1.0) < 1e-3:
            value = "kept"
        elif abs(moved) < 1e-3:
            value = "lost"
        else:
            value = "decayed" if 0 < moved < 1 else "moved otherwise"
        return Dimension(SCORE_TAIL, "kept", (value,), True, f"score + 1 moved the return at [{b}, {t}] by {moved:.4g}")
    return None

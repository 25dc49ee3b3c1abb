"""Root causes of findings on the kinds beyond GAE (`oracles.kinds.dispatch` hands them here).

The property names most mechanisms: a crash, NaN through the mask, non-zero masked outputs, bits
that change; `poison` on a group advantage is a masked reward reaching the score, on the other
kinds a statistic over masked positions; `pad-invariance` a statistic that counts padding or
all-masked rows; `group-isolation` statistics that cross group boundaries, `permutation` too unless a probe
with every row in one group still fails (`row-order`: the place of a row in the batch moves its output).
`affine` and `reference` get probes: the same inputs in float64 (`precision`), then the reference
of each neighbouring variant (biased / unbiased std, eps placement, singleton rule, empty rows
counted, the other estimators): a match is `variant-mismatch`, naming the variant, for a human to
judge (the framework's documented choice, or an undocumented departure).
"""

from __future__ import annotations

import itertools

import torch

from maskfuzz.oracles.declared import Declared
from maskfuzz.oracles.kinds import spec
from maskfuzz.oracles.kinds.judge import affine_twin, call, carries_poison, clean_twin, condition_of, judge
from maskfuzz.oracles.mechanisms import Diagnosis
from maskfuzz.oracles.options import reference_case
from maskfuzz.oracles.tolerance import kind_bound, mismatches

_BY_PROPERTY = {
    "no-crash": "crash-degenerate",
    "poison-nonfinite": "nan-through-mask",
    "deterministic": "nondeterminism",
    "masked-zero": "masked-nonzero",
    "pad-invariance": "masked-statistics",
    "permutation": "group-mixing",
    "group-isolation": "group-mixing",
    "twin": "implementations-disagree",
    "split-invariance": "split-normaliser",
    "empty-step": "crash-degenerate",
}  # a kind's own properties name theirs in its package (`MECHANISMS`)


def diagnose_kind(run, case, declared: Declared, prop: str):
    if prop in _SHIFTABLE and declared.reference:  # the probe compares references: none for a discovered variant
        try:
            centred = _centred_probe(run, case, declared, prop)
        except Exception:  # noqa: BLE001 - a probe the target cannot run decides nothing
            centred = None
        if centred is not None:
            return centred
    if prop in ("pad-invariance", "permutation", "group-isolation"):
        leak = _leak_probe(run, case, declared, prop)  # a twin of a poisoned case can fail through the leak
        if leak is not None:
            return leak
    if prop == "permutation":
        order = _order_probe(run, case, declared)
        if order is not None:
            return order
    if prop == "masked-zero" and case.has_nonfinite_poison():  # the outputs under the mask are NaN, not values
        return Diagnosis("nan-through-mask", "NaN / inf under the mask makes the output there non-finite")
    if prop in ("no-crash", "empty-step"):
        masked = _masked_overflow_probe(run, case, declared, prop)
        if masked is not None:
            return masked
    named = _BY_PROPERTY | getattr(spec(declared.kind).module, "MECHANISMS", {})
    if prop in named:
        return Diagnosis(named[prop], f"the {prop} property names it")
    if getattr(case, "split", None) is not None and prop != "split-invariance":
        whole = case.replace(split=None, ranks=1)  # the step as one micro-batch on one rank
        try:
            verdict = next(v for v in judge(run, whole, declared, only=(prop,)) if v.property == prop)
        except Exception:  # noqa: BLE001 - a probe the target cannot run decides nothing
            verdict = None
        if verdict is not None and verdict.status == "pass":
            return Diagnosis("split-normaliser", f"{prop} holds when the step is one micro-batch on one rank")
    if prop == "poison":
        return Diagnosis(*spec(declared.kind).leak)
    try:
        return _probe(run, case, declared, prop)
    except Exception as exc:  # noqa: BLE001 - a probe the target cannot run decides nothing
        return Diagnosis("unexplained", f"a probe failed to run: {type(exc).__name__}: {exc}")


_SHIFTABLE = ("pad-invariance", "permutation", "group-isolation", "affine", "reference")


def _masked_overflow_probe(run, case, declared: Declared, prop: str):
    """A crash or non-finite output that goes away when every input under the mask is 0 comes from the
    masked values (an exp of a masked log-ratio that overflows, a NaN through a mask product), not
    from the edge case: `nan-through-mask`. None when the clean case fails too (a real crash)."""
    k = spec(declared.kind)
    if not carries_poison(case, k):
        return None
    clean = clean_twin(case, k)
    try:
        verdict = next(v for v in judge(run, clean, declared, only=(prop,)) if v.property == prop)
    except Exception:  # noqa: BLE001 - a probe the target cannot run decides nothing
        return None
    if verdict.status != "pass":
        return None
    return Diagnosis(
        "nan-through-mask",
        f"{prop} holds with every input under the mask set to 0: a masked value overflows or is NaN and reaches "
        "the outputs (inf * 0 = NaN through a mask product)",
    )


def _centred_probe(run, case, declared: Declared, prop: str):
    """`precision` when the property holds once the affine input (scores, x) is centred on its mean
    over live positions: the failure came from cancellation at a large offset (a one-pass
    variance), not from masking or grouping. Only where a shift changes nothing in exact
    arithmetic: std-normalised group advantages, shift-mean whitening."""
    k = spec(declared.kind)
    v = k.module.options(declared.variant)
    centre = getattr(k.module, "centred", None)  # the kind's twin with its affine input centred
    if centre is None or prop == "affine":
        return None
    live = case.trainable
    twin = centre(case, v)
    if twin is None:
        return None
    centred, moved = twin
    if moved < 16.0:  # no offset to cancel
        return None
    before, after = (k.module.reference(reference_case(c, declared), v) for c in (case, centred))
    if before is None or after is None or any(
        mismatches(after[n], before[n], kind_bound(case.dtype, before[n], condition_of(k, case, v, n)), live).any()
        for n in before
    ):  # fmt: skip
        return None  # the reference itself moves with the shift here (a group of one keeps its raw score)
    verdict = next(v for v in judge(run, centred, declared, only=(prop,)) if v.property == prop)
    if verdict.status == "pass":
        return Diagnosis("precision", f"{prop} holds once the inputs are centred (cancellation at a large offset)")
    return None


def _order_probe(run, case, declared: Declared):
    """Which of two mechanisms a `permutation` failure is: `row-order` when reversing the rows still fails with
    every row in one group (no group boundary left to cross: the place of a row in the batch moves its output),
    `group-mixing` when it then holds and the case had several groups. None when the probe cannot tell."""
    rows = case.trainable.shape[0]
    try:
        one = case.replace(group=[0] * rows)
        verdict = next(v for v in judge(run, one, declared, only=("permutation",)) if v.property == "permutation")
    except Exception:  # noqa: BLE001 - a probe the target cannot run decides nothing
        return None
    if verdict.failed:
        return Diagnosis("row-order", "reversing the rows changes a row's output with every row in one group")
    groups = 0 if case.group is None else len(set(case.group.tolist()))
    if verdict.status == "pass" and groups > 1:
        return Diagnosis("group-mixing", "reversing the rows holds once every row is in one group")
    return None


def _leak_probe(run, case, declared: Declared, prop: str):
    """The leak mechanism when `case` carries poison and `prop` holds once it is 0 (else None)."""
    k = spec(declared.kind)
    if not carries_poison(case, k):
        return None
    try:
        verdict = next(v for v in judge(run, clean_twin(case, k), declared, only=(prop,)) if v.property == prop)
    except Exception:  # noqa: BLE001 - a probe the target cannot run decides nothing
        return None
    if verdict.status != "pass":
        return None
    return Diagnosis(k.leak[0], f"{prop} holds once the inputs under the mask are 0")


def _probe(run, case, declared: Declared, prop: str):
    k = spec(declared.kind)
    leak = _leak_probe(run, case, declared, prop)
    if leak is not None:
        return leak
    if k.score_at_last_token:  # the score placed on a masked tail token and lost there
        trimmed = _without_tails(case)
        if trimmed is not None:
            verdict = next(v for v in judge(run, trimmed, declared, only=(prop,)) if v.property == prop)
            if verdict.status == "pass":
                return Diagnosis("score-lost", f"{prop} holds once no row ends in masked real tokens")
    if case.dtype != "float64" and "float64" in declared.domain.dtypes:
        wide = case.replace(dtype="float64")
        verdict = next(v for v in judge(run, wide, declared, only=(prop,)) if v.property == prop)
        if verdict.status == "pass":
            return Diagnosis("precision", f"{prop} holds when the same inputs run in float64")
    if prop == "affine":  # the failure is on the moved input: probe the variants there
        case, _ = affine_twin(case, k)
        if case is None:
            return Diagnosis("unexplained", "the affine twin cannot be built")
    elif prop != "reference":
        return Diagnosis("unexplained", "no single-mechanism probe isolates it")
    out = call(run, case, k)
    base = k.module.options(declared.variant)
    if k.zero_filled_normaliser and prop == "reference":
        every = _every_position(case)  # the normaliser counts padding and masked tokens as zeros
        ref = k.module.reference(reference_case(every, declared), base)
        bound = kind_bound(case.dtype, ref["loss"], condition_of(k, every, base, "loss"))
        if not mismatches(out["loss"], ref["loss"], bound, case.trainable).any():
            return Diagnosis("masked-statistics", "the loss equals the mode's over every position, masked ones as 0")
    space = k.dimensions  # the neighbouring variants: the semantics cards' dimensions
    for n_changes in (1, 2):
        for keys in itertools.combinations(space, n_changes):
            for values in itertools.product(*(space[key] for key in keys)):
                other = dict(base, **dict(zip(keys, values)))
                if other == base:
                    continue
                try:
                    ref = k.module.reference(reference_case(case, declared), other)
                except ValueError:  # a combination the kind does not define (a mode without its constant)
                    continue
                if ref is None:
                    continue
                v_other = k.module.options(other)
                if not any(
                    mismatches(out[n], ref[n], kind_bound(case.dtype, ref[n], condition_of(k, case, v_other, n)),
                               case.trainable).any()
                    for n in ref
                ):  # fmt: skip
                    changed = ", ".join(f"{key}={other[key]!r}" for key in keys)
                    # empty rows counted is a variant like any other (kinds.md): the framework's words decide
                    return Diagnosis("variant-mismatch", f"the output equals the reference with {changed}")
    return Diagnosis("unexplained", "no neighbouring variant and no float64 rerun explains it")


def _without_tails(case):
    """`case` with every row's real tokens after its last trainable one made padding (None when
    no row has such a tail)."""
    pos = torch.arange(case.shape[1])
    last = torch.where(case.trainable, pos, torch.full_like(pos, -1)).max(dim=1).values
    keep = case.attention & ((pos[None, :] <= last[:, None]) | ~case.trainable.any(dim=1, keepdim=True))
    if bool((keep == case.attention).all()):
        return None
    return case.replace(attention=keep)


def _every_position(case):
    """`case` with every position trainable and the per-token losses that were masked set to 0."""
    loss = torch.where(case.trainable, case.extra["loss"], torch.zeros_like(case.extra["loss"]))
    full = torch.ones_like(case.trainable)
    return case.replace(attention=full, trainable=full, extra={**case.extra, "loss": loss})

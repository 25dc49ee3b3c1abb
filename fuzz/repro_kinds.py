"""The reproducer's check for the kinds beyond GAE (`oracles.kinds`): what the script runs and compares.

Each property mirrors `oracles.kinds.judge`: the same twins (`clean_twin`, `with_padding`, the
reversed rows, a group alone, the moved input, the step as one micro-batch, the empty step, the
step with v_old = v), the same tolerance (`kind_bound` of the kind's condition; a target compared
with itself gets twice the bound, whose share relative to the outputs the script applies to its
own outputs, plus rounding slack). `twin` (two functions of the framework) has no standalone
check: `maskfuzz replay` reproduces it.
"""

from __future__ import annotations

import torch

from maskfuzz.fuzz.repro_check import Check, Unsupported, float_rows, mask_rows, rounded_tolerances
from maskfuzz.oracles.case import Case
from maskfuzz.oracles.declared import Declared
from maskfuzz.oracles.domain import POISON_PROBE, poison_cap
from maskfuzz.oracles.kinds import KindSpec, spec
from maskfuzz.oracles.kinds.judge import affine_twin, carries_poison, clean_twin, condition_of, with_padding
from maskfuzz.oracles.options import reference_case
from maskfuzz.oracles.tolerance import FLOOR, SAFETY, UNIT_ROUNDOFF, kind_bound


def build_kind_check(case: Case, prop: str, declared: Declared) -> Check:
    """The check of `prop` on `case` for a target of a kind beyond GAE; Unsupported where the judge
    would say n/a or no standalone check exists."""
    declared = declared.configured(case)
    k = spec(declared.kind)
    v = k.module.options(declared.variant)
    if prop not in k.properties:
        raise Unsupported(f"{prop!r} is not a property of the {k.name} kind")
    why = declared.domain.rejects(case)
    if why:
        raise Unsupported(f"the target cannot express this case: {why}")
    if prop == "no-crash":
        if case.has_nonfinite_poison():  # the judge leaves non-finite outputs to poison-nonfinite: errors only
            return Check(case, None, {"kind": "finite", "raises_only": True}, "no error, or a documented one")
        return Check(case, None, {"kind": "finite"}, "finite outputs at trainable positions, or a documented error")
    if prop == "empty-step":
        return _empty(case, k)
    if prop == "deterministic":
        where = mask_rows(torch.ones(case.shape, dtype=torch.bool))
        return Check(
            case, None, {"kind": "same", "outputs": {n: {"where": where} for n in k.outputs}}, "the first run (bitwise)"
        )
    if prop == "masked-zero":
        if not declared.masked_zero:
            raise Unsupported("the target documents non-zero outputs at masked positions")
        dead = ~case.trainable
        if not dead.any():
            raise Unsupported("masked-zero: the case has no non-trainable position")
        zero = float_rows(torch.zeros(case.shape, dtype=torch.float64))
        outputs = {n: {"expected": zero, "tolerance": 0.0, "where": mask_rows(dead)} for n in k.zero_outputs}
        return Check(case, None, {"kind": "expected", "outputs": outputs}, "0 at every non-trainable position")
    if prop in ("reference", "affine"):
        return _expected(case, prop, k, v, declared)
    if prop in getattr(k.module, "SCORE_MOVES", {}):
        return _moved(case, prop, k, v, declared)
    if prop == "twin":
        raise Unsupported(
            "the twin property compares two functions of the framework, which a one-function script does not "
            "hold; `maskfuzz replay` on the corpus entry reproduces it"
        )
    if prop == "clip-bound":
        free = case.replace(extra={**case.extra, "v_old": case.extra["v"]})
        return _two_runs(case, free, k, v, free, "at-least", "case", "the same step with v_old = v (no clip binds)")
    return _twin(case, prop, k, v, declared)


def _expected(case: Case, prop: str, k: KindSpec, v: dict, declared: Declared) -> Check:
    words = "the float64 reference of the kind's declared variant"
    if prop == "affine":
        if declared.score_map:
            raise Unsupported("the options map the score (clip, scale): not affine-invariant by design")
        twin, how = affine_twin(case, k)
        if twin is None:
            raise Unsupported(f"affine: {how}")
        case, words = twin, f"the float64 reference at the moved input ({how})"
    ref = k.module.reference(reference_case(case, declared), v)
    if ref is None:
        raise Unsupported("the kind's statistic is undefined for this case (too few trainable positions)")
    live = mask_rows(case.trainable)
    outputs = {
        n: {
            "expected": float_rows(ref[n]),
            "tolerance": rounded_tolerances(kind_bound(case.dtype, ref[n], condition_of(k, case, v, n))),
            "where": live,
        }
        for n in k.outputs
    }
    return Check(case, None, {"kind": "expected", "outputs": outputs}, words)


def _moved(case: Case, prop: str, k: KindSpec, v: dict, declared: Declared) -> Check:
    """A kind's own score property (`SCORE_MOVES` of its package): TWIN is the case with each row's score moved;
    the sum of each judged row's trainable outputs must change by the row's `moves` (the judge's twin and
    bound, the bound taken from the reference's outputs on both inputs: the script has no other numbers)."""
    score_move, row_sum_bound = k.module.SCORE_MOVES[prop]
    moved = score_move(case, declared, v)
    if isinstance(moved, str):
        raise Unsupported(f"{prop}: {moved}")
    move, want = moved
    twin = case.replace(score=case.score + move)
    first, second = (k.module.reference(reference_case(c, declared), v) for c in (case, twin))
    if first is None or second is None:
        raise Unsupported("the kind's statistic is undefined for this case (too few trainable positions)")
    name = k.outputs[0]
    bound = 2.0 * row_sum_bound(case, first[name], second[name], v) + 1e-3 * want.abs()
    data = {
        "kind": "moved",
        "output": name,
        "moves": [float(x) for x in want.tolist()],
        "tolerance": [float(x) for x in bound.tolist()],  # per row
        "outputs": {name: {"where": mask_rows(case.trainable & (want != 0)[:, None])}},
    }
    words = "each row's score moved by a power of two: the sum of the row's trainable outputs moves with it"
    return Check(case, twin, data, words, "the same input with each row's score moved by a power of two")


def _empty(case: Case, k: KindSpec) -> Check:
    extra = {n: torch.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0) for n, x in case.extra.items()}
    empty = case.replace(trainable=torch.zeros_like(case.trainable), extra=extra)
    zero, everywhere = float_rows(torch.zeros(case.shape, dtype=torch.float64)), mask_rows(torch.ones(case.shape) > 0)
    outputs = {n: {"expected": zero, "tolerance": 0.0, "where": everywhere} for n in k.outputs}
    return Check(empty, None, {"kind": "zero", "outputs": outputs}, "a finite 0 everywhere, or a documented error")


def _twin(case: Case, prop: str, k: KindSpec, v: dict, declared: Declared) -> Check:
    """The two-run properties: (script case, twin, mapping, which side is observed, the comparison case)."""
    b, t = case.shape
    if prop in ("poison", "poison-nonfinite"):
        if not bool((~case.trainable).any()):
            raise Unsupported(f"{prop}: no masked position")
        clean = clean_twin(case, k)
        if prop == "poison-nonfinite" or carries_poison(case, k):
            what = "0 instead of the NaN / inf inputs" if prop == "poison-nonfinite" else "0 instead of the inputs"
            what = f"the same input with {what} at masked positions"
            return _two_runs(case, clean, k, v, clean, "twin", "case", what)
        probe = min(POISON_PROBE, poison_cap(case.dtype))
        poisoned = clean_twin(case, k, probe, declared.domain)
        if not carries_poison(poisoned, k):
            raise Unsupported("poison: the domain lets no input carry anything under the mask")
        return _two_runs(poisoned, case, k, v, case, "twin", "case", "the same input with 0 at masked positions")
    if prop == "pad-invariance":
        twin = with_padding(case, k, declared)
        mapping = (list(range(b)), list(range(t)))
        what = "the same input with a padding column and an all-masked row, both at the poison probe"
        return _two_runs(case, twin, k, v, case, "twin", "twin", what, mapping)
    if prop == "permutation":
        if b < 2:
            raise Unsupported("permutation: one row")
        perm = list(range(b - 1, -1, -1))
        what = "the same rows in reverse order"
        return _two_runs(case, case.rows(perm), k, v, case, "twin", "twin", what, (perm, None))
    if prop == "group-isolation":
        if case.group is None or v.get("level", "group") == "batch":
            raise Unsupported("group-isolation: no group-level statistic")
        if v.get("std_level") == "batch" or v.get("whiten_tokens") or v.get("estimator") == "gpg":
            raise Unsupported("group-isolation: a batch statistic by design")
        if len(case.group.unique()) < 2:
            raise Unsupported("group-isolation: one group")
        rows = (case.group == case.group[0]).nonzero().flatten().tolist()
        alone = case.rows(rows)
        if k.module.reference(reference_case(alone, declared), v) is None:
            raise Unsupported("group-isolation: the group alone has an undefined statistic")
        what = "the whole batch (this case is the first row's group alone)"
        return _two_runs(alone, case, k, v, alone, "twin", "case", what, (rows, None))
    if prop == "split-invariance":
        if case.split is None or (len(case.split.unique()) < 2 and case.ranks == 1):
            raise Unsupported("split-invariance: one micro-batch on one rank")
        if v.get("scope") == "micro-batch":
            raise Unsupported("split-invariance: the framework documents normalising each micro-batch on its own")
        whole = case.replace(split=None, ranks=1)
        return _two_runs(case, whole, k, v, case, "twin", "case", "the same step as one micro-batch on one rank")
    raise Unsupported(f"no reproducer check for property {prop!r}")


def _two_runs(
    first: Case,
    second: Case,
    k: KindSpec,
    v: dict,
    judged_on: Case,
    check: str,
    observed: str,
    twin_is: str,
    mapping: tuple[list[int], list[int] | None] | None = None,
) -> Check:
    """A check that runs `first` (the script's CASE) and `second` (TWIN), the second's outputs
    mapped onto the first's positions by `mapping` (rows, columns; None: identity), compared at the
    trainable positions of `judged_on` with twice the kind's bound there."""
    rows, columns = mapping or (None, None)
    rows = list(range(first.shape[0])) if rows is None else rows
    columns = list(range(first.shape[1])) if columns is None else columns
    rtol, atol = FLOOR[judged_on.dtype]
    u = UNIT_ROUNDOFF[judged_on.dtype]
    live = mask_rows(judged_on.trainable)
    outputs = {}
    for n in k.outputs:
        absolute = 2.0 * (atol + SAFETY * u * condition_of(k, judged_on, v, n))
        outputs[n] = {"tolerance": rounded_tolerances(absolute), "relative": 2.0 * rtol, "where": live}
    if check == "at-least":
        outputs = {"loss": outputs["loss"]}
    data = {"kind": check, "observed": observed, "rows": rows, "columns": columns, "outputs": outputs}
    words = "the target's own outputs on " + (twin_is if observed == "case" else "the case as given")
    return Check(first, second, data, words, twin_is)

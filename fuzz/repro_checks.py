"""The check a reproducer makes of a property (mirrors `oracles.kinds.dispatch.judge`): `build_check`, which
computes the float64 expectation and the tolerance per position or builds the twin of a two-run check for GAE
targets and hands the kinds beyond GAE to `fuzz/repro_kinds.py`; and the properties in words (`invariant`).
"""

from __future__ import annotations

import torch

from maskfuzz.fuzz.repro_check import Check, Unsupported, float_rows, mask_rows, rounded_tolerances
from maskfuzz.fuzz.repro_kinds import build_kind_check
from maskfuzz.oracles.case import Case
from maskfuzz.oracles.declared import DEFAULT_KIND, Declared
from maskfuzz.oracles.domain import POISON_PROBE
from maskfuzz.oracles.kinds import INVARIANT as KIND_INVARIANT
from maskfuzz.oracles.kinds import spec
from maskfuzz.oracles.kinds.gae.properties import INVARIANT as GAE_INVARIANT
from maskfuzz.oracles.kinds.gae.properties import (
    INVARIANTS_ONLY,
    NEEDS_REFERENCE,
    baseline,
    expected_outputs,
    sanitized,
    with_extra_row,
    with_inserted_gap,
)
from maskfuzz.oracles.kinds.gae.reference import classic_gae_loop, last_trainable
from maskfuzz.oracles.kinds.gae.tolerance import bounds
from maskfuzz.oracles.options import reference_case
from maskfuzz.oracles.tolerance import FLOOR
from maskfuzz.oracles.whitening import masked_whiten

INVARIANT = GAE_INVARIANT | KIND_INVARIANT  # every property of every kind, in words
# the kinds beyond GAE say `reference` and `masked-zero` of their own outputs
KIND_WORDS = {
    "reference": "outputs at trainable positions equal the float64 reference of the kind's declared variant",
    "masked-zero": "outputs that the target promises to zero are 0 at non-trainable positions",
}
WORDS = {"gae": {}, "statistic": KIND_WORDS}  # by the judge's family (`KindSpec.family.name`): over INVARIANT
TWIN_PROPERTIES = ("poison", "poison-nonfinite", "row-independence", "gap-invariance", "deterministic")


def invariant(prop: str, kind: str = DEFAULT_KIND) -> str:
    """The property in words, for a target of `kind`."""
    return WORDS[spec(kind).family.name].get(prop) or INVARIANT[prop]


def build_check(case: Case, prop: str, declared: Declared) -> Check:
    """The check of `prop` on `case` for a target that promises `declared`. Raises Unsupported
    when the property does not apply to this case (the judge would say n/a)."""
    if prop not in INVARIANT:
        raise Unsupported(f"unknown property {prop!r}")
    return CHECKS[spec(declared.kind).family.name](case, prop, declared)


def _gae_check(case: Case, prop: str, declared: Declared) -> Check:
    """`build_check` of a GAE or `returns` target (the kinds beyond GAE: `fuzz.repro_kinds.build_kind_check`)."""
    declared = declared.configured(case)
    why = declared.domain.rejects(case)
    if why:
        raise Unsupported(f"the target cannot express this case: {why}")
    if not declared.reference and prop in NEEDS_REFERENCE:
        raise Unsupported(f"{prop}: {INVARIANTS_ONLY}")
    if prop == "no-crash":
        return Check(case, None, {"kind": "finite"}, "finite outputs at trainable positions, or a documented error")
    if prop in ("poison", "poison-nonfinite"):
        return _poison_check(case, prop, declared)
    if prop == "deterministic":
        where = mask_rows(torch.ones(case.shape, dtype=torch.bool))
        outputs = {"advantages": {"where": where}, "returns": {"where": where}}
        return Check(case, None, {"kind": "same", "outputs": outputs}, "the first run of the same input (bitwise)")

    exp = expected_outputs(case, declared)
    if exp is None:
        raise Unsupported("the target's whitening is undefined for this case (fewer than two trainable positions)")
    ref_adv, ref_ret = exp
    bnd = bounds(case, declared.contract, ref_adv, ref_ret, declared.whitening, baseline=baseline(case, declared))
    live = case.trainable
    if prop in ("row-independence", "gap-invariance"):
        return _twin_check(case, prop, declared, bnd)
    if prop == "reference":  # where the configured case trains (the judge's comparison)
        trained = reference_case(case, declared).trainable
        outputs = {"advantages": (ref_adv, bnd.advantages, trained), "returns": (ref_ret, bnd.returns, trained)}
        words = f"the float64 reference of the `{declared.contract}` contract" + whitened(declared)
    elif prop == "masked-zero":
        if not declared.masked_zero:
            raise Unsupported("the target documents non-zero advantages at masked positions")
        dead = ~live
        if not dead.any():
            raise Unsupported("masked-zero: the case has no non-trainable position")
        atol = torch.full(case.shape, FLOOR[case.dtype][1], dtype=torch.float64)
        outputs = {"advantages": (torch.zeros(case.shape, dtype=torch.float64), atol, dead)}
        words = "0 at every non-trainable position"
    elif prop == "score-kept":
        if case.gamma != 0.0 or not live.any():
            raise Unsupported("score-kept applies at gamma = 0 with a trainable token")
        last = last_trainable(live)
        raw = torch.where(live, case.token_rewards - case.values, torch.zeros_like(case.values))
        raw = raw + torch.where(last, case.score[:, None], torch.zeros_like(raw))
        outputs = {"advantages": (_whiten_like(raw, case, declared), bnd.advantages, last)}
        words = "r' + score - V at the last trainable token (gamma = 0)" + whitened(declared)
    elif prop == "telescoping":
        if not (case.gamma == 1.0 and case.lam == 1.0):
            raise Unsupported("telescoping applies at gamma = lam = 1")
        zero = torch.zeros_like(case.values)
        r = torch.where(live, case.token_rewards, zero) + torch.where(last_trainable(live), case.score[:, None], zero)
        raw = torch.where(live, r.flip(1).cumsum(1).flip(1) - case.values, zero)
        outputs = {"advantages": (_whiten_like(raw, case, declared), bnd.advantages, live)}
        words = "the sum of later trainable rewards minus V (gamma = lam = 1)" + whitened(declared)
    elif prop == "all-trainable":
        if not bool(live.all()):
            raise Unsupported("all-trainable applies when every position is real and trainable")
        adv, ret = torch.zeros_like(case.values), torch.zeros_like(case.values)
        for b in range(case.shape[0]):
            rewards = case.token_rewards[b].tolist()
            rewards[-1] += float(case.score[b])
            a, r = classic_gae_loop(rewards, case.values[b].tolist(), case.gamma, case.lam)
            adv[b], ret[b] = torch.tensor(a, dtype=torch.float64), torch.tensor(r, dtype=torch.float64)
        adv = _whiten_like(adv, case, declared)
        outputs = {"advantages": (adv, bnd.advantages, live), "returns": (ret, bnd.returns, live)}
        words = "classic GAE over the unmasked rows (float64)" + whitened(declared)
    else:
        raise Unsupported(f"no reproducer check for property {prop!r}")
    data = {
        "kind": "expected",
        "outputs": {
            name: {"expected": float_rows(exp_), "tolerance": rounded_tolerances(tol), "where": mask_rows(where)}
            for name, (exp_, tol, where) in outputs.items()
        },
    }
    return Check(case, None, data, words)


def _poison_check(case: Case, prop: str, declared: Declared) -> Check:
    dead = case.poison_mask()
    if not dead.any():
        raise Unsupported(f"{prop}: the case has no non-trainable position to poison")
    nonfinite = prop == "poison-nonfinite"
    if nonfinite:
        probe, clean = case, sanitized(case)
        twin_is = "the same input with 0 instead of the NaN / inf values and rewards at non-trainable positions"
    else:
        poison_rewards = declared.domain.masked_rewards
        has_poison = bool((case.values[dead] != 0).any() or (poison_rewards and (case.token_rewards[dead] != 0).any()))
        clean = sanitized(case)
        if has_poison:
            probe = case
        else:  # the judge's probe: POISON_PROBE under the mask
            fill = torch.full_like(case.values, POISON_PROBE)
            probe = case.replace(
                values=torch.where(dead, fill, case.values),
                token_rewards=torch.where(dead, fill, case.token_rewards) if poison_rewards else case.token_rewards,
            )
        what = "values and token rewards" if poison_rewards else "values"
        if not poison_rewards:
            clean = clean.replace(token_rewards=case.token_rewards)
        if case.lam == 1.0 and declared.domain.critic:  # a leak telescopes away at lam = 1: the judge probes at 0.5
            probe, clean = probe.replace(lam=0.5), clean.replace(lam=0.5)
        twin_is = f"the same input with 0 instead of the {what} at non-trainable positions"
    exp = expected_outputs(clean, declared)
    if exp is None:
        raise Unsupported("the target's whitening is undefined for this case (fewer than two trainable positions)")
    bnd = bounds(clean, declared.contract, exp[0], exp[1], declared.whitening, baseline=baseline(clean, declared))
    b_rows, t_len = case.shape
    data = {
        "kind": "twin",
        "observed": "case",
        "rows": list(range(b_rows)),
        "columns": list(range(t_len)),
        "outputs": {
            "advantages": {"tolerance": rounded_tolerances(2.0 * bnd.advantages), "where": mask_rows(case.trainable)},
            "returns": {"tolerance": rounded_tolerances(2.0 * bnd.returns), "where": mask_rows(case.trainable)},
        },
    }
    return Check(probe, clean, data, f"the target's own outputs on {twin_is}", twin_is)


def _twin_check(case: Case, prop: str, declared: Declared, bnd) -> Check:
    b_rows, t_len = case.shape
    if prop == "row-independence":
        twin, where = with_extra_row(case, declared.domain)
        rows, columns = [int(i) for i in where], list(range(t_len))
        twin_is = "the same rows in reverse order with a padding column (and a padding row where the batch has one)"
    else:
        if declared.contract != "compressed":
            raise Unsupported("gap-invariance applies to the compressed contract only")
        made = with_inserted_gap(case)
        if made is None:
            raise Unsupported("gap-invariance: no row has two trainable tokens")
        twin, p = made
        why = declared.domain.rejects(twin)
        if why:
            raise Unsupported(f"gap-invariance: the target cannot express the twin: {why}")
        rows, columns = list(range(b_rows)), [i for i in range(twin.shape[1]) if i != p]
        twin_is = f"the same input with a non-trainable token inserted at position {p}"
    data = {
        "kind": "twin",
        "observed": "twin",
        "rows": rows,
        "columns": columns,
        "outputs": {
            "advantages": {"tolerance": rounded_tolerances(2.0 * bnd.advantages), "where": mask_rows(case.trainable)},
            "returns": {"tolerance": rounded_tolerances(2.0 * bnd.returns), "where": mask_rows(case.trainable)},
        },
    }
    return Check(case, twin, data, "the target's own outputs on the case as given", twin_is)


def _whiten_like(x: torch.Tensor, case: Case, declared: Declared) -> torch.Tensor:
    return x if declared.whitening is None else masked_whiten(x, case.trainable, declared.whitening)


def whitened(declared: Declared) -> str:
    return ", whitened over the batch as the target whitens" if declared.whitening is not None else ""


CHECKS = {"gae": _gae_check, "statistic": build_kind_check}  # by the judge's family (`KindSpec.family.name`)

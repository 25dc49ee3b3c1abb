"""GAE's root causes (the `gae` and `returns` kinds): which mechanism explains a property finding, and how bad it is.

One upstream defect shows as several properties (a leaked value breaks `poison`, `reference`,
`telescoping`, ...). `diagnose` runs targeted probes on the shrunk case, each isolating one
mechanism of `shared/design/kinds.md` (Root causes), and names the first that explains it:

1. the property itself names it: a crash (`crash-degenerate`), NaN / inf under the mask
   (`nan-through-mask`), bits that change between runs (`nondeterminism`), non-zero masked
   advantages (`masked-nonzero`);
2. `masked-value-bootstrap` / `masked-reward-leak`: the case carries that poison (non-zero
   masked values / rewards; the `poison` property brings its own) and, on the case with clean
   masked positions (the twin the property built, for row-independence and gap-invariance),
   setting only the masked values (only the masked rewards) to a probe changes trainable outputs;
3. `precision`: the property holds when the same (already rounded) inputs run in float64;
4. `extra-decay`: a `compressed` target on the clean case agrees with the `dense` reference;
5. `masked-statistics`: a row's outputs depend on other rows on the clean case, or a whitening
   target agrees with the reference whitened over real tokens or every position;
6. `turn-reward-lost`: a `segment` target on the clean case agrees with the reference that keeps
   only the reward at each turn's last token;
7. `score-lost`: score + 1 moves the advantage at the last trainable token differently from the
   reference (the score sits on a masked position, is decayed, or is dropped);
8. otherwise `unexplained` (reported as such, never forced into a mechanism).

Whether a mechanism breaks a promise is `oracles.promises`' question, and how bad a defect is
`oracles.severity`'s: a diagnosis names the mechanism only.
"""

from __future__ import annotations

import dataclasses

import torch

from maskfuzz.oracles.case import Case
from maskfuzz.oracles.declared import Declared
from maskfuzz.oracles.domain import POISON_PROBE, poison_cap
from maskfuzz.oracles.kinds.gae import kl_reward
from maskfuzz.oracles.kinds.gae.kl_reward import EXTRAS as KL_EXTRAS
from maskfuzz.oracles.kinds.gae.kl_reward import reference_case
from maskfuzz.oracles.kinds.gae.properties import (
    baseline,
    expected_outputs,
    judge,
    sanitized,
    with_extra_row,
    with_inserted_gap,
)
from maskfuzz.oracles.kinds.gae.reference import last_trainable, reference
from maskfuzz.oracles.kinds.gae.tolerance import bounds
from maskfuzz.oracles.mechanisms import Diagnosis
from maskfuzz.oracles.tolerance import mismatches, self_slack
from maskfuzz.oracles.verdict import Run, call
from maskfuzz.oracles.whitening import masked_whiten

_BY_PROPERTY = {
    "no-crash": "crash-degenerate",
    "poison-nonfinite": "nan-through-mask",
    "deterministic": "nondeterminism",
    "masked-zero": "masked-nonzero",
}


def diagnose(run: Run, case: Case, declared: Declared, prop: str) -> Diagnosis:
    """The mechanism behind `case` violating `prop` on `run` (see the module docstring)."""
    declared = declared.configured(case)
    if prop == "masked-zero" and case.has_nonfinite_poison():  # the outputs under the mask are NaN, not values
        return Diagnosis("nan-through-mask", "NaN / inf under the mask makes the output there non-finite")
    if prop in _BY_PROPERTY:
        return Diagnosis(_BY_PROPERTY[prop], f"the {prop} property names it")
    try:
        return _probe(run, case, declared, prop)
    except Exception as exc:  # noqa: BLE001 - a probe the target cannot run decides nothing
        return Diagnosis("unexplained", f"a probe failed to run: {type(exc).__name__}: {exc}")


def _probe(run: Run, case: Case, declared: Declared, prop: str) -> Diagnosis:
    subject = case
    if prop == "row-independence":
        subject = with_extra_row(case, declared.domain)[0]
    elif prop == "gap-invariance" and with_inserted_gap(case) is not None:
        subject = with_inserted_gap(case)[0]
    # clean masked positions; probes at lam < 1, where a leaked value does not telescope away
    probe_lam = 0.5 if subject.lam == 1.0 and declared.domain.critic else subject.lam
    clean = sanitized(subject, rewards=True).replace(lam=probe_lam)
    exp = expected_outputs(clean, declared) if declared.reference else None
    if exp is None and declared.reference:
        return Diagnosis("unexplained", "the reference is undefined on the clean case")
    c_adv, c_ret = call(run, clean)
    if exp is None:  # invariants only (a discovered variant): the probes compare the target with itself
        exp = (c_adv, c_ret)
    bnd = bounds(clean, declared.contract, exp[0], exp[1], declared.whitening, baseline=baseline(clean, declared))
    live = clean.trainable
    slack = self_slack(clean.dtype, c_adv[live], c_ret[live])
    probe = min(POISON_PROBE, poison_cap(clean.dtype))
    if (~live).any():
        for field, mech in (("values", "masked-value-bootstrap"), ("token_rewards", "masked-reward-leak")):
            if field == "token_rewards" and not declared.domain.masked_rewards:
                continue
            own = getattr(subject, field)[~live]
            if prop != "poison" and not bool((own != 0).any()):
                continue  # the case has no such poison: a leak of the probe's cannot explain its failure
            poked = clean.replace(**{field: torch.where(live, getattr(clean, field), torch.full_like(c_adv, probe))})
            p_adv, p_ret = call(run, poked)
            moved = _moved(p_ret, c_ret, bnd.returns, slack, live)
            if declared.whitening is None:  # whitened advantages move with any masked statistic: returns decide
                moved = moved | _moved(p_adv, c_adv, bnd.advantages, slack, live)
            if moved.any():
                where = moved.nonzero().tolist()[0]
                return Diagnosis(mech, f"{field} = {probe:g} at the masked positions moved the output at {where}")
        for name in (n for n in KL_EXTRAS if n in subject.extra):  # the log-probs of a KL in the reward
            own = subject.extra[name][~live]
            if prop != "poison" and not bool((own != clean.extra[name][~live]).any()):
                continue
            poked = clean.replace(extra={**clean.extra, name: torch.where(live, clean.extra[name], -probe)})
            p_adv, p_ret = call(run, poked)
            moved = _moved(p_ret, c_ret, bnd.returns, slack, live) | _moved(p_adv, c_adv, bnd.advantages, slack, live)
            if moved.any():
                where = moved.nonzero().tolist()[0]
                return Diagnosis(
                    "masked-reward-leak", f"{name} = {-probe:g} at the masked positions moved the output at {where}"
                )
    if case.dtype != "float64" and "float64" in declared.domain.dtypes:
        wide = case.replace(dtype="float64")
        verdict = next(v for v in judge(run, wide, declared, only=(prop,)) if v.property == prop)
        if verdict.status == "pass":
            return Diagnosis("precision", f"{prop} holds when the same inputs run in float64")
    wrong = _moved(c_adv, exp[0], bnd.advantages, slack, live).any()
    wrong_ret = _moved(c_ret, exp[1], bnd.returns, slack, live).any()
    if declared.contract == "compressed" and _has_gap(clean) and (wrong or wrong_ret):
        # returns decide too: whitened advantages of a short row hide the decay
        d_exp = expected_outputs(clean, dataclasses.replace(declared, contract="dense"))
        if (
            d_exp is not None
            and not _moved(c_adv, d_exp[0], bnd.advantages, slack, live).any()
            and not _moved(c_ret, d_exp[1], bnd.returns, slack, live).any()
        ):
            return Diagnosis("extra-decay", "on the clean case the output equals the dense reference (a decay per gap)")
    if prop == "row-independence" and clean.shape[0] > 1:
        moved = _row_order(run, sanitized(case, rewards=True).replace(lam=probe_lam), declared)
        if moved is not None:
            return Diagnosis("row-order", moved)
    if clean.shape[0] > 1 or prop == "row-independence":
        rows = next(
            v for v in judge(run, clean, declared, only=("row-independence",)) if v.property == "row-independence"
        )
        if rows.failed:
            return Diagnosis("masked-statistics", f"a row's outputs depend on padding: {rows.message}")
    if clean.shape[0] > 1 and declared.whitening is None:
        alone = _row_alone(run, clean, c_adv, c_ret, bnd, slack)
        if alone is not None:
            return Diagnosis("masked-statistics", alone)
    if declared.whitening is not None and wrong:
        raw, _ = reference(reference_case(clean, declared), declared.contract)
        for name, mask in (("real tokens", clean.attention), ("every position", torch.ones_like(clean.attention))):
            try:
                other = masked_whiten(raw, mask, declared.whitening)
            except ValueError:
                continue
            if not _moved(c_adv, other, bnd.advantages, slack, live).any():
                return Diagnosis("masked-statistics", f"the output equals the reference whitened over {name}")
    if declared.contract == "segment" and (wrong or wrong_ret):
        ends = clean.trainable & ~torch.cat([clean.trainable[:, 1:], torch.zeros_like(clean.trainable[:, :1])], 1)
        # the rewards the recursion reads (a KL in the reward folded in first), kept at each turn's last token
        shaped = kl_reward.fold(clean, declared.variant.get(kl_reward.KEY))
        at_ends = torch.where(ends, shaped.token_rewards, torch.zeros_like(c_adv))
        kept = dataclasses.replace(shaped, token_rewards=at_ends)
        plain = dataclasses.replace(declared, variant={k: v for k, v in declared.variant.items() if k != kl_reward.KEY})
        k_exp = expected_outputs(kept, plain)
        if (
            k_exp is not None
            and not _moved(c_adv, k_exp[0], bnd.advantages, slack, live).any()
            and not _moved(c_ret, k_exp[1], bnd.returns, slack, live).any()
        ):
            return Diagnosis(
                "turn-reward-lost",
                "on the clean case the output equals the reference of the rewards at each turn's last token only",
            )
    if not declared.reference:  # the probes below compare with references
        return Diagnosis("unexplained", "no single-mechanism probe isolates it (invariants only: no reference)")
    moved = _score_misplaced(run, clean, declared, c_adv, c_ret, bnd, slack)
    if moved is not None:
        return Diagnosis("score-lost", moved)
    return Diagnosis("unexplained", "no single-mechanism probe isolates it")


def _row_alone(run: Run, clean: Case, c_adv, c_ret, bnd, slack) -> str | None:
    """Whether a row run by itself gives other outputs than in the batch (a statistic over the rows)."""
    for b in range(clean.shape[0]):
        a_adv, a_ret = call(run, clean.rows([b]))
        live = clean.trainable[b : b + 1]
        moved = _moved(a_adv, c_adv[b : b + 1], bnd.advantages[b : b + 1], slack, live) | _moved(
            a_ret, c_ret[b : b + 1], bnd.returns[b : b + 1], slack, live
        )
        if moved.any():
            return f"row {b} run alone gives other outputs than in the batch (a statistic over the rows)"
    return None


def _row_order(run: Run, clean: Case, declared: Declared) -> str | None:
    """Whether reversing the rows alone (no row added) moves a row's output on the clean case."""
    perm = list(reversed(range(clean.shape[0])))
    adv, ret = call(run, clean)
    r_adv, r_ret = call(run, clean.rows(perm))
    back = torch.tensor(perm)  # its own inverse
    exp = expected_outputs(clean, declared)
    if exp is None:
        return None
    bnd = bounds(clean, declared.contract, exp[0], exp[1], declared.whitening, baseline=baseline(clean, declared))
    slack = self_slack(clean.dtype, adv[clean.trainable], ret[clean.trainable])
    live = clean.trainable
    moved = _moved(r_adv[back], adv, bnd.advantages, slack, live) | _moved(r_ret[back], ret, bnd.returns, slack, live)
    if moved.any():
        return f"reversing the rows alone moved the output at {moved.nonzero().tolist()[0]}"
    return None


def _moved(a: torch.Tensor, b: torch.Tensor, bound: torch.Tensor, slack: float, where: torch.Tensor) -> torch.Tensor:
    return mismatches(a, b, 2.0 * bound + slack, where)


def _has_gap(case: Case) -> bool:
    tr = case.trainable
    for row in tr:
        idx = row.nonzero().flatten()
        if idx.numel() >= 2 and int(idx[-1] - idx[0]) + 1 != idx.numel():
            return True
    return False


def _score_misplaced(run: Run, clean: Case, declared: Declared, c_adv, c_ret, bnd, slack) -> str | None:
    """Score + 1 must move the returns (and, unwhitened, the advantages) at each row's last
    trainable token as the reference says (by +1); a different move there means the score is
    placed, decayed or dropped wrongly (earlier tokens are left out: a wrong recursion moves them
    too; whitened advantages are left out: whitening two tokens hides any score)."""
    if not clean.trainable.any():
        return None
    bumped = clean.replace(score=clean.score + 1.0)
    b_adv, b_ret = call(run, bumped)
    e0, e1 = expected_outputs(clean, declared), expected_outputs(bumped, declared)
    if e0 is None or e1 is None:
        return None
    last = last_trainable(clean.trainable)
    pairs = [("returns", b_ret - c_ret, e1[1] - e0[1], bnd.returns)]
    if declared.whitening is None:
        pairs.insert(0, ("advantage", b_adv - c_adv, e1[0] - e0[0], bnd.advantages))
    for name, got, want, bound in pairs:
        bad = _moved(got, want, bound, slack, last)
        if bad.any():
            b, t = bad.nonzero().tolist()[0]
            return (
                f"score + 1 moved the {name} at the last trainable token [{b}, {t}] by {float(got[b, t]):.6g}, "
                f"the reference by {float(want[b, t]):.6g}"
            )
    return None

"""GAE's judge (the `gae` and `returns` kinds): the properties of the spec, as checks that run an estimator on
a case and return verdicts. `oracles.kinds.dispatch.judge` hands every kind its own judge.

A `Run` maps a `Case` to (advantages, returns), both [B, T], or raises. The property ids
(`oracles.verdict.PROPERTIES`) are the vocabulary of every output of the tool. Checks that need
perturbed reruns (poison, row independence, gap invariance) build those cases themselves; `judge`
runs every check that applies to a case and returns one verdict per property.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from maskfuzz.oracles.case import Case
from maskfuzz.oracles.declared import Declared, documented
from maskfuzz.oracles.domain import POISON_PROBE, Domain, poison_cap
from maskfuzz.oracles.kinds.gae.kl_reward import EXTRAS as KL_EXTRAS
from maskfuzz.oracles.kinds.gae.kl_reward import changes_reference, reference_case
from maskfuzz.oracles.kinds.gae.reference import classic_gae_loop, last_trainable, reference
from maskfuzz.oracles.kinds.gae.tolerance import Bounds, bounds
from maskfuzz.oracles.tolerance import FLOOR, mismatches, self_slack
from maskfuzz.oracles.verdict import PROPERTIES, Run, TwinFailure, Verdict, call, describe, diff, na, ok
from maskfuzz.oracles.whitening import masked_whiten

INVARIANT = {
    "reference": "outputs at trainable positions equal the float64 reference of the declared contract",
    "poison": "finite values / token rewards at non-trainable positions never change trainable outputs",
    "poison-nonfinite": "NaN / inf values at non-trainable positions never reach trainable outputs",
    "row-independence": "a row's outputs do not depend on the order of the rows or on padding (a column; a padding "
    "row where the batch holds rows that are not samples)",
    "score-kept": "with gamma = 0 the advantage at the last trainable token is r' + score - V there",
    "telescoping": "with gamma = lam = 1, A_t = sum of r' over trainable positions >= t, minus V_t",
    "all-trainable": "with every position real and trainable, outputs equal classic GAE",
    "masked-zero": "advantages at non-trainable positions are 0",
    "no-crash": "valid inputs give finite outputs of shape [B, T] or a documented, clear error",
    "deterministic": "the same input twice gives bitwise the same output on CPU",
    "gap-invariance": "inserting non-trainable tokens leaves the trainable outputs unchanged (compressed only)",
}
SEVERITY = {p: "high" for p in PROPERTIES} | {
    "poison-nonfinite": "low",
    "masked-zero": "low",
    "deterministic": "medium",
}


def _compare(prop, exp_adv, exp_ret, bnd: Bounds, adv, ret, where, msg, scale=1.0, slack=0.0) -> Verdict:
    for name, exp, obs, bound in (("advantages", exp_adv, adv, bnd.advantages), ("returns", exp_ret, ret, bnd.returns)):
        if exp is None:
            continue
        bad = mismatches(obs, exp, bound * scale + slack, where)
        if bad.any():
            return diff(prop, name, bad, exp, obs, msg)
    return ok(prop)


# ---------------------------------------------------------------------------------------------
# Perturbed twins.
# ---------------------------------------------------------------------------------------------
def sanitized(case: Case, fill: float = 0.0, rewards: bool = True) -> Case:
    """`case` with every value (and, with `rewards`, token reward) at non-trainable positions set
    to `fill`: 0 gives the clean twin a poison check compares against, POISON_PROBE a probe."""
    dead = case.poison_mask()
    values = torch.where(dead, torch.full_like(case.values, fill), case.values)
    token_rewards = case.token_rewards
    if rewards:
        token_rewards = torch.where(dead, torch.full_like(token_rewards, fill), token_rewards)
    extra = case.extra
    if fill == 0.0 and any(n in extra for n in KL_EXTRAS):  # the log-probs of a KL in the reward: log 1 = 0
        extra = {n: torch.where(dead, torch.zeros_like(x), x) if n in KL_EXTRAS else x for n, x in extra.items()}
    return case.replace(values=values, token_rewards=token_rewards, extra=extra)


def clean_case(case: Case, declared: Declared) -> Case:
    """`case` without poison: values and token rewards 0 at non-trainable positions (`KindSpec.clean`)."""
    return sanitized(case, rewards=True)


def finite_twin(case: Case) -> Case:
    """`case` with its NaN / inf poison set to 0 and its finite poison kept."""
    fix = lambda x: torch.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0)  # noqa: E731
    return case.replace(
        values=fix(case.values),
        token_rewards=fix(case.token_rewards),
        extra={n: fix(x) if n in KL_EXTRAS else x for n, x in case.extra.items()},
    )


def with_extra_row(case: Case, domain: Domain) -> tuple[Case, torch.Tensor]:
    """The row twin: rows reversed plus what the framework treats as padding, clean (0): one padding
    column and, only where the batch holds rows that are not samples (`Domain.padding_rows`), one
    empty padding row in the middle. Never a sample: a row without trainable tokens is one, and
    whether a statistic counts it is a variant; never poison: what leaks from under the mask is
    `poison`'s question. Returns the twin and, for each original row, its index in the twin (the
    original columns are the twin's first T)."""
    b_rows, t_len = case.shape
    perm = list(reversed(range(b_rows)))
    twin = case.rows(perm)

    def col(x: torch.Tensor, fill) -> torch.Tensor:
        return torch.cat([x, torch.full((x.shape[0], 1), fill, dtype=x.dtype)], dim=1)

    twin = twin.replace(
        attention=col(twin.attention, False),
        trainable=col(twin.trainable, False),
        values=col(twin.values, 0.0),
        token_rewards=col(twin.token_rewards, 0.0),
        # a log-prob at padding: log 1 (no KL); a per-row input (ReMax's baseline) keeps the row's value
        extra={
            n: torch.cat([x, torch.zeros_like(x[:, -1:]) if n in KL_EXTRAS else x[:, -1:]], dim=1)
            for n, x in twin.extra.items()
        },
    )
    where = torch.tensor([perm.index(b) for b in range(b_rows)], dtype=torch.long)
    if domain.padding_rows:
        insert_at = b_rows // 2
        pad = Case.build(
            trainable=torch.zeros(1, t_len + 1, dtype=torch.bool),
            attention=torch.zeros(1, t_len + 1, dtype=torch.bool),
            score=[0.0],
            dtype=case.dtype,
        )
        twin = twin.with_rows(pad, at=insert_at)
        where = torch.where(where < insert_at, where, where + 1)
    return twin, where


def with_inserted_gap(case: Case) -> tuple[Case, int] | None:
    """Insert one non-trainable column right after the first trainable token of the first row
    with two or more, clean (value and reward 0), so the twin measures the extra decay of a gap
    and never re-reports poison; it is a real token where both neighbours are real. None if no
    row has two trainable tokens."""
    b_rows, t_len = case.shape
    counts = case.trainable.sum(dim=1)
    rows = (counts >= 2).nonzero().flatten()
    if not rows.numel():
        return None
    row = int(rows[0])
    p = int(case.trainable[row].nonzero()[0]) + 1
    att_col = case.attention[:, p - 1] & case.attention[:, p]

    def ins(x: torch.Tensor, col: torch.Tensor) -> torch.Tensor:
        return torch.cat([x[:, :p], col[:, None], x[:, p:]], dim=1)

    clean = torch.zeros(b_rows, dtype=torch.float64)
    twin = case.replace(
        attention=ins(case.attention, att_col),
        trainable=ins(case.trainable, torch.zeros(b_rows, dtype=torch.bool)),
        values=ins(case.values, clean),
        token_rewards=ins(case.token_rewards, torch.zeros(b_rows, dtype=torch.float64)),
        extra={n: ins(x, x[:, p - 1]) for n, x in case.extra.items()},  # per-row inputs: the neighbour's
    )
    return twin, p


# ---------------------------------------------------------------------------------------------
# The judge.
# ---------------------------------------------------------------------------------------------
@dataclass
class _Base:
    case: Case
    adv: torch.Tensor
    ret: torch.Tensor
    ref_adv: torch.Tensor
    ref_ret: torch.Tensor
    bounds: Bounds


def baseline(case: Case, declared: Declared) -> torch.Tensor | None:
    """The per-row baseline [B] a `returns` variant subtracts (ReMax), else None."""
    if declared.kind == "returns" and declared.variant.get("baseline") == "per-row":
        return case.extra["baseline"][:, 0]
    return None


def expected_outputs(case: Case, declared: Declared) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The float64 reference of the declared contract, whitened as the target whitens; None when
    the target's whitening is undefined for this case (too few trainable positions). The options'
    score map and the truncation semantics apply (`oracles.options.reference_case`)."""
    case = reference_case(case, declared)
    adv, ret = reference(case, declared.contract)
    if declared.kind == "returns" and declared.variant.get("baseline") == "per-row":
        # ReMax: A = return - b, b the row's baseline reward (extra["baseline"], constant along the row)
        base = case.extra["baseline"][:, :1]
        adv = torch.where(case.trainable, adv - base, torch.zeros_like(adv))
    if declared.whitening is not None:
        try:
            adv = masked_whiten(adv, case.trainable, declared.whitening)
        except ValueError:
            return None
    return adv, ret


def _whiten_like(adv: torch.Tensor, case: Case, declared: Declared) -> torch.Tensor:
    return adv if declared.whitening is None else masked_whiten(adv, case.trainable, declared.whitening)


def judge(
    run: Run, case: Case, declared: Declared, device: str = "cpu", only: tuple[str, ...] | None = None
) -> list[Verdict]:
    """Run `case` (and the perturbed twins it needs) through `run`; one verdict per property, in
    the order of PROPERTIES. `only` restricts the checks (the base run and no-crash always run).
    The case's options configure `declared` first."""
    declared = declared.configured(case)
    want = set(only or PROPERTIES)
    verdicts: dict[str, Verdict] = {}
    if declared.whitening is not None and expected_outputs(case, declared) is None:
        # the target documents its statistics as undefined here: nothing about the case is judged
        return _ordered({}, "the target's whitening is undefined for < 2 trainable positions")
    try:
        adv, ret = call(run, case)
    except Exception as exc:  # noqa: BLE001 - any failure of the target is a verdict
        if documented(declared, exc):
            verdicts["no-crash"] = ok("no-crash", f"documented error: {exc}")
        else:
            verdicts["no-crash"] = Verdict("no-crash", "fail", describe(exc))
        return _ordered(verdicts, "the base run raised")

    if case.has_nonfinite_poison():
        # Attribute everything on this case to the non-finite poison; the finite twin is drawn
        # as an example of its own.
        if "poison-nonfinite" in want:
            verdicts["poison-nonfinite"] = _check_poison(run, case, declared, adv, ret, nonfinite=True)
        if "masked-zero" in want:  # NaN kept at a masked advantage reaches the loss through `adv * mask`
            verdicts["masked-zero"] = _check_masked_zero(_Base(case, adv, ret, adv, ret, None), declared)
        verdicts["no-crash"] = ok("no-crash")
        return _ordered(verdicts, "checked for non-finite poison (and masked zeros under it) only")

    live = case.trainable
    bad = live & ~(torch.isfinite(adv) & torch.isfinite(ret))
    if bad.any():
        if _poison_may_overflow(case):
            return _ordered({}, "finite poison above the dtype's poison cap: an overflow is not a leak")
        leak = _nonfinite_from_poison(run, case, declared, adv, ret) if "poison" in want else None
        if leak is not None:
            verdicts["poison"] = leak
            verdicts["no-crash"] = ok("no-crash", "the non-finite output comes from finite poison")
            return _ordered(verdicts, "finite poison made the output non-finite")
        obs = torch.where(torch.isfinite(adv), ret, adv)
        verdicts["no-crash"] = diff(
            "no-crash", "advantages", bad, torch.zeros_like(adv), obs, "non-finite output on finite inputs"
        )
        return _ordered(verdicts, "the base run gave non-finite outputs")
    verdicts["no-crash"] = ok("no-crash")

    if declared.reference:
        ref_adv, ref_ret = expected_outputs(case, declared)
    else:  # invariants only: the twins are compared with the target's own outputs, at their magnitudes
        ref_adv, ref_ret = adv, ret
        for prop in NEEDS_REFERENCE:
            verdicts[prop] = na(prop, INVARIANTS_ONLY)
    bnd = bounds(
        reference_case(case, declared),
        declared.contract,
        ref_adv,
        ref_ret,
        declared.whitening,
        baseline=baseline(case, declared),
    )
    base = _Base(case, adv, ret, ref_adv, ref_ret, bnd)

    # a row the configuration takes out of training (a cut row masked by overlong filtering) has no expected
    # advantage: the reference is compared where the configured case trains
    ref_live = reference_case(case, declared).trainable
    checks = {
        "reference": lambda: _compare(
            "reference", ref_adv, ref_ret, bnd, adv, ret, ref_live, f"differs from the {declared.contract} reference"
        ),
        "masked-zero": lambda: _check_masked_zero(base, declared),
        "poison": lambda: _check_poison(run, case, declared, adv, ret, nonfinite=False, known=bnd),
        "row-independence": lambda: _check_rows(run, base, declared),
        "gap-invariance": lambda: _check_gap(run, base, declared),
        "score-kept": lambda: _closed_form(_check_score_kept, "score-kept", base, declared),
        "telescoping": lambda: _closed_form(_check_telescoping, "telescoping", base, declared),
        "all-trainable": lambda: _closed_form(_check_all_trainable, "all-trainable", base, declared),
        "deterministic": lambda: _check_deterministic(run, base, device),
    }
    for prop, check in checks.items():
        if prop not in want or prop in verdicts:
            continue
        try:
            verdicts[prop] = check()
        except TwinFailure as exc:
            verdicts[prop], crash = _twin_failed(prop, exc, declared)
            if crash is not None and not verdicts["no-crash"].failed:
                verdicts["no-crash"] = crash
        except Exception as exc:  # noqa: BLE001 - the base case itself failed on a rerun
            verdicts[prop] = na(prop, f"the rerun of the base case failed: {describe(exc)}")
            if not verdicts["no-crash"].failed:
                verdicts["no-crash"] = Verdict("no-crash", "fail", f"a second run of the case failed: {describe(exc)}")
    return _ordered(verdicts, "")


# what a variant no float64 reference describes (`Declared.reference` False: a discovered one) is not judged by:
# the reference, the closed forms of GAE, and gap-invariance (compressed or dense is the variant's own choice)
NEEDS_REFERENCE = ("reference", "score-kept", "telescoping", "all-trainable", "gap-invariance")
INVARIANTS_ONLY = "invariants only: no float64 reference describes this variant"


def _closed_form(check, prop: str, base: "_Base", declared: Declared) -> Verdict:
    """A closed-form property is stated on the case's own score and masks: n/a when the
    configuration (a score map, a truncated row's semantics) changes them; `reference` judges it."""
    if changes_reference(base.case, declared):
        return na(prop, "the options or a truncated row change the reference's inputs: judged by reference")
    if declared.variant.get("baseline"):
        return na(prop, "a baseline is subtracted from the returns: judged by reference")
    if declared.contract == "segment":
        return na(prop, "the segment contract gives each turn one value (a closed form per token does not apply)")
    return check(base, declared)


def _twin_failed(prop: str, exc: TwinFailure, declared: Declared) -> tuple[Verdict, Verdict | None]:
    """The property is n/a (its twin could not be judged); the twin's failure is a no-crash
    verdict about the twin's own case unless the error is documented behaviour."""
    if documented(declared, exc.cause):
        return na(prop, f"the perturbed twin raised a documented error: {exc.cause}"), None
    crash = Verdict("no-crash", "fail", f"the {prop} twin of the case: {describe(exc.cause)}", case=exc.case)
    return na(prop, "its perturbed twin failed: reported as no-crash on the twin's own case"), crash


def _call_twin(run: Run, twin: Case) -> tuple[torch.Tensor, torch.Tensor]:
    try:
        return call(run, twin)
    except Exception as exc:  # noqa: BLE001 - any failure of the target on a twin
        raise TwinFailure(twin, exc) from exc


def _poison_may_overflow(case: Case) -> bool:
    """Finite poison above the dtype's cap (old corpus entries: the strategies stay below it)."""
    dead = case.poison_mask()
    mags = torch.cat([case.values[dead], case.token_rewards[dead]]).abs()
    mags = mags[torch.isfinite(mags)]
    return bool(mags.numel()) and float(mags.max()) > poison_cap(case.dtype)


def _ordered(verdicts: dict[str, Verdict], why_missing: str) -> list[Verdict]:
    return [verdicts.get(p) or na(p, why_missing or "not requested") for p in PROPERTIES]


def _nonfinite_from_poison(run: Run, case: Case, declared: Declared, adv, ret) -> Verdict | None:
    """A poison verdict when the sanitized twin of `case` gives finite outputs where `case` did not
    (large finite poison overflowing into trainable outputs is a leak, not a crash)."""
    dead = case.poison_mask()
    if not bool((case.values[dead] != 0).any() or (case.token_rewards[dead] != 0).any()):
        return None
    try:
        c_adv, c_ret = call(run, sanitized(case))
    except Exception:  # noqa: BLE001 - then it is not the poison's doing
        return None
    live = case.trainable
    if not bool((torch.isfinite(c_adv[live]).all() and torch.isfinite(c_ret[live]).all())):
        return None
    for name, obs, clean in (("advantages", adv, c_adv), ("returns", ret, c_ret)):
        bad = live & ~torch.isfinite(obs)
        if bad.any():
            return diff("poison", name, bad, clean, obs, "finite poison under the mask made the output non-finite")
    return None


def _check_masked_zero(base: _Base, declared: Declared) -> Verdict:
    if not declared.masked_zero:
        return na("masked-zero", "the target documents non-zero advantages at masked positions")
    dead = ~base.case.trainable  # NaN / inf there fail too (`~(|x| <= atol)`)
    if not dead.any():
        return na("masked-zero", "no non-trainable position")
    _, atol = FLOOR[base.case.dtype]
    bad = dead & ~(base.adv.abs() <= atol)
    if bad.any():
        return diff(
            "masked-zero",
            "advantages",
            bad,
            torch.zeros_like(base.adv),
            base.adv,
            "non-zero advantage at a masked position",
        )
    return ok("masked-zero")


def poison_twins(case: Case, declared: Declared, nonfinite: bool = False) -> tuple[Case, Case]:
    """(probe, clean): the poisoned input the poison check runs and its clean twin. Non-finite: the case itself
    against its twin with the NaN / inf set to 0 (the finite poison kept, so a finite leak cancels). Finite: the
    case where it carries poison, else the probe value at the masked positions the domain lets a value (with a
    critic) or a reward be, against the twin with 0 there; at lam = 1 with a critic both at lam = 0.5 (a value leak
    telescopes away at lam = 1)."""
    if nonfinite:
        return case, finite_twin(case)
    dead = case.poison_mask()
    poison_rewards = declared.domain.masked_rewards
    has_poison = bool((case.values[dead] != 0).any() or (poison_rewards and (case.token_rewards[dead] != 0).any()))
    clean = sanitized(case, rewards=poison_rewards)
    fill = min(POISON_PROBE, poison_cap(case.dtype))
    probe = case if has_poison else sanitized(case, fill, poison_rewards)
    if probe is not case:
        v_at, r_at = declared.domain.poison_regions(dead, case.attention)
        v_at = v_at & declared.domain.critic
        probe = probe.replace(
            values=torch.where(v_at, probe.values, case.values),
            token_rewards=torch.where(r_at, probe.token_rewards, case.token_rewards),
        )
    if case.lam == 1.0 and declared.domain.critic:
        probe, clean = probe.replace(lam=0.5), clean.replace(lam=0.5)
    return probe, clean


def _check_poison(
    run: Run, case: Case, declared: Declared, adv, ret, nonfinite: bool, known: Bounds | None = None
) -> Verdict:
    """`known`: the bounds of `case`, valid for its clean twin too when lam is unchanged (the
    reference selects poison out, so it is the same for both)."""
    prop = "poison-nonfinite" if nonfinite else "poison"
    dead = case.poison_mask()
    if not dead.any():
        return na(prop, "no non-trainable position to poison")
    probe, clean = poison_twins(case, declared, nonfinite)
    if probe is case and case.lam < 1.0:
        p_adv, p_ret = adv, ret
    else:
        p_adv, p_ret = _call_twin(run, probe)
    c_adv, c_ret = _call_twin(run, clean)
    where = case.trainable
    if nonfinite:  # where the clean twin is itself non-finite there is nothing to compare
        where = where & torch.isfinite(c_adv) & torch.isfinite(c_ret)
        if not where.any():
            return na(prop, "the clean twin's outputs are non-finite at every trainable position")
    if known is not None and clean.lam == case.lam:
        bnd = known
    elif not declared.reference:  # invariants only: at the clean twin's own magnitudes
        bnd = bounds(clean, declared.contract, c_adv, c_ret, declared.whitening)
    else:
        exp = expected_outputs(clean, declared)
        if exp is None:
            return na(prop, "whitening undefined for this case")
        bnd = bounds(clean, declared.contract, exp[0], exp[1], declared.whitening, baseline=baseline(clean, declared))
    what = "non-finite" if nonfinite else "finite"
    slack = self_slack(case.dtype, c_adv[where], c_ret[where])
    verdict = _compare(
        prop,
        c_adv,
        c_ret,
        bnd,
        p_adv,
        p_ret,
        where,
        f"{what} poison under the mask changed the output",
        2.0,
        slack,
    )
    if verdict.failed and probe is not case:  # the finding is the poisoned case itself: it carries what leaks
        verdict.case = probe
    return verdict


def _base_slack(base: _Base) -> float:
    live = base.case.trainable
    return self_slack(base.case.dtype, base.adv[live], base.ret[live])


def _check_rows(run: Run, base: _Base, declared: Declared) -> Verdict:
    twin, where = with_extra_row(base.case, declared.domain)
    t_adv, t_ret = _call_twin(run, twin)
    t_len = base.case.shape[1]
    return _compare(
        "row-independence",
        base.adv,
        base.ret,
        base.bounds,
        t_adv[where, :t_len],
        t_ret[where, :t_len],
        base.case.trainable,
        "reversing the rows and adding padding changed a row's output",
        2.0,
        _base_slack(base),
    )


def _check_gap(run: Run, base: _Base, declared: Declared) -> Verdict:
    if declared.contract != "compressed":
        return na("gap-invariance", "applies to the compressed contract only")
    made = with_inserted_gap(base.case)
    if made is None:
        return na("gap-invariance", "no row has two trainable tokens")
    twin, p = made
    why = declared.domain.rejects(twin)
    if why:
        return na("gap-invariance", f"the target cannot express the twin: {why}")
    t_adv, t_ret = _call_twin(run, twin)
    keep = [i for i in range(twin.shape[1]) if i != p]
    return _compare(
        "gap-invariance",
        base.adv,
        base.ret,
        base.bounds,
        t_adv[:, keep],
        t_ret[:, keep],
        base.case.trainable,
        f"inserting a non-trainable token at position {p} changed the output",
        2.0,
        _base_slack(base),
    )


def _check_score_kept(base: _Base, declared: Declared) -> Verdict:
    case = base.case
    if case.gamma != 0.0:
        return na("score-kept", "applies at gamma = 0")
    if not case.trainable.any():
        return na("score-kept", "no trainable token")
    last = last_trainable(case.trainable)
    # at gamma = 0 every advantage is its own TD error r' - V; the score joins at the last token
    raw = torch.where(case.trainable, case.token_rewards - case.values, torch.zeros_like(case.values))
    raw = raw + torch.where(last, case.score[:, None], torch.zeros_like(raw))
    expected = _whiten_like(raw, case, declared)
    bad = mismatches(base.adv, expected, base.bounds.advantages, last)
    if bad.any():
        return diff(
            "score-kept",
            "advantages",
            bad,
            expected,
            base.adv,
            "the outcome reward is not kept at the last trainable token",
        )
    return ok("score-kept")


def _check_telescoping(base: _Base, declared: Declared) -> Verdict:
    case = base.case
    if not (case.gamma == 1.0 and case.lam == 1.0):
        return na("telescoping", "applies at gamma = lam = 1")
    zero = torch.zeros_like(case.values)
    r = torch.where(case.trainable, case.token_rewards, zero)
    r = r + torch.where(last_trainable(case.trainable), case.score[:, None], zero)
    suffix = r.flip(1).cumsum(1).flip(1)
    raw = torch.where(case.trainable, suffix - case.values, zero)
    expected = _whiten_like(raw, case, declared)
    bad = mismatches(base.adv, expected, base.bounds.advantages, case.trainable)
    if bad.any():
        return diff(
            "telescoping", "advantages", bad, expected, base.adv, "A_t != sum of later rewards - V_t at gamma = lam = 1"
        )
    return ok("telescoping")


def _check_all_trainable(base: _Base, declared: Declared) -> Verdict:
    case = base.case
    if not bool(case.trainable.all()):
        return na("all-trainable", "applies when every position is real and trainable")
    adv = torch.zeros_like(case.values)
    ret = torch.zeros_like(case.values)
    for b in range(case.shape[0]):
        rewards = case.token_rewards[b].tolist()
        rewards[-1] += float(case.score[b])
        a, r = classic_gae_loop(rewards, case.values[b].tolist(), case.gamma, case.lam)
        adv[b] = torch.tensor(a, dtype=torch.float64)
        ret[b] = torch.tensor(r, dtype=torch.float64)
    adv = _whiten_like(adv, case, declared)
    return _compare(
        "all-trainable",
        adv,
        ret,
        base.bounds,
        base.adv,
        base.ret,
        case.trainable,
        "differs from classic GAE with no mask",
    )


def _check_deterministic(run: Run, base: _Base, device: str) -> Verdict:
    if device != "cpu":
        return na("deterministic", f"bitwise determinism is a CPU property (device {device})")
    adv2, ret2 = call(run, base.case)
    for name, a, b in (("advantages", base.adv, adv2), ("returns", base.ret, ret2)):
        same = (a == b) | (torch.isnan(a) & torch.isnan(b))
        if not same.all():
            return diff("deterministic", name, ~same, a, b, "a second run gave different bits")
    return ok("deterministic")

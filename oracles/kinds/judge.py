"""The properties of the kinds beyond GAE (`shared/design/kinds.md`), on one case.

A `Run` maps a `Case` to the kind's outputs (a tuple of [B, T] tensors, `KindSpec.outputs`).
Every comparison is at trainable positions, within the one tolerance policy
(`oracles.tolerance.kind_bound`); a target compared with itself on a perturbed twin gets twice
the bound plus `self_slack`. The judge mechanics follow the GAE judge: a twin that crashes is a
`no-crash` finding on the twin's own case, non-finite poison is judged by `poison-nonfinite`
alone, finite poison stays below the dtype's cap, an undefined statistic makes every property n/a.
"""

from __future__ import annotations

import torch

from maskfuzz.oracles.case import DTYPES, Case
from maskfuzz.oracles.declared import Declared, documented
from maskfuzz.oracles.domain import POISON_PROBE, poison_cap
from maskfuzz.oracles.kinds import KindSpec, spec
from maskfuzz.oracles.options import reference_case
from maskfuzz.oracles.severity import RESCALE_RTOL, uniform_factor
from maskfuzz.oracles.tolerance import kind_bound, mismatches, self_slack
from maskfuzz.oracles.verdict import TargetFailure, TwinFailure, Verdict, describe, diff, na, ok

Outputs = dict[str, torch.Tensor]


def judge(
    run, case: Case, declared: Declared, device: str = "cpu", only: tuple[str, ...] | None = None
) -> list[Verdict]:
    """One verdict per property of the declared kind, in its priority order (the case's options
    configure `declared` first)."""
    declared = declared.configured(case)
    k = spec(declared.kind)
    v = k.module.options(declared.variant)
    want = set(only or k.properties)
    verdicts: dict[str, Verdict] = {}
    ordered = lambda why: [verdicts.get(p) or na(p, why or "not requested") for p in k.properties]  # noqa: E731
    if k.split and not bool(case.trainable.any()):  # an empty step: what it must give is empty-step's alone
        if "empty-step" in want:
            verdicts["empty-step"] = _empty_step(run, k, case, declared)
        return ordered("a step without a trainable token: judged by empty-step")
    for prop, why in declared.not_promised:  # the variant's design says otherwise: never judged, never a pass
        verdicts[prop] = na(prop, f"{NOT_PROMISED}{why}")
    if not declared.reference:  # a discovered variant: the universal invariants of its kind, nothing else
        for prop in NEEDS_REFERENCE:
            verdicts[prop] = na(prop, INVARIANTS_ONLY)
        ref = None
        if _overflows_inputs(case, k):
            return ordered(f"the inputs' scale exceeds the range of {case.dtype}: an overflow is not a defect")
    else:
        ref = k.module.reference(reference_case(case, declared), v)
        if ref is None:
            return ordered("the kind's statistic is undefined for this case (too few trainable positions)")
        if _overflows(case, ref, k, v):
            return ordered(f"the reference exceeds the range of {case.dtype}: an overflow is not a defect")
    try:
        out = call(run, case, k)
    except Exception as exc:  # noqa: BLE001 - any failure of the target is a verdict
        known = documented(declared, exc)
        verdicts["no-crash"] = (
            ok("no-crash", f"documented error: {exc}") if known else Verdict("no-crash", "fail", describe(exc))
        )
        return ordered("the base run raised")
    if case.has_nonfinite_poison():
        verdicts["no-crash"] = ok("no-crash")  # a crashing clean twin replaces it (_guard)
        if "poison-nonfinite" in want:
            verdicts["poison-nonfinite"] = _guard(
                "poison-nonfinite", lambda: _poison(run, k, v, case, out, True, declared), verdicts, declared
            )
        if "masked-zero" in want:  # a promise of zeros holds under NaN too (a mask product breaks it)
            verdicts["masked-zero"] = _masked_zero(declared, k, case, out)
        return ordered("checked for non-finite poison (and masked zeros) only")
    live = case.trainable
    for name in k.outputs:
        bad = live & ~torch.isfinite(out[name])
        if bad.any():
            expected = ref[name] if ref is not None else torch.zeros_like(out[name])  # invariants only: no value
            msg = "non-finite output on finite inputs"
            verdicts["no-crash"] = diff("no-crash", name, bad, expected, out[name], msg)
            return ordered("the base run gave non-finite outputs")
    verdicts["no-crash"] = ok("no-crash")
    checks = {
        "reference": lambda: _reference(case, declared, k, v, ref, out),
        "masked-zero": lambda: _masked_zero(declared, k, case, out),
        "poison": lambda: _poison(run, k, v, case, out, False, declared),
        "pad-invariance": lambda: _pad(run, k, v, case, out, declared),
        "permutation": lambda: _permutation(run, k, v, case, out),
        "group-isolation": lambda: _isolation(run, k, v, case, out, declared),
        "affine": lambda: _affine(run, k, v, case, declared),
        "deterministic": lambda: _deterministic(run, k, case, out, device),
        "twin": lambda: _twin_agrees(declared, k, v, case, out),
        "split-invariance": lambda: _split(run, k, v, case, out, declared),
        "empty-step": lambda: _empty_step(run, k, case, declared),
        "clip-bound": lambda: _clip_bound(run, k, v, case, out),
    }
    for prop, own in getattr(k.module, "PROPERTIES", {}).items():  # a kind's own properties, in its package
        checks.setdefault(prop, lambda own=own: own(case, out, lambda twin: _twin(run, twin, k), declared, v))
    for prop in k.properties:
        if prop in checks and prop in want and prop not in verdicts:
            verdicts[prop] = _guard(prop, checks[prop], verdicts, declared)
    return ordered("")


# what a variant without a float64 reference cannot be judged by (`Declared.reference` False): said, never a pass
NEEDS_REFERENCE = ("reference", "affine")
INVARIANTS_ONLY = "invariants only: no float64 reference describes this variant"
NOT_PROMISED = "not promised: "  # the n/a reason of a property in `Declared.not_promised`


def _reference(case: Case, declared: Declared, k: KindSpec, v: dict, ref: Outputs, out: Outputs) -> Verdict:
    bound = {n: kind_bound(case.dtype, ref[n], condition_of(k, case, v, n)) for n in k.outputs}
    # a row the configuration takes out of training (a cut row masked by mask_truncated_completions) has no
    # expected output: the reference is compared where the configured case trains
    ref_live = reference_case(case, declared).trainable
    return _compare("reference", ref, out, bound, ref_live, "differs from the float64 reference")


def _overflows_inputs(case: Case, k: KindSpec) -> bool:
    """Without a reference: whether the kind's largest intermediate at its default variant (`peak`, a function
    of the inputs' scale) is beyond the case's dtype."""
    big = float(torch.finfo(DTYPES[case.dtype]).max) / 16.0
    return hasattr(k.module, "peak") and k.module.peak(case, k.module.options(None)) > big


def condition_of(k: KindSpec, case: Case, v: dict, name: str) -> torch.Tensor:
    """The kind's condition (in units of u) for output `name`: one tensor for every output, or a
    dict by output where they round at different magnitudes (a loss and its gradient)."""
    c = k.module.condition(case, v)
    return c[name] if isinstance(c, dict) else c


def call(run, case: Case, k: KindSpec) -> Outputs:
    """The target's outputs by name, float64 on the CPU; a wrong arity or shape is a failure."""
    got = run(case)
    if not isinstance(got, (tuple, list)) or len(got) != len(k.outputs):
        raise TargetFailure(
            "exception", f"returned {type(got).__name__}, expected {len(k.outputs)} tensor(s) {k.outputs}"
        )
    out = {}
    for name, x in zip(k.outputs, got):
        if not isinstance(x, torch.Tensor) or list(x.shape) != list(case.shape):
            shape = list(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise TargetFailure("exception", f"{name} has shape {shape}, expected {list(case.shape)}")
        out[name] = x.detach().to("cpu", torch.float64)
    return out


def _guard(prop: str, check, verdicts: dict, declared: Declared | None = None) -> Verdict:
    try:
        return check()
    except TwinFailure as exc:
        if declared is not None and documented(declared, exc.cause):
            return na(prop, f"the perturbed twin raised a documented error: {exc.cause}")
        if not verdicts["no-crash"].failed:
            verdicts["no-crash"] = Verdict(
                "no-crash", "fail", f"the {prop} twin of the case: {describe(exc.cause)}", case=exc.case
            )
        return na(prop, "its perturbed twin failed: reported as no-crash on the twin's own case")


def _twin(run, twin: Case, k: KindSpec) -> Outputs:
    try:
        return call(run, twin, k)
    except Exception as exc:  # noqa: BLE001 - any failure on a twin is a no-crash finding about it
        raise TwinFailure(twin, exc) from exc


def _overflows(case: Case, ref: Outputs, k: KindSpec | None = None, v: dict | None = None) -> bool:
    """Whether the reference, or an intermediate a correct implementation forms (`peak`), is
    beyond the case's dtype."""
    big = float(torch.finfo(DTYPES[case.dtype]).max) / 16.0
    if k is not None and hasattr(k.module, "peak") and k.module.peak(case, v) > big:
        return True
    return any(bool((x[case.trainable].abs() > big).any()) for x in ref.values())


def _compare(prop, exp: Outputs, obs: Outputs, bound: Outputs, where, msg, slack: float = 0.0) -> Verdict:
    for name in exp:
        bad = mismatches(obs[name], exp[name], bound[name] + slack, where)
        if bad.any():
            verdict = diff(prop, name, bad, exp[name], obs[name], msg)
            factor = _one_factor(exp, obs, where)
            if factor is not None:  # every output off by one factor: a rescale of the term (severity medium)
                verdict.scale = factor
            return verdict
    return ok(prop)


def _one_factor(exp: Outputs, obs: Outputs, where) -> float | None:
    """The factor c with obs = c * exp for every output at `where`, when there is one (else None)."""
    factors = [uniform_factor(exp[n], obs[n], where) for n in exp]
    if any(c is None for c in factors) or max(factors) - min(factors) > RESCALE_RTOL * abs(factors[0]):
        return None
    return factors[0]


def _twin_compare(prop, k, v, case, mine: Outputs, theirs: Outputs, where, msg) -> Verdict:
    """`mine` (the case) against `theirs` (a twin mapped back to the case's positions)."""
    slack = self_slack(case.dtype, *[mine[n][where] for n in mine])
    bound = {n: 2.0 * kind_bound(case.dtype, mine[n], condition_of(k, case, v, n)) for n in mine}
    return _compare(prop, mine, theirs, bound, where, msg, slack)


def clean_twin(case: Case, k: KindSpec, fill: float = 0.0, domain=None) -> Case:
    """`case` with every poisoned input at masked positions set to `fill`; with a `domain`, only
    the inputs it lets carry something under the mask (token rewards only where `masked_rewards`)."""
    dead = ~case.trainable
    changes: dict = {}
    extra = dict(case.extra)
    names = k.poisoned
    if domain is not None and not (domain.masked_rewards and domain.token_rewards):
        names = tuple(n for n in names if n != "token_rewards")
    for name in names:
        if name == "token_rewards":
            where = dead if domain is None or fill == 0.0 else domain.poison_regions(dead, case.attention)[1]
            changes["token_rewards"] = torch.where(where, torch.full_like(case.token_rewards, fill), case.token_rewards)
        elif name in extra:
            value = -abs(fill) if domain is not None and _logprob(name, domain) else fill
            extra[name] = torch.where(dead, torch.full_like(extra[name], value), extra[name])
    return case.replace(**changes, extra=extra)


def clean_case(case: Case, declared: Declared) -> Case:
    """`case` with every poisoned input of `declared`'s kind 0 at masked positions (`KindSpec.clean`)."""
    return clean_twin(case, spec(declared.kind))


def _logprob(name: str, domain) -> bool:
    """Whether input `name` must stay a log-probability under the mask in `domain`."""
    return name in ("logp", "old_logp", "rollout_logp") and not domain.masked_logprobs


def carries_poison(case: Case, k: KindSpec) -> bool:
    dead = ~case.trainable
    per = case.per_token()
    return any(bool((per[n][dead] != 0).any()) for n in k.poisoned if n in per)


def _poison(run, k: KindSpec, v: dict, case: Case, out: Outputs, nonfinite: bool, declared: Declared) -> Verdict:
    prop = "poison-nonfinite" if nonfinite else "poison"
    if not bool((~case.trainable).any()):
        return na(prop, "no masked position")
    if nonfinite:
        clean = clean_twin(case, k)
        theirs, mine = out, _twin(run, clean, k)
        if not all(bool(torch.isfinite(mine[n][case.trainable]).all()) for n in mine):
            return na(prop, "the clean twin's own output is not finite")
        return _twin_compare(
            prop, k, v, clean, mine, theirs, case.trainable, "non-finite poison under the mask changed the output"
        )
    if carries_poison(case, k):
        clean, poisoned, mine_out, msg = (
            clean_twin(case, k),
            case,
            None,
            "finite poison under the mask changed the output",
        )
    else:
        probe = min(POISON_PROBE, poison_cap(case.dtype))
        poisoned = clean_twin(case, k, probe, declared.domain)
        if not carries_poison(poisoned, k):
            return na(prop, "the domain lets no input carry anything under the mask")
        clean, poisoned, mine_out, msg = (
            case,
            poisoned,
            out,
            f"poison {probe:g} under the mask changed the output",
        )
    mine = mine_out if mine_out is not None else _twin(run, clean, k)
    theirs = out if poisoned is case else _twin(run, poisoned, k)
    verdict = _twin_compare("poison", k, v, clean, mine, theirs, case.trainable, msg)
    if verdict.failed and poisoned is not case:  # the finding is the poisoned case itself: it carries what leaks
        verdict.case = poisoned
    return verdict


def with_padding(case: Case, k: KindSpec, declared: Declared) -> Case:
    """`case` plus what the framework treats as padding, every input there clean (0; a log-prob 0, ratio 1):
    one padding column, and, only where the batch holds rows that are not samples (`Domain.padding_rows`:
    a sample mask of 0), one padding row, empty and in a group of its own. Never a new sample in an
    existing group: a row without trainable tokens is a sample the policy produced, and whether a
    statistic counts it is a variant (`empty_rows`), not padding. Clean, so pad-invariance sees what the
    padding itself does to a normaliser or a statistic; what leaks from inputs under the mask is `poison`'s
    question (about what the pipeline places there)."""
    b, t = case.shape
    add_row = declared.domain.padding_rows

    def grow(x: torch.Tensor, fill) -> torch.Tensor:
        x = torch.cat([x, torch.full((b, 1), fill, dtype=x.dtype)], dim=1)
        if add_row:
            row = torch.full((1, t + 1), fill, dtype=x.dtype)
            x = torch.cat([x, row], dim=0)
        return x

    changes = {
        "attention": grow(case.attention, False),
        "trainable": grow(case.trainable, False),
        "token_rewards": grow(case.token_rewards, 0.0),
        "values": grow(case.values, 0.0),
        "extra": {n: grow(x, 0.0) for n, x in case.extra.items()},
    }
    if add_row:
        changes["score"] = torch.cat([case.score, torch.zeros(1, dtype=torch.float64)])
        if case.group is not None:  # a group of its own
            changes["group"] = torch.cat([case.group, case.group.max()[None] + 1])
        if case.split is not None:  # the padding row joins row 0's micro-batch
            changes["split"] = torch.cat([case.split, case.split[:1]])
        if case.truncated is not None:  # padding is never cut
            changes["truncated"] = torch.cat([case.truncated, torch.zeros(1, dtype=torch.bool)])
            changes["bootstrap"] = torch.cat([case.bootstrap_values(), torch.zeros(1, dtype=torch.float64)])
    return case.replace(**changes)


def _pad(run, k, v, case: Case, out: Outputs, declared: Declared) -> Verdict:
    twin = with_padding(case, k, declared)
    b, t = case.shape
    got = {n: x[:b, :t] for n, x in _twin(run, twin, k).items()}
    return _twin_compare(
        "pad-invariance", k, v, case, out, got, case.trainable, "padding (a column, a padding row) changed the output"
    )


def _permutation(run, k, v, case: Case, out: Outputs) -> Verdict:
    if case.shape[0] < 2:
        return na("permutation", "one row")
    perm = torch.arange(case.shape[0] - 1, -1, -1)
    got = _twin(run, case.rows(perm), k)
    back = {n: x[perm] for n, x in got.items()}  # perm is its own inverse
    return _twin_compare(
        "permutation", k, v, case, out, back, case.trainable, "reversing the rows changed a row's output"
    )


def _isolation(run, k, v, case: Case, out: Outputs, declared: Declared) -> Verdict:
    level = v.get("level", "group")
    if case.group is None or level == "batch":
        return na("group-isolation", "no group-level statistic")
    if v.get("std_level") == "batch" or v.get("whiten_tokens") or v.get("estimator") == "gpg":
        return na("group-isolation", "a batch statistic (std_level='batch', whiten_tokens, GPG's alpha): by design")
    keys = case.group.unique()
    if len(keys) < 2:
        return na("group-isolation", "one group")
    rows = (case.group == case.group[0]).nonzero().flatten()
    alone = case.rows(rows)
    if declared.reference and k.module.reference(reference_case(alone, declared), v) is None:
        return na("group-isolation", "the group alone has an undefined statistic")
    got = _twin(run, alone, k)
    mine = {n: x[rows] for n, x in out.items()}
    return _twin_compare(
        "group-isolation", k, v, alone, mine, got, alone.trainable, "another group changed this group's output"
    )


def affine_twin(case: Case, k: KindSpec) -> tuple[Case | None, str]:
    """`case` with its affine input moved to 2 x + b at live positions, b a power of two well above
    the input's magnitude (None, and why, when the dtype cannot hold it)."""
    field = k.affine
    live = case.trainable
    if not live.any():
        return None, "no trainable position"
    x = case.score if field == "score" else case.extra[field]
    big = float((x[live.any(dim=1)] if field == "score" else x[live]).abs().max())
    offset = 2.0 ** round(torch.log2(torch.tensor(256.0 * (1.0 + big))).item())
    if offset * 4 > poison_cap(case.dtype):
        return None, f"an offset of {offset:g} is beyond what {case.dtype} holds here"
    if field == "score":
        return case.replace(score=2.0 * x + offset), f"{field}' = 2 {field} + {offset:g}"
    return case.replace(
        extra={**case.extra, field: torch.where(live, 2.0 * x + offset, x)}
    ), f"{field}' = 2 {field} + {offset:g}"


def _affine(run, k, v, case: Case, declared: Declared) -> Verdict:
    twin, how = affine_twin(case, k)
    if twin is None:
        return na("affine", how)
    if declared.score_map:
        return na("affine", "the options map the score (clip, scale): not affine-invariant by design")
    ref = k.module.reference(reference_case(twin, declared), v)
    if ref is None or _overflows(twin, ref, k, v):
        return na("affine", "the reference is undefined at the moved input")
    got = _twin(run, twin, k)
    bound = {n: kind_bound(twin.dtype, ref[n], condition_of(k, twin, v, n)) for n in k.outputs}
    live = reference_case(twin, declared).trainable
    return _compare("affine", ref, got, bound, live, f"at {how} differs from the reference")


def _twin_agrees(declared: Declared, k: KindSpec, v: dict, case: Case, out: Outputs) -> Verdict:
    """The framework's other implementation of the same computation gives the same outputs at
    trainable positions (a disagreement is a defect of the pair, whichever is right)."""
    if declared.twin is None:
        if declared.twin_label:
            return na("twin", f"{declared.twin_label} does not load at this pin")
        return na("twin", "the framework has no second implementation of this entry")
    try:
        theirs = call(declared.twin, case, k)
    except Exception as exc:  # noqa: BLE001 - the twin's own failure is its own finding, not this entry's
        return na("twin", f"{declared.twin_label} failed on this case: {describe(exc)}")
    msg = f"{declared.twin_label} gives a different output"
    return _twin_compare("twin", k, v, case, out, theirs, case.trainable, msg)


def _masked_zero(declared: Declared, k: KindSpec, case: Case, out: Outputs) -> Verdict:
    if not declared.masked_zero:
        return na("masked-zero", "the target documents non-zero outputs at masked positions")
    dead = ~case.trainable
    for name in k.zero_outputs:
        bad = dead & (out[name] != 0)
        if bad.any():
            return diff(
                "masked-zero", name, bad, torch.zeros_like(out[name]), out[name], "non-zero output at a masked position"
            )
    return ok("masked-zero")


def _deterministic(run, k, case: Case, out: Outputs, device: str) -> Verdict:
    if device != "cpu":
        return na("deterministic", "bitwise repeatability is a CPU promise")
    again = _twin(run, case, k)
    for name in k.outputs:
        same = (again[name] == out[name]) | (torch.isnan(again[name]) & torch.isnan(out[name]))
        if not bool(same.all()):
            return diff("deterministic", name, ~same, out[name], again[name], "a second run gave different bits")
    return ok("deterministic")


def _split(run, k, v, case: Case, out: Outputs, declared: Declared) -> Verdict:
    """The step as one micro-batch on one rank gives the outputs of the step as split."""
    if case.split is None or (len(case.split.unique()) < 2 and case.ranks == 1):
        return na("split-invariance", "one micro-batch on one rank")
    if v.get("scope") == "micro-batch":
        return na("split-invariance", "the framework documents normalising each micro-batch on its own")
    whole = case.replace(split=None, ranks=1)
    got = _twin(run, whole, k)
    n_mb = len(case.split.unique())
    msg = f"the step cut into {n_mb} micro-batch(es) on {case.ranks} rank(s) differs from the whole step"
    verdict = _twin_compare("split-invariance", k, v, case, got, out, case.trainable, msg)
    verdict.info = _without_global_normalisers(k, v, case) if declared.reference else {}
    if verdict.info:
        verdict.message += (
            f" (without the global normalisers this split would move the loss by a relative "
            f"{verdict.info['relative_loss_change_without_global_normalisers']:.3g})"
        )
    return verdict


def _without_global_normalisers(k: KindSpec, v: dict, case: Case) -> dict:
    """How far the reference's loss moves when each micro-batch normalises by itself (information
    for `split-invariance`: what the framework's global normaliser arguments are worth here)."""
    if "scope" not in v:
        return {}
    step = k.module.reference(case, v)
    local = k.module.reference(case, dict(v, scope="micro-batch"))
    if step is None or local is None:
        return {}
    a, b = float(step["loss"].flatten()[0]), float(local["loss"].flatten()[0])
    return {"relative_loss_change_without_global_normalisers": abs(b - a) / max(abs(a), 1e-30)}


def _empty_step(run, k, case: Case, declared: Declared) -> Verdict:
    """The same step with no trainable token: a finite 0 loss and gradient, or a documented error."""
    # every position masked; non-finite values there are poison-nonfinite's business, not this property's
    extra = {n: torch.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0) for n, x in case.extra.items()}
    empty = case.replace(trainable=torch.zeros_like(case.trainable), extra=extra)
    try:
        got = call(run, empty, k)
    except Exception as exc:  # noqa: BLE001 - an error is fine only when the framework documents it
        if documented(declared, exc):
            return ok("empty-step", f"documented error: {exc}")
        return Verdict("empty-step", "fail", f"an all-masked step raised: {describe(exc)}", case=empty)
    everywhere = torch.ones(case.shape, dtype=torch.bool)
    for name in k.outputs:
        bad = ~torch.isfinite(got[name]) | (got[name] != 0)
        if bad.any():
            what = "a non-finite" if not bool(torch.isfinite(got[name]).all()) else "a non-zero"
            verdict = diff(
                "empty-step", name, bad & everywhere, torch.zeros_like(got[name]), got[name],
                f"an all-masked step gives {what} {name}",
            )  # fmt: skip
            return Verdict(
                verdict.property, verdict.status, verdict.message, verdict.output, verdict.positions,
                verdict.expected, verdict.observed, case=empty,
            )  # fmt: skip
    return ok("empty-step")


def _clip_bound(run, k, v, case: Case, out: Outputs) -> Verdict:
    """The clipped loss (max of the plain and the clipped square per token, positive weights) is
    never below the step's loss with v_old = v, where the clip never binds (an infinite range)."""
    free = case.replace(extra={**case.extra, "v_old": case.extra["v"]})
    got = _twin(run, free, k)
    live = case.trainable
    if not live.any():
        return na("clip-bound", "no trainable position")
    slack = self_slack(case.dtype, out["loss"][live], got["loss"][live])
    tol = 2.0 * kind_bound(case.dtype, got["loss"], condition_of(k, free, v, "loss")) + slack
    below = live & (out["loss"] < got["loss"] - tol)
    if below.any():
        msg = "the clipped loss is below the unclipped one"
        return diff("clip-bound", "loss", below, got["loss"], out["loss"], msg)
    return ok("clip-bound")

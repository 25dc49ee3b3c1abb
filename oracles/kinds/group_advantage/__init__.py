"""Kind `group-advantage`: outcome advantages normalised within groups of responses to one prompt.

Input (a `Case`): `score[b]` the row's outcome reward, `group[b]` its prompt group (any order, any
sizes, singletons), `trainable[b, t]` the response mask; `token_rewards` is poison under the mask
(a framework that sums rewards without the mask reads it). Output: `advantages[b, t]`, the row's
advantage at its trainable positions, 0 elsewhere.

Variants (`Declared.variant`, every key optional):

    estimator  "grpo" (default) | "rloo" | "opo" | "gpg"
    std        "unbiased" (default) | "biased" | None      grpo: None = Dr.GRPO, r - mean_g
    eps        1e-6                                         added as eps_place says
    eps_place  "std" (default): (r - mean) / (std + eps) | "var": (r - mean) / sqrt(var + eps)
               | "floor": (r - mean) / max(std, eps)  (torchrl's `std.clamp_min(eps)`)
    singleton  "raw" (default, mean 0 and std 1: r / (1 + eps)) | "zero"
    empty_rows "excluded" (default: a row without trainable tokens counts in no statistic)
               | "counted" (the framework documents counting it)
    std_level  "group" (default) | "batch": the std over every counted row of the batch, the mean
               still per group (TRL's scale_rewards="batch"); a batch of one counted row gives 0
    loo_std    False (default) | True: rloo only, divide by the leave-one-out std, the unbiased std of
               the other counted rows of the group, plus eps where it is above 0 (NeMo-RL's
               `use_leave_one_out_baseline` with `normalize_rewards`: rows with no variation are not
               sharpened); fewer than two other rows: std 0, the raw difference
    whiten_tokens  False (default) | True: then whiten the token advantages over every trainable
               position of the batch, unbiased, eps 1e-8 under the sqrt (REINFORCE++-baseline: Dr.GRPO
               shaping then verl's masked_whiten); undefined (None) below two trainable positions

For a group of n >= 2 counted rows (two-pass float64 statistics):

    grpo  A_i = (r_i - mean_g) / (std_g + eps)           std_g with 1/(n-1) or 1/n
    rloo  A_i = r_i - (sum_g - r_i) / (n - 1)  = n / (n - 1) * (r_i - mean_g)
          loo_std: A_i / (s_{-i} + eps) where s_{-i} > 0, s_{-i} the unbiased std of the others
    opo   A_i = r_i - sum_g(len_j r_j) / sum_g(len_j)   len = the row's trainable tokens (OPO's
          length-weighted baseline, arXiv 2505.23585)
    gpg   A_i = alpha (r_i - mean_g),  alpha = (counted rows) / (counted rows with r != 0)   (GPG;
          alpha is a batch statistic)
    passk the best row of the group (the first of equal maxima) gets (r_max - r_second) / (std_g + eps)
          (std None: the raw difference), every other row 0 (Pass@k training, arXiv 2503.19595)
"""

from __future__ import annotations

import math

import torch

from maskfuzz.oracles.case import Case

OUTPUTS = ("advantages",)
# the variant's choices a semantics card infers and a diagnosis tries as neighbours, with their candidates (the
# first name masking choices)
DIMENSIONS = {
    "empty_rows": ["excluded", "counted"],
    "std": ["unbiased", "biased", None],
    "eps_place": ["std", "var", "floor"],
    "singleton": ["raw", "zero"],
    "std_level": ["group", "batch"],
    "estimator": ["grpo", "rloo", "opo", "gpg", "passk"],
}
ESTIMATORS = ("grpo", "rloo", "opo", "gpg", "passk")
DEFAULTS = {
    "estimator": "grpo",
    "std": "unbiased",
    "eps": 1e-6,
    "eps_place": "std",
    "singleton": "raw",
    "empty_rows": "excluded",
    "std_level": "group",
    "whiten_tokens": False,
    "loo_std": False,
}


def options(variant: dict | None) -> dict:
    """The variant with every default filled in; unknown keys or values are a ValueError."""
    out = dict(DEFAULTS)
    for key, value in (variant or {}).items():
        if key not in DEFAULTS:
            raise ValueError(f"unknown group-advantage option {key!r}; known: {sorted(DEFAULTS)}")
        out[key] = value
    if out["estimator"] not in ESTIMATORS or out["std"] not in ("unbiased", "biased", None):
        raise ValueError(f"unknown group-advantage variant {out}")
    if out["eps_place"] not in ("std", "var", "floor") or out["singleton"] not in ("raw", "zero"):
        raise ValueError(f"unknown group-advantage variant {out}")
    if out["std_level"] not in ("group", "batch"):
        raise ValueError(f"unknown group-advantage variant {out}")
    if out["loo_std"] and out["estimator"] != "rloo":
        raise ValueError("loo_std is a variant of the rloo estimator only")
    return out


def counted(case: Case, v: dict) -> torch.Tensor:
    """[B] bool: the rows that enter their group's statistics."""
    if v["empty_rows"] == "counted":
        return torch.ones(case.shape[0], dtype=torch.bool)
    return case.trainable.any(dim=1)


def _denominator(std, var, v: dict):
    """std + eps, sqrt(var + eps) or max(std, eps), for a float or a tensor."""
    eps = v["eps"]
    if v["eps_place"] == "std":
        return std + eps
    if v["eps_place"] == "floor":
        return std.clamp(min=eps) if isinstance(std, torch.Tensor) else max(std, eps)
    return (var + eps).sqrt() if isinstance(var, torch.Tensor) else math.sqrt(var + eps)


def _singleton_denominator(v: dict) -> float:
    """A group of one under the "raw" rule: mean 0 and std 1 through the same eps placement."""
    if v["estimator"] != "grpo" or v["std"] is None:
        return 1.0
    return float(_denominator(1.0, 1.0, v))


def row_advantages_loop(case: Case, variant: dict | None = None) -> torch.Tensor:
    """[B] float64 per-row advantages, a plain loop per group (the reference)."""
    v = options(variant)
    groups = case.group if case.group is not None else torch.zeros(case.shape[0], dtype=torch.int64)
    use = counted(case, v)
    out = [0.0] * case.shape[0]
    if v["std_level"] == "batch" and v["estimator"] == "grpo" and v["std"] is not None:
        return _batch_std_loop(case, v, groups, use)
    for g in sorted(set(groups.tolist())):
        rows = [b for b in range(case.shape[0]) if int(groups[b]) == g and bool(use[b])]
        r = [float(case.score[b]) for b in rows]
        n = len(r)
        if n == 0:
            continue
        if n == 1:
            if v["singleton"] == "zero":
                continue
            denom = _singleton_denominator(v)
            scale = _gpg_alpha_loop(case, use) if v["estimator"] == "gpg" else 1.0  # GPG: mean 0, then alpha
            out[rows[0]] = scale * r[0] / denom
            continue
        mean = sum(r) / n
        if v["estimator"] == "rloo":
            total = sum(r)
            for i, (b, x) in enumerate(zip(rows, r)):
                out[b] = x - (total - x) / (n - 1)
                others = r[:i] + r[i + 1 :]
                if v["loo_std"] and len(others) >= 2:
                    m = sum(others) / len(others)
                    s_loo = math.sqrt(sum((y - m) ** 2 for y in others) / (len(others) - 1))
                    if s_loo > 0:
                        out[b] = out[b] / (s_loo + v["eps"])
            continue
        if v["estimator"] == "opo":
            lens = [int(case.trainable[b].sum()) for b in rows]
            weight = sum(lens)
            base = sum(n_b * x for n_b, x in zip(lens, r)) / weight if weight else 0.0
            for b, x in zip(rows, r):
                out[b] = x - base
            continue
        if v["estimator"] == "gpg":
            for b, x in zip(rows, r):
                out[b] = _gpg_alpha_loop(case, use) * (x - mean)
            continue
        if v["estimator"] == "passk":
            ranked = sorted(range(n), key=lambda i: -r[i])  # stable: the first of equal maxima
            gap = r[ranked[0]] - r[ranked[1]]
            if v["std"] is not None:
                var = sum((x - mean) ** 2 for x in r) / (n - 1 if v["std"] == "unbiased" else n)
                gap = gap / _denominator(math.sqrt(var), var, v)
            out[rows[ranked[0]]] = gap
            continue
        if v["std"] is None:
            for b, x in zip(rows, r):
                out[b] = x - mean
            continue
        var = sum((x - mean) ** 2 for x in r) / (n - 1 if v["std"] == "unbiased" else n)
        denom = _denominator(math.sqrt(var), var, v)
        for b, x in zip(rows, r):
            out[b] = (x - mean) / denom
    return torch.tensor(out, dtype=torch.float64)


def _gpg_alpha_loop(case: Case, use: torch.Tensor) -> float:
    """GPG's alpha: counted rows over counted rows with a non-zero score (at least 1)."""
    rows = [b for b in range(case.shape[0]) if bool(use[b])]
    nonzero = sum(1 for b in rows if float(case.score[b]) != 0.0)
    return len(rows) / max(nonzero, 1)


def _batch_std_loop(case: Case, v: dict, groups: torch.Tensor, use: torch.Tensor) -> torch.Tensor:
    """std_level="batch": (r - mean of the row's group) / (std over every counted row)."""
    all_r = [float(case.score[b]) for b in range(case.shape[0]) if bool(use[b])]
    n = len(all_r)
    out = [0.0] * case.shape[0]
    if n < 2:
        return torch.tensor(out, dtype=torch.float64)
    m = sum(all_r) / n
    var = sum((x - m) ** 2 for x in all_r) / (n - 1 if v["std"] == "unbiased" else n)
    denom = _denominator(math.sqrt(var), var, v)
    for g in sorted(set(groups.tolist())):
        rows = [b for b in range(case.shape[0]) if int(groups[b]) == g and bool(use[b])]
        if rows:
            mean = sum(float(case.score[b]) for b in rows) / len(rows)
            for b in rows:
                out[b] = (float(case.score[b]) - mean) / denom
    return torch.tensor(out, dtype=torch.float64)


def row_advantages(case: Case, variant: dict | None = None) -> torch.Tensor:
    """[B] float64 per-row advantages, vectorised over groups (scatter sums); equals the loop."""
    v = options(variant)
    b_rows = case.shape[0]
    groups = case.group if case.group is not None else torch.zeros(b_rows, dtype=torch.int64)
    _, gid = torch.unique(groups, return_inverse=True)
    k = int(gid.max()) + 1
    use = counted(case, v).to(torch.float64)
    r = case.score * use
    n = torch.zeros(k, dtype=torch.float64).index_add_(0, gid, use)
    total = torch.zeros(k, dtype=torch.float64).index_add_(0, gid, r)
    n_row, total_row = n[gid], total[gid]
    mean = total_row / n_row.clamp(min=1)
    centred = (case.score - mean) * use
    ss = torch.zeros(k, dtype=torch.float64).index_add_(0, gid, centred**2)[gid]
    if v["estimator"] == "rloo":
        adv = case.score - (total_row - case.score) / (n_row - 1).clamp(min=1)
        single = case.score.clone()
        if v["loo_std"]:
            # the others' squares about their own mean m_i: sum_{j != i} (x_j - mean)^2 - (n - 1)(m_i - mean)^2
            m_i = (total_row - case.score) / (n_row - 1).clamp(min=1)
            terms = (ss, centred**2, (n_row - 1) * (m_i - mean) ** 2)
            ss_i = terms[0] - terms[1] - terms[2]
            # others all equal: exactly 0 in the loop's two passes; here a rounding residue of the
            # three terms, snapped to 0
            residue = 64 * torch.finfo(torch.float64).eps * (terms[0] + terms[1] + terms[2])
            ss_i = torch.where(ss_i > residue, ss_i, torch.zeros_like(ss_i))
            s_i = (ss_i / (n_row - 2).clamp(min=1)).sqrt()
            s_i = torch.where(n_row >= 3, s_i, torch.zeros_like(s_i))
            adv = torch.where(s_i > 0, adv / (s_i + v["eps"]), adv)
    elif v["estimator"] == "opo":
        lens = case.trainable.sum(dim=1).to(torch.float64) * use
        w = torch.zeros(k, dtype=torch.float64).index_add_(0, gid, lens)[gid]
        wr = torch.zeros(k, dtype=torch.float64).index_add_(0, gid, lens * case.score)[gid]
        adv = case.score - torch.where(w > 0, wr / w.clamp(min=1), torch.zeros_like(w))
        single = case.score.clone()
    elif v["estimator"] == "gpg":
        alpha = use.sum() / ((case.score != 0).to(torch.float64) * use).sum().clamp(min=1)
        adv = alpha * (case.score - mean)
        single = alpha * case.score
    elif v["estimator"] == "passk":
        adv = _passk_vectorised(case, v, gid, use.bool(), ss, n_row)
        single = case.score.clone()
    elif v["std"] is None:
        adv, single = case.score - mean, case.score.clone()
    elif v["std_level"] == "batch":
        n_b = use.sum()
        if n_b < 2:
            return torch.zeros(b_rows, dtype=torch.float64)
        m_b = (case.score * use).sum() / n_b
        var_b = (((case.score - m_b) * use) ** 2).sum() / (n_b - 1 if v["std"] == "unbiased" else n_b)
        adv = (case.score - mean) / _denominator(var_b.sqrt(), var_b, v)
        return torch.where(use.bool(), adv, torch.zeros_like(adv))
    else:
        var = ss / ((n_row - 1) if v["std"] == "unbiased" else n_row).clamp(min=1)
        adv = (case.score - mean) / _denominator(var.sqrt(), var, v)
        single = case.score / _singleton_denominator(v)
    if v["singleton"] == "zero":
        single = torch.zeros_like(single)
    adv = torch.where(n_row == 1, single, adv)
    return torch.where(use.bool(), adv, torch.zeros_like(adv))


def _passk_vectorised(case: Case, v: dict, gid: torch.Tensor, use: torch.Tensor, ss, n_row) -> torch.Tensor:
    """Pass@k by a stable descending sort of (group, score): the first row of each group is its best."""
    b_rows = case.shape[0]
    order = torch.arange(b_rows)
    key = torch.where(use, case.score, torch.full_like(case.score, -math.inf))
    by_score = order[torch.sort(-key, stable=True).indices]
    by_group = by_score[torch.sort(gid[by_score], stable=True).indices]  # groups, best first within each
    out = torch.zeros(b_rows, dtype=torch.float64)
    g_sorted = gid[by_group]
    first = torch.ones(b_rows, dtype=torch.bool)
    first[1:] = g_sorted[1:] != g_sorted[:-1]
    for pos in first.nonzero().flatten().tolist():
        best = int(by_group[pos])
        if (
            not bool(use[best])
            or pos + 1 >= b_rows
            or g_sorted[pos + 1] != g_sorted[pos]
            or not bool(use[by_group[pos + 1]])
        ):
            continue  # fewer than two counted rows
        gap = case.score[best] - case.score[by_group[pos + 1]]
        if v["std"] is not None:
            var = ss[best] / ((n_row[best] - 1) if v["std"] == "unbiased" else n_row[best])
            gap = gap / _denominator(var.sqrt(), var, v)
        out[best] = gap
    return out


def reference(case: Case, variant: dict | None = None, vectorised: bool = False) -> dict[str, torch.Tensor] | None:
    """The outputs: advantages [B, T], the row advantage at trainable positions, 0 elsewhere (then
    whitened over the trainable positions with `whiten_tokens`; None below two of them)."""
    v = options(variant)
    rows = row_advantages(case, v) if vectorised else row_advantages_loop(case, v)
    adv = torch.where(case.trainable, rows[:, None].expand(case.shape), torch.zeros(case.shape, dtype=torch.float64))
    if not v["whiten_tokens"]:
        return {"advantages": adv}
    live = case.trainable
    n = int(live.sum())
    if n < 2:
        return None
    if vectorised:
        mean = adv[live].mean()
        var = ((adv[live] - mean) ** 2).sum() / (n - 1)
        white = (adv - mean) / (var + 1e-8).sqrt()
        return {"advantages": torch.where(live, white, torch.zeros_like(adv))}
    vals = [float(adv[b, t]) for b, t in live.nonzero().tolist()]
    mean = sum(vals) / n
    var = sum((x - mean) ** 2 for x in vals) / (n - 1)
    out = torch.zeros(case.shape, dtype=torch.float64)
    for b, t in live.nonzero().tolist():
        out[b, t] = (float(adv[b, t]) - mean) / math.sqrt(var + 1e-8)
    return {"advantages": out}


def condition(case: Case, variant: dict | None = None) -> torch.Tensor:
    """[B, T] float64: the magnitude a correct implementation in the case's dtype may be off by,
    in units of the unit roundoff: |r| and the group mean over the group's scale, times the log of
    the group size (summation order)."""
    v = options(variant)
    groups = case.group if case.group is not None else torch.zeros(case.shape[0], dtype=torch.int64)
    use = counted(case, v)
    cond = torch.zeros(case.shape[0], dtype=torch.float64)
    batch = v["std_level"] == "batch"
    for g in set(groups.tolist()):
        rows = (groups == g) & use
        n = int(rows.sum())
        if n == 0:
            continue
        r = case.score[rows]
        big = float(r.abs().max())
        if batch:  # the scale is the batch's
            r, n = case.score[use], int(use.sum())
            big = float(r.abs().max())
        if v["estimator"] == "grpo" and v["std"] is not None and n > 1:
            var = float(((r - r.mean()) ** 2).sum()) / (n - 1 if v["std"] == "unbiased" else n)
            s = float(_denominator(math.sqrt(var), var, v))
            scale = big / s if s > 0 else 0.0
        else:
            scale = big
        cond[rows] = (scale + 1.0) * (2.0 + math.log2(n))
    cond = cond[:, None].expand(case.shape)
    if v["whiten_tokens"]:  # the whitening divides by the tokens' std: the cancellation grows with |a| / s
        ref = reference(case, {**v, "whiten_tokens": False})["advantages"][case.trainable]
        if ref.numel() > 1:
            s_w = math.sqrt(float(ref.var()) + 1e-8)
            cond = (cond + float(ref.abs().max()) / s_w + 1.0) * (2.0 + math.log2(ref.numel()))
    return cond


def peak(case: Case, variant: dict | None = None) -> float:
    """The largest intermediate a two-pass implementation forms (a group's sum of |r| or of
    squared deviations)."""
    v = options(variant)
    groups = case.group if case.group is not None else torch.zeros(case.shape[0], dtype=torch.int64)
    use = counted(case, v)
    out = 0.0
    for g in set(groups.tolist()):
        r = case.score[(groups == g) & use]
        if r.numel():
            out = max(out, float(r.abs().sum()), float(((r - r.mean()) ** 2).sum()))
    return out


def centred(case: Case, v: dict) -> tuple[Case, float] | None:
    """(`case` with its scores centred on their mean over rows with a trainable token, the largest such
    score) where a shift changes nothing in exact arithmetic (std-normalised GRPO), else None: the
    diagnosis's probe for cancellation at a large offset (`oracles.kinds.diagnosis`)."""
    if not (v["estimator"] == "grpo" and v["std"] is not None):
        return None
    rows = case.trainable.any(dim=1)
    if not rows.any():
        return None
    return case.replace(score=case.score - case.score[rows].mean()), float(case.score[rows].abs().max())


# Well-conditioned cases that tell the dimensions apart for a semantics card (`fuzz.semantics`), where random
# draws (offsets, identical scores) often cannot; each kept where the entry's api domain has it.
_T = [[1, 1, 0]]
CARD_PROBES = (  # the inputs of `Case.build`
    # empty rows: group 0 holds a sampled row without a trainable token (attended, score 5)
    dict(trainable=_T * 2 + [[0, 0, 0]] + _T * 2, attention=[[1, 1, 0]] * 5, score=[0.0, 1.0, 5.0, 2.0, 6.0],
         group=[0, 0, 0, 1, 1]),
    # std biased / unbiased and std level: groups of three of different spread
    dict(trainable=_T * 6, attention=_T * 6, score=[0.0, 1.0, 3.0, 0.0, 4.0, 10.0], group=[0, 0, 0, 1, 1, 1]),
    # eps placement: two scores 1e-3 apart (std ~ 7e-4 against eps)
    dict(trainable=_T * 4, attention=_T * 4, score=[0.0, 0.001, 1.0, 3.0], group=[0, 0, 1, 1]),
    # singleton rule: a group of one beside a group of two
    dict(trainable=_T * 3, attention=_T * 3, score=[2.0, 0.0, 1.0], group=[0, 1, 1]),
)  # fmt: skip

"""Hypothesis strategies for the kinds beyond GAE (`oracles.kinds`).

Masks come from the GAE layouts (`fuzz.strategies`: masked tails, gaps, all-masked and
padding-only rows, left padding), inside the target's `Domain`. On top of them each kind draws
what breaks it: group ids in any order with unequal sizes and singletons (`group-advantage`,
group-level `normalization`), splits of the step into micro-batches on simulated ranks
(`loss-aggregation`), scores and inputs at large offsets and tiny scales, identical scores
in a group, log-ratios from 0 to where an estimator's exp overflows (`kl`), and poison (finite
below the dtype's cap, non-finite behind the switch) under the masks of the inputs the kind
poisons. Every class is recorded with `hypothesis.event()`.
"""

from __future__ import annotations

import torch
from hypothesis import event
from hypothesis import strategies as st

from maskfuzz.fuzz.strategies import Sizes, _allowed_layouts, _poison, _row
from maskfuzz.oracles.case import Case, quantize
from maskfuzz.oracles.domain import LOGRATIO_SPAN, Domain
from maskfuzz.oracles.kinds import spec

SCORES = (0.0, 1.0, -1.0, 0.5, 2.0, 10.0, -0.25)
OFFSETS = (0.0, 0.0, 0.0, 1.0, 100.0, 1e3, 1e4)


@st.composite
def groups(draw, b_rows: int, ragged: bool = True) -> torch.Tensor:
    """[B] int64 group ids: contiguous equal blocks (what most pipelines build), or any order
    with unequal sizes and singletons, with ids that are not 0..k-1. Without `ragged`
    (`Domain.ragged_groups` False: n responses per prompt, side by side) equal contiguous blocks only."""
    modes = ["one group", "contiguous blocks", "any order", "all singletons"] if ragged else ["one group", "equal"]
    mode = draw(st.sampled_from(modes))
    event(f"groups: {mode}")
    if mode == "one group":
        ids = [0] * b_rows
    elif mode == "all singletons":
        ids = list(range(b_rows))
    elif mode == "equal":
        size = draw(st.sampled_from([d for d in range(1, b_rows + 1) if b_rows % d == 0]))
        ids = [i // size for i in range(b_rows)]
    elif mode == "contiguous blocks":
        size = draw(st.integers(1, b_rows))
        ids = [i // size for i in range(b_rows)]
    else:
        k = draw(st.integers(1, b_rows))
        ids = [draw(st.integers(0, k - 1)) for _ in range(b_rows)]
    if draw(st.booleans()):
        ids = [7 * g + 3 for g in ids]  # ids are labels, not indices
    return torch.tensor(ids, dtype=torch.int64)


def _values(draw, shape, label: str, pool=SCORES, offsets=OFFSETS) -> torch.Tensor:
    """Inputs at live positions: a constant, per-row constants (identical in a group), or a
    seeded random fill at a drawn scale, plus a drawn offset."""
    mode = draw(st.sampled_from(["const", "per-row", "random", "binary"]))
    event(f"{label}: {mode}")
    if mode == "const":
        x = torch.full(shape, draw(st.sampled_from(pool)), dtype=torch.float64)
    elif mode == "per-row":
        rows = torch.tensor([draw(st.sampled_from(pool)) for _ in range(shape[0])], dtype=torch.float64)
        x = rows.reshape(-1, *([1] * (len(shape) - 1))).expand(shape).clone()
    else:
        g = torch.Generator().manual_seed(draw(st.integers(0, 2**32 - 1)))
        if mode == "binary":
            x = torch.randint(0, 2, shape, generator=g).to(torch.float64)
        else:
            x = torch.randn(shape, generator=g, dtype=torch.float64) * draw(st.sampled_from((1.0, 0.01, 10.0)))
    offset = draw(st.sampled_from(offsets))
    if offset:
        event(f"{label}: offset {offset:g}")
    return x + offset


@st.composite
def kind_cases(draw, kind: str, domain: Domain | None = None, sizes: Sizes = Sizes(), nonfinite: bool = True) -> Case:
    """A case of `kind` inside `domain`; B <= sizes.max_b, T <= min(sizes.max_t, 64)."""
    k = spec(kind)
    domain = domain or Domain()
    dtype = draw(st.sampled_from(domain.dtypes))
    event(f"dtype: {dtype}")
    t_len = draw(st.integers(1, min(8, sizes.max_t)) | st.integers(1, min(64, sizes.max_t)))
    layouts = _allowed_layouts(domain)
    if draw(st.integers(0, 3)) == 0:
        layouts = ["all trainable"]
        event("uniform batch: all trainable")
    rows = draw(st.lists(_row(t_len, layouts, domain), min_size=1, max_size=sizes.max_b))
    attention = torch.tensor([r[0] for r in rows], dtype=torch.bool)
    trainable = torch.tensor([r[1] for r in rows], dtype=torch.bool)
    for r in rows:
        event(f"layout: {r[2]}")
    b_rows = len(rows)
    shape = (b_rows, t_len)
    dead = ~trainable
    nonfinite = nonfinite and domain.nonfinite_poison
    group = draw(groups(b_rows, ragged=domain.ragged_groups)) if k.grouped else None
    extra: dict[str, torch.Tensor] = {}
    score = torch.zeros(b_rows, dtype=torch.float64)
    rewards = torch.zeros(shape, dtype=torch.float64)
    if kind == "group-advantage":
        score = _values(draw, (b_rows,), "score")
        where = domain.poison_regions(dead, attention)[1]
        if where.any():
            rewards = torch.where(where, _poison(draw, dead, dtype, nonfinite), rewards)
    elif kind == "normalization":
        extra["x"] = _values(draw, shape, "x")
    elif kind == "loss-aggregation":
        extra["loss"] = _values(draw, shape, "loss", pool=(0.0, 1.0, -1.0, 0.5, 3.0, -2.0))
    elif kind == "value-loss":
        extra["ret"] = _values(draw, shape, "returns", pool=(0.0, 1.0, -1.0, 0.5, 3.0))
        extra["v"] = _values(draw, shape, "values", pool=(0.0, 1.0, -1.0, 0.25, 2.0))
        how = draw(st.sampled_from(["v_old = v", "near", "far"]))
        event(f"value-loss: {how}")
        step = {"v_old = v": 0.0, "near": 0.1, "far": 3.0}[how]
        g = torch.Generator().manual_seed(draw(st.integers(0, 2**32 - 1)))
        extra["v_old"] = extra["v"] + step * torch.randn(shape, generator=g, dtype=torch.float64)
    elif kind == "policy-loss":
        # log-ratios from 0 (r = 1, the closed form) across both clip edges; advantages of either sign, per
        # token and per row (the score), so every branch of the clip and the dual clip is taken
        extra["old_logp"] = -_values(draw, shape, "old_logp", pool=(0.0, 0.5, 1.0, 3.0), offsets=(0.0, 0.0, 10.0)).abs()
        ratios = (0.0, 0.0, 0.05, -0.05, 0.15, -0.15, 0.3, -0.3, 1.5, -1.5, 3.0, -3.0)
        if draw(st.booleans()):  # each token its own log-ratio from the pool: every clip branch in one row
            event("log-ratio: mixed")
            g = torch.Generator().manual_seed(draw(st.integers(0, 2**32 - 1)))
            d = torch.tensor(ratios, dtype=torch.float64)[torch.randint(0, len(ratios), shape, generator=g)]
        else:
            d = _values(draw, shape, "log-ratio", pool=ratios, offsets=(0.0,))
        # both are log-probabilities (<= 0): a positive log-prob moves both down, the log-ratio d kept
        shift = (extra["old_logp"] + d).clamp(min=0.0)
        extra["old_logp"] = extra["old_logp"] - shift
        extra["logp"] = extra["old_logp"] + d
        extra["adv"] = _values(draw, shape, "adv", pool=(0.0, 1.0, -1.0, 0.5, -2.0, 3.0))
        score = _values(draw, (b_rows,), "row advantage", pool=(0.0, 1.0, -1.0, 0.5, -2.0))
    elif kind == "kl":
        ref = -_values(draw, shape, "ref_logp", pool=(0.0, 0.5, 1.0, 5.0)).abs()
        ratios = (0.0, 0.1, -0.1, 1.0, -1.0, 5.0, -5.0, 20.0, -20.0)
        d = _values(draw, shape, "log-ratio", pool=ratios, offsets=(0.0,))
        extra["ref_logp"], extra["logp"] = ref, ref + d
        extra["old_logp"] = _old_logp(extra["logp"], ref)
    if dtype == "float16":  # keep live inputs inside half's range
        score = score.clamp(-6e4, 6e4)
        extra = {n: x.clamp(-6e4, 6e4) for n, x in extra.items()}
    for name in k.poisoned:
        if name in extra:
            extra[name] = torch.where(dead, _poison(draw, dead, dtype, nonfinite), extra[name])
    if kind == "policy-loss" and not domain.masked_logprobs:  # masked log-probs stay log-probabilities
        lp, old = extra["logp"], extra["old_logp"]
        fix = dead & torch.isfinite(lp) & torch.isfinite(old)
        old = quantize(torch.where(fix, -old.abs(), old), dtype)
        step = (lp - extra["old_logp"]).clamp(-LOGRATIO_SPAN, LOGRATIO_SPAN)
        lp = quantize(torch.where(fix, (old + step).clamp(max=0.0), lp), dtype)
        far = fix & ((lp - old).abs() > LOGRATIO_SPAN)  # the dtype rounded a large log-prob: the same one
        extra["logp"], extra["old_logp"] = torch.where(far, old, lp), old
    split, ranks = draw(splits(b_rows, even=not domain.uneven_splits)) if k.split else (None, 1)
    return Case.build(
        trainable=trainable,
        attention=attention,
        token_rewards=rewards,
        score=score,
        dtype=dtype,
        group=group,
        extra=extra,
        split=split,
        ranks=ranks,
    )


OLD_RATIOS = (0.0, 0.0, 0.1, -0.1, 1.0, -1.0, 5.0, -5.0, 20.0, -20.0)


def _old_logp(logp: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """`kl`'s old log-probs (the sampling policy's, read by a `ratio` variant: x = logp - old_logp):
    old = logp (on-policy, ratio 1), a small drift, per-row or per-token log-ratios from 0 to +-20 nats.
    Derived from the drawn log-probs by a seeded generator, not drawn: `kind_cases` does not see the
    variant (fuzz/engine.py passes the kind and the domain), so a draw of its own would move the search
    of every kl entry, and the entries without a ratio never read it. A log-prob stays <= 0: old =
    min(logp - x, 0), so |logp - old| <= |x| where logp <= 0. Masked positions get the same finite
    values; the poison there is logp's (the judge's twins clean the inputs `KINDS["kl"].poisoned` names)."""
    # NaN hashes by identity (Python >= 3.10): the key is the finite picture, so a replayed draw keeps its old_logp
    key = [torch.nan_to_num(x, nan=0.5, posinf=1.5, neginf=-1.5).flatten().tolist() for x in (logp, ref)]
    seed = hash((tuple(key[0]), tuple(key[1]))) % 2**32
    g = torch.Generator().manual_seed(seed)
    modes = ("old = logp", "near", "per-row", "per-token")
    mode = modes[int(torch.randint(len(modes), (1,), generator=g))]
    event(f"old_logp: {mode}")
    pool = torch.tensor(OLD_RATIOS, dtype=torch.float64)
    if mode == "old = logp":
        x = torch.zeros_like(logp)
    elif mode == "near":
        x = 0.1 * torch.randn(logp.shape, generator=g, dtype=torch.float64)
    elif mode == "per-row":
        x = pool[torch.randint(len(pool), (logp.shape[0], 1), generator=g)].expand(logp.shape)
    else:
        x = pool[torch.randint(len(pool), logp.shape, generator=g)]
    return (logp - x).clamp(max=0.0)


@st.composite
def splits(draw, b_rows: int, even: bool = False) -> tuple[torch.Tensor | None, int]:
    """(micro-batch id per row, simulated ranks): one micro-batch, contiguous micro-batches of a
    size (the last one short), or rows dealt to micro-batches in any order; on 1 or 2 ranks. With
    `even` (a loader that cuts equal micro-batches, `Domain.uneven_splits` False): contiguous
    micro-batches of one size only, as many on every rank."""
    mode = draw(st.sampled_from(["whole step", "contiguous", "any order"] if not even else ["whole step", "equal"]))
    event(f"split: {mode}")
    if mode == "whole step":
        return None, 1
    if mode == "equal":
        n = draw(st.sampled_from([d for d in range(1, b_rows + 1) if b_rows % d == 0]))  # micro-batches
        ranks = draw(st.sampled_from([r for r in (1, 1, 2) if n % r == 0]))
        event(f"split: {ranks} rank(s)")
        return torch.tensor([i // (b_rows // n) for i in range(b_rows)], dtype=torch.int64), ranks
    if mode == "contiguous":
        size = draw(st.integers(1, b_rows))
        ids = [i // size for i in range(b_rows)]
    else:
        k = draw(st.integers(1, b_rows))
        ids = [draw(st.integers(0, k - 1)) for _ in range(b_rows)]
    ranks = draw(st.sampled_from((1, 1, 2))) if len(set(ids)) >= 2 else 1  # every rank gets a micro-batch
    event(f"split: {ranks} rank(s)")
    return torch.tensor(ids, dtype=torch.int64), ranks

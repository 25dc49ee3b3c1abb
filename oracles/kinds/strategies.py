"""Hypothesis strategies for the kinds beyond GAE (`oracles.kinds`): what the statistic kinds share.

Masks come from every kind's layouts (`oracles.strategies`: masked tails, gaps, all-masked and
padding-only rows, left padding), inside the target's `Domain`. On top of them each kind draws
what breaks it (`oracles/kinds/<kind>/strategies.py`, `inputs`, found through the kind's `KindSpec`):
group ids in any order with unequal sizes and singletons (`group-advantage`, group-level
`normalization`), splits of the step into micro-batches on simulated ranks (`loss-aggregation`),
scores and inputs at large offsets and tiny scales, identical scores in a group, log-ratios from 0
to where an estimator's exp overflows (`kl`), and poison (finite below the dtype's cap, non-finite
behind the switch) under the masks of the inputs the kind poisons. Every class is recorded with
`hypothesis.event()`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from hypothesis import event
from hypothesis import strategies as st

from maskfuzz.oracles.case import Case
from maskfuzz.oracles.declared import Declared
from maskfuzz.oracles.domain import Domain
from maskfuzz.oracles.kinds import spec
from maskfuzz.oracles.strategies import Sizes, allowed_layouts, poison, row

SCORES = (0.0, 1.0, -1.0, 0.5, 2.0, 10.0, -0.25)
OFFSETS = (0.0, 0.0, 0.0, 1.0, 100.0, 1e3, 1e4)


@dataclass
class Drawn:
    """A kind case being drawn: the masks and their shape (fixed), and the inputs a kind's `inputs` fills in."""

    shape: tuple[int, int]
    dead: torch.Tensor  # bool [B, T]: not trainable
    attention: torch.Tensor  # bool [B, T]
    dtype: str
    nonfinite: bool  # non-finite poison may be drawn
    domain: Domain
    score: torch.Tensor
    rewards: torch.Tensor
    extra: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def b_rows(self) -> int:
        return self.shape[0]


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


def values(draw, shape, label: str, pool=SCORES, offsets=OFFSETS) -> torch.Tensor:
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
    layouts = allowed_layouts(domain)
    if draw(st.integers(0, 3)) == 0:
        layouts = ["all trainable"]
        event("uniform batch: all trainable")
    rows = draw(st.lists(row(t_len, layouts, domain), min_size=1, max_size=sizes.max_b))
    attention = torch.tensor([r[0] for r in rows], dtype=torch.bool)
    trainable = torch.tensor([r[1] for r in rows], dtype=torch.bool)
    for r in rows:
        event(f"layout: {r[2]}")
    b_rows = len(rows)
    shape = (b_rows, t_len)
    dead = ~trainable
    nonfinite = nonfinite and domain.nonfinite_poison
    group = draw(groups(b_rows, ragged=domain.ragged_groups)) if k.grouped else None
    d = Drawn(
        shape,
        dead,
        attention,
        dtype,
        nonfinite,
        domain,
        score=torch.zeros(b_rows, dtype=torch.float64),
        rewards=torch.zeros(shape, dtype=torch.float64),
    )
    k.strategies.inputs(draw, d)  # the kind's own inputs (oracles/kinds/<kind>/strategies.py)
    score, rewards, extra = d.score, d.rewards, d.extra
    if dtype == "float16":  # keep live inputs inside half's range
        score = score.clamp(-6e4, 6e4)
        extra = {n: x.clamp(-6e4, 6e4) for n, x in extra.items()}
    for name in k.poisoned:
        if name in extra:
            extra[name] = torch.where(dead, poison(draw, dead, dtype, nonfinite), extra[name])
    finish = getattr(k.strategies, "finish", None)  # a kind's fix-up of its poisoned inputs
    if finish is not None:
        extra = finish(extra, dead, dtype, domain)
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


def declared_cases(declared: Declared, sizes: Sizes, nonfinite: bool):
    """The strategy of the cases of `declared`'s kind inside its api domain, options not yet drawn
    (`KindSpec.cases` of the statistic kinds)."""
    return kind_cases(declared.kind, declared.domain, sizes, nonfinite)


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

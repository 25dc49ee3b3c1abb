"""What every kind's Hypothesis strategy draws from: the row layouts, poison, fills and the shape limits.

Each row of a batch gets a *layout* (where its real and trainable tokens are), drawn with
deliberate weight on the shapes frameworks get wrong: masked tails of padding and of real tokens,
long gaps, leading masks, alternation, a single trainable token, all-masked rows, padding-only
rows, left padding. Poison sits under the masks (finite, and non-finite behind a switch). Every
class is recorded with `hypothesis.event()` so a run's statistics show what was covered. Cases stay
inside the target's `Domain`, so nothing is drawn that the framework cannot express.

Tensors are filled by a few drawn choices (zeros, a constant, a seeded random fill), not element
by element: drawing stays cheap at 16 x 256 and shrinking goes to constants a human can read.
Each kind's own strategy sits beside it (`oracles/kinds/<kind>/strategies.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from hypothesis import event
from hypothesis import strategies as st

from maskfuzz.oracles.domain import Domain, poison_cap

# finite poison, each clamped to the dtype's poison_cap (an overflow of legitimate arithmetic is not a leak)
FINITE_POISON = (100.0, 1.0, -1.0, 1e3, -1e3, -100.0, 1e6, -1e6, 0.0)
NONFINITE_POISON = (float("nan"), float("inf"), float("-inf"))
SMALL = (1.0, 0.5, -1.0, 2.0, 0.25, -0.5, 0.0)
LAYOUTS = (
    "response+padding",
    "observation tail",
    "gap",
    "long gap",
    "leading mask",
    "alternating",
    "single trainable",
    "all trainable",
    "all masked",
    "padding only",
    "multi-turn",
)


@dataclass(frozen=True)
class Sizes:
    """Shape limits: B <= max_b, T <= max_t (default 16 x 256; `scale` gives 64 x 4096)."""

    max_b: int = 16
    max_t: int = 256

    @classmethod
    def scaled(cls) -> "Sizes":
        return cls(64, 4096)


def allowed_layouts(domain: Domain) -> list[str]:
    out = []
    for name in LAYOUTS:
        if name in ("observation tail",) and not domain.masked_real_tail:
            continue
        if name in ("gap", "long gap", "alternating", "multi-turn") and not domain.gaps:
            continue
        if name == "leading mask" and not domain.leading_mask:
            continue
        if name == "all masked" and not domain.all_masked_rows:
            continue
        if name == "padding only" and not domain.empty_rows:
            continue
        out.append(name)
    return out


@st.composite
def row(draw, t_len: int, layouts: list[str], domain: Domain) -> tuple[list[bool], list[bool], str]:
    """One row's (attention, trainable, layout name)."""
    kind = draw(st.sampled_from(layouts))
    left = 0
    if domain.left_padding and kind != "padding only" and t_len > 1 and draw(st.integers(0, 4)) == 0:
        left = draw(st.integers(1, max(1, t_len // 2)))
        event("left-padded row")
    n = t_len - left  # room for real tokens + right padding
    # the longest row of a real batch fills the window: a third of rows run to the end
    fills = kind == "all trainable" or (n >= 1 and draw(st.integers(0, 2)) == 0)
    real = n if fills else draw(st.integers(1, n)) if n >= 1 else 0
    if kind == "padding only" or real == 0:
        return [False] * t_len, [False] * t_len, "padding only"
    att = [False] * left + [True] * real + [False] * (n - real)
    tr = [False] * t_len
    seg = list(range(left, left + real))
    if kind in ("response+padding", "all trainable"):
        for i in seg:
            tr[i] = True
    elif kind == "observation tail":
        k = draw(st.integers(1, max(1, real - 1))) if real > 1 else 1
        for i in seg[:k]:
            tr[i] = True
    elif kind in ("gap", "long gap"):
        if real < 3:
            for i in seg:
                tr[i] = True
        else:
            if kind == "long gap":
                gap = draw(st.integers(max(1, (real - 2) * 2 // 3), real - 2))
            else:
                gap = draw(st.integers(1, real - 2))
            before = draw(st.integers(1, real - gap - 1))
            for i in seg[:before] + seg[before + gap :]:
                tr[i] = True
            if not domain.masked_real_tail:
                pass  # the row ends trainable by construction
    elif kind == "leading mask":
        lead = draw(st.integers(1, max(1, real - 1))) if real > 1 else 0
        for i in seg[lead:]:
            tr[i] = True
    elif kind == "alternating":
        phase = draw(st.integers(0, 1))
        for j, i in enumerate(seg):
            tr[i] = (j + phase) % 2 == 0
    elif kind == "single trainable":
        pos = draw(st.integers(0, real - 1))
        tr[seg[pos]] = True
    elif kind == "multi-turn":
        on = True
        j = 0
        while j < real:
            run = draw(st.integers(1, max(1, real // 3)))
            for i in seg[j : j + run]:
                tr[i] = on
            on = not on
            j += run
    # "all masked": nothing trainable
    tr = _fit_domain(att, tr, domain)
    return att, tr, kind


def _fit_domain(att: list[bool], tr: list[bool], domain: Domain) -> list[bool]:
    """Trim a layout into the domain: a framework without observation tails gets trainable
    tokens to the end of the real run, one without leading masks from its start."""
    idx = [i for i, x in enumerate(tr) if x]
    if not idx:
        return tr
    real = [i for i, x in enumerate(att) if x]
    tr = list(tr)
    if not domain.masked_real_tail:
        for i in range(idx[-1] + 1, real[-1] + 1):
            tr[i] = True
    if not domain.leading_mask:
        for i in range(real[0], idx[0]):
            tr[i] = True
    if not domain.gaps:
        first, last = min(i for i, x in enumerate(tr) if x), max(i for i, x in enumerate(tr) if x)
        for i in range(first, last + 1):
            tr[i] = True
    return tr


def fill(draw, shape: tuple[int, ...], label: str, pool=SMALL, allow_zero=True) -> torch.Tensor:
    modes = (["zeros"] if allow_zero else []) + ["const", "random", "per-row"]
    mode = draw(st.sampled_from(modes))
    event(f"{label}: {mode}")
    if mode == "zeros":
        return torch.zeros(shape, dtype=torch.float64)
    if mode == "const":
        return torch.full(shape, draw(st.sampled_from(pool)), dtype=torch.float64)
    if mode == "per-row":
        rows = [draw(st.sampled_from(pool)) for _ in range(shape[0])]
        return torch.tensor(rows, dtype=torch.float64).reshape(-1, *([1] * (len(shape) - 1))).expand(shape).clone()
    seed = draw(st.integers(0, 2**32 - 1))
    scale = draw(st.sampled_from((1.0, 10.0, 0.01)))
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g, dtype=torch.float64) * scale


def poison(draw, dead: torch.Tensor, dtype: str, nonfinite: bool) -> torch.Tensor:
    """Values for the non-trainable positions `dead`: a constant (what shrinking goes to, so a
    shrunk case reads like the seed report's single poisoned slot), zeros, or a seeded mix of the
    pool; "non-finite mixed" puts one NaN / inf at a drawn dead position (the k-th, k shrinking to
    the first), so non-finite findings shrink as far as finite ones."""
    shape = tuple(dead.shape)
    modes = ["const", "zeros", "mixed"] + (["non-finite", "non-finite mixed"] if nonfinite else [])
    mode = draw(st.sampled_from(modes))
    event(f"poison: {mode}")
    if mode == "zeros":
        return torch.zeros(shape, dtype=torch.float64)
    if mode in ("const", "non-finite"):
        pool = FINITE_POISON if mode == "const" else NONFINITE_POISON
        out = torch.full(shape, draw(st.sampled_from(pool)), dtype=torch.float64)
    else:
        seed = draw(st.integers(0, 2**32 - 1))
        g = torch.Generator().manual_seed(seed)
        pick = torch.randint(len(FINITE_POISON), shape, generator=g)
        out = torch.tensor(FINITE_POISON, dtype=torch.float64)[pick]
        where = dead.flatten().nonzero().flatten()
        if mode == "non-finite mixed" and where.numel():
            k = draw(st.integers(0, where.numel() - 1))
            out.view(-1)[int(where[k])] = draw(st.sampled_from(NONFINITE_POISON))
    cap = poison_cap(dtype)
    return torch.where(torch.isfinite(out), out.clamp(-cap, cap), out)

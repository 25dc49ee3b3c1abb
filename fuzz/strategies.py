"""Hypothesis strategies for canonical cases that find masked-math bugs fast.

Each row of a batch gets a *layout* (where its real and trainable tokens are), drawn with
deliberate weight on the shapes frameworks get wrong: masked tails of padding and of real tokens,
long gaps, leading masks, alternation, a single trainable token, all-masked rows, padding-only
rows, left padding. `gamma`/`lam` come from regimes (0, lam = 0, both 1, a tiny product, generic);
poison sits under the masks (finite, and non-finite behind a switch). Every class is recorded with
`hypothesis.event()` so a run's statistics show what was covered. Cases stay inside the target's
`Domain`, so nothing is drawn that the framework cannot express.

Tensors are filled by a few drawn choices (zeros, a constant, a seeded random fill), not element
by element: drawing stays cheap at 16 x 256 and shrinking goes to constants a human can read.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from hypothesis import event
from hypothesis import strategies as st

from maskfuzz.oracles.case import Case
from maskfuzz.oracles.domain import Domain, poison_cap

# finite poison, each clamped to the dtype's poison_cap (an overflow of legitimate arithmetic is not a leak)
FINITE_POISON = (100.0, 1.0, -1.0, 1e3, -1e3, -100.0, 1e6, -1e6, 0.0)
NONFINITE_POISON = (float("nan"), float("inf"), float("-inf"))
SMALL = (1.0, 0.5, -1.0, 2.0, 0.25, -0.5, 0.0)
GAMMA_LAM = {
    "generic": None,
    "gamma=0": (0.0, None),
    "lam=0": (None, 0.0),
    "gamma=lam=1": (1.0, 1.0),
    "tiny gamma*lam": (1e-4, 1e-4),
}
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


def _allowed_layouts(domain: Domain) -> list[str]:
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
def _row(draw, t_len: int, layouts: list[str], domain: Domain) -> tuple[list[bool], list[bool], str]:
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


def _fill(draw, shape: tuple[int, ...], label: str, pool=SMALL, allow_zero=True) -> torch.Tensor:
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


def _poison(draw, dead: torch.Tensor, dtype: str, nonfinite: bool) -> torch.Tensor:
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


@st.composite
def gamma_lam(draw) -> tuple[float, float]:
    # half the draws generic, so a target that crashes at gamma * lam = 0 still shows its other bugs
    regime = draw(st.sampled_from(["generic"] * 3 + [r for r in GAMMA_LAM if r != "generic"]))
    event(f"gamma/lam: {regime}")
    fixed = GAMMA_LAM[regime] or (None, None)
    generic = st.sampled_from((1.0, 0.9, 0.95, 0.99, 0.5)) | st.floats(0.0, 1.0)
    gamma = fixed[0] if fixed[0] is not None else draw(generic)
    lam = fixed[1] if fixed[1] is not None else draw(generic)
    return gamma, lam


def _length(draw, sizes: Sizes) -> int:
    choices = [st.integers(1, min(8, sizes.max_t)), st.integers(1, sizes.max_t)]
    if sizes.max_t >= 129:
        choices.append(st.sampled_from((127, 128, 129)))
    t_len = draw(st.one_of(*choices))
    if t_len in (127, 128, 129):
        event("T at a chunk boundary (127/128/129)")
    return t_len


KL_RATIOS = (0.0, 0.1, -0.1, 1.0, -1.0, 5.0, -5.0)


def _kl_logprobs(draw, dead: torch.Tensor, dtype: str, nonfinite: bool, poison: bool) -> dict[str, torch.Tensor]:
    """`logp` and `ref_logp` [B, T]: log-probs <= 0 whose log-ratio is 0 to +-5 nats (a constant or per row from
    the pool) or random at a scale of 0.01 to 10 (tens of nats: the estimators' clamps bind); at masked positions
    the same kind of log-probs, or poison where the domain allows it."""
    ref = -_fill(draw, tuple(dead.shape), "ref_logp", pool=(0.0, 0.5, 1.0, 5.0)).abs()
    d = _fill(draw, tuple(dead.shape), "kl log-ratio", pool=KL_RATIOS)
    logp = (ref + d).clamp(max=0.0)
    if poison:
        logp = torch.where(dead, _poison(draw, dead, dtype, nonfinite), logp)
    return {"logp": logp, "ref_logp": ref}


@st.composite
def cases(
    draw,
    domain: Domain | None = None,
    sizes: Sizes = Sizes(),
    nonfinite: bool = True,
    baseline: bool = False,
    kl_reward: bool = False,
) -> Case:
    """A canonical case inside `domain`, B <= sizes.max_b, T <= sizes.max_t; with `baseline`, a
    per-row baseline reward in `extra["baseline"]` (the row's value in every column: ReMax's greedy
    rollout reward); with `kl_reward`, the log-probs a KL in the reward reads (`oracles.kinds.gae.kl_reward`)."""
    domain = domain or Domain()
    dtype = draw(st.sampled_from(domain.dtypes))
    event(f"dtype: {dtype}")
    t_len = _length(draw, sizes)
    layouts = _allowed_layouts(domain)
    uniform = draw(st.integers(0, 7))
    if uniform == 0:  # every position real and trainable: where all contracts meet classic GAE
        layouts = ["all trainable"]
        event("uniform batch: all trainable")
    elif uniform <= 2:  # a uniform batch: every row the same kind
        layouts = [draw(st.sampled_from(layouts))]
        event(f"uniform batch: {layouts[0]}")
    # a list strategy, so the shrinker can delete whole rows
    rows = draw(st.lists(_row(t_len, layouts, domain), min_size=1, max_size=sizes.max_b))
    b_rows = len(rows)
    att_rows, tr_rows = [], []
    for att, tr, kind in rows:
        event(f"layout: {kind}")
        att_rows.append(att)
        tr_rows.append(tr)
    attention = torch.tensor(att_rows, dtype=torch.bool)
    trainable = torch.tensor(tr_rows, dtype=torch.bool)
    if b_rows > 1 and (~trainable.any(dim=1)).any() and trainable.any():
        event("all-masked row next to normal rows")
    shape = (b_rows, t_len)
    values = _fill(draw, shape, "values")
    rewards = _fill(draw, shape, "token rewards") if domain.token_rewards else torch.zeros(shape, dtype=torch.float64)
    score = _fill(draw, (b_rows,), "score", allow_zero=False)
    if dtype == "float16":  # keep trainable inputs inside half's range
        values, rewards, score = values.clamp(-6e4, 6e4), rewards.clamp(-6e4, 6e4), score.clamp(-6e4, 6e4)
    dead = ~trainable
    nonfinite = nonfinite and domain.nonfinite_poison
    v_poison, r_poison = domain.poison_regions(dead, attention)
    values = torch.where(dead, torch.zeros_like(values), values)
    values = torch.where(v_poison, _poison(draw, dead, dtype, nonfinite), values)
    rewards = torch.where(dead, torch.zeros_like(rewards), rewards)
    if domain.token_rewards:
        rewards = torch.where(r_poison, _poison(draw, dead, dtype, nonfinite), rewards)
    gamma, lam = draw(gamma_lam())
    if not domain.critic:  # the returns kind: no critic, a discounted sum (GAE with V = 0, lam = 1)
        values, lam = torch.zeros_like(values), 1.0
    if not domain.discount:
        gamma = 1.0
    extra = {}
    if baseline:
        per_row = _fill(draw, (b_rows,), "baseline", allow_zero=True)
        if dtype == "float16":
            per_row = per_row.clamp(-6e4, 6e4)
        extra["baseline"] = per_row[:, None].expand(shape).clone()
    if kl_reward:
        extra.update(_kl_logprobs(draw, dead, dtype, nonfinite, domain.masked_logprobs))
    return Case.build(  # rounds the floats to the run dtype
        trainable=trainable,
        attention=attention,
        token_rewards=rewards,
        values=values,
        score=score,
        gamma=gamma,
        lam=lam,
        dtype=dtype,
        extra=extra,
    )

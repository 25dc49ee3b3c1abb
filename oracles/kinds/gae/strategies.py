"""GAE's Hypothesis strategy (the `gae` and `returns` kinds): canonical cases that find masked-math bugs fast.

The rows' layouts, the poison under the masks and the fills are every kind's (`oracles.strategies`);
`gamma`/`lam` come from regimes (0, lam = 0, both 1, a tiny product, generic); values and token rewards are
poisoned where the domain allows it, a `returns` domain (`critic=False`) draws no values and lam = 1.
"""

from __future__ import annotations

import torch
from hypothesis import event
from hypothesis import strategies as st

from maskfuzz.oracles.case import Case
from maskfuzz.oracles.declared import Declared
from maskfuzz.oracles.domain import Domain
from maskfuzz.oracles.strategies import Sizes, allowed_layouts, fill, poison, row

GAMMA_LAM = {
    "generic": None,
    "gamma=0": (0.0, None),
    "lam=0": (None, 0.0),
    "gamma=lam=1": (1.0, 1.0),
    "tiny gamma*lam": (1e-4, 1e-4),
}

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


def _kl_logprobs(draw, dead: torch.Tensor, dtype: str, nonfinite: bool, poisoned: bool) -> dict[str, torch.Tensor]:
    """`logp` and `ref_logp` [B, T]: log-probs <= 0 whose log-ratio is 0 to +-5 nats (a constant or per row from
    the pool) or random at a scale of 0.01 to 10 (tens of nats: the estimators' clamps bind); at masked positions
    the same kind of log-probs, or poison where the domain allows it."""
    ref = -fill(draw, tuple(dead.shape), "ref_logp", pool=(0.0, 0.5, 1.0, 5.0)).abs()
    d = fill(draw, tuple(dead.shape), "kl log-ratio", pool=KL_RATIOS)
    logp = (ref + d).clamp(max=0.0)
    if poisoned:
        logp = torch.where(dead, poison(draw, dead, dtype, nonfinite), logp)
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
    layouts = allowed_layouts(domain)
    uniform = draw(st.integers(0, 7))
    if uniform == 0:  # every position real and trainable: where all contracts meet classic GAE
        layouts = ["all trainable"]
        event("uniform batch: all trainable")
    elif uniform <= 2:  # a uniform batch: every row the same kind
        layouts = [draw(st.sampled_from(layouts))]
        event(f"uniform batch: {layouts[0]}")
    # a list strategy, so the shrinker can delete whole rows
    rows = draw(st.lists(row(t_len, layouts, domain), min_size=1, max_size=sizes.max_b))
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
    values = fill(draw, shape, "values")
    rewards = fill(draw, shape, "token rewards") if domain.token_rewards else torch.zeros(shape, dtype=torch.float64)
    score = fill(draw, (b_rows,), "score", allow_zero=False)
    if dtype == "float16":  # keep trainable inputs inside half's range
        values, rewards, score = values.clamp(-6e4, 6e4), rewards.clamp(-6e4, 6e4), score.clamp(-6e4, 6e4)
    dead = ~trainable
    nonfinite = nonfinite and domain.nonfinite_poison
    v_poison, r_poison = domain.poison_regions(dead, attention)
    values = torch.where(dead, torch.zeros_like(values), values)
    values = torch.where(v_poison, poison(draw, dead, dtype, nonfinite), values)
    rewards = torch.where(dead, torch.zeros_like(rewards), rewards)
    if domain.token_rewards:
        rewards = torch.where(r_poison, poison(draw, dead, dtype, nonfinite), rewards)
    gamma, lam = draw(gamma_lam())
    if not domain.critic:  # the returns kind: no critic, a discounted sum (GAE with V = 0, lam = 1)
        values, lam = torch.zeros_like(values), 1.0
    if not domain.discount:
        gamma = 1.0
    extra = {}
    if baseline:
        per_row = fill(draw, (b_rows,), "baseline", allow_zero=True)
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


def declared_cases(declared: Declared, sizes: Sizes, nonfinite: bool):
    """The strategy of the cases of a `gae` or `returns` target inside its api domain, options not yet drawn
    (`KindSpec.cases`): with the per-row baseline and the KL log-probs where its variant reads them."""
    v = declared.variant
    return cases(
        declared.domain, sizes, nonfinite, baseline=bool(v.get("baseline")), kl_reward=bool(v.get("kl_reward"))
    )

"""The KL kind's inputs for `oracles.kinds.strategies.kind_cases`: reference log-probs, log-ratios from 0 to
where an estimator's exp overflows, and old log-probs derived from them (`_old_logp`)."""

from __future__ import annotations

import torch
from hypothesis import event

from maskfuzz.oracles.kinds.strategies import Drawn, values


def inputs(draw, d: Drawn) -> None:
    shape, extra = d.shape, d.extra
    ref = -values(draw, shape, "ref_logp", pool=(0.0, 0.5, 1.0, 5.0)).abs()
    ratios = (0.0, 0.1, -0.1, 1.0, -1.0, 5.0, -5.0, 20.0, -20.0)
    r = values(draw, shape, "log-ratio", pool=ratios, offsets=(0.0,))
    extra["ref_logp"], extra["logp"] = ref, ref + r
    extra["old_logp"] = _old_logp(extra["logp"], ref)


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

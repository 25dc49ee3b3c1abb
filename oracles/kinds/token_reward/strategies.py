"""The token reward's inputs for `oracles.kinds.strategies.kind_cases`: a score per row (inside and beyond
OpenRLHF's default clip of [-10, 10], offsets, identical scores) and a per-token KL (0, small, large, of either
sign: k1 is a log-ratio); the KL under the mask is poison (`KINDS["token-reward"].poisoned`, drawn by
`kind_cases`)."""

from __future__ import annotations

from maskfuzz.oracles.kinds.strategies import SCORES, Drawn, values

SCORE_POOL = (*SCORES, 25.0, -12.5)
KL_POOL = (0.0, 0.1, -0.1, 1.0, -1.0, 5.0, -20.0)


def inputs(draw, d: Drawn) -> None:
    d.score = values(draw, (d.b_rows,), "score", pool=SCORE_POOL, offsets=(0.0, 0.0, 1.0, 100.0))
    d.extra["kl"] = values(draw, d.shape, "kl", pool=KL_POOL, offsets=(0.0,))

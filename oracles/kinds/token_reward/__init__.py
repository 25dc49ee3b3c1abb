"""Kind `token-reward`: the per-token reward a PPO step trains on, built from a sequence score and a per-token KL.

Input (a `Case`): `score[b]` the outcome reward of row b (a reward model's or a verifier's), `extra["kl"]`
[B, T] the per-token KL estimate (anything at masked positions: what the pipeline's KL holds there),
`trainable` the action mask, `attention` the real tokens. Output: `reward[b, t]` at trainable positions
(masked positions are the framework's business unless it promises zeros):

    reward[b, t] = -kl_coef * kl[b, t]  +  [t == last(b)] * clip(score[b])

where `last(b)` is the row's last trainable position (the score is the reward of the whole response and lands
on its last action token: OpenRLHF's `compute_reward`, torchtune's `get_rewards_ppo` with the last valid index).
A row without a trainable token has no output. The bug class: a score placed on the last *attended* token, an
observation or an EOS under the mask, is lost to training (`score-kept`, mechanism `score-lost`).

Variants (`Declared.variant`):

    kl_coef      0.01      the KL coefficient (OpenRLHF --init_kl_coef / --algo.kl.init_coef, torchtune kl_coeff)
    score_clip   None      (lo, hi): the score clamped first (OpenRLHF's reward_clip_range, default (-10, 10))
    score_at     "last-trainable" (default) | "last-attended": the row's last real token, trainable or not (a
                 neighbouring variant: where the pipeline ends a response on a masked token it loses the score)

Whether masked positions hold `-kl_coef * kl` (the KL not masked: torchtune, OpenRLHF 0.11.2) or 0 (OpenRLHF
0.3.6-0.6.3 multiply the log-ratio by the mask) is not a variant of the trainable outputs: it is `masked-zero`'s
question, a defect only where a consumer reads the reward there unmasked.

The kind's own property (`PROPERTIES`, run by `oracles.kinds.judge`): `score-kept`, the score reaches a trainable
token of its own row, whatever the variant places where: a twin with each row's score moved by a power of two at
its magnitude (towards 0, so a clip still passes it) changes the sum of the row's trainable rewards by the
(clipped) move, and no other row.
"""

from __future__ import annotations

import torch

from maskfuzz.oracles.case import Case
from maskfuzz.oracles.tolerance import kind_bound
from maskfuzz.oracles.verdict import Verdict, diff, na, ok

OUTPUTS = ("reward",)
# the variant's choices a semantics card infers and a diagnosis tries as neighbours, with their candidates
DIMENSIONS = {"score_at": ["last-trainable", "last-attended"]}
PLACES = ("last-trainable", "last-attended")
DEFAULTS = {"kl_coef": 0.01, "score_clip": None, "score_at": "last-trainable"}


def options(variant: dict | None) -> dict:
    out = dict(DEFAULTS)
    for key, value in (variant or {}).items():
        if key not in DEFAULTS:
            raise ValueError(f"unknown token-reward option {key!r}; known: {sorted(DEFAULTS)}")
        out[key] = value
    if out["score_at"] not in PLACES:
        raise ValueError(f"unknown token-reward score_at {out['score_at']!r}; known: {list(PLACES)}")
    if out["score_clip"] is not None:
        lo, hi = out["score_clip"]
        if not lo <= hi:
            raise ValueError(f"token-reward score_clip {out['score_clip']!r}: lo > hi")
        out["score_clip"] = (float(lo), float(hi))
    return out


def _clip(score: float, v: dict) -> float:
    if v["score_clip"] is None:
        return score
    return min(max(score, v["score_clip"][0]), v["score_clip"][1])


def _where_score(case: Case, v: dict) -> torch.Tensor:
    """bool [B, T]: the one position of each row that receives the score (none for a row without one)."""
    marks = case.trainable if v["score_at"] == "last-trainable" else case.attention
    after = marks.flip(1).cumsum(1).flip(1)  # marked positions at or after t
    return marks & (after == 1)


def reference(case: Case, variant: dict | None = None, vectorised: bool = False) -> dict[str, torch.Tensor]:
    """reward [B, T]: -kl_coef * kl at trainable positions plus the (clipped) score at the row's scoring position
    (the last trainable one by default), 0 at every other position (a loop, or vectorised)."""
    v = options(variant)
    kl, live, coef = case.extra["kl"], case.trainable, float(v["kl_coef"])
    if vectorised:
        score = case.score if v["score_clip"] is None else case.score.clamp(*v["score_clip"])
        zero = torch.zeros(case.shape, dtype=torch.float64)
        out = torch.where(live, -coef * kl, zero)
        return {"reward": out + torch.where(_where_score(case, v), score[:, None].expand(case.shape), zero)}
    b_rows, t_len = case.shape
    out = torch.zeros(case.shape, dtype=torch.float64)
    marks = (case.trainable if v["score_at"] == "last-trainable" else case.attention).tolist()
    trainable, kls, scores = live.tolist(), kl.tolist(), case.score.tolist()
    for b in range(b_rows):
        for t in range(t_len):
            if trainable[b][t]:
                out[b, t] = -coef * kls[b][t]
        last = max((t for t in range(t_len) if marks[b][t]), default=None)
        if last is not None:
            out[b, last] += _clip(scores[b], v)
    return {"reward": out}


def condition(case: Case, variant: dict | None = None) -> torch.Tensor:
    """[B, T]: rounding of a dtype implementation in units of u: the product kl_coef * kl (and its rounding to the
    dtype) plus, at the scoring position, the score and the sum (each operand rounded once)."""
    v = options(variant)
    zero = torch.zeros(case.shape, dtype=torch.float64)
    live = case.trainable
    kl = torch.where(live, case.extra["kl"], zero).abs()
    coef = abs(float(v["kl_coef"]))
    score = case.score.abs()[:, None].expand(case.shape)
    at = _where_score(case, v) & live
    return torch.where(live, 4.0 * (coef * kl + (kl + 1.0) * coef) + torch.where(at, 4.0 * score, zero), zero)


def _clipped(score: torch.Tensor, v: dict) -> torch.Tensor:
    return score if v["score_clip"] is None else score.clamp(*v["score_clip"])


def score_move(case: Case, declared, v: dict) -> tuple[torch.Tensor, torch.Tensor] | str:
    """The twin of `score-kept`: (d [B] the move of each row's score, want [B] the change of the sum of the row's
    trainable rewards it must make, 0 in rows not judged), or the reason the property does not apply.
    d_b = -sign(s_b) 2^ceil(log2(|s_b| + 1)) (+1 at 0): exact in every dtype, larger than the rounding of the
    row's outputs, towards the clip range; want_b = clip(s + d) - clip(s) in rows with a trainable token."""
    rows = case.trainable.any(dim=1)
    if not bool(rows.any()):
        return "no row has a trainable token"
    if declared.score_map:
        return "the options map the score (clip, scale): the move is not the reference's"
    s = case.score
    mag = torch.exp2(torch.ceil(torch.log2(s.abs() + 1.0)))
    move = torch.where(s > 0, -mag, mag)
    want = torch.where(rows, _clipped(s + move, v) - _clipped(s, v), torch.zeros_like(s))
    if not bool((want != 0).any()):
        return "the clip absorbs the move in every row"
    return move, want


def row_sum_bound(case: Case, first: torch.Tensor, second: torch.Tensor, v: dict) -> torch.Tensor:
    """[B]: how far the change of a row's trainable reward sum may be off: the kind's bound of both runs' outputs
    at its trainable positions, summed over the row."""
    live, zero = case.trainable, torch.zeros(case.shape, dtype=torch.float64)
    mags = torch.where(live, first.abs() + second.abs(), zero)
    return torch.where(live, kind_bound(case.dtype, mags, condition(case, v) + mags), zero).sum(dim=1)


def score_kept(case: Case, out: dict, twin, declared, v: dict) -> Verdict:
    """`score-kept`: moving row b's score by d_b moves the sum of row b's trainable rewards by clip(s + d) - clip(s)
    (`twin(case)` runs the target on a twin; the move is `score_move`'s)."""
    moved = score_move(case, declared, v)
    if isinstance(moved, str):
        return na("score-kept", moved)
    move, want = moved
    got = twin(case.replace(score=case.score + move))["reward"]
    live, zero = case.trainable, torch.zeros(case.shape, dtype=torch.float64)
    change = torch.where(live, got - out["reward"], zero).sum(dim=1)
    bound = row_sum_bound(case, out["reward"], got, v)
    bad = (want != 0) & ((change - want).abs() > 2.0 * bound + 1e-3 * want.abs())
    if not bool(bad.any()):
        return ok("score-kept")
    after = live.flip(1).cumsum(1).flip(1)
    last = live & (after == 1) & bad[:, None]  # each failing row's last trainable token: where the move belongs
    expected = out["reward"] + torch.where(last, want[:, None].expand(case.shape), zero)
    return diff("score-kept", "reward", last, expected, got, "a moved score did not reach its row's trainable tokens")


PROPERTIES = {"score-kept": score_kept}  # the kind's own properties (oracles.kinds.judge runs them)
MECHANISMS = {"score-kept": "score-lost"}  # what each names (the score missed its row's trainable tokens)
# the own properties a reproducer checks as a move of the score: the twin moves it, each row's sum must follow
SCORE_MOVES = {"score-kept": (score_move, row_sum_bound)}

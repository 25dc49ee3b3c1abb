"""Reference estimators for the contracts `compressed`, `dense` and `segment`, all in float64.

Two independent implementations of each contract:

* `*_loop`: serial Python loops over one row at a time that read like the recursion of the spec.
  They are the definition; everything else is checked against them.
* `*_vec`: a vectorised chunked scan for large shapes (B x T up to 64 x 4096 and beyond), cross-
  checked against the loops in the tests.

Contract `compressed`, per row with idx = [t : trainable[t]], K = len(idx):
    r'_k = token_rewards[idx_k] (+ score at k = K-1),  v'_k = values[idx_k],  v'_K = 0
    delta_k = r'_k + gamma * v'_{k+1} - v'_k
    A'_k = delta_k + gamma * lam * A'_{k+1},  A'_K = 0;   Ret'_k = A'_k + v'_k
    A[idx_k] = A'_k, Ret[idx_k] = Ret'_k, 0 elsewhere; K = 0 gives zeros (the score is dropped).
Contract `dense`: the same recursion over all T positions with v'_t = values[t] if trainable else 0,
r'_t = token_rewards[t] if trainable else 0, the score added at the last trainable position, and
outputs kept only at trainable positions. Poison is *selected* out, never multiplied by 0.
Contract `segment` (per-turn agentic returns): each maximal run of trainable positions is one
transition (a turn). With runs S_0 .. S_{K-1} of a row in order:
    r'_k = sum of token_rewards over S_k (+ score for k = K-1),  v'_k = values at the first token of S_k
    the same recursion over k = 0 .. K-1, and every position of S_k gets A'_k / Ret'_k.
So one discount per turn, however many tokens the turn has or masked tokens lie between turns.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Literal

import torch

from maskfuzz.oracles.case import Case

Contract = Literal["compressed", "dense", "segment"]
CONTRACTS: tuple[str, ...] = ("compressed", "dense", "segment")


# ---------------------------------------------------------------------------------------------
# Serial loops: the definition.
# ---------------------------------------------------------------------------------------------
def classic_gae_loop(rewards: list[float], values: list[float], gamma: float, lam: float) -> tuple[list, list]:
    """Textbook GAE over one unmasked sequence of length n with a zero bootstrap after it.

    delta_t = r_t + gamma * v_{t+1} - v_t (v_n = 0); A_t = delta_t + gamma * lam * A_{t+1}; Ret = A + v.
    """
    n = len(rewards)
    adv = [0.0] * n
    nxt_value, nxt_adv = 0.0, 0.0
    for t in reversed(range(n)):
        delta = rewards[t] + gamma * nxt_value - values[t]
        nxt_adv = delta + gamma * lam * nxt_adv
        adv[t] = nxt_adv
        nxt_value = values[t]
    return adv, [a + v for a, v in zip(adv, values)]


def compressed_loop(case: Case) -> tuple[torch.Tensor, torch.Tensor]:
    """Contract `compressed` by serial loops. Returns (advantages, returns), float64 [B, T]."""
    b_rows, t_len = case.shape
    adv = torch.zeros(b_rows, t_len, dtype=torch.float64)
    ret = torch.zeros(b_rows, t_len, dtype=torch.float64)
    for b in range(b_rows):
        idx = case.trainable[b].nonzero().flatten().tolist()
        if not idx:
            continue  # K = 0: zeros, the score is dropped
        rewards = [float(case.token_rewards[b, t]) for t in idx]
        rewards[-1] += float(case.score[b])
        values = [float(case.values[b, t]) for t in idx]
        a_packed, r_packed = classic_gae_loop(rewards, values, case.gamma, case.lam)
        for k, t in enumerate(idx):
            adv[b, t] = a_packed[k]
            ret[b, t] = r_packed[k]
    return adv, ret


def dense_loop(case: Case) -> tuple[torch.Tensor, torch.Tensor]:
    """Contract `dense` by serial loops. Returns (advantages, returns), float64 [B, T]."""
    b_rows, t_len = case.shape
    adv = torch.zeros(b_rows, t_len, dtype=torch.float64)
    ret = torch.zeros(b_rows, t_len, dtype=torch.float64)
    for b in range(b_rows):
        live = case.trainable[b].tolist()
        if not any(live):
            continue
        rewards = [float(case.token_rewards[b, t]) if live[t] else 0.0 for t in range(t_len)]
        values = [float(case.values[b, t]) if live[t] else 0.0 for t in range(t_len)]
        last = max(t for t in range(t_len) if live[t])
        rewards[last] += float(case.score[b])
        a_full, r_full = classic_gae_loop(rewards, values, case.gamma, case.lam)
        for t in range(t_len):
            if live[t]:
                adv[b, t] = a_full[t]
                ret[b, t] = r_full[t]
    return adv, ret


def segment_loop(case: Case) -> tuple[torch.Tensor, torch.Tensor]:
    """Contract `segment` by serial loops. Returns (advantages, returns), float64 [B, T]."""
    b_rows, t_len = case.shape
    adv = torch.zeros(b_rows, t_len, dtype=torch.float64)
    ret = torch.zeros(b_rows, t_len, dtype=torch.float64)
    for b in range(b_rows):
        live = case.trainable[b].tolist()
        runs: list[list[int]] = []
        for t in range(t_len):
            if live[t]:
                if t == 0 or not live[t - 1]:
                    runs.append([])
                runs[-1].append(t)
        if not runs:
            continue
        rewards = [sum(float(case.token_rewards[b, t]) for t in run) for run in runs]
        rewards[-1] += float(case.score[b])
        values = [float(case.values[b, run[0]]) for run in runs]
        a_turn, r_turn = classic_gae_loop(rewards, values, case.gamma, case.lam)
        for k, run in enumerate(runs):
            for t in run:
                adv[b, t] = a_turn[k]
                ret[b, t] = r_turn[k]
    return adv, ret


# ---------------------------------------------------------------------------------------------
# Vectorised: a chunked scan, independent of the loops.
# ---------------------------------------------------------------------------------------------
_CHUNK = 64


@functools.lru_cache(maxsize=256)  # shared: callers only read it
def _decay_matrix(c: float, n: int) -> torch.Tensor:
    """M[i, j] = c**(j - i) for j >= i, else 0; float64 [n, n]. 0**0 is 1."""
    i = torch.arange(n, dtype=torch.float64)
    power = i[None, :] - i[:, None]
    m = torch.pow(torch.tensor(c, dtype=torch.float64), power.clamp(min=0))
    return torch.where(power >= 0, m, torch.zeros((), dtype=torch.float64))


def discounted_suffix_sum(delta: torch.Tensor, c: float, chunk: int = _CHUNK) -> torch.Tensor:
    """A_k = sum_{j >= k} c**(j-k) * delta_j along the last dim of float64 [B, L] `delta`.

    Within chunks of `chunk` positions a triangular matrix of powers does the sum; the carries
    between chunks are the same sum one level up with ratio c**chunk. Powers of c <= 1 never
    overflow, so the result stays exact to float64 rounding at any length.
    """
    b_rows, length = delta.shape
    if length == 0:
        return delta.clone()
    n_chunks = -(-length // chunk)
    padded = torch.zeros(b_rows, n_chunks * chunk, dtype=torch.float64)
    padded[:, :length] = delta
    blocks = padded.view(b_rows, n_chunks, chunk)
    local = blocks @ _decay_matrix(c, chunk).T  # local[.., n, i] = sum_{j>=i in chunk n}
    # carry[n] = A at the first position of chunk n = sum_{m>=n} (c**chunk)**(m-n) local[m, 0]
    carry = local[:, :, 0] @ _decay_matrix(c**chunk, n_chunks).T
    nxt = torch.zeros(b_rows, n_chunks, dtype=torch.float64)
    nxt[:, :-1] = carry[:, 1:]
    tail = torch.pow(torch.tensor(c, dtype=torch.float64), torch.arange(chunk, 0, -1, dtype=torch.float64))
    out = local + nxt[:, :, None] * tail  # c**(chunk - i) * A(next chunk start)
    return out.reshape(b_rows, -1)[:, :length]


def gae_packed(rewards: torch.Tensor, values: torch.Tensor, gamma: float, lam: float):
    """GAE over packed float64 [B, L] rows with a zero bootstrap after position L-1."""
    nxt = torch.zeros_like(values)
    nxt[:, :-1] = values[:, 1:]
    delta = rewards + gamma * nxt - values
    adv = discounted_suffix_sum(delta, gamma * lam)
    return adv, adv + values


def last_trainable(trainable: torch.Tensor) -> torch.Tensor:
    """bool [B, T]: True at the last trainable position of each row (none for K = 0 rows)."""
    after = trainable.flip(1).cumsum(1).flip(1)  # trainable positions at or after t
    return trainable & (after == 1)


@dataclass(frozen=True)
class Recursion:
    """The sequences a contract runs its recursion over, float64/bool/long [B, L].

    order[b, k]  the window position that packed slot k came from (a permutation of 0..T-1)
    live[b, k]   whether slot k is a trainable position (its output is kept)
    rewards, values  r' and v' of the spec, 0 at dead slots; v'_L = 0 is implied
    slot[b, t]   `segment` only: the turn (slot) of window position t, -1 where t is not trainable;
                 `order` is then unused and a slot's output goes to every position of its turn
    magnitude    what computing r' rounds, in units of u: |r'| plus `meta["reward_rounding"]` (a KL
                 term's rounding); for `segment` the turn's sum of it times 1 + log2(its tokens)
    """

    order: torch.Tensor
    live: torch.Tensor
    rewards: torch.Tensor
    values: torch.Tensor
    magnitude: torch.Tensor
    slot: torch.Tensor | None = None

    def scatter(self, packed: torch.Tensor) -> torch.Tensor:
        """Packed float64 [B, L] back to window positions, 0 where not live."""
        zero = torch.zeros((), dtype=packed.dtype)
        if self.slot is not None:
            out = torch.gather(packed, 1, self.slot.clamp(min=0))
            return torch.where(self.slot >= 0, out, zero)
        return torch.zeros_like(packed).scatter(1, self.order, torch.where(self.live, packed, zero))


def recursion(case: Case, contract: str) -> Recursion:
    """Pack `case` for `contract`: trainable positions first (`compressed`) or the whole window
    (`dense`); poison is selected out, the score added at the last trainable position."""
    if contract not in CONTRACTS:
        raise ValueError(f"unknown contract {contract!r}; expected one of {CONTRACTS}")
    tr = case.trainable
    zero = torch.zeros((), dtype=torch.float64)
    rewards = case.token_rewards + torch.where(last_trainable(tr), case.score[:, None], zero)
    magnitude = rewards.abs() + case.meta.get("reward_rounding", zero)  # what computing r' rounds (a KL term)
    if contract == "segment":
        return _segments(case, rewards, magnitude)
    if contract == "compressed":
        # a stable sort puts each row's trainable positions first, in order
        order = torch.sort((~tr).to(torch.int8), dim=1, stable=True).indices
    else:
        order = torch.arange(tr.shape[1]).expand_as(tr).contiguous()
    live = torch.gather(tr, 1, order)
    packed_r = torch.where(live, torch.gather(rewards, 1, order), zero)
    packed_v = torch.where(live, torch.gather(case.values, 1, order), zero)
    mag = torch.where(live, torch.gather(magnitude, 1, order), zero)
    return Recursion(order, live, packed_r, packed_v, magnitude=mag)


def _segments(case: Case, rewards: torch.Tensor, magnitude: torch.Tensor) -> Recursion:
    """Pack each row's turns (maximal trainable runs) into slots 0 .. K-1: r' the turn's reward sum,
    v' the value at its first token."""
    tr = case.trainable
    b_rows, t_len = tr.shape
    zero = torch.zeros((), dtype=torch.float64)
    prev = torch.zeros_like(tr)
    prev[:, 1:] = tr[:, :-1]
    starts = tr & ~prev
    slot = torch.where(tr, starts.long().cumsum(1) - 1, torch.full_like(tr, -1, dtype=torch.long))
    index = slot.clamp(min=0)
    packed_r = torch.zeros(b_rows, t_len, dtype=torch.float64).scatter_add(1, index, torch.where(tr, rewards, zero))
    mag = torch.zeros(b_rows, t_len, dtype=torch.float64).scatter_add(1, index, torch.where(tr, magnitude, zero))
    count = torch.zeros(b_rows, t_len, dtype=torch.float64).scatter_add(1, index, tr.double())
    mag = mag * (1.0 + torch.log2(count.clamp(min=1.0)))  # a sum of n terms rounds ~ log2(n) times per term
    packed_v = torch.zeros(b_rows, t_len, dtype=torch.float64).scatter_add(
        1, index, torch.where(starts, case.values, zero)
    )
    live = torch.arange(t_len)[None, :] < starts.sum(1, keepdim=True)
    order = torch.arange(t_len).expand_as(tr).contiguous()
    return Recursion(order, live, packed_r, packed_v, mag, slot=slot)


def _vectorised(contract: str):
    def run(case: Case) -> tuple[torch.Tensor, torch.Tensor]:
        rec = recursion(case, contract)
        adv, ret = gae_packed(rec.rewards, rec.values, case.gamma, case.lam)
        return rec.scatter(adv), rec.scatter(ret)

    run.__name__ = f"{contract}_vec"
    run.__doc__ = f"Contract `{contract}`, vectorised: pack, chunked scan, scatter back. float64 [B, T] x 2."
    return run


compressed_vec = _vectorised("compressed")
dense_vec = _vectorised("dense")
segment_vec = _vectorised("segment")


LOOPS = {"compressed": compressed_loop, "dense": dense_loop, "segment": segment_loop}
VECTORISED = {"compressed": compressed_vec, "dense": dense_vec, "segment": segment_vec}


def reference(case: Case, contract: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The float64 reference (advantages, returns) of `contract` for `case`.

    Uses the vectorised scan; the loops define it and the test suite holds the two equal.
    """
    try:
        return VECTORISED[contract](case)
    except KeyError:
        raise ValueError(f"unknown contract {contract!r}; expected one of {CONTRACTS}") from None

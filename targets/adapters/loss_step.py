"""One optimizer step of a loss aggregator, as a trainer runs it: the shared driver of the
`loss-aggregation` entries (`oracles/kinds/loss_aggregation.py`).

The case's per-token losses become one leaf tensor (the case's dtype, on the device). Each
micro-batch (`microbatches`: split id order, the i-th on rank i % ranks) is handed to the
framework's aggregator by `micro_loss(rows, loss, mask, step)`, which also gets the whole step
(`Step`: what a trainer computes before the loop and passes as the global normalisers). The
micro-batch losses of a rank are summed, as gradient accumulation sums their backward passes,
and the ranks are averaged, as data-parallel all-reduce averages gradients; one backward pass
gives dL/dl. Returns (loss broadcast to [B, T], grad [B, T]).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import torch

from maskfuzz.oracles.case import Case
from maskfuzz.oracles.kinds.loss_aggregation import microbatches


@dataclass(frozen=True)
class Step:
    """The whole step as a trainer sees it before its micro-batch loop."""

    case: Case
    ranks: int  # data-parallel size
    micro_batches: int  # micro-batches in the step (all ranks)
    per_rank: int  # micro-batches on the busiest rank (gradient accumulation steps)
    tokens: int  # trainable tokens in the step (all ranks)
    rows: int  # rows in the step, empty ones included
    nonempty_rows: int  # rows with a trainable token
    mask: torch.Tensor  # [B, T] the loss mask of the whole step, in the case's dtype
    rank: int = 0  # the rank of the micro-batch being aggregated
    rank_rows: int = 0  # rows on that rank (its mini-batch), empty ones included
    rank_micro_batches: int = 0  # micro-batches on that rank (its gradient accumulation steps)


MicroLoss = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, Step], torch.Tensor]


def run_step(
    case: Case, device: str, micro_loss: MicroLoss, leaf_name: str = "loss"
) -> tuple[torch.Tensor, torch.Tensor]:
    """`leaf_name` is the input the gradient is taken with respect to: the per-token loss, or the
    critic's predictions `v` of the `value-loss` kind (whose micro_loss reads the rest from step.case)."""
    dt = case.torch_dtype
    leaf = case.extra[leaf_name].to(device=device, dtype=dt).clone().requires_grad_(True)
    mask = case.trainable.to(device=device, dtype=dt)
    mbs = microbatches(case)
    counts = [sum(1 for r, _ in mbs if r == rank) for rank in range(case.ranks)]
    step = Step(
        case=case,
        ranks=case.ranks,
        micro_batches=len(mbs),
        per_rank=max(counts),
        tokens=int(case.trainable.sum()),
        rows=case.shape[0],
        nonempty_rows=int(case.trainable.any(dim=1).sum()),
        mask=mask,
    )
    rank_rows = [sum(len(r) for k, r in mbs if k == rank) for rank in range(case.ranks)]
    per_rank = [None] * case.ranks
    for rank, rows in mbs:
        idx = rows.to(device)
        here = replace(step, rank=rank, rank_rows=rank_rows[rank], rank_micro_batches=counts[rank])
        out = micro_loss(idx, leaf[idx], mask[idx], here)
        per_rank[rank] = out if per_rank[rank] is None else per_rank[rank] + out
    total = sum(x for x in per_rank if x is not None) / case.ranks
    if not isinstance(total, torch.Tensor):
        raise RuntimeError(f"the aggregator returned {type(total).__name__}, not a tensor")
    if total.numel() != 1:
        raise RuntimeError(f"the aggregator returned a tensor of shape {list(total.shape)}, not a scalar loss")
    if total.requires_grad:  # a constant (e.g. 0 for an empty micro-batch) has no gradient: zeros
        total.backward()
    grad = leaf.grad if leaf.grad is not None else torch.zeros_like(leaf)
    return total.detach().reshape(()).expand(case.shape).clone(), grad.detach()

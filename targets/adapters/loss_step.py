"""One optimizer step of a loss aggregator, as a trainer runs it: the shared driver of the
`loss-aggregation` entries (`oracles/kinds/loss_aggregation/`).

The case's per-token losses become one leaf tensor (the case's dtype, on the device). Each
micro-batch (`microbatches`: split id order, the i-th on rank i % ranks) is handed to the
framework's aggregator by `micro_loss(rows, loss, mask, step)`, which also gets the whole step
(`Step`: what a trainer computes before the loop and passes as the global normalisers). The
micro-batch losses of a rank are summed, as gradient accumulation sums their backward passes,
and the ranks are averaged, as data-parallel all-reduce averages gradients; one backward pass
gives dL/dl. Returns (loss broadcast to [B, T], grad [B, T]).

`run_step_gloo` runs the same step on real ranks: one forked process per rank in a CPU gloo
process group, for aggregators that call torch.distributed themselves (an all-reduce of the step's
normaliser); the gradients and losses of the ranks are then averaged by an all-reduce, as
data-parallel training does.
"""

from __future__ import annotations

import datetime
import os
import pickle
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
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
    leaf, per_rank = _accumulate(case, device, micro_loss, leaf_name)
    total = sum(x for x in per_rank if x is not None) / case.ranks
    grad = _backward(total, leaf)
    return total.detach().reshape(()).expand(case.shape).clone(), grad.detach()


def _accumulate(case: Case, device: str, micro_loss: MicroLoss, leaf_name: str, rank: int | None = None):
    """(the leaf, each rank's micro-batch losses summed, as gradient accumulation sums them; None for a rank
    without a micro-batch); with `rank`, that rank's micro-batches only."""
    leaf, mask, steps = _prepare(case, device, leaf_name)
    per_rank = [None] * case.ranks
    for here, rows in steps:
        if rank is not None and here.rank != rank:
            continue
        idx = rows.to(device)
        out = micro_loss(idx, leaf[idx], mask[idx], here)
        per_rank[here.rank] = out if per_rank[here.rank] is None else per_rank[here.rank] + out
    return leaf, per_rank


def _backward(total, leaf: torch.Tensor) -> torch.Tensor:
    """dtotal/dleaf: one backward pass of the step's scalar loss (zeros for a constant, e.g. 0 for an empty
    micro-batch, which has no gradient)."""
    if not isinstance(total, torch.Tensor):
        raise RuntimeError(f"the aggregator returned {type(total).__name__}, not a tensor")
    if total.numel() != 1:
        raise RuntimeError(f"the aggregator returned a tensor of shape {list(total.shape)}, not a scalar loss")
    if total.requires_grad:
        total.backward()
    return leaf.grad if leaf.grad is not None else torch.zeros_like(leaf)


def _prepare(case: Case, device: str, leaf_name: str) -> tuple[torch.Tensor, torch.Tensor, list]:
    """(the leaf, the mask, (the step as micro-batch i sees it, its rows) for each micro-batch in order)."""
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
    here = lambda rank: replace(step, rank=rank, rank_rows=rank_rows[rank], rank_micro_batches=counts[rank])  # noqa: E731
    return leaf, mask, [(here(rank), rows) for rank, rows in mbs]


def run_step_gloo(
    case: Case, device: str, micro_loss: MicroLoss, leaf_name: str = "loss", timeout: float = 120.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """`run_step` on `case.ranks` real ranks: each a forked process (so compiled framework code and
    closures come along) in a CPU gloo group, running its own micro-batches with torch.distributed
    initialised, so a framework's own all-reduce sees the other ranks. The rank losses and
    gradients are averaged by an all-reduce (float64), as data-parallel training averages them. An
    exception on a rank is raised here (that of the rank that failed first: the others then fail in
    their collectives); a rank that does not finish in `timeout` seconds is killed and reported."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    with tempfile.TemporaryDirectory(prefix="maskfuzz-gloo-") as tmp:
        init = f"file://{tmp}/rendezvous"
        outs = [Path(tmp) / f"rank{r}.pkl" for r in range(case.ranks)]
        procs = [
            ctx.Process(target=_rank_main, args=(r, case, device, micro_loss, leaf_name, init, outs[r]), daemon=True)
            for r in range(case.ranks)
        ]
        for p in procs:
            p.start()
        deadline = time.monotonic() + timeout
        # a rank that failed leaves the others waiting in a collective: stop them at its first error
        while any(p.is_alive() for p in procs) and time.monotonic() < deadline:
            if any(p.exitcode not in (None, 0) for p in procs):  # the others get a moment to write their errors
                deadline = min(deadline, time.monotonic() + 5.0)
            time.sleep(0.005)
        hung = [r for r, p in enumerate(procs) if p.is_alive() and all(q.exitcode in (None, 0) for q in procs)]
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
        if hung:
            raise TimeoutError(f"gloo rank(s) {hung} of {case.ranks} did not finish within {timeout:g} s")
        results = {r: pickle.loads(path.read_bytes()) for r, path in enumerate(outs) if path.is_file()}
    errors = [(payload[1], r, payload[0]) for r, (kind, payload) in results.items() if kind == "error"]
    if errors:  # the rank that failed first: the others fail only because it left their collectives
        raise min(errors, key=lambda e: (e[0], e[1]))[2]
    if len(results) < case.ranks:
        missing = sorted(set(range(case.ranks)) - set(results))
        codes = [procs[r].exitcode for r in missing]
        raise RuntimeError(f"gloo rank(s) {missing} exited with code(s) {codes} and no result")
    loss, grad = results[0][1]
    dt = case.torch_dtype
    return loss.to(dt).reshape(()).expand(case.shape).clone(), grad.to(dt)


def _rank_main(rank, case, device, micro_loss, leaf_name, init, out: Path) -> None:
    """One rank of `run_step_gloo` (in a forked process; never returns). It writes ("ok", (loss, grad))
    or ("error", (exception, when it was raised)) to `out`."""
    import torch.distributed as dist

    try:
        torch.set_num_threads(1)
        # a collective left waiting by a failed rank gives up (the parent stops the ranks sooner)
        wait = datetime.timedelta(seconds=60)
        dist.init_process_group("gloo", init_method=init, rank=rank, world_size=case.ranks, timeout=wait)
        try:
            result = ("ok", _rank_step(rank, case, device, micro_loss, leaf_name))
        except BaseException as exc:  # noqa: BLE001 - timed before the group goes down under the other ranks
            result = ("error", (exc, time.monotonic()))
        finally:
            dist.destroy_process_group()
    except BaseException as exc:  # noqa: BLE001 - the group itself failed
        result = ("error", (exc, time.monotonic()))
    if result[0] == "error":
        try:
            pickle.dumps(result)
        except Exception:  # noqa: BLE001 - an exception that does not pickle goes as its text
            exc, at = result[1]
            result = ("error", (RuntimeError(f"{type(exc).__name__}: {exc}"), at))
    part = out.with_suffix(".part")
    part.write_bytes(pickle.dumps(result))
    part.rename(out)  # the parent reads whole results only
    os._exit(0 if result[0] == "ok" else 1)  # never run the parent's atexit handlers or flush its buffers twice


def _rank_step(rank, case, device, micro_loss, leaf_name) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's micro-batches, backward, and the all-reduced (averaged) loss and gradient."""
    import torch.distributed as dist

    leaf, per_rank = _accumulate(case, device, micro_loss, leaf_name, rank)
    total = per_rank[rank]
    if total is None:
        raise RuntimeError(f"rank {rank} has no micro-batch")
    grad = _backward(total, leaf).detach().to("cpu", torch.float64)
    loss = total.detach().to("cpu", torch.float64).reshape(1).clone()
    for x in (loss, grad):  # data-parallel averaging
        dist.all_reduce(x)
        x /= case.ranks
    return loss, grad

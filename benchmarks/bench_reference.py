"""The float64 references against torchrl's vectorised GAE, same process, same shapes.

    python benchmarks/bench_reference.py [--pin 0.14.1 | --torchrl-root /path/to/unpacked/wheel]
                                         [--batch 64] [--length 4096] [--repeats 7] [--gamma 0.99] [--lam 0.95]

Times `oracles.kinds.gae.reference.compressed_vec` and `dense_vec` (pack, chunked scan, scatter back; a `Case`
in, [B, T] out) and torchrl's `vec_generalized_advantage_estimate` (inputs prepared beforehand by the
torchrl adapter's mapping, [B, T, 1]) on float64 B x T, once with every position trainable and once
with masks (left padding, gaps, observation tails, padding). Each figure is the median of `--repeats`
timed calls after one warm-up call; the ratio reference / torchrl is printed per layout, so machine
load cancels out to first order.

torchrl comes from a released wheel in the maskfuzz cache (`targets.acquire`, downloading it once
when missing) or from `--torchrl-root`, and is imported in this process: the worker's pickling
would otherwise be part of the time. Note: with scalar gamma and lambda torchrl filters with a
geometric series cut where it falls below 1e-7 (int(log 1e-7 / log(gamma * lam)) terms), so its cost
depends on gamma * lam; the references always run the whole recursion.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from maskfuzz.oracles.case import Case  # noqa: E402
from maskfuzz.oracles.kinds.gae.reference import compressed_vec, dense_vec  # noqa: E402
from maskfuzz.targets.adapters import torchrl as torchrl_adapter  # noqa: E402
from maskfuzz.targets.adapters.base import import_from  # noqa: E402

FUNCTION = "vec_generalized_advantage_estimate"
MODULE = "torchrl.objectives.value.functional"


def torchrl_root(pin: str, root: str | None) -> tuple[Path, str]:
    """The unpacked torchrl wheel to import, and how it was found."""
    if root:
        return Path(root), f"--torchrl-root {root}"
    from maskfuzz.targets.registry import get
    from maskfuzz.targets.runtime.acquire import acquire

    checkout = acquire(get("torchrl"), pin)
    return checkout.root, checkout.resolved


def load_vec(root: Path) -> Callable:
    """torchrl's vectorised GAE imported from `root` (refuses a copy from anywhere else)."""
    sys.path.insert(0, str(root))
    return getattr(import_from(root, MODULE), FUNCTION)


def make_case(batch: int, length: int, masked: bool, gamma: float, lam: float, seed: int = 0) -> Case:
    """A float64 case; with `masked`, rows mix left padding, gaps, observation tails and padding."""
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randn(batch, length, generator=g, dtype=torch.float64) * 0.1
    values = torch.randn(batch, length, generator=g, dtype=torch.float64)
    score = torch.randn(batch, generator=g, dtype=torch.float64)
    if not masked:
        ones = torch.ones(batch, length, dtype=torch.bool)
        return Case(ones, ones.clone(), rewards, values, score, gamma, lam, "float64")
    attention = torch.zeros(batch, length, dtype=torch.bool)
    trainable = torch.zeros(batch, length, dtype=torch.bool)
    for b in range(batch):
        start = int(torch.randint(0, length // 8, (1,), generator=g)) if b % 2 else 0  # left padding on odd rows
        end = length - int(torch.randint(0, length // 4, (1,), generator=g))  # right padding
        attention[b, start:end] = True
        trainable[b, start:end] = torch.rand(end - start, generator=g) < 0.8  # gaps (multi-turn observations)
        trainable[b, end - int(torch.randint(0, 32, (1,), generator=g)) : end] = False  # observation tail
    return Case(attention, trainable, rewards, values, score, gamma, lam, "float64")


def median_time(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up: allocator, first-call dispatch
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pin", default="0.14.1", help="torchrl release to take from the cache (default 0.14.1)")
    ap.add_argument("--torchrl-root", default=None, help="an unpacked torchrl wheel to import instead")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--length", type=int, default=4096)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--gamma", type=float, default=0.99)
    ap.add_argument("--lam", type=float, default=0.95)
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's own)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    root, source = torchrl_root(args.pin, args.torchrl_root)
    vec = load_vec(root)
    c = args.gamma * args.lam
    print(f"torchrl {FUNCTION} from {source} ({root})")
    print(f"float64 B={args.batch} T={args.length} gamma={args.gamma} lam={args.lam} "
          f"threads={torch.get_num_threads()} repeats={args.repeats} (median seconds)")
    print(f"{'layout':<15}{'compressed_vec':>16}{'dense_vec':>12}{'torchrl vec':>13}"
          f"{'compressed/torchrl':>20}{'dense/torchrl':>15}")
    for masked in (False, True):
        case = make_case(args.batch, args.length, masked, args.gamma, args.lam)
        kw = torchrl_adapter.framework_inputs(case, "cpu")
        t_comp = median_time(lambda: compressed_vec(case), args.repeats)
        t_dense = median_time(lambda: dense_vec(case), args.repeats)
        t_rl = median_time(lambda: vec(args.gamma, args.lam, **kw), args.repeats)
        layout = "with masks" if masked else "all trainable"
        print(f"{layout:<15}{t_comp:>16.4f}{t_dense:>12.4f}{t_rl:>13.4f}{t_comp / t_rl:>20.2f}{t_dense / t_rl:>15.2f}")
        if not masked:  # same computation: the dense reference and torchrl agree up to torchrl's cut-off
            adv_ref, _ = dense_vec(case)
            adv_rl = vec(args.gamma, args.lam, **kw)[0].squeeze(-1)
            scale = adv_ref.abs().max().item()
            print(f"{'':<15}max |torchrl - dense_vec| = {(adv_rl - adv_ref).abs().max().item():.2e} "
                  f"(max |A| {scale:.2f}; torchrl keeps {_kept_terms(c, args.length)} terms of the series)")
    return 0


def _kept_terms(c: float, length: int) -> int:
    import math

    if c == 0.0:
        return 0
    return length if c >= 1.0 else min(length, int(math.log(1e-7) / math.log(c)))


if __name__ == "__main__":
    sys.exit(main())

"""Fuzzing benchmark: how fast each mutant of the zoo is found, how small the value-bootstrap
mutant shrinks, and fuzz-loop throughput against a bare loop that only draws the same cases.

    python benchmarks/bench_fuzz.py [--seeds 10] [--examples 2000] [--throughput-examples 300]

Every figure is measured in this run; the throughput is a ratio against the bare draw loop
measured in the same run, so machine load cancels out to first order.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from hypothesis import given

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import mutant_zoo as zoo  # noqa: E402

from maskfuzz.fuzz.engine import base_settings, fuzz_target  # noqa: E402
from maskfuzz.oracles.declared import Declared  # noqa: E402
from maskfuzz.oracles.kinds.gae.strategies import cases  # noqa: E402


def time_to_first_failure(seeds: int, examples: int) -> list[tuple[str, str, float, float, int]]:
    rows = []
    for mutant, (declared, prop) in zoo.CATCHES.items():
        times, misses = [], 0
        for seed in range(seeds):
            result = fuzz_target(
                zoo.as_run(mutant),
                declared,
                target=mutant.__name__,
                max_examples=examples,
                seed=seed,
                shrink=False,
                stop_when=lambda r, p=prop: p in r.first_failure_at,
            )
            if prop in result.first_failure_at:
                times.append(result.first_failure_at[prop])
            else:
                misses += 1
                times.append(float("inf"))
        rows.append((mutant.__name__, prop, statistics.median(times), max(times), misses))
    return rows


def shrunk_bootstrap_size(seed: int = 0) -> tuple[int, int]:
    declared, _ = zoo.CATCHES[zoo.values_masked_for_storage_only]
    result = fuzz_target(
        zoo.as_run(zoo.values_masked_for_storage_only), declared, target="m", max_examples=500, seed=seed
    )
    finding = result.finding("poison") or result.finding("reference")
    return finding.case.shape


def throughput(examples: int, seed: int = 0) -> tuple[float, float]:
    """Examples per second of the full fuzz loop (correct target, every property) and of a loop
    that only draws the same cases with the same settings."""
    declared = Declared("compressed")
    strategy = cases(declared.domain)
    count = {"n": 0}

    def draw_only(case) -> None:
        count["n"] += 1

    test = base_settings(examples)(given(strategy)(draw_only))
    t0 = time.perf_counter()
    test()
    bare = count["n"] / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    result = fuzz_target(zoo.as_run(zoo.correct_compressed), declared, target="ref", max_examples=examples, seed=seed)
    full = result.examples / (time.perf_counter() - t0)
    assert not result.findings
    return full, bare


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--examples", type=int, default=2000, help="cap per seed for time-to-first-failure")
    ap.add_argument("--throughput-examples", type=int, default=300)
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"time to first failure over {args.seeds} seeds (seconds; shrinking off)")
    print(f"{'mutant':36s} {'property':18s} {'median':>8s} {'max':>8s} misses")
    for name, prop, med, mx, misses in time_to_first_failure(args.seeds, args.examples):
        print(f"{name:36s} {prop:18s} {med:8.2f} {mx:8.2f} {misses}")
    b, t = shrunk_bootstrap_size()
    print(f"\nvalue-bootstrap mutant shrinks to B={b} T={t}")
    full, bare = throughput(args.throughput_examples)
    print(
        f"\nthroughput: fuzz loop {full:.1f} examples/s, bare draw loop {bare:.1f} examples/s, ratio {full / bare:.0%}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The cost of a discovered entry: fuzz-loop examples per second of discovered variants (invariants only, called
through the framework's registry) against the hand-written entry of the same kind at the same pin, in one run.

    python benchmarks/bench_discovery.py [--examples 60] [--seed 0] [--repo NAME=PATH ...] [--only verl,skyrl]

Each entry is opened as the fuzzer opens it (`open_target`: the pin's code acquired, a worker process, the real
upstream function) and fuzzed by `fuzz_target` for `--examples` examples with shrinking off (a finding is counted,
not minimised, so triage is not part of the figure). Figures: examples / second of the fuzz loop; the ratio
discovered / hand-written per pair, printed so that machine load cancels out to first order (the pairs of one
group run back to back). Git pins (`main`) need the mirror in `--repo` or MASKFUZZ_REPOS.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from maskfuzz.fuzz.engine import fuzz_target  # noqa: E402
from maskfuzz.targets.runtime.session import open_target  # noqa: E402

# (framework, pin, hand-written entry, discovered entries of the same kind)
GROUPS = (
    (
        "verl",
        "0.9.1",
        "policy-loss",
        ("policy-loss:gspo", "policy-loss:sapo", "policy-loss:cispo", "policy-loss:geo_mean"),
    ),
    ("skyrl", "0.3.1", "policy-loss", ("policy-loss:dual_clip", "policy-loss:gspo", "policy-loss:sapo")),
    ("skyrl", "main", "policy-loss", ("policy-loss:dppo", "policy-loss:rollout_is", "policy-loss:importance_sampling")),
    ("skyrl", "main", "grpo", ("adv:maxrl",)),
    # the config choices with call recipes and the frameworks discovered since (issue 26, third slice)
    ("nemo-rl", "main", "policy-loss", ("loss:disable_ppo_ratio=true", "loss:truncated_importance_sampling_type=tis")),
    ("slime", "main", "policy-loss", ("policy:gspo", "switch:use_tis")),
    ("miles", "0.0.2", "policy-loss", ("policy:gspo", "switch:use_tis")),
    ("areal", "1.0.4", "adv-norm", ("adv-norm:adv_norm.mean_level=group",)),
    ("openrlhf", "0.11.2", "group_norm", ("adv:reinforce_baseline",)),
    ("roll", "main", "agentic-reinforce", ("ret:reinforce",)),
)


def rate(label: str, repos: dict, examples: int, seed: int) -> tuple[float, int, float, str]:
    """(examples / second, examples, seconds, how it was judged) of the fuzz loop on `label`."""
    with open_target(label, repos=repos, timeout=120) as handle:
        judged = "reference" if handle.declared.reference else "invariants only"
        t0 = time.perf_counter()
        result = fuzz_target(handle.run, handle.declared, target=label, max_examples=examples, seed=seed, shrink=False)
        took = time.perf_counter() - t0
    return result.examples / took, result.examples, took, judged


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--examples", type=int, default=60)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repo", action="append", default=[], metavar="NAME=PATH")
    ap.add_argument("--only", default="", help="comma-separated frameworks (default: every group)")
    args = ap.parse_args()
    repos = dict(x.split("=", 1) for x in os.environ.get("MASKFUZZ_REPOS", "").split(",") if "=" in x)
    repos.update(dict(x.split("=", 1) for x in args.repo))
    only = set(filter(None, args.only.split(",")))
    ratios = []
    print(f"{'entry':44s} {'judged':16s} {'examples':>8s} {'seconds':>8s} {'ex/s':>7s} {'ratio':>6s}")
    for fw, pin, hand, found in GROUPS:
        if only and fw not in only:
            continue
        base, n, took, judged = rate(f"{fw}:{hand}@{pin}", repos, args.examples, args.seed)
        print(f"{fw}:{hand}@{pin:38s}"[:44].ljust(44) + f" {judged:16s} {n:8d} {took:8.1f} {base:7.1f} {1:6.2f}")
        for entry in found:
            r, n, took, judged = rate(f"{fw}:{entry}@{pin}", repos, args.examples, args.seed)
            ratios.append(r / base)
            print(f"{fw}:{entry}@{pin}"[:44].ljust(44) + f" {judged:16s} {n:8d} {took:8.1f} {r:7.1f} {r / base:6.2f}")
    if ratios:
        print(
            f"\ndiscovered / hand-written examples per second: median {statistics.median(ratios):.2f}, "
            f"range {min(ratios):.2f}-{max(ratios):.2f} over {len(ratios)} discovered entries"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What a real rollout costs next to fuzzing: one executed witness (`maskfuzz validate`'s path: a tiny LM's
generation, ROLL's batch code, the masked critic value, the judge) against one fuzz example of the same ROLL
entry (the corpus case judged on the fuzzing worker, every property with its perturbed reruns; and the mean
example of a short `fuzz_target` run), measured in the same run.

    MASKFUZZ_REPOS=roll=/path/to/ROLL python benchmarks/rollout_cost.py [--pin c09bc8bc9f43] [--repeats 3]
        [--examples 20] [--case corpus/roll/poison-eea9356e726af9b5.json]

Figures: setup (acquiring the checkout, starting and loading the workers), run (the work once loaded), peak
memory: the workers' peak resident set (VmHWM in /proc; a forked worker counts the pages it shares with the
fork server, whose own resident set is printed beside it) and the fuzzing process's Python allocations
(tracemalloc). Each figure is the minimum over the repeats (the first start of the fork server is not counted
against either side), and the ratios are witness / fuzz example.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import tracemalloc
from pathlib import Path

from maskfuzz.fuzz import corpus
from maskfuzz.fuzz import validate as val
from maskfuzz.fuzz.engine import fuzz_target
from maskfuzz.oracles.kinds.dispatch import judge
from maskfuzz.targets import registry
from maskfuzz.targets.rollout.session import open_rollout
from maskfuzz.targets.runtime.repos import parse_repos
from maskfuzz.targets.runtime.session import open_target

ROOT = Path(__file__).resolve().parents[1]
MIB = 1024.0


def _status(pid: int, field: str) -> float:
    """`field` (VmHWM, VmRSS) of process `pid` in MiB, from /proc/PID/status (0 where it cannot be read)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / MIB
    except OSError:
        pass
    return 0.0


def _parent(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("PPid:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def witness(entry, ref: str, repos: dict) -> dict:
    """One executed witness: open both workers, search the scenario, run the poisoned and clean steps, judge."""
    declared = registry.get("roll").declared(None, ref.partition("@")[2])
    tracemalloc.start()
    t0 = time.perf_counter()
    with open_rollout(ref, repos=repos) as rollout:
        t1 = time.perf_counter()
        record = val.validate(entry, rollout, declared)
        t2 = time.perf_counter()
        lm_peak, batch_peak = _status(rollout.lm.pid, "VmHWM"), _status(rollout.batch.pid, "VmHWM")
        server = _status(_parent(rollout.batch.pid), "VmRSS")
    _, py_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {
        "setup": t1 - t0,
        "run": t2 - t1,
        "rss": lm_peak + batch_peak,
        "rss_detail": f"LM worker {lm_peak:.0f} + ROLL worker {batch_peak:.0f}",
        "server": server,
        "py": py_peak / MIB / MIB,
        "seeds": record["recipe"]["constructed_scenario"]["seeds_tried"],
        "reproduced": record["verdict"]["reproduced"],
    }


def fuzz_example(entry, ref: str, repos: dict, examples: int) -> dict:
    """One fuzz example of the entry: the case judged on the fuzzing worker (every property), and the mean
    example of `fuzz_target` with `examples` examples (drawing, judging, no shrinking)."""
    tracemalloc.start()
    t0 = time.perf_counter()
    with open_target(ref, repos=repos) as h:
        t1 = time.perf_counter()
        verdicts = judge(h.run, entry.case, h.declared)
        t2 = time.perf_counter()
        result = fuzz_target(h.run, h.declared, target="roll", pin=h.pin, max_examples=examples, shrink=False)
        t3 = time.perf_counter()
        peak = _status(h.run.pid, "VmHWM")
        server = _status(_parent(h.run.pid), "VmRSS")
    _, py_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {
        "setup": t1 - t0,
        "run": t2 - t1,
        "engine": (t3 - t2) / max(1, result.examples),
        "engine_examples": result.examples,
        "rss": peak,
        "rss_detail": f"ROLL worker {peak:.0f}",
        "server": server,
        "py": py_peak / MIB / MIB,
        "failed": sorted(v.property for v in verdicts if v.failed),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pin", default="c09bc8bc9f43")
    ap.add_argument("--case", type=Path, default=ROOT / "corpus" / "roll" / "poison-eea9356e726af9b5.json")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--examples", type=int, default=20, help="examples of the short fuzz_target run")
    args = ap.parse_args()
    repos = parse_repos(None)
    if "roll" not in repos:
        print("rollout_cost: ROLL is git only: set MASKFUZZ_REPOS=roll=/path/to/ROLL", file=sys.stderr)
        return 2
    entry = corpus.load(args.case)
    ref = f"roll@{args.pin}"
    ws, fs = [], []
    for _ in range(args.repeats):  # alternate, so load drifts hit both sides alike
        ws.append(witness(entry, ref, repos))
        fs.append(fuzz_example(entry, ref, repos, args.examples))
    w = {k: min(x[k] for x in ws) for k in ("setup", "run", "rss", "py")}
    f = {k: min(x[k] for x in fs) for k in ("setup", "run", "engine", "rss", "py")}
    total_w, total_f = w["setup"] + w["run"], f["setup"] + f["run"]
    mode = os.environ.get("MASKFUZZ_WORKER_START", "forkserver")
    print(f"rollout_cost: {ref}, {entry.key}/{entry.property}-{entry.id}, workers from {mode}, "
          f"min of {args.repeats} repeats, {os.cpu_count()} CPUs")  # fmt: skip
    print(f"  executed witness: reproduced={ws[-1]['reproduced']}, scenario found after {ws[-1]['seeds']} seed(s)")
    print(f"  fuzz example: failing properties {fs[-1]['failed']}; engine mean over {fs[-1]['engine_examples']} "
          "examples")  # fmt: skip
    print()
    print(f"  {'':34} {'setup s':>8} {'run s':>8} {'total s':>8} {'peak RSS MiB':>13} {'py peak MiB':>12}")
    print(f"  {'executed witness':34} {w['setup']:8.3f} {w['run']:8.3f} {total_w:8.3f} {w['rss']:13.0f} "
          f"{w['py']:12.2f}   ({ws[-1]['rss_detail']})")  # fmt: skip
    print(f"  {'fuzz example (judge of the case)':34} {f['setup']:8.3f} {f['run']:8.3f} {total_f:8.3f} "
          f"{f['rss']:13.0f} {f['py']:12.2f}   ({fs[-1]['rss_detail']})")  # fmt: skip
    print(f"  {'fuzz example (engine, mean)':34} {'':8} {f['engine']:8.4f}")
    if mode != "spawn":
        print(f"  fork server resident set: {ws[-1]['server']:.0f} MiB (shared by every forked worker)")
    print()
    print(f"  ratios witness / fuzz example: setup {w['setup'] / f['setup']:.2f}x, run {w['run'] / f['run']:.1f}x "
          f"(vs the engine's mean example {w['run'] / f['engine']:.1f}x), total {total_w / total_f:.2f}x, "
          f"peak RSS {w['rss'] / f['rss']:.2f}x, py peak {w['py'] / f['py']:.2f}x")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())

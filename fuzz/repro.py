"""Standalone reproducers and maintainer reports for corpus findings (`maskfuzz repro`).

    plan = make_plan(entry, target)            # the check and the target's call; Unsupported if impossible
    text = render_script(plan, source)         # DIR/repro.py: plain Python + torch, no maskfuzz
    run = run_script(path, checkout_root)      # its JSON and exit code (1 reproduced, 0 fixed, 2 error)
    report = render_report(plan, run, ...)     # DIR/report.md

The script is assembled from two kinds of source:

* the template `fuzz/templates/repro_script.py` (a small `Case`, the checks, `main`) and the
  worker's own stand-ins for heavy imports (`targets/runtime/standins.py`, copied, so the script imports
  exactly as the worker does), of which only what `main` reaches is written;
* the target's call, taken from its adapter (`targets/adapters/<name>.py`), in this order of
  preference (the adapter contract for reproducers):

  1. `repro_source() -> str`: Python source defining `prepare(root: Path) -> (run, where)`, where
     `run(case, device) -> OUTPUTS` (advantages, returns for GAE; the kind's outputs otherwise)
     takes the script's `Case` (the attributes of
     `oracles.case.Case` that adapters use: attention, trainable, token_rewards, values, score,
     gamma, lam, dtype, shape, torch_dtype, inputs(device), Case.build(...); methods nothing
     reads are left out of the script); it may use the script's `ENTRY`,
     `NotPresent`, `Loaded`, `import_from`, `function_from` and import stdlib / torch / the
     framework's own third-party packages at its top.
  2. `REPRO_FUNCTIONS = ("load", ...)`: the adapter's own module-level functions copied into the
     script with every module-level definition they reach; the first is called as
     `first(root, ENTRY) -> Loaded`. Without the attribute the default is `("load",)`.
  3. `REPRO_UNSUPPORTED = "why"`: the adapter cannot be reproduced standalone (exit 2, this reason).

  Copying (2) succeeds when the reached code uses only the standard library, torch, the
  framework's packages, `targets.adapters.base` (`NotPresent`, `Loaded`, `import_from`,
  `function_from`: the script has its own), `oracles.case.Case` (likewise), module-level
  definitions of other adapters under the same rules, and module-level definitions of maskfuzz's
  plain helper modules (`PLAIN`: `oracles.options`, whose `Option` an adapter may read its
  defaults from; `targets.adapters.extract`, which compiles code blocks from the
  framework's source text; standard library + torch only, which is checked). Those are copied
  verbatim, each under a banner naming its file, before the code that uses them. Only what the
  call reaches is copied: the registry entry `SPEC` and what only it uses (`Domain`, `TargetSpec`,
  `Pin`) stay out, so the call must not read `SPEC` (an adapter keeps what `load` needs from it in
  a module constant that `SPEC` uses too, e.g. `PACKAGES` for `SPEC.own`). Anything else (e.g.
  `oracles.kinds.gae.reference`, `targets.registry`) makes the target unsupported, with the names that are
  missing: never a script that calls something else than the adapter does.

Expected values: for properties judged against numbers (reference, score-kept, telescoping,
all-trainable, masked-zero) the float64 expectation and the tolerance per position are computed
here with `oracles` and written into the script; for properties judged by comparing two runs
(poison, poison-nonfinite, row-independence, gap-invariance, deterministic) the script runs the
case and its twin and compares them itself; no-crash checks for finite outputs or a documented
error. Each mirrors `oracles.kinds.dispatch.judge`, and `maskfuzz repro` checks that the script and
the judge agree before it keeps the script. The kinds beyond GAE get their checks from
`fuzz/repro_kinds.py` (mirroring `oracles.kinds.judge`); the script's OUTPUTS are the kind's.

The work is split by job (each module imports only the ones before it):

    fuzz/repro_check.py      the Check as data, the tensors as the script's literals, Unsupported
    fuzz/repro_kinds.py      the checks of the kinds beyond GAE
    fuzz/repro_checks.py     build_check (GAE, and the kinds through repro_kinds), the properties in words
    fuzz/repro_copier.py     the AST copier: Source, Closure, what may be copied into a script
    fuzz/repro_assembly.py   the template, the target's call (call_source) and assemble
    fuzz/repro_plan.py       TargetInfo and Plan
    fuzz/repro_render.py     render_script: the text of DIR/repro.py
    fuzz/repro_run.py        run_script: one run of a written script
    fuzz/repro_report.py     render_report: the text of DIR/report.md
    fuzz/repro.py            make_plan and produce, which writes a reproducer folder (this module)
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from maskfuzz.fuzz.corpus_codec import Entry
from maskfuzz.fuzz.repro_assembly import assemble, call_source
from maskfuzz.fuzz.repro_check import Unsupported
from maskfuzz.fuzz.repro_checks import build_check
from maskfuzz.fuzz.repro_plan import Plan, TargetInfo
from maskfuzz.fuzz.repro_render import DATA_NAMES, data_sources, render_script
from maskfuzz.fuzz.repro_report import Environment, render_report
from maskfuzz.fuzz.repro_run import ScriptRun, run_script

__all__ = [  # the pipeline of the module docstring; the pieces live in the modules it lists
    "Environment",
    "Plan",
    "ReproFailed",
    "ScriptRun",
    "TargetInfo",
    "Unsupported",
    "Written",
    "bisect_of",
    "make_plan",
    "produce",
    "render_report",
    "render_script",
    "run_script",
]


def make_plan(entry: Entry, target: TargetInfo) -> Plan:
    """The check and the call for `entry` on `target`; Unsupported when either is impossible
    (the target first: whether its call can be copied does not depend on the case)."""
    call = call_source(target.adapter)
    assemble(call, {name: f"{name} = None\n" for name in DATA_NAMES})  # every name resolves, or Unsupported
    check = build_check(entry.case, entry.property, target.declared)
    plan = Plan(entry, target, check, call)
    assemble(call, data_sources(plan), check.data["kind"])
    return plan


# =============================================================================================
# Writing both files, after checking that the script agrees with maskfuzz.
# =============================================================================================
class ReproFailed(Exception):
    """The script was written but does not do what it must at the pin (removed; exit 2)."""


@dataclass
class Written:
    script: Path
    report: Path
    run: ScriptRun
    status: str  # reproduced | fixed (at the pin the script was checked at)
    judged: str | None
    info: dict = field(default_factory=dict)  # the judge's worker load info (where, notes, mechanism)


def bisect_of(entry: Entry, path: Path | None = None) -> dict | None:
    """The bisection result for `entry`: the `maskfuzz bisect --json` file at `path`, else the
    corpus entry's own `bisect` field (same format), else None."""
    if path is not None:
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"--bisect {path}: not a readable JSON file ({exc})") from None
        if not isinstance(data, dict) or "result" not in data:
            raise ValueError(f"--bisect {path}: not the output of `maskfuzz bisect --json` (no 'result')")
        return data
    if entry.path is not None and Path(entry.path).is_file():
        raw = json.loads(Path(entry.path).read_text(encoding="utf-8"))
        found = raw.get("bisect") if isinstance(raw, dict) else None
        return found if isinstance(found, dict) else None
    return None


def produce(
    plan: Plan,
    out_dir: Path,
    env: Environment,
    *,
    judge: Any = None,
    bisect: dict | None = None,
    device: str = "cpu",
    timeout: float = 600.0,
) -> Written:
    """Write DIR/repro.py and DIR/report.md for `plan`, run against the checkout `env.root`.

    The script is first written under a temporary name and run; `judge` (a callable returning the
    judge's status of the property at the same pin, 'fail', 'pass' or 'n/a ...', optionally with the
    worker's load info as a second item, whose notes go into the report) runs meanwhile. The
    script is kept only when it ran and agrees with the judge; otherwise it is removed and
    ReproFailed says why."""
    from concurrent.futures import ThreadPoolExecutor

    out_dir.mkdir(parents=True, exist_ok=True)
    text = render_script(plan, env.resolved, env.info.get("wheel"))
    tmp = out_dir / f".repro-{os.getpid()}.py"
    tmp.write_text(text, encoding="utf-8")
    try:
        with ThreadPoolExecutor(1) as pool:
            pending = pool.submit(run_script, tmp, env.root, device, timeout)
            judged = judge() if judge is not None else None
            run = pending.result()
        notes: list[str] = []
        loaded: dict = {}
        if isinstance(judged, tuple):  # (status, the worker's load info: where, notes)
            judged, loaded = judged
            notes = list((loaded or {}).get("notes") or [])
        status = run.status
        if status == "crashed" and plan.entry.property == "no-crash":
            status = "reproduced"  # the interpreter died inside the target: the crash itself
        if status not in ("reproduced", "fixed"):
            message = (run.data or {}).get("message") or f"exit code {run.returncode}"
            raise ReproFailed(f"the reproducer cannot run at {plan.target.label}: {message}\n{_tail(run.stderr)}")
        if judged is not None and judged.startswith("n/a"):
            raise ReproFailed(
                f"maskfuzz's judge could not check {plan.entry.property} at {plan.target.label} ({judged}); "
                "not keeping an unchecked script (--no-judge keeps it without the check)"
            )
        if judged is not None and judged != {"reproduced": "fail", "fixed": "pass"}[status]:
            raise ReproFailed(
                f"the reproducer says {status} at {plan.target.label} but maskfuzz's judge says {judged!r} for "
                f"{plan.entry.property}: not keeping a script that disagrees with the judge"
            )
        script = out_dir / "repro.py"
        os.replace(tmp, script)
        script.chmod(0o755)
    finally:
        tmp.unlink(missing_ok=True)
    env = Environment(env.root, env.resolved, env.kind, env.info | ({"call_notes": notes} if notes else {}), judged)
    report = out_dir / "report.md"
    report.write_text(render_report(plan, run, env, bisect), encoding="utf-8")
    return Written(script, report, run, status, judged, dict(loaded or {}))


def _tail(text: str, lines: int = 15) -> str:
    rows = [r for r in (text or "").rstrip().splitlines() if r.strip()]
    return "\n".join("    " + r for r in rows[-lines:])

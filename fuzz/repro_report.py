"""The maintainer report, DIR/report.md (`render_report`): title, summary, the triggering example, observed vs
expected per position, the promise and the property, the bisection, the environment the script ran in
(`Environment`) and the commands to rerun it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from maskfuzz.fuzz.repro_checks import invariant, whitened
from maskfuzz.fuzz.repro_plan import Plan
from maskfuzz.fuzz.repro_render import check_words, checkout_commands, dist_version
from maskfuzz.fuzz.repro_run import ScriptRun
from maskfuzz.fuzz.signature import position_kind
from maskfuzz.oracles.case import Case
from maskfuzz.oracles.kinds import spec
from maskfuzz.oracles.kinds.gae.properties import SEVERITY

TITLES = {
    "poison": "values at masked positions change the outputs at trained positions",
    "poison-nonfinite": "NaN / inf at masked positions reach the outputs at trained positions",
    "reference": "outputs differ from the `{contract}` masked GAE reference",
    "score-kept": "the outcome reward is lost at gamma = 0",
    "telescoping": "advantages do not telescope at gamma = lam = 1",
    "all-trainable": "outputs differ from classic GAE when every token is trainable",
    "gap-invariance": "a masked token inserted between trained tokens changes their outputs",
    "row-independence": "a row's outputs depend on the other rows of the batch",
    "masked-zero": "non-zero advantages at masked positions",
    "no-crash": "a valid masked batch crashes or gives non-finite outputs",
    "deterministic": "two runs of the same input give different bits",
    # the kinds beyond GAE (oracles/kinds): `reference` and `masked-zero` get the kind's own words
    "pad-invariance": "padding (a column, a padding row) changes the outputs at trained positions",
    "permutation": "reordering the rows of the batch changes a row's outputs",
    "group-isolation": "a group's outputs depend on the other groups of the batch",
    "affine": "outputs at a moved input (a x + b) differ from the reference",
    "split-invariance": "cutting the step into micro-batches (or ranks) changes the loss or its gradient",
    "empty-step": "a step without a trainable token does not give a finite 0",
    "clip-bound": "the clipped value loss lies below the unclipped one",
}
KIND_TITLES = {
    "reference": "outputs differ from the float64 `{kind}` reference of the declared variant",
    "masked-zero": "non-zero {outputs} at masked positions",
}
FAMILY_TITLES = {"gae": TITLES, "statistic": TITLES | KIND_TITLES}  # by the judge's family (`KindSpec.family`)
MAX_ROWS = 32


@dataclass(frozen=True)
class Environment:
    """Where the script was run when the report was written."""

    root: Path
    resolved: str | None = None  # full commit hash or NAME==VERSION
    kind: str = ""  # git | release | local
    info: dict = field(default_factory=dict)  # the checkout's info (wheel, sha256, source)
    judged: str | None = None  # the judge's verdict on the property at this pin (fail / pass), None: not asked


def render_report(plan: Plan, run: ScriptRun, env: Environment, bisect: dict | None = None) -> str:
    """report.md: title, summary, the triggering example, observed vs expected per position, the
    property, the bisection (if any), the environment and the command to rerun."""
    e, t, data = plan.entry, plan.target, run.data or {}
    function = data.get("function") or "the function under test"
    short = function.rsplit("::", 1)[-1]
    kind = t.declared.kind
    family = spec(kind).family.name
    zero_outputs = " / ".join(spec(kind).zero_outputs)  # GAE's titles name none
    title = FAMILY_TITLES[family][e.property].format(contract=t.declared.contract, kind=kind, outputs=zero_outputs)
    version = env.resolved or t.pin
    out = [f"# {t.label}: `{short}`: {title}", ""]
    out += [_summary(plan, data, function, version), ""]
    out += ["## Triggering example", "", _case_block(plan.check.case)]
    if plan.check.twin is not None:
        out += ["", f"Compared with a second run on {plan.check.twin_is}:", "", _case_block(plan.check.twin)]
    out += ["", "## Observed vs expected", "", *_differences(plan, data), ""]
    out += ["## Promise broken", ""]
    triage = e.triage or {}
    if triage.get("promise"):
        note = f" ({triage['promise_note']})" if triage.get("promise_note") else ""
        out += [f"`{triage['promise']}`: \"{triage.get('promise_text', '')}\"{note}.", ""]
    else:  # an entry filed before promises were recorded: replay says at each pin whether one is broken
        out += [
            "Not recorded in this entry (filed before promises were): `maskfuzz replay` shows at each pin whether "
            "the failure breaks a promise (a defect) or none (a fact).",
            "",
        ]
    out += ["## Property violated", ""]
    severity = triage.get("severity") or SEVERITY.get(e.property, "high")
    out += [f"`{e.property}` (severity {severity}): {invariant(e.property, kind)}.", ""]
    out += [f"Checked: {check_words(plan.check)}", ""]
    if e.also:
        out += [f"The same case also violates: {', '.join(f'`{p}`' for p in e.also)}.", ""]
    out += [DECLARED_LINE[family](plan), ""]
    if triage.get("mechanism"):
        out += [
            f"Root cause (maskfuzz's diagnosis): `{triage['mechanism']}`: {triage.get('evidence', '')}. "
            f"Reach `{triage.get('reach', 'api')}`: {triage.get('reach_how', '')}.",
            "",
        ]
    if bisect:
        out += ["## Bisection", "", *_bisection(bisect), ""]
    out += ["## Environment", "", *_environment(plan, run, env), ""]
    if env.info.get("call_notes"):
        out += [f"How maskfuzz calls it ({plan.call.how}; the script does the same):", ""]
        out += [f"- {note}" for note in env.info["call_notes"]] + [""]
    out += ["## Reproduce", "", "```sh", *checkout_commands(t, env.resolved, env.info.get("wheel")), "```", ""]
    out += [
        "With the checkout at hand: `python repro.py /path/to/checkout` (or `MASKFUZZ_TARGET_ROOT=/path/to/checkout "
        "python repro.py`). The script needs only Python and torch (plus what the framework imports for this "
        "function); it prints JSON and exits 1 while the bug reproduces, 0 once it is fixed, 2 if it cannot run.",
        "",
    ]
    if e.path is not None:
        out += [f"Corpus entry: `{e.path}` (id `{e.id}`), found {e.found.date or 'at an unknown date'}.", ""]
    return "\n".join(out)


def _num(x: Any) -> str:
    """A number for reading: up to 6 significant digits, exact when that is short."""
    if isinstance(x, str):
        return x
    x = float(x)
    if not math.isfinite(x):
        return str(x)
    text = repr(x) if len(repr(x)) <= 10 else f"{x:.6g}"
    return text if any(c in text for c in ".en") else text + ".0"


def _nums(xs: list) -> str:
    shown = ", ".join(_num(x) for x in xs[:6])
    return f"[{shown}{', ...' if len(xs) > 6 else ''}]"


def _summary(plan: Plan, data: dict, function: str, version: str) -> str:
    e = plan.entry
    b_rows, t_len = plan.check.case.shape
    subject = f"On the {b_rows} x {t_len} batch below, `{function}` ({version})"
    found = data.get("differences") or []
    status = data.get("status")
    if status == "fixed":
        first = f"{subject} no longer fails: {data.get('message', '')}."
    elif plan.check.data["kind"] == "finite":
        if found:
            where = ", ".join(f"({d['position'][0]}, {d['position'][1]})" for d in found[:4])
            first = f"{subject} gives non-finite outputs at trainable positions {where}."
        else:
            first = f"{subject} {data.get('message', 'fails')}."
    elif found:
        output = found[0]["output"]
        same = [d for d in found if d["output"] == output]
        kinds = sorted({position_kind(plan.check.case, *d["position"]) for d in same})
        first = (
            f"{subject} gives {output} {_nums([d['observed'] for d in same])} at {len(same)} position(s) "
            f"({', '.join(kinds)}), where {plan.check.expected_from} {'are' if plan.check.twin else 'is'} "
            f"{_nums([d['expected'] for d in same])}."
        )
    else:
        first = f"{subject} fails: {data.get('message', 'see below')}."
    second = f"It violates `{e.property}`: {invariant(e.property, plan.target.declared.kind)}."
    return f"{first} {second}"


def _contract_line(plan: Plan) -> str:
    """What a GAE or `returns` target declares: its contract (and its whitening)."""
    t = plan.target
    return f"Contract declared for {t.target}: `{t.declared.contract}`" + whitened(t.declared) + "."


def _variant_line(plan: Plan) -> str:
    """What a target of a statistic kind declares: its variant, as the case's options configure it."""
    t = plan.target
    configured = t.declared.configured(plan.check.case).variant or {}
    variant = ", ".join(f"{k}={v!r}" for k, v in sorted(configured.items())) or "its defaults"
    how = " with the options above" if plan.check.case.options else ""
    return f"Kind `{t.declared.kind}`, variant declared for {t.label}{how}: {variant}."


DECLARED_LINE = {"gae": _contract_line, "statistic": _variant_line}  # by the judge's family


def _case_block(case: Case) -> str:
    """The case as a table per row: masks, the per-token inputs (rewards and values where any is
    non-zero or no other input exists), the extra inputs of the kinds beyond GAE, score, group, split."""
    b_rows, t_len = case.shape
    head = f"gamma = {case.gamma!r}   lam = {case.lam!r}   dtype = {case.dtype}   B = {b_rows}   T = {t_len}"
    if case.split is not None:
        head += f"   ranks = {case.ranks}"
    if case.options:
        head += "\noptions: " + ", ".join(f"{k} = {v!r}" for k, v in sorted(case.options.items()))
    cols = [f"t={t}" for t in range(t_len)]
    lines = [head, ""]
    gae_inputs = {"token_rewards": case.token_rewards, "values": case.values}
    shown = {n: x for n, x in gae_inputs.items() if not case.extra or bool((x != 0).any())} | case.extra
    for b in range(b_rows):
        rows = {
            "attention": [str(int(x)) for x in case.attention[b].tolist()],
            "trainable": [str(int(x)) for x in case.trainable[b].tolist()],
            **{name: [_num(v) for v in x[b].tolist()] for name, x in shown.items()},
        }
        width = max(len(c) for c in cols + [v for r in rows.values() for v in r]) + 2
        lines.append(f"row {b:<14}" + "".join(c.rjust(width) for c in cols))
        for name, vals in rows.items():
            lines.append(f"  {name:<16}" + "".join(v.rjust(width) for v in vals))
        per_row = [f"score = {_num(float(case.score[b]))}"]
        per_row += [f"group = {int(case.group[b])}"] if case.group is not None else []
        per_row += [f"micro-batch = {int(case.split[b])}"] if case.split is not None else []
        if case.truncated is not None and bool(case.truncated[b]):
            per_row += [f"truncated (cut by the length limit), bootstrap = {_num(float(case.bootstrap_values()[b]))}"]
        lines.append("  " + "   ".join(per_row))
    return "```\n" + "\n".join(lines) + "\n```"


def _differences(plan: Plan, data: dict) -> list[str]:
    found = data.get("differences") or []
    if data.get("status") == "error":
        return [f"The script could not run at this pin: {data.get('message', '')}"]
    if not found:
        return [f"No difference at this pin: {data.get('message', '')}."]
    case = plan.check.case
    head = "| output | row | position | kind | observed | expected | abs. difference | tolerance |"
    lines = [head, "|---|---:|---:|---|---:|---:|---:|---:|"]
    for d in found[:MAX_ROWS]:
        b, t = d["position"]
        obs, exp = d["observed"], d["expected"]
        try:
            diff = _num(abs(float(obs) - float(exp)))
        except (TypeError, ValueError):
            diff = "-"
        tol = _num(d["tolerance"]) if "tolerance" in d else "-"
        kind = position_kind(case, b, t)
        lines.append(f"| {d['output']} | {b} | {t} | {kind} | {_num(obs)} | {_num(exp)} | {diff} | {tol} |")
    if len(found) > MAX_ROWS:
        lines.append(f"\n({len(found) - MAX_ROWS} more in the script's JSON output)")
    if data.get("observed") and plan.check.data["kind"] != "finite":
        lines += ["", "Full outputs (rows of the batch):", "", "```"]
        for name in data.get("expected", {}):
            lines.append(f"observed {name:<10} = {_rows_text(data['observed'][name])}")
            lines.append(f"expected {name:<10} = {_rows_text(data['expected'][name])}")
        lines.append("```")
    return lines


def _rows_text(rows: list) -> str:
    return "[" + ", ".join("[" + ", ".join(_num(x) for x in row) + "]" for row in rows) + "]"


def _bisection(b: dict) -> list[str]:
    unit = "version" if "version" in b else "commit"
    answer = b.get(unit)
    old, new = b.get("old") or {}, b.get("new") or {}
    span = (
        f"between `{old.get('id', '?')}` ({old.get('verdict', '?')}) and `{new.get('id', '?')}` "
        f"({new.get('verdict', '?')}): {b.get('revisions', '?')} {unit}(s), {b.get('evaluations', '?')} evaluations "
        f"({b.get('skips', 0)} skipped)"
    )
    result = b.get("result")
    if result == "found" and answer:
        what = "fixed" if b.get("kind") == "fix" else "caused"
        line = f"First {unit} where the verdict changed: `{answer.get('id')}`"
        extra = " ".join(x for x in (answer.get("date", "")[:10], answer.get("subject", "")) if x)
        return [f"{line} {extra}".rstrip() + f" (it {what} the failure).", "", f"Searched {span}."]
    if result == "inconclusive":
        cands = b.get("candidates") or []
        lines = [f"Inconclusive ({b.get('reason', '')}); searched {span}. Candidates:", ""]
        lines += [f"- `{c.get('id')}` {c.get('subject', '')}".rstrip() for c in cands[:10]]
        if len(cands) > 10:
            lines.append(f"- ... and {len(cands) - 10} more")
        return lines
    return [f"No change of verdict {span}: {b.get('reason', '')}."]


def _environment(plan: Plan, run: ScriptRun, env: Environment) -> list[str]:
    t, data = plan.target, run.data or {}
    rows = [
        ("target", t.label if t.target != "callable" else f"callable {t.entry}"),
        ("pin", t.pin),
        ("resolved", env.resolved or "-"),
        ("commit (git rev-parse)", data.get("commit") or "-"),
        ("version (dist-info)", data.get("version") or "-"),
        ("function", data.get("function") or "-"),
        ("python", data.get("python") or "-"),
        ("torch", data.get("torch") or "-"),
        ("tensordict", data.get("tensordict") or "-"),
        ("device", data.get("device") or "-"),
        ("stand-ins used", ", ".join(data.get("stand_ins_used") or []) or "none"),
        ("maskfuzz", dist_version("maskfuzz") or "-"),
    ]
    if env.info.get("wheel"):
        rows.insert(5, ("wheel", f"{env.info['wheel']} (sha256 {env.info.get('sha256', '?')})"))
    changed = data.get("changed") or []
    if changed:
        absent = set(env.info.get("absent") or [])
        lacking = [c for c in changed if c.startswith(" D") and c[3:].strip('"') in absent]
        others = [c.strip() for c in changed if c not in lacking]
        parts = [f"{len(lacking)} file(s) missing that the source repository lacks (data, not code)"] if lacking else []
        if others:
            parts.append(", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else ""))
        rows.insert(4, ("local changes", "; ".join(parts)))
    if env.judged:
        rows.append(("maskfuzz's judge at this pin", env.judged))
    found = plan.entry.found
    rows.append(("found by", f"maskfuzz {found.maskfuzz or '?'}, seed {found.seed}, {found.date or '?'}"))
    return ["| | |", "|---|---|"] + [f"| {k} | {_md(v)} |" for k, v in rows]


def _md(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")

"""Rendering of the script: the text of DIR/repro.py for a plan (`render_script`): its docstring with the
commands that fetch the code, the finding section (`data_sources`, Python literals laid out to read), the copied
helpers and call under their banners, the template's support code, `judge` and `main`; and the check in words
(`check_words`), which the report reuses.
"""

from __future__ import annotations

import ast
import json
import math
import re
import sys
import textwrap
from typing import Any

from maskfuzz.fuzz.corpus_codec import Entry
from maskfuzz.fuzz.repro_assembly import adapter_file, assemble
from maskfuzz.fuzz.repro_check import Check, float_rows, mask_rows
from maskfuzz.fuzz.repro_checks import invariant
from maskfuzz.fuzz.repro_copier import FOLLOWED, Closure, Source
from maskfuzz.fuzz.repro_plan import Plan, TargetInfo
from maskfuzz.oracles.case import Case
from maskfuzz.oracles.kinds import outputs as kind_outputs

# The finding section of the template, in the order the script lists it.
DATA_NAMES = (
    "TARGET",
    "PIN",
    "PROPERTY",
    "INVARIANT",
    "ENTRY",
    "STAND_INS",
    "DENY",
    "OWN",
    "DOCUMENTED_ERRORS",
    "ROOT_ENV",
    "CASE",
    "TWIN",
    "OUTPUTS",
    "CHECK",
)


def py_float(x: float) -> str:
    if math.isnan(x):
        return "math.nan"
    if math.isinf(x):
        return "math.inf" if x > 0 else "-math.inf"
    return repr(float(x))


def py_str(s: str, indent: int = 0, width: int = 118, column: int | None = None) -> str:
    """A string literal in double quotes starting at `column`; a long one as implicit concatenation
    in parentheses, one chunk of words per line."""
    text = json.dumps(s)
    if (indent if column is None else column) + len(text) + 1 <= width:
        return text
    words = re.split(r"(?<= )", s)
    chunks, cur = [], ""
    for w in words:
        if cur and len(json.dumps(cur + w)) + indent + 4 > width:
            chunks.append(cur)
            cur = ""
        cur += w
    chunks.append(cur)
    inner = " " * (indent + 4)
    return "(\n" + "\n".join(inner + json.dumps(c) for c in chunks) + "\n" + " " * indent + ")"


def py_literal(value: Any, indent: int = 0, width: int = 118, top: bool = False, column: int | None = None) -> str:
    """`value` (dicts, lists, tuples, str, numbers, None) as readable Python source starting at
    `column` (default: `indent`) of a line indented by `indent`: one line when it fits (with a
    trailing comma), else a dict key per line, a list of rows one row per line, or items wrapped."""
    column = indent if column is None else column
    pad, inner = " " * indent, " " * (indent + 4)
    flat = _flat(value)
    rows = isinstance(value, list) and len(value) > 1 and all(isinstance(v, (list, dict)) for v in value)
    if column + len(flat) + 1 <= width and not (top and isinstance(value, dict)) and not rows:
        return flat
    if isinstance(value, str):
        return py_str(value, indent, width, column)
    if isinstance(value, dict):
        items = []
        for k, v in value.items():
            key = f"{inner}{json.dumps(k)}: "
            items.append(f"{key}{py_literal(v, indent + 4, width, column=len(key))},")
        return "{\n" + "\n".join(items) + f"\n{pad}}}"
    if isinstance(value, (list, tuple)):
        left, right = ("[", "]") if isinstance(value, list) else ("(", ")")
        if any(isinstance(v, (list, tuple, dict)) for v in value) or rows or any(len(_flat(v)) > 40 for v in value):
            items = [f"{inner}{py_literal(v, indent + 4, width)}," for v in value]
            return left + "\n" + "\n".join(items) + f"\n{pad}{right}"
        lines, cur = [], inner
        for v in value:
            piece = _flat(v) + ", "
            if len(cur) + len(piece) - 1 > width and cur.strip():
                lines.append(cur.rstrip())
                cur = inner
            cur += piece
        lines.append(cur.rstrip())
        return left + "\n" + "\n".join(lines) + f"\n{pad}{right}"
    return flat


def _flat(value: Any) -> str:
    if isinstance(value, bool) or value is None or isinstance(value, int):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, float):
        return py_float(value)
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)}: {_flat(v)}" for k, v in value.items()) + "}"
    if isinstance(value, tuple):
        inside = ", ".join(_flat(v) for v in value)
        return f"({inside},)" if len(value) == 1 else f"({inside})"
    if isinstance(value, list):
        return "[" + ", ".join(_flat(v) for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} as a literal")


def case_dict(case: Case) -> dict:
    """A case as the script's CASE / TWIN: masks as '0'/'1' strings per row, floats as numbers."""
    return {
        "dtype": case.dtype,
        "gamma": case.gamma,
        "lam": case.lam,
        "attention": mask_rows(case.attention),
        "trainable": mask_rows(case.trainable),
        "token_rewards": float_rows(case.token_rewards),
        "values": float_rows(case.values),
        "score": [float(x) for x in case.score.tolist()],
        **(
            {"truncated": case.truncated.tolist(), "bootstrap": [float(x) for x in case.bootstrap_values().tolist()]}
            if case.truncated is not None and bool(case.truncated.any())
            else {}
        ),
        **({"options": dict(sorted(case.options.items()))} if case.options else {}),
        **({"group": case.group.tolist()} if case.group is not None else {}),
        **({"extra": {name: float_rows(x) for name, x in case.extra.items()}} if case.extra else {}),
        **({"split": case.split.tolist(), "ranks": case.ranks} if case.split is not None else {}),
    }


def data_sources(plan: Plan) -> dict[str, str]:
    """The finding section of the script: source text per name (a comment, then the assignment)."""
    t, check = plan.target, plan.check
    doc = {
        "ENTRY": "The adapter's entry point (None: the target's default)."
        if t.target != "callable"
        else ("The function, as MODULE:FUNC importable from the directory given on the command line."),
        "STAND_INS": "Heavy packages the computation never uses: inert stand-ins when they are not installed.",
        "DENY": "Packages kept missing even when installed (their presence changes what the target does).",
        "OWN": "The framework's own packages: never stood in for.",
        "DOCUMENTED_ERRORS": "Errors the target raises on purpose (regular expressions over 'Type: message').",
        "CASE": "The input: B rows padded to T positions; masks as '0'/'1' strings, one per row.",
        "TWIN": f"The second input: {check.twin_is}." if check.twin is not None else "",
        "OUTPUTS": "What the target returns, in order: [B, T] tensors.",
        "CHECK": f"What is compared: {check_words(check)}",
    }
    values: dict[str, Any] = {
        "TARGET": t.target,
        "PIN": t.pin,
        "PROPERTY": plan.entry.property,
        "INVARIANT": invariant(plan.entry.property, t.declared.kind),
        "ENTRY": t.entry,
        "STAND_INS": t.stand_ins,
        "DENY": t.deny,
        "OWN": t.own,
        "DOCUMENTED_ERRORS": tuple(t.declared.documented_errors),
        "ROOT_ENV": "MASKFUZZ_TARGET_ROOT",
        "CASE": case_dict(check.case),
        "TWIN": case_dict(check.twin) if check.twin is not None else None,
        "OUTPUTS": kind_outputs(t.declared.kind),
        "CHECK": check.data | ({"timeout": 60} if _hang(plan.entry) else {}),
    }
    out = {}
    for name in DATA_NAMES:
        comment = textwrap.wrap(doc.get(name, ""), 110, initial_indent="# ", subsequent_indent="# ")
        lead = f"{name} = "
        body = lead + py_literal(values[name], 0, top=name in ("CASE", "TWIN", "CHECK"), column=len(lead))
        out[name] = "\n".join(comment + [body]) + "\n"
    return out


def _hang(entry: Entry) -> bool:
    return entry.property == "no-crash" and entry.verdict.message.startswith("hang")


def check_words(check: Check) -> str:
    kind = check.data["kind"]
    if kind == "finite" and check.data.get("raises_only"):
        return "the target must not raise, or raise a documented error (the case has NaN / inf under the mask)."
    if kind == "finite":
        return "the outputs must be finite at trainable positions (or the error raised a documented one)."
    if kind == "same":
        return "a second run of the case must give the same bits."
    if kind == "zero":
        return "every output must be a finite 0 on the step without a trainable token (or a documented error)."
    if kind == "at-least":
        return (
            f"the case's loss must not lie below the loss on {check.twin_is} by more than the tolerance "
            "(maskfuzz's bound, absolute per position, plus its share relative to the twin's loss) + rounding slack."
        )
    if kind == "moved":
        return (
            f"on {check.twin_is}, the sum of each row's trainable {check.data['output']} must move by the row's "
            "'moves' (rows with 0 not judged); |observed - expected| <= the row's tolerance + rounding slack."
        )
    if kind == "expected":
        return (
            f"the outputs at the 'where' positions against {check.expected_from}, computed by maskfuzz; "
            "|observed - expected| <= tolerance (absolute, per position)."
        )
    twin_observed = check.data["observed"] == "twin"
    observed = "the twin's outputs (rows / columns mapped onto the case)" if twin_observed else "the case's outputs"
    expected = "the case's outputs" if twin_observed else "the twin's outputs"
    relative = any("relative" in o for o in check.data["outputs"].values())
    share = ", plus its share relative to the expected outputs" if relative else ""
    return (
        f"{observed} against {expected} at the 'where' positions; |observed - expected| <= tolerance "
        f"(maskfuzz's bound, absolute per position{share}) + rounding slack in the outputs' own magnitude."
    )


def checkout_commands(t: TargetInfo, resolved: str | None, wheel: str | None) -> list[str]:
    """Shell commands that fetch the code the script wants and run the script on it."""
    if t.target == "callable":
        module = (t.entry or "").partition(":")[0]
        return [f"python repro.py /path/to/the/directory/holding/{module.split('.')[0]}"]
    if resolved and "==" in resolved:
        package, version = resolved.split("==", 1)
        args = " ".join(t.pip_args)
        folder = f"{package}-{version}"
        return [
            f"pip download --no-deps --only-binary=:all: {args + ' ' if args else ''}{package}=={version} -d .",
            f"python -m zipfile -e {wheel or folder + '-*.whl'} {folder}",
            f"python repro.py {folder}",
        ]
    url = t.git_url or f"<{t.target} repository>"
    rev = resolved or t.pin
    return [
        f"git clone {url} {t.target}",
        f"git -C {t.target} fetch origin {rev}   # also finds pull-request commits",
        f"git -C {t.target} checkout {rev}",
        f"python repro.py {t.target}",
    ]


def render_script(plan: Plan, resolved: str | None = None, wheel: str | None = None) -> str:
    """The text of repro.py for `plan` (`resolved` / `wheel` only improve its instructions)."""
    data = data_sources(plan)
    closure, _ = assemble(plan.call, data, plan.check.data["kind"])
    own = plan.call.adapters[-1]
    helper_code = []  # other adapters and helpers the call uses, each under its file's name, before their users
    for name in helper_order(closure, own):
        segments = closure.code(name)
        if segments:
            what = _summary_of(closure.sources[name])
            helper_code += [_banner(f"From maskfuzz's {adapter_file(name)}, copied (the code below uses it): {what}")]
            helper_code += segments
    template_code = [seg for name in FOLLOWED if name in closure.sources for seg in closure.code(name)]
    template_code += closure.code(closure.template.name, prune=("Case",))
    main = template_code.pop()  # `main` is the template's last definition
    finding, prev_plain = "", False
    for text in (data[n].strip() for n in DATA_NAMES if n in closure.used_overrides):
        plain = not text.startswith("#") and "\n" not in text  # one-line assignments stay together
        finding += ("" if not finding else "\n" if plain and prev_plain else "\n\n") + text
        prev_plain = plain
    sections = [
        _banner("The finding") + "\n" + finding,
        *helper_code,
        _banner(f"How maskfuzz calls {plan.target.label}: {plan.call.how}"),
        *closure.code(own),
        plan.call.glue.text.strip(),
        _banner("Support: stand-ins for heavy imports, the case, the check (written by maskfuzz repro)"),
        *template_code,
        closure.overrides["judge"].text.strip(),
        main,
        'if __name__ == "__main__":\n    sys.exit(main())',
    ]
    body, prev = "", ""
    for part in sections:
        part = part.strip("\n")
        if body.endswith("# " + "-" * 98):
            body += "\n" + part  # a banner sits right above what it introduces
        elif _is_assignment(prev) and _is_assignment(part):
            body += "\n\n" + part  # module constants one blank line apart
        else:
            body += ("\n\n\n" if body else "") + part
        prev = part
    return f"{_script_doc(plan, resolved, wheel)}\n\n{closure.import_block()}\n\n{body}\n"


def helper_order(closure: Closure, own: str) -> list[str]:
    """The maskfuzz modules besides the adapter `own` whose definitions the call copies (other adapters,
    `targets.adapters.extract`), each after the ones it imports from: module-level code of the copied
    definitions (constants, class bodies, decorators) runs in the order it is written."""
    helpers = [
        name
        for name in closure.sources
        if name.startswith("maskfuzz.targets.") and name not in FOLLOWED and name != own and name in sys.modules
    ]
    done: list[str] = []

    def visit(name: str, path: tuple[str, ...]) -> None:
        if name in done or name in path:
            return
        src = closure.sources[name]
        for dep in dict.fromkeys(line.module for lines in src.imports.values() for line in lines):
            if dep in helpers:
                visit(dep, path + (name,))
        done.append(name)

    for name in helpers:
        visit(name, ())
    return done


def _summary_of(source: Source) -> str:
    """The first sentence of a module's docstring (what the module is for)."""
    doc = " ".join((ast.get_docstring(source.tree) or "").split("\n\n", 1)[0].split())
    return doc.split(". ", 1)[0].rstrip(".") + "." if doc else ""


def _is_assignment(text: str) -> bool:
    first = next((line for line in text.splitlines() if not line.startswith("#")), "")
    return bool(re.match(r"[A-Za-z_][A-Za-z0-9_]*(, [A-Za-z_][A-Za-z0-9_]*)*(: [^=]+)? = ", first))


def _banner(title: str) -> str:
    rule = "# " + "-" * 98
    return "\n".join([rule] + [f"# {line}" for line in textwrap.wrap(title, 96)] + [rule])


def _script_doc(plan: Plan, resolved: str | None, wheel: str | None) -> str:
    t, e = plan.target, plan.entry
    where = t.label if t.target == "callable" else f"{t.label}" + (f" ({resolved})" if resolved else "")
    para = [
        f"Reproducer: {where}, property `{e.property}` (maskfuzz corpus entry {e.id}).",
        "",
        f"Invariant: {invariant(e.property, t.declared.kind)}.",
        "",
        f"Checked: {check_words(plan.check)}",
        "",
        "It needs Python >= 3.10, torch (and what the framework itself imports for this function, e.g. "
        "tensordict) and the target's code: a git checkout at the commit or the unpacked release wheel, given "
        "as the first argument or in MASKFUZZ_TARGET_ROOT. Heavy packages the computation never uses are "
        "stood in for (STAND_INS). It prints JSON (commit or version, inputs, observed and expected outputs) "
        "and exits 1 when the bug reproduces, 0 when it is fixed, 2 when the code cannot be run as written here.",
        "",
        "Get the code and run:",
        "",
        *["    " + c for c in checkout_commands(t, resolved, wheel)],
        "",
        f"Written by maskfuzz {dist_version('maskfuzz') or ''} (`maskfuzz repro`); the call mirrors {plan.call.how}.",
    ]
    lines = []
    for p in para:
        lines += [p] if p.startswith("    ") or not p else textwrap.wrap(p, 100)
    return '#!/usr/bin/env python3\n"""' + "\n".join(lines) + '\n"""'


def dist_version(dist: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(dist)
    except Exception:  # noqa: BLE001 - informative only
        return None

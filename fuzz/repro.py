"""Standalone reproducers and maintainer reports for corpus findings (`maskfuzz repro`).

    plan = make_plan(entry, target)            # the check and the target's call; Unsupported if impossible
    text = render_script(plan, source)         # DIR/repro.py: plain Python + torch, no maskfuzz
    run = run_script(path, checkout_root)      # its JSON and exit code (1 reproduced, 0 fixed, 2 error)
    report = render_report(plan, run, ...)     # DIR/report.md

The script is assembled from two kinds of source:

* the template `fuzz/templates/repro_script.py` (a small `Case`, the checks, `main`) and the
  worker's own stand-ins for heavy imports (`targets/standins.py`, copied, so the script imports
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
  `oracles.reference`, `targets.registry`) makes the target unsupported, with the names that are
  missing: never a script that calls something else than the adapter does.

Expected values: for properties judged against numbers (reference, score-kept, telescoping,
all-trainable, masked-zero) the float64 expectation and the tolerance per position are computed
here with `oracles` and written into the script; for properties judged by comparing two runs
(poison, poison-nonfinite, row-independence, gap-invariance, deterministic) the script runs the
case and its twin and compares them itself; no-crash checks for finite outputs or a documented
error. Each mirrors `oracles.properties.judge`, and `maskfuzz repro` checks that the script and
the judge agree before it keeps the script. The kinds beyond GAE get their checks from
`fuzz/repro_kinds.py` (mirroring `oracles.kinds.judge`); the script's OUTPUTS are the kind's.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import inspect
import json
import math
import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import torch

from maskfuzz.fuzz.corpus import Entry, position_kind
from maskfuzz.oracles.case import Case
from maskfuzz.oracles.declared import baseline as _baseline
from maskfuzz.oracles.kinds import GAE_KINDS
from maskfuzz.oracles.kinds import INVARIANT as KIND_INVARIANT
from maskfuzz.oracles.kinds import outputs as kind_outputs
from maskfuzz.oracles.options import reference_case
from maskfuzz.oracles.properties import (
    INVARIANT as GAE_INVARIANT,
)
from maskfuzz.oracles.properties import (
    POISON_PROBE,
    SEVERITY,
    Declared,
    expected_outputs,
    sanitized,
    with_extra_row,
    with_inserted_gap,
)
from maskfuzz.oracles.reference import classic_gae_loop, last_trainable, masked_whiten
from maskfuzz.oracles.tolerance import FLOOR, bounds

TEMPLATE = Path(__file__).resolve().parent / "templates" / "repro_script.py"
MASKFUZZ_PACKAGES = frozenset({"maskfuzz"})  # the top-level name of every maskfuzz module
# Names of targets.adapters.base / oracles.case an adapter may use: the script defines its own.
SHIMS = {
    ("maskfuzz.targets.adapters.base", "NotPresent"): "NotPresent",
    ("maskfuzz.targets.adapters.base", "Loaded"): "Loaded",
    ("maskfuzz.targets.adapters.base", "import_from"): "import_from",
    ("maskfuzz.targets.adapters.base", "function_from"): "function_from",
    ("maskfuzz.oracles.case", "Case"): "Case",
}
NOT_FOLLOWED = ("maskfuzz.targets.adapters.base",)
# maskfuzz modules (besides other adapters) whose definitions may be copied into a script; their code
# goes into the script's support section (adapters and PLAIN helpers go with the target's call).
# loss_aggregation: `microbatches`, how a step is cut, which the loss-step driver reads.
FOLLOWED = ("maskfuzz.targets.standins", "maskfuzz.oracles.kinds.loss_aggregation")
# maskfuzz helper modules copied into scripts that must stay standard library + torch: an import of
# anything else from them is refused (the adapter's own module may import the framework's packages)
PLAIN = (
    "maskfuzz.targets.standins",
    "maskfuzz.targets.adapters.extract",
    "maskfuzz.oracles.options",
    "maskfuzz.oracles.kinds.loss_aggregation",
)
INVARIANT = GAE_INVARIANT | KIND_INVARIANT  # every property of every kind, in words
# the kinds beyond GAE say `reference` and `masked-zero` of their own outputs
KIND_WORDS = {
    "reference": "outputs at trainable positions equal the float64 reference of the kind's declared variant",
    "masked-zero": "outputs that the target promises to zero are 0 at non-trainable positions",
}


def invariant(prop: str, kind: str = "gae") -> str:
    """The property in words, for a target of `kind`."""
    return (KIND_WORDS.get(prop) if kind not in GAE_KINDS else None) or INVARIANT[prop]


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
TWIN_PROPERTIES = ("poison", "poison-nonfinite", "row-independence", "gap-invariance", "deterministic")
EXIT_CODES = {0: "fixed", 1: "reproduced", 2: "error"}


class Unsupported(Exception):
    """No faithful reproducer can be written (exit 2 with this reason)."""


# =============================================================================================
# The check: what the script runs and compares (mirrors oracles.properties.judge).
# =============================================================================================
@dataclass(frozen=True)
class Check:
    """`case` is what the script runs first (the triggering example), `twin` the second input of
    a two-run check; `data` is the script's CHECK; the strings say it in words for the report."""

    case: Case
    twin: Case | None
    data: dict
    expected_from: str  # where the expected numbers come from
    twin_is: str = ""  # how the twin differs from the case


def build_check(case: Case, prop: str, declared: Declared) -> Check:
    """The check of `prop` on `case` for a target that promises `declared`. Raises Unsupported
    when the property does not apply to this case (the judge would say n/a)."""
    if prop not in INVARIANT:
        raise Unsupported(f"unknown property {prop!r}")
    if declared.kind not in GAE_KINDS:
        from maskfuzz.fuzz.repro_kinds import build_kind_check

        return build_kind_check(case, prop, declared)
    declared = declared.configured(case)
    why = declared.domain.rejects(case)
    if why:
        raise Unsupported(f"the target cannot express this case: {why}")
    if prop == "no-crash":
        return Check(case, None, {"kind": "finite"}, "finite outputs at trainable positions, or a documented error")
    if prop in ("poison", "poison-nonfinite"):
        return _poison_check(case, prop, declared)
    if prop == "deterministic":
        where = _mask_rows(torch.ones(case.shape, dtype=torch.bool))
        outputs = {"advantages": {"where": where}, "returns": {"where": where}}
        return Check(case, None, {"kind": "same", "outputs": outputs}, "the first run of the same input (bitwise)")

    exp = expected_outputs(case, declared)
    if exp is None:
        raise Unsupported("the target's whitening is undefined for this case (fewer than two trainable positions)")
    ref_adv, ref_ret = exp
    bnd = bounds(case, declared.contract, ref_adv, ref_ret, declared.whitening, baseline=_baseline(case, declared))
    live = case.trainable
    if prop in ("row-independence", "gap-invariance"):
        return _twin_check(case, prop, declared, bnd)
    if prop == "reference":  # where the configured case trains (the judge's comparison)
        trained = reference_case(case, declared).trainable
        outputs = {"advantages": (ref_adv, bnd.advantages, trained), "returns": (ref_ret, bnd.returns, trained)}
        words = f"the float64 reference of the `{declared.contract}` contract" + _whitened(declared)
    elif prop == "masked-zero":
        if not declared.masked_zero:
            raise Unsupported("the target documents non-zero advantages at masked positions")
        dead = ~live
        if not dead.any():
            raise Unsupported("masked-zero: the case has no non-trainable position")
        atol = torch.full(case.shape, FLOOR[case.dtype][1], dtype=torch.float64)
        outputs = {"advantages": (torch.zeros(case.shape, dtype=torch.float64), atol, dead)}
        words = "0 at every non-trainable position"
    elif prop == "score-kept":
        if case.gamma != 0.0 or not live.any():
            raise Unsupported("score-kept applies at gamma = 0 with a trainable token")
        last = last_trainable(live)
        raw = torch.where(live, case.token_rewards - case.values, torch.zeros_like(case.values))
        raw = raw + torch.where(last, case.score[:, None], torch.zeros_like(raw))
        outputs = {"advantages": (_whiten_like(raw, case, declared), bnd.advantages, last)}
        words = "r' + score - V at the last trainable token (gamma = 0)" + _whitened(declared)
    elif prop == "telescoping":
        if not (case.gamma == 1.0 and case.lam == 1.0):
            raise Unsupported("telescoping applies at gamma = lam = 1")
        zero = torch.zeros_like(case.values)
        r = torch.where(live, case.token_rewards, zero) + torch.where(last_trainable(live), case.score[:, None], zero)
        raw = torch.where(live, r.flip(1).cumsum(1).flip(1) - case.values, zero)
        outputs = {"advantages": (_whiten_like(raw, case, declared), bnd.advantages, live)}
        words = "the sum of later trainable rewards minus V (gamma = lam = 1)" + _whitened(declared)
    elif prop == "all-trainable":
        if not bool(live.all()):
            raise Unsupported("all-trainable applies when every position is real and trainable")
        adv, ret = torch.zeros_like(case.values), torch.zeros_like(case.values)
        for b in range(case.shape[0]):
            rewards = case.token_rewards[b].tolist()
            rewards[-1] += float(case.score[b])
            a, r = classic_gae_loop(rewards, case.values[b].tolist(), case.gamma, case.lam)
            adv[b], ret[b] = torch.tensor(a, dtype=torch.float64), torch.tensor(r, dtype=torch.float64)
        adv = _whiten_like(adv, case, declared)
        outputs = {"advantages": (adv, bnd.advantages, live), "returns": (ret, bnd.returns, live)}
        words = "classic GAE over the unmasked rows (float64)" + _whitened(declared)
    else:
        raise Unsupported(f"no reproducer check for property {prop!r}")
    data = {
        "kind": "expected",
        "outputs": {
            name: {"expected": _rows(exp_), "tolerance": _tolerance(tol), "where": _mask_rows(where)}
            for name, (exp_, tol, where) in outputs.items()
        },
    }
    return Check(case, None, data, words)


def _poison_check(case: Case, prop: str, declared: Declared) -> Check:
    dead = case.poison_mask()
    if not dead.any():
        raise Unsupported(f"{prop}: the case has no non-trainable position to poison")
    nonfinite = prop == "poison-nonfinite"
    if nonfinite:
        probe, clean = case, sanitized(case)
        twin_is = "the same input with 0 instead of the NaN / inf values and rewards at non-trainable positions"
    else:
        poison_rewards = declared.domain.masked_rewards
        has_poison = bool((case.values[dead] != 0).any() or (poison_rewards and (case.token_rewards[dead] != 0).any()))
        clean = sanitized(case)
        if has_poison:
            probe = case
        else:  # the judge's probe: POISON_PROBE under the mask
            fill = torch.full_like(case.values, POISON_PROBE)
            probe = case.replace(
                values=torch.where(dead, fill, case.values),
                token_rewards=torch.where(dead, fill, case.token_rewards) if poison_rewards else case.token_rewards,
            )
        what = "values and token rewards" if poison_rewards else "values"
        if not poison_rewards:
            clean = clean.replace(token_rewards=case.token_rewards)
        if case.lam == 1.0 and declared.domain.critic:  # a leak telescopes away at lam = 1: the judge probes at 0.5
            probe, clean = probe.replace(lam=0.5), clean.replace(lam=0.5)
        twin_is = f"the same input with 0 instead of the {what} at non-trainable positions"
    exp = expected_outputs(clean, declared)
    if exp is None:
        raise Unsupported("the target's whitening is undefined for this case (fewer than two trainable positions)")
    bnd = bounds(clean, declared.contract, exp[0], exp[1], declared.whitening, baseline=_baseline(clean, declared))
    b_rows, t_len = case.shape
    data = {
        "kind": "twin",
        "observed": "case",
        "rows": list(range(b_rows)),
        "columns": list(range(t_len)),
        "outputs": {
            "advantages": {"tolerance": _tolerance(2.0 * bnd.advantages), "where": _mask_rows(case.trainable)},
            "returns": {"tolerance": _tolerance(2.0 * bnd.returns), "where": _mask_rows(case.trainable)},
        },
    }
    return Check(probe, clean, data, f"the target's own outputs on {twin_is}", twin_is)


def _twin_check(case: Case, prop: str, declared: Declared, bnd) -> Check:
    b_rows, t_len = case.shape
    if prop == "row-independence":
        twin, where = with_extra_row(case, declared.domain)
        rows, columns = [int(i) for i in where], list(range(t_len))
        twin_is = "the same rows in reverse order with a padding column (and a padding row where the batch has one)"
    else:
        if declared.contract != "compressed":
            raise Unsupported("gap-invariance applies to the compressed contract only")
        made = with_inserted_gap(case)
        if made is None:
            raise Unsupported("gap-invariance: no row has two trainable tokens")
        twin, p = made
        why = declared.domain.rejects(twin)
        if why:
            raise Unsupported(f"gap-invariance: the target cannot express the twin: {why}")
        rows, columns = list(range(b_rows)), [i for i in range(twin.shape[1]) if i != p]
        twin_is = f"the same input with a non-trainable token inserted at position {p}"
    data = {
        "kind": "twin",
        "observed": "twin",
        "rows": rows,
        "columns": columns,
        "outputs": {
            "advantages": {"tolerance": _tolerance(2.0 * bnd.advantages), "where": _mask_rows(case.trainable)},
            "returns": {"tolerance": _tolerance(2.0 * bnd.returns), "where": _mask_rows(case.trainable)},
        },
    }
    return Check(case, twin, data, "the target's own outputs on the case as given", twin_is)


def _whiten_like(x: torch.Tensor, case: Case, declared: Declared) -> torch.Tensor:
    return x if declared.whitening is None else masked_whiten(x, case.trainable, declared.whitening)


def _whitened(declared: Declared) -> str:
    return ", whitened over the batch as the target whitens" if declared.whitening is not None else ""


def _mask_rows(m: torch.Tensor) -> list[str]:
    return ["".join("1" if x else "0" for x in row) for row in m.tolist()]


def _rows(x: torch.Tensor) -> list[list[float]]:
    return [[float(v) for v in row] for row in x.tolist()]


def _up(x: float) -> float:
    """`x` rounded up to three significant digits (tolerances read better; never tighter)."""
    if not math.isfinite(x) or x <= 0:
        return float(x)
    e = math.floor(math.log10(x)) - 2
    m = math.ceil(x / 10.0**e - 1e-9)
    y = float(f"{m}e{e}")
    while y < x:  # guard against the division rounding down
        m += 1
        y = float(f"{m}e{e}")
    return y


def _tolerance(t: torch.Tensor) -> list[list[float]] | float:
    """Per-position tolerances, rounded up; one number when they are all the same."""
    rows = [[_up(float(v)) for v in row] for row in t.tolist()]
    flat = {v for row in rows for v in row}
    return flat.pop() if len(flat) == 1 else rows


# =============================================================================================
# Source: the template and the adapter's call, copied with what they reach.
# =============================================================================================
@dataclass(frozen=True)
class ImportLine:
    """One imported name: `import module [as asname]` or `from module import name [as asname]`."""

    module: str
    name: str | None = None
    asname: str | None = None

    @property
    def bound(self) -> str:
        if self.asname:
            return self.asname
        return self.name if self.name else self.module.split(".")[0]

    def needed(self, dotted: set[str]) -> bool:
        """Whether code using the dotted names `dotted` needs this line."""
        if self.name or self.asname or "." not in self.module:
            return self.bound in dotted
        return self.module in dotted  # `import a.b` only where `a.b...` is used


class Source:
    """The top level of one module's source: definitions and imports by the name they bind."""

    def __init__(self, name: str, text: str, path: str = "<generated>"):
        self.name = name
        self.path = path
        self.text = text
        self.lines = text.splitlines()
        self.tree = ast.parse(text, filename=path)
        self.defs: dict[str, ast.stmt] = {}
        self.imports: dict[str, list[ImportLine]] = {}
        package = name.rpartition(".")[0]
        for node in self.tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self.defs[node.name] = node
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    for n in ast.walk(t):
                        if isinstance(n, ast.Name):
                            self.defs[n.id] = node
            elif isinstance(node, ast.Import):
                for a in node.names:
                    line = ImportLine(a.name, None, a.asname)
                    self.imports.setdefault(line.bound, []).append(line)
            elif isinstance(node, ast.ImportFrom) and node.module != "__future__":
                module = node.module or ""
                if node.level:  # relative: resolve against this module's package
                    base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                    module = f"{base}.{module}" if module else base
                for a in node.names:
                    line = ImportLine(module, a.name, a.asname)
                    self.imports.setdefault(line.bound, []).append(line)

    @classmethod
    def of_module(cls, name: str) -> Source:
        module = importlib.import_module(name)
        path = inspect.getsourcefile(module)
        return cls(name, Path(path).read_text(encoding="utf-8"), str(path))

    def segment(
        self, node: ast.stmt, drop: Iterable[str] = (), omit: Iterable[int] = (), strips: Iterable[tuple] = ()
    ) -> str:
        """The node's source lines with its decorators and the comment lines right above it
        (section banners, `# ---` blocks, are left out); `drop` names methods of a class to omit,
        `omit` 0-based line numbers (a local import of maskfuzz whose names the script defines),
        `strips` (line, column, length) spans to cut (a `module.` prefix whose members the script defines)."""
        start = _first_line(node)
        first = start
        while first > 0 and self.lines[first - 1].lstrip().startswith("#"):
            first -= 1
        comments = self.lines[first:start]
        if any(c.strip().startswith("# ---") or c.strip().startswith("# ===") for c in comments):
            comments = []
        lines = list(enumerate(self.lines[start : node.end_lineno], start))
        skip: set[int] = set(omit)
        for method in getattr(node, "body", []):
            if isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)) and method.name in set(drop):
                lo = _first_line(method)
                lo -= 1 if lo > 0 and not self.lines[lo - 1].strip() else 0  # and the blank line above
                skip |= set(range(lo, method.end_lineno))
        cuts: dict[int, list[tuple[int, int]]] = {}
        for line, col, length in strips:
            cuts.setdefault(line, []).append((col, length))
        out = []
        for i, text in lines:
            if i in skip:
                continue
            for col, length in sorted(cuts.get(i, ()), reverse=True):  # ast columns are UTF-8 byte offsets
                raw = text.encode()
                text = (raw[:col] + raw[col + length :]).decode()
            out.append(text)
        return "\n".join(comments + out)


def _first_line(node: ast.stmt) -> int:
    """0-based index of the node's first line, decorators included."""
    return min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])]) - 1


def unused_methods(cls: ast.ClassDef, used: set[str]) -> set[str]:
    """Methods of `cls` that no attribute access in `used` (names read as `x.name` elsewhere) and no
    kept method reaches; dunder methods are always kept."""
    methods = {m.name: m for m in cls.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))}
    keep = {n for n in methods if n.startswith("__")} | (set(methods) & used)
    while True:
        more = {a.attr for n in keep for a in ast.walk(methods[n]) if isinstance(a, ast.Attribute)} & set(methods)
        if more <= keep:
            return set(methods) - keep
        keep |= more


def free_names(node: ast.AST) -> set[str]:
    """Global names `node` reads: loads that no binding inside it (parameters, assignments, loop
    and comprehension targets, nested defs, imports, `except ... as`) provides; builtins excluded.
    Approximate for shadowing across nested scopes, which module helpers do not do."""
    loads, stores = set(), set()
    for n in ast.walk(node):
        if isinstance(n, ast.Name):
            (loads if isinstance(n.ctx, ast.Load) else stores).add(n.id)
        elif isinstance(n, ast.arg):
            stores.add(n.arg)
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n is not node:
            stores.add(n.name)
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            stores |= {(a.asname or a.name).split(".")[0] for a in n.names}
        elif isinstance(n, ast.ExceptHandler) and n.name:
            stores.add(n.name)
    return loads - stores - set(dir(builtins))


def dotted_names(node: ast.AST) -> set[str]:
    """Every name and dotted prefix read in `node`: `a.b.c` gives a, a.b and a.b.c."""
    out = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Name):
            out.add(n.id)
        elif isinstance(n, ast.Attribute):
            parts, cur = [], n
            while isinstance(cur, ast.Attribute):
                parts.append(cur.attr)
                cur = cur.value
            if isinstance(cur, ast.Name):
                chain = [cur.id] + parts[::-1]
                out |= {".".join(chain[: i + 1]) for i in range(len(chain))}
    return out


@dataclass
class Closure:
    """The definitions reached from some roots across sources, and the imports they need.

    `chain` maps a source to the sources its unresolved names fall back to (the generated glue
    reads the adapter's names, then the template's). `overrides` are template names whose
    definition is replaced by generated source (the finding's data and `prepare`)."""

    template: Source
    overrides: dict[str, Source] = field(default_factory=dict)
    sources: dict[str, Source] = field(default_factory=dict)
    chain: dict[str, list[str]] = field(default_factory=dict)
    picked: dict[tuple[str, int], tuple[Source, ast.stmt]] = field(default_factory=dict)
    bound: dict[str, str] = field(default_factory=dict)  # emitted name -> source it comes from
    imports: set[ImportLine] = field(default_factory=set)
    dotted: set[str] = field(default_factory=set)
    used_overrides: set[str] = field(default_factory=set)
    missing: dict[str, list[str]] = field(default_factory=dict)  # maskfuzz module -> names a script lacks
    local_imports: dict[str, set[int]] = field(default_factory=dict)  # source -> lines of maskfuzz imports in defs
    strips: dict[str, set[tuple[int, int, int]]] = field(default_factory=dict)  # source -> (line, col, len) cut

    def add_source(self, source: Source, chain: Iterable[str] = ()) -> None:
        self.sources[source.name] = source
        self.chain[source.name] = list(chain)

    def need(self, source: Source, name: str, why: str) -> None:
        """Make `name`, as read in `source`, available in the script."""
        if source is self.template and name in self.overrides:
            self._override(name)
            return
        if name in source.defs:
            origin = self._reexported(source, source.defs[name], name)
            if origin is not None:  # `X = mk.X`: the script has one X, the module's
                self.need(origin, name, why)
                return
            self._pick(source, source.defs[name], name)
            return
        if name in source.imports:
            self._imported(source, name, source.imports[name], why)
            return
        for fallback in self.chain.get(source.name, []):
            other = self.sources[fallback]
            if name in other.defs or name in other.imports or (other is self.template and name in self.overrides):
                self.need(other, name, why)
                return
        raise Unsupported(f"{source.name}: the name {name!r} ({why}) is not defined at module level")

    def _reexported(self, source: Source, node: ast.stmt, name: str) -> Source | None:
        """The adapter module whose `name` the definition `name = module.name` re-exports, else None."""
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
            return None
        value = node.value
        if not (isinstance(value, ast.Attribute) and value.attr == name and isinstance(value.value, ast.Name)):
            return None
        lines = source.imports.get(value.value.id, [])
        full = _adapter_module(lines[0]) if lines else None
        if full is None:
            return None
        if full not in self.sources:
            self.add_source(Source.of_module(full))
        return self.sources[full]

    def _override(self, name: str) -> None:
        if name in self.used_overrides:
            return
        self.used_overrides.add(name)
        src = self.overrides[name]
        self._claim(name, src.name)
        for node in src.tree.body:
            self._walk(src, node, name)

    def _pick(self, source: Source, node: ast.stmt, name: str) -> None:
        key = (source.name, node.lineno)
        if key in self.picked:
            return
        names = (
            [name]
            if not isinstance(node, (ast.Assign, ast.AnnAssign))
            else [n for n, d in source.defs.items() if d is node]
        )
        for n in names:
            self._claim(n, source.name)
        self.picked[key] = (source, node)
        self._walk(source, node, name)

    def _claim(self, name: str, owner: str) -> None:
        if self.bound.get(name, owner) != owner:
            raise Unsupported(f"{owner} and {self.bound[name]} both define {name!r}; the script would mix them up")
        self.bound[name] = owner

    def _walk(self, source: Source, node: ast.AST, owner: str) -> None:
        self.dotted |= dotted_names(node)
        modules = {
            bound: full for bound, lines in source.imports.items() for full in [_adapter_module(lines[0])] if full
        }
        # `from maskfuzz... import x` inside a function (adapters import each other lazily): x is copied to
        # the script's top level like any other reached definition, and the import line is left out
        for imp in ast.walk(node):
            if (
                isinstance(imp, ast.ImportFrom)
                and imp is not node
                and (imp.module or "").split(".")[0] in MASKFUZZ_PACKAGES
            ):
                why = f"imported inside {owner} in {source.name}"
                for a in imp.names:
                    line = ImportLine(imp.module, a.name, a.asname)
                    if _adapter_module(line):
                        modules[line.bound] = _adapter_module(line)
                    else:
                        self._imported(source, line.bound, [line], why)
                lines = self.local_imports.setdefault(source.name, set())
                lines |= set(range(imp.lineno - 1, imp.end_lineno))
        for n in sorted(free_names(node) - set(modules)):
            self.need(source, n, f"read by {owner} in {source.name}")
        # an adapter module used as an object (`nemo_rl.KL_TYPE`, `mk.load_x`): its members are copied to the
        # script's top level and the `module.` prefix is cut from the copied text
        for a in ast.walk(node):
            if isinstance(a, ast.Attribute) and isinstance(a.value, ast.Name) and a.value.id in modules:
                full = modules[a.value.id]
                other = self.sources.get(full) or Source.of_module(full)
                if full not in self.sources:
                    self.add_source(other)
                self.need(other, a.attr, f"read as {a.value.id}.{a.attr} by {owner} in {source.name}")
                cut = (a.value.lineno - 1, a.value.col_offset, len(a.value.id) + 1)
                self.strips.setdefault(source.name, set()).add(cut)
            elif isinstance(a, ast.Name) and a.id in modules and not _is_attribute_base(node, a):
                raise Unsupported(f"{source.name}: {owner} uses the module {a.id} itself, not a member of it")

    def _imported(self, source: Source, name: str, lines: list[ImportLine], why: str) -> None:
        for line in lines:
            top = line.module.split(".")[0]
            if top not in MASKFUZZ_PACKAGES:
                if source.name in PLAIN and top not in sys.stdlib_module_names and top != "torch":
                    raise Unsupported(
                        f"{source.name} imports {line.module} ({why}); a helper module copied into a script must "
                        "use only the standard library and torch"
                    )
                self.imports.add(line)
                continue
            key = (line.module, line.name)
            if key in SHIMS:
                self.need(self.template, SHIMS[key], why)
            elif line.name and _followed(line.module):
                other = self.sources.get(line.module) or Source.of_module(line.module)
                if line.module not in self.sources:
                    self.add_source(other)
                if line.asname or line.name not in other.defs:
                    raise Unsupported(f"{source.name} imports {line.name} from {line.module} in a way not copied")
                self.need(other, line.name, why)
            else:  # collected, so that the reason names everything that is missing at once
                names = self.missing.setdefault(line.module, [])
                if (line.name or line.module) not in names:
                    names.append(line.name or line.module)

    def check_complete(self) -> None:
        """Raise Unsupported naming every maskfuzz definition the copied code needs but a script lacks."""
        if self.missing:
            what = "; ".join(f"{', '.join(names)} from {module}" for module, names in sorted(self.missing.items()))
            # the usual cause: the copied call reads the registry entry (SPEC.own, ...), which pulls in
            # TargetSpec / Pin / Domain; a module constant that both SPEC and the call use avoids it
            spec = sorted({src.name for src, node in self.picked.values() if src.defs.get("SPEC") is node})
            hint = (
                f" ({', '.join(spec)}: the copied code reads SPEC; give what it reads from SPEC a module constant "
                "that SPEC uses too)"
                if spec
                else ""
            )
            raise Unsupported(
                f"the adapter's call needs maskfuzz's {what}, which a standalone script does not have{hint}; "
                "the adapter can provide repro_source() (see fuzz/repro.py)"
            )

    def import_block(self) -> str:
        """The import statements the picked code needs, laid out as isort (ruff's `I`) wants them:
        __future__, then the standard library, then third-party packages; `import x` lines before
        `from x import y` lines; imported names ordered constants, classes, functions."""
        lines = [line for line in self.imports if line.needed(self.dotted)]
        stdlib = set(sys.stdlib_module_names)
        blocks = ["from __future__ import annotations"]
        for is_std in (True, False):
            chosen = [x for x in lines if (x.module.split(".")[0] in stdlib) == is_std]
            plain = {x.module + (f" as {x.asname}" if x.asname else "") for x in chosen if not x.name}
            froms: dict[str, set[str]] = {}
            for x in chosen:
                if x.name:
                    froms.setdefault(x.module, set()).add(x.name + (f" as {x.asname}" if x.asname else ""))
            out = [f"import {m}" for m in sorted(plain, key=_module_key)]
            out += [_from_import(m, froms[m]) for m in sorted(froms, key=_module_key)]
            if out and not is_std:  # without torch the script cannot run: exit 2, never 1 ("reproduced")
                assert any(x.module == "sys" and not x.name for x in lines), "the template's main imports sys"
                body = "\n".join("    " + line for line in "\n".join(out).splitlines())
                out = [
                    f"try:\n{body}\n"
                    "except ImportError as exc:  # 2 is \"cannot run\"; 1 would read as \"reproduced\"\n"
                    '    print(f"cannot run: {exc} (the reproducer needs torch: pip install torch)", file=sys.stderr)\n'
                    "    raise SystemExit(2) from None"
                ]
            if out:
                blocks.append("\n".join(out))
        return "\n\n".join(blocks)

    def code(self, source_name: str, prune: tuple[str, ...] = ()) -> list[str]:
        """Source text of what was picked from one source, in its order. Classes named in `prune`
        lose the methods nothing else reads (the script's Case keeps only what is used)."""
        picked = [(node.lineno, src, node) for (name, _), (src, node) in self.picked.items() if name == source_name]
        out = []
        for _, src, node in sorted(picked, key=lambda x: x[0]):
            drop: set[str] = set()
            if isinstance(node, ast.ClassDef) and node.name in prune:
                drop = unused_methods(node, self.attributes(besides=node))
            out.append(src.segment(node, drop, self.local_imports.get(src.name, ()), self.strips.get(src.name, ())))
        return out

    def attributes(self, besides: ast.AST | None = None) -> set[str]:
        """Attribute names read anywhere in the picked code and the overrides, except inside `besides`."""
        nodes = [node for src, node in self.picked.values() if node is not besides]
        nodes += [self.overrides[n].tree for n in self.used_overrides]
        return {a.attr for node in nodes for a in ast.walk(node) if isinstance(a, ast.Attribute)}


def _adapter_module(line: ImportLine) -> str | None:
    """The adapter module an import binds as an object (`from maskfuzz.targets.adapters import nemo_rl`), else None."""
    full = f"{line.module}.{line.name}"
    return full if line.module == "maskfuzz.targets.adapters" and line.name and _followed(full) else None


def _is_attribute_base(node: ast.AST, name: ast.Name) -> bool:
    return any(isinstance(a, ast.Attribute) and a.value is name for a in ast.walk(node))


def _followed(module: str) -> bool:
    """Whether definitions imported from maskfuzz module `module` are copied into the script."""
    return module in FOLLOWED or (module.startswith("maskfuzz.targets.adapters.") and module not in NOT_FOLLOWED)


def _module_key(module: str) -> tuple:
    return (module.lower(), module)


def _member_key(name: str) -> tuple:
    bare = name.split(" as ")[0]
    kind = 0 if bare.isupper() and len(bare) > 1 else 1 if bare[:1].isupper() else 2
    return (kind, bare.lower(), name)


def _from_import(module: str, names: Iterable[str]) -> str:
    ordered = sorted(names, key=_member_key)
    line = f"from {module} import {', '.join(ordered)}"
    if len(line) <= 120:
        return line
    return f"from {module} import (\n" + "".join(f"    {n},\n" for n in ordered) + ")"


# =============================================================================================
# The target's call.
# =============================================================================================
@dataclass(frozen=True)
class CallSource:
    """The target's call for the script: `glue` defines `prepare`; `adapters` are the adapter
    modules whose definitions it copies (the last one is the target's own)."""

    glue: Source
    adapters: tuple[str, ...]
    how: str  # in words, for the script's docstring


def call_source(adapter: str) -> CallSource:
    """How the script calls the target whose adapter module is `adapter` (see the module docstring).
    Raises Unsupported naming what is missing."""
    module = importlib.import_module(adapter)
    reason = getattr(module, "REPRO_UNSUPPORTED", None)
    if reason:
        raise Unsupported(f"{adapter}: {reason}")
    provider = getattr(module, "repro_source", None)
    if callable(provider):
        glue = Source(f"{adapter}.repro_source", textwrap.dedent(provider()).strip() + "\n")
        if "prepare" not in glue.defs:
            raise Unsupported(f"{adapter}.repro_source() does not define prepare(root)")
        return CallSource(glue, (adapter,), f"the reproducer source of {_adapter_file(adapter)}")
    names = tuple(getattr(module, "REPRO_FUNCTIONS", ("load",)))
    first = names[0]
    text = f'''
def prepare(root: Path) -> tuple[Callable, str]:
    """The function under test in the checkout, ready to run, and where it is."""
    loaded = {first}(root, ENTRY)
    return loaded.run, loaded.where
'''
    glue = Source(f"{adapter}.prepare", text.strip() + "\n")
    return CallSource(glue, (adapter,), f"{_adapter_file(adapter)} ({', '.join(names)}), copied")


CHECK_WORDS = {  # the check kinds `build_check` / `build_kind_check` make, each a `check_<kind>` of the template
    "finite": "finite outputs at trainable positions, or a documented error",
    "expected": "the numbers maskfuzz computed, within tolerance",
    "twin": "the outputs on the case and on its twin agree",
    "at-least": "the outputs on the case do not lie below those on its twin",
    "zero": "a finite 0 everywhere, or a documented error",
    "same": "a second run gives the same bits",
}
CHECK_FUNCTIONS = {kind: f"check_{kind.replace('-', '_')}" for kind in CHECK_WORDS}


def _judge_source(kind: str) -> str:
    """`judge` for the script: the one check this finding needs."""
    name, words = CHECK_FUNCTIONS[kind], CHECK_WORDS[kind]
    return (
        "def judge(run: Callable, device: str) -> dict:\n"
        f'    """This finding\'s check: {words}."""\n'
        f"    return {name}(run, Case.from_dict(CASE), device)\n"
    )


def _adapter_file(adapter: str) -> str:
    """'maskfuzz.targets.adapters.verl' -> 'targets/adapters/verl.py', the file in this repository."""
    return adapter.removeprefix("maskfuzz.").replace(".", "/") + ".py"


def assemble(call: CallSource, data: dict[str, str], kind: str = "expected") -> tuple[Closure, list[str]]:
    """Collect everything `main` reaches. `data` maps finding names to their generated source;
    `kind` is the check's kind (which check function the script's `judge` calls).
    Returns the closure and the extra names of the adapter's REPRO_FUNCTIONS that were copied."""
    template = Source("maskfuzz.fuzz.templates.repro_script", TEMPLATE.read_text(encoding="utf-8"), str(TEMPLATE))
    overrides = {name: Source(f"finding.{name}", text) for name, text in data.items()}
    overrides["prepare"] = call.glue
    overrides["judge"] = Source("finding.judge", _judge_source(kind))
    closure = Closure(template, overrides)
    closure.add_source(template)
    adapter = Source.of_module(call.adapters[-1])
    closure.add_source(adapter)
    closure.add_source(call.glue, [adapter.name, template.name])
    for name, src in overrides.items():
        if src is not call.glue:
            closure.add_source(src, [template.name])
    closure.need(template, "main", "the script's entry point")
    module = importlib.import_module(call.adapters[-1])
    extra = [n for n in getattr(module, "REPRO_FUNCTIONS", ())[1:]]
    for name in extra:
        closure.need(adapter, name, "listed in REPRO_FUNCTIONS")
    closure.check_complete()
    return closure, extra


# =============================================================================================
# The target the reproducer calls.
# =============================================================================================
@dataclass(frozen=True)
class TargetInfo:
    """A registered target at a pin (or a user's --callable) as the script needs it."""

    target: str  # registry id, or "callable"
    entry: str | None  # entry point, None for the default; MODULE:FUNC for a callable
    pin: str
    adapter: str
    declared: Declared
    stand_ins: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()
    own: tuple[str, ...] = ()
    git_url: str | None = None
    package: str | None = None
    pip_args: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        if self.target == "callable":
            return f"{self.entry}"
        return f"{self.target}{':' + self.entry if self.entry else ''}@{self.pin}"

    @classmethod
    def from_spec(cls, spec, entry: str | None, pin: str) -> TargetInfo:
        adapter = spec.adapter_for(entry)
        module = importlib.import_module(adapter)
        declared_for = getattr(module, "declared_for", None)
        declared = declared_for(entry) if callable(declared_for) else spec.declared(entry, pin)
        return cls(
            spec.id,
            entry,
            pin,
            adapter,
            declared,
            tuple(spec.stand_ins),
            tuple(spec.deny),
            tuple(spec.own),
            spec.git_url,
            spec.package,
            tuple(spec.pip_args),
        )

    @classmethod
    def of_callable(cls, function: str, declared: Declared) -> TargetInfo:
        module = function.partition(":")[0]
        adapter = "maskfuzz.targets.adapters.callable"
        return cls("callable", function, "local", adapter, declared, own=(module.split(".")[0],))


@dataclass(frozen=True)
class Plan:
    """Everything the script needs except where the code is."""

    entry: Entry
    target: TargetInfo
    check: Check
    call: CallSource


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
# Writing the script.
# =============================================================================================
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
        "attention": _mask_rows(case.attention),
        "trainable": _mask_rows(case.trainable),
        "token_rewards": _rows(case.token_rewards),
        "values": _rows(case.values),
        "score": [float(x) for x in case.score.tolist()],
        **(
            {"truncated": case.truncated.tolist(), "bootstrap": [float(x) for x in case.bootstrap_values().tolist()]}
            if case.truncated is not None and bool(case.truncated.any())
            else {}
        ),
        **({"options": dict(sorted(case.options.items()))} if case.options else {}),
        **({"group": case.group.tolist()} if case.group is not None else {}),
        **({"extra": {name: _rows(x) for name, x in case.extra.items()}} if case.extra else {}),
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
        "CHECK": f"What is compared: {_check_words(check)}",
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


def _check_words(check: Check) -> str:
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
            helper_code += [_banner(f"From maskfuzz's {_adapter_file(name)}, copied (the code below uses it): {what}")]
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
        f"Checked: {_check_words(plan.check)}",
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
        f"Written by maskfuzz {_version('maskfuzz') or ''} (`maskfuzz repro`); the call mirrors {plan.call.how}.",
    ]
    lines = []
    for p in para:
        lines += [p] if p.startswith("    ") or not p else textwrap.wrap(p, 100)
    return '#!/usr/bin/env python3\n"""' + "\n".join(lines) + '\n"""'


def _version(dist: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(dist)
    except Exception:  # noqa: BLE001 - informative only
        return None


# =============================================================================================
# Running the script.
# =============================================================================================
@dataclass
class ScriptRun:
    """One run of a written script: exit code, its JSON (None if it printed none), stderr."""

    returncode: int
    data: dict | None
    stderr: str

    @property
    def status(self) -> str:
        if self.data and self.data.get("status") in EXIT_CODES.values():
            return self.data["status"]
        if self.returncode < 0 or self.returncode >= 128:
            return "crashed"
        return "error"


def run_script(
    script: Path, root: Path, device: str = "cpu", timeout: float = 600.0, python: str | None = None
) -> ScriptRun:
    """Run `script` on the checkout `root` in an isolated interpreter (`-I`: no PYTHONPATH, no user
    site, not the working directory), from the script's folder."""
    cmd = [python or sys.executable, "-I", str(script), str(root), "--device", device]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MASKFUZZ_TARGET_ROOT")}
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, cwd=script.parent, env=env, stdin=subprocess.DEVNULL
        )
    except subprocess.TimeoutExpired as exc:
        err = exc.stderr.decode() if isinstance(exc.stderr, bytes) else exc.stderr or ""
        return ScriptRun(-9, None, f"{err}\n(no answer within {timeout:.0f} s)")
    try:
        data = json.loads(proc.stdout)
    except json.JSONDecodeError:
        data = None
    return ScriptRun(proc.returncode, data if isinstance(data, dict) else None, proc.stderr)


# =============================================================================================
# The maintainer report.
# =============================================================================================
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
    zero_outputs = " / ".join(kind_outputs(kind) if kind in GAE_KINDS else _zero_outputs(kind))
    title = (TITLES if kind in GAE_KINDS else TITLES | KIND_TITLES)[e.property].format(
        contract=t.declared.contract, kind=kind, outputs=zero_outputs
    )
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
    out += [f"Checked: {_check_words(plan.check)}", ""]
    if e.also:
        out += [f"The same case also violates: {', '.join(f'`{p}`' for p in e.also)}.", ""]
    if kind in GAE_KINDS:
        out += [f"Contract declared for {t.target}: `{t.declared.contract}`" + _whitened(t.declared) + ".", ""]
    else:  # the variant as the case's options configure it
        configured = t.declared.configured(plan.check.case).variant or {}
        variant = ", ".join(f"{k}={v!r}" for k, v in sorted(configured.items())) or "its defaults"
        how = " with the options above" if plan.check.case.options else ""
        out += [f"Kind `{kind}`, variant declared for {t.label}{how}: {variant}.", ""]
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


def _zero_outputs(kind: str) -> tuple[str, ...]:
    from maskfuzz.oracles.kinds import spec

    return spec(kind).zero_outputs


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
        ("maskfuzz", _version("maskfuzz") or "-"),
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

"""The AST copier: the top level of a module's source by the names it binds (`Source`), and the `Closure` of
the definitions some roots reach across sources, copied verbatim with the imports they need (laid out as isort
wants them). Which maskfuzz modules may be copied into a standalone script, and which names the script defines
itself, are the constants below; anything else the copied code needs makes the target Unsupported.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import inspect
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from maskfuzz.fuzz.repro_check import Unsupported

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
FOLLOWED = ("maskfuzz.targets.runtime.standins", "maskfuzz.oracles.kinds.loss_aggregation")
# maskfuzz helper modules copied into scripts that must stay standard library + torch: an import of
# anything else from them is refused (the adapter's own module may import the framework's packages)
PLAIN = (
    "maskfuzz.targets.runtime.standins",
    "maskfuzz.targets.adapters.extract",
    "maskfuzz.oracles.options",
    "maskfuzz.oracles.kinds.loss_aggregation",
)


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
    """The adapter module an import binds as an object (`from maskfuzz.targets.adapters import nemo_rl`, or a
    framework's calls: `from maskfuzz.targets.miles import calls_kinds as mk`), else None."""
    full = f"{line.module}.{line.name}"
    package = line.module == "maskfuzz.targets.adapters" or re.fullmatch(r"maskfuzz\.targets\.\w+", line.module)
    return full if package and line.name and _followed(full) else None


def _is_attribute_base(node: ast.AST, name: ast.Name) -> bool:
    return any(isinstance(a, ast.Attribute) and a.value is name for a in ast.walk(node))


def _followed(module: str) -> bool:
    """Whether definitions imported from maskfuzz module `module` are copied into the script: the shared
    helpers in FOLLOWED, a legacy adapter (`targets/adapters/<name>.py`) or a framework's worker-side
    calls (`targets/<name>/calls*.py`; never its declaration, which the worker does not run)."""
    if module in FOLLOWED:
        return True
    if module.startswith("maskfuzz.targets.adapters."):
        return module not in NOT_FOLLOWED
    return re.fullmatch(r"maskfuzz\.targets\.\w+\.calls\w*", module) is not None


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

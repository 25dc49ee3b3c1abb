"""Run code taken from a framework's source text at a pin, without importing its module.

Some frameworks keep the masked GAE inline in a trainer method (TRL's `PPOTrainer.train`) or in a
method of a class whose module pulls in a whole distributed stack at import time (AReaL's
`PPOActor`). Importing those modules through inert stand-ins breaks on module-level version checks
and logging set-up that have nothing to do with the math. Instead, this module parses the real
file with `ast`, takes the statements or the `def` under test, and compiles exactly those nodes
(original file name and line numbers kept, so tracebacks point into the checkout).

The names such code reads from its module are resolved from the same source tree, one definition
at a time: a top-level `def`/`class`/assignment of the module is compiled in a namespace of its
own module (so `masked_whiten` sees its own `masked_mean`), `from .x import y` and
`from pkg.x import y` inside the framework's own packages are followed to the defining file, and
only light external packages (`LIGHT`: torch, numpy, the standard library bits these helpers use)
are imported for real. Nothing is stubbed: a name that cannot be resolved stays unbound and is
reported, so using it raises `NameError` loudly instead of computing garbage.

Locating a block is the adapter's job (it knows the structure to look for); when the structure is
not there it raises `BlockNotFound`, an error, never a skip or a guess.
"""

from __future__ import annotations

import ast
import builtins
import copy
import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator

# External top-level packages that may be imported for real when extracted code reads them.
LIGHT: frozenset[str] = frozenset(
    {
        "torch",
        "numpy",
        "math",
        "typing",
        "typing_extensions",
        "functools",
        "itertools",
        "collections",
        "dataclasses",
        "enum",
        "warnings",
        "contextlib",
        "abc",
        "copy",
        "operator",
        "numbers",
    }
)
_BUILTINS = frozenset(dir(builtins))


class BlockNotFound(RuntimeError):
    """The code under test is not where (or not shaped as) the adapter expects at this pin.

    Raised at load time: the target cannot be tested at this pin until the adapter learns the new
    shape. Deliberately not `NotPresent` (which would turn the problem into a quiet skip)."""


# ---------------------------------------------------------------------------------------------
# Parsing and structural search.
# ---------------------------------------------------------------------------------------------
@dataclass
class SourceFile:
    """One parsed file of the checkout."""

    path: Path
    text: str
    tree: ast.Module

    @classmethod
    def read(cls, path: Path) -> "SourceFile":
        text = Path(path).read_text(encoding="utf-8")
        return cls(Path(path), text, ast.parse(text, filename=str(path)))

    def segment(self, node: ast.AST) -> str:
        return ast.get_source_segment(self.text, node) or ""


def find_class(tree: ast.Module, name: str) -> ast.ClassDef | None:
    """The top-level class `name` of a module, or None."""
    return next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name), None)


def find_method(cls: ast.ClassDef, name: str) -> ast.FunctionDef | None:
    """The method `name` defined directly in `cls`, or None."""
    defs = (ast.FunctionDef, ast.AsyncFunctionDef)
    return next((n for n in cls.body if isinstance(n, defs) and n.name == name), None)


def statement_lists(node: ast.AST) -> Iterator[list[ast.stmt]]:
    """Every list of sibling statements inside `node` (bodies of with/for/if/try/...), outermost
    first; nested function and class bodies are not entered."""
    for name in ("body", "orelse", "finalbody"):
        stmts = getattr(node, name, None)
        if isinstance(stmts, list) and stmts and isinstance(stmts[0], ast.stmt):
            yield stmts
            for s in stmts:
                if not isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    yield from statement_lists(s)
    for handler in getattr(node, "handlers", []) or []:
        yield from statement_lists(handler)
    for case in getattr(node, "cases", []) or []:
        yield from statement_lists(case)


def is_reversed_range_loop(node: ast.AST) -> bool:
    """`for <name> in reversed(range(...)):`"""
    if not isinstance(node, ast.For) or not isinstance(node.target, ast.Name):
        return False
    it = node.iter
    return (
        isinstance(it, ast.Call)
        and isinstance(it.func, ast.Name)
        and it.func.id == "reversed"
        and len(it.args) == 1
        and isinstance(it.args[0], ast.Call)
        and isinstance(it.args[0].func, ast.Name)
        and it.args[0].func.id == "range"
    )


def assigned_names(node: ast.AST) -> set[str]:
    """Plain names stored anywhere inside `node` (assignment targets, loop targets, ...)."""
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del))}


def stored_names(stmt: ast.stmt) -> set[str]:
    """Plain names a top-level assignment statement stores (not names inside nested blocks)."""
    if isinstance(stmt, ast.Assign):
        return {
            n.id for t in stmt.targets for n in ast.walk(t) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
        }
    if isinstance(stmt, (ast.AugAssign, ast.AnnAssign)) and isinstance(stmt.target, ast.Name):
        return {stmt.target.id}
    return set()


def attribute_reads(node: ast.AST, base: str) -> set[str]:
    """Attribute names read as `<base>.<attr>` inside `node` (e.g. the `args.*` a block needs);
    `base` may be dotted (`self.args`)."""
    return {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute) and _dotted(n.value) == base}


def _dotted(node: ast.AST) -> str | None:
    """`a.b.c` for a chain of attributes on a name, else None."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value)
        return None if head is None else f"{head}.{node.attr}"
    return None


def find_gae_loop(func: ast.FunctionDef, carry: str = "lastgaelam") -> tuple[list[ast.stmt], int] | None:
    """The sibling list holding the GAE recursion in `func` and the loop's index in it.

    The loop is recognised by structure: `for t in reversed(range(...))` whose body assigns the
    running advantage `carry` (TRL and AReaL both call it `lastgaelam`). None when absent; two
    such loops in one function is ambiguous and raises BlockNotFound."""
    found = []
    for stmts in statement_lists(func):
        for i, s in enumerate(stmts):
            if is_reversed_range_loop(s) and carry in assigned_names(s):
                found.append((stmts, i))
    if len(found) > 1:
        lines = ", ".join(str(stmts[i].lineno) for stmts, i in found)
        raise BlockNotFound(f"{func.name} has {len(found)} GAE loops (lines {lines}); the adapter cannot tell which")
    return found[0] if found else None


# ---------------------------------------------------------------------------------------------
# Free names.
# ---------------------------------------------------------------------------------------------
class _Reads(ast.NodeVisitor):
    """Names read before they are written, in execution order, over a sequence of statements."""

    def __init__(self) -> None:
        self.stored: set[str] = set()
        self.free: set[str] = set()

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Load):
            if node.id not in self.stored:
                self.free.add(node.id)
        else:
            self.stored.add(node.id)

    def visit_Assign(self, node: ast.Assign) -> None:
        self.visit(node.value)
        for t in node.targets:
            self.visit(t)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self.visit(node.value)
        self.visit(node.target)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self.visit(node.value)
        if isinstance(node.target, ast.Name):
            if node.target.id not in self.stored:
                self.free.add(node.target.id)
            self.stored.add(node.target.id)
        else:
            self.visit(node.target)

    def visit_For(self, node: ast.For) -> None:
        self.visit(node.iter)
        self.visit(node.target)
        for s in node.body + node.orelse:
            self.visit(s)

    def _comprehension(self, node) -> None:
        for gen in node.generators:
            self.visit(gen.iter)
            self.visit(gen.target)
            for cond in gen.ifs:
                self.visit(cond)
        for name in ("elt", "key", "value"):
            if getattr(node, name, None) is not None:
                self.visit(getattr(node, name))

    visit_ListComp = visit_SetComp = visit_GeneratorExp = visit_DictComp = _comprehension

    def _function(self, node) -> None:
        self.stored.add(node.name)
        for free in function_free_names(node):
            if free not in self.stored:
                self.free.add(free)

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _function

    def visit_Lambda(self, node: ast.Lambda) -> None:
        params = {a.arg for a in _all_args(node.args)}
        inner = _Reads()
        inner.stored |= params
        inner.visit(node.body)
        self.free |= {n for n in inner.free if n not in self.stored}


def _all_args(args: ast.arguments) -> list[ast.arg]:
    out = list(args.posonlyargs) + list(args.args) + list(args.kwonlyargs)
    out += [a for a in (args.vararg, args.kwarg) if a is not None]
    return out


def block_free_names(stmts: Iterable[ast.stmt]) -> set[str]:
    """Names a block of statements reads before assigning them (builtins excluded)."""
    reads = _Reads()
    for s in stmts:
        reads.visit(s)
    return reads.free - _BUILTINS


def function_free_names(node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> set[str]:
    """Global names a def or class reads: loads in it that are neither parameters nor assigned in
    it, plus its decorators, defaults and bases (approximate for nested scopes, which is enough to
    resolve module helpers)."""
    outer: set[str] = set()
    for d in getattr(node, "decorator_list", []):
        outer |= {n.id for n in ast.walk(d) if isinstance(n, ast.Name)}
    if isinstance(node, ast.ClassDef):
        for b in list(node.bases) + [k.value for k in node.keywords]:
            outer |= {n.id for n in ast.walk(b) if isinstance(n, ast.Name)}
        body_nodes: list[ast.AST] = list(node.body)
        params: set[str] = set()
    else:
        for d in list(node.args.defaults) + [d for d in node.args.kw_defaults if d is not None]:
            outer |= {n.id for n in ast.walk(d) if isinstance(n, ast.Name)}
        body_nodes = list(node.body)
        params = {a.arg for a in _all_args(node.args)}
    loads, stores = set(), set(params)
    for b in body_nodes:
        for n in ast.walk(b):
            if isinstance(n, ast.Name):
                (loads if isinstance(n.ctx, ast.Load) else stores).add(n.id)
            elif isinstance(n, ast.arg):
                stores.add(n.arg)
            elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                stores.add(n.name)
            elif isinstance(n, (ast.Import, ast.ImportFrom)):
                stores |= {(a.asname or a.name).split(".")[0] for a in n.names}
    return ((loads - stores) | outer) - _BUILTINS


# ---------------------------------------------------------------------------------------------
# Resolving module globals from the source tree.
# ---------------------------------------------------------------------------------------------
@dataclass
class SourceTree:
    """Compiles definitions from the files of a checkout rooted at `root`, whose own top-level
    packages are `own` (their imports are followed in the source, never imported)."""

    root: Path
    own: tuple[str, ...]
    _files: dict[Path, SourceFile] = field(default_factory=dict)
    _namespaces: dict[Path, dict] = field(default_factory=dict)
    _resolving: set[tuple[Path, str]] = field(default_factory=set)
    unresolved: dict[str, str] = field(default_factory=dict)  # "file::name" -> why
    provenance: dict[str, str] = field(default_factory=dict)  # "file::name" -> where it came from

    # -- files and modules ------------------------------------------------------------------------
    def file(self, path: Path) -> SourceFile:
        path = Path(path).resolve()
        if path not in self._files:
            self._files[path] = SourceFile.read(path)
        return self._files[path]

    def module_file(self, module: str) -> Path | None:
        """The file of dotted `module` in the checkout (`a/b.py` or `a/b/__init__.py`), or None."""
        base = Path(self.root, *module.split("."))
        for cand in (base.with_suffix(".py"), base / "__init__.py"):
            if cand.is_file():
                return cand.resolve()
        return None

    def module_name(self, path: Path) -> str:
        rel = Path(path).resolve().relative_to(Path(self.root).resolve()).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        return ".".join(parts)

    def namespace(self, path: Path) -> dict:
        """The (lazily filled) globals of the module at `path`."""
        path = Path(path).resolve()
        if path not in self._namespaces:
            name = self.module_name(path)
            self._namespaces[path] = {"__name__": name, "__file__": str(path), "__builtins__": builtins}
        return self._namespaces[path]

    def rel(self, path: Path) -> str:
        return str(Path(path).resolve().relative_to(Path(self.root).resolve()))

    # -- resolution ---------------------------------------------------------------------------------
    def resolve(self, path: Path, names: Iterable[str]) -> dict:
        """Define each of `names` in the namespace of the module at `path`, as far as the source
        allows; returns that namespace. Failures are recorded in `unresolved`."""
        ns = self.namespace(path)
        for name in sorted(set(names)):
            if name in ns or name in _BUILTINS:
                continue
            key = (Path(path).resolve(), name)
            if key in self._resolving:
                continue
            self._resolving.add(key)
            try:
                self._define(Path(path).resolve(), name, ns)
            finally:
                self._resolving.discard(key)
        return ns

    def _define(self, path: Path, name: str, ns: dict) -> None:
        src = self.file(path)
        where = f"{self.rel(path)}::{name}"
        for node in _top_level(src.tree.body):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
                self.resolve(path, function_free_names(node))
                self._exec_recorded(path, node, ns, where, type(node).__name__)
                return
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and name in _target_names(node):
                self.resolve(path, block_free_names([node]))
                self._exec_recorded(path, node, ns, where, "assignment")
                return
            if isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if (alias.asname or alias.name) == name:
                        self._import_from(path, node, alias, name, ns, where)
                        return
            if isinstance(node, ast.Import):
                for alias in node.names:
                    bound = alias.asname or alias.name.split(".")[0]
                    if bound == name:
                        self._import(alias, name, ns, where)
                        return
        self.unresolved[where] = "no top-level definition or import of this name"

    def _import(self, alias: ast.alias, name: str, ns: dict, where: str) -> None:
        top = alias.name.split(".")[0]
        if top not in LIGHT:
            self.unresolved[where] = f"`import {alias.name}` is not a light package (not imported)"
            return
        mod = importlib.import_module(alias.name)
        ns[name] = mod if alias.asname else importlib.import_module(top)
        self.provenance[where] = f"import {alias.name} (real)"

    def _import_from(self, path: Path, node: ast.ImportFrom, alias: ast.alias, name: str, ns: dict, where: str) -> None:
        module = self._absolute(path, node)
        top = module.split(".")[0]
        if top in self.own:
            target = self.module_file(module)
            if target is None:
                sub = self.module_file(f"{module}.{alias.name}")
                why = "a submodule (not followed)" if sub else "no such file in the checkout"
                self.unresolved[where] = f"from {module} import {alias.name}: {why}"
                return
            other = self.resolve(target, [alias.name])
            if alias.name in other:
                ns[name] = other[alias.name]
                self.provenance[where] = f"from {module} import {alias.name} (source)"
            else:
                self.unresolved[where] = f"from {module} import {alias.name}: unresolved there"
            return
        if top not in LIGHT:
            self.unresolved[where] = f"from {module} import {alias.name}: not a light package (not imported)"
            return
        mod = importlib.import_module(module)
        if not hasattr(mod, alias.name):
            mod = importlib.import_module(f"{module}.{alias.name}")
            ns[name] = mod
        else:
            ns[name] = getattr(mod, alias.name)
        self.provenance[where] = f"from {module} import {alias.name} (real)"

    def _absolute(self, path: Path, node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        package = self.module_name(path).split(".")
        if Path(path).name != "__init__.py":
            package = package[:-1]
        base = package[: len(package) - (node.level - 1)] if node.level > 1 else package
        return ".".join(base + ([node.module] if node.module else []))

    def _exec_recorded(self, path: Path, node: ast.stmt, ns: dict, where: str, kind: str) -> None:
        try:
            self._exec(path, [node], ns)
        except Exception as exc:  # noqa: BLE001 - recorded; a block that needs it fails loudly
            self.unresolved[where] = f"defining it raised {type(exc).__name__}: {exc}"
            return
        self.provenance[where] = f"{self.rel(path)}:{node.lineno} ({kind})"

    def _exec(self, path: Path, nodes: list[ast.stmt], ns: dict) -> None:
        nodes = [_unannotated(n) for n in nodes]
        code = compile(ast.Module(body=nodes, type_ignores=[]), str(path), "exec")
        exec(code, ns)  # noqa: S102 - the framework's own source, the code under test

    # -- what adapters call -----------------------------------------------------------------------
    def function(self, path: Path, node: ast.FunctionDef, strip_decorators: bool = True) -> Callable:
        """Compile the def `node` of the file at `path` (a method is compiled as a plain function
        whose first parameter is `self`), with its module's globals resolved from the source.
        Decorators are dropped when `strip_decorators` (profiling / no_grad wrappers)."""
        fn_node = copy.deepcopy(node)
        if strip_decorators:
            fn_node.decorator_list = []
        ns = self.resolve(path, function_free_names(fn_node))
        local: dict = {}
        code = compile(ast.Module(body=[_unannotated(fn_node)], type_ignores=[]), str(Path(path).resolve()), "exec")
        exec(code, ns, local)  # noqa: S102 - the framework's own source, the code under test
        return local[node.name]

    def block(self, path: Path, stmts: list[ast.stmt], bound: Iterable[str]) -> "Block":
        """Compile sibling statements `stmts` of the file at `path` as one block that runs with the
        names in `bound` supplied by the caller and every other free name resolved from the source.

        Raises BlockNotFound naming any free name that cannot be resolved."""
        free = block_free_names(stmts) - set(bound)
        ns = self.resolve(path, free)
        missing = sorted(n for n in free if n not in ns)
        if missing:
            details = "; ".join(f"{n}: {self.unresolved.get(f'{self.rel(path)}::{n}', '?')}" for n in missing)
            raise BlockNotFound(
                f"the block at {self.rel(path)}:{stmts[0].lineno} reads names that cannot be resolved: {details}"
            )
        code = compile(ast.Module(body=list(stmts), type_ignores=[]), str(Path(path).resolve()), "exec")
        return Block(code, ns, tuple(sorted(set(bound))), stmts[0].lineno, stmts[-1].end_lineno or stmts[-1].lineno)


class _DropAnnotations(ast.NodeTransformer):
    """Removes parameter and return annotations: they name framework types (TrainEngine, ...)
    that the math never needs, and evaluating them at def time would need those imports."""

    def _fn(self, node):
        self.generic_visit(node)
        node.returns = None
        for a in _all_args(node.args):
            a.annotation = None
        return node

    visit_FunctionDef = visit_AsyncFunctionDef = _fn


def _unannotated(node: ast.AST) -> ast.AST:
    """A copy of `node` whose defs carry no annotations."""
    return ast.fix_missing_locations(_DropAnnotations().visit(copy.deepcopy(node)))


def _target_names(node: ast.Assign | ast.AnnAssign) -> set[str]:
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    out = set()
    for t in targets:
        out |= {n.id for n in ast.walk(t) if isinstance(n, ast.Name)}
    return out


def _top_level(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Top-level statements, entering `if`/`try` blocks (optional imports live there)."""
    for node in body:
        if isinstance(node, ast.If):
            yield from _top_level(node.body)
            yield from _top_level(node.orelse)
        elif isinstance(node, ast.Try):
            yield from _top_level(node.body)
            for h in node.handlers:
                yield from _top_level(h.body)
            yield from _top_level(node.orelse)
        else:
            yield node


@dataclass
class Block:
    """Compiled statements plus the module globals they read; `run(**bound)` executes them in a
    fresh namespace and returns it (the block's results are names in it)."""

    code: object
    globals: dict
    bound: tuple[str, ...]
    first_line: int
    last_line: int

    def run(self, **values) -> dict:
        missing = set(self.bound) - set(values)
        if missing:
            raise TypeError(f"the block needs {sorted(missing)} bound")
        ns = dict(self.globals)
        ns.update(values)
        exec(self.code, ns)  # noqa: S102 - the framework's own source, the code under test
        return ns

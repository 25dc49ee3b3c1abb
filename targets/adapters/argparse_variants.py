"""Variants a trainer switches by its argparse options, read from the code at the pin by AST (no import).

A trainer configured by one argparse namespace (`args`) selects its advantage estimator, its KL estimator and its
loss by `choices=[...]` options, and turns corrections on with `store_true` switches that its loss function tests
(`if args.use_x:`). This module reads, framework-neutrally:

* `arguments(tree)`: every `parser.add_argument(flag, ...)` / `reset_arg(parser, flag, ...)` of the arguments file:
  its dest, line, choices (each with its line), whether it is a boolean switch, and its literal default;
* `function_defs(root, package, name)`: where a function of that name is defined under the package;
* `compared(node, attr)`: the strings `args.<attr>` is compared with inside a function (`== "x"`, `in [...]`), each
  with the line of the test and the other strings of the same test (the branch it shares);
* `reads(node, names)`: which of `names` the function reads as `args.<name>`, with the first line.

A framework's `discover.py` builds its `Variant`s from these; the worker reads the defaults with `arguments`.
"""

from __future__ import annotations

import ast
import warnings
from dataclasses import dataclass
from pathlib import Path

_BOOLEAN_ACTIONS = ("store_true", "store_false")


@dataclass(frozen=True)
class Argument:
    """One option of the parser: `flag` ("--use-tis"), `dest` ("use_tis"), the line of the call, its choices (each
    with its line), whether it is a boolean switch (`action="store_true"/"store_false"`) and its default when
    that is a literal (`has_default` False otherwise)."""

    flag: str
    dest: str
    line: int
    choices: tuple[tuple[str, int], ...] = ()
    boolean: bool = False
    default: object = None
    has_default: bool = False


def parse_file(path: Path) -> ast.Module | None:
    """`path` parsed (None when it is absent or does not parse: a half-done refactor upstream is not a variant)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return ast.parse(Path(path).read_text(encoding="utf-8", errors="replace"))
    except (OSError, SyntaxError):
        return None


def _const(node: ast.AST | None) -> tuple[bool, object]:
    try:
        return True, ast.literal_eval(node) if node is not None else None
    except (ValueError, SyntaxError, TypeError):
        return False, None


def _flag_of(call: ast.Call) -> str | None:
    """The flag of `x.add_argument("--f", ...)` or `reset_arg(parser, "--f", ...)`, None for any other call."""
    func = call.func
    if isinstance(func, ast.Attribute) and func.attr == "add_argument":
        first = call.args[0] if call.args else None
    elif isinstance(func, ast.Name) and func.id == "reset_arg":
        first = call.args[1] if len(call.args) > 1 else None
    else:
        return None
    return first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else None


def arguments(tree: ast.Module | None) -> dict[str, Argument]:
    """Every option `tree` declares, by flag; a flag declared twice (a `reset_arg` after Megatron's) is the last."""
    out: dict[str, Argument] = {}
    for node in ast.walk(tree) if tree is not None else ():
        flag = _flag_of(node) if isinstance(node, ast.Call) else None
        if flag is None or not flag.startswith("--"):
            continue
        kw = {k.arg: k.value for k in node.keywords if k.arg}
        dest = kw["dest"].value if isinstance(kw.get("dest"), ast.Constant) else flag[2:].replace("-", "_")
        action = kw["action"].value if isinstance(kw.get("action"), ast.Constant) else None
        choices = kw.get("choices")
        elts = choices.elts if isinstance(choices, (ast.List, ast.Tuple, ast.Set)) else []
        listed = tuple((e.value, e.lineno) for e in elts if isinstance(e, ast.Constant) and isinstance(e.value, str))
        boolean = action in _BOOLEAN_ACTIONS
        if "default" in kw:
            has, default = _const(kw["default"])
        elif boolean:
            has, default = True, action == "store_false"
        else:
            has, default = True, None
        out[flag] = Argument(flag, dest, node.lineno, listed, boolean, default, has)
    return out


def by_dest(args: dict[str, Argument]) -> dict[str, Argument]:
    return {a.dest: a for a in args.values()}


def function_defs(root: Path, package: str, name: str) -> list[tuple[str, ast.FunctionDef]]:
    """Every top-level `def name` under `root/package` (files that mention `def name(` only), as (rel, node)."""
    base = Path(root)
    out = []
    for path in sorted((base / package).rglob("*.py")):
        try:
            if f"def {name}(" not in path.read_text(encoding="utf-8", errors="replace"):
                continue
        except OSError:
            continue
        tree = parse_file(path)
        for node in tree.body if tree is not None else ():
            if isinstance(node, ast.FunctionDef) and node.name == name:
                out.append((str(path.relative_to(base)), node))
    return out


def _is_args_attr(node: ast.AST, attr: str) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == attr and isinstance(node.value, ast.Name)


@dataclass(frozen=True)
class Comparison:
    """`args.<attr>` compared with `value` at `line`, in a test that also names `shared` (one branch)."""

    value: str
    line: int
    shared: tuple[str, ...]


def compared(node: ast.AST, attr: str) -> dict[str, list[Comparison]]:
    """value -> every comparison of `args.<attr>` with it inside `node` (`==`, `!=`, `in`, `not in`), in line order."""
    out: dict[str, list[Comparison]] = {}
    for sub in ast.walk(node):
        if not (isinstance(sub, ast.Compare) and _is_args_attr(sub.left, attr) and len(sub.comparators) == 1):
            continue
        right = sub.comparators[0]
        elts = right.elts if isinstance(right, (ast.List, ast.Tuple, ast.Set)) else [right]
        names = tuple(e.value for e in elts if isinstance(e, ast.Constant) and isinstance(e.value, str))
        for name in names:
            out.setdefault(name, []).append(Comparison(name, sub.lineno, names))
    return {k: sorted(v, key=lambda c: c.line) for k, v in out.items()}


def reads(node: ast.AST, names: set[str] | frozenset[str]) -> dict[str, int]:
    """name -> the first line `node` reads `args.<name>` (`getattr(args, "name", ...)` included), for `names`."""
    out: dict[str, int] = {}
    for sub in ast.walk(node):
        name = None
        if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) and sub.value.id == "args":
            name = sub.attr
        elif (
            isinstance(sub, ast.Call)
            and isinstance(sub.func, ast.Name)
            and sub.func.id == "getattr"
            and len(sub.args) >= 2
            and isinstance(sub.args[1], ast.Constant)
        ):
            name = sub.args[1].value
        if name in names and (name not in out or sub.lineno < out[name]):
            out[name] = sub.lineno
    return out


def calls(node: ast.AST) -> set[str]:
    """The names of the functions `node` calls (`f(...)`, `x.f(...)`)."""
    out = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call):
            f = sub.func
            out.add(f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else "")
    return out - {""}

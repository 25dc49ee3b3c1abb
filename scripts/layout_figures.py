"""The layout figures of issue 25, measured on the source tree (no import of maskfuzz).

    python scripts/layout_figures.py [--json]

Counts, over the product packages (oracles/, fuzz/, targets/; tests excluded):
  import cycles          strongly connected groups of modules importing each other (module level and
                         inside functions), with their members
  function-local imports maskfuzz imports inside a function body
(an import is a statement or `importlib.import_module` / `__import__` of a literal "maskfuzz..." name, a static
import in disguise; a name computed from a declared table, `f"maskfuzz.targets.{folder}.discover"`, is not one)
  private imports        `from maskfuzz.x import _name` across modules
  long files             modules over 800 lines
  kind dispatch          comparisons of a `kind` value with a kind's name (`kind == "gae"`, `kind in (...)`,
                         or a membership test against a module-level name bound to a tuple of kind names:
                         `kind in GAE_KINDS`), outside that kind's own package (`oracles/kinds/gae/` may name
                         `gae` and `returns`)
  against the direction  imports from a higher layer (fuzz > targets > oracles), and, inside oracles, from
                         the shared vocabulary (oracles/*.py) up into a kind (oracles/kinds/)
  framework names        a framework named outside its folder `targets/<fw>/`: an import of
                         `maskfuzz.targets.<fw>` (static or a literal importlib name), or a string constant
                         that is not a docstring or bare string statement (comments and citations do not
                         count) whose value is a framework's id or folder name ("verl", "nemo-rl", "nemo_rl"),
                         starts with "<fw>:" / "<fw>@" / "<fw>." (an entry, a pin, the framework's module
                         path) or is the module path of its folder ("maskfuzz.targets.<fw>..."); the
                         frameworks are the folders targets/*/ that hold a declare.py (the registry's rule)

`tests/test_layout.py` holds the tree to these figures (per file, so a new violation fails).
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("oracles", "fuzz", "targets")
LAYER = {"oracles": 0, "targets": 1, "fuzz": 2}  # a module imports only from its own layer or below
# the kinds' names (tests/test_layout.py checks this against oracles.kinds.ALL_KINDS)


def registered_kinds(registry: Path = ROOT / "oracles" / "kinds" / "__init__.py") -> tuple[str, ...]:
    """The kind names the registry defines, read by AST (the keys of KINDS), so a new kind needs no edit here."""
    names: list[str] = []
    for node in ast.parse(registry.read_text()).body:
        if isinstance(node, ast.AnnAssign):
            target = node.target
        elif isinstance(node, ast.Assign):
            target = node.targets[0]
        else:
            continue
        if not isinstance(target, ast.Name) or node.value is None:
            continue
        if target.id == "KINDS" and isinstance(node.value, ast.Dict):
            names += [k.value for k in node.value.keys if isinstance(k, ast.Constant)]
    return tuple(names)


KIND_NAMES = registered_kinds()
# a kind's own package, oracles/kinds/<package>/, may compare a kind with its own names (GAE's holds `returns`)
OWN_KINDS = {"gae": ("gae", "returns")}


def own_kinds(rel: str) -> tuple[str, ...]:
    """The kind names the module at `rel` (relative to ROOT) may compare a kind with: its package's own."""
    parts = Path(rel).parts
    if len(parts) >= 4 and parts[:2] == ("oracles", "kinds"):
        return OWN_KINDS.get(parts[2], (parts[2].replace("_", "-"),))
    return ()


def framework_folders(root: Path | None = None) -> dict[str, str]:
    """Folder name -> framework id (`-` for `_`) of the folders `targets/<name>/` that hold a declare.py: the
    frameworks, found as the registry finds them (tests/test_layout.py checks them against the registry)."""
    targets = (root or ROOT) / "targets"
    if not targets.is_dir():
        return {}
    return {p.name: p.name.replace("_", "-") for p in sorted(targets.iterdir()) if (p / "declare.py").is_file()}


def framework_named(value: str, folders: dict[str, str]) -> str | None:
    """The framework folder `value` names (see the module docstring: an id, `<fw>:`, `<fw>@`, `<fw>.`, the
    folder's module path), or None."""
    for folder, fid in folders.items():
        module = f"maskfuzz.targets.{folder}"
        if value == module or value.startswith(module + "."):
            return folder
        for name in {folder, fid}:
            if value == name or value.startswith((f"{name}:", f"{name}@", f"{name}.")):
                return folder
    return None


def _framework_folder(rel: str, folders: dict[str, str]) -> str | None:
    """The framework folder the module at `rel` lies in (`targets/<fw>/...`), or None."""
    parts = Path(rel).parts
    return parts[1] if len(parts) >= 3 and parts[0] == "targets" and parts[1] in folders else None


def framework_names(tree: ast.AST, here: str, is_pkg: bool, folders: dict[str, str]) -> list[tuple[int, str]]:
    """(line, what) for each framework the module names outside the framework's folder: its imports of a
    framework's folder and the string constants naming a framework, docstrings and bare strings left out."""
    bare = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
    hits: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        literal = _literal_import(node)
        if literal:
            bare.add(id(node.args[0]))  # counted once, as an import
        mods = _target(node, here, is_pkg)
        named = sorted({f for m in mods for f in [framework_named(m, folders)] if f and m.startswith("maskfuzz.")})
        if named:
            hits.append((node.lineno, f"imports maskfuzz.targets.{named[0]}"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in bare:
            folder = framework_named(node.value, folders)
            if folder:
                hits.append((node.lineno, f"names {folder}: {node.value[:40]!r}"))
    return sorted(hits)


# The entry points, where imports inside functions are the rule: the command line (each command
# imports what it runs) and the pytest plugin (loaded in every pytest run of a maintainer's suite).
CLI_LAYER = ("fuzz/cli.py", "fuzz/commands/", "fuzz/pytest_plugin.py")


def against_direction(importer: str, imported: str) -> str | None:
    """Why `importer` (maskfuzz.x.y) may not import `imported`, or None when it may."""
    a, b = importer.split(".")[1], imported.split(".")[1]
    if LAYER[b] > LAYER[a]:
        return f"{a} imports {b}: the direction is fuzz -> targets -> oracles"
    in_kinds = lambda m: m.startswith("maskfuzz.oracles.kinds")  # noqa: E731
    if a == b == "oracles" and in_kinds(imported) and not in_kinds(importer):
        return "the oracles vocabulary imports a kind: the direction is kinds -> vocabulary"
    return None


def modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for f in sorted((ROOT / pkg).rglob("*.py")):
            rel = f.relative_to(ROOT).with_suffix("")
            parts = list(rel.parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out["maskfuzz." + ".".join(parts)] = f
    return out


def _literal_import(node: ast.AST) -> str | None:
    """The module `importlib.import_module("maskfuzz.x")` / `__import__("maskfuzz.x")` names as a literal, else None."""
    if not isinstance(node, ast.Call) or not node.args:
        return None
    func, arg = node.func, node.args[0]
    called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    if called in ("import_module", "__import__") and isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value if arg.value.startswith("maskfuzz.") else None
    return None


def _target(node: ast.AST, here: str, is_pkg: bool) -> list[str]:
    literal = _literal_import(node)
    if literal:
        return [literal]
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name.startswith("maskfuzz.")]
    if isinstance(node, ast.ImportFrom):
        if node.level:
            base = here.split(".")
            base = base if is_pkg else base[:-1]
            base = base[: len(base) - (node.level - 1)]
            mod = ".".join(base + ([node.module] if node.module else []))
        else:
            mod = node.module or ""
        if not mod.startswith("maskfuzz"):
            return []
        return [mod] + [f"{mod}.{a.name}" for a in node.names]
    return []


def kind_tuples(trees) -> dict[str, tuple[str, ...]]:
    """The names bound at module level (in any of `trees`) to a tuple, list or set of kind names only
    (`GAE_KINDS = ("gae", "returns")`): a membership test against one is a comparison with those names."""
    out: dict[str, tuple[str, ...]] = {}
    for tree in trees:
        for node in tree.body:
            value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
            if not isinstance(value, (ast.Tuple, ast.List, ast.Set)) or not value.elts:
                continue
            if not all(isinstance(e, ast.Constant) and e.value in KIND_NAMES for e in value.elts):
                continue
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(target, ast.Name):
                    out[target.id] = tuple(dict.fromkeys([*out.get(target.id, ()), *(e.value for e in value.elts)]))
    return out


def _named_kinds(x: ast.AST, bound: dict[str, tuple[str, ...]]) -> list[str]:
    """The kind names a compared operand names: a constant, a literal tuple of them, or a name bound to one."""
    if isinstance(x, ast.Constant):
        return [x.value] if x.value in KIND_NAMES else []
    name = x.id if isinstance(x, ast.Name) else x.attr if isinstance(x, ast.Attribute) else None
    if name in bound:
        return list(bound[name])
    return [e.value for e in getattr(x, "elts", []) if isinstance(e, ast.Constant) and e.value in KIND_NAMES]


def figures() -> dict:
    mods = modules()
    trees = {name: ast.parse(path.read_text(encoding="utf-8")) for name, path in mods.items()}
    bound = kind_tuples(trees.values())
    edges: dict[str, set[str]] = {m: set() for m in mods}
    local, private, dispatch, long_files, direction, frameworks = [], [], [], [], [], []
    folders = framework_folders()
    for name, path in mods.items():
        text = path.read_text(encoding="utf-8")
        n_lines = text.count("\n") + 1
        if n_lines > 800:
            long_files.append((str(path.relative_to(ROOT)), n_lines))
        tree = trees[name]
        is_pkg = path.name == "__init__.py"
        rel = str(path.relative_to(ROOT))
        if _framework_folder(rel, folders) is None:
            frameworks += [(rel, line, what) for line, what in framework_names(tree, name, is_pkg, folders)]
        funcs = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        in_func = {id(x) for f in funcs for x in ast.walk(f) if isinstance(x, (ast.Import, ast.ImportFrom, ast.Call))}
        for node in ast.walk(tree):
            targets = [t for t in _target(node, name, is_pkg) if t in mods]
            for t in targets:
                if t != name:
                    edges[name].add(t)
            why = next((w for t in targets if t != name for w in [against_direction(name, t)] if w), None)
            if why:
                direction.append((str(path.relative_to(ROOT)), node.lineno, why))
            if targets and id(node) in in_func:
                local.append((str(path.relative_to(ROOT)), node.lineno))
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("maskfuzz"):
                for a in node.names:
                    if a.name.startswith("_") and not a.name.startswith("__"):
                        private.append((str(path.relative_to(ROOT)), node.lineno, f"{node.module}.{a.name}"))
            if isinstance(node, ast.Compare):
                names = [node.left, *node.comparators]
                mentions_kind = any(
                    (isinstance(x, ast.Name) and x.id == "kind") or (isinstance(x, ast.Attribute) and x.attr == "kind")
                    for x in names
                )
                named = [n for x in names for n in _named_kinds(x, bound)]
                own = own_kinds(str(path.relative_to(ROOT)))
                if mentions_kind and named and not all(n in own for n in named):
                    dispatch.append((str(path.relative_to(ROOT)), node.lineno))
    cycles = _cycles(edges)
    return {
        "modules": len(mods),
        "import_cycles": len(cycles),
        "cycles": cycles,
        "function_local_imports": len(local),
        "private_imports": len(private),
        "private": [f"{f}:{line} {n}" for f, line, n in private],
        "files_over_800_lines": len(long_files),
        "long_files": [f"{f} ({n})" for f, n in long_files],
        "kind_string_dispatch": len(dispatch),
        "dispatch": [f"{f}:{line}" for f, line in dispatch],
        "against_direction": len(direction),
        "direction": [f"{f}:{line} {why}" for f, line, why in direction],
        "framework_names_outside_their_folder": len(frameworks),
        "framework_names": [f"{f}:{line} {what}" for f, line, what in frameworks],
        # per file, for tests/test_layout.py (line numbers move with every edit; files do not)
        "by_file": {
            "function_local_imports": _count(f for f, _ in local if not f.startswith(CLI_LAYER)),
            "kind_string_dispatch": _count(f for f, _ in dispatch),
            "private_imports": _count(f for f, _, _ in private),
            "against_direction": _count(f for f, _, _ in direction),
            "framework_names": _count(f for f, _, _ in frameworks),
        },
        "long_file_lines": dict(long_files),
    }


def _count(files) -> dict[str, int]:
    out: dict[str, int] = {}
    for f in files:
        out[f] = out.get(f, 0) + 1
    return dict(sorted(out.items()))


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in edges:
        if v not in index:
            visit(v)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    f = figures()
    if args.json:
        print(json.dumps(f, indent=1))
        return 0
    print(
        f"{f['modules']} modules: {f['import_cycles']} import cycle(s), {f['function_local_imports']} function-local "
        f"maskfuzz imports, {f['private_imports']} private cross-module imports, {f['files_over_800_lines']} files "
        f"over 800 lines, {f['kind_string_dispatch']} string comparisons of a kind, {f['against_direction']} "
        f"import(s) against the direction, {f['framework_names_outside_their_folder']} framework name(s) outside "
        "their folder"
    )
    for c in f["cycles"]:
        print(f"  cycle ({len(c)}): {', '.join(c)}")
    for line in f["long_files"]:
        print(f"  long: {line}")
    for line in f["direction"]:
        print(f"  direction: {line}")
    for line in f["framework_names"]:
        print(f"  framework: {line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

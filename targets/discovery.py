"""Variants a framework registers by name, read from its code at the pin (no import), as entries of their kind.

A framework opts in with a module of its folder, `targets/<framework>/discover.py`, that gives

    PREFIXES: dict[str, str]                 # entry prefix -> kind, e.g. {"policy-loss": "policy-loss"}
    def discover(root: Path) -> list[Variant]

and a worker-side `targets/<framework>/calls_discovered.py` whose `load(root, entry)` runs the variant named
by `entry` (`<prefix>:<name>`) through the framework's own registry. A discovered entry has no float64
reference (`reference=False`): it is judged against the universal invariants of its kind only, and whether
the variant is registered at a pin is decided by the code there (absent: a skip with the reason), so a
variant added upstream is fuzzed the night it lands, without a change to maskfuzz.
"""

from __future__ import annotations

import ast
import importlib
import warnings
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from maskfuzz.oracles.kinds import spec
from maskfuzz.targets.adapters.selection import BATCH_OPS, ORDER_OPS

DISCOVER, CALLS = "discover", "calls_discovered"
# the spec fields a framework's call recipe may set for a discovered entry (never `reference`: invariants only)
RECIPE_FIELDS = ("variant", "contract", "masked_zero", "masked_zero_why", "documented_errors", "domain", "pipeline",
                 "pipeline_by_pin", "not_promised")  # fmt: skip
_ROOT = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Variant:
    """One variant a framework registers: `name` under `registry` (the decorator or table it came from), the
    function `function` at `file`:`line` of the checkout; `callable` False (with `reason`) when it cannot be
    called outside its trainer; `covered_by` the hand-written entry that already calls it (with a reference)."""

    framework: str
    kind: str
    prefix: str  # the entry prefix: the entry is `<prefix>:<name>`
    name: str
    registry: str
    file: str
    line: int
    function: str
    callable: bool = True
    reason: str = ""
    covered_by: str | None = None

    @property
    def entry(self) -> str:
        return f"{self.prefix}:{self.name}"

    @property
    def citation(self) -> str:
        return f"{self.file}:{self.line}"

    def to_json(self) -> dict:
        return {
            "entry": self.entry,
            "kind": self.kind,
            "name": self.name,
            "registry": self.registry,
            "at": self.citation,
            "function": self.function,
            "callable": self.callable,
            "reason": self.reason,
            "covered_by": self.covered_by,
            "judged": "reference" if self.covered_by else "invariants only",
        }


def module_of(target_id: str) -> ModuleType | None:
    """The framework's discover module (`targets/<id>/discover.py`), or None when it has none."""
    folder = target_id.replace("-", "_")
    if not (_ROOT / folder / f"{DISCOVER}.py").is_file():
        return None
    return importlib.import_module(f"maskfuzz.targets.{folder}.{DISCOVER}")


def _kind_of_entry(target_id: str, entry: str) -> str | None:
    prefix, colon, name = entry.partition(":")
    mod = module_of(target_id) if colon and name else None
    return None if mod is None else mod.PREFIXES.get(prefix)


def is_discovered(target_id: str, entry: str | None) -> bool:
    """Whether `entry` names a discovered variant of the target (`<prefix>:<name>` with a known prefix)."""
    return bool(entry) and _kind_of_entry(target_id, entry) is not None


def calls_module(target_id: str, entry: str | None) -> str | None:
    """The worker module that runs a discovered `entry`, or None when it is not one."""
    if not is_discovered(target_id, entry):
        return None
    return f"maskfuzz.targets.{target_id.replace('-', '_')}.{CALLS}"


def overrides(target_id: str, entry: str | None) -> dict | None:
    """The spec fields of a discovered `entry` (None when it is not one): its kind, no reference (invariants only),
    no option or promise; no variant, pipeline domain or documented error of its own unless the framework's call
    recipe for it sets them (`RECIPE_FIELDS`), with the invariants its design does not promise (`not_promised`)."""
    kind = _kind_of_entry(target_id, entry) if entry else None
    if kind is None:
        return None
    # a framework's call recipe for the variant (`recipe(entry) -> dict` in its discover module): what its calls
    # need declared (dtypes, the adapter's documented refusals, masked outputs) and what its design does not promise
    recipe = getattr(module_of(target_id), "recipe", None)
    own = recipe(entry) if recipe is not None else None
    unknown = set(own or {}) - set(RECIPE_FIELDS)
    if unknown:
        raise ValueError(
            f"{target_id}:{entry}: a call recipe cannot set {sorted(unknown)} ({', '.join(RECIPE_FIELDS)})"
        )
    return dict(
        kind=kind,
        variant={},
        reference=False,
        masked_zero=True,
        masked_zero_why="",
        whitening=None,
        documented_errors=(),
        domain=spec(kind).domain,  # the kind's widest (`returns`: no critic)
        pipeline=None,  # not researched: every finding is reach: api
        pipeline_by_pin={},
        truncation=None,
        options=(),
        promises=(),
        score_map=(),
        twin_of=None,
        not_promised=(),
    ) | (own or {})


def discover(target_id: str, root: Path) -> list[Variant]:
    """Every variant the framework registers in the checkout at `root` ([] when it has no discover module)."""
    mod = module_of(target_id)
    return [] if mod is None else list(mod.discover(Path(root)))


def entries(variants: list[Variant]) -> list[str]:
    """The entries to fuzz: every discovered variant a hand-written entry does not already call (those not
    callable outside their trainer included: each is a skip that says why, never silently left out)."""
    return [v.entry for v in variants if v.covered_by is None]


def changes(previous: list[str], now: list[str]) -> dict[str, list[str]]:
    """The variants that appeared and disappeared between two nights (entry names)."""
    return {"appeared": sorted(set(now) - set(previous)), "disappeared": sorted(set(previous) - set(now))}


# --- AST helpers a framework's discover module uses -------------------------------------------------------------


@dataclass(frozen=True)
class Registration:
    """A `@decorator(arg)` on a top-level def: the decorator's argument as source text (`key`, a string
    literal's value unquoted), the def's name and parameters, and where the decorator is."""

    decorator: str
    key: str
    literal: bool  # the key is readable: a string literal, or a member of a string enum of the package (`enum`)
    function: str
    params: tuple[str, ...]
    file: str
    line: int
    # `torch.<op>` calls in the body that make the output depend on a draw or on row order (`ORDER_OPS`), with lines
    order_ops: tuple[str, ...] = ()
    # the parameters without a default (positional or keyword; *args / **kwargs not counted)
    required: tuple[str, ...] = ()
    # the enum member the key was written as (`PolicyLossType.REGULAR`), "" for a string literal
    enum: str = ""
    # calls of `BATCH_OPS` in the body (a statistic over the whole batch), as "masked_whiten at FILE:LINE"
    batch_ops: tuple[str, ...] = ()


def order_ops(node: ast.AST, file: str) -> tuple[str, ...]:
    """`torch.<op>` / `x.<op>` calls of `ORDER_OPS` inside `node`, as "torch.randperm at FILE:LINE"."""
    found = []
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute) and sub.func.attr in ORDER_OPS:
            found.append(f"torch.{sub.func.attr} at {file}:{sub.lineno}")
    return tuple(found)


def batch_ops(node: ast.AST, file: str) -> tuple[str, ...]:
    """Calls of `BATCH_OPS` (by name or attribute) directly inside `node`, as "masked_whiten at FILE:LINE"."""
    found = []
    for sub in ast.walk(node):
        if not isinstance(sub, ast.Call):
            continue
        func = sub.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        if name in BATCH_OPS:
            found.append(f"{name} at {file}:{sub.lineno}")
    return tuple(found)


_ENUM_BASES = ("Enum", "StrEnum", "str")


def enum_members(trees: list[ast.Module]) -> dict[str, str]:
    """`Class.MEMBER` -> its string value, for every top-level class of `trees` deriving from an enum (`class
    PolicyLossType(StrEnum)`, `class AdvantageEstimator(str, Enum)`) whose members are string literals."""
    out: dict[str, str] = {}
    for tree in trees:
        for node in tree.body:
            if not isinstance(node, ast.ClassDef):
                continue
            bases = {b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases}
            if not bases & set(_ENUM_BASES) or not bases - {"str"}:
                continue
            for item in node.body:
                if (
                    isinstance(item, ast.Assign)
                    and len(item.targets) == 1
                    and isinstance(item.targets[0], ast.Name)
                    and isinstance(item.value, ast.Constant)
                    and isinstance(item.value.value, str)
                ):
                    out[f"{node.name}.{item.targets[0].id}"] = item.value.value
    return out


def _required(args: ast.arguments) -> tuple[str, ...]:
    positional = [*args.posonlyargs, *args.args]
    first_default = len(positional) - len(args.defaults)
    out = [a.arg for i, a in enumerate(positional) if i < first_default]
    out += [a.arg for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is None]
    return tuple(out)


def _parsed(base: Path, package: str) -> list[tuple[Path, ast.Module]]:
    out = []
    for path in sorted((base / package).rglob("*.py")):
        try:
            with warnings.catch_warnings():  # upstream's invalid escapes in docstrings are not ours to report
                warnings.simplefilter("ignore")
                out.append((path, ast.parse(path.read_text(encoding="utf-8", errors="replace"))))
        except SyntaxError:
            continue
    return out


def registrations(root: Path, package: str, decorators: tuple[str, ...]) -> list[Registration]:
    """Every top-level def under `root/package` decorated with a call of one of `decorators` (by name or
    attribute: `@register(x)`, `@mod.register(x)`), in file and line order; a def under several such decorators
    (SkyRL's `ppo_policy_loss` is "regular" and "dual_clip") gives one registration each. The key is a string
    literal, or a member of a string enum defined in the package (`@register_policy_loss(PolicyLossType.GSPO)`,
    resolved to "gspo" by `enum_members`); anything else stays an unread expression (`literal` False). Files that
    do not parse are skipped (a half-done refactor upstream is not a variant)."""
    out = []
    base = Path(root)
    parsed = _parsed(base, package)
    members = enum_members([tree for _, tree in parsed])
    for path, tree in parsed:
        for node in tree.body:
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for deco in node.decorator_list:
                if not isinstance(deco, ast.Call) or not deco.args:
                    continue
                func = deco.func
                name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
                if name not in decorators:
                    continue
                arg = deco.args[0]
                text = ast.unparse(arg)
                literal = isinstance(arg, ast.Constant) and isinstance(arg.value, str)
                enum = "" if literal or text not in members else text
                key = arg.value if literal else members.get(text, text)
                args = node.args
                params = tuple(a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs))
                rel = str(path.relative_to(base))
                out.append(
                    Registration(
                        name,
                        key,
                        literal or bool(enum),
                        node.name,
                        params,
                        rel,
                        deco.lineno,
                        order_ops(node, rel),
                        required=_required(args),
                        enum=enum,
                        batch_ops=batch_ops(node, rel),
                    )
                )
    return out


# --- config choices: variants a framework switches by a config field rather than a registry ---------------------


def parse_file(path: Path) -> ast.Module | None:
    """`path` parsed (None when it is absent or does not parse: a half-done refactor upstream is not a variant)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return ast.parse(Path(path).read_text(encoding="utf-8", errors="replace"))
    except (OSError, SyntaxError):
        return None


def _strings(node: ast.AST | None) -> list[tuple[str, int]]:
    """The string literals of a list / tuple / set display (or of `Literal[...]`'s subscript), with their lines."""
    if isinstance(node, ast.Subscript):
        node = node.slice
    elts = node.elts if isinstance(node, (ast.List, ast.Tuple, ast.Set)) else [node] if node is not None else []
    return [(e.value, e.lineno) for e in elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]


def argparse_choices(tree: ast.Module, flags: tuple[str, ...]) -> list[tuple[str, int]]:
    """The `choices=[...]` of every `add_argument(<flag>, ...)` call of `tree` whose first argument is one of
    `flags`: each choice with the line it is written on (the first such call; [] when there is none)."""
    for node in ast.walk(tree):
        func = node.func if isinstance(node, ast.Call) else None
        if not (isinstance(func, ast.Attribute) and func.attr == "add_argument"):
            continue
        first = node.args[0] if node.args else None
        if not (isinstance(first, ast.Constant) and first.value in flags):
            continue
        for kw in node.keywords:
            if kw.arg == "choices":
                return _strings(kw.value)
    return []


def literal_field(tree: ast.Module, cls: str, name: str) -> tuple[list[tuple[str, int]], int]:
    """The `Literal["a", "b", ...]` values of the annotated field `name` of class `cls` in `tree` (each with its
    line), and the field's line; ([], 0) when the class or field is absent or not annotated with a Literal."""
    for node in ast.walk(tree):
        if not (isinstance(node, ast.ClassDef) and node.name == cls):
            continue
        for item in node.body:
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name) and item.target.id == name:
                ann = item.annotation
                head = getattr(ann, "value", None)
                if isinstance(ann, ast.Subscript) and getattr(head, "id", getattr(head, "attr", "")) == "Literal":
                    return _strings(ann), item.lineno
                return [], item.lineno
    return [], 0


def field_choices(tree: ast.Module, cls: str, name: str) -> list[tuple[str | None, int]]:
    """The `metadata={"choices": [...]}` of the dataclass field `name = field(...)` of class `cls` in `tree`, each
    with its line (a `None` choice kept as None: YAML null); [] when the class, field or choices are absent."""
    for node in ast.walk(tree):
        if not (isinstance(node, ast.ClassDef) and node.name == cls):
            continue
        for item in node.body:
            if not (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name) and item.target.id == name):
                continue
            call = item.value if isinstance(item.value, ast.Call) else None
            for kw in call.keywords if call is not None else ():
                if kw.arg == "metadata" and isinstance(kw.value, ast.Dict):
                    for key, value in zip(kw.value.keys, kw.value.values):
                        if isinstance(key, ast.Constant) and key.value == "choices" and hasattr(value, "elts"):
                            return [
                                (e.value, e.lineno)
                                for e in value.elts
                                if isinstance(e, ast.Constant) and (e.value is None or isinstance(e.value, str))
                            ]
    return []

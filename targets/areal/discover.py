"""AReaL's advantage options, read from its config dataclasses at the pin by AST (no import).

AReaL's advantage is GAE (`PPOActorConfig.discount`, `gae_lambda`); what a config switches is the normalisation and
the KL estimator: `NormConfig.mean_level` and `std_level` (1.0.4 areal/api/cli_args.py:46-63, each
`metadata={"choices": ["batch", "group", None]}`; v0.3.4 :24-41), used as `PPOActorConfig.reward_norm` (the scores,
GRPO's group normalisation) and `adv_norm` (the advantages), both switched in `class Normalization`
(areal/utils/data.py:1378-1597 at 1.0.4: `if self.mean_level == "batch": ... elif ... "group"`), and
`PPOActorConfig.kl_estimator` (`"choices": ["k1", "k2", "k3"]`, KLEstimator in areal/utils/data.py). Every choice is
a variant: `reward-norm:reward_norm.<field>=<choice>`, `adv-norm:adv_norm.<field>=<choice>` (None written "none", as
the options write YAML null) and `kl:<choice>`, at the line the choice is written. A choice a hand-written entry
runs with a float64 reference is `COVERED`: `grpo` runs reward_norm at group / group (std_level "none" is its option
`actor.reward_norm.std_level`), `adv-norm` runs adv_norm at NormConfig's defaults batch / batch, `kl-<k>` each KL
estimator. The others have a call recipe (`recipes.py`: the choice set, the other level at the value of the use's
hand-written entry) and are fuzzed invariants only, group-isolation not promised where a level is "batch"; a choice
without one would be listed, not callable, with the reason ("no call recipe for this estimator yet" and the branch
of Normalization that reads the choice), never left out."""

from __future__ import annotations

import ast
from pathlib import Path

from maskfuzz.targets.areal.recipes import LEVELS
from maskfuzz.targets.areal.recipes import recipe as recipe_of
from maskfuzz.targets.discovery import Variant, field_choices, parse_file

# entry prefix -> kind (of the choices without a hand-written entry)
PREFIXES = {"reward-norm": "group-advantage", "adv-norm": "normalization", "kl": "kl"}
CONFIG, DISPATCH = "areal/api/cli_args.py", "areal/utils/data.py"
NORM_FIELDS = ("mean_level", "std_level")
# prefix -> (the PPOActorConfig field that holds the NormConfig, {choice: hand-written entry})
NORM_USES = {
    "reward-norm": ("reward_norm", {"mean_level=group": "grpo", "std_level=group": "grpo", "std_level=none": "grpo"}),
    "adv-norm": ("adv_norm", {"mean_level=batch": "adv-norm", "std_level=batch": "adv-norm"}),
}
COVERED_KL = {k: f"kl-{k}" for k in ("k1", "k2", "k3")}


def _class(tree: ast.Module | None, name: str) -> ast.ClassDef | None:
    for node in tree.body if tree is not None else ():
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    return None


def _level_branches(cls: ast.ClassDef | None) -> dict[tuple[str, str], int]:
    """(field, choice) -> the first line in `cls` that tests `<x>.<field> == "<choice>"` (or `in [...]`)."""
    out: dict[tuple[str, str], int] = {}
    for node in ast.walk(cls) if cls is not None else ():
        if not (isinstance(node, ast.Compare) and isinstance(node.left, ast.Attribute)):
            continue
        if (
            node.left.attr not in NORM_FIELDS
            or len(node.comparators) != 1
            or not isinstance(node.ops[0], (ast.Eq, ast.In))
        ):
            continue  # `not in {...}` is the validation, not a branch
        right = node.comparators[0]
        for e in right.elts if isinstance(right, (ast.List, ast.Tuple, ast.Set)) else [right]:
            if isinstance(e, ast.Constant) and isinstance(e.value, str):
                key = (node.left.attr, e.value)
                out[key] = min(out.get(key, node.lineno), node.lineno)
    return out


def recipe(entry: str) -> dict | None:
    """The spec fields of a discovered entry's call recipe (`targets.discovery.overrides`); None without one."""
    prefix, _, name = entry.partition(":")
    return recipe_of(name) if prefix in NORM_USES else None


def _variant(prefix: str, name: str, line: int, registry: str, function: str, covered: str | None, at: str):
    runs = covered is not None or (prefix in NORM_USES and name in LEVELS)
    reason = f"call recipe, invariants only: {at}" if runs and not covered else ""
    reason = reason if runs else f"no call recipe for this estimator yet: {at}"
    return Variant(
        framework="areal",
        kind=PREFIXES[prefix],
        prefix=prefix,
        name=name,
        registry=registry,
        file=CONFIG,
        line=line,
        function=function,
        callable=runs,
        reason=reason,
        covered_by=covered,
    )


def discover(root: Path) -> list[Variant]:
    """Every NormConfig level choice, once per use (reward_norm, adv_norm), then every kl_estimator choice."""
    root = Path(root)
    config = parse_file(root / CONFIG)
    data = parse_file(root / DISPATCH)
    norm = _class(data, "Normalization")
    branches = _level_branches(norm)
    norm_at = f"{DISPATCH}:{norm.lineno} (class Normalization)" if norm else f"{DISPATCH} (no class Normalization)"
    out = []
    if config is None:
        return out
    for prefix, (use, covered) in NORM_USES.items():
        for field in NORM_FIELDS:
            for choice, line in field_choices(config, "NormConfig", field):
                value = "none" if choice is None else choice
                name = f"{use}.{field}={value}"  # the use named: the listing shows names without their prefix
                at = f"{DISPATCH}:{branches[field, value]}" if (field, value) in branches else norm_at
                registry = f"PPOActorConfig.{use}: NormConfig.{field} choices"
                out.append(_variant(prefix, name, line, registry, "Normalization", covered.get(f"{field}={value}"), at))
    kl = _class(data, "KLEstimator")
    kl_at = f"{DISPATCH}:{kl.lineno} (class KLEstimator)" if kl else f"{DISPATCH} (no class KLEstimator)"
    for choice, line in field_choices(config, "PPOActorConfig", "kl_estimator"):
        if choice is not None:
            registry = "PPOActorConfig.kl_estimator choices"
            out.append(_variant("kl", choice, line, registry, "KLEstimator", COVERED_KL.get(choice), kl_at))
    return out

"""OpenRLHF's advantage estimators, read from the choices of its CLI flag at the pin by AST (no import).

OpenRLHF has no registry: the estimator is the argparse option `--algo.advantage.estimator` (0.11.2
openrlhf/cli/train_ppo_ray.py:514-521, `choices=[...]` at :517; `--advantage_estimator` at 0.6.3 :352-357) and
`compute_advantages_and_returns` switches on it (0.11.2 openrlhf/trainer/ppo_utils/experience_maker.py:268-278 the
group baselines, :292-319 GAE or the cumulative returns, :325-337 the batch whitening). Every choice is a variant
`adv:<choice>` at the line it is written; the choices a hand-written entry already runs through the same
`compute_advantages_and_returns` (`calls_kinds.load_estimator`, with a float64 reference) are `COVERED`. The others
are listed, not callable, with the reason, never left out: "no call recipe for this estimator yet" with the
dispatcher's file:line, and what in the dispatcher makes an invariants-only judge misread it, read from the code:
a whitening over the whole rollout batch (the `estimator in [...]` block that ends in `rsqrt`), or a
baseline that is the mean over the whole batch (`rewards.mean()` with no dim): the group-advantage kind's
group-isolation is then not a promise of the estimator. A choice with a call recipe (`recipes.py`:
reinforce_baseline, flash_reinforce) is callable, invariants only, group-isolation not promised; the worker runs it
only where that whole-batch statistic is still in the dispatcher (`batch_designs`).
"""

from __future__ import annotations

import ast
from pathlib import Path

from maskfuzz.targets.discovery import Variant, argparse_choices, parse_file
from maskfuzz.targets.openrlhf.recipes import NOT_PROMISED
from maskfuzz.targets.openrlhf.recipes import recipe as recipe_of

PREFIXES = {"adv": "group-advantage"}  # entry prefix -> kind (of the choices without a hand-written entry)
CLI = "openrlhf/cli/train_ppo_ray.py"
DISPATCH = "openrlhf/trainer/ppo_utils/experience_maker.py"
FLAGS = ("--algo.advantage.estimator", "--advantage_estimator")
REGISTRY = "argparse choices of --algo.advantage.estimator (--advantage_estimator at older pins)"
# choice -> (the hand-written entry that runs it through compute_advantages_and_returns, that entry's kind)
COVERED = {
    "gae": ("default", "gae"),
    "reinforce": ("reinforce", "returns"),
    "rloo": ("rloo", "group-advantage"),
    "group_norm": ("group_norm", "group-advantage"),
    "dr_grpo": ("dr_grpo", "group-advantage"),
}


def _is_estimator(node: ast.AST) -> bool:
    """`self.advantage_estimator`, `args.advantage_estimator` or `args.algo.advantage.estimator`."""
    if not isinstance(node, ast.Attribute):
        return False
    return node.attr == "advantage_estimator" or (
        node.attr == "estimator" and isinstance(node.value, ast.Attribute) and node.value.attr == "advantage"
    )


def _tested(test: ast.AST) -> list[str]:
    """The strings an `estimator == "x"` / `estimator in ["x", ...]` test compares the estimator with."""
    if not (isinstance(test, ast.Compare) and _is_estimator(test.left) and len(test.comparators) == 1):
        return []
    right = test.comparators[0]
    elts = right.elts if isinstance(right, (ast.List, ast.Tuple, ast.Set)) else [right]
    return [e.value for e in elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]


def _calls(body: list[ast.stmt], attr: str, bare: bool = False) -> int:
    """The line of the first `<x>.<attr>(...)` call in `body` (with no argument when `bare`), 0 when none."""
    for stmt in body:
        for sub in ast.walk(stmt):
            if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute) and sub.func.attr == attr:
                if not bare or not (sub.args or sub.keywords):
                    return sub.lineno
    return 0


def _dispatch(tree: ast.Module | None) -> tuple[int, dict[str, str]]:
    """The line of the first `if` on the estimator in the dispatcher file (0 when none), and per estimator what an
    invariants-only judge would misread in its branch."""
    first, why = 0, {}
    if tree is None:
        return first, why
    for node in ast.walk(tree):
        if not isinstance(node, ast.If) or not _tested(node.test):
            continue
        first = node.lineno if not first else min(first, node.lineno)
        if line := _calls(node.body, "rsqrt"):  # the block that whitens over every experience of the batch
            for name in _tested(node.test):
                why.setdefault(name, f"whitens over the whole rollout batch ({DISPATCH}:{node.lineno}, rsqrt at "
                               f":{line})")  # fmt: skip
        elif line := _calls(node.body, "mean", bare=True):
            for name in _tested(node.test):
                why.setdefault(name, f"its baseline is the mean over the whole rollout batch ({DISPATCH}:{line})")
    return first, why


def batch_designs(root: Path) -> dict[str, str]:
    """Per estimator, the whole-batch statistic of its branch in the dispatcher under `root` (with file:line)."""
    return _dispatch(parse_file(Path(root) / DISPATCH))[1]


def recipe(entry: str) -> dict | None:
    """The spec fields of a discovered entry's call recipe (`targets.discovery.overrides`); None without one."""
    prefix, _, name = entry.partition(":")
    return recipe_of(name) if prefix == "adv" else None


def discover(root: Path) -> list[Variant]:
    """Every choice of the estimator flag under `root`, in the order written; [] at a pin without the flag."""
    root = Path(root)
    cli = parse_file(root / CLI)
    choices = argparse_choices(cli, FLAGS) if cli is not None else []
    first, why = _dispatch(parse_file(root / DISPATCH))
    at = f"{DISPATCH}:{first}" if first else f"{DISPATCH} (no `if` on the estimator found)"
    out = []
    for name, line in choices:
        entry, kind = COVERED.get(name, (None, PREFIXES["adv"]))
        reason = ""
        runs = entry is not None or (name in NOT_PROMISED and name in why)
        if entry is None and runs:  # its recipe's not-promise rests on the whole-batch statistic found here
            reason = f"call recipe, invariants only: {at}; not promised: group-isolation: {why[name]}"
        elif entry is None:
            reason = f"no call recipe for this estimator yet: {at}"
            if name in NOT_PROMISED:
                reason = f"its call recipe rests on a whole-batch statistic the dispatcher lacks here: {at}"
            elif name in why:
                reason += f"; {why[name]}: group-isolation is not its promise, and the invariants-only judge cannot "
                reason += "set it aside"
        out.append(
            Variant(
                framework="openrlhf",
                kind=kind,
                prefix="adv",
                name=name,
                registry=REGISTRY,
                file=CLI,
                line=line,
                function="compute_advantages_and_returns",
                callable=runs,
                reason=reason,
                covered_by=entry,
            )
        )
    return out

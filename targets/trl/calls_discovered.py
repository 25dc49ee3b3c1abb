"""The worker side of TRL's discovered loss types: `agg:<loss_type>` run through GRPOTrainer's own chain.

TRL selects its loss aggregation by `GRPOConfig.loss_type` in the `if self.loss_type ...: loss = ...` chain of
`GRPOTrainer._compute_loss` (1.16.0 trl/trainer/grpo_trainer.py:3152-3184). `chain_values(root)` reads every value
that chain tests (each with its file:line, by AST, no trl import) and `branch_problem` says why a value's branch
cannot be run with what the loss-aggregation kind holds: the [B, T] per-token loss, the mask, `mode`,
`inputs["num_items_in_batch"]` and the `self` attributes `load_aggregate` sets (`AGG_SELF_SET`; `self.args` only
`steps_per_generation`), or why judging it against the invariants would misread it (a random draw or a rank,
`ORDER_OPS`). `load(root, entry)` runs a value that has no problem through `calls_aggregate.load_aggregate`, the
same compiled chain, once per micro-batch, as the hand-written `agg-*` entries run theirs. discover.py imports
this module (a reproducer copies this module, never discovery).
"""

from __future__ import annotations

import ast
import dataclasses
import warnings
from dataclasses import dataclass
from pathlib import Path

from maskfuzz.targets.adapters.base import Loaded, NotPresent
from maskfuzz.targets.adapters.extract import attribute_reads, block_free_names, find_class, find_method, stored_names
from maskfuzz.targets.adapters.selection import ORDER_OPS
from maskfuzz.targets.trl.calls_aggregate import AGG_BOUND, AGG_SELF_SET, load_aggregate, reads_loss_type
from maskfuzz.targets.trl.calls_common import LOSS_METHODS, TRAINERS
from maskfuzz.targets.trl.calls_policy import POLICY_SELF_SET, load_policy

LEVEL = "importance_sampling_level"
# what the importance-weight branch may read for `load_policy` to run it: the log-ratio and the mask it builds
LEVEL_READS = ("log_ratio", "mask", "completion_mask", "per_token_logps", "old_per_token_logps", "torch")
ARGS_SET = ("steps_per_generation",)  # what `load_aggregate` sets on self.args
INPUT_KEYS = ("num_items_in_batch",)  # what it puts in `inputs`


@dataclass(frozen=True)
class ChainValue:
    """One loss_type value the chain tests: its branch (the statements run when it is selected), where the value is
    written, and the class and method the chain is in."""

    name: str
    file: str
    line: int
    function: str
    body: tuple[ast.stmt, ...]


def _parse(path: Path) -> ast.Module | None:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return ast.parse(path.read_text(encoding="utf-8", errors="replace"))
    except (OSError, SyntaxError):
        return None


def _chain(cls: ast.ClassDef) -> tuple[str, ast.If] | None:
    """The loss method's `if self.loss_type ...` statement whose branches assign `loss` (the aggregation chain,
    not the per-token chain that assigns per_token_loss), as `calls_aggregate.aggregation_block` finds it."""
    for name in LOSS_METHODS:
        method = find_method(cls, name)
        for st in method.body if method is not None else []:
            if isinstance(st, ast.If) and reads_loss_type(st.test) and any("loss" in stored_names(b) for b in st.body):
                return name, st
    return None


def _level_chain(cls: ast.ClassDef) -> tuple[str, ast.If] | None:
    """The loss method's `if self.importance_sampling_level == ...` statement assigning log_importance_weights
    (1.16.0 grpo_trainer.py:3083-3092)."""
    for name in LOSS_METHODS:
        method = find_method(cls, name)
        for st in method.body if method is not None else []:
            if (
                isinstance(st, ast.If)
                and _reads(st.test, LEVEL)
                and any("log_importance_weights" in stored_names(b) for b in st.body)
            ):
                return name, st
    return None


def _reads(node: ast.AST, attr: str) -> bool:
    return any(isinstance(n, ast.Attribute) and n.attr == attr for n in ast.walk(node))


def chain_values(root: Path, attr: str = "loss_type") -> list[ChainValue]:
    """Every string the aggregation chain compares `self.loss_type` with (`attr` "importance_sampling_level": the
    importance-weight chain), in branch order (a value tested twice counts where it is first tested: the branch that
    runs); [] when the pin has no GRPOTrainer or no such chain."""
    rel, cls_name = TRAINERS["grpo"]
    path = Path(root) / rel
    tree = _parse(path) if path.is_file() else None
    cls = find_class(tree, cls_name) if tree is not None else None
    found = (_chain(cls) if attr == "loss_type" else _level_chain(cls)) if cls is not None else None
    if found is None:
        return []
    method, node = found
    out: dict[str, ChainValue] = {}
    while isinstance(node, ast.If) and _reads(node.test, attr):
        for sub in ast.walk(node.test):
            if isinstance(sub, ast.Constant) and isinstance(sub.value, str) and sub.value not in out:
                out[sub.value] = ChainValue(sub.value, rel, sub.lineno, f"{cls_name}.{method}", tuple(node.body))
        node = node.orelse[0] if len(node.orelse) == 1 else None
    return list(out.values())


def branch_problem(value: ChainValue) -> str:
    """Why the branch of `value` cannot be judged as a loss aggregation ("" when it can)."""
    body = list(value.body)
    at = f"{value.file}:{value.line}"
    free = sorted(block_free_names(body) - set(AGG_BOUND) - {"torch"})
    self_reads = sorted(set().union(*(attribute_reads(s, "self") for s in body)) - set(AGG_SELF_SET))
    args_reads = sorted(set().union(*(attribute_reads(s, "self.args") for s in body)) - set(ARGS_SET))
    keys = sorted(
        {
            sub.slice.value
            for s in body
            for sub in ast.walk(s)
            if isinstance(sub, ast.Subscript)
            and isinstance(sub.value, ast.Name)
            and sub.value.id == "inputs"
            and isinstance(sub.slice, ast.Constant)
        }
        - set(INPUT_KEYS)
    )
    needs = [*free, *(f"self.{a}" for a in self_reads), *(f"self.args.{a}" for a in args_reads)]
    needs += [f"inputs[{k!r}]" for k in keys]
    if needs:
        return (
            f"the branch of loss_type {value.name!r} at {at} reads {', '.join(needs)}: inputs beyond what the "
            "loss-aggregation kind holds (the per-token loss, the mask, num_items_in_batch and the trainer's "
            "accumulation settings)"
        )
    order = [
        f"torch.{sub.func.attr} at {value.file}:{sub.lineno}"
        for s in body
        for sub in ast.walk(s)
        if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute) and sub.func.attr in ORDER_OPS
    ]
    if order:
        return (
            f"selects tokens by a random draw or a rank over the batch ({', '.join(order)}): permutation, "
            "pad-invariance and determinism are not its promises, and the invariants-only judge has no seeded twin"
        )
    return ""


def level_problem(value: ChainValue) -> str:
    """Why the importance-weight branch of `value` cannot be run by `load_policy` ("" when it can)."""
    body = list(value.body)
    needs = sorted(block_free_names(body) - set(LEVEL_READS))
    self_reads = set().union(*(attribute_reads(s, "self") for s in body)) - set(POLICY_SELF_SET)
    needs += [f"self.{a}" for a in sorted(self_reads)]
    if needs:
        return (
            f"the branch of importance_sampling_level {value.name!r} at {value.file}:{value.line} reads "
            f"{', '.join(needs)}: inputs beyond what the policy-loss entry binds"
        )
    return ""


def load_level(root: Path, name: str) -> Loaded:
    """`policy-is:<level>`: `load_policy` (GRPOTrainer._compute_loss at GRPOConfig's defaults, loss_type "dapo")
    with `self.importance_sampling_level = <level>`."""
    values = {v.name: v for v in chain_values(Path(root), LEVEL)}
    if name not in values:
        known = ", ".join(values) or "none"
        raise NotPresent(f"no importance_sampling_level {name!r} in GRPOTrainer's loss at this pin (tested: {known})")
    value = values[name]
    why = level_problem(value)
    if why:
        raise NotPresent(f"{value.file}:{value.line}: not callable as a policy loss: {why}")
    loaded = load_policy(Path(root), "policy-grpo", level=name)
    note = (
        f"discovered: importance_sampling_level {name!r} tested at {value.file}:{value.line} ({value.function}); "
        "invariants only (no float64 reference)"
    )
    return dataclasses.replace(loaded, notes=[note, *loaded.notes])


def load(root: Path, entry: str) -> Loaded:
    """`agg:<loss_type>` (`policy-is:<level>`: `load_level`): the pin's aggregation chain with `self.loss_type =
    <loss_type>`, as `load_aggregate` runs the hand-written entries; a value the chain does not test at this pin, or
    whose branch needs more than the kind holds, is a skip with the reason."""
    prefix, _, name = entry.partition(":")
    if prefix == "policy-is" and name:
        return load_level(Path(root), name)
    if prefix != "agg" or not name:
        raise NotPresent(f"trl: {entry!r} is not a discovered loss type (agg:<loss_type>)")
    values = {v.name: v for v in chain_values(Path(root))}
    if name not in values:
        known = ", ".join(values) or "none"
        raise NotPresent(f"no loss_type {name!r} in GRPOTrainer's aggregation chain at this pin (tested: {known})")
    value = values[name]
    why = branch_problem(value)
    if why:
        raise NotPresent(f"{value.file}:{value.line}: not callable as a loss aggregation: {why}")
    loaded = load_aggregate(Path(root), entry, loss_type=name)
    note = (
        f"discovered: loss_type {name!r} tested at {value.file}:{value.line} ({value.function}); invariants only "
        "(no float64 reference)"
    )
    return dataclasses.replace(loaded, notes=[note, *loaded.notes])

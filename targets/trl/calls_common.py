"""What TRL's kind calls share: the trainers they parse (`TRAINERS`), the checks of what a block reads
(`check_reads`, `logps_block`), running a block that binds `self` (`run_block`), and GRPOTrainer's
`mask_truncated_completions` statement (`truncation_block` / `truncation_mask`: the [N, T] completion mask it
leaves), each compiled from the source at the pin."""

from __future__ import annotations

import ast
import types
from pathlib import Path

import torch

from maskfuzz.oracles.case import Case
from maskfuzz.targets.adapters.extract import (
    Block,
    BlockNotFound,
    SourceTree,
    attribute_reads,
    block_free_names,
    find_method,
    stored_names,
)
from maskfuzz.targets.trl.calls import EOS_ID, PAD_ID

PACKAGES = ("trl",)
METHOD = "_generate_and_score_completions"
LOSS_METHODS = ("_compute_loss", "compute_loss")  # GRPOTrainer's loss method, by pin
TRAINERS = {  # estimator -> (file, class)
    "grpo": ("trl/trainer/grpo_trainer.py", "GRPOTrainer"),
    "rloo": ("trl/trainer/rloo_trainer.py", "RLOOTrainer"),
}


class OptionNotAtPin(ValueError):
    """An option value the framework does not have at this pin (scale_rewards="batch" where it is a bool)."""



def check_reads(block: list, where: str, what: str, base: str, allowed) -> None:
    """Raise BlockNotFound when the statements of `block` read attributes of `base` ("self", "self.args",
    "args") that the adapter does not set (`allowed`): a block that grew a new input cannot be run as it is."""
    unknown = sorted(set().union(*(attribute_reads(s, base) for s in block)) - set(allowed))
    if unknown:
        reads = ", ".join(f"{base}.{a}" for a in unknown)
        raise BlockNotFound(f"trl: {what} at {where} reads {reads}, which the adapter does not set")


def logps_block(tree: SourceTree, path: Path, block: list, where: str, what: str, bound) -> Block:
    """`block` compiled with the names of `bound` it reads as inputs; it must read per_token_logps and no
    local name the adapter does not bind (torch comes from the module)."""
    free = block_free_names(block)
    extra = sorted(free - set(bound) - {"torch"})
    if extra or "per_token_logps" not in free:
        raise BlockNotFound(f"trl: {what} at {where} reads {extra or 'no per_token_logps'}; the adapter binds {bound}")
    return tree.block(path, block, [n for n in bound if n in free])


def run_block(block: Block, values: dict) -> dict:
    """`Block.run` for a block that reads `self` (a keyword `Block.run` itself takes): the compiled statements in
    a fresh namespace of their module globals plus `values`."""
    missing = set(block.bound) - set(values)
    if missing:
        raise TypeError(f"the block needs {sorted(missing)} bound")
    ns = dict(block.globals)
    ns.update(values)
    exec(block.code, ns)  # noqa: S102 - the framework's own source, the code under test
    return ns



TRUNC_BOUND = ("self", "completion_ids", "completion_ids_list", "completion_mask", "tool_mask", "device")


def truncation_block(tree: SourceTree, path: Path, rel: str, cls: ast.ClassDef) -> Block:
    """`if self.mask_truncated_completions: ...` of GRPOTrainer._generate_and_score_completions (with the `is_eos =
    ...` line it reads at old pins), compiled from the source."""
    method = find_method(cls, METHOD)
    stmts = method.body if method is not None else []
    at = next(
        (
            i
            for i, st in enumerate(stmts)
            if isinstance(st, ast.If) and "mask_truncated_completions" in attribute_reads(st.test, "self")
        ),
        None,
    )
    if at is None:
        raise BlockNotFound(f"trl: {rel}::{METHOD} has no `if self.mask_truncated_completions:` statement")
    block = [stmts[at]]
    if "is_eos" in block_free_names(block):
        eos = next((st for st in stmts[:at] if "is_eos" in stored_names(st)), None)
        if eos is None:
            raise BlockNotFound(f"trl: {rel}:{stmts[at].lineno}: the statement reads is_eos, assigned nowhere before")
        block = [eos, *block]
    free = block_free_names(block)
    if "completion_mask" not in free:
        raise BlockNotFound(f"trl: {rel}:{stmts[at].lineno}: mask_truncated_completions does not read completion_mask")
    return tree.block(path, block, [n for n in TRUNC_BOUND if n in free])


def truncation_mask(block: Block, case: Case, on: bool) -> torch.Tensor | None:
    """The case's loss mask after TRL's mask_truncated_completions statement (None when the option is off): TRL
    reads the completion ids, the last token of an ended completion its EOS, of a cut one an ordinary token."""
    if not on:
        return None
    live = case.trainable
    b_rows, t_len = live.shape
    ended = ~case.truncated_rows()
    ids = torch.where(live, 1, PAD_ID).long()
    lists = []
    for b in range(b_rows):
        where = live[b].nonzero().flatten().tolist()
        if not where:  # no completion token: TRL's completion would be empty, the padded row reads as ended
            lists.append([PAD_ID])
            continue
        if ended[b]:
            ids[b, where[-1]] = EOS_ID
        lists.append(ids[b, : where[-1] + 1].tolist())
    tok = types.SimpleNamespace(eos_token_id=EOS_ID, pad_token_id=PAD_ID)
    me = types.SimpleNamespace(
        mask_truncated_completions=True,
        eos_token_ids=[EOS_ID],
        _tokenizer=tok,
        processing_class=tok,
        tokenizer=tok,
    )
    values = dict(
        self=me,
        completion_ids=ids,
        completion_ids_list=lists,
        completion_mask=live.int(),
        tool_mask=None,
        device="cpu",
    )
    out = run_block(block, {name: values[name] for name in block.bound})
    return out["completion_mask"].bool()

"""TRL's loss-aggregation entries as the worker calls them (`agg-grpo`, `agg-bnpo`, `agg-dr_grpo`, `agg-dapo`):
the `if self.loss_type ...` chain of GRPOTrainer._compute_loss run from the source at the pin once per micro-batch of
a step (`loss_step.run_step`), on the case's [B, T] per-token loss and mask. See `calls_kinds.py`'s docstring."""

from __future__ import annotations

import ast
import copy
import types
from pathlib import Path

import torch

from maskfuzz.oracles.case import Case
from maskfuzz.targets.adapters.base import Loaded, NotPresent
from maskfuzz.targets.adapters.extract import (
    Block,
    BlockNotFound,
    SourceTree,
    attribute_reads,
    block_free_names,
    find_class,
    find_method,
    stored_names,
)
from maskfuzz.targets.adapters.loss_step import run_step
from maskfuzz.targets.trl.calls import EOS_ID, PAD_ID
from maskfuzz.targets.trl.calls_common import (
    LOSS_METHODS,
    PACKAGES,
    TRAINERS,
    check_reads,
    run_block,
    truncation_block,
    truncation_mask,
)

# entry -> TRL's loss_type
AGGREGATE = {"agg-grpo": "grpo", "agg-bnpo": "bnpo", "agg-dr_grpo": "dr_grpo", "agg-dapo": "dapo"}
MAX_COMPLETION_LENGTH = 512  # GRPOConfig.max_completion_length default (1.16.0 grpo_config.py:494-497)
AGG_SELF_SET = (
    "loss_type",
    "current_gradient_accumulation_steps",
    "max_completion_length",
    "accelerator",
    "args",
    "model",
)
AGG_BOUND = ("per_token_loss", "mask", "completion_mask", "inputs", "self", "mode")


def reads_loss_type(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Attribute) and n.attr == "loss_type" for n in ast.walk(node))


def selected_only(chain: ast.If, loss_type: str) -> ast.If:
    """A copy of the chain whose branches other than the first one testing `loss_type` (and the final else) only
    raise: TRL's own tests still select, the selected branch is TRL's, and a branch that reads what the adapter does
    not bind (a new loss type's own inputs) no longer stops the others from running."""
    out = copy.deepcopy(chain)
    node, kept = out, False
    while True:
        tests = {n.value for n in ast.walk(node.test) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
        if kept or loss_type not in tests:
            node.body = [_not_selected(node.body[0])]
        kept = kept or loss_type in tests
        if len(node.orelse) == 1 and isinstance(node.orelse[0], ast.If) and reads_loss_type(node.orelse[0].test):
            node = node.orelse[0]
            continue
        if node.orelse:
            node.orelse = [_not_selected(node.orelse[0])]
        return out


def _not_selected(at: ast.stmt) -> ast.stmt:
    stub = ast.parse('raise RuntimeError("maskfuzz: a loss_type branch the entry does not select")').body[0]
    return ast.fix_missing_locations(ast.copy_location(stub, at))


def aggregation_block(
    tree: SourceTree, path: Path, rel: str, cls: ast.ClassDef, loss_type: str | None = None
) -> tuple[Block, list[ast.stmt], str]:
    """The `if self.loss_type ...` chain of the loss method whose branches assign `loss` (not the per-token chain,
    which assigns per_token_loss), with the `mode = ...` line right before it when there is one; with `loss_type`
    (a discovered entry) the other branches compiled as stubs (`selected_only`), the statements returned as TRL's."""
    for name in LOSS_METHODS:
        method = find_method(cls, name)
        if method is None:
            continue
        stmts = method.body
        for i, st in enumerate(stmts):
            if not (isinstance(st, ast.If) and reads_loss_type(st.test)):
                continue
            if not any("loss" in stored_names(b) for b in st.body):
                continue
            start = i - 1 if i > 0 and "mode" in stored_names(stmts[i - 1]) else i
            block = stmts[start : i + 1]
            source = block
            if loss_type is not None:
                block = [*block[:-1], selected_only(st, loss_type)]
            free = block_free_names(block)
            where = f"{rel}:{block[0].lineno}"
            check_reads(block, where, "the loss block", "self", AGG_SELF_SET)
            check_reads(block, where, "the loss block", "args", ("steps_per_generation",))
            if "per_token_loss" not in free or not ({"mask", "completion_mask"} & free):
                raise BlockNotFound(f"trl: {rel}:{block[0].lineno}: the block does not read per_token_loss and a mask")
            bound = [n for n in AGG_BOUND if n in free]
            return tree.block(path, block, bound), source, name
    raise BlockNotFound(
        f"trl: {rel}: no `if self.loss_type ...` chain assigning loss in {' / '.join(LOSS_METHODS)}; the adapter "
        "must learn the new shape before this pin can be tested"
    )


def trainer_scales_for_ga(cls: ast.ClassDef) -> bool:
    """Whether transformers' Trainer.training_step divides the returned loss by the accumulation steps: it does
    unless GRPOTrainer sets `loss_is_scaled_for_ga = True` (1.16.0) or passes `compute_loss_func=...` to
    Trainer.__init__ (1.12.0, f2cd577), both there to disable that scaling."""
    for node in ast.walk(cls):
        if isinstance(node, ast.Assign) and "loss_is_scaled_for_ga" in {
            t.id for t in node.targets if isinstance(t, ast.Name)
        }:
            if isinstance(node.value, ast.Constant) and node.value.value is True:
                return False
        if isinstance(node, ast.keyword) and node.arg == "compute_loss_func":
            return False
    return True


def load_aggregate(root: Path, entry: str, loss_type: str | None = None) -> Loaded:
    """TRL's normalisation block over one optimizer step, as GRPOTrainer and transformers' Trainer run it, with
    `self.loss_type` the entry's (`AGGREGATE`) or `loss_type` (a value discovered in the chain, calls_discovered.py).

    Each micro-batch runs the block with `self.current_gradient_accumulation_steps` = the configured accumulation
    steps (`Step.per_rank`, every rank runs that many), `self.accelerator.num_processes` = the simulated ranks,
    `self.args.steps_per_generation` = the accumulation steps (its default, grpo_config.py:528-531, 1098-1099 at
    1.16.0), `self.max_completion_length` = 512 (its default), `self.model.training = True` (mode "train") and
    `inputs["num_items_in_batch"]` = the trainable tokens of the whole step on all ranks, int64: TRL's
    `num_items_in_batch = self.accelerator.gather(loss_mask.sum()).sum()` over the generation batch
    (grpo_trainer.py:2497-2498 at 1.16.0), which with steps_per_generation = accumulation steps is the step.
    The block's `loss` is what is backpropagated: at 1.16.0 `loss_is_scaled_for_ga = True` (grpo_trainer.py:285;
    trainer/base_trainer.py:73-78 turns it into `compute_loss_func` on transformers < 5.19), at 1.12.0 and
    f2cd577 `compute_loss_func="non-None value to disable scaling"` (grpo_trainer.py:958-963 / 945-950): the
    Trainer does not divide again, the block divides by current_gradient_accumulation_steps itself. At 0.19.1
    neither is set (`self.model_accepts_loss_kwargs = False`, grpo_trainer.py:699-702) and the block has no
    normaliser, so the Trainer's training_step divides by gradient_accumulation_steps: the adapter does that.
    Ranks are averaged by the driver as DDP averages gradients. None of the modes but dapo gets a global
    normaliser: grpo / bnpo / dr_grpo are judged per micro-batch, as TRL runs them."""
    selected = loss_type  # a discovered value: only its branch compiled as TRL's (`selected_only`)
    loss_type = loss_type or AGGREGATE[entry]
    rel, cls_name = TRAINERS["grpo"]
    tree = SourceTree(Path(root), PACKAGES)
    path = Path(root, rel)
    cls = find_class(tree.file(path).tree, cls_name) if path.is_file() else None
    if cls is None:
        raise NotPresent(f"no {rel}::{cls_name} at this pin (GRPO arrived in 0.14)")
    rel = tree.rel(path)
    block, stmts, method = aggregation_block(tree, path, rel, cls, selected)
    strings = {n.value for s in stmts for n in ast.walk(s) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    if loss_type not in strings:
        raise NotPresent(f"{rel}:{stmts[0].lineno}: {cls_name}.{method} has no loss_type {loss_type!r} at this pin")
    block_scales = "current_gradient_accumulation_steps" in set().union(*(attribute_reads(s, "self") for s in stmts))
    trainer_scales = trainer_scales_for_ga(cls)
    if block_scales == trainer_scales:
        raise BlockNotFound(
            f"trl: {rel}:{stmts[0].lineno}: the block {'divides' if block_scales else 'does not divide'} by the "
            f"accumulation steps and the Trainer {'does' if trainer_scales else 'does not'} either; the adapter does "
            "not know this combination"
        )
    mask_name = "mask" if "mask" in block.bound else "completion_mask"
    trunc = truncation_block(tree, path, rel, cls)

    def micro(rows, loss, mask, step):
        gas = step.per_rank
        me = types.SimpleNamespace(
            loss_type=loss_type,
            current_gradient_accumulation_steps=gas,
            max_completion_length=MAX_COMPLETION_LENGTH,
            accelerator=types.SimpleNamespace(num_processes=step.ranks),
            args=types.SimpleNamespace(steps_per_generation=gas),
            model=types.SimpleNamespace(training=True),
        )
        values = {
            "per_token_loss": loss,
            mask_name: step.case.trainable[rows.cpu()].to(device=loss.device, dtype=torch.long),
            "inputs": {"num_items_in_batch": torch.tensor(step.tokens, dtype=torch.long, device=loss.device)},
            "self": me,
            "mode": "train",
        }
        out = run_block(block, {name: values[name] for name in block.bound})["loss"]
        return out / gas if trainer_scales else out

    def run(case: Case, device: str) -> tuple[torch.Tensor, torch.Tensor]:
        masked = truncation_mask(trunc, case, case.options.get("mask_truncated_completions", False))
        return run_step(case if masked is None else case.replace(trainable=masked), device, micro)

    notes = [
        f"block {rel}:{block.first_line}-{block.last_line} of {cls_name}.{method} run from source, loss_type="
        f"{loss_type!r}, once per micro-batch",
        f"{mask_name} int64; current_gradient_accumulation_steps = steps_per_generation = the step's accumulation "
        f"steps; num_processes = ranks; max_completion_length = {MAX_COMPLETION_LENGTH}; num_items_in_batch = the "
        "step's trainable tokens (all ranks)",
        "loss / accumulation steps by the Trainer's training_step"
        if trainer_scales
        else "the Trainer does not rescale (the block divides by the accumulation steps itself)",
        f"mask_truncated_completions from the case's options through {rel}:{trunc.first_line}-{trunc.last_line} "
        f"(TRL's own statement) on completion ids 1, pad {PAD_ID}, eos {EOS_ID} last in every row not truncated; "
        "the step (and num_items_in_batch) then sees the mask it leaves",
    ]
    return Loaded(run, f"{rel}::{cls_name}.{method} (lines {block.first_line}-{block.last_line})", notes)

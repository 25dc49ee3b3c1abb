"""TRL entries beyond GAE: the group advantages of GRPOTrainer and RLOOTrainer, run from the source at the pin.

TRL has no advantage function: the GRPO and RLOO advantages are inline in
`GRPOTrainer._generate_and_score_completions` (`trl/trainer/grpo_trainer.py`, 1.12.0:2778-2832) and
`RLOOTrainer._generate_and_score_completions` (`trl/trainer/rloo_trainer.py`, 1.12.0:1557-1595). As the PPO
entry does (`targets/adapters/trl.py::_gae_block`), the adapter parses the trainer file, takes the sibling
statements of that method from the one after `rewards_per_func = self._calculate_rewards(...)` through the last
assignment of `advantages` before `process_slice = ...` (TRL's own `num_generations` line, the unscorable mask,
the weighted sum, the KL penalty of RLOO, the group statistics, `nan_to_num`), compiles them with their helpers
(`nanstd`) from the source at the pin (`extract.SourceTree`, no trl import), and runs only that block with its
own variable names bound:

* `rewards_per_func` [N, 1]: the case's scores in the case's dtype (one reward function, weight 1 as
  `self.reward_weights = torch.ones(len(reward_funcs), dtype=torch.float32)`).
* `self`: a namespace with only the attributes the block reads (checked: an unknown one is `BlockNotFound`):
  `num_generations` (= the group size), `multi_objective_aggregation = "sum_then_normalize"` (the default),
  `reward_weights`, `reward_funcs`, `scale_rewards` (the entry's, or the case's option on `grpo`), and for RLOO
  `beta` (0.05, TRL's default) and `reward_clip_range` (None) or the case's options, `normalize_advantages = False`.
* Options and cut rows (`Case.options`, `Case.truncated_rows()`): `mask_truncated_completions` runs TRL's own
  `if self.mask_truncated_completions:` statement of the same method (`truncation_block`) on completion ids built
  from the case (1, pad 0, EOS 2 as the last token of every row not cut), and the mask it leaves is RLOO's
  `completion_mask` here and the loss mask of the aggregation entries (before the step is split, so
  `num_items_in_batch` counts what TRL counts).
* `mode = "train"`, `device`; RLOO: `old_per_token_logps = 0`, `ref_per_token_logps = token_rewards` and
  `completion_mask = trainable` (int, as TRL builds it), so RLOO's `per_token_kl = old - ref` is
  `-token_rewards` and `rewards - beta * (per_token_kl * completion_mask).sum(-1)` adds the trained token rewards
  (0 in group-advantage cases, poison under the mask); `gather` (accelerate's all-gather) is the identity of a
  one-process run.

Groups. TRL has no group ids: `RepeatSampler` puts each prompt's `num_generations` completions next to each
other and the block reshapes the rewards `view(-1, num_generations)`. Effective groups of unequal size exist in
TRL through unscorable completions (every reward function returned None: a NaN row that the nan-aware statistics
skip and `nan_to_num` zeroes). The adapter lays the case's groups out contiguously with `num_generations` = the
largest group and fills the short groups with unscorable (NaN) rows, TRL's own mechanism, then reads the real
rows back. A pin without the unscorable handling (0.19.1: plain `.mean()` / `.std()`) takes equal groups only:
unequal ones are a documented `GroupShapeError`.

The output is one advantage per completion ([N]); the loss multiplies it into every token and masks there
(`advantages.unsqueeze(1)` with `(per_token_loss * mask)`), so the adapter broadcasts it to every position of
the row.

Loss aggregation (`agg-grpo`, `agg-bnpo`, `agg-dr_grpo`, `agg-dapo`, the `loss_type` values): TRL has no
aggregation function either; the normalisation is the `if self.loss_type ...: loss = ...` chain of
`GRPOTrainer._compute_loss` (1.16.0:3152-3184; 0.19.1:1404-1411), preceded where present by its
`mode = "train" if self.model.training else "eval"` line. `load_aggregate` takes exactly those statements from the
source at the pin, as above, binds `per_token_loss` (the case's loss of the micro-batch), the mask under the name
the block reads (`mask` / `completion_mask`, int64 as TRL pads it), `inputs["num_items_in_batch"]` and a namespace
`self`, and runs them once per micro-batch of the step (`loss_step.run_step`); see its docstring for the scaling.

KL (`kl-grpo`, `kl-ppo`): GRPO's `if self.beta != 0.0: ... per_token_kl = ...` statement of `_compute_loss` with the
`old_per_token_logps` / `log_ratio` ... `coef_1` lines it reads (`load_kl_grpo`), and the PPO trainer's padding
masks, INVALID_LOGPROB fills and `logr` / `kl` lines of `train()` (`load_kl_ppo`); see their docstrings.

Policy loss (`policy-grpo`): `GRPOTrainer._compute_loss` from `advantages = inputs["advantages"]` through the
`loss_type` chain, at GRPOConfig's defaults (loss_type "dapo", epsilon 0.2, beta 0), per micro-batch
(`load_policy`).
"""

from __future__ import annotations

import ast
import types
from pathlib import Path

import torch

from maskfuzz.oracles.case import Case
from maskfuzz.targets.adapters.base import Loaded, NotPresent
from maskfuzz.targets.adapters.extract import (
    Block,
    BlockNotFound,
    SourceTree,
    assigned_names,
    attribute_reads,
    block_free_names,
    find_class,
    find_method,
    statement_lists,
    stored_names,
)
from maskfuzz.targets.adapters.trl import EOS_ID, PAD_ID  # completion ids: tokens 1, an ended row's last EOS

PACKAGES = ("trl",)
METHOD = "_generate_and_score_completions"
TRAINERS = {  # estimator -> (file, class)
    "grpo": ("trl/trainer/grpo_trainer.py", "GRPOTrainer"),
    "rloo": ("trl/trainer/rloo_trainer.py", "RLOOTrainer"),
}
# entry -> (estimator, scale_rewards); "batch" is a batch std around the group mean (std_level="batch")
ENTRIES = {
    "grpo": ("grpo", "group"),
    "dr-grpo": ("grpo", "none"),
    "grpo-batch": ("grpo", "batch"),
    "rloo": ("rloo", None),
}
# what the block may read from `self`; each is set by the adapter
SELF_SET = (
    "num_generations",
    "num_generations_eval",
    "multi_objective_aggregation",
    "reward_weights",
    "reward_funcs",
    "scale_rewards",
    "beta",
    "reward_clip_range",
    "normalize_advantages",
)
BOUND = (
    "rewards_per_func",
    "self",
    "device",
    "mode",
    "old_per_token_logps",
    "ref_per_token_logps",
    "completion_mask",
    "gather",
)


class GroupShapeError(ValueError):
    """The case's groups cannot be expressed as TRL's contiguous groups of `num_generations` rows."""


class OptionNotAtPin(ValueError):
    """An option value the framework does not have at this pin (scale_rewards="batch" where it is a bool)."""


RLOO_BETA = 0.05  # RLOOConfig.beta default (1.16.0 rloo_config.py:502)


def advantage_block(tree: SourceTree, path: Path, rel: str, method: ast.FunctionDef) -> tuple[Block, list[ast.stmt]]:
    """The sibling statements of `method` after `rewards_per_func = ...` through the last assignment of
    `advantages` before `process_slice = ...`, compiled with their helpers from the source."""
    stmts = method.body
    start = next((i for i, s in enumerate(stmts) if "rewards_per_func" in stored_names(s)), None)
    stop = next((i for i, s in enumerate(stmts) if "process_slice" in stored_names(s)), None)
    if start is None or stop is None or stop <= start:
        raise BlockNotFound(
            f"trl: {rel}::{method.name}: no `rewards_per_func = ...` followed by `process_slice = ...` at the top "
            "level of the method; the adapter must learn the new shape before this pin can be tested"
        )
    end = next((i for i in range(stop - 1, start, -1) if "advantages" in assigned_names(stmts[i])), None)
    if end is None:
        raise BlockNotFound(f"trl: {rel}:{stmts[start].lineno}: no assignment of advantages before process_slice")
    block = stmts[start + 1 : end + 1]
    free = block_free_names(block)
    if "rewards_per_func" not in free:
        raise BlockNotFound(f"trl: {rel}:{block[0].lineno}: the block does not read rewards_per_func")
    check_reads(block, f"{rel}:{block[0].lineno}", "the block", "self", SELF_SET)
    bound = [n for n in BOUND if n in free]
    return tree.block(path, block, bound), block


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


def layout(group: torch.Tensor | None, b_rows: int, fill: bool) -> tuple[list[int], int, int]:
    """(position of each case row in TRL's contiguous layout, num_generations, number of prompts).

    Groups in order of first appearance, each its rows in order, padded to the largest group with filler rows
    when `fill`; GroupShapeError when not `fill` and the groups differ in size."""
    ids = group.tolist() if group is not None else [0] * b_rows
    order = list(dict.fromkeys(ids))
    sizes = {g: ids.count(g) for g in order}
    n = max(sizes.values())
    if not fill and len(set(sizes.values())) != 1:
        raise GroupShapeError(
            f"GroupShapeError: groups of sizes {sorted(set(sizes.values()))}: at this pin TRL reshapes the rewards "
            "view(-1, num_generations) with no unscorable (NaN) rows to shorten a group; every prompt has "
            "num_generations completions"
        )
    if not fill and n < 2:
        raise GroupShapeError(
            "GroupShapeError: groups of one: at this pin GRPOConfig rejects num_generations < 2 (0.19.1 "
            "trl/trainer/grpo_config.py:556) and no unscorable row can shorten a group"
        )
    seen = dict.fromkeys(order, 0)
    pos = []
    for g in ids:
        pos.append(order.index(g) * n + seen[g])
        seen[g] += 1
    return pos, n, len(order)


def load_group(root: Path, entry: str) -> Loaded:
    if entry not in ENTRIES:
        raise ValueError(f"trl has no group-advantage entry {entry!r}")
    estimator, scale = ENTRIES[entry]
    rel, cls_name = TRAINERS[estimator]
    tree = SourceTree(Path(root), PACKAGES)
    path = Path(root, rel)
    cls = find_class(tree.file(path).tree, cls_name) if path.is_file() else None
    method = find_method(cls, METHOD) if cls is not None else None
    if method is None:
        raise NotPresent(
            f"no {rel}::{cls_name}.{METHOD} at this pin (the {estimator.upper()} advantage block lives there; "
            + (
                "older RLOOTrainers are PPO-style, with no such block"
                if estimator == "rloo"
                else "GRPO arrived in 0.14"
            )
            + ")"
        )
    rel = tree.rel(path)
    block, stmts = advantage_block(tree, path, rel, method)
    trunc = truncation_block(tree, path, rel, cls)
    names = set().union(*(assigned_names(s) for s in stmts))
    nan_aware = "unscorable_mask" in names  # unscorable rows: NaN rewards the statistics skip
    strings = {n.value for s in stmts for n in ast.walk(s) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    bool_scale = estimator == "grpo" and not ({"group", "none"} & strings)  # scale_rewards was a bool (<= 0.19)
    if bool_scale and scale == "batch":
        raise NotPresent(f"{rel}:{stmts[0].lineno}: scale_rewards is a bool at this pin (no batch scaling)")

    def scale_of(case: Case) -> object:
        """TRL's scale_rewards for the case: the entry's, or the option's on the `grpo` entry; a bool at old pins."""
        value = case.options.get("scale_rewards", scale)
        if not bool_scale:
            return value
        if value == "batch":
            raise OptionNotAtPin(f"{rel}:{stmts[0].lineno}: scale_rewards is a bool at this pin, there is no 'batch'")
        return value == "group"

    scale_value = scale_of(Case.build(trainable=[[1]], dtype="float64")) if estimator == "grpo" else None
    if estimator == "rloo" and "gather" in block.bound and "per_token_kl" not in names:
        raise BlockNotFound(f"trl: {rel}:{stmts[0].lineno}: RLOO block gathers something other than the KL")

    def run(case: Case, device: str) -> tuple[torch.Tensor]:
        dt = case.torch_dtype
        b_rows, t_len = case.shape
        pos, n, k = layout(case.group, b_rows, nan_aware)
        idx = torch.tensor(pos, device=device)
        rows = k * n
        rpf = torch.full((rows, 1), float("nan"), dtype=dt, device=device)
        rpf[idx, 0] = case.score.to(device=device, dtype=dt)
        mask = torch.zeros((rows, t_len), dtype=torch.int32, device=device)
        # mask_truncated_completions: TRL's own statement clears a cut completion's completion_mask (the advantage
        # block of GRPO does not read it; RLOO's KL sum does)
        masked = truncation_mask(trunc, case, case.options.get("mask_truncated_completions", False))
        mask[idx] = (case.trainable if masked is None else masked).to(device=device, dtype=torch.int32)
        ref = torch.zeros((rows, t_len), dtype=dt, device=device)
        ref[idx] = case.token_rewards.to(device=device, dtype=dt)
        clip = case.options.get("reward_clip_range", "none")
        me = types.SimpleNamespace(
            num_generations=n,
            num_generations_eval=n,
            multi_objective_aggregation="sum_then_normalize",
            reward_weights=torch.ones(1, dtype=torch.float32),
            reward_funcs=[None],
            scale_rewards=scale_of(case) if estimator == "grpo" else None,
            beta=case.options.get("beta", RLOO_BETA),
            reward_clip_range=None if clip == "none" else (-clip, clip),  # "none": TRL's default None
            normalize_advantages=False,
        )
        values = dict(
            rewards_per_func=rpf,
            self=me,
            device=device,
            mode="train",
            old_per_token_logps=torch.zeros_like(ref),
            ref_per_token_logps=ref,
            completion_mask=mask,
            gather=lambda t: t,
        )
        out = run_block(block, {name: values[name] for name in block.bound})
        adv = out["advantages"][idx]
        return (adv[:, None].expand(b_rows, t_len),)

    notes = [
        f"block {rel}:{block.first_line}-{block.last_line} of {cls_name}.{METHOD} run from source "
        "(after rewards_per_func through the last advantages assignment before process_slice)",
        f"self: num_generations = the largest group, scale_rewards={scale_value!r} (or the case's option), "
        "multi_objective_aggregation='sum_then_normalize', one reward function of weight 1"
        + (
            f"; beta={RLOO_BETA} and reward_clip_range=None (or the case's options: c stands for (-c, c)), "
            "normalize_advantages=False"
            if estimator == "rloo"
            else ""
        ),
        (
            "groups laid out contiguously, short groups filled with unscorable (NaN) rows"
            if nan_aware
            else "groups laid out contiguously; unequal groups are a GroupShapeError at this pin"
        ),
        "the [N] advantages broadcast to every position of the row",
        f"mask_truncated_completions from the case's options through {rel}:{trunc.first_line}-{trunc.last_line} "
        "(TRL's own statement) on the completion mask",
        "helpers compiled from source: " + ", ".join(sorted(tree.provenance)),
    ]
    if estimator == "rloo":
        notes.append("old_per_token_logps = 0, ref_per_token_logps = token_rewards, completion_mask = trainable (int)")
    return Loaded(run, f"{rel}::{cls_name}.{METHOD} (lines {block.first_line}-{block.last_line})", notes)


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
LOSS_METHODS = ("_compute_loss", "compute_loss")


def _reads_loss_type(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Attribute) and n.attr == "loss_type" for n in ast.walk(node))


def aggregation_block(tree: SourceTree, path: Path, rel: str, cls: ast.ClassDef) -> tuple[Block, list[ast.stmt], str]:
    """The `if self.loss_type ...` chain of the loss method whose branches assign `loss` (not the per-token chain,
    which assigns per_token_loss), with the `mode = ...` line right before it when there is one."""
    for name in LOSS_METHODS:
        method = find_method(cls, name)
        if method is None:
            continue
        stmts = method.body
        for i, st in enumerate(stmts):
            if not (isinstance(st, ast.If) and _reads_loss_type(st.test)):
                continue
            if not any("loss" in stored_names(b) for b in st.body):
                continue
            start = i - 1 if i > 0 and "mode" in stored_names(stmts[i - 1]) else i
            block = stmts[start : i + 1]
            free = block_free_names(block)
            where = f"{rel}:{block[0].lineno}"
            check_reads(block, where, "the loss block", "self", AGG_SELF_SET)
            check_reads(block, where, "the loss block", "args", ("steps_per_generation",))
            if "per_token_loss" not in free or not ({"mask", "completion_mask"} & free):
                raise BlockNotFound(f"trl: {rel}:{block[0].lineno}: the block does not read per_token_loss and a mask")
            bound = [n for n in AGG_BOUND if n in free]
            return tree.block(path, block, bound), block, name
    raise BlockNotFound(
        f"trl: {rel}: no `if self.loss_type ...` chain assigning loss in {' / '.join(LOSS_METHODS)}; the adapter "
        "must learn the new shape before this pin can be tested"
    )


def _trainer_scales_for_ga(cls: ast.ClassDef) -> bool:
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


def load_aggregate(root: Path, entry: str) -> Loaded:
    """TRL's normalisation block over one optimizer step, as GRPOTrainer and transformers' Trainer run it.

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
    from maskfuzz.targets.adapters.loss_step import run_step

    loss_type = AGGREGATE[entry]
    rel, cls_name = TRAINERS["grpo"]
    tree = SourceTree(Path(root), PACKAGES)
    path = Path(root, rel)
    cls = find_class(tree.file(path).tree, cls_name) if path.is_file() else None
    if cls is None:
        raise NotPresent(f"no {rel}::{cls_name} at this pin (GRPO arrived in 0.14)")
    rel = tree.rel(path)
    block, stmts, method = aggregation_block(tree, path, rel, cls)
    strings = {n.value for s in stmts for n in ast.walk(s) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    if loss_type not in strings:
        raise NotPresent(f"{rel}:{stmts[0].lineno}: {cls_name}.{method} has no loss_type {loss_type!r} at this pin")
    block_scales = "current_gradient_accumulation_steps" in set().union(*(attribute_reads(s, "self") for s in stmts))
    trainer_scales = _trainer_scales_for_ga(cls)
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


def load(root, entry: str) -> Loaded:
    """The entry of a kind beyond GAE (the worker loads it from here: targets.registry.adapter_for)."""
    if entry in AGGREGATE:
        return load_aggregate(Path(root), entry)
    if entry == "kl-grpo":
        return load_kl_grpo(Path(root))
    if entry == "kl-ppo":
        return load_kl_ppo(Path(root))
    if entry in POLICY:
        return load_policy(Path(root), entry)
    return load_group(Path(root), entry)


# ---- kl: GRPO's per-token KL to the reference (the `if self.beta != 0.0:` statement of GRPOTrainer._compute_loss)
KL_BETA = 0.04  # any non-zero beta: the block runs only when self.beta != 0.0 (GRPOConfig.beta defaults to 0.0)
KL_SELF_SET = ("beta", "args", "importance_sampling_level")
KL_ARGS_SET = ("use_bias_correction_kl",)
KL_BOUND = ("per_token_logps", "inputs", "mask", "self")
USE_BIAS_CORRECTION_KL = True  # GRPOConfig default at 1.16.0 / 1.12.0 (grpo_config.py:972-973 / 965-966)


def _reads_beta(node: ast.AST) -> bool:
    return "beta" in attribute_reads(node, "self")


def kl_grpo_block(tree: SourceTree, path: Path, rel: str, cls: ast.ClassDef) -> tuple[Block, list[ast.stmt], str]:
    """The `if self.beta != 0.0:` statement of the loss method that assigns per_token_kl, and, where it multiplies by
    the importance ratio `coef_1` (use_bias_correction_kl, >= 1.x), TRL's statements that build it: the
    `old_per_token_logps = ...` defaults and `log_ratio = ...` through `coef_1 = ...` (the off-policy mask between
    them computes a loss mask only and is left out)."""
    for name in LOSS_METHODS:
        method = find_method(cls, name)
        if method is None:
            continue
        stmts = method.body
        at = next(
            (
                i
                for i, st in enumerate(stmts)
                if isinstance(st, ast.If) and _reads_beta(st.test) and "per_token_kl" in assigned_names(st)
            ),
            None,
        )
        if at is None:
            continue
        block = [stmts[at]]
        if "coef_1" in block_free_names(block):
            start = next((i for i in range(at - 1, -1, -1) if "log_ratio" in stored_names(stmts[i])), None)
            if start is None or not any("coef_1" in stored_names(s) for s in stmts[start:at]):
                raise BlockNotFound(
                    f"trl: {rel}:{stmts[at].lineno}: the KL reads coef_1 but no `log_ratio = ...` ... `coef_1 = ...` "
                    "precedes it"
                )
            olds = [s for s in stmts[:start] if "old_per_token_logps" in stored_names(s)]
            block = [*olds, *stmts[start : at + 1]]
        where = f"{rel}:{block[0].lineno}"
        check_reads(block, where, "the KL block", "self", KL_SELF_SET)
        check_reads(block, where, "the KL block", "self.args", KL_ARGS_SET)
        return logps_block(tree, path, block, where, "the KL block", KL_BOUND), block, name
    raise BlockNotFound(
        f"trl: {rel}: no `if self.beta != 0.0:` statement assigning per_token_kl in {' / '.join(LOSS_METHODS)}; the "
        "adapter must learn the new shape before this pin can be tested"
    )


def load_kl_grpo(root: Path) -> Loaded:
    """GRPO's per-token k3 KL to the reference, as `GRPOTrainer._compute_loss` computes it (1.16.0
    grpo_trainer.py:3098-3106): `per_token_kl = exp(ref - logp) - (ref - logp) - 1`, times the importance ratio
    `coef_1` when `args.use_bias_correction_kl` (3104-3105), coef_1 = exp(log_ratio) per token or exp of its masked row
    mean (`importance_sampling_level`, 3083-3095), unclamped. Bound: `per_token_logps` = the case's logp, `inputs =
    {"ref_per_token_logps": ref_logp, "old_per_token_logps": old_logp}` (the num_iterations > 1 / vLLM path, read at
    3065; a case without old_logp leaves TRL's own default `old = per_token_logps.detach()`, 3066, so coef_1 = 1; at
    0.19.1, which has no coef_1, a case whose old_logp differs from logp at a trained token is OptionNotAtPin under
    the correction (the declared `ratio` of use_bias_correction_kl=True cannot hold there)), `mask` = trainable
    (int64, the completion_mask of 3027 without a tool mask), `self.beta` = 0.04, `self.importance_sampling_level` and
    `self.args.use_bias_correction_kl` from the case's options. The output is per_token_kl at every position: TRL
    masks it in the loss (`per_token_loss * mask`, 3153-3184) and in the metric (`global_masked_mean`, 3268)."""
    rel, cls_name = TRAINERS["grpo"]
    tree = SourceTree(Path(root), PACKAGES)
    path = Path(root, rel)
    cls = find_class(tree.file(path).tree, cls_name) if path.is_file() else None
    if cls is None:
        raise NotPresent(f"no {rel}::{cls_name} at this pin (GRPO arrived in 0.14)")
    rel = tree.rel(path)
    block, stmts, method = kl_grpo_block(tree, path, rel, cls)
    attrs = {n.attr for s in stmts for n in ast.walk(s) if isinstance(n, ast.Attribute)}
    reads_bias = "use_bias_correction_kl" in attrs
    reads_level = "importance_sampling_level" in set().union(*(attribute_reads(s, "self") for s in stmts))

    def run(case: Case, device: str) -> tuple[torch.Tensor]:
        dt = case.torch_dtype
        bias = case.options.get("use_bias_correction_kl", USE_BIAS_CORRECTION_KL)
        level = case.options.get("importance_sampling_level", "token")
        # a pin without coef_1 in the KL (0.19.1) computes the uncorrected KL: use_bias_correction_kl=False exactly,
        # True only where the ratio is 1 (old_logp absent or equal to logp at every trained token)
        if level != "token" and not reads_level:
            raise OptionNotAtPin(f"{rel}:{block.first_line}: no importance_sampling_level at this pin")
        off_policy = "old_logp" in case.extra and bool(
            (case.extra["old_logp"] != case.extra["logp"])[case.trainable].any()
        )
        if bias and off_policy and not reads_bias:
            raise OptionNotAtPin(
                f"{rel}:{block.first_line}: no use_bias_correction_kl at this pin: the KL has no importance ratio, "
                "so a case with old_logp != logp (a ratio != 1) cannot be run with the correction on"
            )
        logp = case.extra["logp"].to(device=device, dtype=dt)
        ref = case.extra["ref_logp"].to(device=device, dtype=dt)
        me = types.SimpleNamespace(
            beta=KL_BETA,
            importance_sampling_level=level,
            args=types.SimpleNamespace(use_bias_correction_kl=bias),
        )
        inputs = {"ref_per_token_logps": ref}
        if "old_logp" in case.extra:  # TRL's `inputs.get("old_per_token_logps")`: the real ratio, not 1
            inputs["old_per_token_logps"] = case.extra["old_logp"].to(device=device, dtype=dt)
        values = dict(
            per_token_logps=logp,
            inputs=inputs,
            mask=case.trainable.to(device=device, dtype=torch.long),
            self=me,
        )
        out = run_block(block, {name: values[name] for name in block.bound})
        return (out["per_token_kl"],)

    notes = [
        f"block {rel}:{block.first_line}-{block.last_line} of {cls_name}.{method} run from source"
        + (" (old_per_token_logps defaults, log_ratio through coef_1, the KL statement)" if reads_bias else ""),
        f"self.beta = {KL_BETA} (the block runs only for beta != 0); per_token_logps = logp, inputs = "
        "{'ref_per_token_logps': ref_logp, 'old_per_token_logps': old_logp} (without old_logp in the case, TRL's "
        "default old = logp.detach(), ratio 1)",
        "use_bias_correction_kl and importance_sampling_level from the case's options; mask = trainable (int64)",
        "output: per_token_kl at every position (TRL masks it in the loss)",
    ]
    return Loaded(run, f"{rel}::{cls_name}.{method} (lines {block.first_line}-{block.last_line})", notes)


# ---- kl: the PPO trainer's KL estimator (PPOTrainer.train(), `kl = -logr if args.kl_estimator == "k1" else ...`)
KL_PPO_BOUND = ("responses", "sequence_lengths", "logprobs", "ref_logprobs", "values", "args")


def kl_ppo_block(tree: SourceTree, path: Path, rel: str, train: ast.FunctionDef) -> Block:
    """The sibling statements of train() from `response_idxs = ...` (the padding masks and their INVALID_LOGPROB
    fills) through `kl = ...`."""
    for stmts in statement_lists(train):
        end = next((i for i, s in enumerate(stmts) if "kl" in stored_names(s)), None)
        if end is None:
            continue
        start = next(
            (i for i in range(end - 1, -1, -1) if {"response_idxs", "padding_mask"} & stored_names(stmts[i])), None
        )
        if start is None:
            continue
        while start > 0 and "response_idxs" in stored_names(stmts[start - 1]):
            start -= 1
        block = stmts[start : end + 1]
        free = block_free_names(block)
        names = set().union(*(assigned_names(s) for s in block))
        if not {"padding_mask", "logprobs", "ref_logprobs"} <= names:
            raise BlockNotFound(
                f"trl: {rel}:{block[0].lineno}-{block[-1].end_lineno}: the KL block does not fill logprobs / "
                "ref_logprobs under padding_mask"
            )
        unknown_args = sorted(set().union(*(attribute_reads(s, "args") for s in block)) - {"kl_estimator"})
        extra = sorted(free - set(KL_PPO_BOUND) - {"torch", "INVALID_LOGPROB"})
        if unknown_args or extra or "self" in free:
            raise BlockNotFound(
                f"trl: the KL block at {rel}:{block[0].lineno} reads args.{unknown_args} / {extra}; the adapter binds "
                f"{KL_PPO_BOUND} and args.kl_estimator"
            )
        return tree.block(path, block, [n for n in KL_PPO_BOUND if n in free])
    raise BlockNotFound(
        f"trl: {rel}::train has no `kl = ...` after the padding masks; the adapter must learn the new shape"
    )


def load_kl_ppo(root: Path) -> Loaded:
    """The PPO trainer's per-token KL (1.12.0 trl/experimental/ppo/ppo_trainer.py:763-774, 0.19.1
    trl/trainer/ppo_trainer.py:500-511, 0.11.4 trl/trainer/ppov2_trainer.py:407-416 k1 only): the padding masks,
    `logprobs` / `ref_logprobs` filled with INVALID_LOGPROB (1.0) at padding, `logr = ref - logp`, `kl = -logr` (k1)
    or `(logr.exp() - 1) - logr` (k3). The padding comes from TRL's own `sequence_length` line on response ids
    (1 at trained tokens, pad 0, EOS 2 on the last token of an ended row), as for the `train` entry; `values`
    (read by the `values = masked_fill(values, padding_mask_p1, 0)` statement inside the range, not by the KL) are
    zeros; `args.kl_estimator` is the case's option."""
    from maskfuzz.targets.adapters.trl import _sequence_length_block, _trainers, response_tokens

    tree = SourceTree(Path(root), PACKAGES)
    trainers = _trainers(tree)
    if not trainers:
        raise NotPresent("no PPO trainer at this pin (trl >= 1.13 ships none)")
    path, train, qual = trainers[0]
    rel = tree.rel(path)
    block = kl_ppo_block(tree, path, rel, train)
    seq = _sequence_length_block(tree, path, rel, train)
    has_estimator = "args" in block.bound  # 0.11.4: `kl = logprobs - ref_logprobs`, no estimator

    def run(case: Case, device: str) -> tuple[torch.Tensor]:
        dt = case.torch_dtype
        estimator = case.options.get("kl_estimator", "k1")
        if estimator != "k1" and not has_estimator:
            raise OptionNotAtPin(f"{rel}:{block.first_line}: no kl_estimator at this pin (k1 only)")
        tokens = response_tokens(case).to(device)
        tok = types.SimpleNamespace(pad_token_id=PAD_ID, eos_token_id=EOS_ID)
        seq_ns = seq.run(**{name: tokens if name == "postprocessed_response" else tok for name in seq.bound})
        logp = case.extra["logp"].to(device=device, dtype=dt)
        values = dict(
            responses=tokens,
            sequence_lengths=seq_ns["sequence_length"],
            logprobs=logp.clone(),
            ref_logprobs=case.extra["ref_logp"].to(device=device, dtype=dt).clone(),
            values=torch.zeros_like(logp),
            args=types.SimpleNamespace(kl_estimator=estimator),
        )
        return (run_block(block, {name: values[name] for name in block.bound})["kl"],)

    notes = [
        f"block {rel}:{block.first_line}-{block.last_line} of {qual} run from source (padding masks, INVALID_LOGPROB "
        "fills, logr, kl)",
        f"sequence_lengths from {rel}:{seq.first_line} on response ids 1, pad {PAD_ID}, eos {EOS_ID}",
        "args.kl_estimator from the case's options (k1 default); values zeros (not read by the KL)",
    ]
    return Loaded(run, f"{rel}::{qual} (lines {block.first_line}-{block.last_line})", notes)


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


# ---- policy-loss: GRPOTrainer._compute_loss from `advantages = inputs["advantages"]` through the loss_type chain
# entry -> TRL's loss_type at the pin's defaults (GRPOConfig.loss_type default "dapo": 1.16.0 grpo_config.py:801-802,
# 1.12.0 :794-795, git f2cd577 :791-792; "bnpo" at 0.19.1 :458-459, which has no "dapo": the entry skips there)
POLICY = {"policy-grpo": "dapo"}
EPSILON = 0.2  # GRPOConfig.epsilon default (1.16.0 grpo_config.py:693-695); epsilon_high None -> epsilon (trainer :946)
POLICY_SELF_SET = (
    "off_policy_mask_threshold",
    "importance_sampling_level",
    "beta",
    "loss_type",
    "epsilon_low",
    "epsilon_high",
    "use_vllm",
    "vllm_importance_sampling_correction",
    *AGG_SELF_SET,
)
# read only inside branches the default configuration does not take (off-policy masking, vespo): left unset, so a
# pin that starts calling them by default fails loudly instead of running a stand-in
POLICY_SELF_UNSET = ("get_off_policy_mask", "get_gamma_weights")
POLICY_ARGS_SET = ("delta", "steps_per_generation", "use_bias_correction_kl")
POLICY_ARGS_UNSET = (
    "sapo_temperature_pos",
    "sapo_temperature_neg",
    "vespo_k_pos",
    "vespo_lambda_pos",
    "vespo_k_neg",
    "vespo_lambda_neg",
)
POLICY_BOUND = ("per_token_logps", "inputs", "mask", "completion_mask", "entropy_mask", "self")


def policy_block(tree: SourceTree, path: Path, rel: str, cls: ast.ClassDef) -> tuple[Block, list[ast.stmt], str]:
    """The sibling statements of the loss method from `advantages = inputs["advantages"]` through the `if
    self.loss_type ...` chain that assigns `loss` (old_per_token_logps, log_ratio, coef_1, the KL, the per-token
    loss_type chain with coef_2 and the delta clip, the off-policy / entropy / vLLM / KL terms, `mode`, the
    aggregation)."""
    for name in LOSS_METHODS:
        method = find_method(cls, name)
        if method is None:
            continue
        stmts = method.body
        start = next((i for i, s in enumerate(stmts) if "advantages" in stored_names(s)), None)
        end = next(
            (
                i
                for i, st in enumerate(stmts)
                if isinstance(st, ast.If)
                and _reads_loss_type(st.test)
                and any("loss" in stored_names(b) for b in st.body)
            ),
            None,
        )
        if start is None or end is None or end <= start:
            continue
        block = stmts[start : end + 1]
        names = set().union(*(assigned_names(s) for s in block))
        if not {"coef_1", "per_token_loss", "loss"} <= names:
            raise BlockNotFound(f"trl: {rel}:{block[0].lineno}: the loss block assigns no coef_1 / per_token_loss")
        where = f"{rel}:{block[0].lineno}"
        check_reads(block, where, "the policy-loss block", "self", (*POLICY_SELF_SET, *POLICY_SELF_UNSET))
        check_reads(block, where, "the policy-loss block", "self.args", (*POLICY_ARGS_SET, *POLICY_ARGS_UNSET))
        return logps_block(tree, path, block, where, "the policy-loss block", POLICY_BOUND), block, name
    raise BlockNotFound(
        f"trl: {rel}: no `advantages = ...` followed by an `if self.loss_type ...` chain assigning loss in "
        f"{' / '.join(LOSS_METHODS)}; the adapter must learn the new shape before this pin can be tested"
    )


def load_policy(root: Path, entry: str) -> Loaded:
    """GRPO's clipped policy loss over one optimizer step, as GRPOTrainer._compute_loss computes it (1.16.0
    grpo_trainer.py:3055-3184): `coef_1 = exp(per_token_logps - old_per_token_logps)` (3083-3095), `coef_2 =
    clamp(coef_1, 1 - epsilon_low, 1 + epsilon_high)` (3113), `per_token_loss = -min(coef_1 A, coef_2 A)`
    (3118-3120; `args.delta` clamps coef_1 at 3115-3116), then the loss_type chain (3152-3184), run once per
    micro-batch (`loss_step.run_step`) with the same `self` as the `agg-*` entries (`load_aggregate`: accumulation
    steps, ranks, num_items_in_batch = the step's trainable tokens, the Trainer not rescaling at >= 1.12).

    Bound: `per_token_logps` = the micro-batch's slice of the logp leaf (the gradient is taken there, as TRL's
    backward reaches the model through it), `inputs = {"advantages": score [rows] (shape [B], TRL's per-completion
    advantage, unsqueezed by the block), "old_per_token_logps": old_logp, "num_items_in_batch": ...}`, the mask
    (int64) under the block's name, `entropy_mask = None` (top_entropy_quantile = 1.0, the default, grpo_config.py
    :866-867, leaves it None at 3050-3053). `self`: loss_type (the entry's), epsilon_low = epsilon_high = 0.2,
    `args.delta = None` (grpo_config.py:697-698), beta = 0.0 (681-682: the KL statements do not run),
    importance_sampling_level = "token" (760-761), off_policy_mask_threshold = None (963-964), use_vllm = False
    (587-588). The entry's options (epsilon_high, delta) replace those defaults."""
    from maskfuzz.targets.adapters.loss_step import run_step

    loss_type = POLICY[entry]
    rel, cls_name = TRAINERS["grpo"]
    tree = SourceTree(Path(root), PACKAGES)
    path = Path(root, rel)
    cls = find_class(tree.file(path).tree, cls_name) if path.is_file() else None
    if cls is None:
        raise NotPresent(f"no {rel}::{cls_name} at this pin (GRPO arrived in 0.14)")
    rel = tree.rel(path)
    _, agg_stmts, method = aggregation_block(tree, path, rel, cls)
    strings = {
        n.value for s in agg_stmts for n in ast.walk(s) if isinstance(n, ast.Constant) and isinstance(n.value, str)
    }
    if loss_type not in strings:
        raise NotPresent(
            f"{rel}:{agg_stmts[-1].lineno}: {cls_name}.{method} has no loss_type {loss_type!r} at this pin"
        )
    block, stmts, method = policy_block(tree, path, rel, cls)
    chain = stmts[-1]
    block_scales = "current_gradient_accumulation_steps" in attribute_reads(chain, "self")
    trainer_scales = _trainer_scales_for_ga(cls)
    if block_scales == trainer_scales:
        raise BlockNotFound(
            f"trl: {rel}:{chain.lineno}: the block {'divides' if block_scales else 'does not divide'} by the "
            f"accumulation steps and the Trainer {'does' if trainer_scales else 'does not'} either"
        )
    reads_delta = "delta" in set().union(*(attribute_reads(s, "self.args") for s in stmts))
    mask_name = "mask" if "mask" in block.bound else "completion_mask"
    trunc = truncation_block(tree, path, rel, cls)

    def micro(rows, logp, mask, step):
        gas = step.per_rank
        case = step.case
        delta = case.options.get("delta", "none")
        if delta != "none" and not reads_delta:
            raise OptionNotAtPin(f"{rel}:{block.first_line}: no delta (two-sided clip) at this pin")
        me = types.SimpleNamespace(
            off_policy_mask_threshold=None,
            importance_sampling_level="token",
            beta=0.0,
            loss_type=loss_type,
            epsilon_low=EPSILON,
            epsilon_high=case.options.get("epsilon_high", EPSILON),
            use_vllm=False,
            vllm_importance_sampling_correction=True,
            current_gradient_accumulation_steps=gas,
            max_completion_length=MAX_COMPLETION_LENGTH,
            accelerator=types.SimpleNamespace(num_processes=step.ranks),
            args=types.SimpleNamespace(
                delta=None if delta == "none" else delta, steps_per_generation=gas, use_bias_correction_kl=True
            ),
            model=types.SimpleNamespace(training=True),
        )
        cpu = rows.cpu()
        like = dict(device=logp.device, dtype=logp.dtype)
        values = {
            "per_token_logps": logp,
            "inputs": {
                "advantages": case.score[cpu].to(**like),
                "old_per_token_logps": case.extra["old_logp"][cpu].to(**like),
                "num_items_in_batch": torch.tensor(step.tokens, dtype=torch.long, device=logp.device),
            },
            mask_name: case.trainable[cpu].to(device=logp.device, dtype=torch.long),
            "entropy_mask": None,
            "self": me,
        }
        out = run_block(block, {name: values[name] for name in block.bound})["loss"]
        return out / gas if trainer_scales else out

    def run(case: Case, device: str) -> tuple[torch.Tensor, torch.Tensor]:
        masked = truncation_mask(trunc, case, case.options.get("mask_truncated_completions", False))
        return run_step(case if masked is None else case.replace(trainable=masked), device, micro, leaf_name="logp")

    notes = [
        f"block {rel}:{block.first_line}-{block.last_line} of {cls_name}.{method} run from source, loss_type="
        f"{loss_type!r}, once per micro-batch: advantages through the loss_type aggregation chain",
        "per_token_logps = the logp leaf (the gradient is dL/dlogp); inputs: advantages = the row's score ([B], "
        "TRL's per-completion advantage), old_per_token_logps = old_logp, num_items_in_batch = the step's trainable "
        f"tokens (all ranks); {mask_name} int64; entropy_mask = None (top_entropy_quantile = 1.0)",
        f"self: epsilon_low = epsilon_high = {EPSILON} (or the case's epsilon_high), args.delta = None (or the "
        "case's), beta = 0.0 (no KL), importance_sampling_level = 'token', off_policy_mask_threshold = None, "
        "use_vllm = False",
        f"current_gradient_accumulation_steps = steps_per_generation = the step's accumulation steps; num_processes = "
        f"ranks; max_completion_length = {MAX_COMPLETION_LENGTH}; "
        + (
            "loss / accumulation steps by the Trainer's training_step"
            if trainer_scales
            else "the Trainer does not rescale (the block divides itself)"
        ),
        f"mask_truncated_completions from the case's options through {rel}:{trunc.first_line}-{trunc.last_line}",
    ]
    return Loaded(run, f"{rel}::{cls_name}.{method} (lines {block.first_line}-{block.last_line})", notes)

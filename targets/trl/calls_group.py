"""TRL's group-advantage entries as the worker calls them (`grpo`, `dr-grpo`, `grpo-batch`, `rloo`): the inline
advantage block of GRPOTrainer / RLOOTrainer._generate_and_score_completions run from the source at the pin on the
case's [N] scores laid out in TRL's contiguous groups (`layout`); the output is one advantage per completion,
broadcast to the row ([N, T]). See `calls_kinds.py`'s docstring."""

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
    block_free_names,
    find_class,
    find_method,
    stored_names,
)
from maskfuzz.targets.trl.calls_common import (
    METHOD,
    PACKAGES,
    TRAINERS,
    OptionNotAtPin,
    check_reads,
    run_block,
    truncation_block,
    truncation_mask,
)

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

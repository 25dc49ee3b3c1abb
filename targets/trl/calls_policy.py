"""TRL's policy-loss entry as the worker calls it (`policy-grpo`): GRPOTrainer._compute_loss from
`advantages = inputs["advantages"]` through the `loss_type` chain at GRPOConfig's defaults, run from the source at
the pin per micro-batch of a step, with respect to the [B, T] log-probs."""

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
    find_class,
    find_method,
    stored_names,
)
from maskfuzz.targets.adapters.loss_step import run_step
from maskfuzz.targets.trl.calls_aggregate import (
    AGG_SELF_SET,
    MAX_COMPLETION_LENGTH,
    aggregation_block,
    reads_loss_type,
    trainer_scales_for_ga,
)
from maskfuzz.targets.trl.calls_common import (
    LOSS_METHODS,
    PACKAGES,
    TRAINERS,
    OptionNotAtPin,
    check_reads,
    logps_block,
    run_block,
    truncation_block,
    truncation_mask,
)

# ---- policy-loss: GRPOTrainer._compute_loss from `advantages = inputs["advantages"]` through the loss_type chain
# entry -> TRL's loss_type at the pin's defaults (GRPOConfig.loss_type default "dapo": 1.16.0 grpo_config.py:801-802,
# 1.12.0 :794-795, git f2cd577 :791-792; "bnpo" at 0.19.1 :458-459, which has no "dapo": the entry skips there)
POLICY = {"policy-grpo": "dapo", "policy-gspo": "grpo"}
# entry -> its importance_sampling_level: GSPO is "sequence" with loss_type "grpo", the setup TRL's warning names for
# the paper (1.16.0 grpo_trainer.py:928-933); the case's option `loss_type` picks "dapo" (GRPOConfig's default)
LEVELS = {"policy-gspo": "sequence"}
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
                and reads_loss_type(st.test)
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


def load_policy(root: Path, entry: str, level: str | None = None) -> Loaded:
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
    (587-588). The entry's options (epsilon_high, delta) replace those defaults. `level`: importance_sampling_level
    set to a value discovered in the pin's chain instead (calls_discovered.py, `policy-is:<level>`)."""
    loss_type = POLICY[entry]
    level = level or LEVELS.get(entry)
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
    for wanted in {loss_type, "dapo"} if entry in LEVELS else {loss_type}:
        if wanted not in strings:
            raise NotPresent(
                f"{rel}:{agg_stmts[-1].lineno}: {cls_name}.{method} has no loss_type {wanted!r} at this pin"
            )
    if loss_type not in strings:
        raise NotPresent(
            f"{rel}:{agg_stmts[-1].lineno}: {cls_name}.{method} has no loss_type {loss_type!r} at this pin"
        )
    block, stmts, method = policy_block(tree, path, rel, cls)
    said = {n.value for st in stmts for n in ast.walk(st) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    if entry in LEVELS and level not in said:
        raise NotPresent(f"{rel}:{block.first_line}: {cls_name}.{method} has no importance_sampling_level {level!r}")
    chain = stmts[-1]
    block_scales = "current_gradient_accumulation_steps" in attribute_reads(chain, "self")
    trainer_scales = trainer_scales_for_ga(cls)
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
            importance_sampling_level=level or "token",
            beta=0.0,
            loss_type=case.options.get("loss_type", loss_type),
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
        "case's), beta = 0.0 (no KL), importance_sampling_level = "
        f"{level or 'token'!r}, off_policy_mask_threshold = None, "
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

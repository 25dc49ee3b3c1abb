"""TRL's kl entries as the worker calls them: `kl-grpo` (GRPOTrainer._compute_loss's per-token KL to the
reference, the `if self.beta != 0.0:` statement) and `kl-ppo` (the PPO trainer's k1 / k3 estimator in `train()`,
with its padding masks and INVALID_LOGPROB fills), each [B, T], run from the source at the pin."""

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
from maskfuzz.targets.trl.calls import EOS_ID, PAD_ID, ppo_trainers, response_tokens, sequence_length_block
from maskfuzz.targets.trl.calls_common import (
    LOSS_METHODS,
    PACKAGES,
    TRAINERS,
    OptionNotAtPin,
    check_reads,
    logps_block,
    run_block,
)

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
    tree = SourceTree(Path(root), PACKAGES)
    trainers = ppo_trainers(tree)
    if not trainers:
        raise NotPresent("no PPO trainer at this pin (trl >= 1.13 ships none)")
    path, train, qual = trainers[0]
    rel = tree.rel(path)
    block = kl_ppo_block(tree, path, rel, train)
    seq = sequence_length_block(tree, path, rel, train)
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

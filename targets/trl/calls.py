"""TRL's GAE entries as the worker calls them: `train` (the inline masking + GAE block of the PPO trainer's
`train()`, trl/experimental/ppo/ppo_trainer.py from 0.26, trl/trainer/ppo_trainer.py 0.12-0.25,
trl/trainer/ppov2_trainer.py up to 0.12) and `compute_advantages` (the old `PPOTrainer.compute_advantages` with its
`compute_rewards` / `_kl_penalty`, up to 0.11.x), each compiled from the source at the pin, no trl import. The
declaration (pins, domains, entries, options, citations) is `targets/trl/declare.py`; the other kinds' calls are
`calls_kinds.py`."""

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
    find_gae_loop,
    find_method,
    stored_names,
)

PACKAGES = ("trl",)  # the framework's own packages: followed in its source, never imported
# entry points, the first is the default
ENTRIES = (
    "train",
    "compute_advantages",
    "grpo",
    "dr-grpo",
    "grpo-batch",
    "rloo",
    "agg-grpo",
    "agg-bnpo",
    "agg-dr_grpo",
    "agg-dapo",
    "kl-grpo",
    "kl-ppo",
    "policy-grpo",
    "policy-gspo",
)
PAD_ID = 0  # pad token id given to TRL's own sequence-length line; response tokens are 1
TRAIN_FILES: tuple[tuple[str, str], ...] = (  # (file, class) in the order they are looked at
    ("trl/experimental/ppo/ppo_trainer.py", "PPOTrainer"),
    ("trl/trainer/ppo_trainer.py", "PPOTrainer"),
    ("trl/trainer/ppov2_trainer.py", "PPOv2Trainer"),
)
OLD_FILE, OLD_CLASS = "trl/trainer/ppo_trainer.py", "PPOTrainer"
BLOCK_INPUTS = (
    "responses",
    "postprocessed_responses",
    "sequence_lengths",
    "logprobs",
    "ref_logprobs",
    "values",
    "scores",
    "args",
    "self",
)
ARGS_SET = ("gamma", "lam", "kl_coef", "kl_estimator", "whiten_rewards")
# what the EOS filter before the block reads from `self` (self.args.missing_eos_penalty, the tokenizer's eos id)
SELF_READS = ("args", "processing_class", "tokenizer")
EOS_ID = 2  # eos token id: the last token of an ended row (TRL's truncate_response keeps the stop token)


def entry_or_default(entry: str | None) -> str:
    """`entry`, or the default entry for None / "" / "default"; ValueError for a name trl does not have."""
    if entry in (None, "", "default"):
        return ENTRIES[0]
    if entry not in ENTRIES:
        raise ValueError(f"trl has no entry {entry!r}; entries: {', '.join(ENTRIES)}")
    return entry


def load(root: Path, entry: str | None) -> Loaded:
    entry = entry_or_default(entry)
    tree = SourceTree(Path(root), PACKAGES)
    if entry == "train":
        return _load_train(tree)
    return _load_compute_advantages(tree)


# ---------------------------------------------------------------------------------------------
# Entry `train`: the inline block of PPOTrainer.train().
# ---------------------------------------------------------------------------------------------
def ppo_trainers(tree: SourceTree) -> list[tuple[Path, ast.FunctionDef, str]]:
    """Each (file, train FunctionDef, "Class.train") of a PPO trainer class with a train() method."""
    out = []
    for rel, cls_name in TRAIN_FILES:
        path = Path(tree.root, rel)
        if not path.is_file():
            continue
        cls = find_class(tree.file(path).tree, cls_name)
        method = find_method(cls, "train") if cls is not None else None
        if method is not None:
            out.append((path, method, f"{cls_name}.train"))
    return out


def _load_train(tree: SourceTree) -> Loaded:
    trainers = ppo_trainers(tree)
    if not trainers:
        looked = ", ".join(f"{rel}::{cls}.train" for rel, cls in TRAIN_FILES)
        raise NotPresent(f"no PPO trainer at this pin (trl >= 1.13 ships none); looked for {looked}")
    for path, train, qual in trainers:
        located = find_gae_loop(train)
        if located is not None:
            break
    else:
        where = ", ".join(f"{tree.rel(p)}::{q}" for p, _, q in trainers)
        raise BlockNotFound(
            f"trl: {where} exist(s) but no GAE loop (`for t in reversed(range(...))` assigning lastgaelam) was found "
            "in train(); the adapter must learn the new shape before this pin can be tested"
        )
    stmts, loop_at = located
    rel = tree.rel(path)
    block = _gae_block(tree, path, rel, stmts, loop_at)
    seq = sequence_length_block(tree, path, rel, train)

    def run(case: Case, device: str) -> tuple[torch.Tensor, torch.Tensor]:
        x = case.inputs(device)
        tokens = response_tokens(case).to(device)
        tok = types.SimpleNamespace(pad_token_id=PAD_ID, eos_token_id=EOS_ID)
        seq_ns = seq.run(**{name: tokens if name == "postprocessed_response" else tok for name in seq.bound})
        penalty = case.options.get("missing_eos_penalty", "none")
        args = types.SimpleNamespace(
            gamma=case.gamma,
            lam=case.lam,
            kl_coef=1.0,
            kl_estimator="k1",
            whiten_rewards=False,
            missing_eos_penalty=None if penalty == "none" else penalty,  # "none": TRL's default None
        )
        me = types.SimpleNamespace(args=args, processing_class=tok, tokenizer=tok)
        values = dict(
            responses=tokens,
            postprocessed_responses=tokens,
            sequence_lengths=seq_ns["sequence_length"],
            logprobs=torch.zeros_like(x["values"]),
            ref_logprobs=x["token_rewards"].clone(),
            values=x["values"].clone(),
            scores=x["score"].clone(),
            args=args,
            self=me,
        )
        out = run_block(block, {name: values[name] for name in block.bound})
        return out["advantages"], out["returns"]

    notes = [
        f"block {rel}:{block.first_line}-{block.last_line} of {qual} run from source "
        f"(from `response_idxs = ...` through the masked fill of advantages)",
        f"sequence_lengths from {rel}:{seq.first_line} (TRL's first_true_indices line, pad_token_id={PAD_ID})",
        "token_rewards enter as ref_logprobs with logprobs = 0, kl_coef = 1, kl_estimator = 'k1'; "
        "whiten_rewards = False",
        f"responses: token 1, pad {PAD_ID}, eos {EOS_ID} on the last token of every row that is not truncated; "
        "missing_eos_penalty from the case's options ('none' = None), applied by TRL's own EOS filter in the block",
        "helpers compiled from source: " + ", ".join(sorted(tree.provenance)),
    ]
    if tree.unresolved:
        notes.append("unresolved (unused) names: " + "; ".join(f"{k}: {v}" for k, v in sorted(tree.unresolved.items())))
    return Loaded(run, f"{rel}::{qual} (lines {block.first_line}-{block.last_line})", notes)


def response_tokens(case: Case) -> torch.Tensor:
    """TRL's postprocessed response of each row: 1 at its tokens, PAD_ID after them and EOS_ID as the last token of a
    row that ended (with stop_token set, truncate_response keeps the stop token and pads after it, so the EOS is the
    last trained token); a truncated row (cut by response_length) has no EOS."""
    live = case.trainable
    tokens = torch.where(live, 1, PAD_ID).long()
    ended = live.any(dim=1) & ~case.truncated_rows()
    last = live.shape[1] - 1 - live.flip(1).int().argmax(dim=1)
    rows = ended.nonzero().flatten()
    tokens[rows, last[rows]] = EOS_ID
    return tokens


def run_block(block: Block, values: dict) -> dict:
    """`Block.run` for a block that binds `self` (a keyword `Block.run` itself takes)."""
    missing = set(block.bound) - set(values)
    if missing:
        raise TypeError(f"the block needs {sorted(missing)} bound")
    ns = dict(block.globals)
    ns.update(values)
    exec(block.code, ns)  # noqa: S102 - the framework's own source, the code under test
    return ns


def _gae_block(tree: SourceTree, path: Path, rel: str, stmts: list[ast.stmt], loop_at: int) -> Block:
    """The statements from the padding masks through the final advantages of train()."""
    start = None
    for first_name in ("response_idxs", "padding_mask"):
        start = next((i for i in range(loop_at - 1, -1, -1) if first_name in stored_names(stmts[i])), None)
        if start is not None:
            break
    if start is None:
        raise BlockNotFound(
            f"trl: {rel}:{stmts[loop_at].lineno}: no `response_idxs`/`padding_mask` assignment before the GAE loop"
        )
    # "Response Processing 3": `contain_eos_token = ...` and `if self.args.missing_eos_penalty is not None: scores[...]
    # -= ...` right before the masks: the missing_eos_penalty option, applied by TRL's own statements
    near = range(start - 1, max(start - 4, -1), -1)
    eos_at = next((i for i in near if "contain_eos_token" in stored_names(stmts[i])), None)
    if eos_at is None:
        raise BlockNotFound(
            f"trl: {rel}:{stmts[start].lineno}: no `contain_eos_token = ...` (the missing_eos_penalty filter) right "
            "before the masks of the GAE block"
        )
    start = eos_at
    end = loop_at
    while end + 1 < len(stmts) and stored_names(stmts[end + 1]) & {"advantages", "returns"}:
        end += 1
    block = stmts[start : end + 1]
    after = set().union(*(stored_names(s) for s in stmts[loop_at + 1 : end + 1])) if end > loop_at else set()
    if not {"advantages", "returns"} <= after:
        raise BlockNotFound(
            f"trl: {rel}:{stmts[loop_at].lineno}: the GAE loop is not followed by assignments of advantages and returns"
        )
    free = block_free_names(block)
    needed = {"sequence_lengths", "values", "scores"}
    if not needed <= free or "padding_mask" not in set().union(*(assigned_names(s) for s in block)):
        raise BlockNotFound(
            f"trl: {rel}:{block[0].lineno}-{block[-1].end_lineno}: the block does not read {sorted(needed - free)} "
            "or does not build padding_mask; it is not the masking + GAE block the adapter knows"
        )
    unknown_args = sorted(set().union(*(attribute_reads(s, "args") for s in block)) - set(ARGS_SET))
    if unknown_args:
        reads = ", ".join(f"args.{a}" for a in unknown_args)
        raise BlockNotFound(f"trl: the block at {rel}:{block[0].lineno} reads {reads}, which the adapter does not set")
    unknown_self = sorted(set().union(*(attribute_reads(s, "self") for s in block)) - set(SELF_READS))
    if unknown_self:
        reads = ", ".join(f"self.{a}" for a in unknown_self)
        raise BlockNotFound(f"trl: the block at {rel}:{block[0].lineno} reads {reads}, which the adapter does not set")
    self_args = set().union(*(attribute_reads(s, "self.args") for s in block))
    if self_args - {"missing_eos_penalty"}:
        raise BlockNotFound(
            f"trl: the block at {rel}:{block[0].lineno} reads self.args.{sorted(self_args - {'missing_eos_penalty'})}"
        )
    bound = [n for n in BLOCK_INPUTS if n in free]
    extra = sorted(n for n in free - set(BLOCK_INPUTS) if n in {"accelerator", "model"})
    if extra:
        raise BlockNotFound(
            f"trl: the block at {rel}:{block[0].lineno} reads {extra}; the adapter binds only {BLOCK_INPUTS}"
        )
    return tree.block(path, block, bound)


def sequence_length_block(tree: SourceTree, path: Path, rel: str, train: ast.FunctionDef) -> Block:
    """TRL's `sequence_length = first_true_indices(... == pad_token_id) - 1` line of train()."""
    for node in ast.walk(train):
        if isinstance(node, ast.Assign) and "sequence_length" in stored_names(node):
            calls = {
                c.func.id for c in ast.walk(node.value) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)
            }
            if "first_true_indices" in calls:
                free = block_free_names([node])
                bound = sorted(free & {"postprocessed_response", "processing_class", "tokenizer"})
                if "postprocessed_response" not in bound:
                    raise BlockNotFound(
                        f"trl: {rel}:{node.lineno}: the sequence-length line does not read postprocessed_response"
                    )
                return tree.block(path, [node], bound)
    raise BlockNotFound(f"trl: {rel}: train() has no `sequence_length = first_true_indices(...)` line")


# ---------------------------------------------------------------------------------------------
# Entry `compute_advantages`: the old PPOTrainer's methods (up to 0.11.x).
# ---------------------------------------------------------------------------------------------
CONFIG_SET = ("gamma", "lam", "whiten_rewards", "kl_penalty")


def _load_compute_advantages(tree: SourceTree) -> Loaded:
    path = Path(tree.root, OLD_FILE)
    cls = find_class(tree.file(path).tree, OLD_CLASS) if path.is_file() else None
    method = find_method(cls, "compute_advantages") if cls is not None else None
    if method is None:
        raise NotPresent(
            f"no {OLD_FILE}::{OLD_CLASS}.compute_advantages at this pin (the standalone method exists up to 0.11.x)"
        )
    rel = tree.rel(path)
    if find_gae_loop(method) is None:
        raise BlockNotFound(
            f"trl: {rel}::{OLD_CLASS}.compute_advantages has no GAE loop (lastgaelam over reversed(range(...)))"
        )
    nodes = {}
    for name in ("compute_advantages", "compute_rewards", "_kl_penalty"):
        node = find_method(cls, name)
        if node is None:
            raise BlockNotFound(
                f"trl: {rel}::{OLD_CLASS} has compute_advantages but no {name}; "
                "the adapter needs TRL's own score placement"
            )
        nodes[name] = node
    config_reads = set()
    for node in nodes.values():
        config_reads |= {
            n.attr
            for n in ast.walk(node)
            if isinstance(n, ast.Attribute)
            and isinstance(n.value, ast.Attribute)
            and n.value.attr == "config"
            and isinstance(n.value.value, ast.Name)
            and n.value.value.id == "self"
        }
    if config_reads - set(CONFIG_SET):
        unknown = sorted(config_reads - set(CONFIG_SET))
        raise BlockNotFound(f"trl: {rel}::{OLD_CLASS} methods read self.config.{unknown}, not set by the adapter")
    fns = {name: tree.function(path, node) for name, node in nodes.items()}
    clip = _score_clip_block(tree, path, rel, cls)

    def run(case: Case, device: str) -> tuple[torch.Tensor, torch.Tensor]:
        x = case.inputs(device)
        score_clip = case.options.get("score_clip", "none")
        config = types.SimpleNamespace(
            gamma=case.gamma,
            lam=case.lam,
            whiten_rewards=False,
            kl_penalty="kl",
            score_clip=None if score_clip == "none" else score_clip,  # "none": TRL's default None
        )
        me = types.SimpleNamespace(config=config, kl_ctl=types.SimpleNamespace(value=1.0))
        me._kl_penalty = types.MethodType(fns["_kl_penalty"], me)
        # step(): the score clipping statement, TRL's own, on the scores before compute_rewards
        scores = run_block(clip, {"scores": x["score"].clone(), "self": me})["scores"]
        # masks are integer in TRL (derived from the attention mask)
        mask = case.trainable.to(device).long()
        logprobs, ref_logprobs = torch.zeros_like(x["values"]), x["token_rewards"].clone()
        rewards, _, _ = fns["compute_rewards"](me, scores, logprobs, ref_logprobs, mask)
        _, advantages, returns = fns["compute_advantages"](me, x["values"].clone(), rewards, mask)
        return advantages, returns

    notes = [
        f"{rel}::{OLD_CLASS}.compute_rewards -> compute_advantages compiled from source (lines "
        f"{nodes['compute_rewards'].lineno}, {nodes['compute_advantages'].lineno}), self = namespace with "
        "config.{gamma, lam, whiten_rewards=False, kl_penalty='kl'}, kl_ctl.value = 1.0, _kl_penalty (TRL's own)",
        "token_rewards enter as ref_logprobs with logprobs = 0 (kl = logprob - ref_logprob, reward = -kl); "
        "mask = trainable as long",
        f"score_clip from the case's options ('none' = None) through step()'s own clipping statement ({rel}:"
        f"{clip.first_line}-{clip.last_line})",
        "helpers compiled from source: " + ", ".join(sorted(tree.provenance)),
    ]
    return Loaded(run, f"{rel}::{OLD_CLASS}.compute_advantages", notes)


def _score_clip_block(tree: SourceTree, path: Path, rel: str, cls: ast.ClassDef) -> Block:
    """The `if self.config.score_clip is not None: ...` statement of the old PPOTrainer.step()."""
    step = find_method(cls, "step")
    for node in step.body if step is not None else []:
        if isinstance(node, ast.If) and "score_clip" in {
            n.attr for n in ast.walk(node.test) if isinstance(n, ast.Attribute)
        }:
            free = block_free_names([node])
            if not {"scores", "self"} <= free:
                raise BlockNotFound(f"trl: {rel}:{node.lineno}: the score_clip statement does not read scores")
            return tree.block(path, [node], ["scores", "self"])
    raise BlockNotFound(f"trl: {rel}::{OLD_CLASS}.step has no `if self.config.score_clip ...` statement")

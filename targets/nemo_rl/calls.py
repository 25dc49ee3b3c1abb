"""NeMo-RL's GAE entry as the worker calls it: `GeneralizedAdvantageEstimator.compute_advantage`
(nemo_rl/algorithms/advantage_estimator.py) compiled from the pinned source with the helpers it uses, its mask
and sample mask as the PPO loop (nemo_rl/algorithms/ppo.py) builds them, overlong filtering compiled from the
loop. The declaration (pins, domains, entries, options, citations) is `targets/nemo_rl/declare.py`; the other
kinds' calls are `calls_kinds.py`."""

from __future__ import annotations

import ast
import copy
import math
from pathlib import Path
from types import SimpleNamespace

import torch

from maskfuzz.oracles.case import Case
from maskfuzz.targets.adapters.base import Loaded, NotPresent
from maskfuzz.targets.adapters.extract import (
    BlockNotFound,
    SourceTree,
    find_class,
    function_free_names,
    statement_lists,
)

PACKAGES = ("nemo_rl",)  # the framework's own packages: followed in its source, never imported

# Options (lines at 7ea279abfbeb; 857b11522612 where it differs). The PPO loop reads both from its config.
NORMALIZE = "ppo.adv_estimator.normalize_advantages"
OVERLONG = "ppo.overlong_filtering"

_MODULE = "nemo_rl.algorithms.advantage_estimator"
_CLASS = "GeneralizedAdvantageEstimator"
_MAX_KL = 8.0  # below calculate_kl's output clamp of 10


def load(root: Path, entry: str | None) -> Loaded:
    """Compile NeMo-RL's GAE estimator from the checkout at `root`; NotPresent before it existed."""
    if entry not in (None, "default"):
        raise ValueError(f"the GAE adapter loads the entry 'default'; {entry!r} loads from calls_kinds")
    tree = SourceTree(Path(root), PACKAGES)
    path = tree.module_file(_MODULE)
    if path is None:
        raise NotPresent(f"{_MODULE} is not present at this pin")
    node = find_class(tree.file(path).tree, _CLASS)
    if node is None:
        raise NotPresent(f"{_MODULE} has no {_CLASS} at this pin")
    ns = tree.resolve(path, [_CLASS])
    rel = tree.rel(path)
    # names the class reads at run time (annotations are dropped when compiling, so they need not resolve)
    missing = sorted(n for n in function_free_names(_without_annotations(node)) if n not in ns)
    if _CLASS not in ns or missing:
        why = "; ".join(f"{n}: {tree.unresolved.get(f'{rel}::{n}', '?')}" for n in missing or [_CLASS])
        raise BlockNotFound(f"nemo-rl: {rel}::{_CLASS} reads names that cannot be resolved from the source: {why}")
    estimator_cls = ns[_CLASS]
    where = f"{rel}::{_CLASS}.compute_advantage"
    ppo = tree.module_file("nemo_rl.algorithms.ppo")
    if ppo is None:
        raise BlockNotFound(
            "nemo-rl: nemo_rl/algorithms/ppo.py (the PPO loop: overlong filtering, the mask) is missing"
        )
    overlong = overlong_block(tree, ppo)
    with_sample_mask = loop_masks_with_sample_mask(tree, ppo)

    def run(case: Case, device: str) -> tuple[torch.Tensor, torch.Tensor]:
        inputs = case.inputs(device)
        scale = _kl_scale(case)
        # the PPO loop: overlong filtering zeroes a truncated row's loss_multiplier (ppo.py:1464-1471), which 7ea
        # multiplies into the estimator's mask (ppo.py:266, :1590); 857b passes token_mask alone (ppo.py:1244)
        sample_mask = run_overlong(overlong, "ppo", case.options.get(OVERLONG, False), case.truncated_rows())
        # in the loop's dtypes: token_loss_mask is int64 (ones_like(token_ids), grpo.py:1935), loss_multiplier
        # float32 (torch.tensor of python floats, data/collate_fn.py:33-34): the product is float32 at 7ea, the token
        # mask int64 at 857b, so the estimator's masked statistics run in float32 whatever the values' dtype
        mask = case.trainable.to(device=device, dtype=torch.int64)
        if with_sample_mask:
            mask = mask * sample_mask.to(device=device, dtype=torch.float32)[:, None]
        estimator = estimator_cls(
            {
                "gae_lambda": case.lam,
                "gae_gamma": case.gamma,
                "normalize_advantages": case.options.get(NORMALIZE, True),
                "length_adaptive_alpha": 0.0,
                "gae_lambda_value": None,
                "gae_lambda_policy": None,
            },
            # the three fields the estimator reads from ClippedPGLossConfig (as its test helper notes)
            SimpleNamespace(use_kl_in_reward=True, reference_policy_kl_penalty=scale, reference_policy_kl_type="k1"),
        )
        logprobs = (-case.token_rewards / scale).to(device=device, dtype=case.torch_dtype)
        return estimator.compute_advantage(
            prompt_ids=torch.zeros(case.shape[0], 1, dtype=torch.long, device=device),
            rewards=inputs["score"],
            mask=mask,
            values=inputs["values"],
            reference_logprobs=torch.zeros_like(logprobs),
            logprobs=logprobs,
        )

    helpers = sorted(k for k, v in tree.provenance.items() if v.endswith("(FunctionDef)"))
    notes = [
        "compiled from the pinned source (its module needs real transformers/tensorboard/pydantic to import)",
        "definitions used: " + ", ".join(helpers),
        "token rewards as -c * k1 KL with c a power of two; score placed by NeMo-RL on the last mask=1 token",
        f"{tree.rel(ppo)}:{overlong.first_line}-{overlong.last_line} (overlong filtering) compiled from the pin; "
        + ("mask = token_mask * sample_mask" if with_sample_mask else "mask = token_mask (sample_mask not applied)"),
    ]
    return Loaded(run, where, notes)


class Config(dict):
    """A config section read as `cfg.key` (pydantic models at 7ea) or `cfg["key"]` (TypedDicts at 857b)."""

    def __getattr__(self, name: str):
        try:
            return self[name]
        except KeyError as exc:
            raise AttributeError(name) from exc


def overlong_block(tree: SourceTree, path: Path):
    """`use_overlong_filtering = master_config.<section>.overlong_filtering` and the `if use_overlong_filtering:`
    statement after it (the first such pair in the training loop of `path`), compiled from the pin."""
    funcs = [n for n in ast.walk(tree.file(path).tree) if isinstance(n, ast.FunctionDef)]
    for stmts in (lists for fn in funcs for lists in statement_lists(fn)):
        for first, second in zip(stmts, stmts[1:]):
            if (
                isinstance(first, ast.Assign)
                and [ast.unparse(t) for t in first.targets] == ["use_overlong_filtering"]
                and isinstance(second, ast.If)
                and ast.unparse(second.test) == "use_overlong_filtering"
            ):
                return tree.block(path, [first, second], ("master_config", "repeated_batch"))
    raise BlockNotFound(f"nemo-rl: {tree.rel(path)} has no `use_overlong_filtering = ...` / `if` block at this pin")


def run_overlong(block, section: str, on: bool, truncated: torch.Tensor) -> torch.Tensor:
    """The loss_multiplier (float32 [B], ones from the rollout) after the framework's overlong-filtering block,
    given the rollout's per-sample `truncated` flags (a list, as the rollout stores them)."""
    batch = {"loss_multiplier": torch.ones(truncated.shape[0], dtype=torch.float32), "truncated": truncated.tolist()}
    block.run(master_config=Config({section: Config(overlong_filtering=bool(on))}), repeated_batch=batch)
    return batch["loss_multiplier"]


def loop_masks_with_sample_mask(tree: SourceTree, path: Path) -> bool:
    """Whether the PPO loop hands the estimator `token_mask * sample_mask` (7ea: `mask=advantage_mask`, built by
    `_apply_ppo_seq_logprob_error_masking`, ppo.py:266) or `token_mask` alone (857b: ppo.py:1244)."""
    text = tree.file(path).tree
    for node in ast.walk(text):
        if isinstance(node, ast.Assign) and [ast.unparse(t) for t in node.targets] == ["adv_kwargs"]:
            mask = next((k.value for k in getattr(node.value, "keywords", []) if k.arg == "mask"), None)
            src = ast.unparse(mask) if mask is not None else ""
            if src == "train_data['token_mask']":
                return False
            if src == "advantage_mask":
                built = "advantage_mask = train_data['token_mask'] * train_data['sample_mask'].unsqueeze(-1)"
                if any(isinstance(n, ast.Assign) and ast.unparse(n) == built for n in ast.walk(text)):
                    return True
            raise BlockNotFound(f"nemo-rl: {tree.rel(path)}:{node.lineno} passes mask={src!r}: not a known form")
    raise BlockNotFound(f"nemo-rl: {tree.rel(path)} builds no `adv_kwargs` for the estimator at this pin")


def _kl_scale(case: Case) -> float:
    """The smallest power of two c >= 1 with |token_rewards| / c <= 8 at trainable positions."""
    live = case.token_rewards[case.trainable]
    peak = float(live.abs().max()) if live.numel() else 0.0
    return 2.0 ** max(0, math.ceil(math.log2(peak / _MAX_KL))) if peak > _MAX_KL else 1.0


def _without_annotations(node: ast.ClassDef) -> ast.ClassDef:
    """A copy of the class whose defs carry no parameter or return annotations."""
    node = copy.deepcopy(node)
    for n in ast.walk(node):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            n.returns = None
        elif isinstance(n, ast.arg):
            n.annotation = None
    return node

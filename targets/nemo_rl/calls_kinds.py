"""NeMo-RL's masked math beyond GAE: loaders for the entries of `targets.nemo_rl.declare.SPEC`.

`GRPOAdvantageEstimator` (nemo_rl/algorithms/advantage_estimator.py) is compiled from the checkout with
`SourceTree`, as the GAE entry compiles `GeneralizedAdvantageEstimator` (nothing of nemo_rl is imported); it
calls NeMo-RL's own `calculate_baseline_and_std_per_prompt` (nemo_rl/algorithms/utils.py), compiled the same way.
Inputs as grpo.py hands them: `prompt_ids` a [B, S] tensor whose equal rows are one prompt (the adapter gives
[B, 1] group ids), `rewards` the [B] scores, `mask` the response token mask (used only for the output shape).
The config is a dict also read as attributes (`calls.Config`): `__init__` reads `estimator_config.key` at 7ea
(a pydantic model) and `estimator_config["key"]` at 857b (a TypedDict).

`agg-token-level` / `agg-sequence-level` (loss-aggregation): the actor-loss aggregation of
`ClippedPGLossFn.__call__` (nemo_rl/algorithms/loss/loss_functions.py), its own statements compiled from the pin
(`mask = token_mask * sample_mask.unsqueeze(-1)` and the `if self.loss_type == LossType.TOKEN_LEVEL:` block that
assigns `actor_loss` through `masked_mean(..., global_normalization_factor=...)`), driven over one optimizer step
by `load_loss`.

`value-loss`: `MseValueLossFn.__call__` (nemo_rl/algorithms/loss/loss_functions.py), the method compiled from the
pin as a plain function (its `self` a namespace of the three attributes `__init__` sets), driven over one
optimizer step by `load_value`.

`kl`: the per-token KL-to-reference term of `ClippedPGLossFn.__call__` (the statements of its `if
self.reference_policy_kl_penalty != 0:` block up to `kl = ... calculate_kl(...)`, compiled from the pin with
NeMo-RL's `calculate_kl`), before its reduction (`load_kl`).

`policy-loss`: `ClippedPGLossFn.__call__` whole, with its `__init__` on ClippedPGLossConfig's defaults read from
the pin, compiled as plain functions (`load_policy`), driven over one optimizer step with respect to the log-probs.

`whiten` (normalization): `GeneralizedAdvantageEstimator._reward_whiten`, the advantage whitening, compiled from
the pin as a plain function with its `masked_mean` / `masked_var` (`load_whiten`).
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path
from types import SimpleNamespace

import torch

from maskfuzz.oracles.case import Case
from maskfuzz.targets.adapters.base import Loaded, NotPresent
from maskfuzz.targets.adapters.extract import BlockNotFound, SourceTree, find_class, find_method
from maskfuzz.targets.adapters.loss_step import run_step
from maskfuzz.targets.nemo_rl.calls import OVERLONG, Config, loop_masks_with_sample_mask, overlong_block, run_overlong

# ---- options the kinds' calls read (oracles/options.py; declared in declare.py) ----
NORMALIZE_REWARDS = "grpo.normalize_rewards"
TOKEN_LEVEL = "loss_fn.token_level_loss"
GRPO_OVERLONG = "grpo.overlong_filtering"
KL_TYPE = "loss_fn.reference_policy_kl_type"
KL_IN_CLAMP = "loss_fn.kl_input_clamp_value"
KL_OUT_CLAMP = "loss_fn.kl_output_clamp_value"
RATIO_CLIP_C = "loss_fn.ratio_clip_c"
# the policy-loss case's rollout-engine log-probs (`oracles.kinds.policy_loss.ROLLOUT`; a literal: `maskfuzz repro`
# copies this module into a standalone script, which has no maskfuzz to import it from)
ROLLOUT = "rollout_logp"

_MODULE = "nemo_rl.algorithms.advantage_estimator"
_CLASS = "GRPOAdvantageEstimator"
CONFIGS = {
    # use_leave_one_out_baseline=False, normalize_rewards=True: (r - mean_g) / (std_g + 1e-6)
    "grpo": {"use_leave_one_out_baseline": False, "normalize_rewards": True},
    # use_leave_one_out_baseline=True, normalize_rewards=False: r - mean of the others (RLOO)
    "rloo": {"use_leave_one_out_baseline": True, "normalize_rewards": False},
    # both True, NeMo-RL's defaults (grpo.py:247, :253): (r - mean of the others) / (std of the others + 1e-6)
    "grpo-loo": {"use_leave_one_out_baseline": True, "normalize_rewards": True},
}


_LOSS_MODULE = "nemo_rl.algorithms.loss.loss_functions"
_LOSS_CLASS = "ClippedPGLossFn"
# entry -> the LossType member ClippedPGLossFn's config picks (`token_level_loss`, loss_functions.py:262-264 at 7ea)
LOSS = {"agg-token-level": "TOKEN_LEVEL", "agg-sequence-level": "SEQUENCE_LEVEL"}


def _aggregation_block(tree: SourceTree, path: Path, cls: ast.ClassDef):
    """`mask = token_mask * sample_mask.unsqueeze(-1)` and the `if self.loss_type == LossType.TOKEN_LEVEL:`
    statement assigning `actor_loss`, both at the top level of `ClippedPGLossFn.__call__`."""
    call = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__call__"), None)
    if call is None:
        raise NotPresent(f"{_LOSS_CLASS} has no __call__ at this pin")
    mask_stmt = next(
        (
            n
            for n in call.body
            if isinstance(n, ast.Assign)
            and [ast.unparse(t) for t in n.targets] == ["mask"]
            and ast.unparse(n.value) == "token_mask * sample_mask.unsqueeze(-1)"
        ),
        None,
    )
    agg = next(
        (
            n
            for n in call.body
            if isinstance(n, ast.If)
            and ast.unparse(n.test) == "self.loss_type == LossType.TOKEN_LEVEL"
            and any(isinstance(b, ast.Assign) and ast.unparse(b.targets[0]) == "actor_loss" for b in n.body)
        ),
        None,
    )
    if mask_stmt is None or agg is None:
        raise NotPresent(
            f"{_LOSS_CLASS}.__call__ has no `mask = token_mask * sample_mask...` / actor_loss "
            "aggregation block at this pin"
        )
    bound = (
        "self",
        "clip_loss",
        "importance_weights_to_use",
        "token_mask",
        "sample_mask",
        "global_valid_seqs",
        "global_valid_toks",
    )
    return tree.block(path, [mask_stmt, agg], bound), mask_stmt.lineno, agg.lineno, agg.end_lineno


def load_loss(root: Path, entry: str) -> Loaded:
    """ClippedPGLossFn's aggregation over one optimizer step, as NeMo-RL's policy worker drives it (lines at 7ea).

    Normalisers: `process_global_batch` computes them once per global batch, before the micro-batch loop:
    `global_valid_seqs = sum(sample_mask)`, `global_valid_toks = sum(token_mask[:, 1:] * sample_mask)`, both
    all-reduced over the data-parallel group, no clamp (nemo_rl/models/automodel/data.py:408-420); every
    micro-batch gets them (:427-431, nemo_rl/models/automodel/train.py:513-514). sample_mask is 1.0 (float32) for
    every row (the case has no sample-level filter; `"sample_mask": repeated_batch["loss_multiplier"]`,
    nemo_rl/algorithms/grpo.py:2143), token_mask[:, 1:] is the case's mask as int64 (`token_loss_mask =
    torch.ones_like(token_ids)` / `zeros_like`, grpo.py:1934-1937); the per-token loss enters as `clip_loss`
    with `importance_weights_to_use` all ones (use_importance_sampling_correction off, loss_functions.py:673-676).
    Scaling: `loss = result * dp_size * cp_size; loss.backward()` per micro-batch (train.py:545-548: "when FSDP
    reduces the gradients over the DP dim, they're automatically averaged but we want to sum them"), cp_size 1."""
    tree = SourceTree(Path(root), ("nemo_rl",))
    path = tree.module_file(_LOSS_MODULE)
    cls = None if path is None else find_class(tree.file(path).tree, _LOSS_CLASS)
    if cls is None:
        raise NotPresent(f"{_LOSS_MODULE}.{_LOSS_CLASS} is not present at this pin")
    block, mask_line, first, last = _aggregation_block(tree, path, cls)
    ns = tree.resolve(path, ["LossType"])
    if "LossType" not in ns:
        raise NotPresent(f"LossType could not be compiled: {tree.unresolved}")
    this = SimpleNamespace(loss_type=getattr(ns["LossType"], LOSS[entry]))
    overlong = _overlong(tree, "nemo_rl.algorithms.grpo")
    state: dict = {}  # the step's sample_mask, set per case by `run`
    # `self` is the block's only attribute holder; Block.run takes bound names as keywords, so it goes in globals
    block = dataclasses.replace(
        block, globals={**block.globals, "self": this}, bound=tuple(b for b in block.bound if b != "self")
    )

    def micro(rows, loss, mask, step):
        dev = loss.device
        sample_mask, to_reduce = _sample_mask(step, state["sample_mask"], rows, dev)
        out = block.run(
            clip_loss=loss,
            importance_weights_to_use=torch.ones_like(loss),
            token_mask=mask.to(torch.int64),
            sample_mask=sample_mask,
            global_valid_seqs=to_reduce[0],
            global_valid_toks=to_reduce[1],
        )
        return out["actor_loss"] * step.ranks  # train.py:547, cp_size 1

    def run(case: Case, device: str):
        if entry == "agg-token-level":  # loss_functions.py:262-264: the LossType from token_level_loss
            level = case.options.get(TOKEN_LEVEL, True)
            this.loss_type = getattr(ns["LossType"], "TOKEN_LEVEL" if level else "SEQUENCE_LEVEL")
        # grpo.py:3136-3145: overlong filtering zeroes a truncated row's loss_multiplier = the loss's sample_mask
        on = case.options.get(GRPO_OVERLONG, False)
        state["sample_mask"] = run_overlong(overlong, "grpo", on, case.truncated_rows())
        return run_step(case, device, micro)

    rel = tree.rel(path)
    notes = [
        f"{rel}:{mask_line} and :{first}-{last} compiled from the pin; self.loss_type = LossType.{LOSS[entry]}",
        "sample_mask = loss_multiplier (ones) after grpo.py's overlong-filtering block (compiled from the pin)",
        "global_valid_seqs = sum(sample_mask), global_valid_toks = sum(token_mask * sample_mask) over the step",
        "micro-batch loss * dp_size, ranks averaged (FSDP) = summed",
    ]
    return Loaded(run, f"{rel}::{_LOSS_CLASS}.__call__ (actor_loss aggregation)", notes)


_VALUE_CLASS = "MseValueLossFn"
# examples/configs/ppo_math_1B.yaml:86-88 (7ea; ppo_math_1B_megatron.yaml:72-74 at 857b): cliprange 0.2; the class
# default is None (no clipping, MseValueLossConfig); scale is left at the class default 1.0 (the recipes' value;
# the base config's 0.4 only multiplies the loss)
VALUE_CLIPRANGE = 0.2


def _overlong(tree: SourceTree, module: str):
    """The loop's overlong-filtering block (`overlong_block`) of `module`, compiled from the pin."""
    path = tree.module_file(module)
    if path is None:
        raise NotPresent(f"{module} (the training loop: overlong filtering) is not present at this pin")
    return overlong_block(tree, path)


def _sample_mask(step, whole: torch.Tensor, rows, dev):
    """The micro-batch's sample_mask (float32, the step's loss_multiplier) and `process_global_batch`'s
    normalisers (nemo_rl/models/automodel/data.py:408-420): sum(sample_mask), sum(token_mask * sample_mask)
    over the whole step (all ranks)."""
    seqs = float(whole.sum())
    toks = float((step.case.trainable.to(torch.float32) * whole[:, None]).sum())
    return whole[rows.cpu()].to(dev), torch.tensor([seqs, toks], device=dev)


def load_value(root: Path, entry: str) -> Loaded:
    """`MseValueLossFn.__call__(values, data, global_valid_seqs, global_valid_toks)` over one optimizer step, as
    NeMo-RL's value workers drive it, the gradient taken with respect to its `values` (lines at 7ea279abfbeb; the
    class is at loss_functions.py:1218-1341 there, :1091-1213 at 857b11522612, absent at f6e91870a807).

    Normalisers: the value worker's train loop calls `process_global_batch` once per global batch, before the
    micro-batch loop (nemo_rl/models/value/workers/dtensor_value_worker_v2.py:344-353; megatron_value_worker.py
    :480-489, 857b :527-536): `global_valid_toks = sum(token_mask[:, 1:] * sample_mask)`, `global_valid_seqs =
    sum(sample_mask)`, all-reduced over data-parallel ranks, no clamp (nemo_rl/models/automodel/data.py:408-420);
    every micro-batch gets both (dtensor_value_worker_v2.py:368-379 -> automodel/train.py:513-514). The loss
    reads `data["token_mask"]` unshifted over the full flat sequence (ppo.py:1502-1503, "token_mask":
    flat_messages["token_loss_mask"], "sample_mask": loss_multiplier), while the normaliser skips column 0: the
    case's columns are sequence tokens 1..T behind one masked prompt token (a flat sequence starts with the
    prompt), so the normaliser is the case's trained tokens. sample_mask is 1.0 (float32) for every row.
    Scaling (the DTensor worker): `loss = result * dp_size * cp_size; loss.backward()` per micro-batch
    (automodel/train.py:545-548), cp_size 1; FSDP averages over ranks. The Megatron worker instead multiplies by
    num_microbatches to undo Megatron-core's averaging (nemo_rl/models/megatron/train.py:584-594): the same sum
    over micro-batches; its data-parallel reduction was not re-read here.
    Config: scale 1.0 (MseValueLossConfig default), cliprange 0.2 (examples/configs/ppo_math_1B.yaml:88)."""
    tree = SourceTree(Path(root), ("nemo_rl",))
    path = tree.module_file(_LOSS_MODULE)
    cls = None if path is None else find_class(tree.file(path).tree, _VALUE_CLASS)
    if cls is None:
        raise NotPresent(
            f"{_LOSS_MODULE}.{_VALUE_CLASS} is not present at this pin (the PPO value model arrived "
            "with 857b11522612, 'PPO with MCore')"
        )
    call = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__call__"), None)
    if call is None:
        raise NotPresent(f"{_VALUE_CLASS} has no __call__ at this pin")
    fn = tree.function(path, call)
    this = SimpleNamespace(scale=1.0, cliprange=VALUE_CLIPRANGE, loss_type=None)
    overlong = _overlong(tree, "nemo_rl.algorithms.ppo")
    state: dict = {}  # the step's sample_mask, set per case by `run`

    def micro(rows, v, mask, step):
        dev, dt = v.device, v.dtype
        old = step.case.extra["v_old"][rows].to(device=dev, dtype=dt)
        ret = step.case.extra["ret"][rows].to(device=dev, dtype=dt)
        pad = torch.zeros(v.shape[0], 1, dtype=dt, device=dev)  # sequence token 0: a prompt token, never trained
        token_mask = torch.cat([pad.to(torch.int64), mask.to(torch.int64)], dim=1)
        # data.py:412-420: sum(sample_mask), sum(token_mask[:, 1:] * sample_mask) all-reduced over the step
        sample_mask, to_reduce = _sample_mask(step, state["sample_mask"], rows, dev)
        data = {
            "token_mask": token_mask,
            "sample_mask": sample_mask,
            "returns": torch.cat([pad, ret], dim=1),
            "values": torch.cat([pad, old], dim=1),
        }
        loss, _ = fn(this, torch.cat([pad, v], dim=1), data, to_reduce[0], to_reduce[1])
        return loss * step.ranks  # automodel/train.py:547, cp_size 1

    def run(case: Case, device: str):
        # ppo.py:1464-1471: overlong filtering zeroes a truncated row's loss_multiplier = the loss's sample_mask
        on = case.options.get(OVERLONG, False)
        state["sample_mask"] = run_overlong(overlong, "ppo", on, case.truncated_rows())
        return run_step(case, device, micro, leaf_name="v")

    rel = tree.rel(path)
    notes = [
        f"{rel}:{call.lineno}-{call.end_lineno} compiled from the pin; scale 1.0, cliprange {VALUE_CLIPRANGE}",
        "global_valid_toks = the step's trained tokens (columns behind one masked prompt token), sample_mask ones",
        "micro-batch loss * dp_size, ranks averaged (FSDP) = summed",
    ]
    return Loaded(run, f"{rel}::{_VALUE_CLASS}.__call__", notes)


def _kl_block(tree: SourceTree, path: Path, cls: ast.ClassDef):
    """The body of `if self.reference_policy_kl_penalty != 0:` in `ClippedPGLossFn.__call__` that computes the
    per-token KL: its statements up to and including the `kl = ... calculate_kl(...)` assignment (the importance
    weights and the term), without the reduction that follows."""
    call = find_method(cls, "__call__")
    if call is None:
        raise NotPresent(f"{_LOSS_CLASS} has no __call__ at this pin")
    for node in call.body:
        if not (isinstance(node, ast.If) and ast.unparse(node.test) == "self.reference_policy_kl_penalty != 0"):
            continue
        for i, stmt in enumerate(node.body):
            calls = {ast.unparse(c.func) for c in ast.walk(stmt) if isinstance(c, ast.Call)}
            if isinstance(stmt, ast.Assign) and [ast.unparse(t) for t in stmt.targets] == ["kl"]:
                if "calculate_kl" not in calls:
                    break
                bound = ("self", "curr_logprobs_unfiltered", "reference_policy_logprobs", "generation_logprobs")
                return tree.block(path, node.body[: i + 1], bound)
    raise BlockNotFound(
        f"nemo-rl: {tree.rel(path)}::{_LOSS_CLASS}.__call__ has no `if self.reference_policy_kl_penalty != 0:` "
        "block assigning `kl = ... calculate_kl(...)` at this pin"
    )


def load_kl(root: Path, entry: str, settings: dict | None = None) -> Loaded:
    """The per-token KL-to-reference term of `ClippedPGLossFn.__call__`, its statements compiled from the pin
    (7ea: nemo_rl/algorithms/loss/loss_functions.py:469-503; 857b: :358-389) with NeMo-RL's `calculate_kl`
    (nemo_rl/algorithms/utils.py) resolved from the same source, before the reduction (:505-515).

    Inputs as the loss has them: `curr_logprobs_unfiltered` the policy's log-probs (`data.get(
    "curr_logprobs_unfiltered", curr_logprobs)`, :393-395: without top-k/top-p they are the same tensor),
    `reference_policy_logprobs` the reference's, `generation_logprobs` (read only under
    use_on_policy_kl_approximation, off by default, :153) the policy's too. `self` carries the five attributes the
    block reads, as `__init__` sets them from ClippedPGLossConfig (:240-256): reference_policy_kl_penalty 1.0 (the
    coefficient only scales the term; 1 keeps it exact), reference_policy_kl_type and the two clamps from the case's
    options, use_on_policy_kl_approximation False (`settings`: attributes set over these, a discovered variant's
    config field, calls_discovered.py). At 7ea the term carries importance weights
    exp(x - x.detach()) (forward value 1, nan_to_num'd); at 857b ones_like."""
    tree = SourceTree(Path(root), ("nemo_rl",))
    path = tree.module_file(_LOSS_MODULE)
    cls = None if path is None else find_class(tree.file(path).tree, _LOSS_CLASS)
    if cls is None:
        raise NotPresent(f"{_LOSS_MODULE}.{_LOSS_CLASS} is not present at this pin")
    block = _kl_block(tree, path, cls)
    this = SimpleNamespace(reference_policy_kl_penalty=1.0, use_on_policy_kl_approximation=False)
    # `self` is the block's only attribute holder; Block.run takes bound names as keywords, so it goes in globals
    block = dataclasses.replace(
        block, globals={**block.globals, "self": this}, bound=tuple(b for b in block.bound if b != "self")
    )

    def run(case: Case, device: str):
        dt = case.torch_dtype
        logp = case.extra["logp"].to(device=device, dtype=dt)
        ref = case.extra["ref_logp"].to(device=device, dtype=dt)
        # __init__ copies the three config keys (loss_functions.py:243-245 at 7ea)
        this.reference_policy_kl_type = case.options.get(KL_TYPE, "k3")
        this.kl_input_clamp_value = case.options.get(KL_IN_CLAMP, 20.0)
        this.kl_output_clamp_value = case.options.get(KL_OUT_CLAMP, 10.0)
        vars(this).update(settings or {})
        out = block.run(curr_logprobs_unfiltered=logp, reference_policy_logprobs=ref, generation_logprobs=logp)
        return (out["kl"],)

    rel = tree.rel(path)
    notes = [
        f"{rel}:{block.first_line}-{block.last_line} compiled from the pin (calculate_kl from the source)",
        "reference_policy_kl_penalty 1.0; kl type and clamps from the options (defaults k3, 20, 10)",
        "curr_logprobs_unfiltered = generation_logprobs = logp; use_on_policy_kl_approximation False",
    ]
    return Loaded(run, f"{rel}::{_LOSS_CLASS}.__call__ (KL-to-reference term, per token)", notes)


_POLICY_CONFIG = "ClippedPGLossConfig"


def _config_defaults(tree: SourceTree, path: Path, name: str) -> dict:
    """The field defaults of the pydantic config class `name` in `path`, read from the pin's source (every
    `field: type = <literal>`); BlockNotFound for a field without a literal default."""
    cls = find_class(tree.file(path).tree, name)
    if cls is None:
        raise NotPresent(f"{name} is not present at this pin")
    out = {}
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            try:
                out[node.target.id] = ast.literal_eval(node.value)
            except (ValueError, TypeError, SyntaxError) as exc:
                raise BlockNotFound(
                    f"nemo-rl: {tree.rel(path)}:{node.lineno} {name}.{node.target.id} has no literal default"
                ) from exc
    return out


def load_policy(root: Path, entry: str, config: dict | None = None) -> Loaded:
    """`ClippedPGLossFn.__call__(next_token_logprobs, data, global_valid_seqs, global_valid_toks)` over one optimizer
    step, the gradient taken with respect to `next_token_logprobs` (NeMo-RL's loss takes log-probs,
    `input_type = LossInputType.LOGPROB`, 7ea: nemo_rl/algorithms/loss/loss_functions.py:226; 857b :200; f6e9
    :196: no logits needed). `__init__` and `__call__` are compiled from the pin as plain functions (as
    `load_value` compiles MseValueLossFn); `self` is a namespace that the compiled `__init__` fills from
    ClippedPGLossConfig's defaults read from the pin's source (`_config_defaults`), with three changes:
    `reference_policy_kl_penalty = 0` (the KL-to-reference term is the `kl` entry; a kind input it does not
    have), and `token_level_loss` / `ratio_clip_c` from the case's options (defaults True / None); `config` (a
    discovered variant's fields, calls_discovered.py) is set over all of these, and a config its `__init__`
    rejects (an assert or a ValueError on a plain config) is a skip with the upstream message.

    The data dict as the GRPO / PPO loops build it (7ea grpo.py:2135-2145): every [B, S] tensor is the flat
    sequence, and `__call__` reads `[:, 1:]` of each (:383-390) against `next_token_logprobs` [B, S - 1]: the
    case's columns are sequence tokens 1..T behind one masked prompt token (as for value-loss). token_mask int64
    (`torch.ones_like(token_ids)`, grpo.py:1934-1937), sample_mask float32 (loss_multiplier, after the overlong-
    filtering block compiled from grpo.py), advantages / prev_logprobs the case's, generation_logprobs the case's
    `rollout_logp` where it holds one (the entries of the importance-sampling correction, `discover.recipe`),
    else prev_logprobs (read by metrics and the importance-sampling correction, off by default). Normalisers and
    scaling as `load_loss`: global_valid_seqs = sum(sample_mask), global_valid_toks = sum(token_mask[:, 1:] *
    sample_mask) over the step (nemo_rl/models/automodel/data.py:408-420), `loss * dp_size` per micro-batch
    (automodel/train.py:545-548)."""
    tree = SourceTree(Path(root), ("nemo_rl",))
    path = tree.module_file(_LOSS_MODULE)
    cls = None if path is None else find_class(tree.file(path).tree, _LOSS_CLASS)
    if cls is None:
        raise NotPresent(f"{_LOSS_MODULE}.{_LOSS_CLASS} is not present at this pin")
    nodes = {name: find_method(cls, name) for name in ("__init__", "__call__")}
    if any(n is None for n in nodes.values()):
        raise NotPresent(f"{_LOSS_CLASS} lacks {[k for k, n in nodes.items() if n is None]} at this pin")
    init, call = (tree.function(path, nodes[k]) for k in ("__init__", "__call__"))
    defaults = _config_defaults(tree, path, _POLICY_CONFIG)
    overlong = _overlong(tree, "nemo_rl.algorithms.grpo")
    state: dict = {}  # the configured loss and the step's sample_mask, set per case by `run`
    if config:
        try:
            init(SimpleNamespace(), Config(dict(defaults, reference_policy_kl_penalty=0.0, **config)))
        except (AssertionError, ValueError) as exc:
            raise NotPresent(f"{tree.rel(path)}: {_LOSS_CLASS}.__init__ rejects {config}: {exc}") from None

    def micro(rows, logp, mask, step):
        dev, dt = logp.device, logp.dtype
        old = step.case.extra["old_logp"][rows].to(device=dev, dtype=dt)
        adv = step.case.extra["adv"][rows].to(device=dev, dtype=dt)
        pad = torch.zeros(logp.shape[0], 1, dtype=dt, device=dev)  # sequence token 0: a prompt token, never trained
        sample_mask, to_reduce = _sample_mask(step, state["sample_mask"], rows, dev)
        prev = torch.cat([pad, old], dim=1)
        gen = prev  # the inference engine's log-probs: the case's where it holds them (a discovered IS entry)
        if ROLLOUT in step.case.extra:
            gen = torch.cat([pad, step.case.extra[ROLLOUT][rows].to(device=dev, dtype=dt)], dim=1)
        data = {
            "token_mask": torch.cat([pad.to(torch.int64), mask.to(torch.int64)], dim=1),
            "sample_mask": sample_mask,
            "advantages": torch.cat([pad, adv], dim=1),
            "prev_logprobs": prev,
            "generation_logprobs": gen,
            "reference_policy_logprobs": prev,
        }
        loss, _ = call(state["self"], logp, data, to_reduce[0], to_reduce[1])
        return loss * step.ranks  # automodel/train.py:547, cp_size 1

    def run(case: Case, device: str):
        cfg = dict(defaults, reference_policy_kl_penalty=0.0)
        cfg["token_level_loss"] = case.options.get(TOKEN_LEVEL, defaults["token_level_loss"])
        cfg["ratio_clip_c"] = case.options.get(RATIO_CLIP_C, defaults["ratio_clip_c"])
        cfg.update(config or {})
        this = SimpleNamespace()
        init(this, Config(cfg))
        state["self"] = this
        # grpo.py:3136-3145: overlong filtering zeroes a truncated row's loss_multiplier = the loss's sample_mask
        on = case.options.get(GRPO_OVERLONG, False)
        state["sample_mask"] = run_overlong(overlong, "grpo", on, case.truncated_rows())
        return run_step(case, device, micro, leaf_name="logp")

    rel = tree.rel(path)
    c = nodes["__call__"]
    clip = f"ratio_clip {defaults['ratio_clip_min']} / {defaults['ratio_clip_max']}, ratio_clip_c option"
    notes = [
        f"{rel}:{c.lineno}-{c.end_lineno} (__call__) and __init__ compiled from the pin; {_POLICY_CONFIG} defaults "
        f"from the source ({clip}), token_level_loss from the options",
        "reference_policy_kl_penalty 0 (the KL term is the kl entry); generation_logprobs = the case's rollout_logp "
        "where it holds one, else prev_logprobs; importance-sampling correction off (default) unless set",
        "columns behind one masked prompt token ([:, 1:]); sample_mask after grpo.py's overlong filtering; "
        "global_valid_toks / global_valid_seqs over the step; micro-batch loss * dp_size",
    ]
    return Loaded(run, f"{rel}::{_LOSS_CLASS}.__call__", notes)


_WHITEN_CLASS = "GeneralizedAdvantageEstimator"


def load_whiten(root: Path, entry: str) -> Loaded:
    """`GeneralizedAdvantageEstimator._reward_whiten(rewards, mask)` (7ea: nemo_rl/algorithms/advantage_estimator.py
    :345-358; 857b: :306-319) compiled from the pin as a plain function, with its `masked_mean` / `masked_var`
    (nemo_rl/algorithms/utils.py) resolved from the same source. It reads nothing from `self` (None is passed).
    Called as compute_advantage calls it (:494): `_reward_whiten(advantages, mask)`, shift_mean at its default,
    with the mask the PPO loop hands the estimator: `token_loss_mask` is int64 (`torch.ones_like(token_ids)`,
    ppo.py:1476-1482; 857b :1139-1145); 7ea multiplies it by the float32 `sample_mask` (loss_multiplier, all ones
    here): a float32 mask (ppo.py:266, :1590); 857b passes the int64 token_mask alone (ppo.py:1244). The mask's
    dtype matters: `sum(mask) + 1e-8` (utils.py:224) is float32 either way, so the 1e-8 rounds away for n >= 1,
    and `values * mask` promotes half-precision advantages to float32 under the 7ea mask only."""
    tree = SourceTree(Path(root), ("nemo_rl",))
    path = tree.module_file(_MODULE)
    cls = None if path is None else find_class(tree.file(path).tree, _WHITEN_CLASS)
    method = None if cls is None else find_method(cls, "_reward_whiten")
    if method is None:
        raise NotPresent(f"{_MODULE}.{_WHITEN_CLASS}._reward_whiten is not present at this pin")
    if any(isinstance(n, ast.Attribute) and ast.unparse(n.value) == "self" for n in ast.walk(method)):
        raise BlockNotFound("nemo-rl: _reward_whiten reads an attribute of `self` at this pin")
    fn = tree.function(path, method)
    ppo = tree.module_file("nemo_rl.algorithms.ppo")
    if ppo is None:
        raise BlockNotFound("nemo-rl: nemo_rl/algorithms/ppo.py (the PPO loop: the estimator's mask) is missing")
    with_sample_mask = loop_masks_with_sample_mask(tree, ppo)

    def run(case: Case, device: str):
        x = case.extra["x"].to(device=device, dtype=case.torch_dtype)
        mask = case.trainable.to(device=device, dtype=torch.int64)  # token_loss_mask
        if with_sample_mask:  # advantage_mask = token_mask * sample_mask.unsqueeze(-1) (ppo.py:266 at 7ea)
            mask = mask * torch.ones(case.shape[0], dtype=torch.float32, device=device).unsqueeze(-1)
        return (fn(None, x, mask),)

    rel = tree.rel(path)
    form = "token_mask (int64) * sample_mask (float32)" if with_sample_mask else "token_mask (int64)"
    notes = [
        f"{rel}:{method.lineno}-{method.end_lineno} compiled from the pin; self None (unread), shift_mean default",
        f"mask as {tree.rel(ppo)} hands it to the estimator: {form}",
    ]
    return Loaded(run, f"{rel}::{_WHITEN_CLASS}._reward_whiten", notes)


def load_kind(root: Path, entry: str) -> Loaded:
    if entry == "kl":
        return load_kl(root, entry)
    if entry == "whiten":
        return load_whiten(root, entry)
    if entry == "value-loss":
        return load_value(root, entry)
    if entry == "policy-loss":
        return load_policy(root, entry)
    if entry in LOSS:
        return load_loss(root, entry)
    if entry not in CONFIGS:
        raise NotPresent(f"nemo-rl has no entry {entry!r}; entries: default, {', '.join(CONFIGS)}")
    tree = SourceTree(Path(root), ("nemo_rl",))
    path = tree.module_file(_MODULE)
    if path is None or find_class(tree.file(path).tree, _CLASS) is None:
        raise NotPresent(f"{_MODULE}.{_CLASS} is not present at this pin")
    ns = tree.resolve(path, [_CLASS])
    if _CLASS not in ns:
        raise NotPresent(f"{_CLASS} could not be compiled: {tree.unresolved}")
    cls = ns[_CLASS]

    def run(case: Case, device: str):
        dt = case.torch_dtype
        groups = case.group if case.group is not None else torch.zeros(case.shape[0], dtype=torch.int64)
        prompt_ids = groups.to(device)[:, None]
        rewards = case.score.to(device=device, dtype=dt)
        mask = case.trainable.to(device=device, dtype=dt)
        config = dict(CONFIGS[entry])
        if entry == "grpo":  # grpo.normalize_rewards, read by __init__ (advantage_estimator.py:67)
            config["normalize_rewards"] = case.options.get(NORMALIZE_REWARDS, True)
        return (cls(Config(config), None).compute_advantage(prompt_ids, rewards, mask),)

    cfg = ", ".join(f"{k}={v}" for k, v in CONFIGS[entry].items())
    return Loaded(
        run,
        f"{tree.rel(path)}::{_CLASS}.compute_advantage",
        [f"config: {cfg}", "prompt_ids = group ids as a [B, 1] tensor"],
    )


load = load_kind  # the worker loads the entries of the other kinds from here (targets.registry.adapter_for)

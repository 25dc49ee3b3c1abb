"""miles entries beyond GAE (`shared/design/kinds.md`): group-advantage, kl, normalization, returns,
loss-aggregation, value-loss and policy-loss (`load_loss`, `load_value`, `load_policy`: the trainer's
`loss_function`, Megatron path).

Every entry calls miles' own code at the pin; the layout moved between the release wheel and git:

    what                        miles-rl 0.0.2                         git (6ccdc7da6, 3d2e0e411)
    _post_process_rewards       miles/ray/rollout.py (RolloutManager)  miles/ray/rollout/train_data_conversion.py
    get_grpo_returns,           miles/utils/ppo_utils.py               miles/backends/training_utils/loss_hub/
    compute_approx_kl,                                                 math_utils.py
    get_reinforce_plus_plus_returns
    distributed_masked_whiten   miles/utils/distributed_utils.py       (same file)

* `grpo` (group-advantage): the rollout's group normalisation `_post_process_rewards` (GRPO: mean
  and unbiased std per group, `/(std + 1e-6)`, float32), then the trainer's `get_grpo_returns`,
  which broadcasts the normalised scalar over every response token (`torch.ones_like(kl[i]) *
  rewards[i]`, no mask) with the float32 zero KL the trainer builds when `kl_coef == 0` (the
  default). `_post_process_rewards` lives in a Ray actor class (0.0.2) or a module that pulls the
  object store (git); it is compiled from the real source text (`targets.adapters.extract`), a
  method with a stand-in `self` holding only `args` and `custom_reward_post_process_func = None`.
  Its groups are implicit: `reshape(-1, n_samples_per_prompt)` when the sample count is exactly
  `n_samples_per_prompt * rollout_batch_size`, else one group of the whole batch. The rollout hands
  it samples grouped contiguously (a list of groups, flattened), so the adapter orders the rows
  by group (stable, groups in order of first appearance), sets `n_samples_per_prompt` to the
  largest group and `rollout_batch_size` to the number of groups, and restores the order after.
  Equal groups take the reshape; unequal ones take the whole-batch fallback, as in miles.
* `kl`, `kl-k2`, `kl-k3`, `kl-low-var` (kl): `compute_approx_kl(log_probs, ref_log_probs, kl_loss_type)`
  with k1 (the `--kl-loss-type` default), k2, k3 and low_var_kl; the eager function under miles'
  `@torch.compile(dynamic=True)` (`_torchdynamo_orig_callable`), so inductor is not under test.
* `whiten` (normalization): `distributed_masked_whiten(advantages, loss_masks)` on the concatenated
  per-sample tensors, as `--normalize-advantages` calls it; a one-rank gloo process group is
  initialised in the worker (the all-reduce of one rank is the identity).
* `reinforce++` (returns): `get_reinforce_plus_plus_returns` with the caller's arguments (scores as
  a float32 tensor, per-sample KL, loss masks, kl_coef, gamma). Token rewards enter as KL exactly
  as for GAE: `compute_approx_kl(0, token_rewards, "k1") = -token_rewards`, kl_coef = 1.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import os
import tempfile
from argparse import Namespace
from pathlib import Path
from typing import Callable

import torch

from maskfuzz.oracles.case import Case
from maskfuzz.oracles.kinds.loss_aggregation import microbatches
from maskfuzz.targets.adapters.base import Loaded, NotPresent, function_from, import_from
from maskfuzz.targets.adapters.extract import SourceTree, find_class, find_method
from maskfuzz.targets.adapters.loss_step import Step, run_step
from maskfuzz.targets.miles.calls import kl_caller, provide_parallel_state
from maskfuzz.targets.slime.calls import (  # total_lengths = prompt + response
    PROMPT_LEN,
    Samples,
    kl_smoke,
    run_kl_caller,
)

KL_ENTRIES = {"kl": "k1", "kl-k2": "k2", "kl-k3": "k3", "kl-low-var": "low_var_kl"}
KIND_ENTRIES = ("grpo", *KL_ENTRIES, "whiten", "reinforce++")  # + LOSS_ENTRIES (loss-aggregation)

MATH_HOMES = ("miles.backends.training_utils.loss_hub.math_utils", "miles.utils.ppo_utils")
# where `_post_process_rewards` is: (file, class or None)
REWARD_HOMES = (
    ("miles/ray/rollout/train_data_conversion.py", None),
    ("miles/ray/rollout.py", "RolloutManager"),
)


# ---------------------------------------------------------------------------------------------
# Shared with slime (same code, other homes).
# ---------------------------------------------------------------------------------------------
def eager(fn: Callable) -> Callable:
    """The function under a `torch.compile` wrapper (the plain function otherwise)."""
    return getattr(fn, "_torchdynamo_orig_callable", None) or fn


def math_function(root: Path, name: str, homes=MATH_HOMES) -> tuple[Callable, str]:
    return function_from(root, [(m, name) for m in homes])


def reward_postprocess(root: Path, own: tuple[str, ...], homes=REWARD_HOMES) -> tuple[Callable, str, bool]:
    """`_post_process_rewards` compiled from the source at the pin: (function, where, is_method)."""
    tree = SourceTree(Path(root), own)
    for rel, cls_name in homes:
        path = Path(root, rel)
        if not path.is_file():
            continue
        src = tree.file(path)
        if cls_name is None:
            node = next(
                (n for n in src.tree.body if isinstance(n, ast.FunctionDef) and n.name == "_post_process_rewards"),
                None,
            )
        else:
            cls = find_class(src.tree, cls_name)
            node = find_method(cls, "_post_process_rewards") if cls is not None else None
        if node is None:
            continue
        fn = tree.function(path, node)
        owner = f"{cls_name}." if cls_name else ""
        return fn, f"{rel}:{node.lineno}::{owner}_post_process_rewards", cls_name is not None
    raise NotPresent("_post_process_rewards not found in " + ", ".join(r for r, _ in homes))


class RewardArgs(Namespace):
    """The arguments `_post_process_rewards` reads; others answer None (off)."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return None


def contiguous_groups(group: torch.Tensor) -> tuple[torch.Tensor, int, int]:
    """(order, largest group size, number of groups): `order` puts the rows group by group, groups
    in order of first appearance, rows in their order inside a group."""
    first: dict[int, int] = {}
    for b, g in enumerate(group.tolist()):
        first.setdefault(int(g), b)
    keys = [(first[int(g)], b) for b, g in enumerate(group.tolist())]
    order = torch.tensor(sorted(range(len(keys)), key=lambda b: keys[b]), dtype=torch.int64)
    sizes = torch.unique(group, return_counts=True)[1]
    return order, int(sizes.max()), len(first)


def make_sample(types_mod, reward: float):
    """A real `Sample` carrying only the reward (the rest at its defaults), or None."""
    cls = getattr(types_mod, "Sample", None) if types_mod is not None else None
    return cls(reward=reward) if cls is not None else None


def grpo_runner(post: Callable, is_method: bool, grpo_returns: Callable, sample_cls: Callable) -> Callable:
    def run(case: Case, device: str):
        group = case.group if case.group is not None else torch.zeros(case.shape[0], dtype=torch.int64)
        order, n, k = contiguous_groups(group)
        s = Samples.from_case(case, device)
        scores = [float(x) for x in case.score.to(case.torch_dtype).to(torch.float64)]
        samples = [sample_cls(scores[int(b)]) for b in order]
        args = RewardArgs(
            advantage_estimator=case.options.get("advantage_estimator", "grpo"),  # a discovered variant sets it
            rewards_normalization=True,
            grpo_std_normalization=bool(case.options.get("grpo_std_normalization", True)),
            n_samples_per_prompt=n,
            rollout_batch_size=k,
            reward_key=None,
        )
        if is_method:
            _, normed = post(Namespace(args=args, custom_reward_post_process_func=None), samples)
        else:
            _, normed = post(args, samples, None)
        back = [0.0] * len(normed)
        for i, b in enumerate(order.tolist()):
            back[b] = normed[i]
        # the trainer: rewards as float32, KL zeros of float32 per response token (kl_coef == 0)
        rewards = torch.tensor(back, dtype=torch.float32, device=device)
        kl = [torch.zeros(hi - lo, dtype=torch.float32, device=device) for lo, hi in s.spans]
        return (s.scatter(case, list(grpo_returns(rewards, kl))),)

    return run


def kl_runner(fn: Callable, kl_type: str) -> Callable:
    def run(case: Case, device: str):
        dt = case.torch_dtype
        logp = case.extra["logp"].to(device=device, dtype=dt)
        ref = case.extra["ref_logp"].to(device=device, dtype=dt)
        return (fn(logp, ref, kl_loss_type=kl_type),)

    return run


def init_one_rank_gloo() -> str:
    """A one-rank gloo default process group for this worker (idempotent)."""
    import torch.distributed as dist

    if dist.is_available() and not dist.is_initialized():
        fd, path = tempfile.mkstemp(prefix="maskfuzz-gloo-")
        os.close(fd)
        os.unlink(path)
        dist.init_process_group("gloo", init_method=f"file://{path}", rank=0, world_size=1)
    return "state: torch.distributed initialised as a one-rank gloo group (the all-reduce is the identity)"


def whiten_runner(fn: Callable) -> Callable:
    def run(case: Case, device: str):
        s = Samples.from_case(case, device)
        dt = case.torch_dtype
        x = [case.extra["x"][b, lo:hi].to(device=device, dtype=dt) for b, (lo, hi) in enumerate(s.spans)]
        all_advs, all_masks = torch.cat(x), torch.cat(s.loss_masks)
        out = fn(all_advs, all_masks, process_group=None, shift_mean=True)
        return (s.scatter(case, list(torch.split(out, [hi - lo for lo, hi in s.spans]))),)

    return run


def reinforce_runner(fn: Callable, kl_fn: Callable, **fixed) -> Callable:
    """REINFORCE++ returns with the caller's arguments; token rewards as k1 KL with kl_coef 1."""
    params = inspect.signature(fn).parameters

    def run(case: Case, device: str):
        s = Samples.from_case(case, device)
        kl = [kl_fn(torch.zeros_like(r), r, kl_loss_type="k1") for r in s.token_rewards]
        kwargs = dict(
            rewards=torch.tensor(s.scores, dtype=torch.float32, device=device),
            kl=kl,
            loss_masks=[m.clone() for m in s.loss_masks],
            response_lengths=list(s.response_lengths),
            total_lengths=list(s.total_lengths),
            kl_coef=1.0,
            gamma=case.gamma,
        )
        kwargs.update({k: v for k, v in fixed.items() if k in params})
        ret = fn(**kwargs)
        out = s.scatter(case, list(ret))
        return out, out.clone()

    return run


# ---------------------------------------------------------------------------------------------
# load
# ---------------------------------------------------------------------------------------------
def load(root: Path, entry: str) -> Loaded:
    if entry in LOSS_ENTRIES:
        return load_loss(root, entry)
    if entry in VALUE_ENTRIES:
        return load_value(root, entry)
    if entry in POLICY_ENTRIES:
        return load_policy(root, entry)
    if entry == "reinforce++-kl":
        return load_reinforce_kl(root)
    if entry not in KIND_ENTRIES:
        raise NotPresent(f"unknown entry {entry!r}")
    notes: list[str] = []
    if entry == "grpo":
        post, post_where, is_method = reward_postprocess(root, ("miles",))
        ret, ret_where = math_function(root, "get_grpo_returns")
        types_mod = import_from(root, "miles.utils.types")
        notes += [
            f"{post_where} compiled from the source text (self = args + custom_reward_post_process_func None)"
            if is_method
            else f"{post_where} compiled from the source text",
            "rows ordered group by group (as the rollout's list of groups); n_samples_per_prompt = the largest "
            "group, rollout_batch_size = the number of groups; order restored after",
            "then the trainer: float32 rewards, float32 zero KL per response token (kl_coef 0), get_grpo_returns",
        ]
        run = grpo_runner(post, is_method, ret, lambda r: make_sample(types_mod, r))
        return Loaded(run, f"{post_where} + {ret_where}", notes)
    if entry == "whiten":
        fn, where = function_from(root, [("miles.utils.distributed_utils", "distributed_masked_whiten")])
        notes.append(init_one_rank_gloo())
        notes.append("per-sample advantages and loss masks concatenated (loss.py normalize_advantages)")
        return Loaded(whiten_runner(fn), where, notes)
    kl_fn, kl_where = math_function(root, "compute_approx_kl")
    kl_eager = eager(kl_fn)
    if kl_eager is not kl_fn:
        notes.append("compute_approx_kl: the eager function under @torch.compile (_torchdynamo_orig_callable)")
    if entry in KL_ENTRIES:
        notes.append(f"kl_loss_type={KL_ENTRIES[entry]!r}")
        return Loaded(kl_runner(kl_eager, KL_ENTRIES[entry]), kl_where, notes)
    # reinforce++
    state, more = provide_parallel_state(root)
    notes += more
    fn, where = math_function(root, "get_reinforce_plus_plus_returns")
    notes.append("token rewards enter as KL: compute_approx_kl(0, token_rewards, 'k1'), kl_coef = 1")
    return Loaded(reinforce_runner(fn, kl_eager, parallel_state=state), where, notes)


def load_reinforce_kl(root: Path) -> Loaded:
    """REINFORCE++ with the KL in the reward, through the trainer's compute_advantages_and_returns (W
    miles/backends/training_utils/loss.py:291, G :19) with advantage_estimator reinforce_plus_plus:
    compute_approx_kl(log_probs, ref_log_probs, 'k1') per sample (W :326-337, G :54-65), then
    get_reinforce_plus_plus_returns(kl=kl, kl_coef=...) shapes -kl_coef * kl (unmasked), puts the score at the last
    loss_mask == 1 token and discounts every response token (W miles/utils/ppo_utils.py:412-423, G
    loss_hub/math_utils.py:486-497)."""
    call, caller_where, notes = kl_caller(root)
    _, where = math_function(root, "get_reinforce_plus_plus_returns")

    def run(case: Case, device: str):
        return run_kl_caller(
            call, case, device, critic=False, advantage_estimator="reinforce_plus_plus", qkv_format="thd"
        )

    return Loaded(run, f"{where} via {caller_where}", notes + kl_smoke(run))


# ---------------------------------------------------------------------------------------------
# loss-aggregation: the trainer's loss_function with slime's / miles' own reducer, one optimizer step.
# ---------------------------------------------------------------------------------------------
# entry -> calculate_per_token_loss (the reducer get_sum_of_sample_mean hands back: sum_of_sample_mean for
# False, sum_of_token for True); slime adds "agg-rollout-mean" (slime.calls_kinds.SLIME_LOSS_ENTRIES)
LOSS_ENTRIES = {"agg-seq-mean-token-mean": False, "agg-token-mean": True}
CUSTOM_LOSS = "maskfuzz.targets.miles.calls_kinds.reducer_loss"


def reducer_loss(args, batch, logits, sum_of_sample_mean):
    """A `--loss-type custom_loss` function (`--custom-loss-function-path`, loaded by the framework's
    `load_function`): the reducer the framework built for this micro-batch, applied to the per-token
    losses, which the adapter passes in place of the logits. Nothing else."""
    return sum_of_sample_mean(logits), {}


class LossArgs(Namespace):
    """The arguments `loss_function` reads; any other answers None (off) and is recorded."""

    unknown: set[str] = set()

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        LossArgs.unknown.add(name)
        return None


def loss_args(per_token: bool, global_batch_size: int) -> LossArgs:
    return LossArgs(
        loss_type="custom_loss",
        custom_loss_function_path=CUSTOM_LOSS,
        calculate_per_token_loss=per_token,
        recompute_loss_function=False,
        allgather_cp=False,
        qkv_format="thd",
        use_dynamic_global_batch_size=False,
        global_batch_size=global_batch_size,
        true_on_policy_mode=False,
        multi_lora=False,
    )


def micro_batch(case: Case, rows: torch.Tensor, loss: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """One micro-batch as the trainer's batch: per-sample lists without padding (a row's real run is
    its response), loss_masks torch.int (slime/miles actor.py move them `.to(dtype=torch.int)`), and
    the per-token losses concatenated in sample order (the packed THD layout the reducer splits)."""
    att = case.attention[rows.cpu()]
    xs, masks, lengths = [], [], []
    for i in range(len(rows)):
        real = att[i].nonzero().flatten()
        lo, hi = (int(real[0]), int(real[-1]) + 1) if real.numel() else (0, 0)
        xs.append(loss[i, lo:hi])
        masks.append(mask[i, lo:hi].to(torch.int))
        lengths.append(hi - lo)
    batch = {"total_lengths": [n + PROMPT_LEN for n in lengths], "response_lengths": lengths, "loss_masks": masks}
    return torch.cat(xs), batch


def megatron_step(call: Callable, per_token: bool) -> Callable:
    """`loss_step.run_step`'s micro_loss for a Megatron trainer. `call(x, batch, rows, num_microbatches,
    step)` runs the framework's `loss_function` and returns its `(loss, normalizer, log)`; then what
    Megatron-core does with it (megatron/core/pipeline_parallel/schedules.py::forward_step_calc_loss,
    distributed/distributed_data_parallel.py, distributed/finalize_model_grads.py):

    * not per-token: `loss / clamp(normalizer, min=1) / num_microbatches` before backward, and the
      DDP gradient averaged over data-parallel ranks (`gradient_scaling_factor = 1 / dp_size`): the
      driver's mean over ranks.
    * per-token (`calculate_per_token_loss`): the loss is backpropagated as it is, DDP sums the
      gradients over ranks (`gradient_scaling_factor = 1.0`) and `finalize_model_grads` scales them by
      1 / (the normalisers summed over every micro-batch and all-reduced over data-parallel ranks):
      `loss * dp_size / total` against the driver's mean. The total comes from the framework's own
      normalisers, one `loss_function` call per micro-batch of the step."""
    cache: dict = {}

    def total_normaliser(step: Step, device) -> torch.Tensor:
        if cache.get("case") is not step.case:
            total = 0
            for _, rows in microbatches(step.case):
                idx = rows.to(device)
                zeros = torch.zeros(step.mask[idx].shape, dtype=step.mask.dtype, device=device)
                x, batch = micro_batch(step.case, rows, zeros, step.mask[idx])
                _, normaliser, _ = call(x, batch, rows, 1, step)
                total = total + normaliser
            cache.update(case=step.case, total=total)
        return cache["total"]

    def micro(rows, loss, mask, step):
        x, batch = micro_batch(step.case, rows, loss, mask)
        out, normaliser, _ = call(x, batch, rows, step.rank_micro_batches, step)
        if not per_token:
            return out / torch.clamp(normaliser, min=1) / step.rank_micro_batches
        return out * step.ranks / total_normaliser(step, loss.device)

    return micro


def with_dp(state, ranks: int):
    """`state` (a miles ParallelState of one rank) with the data-parallel groups of `ranks` ranks."""
    group = type(state.intra_dp)
    dp = group(rank=0, size=ranks, group=None)
    return dataclasses.replace(state, intra_dp=dp, intra_dp_cp=dp)


def load_loss(root: Path, entry: str) -> Loaded:
    """`miles/backends/training_utils/loss.py::loss_function` over one optimizer step, as the Megatron
    trainer drives it (miles/backends/megatron_utils/model.py:522 at 3d2e0e411 binds
    `partial(loss_function, args, batch, num_microbatches, apply_megatron_loss_scaling=True)`).

    The loss is `--loss-type custom_loss` with `reducer_loss`: the reducer loss_function builds,
    `get_sum_of_sample_mean(total_lengths, response_lengths, loss_masks, calculate_per_token_loss,
    qkv_format, max_seq_lens)` (cp_utils.py:92 at every pin), applied to the per-token losses. The
    step's normalisers are the trainer's: `global_batch_size` = `args.global_batch_size`, the samples of
    one step over all ranks (miles/backends/training_utils/data.py:365-367 at 0.0.2, :439-441 at
    3d2e0e411: each rank takes global_batch_size // dp_size samples a step), `num_microbatches` the
    rank's micro-batches (data.py:382 / :462), the data-parallel size from miles' ParallelState
    (`intra_dp_cp.size`, loss.py:1049-1056 at 0.0.2, :164-172 at 3d2e0e411), CP size 1. Megatron's
    scaling after it: `megatron_step`."""
    per_token = LOSS_ENTRIES[entry]
    fn, where = function_from(root, [("miles.backends.training_utils.loss", "loss_function")])
    if "apply_megatron_loss_scaling" not in inspect.signature(fn).parameters:
        raise NotPresent(f"{where} has no apply_megatron_loss_scaling at this pin")
    parallel = import_from(root, "miles.backends.training_utils.parallel")
    state, notes = provide_parallel_state(root)
    if state is None or not hasattr(parallel, "set_parallel_state"):
        raise NotPresent("no settable ParallelState at this pin")

    def call(x, batch, rows, num_microbatches, step):
        parallel.set_parallel_state(with_dp(state, step.ranks))
        args = loss_args(per_token, step.rows)
        return fn(args, batch, num_microbatches, x, apply_megatron_loss_scaling=True)

    micro = megatron_step(call, per_token)

    def run(case: Case, device: str):
        return run_step(case, device, micro)

    notes += [
        f"--loss-type custom_loss ({CUSTOM_LOSS}): get_sum_of_sample_mean's reducer on the per-token losses, "
        f"calculate_per_token_loss={per_token}",
        "global_batch_size = the step's samples (all ranks); num_microbatches = the rank's; ParallelState "
        "intra_dp / intra_dp_cp of the case's ranks, CP 1; Megatron's forward_step / DDP / finalize_model_grads "
        "scaling after it",
    ]
    return Loaded(run, where, notes)


# ---------------------------------------------------------------------------------------------
# value-loss: the critic's `--loss-type value_loss` through the same loss_function, one optimizer step.
# ---------------------------------------------------------------------------------------------
VALUE_ENTRIES = ("value-loss",)
VALUE_CLIP = 0.2  # --value-clip default (W miles/utils/arguments.py:890, G :1121; slime arguments.py:907)
VALUE_HOMES = ("miles.backends.training_utils.loss_hub.losses", "miles.backends.training_utils.loss")


def value_options(case: Case) -> tuple[bool, float]:
    """(calculate_per_token_loss, value_clip) of the case: its options over the argparse defaults."""
    return bool(case.options.get("calculate_per_token_loss", False)), float(case.options.get("value_clip", VALUE_CLIP))


def value_args(case: Case, global_batch_size: int) -> LossArgs:
    """`loss_args` of the critic: `loss_type = "value_loss"` (what the critic's train sets, W
    miles/backends/megatron_utils/actor.py:356, slime actor.py:407), `value_clip`, `calculate_per_token_loss`
    and `rollout_temperature` (default 1.0; get_responses divides the value logits by it at W loss.py:80 and
    slime 166441911 loss.py:69-70) from the case's options."""
    per_token, clip = value_options(case)
    args = loss_args(per_token, global_batch_size)
    args.loss_type = "value_loss"
    args.custom_loss_function_path = None
    args.value_clip = clip
    args.rollout_temperature = float(case.options.get("rollout_temperature", 1.0))
    return args


def value_batch(case: Case, rows: torch.Tensor, x: torch.Tensor, batch: dict) -> tuple[torch.Tensor, dict]:
    """value_loss_function's inputs for one micro-batch of `micro_batch` (x: the rows' predictions v on their
    response tokens, concatenated): the value head's packed THD output `[1, sum(total_lengths), 1]`, where
    get_responses reads sample i's response at `logits[start - 1 : end - 1]` (end = the running sum of
    total_lengths, start = end - response_length, CP 1), so each sample's span is PROMPT_LEN - 1 fillers, its
    predictions, one filler (the logit after the last token, never read); and the batch keys the function
    reads: "values" (the old values), "returns", "unconcat_tokens" (prompt + response tokens; only sliced)."""
    lengths = batch["response_lengths"]
    att = case.attention[rows.cpu()]
    parts, olds, rets, tokens = [], [], [], []
    for i, (xi, n) in enumerate(zip(x.split(lengths), lengths)):
        real = att[i].nonzero().flatten()
        lo = int(real[0]) if real.numel() else 0
        b = int(rows[i])
        parts += [x.new_zeros(PROMPT_LEN - 1), xi, x.new_zeros(1)]
        olds.append(case.extra["v_old"][b, lo : lo + n].to(device=x.device, dtype=x.dtype))
        rets.append(case.extra["ret"][b, lo : lo + n].to(device=x.device, dtype=x.dtype))
        tokens.append(torch.zeros(PROMPT_LEN + n, dtype=torch.long, device=x.device))
    logits = torch.cat(parts).reshape(1, -1, 1)
    return logits, {**batch, "values": olds, "returns": rets, "unconcat_tokens": tokens}


def value_function(root: Path, homes=VALUE_HOMES) -> tuple[Callable, str]:
    """`value_loss_function` at the pin, for `where`: the dispatch (`match args.loss_type`) returns the global of
    the module that defines it (W loss.py:1018-1019, G loss_hub/losses.py:483-484, slime loss.py:1330-1331)."""
    return function_from(root, [(m, "value_loss_function") for m in homes])


def value_runner(micros: dict) -> Callable:
    """`micros[per_token]` is the Megatron micro_loss of the case's `calculate_per_token_loss`."""

    def run(case: Case, device: str):
        per_token, _ = value_options(case)
        return run_step(case, device, micros[per_token], leaf_name="v")

    return run


def load_value(root: Path, entry: str) -> Loaded:
    """miles' critic loss over one optimizer step: `loss_function(args, batch, num_microbatches, logits,
    apply_megatron_loss_scaling=True)` (as `load_loss`) with `args.loss_type = "value_loss"`, which dispatches
    to `value_loss_function` (W miles/backends/training_utils/loss.py:863, dispatch :1018-1019; G
    loss_hub/losses.py:370 via get_loss_function). The function reads the predictions from the value head's
    output through get_values (`value_batch` builds it from the case's v, the gradient's leaf), the old values
    and returns from the batch, `max((v_c - R)^2, (v - R)^2)` per token with v_c = old + clamp(v - old,
    -value_clip, value_clip), no factor 1/2 (W :900-904), then the reducer: sum_of_sample_mean, or the token
    sum with --calculate-per-token-loss; the normalisers and Megatron's scaling are the loss entries'."""
    fn, where = function_from(root, [("miles.backends.training_utils.loss", "loss_function")])
    if "apply_megatron_loss_scaling" not in inspect.signature(fn).parameters:
        raise NotPresent(f"{where} has no apply_megatron_loss_scaling at this pin")
    vfn, vwhere = value_function(root)
    parallel = import_from(root, "miles.backends.training_utils.parallel")
    state, notes = provide_parallel_state(root)
    if state is None or not hasattr(parallel, "set_parallel_state"):
        raise NotPresent("no settable ParallelState at this pin")

    def call(x, batch, rows, num_microbatches, step):
        parallel.set_parallel_state(with_dp(state, step.ranks))
        logits, vbatch = value_batch(step.case, rows, x, batch)
        return fn(value_args(step.case, step.rows), vbatch, num_microbatches, logits, apply_megatron_loss_scaling=True)

    notes += [
        f"--loss-type value_loss: loss_function dispatches to {vwhere}; value_clip and calculate_per_token_loss "
        "from the case's options (defaults 0.2, False)",
        "the case's v as the value head's packed [1, T, 1] output (read back by get_values), v_old as "
        "batch['values'], ret as batch['returns']; the gradient is d loss / d v",
        "global_batch_size = the step's samples (all ranks); num_microbatches = the rank's; ParallelState "
        "intra_dp / intra_dp_cp of the case's ranks, CP 1; Megatron's scaling after it (megatron_step)",
    ]
    micros = {p: megatron_step(call, p) for p in (False, True)}
    return Loaded(value_runner(micros), f"{vwhere} via {where}", notes)


# ---------------------------------------------------------------------------------------------
# policy-loss: the actor's `--loss-type policy_loss` through the same loss_function, one optimizer step.
# ---------------------------------------------------------------------------------------------
POLICY_ENTRIES = ("policy-loss", "policy-gspo")
# entry -> the arguments it sets over policy_args' (the rest at their defaults): GSPO is --advantage-estimator gspo,
# which makes policy_loss_function take the sequence KL (compute_gspo_kl; miles 0.0.2 loss.py:647-653, slime
# 624b824a8 loss.py:1021)
POLICY_SETTINGS = {"policy-gspo": {"advantage_estimator": "gspo"}}
EPS_CLIP = 0.2  # --eps-clip default (W miles/utils/arguments.py:882; slime arguments.py:899, 166441911 :733)


def policy_args(case: Case, global_batch_size: int) -> LossArgs:
    """`loss_args` of the actor: `loss_type = "policy_loss"` (the argparse default), the PPO clip from the case's
    options (`eps_clip_high` None = `eps_clip`, as the argument check sets it; `eps_clip_c` None = no dual clip),
    `calculate_per_token_loss`, and every other switch policy_loss_function reads at its default: advantage
    estimator grpo (per-token KL, not gspo's sequence KL, not cispo), entropy_coef 0, no KL loss, no TIS / OPSM /
    mismatch metrics, old log-probs from the actor (not the rollout's), rollout temperature and top-p 1."""
    per_token = bool(case.options.get("calculate_per_token_loss", False))
    high = case.options.get("eps_clip_high")
    args = loss_args(per_token, global_batch_size)
    args.loss_type = "policy_loss"
    args.custom_loss_function_path = None
    args.eps_clip = EPS_CLIP
    args.eps_clip_high = EPS_CLIP if high is None else float(high)
    args.eps_clip_c = case.options.get("eps_clip_c")
    args.advantage_estimator = "grpo"
    args.entropy_coef = 0.0
    args.use_kl_loss = False
    args.kl_loss_coef = 0.0
    args.use_rollout_logprobs = False
    args.use_tis = False
    args.use_opsm = False
    args.get_mismatch_metrics = False
    args.rollout_temperature = 1.0
    args.rollout_top_p = 1.0
    args.log_probs_chunk_size = -1
    return args


def token_log_probs(logits, tokens, tp_group, with_entropy: bool = False, **_ignored):
    """Stands in for `calculate_log_probs_and_entropy` (the model's vocab-parallel log-softmax, megatron's
    fused cross entropy): the packed `[R, 1]` "logits" ARE the response tokens' log-probs, returned as the
    `[R, 1]` log-probs the caller squeezes; entropy zeros (entropy_coef is 0: it never reaches the loss)."""
    entropy = logits.detach().new_zeros(logits.shape[:-1]) if with_entropy else None
    return logits, entropy


def policy_batch(case: Case, rows: torch.Tensor, x: torch.Tensor, batch: dict) -> tuple[torch.Tensor, dict]:
    """policy_loss_function's inputs for one micro-batch of `micro_batch` (x: the rows' log-probs on their response
    tokens, concatenated): the packed `[1, sum(total_lengths), 1]` logits laid out as `value_batch` lays out the
    value head (sample i's response read at `logits[start - 1 : end - 1]`, get_responses / _extract_per_sample at
    CP 1), and the batch keys the function reads: "log_probs" (old, the actor's recomputed), "advantages"
    (per token), "unconcat_tokens"."""
    lengths = batch["response_lengths"]
    att = case.attention[rows.cpu()]
    parts, olds, advs, tokens = [], [], [], []
    for i, (xi, n) in enumerate(zip(x.split(lengths), lengths)):
        real = att[i].nonzero().flatten()
        lo = int(real[0]) if real.numel() else 0
        b = int(rows[i])
        parts += [x.new_zeros(PROMPT_LEN - 1), xi, x.new_zeros(1)]
        olds.append(case.extra["old_logp"][b, lo : lo + n].to(device=x.device, dtype=x.dtype))
        advs.append(case.extra["adv"][b, lo : lo + n].to(device=x.device, dtype=x.dtype))
        tokens.append(torch.zeros(PROMPT_LEN + n, dtype=torch.long, device=x.device))
    logits = torch.cat(parts).reshape(1, -1, 1)
    return logits, {**batch, "log_probs": olds, "advantages": advs, "unconcat_tokens": tokens}


def apply_settings(args: LossArgs, settings: dict, defaults: dict) -> None:
    """A discovered variant's namespace (`calls_discovered`): `defaults` (the argparse defaults of what the policy
    loss reads, read by AST) where `args` sets nothing, then `settings` (the variant's option) over everything."""
    for name, value in defaults.items():
        if name not in vars(args):
            setattr(args, name, value)
    for name, value in settings.items():
        setattr(args, name, value)


def with_rollout_log_probs(case: Case, rows: torch.Tensor, pbatch: dict) -> dict:
    """`pbatch` with "rollout_log_probs" per sample, which the importance-sampling corrections read: the case's
    rollout-engine log-probs where the entry's domain draws them (`extra["rollout_logp"]`, near the old ones, poison
    under the mask), else `old - (logp - old) / 2` at every token (an elementwise function of the drawn log-probs,
    detached: the ratio old / rollout = exp((logp - old) / 2) moves with the update, and every invariant of the kind
    still holds for it)."""
    att = case.attention[rows.cpu()]
    drawn = case.extra.get("rollout_logp")
    out = []
    for i, old in enumerate(pbatch["log_probs"]):
        real = att[i].nonzero().flatten()
        lo = int(real[0]) if real.numel() else 0
        b, n = int(rows[i]), old.shape[0]
        if drawn is not None:
            out.append(drawn[b, lo : lo + n].to(device=old.device, dtype=old.dtype).detach())
            continue
        logp = case.extra["logp"][b, lo : lo + n].to(device=old.device, dtype=old.dtype)
        out.append((old - (logp - old) / 2).detach())
    return {**pbatch, "rollout_log_probs": out}


def with_ref_log_probs(pbatch: dict) -> dict:
    """`pbatch` with "ref_log_probs" per sample, which `--use-kl-loss` reads (slime loss.py:1116-1117 at git HEAD):
    the old log-probs, detached, as at the first step, where the reference and the rollout policy are one model;
    poison under the mask reaches them as it reaches the old log-probs."""
    return {**pbatch, "ref_log_probs": [old.detach().clone() for old in pbatch["log_probs"]]}


def bind_policy_stand_ins(loss_mod) -> list[str]:
    """The log-prob stand-in (`token_log_probs`) in the module that calls `calculate_log_probs_and_entropy`, and the
    eager `compute_policy_loss` under its `@torch.compile(dynamic=True)` (inductor is not under test, as for the kl
    entries) in `loss_mod`, the module of policy_loss_function, which calls it. The caller of the log-softmax is the
    module of the `get_log_probs_and_entropy` policy_loss_function calls: loss.py itself at 0.0.2 (W :154), G
    loss_hub/logit_processors.py (import :7, call :178) at the git pins, where loss_hub/losses.py imports it (:13).
    Returns notes."""
    getter = getattr(loss_mod, "get_log_probs_and_entropy", None)
    lp_mod = (inspect.getmodule(getter) if getter is not None else None) or loss_mod
    for mod, name in ((lp_mod, "calculate_log_probs_and_entropy"), (loss_mod, "compute_policy_loss")):
        if not hasattr(mod, name):
            raise NotPresent(f"{mod.__name__} has no {name} at this pin")
    compiled = loss_mod.compute_policy_loss
    loss_mod.compute_policy_loss = eager(compiled)
    lp_mod.calculate_log_probs_and_entropy = token_log_probs
    return [
        f"log-probs: calculate_log_probs_and_entropy (the vocab-parallel log-softmax), called in {lp_mod.__name__}, "
        "stands as the identity on [1, T, 1] logits that hold the case's logp (the leaf), entropy 0 (entropy_coef "
        "0); the real get_log_probs_and_entropy slices them per sample",
        f"compute_policy_loss (called in {loss_mod.__name__}): the eager function under @torch.compile"
        + (" (_torchdynamo_orig_callable)" if loss_mod.compute_policy_loss is not compiled else " (not compiled)"),
        "defaults: eps_clip 0.2, eps_clip_high = eps_clip, eps_clip_c None, advantage_estimator grpo, entropy_coef "
        "0, no KL loss / TIS / OPSM, old log-probs = batch['log_probs']; options eps_clip_high, eps_clip_c, "
        "calculate_per_token_loss from the case",
        "the case's logp as the [1, T, 1] logits, old_logp as batch['log_probs'], adv as batch['advantages'] "
        "(per token); the gradient is d loss / d logp",
    ]


def policy_runner(micros: dict) -> Callable:
    """`micros[per_token]` is the Megatron micro_loss of the case's `calculate_per_token_loss`."""

    def run(case: Case, device: str):
        per_token = bool(case.options.get("calculate_per_token_loss", False))
        return run_step(case, device, micros[per_token], leaf_name="logp")

    return run


def load_policy(root: Path, entry: str, settings: dict | None = None, defaults: dict | None = None) -> Loaded:
    """miles' actor loss over one optimizer step: `loss_function(args, batch, num_microbatches, logits,
    apply_megatron_loss_scaling=True)` (as `load_loss`) with `args.loss_type = "policy_loss"`, which dispatches to
    `policy_loss_function` (W miles/backends/training_utils/loss.py:565, dispatch :1016-1017): log-probs from the
    logits (get_log_probs_and_entropy :154, its log-softmax stood in by `token_log_probs`), ppo_kl = old - logp,
    ppo_kl and advantages zeroed off the loss mask with nan_to_num (:669-679), compute_policy_loss(ppo_kl,
    advantages, eps_clip, eps_clip_high) (:681; miles/utils/ppo_utils.py:178-201), then the reducer
    (sum_of_sample_mean, or the token sum with --calculate-per-token-loss); normalisers and Megatron's scaling are
    the loss entries'. At the git pins (6ccdc7da6, 3d2e0e411, HEAD 31f1ca961) policy_loss_function is in
    loss_hub/losses.py:62 (get_loss_function), the log-softmax is called in loss_hub/logit_processors.py:178 and
    compute_policy_loss gets eps_clip_c too (losses.py:180-182, HEAD :207-209, #1729); `bind_policy_stand_ins`
    binds each stand-in in the module that calls it. `settings` / `defaults`: a discovered variant's namespace
    (`apply_settings`), with the batch's rollout log-probs (`with_rollout_log_probs`)."""
    fn, where = function_from(root, [("miles.backends.training_utils.loss", "loss_function")])
    if "apply_megatron_loss_scaling" not in inspect.signature(fn).parameters:
        raise NotPresent(f"{where} has no apply_megatron_loss_scaling at this pin")
    pfn, pwhere = function_from(
        root, [(m, "policy_loss_function") for m in ("miles.backends.training_utils.loss_hub.losses", *VALUE_HOMES)]
    )
    parallel = import_from(root, "miles.backends.training_utils.parallel")
    state, notes = provide_parallel_state(root)
    if state is None or not hasattr(parallel, "set_parallel_state"):
        raise NotPresent("no settable ParallelState at this pin")
    notes += bind_policy_stand_ins(inspect.getmodule(pfn))

    def call(x, batch, rows, num_microbatches, step):
        parallel.set_parallel_state(with_dp(state, step.ranks))
        logits, pbatch = policy_batch(step.case, rows, x, batch)
        args = policy_args(step.case, step.rows)
        for name, value in POLICY_SETTINGS.get(entry, {}).items():  # the entry's own (policy-gspo)
            setattr(args, name, value)
        if settings is not None:
            apply_settings(args, settings, defaults or {})
            pbatch = with_rollout_log_probs(step.case, rows, pbatch)
            pbatch = with_ref_log_probs(pbatch)
        return fn(args, pbatch, num_microbatches, logits, apply_megatron_loss_scaling=True)

    notes += [
        f"--loss-type policy_loss: loss_function dispatches to {pwhere}",
        "global_batch_size = the step's samples (all ranks); num_microbatches = the rank's; ParallelState "
        "intra_dp / intra_dp_cp of the case's ranks, CP 1; Megatron's scaling after it (megatron_step)",
    ]
    notes += [f"set: {k}={v!r}" for k, v in POLICY_SETTINGS.get(entry, {}).items()]
    micros = {p: megatron_step(call, p) for p in (False, True)}
    return Loaded(policy_runner(micros), f"{pwhere} via {where}", notes)

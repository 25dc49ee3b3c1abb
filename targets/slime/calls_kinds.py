"""slime entries beyond GAE (`shared/design/kinds.md`): group-advantage, kl, normalization, returns,
loss-aggregation (`load_loss`), value-loss (`load_value`: the critic's `--loss-type value_loss` through the
same `loss_function`, which dispatches to `value_loss_function`, loss.py:1176 at 624b824a8) and policy-loss
(`load_policy`: the actor's `--loss-type policy_loss`, `policy_loss_function`, loss.py:934).

slime is miles' origin; the code and the way it is called are the same, at other homes (read at
HEAD 624b824a8), so the runners are miles' (`targets.miles.calls_kinds`); the GAE calls are `calls.py`:

* `grpo`: `RolloutManager._post_process_rewards` (slime/ray/rollout.py:608-633, a method of a Ray
  actor class: compiled from the source text), then the trainer's `compute_advantages_and_returns`
  (loss.py:704), which calls `get_grpo_returns` (slime/utils/ppo_utils.py:361) with the float32 zero KL
  of `kl_coef == 0` (loss.py:743-746, 763-767), or `get_reinforce_plus_plus_baseline_advantages`, and
  whitens with `--normalize-advantages` (:819): the options `advantage_estimator`,
  `grpo_std_normalization`, `normalize_advantages` are set on the namespaces both read.
* `kl`, `kl-k2`, `kl-k3`, `kl-low-var`: `compute_approx_kl` (slime/utils/ppo_utils.py:11-51), the eager
  function under `@torch.compile(dynamic=True)`.
* `whiten`: `distributed_masked_whiten` (slime/utils/distributed_utils.py:111-171) over a one-rank
  gloo group, as `--normalize-advantages` calls it (loss.py:871).
* `reinforce++`: `get_reinforce_plus_plus_returns` (slime/utils/ppo_utils.py:371-445) through the same
  caller (advantage_estimator reinforce_plus_plus, token rewards as k1 KL, kl_coef 1; whitened with the
  option `normalize_advantages`); it asks `megatron.core.mpu` for the CP size inside the call: the
  single-rank state of the GAE adapter.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import torch

from maskfuzz.targets.adapters import extract
from maskfuzz.targets.adapters.base import Loaded, NotPresent, function_from, import_from
from maskfuzz.targets.adapters.loss_step import run_step
from maskfuzz.targets.miles import calls_kinds as mk
from maskfuzz.targets.slime.calls import (
    KL_COEF,
    Samples,
    caller_args,
    install_mpu_state,
    kl_smoke,
    rollout_data,
    run_kl_caller,
)

KIND_ENTRIES = mk.KIND_ENTRIES
SLIME_MATH_HOMES = ("slime.utils.ppo_utils",)
SLIME_REWARD_HOMES = (("slime/ray/rollout.py", "RolloutManager"),)


def load(root: Path, entry: str) -> Loaded:
    if entry in SLIME_LOSS_ENTRIES:
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
        post, post_where, is_method = mk.reward_postprocess(root, ("slime",), SLIME_REWARD_HOMES)
        ret, ret_where = mk.math_function(root, "get_grpo_returns", SLIME_MATH_HOMES)
        types_mod = import_from(root, "slime.utils.types")
        notes += [
            f"{post_where} compiled from the source text (self = args + custom_reward_post_process_func None)",
            "rows ordered group by group (as the rollout's list of groups); n_samples_per_prompt = the largest "
            "group, rollout_batch_size = the number of groups; order restored after",
            "then the trainer: float32 rewards, float32 zero KL per response token (kl_coef 0), get_grpo_returns",
        ]
        caller, caller_where = caller_of(root)
        notes[-1] = (
            f"then the trainer: {caller_where} with kl_coef 0 (float32 zero KL per response token), which calls "
            f"{ret_where.split('::')[-1]} (or get_reinforce_plus_plus_baseline_advantages) and whitens with "
            "--normalize-advantages"
        )
        run = grpo_runner(post, caller, lambda r: mk.make_sample(types_mod, r))
        return Loaded(run, f"{post_where} + {ret_where}", notes, absent_options=_absent_estimators(root))
    if entry == "whiten":
        fn, where = function_from(root, [("slime.utils.distributed_utils", "distributed_masked_whiten")])
        notes.append(mk.init_one_rank_gloo())
        notes.append("per-sample advantages and loss masks concatenated (loss.py normalize_advantages)")
        return Loaded(mk.whiten_runner(fn), where, notes)
    kl_fn, kl_where = mk.math_function(root, "compute_approx_kl", SLIME_MATH_HOMES)
    kl_eager = mk.eager(kl_fn)
    if kl_eager is not kl_fn:
        notes.append("compute_approx_kl: the eager function under @torch.compile (_torchdynamo_orig_callable)")
    if entry in mk.KL_ENTRIES:
        notes.append(f"kl_loss_type={mk.KL_ENTRIES[entry]!r}")
        return Loaded(mk.kl_runner(kl_eager, mk.KL_ENTRIES[entry]), kl_where, notes)
    install_mpu_state()
    notes.append("state: megatron.core.mpu answers CP size 1, CP rank 0 (as slime's tests stub it)")
    fn, where = mk.math_function(root, "get_reinforce_plus_plus_returns", SLIME_MATH_HOMES)
    caller, caller_where = caller_of(root)
    notes.append(
        f"through {caller_where} (advantage_estimator reinforce_plus_plus); token rewards enter as KL: "
        "log_probs 0, ref_log_probs = token_rewards, k1, kl_coef = 1"
    )
    return Loaded(reinforce_runner(caller), f"{where} via {caller_where}", notes)


# ---------------------------------------------------------------------------------------------
# grpo and reinforce++ through the trainer's compute_advantages_and_returns (it applies the options)
# ---------------------------------------------------------------------------------------------
def caller_of(root: Path):
    mpu = install_mpu_state()
    caller, where = function_from(root, [("slime.backends.megatron_utils.loss", "compute_advantages_and_returns")])
    if getattr(import_from(root, "slime.backends.megatron_utils.loss"), "mpu", mpu) is not mpu:
        raise RuntimeError("slime's loss.py bound a megatron mpu other than the single-rank state")
    return caller, where


def load_reinforce_kl(root: Path) -> Loaded:
    """REINFORCE++ with the KL in the reward, through the trainer's compute_advantages_and_returns (loss.py:704 at
    624b824a8, :222 at 166441911) with advantage_estimator reinforce_plus_plus: compute_approx_kl(log_probs,
    ref_log_probs, 'k1') per sample (:743-754), then get_reinforce_plus_plus_returns(kl=kl, kl_coef=...) masks it,
    shapes -kl_coef * masked_kl, puts the score at the last loss_mask == 1 token (ppo_utils.py:415-419) and
    discounts (:430)."""
    fn, where = mk.math_function(root, "get_reinforce_plus_plus_returns", SLIME_MATH_HOMES)
    caller, caller_where = caller_of(root)
    notes = [
        "state: megatron.core.mpu answers CP size 1, CP rank 0 (as slime's tests stub it)",
        f"through {caller_where} (advantage_estimator reinforce_plus_plus): log_probs = logp, ref_log_probs = "
        f"ref_logp, kl_loss_type 'k1', kl_coef {KL_COEF}; the caller computes compute_approx_kl, "
        f"{where.split('::')[-1]} shapes -kl_coef * masked KL and adds the score",
    ]

    def run(case, device: str):
        return run_kl_caller(caller, case, device, critic=False, advantage_estimator="reinforce_plus_plus")

    return Loaded(run, f"{where} via {caller_where}", notes + kl_smoke(run))


# estimators the grpo entry's option may set only where both the rollout and the trainer list them with grpo
# (624b824a8: slime/ray/rollout.py:614, :627 and slime/backends/megatron_utils/loss.py:763 `["grpo", "gspo", "cispo"]`)
_SHARED_ESTIMATORS = ("cispo",)
_ESTIMATOR_FILES = ("slime/ray/rollout.py", "slime/backends/megatron_utils/loss.py")


def _absent_estimators(root: Path) -> dict[str, tuple[tuple, str]]:
    """advantage_estimator values on grpo's path that the pin's rollout or trainer does not name (never drawn)."""
    texts = [(Path(root) / f).read_text() if (Path(root) / f).is_file() else "" for f in _ESTIMATOR_FILES]
    gone = tuple(e for e in _SHARED_ESTIMATORS if not all(f'"{e}"' in t for t in texts))
    return {"advantage_estimator": (gone, f"not named in {' and '.join(_ESTIMATOR_FILES)} at this pin")} if gone else {}


def grpo_runner(post, caller, sample_cls):
    """The rollout's `_post_process_rewards` then the trainer's caller, both configured by the case's
    options (`advantage_estimator`, `grpo_std_normalization`, `normalize_advantages`)."""

    def run(case, device: str):
        estimator = case.options.get("advantage_estimator", "grpo")
        group = case.group if case.group is not None else torch.zeros(case.shape[0], dtype=torch.int64)
        order, n, k = mk.contiguous_groups(group)
        scores = [float(x) for x in case.score.to(case.torch_dtype).to(torch.float64)]
        samples = [sample_cls(scores[int(b)]) for b in order]
        args = mk.RewardArgs(
            advantage_estimator=estimator,
            rewards_normalization=True,
            grpo_std_normalization=bool(case.options.get("grpo_std_normalization", True)),
            n_samples_per_prompt=n,
            rollout_batch_size=k,
            reward_key=None,
        )
        _, normed = post(mk.Namespace(args=args, custom_reward_post_process_func=None), samples)
        back = [0.0] * len(normed)
        for i, b in enumerate(order.tolist()):
            back[b] = normed[i]
        s = Samples.from_case(case, device)
        zeros = [torch.zeros(hi - lo, dtype=torch.float32, device=device) for lo, hi in s.spans]
        data = {
            "log_probs": zeros,
            "ref_log_probs": [z.clone() for z in zeros],
            "rewards": back,
            "values": None,
            "response_lengths": list(s.response_lengths),
            "total_lengths": list(s.total_lengths),
            "loss_masks": [m.clone() for m in s.loss_masks],
        }
        cargs = caller_args(
            1.0,
            1.0,
            advantage_estimator=estimator,
            kl_coef=0.0,  # the default: KL zeros of float32 (loss.py:743-746)
            normalize_advantages=bool(case.options.get("normalize_advantages", False)),
        )
        caller(cargs, data)
        return (s.scatter(case, list(data["advantages"])),)

    return run


def reinforce_runner(caller):
    """REINFORCE++ returns through the caller; token rewards as k1 KL with kl_coef 1, scores the rewards."""

    def run(case, device: str):
        s = Samples.from_case(case, device)
        data = rollout_data(s)
        data["values"] = None
        cargs = caller_args(
            case.gamma,
            1.0,
            advantage_estimator="reinforce_plus_plus",
            normalize_advantages=bool(case.options.get("normalize_advantages", False)),
        )
        caller(cargs, data)
        adv, ret = s.scatter(case, list(data["advantages"])), s.scatter(case, list(data["returns"]))
        return adv, ret

    return run


# ---------------------------------------------------------------------------------------------
# loss-aggregation
# ---------------------------------------------------------------------------------------------
# entry -> calculate_per_token_loss; "agg-rollout-mean": the per-rollout mean of Sample.rollout_id (the case's
# group ids), the sum_of_sample_mean reducer with the precomputed rollout_mask_sums denominators
SLIME_LOSS_ENTRIES = {**mk.LOSS_ENTRIES, "agg-rollout-mean": False}


def train_data_converter(root: Path):
    """`RolloutManager._convert_samples_to_train_data` (slime/ray/rollout.py:635 at 624b824a8) compiled from
    the source text, a method with a stand-in self: args (rollout_top_p 1.0, the rest None), no custom
    converter, and `_post_process_rewards` returning the rewards as they are (they reach no loss here)."""
    rel = "slime/ray/rollout.py"
    tree = extract.SourceTree(Path(root), ("slime",))
    cls = extract.find_class(tree.file(Path(root, rel)).tree, "RolloutManager")
    node = extract.find_method(cls, "_convert_samples_to_train_data") if cls is not None else None
    if node is None:
        raise NotPresent(f"{rel} has no RolloutManager._convert_samples_to_train_data")
    fn = tree.function(Path(root, rel), node)
    types_mod = import_from(root, "slime.utils.types")

    def convert(case, rollout_ids) -> dict:
        samples = []
        for b in range(case.shape[0]):
            real = case.attention[b].nonzero().flatten()
            lo, hi = (int(real[0]), int(real[-1]) + 1) if real.numel() else (0, 0)
            samples.append(
                types_mod.Sample(
                    tokens=[0] * (mk.PROMPT_LEN + hi - lo),
                    response_length=hi - lo,
                    loss_mask=[int(x) for x in case.trainable[b, lo:hi].tolist()],
                    rollout_id=None if rollout_ids is None else int(rollout_ids[b]),
                    reward=0.0,
                    metadata=None,
                )
            )
        rewards = [0.0] * len(samples)
        this = mk.Namespace(
            args=mk.RewardArgs(rollout_top_p=1.0),
            custom_convert_samples_to_train_data_func=None,
            _post_process_rewards=lambda s: (rewards, rewards),
        )
        return fn(this, samples)

    return convert, f"{rel}:{node.lineno}::RolloutManager._convert_samples_to_train_data"


def step_denominators(root: Path, per_rollout: bool):
    """`denominators(case) -> (rollout_mask_sums float32 [B], rollout count)` as the trainer computes them
    before its micro-batch loop (624b824a8), from slime's own `_convert_samples_to_train_data`; rollout_id =
    the case's group ids when `per_rollout`, else None (a fresh id per sample, rollout.py:646-655). And notes."""
    convert, convert_where = train_data_converter(root)
    notes = [
        f"rollout_mask_sums and the rollout count from {convert_where} (compiled from the source text)",
        "rollout_id = the case's group ids" if per_rollout else "rollout_id None (one per sample)",
    ]
    cache: dict = {}

    def denominators(case) -> tuple[torch.Tensor, int]:
        if cache.get("case") is not case:
            ids = case.group.tolist() if per_rollout and case.group is not None else None
            data = convert(case, ids)
            sums = torch.tensor(data["rollout_mask_sums"], dtype=torch.float32)  # actor.py:267-268
            cache.update(case=case, sums=sums, rollouts=len(set(data["rollout_ids"])))
        return cache["sums"], cache["rollouts"]

    return denominators, notes


def load_loss(root: Path, entry: str) -> Loaded:
    """`slime/backends/megatron_utils/loss.py::loss_function` over one optimizer step, as slime's Megatron
    trainer drives it (model.py:644 at 624b824a8 binds `partial(loss_function, args, batch,
    num_microbatches, step_global_batch_size)`; model.py:413 at 166441911 without the last).

    The loss is `--loss-type custom_loss` with `calls_kinds.reducer_loss` (miles'): the reducer loss_function
    builds with `get_sum_of_sample_mean` (cp_utils.py:47 at 624b824a8, :53 at 166441911), applied to the
    per-token losses. The step's normalisers, as the trainer computes them:

    * 624b824a8: `rollout_mask_sums` from slime's own `_convert_samples_to_train_data` (rollout.py:646-655
      give a sample without `rollout_id` a fresh id, :688-700 sum the loss masks per rollout), moved to
      float32 as actor.py:264-268 does and sliced per micro-batch; `step_global_batch_size` = the step's
      rollout count (dp_schedule.py:137-141: a step takes `global_batch_size` rollouts and reports that
      constant; one rollout = one sample unless samples share a `rollout_id`, types.py:99-106).
    * 166441911: `global_batch_size` = `args.global_batch_size`, the step's samples over all ranks
      (data.py:290-292: each rank takes global_batch_size // dp_size samples a step).
    * `num_microbatches` the rank's micro-batches (the same on every rank, dp_schedule.py:24-26), the
      data-parallel size from `mpu.get_data_parallel_world_size(with_context_parallel=True)` = the case's
      ranks, CP size 1; then Megatron's scaling (miles' `calls_kinds.megatron_step`)."""
    per_token = SLIME_LOSS_ENTRIES[entry]
    mpu = install_mpu_state()
    dp = {"size": 1}
    mpu.get_data_parallel_world_size = lambda with_context_parallel=False: dp["size"]
    fn, where = function_from(root, [("slime.backends.megatron_utils.loss", "loss_function")])
    loss_mod = import_from(root, "slime.backends.megatron_utils.loss")
    if getattr(loss_mod, "mpu", mpu) is not mpu:
        raise RuntimeError("slime's loss.py bound a megatron mpu other than the single-rank state")
    step_gbs = "step_global_batch_size" in inspect.signature(fn).parameters
    if entry == "agg-rollout-mean" and not step_gbs:
        raise NotPresent(
            f"{where} has no per-rollout denominators at this pin (no step_global_batch_size / rollout_mask_sums): "
            "the reducer divides each sample by its own loss-mask sum"
        )
    notes = [
        "state: megatron.core.mpu answers CP size 1, CP rank 0, DP size = the case's ranks",
        f"--loss-type custom_loss ({mk.CUSTOM_LOSS}): get_sum_of_sample_mean's reducer on the per-token losses, "
        f"calculate_per_token_loss={per_token}",
    ]
    if step_gbs:
        denominators, more = step_denominators(root, entry == "agg-rollout-mean")
        notes += more

    def call(x, batch, rows, num_microbatches, step):
        dp["size"] = step.ranks
        args = mk.loss_args(per_token, step.rows)
        if not step_gbs:
            return fn(args, batch, num_microbatches, x)
        sums, rollouts = denominators(step.case)
        batch["rollout_mask_sums"] = sums[rows.cpu()].to(x.device)
        return fn(args, batch, num_microbatches, rollouts, x)

    micro = mk.megatron_step(call, per_token)

    def run(case, device: str):
        return run_step(case, device, micro)

    return Loaded(run, where, notes)


# ---------------------------------------------------------------------------------------------
# value-loss: the critic's `--loss-type value_loss` through the same loss_function (runners: miles' calls_kinds).
# ---------------------------------------------------------------------------------------------
VALUE_ENTRIES = mk.VALUE_ENTRIES
SLIME_VALUE_HOMES = ("slime.backends.megatron_utils.loss",)


def load_value(root: Path, entry: str) -> Loaded:
    """slime's critic loss over one optimizer step. `train_critic` sets `args.loss_type = "value_loss"`
    (actor.py:407 at 624b824a8) and runs the same `train` as the actor, so each micro-batch goes through
    `loss_function` (loss.py:1283; 166441911 :767) with `load_loss`'s normalisers (step_global_batch_size and
    rollout_mask_sums with rollout_id None, or global_batch_size at 166441911), which dispatches to
    `value_loss_function` (loss.py:1176, :1330-1331; 166441911 :658): the predictions read from the value head's
    output by get_values (float32 asserted, get_responses), `max((v_c - R)^2, (v - R)^2)`, v_c = old + clamp(v -
    old, -value_clip, value_clip), no factor 1/2 (:1212-1216), then the reducer (sum_of_sample_mean, or the
    token sum with --calculate-per-token-loss); Megatron's scaling after it (miles' `calls_kinds.megatron_step`)."""
    mpu = install_mpu_state()
    dp = {"size": 1}
    mpu.get_data_parallel_world_size = lambda with_context_parallel=False: dp["size"]
    fn, where = function_from(root, [("slime.backends.megatron_utils.loss", "loss_function")])
    _, vwhere = mk.value_function(root, SLIME_VALUE_HOMES)
    loss_mod = import_from(root, "slime.backends.megatron_utils.loss")
    if getattr(loss_mod, "mpu", mpu) is not mpu:
        raise RuntimeError("slime's loss.py bound a megatron mpu other than the single-rank state")
    step_gbs = "step_global_batch_size" in inspect.signature(fn).parameters
    notes = [
        "state: megatron.core.mpu answers CP size 1, CP rank 0, DP size = the case's ranks",
        f"--loss-type value_loss: loss_function dispatches to {vwhere}; value_clip and calculate_per_token_loss "
        "from the case's options (defaults 0.2, False)",
        "the case's v as the value head's packed [1, T, 1] float32 output (read back by get_values), v_old as "
        "batch['values'], ret as batch['returns']; the gradient is d loss / d v",
    ]
    if step_gbs:
        denominators, more = step_denominators(root, per_rollout=False)
        notes += more

    def call(x, batch, rows, num_microbatches, step):
        dp["size"] = step.ranks
        args = mk.value_args(step.case, step.rows)
        logits, vbatch = mk.value_batch(step.case, rows, x, batch)
        if not step_gbs:
            return fn(args, vbatch, num_microbatches, logits)
        sums, rollouts = denominators(step.case)
        vbatch["rollout_mask_sums"] = sums[rows.cpu()].to(x.device)
        return fn(args, vbatch, num_microbatches, rollouts, logits)

    micros = {p: mk.megatron_step(call, p) for p in (False, True)}
    return Loaded(mk.value_runner(micros), f"{vwhere} via {where}", notes)


# ---------------------------------------------------------------------------------------------
# policy-loss: the actor's `--loss-type policy_loss` through the same loss_function (runners: miles' calls_kinds).
# ---------------------------------------------------------------------------------------------
POLICY_ENTRIES = mk.POLICY_ENTRIES


def load_policy(root: Path, entry: str, settings: dict | None = None, defaults: dict | None = None) -> Loaded:
    """slime's actor loss over one optimizer step: each micro-batch goes through `loss_function` (loss.py:1283;
    166441911 :767) with `load_loss`'s normalisers (step_global_batch_size and rollout_mask_sums with rollout_id
    None, or global_batch_size at 166441911) and `args.loss_type = "policy_loss"` (the default), which dispatches to
    `policy_loss_function` (loss.py:934, :1328-1329; 166441911 :442, :809-810): log-probs from the logits
    (get_log_probs_and_entropy, its vocab-parallel log-softmax `calculate_log_probs_and_entropy` stood in by
    `mk.token_log_probs`), ppo_kl = old - logp (:1033), compute_policy_loss(ppo_kl, advantages, eps_clip,
    eps_clip_high, eps_clip_c=...) (:1038-1044; 166441911 :535 without eps_clip_c), no masking before the reducer,
    then sum_of_sample_mean (or the token sum with --calculate-per-token-loss); Megatron's scaling after it.

    `settings` (a discovered variant, `calls_discovered`): namespace attributes set over the entry's, with
    `defaults` (the argparse defaults of what the function reads) where the entry sets nothing, and the batch's
    rollout log-probs (`mk.with_rollout_log_probs`)."""
    mpu = install_mpu_state()
    dp = {"size": 1}
    mpu.get_data_parallel_world_size = lambda with_context_parallel=False: dp["size"]
    mpu.get_tensor_model_parallel_group = lambda *args, **kwargs: None  # TP 1: the stand-in log-softmax ignores it
    fn, where = function_from(root, [("slime.backends.megatron_utils.loss", "loss_function")])
    _, pwhere = function_from(root, [("slime.backends.megatron_utils.loss", "policy_loss_function")])
    loss_mod = import_from(root, "slime.backends.megatron_utils.loss")
    if getattr(loss_mod, "mpu", mpu) is not mpu:
        raise RuntimeError("slime's loss.py bound a megatron mpu other than the single-rank state")
    step_gbs = "step_global_batch_size" in inspect.signature(fn).parameters
    notes = [
        "state: megatron.core.mpu answers CP size 1, CP rank 0, TP group None, DP size = the case's ranks",
        f"--loss-type policy_loss: loss_function dispatches to {pwhere}",
        *mk.bind_policy_stand_ins(loss_mod),
    ]
    if step_gbs:
        denominators, more = step_denominators(root, per_rollout=False)
        notes += more

    def call(x, batch, rows, num_microbatches, step):
        dp["size"] = step.ranks
        args = mk.policy_args(step.case, step.rows)
        logits, pbatch = mk.policy_batch(step.case, rows, x, batch)
        for name, value in mk.POLICY_SETTINGS.get(entry, {}).items():  # the entry's own (policy-gspo)
            setattr(args, name, value)
        if settings is not None:
            mk.apply_settings(args, settings, defaults or {})
            pbatch = mk.with_rollout_log_probs(step.case, rows, pbatch)
            pbatch = mk.with_ref_log_probs(pbatch)
        if not step_gbs:
            return fn(args, pbatch, num_microbatches, logits)
        sums, rollouts = denominators(step.case)
        pbatch["rollout_mask_sums"] = sums[rows.cpu()].to(x.device)
        return fn(args, pbatch, num_microbatches, rollouts, logits)

    notes += [f"set: {k}={v!r}" for k, v in mk.POLICY_SETTINGS.get(entry, {}).items()]
    micros = {p: mk.megatron_step(call, p) for p in (False, True)}
    return Loaded(mk.policy_runner(micros), f"{pwhere} via {where}", notes)

"""OpenRLHF entries beyond GAE: group advantages, the KL estimators, masked_mean and REINFORCE returns.

Every entry calls OpenRLHF's own code at the pin, imported from the checkout:

* group-advantage (`group_norm`, `dr_grpo`, `rloo`) and returns (`reinforce`): the experience
  maker's real `compute_advantages_and_returns(self, experiences)`, called unbound with a namespace
  `self` (`strategy.args`, `kl_ctl`, `advantage_estimator`, the real `get_cumulative_returns`) on one
  real `Experience`. That method runs the inline group block (the rewards scattered back to prompt
  order by `experience.index`, `reshape(-1, n_samples_per_prompt)`, the estimator's baseline), then
  `compute_reward` (the shaped scalar at the last action-mask token, minus `kl_coef * kl`), then
  `get_cumulative_returns` (`action_mask * rewards`, a discounted cumsum over every position), then,
  for `reinforce`, the inline whitening over all action tokens. The advantage the trainer uses is
  the output.
* kl (`kl-k1`, `kl-k2`, `kl-k3`): `openrlhf/models/utils.py::compute_approx_kl`.
* normalization (`masked_mean`): `openrlhf/models/utils.py::masked_mean(tensor, mask, dim=-1)`, as
  the experience maker calls it on the KL (row means), broadcast back to the row.
* loss-aggregation (`agg-token-mean`, `agg-seq-mean-token-mean`): `openrlhf/models/loss.py::aggregate_loss`
  (0.11.2:11-39) with `token_level_loss` True / False, over one optimizer step as the PPO actor drives it
  (`load_aggregate`): the global normalisers from OpenRLHF's own `loss_utils._optimizer_step_loss_norm`,
  DeepSpeed's 1 / gas on every micro-batch.
* token-reward (`token-reward`): `openrlhf/models/utils.py::compute_reward` itself (`load_token_reward`), the
  per-token reward make_experience builds: `compute_reward(r, kl_coef, kl, action_mask, reward_clip_range)` from
  0.5.0 (0.6.3 adds `num_actions`, read only without a mask), `compute_reward(r, kl_coef, log_probs, log_probs_base,
  action_mask)` at 0.3.6.post1 (the KL computed inside, the score clamped to [-10, 10]); the case's KL is passed as
  the KL, or as `log_probs` over a zero `log_probs_base`.
* policy-loss (`policy-loss`): `openrlhf/models/loss.py::PolicyLoss` (0.11.2:116-259) at the CLI defaults, driven as
  the loss-aggregation entries (`load_policy`).

Inputs from the canonical case. Groups: OpenRLHF has no group ids; `n_samples_per_prompt` rows
per prompt sit contiguously in prompt order and `experience.index` maps each row to that order.
The adapter numbers each group's rows in order of appearance and passes that index, the way the
samples generator numbers rollouts; groups of unequal size cannot be expressed (a documented
`GroupShapeError`), nor can `n_samples_per_prompt == 1` for these estimators (the CLI asserts
`n > 1`, `cli/train_ppo_ray.py:656-659`). Token rewards: the only per-token reward OpenRLHF has is
the KL term of `compute_reward`, so the case's token rewards enter as `kl = -token_rewards` with
`kl_coef = 1` (in the case's dtype, as the GAE adapter adds them to the reward). The reward clip
range is opened wide (`--reward.clip_range` is a user option; the clip is not masking behaviour and
would blur the comparison, as in the GAE adapter).
"""

from __future__ import annotations

import inspect
from pathlib import Path
from types import SimpleNamespace

import torch

from maskfuzz.oracles.case import Case
from maskfuzz.oracles.kinds.loss_aggregation import microbatches
from maskfuzz.targets.adapters.base import Loaded, NotPresent, import_from
from maskfuzz.targets.adapters.loss_step import run_step
from maskfuzz.targets.openrlhf.calls import CLIP_RANGE, STOP_OFF, STOP_PROPERLY, OptionNotAtPin

_MAKER = "openrlhf.trainer.ppo_utils.experience_maker"
_EXPERIENCE = "openrlhf.trainer.ppo_utils.experience"
_UTILS = "openrlhf.models.utils"
_LOSS = "openrlhf.models.loss"
_LOSS_UTILS = "openrlhf.utils.loss_utils"
# entry -> token_level_loss (ppo_actor.py:80 at 0.11.2: token_level_loss = loss_agg_mode == "token-mean")
AGGREGATE = {"agg-token-mean": True, "agg-seq-mean-token-mean": False}
# KL in the reward (`oracles/kinds/gae/kl_reward.py`): entry -> (advantage estimator, --algo.kl.estimator)
KL_IN_REWARD = {"reinforce-kl": ("reinforce", "k1")}
# --algo.kl.init_coef (default 0.01, cli/train_ppo_ray.py:438 at 0.11.2) is the value of the fixed controller
# without --algo.kl.target (FixedKLController, trainer/ppo_trainer.py:176), read as self.kl_ctl.value by
# compute_advantages_and_returns (experience_maker.py:286); the same constant as calls.KL_INIT_COEF
KL_INIT_COEF = 0.01
_WIDE = (-float("inf"), float("inf"))  # opened wide; +-1e30 overflows a float16 reward (git 3c3be623)
# options the loads read (their Option declarations are in declare.py)
VALUE_CLIP = "critic.value_clip"
DUAL_CLIP = "actor.dual_clip"
LOSS_AGG_MODE = "actor.loss_agg_mode"


class GroupShapeError(ValueError):
    """The case's groups cannot be expressed as OpenRLHF's fixed-size prompt groups."""


def _rel(root: Path, mod) -> str:
    return str(Path(inspect.getfile(mod)).resolve().relative_to(Path(root).resolve()))


def _method(root: Path, name: str):
    mod = import_from(root, _MAKER)
    for obj in vars(mod).values():
        if inspect.isclass(obj) and obj.__module__ == mod.__name__ and name in vars(obj):
            return vars(obj)[name], f"{_rel(root, mod)}::{vars(obj)[name].__qualname__}"
    raise NotPresent(f"{_MAKER} has no class with {name}")


def prompt_order(group: torch.Tensor) -> tuple[list[int], int]:
    """`experience.index` for rows with these group ids (group g's k-th row -> g_rank * n + k) and n.

    GroupShapeError when the groups are not all of one size n >= 2."""
    ids = group.tolist()
    order = list(dict.fromkeys(ids))
    sizes = {g: ids.count(g) for g in order}
    n = sizes[order[0]]
    if len(set(sizes.values())) != 1:
        raise GroupShapeError(
            f"GroupShapeError: groups of sizes {sorted(set(sizes.values()))}: OpenRLHF reshapes the rewards to "
            "(-1, n_samples_per_prompt) (experience_maker.py:256), every prompt has n rows"
        )
    if n < 2:
        raise GroupShapeError(
            "GroupShapeError: n_samples_per_prompt == 1: the CLI asserts n > 1 for rloo / reinforce_baseline / "
            "group_norm / dr_grpo (cli/train_ppo_ray.py:656-659)"
        )
    seen = {g: 0 for g in order}
    index = []
    for g in ids:
        index.append(order.index(g) * n + seen[g])
        seen[g] += 1
    return index, n


def _args(estimator: str, n: int, gamma: float, options: dict | None = None) -> SimpleNamespace:
    """strategy.args at the CLI defaults, with the case's options where the adapter declares them
    (calls.CLIP_RANGE c -> --reward.clip_range -c c; calls.STOP_PROPERLY, 1.0 standing for None)."""
    options = options or {}
    c = options.get(CLIP_RANGE)
    coef = options.get(STOP_PROPERLY, STOP_OFF)
    ns = SimpleNamespace
    return ns(
        rollout=ns(n_samples_per_prompt=n),
        algo=ns(advantage=ns(estimator=estimator, gamma=gamma, lambd=1.0, no_std_norm=False)),
        reward=ns(
            clip_range=_WIDE if c is None else (-c, c),
            overlong_buffer_len=None,
            stop_properly_penalty_coef=None if coef == STOP_OFF else coef,
        ),
    )


# estimators of the single-rollout regime (0.11.2 cli/train_ppo_ray.py:520 "the n_samples_per_prompt=1 estimator")
SINGLE_ROLLOUT = ("flash_reinforce",)


def load_estimator(root: Path, estimator: str, kl_estimator: str | None = None) -> Loaded:
    """`group_norm` / `dr_grpo` / `rloo` (group-advantage) or `reinforce` (returns) through the
    real `compute_advantages_and_returns`. With `kl_estimator` (the KL in the reward), `experience.kl` is the pin's
    `compute_approx_kl(logp, ref_logp, kl_estimator=...)` as make_experience computes it (experience_maker.py:205-225
    at 0.11.2) and `kl_ctl.value` is --algo.kl.init_coef (KL_INIT_COEF); the case's token rewards (zero by the
    entry's domain) are then not passed: the KL is OpenRLHF's only per-token reward."""
    method, where = _method(root, "compute_advantages_and_returns")
    cumulative, _ = _method(root, "get_cumulative_returns")
    experience_cls = getattr(import_from(root, _EXPERIENCE), "Experience", None)
    if experience_cls is None:
        raise NotPresent(f"{_EXPERIENCE} has no Experience")
    has_truncated = "truncated" in getattr(experience_cls, "__dataclass_fields__", {})
    src = inspect.getsource(method)
    penalised = has_truncated and "apply_length_penalties" in src
    if f'"{estimator}"' not in src:
        raise NotPresent(f"{where} has no estimator {estimator!r} at this pin")
    approx_kl = _approx_kl(root) if kl_estimator else None

    def run(case: Case, device: str):
        dt = case.torch_dtype
        if estimator == "reinforce":
            index, n, gamma = list(range(case.shape[0])), 1, case.gamma
        elif estimator in SINGLE_ROLLOUT:  # no prompt group: one row per prompt, gamma forced to 1 (:300-302)
            index, n, gamma = list(range(case.shape[0])), 1, 1.0
        else:
            index, n = prompt_order(case.group)
            gamma = 1.0
        if case.options.get(STOP_PROPERLY, STOP_OFF) != STOP_OFF and not penalised:
            raise OptionNotAtPin(f"OptionNotAtPin: {where} applies no length penalties at this pin")
        args = _args(estimator, n, gamma, case.options)
        self = SimpleNamespace(
            strategy=SimpleNamespace(args=args),
            args=args,
            kl_ctl=SimpleNamespace(value=1.0 if approx_kl is None else KL_INIT_COEF),
            advantage_estimator=estimator,
        )
        self.get_cumulative_returns = cumulative.__get__(self)
        # samples_generator.py:278,307 (0.11.2): every experience carries finish_reason == "length" as `truncated`
        flags = {"truncated": case.truncated_rows().to(device)} if has_truncated else {}
        if approx_kl is None:
            kl = -case.token_rewards.to(device=device, dtype=dt)
        else:
            kl = approx_kl(case, device, kl_estimator)
        exp = experience_cls(
            action_mask=case.trainable.to(device),
            rewards=case.score.to(device=device, dtype=dt),
            kl=kl,
            index=index,
            **flags,
        )
        (out,) = method(self, [exp])
        if estimator == "reinforce":
            return out.advantages, out.returns
        return (out.advantages,)

    notes = [
        "called unbound with a namespace self (strategy.args at the CLI defaults, kl_ctl.value = 1, the real "
        "get_cumulative_returns) on one real Experience",
        "experience.index numbers each group's rows in order of appearance (prompt order, n rows per prompt)",
        (
            "token rewards enter as kl = -token_rewards with kl_coef 1"
            if approx_kl is None
            else f"experience.kl = compute_approx_kl(logp, ref_logp, kl_estimator={kl_estimator!r}), kl_ctl.value = "
            f"{KL_INIT_COEF} (--algo.kl.init_coef)"
        )
        + "; reward clip range opened wide unless the case sets reward.clip_range",
        "the case's truncated rows as Experience.truncated; reward.stop_properly_penalty_coef in strategy.args",
    ]
    return Loaded(run, where, notes)


def _kl_function(root: Path, why: str = ""):
    """(module, compute_approx_kl, its parameters); NotPresent where it is absent or takes no kl_estimator (`why`
    says what the pin does instead)."""
    mod = import_from(root, _UTILS)
    fn = getattr(mod, "compute_approx_kl", None)
    if fn is None:
        raise NotPresent(f"{_UTILS}.compute_approx_kl is not present at this pin")
    params = inspect.signature(fn).parameters
    if "kl_estimator" not in params:
        raise NotPresent(f"{_UTILS}.compute_approx_kl takes no kl_estimator at this pin ({list(params)}){why}")
    return mod, fn, params


def load_kl(root: Path, estimator: str) -> Loaded:
    mod, fn, _ = _kl_function(root)

    def run(case: Case, device: str):
        dt = case.torch_dtype
        lp = case.extra["logp"].to(device=device, dtype=dt)
        ref = case.extra["ref_logp"].to(device=device, dtype=dt)
        return (fn(lp, ref, kl_estimator=estimator),)

    return Loaded(run, f"{_rel(root, mod)}::compute_approx_kl", [f"kl_estimator={estimator!r}, no mask argument"])


def load_masked_mean(root: Path) -> Loaded:
    mod = import_from(root, _UTILS)
    fn = getattr(mod, "masked_mean", None)
    if fn is None:
        raise NotPresent(f"{_UTILS}.masked_mean is not present at this pin")

    def run(case: Case, device: str):
        x = case.extra["x"].to(device=device, dtype=case.torch_dtype)
        mask = case.trainable.to(device)
        return (fn(x, mask, dim=-1)[:, None].expand(case.shape),)

    return Loaded(run, f"{_rel(root, mod)}::masked_mean", ["dim=-1 (row means), broadcast back to the row"])


def load_aggregate(root: Path, entry: str) -> Loaded:
    """`aggregate_loss(loss, loss_mask, token_level_loss, dp_size, batch_num_tokens, global_batch_size)` over one
    optimizer step, as `PPOActor.train` / `training_step` run it (0.11.2, not dynamic batching):

    * normalisers: `iter_grad_accum_global_norm(pbar, strategy, strategy.accumulated_gradient, lambda e:
      e.action_mask)` (trainer/ray/ppo_actor.py:186-189) groups gas micro-batches into one window and gives each
      the same `_optimizer_step_loss_norm(masks, dp_group, dp_size, gas)` (utils/loss_utils.py:80-105, 54-77):
      `batch_num_tokens` = action tokens of the window all-reduced over the data-parallel ranks / gas,
      `global_batch_size` = rows with an action token, all-reduced, / gas, and `dp_size`. The adapter calls that
      function itself with the action masks (bool, as Experience.action_mask is) of every micro-batch of the step
      on every rank (the sum the all-reduce forms), gas = the micro-batches of the busiest rank
      (`Step.per_rank`, DeepSpeed's gradient_accumulation_steps, utils/deepspeed/deepspeed.py:110-116) and
      dp_size = the simulated ranks; it is handed to aggregate_loss as `**loss_batch_info`
      (trainer/ray/ppo_actor.py:304-310 through PolicyLoss, models/loss.py:249-256).
    * scaling: the micro-batch loss goes unscaled to `strategy.backward` (ppo_actor.py:355), i.e. DeepSpeed's
      `engine.backward` (utils/deepspeed/deepspeed.py:177-181), which divides it by gas (the 1 / gas that
      loss_utils.py:60-63 pre-compensates); the driver then averages the ranks as DeepSpeed averages gradients.
    """
    token_level = AGGREGATE[entry]
    mod = import_from(root, _LOSS)
    fn = getattr(mod, "aggregate_loss", None)
    if fn is None:
        raise NotPresent(f"{_LOSS}.aggregate_loss is not present at this pin (the policy loss aggregates inline)")
    params = inspect.signature(fn).parameters
    need = ("token_level_loss", "dp_size", "batch_num_tokens", "global_batch_size")
    if not all(p in params for p in need):
        raise NotPresent(f"{_LOSS}.aggregate_loss has parameters {list(params)} at this pin; expected {need}")
    utils = import_from(root, _LOSS_UTILS)  # NotPresent when the module is absent
    step_norm = getattr(utils, "_optimizer_step_loss_norm", None)
    if step_norm is None:
        raise NotPresent(f"{_LOSS_UTILS}._optimizer_step_loss_norm (the per-step global normalisers) is not present")
    cache: dict = {}

    def micro(rows, loss, mask, step):
        key = id(step.case)
        if cache.get("key") != key:
            masks = [step.case.trainable[r] for _, r in microbatches(step.case)]
            cache.update(key=key, info=step_norm(masks, None, step.ranks, step.per_rank))
        info = {k: v.to(loss.device) if torch.is_tensor(v) else v for k, v in cache["info"].items()}
        out = fn(loss, mask.bool(), token_level_loss=token_level, **info)
        return out / step.per_rank  # DeepSpeed engine.backward: loss / gradient_accumulation_steps

    def run(case: Case, device: str) -> tuple[torch.Tensor, torch.Tensor]:
        cache.clear()
        return run_step(case, device, micro)

    notes = [
        f"token_level_loss={token_level}; action mask as bool",
        f"global normalisers from {_rel(root, utils)}::_optimizer_step_loss_norm over the step's masks "
        "(all micro-batches, all ranks), gas = Step.per_rank, dp_size = ranks",
        "each micro-batch loss divided by gas (DeepSpeed engine.backward), ranks averaged by the driver",
    ]
    return Loaded(run, f"{_rel(root, mod)}::aggregate_loss", notes)


def load_value(root: Path) -> Loaded:
    """`ValueLoss(clip_eps=0.5).forward(values, old_values, returns, action_mask, dp_size, batch_num_tokens,
    global_batch_size)` (models/loss.py:262-298 at 0.11.2) over one optimizer step as `PPOCritic` runs it: the
    same `iter_grad_accum_global_norm` window normalisers as the actor (trainer/ray/ppo_critic.py:99-104, passed
    as `**loss_batch_info` at :152-158), DeepSpeed's 1 / gas on every micro-batch (`strategy.backward`, :168);
    the gradient is taken with respect to the critic's values."""
    mod = import_from(root, _LOSS)
    cls = getattr(mod, "ValueLoss", None)
    if cls is None or "dp_size" not in inspect.signature(cls.forward).parameters:
        raise NotPresent(f"{_LOSS}.ValueLoss takes no global normalisers at this pin")
    utils = import_from(root, _LOSS_UTILS)
    step_norm = getattr(utils, "_optimizer_step_loss_norm", None)
    if step_norm is None:
        raise NotPresent(f"{_LOSS_UTILS}._optimizer_step_loss_norm (the per-step global normalisers) is not present")
    losses: dict = {}

    def micro(rows, v, mask, step):
        # ppo_critic.py:60,257 (0.11.2): ValueLoss(args.critic.value_clip)
        clip = step.case.options.get(VALUE_CLIP, 0.5)
        value_loss = losses.setdefault(clip, cls(clip))
        masks = [step.case.trainable[r] for _, r in microbatches(step.case)]
        info = {
            k: x.to(v.device) if torch.is_tensor(x) else x
            for k, x in step_norm(masks, None, step.ranks, step.per_rank).items()
        }
        old = step.case.extra["v_old"][rows].to(device=v.device, dtype=v.dtype)
        ret = step.case.extra["ret"][rows].to(device=v.device, dtype=v.dtype)
        return value_loss(v, old, ret, action_mask=mask.bool(), **info) / step.per_rank

    def run(case: Case, device: str) -> tuple[torch.Tensor, torch.Tensor]:
        return run_step(case, device, micro, leaf_name="v")

    notes = [
        "ValueLoss(clip_eps=critic.value_clip, 0.5 by default), token level, the step's _optimizer_step_loss_norm, "
        "/ gas per micro-batch"
    ]
    return Loaded(run, f"{_rel(root, mod)}::ValueLoss", notes)


def load_policy(root: Path) -> Loaded:
    """`PolicyLoss(clip_eps_low, clip_eps_high, dual_clip, token_level_loss, policy_loss_type="ppo").forward(log_probs,
    old_log_probs, advantages, action_mask, rollout_log_probs, dp_size, batch_num_tokens, global_batch_size)`
    (models/loss.py:116-259 at 0.11.2) over one optimizer step as `PPOActor` runs it: built at
    trainer/ray/ppo_actor.py:76-86 from `--actor.eps_clip_low_high` (= (eps_clip, eps_clip) = (0.2, 0.2) by default,
    cli/train_ppo_ray.py:406-407, :633-634), `--actor.dual_clip` (None, :408), `token_level_loss = loss_agg_mode ==
    "token-mean"` (default token-mean, :440-447), `policy_loss_type` "ppo" (:439) and `is_correction_level` "off"
    (:260-267, so `rollout_log_probs` is never read: passed None); called in `training_step` with the micro-batch's
    action log-probs, old log-probs, advantages and action mask and `**loss_batch_info` (ppo_actor.py:304-310), the
    same `iter_grad_accum_global_norm` window normalisers as `load_aggregate` (ppo_actor.py:186-189), the loss
    (first element of the returned tuple) backpropagated through DeepSpeed's 1 / gas (ppo_actor.py:355,
    utils/deepspeed/deepspeed.py:177-181). The KL loss (`algo.kl.use_loss`), entropy and aux terms are added to the
    same scalar only when configured (ppo_actor.py:318-353; off by default, cli/train_ppo_ray.py:467, :469-473, :524):
    not included. The gradient is taken
    with respect to the current log-probs."""
    mod = import_from(root, _LOSS)
    cls = getattr(mod, "PolicyLoss", None)
    if cls is None:
        raise NotPresent(f"{_LOSS}.PolicyLoss is not present at this pin")
    init = inspect.signature(cls.__init__).parameters
    fwd = inspect.signature(cls.forward).parameters
    if not all(p in init for p in ("clip_eps_low", "clip_eps_high", "dual_clip", "token_level_loss")) or not all(
        p in fwd for p in ("dp_size", "batch_num_tokens", "global_batch_size")
    ):
        raise NotPresent(
            f"{_LOSS}.PolicyLoss has __init__{list(init)[1:]} / forward{list(fwd)[1:]} at this pin: no asymmetric "
            "clip, dual clip or global step normalisers (releases before 0.11 aggregate per micro-batch inline, e.g. "
            "0.6.3 models/loss.py:56-77 masked_mean(loss, action_mask, dim=-1).mean())"
        )
    utils = import_from(root, _LOSS_UTILS)
    step_norm = getattr(utils, "_optimizer_step_loss_norm", None)
    if step_norm is None:
        raise NotPresent(f"{_LOSS_UTILS}._optimizer_step_loss_norm (the per-step global normalisers) is not present")
    losses: dict = {}

    def micro(rows, logp, mask, step):
        dual = step.case.options.get(DUAL_CLIP)
        mode = step.case.options.get(LOSS_AGG_MODE, "token-mean")
        key = (dual, mode)
        if key not in losses:  # ppo_actor.py:76-86 with the CLI defaults but the options
            losses[key] = cls(
                clip_eps_low=0.2,
                clip_eps_high=0.2,
                dual_clip=dual,
                token_level_loss=mode == "token-mean",
                policy_loss_type="ppo",
            )
        masks = [step.case.trainable[r] for _, r in microbatches(step.case)]
        info = {
            k: x.to(logp.device) if torch.is_tensor(x) else x
            for k, x in step_norm(masks, None, step.ranks, step.per_rank).items()
        }
        old = step.case.extra["old_logp"][rows].to(device=logp.device, dtype=logp.dtype)
        adv = step.case.extra["adv"][rows].to(device=logp.device, dtype=logp.dtype)
        out = losses[key](logp, old, adv, action_mask=mask.bool(), rollout_log_probs=None, **info)
        return out[0] / step.per_rank  # DeepSpeed engine.backward: loss / gradient_accumulation_steps

    def run(case: Case, device: str) -> tuple[torch.Tensor, torch.Tensor]:
        return run_step(case, device, micro, leaf_name="logp")

    notes = [
        "PolicyLoss(clip_eps_low=0.2, clip_eps_high=0.2, dual_clip=actor.dual_clip (None), token_level_loss="
        "actor.loss_agg_mode == 'token-mean', policy_loss_type='ppo'), is_correction off: rollout_log_probs None",
        "the step's _optimizer_step_loss_norm over every micro-batch's action mask (bool), / gas per micro-batch",
        "per-token advantages (Experience.advantages); KL / entropy / aux loss terms not added (off by default)",
    ]
    return Loaded(run, f"{_rel(root, mod)}::PolicyLoss", notes)


# the CLI defaults compute_reward is called with: --init_kl_coef / --algo.kl.init_coef 0.01 and --reward_clip_range /
# --reward.clip_range (-10, 10) (0.6.3 cli/train_ppo_ray.py:337, 349; 0.11.2 :438, 474; 0.3.6.post1 clamps to
# [-10, 10] unconditionally, models/utils.py:42)
TOKEN_REWARD_KL_COEF = 0.01
TOKEN_REWARD_CLIP = (-10.0, 10.0)


def load_token_reward(root: Path) -> Loaded:
    """compute_reward(score, 0.01, kl, action_mask=trainable, reward_clip_range=(-10, 10)) (0.3.6.post1:
    compute_reward(score, 0.01, log_probs=kl, log_probs_base=0, action_mask=trainable), which returns (reward, kl))."""
    mod = import_from(root, _UTILS)
    fn = getattr(mod, "compute_reward", None)
    if fn is None:
        raise NotPresent(f"{_UTILS}.compute_reward is not present at this pin")
    params = inspect.signature(fn).parameters
    if "kl" not in params and "log_probs" not in params:
        raise NotPresent(f"compute_reward has parameters {list(params)}: neither kl nor log_probs")
    where = f"{Path(inspect.getfile(mod)).resolve().relative_to(Path(root).resolve())}::compute_reward"

    def run(case: Case, device: str):
        dt = case.torch_dtype
        kl = case.extra["kl"].to(device=device, dtype=dt)
        score = case.score.to(device=device, dtype=dt)
        mask = case.trainable.to(device)
        kw = {"action_mask": mask}
        if "kl" in params:
            kw["kl"] = kl
        else:
            kw.update(log_probs=kl, log_probs_base=torch.zeros_like(kl))
        if "reward_clip_range" in params:
            kw["reward_clip_range"] = TOKEN_REWARD_CLIP
        out = fn(score, TOKEN_REWARD_KL_COEF, **kw)
        return (out[0] if isinstance(out, tuple) else out,)

    notes = [
        f"compute_reward(score, kl_coef={TOKEN_REWARD_KL_COEF}, kl, action_mask=trainable, reward_clip_range="
        f"{TOKEN_REWARD_CLIP}) (0.3.6.post1: log_probs=kl, log_probs_base=0, the clamp to [-10, 10] built in)"
    ]
    return Loaded(run, where, notes)


def load(root: Path, entry: str) -> Loaded:
    """The entry of a kind beyond GAE (the worker loads it from here: targets.registry.adapter_for)."""
    if entry == "token-reward":
        return load_token_reward(root)
    if entry in ("group_norm", "dr_grpo", "rloo", "reinforce"):
        return load_estimator(root, entry)
    if entry in ("kl-k1", "kl-k2", "kl-k3"):
        return load_kl(root, entry.split("-")[1])
    if entry == "masked_mean":
        return load_masked_mean(root)
    if entry in AGGREGATE:
        return load_aggregate(root, entry)
    if entry == "value-loss":
        return load_value(root)
    if entry == "policy-loss":
        return load_policy(root)
    if entry in KL_IN_REWARD:  # "gae-kl" is a kind "gae" entry: the GAE calls (calls.py) load it
        return load_estimator(root, *KL_IN_REWARD[entry])
    raise ValueError(f"openrlhf's calls_kinds has no entry {entry!r}")


def _approx_kl(root: Path):
    """(case, device, kl_estimator) -> the per-token KL as the pin's experience maker computes it: 0.11.2
    `compute_approx_kl(action_log_probs, base_action_log_probs, kl_estimator=...)` (no mask;
    experience_maker.py:206-210), 0.6.3 the same with `action_mask=samples.action_mask` (:415-420, the mask
    multiplies the log-ratio inside, models/utils.py:23-26). NotPresent where compute_approx_kl takes no
    kl_estimator (0.3.6.post1 computes the KL inside compute_reward)."""
    _, fn, params = _kl_function(
        root,
        ": the KL is computed inside compute_reward(r, kl_coef, log_probs, log_probs_base, action_mask), which also "
        "clamps the score to [-10, 10] unconditionally (models/utils.py:39-42 at 0.3.6.post1)",
    )
    if "clamp(min=-10, max=10)" not in inspect.getsource(fn):
        raise NotPresent(
            f"{_UTILS}.compute_approx_kl does not clamp the estimate at this pin: the entry declares the clamp to "
            "[-10, 10] of 0.11.2 (models/utils.py:113)"
        )
    masked = "action_mask" in params

    def kl(case: Case, device: str, estimator: str) -> torch.Tensor:
        dt = case.torch_dtype
        lp = case.extra["logp"].to(device=device, dtype=dt)
        ref = case.extra["ref_logp"].to(device=device, dtype=dt)
        if masked:
            return fn(lp, ref, action_mask=case.trainable.to(device), kl_estimator=estimator)
        return fn(lp, ref, kl_estimator=estimator)

    return kl

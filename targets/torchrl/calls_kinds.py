"""torchrl entries beyond GAE: the LLM GRPO group advantage (`MCAdvantage`) and the per-token KL
(`KLComputation`), each called from torchrl's own source at the pin.

* group-advantage (`mc-advantage`, `mc-advantage-sum`): `torchrl/objectives/llm/grpo.py::MCAdvantage`, the
  replay-buffer transform the GRPO scripts install (`sota-implementations/grpo/grpo-sync.py:291`,
  `transform_factory=partial(MCAdvantage, grpo_size=cfg.env.repeats)`). The adapter builds one real instance
  (`grpo_size` = the group size, `prompt_key` a tensor group id, grouped by value) and hands it the whole batch
  through its public `inv`: a [B, 1] tensordict, each row a one-step trajectory (one dialog turn, `done` True),
  whose `("next", "reward")` is the row's score with the env's per-step shape (1, 1)
  (`torchrl/envs/llm/reward/gsm8k.py:218`). `MCAdvantage` queues each group, computes it when `grpo_size`
  trajectories have arrived, and returns the groups in completion order; a `row` key carried along maps the
  advantages back. `mc-advantage` is the default per-step branch (`trajectory_return=None`),
  `mc-advantage-sum` the trajectory-return branch (`trajectory_return="sum"`, the VLA GRPO recipe). Each gives
  one advantage per trajectory: the adapter broadcasts it to every position of the row (the loss applies the
  assistant mask), so masked positions are not zero.
* kl (`kl`): `torchrl/envs/llm/transforms/kl.py::KLComputation` (the KL step of `RetrieveKL`), k1
  `gen_lp - ref_lp` per token, with `add_to_reward=False` (the reward use is `reward - coeff * kl`). The
  case's log-probs enter as the `("log_probs", "full")` and `("ref_log_probs", "full")` entries of `next`.

* loss-aggregation (`agg-token-mean`, `agg-prompt-mean`): `GRPOLoss._aggregate_loss_value` on a real
  `GRPOLoss(aggregation=...)`, one call per micro-batch (see `load_aggregation`).
* value-loss (`value-loss`): the critic loss of a real `ClipPPOLoss(clip_value=..., loss_critic_type="l2")`,
  its `forward` on a micro-batch tensordict whose critic network returns the case's predictions and whose
  `("collector", "mask")` is the loss mask; the `loss_critic` key, / accumulation steps (see `load_value`).

Not entries: `GRPOLoss._kl_to_ref` (k3 then `.mean()` over all B x T positions: a loss aggregation, a kind
the judge does not implement yet; see the tests for its pad dependence), `KLRewardTransform` (needs a
reference model).
"""

from __future__ import annotations

import inspect
from pathlib import Path

import torch

from maskfuzz.oracles.case import Case
from maskfuzz.targets.adapters.base import Loaded, NotPresent, import_from
from maskfuzz.targets.adapters.loss_step import run_step

_GRPO = "torchrl.objectives.llm.grpo"
_KL = "torchrl.envs.llm.transforms.kl"


class GroupShapeError(ValueError):
    """The case's groups cannot be expressed as MCAdvantage's one `grpo_size`."""


def _rel(root: Path, mod) -> str:
    return str(Path(inspect.getfile(mod)).resolve().relative_to(Path(root).resolve()))


def group_size(group: torch.Tensor) -> int:
    """The one size every group has; GroupShapeError when sizes differ."""
    sizes = set(torch.unique(group, return_counts=True)[1].tolist())
    if len(sizes) != 1:
        raise GroupShapeError(
            f"GroupShapeError: groups of sizes {sorted(sizes)}: MCAdvantage takes one grpo_size and emits a group "
            "when its queue reaches it (grpo.py:1472-1511 at 0.14.1); every prompt has grpo_size trajectories"
        )
    return sizes.pop()


def load_mc_advantage(root: Path, trajectory_return: str | None) -> Loaded:
    mod = import_from(root, _GRPO)
    cls = getattr(mod, "MCAdvantage", None)
    if cls is None:
        raise NotPresent(f"{_GRPO}.MCAdvantage is not present at this pin")
    params = inspect.signature(cls.__init__).parameters
    if trajectory_return is not None and "trajectory_return" not in params:
        raise NotPresent(f"{_GRPO}.MCAdvantage takes no trajectory_return at this pin")
    from tensordict import TensorDict

    def run(case: Case, device: str):
        b_rows, t_len = case.shape
        n = group_size(case.group)
        chosen = case.options.get("trajectory_return", trajectory_return) if trajectory_return else None
        kw = {"trajectory_return": chosen} if chosen is not None else {}
        transform = cls(grpo_size=n, prompt_key="query", **kw)
        reward = case.score.to(device=device, dtype=case.torch_dtype).reshape(b_rows, 1, 1, 1)
        td = TensorDict(
            {
                "query": case.group.to(device).reshape(b_rows, 1),
                "row": torch.arange(b_rows, device=device).reshape(b_rows, 1),
                "next": TensorDict(
                    {"reward": reward, "done": torch.ones(b_rows, 1, 1, dtype=torch.bool, device=device)},
                    batch_size=[b_rows, 1],
                ),
            },
            batch_size=[b_rows, 1],
            device=device,
        )
        out = transform.inv(td)
        if out is None or out.numel() != b_rows:
            got = 0 if out is None else out.numel()
            raise RuntimeError(f"MCAdvantage returned {got} of {b_rows} trajectories (incomplete groups held back)")
        adv = out.get("advantage").reshape(b_rows)
        rows = out.get("row").reshape(b_rows)
        per_row = torch.empty_like(adv).index_copy_(0, rows, adv)
        return (per_row[:, None].expand(b_rows, t_len),)

    branch = f"trajectory_return={trajectory_return!r}"
    notes = [
        f"MCAdvantage(grpo_size=<group size>, prompt_key='query', {branch}).inv on a [B, 1] tensordict: one-step "
        "trajectories (done True), reward = score with the env's per-step shape (1, 1)",
        "group ids as an int tensor (grouped by value); groups of unequal size are a documented GroupShapeError",
        "one advantage per trajectory, broadcast by the adapter to every position of its row",
    ]
    return Loaded(run, f"{_rel(root, mod)}::MCAdvantage", notes)


def load_kl_computation(root: Path) -> Loaded:
    mod = import_from(root, _KL)
    cls = getattr(mod, "KLComputation", None)
    if cls is None:
        raise NotPresent(f"{_KL}.KLComputation is not present at this pin")
    from tensordict import TensorDict

    def run(case: Case, device: str):
        b_rows, t_len = case.shape
        dt = case.torch_dtype
        lp = case.extra["logp"].to(device=device, dtype=dt)
        ref = case.extra["ref_logp"].to(device=device, dtype=dt)
        transform = cls(("log_probs", "full"), ("ref_log_probs", "full"), add_to_reward=False)
        nxt = TensorDict({("log_probs", "full"): lp, ("ref_log_probs", "full"): ref}, batch_size=[b_rows])
        out = transform(TensorDict({"next": nxt}, batch_size=[b_rows]))
        kl = out.get(("next", "kl_penalty"))
        kl = torch.stack(list(kl.unbind(0))) if kl.is_nested else kl
        return (kl.reshape(b_rows, t_len),)

    notes = [
        "KLComputation(('log_probs', 'full'), ('ref_log_probs', 'full'), add_to_reward=False) on "
        "TensorDict(next=...) with [B, T] log-probs (no mask: torchrl zero-fills non-assistant log-probs upstream)",
    ]
    return Loaded(run, f"{_rel(root, mod)}::KLComputation", notes)


# entry -> GRPOLoss(aggregation=...)
AGGREGATION = {"agg-token-mean": "token_mean", "agg-prompt-mean": "prompt_mean"}


def load_aggregation(root: Path, entry: str) -> Loaded:
    """`GRPOLoss._aggregate_loss_value(value, mask)` on one micro-batch, as torchrl's GRPO training drives it.

    A real `GRPOLoss(actor_network=None, aggregation=...)` (the method reads only `aggregation`, `reduction` and,
    from 0.14.1, `_reduce_loss`); `value` is the micro-batch's per-token loss [b, T, 1] and `mask` a bool [b, T],
    the shapes `GRPOLoss.forward` passes (`loss_objective` = -gain [B, T, 1], `mask` = `dist.mask &
    isfinite(prev_log_prob)`, grpo.py:961, 982 and 738-746 at 0.14.1). `tensordict` is left None: the loss-mask
    keys `_reduce_loss` could read from it are absent from a GRPO batch.

    There is no global normaliser: every call normalises its own micro-batch, and the trainer divides each
    micro-batch loss by the accumulation steps before backward. 0.14.1: `GRPOTrainer` builds a
    `MixedPrecisionOptimizationStepper` (torchrl/trainers/algorithms/grpo.py:219-231), whose `step` sums the
    `loss_*` keys and divides by `gradient_accumulation_steps` (torchrl/trainers/trainers.py:474-479), backward at
    :495-499, optimizer step every `gradient_accumulation_steps` calls (:503-505); the replay buffer samples
    `optim_batch_size // gradient_accumulation_steps` rows per micro-batch (sota-implementations/grpo/
    grpo-sync.py:276-294). 0.12.0 and git main (no GRPOTrainer): the script's loop divides
    `loss.mean(reduce=True)` by `gradient_accumulation_steps` (0.12.0 sota-implementations/grpo/grpo-sync.py:
    216-230; main :227-241; stepping every gradient_accumulation_steps at :232 / :243). `mean(reduce=True)` of
    the output tensorclass averages all its fields (logging metrics included), a constant factor 1/(number of
    fields) per micro-batch that the adapter does not apply (it is no part of the aggregation). So the
    adapter returns `_aggregate_loss_value(...) / gradient_accumulation_steps` with gradient_accumulation_steps
    = the micro-batches of the rank (`Step.rank_micro_batches`). The GRPO recipes train on one process
    (no data-parallel all-reduce in the scripts); ranks, when the case has them, are averaged by the driver."""
    mod = import_from(root, _GRPO)
    cls = getattr(mod, "GRPOLoss", None)
    if cls is None:
        raise NotPresent(f"{_GRPO}.GRPOLoss is not present at this pin")
    if not hasattr(cls, "_aggregate_loss_value"):
        raise NotPresent(
            f"{_GRPO}.GRPOLoss has no _aggregate_loss_value (no `aggregation` option) at this pin: it subclasses "
            "ClipPPOLoss and reduces with its plain reduction"
        )
    modules: dict = {}

    def module(aggregation: str):
        if aggregation not in modules:
            modules[aggregation] = cls(actor_network=None, aggregation=aggregation)
        return modules[aggregation]

    def run(case: Case, device: str):
        # the `aggregation` option (declared on agg-token-mean) picks the GRPOLoss configuration
        loss_module = module(case.options.get("aggregation", AGGREGATION[entry]))

        def micro(rows, loss, mask, step):
            value = loss.unsqueeze(-1)  # [b, T, 1], as GRPOLoss.forward's loss_objective
            out = loss_module._aggregate_loss_value(value, mask.bool())
            return out / step.rank_micro_batches

        return run_step(case, device, micro)

    aggregation = AGGREGATION[entry]
    module(aggregation)

    notes = [
        f"GRPOLoss(actor_network=None, aggregation={aggregation!r})._aggregate_loss_value(loss[b, T, 1], mask bool) "
        "per micro-batch",
        "no global normaliser: each micro-batch loss / gradient_accumulation_steps (the rank's micro-batches)",
    ]
    return Loaded(run, f"{_rel(root, mod)}::GRPOLoss._aggregate_loss_value", notes)


def load_kl_to_ref(root: Path) -> Loaded:
    """`GRPOLoss._kl_to_ref(tensordict, ref_log_prob=..., coeff=1.0, mask=...)`, the KL-to-reference loss term
    (grpo.py:868-922 at 0.14.1): masked log-probs set to 0 by torch.where, diff = ref - cur,
    `kl_penalty = (diff.expm1() - diff).mean()`. The case's per-token loss is the log-ratio: ref_log_prob = l,
    cur_log_prob = 0 (through `_cur_log_prob`, differentiable in l), so the term is the k3 estimate of l
    aggregated by the call (the `transform="k3"` reference); per micro-batch, / gradient_accumulation_steps as
    the GRPO training loop divides every loss key (see `load_aggregation`)."""
    from tensordict import TensorDict

    mod = import_from(root, _GRPO)
    cls = getattr(mod, "GRPOLoss", None)
    if cls is None or not hasattr(cls, "_kl_to_ref"):
        raise NotPresent(f"{_GRPO}.GRPOLoss._kl_to_ref is not present at this pin")
    params = inspect.signature(cls._kl_to_ref).parameters
    if not all(p in params for p in ("ref_log_prob", "coeff", "mask")):
        raise NotPresent(f"{_GRPO}.GRPOLoss._kl_to_ref has parameters {list(params)} at this pin")
    try:
        loss_module = cls(actor_network=None, kl_to_ref_coeff=1.0)
    except TypeError as exc:
        raise NotPresent(f"{_GRPO}.GRPOLoss takes no kl_to_ref_coeff at this pin: {exc}") from None

    def micro(rows, loss, mask, step):
        cur = torch.zeros_like(loss) * loss  # 0, differentiable: diff = ref - cur carries the gradient of l
        td = TensorDict({"_cur_log_prob": cur}, batch_size=[loss.shape[0]])
        term, _ = loss_module._kl_to_ref(td, ref_log_prob=loss, coeff=1.0, mask=mask.bool())
        return term / step.rank_micro_batches

    def run(case: Case, device: str):
        return run_step(case, device, micro)

    notes = [
        "GRPOLoss(actor_network=None, kl_to_ref_coeff=1.0)._kl_to_ref(td(_cur_log_prob=0), ref_log_prob=l, "
        "coeff=1.0, mask) per micro-batch: the k3 estimate of the log-ratio l, then .mean() of the call",
        "no global normaliser: each micro-batch term / gradient_accumulation_steps",
    ]
    return Loaded(run, f"{_rel(root, mod)}::GRPOLoss._kl_to_ref", notes)


# The `value-loss` entry: ClipPPOLoss's critic loss (lines at 0.14.1, git main ae9719f17b15 in brackets).
_PPO = "torchrl.objectives.ppo"
_COMMON = "torchrl.objectives.common"
VALUE_CLIP = 0.2  # clip_value=True takes clip_epsilon (ppo.py:1480 [1258]), whose default is 0.2
MASK_KEY = ("collector", "mask")  # what split_trajectories writes (collectors/utils.py:214-222 [214-220])


def _inert_actor():
    """A policy the critic loss never reads: loc 0 and scale 1 of a Normal over a zero observation (the policy
    term of `forward` runs on it with advantage 0)."""
    from tensordict.nn import TensorDictModule
    from torchrl.modules import ProbabilisticActor

    class ZeroNormal(torch.nn.Module):
        def forward(self, obs):
            return torch.zeros_like(obs), torch.ones_like(obs)

    body = TensorDictModule(ZeroNormal(), in_keys=["inert_obs"], out_keys=["loc", "scale"])
    return ProbabilisticActor(
        body, in_keys=["loc", "scale"], distribution_class=torch.distributions.Normal, return_log_prob=True
    )


def load_value(root: Path) -> Loaded:
    """`ClipPPOLoss(...)(tensordict)["loss_critic"]` per micro-batch, as a PPO trainer calls the loss module.

    The loss module is real (`ClipPPOLoss(actor, critic, clip_value=<option>, loss_critic_type="l2",
    reduction=<option>)`, critic_coeff left to its default 1.0, ppo.py:549-550 [502-503]); its critic network is
    `TensorDictModule(nn.Identity(), in_keys=["v_pred"], out_keys=["state_value"])`, so the network's output is
    the case's predictions v (the autograd leaf). The tensordict [b, T] holds what a collector batch after GAE
    holds: `state_value` = v_old (the values at rollout time, which `loss_critic` reads as `old_state_value` before
    the critic overwrites the key, ppo.py:961, 976 [838, 853]), `value_target` = ret, `advantage` = 0, and the
    loss mask as `("collector", "mask")`, the padding mask `split_trajectories` writes; `_reduce_loss` (common.py:
    340-377) finds it through `loss_mask_key="auto"` (common.py:41, 359-363), selects with `torch.where` (:368)
    and divides by `mask.sum().clamp_min(1)` (:374; "sum": :376). `forward` reduces every `loss_*` key that way
    (ppo.py:1669-1672 [1442-1445]). The policy term runs on an inert actor (see `_inert_actor`) and is not
    returned. Per micro-batch the loss is divided by the accumulation steps, as `MixedPrecisionOptimizationStepper`
    does (0.14.1 torchrl/trainers/trainers.py:479; main has no accumulating stepper and the PPO recipes step the
    optimizer per mini-batch, sota-implementations/ppo/ppo_mujoco.py:244-253)."""
    from tensordict import TensorDict
    from tensordict.nn import TensorDictModule

    mod = import_from(root, _PPO)
    common = import_from(root, _COMMON)
    cls = getattr(mod, "ClipPPOLoss", None)
    if cls is None:
        raise NotPresent(f"{_PPO}.ClipPPOLoss is not present at this pin")
    if not hasattr(common.LossModule, "_reduce_loss") or not hasattr(common.LossModule, "loss_mask_key"):
        raise NotPresent(
            "torchrl's PPO losses take no loss mask at this pin: forward reduces every loss_* key with "
            "_reduce(value, reduction=self.reduction) over all elements (0.12.0 torchrl/objectives/ppo.py:1307), so "
            "padding and masked steps are averaged in; the mask (LossModule.loss_mask_key, "
            "('collector', 'mask')) exists from 0.14.1"
        )
    modules: dict = {}

    def module(clip, reduction: str):
        key = (clip, reduction)
        if key not in modules:
            critic = TensorDictModule(torch.nn.Identity(), in_keys=["v_pred"], out_keys=["state_value"])
            modules[key] = cls(
                _inert_actor(),
                critic,
                clip_value=clip,
                loss_critic_type="l2",
                entropy_bonus=False,
                reduction=reduction,
            )
        return modules[key]

    def run(case: Case, device: str):
        clip = case.options.get("clip_value", VALUE_CLIP)
        reduction = case.options.get("reduction", "mean")
        loss_module = module(clip, reduction).to(device)

        def micro(rows, v, mask, step):
            b, t = v.shape
            zero = torch.zeros(b, t, 1, device=v.device, dtype=v.dtype)
            old = step.case.extra["v_old"][rows].to(device=v.device, dtype=v.dtype)
            ret = step.case.extra["ret"][rows].to(device=v.device, dtype=v.dtype)
            td = TensorDict(
                {
                    "v_pred": v.unsqueeze(-1),
                    "state_value": old.unsqueeze(-1),
                    "value_target": ret.unsqueeze(-1),
                    "advantage": zero,
                    "inert_obs": zero,
                    "action": zero,
                    loss_module.tensor_keys.sample_log_prob: zero,
                    MASK_KEY: mask.bool(),
                },
                batch_size=[b, t],
                device=v.device,
            )
            out = loss_module(td)
            return out.get("loss_critic") / step.rank_micro_batches

        return run_step(case, device, micro, leaf_name="v")

    notes = [
        f"ClipPPOLoss(inert actor, critic=Identity(v_pred -> state_value), clip_value=<option, {VALUE_CLIP}>, "
        "loss_critic_type='l2', reduction=<option, 'mean'>)(td)['loss_critic'] per micro-batch",
        "td [b, T]: v_pred = v, state_value = v_old, value_target = ret, advantage = 0, ('collector', 'mask') = "
        "the loss mask (loss_mask_key='auto'); / accumulation steps",
    ]
    return Loaded(run, f"{_rel(root, mod)}::ClipPPOLoss.loss_critic", notes)


# The `policy-loss` entry: GRPOLoss.forward (lines at 0.14.1, 0.12.0 in parentheses).
POLICY_CLIP = 0.2  # GRPOLoss(clip_epsilon=0.2) default, grpo.py:498 (0.12.0 :202)


class _GivenLogProbs:
    """What `GRPOLoss._get_cur_log_prob` reads from the distribution an LLM wrapper returns: `log_prob(action)` (the
    current policy's per-token log-probs) and `mask` (the LLMMaskedCategorical's mask: the tokens the loss trains on,
    which `_log_weight` and `forward` take as the loss mask, grpo.py:961 [0.12.0 :398, :651])."""

    def __init__(self, log_prob: torch.Tensor, mask: torch.Tensor) -> None:
        self._log_prob, self.mask = log_prob, mask

    def log_prob(self, action: torch.Tensor) -> torch.Tensor:
        return self._log_prob


def _given_actor():
    """The trivial actor: `get_dist(tensordict)` returns the tensordict's `given_log_prob` [b, T] (the autograd
    leaf's slice) with `given_mask` as the distribution's mask; no model, no logits."""

    class GivenLogProbActor(torch.nn.Module):
        def get_dist(self, tensordict, logits_key=None, **kwargs):
            return _GivenLogProbs(tensordict.get("given_log_prob"), tensordict.get("given_mask"))

    return GivenLogProbActor()


def load_policy(root: Path) -> Loaded:
    """`GRPOLoss(actor)(tensordict)["loss_objective"]` per micro-batch, as torchrl's GRPO training calls the loss.

    The loss module is real: `GRPOLoss(actor, entropy_bonus=False)` with every other argument at its default
    (clip_epsilon 0.2, aggregation "token_mean", kl_mask_threshold / kl_to_ref_coeff / kl_to_inference_coeff None,
    masking_strategy "sft"; grpo.py:494-514). The actor is trivial (`_given_actor`): it has no `_get_sft_dist`, so
    `_get_cur_log_prob` falls back to `actor.get_dist(tensordict, logits_key="logits")` (grpo.py:637-642) and reads
    `dist.log_prob(action)` (:654): the case's current log-probs, the autograd leaf. The tensordict [b, T] holds
    `("tokens", "full")` (zeros: the action the distribution ignores), `("log_probs", "full")` = old_logp (the
    rollout log-probs, `sample_log_prob`, :924-929), `advantage` = the per-token advantage [b, T, 1] (`forward`
    requires it with the log-weight's ndim, :717-720). torchrl then runs its own masking (`dist.mask &
    isfinite(prev_log_prob)` and `torch.where` of both log-probs, :961-967; 0.12.0 `dist.mask` only, :651-657), the
    clipped objective (`_compute_policy_objective`, :769-782: clamp of the log-weight to [log(1 - eps),
    log1p(eps)], `-min(r A, clip(r) A)`) and the token_mean aggregation (`_aggregate_loss_value` :784-816 ->
    `_reduce_loss`, common.py:340-377). entropy_bonus=False: the entropy needs logits (the `loss_entropy` key is a
    separate term; the trainer's sum would add it), the neutral coefficient 0. Per micro-batch / the accumulation
    steps, as `load_aggregation` (0.14.1 torchrl/trainers/trainers.py:474-479)."""
    from tensordict import TensorDict

    mod = import_from(root, _GRPO)
    cls = getattr(mod, "GRPOLoss", None)
    if cls is None:
        raise NotPresent(f"{_GRPO}.GRPOLoss is not present at this pin")
    loss_module = cls(_given_actor(), entropy_bonus=False)
    keys = loss_module.tensor_keys

    def micro(rows, logp, mask, step):
        case = step.case
        cpu = rows.cpu()
        like = dict(device=logp.device, dtype=logp.dtype)
        b, t = logp.shape
        td = TensorDict(
            {
                "given_log_prob": logp,
                "given_mask": mask.bool(),
                keys.action: torch.zeros(b, t, dtype=torch.long, device=logp.device),
                keys.sample_log_prob: case.extra["old_logp"][cpu].to(**like),
                keys.advantage: case.extra["adv"][cpu].to(**like).unsqueeze(-1),
            },
            batch_size=[b],
            device=logp.device,
        )
        out = loss_module.to(logp.device)(td)
        return out.get("loss_objective") / step.rank_micro_batches

    def run(case: Case, device: str):
        return run_step(case, device, micro, leaf_name="logp")

    notes = [
        "GRPOLoss(trivial actor, entropy_bonus=False), other arguments at their defaults (clip_epsilon=0.2, "
        "aggregation='token_mean', no KL terms, masking_strategy='sft'); out['loss_objective'] per micro-batch",
        "actor.get_dist(td) returns the case's logp (the autograd leaf) as log_prob(action) and the loss mask as "
        "dist.mask (what an LLM wrapper's masked distribution carries); td: ('log_probs', 'full') = old_logp, "
        "advantage = adv [b, T, 1], ('tokens', 'full') = zeros",
        "entropy_bonus=False: no logits to take an entropy from (the neutral coefficient 0); / accumulation steps",
    ]
    return Loaded(run, f"{_rel(root, mod)}::GRPOLoss.forward", notes)


def load(root: Path, entry: str) -> Loaded:
    """The entry of a kind beyond GAE (the worker loads it from here: targets.registry.adapter_for)."""
    if entry == "policy-loss":
        return load_policy(root)
    if entry == "value-loss":
        return load_value(root)
    if entry in AGGREGATION:
        return load_aggregation(root, entry)
    if entry == "kl-to-ref":
        return load_kl_to_ref(root)
    if entry in ("mc-advantage", "mc-advantage-sum"):
        return load_mc_advantage(root, None if entry == "mc-advantage" else "sum")
    if entry == "kl":
        return load_kl_computation(root)
    raise ValueError(f"torchrl_kinds has no entry {entry!r}")

"""OpenRLHF's GAE entries as the worker calls them: the experience maker's own `get_advantages_and_returns`
(openrlhf/trainer/ppo_utils/experience_maker.py), called unbound with `self=None`, on a score placed by
OpenRLHF's own `compute_reward` (openrlhf/models/utils.py), at the pin. The declaration (pins, domains,
entries, options, citations) is `targets/openrlhf/declare.py`; the other kinds' calls are `calls_kinds.py`."""

from __future__ import annotations

import inspect
from pathlib import Path
from types import SimpleNamespace

import torch

from maskfuzz.oracles.case import Case
from maskfuzz.targets.adapters.base import Loaded, NotPresent, import_from

_MODULE = "openrlhf.trainer.ppo_utils.experience_maker"
_NAME = "get_advantages_and_returns"
_PLACEMENT = ("openrlhf.models.utils", "compute_reward")
_PENALTIES = ("openrlhf.trainer.ppo_utils.length_penalty", "apply_length_penalties")

# ---- options (oracles/options.py; declared in declare.py); lines at 0.11.2 inside the wheel ---------------------
CLIP_RANGE = "reward.clip_range"
STOP_PROPERLY = "reward.stop_properly_penalty_coef"
STOP_OFF = 1.0  # stands for the CLI default None (off): scaling a cut row's reward by 1 changes nothing


class OptionNotAtPin(RuntimeError):
    """A non-default option the framework does not have at this pin (the code that reads it is absent)."""


def _find_gae(root: Path):
    """The function object and where it is defined; NotPresent when no class of the module has it."""
    mod = import_from(root, _MODULE)
    fn = getattr(mod, _NAME, None)
    if fn is None:
        owners = [
            obj
            for obj in vars(mod).values()
            if inspect.isclass(obj) and obj.__module__ == mod.__name__ and _NAME in vars(obj)
        ]
        if not owners:
            raise NotPresent(f"{_MODULE} has no {_NAME} (neither a function nor a method of one of its classes)")
        fn = vars(owners[0])[_NAME]
    rel = Path(inspect.getfile(mod)).resolve().relative_to(Path(root).resolve())
    return fn, f"{rel}::{fn.__qualname__}"


def _score_placer(root: Path):
    """OpenRLHF's own placement: (action_mask bool [B, T]) -> bool [B, T], True where compute_reward puts r;
    and compute_reward itself when it takes `reward_clip_range` (from 0.5.0), else None."""
    mod = import_from(root, _PLACEMENT[0])
    compute_reward = getattr(mod, _PLACEMENT[1], None)
    if compute_reward is None:
        raise NotPresent(f"{_PLACEMENT[0]}.{_PLACEMENT[1]} is not present at this pin")
    params = inspect.signature(compute_reward).parameters

    def place(action_mask: torch.Tensor) -> torch.Tensor:
        zeros = torch.zeros(action_mask.shape, dtype=torch.float32)
        kw = {"r": torch.ones(action_mask.shape[0]), "kl_coef": 0.0, "action_mask": action_mask}
        if "kl" in params:
            kw["kl"] = zeros
        elif "log_probs" in params and "log_probs_base" in params:  # up to 0.4.x it computes the KL inside
            kw["log_probs"], kw["log_probs_base"] = zeros, zeros.clone()
        else:
            raise RuntimeError(f"compute_reward has parameters {list(params)}; expected kl or log_probs/log_probs_base")
        out = compute_reward(**kw)
        reward = out[0] if isinstance(out, tuple) else out
        return reward != 0

    rel = Path(inspect.getfile(mod)).resolve().relative_to(Path(root).resolve())
    clipping = compute_reward if "reward_clip_range" in params and "kl" in params else None
    return place, f"{rel}::compute_reward", clipping


def _penalties(root: Path):
    """`apply_length_penalties(experiences, args)` (0.11: the stop-properly penalty), or None at a pin without it."""
    try:
        mod = import_from(root, _PENALTIES[0])
    except NotPresent:
        return None
    return getattr(mod, _PENALTIES[1], None)


def _stop_properly(penalties, score: torch.Tensor, cut: torch.Tensor, coef: float) -> torch.Tensor:
    """The outcome rewards after OpenRLHF's own length penalties with --reward.stop_properly_penalty_coef `coef`
    (an experience holding the rewards and the truncated flags, as samples_generator.py:307 sets them)."""
    if penalties is None:
        raise OptionNotAtPin(
            f"OptionNotAtPin: {STOP_PROPERLY}={coef} needs openrlhf/trainer/ppo_utils/length_penalty.py (0.11)"
        )
    exp = SimpleNamespace(rewards=score.clone(), truncated=cut.to(score.device), info={})
    ns = SimpleNamespace
    args = ns(reward=ns(overlong_buffer_len=None, stop_properly_penalty_coef=coef), rollout=ns(), data=ns())
    penalties([exp], args)
    return exp.rewards


# --algo.kl.init_coef's default (cli/train_ppo_ray.py:438 at 0.11.2): the FixedKLController value
# (trainer/ppo_trainer.py:176) compute_reward gets as kl_coef (experience_maker.py:286)
KL_INIT_COEF = 0.01
KL_ESTIMATOR = "k1"  # --algo.kl.estimator's default (cli/train_ppo_ray.py:449-451)


def _load_gae_kl(root: Path) -> Loaded:
    """GAE with the KL in the reward ("gae-kl"), the functions the experience maker calls, in its order (0.11.2):
    make_experience's `compute_approx_kl(action_log_probs, base_action_log_probs, kl_estimator=...)`
    (experience_maker.py:205-210, no mask; 0.6.3 :415-420 also passes action_mask=samples.action_mask), then
    `compute_reward(r, kl_ctl.value, kl, action_mask, reward_clip_range)` (models/utils.py:131-157, called at
    experience_maker.py:284-290; 0.6.3 :533-540), then `get_advantages_and_returns(values, reward, action_mask, gamma,
    lambd)` (:293-299; 0.6.3 :543-549), the default entry's function. The batch whitening that follows
    (:326-338) is not applied, as for the default entry. NotPresent at 0.3.6.post1 (compute_reward computes the KL
    itself and clamps the score to [-10, 10] unconditionally, models/utils.py:39-42 there) and at 0.6.3 (no clamp of
    the estimate: another variant than the declared one)."""
    gae, where = _find_gae(root)
    mod = import_from(root, _PLACEMENT[0])
    approx = getattr(mod, "compute_approx_kl", None)
    reward_fn = getattr(mod, _PLACEMENT[1], None)
    kl_params = inspect.signature(approx).parameters if approx else {}
    r_params = inspect.signature(reward_fn).parameters if reward_fn else {}
    if "kl_estimator" not in kl_params or not {"kl", "action_mask", "reward_clip_range"} <= set(r_params):
        raise NotPresent(
            f"compute_approx_kl {list(kl_params)} / compute_reward {list(r_params)}: no kl_estimator or no KL input "
            "to compute_reward at this pin (0.3.6.post1 computes the KL inside compute_reward and clamps the score to "
            "[-10, 10] unconditionally, models/utils.py:39-42)"
        )
    if "clamp(min=-10, max=10)" not in inspect.getsource(approx):
        raise NotPresent(
            "compute_approx_kl does not clamp the estimate at this pin (0.6.3: models/utils.py:23-48, the log-ratio "
            "times the mask); the entry declares the clamp to [-10, 10] of 0.11.2 (models/utils.py:113) and an "
            "entry holds one variant"
        )
    masked_kl = "action_mask" in kl_params
    wide = (-float("inf"), float("inf"))  # --reward.clip_range opened wide, as the default entry keeps the score

    def run(case: Case, device: str) -> tuple[torch.Tensor, torch.Tensor]:
        dt = case.torch_dtype
        action_mask = case.trainable.to(device)
        logp = case.extra["logp"].to(device=device, dtype=dt)
        ref = case.extra["ref_logp"].to(device=device, dtype=dt)
        mask_kw = {"action_mask": action_mask} if masked_kl else {}
        kl = approx(logp, ref, kl_estimator=KL_ESTIMATOR, **mask_kw)
        score = case.score.to(device=device, dtype=dt)
        reward = reward_fn(score, KL_INIT_COEF, kl, action_mask=action_mask, reward_clip_range=wide)
        values = case.values.to(device=device, dtype=dt)
        return gae(None, values=values, rewards=reward, action_mask=action_mask, gamma=case.gamma, lambd=case.lam)

    rel = Path(inspect.getfile(mod)).resolve().relative_to(Path(root).resolve())
    notes = [
        f"{rel}::compute_approx_kl(logp, ref_logp, kl_estimator={KL_ESTIMATOR!r}"
        + (", action_mask)" if masked_kl else ") (no mask, as make_experience calls it)"),
        f"{rel}::compute_reward(score, kl_coef={KL_INIT_COEF}, kl, action_mask, reward_clip_range opened wide); the "
        "shaped reward is float32 (zeros_like(kl))",
        f"{where} called unbound with self=None; the case's token rewards are not passed (zero by the domain)",
    ]
    # `where` names the judged function alone (maskfuzz repro writes it as an import); the chain is in the notes
    return Loaded(run, where, notes)


def load(root: Path, entry: str | None) -> Loaded:
    if entry == "gae-kl":
        return _load_gae_kl(root)
    if entry not in (None, "default"):
        raise ValueError(f"openrlhf's GAE adapter loads the entry 'default'; {entry!r} loads from calls_kinds")
    gae, where = _find_gae(root)
    params = list(inspect.signature(gae).parameters)
    if params[:6] != ["self", "values", "rewards", "action_mask", "gamma", "lambd"]:
        # a changed signature must fail loudly, never be called with guessed names
        want = "(self, values, rewards, action_mask, gamma, lambd)"
        raise RuntimeError(f"{where} has parameters {params}; expected {want}")
    place, place_where, clipping = _score_placer(root)
    penalties = _penalties(root)

    def run(case: Case, device: str) -> tuple[torch.Tensor, torch.Tensor]:
        dt = case.torch_dtype
        action_mask = case.trainable.to(device)
        score = case.score.to(device=device, dtype=dt)
        coef = case.options.get(STOP_PROPERLY, STOP_OFF)
        if coef != STOP_OFF:  # experience_maker.py:247 runs the penalties on the outcome rewards first
            score = _stop_properly(penalties, score, case.truncated_rows(), coef)
        rewards = case.token_rewards.to(device=device, dtype=dt)
        if CLIP_RANGE in case.options:  # compute_reward clamps r, then puts it at the last action token
            if clipping is None:
                raise OptionNotAtPin(f"OptionNotAtPin: {CLIP_RANGE} needs compute_reward(reward_clip_range) (0.5.0)")
            c = case.options[CLIP_RANGE]
            zero = torch.zeros(case.shape, dtype=dt, device=device)
            rewards = rewards + clipping(score, 0.0, zero, action_mask=action_mask, reward_clip_range=(-c, c))
        else:
            at_score = place(case.trainable).to(device)
            rewards = rewards + torch.where(at_score, score[:, None], torch.zeros((), dtype=dt, device=device))
        values = case.values.to(device=device, dtype=dt)
        return gae(None, values=values, rewards=rewards, action_mask=action_mask, gamma=case.gamma, lambd=case.lam)

    notes = [
        "called unbound with self=None (the padded-tensor branch never uses self)",
        f"score placed by OpenRLHF's {place_where} (last action-mask token), moved into the case's dtype",
        f"options: {CLIP_RANGE} c -> compute_reward(reward_clip_range=(-c, c)) places the clamped score; "
        f"{STOP_PROPERLY} -> the real apply_length_penalties on the score with the case's truncated rows",
    ]
    return Loaded(run, where, notes)

"""Adapter for OpenRLHF: `openrlhf/trainer/ppo_utils/experience_maker.py::get_advantages_and_returns`.

`get_advantages_and_returns(self, values, rewards, action_mask, gamma, lambd)` is a method of the
experience maker (`NaiveExperienceMaker` in 0.3.6-0.6.2, `RemoteExperienceMaker` from 0.6.3) that never
uses `self` on padded [B, T] tensors (only its packed-list branch, 0.5-0.6, recurses through it),
so the adapter calls it unbound with `self=None`. It multiplies values and rewards by the action
mask and runs a plain GAE loop over every position of the window: the `dense` contract. It does not
whiten (the experience maker whitens afterwards, over all experiences) and does not mask its
outputs.

Score placement is OpenRLHF's own `openrlhf/models/utils.py::compute_reward`: the score goes to
`eos_indices = T - 1 - action_mask.fliplr().argmax(1)`, the last action-mask token (T - 1 for a row
without action tokens). The adapter runs it with a marker score of 1.0 and zero KL to learn the
position and puts the case's score there in the case's dtype, because compute_reward also clips the
score (up to 0.4.x: `r.clamp(-10, 10)`; from 0.5.0: optional `reward_clip_range`) and, up to 0.4.x, computes the KL
term from two log-prob tensors: neither is masking behaviour, and both would blur the comparison.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import torch

from oracles.case import Case
from targets.adapters.base import Loaded, NotPresent, import_from
from targets.registry import COMMON_HEAVY, Pin, TargetSpec

_MODULE = "openrlhf.trainer.ppo_utils.experience_maker"
_NAME = "get_advantages_and_returns"
_PLACEMENT = ("openrlhf.models.utils", "compute_reward")

SPEC = TargetSpec(
    id="openrlhf",
    adapter="targets.adapters.openrlhf",
    own=("openrlhf",),
    contract="dense",
    git_url="https://github.com/OpenRLHF/OpenRLHF.git",
    package="openrlhf",
    pins=(
        Pin("0.3.6.post1", "oldest release on PyPI (NaiveExperienceMaker; compute_reward clamps r to [-10, 10])"),
        Pin("0.6.3", "first release with the method on RemoteExperienceMaker (split from BaseExperienceMaker)"),
        Pin("0.11.2", "newest release", default=True),
    ),
    whitening=None,
    masked_zero=True,
    masked_zero_why="",
    # Missing packages imported at module level by OpenRLHF and never used by the GAE loop or by
    # compute_reward: bitsandbytes, loralib (0.3.x models), tqdm, requests (remote reward models),
    # pylatexenc (math grading), aiohttp (agent utils), torchdata (deepspeed utils, 0.11).
    stand_ins=COMMON_HEAVY + ("bitsandbytes", "loralib", "tqdm", "requests", "pylatexenc", "aiohttp", "torchdata"),
    notes=(
        "Contract: dense. The function masks values and rewards by multiplication (values = action_mask * values) "
        "and runs the plain loop over all T positions, so each non-action token is a zero-value, zero-reward "
        "transition; this is what OpenRLHF intends for multi-turn rollouts too (samples_generator.py builds "
        "action_mask from the action ranges, observation tokens between them are 0). The action mask is passed as a "
        "bool tensor, as Experience.action_mask is. Multiplying does not remove NaN (NaN * 0 = NaN). Outputs are "
        "not multiplied by the mask: advantages in gaps and before the first action token carry the later "
        "advantage; nothing in OpenRLHF documents that, so masked_zero stays promised."
    ),
)


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
    """OpenRLHF's own placement: (action_mask bool [B, T]) -> bool [B, T], True where compute_reward puts r."""
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
    return place, f"{rel}::compute_reward"


def load(root: Path, entry: str | None) -> Loaded:
    if entry not in (None, "default"):
        raise ValueError(f"openrlhf has one entry point, 'default'; got {entry!r}")
    gae, where = _find_gae(root)
    params = list(inspect.signature(gae).parameters)
    if params[:6] != ["self", "values", "rewards", "action_mask", "gamma", "lambd"]:
        # a changed signature must fail loudly, never be called with guessed names
        want = "(self, values, rewards, action_mask, gamma, lambd)"
        raise RuntimeError(f"{where} has parameters {params}; expected {want}")
    place, place_where = _score_placer(root)

    def run(case: Case, device: str) -> tuple[torch.Tensor, torch.Tensor]:
        dt = case.torch_dtype
        action_mask = case.trainable.to(device)
        at_score = place(case.trainable).to(device)
        score = case.score.to(device=device, dtype=dt)
        rewards = case.token_rewards.to(device=device, dtype=dt)
        rewards = rewards + torch.where(at_score, score[:, None], torch.zeros((), dtype=dt, device=device))
        values = case.values.to(device=device, dtype=dt)
        return gae(None, values=values, rewards=rewards, action_mask=action_mask, gamma=case.gamma, lambd=case.lam)

    notes = [
        "called unbound with self=None (the padded-tensor branch never uses self)",
        f"score placed by OpenRLHF's {place_where} (last action-mask token), moved into the case's dtype",
    ]
    return Loaded(run, where, notes)

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

Pipeline domain. At 0.3.6.post1 and 0.6.3 the response window comes from `Actor.process_sequences`:
the action mask marks actions whose state token is neither EOS nor pad and forces position 0 on, and
the response is right-padded, so no row is left-padded, starts masked or is empty (the packed path of
0.6.3 passes no mask at all). The KL term is multiplied by the action mask before it enters the
reward and the score sits on the last action token, so token rewards under the mask are 0. Critic
values under the mask are raw critic outputs (the function masks them itself). Gaps and a masked
real tail stay possible there only through a pad or EOS id sampled mid-response (the mask is built
per token). From 0.6.3 the log-probs are float32 and the reward tensor float32, so the loop runs in
float32 (bf16 critic values are promoted). At 0.11.2 the window is the whole sample from its second
token (`action_mask[1:]` over prompt + actions + environment feedback, right-padded): prompt tokens
lead every row, multi-turn agents give gaps and an observation tail; critic values and action
log-probs are multiplied by the action mask in the models, so values and KL rewards under the mask
are 0. Values come from a linear value head and the KL from float32 log-prob differences (clamped to
[-10, 10] at 0.11.2): nothing non-finite reaches the masked positions. Every restriction cites its line
in `pipeline` / `pipeline_by_pin`.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import torch

from oracles.case import Case
from oracles.domain import Domain
from targets.adapters.base import Loaded, NotPresent, import_from
from targets.registry import COMMON_HEAVY, Pin, TargetSpec

_MODULE = "openrlhf.trainer.ppo_utils.experience_maker"
_NAME = "get_advantages_and_returns"
_PLACEMENT = ("openrlhf.models.utils", "compute_reward")

# The pipeline domain at each pin (module docstring, "Pipeline domain"). Paths are inside the release wheel.
_FINITE_036 = (
    "0.3.6.post1: openrlhf/models/model.py:258-268 values are the critic's linear value head, unmasked and "
    "finite; openrlhf/models/utils.py:25-26,39-42 rewards are a log-prob difference times the action mask "
    "plus the score clamped to [-10, 10]"
)
_PIPELINE_036 = Domain(
    leading_mask=False,
    left_padding=False,
    all_masked_rows=False,
    masked_rewards=False,
    nonfinite_poison=False,
    why={
        "leading_mask": "0.3.6.post1: openrlhf/models/actor.py:163-165 action_mask[:, 0] = 1 (the first action "
        "always counts)",
        "left_padding": "0.3.6.post1: openrlhf/trainer/ppo_utils/experience_maker.py:364-387 responses are "
        "right-padded; openrlhf/models/actor.py:165 position 0 is always an action",
        "all_masked_rows": "0.3.6.post1: openrlhf/models/actor.py:165 action_mask[:, 0] = 1, so every row has an "
        "action (HF path: openrlhf/models/actor.py:139 uses the same process_sequences)",
        "masked_rewards": "0.3.6.post1: openrlhf/models/utils.py:25-26 kl = log_ratio * action_mask; "
        "openrlhf/models/utils.py:53-56 the score goes to the last action-mask token",
        "nonfinite_poison": _FINITE_036,
    },
)
_PIPELINE_063 = Domain(
    dtypes=("float32",),
    leading_mask=False,
    left_padding=False,
    all_masked_rows=False,
    masked_rewards=False,
    nonfinite_poison=False,
    why={
        "dtypes": "0.6.3: openrlhf/models/actor.py:226 logits to float32, openrlhf/models/utils.py:24,77 "
        "kl = log_probs.float() - ... and the reward is zeros_like(kl): rewards are float32, so "
        "openrlhf/trainer/ppo_utils/experience_maker.py:626-635 runs in float32 (bf16 values promoted)",
        "leading_mask": "0.6.3: openrlhf/models/actor.py:191-193 action_mask[:, 0] = 1; packed samples "
        "(openrlhf/trainer/ppo_utils/experience_maker.py:874) pass no mask",
        "left_padding": "0.6.3: openrlhf/trainer/ppo_utils/experience_maker.py:792-812 responses are "
        "right-padded; openrlhf/models/actor.py:193 position 0 is always an action",
        "all_masked_rows": "0.6.3: openrlhf/models/actor.py:193 action_mask[:, 0] = 1; packed: "
        "openrlhf/trainer/ppo_utils/experience_maker.py:858 num_actions = max(1, output_len)",
        "masked_rewards": "0.6.3: openrlhf/trainer/ppo_utils/experience_maker.py:415-420 with "
        "openrlhf/models/utils.py:23-47 the log ratio is multiplied by action_mask before k1/k2/k3 (all 0 there); "
        "openrlhf/models/utils.py:76-79 the score goes to the last action-mask token",
        "nonfinite_poison": "0.6.3: openrlhf/models/model.py:289-303 values are the critic's linear value head "
        "(finite); openrlhf/models/utils.py:23-47 rewards are a masked float32 log-prob difference",
    },
)
_PIPELINE_0112 = Domain(
    dtypes=("float32",),
    left_padding=False,
    masked_rewards=False,
    masked_values=False,
    nonfinite_poison=False,
    why={
        "dtypes": "0.11.2: openrlhf/models/actor.py:267 logits to float32; openrlhf/models/utils.py:93 "
        "log_ratio in float32; openrlhf/models/model.py:312 values * action_mask.float() is float32; "
        "openrlhf/trainer/ppo_utils/experience_maker.py:244 rewards promoted to at least float32",
        "left_padding": "0.11.2: openrlhf/trainer/ppo_utils/samples_generator.py:253-263 the window is the "
        "sample from its second token; openrlhf/trainer/ppo_utils/experience.py:113 batches are right-padded",
        "masked_rewards": "0.11.2: openrlhf/models/actor.py:298 action log-probs (actor and reference) times "
        "action_mask, so openrlhf/models/utils.py:93-113 gives kl 0 there for k1/k2/k3; "
        "openrlhf/models/utils.py:154-157 the score goes to the last action-mask token",
        "masked_values": "0.11.2: openrlhf/models/model.py:312 action_values = values[...] * action_mask.float()",
        "nonfinite_poison": "0.11.2: openrlhf/models/model.py:302-312 values are the critic's linear value head "
        "(finite) times the mask; openrlhf/models/utils.py:93-113 the KL is a float32 log-prob difference "
        "clamped to [-10, 10]",
    },
)

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
    pipeline=_PIPELINE_0112,
    pipeline_by_pin={"0.3.6.post1": _PIPELINE_036, "0.6.3": _PIPELINE_063},
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

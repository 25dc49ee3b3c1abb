"""torchtune's GAE entry as the worker calls it: `torchtune/rlhf/rewards.py::estimate_advantages(values, rewards,
gamma, lmbda, masks)` at the pin, on rewards built by the same module's `get_rewards_ppo` (the score scattered to
`valid_score_idxs`), imported from the release wheel. The declaration (pins, domains, entries, citations) is
`targets/torchtune/declare.py`; the other kinds' calls are `calls_kinds.py`."""

from __future__ import annotations

import inspect
from pathlib import Path

import torch

from maskfuzz.oracles.case import Case
from maskfuzz.targets.adapters.base import Loaded, function_from

_REWARDS = "torchtune.rlhf.rewards"  # torchtune/rlhf/ from 0.3.0; 0.2.x has no rlhf package
_GAE = "estimate_advantages"
_PLACE = "get_rewards_ppo"
GAE_PARAMS = ["values", "rewards", "gamma", "lmbda", "masks"]


def last_trainable_index(trainable: torch.Tensor) -> torch.Tensor:
    """[B] int64: the last trainable position of each row (0 for a row without one, whose outputs are all masked)."""
    b_rows, t_len = trainable.shape
    pos = torch.arange(t_len, device=trainable.device).expand(b_rows, t_len)
    return torch.where(trainable, pos, torch.full_like(pos, -1)).max(dim=1).values.clamp(min=0)


def load(root: Path, entry: str | None) -> Loaded:
    """`estimate_advantages` for the entry "default" (NotPresent at a pin without `torchtune.rlhf`)."""
    if entry not in (None, "default"):
        raise ValueError(f"torchtune's GAE adapter loads the entry 'default'; {entry!r} loads from calls_kinds")
    gae, where = function_from(root, [(_REWARDS, _GAE)])
    place, _ = function_from(root, [(_REWARDS, _PLACE)])
    params = list(inspect.signature(gae).parameters)
    if params[:5] != GAE_PARAMS:
        # a changed signature must fail loudly, never be called with guessed names
        raise RuntimeError(f"{where} has parameters {params}; expected {GAE_PARAMS}")

    def run(case: Case, device: str) -> tuple[torch.Tensor, torch.Tensor]:
        dt = case.torch_dtype
        masks = case.trainable.to(device)
        score = case.score.to(device=device, dtype=dt)
        zero = torch.zeros(case.shape, dtype=dt, device=device)
        # the token rewards enter as torchtune's only per-token reward, -kl_coeff * (logprobs - ref_logprobs), with
        # kl_coeff 1 (exact: -1 * -r = r); the score goes where get_rewards_ppo scatters it (valid_score_idxs)
        logprobs = -case.token_rewards.to(device=device, dtype=dt)
        rewards, _, _ = place(score, logprobs, zero, 1.0, last_trainable_index(masks))
        values = case.values.to(device=device, dtype=dt)
        return gae(values, rewards, case.gamma, case.lam, masks=masks)

    notes = [
        f"rewards from {_REWARDS}.{_PLACE}(score, logprobs=-token_rewards, ref_logprobs=0, kl_coeff=1, "
        "valid_score_idxs=the last trainable position; 0 for a row without one)",
        f"{where}(values, rewards, gamma, lmbda, masks=trainable): the masks select the whitening statistics and "
        "the zeroed advantages; values and rewards are passed as the case holds them",
    ]
    return Loaded(run, where, notes)

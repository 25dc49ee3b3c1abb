"""verl's GAE entry as the worker calls it: `verl/trainer/ppo/core_algos.py::compute_gae_advantage_return` with
the score placed by verl's own reward manager (`score_placer`, also used by the other kinds' calls), at the pin.
The declaration (pins, domains, entries, options, promises) is `targets/verl/declare.py`; the other kinds'
calls are `calls_kinds.py`."""

from __future__ import annotations

import inspect
from pathlib import Path

import torch

from maskfuzz.oracles.case import Case
from maskfuzz.targets.adapters.base import Loaded, NotPresent, function_from, import_from

_GAE = ("verl.trainer.ppo.core_algos", "compute_gae_advantage_return")


class _NoTokenizer:
    """The reward manager decodes ids to text for its scorer and for printing; our scorer ignores text."""

    def decode(self, *args, **kwargs) -> str:
        return ""

    def batch_decode(self, ids, *args, **kwargs) -> list[str]:
        return ["" for _ in ids]


def _marker_score(*args, **kwargs) -> float:
    """The scorer handed to verl's reward manager: 1.0 for every row, so the non-zero entry of the
    reward tensor it returns marks the position its placement code chose."""
    return 1.0


def score_placer(root: Path):
    """verl's own score placement at this pin: a function (attention [B, T] bool) -> bool [B, T]
    marking, per row, the position where the reward manager writes the score; and where it lives."""
    from verl import DataProto  # the pin's own DataProto (verl/protocol.py)

    try:
        naive = import_from(root, "verl.workers.reward_manager.naive")
        manager = naive.NaiveRewardManager(tokenizer=_NoTokenizer(), num_examine=0, compute_score=_marker_score)
        where = "verl/workers/reward_manager/naive.py::NaiveRewardManager.__call__"
    except NotPresent:
        # 0.1: the manager is a class in main_ppo.py that picks its scorer by data source through the
        # module-level _select_rm_score_fn; we point that at the marker scorer (the placement is untouched).
        main_ppo = import_from(root, "verl.trainer.main_ppo")
        if not hasattr(main_ppo, "RewardManager"):
            raise NotPresent("no reward manager at this pin (verl.workers.reward_manager.naive, verl.trainer.main_ppo)")
        main_ppo._select_rm_score_fn = lambda data_source: _marker_score
        manager = main_ppo.RewardManager(tokenizer=_NoTokenizer(), num_examine=0)
        where = "verl/trainer/main_ppo.py::RewardManager.__call__"

    def place(attention: torch.Tensor) -> torch.Tensor:
        b_rows, t_len = attention.shape
        prompt = torch.ones(b_rows, 1, dtype=torch.long)  # one real prompt token per row
        data = DataProto.from_dict(
            tensors={
                "prompts": prompt,
                "responses": torch.zeros(b_rows, t_len, dtype=torch.long),
                "attention_mask": torch.cat([prompt, attention.to(torch.long)], dim=1),
            },
            non_tensors={
                "data_source": ["maskfuzz"] * b_rows,
                "reward_model": [{"ground_truth": ""} for _ in range(b_rows)],
            },
        )
        out = manager(data)
        reward = out["reward_tensor"] if isinstance(out, dict) else out
        return reward != 0

    return place, where


def load(root: Path, entry: str | None) -> Loaded:
    if entry not in (None, "default"):
        raise ValueError(f"verl's GAE adapter loads the entry 'default'; {entry!r} loads from calls_kinds")
    gae, where = function_from(root, [_GAE])
    params = list(inspect.signature(gae).parameters)
    mask_arg = next((p for p in ("response_mask", "eos_mask") if p in params), None)
    expected = {"token_level_rewards", "values", "gamma", "lam"}
    if mask_arg is None or not expected <= set(params):
        # a changed signature must fail loudly, never be called with guessed names
        raise RuntimeError(f"{where} has parameters {params}; expected {sorted(expected)} and response_mask/eos_mask")
    place, place_where = score_placer(root)

    def run(case: Case, device: str) -> tuple[torch.Tensor, torch.Tensor]:
        dt = case.torch_dtype
        at_score = place(case.attention).to(device)
        score = case.score.to(device=device, dtype=dt)
        rewards = case.token_rewards.to(device=device, dtype=dt)
        rewards = rewards + torch.where(at_score, score[:, None], torch.zeros((), dtype=dt, device=device))
        adv, ret = gae(
            token_level_rewards=rewards,
            values=case.values.to(device=device, dtype=dt),
            **{mask_arg: case.trainable.to(device=device, dtype=torch.long)},
            gamma=case.gamma,
            lam=case.lam,
        )
        return adv, ret

    notes = [
        f"called with mask argument {mask_arg!r} (int64, as verl passes it)",
        f"score placed by verl's {place_where} (last attended response token), moved into the case's dtype",
    ]
    return Loaded(run, where, notes)

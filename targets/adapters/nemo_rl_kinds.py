"""NeMo-RL's masked math beyond GAE: loaders for the entries of `targets.adapters.nemo_rl.SPEC`.

`GRPOAdvantageEstimator` (nemo_rl/algorithms/advantage_estimator.py) is compiled from the checkout with
`SourceTree`, as the GAE entry compiles `GeneralizedAdvantageEstimator` (nothing of nemo_rl is imported); it
calls NeMo-RL's own `calculate_baseline_and_std_per_prompt` (nemo_rl/algorithms/utils.py), compiled the same way.
Inputs as grpo.py hands them: `prompt_ids` a [B, S] tensor whose equal rows are one prompt (the adapter gives
[B, 1] group ids), `rewards` the [B] scores, `mask` the response token mask (used only for the output shape).
The config is a namespace with the two attributes `__init__` reads.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import torch

from maskfuzz.oracles.case import Case
from maskfuzz.targets.adapters.base import Loaded, NotPresent
from maskfuzz.targets.adapters.extract import SourceTree, find_class

_MODULE = "nemo_rl.algorithms.advantage_estimator"
_CLASS = "GRPOAdvantageEstimator"
CONFIGS = {
    # use_leave_one_out_baseline=False, normalize_rewards=True: (r - mean_g) / (std_g + 1e-6)
    "grpo": {"use_leave_one_out_baseline": False, "normalize_rewards": True},
    # use_leave_one_out_baseline=True, normalize_rewards=False: r - mean of the others (RLOO)
    "rloo": {"use_leave_one_out_baseline": True, "normalize_rewards": False},
}


def load_kind(root: Path, entry: str) -> Loaded:
    if entry not in CONFIGS:
        raise NotPresent(f"nemo-rl has no entry {entry!r}; entries: default, {', '.join(CONFIGS)}")
    tree = SourceTree(Path(root), ("nemo_rl",))
    path = tree.module_file(_MODULE)
    if path is None or find_class(tree.file(path).tree, _CLASS) is None:
        raise NotPresent(f"{_MODULE}.{_CLASS} is not present at this pin")
    ns = tree.resolve(path, [_CLASS])
    if _CLASS not in ns:
        raise NotPresent(f"{_CLASS} could not be compiled: {tree.unresolved}")
    est = ns[_CLASS](SimpleNamespace(**CONFIGS[entry]), None)

    def run(case: Case, device: str):
        dt = case.torch_dtype
        groups = case.group if case.group is not None else torch.zeros(case.shape[0], dtype=torch.int64)
        prompt_ids = groups.to(device)[:, None]
        rewards = case.score.to(device=device, dtype=dt)
        mask = case.trainable.to(device=device, dtype=dt)
        return (est.compute_advantage(prompt_ids, rewards, mask),)

    cfg = ", ".join(f"{k}={v}" for k, v in CONFIGS[entry].items())
    return Loaded(run, f"{tree.rel(path)}::{_CLASS}.compute_advantage",
                  [f"config: {cfg}", "prompt_ids = group ids as a [B, 1] tensor"])

load = load_kind  # the worker loads the entries of the other kinds from here (targets.registry.adapter_for)

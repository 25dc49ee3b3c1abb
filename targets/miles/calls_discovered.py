"""The worker side of miles' discovered variants (`discover.py`): `trainer_options_calls` with miles' calls
(`calls_kinds`: the grpo entry's `_post_process_rewards` + `get_grpo_returns`, the policy entry's `loss_function` ->
`policy_loss_function`, `compute_approx_kl`)."""

from __future__ import annotations

from pathlib import Path

from maskfuzz.targets.adapters import trainer_options_calls as toc
from maskfuzz.targets.adapters.base import Loaded
from maskfuzz.targets.miles import calls_kinds as mk
from maskfuzz.targets.miles.discover import LAYOUT


def _group(root: Path) -> Loaded:
    return mk.load(root, "grpo")


def _policy(root: Path, settings: dict, defaults: dict) -> Loaded:
    return mk.load_policy(root, "policy-loss", settings=settings, defaults=defaults)


def _kl(root: Path, name: str) -> Loaded:
    fn, where = mk.math_function(root, "compute_approx_kl")
    return Loaded(mk.kl_runner(mk.eager(fn), name), where, [f"kl_loss_type={name!r}"])


def load(root: Path, entry: str) -> Loaded:
    return toc.load(root, entry, LAYOUT, _group, _policy, _kl)

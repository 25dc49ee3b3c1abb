"""The worker side of slime's discovered variants (`discover.py`): `trainer_options_calls` with slime's calls
(`calls_kinds`: the grpo entry's `_post_process_rewards` + `compute_advantages_and_returns`, the policy entry's
`loss_function` -> `policy_loss_function`, `compute_approx_kl`)."""

from __future__ import annotations

from pathlib import Path

from maskfuzz.targets.adapters import trainer_options_calls as toc
from maskfuzz.targets.adapters.base import Loaded, function_from
from maskfuzz.targets.miles import calls_kinds as mk
from maskfuzz.targets.slime import calls_kinds as ck
from maskfuzz.targets.slime.discover import LAYOUT


def _group(root: Path) -> Loaded:
    return ck.load(root, "grpo")


def _policy(root: Path, settings: dict, defaults: dict) -> Loaded:
    return ck.load_policy(root, "policy-loss", settings=settings, defaults=defaults)


def _kl(root: Path, name: str) -> Loaded:
    fn, where = function_from(root, [(m, "compute_approx_kl") for m in ck.SLIME_MATH_HOMES])
    return Loaded(mk.kl_runner(mk.eager(fn), name), where, [f"kl_loss_type={name!r}"])


def load(root: Path, entry: str) -> Loaded:
    return toc.load(root, entry, LAYOUT, _group, _policy, _kl)

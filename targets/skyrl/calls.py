"""SkyRL's GAE entries as the worker calls them: `compute_gae_advantage_return(token_level_rewards, values,
response_mask, gamma, lambd)` imported from the pin's `ppo_utils` (its monorepo subprojects first on sys.path), on
the rewards SkyRL's trainer builds (the score on the last real response token, a rule `load` checks in the trainer
source), and for `gae-kl` after the trainer's own `apply_reward_kl_penalty` compiled from source. The declaration
(pins, domains, entries, options, citations) is `targets/skyrl/declare.py`; the other kinds' calls are
`calls_kinds.py`."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import torch

from maskfuzz.oracles.case import Case
from maskfuzz.targets.adapters.base import Loaded, function_from
from maskfuzz.targets.adapters.extract import SourceTree, find_class, find_method

# The function's own module. `skyrl_train` first: from 2026-02-12 to 02-15 both packages exist and
# skyrl-train/ is the one the trainer of those commits (and the skyrl_train-v* tags) uses.
_CANDIDATES = [
    ("skyrl_train.utils.ppo_utils", "compute_gae_advantage_return"),
    ("skyrl.backends.skyrl_train.utils.ppo_utils", "compute_gae_advantage_return"),
]
# The trainer that places the scalar reward, per package (relative to the directory holding the package).
_TRAINERS = {"skyrl_train": "skyrl_train/trainer.py", "skyrl": "skyrl/train/trainer.py"}
_PLACEMENT = "per_token_reward[-1] = float(reward)"

# options the loads read (their Option declarations are in declare.py)
KL_TYPE = "trainer.algorithm.kl_estimator_type"
# kl_loss_coef's default (0.3.1 skyrl_train/config/ppo_base_config.yaml:109; git main config.py:836), the reward KL
# controller's value in apply_reward_kl_penalty (declare.py cites the chain)
KL_COEF = 0.001


class _Batch(dict):
    """A dict standing in for TrainingInputBatch: apply_reward_kl_penalty reads and writes keys and `.metadata`."""

    metadata: dict


def kl_penalty(root: Path) -> tuple:
    """SkyRL's `apply_reward_kl_penalty` compiled from the pin's trainer source (a method of a Ray trainer class:
    `self` stands in with cfg.trainer.algorithm and the reward KL controller of `get_kl_controller`), as
    `shape(case, device, rewards) -> rewards - kl * coef`; and where it came from."""
    ctrl_fn, _ = function_from(root, [(m, "get_kl_controller") for m, _ in _CANDIDATES])
    module = sys.modules[ctrl_fn.__module__]
    package = ctrl_fn.__module__.split(".")[0]
    base = Path(module.__file__).resolve().parents[ctrl_fn.__module__.count(".")]
    path = base / _TRAINERS[package]
    tree = SourceTree(base, ("skyrl_train", "skyrl"))
    parsed = tree.file(path).tree
    classes = [find_class(parsed, n.name) for n in parsed.body if type(n).__name__ == "ClassDef"]
    node = next((m for m in (find_method(c, "apply_reward_kl_penalty") for c in classes) if m is not None), None)
    if node is None:
        raise RuntimeError(f"{path} has no trainer method apply_reward_kl_penalty: update targets/skyrl/calls.py")
    fn = tree.function(path, node)

    def shape(case: Case, device: str, rewards: torch.Tensor) -> torch.Tensor:
        dt = case.torch_dtype
        algo = types.SimpleNamespace(
            kl_estimator_type=case.options.get(KL_TYPE, "k3"),
            kl_loss_coef=KL_COEF,
            kl_ctrl=types.SimpleNamespace(type="fixed", kl_target=0.1, horizon=10000),  # the config's defaults
        )
        me = types.SimpleNamespace(
            cfg=types.SimpleNamespace(trainer=types.SimpleNamespace(algorithm=algo)),
            reward_kl_controller=ctrl_fn(algo),  # the trainer's, with use_kl_in_reward (trainer.py:186-187)
            all_metrics={},  # the method logs avg_kl there (metrics only)
        )
        data = _Batch(
            loss_mask=case.trainable.to(device=device, dtype=dt),
            rewards=rewards,
            custom_rewards=rewards,  # 0.1.0 shapes data["custom_rewards"]
            action_log_probs=case.extra["logp"].to(device=device, dtype=dt),
            base_action_log_probs=case.extra["ref_logp"].to(device=device, dtype=dt),
        )
        data.metadata = {}
        fn(me, data)
        changed = [k for k in ("rewards", "custom_rewards") if data[k] is not rewards]
        if len(changed) != 1:
            raise RuntimeError(f"apply_reward_kl_penalty wrote {changed}, expected one rewards key")
        return data[changed[0]]

    rel = path.relative_to(base)
    return shape, f"{rel}:{node.lineno}::apply_reward_kl_penalty (compiled from the source)"


def import_roots(root: Path) -> list[Path]:
    """The directories that make the pin's packages importable, most specific first."""
    roots = []
    for sub in ("skyrl-train", "skyrl-gym"):  # monorepo subprojects with their own package dirs
        if (root / sub).is_dir():
            roots.append(root / sub)
    if (root / "skyrl" / "skyrl").is_dir():  # the short-lived nested layout
        roots.append(root / "skyrl")
    return roots


def _check_placement(fn) -> Path:
    """Insist that the trainer next to `fn`'s package still places the scalar reward on the last
    response token; returns the trainer's path.

    Raises RuntimeError when the rule changed or the trainer is missing (the adapter must then be
    updated, not silently keep the old rule)."""
    module = sys.modules[fn.__module__]
    package = fn.__module__.split(".")[0]
    base = Path(module.__file__).resolve().parents[fn.__module__.count(".")]
    path = base / _TRAINERS[package]
    if not path.is_file():
        raise RuntimeError(f"no SkyRL trainer at {path} to check the score placement against; update the adapter")
    if _PLACEMENT not in path.read_text(encoding="utf-8", errors="replace"):
        raise RuntimeError(
            f"{path} no longer contains {_PLACEMENT!r}: SkyRL's score placement changed at this pin; "
            "update targets/skyrl/calls.py"
        )
    return path


def framework_inputs(case: Case, device: str) -> dict:
    """The tensors SkyRL passes to its GAE, [B, T] each in the case's dtype.

    token_level_rewards: the case's token rewards at real tokens (0 at padding), plus the score on
    the last real token of the row; values: as given; response_mask: attention."""
    x = case.inputs(device)
    attention = case.attention.to(device)
    rewards = torch.where(attention, x["token_rewards"], torch.zeros_like(x["token_rewards"]))
    pos = torch.arange(case.shape[1], device=device).expand(case.shape)
    last_real = torch.where(attention, pos, torch.full_like(pos, -1)).max(dim=1).values
    at_last = (pos == last_real[:, None]) & attention
    rewards = rewards + torch.where(at_last, x["score"][:, None], torch.zeros_like(rewards))
    return {"token_level_rewards": rewards, "values": x["values"], "response_mask": x["attention"]}


def load(root: Path, entry: str | None) -> Loaded:
    """Import SkyRL's GAE from the checkout / unpacked wheel at `root` (its monorepo subprojects put
    first on sys.path), check the pin's score-placement rule, and return the canonical run."""
    if entry not in (None, "default", "gae-kl"):
        raise ValueError(f"the GAE adapter loads the entry 'default'; {entry!r} loads from calls_kinds")
    roots = import_roots(Path(root))
    for extra in reversed(roots):
        sys.path.insert(0, str(extra))
    fn, where = function_from(root, _CANDIDATES)
    trainer = _check_placement(fn)
    if entry == "gae-kl":
        shape, shape_where = kl_penalty(root)

        def run_kl(case: Case, device: str):
            kw = framework_inputs(case, device)
            kw["token_level_rewards"] = shape(case, device, kw["token_level_rewards"])
            return fn(**kw, gamma=case.gamma, lambd=case.lam)

        notes = [
            f"score placed on the last real response token, the rule of {trainer.relative_to(Path(root).resolve())}",
            f"then {shape_where}: kl_estimator_type from the case's options (default k3), kl_loss_coef {KL_COEF} "
            "through the fixed KL controller, loss_mask = trainable",
            "then the GAE function on the shaped rewards; response_mask = attention",
        ]
        return Loaded(run=run_kl, where=f"{where} after {shape_where}", notes=notes)

    def run(case: Case, device: str):
        kw = framework_inputs(case, device)
        adv, ret = fn(**kw, gamma=case.gamma, lambd=case.lam)
        return adv, ret

    notes = [
        f"score placed on the last real response token, the rule of {trainer.relative_to(Path(root).resolve())}",
        "response_mask = attention (SkyRL's response indicator); rewards 0 at padding",
    ]
    return Loaded(run=run, where=where, notes=notes)

"""The worker side of NeMo-RL's discovered variants (`discover.py`): a `ClippedPGLossConfig` field set in NeMo-RL's
own loss, compiled from the pin as the hand-written entries compile it (nothing of nemo_rl is imported).

`loss:<field>=true`: `calls_kinds.load_policy` (ClippedPGLossFn.__init__ and __call__ compiled from the pin, its
config ClippedPGLossConfig's defaults read from the source, reference_policy_kl_penalty 0, over one optimizer step)
with the field set, and what __init__ asserts with it (`discover.REQUIRES`: GSPO's sequence-level ratios with
token_level_loss False). `kl:<field>=true`: `calls_kinds.load_kl` (the KL-to-reference block of __call__) with the
attribute set. generation_logprobs is the case's `rollout_logp` (the rollout engine's log-probs, near prev_logprobs)
for the importance-sampling correction and its truncations (`discover.recipe`: `use_importance_sampling_
correction=true`, `truncated_importance_sampling_type=<tis|icepop|seq-mask-tis>` at the bounds of the pin's example
configs, `discover.VALUE_SETTINGS`), prev_logprobs elsewhere (those cases hold no inference-engine log-probs).
An estimator name or a field that a hand-written entry runs, or that is listed, is a skip that says why; a name that
is not a setting at this pin is a skip too.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from maskfuzz.oracles.case import Case
from maskfuzz.targets.adapters.base import Loaded, NotPresent
from maskfuzz.targets.adapters.extract import SourceTree, find_class
from maskfuzz.targets.nemo_rl.calls import Config
from maskfuzz.targets.nemo_rl.calls_kinds import load_kl, load_policy
from maskfuzz.targets.nemo_rl.discover import ADV_RECIPES, discover, estimator_class, recipe, setting

_ESTIMATORS = "nemo_rl.algorithms.advantage_estimator"


def load(root: Path, entry: str) -> Loaded:
    prefix = entry.partition(":")[0]
    found = {v.entry: v for v in discover(Path(root))}
    if entry not in found:
        known = ", ".join(v.name for v in found.values() if v.prefix == prefix) or "none"
        raise NotPresent(f"no {entry} is a NeMo-RL estimator name or ClippedPGLossConfig setting at this pin ({known})")
    v = found[entry]
    if v.covered_by:
        raise NotPresent(f"{v.citation}: {v.name!r} is run by the hand-written entry {v.covered_by!r}")
    if not v.callable:
        raise NotPresent(f"{v.citation}: not callable outside the trainer: {v.reason}")
    if prefix == "adv":
        return load_estimator(Path(root), v.name, f"discovered: {v.registry} {v.name} at {v.citation}")
    config = setting(v.name)
    loaded = (
        load_kl(Path(root), "kl", settings=config) if prefix == "kl" else load_policy(Path(root), "policy-loss", config)
    )
    gen = "the case's rollout_logp" if recipe(entry) else "prev_logprobs"
    note = (
        f"discovered: {v.registry} {v.name} at {v.citation}; set as {config}; invariants only (no float64 "
        f"reference); generation_logprobs = {gen}"
    )
    return dataclasses.replace(loaded, notes=[note, *loaded.notes])


def load_estimator(root: Path, name: str, note: str) -> Loaded:
    """`<Estimator>(estimator_config, loss_config).compute_advantage(prompt_ids, rewards, mask)` for an estimator
    with a call recipe (`discover.ADV_RECIPES`), the class compiled from the pin as `grpo-loo` compiles
    GRPOAdvantageEstimator: prompt_ids the [B, 1] group ids, rewards the [B] scores, mask the trainable mask in the
    case's dtype. RawRewardAdvantageEstimator returns (advantages, None): the advantages are judged."""
    cls_name = estimator_class(name)
    estimator_config, loss_config, _ = ADV_RECIPES[cls_name]
    tree = SourceTree(root, ("nemo_rl",))
    path = tree.module_file(_ESTIMATORS)
    if path is None or find_class(tree.file(path).tree, cls_name) is None:
        raise NotPresent(f"{_ESTIMATORS}.{cls_name} is not present at this pin")
    ns = tree.resolve(path, [cls_name])
    if cls_name not in ns:
        raise NotPresent(f"{cls_name} could not be compiled: {tree.unresolved}")
    estimator = ns[cls_name](Config(dict(estimator_config)), Config(dict(loss_config)))

    def run(case: Case, device: str):
        groups = case.group if case.group is not None else torch.zeros(case.shape[0], dtype=torch.int64)
        rewards = case.score.to(device=device, dtype=case.torch_dtype)
        mask = case.trainable.to(device=device, dtype=case.torch_dtype)
        out = estimator.compute_advantage(groups.to(device)[:, None], rewards, mask)
        return (out[0] if isinstance(out, tuple) else out,)

    cfg = ", ".join(f"{k}={val}" for k, val in {**estimator_config, **loss_config}.items())
    notes = [f"{note}; config: {cfg}; invariants only (no float64 reference)", "prompt_ids = group ids as [B, 1]"]
    return Loaded(run, f"{tree.rel(path)}::{cls_name}.compute_advantage", notes)

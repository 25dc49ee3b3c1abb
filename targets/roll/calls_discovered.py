"""The worker side of ROLL's discovered estimators (`discover.py`). `ret:reinforce` runs the RLVR pipeline's chain
with `adv_estimator="reinforce"` (below); every other value of `PPOConfig.adv_estimator` without a hand-written
entry is a skip that says why (no call recipe for it yet), or that it is not a value at this pin."""

from __future__ import annotations

from pathlib import Path

import torch

from maskfuzz.oracles.case import Case
from maskfuzz.targets.adapters.base import Loaded, NotPresent
from maskfuzz.targets.roll.calls import data_proto, final_response_mask, modules, pipeline_config
from maskfuzz.targets.roll.discover import CLASS, FIELD, PREFIXES, RECIPES, discover  # the skips are never copied

_FN = "roll.utils.functionals"


def load(root: Path, entry: str) -> Loaded:
    prefix, _, name = entry.partition(":")
    found = {v.name: v for v in discover(root)} if prefix in PREFIXES else {}
    v = found.get(name)
    if v is None or v.prefix != prefix:
        known = ", ".join(f"{x.prefix}:{x.name}" for x in found.values()) or "none"
        raise NotPresent(f"no advantage estimator {entry!r} is a value of {CLASS}.{FIELD} at this pin ({known})")
    if v.covered_by:
        raise NotPresent(f"{v.citation}: {name!r} is run by the hand-written entry {v.covered_by!r}")
    if not v.callable:
        raise NotPresent(f"{v.citation}: not callable outside the trainer: {v.reason}")
    return load_reinforce(root, name)


def load_reinforce(root: Path, estimator: str) -> Loaded:
    """`compute_advantage(adv_estimator=estimator)` as the RLVR pipeline calls it (rlvr_pipeline.py:687-721 at
    8eb27cc2dc34): `get_sample_level_mask` -> `reward_postprocess` -> `compute_token_reward` -> `compute_advantage`
    with `final_response_mask`. Its branch (functionals.py:1168 at 8eb27cc2dc34) runs `compute_reinforce_return(
    token_level_rewards, gamma, lambd)`, the discounted returns of the token rewards (no critic; advantages =
    returns). The config's reward normalisation is its default: `norm_mean_type` / `norm_std_type` None
    (base_config.py:551-562 at 8eb27cc2dc34: "None (without subtracting mean)", "None (without dividing by
    std)"), so no statistic crosses rows; reward_clip None (:541)."""
    assert estimator in RECIPES, estimator
    functionals, protocol, kl = modules(root)
    names = ("compute_advantage", "reward_postprocess", "compute_token_reward", "get_sample_level_mask")
    fns = {n: getattr(functionals, n, None) for n in names}
    missing = [n for n, f in fns.items() if f is None]
    if missing:
        raise NotPresent(f"{_FN} lacks {', '.join(missing)} at this pin")

    def run(case: Case, device: str) -> tuple[torch.Tensor, torch.Tensor]:
        data = data_proto(case, device, protocol.DataProto, "default")
        config = pipeline_config()
        config.adv_estimator = estimator
        final = final_response_mask(case, data, config, fns["get_sample_level_mask"])
        data, _ = fns["reward_postprocess"](data, config, {})
        data, _ = fns["compute_token_reward"](data, config, kl.FixedKLController(kl_coef=1.0))
        out = fns["compute_advantage"](
            data=data,
            gamma=case.gamma,
            lambd=case.lam,
            adv_estimator=estimator,
            advantage_clip=None,
            whiten_advantages=False,
            whiten_rewards=False,
            response_mask=final,
            pipeline_config=config,
        )
        return out.batch["advantages"], out.batch["returns"]

    notes = [
        f"compute_advantage(adv_estimator={estimator!r}) after reward_postprocess and compute_token_reward, as "
        "rlvr_pipeline.py runs them; score placed by ROLL (last attended token), token rewards via its KL term, beta 1",
        "reward normalisation at the config's default (norm_mean_type / norm_std_type None), whiten_advantages False",
        "invariants only: no float64 reference is declared for this variant",
    ]
    return Loaded(run, f"{_FN}::compute_advantage (adv_estimator={estimator!r})", notes)

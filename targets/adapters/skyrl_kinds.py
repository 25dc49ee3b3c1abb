"""SkyRL's masked math beyond GAE: loaders for the entries of `targets.adapters.skyrl.SPEC`.

Every loader imports SkyRL's own function from `ppo_utils` at the pin (the wheel's
`skyrl_train/utils/ppo_utils.py`, git main's `skyrl/backends/skyrl_train/utils/ppo_utils.py`) and
feeds it what SkyRL's trainer feeds it:

* outcome estimators (`grpo`, `dr-grpo`, `rloo`, `reinforce++`) get `token_level_rewards` with the
  scalar score on the last *real* response token (`per_token_reward[-1] = float(reward)`, the rule
  `targets.adapters.skyrl` checks in the trainer) plus the case's token rewards at real tokens (0 at
  padding), `response_mask` = the response indicator (canonical `attention`, never the loss mask:
  0.3.1 skyrl_train/trainer.py:771-775) and `index` = the row's uid (np.ndarray of str,
  0.3.1 skyrl_train/trainer.py:741);
* `compute_approx_kl` gets the policy and reference log-probs with `loss_mask` = canonical
  `trainable` (0.3.1 skyrl_train/trainer.py:1011-1016, skyrl_train/workers/worker.py:680-685);
* `normalize_advantages_dict` gets a dict with `advantages` = canonical `x` and `response_mask` =
  canonical `attention` (it reads nothing else; 0.3.1 skyrl_train/trainer.py:264-265).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

from maskfuzz.oracles.case import Case
from maskfuzz.targets.adapters.base import Loaded, NotPresent, function_from

_MODULES = ("skyrl_train.utils.ppo_utils", "skyrl.backends.skyrl_train.utils.ppo_utils")

# entry -> (function name, keyword arguments beyond the inputs)
OUTCOME = {
    "grpo": ("compute_grpo_outcome_advantage", {"grpo_norm_by_std": True}),
    "dr-grpo": ("compute_grpo_outcome_advantage", {"grpo_norm_by_std": False}),
    "rloo": ("compute_rloo_outcome_advantage", {}),
}
KL = {"kl-k3": "k3", "kl-k1": "k1", "kl-k2": "k2", "kl-abs": "abs"}
RETURNS = {"reinforce++": "compute_reinforce_plus_plus_outcome_advantage"}
NORMALIZATION = {"batch-norm": "normalize_advantages_dict"}
ENTRIES = (*OUTCOME, *RETURNS, *KL, *NORMALIZATION)


def _function(root: Path, name: str):
    from maskfuzz.targets.adapters.skyrl import _import_roots

    for extra in reversed(_import_roots(Path(root))):
        if str(extra) not in sys.path:
            sys.path.insert(0, str(extra))
    return function_from(root, [(m, name) for m in _MODULES])


def outcome_inputs(case: Case, device: str) -> dict:
    """token_level_rewards / response_mask / index as SkyRL's trainer builds them."""
    from maskfuzz.targets.adapters.skyrl import framework_inputs

    x = framework_inputs(case, device)
    groups = case.group if case.group is not None else torch.zeros(case.shape[0], dtype=torch.int64)
    index = np.array([str(int(g)) for g in groups.tolist()])
    return {"token_level_rewards": x["token_level_rewards"], "response_mask": x["response_mask"], "index": index}


def load_kind(root: Path, entry: str) -> Loaded:
    if entry in OUTCOME:
        name, kw = OUTCOME[entry]
        fn, where = _function(root, name)

        def run(case: Case, device: str):
            adv, _ = fn(**outcome_inputs(case, device), **kw)
            return (adv,)

        notes = [
            "score on the last real response token (trainer rule), token rewards at real tokens, 0 at padding",
            "response_mask = attention (SkyRL's response indicator), index = uids as np.ndarray of str",
            *(f"{k}={v}" for k, v in kw.items()),
        ]
        return Loaded(run=run, where=where, notes=notes)
    if entry in RETURNS:
        fn, where = _function(root, RETURNS[entry])

        def run_returns(case: Case, device: str):
            x = outcome_inputs(case, device)
            return fn(token_level_rewards=x["token_level_rewards"], response_mask=x["response_mask"], gamma=case.gamma)

        return Loaded(run=run_returns, where=where, notes=["response_mask = attention; score on the last real token"])
    if entry in KL:
        fn, where = _function(root, "compute_approx_kl")
        estimator = KL[entry]

        def run_kl(case: Case, device: str):
            dt = case.torch_dtype
            logp = case.extra["logp"].to(device=device, dtype=dt)
            ref = case.extra["ref_logp"].to(device=device, dtype=dt)
            mask = case.trainable.to(device=device, dtype=dt)
            return (fn(logp, ref, loss_mask=mask, kl_estimator_type=estimator),)

        return Loaded(run=run_kl, where=where, notes=[f"kl_estimator_type={estimator!r}, loss_mask = trainable"])
    if entry in NORMALIZATION:
        try:
            fn, where = _function(root, NORMALIZATION[entry])
        except NotPresent as exc:
            raise NotPresent(
                "normalize_advantages_dict is not present at this pin (git main inlines the batch normalisation "
                "in skyrl/train/trainer.py:1477-1481; not extracted): " + str(exc)
            ) from None

        def run_norm(case: Case, device: str):
            dt = case.torch_dtype
            data = {
                "advantages": case.extra["x"].to(device=device, dtype=dt),
                "response_mask": case.attention.to(device=device, dtype=dt),
            }
            return (fn(data)["advantages"],)

        return Loaded(run=run_norm, where=where, notes=["a dict stands in for TrainingInputBatch (two keys read)"])
    raise NotPresent(f"skyrl has no entry {entry!r}; entries: default, {', '.join(ENTRIES)}")

load = load_kind  # the worker loads the entries of the other kinds from here (targets.registry.adapter_for)

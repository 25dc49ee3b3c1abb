"""torchrl's GAE entries as the worker calls them: the framework's own `generalized_advantage_estimate` /
`vec_generalized_advantage_estimate` (torchrl/objectives/value/functional.py) and the `GAE` module
(torchrl/objectives/value/advantages.py) at the pin, on a case's tensors. The declaration (pins,
domains, entries, options, citations) is `targets/torchrl/declare.py`; the other kinds' calls are
`calls_kinds.py`."""

from __future__ import annotations

from pathlib import Path

import torch

from maskfuzz.oracles.case import Case
from maskfuzz.targets.adapters.base import Loaded, NotPresent, function_from

_MODULE = "torchrl.objectives.value.functional"
_ENTRIES = {"default": "generalized_advantage_estimate", "vec": "vec_generalized_advantage_estimate"}
_ADV_MODULE = "torchrl.objectives.value.advantages"

def framework_inputs(case: Case, device: str) -> dict:
    """torchrl's keyword inputs for `case`: float tensors [B, T, 1] in the case's dtype, bool flags [B, T, 1].

    A truncated row (`case.truncated_rows()`, cut by the length limit) ends its trajectory with `done` but not
    `terminated` at its last trainable token, and the critic value of the state after that token
    (`case.bootstrap_values()[b]`) is the `next_state_value` there, as a collector with a value network gives it."""
    x = case.inputs(device)
    b_rows, t_len = case.shape
    trainable = case.trainable.to(device)
    pos = torch.arange(t_len, device=device).expand(b_rows, t_len)
    last = torch.where(trainable, pos, torch.full_like(pos, -1)).max(dim=1).values
    end = (pos == last[:, None]) & trainable  # all False in a row without trainable tokens
    cut = end & case.truncated_rows().to(device)[:, None]
    reward = x["token_rewards"] + torch.where(end, x["score"][:, None], torch.zeros_like(x["token_rewards"]))
    values = x["values"]
    next_values = torch.cat([values[:, 1:], torch.zeros_like(values[:, :1])], dim=1)
    boot = case.bootstrap_values().to(device=device, dtype=values.dtype)[:, None].expand(b_rows, t_len)
    next_values = torch.where(cut, boot, next_values)
    return {
        "state_value": values.unsqueeze(-1),
        "next_state_value": next_values.unsqueeze(-1),
        "reward": reward.unsqueeze(-1),
        "done": end.unsqueeze(-1),
        "terminated": (end & ~cut).unsqueeze(-1),
    }


def _run_module(cls, case: Case, device: str):
    """`GAE(gamma, lmbda, value_network=None, average_gae, vectorized)` on the tensordict a collector hands it
    (values already filled: `state_value` and `("next", "state_value")`, advantages.py:2276-2290 at 0.14.1)."""
    from tensordict import TensorDict

    x = framework_inputs(case, device)
    b_rows, t_len = case.shape
    average_gae = case.options.get("average_gae", False)
    vectorized = case.options.get("vectorized", False)
    module = cls(gamma=case.gamma, lmbda=case.lam, value_network=None, average_gae=average_gae, vectorized=vectorized)
    nxt = {
        "reward": x["reward"],
        "done": x["done"],
        "terminated": x["terminated"],
        "truncated": x["done"] & ~x["terminated"],
        "state_value": x["next_state_value"],
    }
    td = TensorDict({"state_value": x["state_value"], "next": nxt}, batch_size=[b_rows, t_len], device=device)
    out = module(td)
    return out.get("advantage").squeeze(-1), out.get("value_target").squeeze(-1)


def load(root: Path, entry: str | None) -> Loaded:
    """torchrl's GAE for `entry` from `root`: "default" the functional loop, "vec" the vectorised functional,
    "module" the `GAE` value-estimator module (the one PPO builds) with its options."""
    if entry == "module":
        cls, where = function_from(root, [(_ADV_MODULE, "GAE")])

        def run_module(case: Case, device: str):
            return _run_module(cls, case, device)

        notes = [
            "GAE(gamma, lmbda, value_network=None, average_gae=<option>, vectorized=<option>) on "
            "TensorDict(state_value, next=(reward, done, terminated, truncated, state_value)) [B, T, 1]",
            "done at the last trainable token; terminated too unless the row is truncated, whose "
            "('next', 'state_value') there is the case's bootstrap value",
        ]
        return Loaded(run=run_module, where=where, notes=notes)
    name = _ENTRIES.get(entry or "default")
    if name is None:
        raise NotPresent(
            f"torchrl's GAE adapter has no entry {entry!r}; its GAE entries: {', '.join([*_ENTRIES, 'module'])}"
        )
    fn, where = function_from(root, [(_MODULE, name)])

    def run(case: Case, device: str):
        adv, ret = fn(case.gamma, case.lam, **framework_inputs(case, device))
        return adv.squeeze(-1), ret.squeeze(-1)

    notes = [
        "done = terminated at the last trainable token of each row; next_state_value = values shifted, 0 after the row",
        "a truncated row: done but not terminated there, next_state_value there = the case's bootstrap value",
        "gamma and lambda passed as Python floats, as the functional API documents (scalars)",
    ]
    return Loaded(run=run, where=where, notes=notes)

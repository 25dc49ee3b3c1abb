"""The worker side of `trainer_options`' variants (framework-neutral): each variant the pin has runs through the
framework's own calls with its option set, invariants only; a covered, listed or absent one is a skip that says why.

* `adv:<choice>`: the group-advantage calls (`group(root)`, the hand-written grpo entry's) on cases whose options
  carry `advantage_estimator = <choice>`, which those calls hand the rollout's normalisation and the trainer;
* `policy:<choice>` / `switch:<dest>`: `policy(root, settings, defaults)` (the hand-written policy entry's calls) with
  `advantage_estimator = <choice>` / `<dest>` turned on, every other option the policy loss reads at its argparse
  default; one trivial case is run at load, so a variant that needs more than the kind holds is a skip with the
  error, never a crash finding;
* `kl:<choice>`: `kl(root, choice)`, compute_approx_kl with that kl_loss_type.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable

from maskfuzz.oracles.case import Case
from maskfuzz.targets.adapters import trainer_options as to
from maskfuzz.targets.adapters.base import Loaded, NotPresent

_SMOKE = Case.build(
    trainable=[[1, 1, 0], [1, 1, 1]],
    extra={n: [[-1.0, -0.5, -2.0], [-0.2, -1.5, -0.7]] for n in ("logp", "old_logp")}
    | {"adv": [[1.0, -1.0, 0.5], [-0.5, 2.0, 1.0]]},
    dtype="float32",
)


def _with_option(run: Callable, name: str, value) -> Callable:
    def wrapped(case: Case, device: str):
        return run(case.replace(options={**case.options, name: value}), device)

    return wrapped


def load(root: Path, entry: str, layout: to.Layout, group: Callable, policy: Callable, kl: Callable) -> Loaded:
    prefix, _, name = entry.partition(":")
    found = {v.entry: v for v in to.discover(Path(root), layout)}
    if entry not in found:
        known = ", ".join(e for e in found if e.startswith(f"{prefix}:")) or "none"
        raise NotPresent(f"{layout.framework}: no variant {entry!r} in the options at this pin ({known})")
    v = found[entry]
    if v.covered_by:
        raise NotPresent(f"{v.citation}: {entry!r} is run by the hand-written entry {v.covered_by!r}")
    if not v.callable:
        raise NotPresent(f"{v.citation}: not callable outside the trainer: {v.reason}")
    note = f"discovered: {v.registry} {name!r} at {v.citation} (through {v.function}); invariants only"
    if prefix == "adv":
        loaded = group(Path(root))
        loaded = dataclasses.replace(loaded, run=_with_option(loaded.run, "advantage_estimator", name))
        return dataclasses.replace(loaded, notes=[note, f"advantage_estimator={name!r}", *loaded.notes])
    if prefix == "kl":
        loaded = kl(Path(root), name)
        return dataclasses.replace(loaded, notes=[note, *loaded.notes])
    if prefix not in ("policy", "switch"):
        raise NotPresent(f"{v.citation}: no call recipe for the prefix {prefix!r}")
    args = to.read(Path(root), layout).args
    if prefix == "policy":
        settings = {"advantage_estimator": name}
    else:  # a switch turned from its default (store_true on, store_false off)
        dest = {a.dest: a for a in args.values() if a.boolean}[name]
        settings = {name: not bool(dest.default), **to.WITH.get(name, {})}
    defaults = to.defaults_read(Path(root), layout)
    loaded = policy(Path(root), settings, defaults)
    try:
        loaded.run(_SMOKE, "cpu")
    except Exception as exc:  # noqa: BLE001 - what the variant needs beyond the kind, said as a skip
        raise NotPresent(f"{v.citation}: {entry!r} cannot run with what the policy-loss kind holds: "
                         f"{type(exc).__name__}: {exc}") from exc  # fmt: skip
    set_ = ", ".join(f"{k}={val!r}" for k, val in settings.items())
    filled = ", ".join(sorted(defaults))
    notes = [note, f"set: {set_}; argparse defaults for the rest it reads ({filled})",
             "rollout_log_probs: the case's rollout-engine log-probs (drawn near the old ones); ref_log_probs: the "
             "old log-probs (reference = rollout policy, as at the first step)"]  # fmt: skip
    return dataclasses.replace(loaded, notes=[*notes, *loaded.notes])

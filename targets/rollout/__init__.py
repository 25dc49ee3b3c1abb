"""Reach you can run: real rollouts through the frameworks' own batch code.

A corpus entry is a canonical case the fuzzer drew; a *validation* re-runs it the way a training step would
meet it. A tiny causal LM, built in code (`lm.py`), generates real responses with sampling, EOS and padding;
the framework's own batch code at the pin (`roll.py` for ROLL, `verl.py`, `openrlhf.py`) turns them into its
batch (response lengths and masks decided by the generation); the fault enters at one named boundary (for
ROLL: the critic's values under the mask, just before `compute_advantage`), and everything after it is the
framework's code again.

Both halves run in worker processes (`targets.client.Worker`, `session.open_rollout`): the LM in one with a
real `transformers`, the framework in one with the stand-ins its fuzzing worker uses, so the framework
loads exactly as it does under `maskfuzz fuzz`.

`BATCH_CODE` maps a target (and entry) to the module that drives its batch code; `fuzz.validate` searches
the scenario and judges it.
"""

from __future__ import annotations

# target key (`target` or `target:entry`) -> the worker-side module that drives its batch code
BATCH_CODE: dict[str, str] = {
    "areal": "maskfuzz.targets.rollout.areal",
    "miles": "maskfuzz.targets.rollout.miles",
    "openrlhf": "maskfuzz.targets.rollout.openrlhf",
    "roll": "maskfuzz.targets.rollout.roll",
    "skyrl": "maskfuzz.targets.rollout.skyrl",
    "slime": "maskfuzz.targets.rollout.slime",
    "trl": "maskfuzz.targets.rollout.trl",
    "verl": "maskfuzz.targets.rollout.verl",
}

"""Reach you can run: real rollouts through the frameworks' own batch code.

A corpus entry is a canonical case the fuzzer drew; a *validation* re-runs it the way a training step would
meet it. A tiny causal LM, built in code (`lm.py`), generates real responses with sampling, EOS and padding;
the framework's own batch code at the pin (`targets/<framework>/rollout.py`: `targets/roll/rollout.py` for
ROLL, ...) turns them into its batch (response lengths and masks decided by the generation); the fault enters
at one named boundary (for ROLL: the critic's values under the mask, just before `compute_advantage`), and
everything after it is the framework's code again.

Both halves run in worker processes (`targets.client.Worker`, `session.open_rollout`): the LM in one with a
real `transformers`, the framework in one with the stand-ins its fuzzing worker uses, so the framework
loads exactly as it does under `maskfuzz fuzz`.

This package names no framework: `session.batch_code` finds a target's batch-code module in the target's
folder (`ROLLOUT`), so a framework gains a real-rollout path with a new file in its folder; `fuzz.validate`
searches the scenario and judges it.
"""

from __future__ import annotations

ROLLOUT = "rollout"  # targets/<framework>/rollout.py: the worker-side module that drives its batch code

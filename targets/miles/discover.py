"""miles' variants, read from its argparse options at the pin by AST (no import): `targets.adapters.trainer_options`.

miles (slime's fork) has no registry: `miles/utils/arguments.py` declares the choices of `--advantage-estimator`
(0.0.2 :924-935: grpo, gspo, reinforce_plus_plus, reinforce_plus_plus_baseline, ppo, on_policy_distillation; HEAD
31f1ca961 :1422-1433 without on_policy_distillation, OPD being the switch `--use-opd`), `--kl-loss-type` and
`--loss-type`, and the switches the policy loss reads (`--use-tis`, `--use-opsm`, ...). The advantage dispatcher is
`compute_advantages_and_returns` (0.0.2 miles/backends/training_utils/loss.py:291; HEAD `compute_advantages`,
loss_hub/advantages.py:16), the policy loss `policy_loss_function` (0.0.2 loss.py; HEAD loss_hub/losses.py:62).
`COVERED` maps each variant a hand-written entry already runs (with a float64 reference) to that entry; the others
are invariants-only entries (`calls_discovered.py`) or listed with the reason.
"""

from __future__ import annotations

from pathlib import Path

from maskfuzz.targets.adapters import trainer_options as to
from maskfuzz.targets.discovery import Variant
from maskfuzz.targets.miles.declare import KIND_OVERRIDES as K

PREFIXES = dict(to.PREFIXES)  # entry prefix -> kind (of the variants without a hand-written entry)
COVERED = {
    "adv": {"ppo": "default", "grpo": "grpo", "reinforce_plus_plus": "reinforce++"},
    "policy": {"grpo": "policy-loss", "gspo": "policy-gspo"},
    "kl": {"k1": "kl", "k2": "kl-k2", "k3": "kl-k3", "low_var_kl": "kl-low-var"},
    "loss": {"policy_loss": "policy-loss", "custom_loss": "agg-seq-mean-token-mean"},
    "switch": {"calculate_per_token_loss": "policy-loss"},  # the entry's option
    "adv-switch": {"normalize_advantages": "default"},  # the option of default, reinforce++
}
ARGUMENTS = "miles/utils/arguments.py"
LAYOUT = to.Layout("miles", "miles", ARGUMENTS, COVERED, to.ENTRY_KINDS, to.needs(ARGUMENTS))
recipe = to.sibling_recipe(to.entry_fields(K))  # a variant's spec fields: its hand-written sibling's


def discover(root: Path) -> list[Variant]:
    return to.discover(Path(root), LAYOUT)

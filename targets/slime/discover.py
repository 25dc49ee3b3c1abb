"""slime's variants, read from its argparse options at the pin by AST (no import): `targets.adapters.trainer_options`.

slime has no registry: `slime/utils/arguments.py` declares the choices of `--advantage-estimator` (624b824a8 :940-957:
grpo, gspo, cispo, reinforce_plus_plus, reinforce_plus_plus_baseline, ppo), `--kl-loss-type` (:934-939) and
`--loss-type` (:915-918), and the switches `policy_loss_function` reads (`--use-tis` :1061, `--use-opsm` :1104, ...).
`compute_advantages_and_returns` (slime/backends/megatron_utils/loss.py:704) dispatches the estimator (grpo, gspo and
cispo share one branch, :763) and `policy_loss_function` (:934) tests gspo (sequence KL, :1021) and cispo (:1035).
`COVERED` maps each variant a hand-written entry already runs (with a float64 reference) to that entry; the others
are invariants-only entries (`calls_discovered.py`) or listed with the reason.
"""

from __future__ import annotations

from pathlib import Path

from maskfuzz.targets.adapters import trainer_options as to
from maskfuzz.targets.discovery import Variant
from maskfuzz.targets.slime.declare import KIND_OVERRIDES as K

PREFIXES = dict(to.PREFIXES)  # entry prefix -> kind (of the variants without a hand-written entry)
COVERED = {
    "adv": {
        "ppo": "default",
        "grpo": "grpo",
        "reinforce_plus_plus": "reinforce++",
        "reinforce_plus_plus_baseline": "grpo",
        "cispo": "grpo",
    },  # grpo's option advantage_estimator  # fmt: skip
    "policy": {"grpo": "policy-loss", "gspo": "policy-gspo"},
    "kl": {"k1": "kl", "k2": "kl-k2", "k3": "kl-k3", "low_var_kl": "kl-low-var"},
    "loss": {"policy_loss": "policy-loss", "custom_loss": "agg-seq-mean-token-mean"},
    "switch": {"calculate_per_token_loss": "policy-loss"},  # the entry's option
    "adv-switch": {"normalize_advantages": "default"},  # the option of default, grpo, reinforce++
}
ARGUMENTS = "slime/utils/arguments.py"
LAYOUT = to.Layout("slime", "slime", ARGUMENTS, COVERED, to.ENTRY_KINDS, to.needs(ARGUMENTS))
recipe = to.sibling_recipe(to.entry_fields(K))  # a variant's spec fields: its hand-written sibling's


def discover(root: Path) -> list[Variant]:
    return to.discover(Path(root), LAYOUT)

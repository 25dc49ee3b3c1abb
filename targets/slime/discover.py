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
    },  # grpo's option advantage_estimator  # fmt: skip
    "policy": {"grpo": "policy-loss"},
    "kl": {"k1": "kl", "k3": "kl-k3", "low_var_kl": "kl-low-var"},
    "loss": {"policy_loss": "policy-loss", "custom_loss": "agg-seq-mean-token-mean"},
    "switch": {"calculate_per_token_loss": "policy-loss"},  # the entry's option
    "adv-switch": {"normalize_advantages": "default"},  # the option of default, grpo, reinforce++
}
KINDS = {"default": "gae", "grpo": "group-advantage", "reinforce++": "returns", "policy-loss": "policy-loss",
         "kl": "kl", "kl-k3": "kl", "kl-low-var": "kl", "agg-seq-mean-token-mean": "loss-aggregation"}  # fmt: skip
# switch -> what it needs that the policy-loss kind (log-probs, old log-probs, advantages, the mask) does not hold
NEEDS = {
    "use_kl_loss": "adds a KL loss to the reference policy: the policy-loss kind draws no reference log-probs",
    "use_unbiased_kl": "weights the KL loss of --use-kl-loss, which needs reference log-probs the kind does not draw",
    "use_rollout_logprobs": "takes the old log-probs from the rollout engine in place of the trainer's: no call "
    "recipe sets them from the drawn rollout log-probs yet",
    "get_mismatch_metrics": "requires --custom-tis-function-path (slime/utils/arguments.py's check), a user's function",
    "use_opd": "needs the teacher's log-probs (on-policy distillation): the kind draws no teacher",
    "adv-switch:use_opd": "needs the teacher's log-probs (on-policy distillation): the kind draws no teacher",
    "adv-switch:use_rollout_logprobs": "takes the log-probs of the reward's KL from the rollout engine: the "
    "group-advantage kind draws no log-probs (its KL is 0 at --kl-coef 0, the default)",
}
LAYOUT = to.Layout("slime", "slime", "slime/utils/arguments.py", COVERED, KINDS, NEEDS)
ENTRY_FIELDS = to.entry_fields(K)  # prefix -> spec fields


def recipe(entry: str) -> dict:
    """The spec fields of a discovered entry (`discovery.overrides`): those of its prefix's hand-written sibling."""
    return dict(ENTRY_FIELDS.get(entry.partition(":")[0], {}))


def discover(root: Path) -> list[Variant]:
    return to.discover(Path(root), LAYOUT)

"""verl's registered policy losses, read from the checkout at the pin by AST (no import).

verl registers each policy loss with `@register_policy_loss("<name>")` (verl/trainer/ppo/core_algos.py:53-67 at
0.9.1; the same form since #1830, 0.4.x) and its trainer looks one up by `actor.policy_loss.loss_mode` through
`get_policy_loss_fn(name)` (core_algos.py:70-85). Each registration is an entry `policy-loss:<name>` of the
`policy-loss` kind, judged against the kind's universal invariants (no float64 reference), except those a
hand-written entry already calls with a reference ("vanilla": the `policy-loss` entry). A variant whose required
parameters are not the common signature `fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode,
config, rollout_is_weights)` is listed as not callable, with the parameters it wants.

Advantage estimators: `@register_adv_est(AdvantageEstimator.<X>)` (core_algos.py:113-150 at 0.9.1; the key an
enum member of `class AdvantageEstimator(str, Enum)`, :88-110, resolved to its value), looked up by
`ray_trainer.compute_advantage` for every estimator but GAE and GRPO (verl/trainer/ppo/ray_trainer.py:248-279 at
0.9.1) and called with `token_level_rewards`, `response_mask`, `config` and `index` (the uids). Each is an entry
`adv:<name>` of the `group-advantage` kind, judged against its invariants only, except those a hand-written entry
calls with a reference (`COVERED_ADV`); one that requires an input beyond those four (a critic's values, REMAX's
reward baselines, the Optimal Token Baseline's old_log_probs and sum_pi_squared) or normalises over the whole batch
(GDPO's final `masked_whiten`, `discovery.BATCH_OPS`) is listed with the reason.
"""

from __future__ import annotations

from pathlib import Path

from maskfuzz.targets.adapters import cov_selection
from maskfuzz.targets.adapters.trainer_options import sibling_recipe
from maskfuzz.targets.discovery import Registration, Variant, registrations
from maskfuzz.targets.verl.calls_discovered import adv_problem, signature_problem
from maskfuzz.targets.verl.calls_kinds import POLICY
from maskfuzz.targets.verl.discover_recipe import SIBLING_FIELDS

PREFIXES = {"policy-loss": "policy-loss", "adv": "group-advantage"}  # entry prefix -> kind
DECORATOR, ADV_DECORATOR = "register_policy_loss", "register_adv_est"
# loss_mode -> the hand-written entry that already calls it with a reference (calls_kinds.POLICY, inverted)
COVERED = {mode: entry for entry, mode in POLICY.items()}
# estimator name -> the hand-written entry calling the same function with a reference (calls_kinds.GROUP, RETURNS)
COVERED_ADV = {
    "gae": "default",
    "grpo": "grpo",
    "grpo_vectorized": "grpo-vectorized",
    "rloo": "rloo",
    "rloo_vectorized": "rloo-vectorized",
    "reinforce_plus_plus_baseline": "reinforce++-baseline",
    "opo": "opo",
    "gpg": "gpg",
    "grpo_passk": "grpo-passk",
    "reinforce_plus_plus": "reinforce++",
    "remax": "remax",
}


def adv_kind(required: tuple[str, ...]) -> str:
    """The kind an estimator computes, by what it requires: a critic's values (gae), no groups (returns: REINFORCE++,
    REMAX's baselines), else an outcome advantage over groups."""
    return "gae" if "values" in required else "returns" if "index" not in required else "group-advantage"


def _variant(reg: Registration) -> Variant:
    reason = signature_problem(reg.function, reg.params)
    if not reason and not reg.literal:
        reason = f"registered under the expression {reg.key!r}, not a name the AST can read"
    has_recipe = bool(not reason and reg.order_ops and reg.key in cov_selection.NAMES)  # Clip-Cov, KL-Cov
    if has_recipe:
        reason = cov_selection.reason(reg.key, reg.order_ops)
    elif not reason and reg.order_ops:  # judged as it is, its random or rank selection would read as a defect
        reason = (
            f"selects tokens by a random draw or a rank over the batch ({', '.join(reg.order_ops)}): permutation, "
            "pad-invariance and determinism are not its promises, and the invariants-only judge has no seeded twin"
        )
    return Variant(
        framework="verl",
        kind="policy-loss",
        prefix="policy-loss",
        name=reg.key,
        registry=f"@{DECORATOR}",
        file=reg.file,
        line=reg.line,
        function=reg.function,
        callable=not reason or has_recipe,
        reason=reason,
        covered_by=COVERED.get(reg.key),
    )


def _adv_variant(reg: Registration) -> Variant:
    reason = adv_problem(reg.function, reg.required)
    if not reason and not reg.literal:
        reason = f"registered under the expression {reg.key!r}, not a name the AST can read"
    if not reason and reg.order_ops:
        reason = (
            f"selects by a random draw or a rank over the batch ({', '.join(reg.order_ops)}): permutation, "
            "pad-invariance and determinism are not its promises, and the invariants-only judge has no seeded twin"
        )
    if not reason and reg.batch_ops:
        reason = (
            f"normalises over the whole batch ({', '.join(reg.batch_ops)}): group-isolation is not its promise, "
            "and the invariants-only judge cannot set it aside"
        )
    return Variant(
        framework="verl",
        kind=adv_kind(reg.required),
        prefix="adv",
        name=reg.key,
        registry=f"@{ADV_DECORATOR}",
        file=reg.file,
        line=reg.line,
        function=reg.function,
        callable=not reason,
        reason=reason,
        covered_by=COVERED_ADV.get(reg.key),
    )


def recipe(entry: str) -> dict:
    """The spec fields of a discovered entry's call recipe (`targets.discovery.overrides`): its hand-written
    sibling's (`discover_recipe.SIBLING_FIELDS`), and for Clip-Cov and KL-Cov (`adapters.cov_selection`) the
    invariants their selection does not promise."""
    prefix, _, name = entry.partition(":")
    own = cov_selection.recipe(name) if prefix == "policy-loss" else None
    return _sibling(entry) | (own or {})


def discover(root: Path) -> list[Variant]:
    """Every `@register_policy_loss(...)`, then every `@register_adv_est(...)`, under `root/verl`, in file and
    line order."""
    found = registrations(root, "verl", (DECORATOR, ADV_DECORATOR))
    return [_variant(r) for r in found if r.decorator == DECORATOR] + [
        _adv_variant(r) for r in found if r.decorator == ADV_DECORATOR
    ]


# --- call recipes (`discovery.overrides`): the pipeline domain of the hand-written entry whose trainer step calls
# the variant with the same inputs, at the pins where that step was read (discover_recipe.py)
_sibling = sibling_recipe(SIBLING_FIELDS)

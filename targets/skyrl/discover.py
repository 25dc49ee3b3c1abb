"""SkyRL's registered policy losses and advantage estimators, read from the checkout at the pin by AST (no import).

SkyRL keeps two registries in its `ppo_utils` (0.3.1: skyrl_train/utils/ppo_utils.py:435-532; git main
a9564572eb8e: skyrl/backends/skyrl_train/utils/ppo_utils.py:414-541): `PolicyLossRegistry`, filled by
`@register_policy_loss(PolicyLossType.<X>)`, and `AdvantageEstimatorRegistry`, filled by
`@register_advantage_estimator(AdvantageEstimator.<X>)`. The keys are members of string enums
(`class PolicyLossType(StrEnum)`, 0.3.1 ppo_utils.py:466-473), which `targets.discovery.registrations` resolves to
their values, and one def may carry two decorators (`ppo_policy_loss` is "regular" and "dual_clip", :555-556). The
policy worker takes `PolicyLossRegistry.get(cfg.trainer.algorithm.policy_loss_type)` (0.3.1
skyrl_train/workers/worker.py:611) and the trainer `AdvantageEstimatorRegistry.get(adv_estimator)` through
`compute_advantages_and_returns` (0.3.1 ppo_utils.py:1087-1110). A user's own `PolicyLossRegistry.register(name,
fn)` call is not read (only the package's decorators).

Entries: `policy-loss:<name>` of the `policy-loss` kind, and `adv:<name>` of the `group-advantage` kind (an
outcome estimator over groups of rows); both judged against their kind's universal invariants, no float64
reference. A variant a hand-written entry already calls with a reference is `covered_by` it. Listed, not callable,
with the reason: a loss outside the worker's call signature, a variant that selects tokens by a random draw or a
rank (`ORDER_OPS`), an estimator that reads a critic's values or a discount (a GAE or returns estimator, which no
discovered entry calls yet: `adv:` entries are group advantages), or one that normalises over the whole batch
(`BATCH_OPS`).
"""

from __future__ import annotations

from pathlib import Path

from maskfuzz.targets.adapters import cov_selection
from maskfuzz.targets.adapters.trainer_options import sibling_recipe
from maskfuzz.targets.discovery import Registration, Variant, registrations
from maskfuzz.targets.skyrl.calls_discovered import adv_kind, adv_problem, policy_problem
from maskfuzz.targets.skyrl.discover_recipe import SIBLING_FIELDS

PREFIXES = {"policy-loss": "policy-loss", "adv": "group-advantage"}  # entry prefix -> kind
POLICY_DECORATOR, ADV_DECORATOR = "register_policy_loss", "register_advantage_estimator"
# the packages that hold ppo_utils: the wheels' and the old monorepo subproject's `skyrl_train`, git main's `skyrl`
PACKAGES = ("skyrl_train", "skyrl-train/skyrl_train", "skyrl/backends/skyrl_train", "skyrl/skyrl/backends/skyrl_train")
# registry key -> the hand-written entry that already calls it with a reference (declare.py / calls_kinds.py)
COVERED = {
    "policy-loss": {"regular": "policy-loss", "dual_clip": "policy-dual-clip", "gspo": "policy-gspo"},
    "adv": {"gae": "default", "grpo": "grpo", "rloo": "rloo", "reinforce++": "reinforce++"},
}


def _variant(reg: Registration, prefix: str) -> Variant:
    kind = "policy-loss"
    if prefix == "policy-loss":
        reason = policy_problem(reg.function, reg.required, reg.params)
    else:
        kind = adv_kind(reg.required)
        reason = adv_problem(reg.function, reg.required)
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
    if not reason and prefix == "adv" and reg.batch_ops:
        reason = (
            f"normalises over the whole batch ({', '.join(reg.batch_ops)}): group-isolation is not its promise, "
            "and the invariants-only judge cannot set it aside"
        )
    return Variant(
        framework="skyrl",
        kind=kind,
        prefix=prefix,
        name=reg.key,
        registry=f"@{POLICY_DECORATOR if prefix == 'policy-loss' else ADV_DECORATOR}",
        file=reg.file,
        line=reg.line,
        function=reg.function,
        callable=not reason or has_recipe,
        reason=reason,
        covered_by=COVERED[prefix].get(reg.key),
    )


def package(root: Path) -> str | None:
    """The package directory holding `utils/ppo_utils.py` at this checkout (None when none does)."""
    return next((p for p in PACKAGES if (Path(root) / p / "utils" / "ppo_utils.py").is_file()), None)


def recipe(entry: str) -> dict:
    """The spec fields of a discovered entry's call recipe (`targets.discovery.overrides`): its hand-written
    sibling's (`discover_recipe.SIBLING_FIELDS`), and for Clip-Cov and KL-Cov (`adapters.cov_selection`) the
    invariants their selection does not promise."""
    prefix, _, name = entry.partition(":")
    own = cov_selection.recipe(name) if prefix == "policy-loss" else None
    return _sibling(entry) | (own or {})


def discover(root: Path) -> list[Variant]:
    """Every `@register_policy_loss(...)` then every `@register_advantage_estimator(...)` of SkyRL's package at
    `root`, in file and line order."""
    pkg = package(root)
    if pkg is None:
        return []
    found = registrations(root, pkg, (POLICY_DECORATOR, ADV_DECORATOR))
    policy = [_variant(r, "policy-loss") for r in found if r.decorator == POLICY_DECORATOR]
    return policy + [_variant(r, "adv") for r in found if r.decorator == ADV_DECORATOR]


# --- call recipes (`discovery.overrides`): the pipeline domain of the hand-written entry whose trainer step calls
# the variant with the same inputs, at the pins where that step was read (discover_recipe.py)
_sibling = sibling_recipe(SIBLING_FIELDS)

"""verl's registered policy losses, read from the checkout at the pin by AST (no import).

verl registers each policy loss with `@register_policy_loss("<name>")` (verl/trainer/ppo/core_algos.py:53-67 at
0.9.1; the same form since #1830, 0.4.x) and its trainer looks one up by `actor.policy_loss.loss_mode` through
`get_policy_loss_fn(name)` (core_algos.py:70-85). Each registration is an entry `policy-loss:<name>` of the
`policy-loss` kind, judged against the kind's universal invariants (no float64 reference), except those a
hand-written entry already calls with a reference ("vanilla": the `policy-loss` entry). A variant whose required
parameters are not the common signature `fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode,
config, rollout_is_weights)` is listed as not callable, with the parameters it wants.
"""

from __future__ import annotations

from pathlib import Path

from maskfuzz.targets.discovery import Registration, Variant, registrations
from maskfuzz.targets.verl.calls_discovered import signature_problem
from maskfuzz.targets.verl.calls_kinds import POLICY

PREFIXES = {"policy-loss": "policy-loss"}  # entry prefix -> kind
DECORATOR = "register_policy_loss"
# loss_mode -> the hand-written entry that already calls it with a reference (calls_kinds.POLICY, inverted)
COVERED = {mode: entry for entry, mode in POLICY.items()}


def _variant(reg: Registration) -> Variant:
    reason = signature_problem(reg.function, reg.params)
    if not reason and not reg.literal:
        reason = f"registered under the expression {reg.key!r}, not a name the AST can read"
    if not reason and reg.order_ops:  # judged as it is, its random or rank selection would read as a defect
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
        callable=not reason,
        reason=reason,
        covered_by=COVERED.get(reg.key),
    )


def discover(root: Path) -> list[Variant]:
    """Every `@register_policy_loss(...)` under `root/verl`, in file and line order."""
    return [_variant(r) for r in registrations(root, "verl", (DECORATOR,))]

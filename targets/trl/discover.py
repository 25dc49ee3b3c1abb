"""TRL's loss types, read from GRPOTrainer's loss_type chain at the pin by AST (no import).

TRL has no registry: `GRPOConfig.loss_type` (1.16.0 trl/trainer/grpo_config.py:801-835; help: "Supported values
are 'grpo', 'dr_grpo', 'dapo', 'bnpo', 'cispo', 'sapo', 'luspo', and 'vespo'") selects a branch of the `if
self.loss_type ...: loss = ...` chain of `GRPOTrainer._compute_loss` (1.16.0 trl/trainer/grpo_trainer.py:3152-3184;
1.12.0 :3241-3273; git f2cd577 :3123-3150; 0.19.1 :1404-1411). Every string that chain compares `self.loss_type`
with is a variant, at the line it is written (`calls_discovered.chain_values`). A value without a hand-written
entry (`COVERED`, from `calls_aggregate.AGGREGATE`) is an entry `agg:<loss_type>` of the `loss-aggregation` kind,
judged against the kind's universal invariants (no float64 reference) and run through the same chain
(`calls_discovered.load`). Listed, not callable, with the reason: a value whose branch reads inputs the kind does
not hold (a method local such as the advantages, a `self` attribute the adapter does not set, another `inputs`
key), or that selects tokens by a random draw or a rank (`ORDER_OPS`).

Importance sampling: `GRPOConfig.importance_sampling_level` (1.16.0 grpo_config.py:760-761, default "token") selects a
branch of `if self.importance_sampling_level == "token": ... elif ... == "sequence":` (grpo_trainer.py:3083-3092);
each value without a hand-written entry ("token" is `policy-grpo`'s) is an entry `policy-is:<level>` of the
`policy-loss` kind, `load_policy` at GRPOConfig's defaults (loss_type "dapo") with that level, invariants only.

Call recipe (`recipe`, `targets.discovery.overrides`): an `agg:<loss_type>` is a branch of the chain the hand-written
`agg-*` entries run, on the micro-batches GRPOTrainer cuts the same way for every loss_type, so it takes `agg-grpo`'s
api domain (equal micro-batches: `split_tensor_dict`, chunk_size = rows // num_chunks, 1.16.0 grpo_trainer.py:1544,
trl/trainer/utils.py:1077) and its pipeline domain (right-padded completions, tool-masked gaps and tails, rows cleared
by `mask_truncated_completions`; `declare_kinds._AGG_PIPELINE`) at the pins where that batch was read (`AGG_PINS`);
at any other pin none (reach api).

Only the aggregation chain is read for loss types: the per-token chain before it (the clipped, CISPO, SAPO, VESPO
per-token losses, 3109-3138 at 1.16.0) is the policy loss, which `policy-grpo` runs at GRPOConfig's default loss_type.
"""

from __future__ import annotations

from pathlib import Path

from maskfuzz.targets.adapters.trainer_options import pinned, sibling_recipe
from maskfuzz.targets.discovery import Variant
from maskfuzz.targets.trl.calls_aggregate import AGGREGATE
from maskfuzz.targets.trl.calls_discovered import LEVEL, branch_problem, chain_values, level_problem
from maskfuzz.targets.trl.declare_kinds import GIT
from maskfuzz.targets.trl.declare_kinds import KIND_OVERRIDES as K

PREFIXES = {"agg": "loss-aggregation", "policy-is": "policy-loss"}  # entry prefix -> kind
REGISTRY = "GRPOTrainer loss_type chain"
LEVEL_REGISTRY = "GRPOTrainer importance_sampling_level chain"
# importance_sampling_level -> the hand-written entry that runs it (policy-grpo: "token", GRPOConfig's default;
# policy-gspo: "sequence", with loss_type grpo or, as its option, dapo)
COVERED_LEVEL = {"token": "policy-grpo", "sequence": "policy-gspo"}  # policy-gspo's option loss_type dapo
# loss_type -> the hand-written entry that already runs it with a reference (calls_aggregate.AGGREGATE, inverted)
COVERED = {loss_type: entry for entry, loss_type in AGGREGATE.items()}


def discover(root: Path) -> list[Variant]:
    """Every loss_type value the aggregation chain tests under `root`, in branch order, then every
    importance_sampling_level value of the importance-weight chain."""
    out = []
    for value in chain_values(Path(root)):
        reason = branch_problem(value)
        out.append(
            Variant(
                framework="trl",
                kind="loss-aggregation",
                prefix="agg",
                name=value.name,
                registry=REGISTRY,
                file=value.file,
                line=value.line,
                function=value.function,
                callable=not reason,
                reason=reason,
                covered_by=COVERED.get(value.name),
            )
        )
    for value in chain_values(Path(root), LEVEL):
        reason = level_problem(value)
        out.append(
            Variant(
                framework="trl",
                kind="policy-loss",
                prefix="policy-is",
                name=value.name,
                registry=LEVEL_REGISTRY,
                file=value.file,
                line=value.line,
                function=value.function,
                callable=not reason,
                reason=reason,
                covered_by=COVERED_LEVEL.get(value.name),
            )
        )
    return out


# --- call recipes (`discovery.overrides`): the hand-written agg-* entries' step at the pins where it was read
AGG_PINS = ("1.16.0", "1.12.0", GIT, "0.19.1")
recipe = sibling_recipe({"agg": pinned(K["agg-grpo"], ("domain", "pipeline", "pipeline_by_pin"), AGG_PINS)})

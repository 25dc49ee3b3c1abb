"""Call recipes for AReaL's NormConfig level choices that no hand-written entry runs (`discover.py`).

Each recipe is one `Normalization(NormConfig)` as `PPOActor` builds it, called as the actor calls it: reward_norm on
the [B] scores (1.0.4 areal/trainer/ppo/actor.py:172-173; git main :211-212 with `group_sizes`), adv_norm on the
[B, T] advantages with the loss mask (1.0.4 actor.py:238-239; git main :313 with `group_sizes`). The choice named by
the entry is set; the other level stays at the value of the use's hand-written entry (reward_norm: `grpo`'s group /
group, as AReaL's GRPO examples set it; adv_norm: `adv-norm`'s batch / batch, NormConfig's defaults), so each recipe
moves one field away from an entry with a float64 reference. `group_size` (group levels) is the size of the case's
contiguous groups of one size: AReaL's rollout lays out n_samples rows per prompt next to each other.

A level "batch" statistic is, by AReaL's own words, over the entire batch (1.0.4 areal/utils/data.py:1383,
`"batch": normalize across entire batch (with optional all_reduce in distributed setting)`; git cbff54d64 :1387),
so a recipe with a batch level makes no promise of group-isolation (`NOT_PROMISED`); the worker checks at the pin
that those words are still there (`BATCH_WORDS`) before it runs the recipe.
"""

from __future__ import annotations

from maskfuzz.oracles.domain import Domain

DATA = "areal/utils/data.py"
# the docstring line of class Normalization that makes a batch level a whole-batch statistic
BATCH_WORDS = '"batch": normalize across entire batch'
_BATCH_AT = "1.0.4 areal/utils/data.py:1383 (git cbff54d64 :1387)"
_WHY_BATCH = (
    "group-isolation",
    f'{{what}} is a batch level: "batch": normalize across entire batch (with optional all_reduce in distributed '
    f"setting), {_BATCH_AT}; the branch {{branch}}",
)
# (use, the other level held at its hand-written entry's value) per recipe entry name (`<use>.<field>=<choice>`)
LEVELS = {
    "reward_norm.mean_level=batch": dict(mean_level="batch", std_level="group"),
    "reward_norm.mean_level=none": dict(mean_level=None, std_level="group"),
    "reward_norm.std_level=batch": dict(mean_level="group", std_level="batch"),
    "adv_norm.mean_level=group": dict(mean_level="group", std_level="batch"),
    "adv_norm.mean_level=none": dict(mean_level=None, std_level="batch"),
    "adv_norm.std_level=group": dict(mean_level="batch", std_level="group"),
    "adv_norm.std_level=none": dict(mean_level="batch", std_level=None),
}
# the branch of Normalization.__call__ at 1.0.4 (git cbff54d64) that reads a batch level
_BRANCH = {"mean_level": "1.0.4 :1412 (git cbff54d64 :1453)", "std_level": "1.0.4 :1455 (git cbff54d64 :1497)"}
_F32_WHY = "Normalization returns (x_centered / (std + eps)).float() (1.0.4 areal/utils/data.py:1496)"
_CONTIGUOUS_WHY = (
    "Normalization(group) slices contiguous groups of one group_size (1.0.4 areal/utils/data.py:1424, :1468: "
    "range(bs // group_size)); AReaL's rollout lays out n_samples rows per prompt next to each other"
)
# the adapter's own refusal of groups AReaL cannot be given (the hand-written grpo's documented error)
_REFUSAL = (r"ValueError: areal: Normalization\(group\)",)


def config(name: str) -> dict:
    """The NormConfig attributes `Normalization.__init__` reads, for the recipe `name` (without group_size)."""
    return dict(LEVELS[name], mean_leave1out=False, std_unbiased=True, eps=1e-5)


def grouped(name: str) -> bool:
    return "group" in LEVELS[name].values()


def not_promised(name: str) -> tuple[tuple[str, str], ...]:
    """(property, why) the recipe's design makes no promise of: group-isolation where a level is "batch"."""
    batch = [f for f, level in LEVELS[name].items() if level == "batch"]
    if not batch:
        return ()
    prop, why = _WHY_BATCH
    what = " and ".join(f"{f}" for f in batch)
    return ((prop, why.format(what=what, branch=", ".join(_BRANCH[f] for f in batch))),)


def recipe(name: str) -> dict | None:
    """The spec fields of the discovered entry `name` (None when it has no recipe)."""
    if name not in LEVELS:
        return None
    use = name.partition(".")[0]
    why = {"dtypes": _F32_WHY}
    if grouped(name):
        why["ragged_groups"] = _CONTIGUOUS_WHY
    domain = Domain(dtypes=("float32", "bfloat16", "float16"), ragged_groups=not grouped(name), why=why)
    fields = dict(domain=domain, documented_errors=_REFUSAL, not_promised=not_promised(name))
    if use == "reward_norm":  # the kind's tolerance from the nearest variant; no reference is read
        std_level = "batch" if LEVELS[name]["std_level"] == "batch" else "group"
        variant = {"estimator": "grpo", "std": "unbiased", "eps": 1e-5, "eps_place": "std", "singleton": "zero",
                   "empty_rows": "counted", "std_level": std_level}  # fmt: skip
        why_nonzero = (
            "Normalization returns one value per row ([B] scores); the adapter broadcasts it to every position"
        )
        return fields | dict(variant=variant, contract="dense", masked_zero=False, masked_zero_why=why_nonzero)
    level = "group" if grouped(name) else "batch"
    variant = {"level": level, "unbiased": True, "eps": 1e-5, "eps_place": "std", "shift_mean": True}
    return fields | dict(variant=variant, masked_zero=True)  # x_centered * loss_mask (1.0.4 data.py:1452)

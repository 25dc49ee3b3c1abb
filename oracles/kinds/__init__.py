"""The kinds of masked RL math (`shared/design/kinds.md`), one package each: `oracles/kinds/<kind>/`.

GAE (with `returns`) is `oracles/kinds/gae/`: its float64 references, its judge (`properties`), its
diagnosis, its KL in the reward and its Hypothesis strategy. Each kind beyond GAE gives, in its package's
`__init__`, `OUTPUTS` (the names of the tensors a target returns, in order, each
[B, T]), `options(variant)` (the variant with defaults, unknown keys rejected),
`reference(case, variant, vectorised=False)` (float64; a plain loop, or the independent
vectorised form; None where the kind's statistic is undefined) and `condition(case, variant)`
(how far a correct implementation in the case's dtype may be off, in units of the unit roundoff).
`KINDS` says which inputs are poison under the mask, which input the `affine` property moves and
which properties apply; its Hypothesis inputs are its package's `strategies` (`KindSpec.strategies`,
drawn by `oracles.kinds.strategies.kind_cases`, with what the statistic kinds share). The `returns`
kind is GAE with V = 0 and lam = 1: it runs on the GAE judge (`oracles.kinds.gae.properties`), with the
`critic=False` domain.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType

from maskfuzz.oracles.kinds import (
    group_advantage,
    kl,
    loss_aggregation,
    normalization,
    policy_loss,
    token_reward,
    value_loss,
)
from maskfuzz.oracles.verdict import PROPERTIES


@dataclass(frozen=True)
class KindSpec:
    name: str
    module: ModuleType
    properties: tuple[str, ...]  # in priority order: the first a case violates names the finding
    poisoned: tuple[str, ...]  # per-token inputs that are poison under the mask
    affine: str | None = None  # "score" or an extra tensor: what the affine property moves
    grouped: bool = False  # rows carry group ids
    split: bool = False  # the step is cut into micro-batches (and simulated ranks)
    # what a leak of the poisoned inputs is (`oracles.mechanisms`): the mechanism and its words
    leak: tuple[str, str] = ("masked-statistics", "an input under the mask reaches a statistic of trainable outputs")
    score_at_last_token: bool = False  # the row's score lands on its last trainable token (lost on a masked tail)
    zero_filled_normaliser: bool = False  # a normaliser that may count padding and masked tokens as zeros

    @property
    def outputs(self) -> tuple[str, ...]:
        return self.module.OUTPUTS

    @property
    def strategies(self) -> ModuleType:
        """The kind's Hypothesis inputs, `oracles/kinds/<kind>/strategies.py` (`inputs(draw, drawn)`, and
        `finish` where the kind fixes up its poisoned inputs), imported on first use: judging needs no
        hypothesis."""
        return importlib.import_module(f"{self.module.__name__}.strategies")

    @property
    def zero_outputs(self) -> tuple[str, ...]:
        """The outputs a masked-zero promise covers (a broadcast scalar is not one of them)."""
        return getattr(self.module, "ZERO_OUTPUTS", self.module.OUTPUTS)


_COMMON = ("no-crash", "poison-nonfinite", "poison", "pad-invariance")
_TAIL = ("masked-zero", "twin", "deterministic", "reference")
_STATISTICS = (*_COMMON, "permutation", "group-isolation", "affine", *_TAIL)  # kinds with row / group statistics
KINDS: dict[str, KindSpec] = {
    "group-advantage": KindSpec(
        "group-advantage",
        group_advantage,
        _STATISTICS,
        poisoned=("token_rewards",),
        affine="score",
        grouped=True,
        leak=("masked-reward-leak", "a reward under the mask reaches the row's score"),
        score_at_last_token=True,
    ),
    "normalization": KindSpec(
        "normalization",
        normalization,
        _STATISTICS,
        poisoned=("x",),
        affine="x",
        grouped=True,
    ),
    "kl": KindSpec(
        "kl",
        kl,
        (*_COMMON, *_TAIL),
        poisoned=("logp", "ref_logp"),
    ),
    "loss-aggregation": KindSpec(
        "loss-aggregation",
        loss_aggregation,
        (*_COMMON, "permutation", "split-invariance", "empty-step", *_TAIL),
        poisoned=("loss",),
        grouped=True,
        split=True,
        leak=("masked-loss-leak", "a per-token loss under the mask reaches the step's loss"),
        zero_filled_normaliser=True,
    ),
    "value-loss": KindSpec(
        "value-loss",
        value_loss,
        (*_COMMON, "permutation", "split-invariance", "empty-step", "clip-bound", *_TAIL),
        poisoned=("v", "v_old", "ret"),
        grouped=True,
        split=True,
    ),
    "policy-loss": KindSpec(
        "policy-loss",
        policy_loss,
        (*_COMMON, "permutation", "split-invariance", "empty-step", *_TAIL),
        poisoned=policy_loss.INPUTS,
        grouped=True,
        split=True,
    ),
    "token-reward": KindSpec(
        "token-reward",
        token_reward,
        (*_COMMON, "permutation", "score-kept", *_TAIL),
        poisoned=("kl",),
        leak=("masked-reward-leak", "a KL under the mask reaches the reward of a trainable token"),
        score_at_last_token=True,
    ),
}
GAE_KINDS = ("gae", "returns")  # judged by `oracles.kinds.gae`
ALL_KINDS = (*GAE_KINDS, *KINDS)

INVARIANT = {
    "pad-invariance": "padding (a column; a padding row where the batch holds rows that are not samples) changes "
    "no output at trainable positions",
    "permutation": "permuting rows (group ids kept) permutes the outputs",
    "group-isolation": "a group's outputs do not depend on the other groups",
    "affine": "a x + b (a > 0, large b) gives the reference of the moved input (std-normalised outputs unchanged)",
    "twin": "two implementations of one computation in the framework (a loop and its vectorised twin) agree",
    "split-invariance": "loss and gradient summed over the step's micro-batches (and ranks) equal the whole step's",
    "empty-step": "a step without a trainable token gives a finite 0 loss and gradient, or a documented error",
    "clip-bound": "the clipped value loss is never below the same step's loss with the clip never binding (v_old = v)",
}


def spec(kind: str) -> KindSpec:
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}; known: {', '.join(ALL_KINDS)}")
    return KINDS[kind]


def properties(kind: str) -> tuple[str, ...]:
    """The property ids of `kind`, in priority order."""
    if kind in GAE_KINDS:
        return PROPERTIES
    return spec(kind).properties


def _all_properties() -> tuple[str, ...]:
    return tuple(dict.fromkeys([*PROPERTIES, *(p for k in KINDS.values() for p in k.properties)]))


ALL_PROPERTIES = _all_properties()  # every property id of every kind, GAE's first


def outputs(kind: str) -> tuple[str, ...]:
    return ("advantages", "returns") if kind in GAE_KINDS else spec(kind).outputs

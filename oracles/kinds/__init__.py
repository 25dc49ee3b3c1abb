"""The kinds of masked RL math (`shared/design/kinds.md`), one package each: `oracles/kinds/<kind>/`.

`KINDS` is the one registry of kinds, and the only dispatch on them: code outside a kind's package asks
`spec(kind)` for what differs, never compares a kind with a name. GAE (with `returns`) is `oracles/kinds/gae/`:
its float64 references, its judge (`properties`), its diagnosis, its KL in the reward and its Hypothesis
strategy. Each kind beyond GAE gives, in its package's `__init__`, `OUTPUTS` (the names of the tensors a target
returns, in order, each [B, T]), `options(variant)` (the variant with defaults, unknown keys rejected),
`reference(case, variant, vectorised=False)` (float64; a plain loop, or the independent vectorised form; None
where the kind's statistic is undefined) and `condition(case, variant)` (how far a correct implementation in the
case's dtype may be off, in units of the unit roundoff). A `KindSpec` says which inputs are poison under the
mask, which input the `affine` property moves, which properties apply and which judge runs the kind
(`Family`: GAE's for `gae` and `returns`, the shared statistic judge for the others); the statistic kinds'
Hypothesis inputs are their package's `strategies` (`KindSpec.strategies`, drawn by
`oracles.kinds.strategies.kind_cases`, with what the statistic kinds share). The `returns` kind is GAE with
V = 0 and lam = 1: it runs on the GAE judge (`oracles.kinds.gae.properties`), with the `critic=False` domain.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from types import ModuleType
from typing import Callable

from maskfuzz.oracles.domain import Domain
from maskfuzz.oracles.kinds import (
    gae,
    group_advantage,
    kl,
    loss_aggregation,
    normalization,
    policy_loss,
    token_reward,
    value_loss,
)
from maskfuzz.oracles.verdict import PROPERTIES


def _resolve(hook: str) -> Callable:
    module, _, attr = hook.partition(":")
    return getattr(importlib.import_module(module), attr)


@dataclass(frozen=True)
class Family:
    """The judge a kind runs on and what comes with it: GAE's recursion judge (`oracles/kinds/gae/`, for `gae`
    and `returns`) or the shared judge of the statistic kinds (`oracles/kinds/judge.py`). Each hook is a
    `module:function` name, imported on first use: the judges import this registry, so it names them instead
    of importing them (and judging imports no hypothesis)."""

    name: str  # "gae" | "statistic": the key of the tables outside oracles/ that differ by judge (reproducer)
    judge: str  # (run, case, declared, device="cpu", only=None) -> list[Verdict], one per property
    diagnose: str  # (run, case, declared, prop) -> Diagnosis: the mechanism behind a property finding
    cases: str  # (declared, sizes, nonfinite) -> the Hypothesis strategy of the declared's cases, options not drawn
    clean: str  # (case, declared) -> the case without poison under the masks (semantics cards)
    card_variant: str  # (declared) -> dict: the declared variant, as the semantics card's dimensions name it
    card_reference: str  # (case, declared, variant) -> (outputs, bounds) | None: a card candidate's reference
    score_tail: bool = False  # the card reads the variant on responses without an observation tail, and what a
    # score behind a tail does as a fact of its own


STATISTIC_JUDGE = Family(
    "statistic",
    judge="maskfuzz.oracles.kinds.judge:judge",
    diagnose="maskfuzz.oracles.kinds.diagnosis:diagnose_kind",
    cases="maskfuzz.oracles.kinds.strategies:declared_cases",
    clean="maskfuzz.oracles.kinds.judge:clean_case",
    card_variant="maskfuzz.oracles.kinds.semantics:kind_variant",
    card_reference="maskfuzz.oracles.kinds.semantics:kind_reference",
)
GAE_JUDGE = Family(
    "gae",
    judge="maskfuzz.oracles.kinds.gae.properties:judge",
    diagnose="maskfuzz.oracles.kinds.gae.diagnosis:diagnose",
    cases="maskfuzz.oracles.kinds.gae.strategies:declared_cases",
    clean="maskfuzz.oracles.kinds.gae.properties:clean_case",
    card_variant="maskfuzz.oracles.kinds.gae.card:variant",
    card_reference="maskfuzz.oracles.kinds.gae.card:reference",
    score_tail=True,
)


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
    family: Family = STATISTIC_JUDGE  # the judge it runs on, its diagnosis, strategy and card
    domain: Domain = field(default_factory=Domain)  # the kind's widest api domain (a discovered variant's)

    @property
    def judge(self) -> Callable:
        """`judge(run, case, declared, device="cpu", only=None)`: one verdict per property (`Family.judge`)."""
        return _resolve(self.family.judge)

    @property
    def diagnose(self) -> Callable:
        """`diagnose(run, case, declared, prop)`: the mechanism behind a finding (`Family.diagnose`)."""
        return _resolve(self.family.diagnose)

    @property
    def cases(self) -> Callable:
        """`cases(declared, sizes, nonfinite)`: the strategy of the declared's cases (`Family.cases`)."""
        return _resolve(self.family.cases)

    @property
    def clean(self) -> Callable:
        """`clean(case, declared)`: the case without poison under the masks (`Family.clean`)."""
        return _resolve(self.family.clean)

    @property
    def card_variant(self) -> Callable:
        return _resolve(self.family.card_variant)

    @property
    def card_reference(self) -> Callable:
        return _resolve(self.family.card_reference)

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
    def dimensions(self) -> dict[str, list]:
        """The variant's choices a semantics card infers and a diagnosis tries as neighbouring variants, each with
        its candidate values (`DIMENSIONS` of the kind's package; for gae and returns the contract)."""
        return getattr(self.module, "DIMENSIONS", {})

    @property
    def zero_outputs(self) -> tuple[str, ...]:
        """The outputs a masked-zero promise covers (a broadcast scalar is not one of them)."""
        return getattr(self.module, "ZERO_OUTPUTS", self.module.OUTPUTS)


_COMMON = ("no-crash", "poison-nonfinite", "poison", "pad-invariance")
_TAIL = ("masked-zero", "twin", "deterministic", "reference")
_STATISTICS = (*_COMMON, "permutation", "group-isolation", "affine", *_TAIL)  # kinds with row / group statistics
_GAE = dict(poisoned=("values", "token_rewards"), family=GAE_JUDGE)
KINDS: dict[str, KindSpec] = {
    # first: GAE's properties lead ALL_PROPERTIES, and its kinds every listing of the kinds
    "gae": KindSpec("gae", gae, PROPERTIES, **_GAE),
    "returns": KindSpec("returns", gae, PROPERTIES, **_GAE, domain=Domain(critic=False)),  # GAE, V = 0, lam = 1
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
ALL_KINDS = tuple(KINDS)

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
    return spec(kind).properties


def _all_properties() -> tuple[str, ...]:
    return tuple(dict.fromkeys(p for k in KINDS.values() for p in k.properties))


ALL_PROPERTIES = _all_properties()  # every property id of every kind, GAE's first


def outputs(kind: str) -> tuple[str, ...]:
    return spec(kind).outputs

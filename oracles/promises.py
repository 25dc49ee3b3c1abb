"""Promises: what turns a difference into a defect (`shared/design/kinds.md`, "Promises").

A finding is a **defect** only when it breaks a promise, and every defect names the one it breaks:

* a universal invariant of masking (`universal:<id>`, `UNIVERSAL`), which no sensible design
  breaks; or
* the framework's own contract at the pin (`upstream:<file>:<line>` or a docs URL): a docstring,
  config help, a docs page, its own test, the paper it says it implements, quoted in `text`.
  An entry declares these (`Declared.promises`), each with the properties it `covers`.

Everything else that differs from one of our references is a **fact**, never a defect: which
variant the code implements (a semantics fact, inferred by `oracles.kinds.semantics`), or how it
behaves on inputs its own pipeline never builds (a robustness fact). Four universal promises are
about what the pipeline can build: masked inputs (`poison`, `poison-nonfinite`), a response that
ends on a masked token (`score-kept`) and valid input (`no-crash`). A finding of theirs without a
pipeline witness breaks none of them (`PIPELINE_BOUND`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# The invariants of kinds.md "Promises", in its words.
_UNIVERSAL_TEXT = {
    "poison": "what the pipeline can place at masked positions never moves trainable outputs or the loss",
    "poison-nonfinite": "what the pipeline can place at masked positions, NaN / inf too, never reaches trainable "
    "outputs or the loss",
    "score-kept": "the outcome reward reaches the trainable tokens, where the pipeline can end a response on a "
    "masked token",
    "permutation": "a sample's output does not depend on the order of rows",
    "pad-invariance": "a sample's output does not depend on padding",
    "group-isolation": "a sample's output does not depend on unrelated groups",
    "split-invariance": "the step's loss and gradient do not depend on how it is cut into micro-batches and ranks, "
    "where the framework passes (or documents) a global normaliser",
    "no-crash": "valid pipeline input gives finite outputs or a documented error",
    "deterministic": "the same input gives the same output",
    "twin": "two implementations of one computation agree",
}
# universal promises that speak of what the pipeline builds: an api-only finding breaks none of them
PIPELINE_BOUND = ("poison", "poison-nonfinite", "score-kept", "no-crash")
# properties that are a universal invariant by themselves (empty-step is no-crash on an all-masked step)
_BY_PROPERTY = {p: p for p in _UNIVERSAL_TEXT} | {"empty-step": "no-crash"}
# properties that compare with a reference: the mechanism decides which promise (if any) the failure breaks
_BY_MECHANISM = {
    "masked-value-bootstrap": "poison",
    "masked-reward-leak": "poison",
    "masked-loss-leak": "poison",
    "nan-through-mask": "poison-nonfinite",
    "score-lost": "score-kept",
    "crash-degenerate": "no-crash",
    "nondeterminism": "deterministic",
    "implementations-disagree": "twin",
    "row-order": "permutation",
}
# findings that no universal invariant covers whatever their mechanism: the framework's own words decide
_NEEDS_CONTRACT = ("masked-zero",)
# split-invariance holds "where the framework passes (or documents) a global normaliser": that condition is a line
# of the framework's (the docs that promise a global token mean, the code that passes the step's normalisers), so
# an entry declares it as a promise covering split-invariance; without one, normalising each micro-batch by itself
# is a variant (a semantics fact), never a defect
_CONDITIONAL = ("split-invariance", "split-normaliser")
_HASH = re.compile(r"[0-9a-f]{7,40}")
_ID = re.compile(r"(universal:[a-z-]+|upstream:[\w./-]+\.\w+:\d+(-\d+)?|https?://\S+)")


@dataclass(frozen=True)
class Promise:
    """One promise: `id` is `universal:<invariant>`, `upstream:<file>:<line>` (or a range) or a docs
    URL; `text` the words that make it, quoted for an upstream one; `covers` the property ids (and
    `mechanism:<name>` items) whose failure breaks it (an upstream promise only); `note` why it
    applies (e.g. which consumer reads the masked advantages); `pins` the pins whose code says it
    (a release, or a commit prefix of 7+ hex digits; empty: every pin of the entry); `options` the
    framework options under which the words apply (name -> value; empty: every configuration), e.g.
    a docs line about `loss_agg_mode: token-mean` says nothing of the seq-mean modes."""

    id: str
    text: str
    covers: tuple[str, ...] = field(default=())
    note: str = ""
    pins: tuple[str, ...] = field(default=())
    options: dict = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "covers", tuple(self.covers))
        object.__setattr__(self, "pins", tuple(self.pins))
        if not _ID.fullmatch(self.id):
            raise ValueError(
                f"promise id {self.id!r} is not universal:<id>, upstream:<file>:<line> or a URL "
                "(e.g. upstream:verl/trainer/ppo/core_algos.py:268)"
            )
        if not self.text.strip():
            raise ValueError(f"promise {self.id}: quote the words that make it (text is empty)")
        if self.universal and self.id.removeprefix("universal:") not in _UNIVERSAL_TEXT:
            raise ValueError(f"unknown universal promise {self.id!r}; known: {', '.join(_UNIVERSAL_TEXT)}")
        if not self.universal and not self.covers:
            raise ValueError(f"promise {self.id}: say which properties it covers (covers=('reference',), ...)")

    @property
    def universal(self) -> bool:
        return self.id.startswith("universal:")

    def at(self, pin: str | None) -> bool:
        """Whether the code at `pin` (as asked or resolved) makes this promise."""
        return not self.pins or pin is None or any(pin_matches(p, pin) for p in self.pins)

    def under(self, options: dict) -> bool:
        """Whether the promise speaks of the configuration `options` (every option with its value)."""
        return all(options.get(k) == v for k, v in self.options.items())

    def to_json(self) -> dict:
        out = {"promise": self.id, "promise_text": self.text}
        if self.note:
            out["promise_note"] = self.note
        if self.options:
            out["promise_options"] = dict(self.options)
        return out


def pin_matches(written: str, pin: str) -> bool:
    """A pin as written in a declaration matches `pin`: equal, or one a 7+ digit prefix of the other."""
    pin = pin.removeprefix("==")
    if written == pin:
        return True
    hexes = _HASH.fullmatch(written) and _HASH.fullmatch(pin)
    return bool(hexes) and (pin.startswith(written) or written.startswith(pin))


UNIVERSAL: dict[str, Promise] = {k: Promise(f"universal:{k}", text) for k, text in _UNIVERSAL_TEXT.items()}


def universal_for(prop: str, mechanism: str) -> Promise | None:
    """The universal invariant that a failure of `prop` explained by `mechanism` breaks, if any.

    The property names it where it is an invariant by itself (poison, permutation, split, ...);
    a comparison with a reference (reference, telescoping, gap-invariance, affine, ...) breaks one
    only through its mechanism (a masked value that bootstraps breaks `poison`; a variant of ours
    that differs breaks none). A statistic that counts masked inputs breaks `poison` only when
    the masked inputs move it, and `pad-invariance` only through padding."""
    if prop in _NEEDS_CONTRACT:
        return None
    if prop in _CONDITIONAL or mechanism in _CONDITIONAL:  # the condition is the framework's own words or code
        return None
    if prop in _BY_PROPERTY:
        return UNIVERSAL[_BY_PROPERTY[prop]]
    if mechanism in _BY_MECHANISM:
        return UNIVERSAL[_BY_MECHANISM[mechanism]]
    if prop == "row-independence":  # GAE's row twin reverses the rows and adds padding only
        return UNIVERSAL["pad-invariance"]
    return None


def broken(
    prop: str, mechanism: str, promises: tuple[Promise, ...] = (), *, reach: str = "pipeline", kind: str = ""
) -> Promise | None:
    """The promise a finding of `prop` (diagnosed `mechanism`, at `reach`, of `kind`) breaks, or None: a fact.

    The framework's own words come first where they cover the property or the mechanism (they are
    what a maintainer answers to), then what implementing the kind promises (`kind_contract`); then
    the universal invariants, those about the pipeline only with a pipeline witness."""
    for p in (*promises, *kind_contract(kind)):
        if prop in p.covers or f"mechanism:{mechanism}" in p.covers:
            return p
    found = universal_for(prop, mechanism)
    if found is None:
        return None
    if reach != "pipeline" and found.id.removeprefix("universal:") in PIPELINE_BOUND:
        return None
    return found


def fact_kind(prop: str, mechanism: str) -> str:
    """What a finding that breaks no promise tells: `robustness` (a universal invariant on an input
    the pipeline never builds) or `semantics` (which variant the code implements)."""
    if universal_for(prop, mechanism) is not None or mechanism in ("nan-through-mask", "crash-degenerate"):
        return "robustness"
    return "semantics"


# The paper a kind's functions say they implement, where their name says it (compute_gae_*, GAE): with no mask
# at all, the masked estimator reduces to the paper's formula. Covers only the unmasked case.
_GAE_PAPER = Promise(
    "https://arxiv.org/abs/1506.02438",
    "A^GAE(gamma, lambda)_t = sum_l (gamma lambda)^l delta_{t+l}, delta_t = r_t + gamma V(s_{t+1}) - V(s_t) "
    "(Schulman et al., High-Dimensional Continuous Control Using Generalized Advantage Estimation, eq. 16)",
    covers=("all-trainable",),
    note="the function is a GAE implementation by its name; with every position real and trainable no mask applies",
)
_KIND_CONTRACTS = {"gae": (_GAE_PAPER,)}


def kind_contract(kind: str) -> tuple[Promise, ...]:
    """The promises every entry of `kind` makes by implementing it (the paper's formula, unmasked)."""
    return _KIND_CONTRACTS.get(kind, ())

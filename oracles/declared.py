"""What a target promises (`Declared`), and the readings of that promise every judge shares.

`Declared.configured` is the promise under a case's options; `documented` says whether an error is
documented behaviour of the target. (The per-row baseline a `returns` variant subtracts is GAE's:
`oracles.kinds.gae.properties.baseline`.)
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Callable

from maskfuzz.oracles.case import Case
from maskfuzz.oracles.domain import Domain
from maskfuzz.oracles.options import Truncation, apply
from maskfuzz.oracles.verdict import TargetFailure
from maskfuzz.oracles.whitening import Whitening

DEFAULT_KIND = "gae"  # the kind of a promise, an entry or a result that names none


@dataclass(frozen=True)
class Declared:
    """What a target promises: its contract, whether it whitens inside, whether masked advantages
    are zero, which errors are documented behaviour, and the inputs it can express."""

    contract: str = "compressed"
    whitening: Whitening | None = None
    masked_zero: bool = True
    documented_errors: tuple[str, ...] = ()  # regexes matched against "ExceptionType: message"
    domain: Domain = field(default_factory=Domain)  # the api domain: what the function accepts
    pipeline: Domain | None = None  # what the framework's own pipeline can hand it (None: not declared)
    kind: str = DEFAULT_KIND  # shared/design/kinds.md: gae, returns (GAE with V = 0, lam = 1), group-advantage, ...
    variant: dict = field(default_factory=dict, hash=False)  # the kind's options (oracles/kinds/<kind>/)
    # the run of a second implementation of the same computation in the framework, and its label
    twin: Callable | None = field(default=None, compare=False, hash=False, repr=False)
    twin_label: str = ""
    # the framework's options that touch the math (oracles.options.Option) and what the
    # configuration in force does: truncated rows, the score map (both read by the reference)
    options: tuple = field(default=(), hash=False)
    truncation: Truncation | None = None  # None: not declared (no truncated row is drawn; terminal)
    score_map: tuple = ()
    applied: tuple | None = None  # the options this promise is configured with (None: not yet)
    # the framework's own words at the pin (`oracles.promises.Promise`, each with the properties it covers):
    # what turns a difference from our reference into a defect, beside the universal invariants
    promises: tuple = field(default=(), hash=False)
    # the function's inputs are its caller's own (a --callable): its api domain stands for its pipeline
    own_inputs: bool = False
    # False: no float64 reference describes this variant (a discovered one, `targets.discovery`): judged against the
    # universal invariants of its kind only; `reference`, `affine` and every reference-based probe are n/a
    reference: bool = True
    # (property, why) pairs the variant's own design makes no promise of, each why ending in the upstream line that
    # says so (a whitening over the whole batch promises no group-isolation): judged n/a "not promised: <why>"
    not_promised: tuple = field(default=(), hash=False)

    def configured(self, case: Case) -> "Declared":
        """This promise under the options `case` runs with (`oracles.options.apply`); a promise
        configured once stays as it is for the twins of the case, which keep its options."""
        key = tuple(sorted(case.options.items()))
        if self.applied is not None:
            if self.applied != key:
                raise ValueError(
                    f"a promise configured for options {dict(self.applied)} judged a case with {dict(key)}"
                )
            return self
        return dataclasses.replace(apply(self, case.options), applied=key)


def documented(declared: Declared, exc: BaseException) -> bool:
    text = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, TargetFailure) and exc.kind != "exception":
        return False
    detail = exc.detail if isinstance(exc, TargetFailure) else text
    return any(re.search(p, detail) or re.search(p, text) for p in declared.documented_errors)

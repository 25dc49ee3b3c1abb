"""Verdicts: what judging a target on a case gives, in the vocabulary every output of the tool shares.

The GAE property ids (`PROPERTIES`, in priority order; the kinds beyond GAE list theirs in
`oracles.kinds`), the `Verdict` on one property, the failures a target run raises (`TargetFailure`,
`TwinFailure`), the builders of verdicts (`ok`, `na`, `diff`, `describe`) and a GAE `Run` read into
(advantages, returns) with its arity and shape checked (`call`). Every judge builds on these.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from maskfuzz.oracles.case import Case

Run = Callable[[Case], "tuple[torch.Tensor, torch.Tensor]"]

# Priority order: when one case violates several, the first listed names the finding.
PROPERTIES: tuple[str, ...] = (
    "no-crash",
    "poison-nonfinite",
    "poison",
    "score-kept",
    "telescoping",
    "all-trainable",
    "gap-invariance",
    "row-independence",
    "masked-zero",
    "deterministic",
    "reference",
)
MAX_REPORTED = 32


class TwinFailure(Exception):
    """A perturbed twin (row order, inserted gap, clean or probe twin) made the target fail: a
    no-crash finding on the twin's own case, never a violation of the property that built it."""

    def __init__(self, case: Case, cause: BaseException):
        super().__init__(str(cause))
        self.case = case
        self.cause = cause


class TargetFailure(Exception):
    """A target run that produced no output: `kind` is 'exception', 'crash' or 'hang'."""

    def __init__(self, kind: str, detail: str):
        super().__init__(f"{kind}: {detail}")
        self.kind = kind
        self.detail = detail


@dataclass
class Verdict:
    """The outcome of one property on one case."""

    property: str
    status: str  # "pass" | "fail" | "n/a"
    message: str = ""
    output: str = ""  # "advantages" | "returns" | ""
    positions: list = field(default_factory=list)  # [[b, t], ...]
    expected: list = field(default_factory=list)
    observed: list = field(default_factory=list)
    # the case this verdict is about when it is not the judged case: a perturbed twin that crashed
    case: Case | None = field(default=None, compare=False, repr=False)
    # information beside the verdict, name -> number (e.g. what the split would change without the
    # framework's global normalisers); the engine keeps the largest per name
    info: dict = field(default_factory=dict, compare=False)
    # a failure where every output is the expected one times one factor c: that c (a rescale of one term)
    scale: float | None = field(default=None, compare=False)

    @property
    def failed(self) -> bool:
        return self.status == "fail"

    def to_dict(self) -> dict:
        return {
            "property": self.property,
            "status": self.status,
            "message": self.message,
            "output": self.output,
            "positions": self.positions,
            "expected": self.expected,
            "observed": self.observed,
        }


def ok(prop: str, msg: str = "") -> Verdict:
    return Verdict(prop, "pass", msg)


def na(prop: str, msg: str) -> Verdict:
    return Verdict(prop, "n/a", msg)


def diff(prop: str, name: str, bad: torch.Tensor, expected: torch.Tensor, observed: torch.Tensor, msg: str) -> Verdict:
    pos = bad.nonzero().tolist()[:MAX_REPORTED]
    return Verdict(
        prop,
        "fail",
        f"{msg} ({int(bad.sum())} position(s) of {name})",
        name,
        [list(p) for p in pos],
        [float(expected[b, t]) for b, t in pos],
        [float(observed[b, t]) for b, t in pos],
    )


def call(run: Run, case: Case) -> tuple[torch.Tensor, torch.Tensor]:
    out = run(case)
    if not (isinstance(out, (tuple, list)) and len(out) == 2):
        raise TargetFailure("exception", f"returned {type(out).__name__}, expected (advantages, returns)")
    adv, ret = out
    shape = list(case.shape)
    for name, x in (("advantages", adv), ("returns", ret)):
        if not isinstance(x, torch.Tensor) or list(x.shape) != shape:
            got = list(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise TargetFailure("exception", f"{name} has shape {got}, expected {shape}")
    return adv.detach().to("cpu", torch.float64), ret.detach().to("cpu", torch.float64)


def describe(exc: BaseException) -> str:
    if isinstance(exc, TargetFailure):
        return str(exc)
    return f"raised {type(exc).__name__}: {exc}"

"""Hypothesis strategies for a target's configuration: its options and truncated rows.

`configured(base, declared)` draws a case from `base`, then the framework options of the
target's option space (each at its default about half the time, so defaults stay covered and a
finding shrinks towards them) and, where the target declares truncation semantics, rows cut by
the length limit with the bootstrap value a bootstrapping framework reads. Only values that
differ from the defaults are recorded on the case (`Case.options`). Every draw is an `event()`.
"""

from __future__ import annotations

import torch
from hypothesis import event
from hypothesis import strategies as st

from maskfuzz.oracles.case import Case
from maskfuzz.oracles.domain import Domain
from maskfuzz.oracles.options import Option

BOOTSTRAPS = (1.0, -2.0, 0.5, 0.0, 8.0)


@st.composite
def option_values(draw, space: tuple[Option, ...]) -> dict:
    """name -> value for the options that differ from their default (possibly none)."""
    chosen = {}
    for opt in space:
        value = draw(st.just(opt.default) | st.sampled_from(opt.values))
        event(f"option {opt.name}={value}")
        if value != opt.default or isinstance(value, bool) != isinstance(opt.default, bool):
            chosen[opt.name] = value
    return chosen


@st.composite
def truncation(draw, case: Case) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(truncated [B], bootstrap [B]) or (None, None): some rows with a trainable token cut."""
    eligible = case.trainable.any(dim=1).tolist()
    if not any(eligible) or not draw(st.booleans()):
        return None, None
    cut = [bool(e) and draw(st.booleans()) for e in eligible]
    if not any(cut):
        return None, None
    boot = [draw(st.sampled_from(BOOTSTRAPS)) if c else 0.0 for c in cut]
    event(f"truncated rows: {sum(cut)} of {len(cut)}")
    return torch.tensor(cut, dtype=torch.bool), torch.tensor(boot, dtype=torch.float64)


@st.composite
def configured(draw, base, declared, domain: Domain | None = None, fixed: dict | None = None) -> Case:
    """A case of `base` with options from `declared.options` (or exactly `fixed`) and, when
    `declared.truncation` is declared and `domain` allows it, truncated rows; a cut that leaves
    `domain` is not made (the rows stay ended)."""
    case = draw(base)
    domain = domain or declared.domain
    changes: dict = {}
    if fixed is not None:
        changes["options"] = dict(fixed)
    elif declared.options:
        changes["options"] = draw(option_values(tuple(declared.options)))
    if declared.truncation is not None and domain.truncated_rows:
        cut, boot = draw(truncation(case))
        if cut is not None:
            out = case.replace(truncated=cut, bootstrap=boot)
            if domain.rejects(out) is None:
                changes["truncated"], changes["bootstrap"] = cut, boot
            else:
                event("truncated rows: outside the domain (kept ended)")
    return case.replace(**changes) if changes else case

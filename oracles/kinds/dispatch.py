"""The judge and the diagnosis of every kind: each kind's own, by the declared kind.

`judge(run, case, declared)` returns one verdict per property of the declared kind; `diagnose` names the
mechanism behind a property finding. The kind's `KindSpec.family` names them: GAE and `returns` have theirs in
`oracles.kinds.gae`; the statistic kinds share `oracles.kinds.judge` and `oracles.kinds.diagnosis`.
"""

from __future__ import annotations

from maskfuzz.oracles.case import Case
from maskfuzz.oracles.declared import Declared
from maskfuzz.oracles.kinds import spec
from maskfuzz.oracles.mechanisms import Diagnosis
from maskfuzz.oracles.verdict import Run, Verdict


def judge(
    run: Run, case: Case, declared: Declared, device: str = "cpu", only: tuple[str, ...] | None = None
) -> list[Verdict]:
    """Run `case` (and the perturbed twins it needs) through `run`; one verdict per property of the
    declared kind, in its priority order. `only` restricts the checks (the base run and no-crash always
    run). The case's options configure `declared` first."""
    declared = declared.configured(case)
    return spec(declared.kind).judge(run, case, declared, device=device, only=only)


def diagnose(run: Run, case: Case, declared: Declared, prop: str) -> Diagnosis:
    """The mechanism behind `case` violating `prop` on `run` (`oracles.mechanisms`)."""
    declared = declared.configured(case)
    return spec(declared.kind).diagnose(run, case, declared, prop)

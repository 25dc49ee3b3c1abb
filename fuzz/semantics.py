"""Semantics cards of targets: clean cases drawn for an entry, then `oracles.kinds.semantics.infer`.

The cases come from the entry's own strategy inside its api domain (so they carry what tells the
variants apart: groups of one, rows without a trainable token, gaps, observation tails, splits),
without NaN, with the poison under the masks cleared and the options at their defaults: a card
describes the default configuration on valid input.
"""

from __future__ import annotations

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hyp_seed

from maskfuzz.fuzz.engine import draws
from maskfuzz.oracles.case import Case
from maskfuzz.oracles.declared import Declared
from maskfuzz.oracles.kinds import spec
from maskfuzz.oracles.kinds.semantics import Card, infer
from maskfuzz.oracles.strategies import Sizes
from maskfuzz.oracles.verdict import Run

CASES = 32  # clean cases per card: enough to draw singletons, empty rows, gaps and tails at these sizes
SIZES = Sizes(6, 12)


def _probes(declared: Declared) -> list[Case]:
    """Well-conditioned cases that tell a kind's dimensions apart, where random draws (offsets, identical
    scores) often cannot: a group with a row without a trainable token, a group of three, two scores 1e-3
    apart (eps placement), a group of one, groups of different spread (std level). Those outside the entry's
    api domain are left out."""
    layouts = getattr(spec(declared.kind).module, "CARD_PROBES", ())  # the kind's own, beside its reference
    if not layouts:
        return []
    dtype = "float32" if "float32" in declared.domain.dtypes else declared.domain.dtypes[0]
    out = []
    for kw in layouts:
        case = Case.build(dtype=dtype, **kw)
        if declared.domain.rejects(case) is None:
            out.append(case)
    return out


def clean_cases(declared: Declared, n: int = CASES, seed: int = 0, sizes: Sizes = SIZES) -> list[Case]:
    """`n` clean cases of `declared`'s kind, drawn reproducibly from its strategy (see the module docstring),
    after the kind's well-conditioned probes."""
    if n < 1:
        raise ValueError(f"a card needs at least one case, got n={n}")
    out: list[Case] = _probes(declared)

    @settings(
        max_examples=n,
        database=None,
        derandomize=False,
        deadline=None,
        phases=(Phase.generate,),
        suppress_health_check=list(HealthCheck),
    )
    @given(draws(declared, sizes, nonfinite=False))
    def collect(case: Case) -> None:
        out.append(_clean(case, declared))

    hyp_seed(seed)(collect)()
    return out[: n + len(_probes(declared))]


def _clean(case: Case, declared: Declared) -> Case:
    case = case.replace(options={}, truncated=None, bootstrap=None)
    return spec(declared.kind).clean(case, declared)


def card(run: Run, declared: Declared, target: str = "", n: int = CASES, seed: int = 0) -> Card:
    """The semantics card of `run` (a target's Run) as `declared`, on `n` clean cases."""
    return infer(run, clean_cases(declared, n, seed), declared, target)

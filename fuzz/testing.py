"""maskfuzz inside a maintainer's own pytest run, without the command line.

The public API (stable names; everything else is internal):

* `gae_cases(dtypes=..., max_batch=..., max_len=..., nonfinite=...)`: the Hypothesis strategy of masked
  batches maskfuzz fuzzes with (masked tails of padding and of real tokens, gaps, all-masked rows,
  gamma = 0, gamma = lam = 1, finite and non-finite poison under the mask), as `Case` objects;
  `case.inputs()` gives the keyword arguments of the canonical signature below.
* `reference(case, contract)`: the serial float64 reference `(advantages, returns)` of a contract,
  "compressed" (masked tokens are skipped: values and rewards under the mask never enter the
  recursion), "dense" (every position is a step) or "segment".
* `defects(fn, contract=..., ...)` / `assert_invariants(fn, contract=..., ...)`: fuzz `fn` in this
  process against the universal invariants of masking and the contract it intends, shrink every
  failure, and return the defects (each naming the promise it breaks) or raise AssertionError listing
  them with their smallest cases.

`fn` has the canonical keyword signature of `maskfuzz fuzz --callable`:
`fn(*, token_rewards, values, trainable, attention, score, gamma, lam) -> (advantages, returns)`,
B x T tensors in the case's dtype (masks as 1.0 / 0.0), `score` of shape [B], `gamma` / `lam` floats.
The pytest plugin (entry point `maskfuzz`) offers the same check as the fixture `maskfuzz_invariants`.
"""

from __future__ import annotations

import json
from typing import Callable

from hypothesis import strategies as st

from maskfuzz.fuzz.corpus_codec import case_to_json
from maskfuzz.fuzz.engine import fuzz_target
from maskfuzz.fuzz.triage import Defect, triage
from maskfuzz.oracles.case import DTYPES, Case
from maskfuzz.oracles.declared import Declared
from maskfuzz.oracles.domain import Domain
from maskfuzz.oracles.kinds.gae.reference import CONTRACTS, reference
from maskfuzz.oracles.kinds.gae.strategies import cases
from maskfuzz.oracles.strategies import Sizes

__all__ = ["Case", "CONTRACTS", "assert_invariants", "defects", "gae_cases", "reference"]

GaeFn = Callable[..., tuple]


def gae_cases(
    dtypes: tuple[str, ...] = ("float32",), max_batch: int = 16, max_len: int = 256, nonfinite: bool = True
) -> st.SearchStrategy[Case]:
    """Masked batches in `dtypes` (any of float32, float64, bfloat16, float16), B <= max_batch, T <= max_len;
    `nonfinite` also draws NaN / inf poison under the mask."""
    bad = [d for d in dtypes if d not in DTYPES]
    if bad or not dtypes:
        raise ValueError(f"dtypes {bad or dtypes}: choose among {', '.join(DTYPES)}")
    if max_batch < 1 or max_len < 1:
        raise ValueError(f"max_batch and max_len must be >= 1, got {max_batch}, {max_len}")
    return cases(domain=Domain(dtypes=tuple(dtypes)), sizes=Sizes(max_batch, max_len), nonfinite=nonfinite)


def defects(
    fn: GaeFn,
    contract: str = "compressed",
    *,
    dtypes: tuple[str, ...] = ("float32",),
    max_examples: int = 200,
    seed: int = 0,
    nonfinite: bool = True,
) -> list[Defect]:
    """Fuzz `fn` against the universal invariants and `contract`; its defects, most severe first (every
    input is the caller's own, so reach is `pipeline`). Findings that break no promise are not returned."""
    if contract not in CONTRACTS:
        raise ValueError(f"contract {contract!r}: choose one of {', '.join(CONTRACTS)}")
    if max_examples < 1:
        raise ValueError(f"max_examples must be >= 1, got {max_examples}")
    gae_cases(dtypes)  # validates the dtypes
    declared = Declared(contract=contract, own_inputs=True, domain=Domain(dtypes=tuple(dtypes)))

    def run(case: Case):
        return fn(**case.inputs("cpu"))

    name = getattr(fn, "__qualname__", "fn")
    result = fuzz_target(run, declared, target=name, max_examples=max_examples, seed=seed, nonfinite=nonfinite)
    return triage(result, run, declared, seed=seed)


def assert_invariants(fn: GaeFn, contract: str = "compressed", **kwargs) -> None:
    """AssertionError listing every defect of `fn` (the promise it breaks, its root cause and its smallest
    case) when there is one; returns None when `fn` keeps every promise on the examples drawn."""
    found = defects(fn, contract, **kwargs)
    if found:
        lines = [f"{len(found)} defect(s) of {getattr(fn, '__qualname__', 'fn')} (contract {contract}):"]
        for d in found:
            lines.append(f"  {d.line()}")
            lines.append(f"    promise: {d.promise.id}: {d.promise.text}" if d.promise else "")
            lines.append(f"    smallest case: {json.dumps(case_to_json(d.case))}")
        raise AssertionError("\n".join(x for x in lines if x))

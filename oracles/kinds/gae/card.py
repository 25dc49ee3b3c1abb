"""What a semantics card (`oracles.kinds.semantics`) asks of GAE and `returns`: the declared variant as the
card's dimensions name it (the contract), and the float64 reference of a candidate contract with the judge's
tolerance of it (`KindSpec.card_variant`, `KindSpec.card_reference`).
"""

from __future__ import annotations

import dataclasses

import torch

from maskfuzz.oracles.case import Case
from maskfuzz.oracles.declared import Declared
from maskfuzz.oracles.kinds.gae.kl_reward import reference_case
from maskfuzz.oracles.kinds.gae.properties import baseline, expected_outputs
from maskfuzz.oracles.kinds.gae.tolerance import bounds

Outputs = dict[str, torch.Tensor]


def variant(declared: Declared) -> dict:
    """The declared variant of a GAE target: its contract (the `DIMENSIONS` of `oracles.kinds.gae`)."""
    return {"contract": declared.contract}


def reference(case: Case, declared: Declared, variant: dict) -> tuple[Outputs, Outputs] | None:
    """(advantages and returns of contract `variant["contract"]`, their bounds) for `case`, each [B, T], or None
    where the reference is undefined (whitening fewer than two trainable positions)."""
    d = dataclasses.replace(declared, contract=variant["contract"])
    try:
        exp = expected_outputs(case, d)
    except ValueError:
        return None
    if exp is None:
        return None
    bnd = bounds(reference_case(case, d), d.contract, exp[0], exp[1], d.whitening, baseline=baseline(case, d))
    return {"advantages": exp[0], "returns": exp[1]}, {"advantages": bnd.advantages, "returns": bnd.returns}

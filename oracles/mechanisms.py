"""Root-cause vocabulary: the mechanisms a diagnosis can name (`MECHANISMS`) and a `Diagnosis`.

Which probe decides a mechanism is `oracles.kinds.gae.diagnosis`' question for GAE and `oracles.kinds.diagnosis`'
for the kinds beyond it; both name their findings in these words.
"""

from __future__ import annotations

from dataclasses import dataclass

MECHANISMS: dict[str, str] = {
    "masked-value-bootstrap": "a critic value at a non-trainable position bootstraps into trainable advantages",
    "masked-reward-leak": "a reward (or KL term) at a non-trainable position reaches trainable outputs",
    "extra-decay": "each masked token between trainable ones adds a decay step and a zero bootstrap",
    "score-lost": "the outcome reward lands on a masked position, is decayed or is dropped",
    "turn-reward-lost": "a per-turn return reads one token's reward per turn: rewards elsewhere in the turn are lost",
    "nan-through-mask": "NaN / inf under the mask reaches trainable outputs (a mask product keeps NaN)",
    "crash-degenerate": "an error or a non-finite output on a valid edge input (empty or all-masked rows, ...)",
    "masked-statistics": "a statistic (whitening mean / variance) counts non-trainable tokens, rows or groups",
    "split-normaliser": "a normaliser depends on the split of the step or on padding",
    "masked-loss-leak": "a per-token loss at a non-trainable position reaches the step's loss or its gradient",
    "precision": "arithmetic below the precision of the inputs (the property holds in float64)",
    "nondeterminism": "the same input gives different bits on CPU",
    "masked-nonzero": "non-zero advantages at masked positions (no effect where the loss masks them)",
    "group-mixing": "a group statistic crosses group boundaries (rows assumed contiguous or of one size)",
    "row-order": "a row's output depends on the order of the rows",
    "variant-mismatch": "the output is another variant's (std, eps, singleton rule, estimator): documented or not",
    "implementations-disagree": "two implementations of one computation in the framework give different outputs",
    "unexplained": "no single-mechanism probe isolates it",
}


@dataclass(frozen=True)
class Diagnosis:
    mechanism: str
    evidence: str  # what the probe that decided it saw

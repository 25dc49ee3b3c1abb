"""Variant dimensions: per kind, the choices a correct implementation may make and their candidate values.

A semantics card (`oracles.kinds.semantics`) infers, dimension by dimension, which candidates agree with an
entry's code; a diagnosis (`oracles.kinds.diagnosis`) tries the same candidates as neighbouring variants.
"""

from __future__ import annotations

# kind -> dimension -> its candidate values (the first dimensions name masking choices). For the kinds beyond
# GAE a dimension is a key of the kind's variant; for GAE and returns "contract" is the declared contract.
_AGG = {
    "empty_rows": ["excluded", "counted"],
    "mode": ["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "prompt-mean"],
    "scope": ["step", "micro-batch"],
}
DIMENSIONS: dict[str, dict[str, list]] = {
    "gae": {"contract": ["compressed", "dense", "segment"]},
    "returns": {"contract": ["compressed", "dense", "segment"]},
    "group-advantage": {
        "empty_rows": ["excluded", "counted"],
        "std": ["unbiased", "biased", None],
        "eps_place": ["std", "var", "floor"],
        "singleton": ["raw", "zero"],
        "std_level": ["group", "batch"],
        "estimator": ["grpo", "rloo", "opo", "gpg", "passk"],
    },
    "normalization": {"unbiased": [True, False], "eps_place": ["var", "std", "floor"], "shift_mean": [True, False]},
    "kl": {"estimator": ["k1", "abs", "k2", "k3"]},
    "token-reward": {"score_at": ["last-trainable", "last-attended"]},
    "loss-aggregation": dict(_AGG),
    "value-loss": {**_AGG, "half": [True, False]},
    "policy-loss": {**_AGG, "dual_clip": [None, 3.0], "clip_high": [None, 0.28], "advantages": ["token", "row"]},
}

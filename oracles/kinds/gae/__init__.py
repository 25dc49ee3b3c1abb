"""The `gae` kind and `returns` (GAE with V = 0, lam = 1): generalized advantage estimation over masked tokens.

`reference` (the float64 references of the contracts `compressed`, `dense`, `segment`), `tolerance` (the
recursion's error bound), `kl_reward` (a KL penalty folded into the rewards, and the inputs the reference
sees), `properties` (the judge), `diagnosis` (the probes that name a mechanism) and `strategies` (the
Hypothesis strategy of canonical masked batches).
"""

OUTPUTS = ("advantages", "returns")  # what a target of `gae` or `returns` gives, each [B, T]
ZERO_OUTPUTS = ("advantages",)  # what a masked-zero promise covers (returns at masked positions are free)
# the choices a correct implementation may make, with their candidates (a semantics card infers them, a diagnosis
# tries them as neighbouring variants): for gae and returns the contract
DIMENSIONS = {"contract": ["compressed", "dense", "segment"]}

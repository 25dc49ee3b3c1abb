"""Call recipes for the Entropy-Mechanism losses Clip-Cov and KL-Cov, as verl and SkyRL register them.

Both are "Adapted from https://github.com/PRIME-RL/Entropy-Mechanism-of-RL" (verl 0.9.1
verl/trainer/ppo/core_algos.py:1756; SkyRL 0.3.1 skyrl_train/utils/ppo_utils.py:765) and select tokens by the
covariance of advantage and log-prob over the *valid* tokens of the batch they are handed (`response_mask` /
`loss_mask` > 0). What is judged: no-crash, poison (finite and non-finite), pad-invariance, masked-zero,
empty-step, invariants only. What their design does not promise, never judged:

* Clip-Cov draws its clipped tokens at random among the candidates, `perm = torch.randperm(len(top_k_idx))`
  (verl 0.9.1 core_algos.py:1823, SkyRL 0.3.1 ppo_utils.py:796): not `deterministic`, and which rows are picked
  follows their order (`torch.nonzero` row-major), so not `permutation`. Each call here runs under a forked CPU
  RNG seeded the same (`seeded`), as a trainer at a fixed seed on the same batch: a twin then differs from its
  base only by what the judge changed (its padding, its poison), which the selection over valid tokens must not
  see.
* Both compute the covariance, the candidate count (`clip_cov_ratio * mask.sum()`, `len(valid) * kl_cov_ratio`)
  and the rank over the micro-batch they are called with (verl 0.9.1 core_algos.py:1812-1818 / :1899-1907):
  the selection is a statistic of the micro-batch by design, so not `split-invariance`.
* KL-Cov ranks by `torch.topk(cov_lst_all, k, largest=True)` (verl 0.9.1 core_algos.py:1907, SkyRL 0.3.1
  ppo_utils.py:858), whose ties fall to position: permuting rows moves which of two equal covariances gets the KL
  term, so not `permutation`.
"""

from __future__ import annotations

from typing import Callable, TypeVar

import torch

NAMES = ("clip_cov", "kl_cov")  # the registry keys with a recipe
SEED = 0  # the CPU RNG state each call starts from (`seeded`)

_V, _S = "verl 0.9.1 verl/trainer/ppo/core_algos.py", "SkyRL 0.3.1 skyrl_train/utils/ppo_utils.py"
_SPLIT = (
    "split-invariance",
    f"the covariance, candidate count and rank are over the micro-batch it is called with ({_V}:1812-1818 "
    f"Clip-Cov, :1899-1907 KL-Cov; {_S}:784-792, :846-858): a statistic of the micro-batch by design",
)
NOT_PROMISED = {
    "clip_cov": (
        (
            "deterministic",
            f"clipped tokens drawn at random: perm = torch.randperm(len(top_k_idx)), {_V}:1823, {_S}:796",
        ),
        (
            "permutation",
            f"the random draw is over the candidates in row order (torch.nonzero then torch.randperm, {_V}:1820-1824, "
            f"{_S}:793-797): the rows picked follow the order of the rows",
        ),
        _SPLIT,
    ),
    "kl_cov": (
        (
            "permutation",
            f"torch.topk(cov_lst_all, k_percent_nums, largest=True), {_V}:1907, {_S}:858: ties in the covariance fall "
            "to position, so the row order picks which of two equal covariances gets the KL term",
        ),
        _SPLIT,
    ),
}

T = TypeVar("T")


def seeded(call: Callable[..., T]) -> Callable[..., T]:
    """`call` run under a forked CPU RNG seeded with SEED: every call draws the same permutation of the same
    candidates, and the caller's RNG state is left as it was."""

    def run(*args, **kwargs) -> T:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(SEED)
            return call(*args, **kwargs)

    return run


def recipe(name: str) -> dict | None:
    """The spec fields of the discovered loss `name` (`targets.discovery.overrides`); None without a recipe."""
    return dict(not_promised=NOT_PROMISED[name]) if name in NOT_PROMISED else None


def reason(name: str, order_ops: tuple[str, ...]) -> str:
    """The listing's note for a loss with a recipe, naming the selection ops found at this pin."""
    ops = ", ".join(order_ops) or "none found"
    return f"call recipe, invariants only: selects over the valid tokens ({ops}); not promised: " + ", ".join(
        p for p, _ in NOT_PROMISED[name]
    )

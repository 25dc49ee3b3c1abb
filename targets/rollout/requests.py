"""What the validation sends a framework's batch-code worker, and what comes back (pickled, `targets.worker`).

The layout is the canonical one of `oracles.case.Case`: B x T token-level tensors. A batch-code module maps
its framework's layout onto it (ROLL: the token-level tensors are the sequence shifted by one, `[:, 1:]`,
T = sequence_length - 1) and says how in its docstring.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from maskfuzz.targets.rollout.lm import Generation


@dataclass(frozen=True)
class Fault:
    """The inputs of one step at the hooked boundary, in the canonical layout:

    values         [B, T] float32  the critic's values as they reach the advantage code (the fault lives under
                                   the mask; the valid positions hold what the case holds there)
    token_rewards  [B, T] float32  dense per-token rewards, fed through the framework's own reward path
    score          [B]    float32  the outcome reward of each row
    gamma, lam                     the step's discount and GAE lambda
    """

    values: torch.Tensor
    token_rewards: torch.Tensor
    score: torch.Tensor
    gamma: float
    lam: float


@dataclass(frozen=True)
class BatchRequest:
    """Build the framework's batch from `generation` (with `sequence_length`, the pipeline's configured
    length, and the framework `options` of the case, `Case.options`, in its configuration) and, with a
    `fault`, run the step's reward and advantage code on it."""

    generation: Generation
    sequence_length: int
    options: dict = field(default_factory=dict)
    fault: Fault | None = None


@dataclass
class Batch:
    """The framework's answer, canonical layout:

    attention  [B, T] bool    a real token;   trainable [B, T] bool  the mask the advantage code is given
    truncated  [B]    bool    the response has no EOS (cut at the length limit)
    stages     name -> tensor the framework's own batch fields after each stage (for the record)
    advantages, returns [B, T] float32, only with a fault; `called`: every upstream function called, as
    `path/in/checkout.py::name`; `metrics`: what those functions reported
    tokens      [B, T] int64  the token id at each canonical position, where the layout is not ROLL's
                              (None: `stages["input_ids"][:, 1:]`)
    reward_mask [B, T] bool   where the framework's reward path lets dense token rewards through, where the
                              layout is not ROLL's (None: `stages["response_mask"][:, 1:]`, or everywhere)
    """

    attention: torch.Tensor
    trainable: torch.Tensor
    truncated: torch.Tensor
    stages: dict = field(default_factory=dict)
    advantages: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    called: list = field(default_factory=list)
    metrics: dict = field(default_factory=dict)
    tokens: torch.Tensor | None = None
    reward_mask: torch.Tensor | None = None

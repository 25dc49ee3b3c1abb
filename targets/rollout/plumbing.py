"""What a framework's rollout step passes its batch through, in one process (slime's and miles' managers).

`ObjectStore` stands in for ray's `put` / `get`, which move an object between processes and never change it;
`pad_responses` lays per-sample response tensors out as the canonical [B, T] of `oracles.case.Case`.
"""

from __future__ import annotations

import torch


class ObjectStore:
    """`ray.put` / `ray.get` of one process: the object itself (the store moves it, never changes it)."""

    @staticmethod
    def put(obj, **kwargs):
        return obj

    @staticmethod
    def get(obj):
        return obj


def pad_responses(per_sample: list, lengths: list[int], t_len: int) -> torch.Tensor:
    """Per-sample [response_length] tensors as the canonical [B, T] float32, 0 after each response."""
    out = torch.zeros(len(lengths), t_len, dtype=torch.float32)
    for b, (x, n) in enumerate(zip(per_sample, lengths)):
        out[b, :n] = x.float()
    return out

"""The inputs a target's framework can express.

A framework that has no token mask (torchrl: done flags) or only "response then padding" (TRL)
cannot be asked about gaps; the strategies draw inside a target's domain instead of skipping most
cases, and each narrowing carries the reason, so what is not tested is recorded, not hidden.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import torch

from oracles.case import DTYPES, Case


@dataclass(frozen=True)
class Domain:
    """What a target accepts. Every False/narrowed field should have an entry in `why`."""

    dtypes: tuple[str, ...] = tuple(DTYPES)
    gaps: bool = True  # non-trainable real tokens between trainable ones
    masked_real_tail: bool = True  # real tokens after the last trainable one (an observation tail)
    leading_mask: bool = True  # real non-trainable tokens before the first trainable one
    left_padding: bool = True  # padding before the real tokens
    all_masked_rows: bool = True  # rows with no trainable token next to normal rows
    masked_rewards: bool = True  # non-zero token rewards at non-trainable positions
    token_rewards: bool = True  # non-zero token rewards at all (else only the score)
    why: dict = field(default_factory=dict, compare=False, hash=False)

    def restrictions(self) -> dict[str, str]:
        """Each narrowed field mapped to the reason the target gives for it."""
        out = {}
        full = Domain()
        for f in fields(self):
            if f.name == "why":
                continue
            if getattr(self, f.name) != getattr(full, f.name):
                out[f.name] = self.why.get(f.name, "(no reason recorded)")
        return out

    def rejects(self, case: Case) -> str | None:
        """Why `case` lies outside this domain, or None when the target can express it."""
        if case.dtype not in self.dtypes:
            return f"dtype {case.dtype} not in {list(self.dtypes)}"
        att, tr = case.attention, case.trainable
        pos = torch.arange(case.shape[1])
        for b in range(case.shape[0]):
            a_idx, t_idx = att[b].nonzero().flatten(), tr[b].nonzero().flatten()
            if not t_idx.numel():
                if a_idx.numel() and not self.all_masked_rows:
                    return f"row {b} has no trainable token"
                continue
            first, last = int(t_idx[0]), int(t_idx[-1])
            if not self.gaps and int(tr[b, first : last + 1].sum()) != last - first + 1:
                return f"row {b} has a gap between trainable tokens"
            if not self.masked_real_tail and bool((att[b] & (pos > last)).any()):
                return f"row {b} ends in real non-trainable tokens"
            if not self.leading_mask and bool((att[b] & (pos < first)).any()):
                return f"row {b} starts with real non-trainable tokens"
            if not self.left_padding and a_idx.numel() and int(a_idx[0]) > 0:
                return f"row {b} is left-padded"
        if not self.left_padding and (att[:, 0] == 0).logical_and(att.any(dim=1)).any():
            return "a row is left-padded"
        if not self.token_rewards and bool((case.token_rewards != 0).any()):
            return "token rewards are non-zero (the target takes only the score)"
        if not self.masked_rewards and bool((case.token_rewards[~tr] != 0).any()):
            return "token rewards at non-trainable positions are non-zero"
        return None

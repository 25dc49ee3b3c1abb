"""The inputs a target can be given: its `api` domain and its `pipeline` domain.

`api`: what the function accepts by signature and docs. A framework that has no token mask
(torchrl: done flags) or only "response then padding" (TRL) cannot be asked about gaps; the
strategies draw inside the api domain instead of skipping most cases, and each narrowing carries
the reason, so what is not tested is recorded, not hidden.

`pipeline`: what the framework's own rollout, reward, KL and batching code can hand the function
at a pin (`shared/design/kinds.md`, Reachability). Every narrowing of a pipeline domain cites the
upstream file and lines (`cited`); a finding is `reach: pipeline` only with a witness inside it.
A narrowing is not enough: a field the pipeline domain leaves permissive is only what nobody
ruled out, so a witness counts only when every feature it exercises (`features`: a gap, an
observation tail, a masked critic value, a bfloat16 run, ...) is cited as *produced* by the
framework's own code (`produces`: the env manager that ends a response on an observation, the
critic whose values under tool tokens reach the function); `unproduced` names what is missing.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, fields, replace

import torch

from maskfuzz.oracles.case import DTYPES, Case

WIDTH = {"float16": 0, "bfloat16": 1, "float32": 2, "float64": 3}
# How far one policy update moves a token's log-prob at most, in a pipeline: verl clamps the log-ratio
# to this span before the exp (verl/trainer/ppo/core_algos.py:1334 at 0.9.1)
LOGRATIO_SPAN = 20.0
LOGPROBS = ("logp", "old_logp", "ref_logp", "rollout_logp")  # the extras that are log-probabilities
# Fields that say which inputs the function takes, not how far a pipeline narrows them: never a restriction
INPUT_FIELDS = ("rollout_logprobs",)
# Narrowings that state what an input *is* (log-probabilities), not what a pipeline chooses to build:
# they need no upstream citation in a pipeline domain
SELF_EVIDENT = ("masked_logprobs",)
# The Domain fields a case can exercise beyond the plain batch (right-padded responses, trainable real tokens,
# finite values and a score, float32): each needs a production citation before a witness may use it
FEATURES = (
    "gaps",
    "masked_real_tail",
    "leading_mask",
    "left_padding",
    "all_masked_rows",
    "empty_rows",
    "masked_rewards",
    "padding_rewards",
    "token_rewards",
    "masked_values",
    "padding_values",
    "nonfinite_poison",
    "truncated_rows",
    "truncated_padded",
    "uneven_splits",
    "ragged_groups",
    "dtypes",
)
# a production citation of the masked input covers padding too, unless the domain narrows padding apart
_FALLBACK = {"padding_values": "masked_values", "padding_rewards": "masked_rewards"}
_CITES = re.compile(r"[\w/.-]+\.\w+:\d+")
POISON_PROBE = 100.0  # the finite poison a probe puts under the mask (at most `poison_cap` of the dtype)


def poison_cap(dtype: str) -> float:
    """The largest finite poison magnitude drawn or probed in `dtype`: legitimate arithmetic on
    masked positions (a TD error, a whitening square over a few hundred positions) cannot overflow
    below it, so a non-finite output from finite poison under it is a leak, never an overflow."""
    big = float(torch.finfo(DTYPES[dtype]).max)
    return min(1e6, math.sqrt(big) / 16.0)


def even_split(case: Case) -> bool:
    """Every micro-batch of the step has the same row count and every rank the same number of them."""
    ids = case.split.tolist()
    sizes = [ids.count(k) for k in sorted(set(ids))]
    per_rank = [len(sizes[r :: case.ranks]) for r in range(case.ranks)]
    return len(set(sizes)) == 1 and len(set(per_rank)) == 1


def regular_groups(case: Case) -> bool:
    """Every prompt group has the same number of rows and its rows are next to each other (as a rollout that
    samples n responses per prompt lays them out)."""
    ids = case.group.tolist()
    runs = [ids[0]] + [g for a, g in zip(ids, ids[1:]) if g != a]
    sizes = [ids.count(g) for g in set(ids)]
    return len(runs) == len(set(runs)) and len(set(sizes)) == 1


@dataclass(frozen=True)
class Domain:
    """What a target accepts. Every False/narrowed field should have an entry in `why`."""

    dtypes: tuple[str, ...] = tuple(DTYPES)
    gaps: bool = True  # non-trainable real tokens between trainable ones
    masked_real_tail: bool = True  # real tokens after the last trainable one (an observation tail)
    leading_mask: bool = True  # real non-trainable tokens before the first trainable one
    left_padding: bool = True  # padding before the real tokens
    all_masked_rows: bool = True  # rows with no trainable token next to normal rows
    empty_rows: bool = True  # rows with no real token at all (a zero-length response)
    masked_rewards: bool = True  # non-zero token rewards at non-trainable positions (real tokens; padding too unless
    # `padding_rewards` says otherwise)
    token_rewards: bool = True  # non-zero token rewards at all (else only the score)
    masked_values: bool = True  # non-zero critic values at non-trainable positions (as masked_rewards)
    nonfinite_poison: bool = True  # NaN / inf values or rewards at non-trainable positions
    critic: bool = True  # takes critic values and lam (False: the `returns` kind, V = 0 and lam = 1)
    discount: bool = True  # takes a discount gamma (False: undiscounted, gamma = 1, e.g. ReMax's returns)
    uneven_splits: bool = True  # micro-batches of different row counts, or ranks with different counts of them
    ragged_groups: bool = True  # prompt groups of different sizes, or a group's rows not next to each other
    truncated_rows: bool = True  # rows cut by the length limit (where the target declares truncation)
    truncated_padded: bool = True  # a cut row followed by padding (the window wider than the length limit)
    # masked log-probs (`logp`, `old_logp`, `ref_logp`) may be any finite number; False: they are log-probabilities
    # of the rollout policy and of its next update (or the reference policy), <= 0 and within LOGRATIO_SPAN
    masked_logprobs: bool = True
    # the batch holds rows that are not samples (batch padding: a sample mask of 0, its own group); only then
    # does pad-invariance add a padding row (an empty row in a group of its own), never a sample of a group
    padding_rows: bool = False
    # at padding positions (no real token) apart from masked real tokens: None follows masked_values / masked_rewards;
    # e.g. a critic that zeroes padding but keeps values under tool tokens is masked_values=True, padding_values=False
    padding_values: bool | None = None
    padding_rewards: bool | None = None
    # the function also takes the rollout engine's log-probs (`rollout_logp`, a rollout / importance-sampling
    # correction): drawn near `old_logp` at trainable positions, poison under the mask; False: not drawn at all
    rollout_logprobs: bool = False
    why: dict = field(default_factory=dict, compare=False, hash=False)
    # feature -> the upstream file:line that produces such an input (a pipeline domain; see `unproduced`)
    produces: dict = field(default_factory=dict, compare=False, hash=False)

    def within(self, api: "Domain") -> "Domain":
        """This (pipeline) domain read inside `api`: what the pipeline builds and the function also takes.
        A pipeline domain declared field by field may leave permissive what the api domain narrows by the
        kind (no critic for `returns`, no discount, a dtype the function rejects): the api's narrowing holds."""
        changes: dict = {}
        for f in fields(self):
            if f.name in ("dtypes", "why", "produces"):
                continue
            if self.allows(f.name) and not api.allows(f.name):
                changes[f.name] = False
        dtypes = tuple(d for d in self.dtypes if d in api.dtypes) or api.dtypes
        if dtypes != self.dtypes:
            changes["dtypes"] = dtypes
        if not changes:
            return self
        why = {**{k: api.why[k] for k in changes if k in api.why}, **self.why}
        return replace(self, **changes, why=why)

    def cited(self) -> list[str]:
        """Narrowed fields whose reason cites no upstream file and line ("path.py:12" or
        "path.py:12-30"): a pipeline domain must have none."""
        return [
            k
            for k, why in self.restrictions().items()
            if k not in SELF_EVIDENT and not re.search(r"[\w/.-]+\.py:\d+", why)
        ]

    def features(self, case: Case) -> list[str]:
        """The fields of `FEATURES` that `case` exercises (a gap, a masked tail, masked values, ...)."""
        att, tr = case.attention, case.trainable
        pos = torch.arange(case.shape[1])
        used: set[str] = set()
        for b in range(case.shape[0]):
            a_idx, t_idx = att[b].nonzero().flatten(), tr[b].nonzero().flatten()
            if not a_idx.numel():
                used.add("empty_rows")
                continue
            if int(a_idx[0]) > 0:
                used.add("left_padding")
            if not t_idx.numel():
                used.add("all_masked_rows")
                continue
            first, last = int(t_idx[0]), int(t_idx[-1])
            if int(tr[b, first : last + 1].sum()) != last - first + 1:
                used.add("gaps")
            if bool((att[b] & (pos > last)).any()):
                used.add("masked_real_tail")
            if bool((att[b] & (pos < first)).any()):
                used.add("leading_mask")
        real, pad = ~tr & att, ~att
        if bool((case.token_rewards[real] != 0).any()):
            used.add("masked_rewards")
        if bool((case.token_rewards[pad] != 0).any()):
            used.add("padding_rewards")
        if bool((case.token_rewards[tr] != 0).any()):
            used.add("token_rewards")
        if bool((case.values[real] != 0).any()):
            used.add("masked_values")
        if bool((case.values[pad] != 0).any()):
            used.add("padding_values")
        if case.has_nonfinite_poison():
            used.add("nonfinite_poison")
        cut = case.truncated_rows()
        if bool(cut.any()):
            used.add("truncated_rows")
            if bool((cut & ~case.attention[:, -1]).any()):
                used.add("truncated_padded")
        if case.split is not None and not even_split(case):
            used.add("uneven_splits")
        if case.group is not None and not regular_groups(case):
            used.add("ragged_groups")
        if case.dtype != "float32":
            used.add("dtypes")
        return [f for f in FEATURES if f in used]

    def citations(self, case: Case) -> dict[str, str]:
        """The features `case` exercises with the upstream lines cited as producing each (the pipeline
        configuration a witness needs: a rollout correction, the KL in the reward, a tool turn)."""
        out = {}
        for f in self.features(case):
            cite = self.produces.get(f, "") or self.produces.get(_FALLBACK.get(f, ""), "")
            if _CITES.search(cite):
                out[f] = cite
        return out

    def unproduced(self, case: Case) -> list[str]:
        """The features `case` exercises that this (pipeline) domain does not cite as produced by the
        framework's code (`produces`, or for the dtype its narrowing's citation): a witness with any of
        them is a case nobody showed the pipeline builds."""
        out = []
        for f in self.features(case):
            cite = self.produces.get(f, "") or self.produces.get(_FALLBACK.get(f, ""), "")
            if f == "dtypes" and self.dtypes != tuple(DTYPES):
                cite = cite or self.why.get("dtypes", "")
            if not _CITES.search(cite):
                out.append(f)
        return out

    def allows(self, name: str) -> bool:
        """Field `name` as in force (`padding_values` / `padding_rewards` None follow their masked input)."""
        value = getattr(self, name)
        return getattr(self, _FALLBACK[name]) if value is None and name in _FALLBACK else bool(value)

    def poison_regions(self, dead: torch.Tensor, attention: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[B, T] bool masks of where this domain lets critic values and token rewards be non-zero under the mask
        `dead`: masked real tokens per masked_values / masked_rewards, padding per padding_values / padding_rewards."""
        real, pad = dead & attention, dead & ~attention
        values = (real & self.masked_values) | (pad & self.allows("padding_values"))
        rewards = (real & self.masked_rewards) | (pad & self.allows("padding_rewards"))
        return values, rewards

    def produced_only(self) -> "Domain":
        """This (pipeline) domain with every feature it does not cite as produced turned off: what a
        witness may use. The dtype stays where its narrowing cites a line, else float32 alone."""
        changes: dict = {}
        why = dict(self.why)
        for f in FEATURES:
            if f == "dtypes":
                cited = _CITES.search(self.produces.get(f, "")) or (
                    self.dtypes != tuple(DTYPES) and _CITES.search(self.why.get("dtypes", ""))
                )
                if not cited and self.dtypes != ("float32",) and "float32" in self.dtypes:
                    changes["dtypes"] = ("float32",)
                    why["dtypes"] = "float32: no other dtype is cited as produced by the pipeline"
                continue
            cite = self.produces.get(f, "") or self.produces.get(_FALLBACK.get(f, ""), "")
            if self.allows(f) and not _CITES.search(cite):
                changes[f] = False
                why[f] = f"not cited as produced by the pipeline (no file:line in `produces[{f!r}]`)"
        return replace(self, **changes, why=why) if changes else self

    def restrictions(self) -> dict[str, str]:
        """Each narrowed field mapped to the reason the target gives for it."""
        out = {}
        full = Domain()
        for f in fields(self):
            if f.name in ("why", "produces", *INPUT_FIELDS):
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
            if not a_idx.numel() and not self.empty_rows:
                return f"row {b} is empty (a zero-length response)"
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
        real, pad = ~tr & att, ~att
        if not self.masked_rewards and bool((case.token_rewards[real] != 0).any()):
            return "token rewards at non-trainable positions are non-zero"
        if not self.allows("padding_rewards") and bool((case.token_rewards[pad] != 0).any()):
            return "token rewards at non-trainable positions (padding) are non-zero"
        if not self.nonfinite_poison and case.has_nonfinite_poison():
            return "NaN / inf at non-trainable positions"
        if not self.masked_logprobs and not bool(_logprobs_ok(case).all()):
            return f"a masked log-prob is positive or moves by more than {LOGRATIO_SPAN:g} nats (not a log-probability)"
        if not self.masked_values and bool((case.values[real] != 0).any()):
            return "critic values at non-trainable positions are non-zero"
        if not self.allows("padding_values") and bool((case.values[pad] != 0).any()):
            return "critic values at non-trainable positions (padding) are non-zero"
        if not self.critic and (bool((case.values != 0).any()) or case.lam != 1.0):
            return "the target takes no critic: values must be 0 and lam 1"
        if not self.discount and case.gamma != 1.0:
            return "the target takes no discount: gamma must be 1"
        cut = case.truncated_rows()
        if bool(cut.any()):
            if not self.truncated_rows:
                return "a row is truncated (cut by the length limit)"
            if not self.truncated_padded and bool((cut & ~case.attention[:, -1]).any()):
                return f"truncated row {int((cut & ~case.attention[:, -1]).nonzero()[0])} is followed by padding"
        if not self.uneven_splits and case.split is not None and not even_split(case):
            return "the step is cut into micro-batches of different sizes (or ranks with different counts of them)"
        if not self.ragged_groups and case.group is not None and not regular_groups(case):
            return "the prompt groups differ in size or are not contiguous"
        return None

    def project(self, case: Case) -> Case | None:
        """The nearest case inside this domain that keeps `case`'s masks, or None when the masks
        themselves are outside it (a gap, a tail, left padding: no projection keeps the finding's
        shape). Non-finite poison becomes POISON_CAP-sized finite poison, disallowed masked values,
        rewards or log-probs become 0, a disallowed dtype the widest allowed one."""
        changes: dict = {}
        dead = ~case.trainable
        values, rewards = case.values, case.token_rewards
        if not self.nonfinite_poison and case.has_nonfinite_poison():
            cap = poison_cap(case.dtype)
            values = torch.nan_to_num(values, nan=cap, posinf=cap, neginf=-cap)
            rewards = torch.nan_to_num(rewards, nan=cap, posinf=cap, neginf=-cap)
            if case.extra:
                fix = {n: torch.nan_to_num(x, nan=cap, posinf=cap, neginf=-cap) for n, x in case.extra.items()}
                changes["extra"] = fix
        if not self.masked_logprobs:
            # a masked log-prob that is not one becomes -min(|x|, SPAN / 2): a log-prob, the log-ratio kept
            # non-zero where it was (a leak of a masked KL or ratio stays visible in the projection)
            extra = changes.get("extra", case.extra)
            bad = ~_logprobs_ok(case.replace(extra=extra))
            if bool(bad.any()):
                fix = lambda x: torch.where(bad, -x.abs().clamp(max=LOGRATIO_SPAN / 2), x)  # noqa: E731
                changes["extra"] = {n: fix(x) if n in LOGPROBS else x for n, x in extra.items()}
        real, pad = dead & case.attention, ~case.attention
        for allowed, where in ((self.masked_values, real), (self.allows("padding_values"), pad)):
            if not allowed:
                values = torch.where(where, torch.zeros_like(values), values)
        for allowed, where in ((self.masked_rewards, real), (self.allows("padding_rewards"), pad)):
            if not allowed or not self.token_rewards:
                rewards = torch.where(where, torch.zeros_like(rewards), rewards)
        if not self.token_rewards:
            rewards = torch.zeros_like(rewards)
        if values is not case.values:
            changes["values"] = values
        if rewards is not case.token_rewards:
            changes["token_rewards"] = rewards
        if case.dtype not in self.dtypes:
            changes["dtype"] = max(self.dtypes, key=lambda d: WIDTH[d])
        if not self.truncated_rows and case.truncated is not None:
            changes["truncated"], changes["bootstrap"] = None, None
        out = case.replace(**changes) if changes else case
        return None if self.rejects(out) else out


def _logprobs_ok(case: Case) -> torch.Tensor:
    """bool [B, T]: positions where the case's finite log-probs could be those of a policy and its
    next update (<= 0, |logp - old_logp| <= LOGRATIO_SPAN; `ref_logp` in place of `old_logp` for a KL
    in the reward; the rollout engine's `rollout_logp`, where drawn, <= 0 and as near `old_logp`);
    trainable positions, cases without both inputs and non-finite values (`nonfinite_poison`'s
    business) always pass."""
    other = next((n for n in ("old_logp", "ref_logp") if n in case.extra), None)  # the policy's update / reference
    if "logp" not in case.extra or other is None:
        return torch.ones(case.shape, dtype=torch.bool)
    lp, old = case.extra["logp"], case.extra[other]
    finite = torch.isfinite(lp) & torch.isfinite(old)
    fine = (lp <= 0) & (old <= 0) & ((lp - old).abs() <= LOGRATIO_SPAN)
    rollout = case.extra.get("rollout_logp")  # the rollout engine's, where drawn: near the old policy's too
    if rollout is not None:
        finite = finite & torch.isfinite(rollout)
        fine = fine & (rollout <= 0) & ((rollout - old).abs() <= LOGRATIO_SPAN)
    return case.trainable | ~finite | fine

"""The canonical case: one batch of masked GAE inputs, as `shared/design/semantics.md` defines it.

A case is B rows padded to T positions. Masks are bool tensors of shape [B, T]; rewards and
values are float64 tensors of shape [B, T]; the score is float64 of shape [B]. `dtype` names the
precision the case is *run* in; the float64 tensors hold the values exactly as that dtype rounds
them (see `Case.build`), so what a corpus file shows is what a target receives.

Validation happens on construction: a bad case never reaches a target.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Sequence

import torch

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float64": torch.float64,
}
DTYPE_ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "fp64": "float64"}


class CaseError(ValueError):
    """A case that violates the canonical format; the message says which field and why."""


def dtype_name(name: str) -> str:
    """Normalise `fp32`/`float32`/`torch.float32` to the canonical dtype name."""
    key = name.removeprefix("torch.")
    key = DTYPE_ALIASES.get(key, key)
    if key not in DTYPES:
        raise CaseError(f"dtype {name!r} is not one of {sorted(DTYPES)} (or fp32/bf16/fp16/fp64)")
    return key


def quantize(x: torch.Tensor, dtype: str) -> torch.Tensor:
    """Round float64 `x` to `dtype` and back: the exact numbers a target in `dtype` receives."""
    return x.to(DTYPES[dtype_name(dtype)]).to(torch.float64)


@dataclass(frozen=True, eq=False)
class Case:
    """B x T masked GAE inputs.

    attention[b, t]     bool, a real token (assistant or observation); one contiguous run per row
    trainable[b, t]     bool, the loss mask; trainable <= attention
    token_rewards[b, t] float64, dense per-token shaping, defined everywhere
    values[b, t]        float64, critic values; arbitrary ("poison") where trainable is 0
    score[b]            float64, the outcome reward of the row
    gamma, lam          discount and GAE lambda in [0, 1]
    dtype               the precision a target runs the case in
    group[b]            int64, the prompt group of the row (kind `group-advantage`, group-level
                        statistics); None when the kind has no groups
    extra[name][b, t]   float64, the per-token inputs of the other kinds (`kl`: logp, ref_logp;
                        `normalization`: x; `loss-aggregation`: loss), finite at trainable
                        positions, anything elsewhere
    split[b]            int64 >= 0, the micro-batch of the row in one optimizer step (kind
                        `loss-aggregation`): micro-batches run in increasing id order, the i-th of
                        them on simulated rank i % ranks; None is one micro-batch
    ranks               the number of simulated data-parallel ranks (1 without a split)
    truncated[b]        bool, the row was cut by the length limit (no EOS); None: no row was
    bootstrap[b]        float64, the critic value of the state after a truncated row's last token,
                        read by a framework that bootstraps (`oracles.options.Truncation`); finite
    options             the framework options the case runs with, name -> JSON scalar, only those
                        that differ from the target's defaults (`oracles.options.Option`)

    GAE and `returns` use the first seven fields; the other kinds (`oracles/kinds`) add `group`
    and `extra` (and `split`, `ranks`) and ignore what they do not read.
    """

    attention: torch.Tensor
    trainable: torch.Tensor
    token_rewards: torch.Tensor
    values: torch.Tensor
    score: torch.Tensor
    gamma: float
    lam: float
    dtype: str = "float32"
    group: torch.Tensor | None = None
    extra: dict = field(default_factory=dict)
    split: torch.Tensor | None = None
    ranks: int = 1
    truncated: torch.Tensor | None = None
    bootstrap: torch.Tensor | None = None
    options: dict = field(default_factory=dict)
    meta: dict = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", dtype_name(self.dtype))
        object.__setattr__(self, "gamma", float(self.gamma))
        object.__setattr__(self, "lam", float(self.lam))
        object.__setattr__(self, "ranks", int(self.ranks))
        _validate(self)

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def build(
        cls,
        *,
        trainable: Sequence[Sequence[int]] | torch.Tensor,
        attention: Sequence[Sequence[int]] | torch.Tensor | None = None,
        token_rewards: Sequence[Sequence[float]] | torch.Tensor | None = None,
        values: Sequence[Sequence[float]] | torch.Tensor | None = None,
        score: Sequence[float] | torch.Tensor | None = None,
        gamma: float = 1.0,
        lam: float = 1.0,
        dtype: str = "float32",
        group: Sequence[int] | torch.Tensor | None = None,
        extra: dict | None = None,
        split: Sequence[int] | torch.Tensor | None = None,
        ranks: int = 1,
        truncated: Sequence[bool] | torch.Tensor | None = None,
        bootstrap: Sequence[float] | torch.Tensor | None = None,
        options: dict | None = None,
    ) -> "Case":
        """Build a case from nested lists or tensors, rounding the floats to `dtype`.

        Omitted fields default to: attention = every position real, rewards/values/score = 0,
        no groups, no extra tensors.
        """
        tr = _as_bool(trainable, "trainable")
        if tr.dim() != 2:
            raise CaseError(f"trainable must be 2-D [B, T], got shape {list(tr.shape)}")
        att = torch.ones_like(tr) if attention is None else _as_bool(attention, "attention")
        zeros = torch.zeros(tr.shape, dtype=torch.float64)
        rew = zeros if token_rewards is None else _as_f64(token_rewards, "token_rewards")
        val = zeros if values is None else _as_f64(values, "values")
        sc = torch.zeros(tr.shape[0], dtype=torch.float64) if score is None else _as_f64(score, "score")
        name = dtype_name(dtype)
        return cls(
            attention=att,
            trainable=tr,
            token_rewards=quantize(rew, name),
            values=quantize(val, name),
            score=quantize(sc, name),
            gamma=gamma,
            lam=lam,
            dtype=name,
            group=None if group is None else _as_group(group),
            extra={k: quantize(_as_f64(v, k), name) for k, v in (extra or {}).items()},
            split=None if split is None else _as_group(split, "split ids"),
            ranks=ranks,
            truncated=None if truncated is None else _as_flags(truncated),
            bootstrap=None if bootstrap is None else quantize(_as_f64(bootstrap, "bootstrap"), name),
            options=dict(options or {}),
        )

    # -- views ----------------------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, int]:
        return (int(self.trainable.shape[0]), int(self.trainable.shape[1]))

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    def replace(self, **changes) -> "Case":
        """A validated copy with `changes` applied (floats are rounded to the case's dtype)."""
        name = dtype_name(changes.get("dtype", self.dtype))
        for key in ("token_rewards", "values", "score"):
            if key in changes:
                changes[key] = quantize(_as_f64(changes[key], key), name)
            elif name != self.dtype:
                changes[key] = quantize(getattr(self, key), name)
        if "extra" in changes or name != self.dtype:
            extra = changes.get("extra", self.extra)
            changes["extra"] = {k: quantize(_as_f64(v, k), name) for k, v in extra.items()}
        if changes.get("group") is not None:
            changes["group"] = _as_group(changes["group"])
        if changes.get("split") is not None:
            changes["split"] = _as_group(changes["split"], "split ids")
        if changes.get("truncated") is not None:
            changes["truncated"] = _as_flags(changes["truncated"])
        if changes.get("bootstrap") is not None:
            changes["bootstrap"] = quantize(_as_f64(changes["bootstrap"], "bootstrap"), name)
        elif name != self.dtype and self.bootstrap is not None and "bootstrap" not in changes:
            changes["bootstrap"] = quantize(self.bootstrap, name)
        changes.setdefault("meta", {})
        return replace(self, **changes)

    def rows(self, idx: torch.Tensor | Sequence[int]) -> "Case":
        """The case of rows `idx` (in that order), every per-row field taken along; a split whose
        micro-batches no longer cover its ranks falls back to one rank."""
        idx = torch.as_tensor(idx, dtype=torch.int64)
        split = None if self.split is None else self.split[idx]
        ranks = self.ranks if split is not None and len(set(split.tolist())) >= self.ranks else 1
        return self.replace(
            attention=self.attention[idx],
            trainable=self.trainable[idx],
            token_rewards=self.token_rewards[idx],
            values=self.values[idx],
            score=self.score[idx],
            group=None if self.group is None else self.group[idx],
            extra={n: x[idx] for n, x in self.extra.items()},
            split=split,
            ranks=ranks,
            truncated=None if self.truncated is None else self.truncated[idx],
            bootstrap=None if self.bootstrap is None else self.bootstrap[idx],
        )

    def with_rows(self, rows: "Case", at: int | None = None) -> "Case":
        """This case with the rows of `rows` (same width and dtype) inserted before row `at` (the
        end by default), every per-row field taken along (defaults where one side has none)."""
        b = self.shape[0]
        at = b if at is None else at

        def cat(mine, theirs):
            return torch.cat([mine[:at], theirs, mine[at:]], dim=0)

        def opt(name, fill):
            mine, theirs = getattr(self, name), getattr(rows, name)
            if mine is None and theirs is None:
                return None
            dt = (mine if mine is not None else theirs).dtype
            full = lambda c, x: x if x is not None else torch.full((c.shape[0],), fill, dtype=dt)  # noqa: E731
            return cat(full(self, mine), full(rows, theirs))

        return self.replace(
            attention=cat(self.attention, rows.attention),
            trainable=cat(self.trainable, rows.trainable),
            token_rewards=cat(self.token_rewards, rows.token_rewards),
            values=cat(self.values, rows.values),
            score=cat(self.score, rows.score),
            group=opt("group", 0),
            # an input the added rows lack is 0 there (they are all-masked probes: it never matters)
            extra={n: cat(x, rows.extra.get(n, torch.zeros(rows.shape, dtype=x.dtype))) for n, x in self.extra.items()},
            split=opt("split", 0),
            truncated=opt("truncated", False),
            bootstrap=opt("bootstrap", 0.0),
        )

    def bootstrap_values(self) -> torch.Tensor:
        """float64 [B]: the bootstrap value of each row (0 where none is recorded)."""
        if self.bootstrap is None:
            return torch.zeros(self.shape[0], dtype=torch.float64)
        return self.bootstrap

    def truncated_rows(self) -> torch.Tensor:
        """bool [B]: the rows cut by the length limit (none when not recorded)."""
        if self.truncated is None:
            return torch.zeros(self.shape[0], dtype=torch.bool)
        return self.truncated

    def inputs(self, device: str | torch.device = "cpu") -> dict:
        """The canonical keyword inputs a target receives, in the case's dtype on `device`.

        Masks are float tensors of the same dtype (1.0 / 0.0), as frameworks pass them.
        """
        dt = self.torch_dtype
        return {
            "token_rewards": self.token_rewards.to(device=device, dtype=dt),
            "values": self.values.to(device=device, dtype=dt),
            "trainable": self.trainable.to(device=device, dtype=dt),
            "attention": self.attention.to(device=device, dtype=dt),
            "score": self.score.to(device=device, dtype=dt),
            "gamma": self.gamma,
            "lam": self.lam,
        }

    def poison_mask(self) -> torch.Tensor:
        """Positions whose values and token rewards must never matter (trainable == 0)."""
        return ~self.trainable

    def has_nonfinite_poison(self) -> bool:
        poison = self.poison_mask()
        tensors = (self.values, self.token_rewards, *self.extra.values())
        return any(bool((~torch.isfinite(x[poison])).any()) for x in tensors)

    def per_token(self) -> dict[str, torch.Tensor]:
        """Every float64 [B, T] input by name: token_rewards, values, then the extra tensors."""
        return {"token_rewards": self.token_rewards, "values": self.values, **self.extra}

    def __repr__(self) -> str:
        rows = [
            "".join("1" if x else ("0" if a else ".") for x, a in zip(tr, at))
            for tr, at in zip(self.trainable.tolist(), self.attention.tolist())
        ]
        shown = rows if len(rows) <= 4 and self.shape[1] <= 32 else [f"{len(rows)} rows"]
        return f"Case({self.summary()}, trainable/attention={shown})"

    def summary(self) -> str:
        b, t = self.shape
        out = f"B={b} T={t} gamma={self.gamma:g} lam={self.lam:g} dtype={self.dtype}"
        if self.truncated is not None and bool(self.truncated.any()):
            out += f" truncated={self.truncated.nonzero().flatten().tolist()}"
        if self.options:
            out += " options=" + ",".join(f"{k}={v}" for k, v in sorted(self.options.items()))
        return out


def _as_bool(x, name: str) -> torch.Tensor:
    t = torch.as_tensor(x)
    if t.dtype != torch.bool:
        if t.is_floating_point() and not torch.isin(t, torch.tensor([0.0, 1.0], dtype=t.dtype)).all():
            raise CaseError(f"{name} must hold only 0 and 1")
        if not t.is_floating_point() and not torch.isin(t, torch.tensor([0, 1], dtype=t.dtype)).all():
            raise CaseError(f"{name} must hold only 0 and 1")
        t = t != 0
    return t.clone()


def _as_f64(x, name: str) -> torch.Tensor:
    try:
        return torch.as_tensor(x, dtype=torch.float64).clone()
    except (TypeError, ValueError, RuntimeError) as exc:
        raise CaseError(f"{name} is not a numeric array: {exc}") from None


def _as_group(x, what: str = "group ids") -> torch.Tensor:
    t = torch.as_tensor(x)
    if t.is_floating_point() or t.dtype == torch.bool:
        raise CaseError(f"{what} must be integers, got {t.dtype}")
    return t.to(torch.int64).clone()


def _as_flags(x) -> torch.Tensor:
    t = torch.as_tensor(x)
    if t.dtype != torch.bool:
        if not torch.isin(t, torch.tensor([0, 1], dtype=t.dtype)).all():
            raise CaseError("truncated must hold only booleans (0 / 1), one per row")
        t = t != 0
    return t.clone()


def _validate(c: Case) -> None:
    for name in ("attention", "trainable"):
        t = getattr(c, name)
        if not isinstance(t, torch.Tensor) or t.dtype != torch.bool:
            raise CaseError(f"{name} must be a bool tensor, got {getattr(t, 'dtype', type(t).__name__)}")
    for name in ("token_rewards", "values", "score"):
        t = getattr(c, name)
        if not isinstance(t, torch.Tensor) or t.dtype != torch.float64:
            raise CaseError(f"{name} must be a float64 tensor, got {getattr(t, 'dtype', type(t).__name__)}")
    if c.trainable.dim() != 2:
        raise CaseError(f"trainable must be 2-D [B, T], got shape {list(c.trainable.shape)}")
    b, t = c.trainable.shape
    if b == 0 or t == 0:
        raise CaseError(f"empty batch: shape [B={b}, T={t}]; a case needs at least one row and one position")
    for name in ("attention", "token_rewards", "values"):
        shape = list(getattr(c, name).shape)
        if shape != [b, t]:
            raise CaseError(f"shape mismatch: {name} has shape {shape}, trainable has [{b}, {t}]")
    if list(c.score.shape) != [b]:
        raise CaseError(f"shape mismatch: score has shape {list(c.score.shape)}, expected [{b}] (one per row)")
    outside = c.trainable & ~c.attention
    if outside.any():
        pos = [list(p) for p in outside.nonzero().tolist()[:5]]
        raise CaseError(f"trainable outside attention at [row, position] {pos}: trainable must be <= attention")
    count = c.attention.sum(dim=1)
    first = c.attention.int().argmax(dim=1)
    last = t - 1 - c.attention.flip(1).int().argmax(dim=1)
    broken = (count > 0) & (last - first + 1 != count)
    if broken.any():
        row = int(broken.nonzero()[0])
        raise CaseError(
            f"attention of row {row} is not contiguous ({_bits(c.attention[row])}): "
            "real tokens must form one run, padding only on the left and/or right"
        )
    for name, v in (("gamma", c.gamma), ("lam", c.lam)):
        if not (math.isfinite(v) and 0.0 <= v <= 1.0):
            raise CaseError(f"{name}={v!r} is outside [0, 1]")
    live = c.trainable
    for name in ("token_rewards", "values"):
        bad = live & ~torch.isfinite(getattr(c, name))
        if bad.any():
            pos = [list(p) for p in bad.nonzero().tolist()[:5]]
            raise CaseError(
                f"{name} is not finite at trainable positions {pos}: only masked positions may hold NaN/inf"
            )
    if not torch.isfinite(c.score).all():
        raise CaseError("score must be finite in every row")
    if c.group is not None and (c.group.dtype != torch.int64 or list(c.group.shape) != [b]):
        raise CaseError(f"group must be int64 of shape [{b}] (one id per row), got {list(c.group.shape)}")
    if c.split is not None:
        if c.split.dtype != torch.int64 or list(c.split.shape) != [b] or bool((c.split < 0).any()):
            raise CaseError(f"split must be int64 >= 0 of shape [{b}] (a micro-batch per row), got {c.split.tolist()}")
    if c.ranks < 1 or (c.ranks > 1 and (c.split is None or len(set(c.split.tolist())) < c.ranks)):
        raise CaseError(f"ranks must be 1, or at most the number of micro-batches (every rank has data); got {c.ranks}")
    if c.truncated is not None and (c.truncated.dtype != torch.bool or list(c.truncated.shape) != [b]):
        raise CaseError(f"truncated must be bool of shape [{b}] (one flag per row), got {list(c.truncated.shape)}")
    if c.bootstrap is not None:
        if c.bootstrap.dtype != torch.float64 or list(c.bootstrap.shape) != [b]:
            raise CaseError(f"bootstrap must be float64 of shape [{b}] (one value per row)")
        if not torch.isfinite(c.bootstrap).all():
            raise CaseError("bootstrap must be finite in every row: it is a critic value the framework trains on")
    if not isinstance(c.options, dict) or not all(isinstance(k, str) for k in c.options):
        raise CaseError(f"options must map option names to values, got {c.options!r}")
    for name, value in c.options.items():
        if not isinstance(value, (bool, int, float, str)) and value is not None:
            raise CaseError(f"option {name}={value!r} is not a JSON scalar")
    for name, x in c.extra.items():
        if not isinstance(x, torch.Tensor) or x.dtype != torch.float64 or list(x.shape) != [b, t]:
            raise CaseError(f"extra tensor {name!r} must be float64 of shape [{b}, {t}]")
        bad = live & ~torch.isfinite(x)
        if bad.any():
            pos = [list(p) for p in bad.nonzero().tolist()[:5]]
            raise CaseError(f"{name} is not finite at trainable positions {pos}: only masked positions may be")


def _bits(row: torch.Tensor) -> str:
    return "".join("1" if x else "0" for x in row.tolist())

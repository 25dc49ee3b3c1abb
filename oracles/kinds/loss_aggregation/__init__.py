"""Kind `loss-aggregation`: per-token losses to the one scalar of an optimizer step.

Input (a `Case`): `extra["loss"]` [B, T] per-token losses (anything at masked positions),
`trainable` the loss mask, `group` the prompt of each row (prompt-mean), `split` / `ranks` how the
step is cut into micro-batches on simulated data-parallel ranks. The reference is the whole step,
whatever the split: a framework given its own global-normaliser arguments must not depend on it.

With m the mask, n_b = sum_t m[b, t] the row's token count, R the rows with n_b > 0 (all rows with
`empty_rows="counted"`), N = sum m and G the prompts with a trainable token (every prompt with
`empty_rows="counted"`):

    token-mean                 L = sum(l m) / N                     (DAPO's global token mean too)
    token-sum                  L = sum(l m)
    seq-mean-token-sum         L = (1/R) sum_b sum_t l m
    seq-mean-token-mean        L = (1/R) sum_b (sum_t l m) / n_b
    seq-mean-token-sum-norm    L = sum(l m) / (R * constant)        (Dr.GRPO: constant = max length)
    prompt-mean                L = (1/G) sum_g (sum_{b in g, t} l m) / (sum_{b in g, t} m)

An empty step (no trainable token) is L = 0. Outputs ([B, T] each, `OUTPUTS`): `loss`, the scalar
broadcast to every position (so an empty step still shows it), and `grad` = dL/dl (0 at masked
positions). Variants: `mode`, `constant`, `empty_rows` ("excluded" | "counted"), `scope`: "step"
(the whole step, whatever its split) or "micro-batch" (a framework that documents normalising each
micro-batch on its own: L = (1/ranks) sum_rank (1/m) sum_mb L_mode(mb), m the accumulation steps
(the busiest rank's micro-batches, a trainer's configured value); split-invariance then does not
apply), `transform`:
None, or "k3" where the aggregated per-token value is the k3 KL estimate of the log-ratio l,
expm1(l) - l (a KL-to-reference loss term: torchrl's GRPOLoss._kl_to_ref), dL/dl = w expm1(l).
"""

from __future__ import annotations

import math

import torch

from maskfuzz.oracles.case import Case

OUTPUTS = ("loss", "grad")
ZERO_OUTPUTS = ("grad",)  # what must be 0 at masked positions (the loss is broadcast everywhere)
# the variant's choices a semantics card infers and a diagnosis tries as neighbours, with their candidates (the
# loss kinds on this aggregation share them)
DIMENSIONS = {
    "empty_rows": ["excluded", "counted"],
    "mode": ["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "prompt-mean"],
    "scope": ["step", "micro-batch"],
}
MODES = (
    "token-mean",
    "token-sum",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
    "prompt-mean",
)
DEFAULTS = {"mode": "token-mean", "constant": None, "empty_rows": "excluded", "transform": None, "scope": "step"}
TRANSFORMS = (None, "k3")


def microbatches(case: Case) -> list[tuple[int, torch.Tensor]]:
    """(rank, row indices) of each micro-batch of the step, in the order they run: increasing
    split id, the i-th micro-batch on rank i % ranks; one micro-batch of every row without a split."""
    if case.split is None:
        return [(0, torch.arange(case.shape[0]))]
    ids = sorted(set(case.split.tolist()))
    return [(i % case.ranks, (case.split == k).nonzero().flatten()) for i, k in enumerate(ids)]


def options(variant: dict | None) -> dict:
    out = dict(DEFAULTS)
    for key, value in (variant or {}).items():
        if key not in DEFAULTS:
            raise ValueError(f"unknown loss-aggregation option {key!r}; known: {sorted(DEFAULTS)}")
        out[key] = value
    if out["mode"] not in MODES:
        raise ValueError(f"unknown aggregation mode {out['mode']!r}; known: {', '.join(MODES)}")
    if out["empty_rows"] not in ("excluded", "counted"):
        raise ValueError(f"empty_rows must be 'excluded' or 'counted', got {out['empty_rows']!r}")
    if out["scope"] not in ("step", "micro-batch"):
        raise ValueError(f"scope must be 'step' or 'micro-batch', got {out['scope']!r}")
    if out["transform"] not in TRANSFORMS:
        raise ValueError(f"unknown transform {out['transform']!r}; known: {TRANSFORMS}")
    if out["mode"] == "seq-mean-token-sum-norm" and not out["constant"]:
        raise ValueError("seq-mean-token-sum-norm needs its constant (e.g. the maximum response length)")
    return out


def _per_microbatch(case: Case, v: dict, one) -> torch.Tensor:
    """scope="micro-batch": each micro-batch's own weights (`one(sub-case, variant)`, a [b, T] tensor) over
    its rank's micro-batch count and the ranks."""
    w = torch.zeros(case.shape, dtype=torch.float64)
    mbs = microbatches(case)
    accumulation = max(sum(1 for k, _ in mbs if k == r) for r, _ in mbs)  # the configured steps: the busiest rank's
    step_v = dict(v, scope="step")
    for _, rows in mbs:
        w[rows] = one(case.rows(rows).replace(split=None, ranks=1), step_v) / (accumulation * case.ranks)
    return w


def weights(case: Case, variant: dict | None = None) -> list[list[float]]:
    """dL/dl[b][t] by plain loops: the weight of each trainable token in the step's loss."""
    v = options(variant)
    if v["scope"] == "micro-batch" and case.split is not None:
        one = lambda sub, sv: torch.tensor(weights(sub, sv), dtype=torch.float64).reshape(sub.shape)  # noqa: E731
        return _per_microbatch(case, v, one).tolist()
    mask = case.trainable.tolist()
    b_rows, t_len = case.shape
    counts = [sum(1 for x in row if x) for row in mask]
    rows = b_rows if v["empty_rows"] == "counted" else sum(1 for n in counts if n > 0)
    total = sum(counts)
    w = [[0.0] * t_len for _ in range(b_rows)]
    group_tokens: dict[int, int] = {}
    if v["mode"] == "prompt-mean":
        groups = case.group.tolist() if case.group is not None else list(range(b_rows))
        for b in range(b_rows):
            group_tokens[groups[b]] = group_tokens.get(groups[b], 0) + counts[b]
        n_groups = len(group_tokens) if v["empty_rows"] == "counted" else sum(1 for n in group_tokens.values() if n > 0)
    for b in range(b_rows):
        for t in range(t_len):
            if not mask[b][t]:
                continue
            mode = v["mode"]
            if mode == "token-mean":
                w[b][t] = 1.0 / total
            elif mode == "token-sum":
                w[b][t] = 1.0
            elif mode == "seq-mean-token-sum":
                w[b][t] = 1.0 / rows
            elif mode == "seq-mean-token-mean":
                w[b][t] = 1.0 / (rows * counts[b])
            elif mode == "seq-mean-token-sum-norm":
                w[b][t] = 1.0 / (rows * float(v["constant"]))
            else:
                w[b][t] = 1.0 / (n_groups * group_tokens[groups[b]])
    return w


def reference(case: Case, variant: dict | None = None, vectorised: bool = False) -> dict[str, torch.Tensor]:
    """loss (the scalar, broadcast) and grad [B, T] in float64: loops, or the vectorised form."""
    v = options(variant)
    loss = case.extra["loss"]
    live = case.trainable
    k3 = v["transform"] == "k3"
    if vectorised:
        w = _weights_vectorised(case, v)
        lm = torch.where(live, loss, torch.zeros_like(loss))
        value = torch.expm1(lm) - lm if k3 else lm
        total = (value * w).sum()
        grad = w * torch.expm1(lm) if k3 else w
    else:
        wl = weights(case, v)
        w = torch.tensor(wl, dtype=torch.float64).reshape(case.shape)
        grad = w.clone()
        total = 0.0
        for b, t in live.nonzero().tolist():
            x = float(loss[b, t])
            total += wl[b][t] * ((math.expm1(x) - x if x < 709.0 else math.inf) if k3 else x)
            if k3:
                grad[b, t] = wl[b][t] * (math.expm1(x) if x < 709.0 else math.inf)
        total = torch.tensor(total, dtype=torch.float64)
    return {"loss": torch.full(case.shape, float(total), dtype=torch.float64), "grad": grad}


def _weights_vectorised(case: Case, v: dict) -> torch.Tensor:
    if v["scope"] == "micro-batch" and case.split is not None:
        return _per_microbatch(case, v, _weights_vectorised)
    m = case.trainable.to(torch.float64)
    n_b = m.sum(dim=1, keepdim=True)
    rows = float(case.shape[0]) if v["empty_rows"] == "counted" else float((n_b > 0).sum())
    mode = v["mode"]
    if mode == "token-mean":
        return m / m.sum().clamp(min=1.0)
    if mode == "token-sum":
        return m
    if mode == "seq-mean-token-sum":
        return m / max(rows, 1.0)
    if mode == "seq-mean-token-mean":
        return m / (max(rows, 1.0) * n_b.clamp(min=1.0))
    if mode == "seq-mean-token-sum-norm":
        return m / (max(rows, 1.0) * float(v["constant"]))
    groups = case.group if case.group is not None else torch.arange(case.shape[0])
    _, inv = torch.unique(groups, return_inverse=True)
    per_group = torch.zeros(int(inv.max()) + 1 if len(inv) else 0, dtype=torch.float64).index_add_(0, inv, n_b[:, 0])
    n_groups = float(len(per_group)) if v["empty_rows"] == "counted" else float((per_group > 0).sum())
    return m / (max(n_groups, 1.0) * per_group[inv].clamp(min=1.0)[:, None])


def condition(case: Case, variant: dict | None = None) -> dict[str, torch.Tensor]:
    """Per output, in units of u: the summed magnitude |l| w times the reduction's depth (loss), and
    the weight's own size for the few roundings of a normaliser (grad)."""
    v = options(variant)
    w = _weights_vectorised(case, v)
    live = case.trainable
    x = torch.where(live, case.extra["loss"], torch.zeros_like(w))
    if v["transform"] == "k3":  # expm1(l) - l: each term rounds at |expm1(l)| + |l|, its slope is expm1(l)
        mag = float(((torch.expm1(x).abs() + x.abs() + x.abs() * torch.exp(x)) * w).sum())
        depth = math.log2(max(int(live.sum()), 1)) + 4.0
        slope = (torch.exp(x) * (x.abs() + 1.0)) * w
        return {"loss": torch.full(case.shape, (mag + 1e-30) * depth * 4.0, dtype=torch.float64), "grad": slope * 8.0}
    mag = float((x.abs() * w).sum())
    depth = math.log2(max(int(live.sum()), 1)) + 4.0
    shape = case.shape
    return {"loss": torch.full(shape, (mag + 1e-30) * depth * 4.0, dtype=torch.float64), "grad": w.abs() * 8.0 + 0.0}


def peak(case: Case, variant: dict | None = None) -> float:
    """The largest intermediate a correct implementation forms: the unnormalised sum of |l m|."""
    live = case.trainable
    x = torch.where(live, case.extra["loss"], torch.zeros(case.shape, dtype=torch.float64))
    if options(variant)["transform"] == "k3":
        return float((torch.expm1(x).abs() + x.abs()).sum())
    return float(x.abs().sum())

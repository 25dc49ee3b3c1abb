"""The mutant zoo of the kinds beyond GAE: deliberately buggy implementations that test the suite
itself (`oracles.kinds`), one per way frameworks get the kind wrong, and a correct one per kind.

They are NOT upstream code. Each takes a `Case` and computes in the case's dtype with ordinary
torch code, returning the kind's outputs as a tuple. `CATCHES[fn] = (kind, variant, properties)`
lists the properties a mutant must fail; a correct implementation must fail none.
"""

from __future__ import annotations

import torch

from maskfuzz.oracles.case import Case


def _live(case: Case):
    return case.trainable, case.torch_dtype


def _score_rows(case: Case) -> torch.Tensor:
    return case.score.to(case.torch_dtype)


# -- group-advantage ---------------------------------------------------------------------------
def _grpo(case: Case, score: torch.Tensor, use: torch.Tensor, *, unbiased=True, one_pass=False) -> torch.Tensor:
    dt = case.torch_dtype
    adv = torch.zeros(case.shape[0], dtype=dt)
    for g in case.group.unique():
        rows = ((case.group == g) & use).nonzero().flatten()
        if rows.numel() == 0:
            continue
        r = score[rows]
        if rows.numel() == 1:
            adv[rows] = r / (1 + 1e-6)
            continue
        mean = r.mean()
        if one_pass:
            var = ((r * r).mean() - mean * mean) * (rows.numel() / (rows.numel() - 1))
            std = var.clamp(min=0).sqrt()
        else:
            std = r.std(unbiased=unbiased)
        adv[rows] = (r - mean) / (std + 1e-6)
    return adv


def _broadcast(case: Case, adv: torch.Tensor) -> torch.Tensor:
    return torch.where(case.trainable, adv[:, None].expand(case.shape), torch.zeros((), dtype=adv.dtype))


def grpo_correct(case: Case):
    return (_broadcast(case, _grpo(case, _score_rows(case), case.trainable.any(1))),)


def grpo_unmasked_reward_sum(case: Case):
    """Sums the token rewards over the whole row, masked positions included (score at the last
    trainable token): rewards under the mask leak into the score."""
    dt = case.torch_dtype
    last = torch.where(case.trainable, torch.arange(case.shape[1]), -1).max(1).values
    rew = case.token_rewards.to(dt).clone()
    for b, t in enumerate(last.tolist()):
        if t >= 0:
            rew[b, t] += case.score[b].to(dt)
    return (_broadcast(case, _grpo(case, rew.sum(-1), case.trainable.any(1))),)


def grpo_counts_empty_rows(case: Case):
    """Rows without a trainable token still enter their group's mean and std."""
    return (_broadcast(case, _grpo(case, _score_rows(case), torch.ones(case.shape[0], dtype=torch.bool))),)


def grpo_fixed_group_size(case: Case):
    """Assumes groups are contiguous blocks of the first group's size (`view(-1, n)`)."""
    dt = case.torch_dtype
    n = int((case.group == case.group[0]).sum())
    b = case.shape[0]
    if b % n:
        n = 1
    r = _score_rows(case).view(-1, n)
    std = r.std(dim=1, keepdim=True) if n > 1 else torch.ones_like(r)
    mean = r.mean(dim=1, keepdim=True) if n > 1 else torch.zeros_like(r)
    adv = ((r - mean) / (std + 1e-6)).view(-1).to(dt)
    adv = torch.where(case.trainable.any(1), adv, torch.zeros_like(adv))
    return (_broadcast(case, adv),)


def grpo_whole_batch_on_unequal_groups(case: Case):
    """Equal groups as declared; unequal ones all normalised as one group of the whole batch (the
    fallback miles and slime take when the sample count is not n_samples_per_prompt * groups)."""
    sizes = torch.unique(case.group, return_counts=True)[1] if case.group is not None else None
    if sizes is None or bool((sizes == sizes[0]).all()):
        return grpo_correct(case)
    whole = case.replace(group=torch.zeros_like(case.group))
    return (_broadcast(case, _grpo(whole, _score_rows(case), case.trainable.any(1))),)


def grpo_biased_std(case: Case):
    """Divides by the biased (1/n) std where the unbiased one is declared."""
    return (_broadcast(case, _grpo(case, _score_rows(case), case.trainable.any(1), unbiased=False)),)


def grpo_one_pass_variance(case: Case):
    """E[r^2] - E[r]^2 in the run dtype: cancels catastrophically at large offsets."""
    return (_broadcast(case, _grpo(case, _score_rows(case), case.trainable.any(1), one_pass=True)),)


def grpo_not_masked(case: Case):
    """Broadcasts the row advantage to every position, masked ones included."""
    adv = _grpo(case, _score_rows(case), case.trainable.any(1))
    return (adv[:, None].expand(case.shape).clone(),)


def grpo_score_on_last_attended(case: Case):
    """Places the score on the last attended token and reads it back through the loss mask: a row
    that ends in an observation tail loses its score (counted as 0)."""
    pos = torch.arange(case.shape[1])
    last = torch.where(case.attention, pos, -1).max(1).values
    kept = [float(case.score[b]) if t >= 0 and bool(case.trainable[b, t]) else 0.0 for b, t in enumerate(last.tolist())]
    score = torch.tensor(kept, dtype=case.torch_dtype)
    return (_broadcast(case, _grpo(case, score, case.trainable.any(1))),)


# -- kl ----------------------------------------------------------------------------------------
def _d(case: Case) -> torch.Tensor:
    dt = case.torch_dtype
    return case.extra["logp"].to(dt) - case.extra["ref_logp"].to(dt)


def k3_correct(case: Case):
    d = _d(case)
    k = torch.expm1(-d) + d
    return (torch.where(case.trainable, k, torch.zeros((), dtype=k.dtype)),)


def k3_mask_by_multiply(case: Case):
    """k * mask: NaN * 0 = NaN at masked positions."""
    d = _d(case)
    return ((torch.expm1(-d) + d) * case.trainable.to(d.dtype),)


def k3_wrong_sign(case: Case):
    """exp(d) - 1 - d: the estimator of KL(ref || policy) where KL(policy || ref) is declared."""
    d = _d(case)
    return (torch.where(case.trainable, torch.expm1(d) - d, torch.zeros((), dtype=d.dtype)),)


def k1_centred_over_all_positions(case: Case):
    """Subtracts the batch mean of d over every position, padding included."""
    d = _d(case)
    d = torch.where(torch.isfinite(d), d, torch.zeros_like(d))
    k = d - d.mean()
    return (torch.where(case.trainable, k, torch.zeros((), dtype=k.dtype)),)


def _ratio(case: Case, sign: float):
    """k3 times exp(sign * (logp - old_logp)) at trainable positions (old_logp absent: ratio 1)."""
    dt = case.torch_dtype
    d = _d(case)
    logp = case.extra["logp"].to(dt)
    x = logp - case.extra.get("old_logp", case.extra["logp"]).to(dt)
    k = (torch.expm1(-d) + d) * torch.exp(sign * x)
    return (torch.where(case.trainable, k, torch.zeros((), dtype=k.dtype)),)


def k3_ratio_correct(case: Case):
    return _ratio(case, 1.0)


def kl_ratio_inverted(case: Case):
    """k3 times exp(old_logp - logp): the inverse of the importance ratio (pi_old / pi)."""
    return _ratio(case, -1.0)


# -- normalization -----------------------------------------------------------------------------
def _whiten(case: Case, x: torch.Tensor, mask: torch.Tensor, *, one_pass=False, unbiased=True) -> torch.Tensor:
    m = mask.to(x.dtype)
    xs = torch.where(mask, x, torch.zeros((), dtype=x.dtype))
    n = m.sum()
    mean = xs.sum() / n
    if one_pass:
        var = ((xs * xs).sum() / n - mean * mean) * (n / (n - 1) if unbiased else 1)
    else:
        var = (((xs - mean) * m) ** 2).sum() / ((n - 1) if unbiased else n)
    w = (x - mean) * torch.rsqrt(var + 1e-8)
    return torch.where(mask, w, torch.zeros((), dtype=x.dtype))


def whiten_correct(case: Case):
    """Half-precision inputs whiten in float32 (eps = 1e-8 is 0 in float16)."""
    x = case.extra["x"].to(case.torch_dtype)
    wide = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    return (_whiten(case, wide, case.trainable).to(x.dtype),)


def whiten_over_all_positions(case: Case):
    """Statistics over every position: padding and masked tokens count."""
    x = case.extra["x"].to(case.torch_dtype)
    x = torch.where(torch.isfinite(x), x, torch.zeros_like(x))
    return (_whiten(case, x, torch.ones_like(case.trainable)) * case.trainable,)


def whiten_one_pass(case: Case):
    return (_whiten(case, case.extra["x"].to(case.torch_dtype), case.trainable, one_pass=True),)


def whiten_biased(case: Case):
    return (_whiten(case, case.extra["x"].to(case.torch_dtype), case.trainable, unbiased=False),)


# -- loss-aggregation: aggregators driven through a step as the adapters drive them ------------------
def _step(micro):
    from maskfuzz.targets.adapters.loss_step import run_step

    return lambda case: run_step(case, "cpu", micro)


def _masked_sum(loss: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.where(mask > 0, loss, torch.zeros_like(loss)).sum()


def _global_token_mean(rows, loss, mask, step):
    return _masked_sum(loss, mask) / max(step.tokens, 1) * step.ranks


agg_correct = _step(_global_token_mean)
agg_unmasked_numerator = _step(lambda rows, loss, mask, step: loss.sum() / max(step.tokens, 1) * step.ranks)
agg_mask_by_multiply = _step(lambda rows, loss, mask, step: (loss * mask).sum() / max(step.tokens, 1) * step.ranks)
agg_per_microbatch_normaliser = _step(  # each micro-batch's own token mean, averaged over accumulation steps
    lambda rows, loss, mask, step: _masked_sum(loss, mask) / mask.sum().clamp(min=1) / step.per_rank
)
agg_counts_padding = _step(lambda rows, loss, mask, step: _masked_sum(loss, mask) / step.mask.numel() * step.ranks)
agg_nan_on_empty_step = _step(lambda rows, loss, mask, step: _masked_sum(loss, mask) / step.tokens * step.ranks)
agg_forgets_ranks = _step(lambda rows, loss, mask, step: _masked_sum(loss, mask) / max(step.tokens, 1))


def _seq_mean_token_mean(rows_counted):
    def micro(rows, loss, mask, step):
        per_row = torch.where(mask > 0, loss, torch.zeros_like(loss)).sum(-1) / mask.sum(-1).clamp(min=1)
        return per_row.sum() / max(rows_counted(step), 1) * step.ranks

    return micro


agg_seq_mean_correct = _step(_seq_mean_token_mean(lambda step: step.nonempty_rows))
agg_seq_mean_counts_empty_rows = _step(_seq_mean_token_mean(lambda step: step.rows))


# -- value-loss: 0.5 max((v - R)^2, (v_c - R)^2), token-mean over the step --------------------------
def _value(form):
    """A value loss whose inputs are zeroed under the mask first: a square of a masked inf / NaN
    would give a NaN gradient there even through torch.where."""
    from maskfuzz.targets.adapters.loss_step import run_step

    def micro(rows, v, mask, step):
        dt, live = v.dtype, mask > 0
        zero = torch.zeros((), dtype=dt)
        old = torch.where(live, step.case.extra["v_old"][rows].to(dt), zero)
        ret = torch.where(live, step.case.extra["ret"][rows].to(dt), zero)
        per_token = form(torch.where(live, v, zero), old, ret, 0.5)
        return _masked_sum(per_token, mask) / max(step.tokens, 1) * step.ranks

    return lambda case: run_step(case, "cpu", micro, leaf_name="v")


def _clipped_sq(v, old, ret, c):
    return (old + (v - old).clamp(-c, c) - ret) ** 2


value_correct = _value(lambda v, old, ret, c: 0.5 * torch.maximum((v - ret) ** 2, _clipped_sq(v, old, ret, c)))
value_min_not_max = _value(lambda v, old, ret, c: 0.5 * torch.minimum((v - ret) ** 2, _clipped_sq(v, old, ret, c)))
value_clipped_around_returns = _value(
    lambda v, old, ret, c: 0.5 * torch.maximum((v - ret) ** 2, (ret + (v - ret).clamp(-c, c) - ret) ** 2)
)

# -- policy-loss: the clipped PPO objective, token-mean over the step, gradient w.r.t. logp ------------
PL = {"clip_low": 0.2, "dual_clip": 3.0}


def _policy(form, masked_inputs: bool = True, normaliser=None):
    """A clipped policy loss driven through a step as the adapters drive it. `form(logp, old, adv)`
    gives the per-token loss; inputs are zeroed under the mask first, else the loss is masked by
    multiplying with the mask (`masked_inputs=False`: NaN * 0 is NaN)."""
    from maskfuzz.targets.adapters.loss_step import run_step

    def micro(rows, logp, mask, step):
        dt, live = logp.dtype, mask > 0
        zero = torch.zeros((), dtype=dt)
        old = step.case.extra["old_logp"][rows].to(dt)
        adv = step.case.extra["adv"][rows].to(dt)
        if masked_inputs:
            logp, old, adv = (torch.where(live, x, zero) for x in (logp, old, adv))
        per_token = form(logp, old, adv)
        total = _masked_sum(per_token, mask) if masked_inputs else (per_token * mask).sum()
        denominator = max(step.tokens, 1) if normaliser is None else normaliser(mask, step)
        return total / denominator * step.ranks

    return lambda case: run_step(case, "cpu", micro, leaf_name="logp")


def _ppo(logp, old, adv, dual=3.0, clip=0.2):
    r = torch.exp(logp - old)
    loss = torch.maximum(-adv * r, -adv * r.clamp(1 - clip, 1 + clip))
    return torch.where(adv < 0, torch.minimum(loss, -adv * dual), loss) if dual else loss


policy_correct = _policy(_ppo)
policy_no_dual_clip = _policy(lambda logp, old, adv: _ppo(logp, old, adv, dual=None))
policy_ratio_inverted = _policy(lambda logp, old, adv: _ppo(old, logp, adv))
policy_mask_by_multiply = _policy(_ppo, masked_inputs=False)
policy_per_microbatch_normaliser = _policy(_ppo, normaliser=lambda mask, step: mask.sum().clamp(min=1) * step.per_rank)
policy_min_not_max = _policy(
    lambda logp, old, adv: torch.minimum(-adv * torch.exp(logp - old), -adv * torch.exp(logp - old).clamp(0.8, 1.2))
)

GA = {"estimator": "grpo", "std": "unbiased", "eps": 1e-6, "singleton": "raw"}
K3 = {"estimator": "k3"}
K3_RATIO = {"estimator": "k3", "ratio": "token"}
WH = {"level": "batch", "unbiased": True, "eps": 1e-8}
CATCHES = {
    grpo_correct: ("group-advantage", GA, ()),
    grpo_unmasked_reward_sum: ("group-advantage", GA, ("poison",)),
    # counting rows without a trainable token is a variant (empty_rows="counted"), not padding: the reference shows it
    grpo_counts_empty_rows: ("group-advantage", GA, ("reference",)),
    grpo_fixed_group_size: ("group-advantage", GA, ("group-isolation",)),
    grpo_biased_std: ("group-advantage", GA, ("reference",)),
    grpo_one_pass_variance: ("group-advantage", GA, ("affine",)),
    grpo_not_masked: ("group-advantage", GA, ("masked-zero",)),
    grpo_score_on_last_attended: ("group-advantage", GA, ("reference",)),
    k3_correct: ("kl", K3, ()),
    k3_mask_by_multiply: ("kl", K3, ("masked-zero",)),
    k3_wrong_sign: ("kl", K3, ("reference",)),
    k1_centred_over_all_positions: ("kl", {"estimator": "k1"}, ("poison",)),
    k3_ratio_correct: ("kl", K3_RATIO, ()),
    kl_ratio_inverted: ("kl", K3_RATIO, ("reference",)),
    whiten_correct: ("normalization", WH, ()),
    whiten_over_all_positions: ("normalization", WH, ("poison",)),
    whiten_one_pass: ("normalization", WH, ("affine",)),
    whiten_biased: ("normalization", WH, ("reference",)),
    agg_correct: ("loss-aggregation", {}, ()),
    agg_unmasked_numerator: ("loss-aggregation", {}, ("poison",)),
    agg_mask_by_multiply: ("loss-aggregation", {}, ("poison-nonfinite",)),
    agg_per_microbatch_normaliser: ("loss-aggregation", {}, ("split-invariance",)),
    agg_counts_padding: ("loss-aggregation", {}, ("pad-invariance",)),
    agg_nan_on_empty_step: ("loss-aggregation", {}, ("empty-step",)),
    agg_forgets_ranks: ("loss-aggregation", {}, ("split-invariance",)),
    agg_seq_mean_correct: ("loss-aggregation", {"mode": "seq-mean-token-mean"}, ()),
    agg_seq_mean_counts_empty_rows: ("loss-aggregation", {"mode": "seq-mean-token-mean"}, ("reference",)),
    value_correct: ("value-loss", {}, ()),
    value_min_not_max: ("value-loss", {}, ("clip-bound",)),
    value_clipped_around_returns: ("value-loss", {}, ("reference",)),
    policy_correct: ("policy-loss", PL, ()),
    policy_no_dual_clip: ("policy-loss", PL, ("reference",)),
    policy_ratio_inverted: ("policy-loss", PL, ("reference",)),
    policy_mask_by_multiply: ("policy-loss", PL, ("poison-nonfinite",)),
    policy_per_microbatch_normaliser: ("policy-loss", PL, ("split-invariance",)),
    policy_min_not_max: ("policy-loss", PL, ("reference",)),
}

for _name, _fn in list(globals().items()):  # the step-driven mutants are closures: name them for test ids
    if callable(_fn) and getattr(_fn, "__name__", "") == "<lambda>" and any(_fn is f for f in CATCHES):
        _fn.__name__ = _name

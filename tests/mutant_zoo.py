"""The mutant zoo: deliberately wrong masked GAE implementations that test the suite itself.

These are NOT targets and are never registered as such. Each one is a realistic bug class seen in
(or one step away from) real frameworks, written with the canonical keyword signature

    fn(*, token_rewards, values, trainable, attention, score, gamma, lam) -> (advantages, returns)

and paired with the property that must catch it (`CATCHES`). The correct implementations at the
bottom must produce no finding.
"""

from __future__ import annotations

import torch

from maskfuzz.oracles.case import Case
from maskfuzz.oracles.declared import Declared
from maskfuzz.oracles.kinds.gae.reference import compressed_vec, dense_vec, segment_vec
from maskfuzz.oracles.whitening import Whitening


# -- building blocks ----------------------------------------------------------------------------
def _last_index(mask: torch.Tensor) -> torch.Tensor:
    """Index of the last 1 of each row of a float mask (0 for an empty row)."""
    pos = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    return torch.where(mask > 0, pos, torch.zeros_like(pos)).max(dim=1).values


def _place_score(rewards: torch.Tensor, score: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    out = rewards.clone()
    rows = torch.arange(rewards.shape[0])
    has = mask.sum(dim=1) > 0
    out[rows[has], _last_index(mask)[has]] += score[has]
    return out


def _scan(rewards, values, gamma, lam, carry_mask=None):
    """Plain reverse GAE loop over all positions with a zero bootstrap after T-1."""
    b, t_len = rewards.shape
    adv = torch.zeros_like(rewards)
    last = torch.zeros(b, dtype=rewards.dtype)
    for t in reversed(range(t_len)):
        nxt = values[:, t + 1] if t + 1 < t_len else torch.zeros_like(last)
        delta = rewards[:, t] + gamma * nxt - values[:, t]
        last = delta + gamma * lam * last
        adv[:, t] = last
    return adv, adv + values


# -- the zoo ------------------------------------------------------------------------------------
def values_masked_for_storage_only(*, token_rewards, values, trainable, attention, score, gamma, lam):
    """ROLL's seed bug: the masked values are stored, the raw ones go into the recursion."""
    _stored = values * trainable  # noqa: F841 - the storage the bug author thought was enough
    rewards = _place_score(token_rewards * trainable, score, trainable)
    adv, ret = _scan(rewards, values, gamma, lam)
    return adv * trainable, ret * trainable


def mask_ignored(*, token_rewards, values, trainable, attention, score, gamma, lam):
    """The loss mask never reaches the estimator: observation rewards and values count."""
    rewards = _place_score(token_rewards, score, trainable)
    adv, ret = _scan(rewards, values, gamma, lam)
    return adv * trainable, ret * trainable


def score_on_last_real_token(*, token_rewards, values, trainable, attention, score, gamma, lam):
    """The score goes on the last *attended* token, which an observation tail then masks."""
    rewards = _place_score(torch.where(trainable > 0, token_rewards, 0.0), score, attention)
    adv, ret = _scan(rewards, torch.where(trainable > 0, values, 0.0), gamma, lam)
    return adv * trainable, ret * trainable


def extra_decay_per_masked_token(*, token_rewards, values, trainable, attention, score, gamma, lam):
    """A dense estimator shipped where `compressed` is promised: each masked token decays again."""
    case = _case(token_rewards, values, trainable, attention, score, gamma, lam)
    adv, ret = dense_vec(case)
    return adv.to(values.dtype), ret.to(values.dtype)


def nan_leaks_through_multiply(*, token_rewards, values, trainable, attention, score, gamma, lam):
    """Masking by multiplication: NaN * 0 = NaN, so NaN poison leaks."""
    v = values * trainable
    rewards = _place_score(token_rewards * trainable, score, trainable)
    adv, ret = _scan(rewards, v, gamma, lam)
    return adv * trainable, ret * trainable


def off_by_one_bootstrap(*, token_rewards, values, trainable, attention, score, gamma, lam):
    """Bootstraps from the last value instead of zero after the end of the sequence."""
    v = torch.where(trainable > 0, values, 0.0)
    rewards = _place_score(torch.where(trainable > 0, token_rewards, 0.0), score, trainable)
    b, t_len = v.shape
    adv = torch.zeros_like(v)
    last = torch.zeros(b, dtype=v.dtype)
    for t in reversed(range(t_len)):
        nxt = v[:, t + 1] if t + 1 < t_len else v[:, t]
        last = rewards[:, t] + gamma * nxt - v[:, t] + gamma * lam * last
        adv[:, t] = last
    return adv * trainable, (adv + v) * trainable


def crash_on_all_masked_row(*, token_rewards, values, trainable, attention, score, gamma, lam):
    """Indexes the last trainable token with nonzero()[-1]: an empty row raises."""
    rewards = torch.where(trainable > 0, token_rewards, 0.0).clone()
    for b in range(rewards.shape[0]):
        last = int(trainable[b].nonzero()[-1])
        rewards[b, last] += score[b]
    adv, ret = _scan(rewards, torch.where(trainable > 0, values, 0.0), gamma, lam)
    return adv * trainable, ret * trainable


def whitening_not_mask_weighted(*, token_rewards, values, trainable, attention, score, gamma, lam):
    """Whitens over every position of the batch, masked zeros included."""
    case = _case(token_rewards, values, trainable, attention, score, gamma, lam)
    adv, ret = compressed_vec(case)
    mean, std = adv.mean(), adv.std()
    return ((adv - mean) / torch.sqrt(std**2 + 1e-8)).to(values.dtype), ret.to(values.dtype)


def crash_at_zero_decay(*, token_rewards, values, trainable, attention, score, gamma, lam):
    """A closed form that rescales by (gamma * lam) ** -t: undefined at gamma * lam = 0."""
    c = gamma * lam
    case = _case(token_rewards, values, trainable, attention, score, gamma, lam)
    t_len = values.shape[1]
    scale = torch.tensor([c ** (-t) if c else float("inf") for t in range(t_len)], dtype=torch.float64)
    adv, ret = compressed_vec(case)
    adv = adv * scale / scale  # inf / inf = nan at c = 0
    return adv.to(values.dtype), ret.to(values.dtype)


def chunked_scan_drops_carry(*, token_rewards, values, trainable, attention, score, gamma, lam):
    """A chunked scan (128 positions per chunk) that forgets the carry between chunks."""
    v = torch.where(trainable > 0, values, 0.0)
    rewards = _place_score(torch.where(trainable > 0, token_rewards, 0.0), score, trainable)
    nxt = torch.cat([v[:, 1:], torch.zeros_like(v[:, :1])], dim=1)
    delta = rewards + gamma * nxt - v
    adv = torch.zeros_like(v)
    for start in range(0, v.shape[1], 128):
        last = torch.zeros_like(v[:, 0])  # bug: should start from the next chunk's advantage
        for t in reversed(range(start, min(start + 128, v.shape[1]))):
            last = delta[:, t] + gamma * lam * last
            adv[:, t] = last
    return adv * trainable, (adv + v) * trainable


def rows_coupled_by_batch_mean(*, token_rewards, values, trainable, attention, score, gamma, lam):
    """Centres the scores on the batch mean over every row, rows without trainable tokens too."""
    case = _case(token_rewards, values, trainable, attention, score - score.mean(), gamma, lam)
    adv, ret = dense_vec(case)
    return adv.to(values.dtype), ret.to(values.dtype)


def carry_left_at_masked_positions(*, token_rewards, values, trainable, attention, score, gamma, lam):
    """Skips observation tokens correctly but leaves the carried advantage at them (not zero)."""
    v = values
    rewards = _place_score(token_rewards, score, trainable)
    b, t_len = v.shape
    adv = torch.zeros_like(v)
    last = torch.zeros(b, dtype=v.dtype)
    nxt = torch.zeros(b, dtype=v.dtype)
    for t in reversed(range(t_len)):
        m = trainable[:, t] > 0
        delta = rewards[:, t] + gamma * nxt - v[:, t]
        new = delta + gamma * lam * last
        last = torch.where(m, new, last)
        nxt = torch.where(m, v[:, t], nxt)
        adv[:, t] = last
    ret = torch.where(trainable > 0, adv + v, 0.0)
    return adv, ret


def nondeterministic_noise(*, token_rewards, values, trainable, attention, score, gamma, lam):
    """Right to within rounding but not bitwise repeatable (a racy reduction order, say)."""
    case = _case(token_rewards, values, trainable, attention, score, gamma, lam)
    adv, ret = compressed_vec(case)
    adv = adv.to(values.dtype)
    flip = torch.rand(adv.shape) < 0.5
    adv = torch.where(flip, torch.nextafter(adv, torch.full_like(adv, float("inf"))), adv)
    return adv * trainable, ret.to(values.dtype)


def segment_reads_last_token_only(*, token_rewards, values, trainable, attention, score, gamma, lam):
    """Per-turn returns that read one reward per turn, at the turn's last token: a reward (a per-token KL
    penalty) anywhere else in the turn is lost (ROLL's compute_agentic_reinforce_return reads
    `sample_rewards[end_idx - 1]` only)."""
    m = trainable > 0
    ends = m.clone()
    ends[:, :-1] &= ~m[:, 1:]
    kept = torch.where(ends, token_rewards, torch.zeros_like(token_rewards))
    case = _case(kept, values, trainable, attention, score, gamma, lam)
    adv, ret = segment_vec(case)
    return adv.to(values.dtype), ret.to(values.dtype)


# -- correct implementations (no finding allowed) ----------------------------------------------
def correct_compressed(*, token_rewards, values, trainable, attention, score, gamma, lam):
    case = _case(token_rewards, values, trainable, attention, score, gamma, lam)
    adv, ret = compressed_vec(case)
    return adv.to(values.dtype), ret.to(values.dtype)


def correct_dense(*, token_rewards, values, trainable, attention, score, gamma, lam):
    case = _case(token_rewards, values, trainable, attention, score, gamma, lam)
    adv, ret = dense_vec(case)
    return adv.to(values.dtype), ret.to(values.dtype)


def correct_segment(*, token_rewards, values, trainable, attention, score, gamma, lam):
    case = _case(token_rewards, values, trainable, attention, score, gamma, lam)
    adv, ret = segment_vec(case)
    return adv.to(values.dtype), ret.to(values.dtype)


def _case(token_rewards, values, trainable, attention, score, gamma, lam) -> Case:
    """Back to a float64 case (inputs are already rounded to the run dtype, so this is exact)."""
    f = lambda x: x.detach().to("cpu", torch.float64)  # noqa: E731
    return Case(
        attention=attention.detach().cpu() > 0,
        trainable=trainable.detach().cpu() > 0,
        token_rewards=f(token_rewards),
        values=f(values),
        score=f(score),
        gamma=gamma,
        lam=lam,
        dtype={
            torch.float32: "float32",
            torch.float64: "float64",
            torch.float16: "float16",
            torch.bfloat16: "bfloat16",
        }[values.dtype],
    )


_WHITENED = Declared(
    "compressed", own_inputs=True, whitening=Whitening(unbiased=True, eps=1e-8), documented_errors=("whitening needs",)
)

# mutant -> (what it declares, the property that must catch it)
CATCHES = {
    values_masked_for_storage_only: (Declared("dense", own_inputs=True), "poison"),
    mask_ignored: (Declared("dense", own_inputs=True), "poison"),
    score_on_last_real_token: (Declared("dense", own_inputs=True), "score-kept"),
    extra_decay_per_masked_token: (Declared("compressed", own_inputs=True), "gap-invariance"),
    nan_leaks_through_multiply: (Declared("dense", own_inputs=True), "poison-nonfinite"),
    off_by_one_bootstrap: (Declared("dense", own_inputs=True), "all-trainable"),
    crash_on_all_masked_row: (Declared("dense", own_inputs=True), "no-crash"),
    whitening_not_mask_weighted: (_WHITENED, "row-independence"),
    crash_at_zero_decay: (Declared("compressed", own_inputs=True), "no-crash"),
    chunked_scan_drops_carry: (Declared("dense", own_inputs=True), "reference"),
    rows_coupled_by_batch_mean: (Declared("dense", own_inputs=True), "all-trainable"),
    carry_left_at_masked_positions: (Declared("compressed", own_inputs=True), "masked-zero"),
    nondeterministic_noise: (Declared("compressed", own_inputs=True), "deterministic"),
    segment_reads_last_token_only: (Declared("segment", own_inputs=True), "reference"),
}
CORRECT = {
    correct_compressed: Declared("compressed", own_inputs=True),
    correct_dense: Declared("dense", own_inputs=True),
    correct_segment: Declared("segment", own_inputs=True),
}


# -- KL in the reward (`oracles.kinds.gae.kl_reward`): mutants that read the case's log-probs ------------------
KL_REWARD = {"coef": 0.1, "estimator": "k1"}
_KL_DECLARED = Declared("compressed", own_inputs=True, variant={"kl_reward": KL_REWARD})


def _kl_scan(case: Case, rewards: torch.Tensor):
    dt = case.torch_dtype
    adv, ret = compressed_vec(case.replace(token_rewards=rewards))
    return adv.to(dt), ret.to(dt)


def kl_reward_sign_flipped(case: Case):
    """The KL penalty added with the wrong sign: a bonus for moving away from the reference."""
    lp, ref = case.extra["logp"], case.extra["ref_logp"]
    kl = torch.where(case.trainable, lp - ref, torch.zeros_like(lp))
    return _kl_scan(case, case.token_rewards + KL_REWARD["coef"] * kl)


def kl_reward_masked_by_multiply(case: Case):
    """kl * mask keeps a NaN log-prob of a masked token, and a row sum of the penalty (a KL metric folded
    back in) carries it to every token of the row."""
    dt = case.torch_dtype
    lp, ref = case.extra["logp"].to(dt), case.extra["ref_logp"].to(dt)
    kl = (lp - ref) * case.trainable.to(dt)
    adv, ret = kl_reward_correct(case)
    leak = kl.sum(1, keepdim=True) * 0
    return adv + leak, ret + leak


def kl_reward_correct(case: Case):
    """The penalty folded in float64 at trainable positions (what the reference does)."""
    lp, ref = case.extra["logp"], case.extra["ref_logp"]
    kl = torch.where(case.trainable, lp - ref, torch.zeros_like(lp))
    return _kl_scan(case, case.token_rewards - KL_REWARD["coef"] * kl)


KL_CATCHES = {kl_reward_sign_flipped: "reference", kl_reward_masked_by_multiply: "poison-nonfinite"}
KL_CORRECT = kl_reward_correct


def as_run(fn):
    """The in-process Run of a canonical-signature function."""

    def run(case: Case):
        return fn(**case.inputs("cpu"))

    run.__name__ = fn.__name__
    return run

# mutant -> the promise its CATCHES finding breaks (None: a fact; the variant, not a promise, differs)
PROMISE = {
    values_masked_for_storage_only: "universal:poison",
    mask_ignored: "universal:poison",
    score_on_last_real_token: "universal:score-kept",
    extra_decay_per_masked_token: None,  # dense instead of compressed: a variant unless the framework says otherwise
    nan_leaks_through_multiply: "universal:poison-nonfinite",
    off_by_one_bootstrap: "https://arxiv.org/abs/1506.02438",  # unmasked, GAE is the paper's formula
    crash_on_all_masked_row: "universal:no-crash",
    whitening_not_mask_weighted: "universal:pad-invariance",
    crash_at_zero_decay: "universal:no-crash",
    chunked_scan_drops_carry: None,  # a wrong recursion under masks: only the framework's own words make it a defect
    rows_coupled_by_batch_mean: "https://arxiv.org/abs/1506.02438",
    carry_left_at_masked_positions: None,  # masked positions' contents: a defect only where a consumer reads them
    nondeterministic_noise: "universal:deterministic",
    segment_reads_last_token_only: None,
}

# mutant -> the mechanism `oracles.kinds.gae.diagnosis` must name for the finding of its CATCHES property
MECHANISM = {
    values_masked_for_storage_only: "masked-value-bootstrap",
    mask_ignored: "masked-value-bootstrap",
    score_on_last_real_token: "score-lost",
    extra_decay_per_masked_token: "extra-decay",
    nan_leaks_through_multiply: "nan-through-mask",
    off_by_one_bootstrap: "unexplained",
    crash_on_all_masked_row: "crash-degenerate",
    whitening_not_mask_weighted: "masked-statistics",
    crash_at_zero_decay: "crash-degenerate",
    chunked_scan_drops_carry: "unexplained",
    rows_coupled_by_batch_mean: "score-lost",  # shrunk to one row, centring on the batch mean drops the score
    carry_left_at_masked_positions: "masked-nonzero",
    nondeterministic_noise: "nondeterminism",
    segment_reads_last_token_only: "turn-reward-lost",
}

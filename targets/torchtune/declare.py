"""torchtune (`torchtune.rlhf`, the PPO utilities of its PPO recipe), from its release wheels: the SPEC the fuzzer
reads. The worker's calls are `calls.py` (GAE) and `calls_kinds.py` (the other kinds).

`estimate_advantages(values, rewards, gamma, lmbda, masks)` (torchtune/rlhf/rewards.py:164-220 at 0.6.1) runs the
textbook GAE loop over every position of the response window with V = 0 after it, returns = advantages + values,
then whitens the advantages over the positions `masks` marks (`whiten`, unbiased variance, eps 1e-8 inside the
rsqrt, and at its default `shift_mean=True` the mean added back, :158-160) and zeroes them where `masks` is False
(:217-218). The masks enter nowhere else: values and rewards at masked positions are the caller's business (the PPO
recipe zeroes the padded values and sets padded log-probs to 1.0 so the KL reward is 0 there,
recipes/ppo_full_finetune_single_device.py:852-853, 865). So the contract is `dense` on inputs that are 0 under the
mask, which is the api domain below. The score is placed by the same module's `get_rewards_ppo` (scattered to
`valid_score_idxs`, :87-92), given the last trainable position.

Pins: 0.6.1 (newest, default) and 0.6.0 share the code; 0.5.0 and 0.3.1 (the first release with `torchtune/rlhf`)
share the older variant: `masked_mean` divides by `mask.sum()` without the 1e-8 (rewards.py:116 there) and
`masked_var` raises ValueError on an empty mask (:141-146; `whiten` only calls it when `mask.any()`, :170).
0.2.1 has no `torchtune.rlhf` (a NotPresent skip).

Pipeline: not researched field by field (`pipeline=None`, every finding is `reach: api`). Noted for the reader: the
PPO recipe puts the score at `seq_lens + 1`, one position after the last response token (recipes/
ppo_full_finetune_single_device.py:856-860, passed as valid_score_idxs at :945-951) while `masks` is the response
mask (:959), so in the recipe the score sits at a masked position whose value is kept (:861-865).
"""

from __future__ import annotations

from maskfuzz.oracles.domain import Domain
from maskfuzz.oracles.promises import Promise
from maskfuzz.oracles.whitening import Whitening
from maskfuzz.targets.registry import COMMON_HEAVY, Pin, TargetSpec
from maskfuzz.targets.torchtune.calls_kinds import EPSILON, KL_COEFF, VALUE_CLIP

_RW = "torchtune/rlhf/rewards.py"
_PPO = "torchtune/rlhf/loss/ppo.py"
_RECIPE = "recipes/ppo_full_finetune_single_device.py"
NEW, OLD = ("0.6.1", "0.6.0"), ("0.5.0", "0.3.1")  # the two variants of rewards.py (lines differ)

# heavy packages `import torchtune` pulls in (torchtune/__init__.py:16 torchao, :38 datasets / models / ...) that
# the rlhf math never touches; found by the stand-in finder at 0.6.1, 0.5.0 and 0.3.1
STAND_INS = (*COMMON_HEAVY, "torchao", "torchdata", "sentencepiece", "tiktoken", "tokenizers")

# ---- GAE ---------------------------------------------------------------------------------------------------------
_MASK_ONLY_STATS = (
    "estimate_advantages takes no mask for its recursion: `masks` is 'A bool mask tensor, where True indicates the "
    "corresponding value in ``values`` should participate in the mean calculation' (0.6.1 torchtune/rlhf/rewards.py:"
    "180-181; 0.5.0 :195-196), used only by whiten (:216) and to zero the advantages (:217-218); the loop reads "
    "values[:, t + 1] and rewards[:, t] at every position (:197-206): the caller zeroes them under the mask "
    "(recipes/ppo_full_finetune_single_device.py:852-853, 865)"
)
GAE_DOMAIN = Domain(
    masked_values=False,
    masked_rewards=False,
    nonfinite_poison=False,
    why={"masked_values": _MASK_ONLY_STATS, "masked_rewards": _MASK_ONLY_STATS, "nonfinite_poison": _MASK_ONLY_STATS},
)
_GAE_DOC = (
    "Estimates the advantages and returns for the PPO algorithm using Generalized Advantage Estimation "
    "https://arxiv.org/pdf/1506.02438.pdf"
)
GAE_PROMISES = tuple(
    Promise(
        id=f"upstream:{_RW}:{lines}",
        text=_GAE_DOC,
        covers=("reference", "telescoping", "score-kept", "all-trainable"),
        note="GAE over the response window with V = 0 after it (rewards.py loop), whitened over the masked-in "
        "positions: the dense recursion on inputs that are 0 under the mask",
        pins=pins,
    )
    for pins, lines in ((NEW, "172-173"), (OLD, "187-188"))
)
_MASKS_DOC = (
    "masks (Optional[torch.Tensor]): A bool mask tensor, where True indicates the corresponding value in ``values`` "
    "should participate in the mean calculation."
)
GAE_PROMISES += tuple(
    Promise(
        id=f"upstream:{_RW}:{lines}",
        text=_MASKS_DOC,
        covers=("reference", "row-independence"),
        note="the whitening statistics come from the masked-in positions only",
        pins=pins,
    )
    for pins, lines in ((NEW, "180-181"), (OLD, "195-196"))
)

# ---- the other kinds -----------------------------------------------------------------------------------------------
_WHITEN_DOC = (
    "Whiten (normalises) values, optionally with masked values. [...] mask (Optional[torch.Tensor]): The bool mask "
    "tensor [...] where True indicates the corresponding value in ``x`` should participate in the mean calculation."
)
_PADDING_DOC = (
    "padding_masks (Optional[torch.Tensor]): Padding token masks of the same shape as ``pi_logprobs``, where True "
    "indicates the corresponding loss values should participage in policy loss calculation."
)
_VALUE_PADDING_DOC = (
    "value_padding_masks (Optional[torch.Tensor]): Padding token masks of the same shape as ``pi_logprobs``, where "
    "True indicates the corresponding loss values should participage in value loss calculation."
)
# one process, equal micro-batches: ppo_backward_batch_size = ppo_batch_size // gradient_accumulation_steps
_SPLITS = Domain(
    uneven_splits=False,
    why={
        "uneven_splits": f"one device, equal micro-batches: 0.6.1 {_RECIPE}:389-391 (ppo_backward_batch_size = "
        "ppo_batch_size // gradient_accumulation_steps), :404-408 (a remainder raises), :971-976 (the backward "
        "batches)"
    },
)
# the policy loss's inputs are log-probabilities (ppo.py:59-60 "Log probabilities of the old policy." / "of the
# current policy."), at masked positions too: the recipe sets both to 1.0 there (recipe :852, :1090), ratio 1
_POLICY_DOMAIN = Domain(
    uneven_splits=False,
    masked_logprobs=False,
    why={
        **_SPLITS.why,
        "masked_logprobs": f"0.6.1 {_PPO}:59-60 pi_old_logprobs / pi_logprobs are 'Log probabilities of the old "
        f"policy' / 'of the current policy'; the recipe sets both to 1.0 under the mask ({_RECIPE}:852, 1090)",
    },
)
_LOSS_COMMON = dict(
    masked_zero=True,  # masked_mean multiplies by the mask (rewards.py:112): d loss / d input = 0 there
    masked_zero_why="",
    documented_errors=(),
    whitening=None,
    truncation=None,
    domain=_SPLITS,
    pipeline=None,  # not researched: every finding is reach: api
    pipeline_by_pin={},
    contract="dense",
)

ENTRY_OVERRIDES: dict = {
    "default": {"promises": GAE_PROMISES},
    "whiten": dict(
        kind="normalization",
        # batch statistics over the mask, unbiased (masked_var's Bessel correction, rewards.py:132-135), eps 1e-8
        # inside the rsqrt (:158); torchtune's shift_mean=True adds the mean back (:159-160): maskfuzz's
        # shift_mean=False. At 0.6.1 masked_mean divides by mask.sum() + 1e-8 (:112), a float32 tensor: n for n >= 1
        variant={"level": "batch", "unbiased": True, "eps": 1e-8, "eps_place": "var", "shift_mean": False},
        masked_zero=False,
        masked_zero_why=f"{_RW}:158 (0.6.1) whiten returns (x - mean) * rsqrt(var + eps) at every position; "
        "estimate_advantages zeroes the masked ones itself (:217-218)",
        documented_errors=(),
        whitening=None,
        domain=Domain(),
        pipeline=None,
        pipeline_by_pin={},
        contract="dense",
        promises=tuple(
            Promise(
                id=f"upstream:{_RW}:{lines}",
                text=_WHITEN_DOC,
                covers=("reference", "poison", "pad-invariance"),
                note="the statistics come from the masked-in values only",
                pins=pins,
            )
            for pins, lines in ((NEW, "143-147"), (OLD, "158-162"))
        ),
        notes="whiten(x, mask=trainable), shift_mean=True (the mean added back)",
    ),
    "kl": dict(
        kind="kl",
        variant={"estimator": "k1"},  # kl = logprobs - ref_logprobs (rewards.py:79 at 0.6.1, :83 at 0.5.0)
        masked_zero=False,
        masked_zero_why=f"{_RW}:79 (0.6.1) get_rewards_ppo takes no mask: the recipe sets the padded log-probs of "
        f"both policies to 1.0 so the KL is 0 there ({_RECIPE}:852-853)",
        documented_errors=(),
        whitening=None,
        domain=Domain(),
        pipeline=None,
        pipeline_by_pin={},
        contract="dense",
        promises=(
            Promise(
                id=f"upstream:{_RW}:71",
                text="kl: kl divergence between policy and reference policy logprobs.",
                covers=("reference",),
                note="get_rewards_ppo's returned kl: the log-ratio per token (k1)",
            ),
        ),
        notes="the kl output of get_rewards_ppo(0, logp, ref_logp, kl_coeff=0.01)",
    ),
    "token-reward": dict(
        kind="token-reward",
        # total_reward = -kl_coeff * (logprobs - ref_logprobs), the score scatter-added at valid_score_idxs
        # (rewards.py:79-92 at 0.6.1; :83-96 at 0.5.0 / 0.3.1); kl_coeff 0.01 (the PPO config's kl_coeff,
        # recipes/configs/mistral/7B_full_ppo_low_memory.yaml:176); no score clip
        variant={"kl_coef": KL_COEFF, "score_clip": None, "score_at": "last-trainable"},
        masked_zero=False,
        masked_zero_why=f"{_RW}:79-82 (0.6.1) get_rewards_ppo takes no mask: -kl_coeff * kl at every position; the "
        f"recipe sets the padded log-probs of both policies to 1.0 so the KL is 0 there ({_RECIPE}:852-853)",
        documented_errors=(),
        whitening=None,
        domain=Domain(),
        pipeline=None,  # not researched: every finding is reach: api
        pipeline_by_pin={},
        contract="dense",
        options=(),
        promises=(
            Promise(
                id=f"upstream:{_RW}:64-66",
                text="valid_score_idxs (Optional[torch.Tensor]): A tensor of indexes for valid (non-padded) token "
                "predictions. This is useful when calculating rewards for padded sequences, as scores and value "
                "estimates are defined for the last valid predicted token.",
                covers=("reference",),
                note="the score lands on the index given, the last valid (trainable) token",
            ),
            Promise(
                id=f"upstream:{_RW}:70",
                text="total_reward: total reward combining per-token kl rewards and reward model score.",
                covers=("reference",),
                note="-kl_coeff * kl per token plus the score",
            ),
        ),
        notes=f"get_rewards_ppo(score, logprobs=kl, ref_logprobs=0, kl_coeff={KL_COEFF}, valid_score_idxs=the last "
        "trainable index), the total_reward output. Not fuzzed here: "
        f"the PPO recipe passes value_seq_idxs = seq_lens + 1, one past the last response token ({_RECIPE}:856-860, "
        "945-951), a masked position its dense GAE reads (the default entry's business)",
    ),
    "policy-loss": dict(
        kind="policy-loss",
        # ratios = exp(pi - old), clamp(1 - eps, 1 + eps), max(-A r, -A clip(r)) (ppo.py:79-94), masked_mean over
        # padding_masks (:95-99): the token mean of the micro-batch; the recipe divides by the accumulation steps
        variant={
            "clip_low": EPSILON,
            "clip_high": EPSILON,
            "dual_clip": None,
            "advantages": "token",
            "mode": "token-mean",
            "scope": "micro-batch",
        },
        options=(),
        promises=(
            Promise(
                id=f"upstream:{_PPO}:65-66",
                text=_PADDING_DOC,
                covers=("reference", "poison", "pad-invariance"),
                note="only the masked-in positions participate in the policy loss",
            ),
        ),
        notes=f"PPOLoss(epsilon={EPSILON}, value_clip_range={VALUE_CLIP}) per micro-batch, total loss with the value "
        "inputs at 0; / accumulation steps",
        **{**_LOSS_COMMON, "domain": _POLICY_DOMAIN},
    ),
    "value-loss": dict(
        kind="value-loss",
        # v_c = clamp(v, v_old - c, v_old + c), max((v - R)^2, (v_c - R)^2), 0.5 * masked_mean over
        # value_padding_masks (ppo.py:101-113)
        variant={"clip": VALUE_CLIP, "half": True, "mode": "token-mean", "scope": "micro-batch"},
        options=(),
        promises=(
            Promise(
                id=f"upstream:{_PPO}:67-68",
                text=_VALUE_PADDING_DOC,
                covers=("reference", "poison", "pad-invariance"),
                note="only the masked-in positions participate in the value loss",
            ),
        ),
        notes=f"PPOLoss(epsilon={EPSILON}, value_clip_range={VALUE_CLIP}, value_coeff=1.0) per micro-batch, total "
        "loss with the log-probs and advantages at 0; / accumulation steps",
        **_LOSS_COMMON,
    ),
}

SPEC = TargetSpec(
    id="torchtune",
    adapter="maskfuzz.targets.torchtune.calls",
    own=("torchtune",),
    contract="dense",
    package="torchtune",  # a pure-python wheel (py3-none-any): no pip_args
    pins=(
        Pin("0.6.1", "latest torchtune release", default=True),
        Pin("0.6.0", "the release that added the 1e-8 to masked_mean's denominator (rewards.py:112)"),
        Pin(
            "0.5.0",
            "last release of the older rewards.py: masked_mean without eps, masked_var raising on an empty mask",
        ),
        Pin("0.3.1", "oldest release line with torchtune/rlhf (0.2.x has none)"),
    ),
    entries=tuple(ENTRY_OVERRIDES),
    entry_overrides=ENTRY_OVERRIDES,
    first_run=("default", "policy-loss"),
    whitening=Whitening(unbiased=True, eps=1e-8, shift_mean=False),  # torchtune's shift_mean=True: mean added back
    masked_zero=True,  # advantages[~masks] = 0.0 (0.6.1 rewards.py:217-218; 0.5.0 :232-233)
    masked_zero_why="",
    documented_errors=(),
    stand_ins=STAND_INS,
    domain=GAE_DOMAIN,
    pipeline=None,  # not researched: every finding is reach: api
    notes="rewards = get_rewards_ppo(score, logprobs=-token_rewards, ref=0, kl_coeff=1, valid_score_idxs=last "
    "trainable); estimate_advantages(values, rewards, gamma, lam, masks=trainable)",
)

"""OpenRLHF's `token-reward` entry: `openrlhf/models/utils.py::compute_reward`, the per-token reward every
advantage estimator of the experience maker starts from (0.11.2 experience_maker.py:284-290), declared apart from
`declare.py` (which reads it into its ENTRY_OVERRIDES). The worker's call is `calls_kinds.load_token_reward`.

compute_reward has no docstring; its contract is the comment above its placement, the same words at every pin
(0.11.2 models/utils.py:145-153, 0.6.3 :67-75, 0.3.6.post1 :44-52): the score goes to the last position whose
action mask is > 0.5, the loop it says the vectorised `eos_indices` scatter is equivalent to. The KL term
`-kl_coef * kl` is added at every position (0.11.2 :144, :157): compute_reward does not mask it (from 0.5.0 the
caller's compute_approx_kl does not either; at 0.3.6.post1 and 0.6.3 compute_approx_kl multiplies the log-ratio by
the action mask), and a row without an action token gets its score at T - 1 (argmax of an all-zero row is 0), a
masked position. So masked positions are not promised zeros. The score is clamped first: `reward_clip_range`
(from 0.5.0; the CLI default (-10, 10), 0.6.3 cli/train_ppo_ray.py:349, 0.11.2 :474, passed by the adapter), and
unconditionally to [-10, 10] at 0.3.6.post1 (:42): the variant's `score_clip`. kl_coef is the CLI default 0.01
(--init_kl_coef 0.6.3 :337, --algo.kl.init_coef 0.11.2 :438; a fixed controller without a KL target).

Pipeline: the KL entries' (`declare.py` `_PIPELINE_LOGP`, passed in by `token_reward_entry`): the 0.11.2
experiences' window (gaps, observation tails, leading prompt tokens: produced, cited there), float32, right-padded,
nothing non-finite under the mask (the models multiply the action log-probs by the mask, so the KL there is 0).
"""

from __future__ import annotations

from maskfuzz.oracles.domain import Domain
from maskfuzz.oracles.promises import Promise
from maskfuzz.targets.openrlhf.calls_kinds import TOKEN_REWARD_CLIP, TOKEN_REWARD_KL_COEF

_UT = "openrlhf/models/utils.py"
_PLACEMENT_COMMENT = (
    "# The following code is equivalent to: # # last_reward = torch.zeros_like(kl) # for i in "
    "range(last_reward.size(0)): # for t in reversed(range(last_reward.size(1))): # if action_mask[i][t] > 0.5: "
    "# last_reward[i][t] = r[i] # break #"
)


def token_reward_entry(pipeline: Domain) -> dict:
    """The entry, with the pipeline domain of the experiences compute_reward reads (the KL entries')."""
    return dict(TOKEN_REWARD, pipeline=pipeline)


TOKEN_REWARD = dict(
    kind="token-reward",
    variant={"kl_coef": TOKEN_REWARD_KL_COEF, "score_clip": TOKEN_REWARD_CLIP, "score_at": "last-trainable"},
    masked_zero=False,
    masked_zero_why=f"0.11.2 {_UT}:144, 154-157 compute_reward adds -kl_coef * kl at every position and puts a row "
    "without an action token's score at T - 1: nothing in OpenRLHF promises zeros there (get_cumulative_returns "
    "and get_advantages_and_returns multiply by the action mask, 0.11.2 experience_maker.py:378, 415)",
    documented_errors=(),
    whitening=None,
    domain=Domain(),
    pipeline=None,  # token_reward_entry gives the pipeline
    pipeline_by_pin={},
    contract="dense",
    options=(),
    truncation=None,
    promises=tuple(
        Promise(
            id=f"upstream:{_UT}:{lines}",
            text=_PLACEMENT_COMMENT,
            covers=("reference",),
            note="the score on the last action-mask token of its row (a code comment, the only statement of the "
            "placement), plus -kl_coef * kl per token (the next line: reward = last_reward + kl_reward)",
            pins=(pin,),
        )
        for pin, lines in (("0.11.2", "145-153"), ("0.6.3", "67-75"), ("0.3.6.post1", "44-52"))
    ),
    notes=f"compute_reward(score, kl_coef={TOKEN_REWARD_KL_COEF}, kl, action_mask=trainable, reward_clip_range="
    f"{TOKEN_REWARD_CLIP}) (0.3.6.post1: log_probs=kl, log_probs_base=0; the clamp built in)",
)

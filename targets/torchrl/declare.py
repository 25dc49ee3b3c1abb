"""Adapter for torchrl: the functional GAE in `torchrl/objectives/value/functional.py` and the `GAE` module.

Entries: "default" is `generalized_advantage_estimate` (a reverse loop), "vec" is
`vec_generalized_advantage_estimate` (with scalar gamma and lambda it runs `_fast_vec_gae`: rows are
split into trajectories at `done`, padded, and filtered with a truncated geometric series), "module" is the
`GAE` value estimator of `torchrl/objectives/value/advantages.py` (what `ClipPPOLoss.make_value_estimator` and
the PPO recipes build) with `value_network=None` (the values already in the tensordict) and its options
`average_gae` (standardise the advantages) and `vectorized` (the vec functional instead of the loop).

Truncated rows (cut by the length limit, no EOS): torchrl separates `terminated` (end of the episode: zero
bootstrap) from `done` (end of the trajectory: the lambda recursion stops), so a row cut by the length limit
is `done` but not `terminated` at its last trainable token and the functional reads `next_state_value` there
(`gamma * (~terminated) * next_state_value`). The adapter puts the case's bootstrap value (the critic value of
the state after the last token, as a rollout with a critic gives `("next", "state_value")`) there and sets
`("next", "truncated")` for the module; every other position is as below.

torchrl has no token mask. The episode is described by `done` / `terminated` flags, so an LLM row
maps onto one trajectory that ends at its last trainable token:

    reward[b, t, 0]           token_rewards[b, t], plus the score at the last trainable token L_b
    state_value[b, t, 0]      values[b, t]
    next_state_value[b, t, 0] values[b, t + 1], and 0 after the end of the row (t = T - 1)
    done = terminated         True at t = L_b only (rows without a trainable token have no flag)

`terminated` at L_b gives the zero bootstrap after the last trainable token (the value at L_b + 1
is multiplied by 0) and `done` cuts the lambda recursion there, so what follows L_b (an
observation tail, padding) is, for torchrl, the start of another trajectory that never reaches the
trainable tokens. Positions before the first trainable token (a masked head, left padding) only
feed advantages at earlier positions. The inputs this mapping can *not* express are gaps: a
non-trainable token between trainable ones would be an ordinary transition with its (poison)
value and reward, because torchrl has nothing to mark it. `SPEC.domain` excludes gaps for that
reason, and the contract is `dense` (every position of the trajectory is a transition).

torchrl computes advantages at every position, so positions after `done` get the advantages of
their own trajectory: `masked_zero=False`.

Importing `torchrl` with a torch it was not built against only warns about its C++ extension
(`torchrl._torchrl`, used by prioritized replay buffers); the functional GAE is pure torch.
Releases 0.2.0 and 0.4.0 do not import with torch 2.13 / tensordict 0.15 (0.2 loads the extension
eagerly, 0.4 needs `tensordict._tensordict`), so the release pins start at 0.6.0.

Pipeline domain. torchrl is a general RL library: its LLM stack (torchrl/envs/llm, objectives/llm: GRPO, SFT,
distillation) never calls GAE, so the pipeline is the classic one: collectors hand contiguous [B, T] batches in
which `done` falls anywhere (what follows it is the next episode, what precedes the first step is the end of
the previous one, a row may hold no `done`), and the `GAE` module calls the functional with value-network
outputs at `obs` and `("next", obs)`. Dtypes, rewards and values are whatever the user's env and networks make,
so everything the api domain allows stays permissive, with one fact per pin: `AutoResetTransform` fills the
`("next", obs)` of a done step with NaN by default (`fill_float="nan"`), so V(next) is NaN exactly where the
functional multiplies it by `not_terminated`; at 0.6.0 .. 0.12.0 the GAE module passes it through
(non-finite poison reachable), from 0.14.1 (and git main) `_sanitize_next_obs_nan` replaces NaN next
observations before the value network (`pipeline_by_pin`: non-finite poison narrowed). `gaps` stays excluded as
in the api domain (no token mask to express them).
"""

from __future__ import annotations

import dataclasses

from maskfuzz.oracles.domain import Domain
from maskfuzz.oracles.promises import Promise
from maskfuzz.oracles.whitening import Whitening
from maskfuzz.targets.registry import Option, Pin, TargetSpec, Truncation
from maskfuzz.targets.torchrl.calls_kinds import VALUE_CLIP

# Truncation (0.14.1 lines; the same code at every pin and at git main): `terminated` cuts the bootstrap,
# `done` cuts the lambda recursion; a step that is `done` but not `terminated` (a trajectory truncated by the
# time limit) still reads `next_state_value` there.
_FUNCTIONAL = "torchrl/objectives/value/functional.py"
_TRUNCATION = Truncation(
    bootstrap="value",
    cite=f"{_FUNCTIONAL}:164-172 (loop: delta = reward + gamma * (~terminated) * next_state_value - state_value, "
    "discount = lmbda * gamma * (~done)), :250-251 (vec, _fast_vec_gae); docstring :142-144 (done: end of "
    "trajectory, terminated: end of episode)",
)
_ADV = "torchrl/objectives/value/advantages.py"
# Options of the GAE module (entry "module"); lines at 0.14.1 (0.6.0 in parentheses, git main in brackets).
_OPTIONS = (
    Option(
        "average_gae",
        (False, True),
        False,
        f"{_ADV}:2338-2341 -> _normalize_advantage :2390-2393 (0.6.0: :1373-1377) [2243, 2287-2288]",
        "if True, the resulting GAE values will be standardized (advantages.py:1972-1973): (adv - mean) / "
        "std.clamp_min(1e-4), torch .std() unbiased",
        # max(std, 1e-4) = sqrt(max(var, 1e-8)): the floor placement; the statistics are the batch's advantages,
        # which for a masked batch are those of its trainable tokens
        effect={True: {"whitening": Whitening(unbiased=True, eps=1e-8, floor=True)}},
    ),
    Option(
        "vectorized",
        (False, True),
        False,
        f"{_ADV}:2147, 2315-2336 (0.6.0 default True) [2220]",
        "whether to use the vectorized version of the lambda return (the default None runs the loop: "
        "`if self.vectorized:` at :2315); the same GAE either way",
    ),
)

# Entries beyond GAE (targets/torchrl/calls_kinds.py). Lines at 0.14.1 (git main ae9719f17b15 in brackets).
_GRPO = "torchrl/objectives/llm/grpo.py"
_KLPY = "torchrl/envs/llm/transforms/kl.py"
_PER_TRAJECTORY = (
    f"{_GRPO}:1502-1514 [1511-1523] MCAdvantage sets one advantage per trajectory (the reward's shape) and no token "
    "mask; the adapter broadcasts it to every position of the row, GRPOLoss applies the assistant mask later"
)
_GROUP_ERRORS = (r"GroupShapeError",)
# MCAdvantage.__init__ (grpo.py:1165-1170 [1174-1179]): the trajectory-return branch refuses grpo_size < 2
_SUM_ERRORS = (r"GroupShapeError", r"ValueError: trajectory_return requires grpo_size >= 2")


def _group_entry(errors: tuple[str, ...], notes: str) -> dict:
    return dict(
        kind="group-advantage",
        # (r - mean_g) / std_g.clamp_min(1e-6), torch .std() unbiased (grpo.py:1508-1511 per-step, 1583 sum
        # [1517-1520, 1592]): the floor placement max(std, 1e-6)
        variant={"estimator": "grpo", "std": "unbiased", "eps": 1e-6, "eps_place": "floor"},
        domain=Domain(),
        pipeline=Domain(),
        pipeline_by_pin={},
        masked_zero=False,
        masked_zero_why=_PER_TRAJECTORY,
        documented_errors=errors,
        whitening=None,
        contract="dense",
        notes=notes,
    )


# The GRPO recipes sample equal micro-batches on one process: optim_batch_size must be a multiple of the accumulation
# steps and the buffer samples optim_batch_size // gradient_accumulation_steps rows per micro-batch
GRPO_SPLITS = Domain(
    uneven_splits=False,
    why={
        "uneven_splits": "equal-row micro-batches on one process: 0.14.1 sota-implementations/grpo/grpo-sync.py:"
        "276-279 (optim_batch_size % gradient_accumulation_steps != 0 raises) and :292-294 (the replay buffer's "
        "batch_size = optim_batch_size // gradient_accumulation_steps); 0.12.0 :370-373, :386-388; git main :388, :405"
    },
)


def _agg_entry(mode: str, why: str) -> dict:
    return dict(
        kind="loss-aggregation",
        # GRPOLoss normalises each call by itself and takes no global normaliser; the trainer calls it per micro-batch
        # and divides by the accumulation steps (0.14.1 torchrl/trainers/trainers.py:472-479): scope "micro-batch"
        variant={"mode": mode, "scope": "micro-batch"},
        # dL/dl at masked positions is 0: token_mean selects with torch.where (0.14.1: torchrl/objectives/common.py:368)
        # or boolean indexing (0.12.0: torchrl/objectives/utils.py:663-664), prompt_mean multiplies by the mask
        # (grpo.py:807 [799]); NaN under the mask is judged by poison-nonfinite
        masked_zero=True,
        masked_zero_why="",
        documented_errors=(),
        whitening=None,
        domain=GRPO_SPLITS,
        pipeline=None,  # not researched: every finding is reach: api
        pipeline_by_pin={},
        contract="dense",
        notes=why,
    )


ENTRY_OVERRIDES = {
    "default": {"truncation": _TRUNCATION},
    "vec": {"truncation": _TRUNCATION},
    "module": {"truncation": _TRUNCATION, "options": _OPTIONS},
    "mc-advantage": _group_entry(
        _GROUP_ERRORS,
        "MCAdvantage per-step branch (trajectory_return=None, the LLM GRPO default, grpo-sync.py:291): one-step "
        "trajectories, reward = score; one grpo_size for every group (unequal sizes: GroupShapeError)",
    ),
    "mc-advantage-sum": {
        **_group_entry(
            _SUM_ERRORS,
            "MCAdvantage trajectory branch (trajectory_return='sum', the VLA GRPO recipe): returns summed per "
            "trajectory, normalised over the group; grpo_size < 2 refused at construction",
        ),
        # the framework's default is None, the per-step branch: the `mc-advantage` entry; this entry is the
        # trajectory branch, whose reductions are sum (the VLA recipe), max and mean
        "options": (
            Option(
                "trajectory_return",
                ("sum", "max", "mean"),
                "sum",
                f"{_GRPO}:1153, 1518-1523 [1162, 1527-1532]",
                "reduces each trajectory's rewards to a scalar return (sum, max or mean), normalizes the returns "
                "across the group (grpo.py:1089-1092); a one-step trajectory (one dialog turn, the adapter's "
                "layout) has the same return under all three",
            ),
        ),
    },
    "kl": dict(
        kind="kl",
        # kl.py:1558-1563 [1493-1496] k1: gen_lp - ref_lp; 0.14.1 zeroes positions where either is NaN
        variant={"estimator": "k1"},
        domain=Domain(),
        pipeline=Domain(),
        pipeline_by_pin={},
        masked_zero=False,
        masked_zero_why=f"{_KLPY}:1530-1563 KLComputation takes no mask: it relies on RetrieveLogProb having "
        f"zero-filled the non-assistant log-probs ({_KLPY}:805-838)",
        documented_errors=(),
        whitening=None,
        contract="dense",
        notes="KLComputation k1 per token, add_to_reward=False",
    ),
    # GRPOLoss._aggregate_loss_value (grpo.py:784-816 at 0.14.1, 506-532 at 0.12.0 [776-808]) on one micro-batch;
    # GRPOLoss docstring grpo.py:400-403 at 0.14.1: "token_mean": global masked token mean (of the call);
    "agg-token-mean": {
        **_agg_entry("token-mean", "GRPOLoss(aggregation='token_mean')._aggregate_loss_value per micro-batch"),
        "options": (
            Option(
                "aggregation",
                ("token_mean", "prompt_mean"),
                "token_mean",
                f"{_GRPO}:500, 523, 800-816 (0.12.0: :204, 225, 523) [489, 510, 796]",
                "token_mean: global masked token mean; prompt_mean: per-sample masked mean over tokens, then "
                "mean across samples (equal sample weight) (grpo.py:400-402); 'none' (per-token output) is not "
                "a scalar loss and is not declared",
                effect={"prompt_mean": {"variant": {"mode": "seq-mean-token-mean", "empty_rows": "counted"}}},
            ),
        ),
    },
    # "prompt_mean": "per-sample masked mean over tokens, then mean across samples (equal sample weight)": a row
    # (sample) mean, i.e. seq-mean-token-mean, not a mean over prompt groups. Every sample counts, one without a token
    # too (token_count.clamp_min(1) then .mean(dim=0), grpo.py:808-810 [800-802]), as "mean across samples (equal
    # sample weight)" says: empty_rows "counted" (issue 24), the variant the code implements
    "agg-prompt-mean": {
        **_agg_entry(
            "seq-mean-token-mean", "GRPOLoss(aggregation='prompt_mean')._aggregate_loss_value per micro-batch"
        ),
        "variant": {"mode": "seq-mean-token-mean", "empty_rows": "counted", "scope": "micro-batch"},
    },
    # GRPOLoss._kl_to_ref (grpo.py:868-922 at 0.14.1): the k3 KL of the masked log-ratio, then .mean() (:920);
    # its aggregation is the same call's token mean (the KL term joins the token_mean loss keys, :738-763)
    "kl-to-ref": {
        **_agg_entry("token-mean", "GRPOLoss._kl_to_ref per micro-batch: expm1(d) - d of the masked log-ratio"),
        "variant": {"mode": "token-mean", "transform": "k3", "scope": "micro-batch"},
    },
}

# ClipPPOLoss's critic loss (torchrl_kinds.load_value). Lines at 0.14.1, git main ae9719f17b15 in brackets.
_PPO = "torchrl/objectives/ppo.py"
_COMMON = "torchrl/objectives/common.py"
_VALUE_OPTIONS = (
    # torchrl's default is None (no value clip, ppo.py:1466 [1246]) and the PPO recipes leave it unset
    # (sota-implementations/ppo/ppo_mujoco.py:180-188 at main); this entry's base configuration is the clipped
    # loss (clip_value=True -> clip_epsilon 0.2, ppo.py:1473-1480 [1251-1258]), None the unclipped one
    Option(
        "clip_value",
        (0.2, None),
        0.2,
        f"{_PPO}:653 (buffer), 960-967, 1000-1008 in loss_critic [590, 837-845, 877-885]; "
        "torchrl/objectives/utils.py:1053-1079 _clip_value_loss [933-959]",
        "'If a float is provided, it will be used to compute a clipped version of the value prediction with "
        "respect to the input tensordict value estimate' (ppo.py:1342): max((v - R)^2, (v_old + clamp(v - v_old, "
        "-c, c) - R)^2); None: (v - R)^2",
        effect={None: {"variant": {"clip": float("inf")}}},
    ),
    Option(
        "reduction",
        ("mean", "sum"),
        "mean",
        f"{_PPO}:529, 560-561, 602 [484, 513-514, 546] -> {_COMMON}:340-377 _reduce_loss (masked mean :374, "
        "sum :376) [same lines]",
        "'mean: the sum of the output will be divided by the number of elements in the output, sum: the output "
        "will be summed' (ppo.py:219-222); with a loss mask: the sum over the mask / mask.sum().clamp_min(1)",
        effect={"sum": {"variant": {"mode": "token-sum"}}},
    ),
)
_VALUE_ENTRY = dict(
    kind="value-loss",
    # loss_critic_type="l2": F.mse_loss(v1, v2, reduction="none") = (v - R)^2 with no 1/2 (utils.py:357-358 [355-356];
    # the PPO recipes' value, main sota-implementations/ppo/config_mujoco.yaml:43); the clip as in _clip_value_loss
    # (utils.py:1067-1078 [947-958]); reduction "mean" through the loss mask: the token mean of the micro-batch, as
    # documented per call ("divided by the number of elements in the output", ppo.py:219-222) and no global
    # normaliser to pass (_reduce_loss, common.py:340-347): scope "micro-batch", each / the accumulation steps
    # (0.14.1 trainers.py:472-479)
    variant={"clip": VALUE_CLIP, "half": False, "mode": "token-mean", "scope": "micro-batch"},
    # _reduce_loss selects with torch.where(mask, loss, 0) (common.py:368): dl/dv = 0 at masked positions
    masked_zero=True,
    masked_zero_why="",
    options=_VALUE_OPTIONS,
    documented_errors=(),
    whitening=None,
    truncation=None,  # the value targets are given; a cut row is a row like another for the critic loss
    # api: ClipPPOLoss takes any [b, T] batch with a bool ("collector", "mask") (AUTO_LOSS_MASK_KEYS, common.py:41,
    # read :359-363, broadcast by _expand_loss_mask :320-338): gaps, padding and empty rows are expressible
    domain=Domain(),
    pipeline=None,  # not researched: every finding is reach: api
    pipeline_by_pin={},
    contract="dense",
    notes="ClipPPOLoss(clip_value, loss_critic_type='l2', reduction)(td)['loss_critic'] per micro-batch, the loss "
    "mask as ('collector', 'mask'); / accumulation steps",
)
ENTRY_OVERRIDES["value-loss"] = _VALUE_ENTRY

# GRPOLoss's clipped policy objective (torchrl_kinds.load_policy). Lines at 0.14.1, 0.12.0 in parentheses.
# clip_epsilon 0.2 (symmetric, grpo.py:498 (202)): the log-weight clamped to [log(1 - 0.2), log1p(0.2)] (:551-556,
# :777) then exp, gain = min(r A, clip(r) A) (:769-782), no dual clip; aggregation "token_mean" (:500 (204)) through
# _aggregate_loss_value (:784-816), declared as agg-token-mean (canonical global token mean: the docstring's "global
# masked token mean", :401); advantages per token ([b, T, 1], :717-720: forward takes any per-token advantage)
ENTRY_OVERRIDES["policy-loss"] = dict(
    kind="policy-loss",
    # per call, as agg-token-mean (scope "micro-batch": the trainer divides each call by the accumulation steps)
    variant={"clip_low": 0.2, "clip_high": 0.2, "dual_clip": None, "advantages": "token", "mode": "token-mean",
             "scope": "micro-batch"},  # fmt: skip
    # _log_weight zeroes both log-probs outside the mask with torch.where (:961-967 (651-657)), so the log-weight
    # is 0 there, and _reduce_loss selects with torch.where (common.py:368): dL/dlogp = 0 at masked positions
    masked_zero=True,
    masked_zero_why="",
    options=(),
    documented_errors=(),
    whitening=None,
    truncation=None,  # the advantages are given; a cut row is a row like another for the policy loss
    domain=GRPO_SPLITS,
    pipeline=None,  # not researched: every finding is reach: api
    pipeline_by_pin={},
    contract="dense",
    notes="GRPOLoss(trivial actor returning the case's logp and mask, entropy_bonus=False)(td)['loss_objective'] "
    "per micro-batch, ('log_probs', 'full') = old_logp, advantage per token; / accumulation steps",
)


# What torchrl's own collector / GAE module / transforms produce, in the adapter's mapping (a row = the steps of a
# collector batch, the "trainable" run = one trajectory ending at `done`; what lies before and after it are the
# previous and the next episode's steps: real transitions with their own rewards and value-network outputs).
# `Domain.produces`, issue 24; the lines of every pin in one citation where the fact is the same.
_COLLECT = (
    "the collector steps the env with step_and_maybe_reset and resets a done env in place (0.6.0 "
    "torchrl/collectors/collectors.py:1166; 0.8.1 :1458; 0.10.1 :1534; 0.12.0 torchrl/collectors/_single.py:1688; "
    "0.14.1 :2153; git main :2131), so a batch row runs on past `done` into the next episode"
)
_VNET = (
    "the GAE module runs the value network on obs and ('next', obs) of every step (0.6.0 "
    "torchrl/objectives/value/advantages.py:1333; 0.8.1 :1468; 0.10.1 :1491; 0.12.0 :1505; 0.14.1 :2269; git main "
    ":2174) and hands both to the functional (0.12.0 :1537-1556; 0.14.1 :2316-2335; git main :2221-2240): the values "
    "of the steps after `done` and V(next obs) at the done step are value-network outputs"
)
_STEPS = (
    "StepCounter(max_steps) sets truncated (done, not terminated) at the step limit (0.6.0 "
    "torchrl/envs/transforms/transforms.py:5890; 0.8.1 :7552; 0.10.1 :7748; 0.12.0 :7853; 0.14.1 "
    "torchrl/envs/transforms/_env.py:970; git main :966)"
)
GAE_PRODUCES = {
    "masked_real_tail": _COLLECT,
    "leading_mask": _COLLECT + "; a batch starts where the previous one stopped, mid-episode",
    "masked_rewards": _COLLECT + ": the next episode's steps carry their env rewards",
    "token_rewards": _COLLECT + ": every step carries its env reward",
    "masked_values": _VNET,
    "truncated_rows": _STEPS,
    "truncated_padded": _STEPS + "; " + _COLLECT,
}
# AutoResetTransform fills ('next', obs) of a done step with NaN (fill_float="nan") and, up to 0.12.0, the GAE module
# feeds V(NaN) to the functional: NaN next values exactly where it multiplies by not_terminated. The feature also
# lets a witness put NaN in a reward, which torchrl never does (one field for values and rewards: see
# docs/audit/torchrl.md)
_NAN_UNTIL_0_12 = (
    "AutoResetTransform fill_float='nan' writes NaN into ('next', obs) of every done step (0.6.0 "
    "torchrl/envs/transforms/transforms.py:8212; 0.8.1 :9892; 0.10.1 :10077; 0.12.0 :10459) and the GAE module runs "
    "the value network on it unsanitised (0.12.0 torchrl/objectives/value/advantages.py:1505, 1537-1556)"
)
# The GAE module entry: with average_gae the advantages of every step of the batch are standardised together by
# design ("if True, the resulting GAE values will be standardized", advantages.py:1972-1973 at 0.14.1): the steps
# around a trajectory are real transitions there, not masked ones, so no witness may put poison on them (no
# masked values / rewards / tails cited); the cut rows and the plain rows stay
MODULE_PRODUCES = {k: v for k, v in GAE_PRODUCES.items() if k in ("token_rewards", "truncated_rows")}

# GRPOLoss's own words for its aggregations (the docstring of `aggregation`), per pin
_AGG_DOC = {
    "0.12.0": 110,
    "0.14.1": 401,
    "ae9719f17b15": 395,
}
_TOKEN_MEAN = '"token_mean": global masked token mean (weights long sequences more). Default.'
_PROMPT_MEAN = '"prompt_mean": per-sample masked mean over tokens, then mean across samples (equal sample weight).'


def agg_promise(which: str) -> tuple[Promise, ...]:
    """GRPOLoss's `aggregation` docstring line for `which` ("token_mean" | "prompt_mean") at each pin."""
    text, off = (_TOKEN_MEAN, 0) if which == "token_mean" else (_PROMPT_MEAN, 1)
    note = (
        "GRPOLoss's docstring for the aggregation of one call (the trainer calls it per micro-batch and divides by "
        "the accumulation steps: scope micro-batch)"
    )
    return tuple(
        Promise(f"upstream:{_GRPO}:{line + off}", text, covers=("reference",), note=note, pins=(pin,))
        for pin, line in _AGG_DOC.items()
    )


ENTRY_OVERRIDES["agg-token-mean"]["promises"] = agg_promise("token_mean")
ENTRY_OVERRIDES["agg-prompt-mean"]["promises"] = agg_promise("prompt_mean")

SPEC = TargetSpec(
    id="torchrl",
    first_run=('default', 'mc-advantage', 'policy-loss'),
    adapter="maskfuzz.targets.torchrl.calls",
    own=("torchrl",),
    contract="dense",
    git_url="https://github.com/pytorch/rl.git",
    package="torchrl",
    pins=(
        Pin("0.14.1", "latest torchrl release (declares tensordict < 0.15; imports with 0.15.3)", default=True),
        Pin("0.12.0", "an intermediate release"),
        Pin("0.10.1", "an intermediate release"),
        Pin("0.8.1", "an intermediate release"),
        Pin("0.6.0", "oldest release that imports with torch 2.13 and tensordict 0.15"),
        Pin("ae9719f17b15", "main at the mirror snapshot (2026-08-22)", kind="git"),
    ),
    entries=tuple(ENTRY_OVERRIDES),
    entry_overrides=ENTRY_OVERRIDES,
    masked_zero=False,
    masked_zero_why=(
        "torchrl has no token mask: every position is a transition with its own advantage, and positions "
        "after `done` (an observation tail, padding) start a new trajectory with advantages of their own"
    ),
    domain=Domain(
        gaps=False,
        why={
            "gaps": "torchrl has no token mask; a non-trainable token inside a trajectory can only be an ordinary "
            "transition with its own value and reward, so gaps are not expressible",
        },
    ),
    pipeline=Domain(
        gaps=False,
        why={
            "gaps": "as the api domain: the functional takes done / terminated flags and no token mask "
            "(0.14.1: torchrl/objectives/value/functional.py:120-128), so a masked token inside a trajectory "
            "cannot be expressed; non-finite poison stays allowed here: AutoResetTransform fills the next "
            "observation of a done step with NaN (0.12.0: torchrl/envs/transforms/transforms.py:10459; 0.10.1: "
            ":10077; 0.8.1: :9892; 0.6.0: :8212) and the GAE module feeds V(NaN) to the functional unsanitised "
            "(0.12.0: torchrl/objectives/value/advantages.py:1505, 1537-1556)",
        },
        produces={**GAE_PRODUCES, "nonfinite_poison": _NAN_UNTIL_0_12},
    ),
    pipeline_by_pin={
        rev: Domain(
            gaps=False,
            nonfinite_poison=False,
            why={
                "gaps": "as the api domain: the functional takes done / terminated flags and no token mask "
                "(torchrl/objectives/value/functional.py:120-128)",
                "nonfinite_poison": "the GAE module replaces NaN next observations (AutoResetTransform, "
                f"compact_obs) by the root observation before the value network ({cite}); rewards and "
                "the other values are env / network outputs, finite",
            },
            produces=GAE_PRODUCES,
        )
        for rev, cite in (
            (
                "0.14.1",
                "torchrl/objectives/value/advantages.py:609-661, 872; fill at torchrl/envs/transforms/_env.py:2232",
            ),
            (
                "ae9719f17b15",
                "torchrl/objectives/value/advantages.py:562-614, 813; fill at torchrl/envs/transforms/_env.py:2112",
            ),
        )
    },
    notes=(
        "row -> one trajectory ending at the last trainable token (done = terminated there); "
        "next_state_value = values shifted left with 0 after the row; score added at the last trainable token"
    ),
)


# the GAE module's own pipeline (MODULE_PRODUCES: average_gae standardises every step of the batch by design)
ENTRY_OVERRIDES["module"]["pipeline"] = dataclasses.replace(SPEC.pipeline, produces=MODULE_PRODUCES)
ENTRY_OVERRIDES["module"]["pipeline_by_pin"] = {
    rev: dataclasses.replace(dom, produces=MODULE_PRODUCES) for rev, dom in SPEC.pipeline_by_pin.items()
}

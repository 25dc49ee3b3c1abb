"""TRL's entries beyond GAE as declared: the group-advantage (`grpo`, `dr-grpo`, `grpo-batch`, `rloo`),
loss-aggregation (`agg-*`), kl (`kl-grpo`, `kl-ppo`) and policy-loss (`policy-grpo`) entries, each with its domains,
options, truncation and promises cited at the pins (`KIND_OVERRIDES`; see docs/kinds/trl.md)."""

from __future__ import annotations

import dataclasses

from maskfuzz.oracles.domain import Domain
from maskfuzz.oracles.promises import Promise
from maskfuzz.targets.registry import Option, Truncation
from maskfuzz.targets.trl.declare_ppo import NEW_FILE, TRAIN_DOMAIN, TRAIN_PIPELINE, TRAIN_PIPELINE_BY_PIN

KIND_OVERRIDES: dict[str, dict] = {}

# ---- group-advantage entries (targets/trl/calls_*.py): the inline advantage blocks of GRPOTrainer and
# RLOOTrainer._generate_and_score_completions. Lines are at 1.12.0 (1.16.0 / git f2cd577 in brackets).
_GR = "trl/trainer/grpo_trainer.py"
_RL = "trl/trainer/rloo_trainer.py"
_UT = "trl/trainer/utils.py"
_GC = "trl/trainer/grpo_config.py"
GIT = "f2cd57710ae345ea6428ae95363267fcf38a3dc8"  # the git pin (SPEC.pins)


def _upstream(path: str, lines: dict, text: str, covers: tuple, note: str) -> tuple[Promise, ...]:
    """One Promise per pin group of TRL's own words (`text`, quoted) at `path`: `lines` maps the line (range) to the
    pins whose file has those words there (issue 24: a promise names its file and line at the pins that say it)."""
    return tuple(
        Promise(id=f"upstream:{path}:{at}", text=text, covers=covers, note=note, pins=tuple(pins))
        for at, pins in lines.items()
    )


# GRPOConfig's docstring of scale_rewards (1.16.0 grpo_config.py:227-236; 1.12.0 :233-242; git :234-243; a bool at
# 0.19.1, :154-158): the scaling of the group-centred rewards, TRL's formula for the `grpo` entries (the docs page at
# the git pin writes it out, docs/source/grpo_trainer.md:70).
_SCALE_GROUP = (
    '`True` or `"group"` (default): rewards are scaled by the standard deviation within each group, ensuring unit '
    "variance within a group."
)
_SCALE_BATCH = (
    '`"batch"`: rewards are scaled by the standard deviation across the entire batch, as recommended in the [PPO '
    "Lite paper](https://huggingface.co/papers/2508.08221)."
)
_SCALE_NONE = '`False` or `"none"`: no scaling is applied.'
_GROUP_NOTE = (
    "GRPOConfig documents the advantage of the scale_rewards setting; the block computes it over the group's "
    "rewards (the declared variant: unbiased nanstd, 1e-4 added to the std, a group of one scorable row 0)"
)
GRPO_PROMISES = (
    *_upstream(
        _GC,
        {"230-231": ("1.16.0",), "236-237": ("1.12.0",), "237-238": (GIT,)},
        _SCALE_GROUP,
        ("reference",),
        _GROUP_NOTE,
    ),
    *_upstream(
        _GC,
        {"155-156": ("0.19.1",)},
        "If `True` (default), the rewards are normalized by the standard deviation, ensuring they have unit variance.",
        ("reference",),
        _GROUP_NOTE,
    ),
    *_upstream(
        "docs/source/grpo_trainer.md",
        {"70": (GIT,)},
        "$$\\hat{A}_{i,t} = \\frac{r_i - \\text{mean}(\\mathbf{r})}{\\text{std}(\\mathbf{r})}$$",
        ("reference",),
        "the GRPO docs page at the pin: the group-normalised advantage of every completion",
    ),
)
DR_GRPO_PROMISES = (
    *_upstream(_GC, {"234": ("1.16.0",), "240": ("1.12.0",), "241": (GIT,)}, _SCALE_NONE, ("reference",), _GROUP_NOTE),
    *_upstream(_GC, {"156-157": ("0.19.1",)}, "If `False`, no scaling is applied.", ("reference",), _GROUP_NOTE),
)
GRPO_BATCH_PROMISES = _upstream(
    _GC, {"232-233": ("1.16.0",), "238-239": ("1.12.0",), "239-240": (GIT,)}, _SCALE_BATCH, ("reference",), _GROUP_NOTE
)
# RLOOTrainer's own comment on its baseline (1.16.0 rloo_trainer.py:1682-1684; 1.12.0 :1589-1591; git :1544-1546) and
# the RLOO docs page at the git pin (docs/source/rloo_trainer.md:93-104)
_RLOO_COMMENT = (
    "RLOO advantages computation. The leave-one-out baseline averages over scorable siblings only: nansum drops "
    "unscorable rewards and the divisor is (scorable count − 1). A group with a single scorable completion yields "
    "0/0 = NaN, and unscorable rows stay NaN; both are zeroed by nan_to_num below."
)
RLOO_PROMISES = (
    *_upstream(
        _RL,
        {"1682-1684": ("1.16.0",), "1589-1591": ("1.12.0",), "1544-1546": (GIT,)},
        _RLOO_COMMENT,
        ("reference",),
        "the trainer's comment states the leave-one-out formula and its singleton rule (the declared variant)",
    ),
    *_upstream(
        "docs/source/rloo_trainer.md",
        {"93-104": (GIT,)},
        "we calculate a baseline as the average reward of all other samples in the same batch, excluding the current "
        "sample. [...] b_i = \\frac{1}{G-1} \\sum_{j \\neq i} r_j [...] A_i = r_i - b_i",
        ("reference",),
        "the RLOO docs page at the pin",
    ),
)
_NOT_MASKED = (
    "the block gives one advantage per completion ([N]); the loss broadcasts it over the tokens and masks the "
    "per-token loss ({f}), so masked positions of the broadcast row are not zero; the adapter broadcasts it"
)
_TRUNC = (
    "all-masked rows: mask_truncated_completions=True zeroes the completion_mask of a truncated completion "
    "({f}) while its reward still enters the group statistics"
)


def _group_override(variant: dict, est: str, domain: Domain, pipeline: Domain, loss: str, promises: tuple = ()) -> dict:
    return dict(
        kind="group-advantage",
        # the statistics read the rewards alone (GRPO 1.12.0 grpo_trainer.py:2785-2793 nanmean / nanstd over
        # rewards.view(-1, num_generations); RLOO rloo_trainer.py:1582-1597 over grouped_rewards): a completion without
        # a trained token, e.g. one cleared by mask_truncated_completions, is a sample of its group by design
        variant={**variant, "empty_rows": "counted"},
        promises=promises,
        contract="dense",
        whitening=None,
        masked_zero=False,
        masked_zero_why=_NOT_MASKED.format(f=loss),
        documented_errors=(r"GroupShapeError",),
        domain=domain,
        pipeline=pipeline,
        pipeline_by_pin={},
        notes=(
            f"{est}: TRL groups are positional (view(-1, num_generations)); the adapter lays the case's groups out "
            "contiguously and fills short groups with unscorable (NaN) completions, TRL's own way of shortening a "
            "group (0.19.1 has none: unequal groups are a GroupShapeError there). "
            + _TRUNC.format(f=f"{_GR}:2506-2510 [2488-2492 / 2417-2421]" if est == "GRPO" else f"{_RL}:1422-1426")
        ),
    )


_F32_REWARDS = (
    "{f} rewards_per_func = torch.zeros(len(prompts), len(self.reward_funcs), device=device): float32 rewards, "
    "weighted by float32 reward_weights ({w})"
)
_GRPO_ONLY_SCORE = (
    f"{_GR}:2778-2832 [2756-2810 / 2676-2730]: the advantage block reads only rewards_per_func [N, F] (one scalar "
    "per completion and reward function); there is no per-token input that could carry anything under the mask"
)
_GRPO_DOMAIN = Domain(
    token_rewards=False,
    masked_rewards=False,
    nonfinite_poison=False,
    why={"token_rewards": _GRPO_ONLY_SCORE, "masked_rewards": _GRPO_ONLY_SCORE, "nonfinite_poison": _GRPO_ONLY_SCORE},
)
# What GRPO's / RLOO's own code builds (issue 24): a completion whose completion_mask mask_truncated_completions
# cleared (no trained token), and completions cut by max_completion_length. Not cited: masks inside a completion
# (the advantage block reads no mask), empty rows (a completion has at least its EOS or one generated token).
_GRPO_PRODUCES = {
    "all_masked_rows": f"{_GR}:2506-2510 [2488-2492 / 2417-2421] (0.19.1: 1199-1202) mask_truncated_completions=True "
    "zeroes the completion_mask of a completion whose last token is neither EOS nor pad",
    "truncated_rows": f"{_GR}:1123 [1156 / 1110] max_new_tokens = max_completion_length: a completion that reaches it "
    "has no EOS",
}
_GRPO_PIPELINE = dataclasses.replace(
    _GRPO_DOMAIN,
    dtypes=("float32",),
    why={
        **_GRPO_DOMAIN.why,
        "dtypes": _F32_REWARDS.format(f=f"{_GR}:1634 [1581 / 1614]", w=f"{_GR}:542 [576 / 536]"),
    },
    produces=_GRPO_PRODUCES,
)
_RLOO_PIPELINE = Domain(
    dtypes=("float32",),
    nonfinite_poison=False,
    why={
        "dtypes": _F32_REWARDS.format(f=f"{_RL}:1072 [1150 / 1055]", w=f"{_RL}:462 [503 / 456]"),
        "nonfinite_poison": f"{_RL}:1503-1513 [1600 / 1458] old_per_token_logps (and the reference's) are the "
        "models' log-softmax at every completion position, padding included: finite under the mask",
    },
    # the adapter's token rewards are RLOO's per-token KL (old - ref, summed under completion_mask): non-zero at trained
    # tokens; under the padding both log-probs are the models' log-softmax there (the nonfinite_poison reason)
    produces={
        "token_rewards": f"{_RL}:1576-1580 [1669-1673 / 1531-1535] per_token_kl = old_per_token_logps - "
        "ref_per_token_logps, summed under completion_mask into the reward",
        "masked_rewards": f"{_RL}:1503-1513 [1600 / 1458] old and reference log-probs at every completion position, "
        "padding included: their difference is non-zero under the mask before the completion_mask product",
        "all_masked_rows": f"{_RL}:1422-1426 [1519-1523 / 1387-1391] mask_truncated_completions=True zeroes a "
        "truncated completion's completion_mask",
        "truncated_rows": f"{_RL}:691 [788 / 681] max_new_tokens = max_completion_length: a completion that reaches it "
        "has no EOS",
    },
)
_GRPO_LOSS = f"{_GR}:3148 [3059 / 3030] advantages.unsqueeze(1), {_GR}:3248 [3159 / 3130] (per_token_loss * mask)"
_RLOO_LOSS = (
    f"{_RL}:1736 [1830 / 1691] per_sequence_loss1 = coef_1 * advantages, the log-probs summed under "
    f"completion_mask ({_RL}:1728 [1822 / 1683])"
)
GROUP_ENTRIES = ("grpo", "dr-grpo", "grpo-batch", "rloo")
KIND_OVERRIDES.update(
    {
        # scale_rewards="group" (the default, grpo_config.py:782-783): advantages = (r - nanmean_g) / (nanstd_g +
        # 1e-4) (grpo_trainer.py:2807-2809); nanstd is unbiased (utils.py:879-881 count / (count - 1)) and NaN for
        # a group of one scorable row (utils.py:880), which nan_to_num turns into 0 (grpo_trainer.py:2832)
        "grpo": _group_override(
            {"estimator": "grpo", "std": "unbiased", "eps": 1e-4, "eps_place": "std", "singleton": "zero"},
            "GRPO",
            _GRPO_DOMAIN,
            _GRPO_PIPELINE,
            _GRPO_LOSS,
            # no promise attached: see DEFERRED_PROMISES
        ),
        # scale_rewards="none" (Dr. GRPO): advantages = r - nanmean_g (grpo_trainer.py:2807-2808); a group of one
        # scorable row gives r - r = 0
        "dr-grpo": _group_override(
            {"estimator": "grpo", "std": None, "singleton": "zero"},
            "GRPO",
            _GRPO_DOMAIN,
            _GRPO_PIPELINE,
            _GRPO_LOSS,
            DR_GRPO_PROMISES,
        ),
        # scale_rewards="batch": (r - nanmean_g) / (nanstd(all rewards) + 1e-4) (grpo_trainer.py:2796-2800,
        # 2807-2809), a batch of one scorable row NaN, zeroed by nan_to_num (2832)
        "grpo-batch": _group_override(
            {
                "estimator": "grpo",
                "std": "unbiased",
                "eps": 1e-4,
                "eps_place": "std",
                "singleton": "zero",
                "std_level": "batch",
            },
            "GRPO",
            _GRPO_DOMAIN,
            _GRPO_PIPELINE,
            _GRPO_LOSS,
            GRPO_BATCH_PROMISES,
        ),
        # leave-one-out over the scorable rows: r - (nansum_g - r) / (count_g - 1) (rloo_trainer.py:1592-1597);
        # one scorable row gives 0 / 0 = NaN, zeroed by nan_to_num (1606; the comment at 1589-1591 says so);
        # normalize_advantages=False (rloo_config.py:524-525)
        "rloo": _group_override(
            {"estimator": "rloo", "singleton": "zero"}, "RLOO", Domain(), _RLOO_PIPELINE, _RLOO_LOSS
        ),
    }
)
# TRL's words for the `grpo` and `rloo` entries are real promises covering `reference`, but they are not attached yet:
# both entries take mask_truncated_completions, and the kinds judge compares a row that option clears at the row's
# original positions (oracles/kinds/judge.py:87 `live = case.trainable`, against the reference of reference_case,
# which zeroes the cleared row), where TRL's broadcast advantage is never read (the loss mask is cleared,
# masked_zero=False). Attached, that comparison would file a false defect naming TRL's words (a fuzz at 1.12.0 found
# one: B=4, the only trained row cut). Attach them once the judge compares on the reference case's mask.
DEFERRED_PROMISES = {
    "grpo": GRPO_PROMISES + GRPO_BATCH_PROMISES + DR_GRPO_PROMISES,  # its scale_rewards option takes all three
    "rloo": RLOO_PROMISES,
}


# ---- loss-aggregation entries (calls_kinds: load_aggregate): the `if self.loss_type ...` chain
# of GRPOTrainer._compute_loss. Lines at 1.16.0 (1.12.0 / git f2cd577 / 0.19.1 in brackets).
_AGG_CHAIN = f"{_GR}:3152-3184 [3241-3273 / 3123-3150 / 1404-1411]"
# What GRPOTrainer's own code builds for the loss (issue 24), lines at 1.16.0 (1.12.0 / git f2cd577): the loss mask
# completion_mask * tool_mask (:2497 [2515 / 2426]) with the tool's result tokens 0 between the model's (:2154 [2189 /
# 2112]); a completion that ends on a tool result when the post-tool generation is cut to nothing by
# max_completion_length (:2139-2143 [2174-2178 / 2097-2101]); a truncated completion's mask cleared by
# mask_truncated_completions (:2488-2492 [2506-2510 / 2417-2421]); completions cut by max_new_tokens (:1156 [1123 /
# 1110]). 0.19.1 has no tool mask: its own domain below. Not cited: leading masks and empty rows (a completion starts
# with a generated token and has one), dtypes (the model's, not researched: float32 witnesses only).
_AGG_PRODUCES = {
    "gaps": f"{_GR}:2154 [2189 / 2112] tool_mask += [0] * tool_length + [1] * post_tool_length: a tool's result "
    f"masked between generated tokens, the loss mask completion_mask * tool_mask ({_GR}:2497 [2515 / 2426])",
    "masked_real_tail": f"{_GR}:2139-2143 [2174-2178 / 2097-2101] the post-tool generation cut to fit "
    "max_completion_length (to nothing when the tool's result fills it): the completion ends on the masked tool result "
    f"(:2154 [2189 / 2112])",
    "all_masked_rows": f"{_GR}:2488-2492 [2506-2510 / 2417-2421] mask_truncated_completions=True zeroes a truncated "
    "completion's completion_mask",
    "truncated_rows": f"{_GR}:1156 [1123 / 1110] max_new_tokens = max_completion_length: a completion that reaches "
    "it has no EOS",
}
_AGG_PIPELINE = Domain(
    left_padding=False,
    uneven_splits=False,
    why={
        "left_padding": f"{_GR}:2460 completion_mask = pad(..., padding_side='right'): completions are right-padded",
        "uneven_splits": (
            f"{_GR}:1544 splits the generation batch with split_tensor_dict (trl/trainer/utils.py:1057-1089): "
            "chunk_size = rows // num_chunks, equal chunks on every process"
        ),
    },
    produces=_AGG_PRODUCES,
)  # dtypes stay open: selective_log_softmax keeps the model's dtype (trl/trainer/utils.py:582-594)
_AGG_PIPELINE_0191 = dataclasses.replace(
    _AGG_PIPELINE,
    produces={
        "all_masked_rows": f"0.19.1: {_GR}:1200-1202 mask_truncated_completions=True zeroes the completion_mask of "
        "a completion without EOS",
        "truncated_rows": f"0.19.1: {_GR}:683 max_new_tokens = max_completion_length: a completion that reaches it "
        "has no EOS",
    },
)
# The api domain of the loss entries: TRL cuts each optimizer step into equal micro-batches (split_tensor_dict:
# chunk_size = rows // num_chunks, 1.16.0 trl/trainer/utils.py:1077, git :913; called in _prepare_inputs, 1.16.0
# grpo_trainer.py:1544 [1.12.0 :1597 / git :1577], each chunk per_device_train_batch_size rows on every process), so
# split-invariance draws only the shapes the loader builds.
_EQUAL_SPLITS = Domain(
    uneven_splits=False,
    why={
        "uneven_splits": f"{_GR}:1544 [1597 / 1577; 0.19.1 :992] _prepare_inputs cuts the generation batch with "
        "split_tensor_dict (trl/trainer/utils.py:1077 [git :913; 0.19.1 :223] chunk_size = rows // num_chunks): equal "
        "micro-batches on every process"
    },
)


def _agg_override(variant: dict, notes: str, promises: tuple = ()) -> dict:
    return dict(
        kind="loss-aggregation",
        variant=variant,
        contract="dense",
        whitening=None,
        masked_zero=True,  # d/dl of (per_token_loss * mask).sum(...) is the mask: 0 at masked positions
        masked_zero_why=f"{_AGG_CHAIN}: every loss_type sums per_token_loss * mask",
        documented_errors=(),
        domain=_EQUAL_SPLITS,
        pipeline=_AGG_PIPELINE,
        pipeline_by_pin={"0.19.1": _AGG_PIPELINE_0191},
        notes=notes,
        promises=promises,
    )


# GRPOConfig's docstring of loss_type (1.16.0 grpo_config.py:237-252; 1.12.0 :243-258; git :244-259; 0.19.1
# :159-171, no dapo): the normaliser of each loss_type in TRL's words
_LT = {"1.16.0": 0, "1.12.0": 6, GIT: 7}  # line offset of the same words from 1.16.0


def _lt(first: int, last: int, text: str, covers: tuple, old: tuple[int, int] | None = None, old_text: str = ""):
    lines = {f"{first + d}-{last + d}" if last > first else f"{first + d}": (pin,) for pin, d in _LT.items()}
    out = _upstream(_GC, lines, text, covers, "GRPOConfig.loss_type's documented normaliser")
    if old:
        at = f"{old[0]}-{old[1]}" if old[1] > old[0] else f"{old[0]}"
        out += _upstream(
            _GC, {at: ("0.19.1",)}, old_text or text, covers, "GRPOConfig.loss_type's documented normaliser"
        )
    return out


_LT_GRPO = '`"grpo"`: Aggregates token-level losses by normalizing over sequence length.'
_LT_DR = (
    '`"dr_grpo"`: Aggregates token-level losses by normalizing with a global constant. This method was introduced in '
    "the [Dr. GRPO paper](https://huggingface.co/papers/2503.20783) to eliminate length bias. The value of the "
    "constant corresponds to `max_completion_length`."
)
_LT_DAPO = (
    '`"dapo"` (default): Aggregates token-level losses by normalizing with the number of active token in the global '
    "accumulated batch."
)
_LT_BNPO = (
    '`"bnpo"`: Aggregates token-level losses by normalizing with the number of active token in the local batch. Note '
    "that normalization is performed over the local batch only, so results may slightly vary depending on the local "
    "batch size, despite a constant effective batch size."
)
AGG_GRPO_PROMISES = _lt(240, 240, _LT_GRPO, ("reference",), (162, 162))
AGG_DR_GRPO_PROMISES = _lt(243, 245, _LT_DR, ("reference", "split-invariance"), (169, 171))
AGG_DAPO_PROMISES = _lt(246, 247, _LT_DAPO, ("reference", "split-invariance"))
AGG_BNPO_PROMISES = _lt(
    249,
    251,
    _LT_BNPO,
    ("reference",),
    (165, 167),
    '`"bnpo"`: Aggregates token-level losses by normalizing number of active token in the local batch. Note that '
    "normalization is performed over the local batch only, so results may slightly vary depending on the local batch "
    "size, despite a constant effective batch size.",
)


AGG_ENTRIES = ("agg-grpo", "agg-bnpo", "agg-dr_grpo", "agg-dapo")
KIND_OVERRIDES.update(
    {
        # grpo: mean over the micro-batch's rows of sum(l m) / sum(m).clamp(1), / GA (grpo_trainer.py:3153-3157):
        # "normalizing over sequence length" (grpo_config.py:240). By design its .mean() counts every completion of
        # the micro-batch, one without a trained token too (:3154; the docs page at the git pin writes the loss as
        # 1/G sum_i 1/|o_i| sum_t, docs/source/grpo_trainer.md:118): empty_rows="counted"; and it passes no global
        # normaliser, each micro-batch is normalised by its own rows (:3154-3157): scope="micro-batch"
        "agg-grpo": _agg_override(
            {"mode": "seq-mean-token-mean", "empty_rows": "counted", "scope": "micro-batch"},
            "loss_type='grpo': per-micro-batch mean of row token means over all rows of the micro-batch, / GA",
            AGG_GRPO_PROMISES,
        ),
        # bnpo: sum(l m) / sum(m).clamp(1) / GA (grpo_trainer.py:3158-3162); documented as the local (micro-)batch
        # token count, grpo_config.py:249-252 ("results may slightly vary depending on the local batch size"):
        # scope="micro-batch", the declared design
        "agg-bnpo": _agg_override(
            {"mode": "token-mean", "scope": "micro-batch"},
            "loss_type='bnpo': per-micro-batch token mean / GA, documented as local (grpo_config.py:249-252)",
            AGG_BNPO_PROMISES,
        ),
        # dr_grpo: sum(l m) / (per_token_loss.size(0) * max_completion_length) / GA (grpo_trainer.py:3163-3167):
        # "normalizing with a global constant ... max_completion_length" (grpo_config.py:243-245), so every row
        # counts, empty or not (empty_rows="counted"); max_completion_length at its default 512 (grpo_config.py:70)
        "agg-dr_grpo": _agg_override(
            {"mode": "seq-mean-token-sum-norm", "constant": 512, "empty_rows": "counted"},
            "loss_type='dr_grpo': sum / (rows of the micro-batch * max_completion_length) / GA",
            AGG_DR_GRPO_PROMISES,
        ),
        # dapo: sum(l m) / (num_items_in_batch.clamp(1) / num_processes * GA / steps_per_generation)
        # (grpo_trainer.py:3168-3174), num_items_in_batch the generation batch's tokens over all ranks (:2498):
        # "normalizing with the number of active token in the global accumulated batch" (grpo_config.py:246-247)
        "agg-dapo": _agg_override(
            {"mode": "token-mean"},
            "loss_type='dapo': the global token mean through num_items_in_batch (absent before 0.2x: a skip)",
            AGG_DAPO_PROMISES,
        ),
    }
)


# ---- options and truncation of the group-advantage and loss-aggregation entries, cited at 1.16.0 (the newest release)
SCALE_REWARDS = Option(
    "scale_rewards",
    ("group", "batch", "none"),
    "group",
    f"{_GR}:2767-2788 (1.16.0; self.scale_rewards = args.scale_rewards :833, grpo_config.py:789 default 'group'; a "
    "bool at 0.19.1, True = 'group', False = 'none': 'batch' is OptionNotAtPin there)",
    "scale the group-centred rewards by the group's std ('group'), the batch's std ('batch') or not at all ('none', "
    "Dr. GRPO)",
    effect={"none": {"variant": {"std": None}}, "batch": {"variant": {"std_level": "batch"}}},
)
RLOO_BETA = Option(
    "beta",
    (0.05, 0.0),
    0.05,
    f"{_RL}:1664-1673 (1.16.0; rloo_config.py:502 default 0.05)",
    "KL coefficient: rewards - beta * (per_token_kl * completion_mask).sum(-1); the KL of a group-advantage case is 0 "
    "at every trained token, so a correct implementation gives the same advantages for every beta (0.0 skips the KL)",
)
RLOO_CLIP = Option(
    "reward_clip_range",
    ("none", 1.0),
    "none",
    f"{_RL}:1659-1661 (1.16.0; rloo_config.py:538 default None)",
    "clamp the summed reward to [min, max] before the KL and the baseline; c stands for (-c, c), 'none' for None",
    effect={1.0: {"score_map": (("clip", 1.0),)}},
)
MASK_TRUNCATED = Option(
    "mask_truncated_completions",
    (False, True),
    False,
    f"{_GR}:2487-2495 (1.16.0; grpo_config.py:836 default False; 1.12.0 :2506-2513, 0.19.1 :1199-1202)",
    "zero the completion_mask of a completion whose last token is neither EOS nor pad (cut by max_completion_length); "
    "num_items_in_batch is counted after (:2497-2498)",
    effect={True: {"truncation": {"row": "masked"}}},
)
AGG_TRUNCATION = Truncation(
    cite=f"{_GR}:2488 (1.16.0): with mask_truncated_completions=False (the default) a cut completion keeps its "
    "completion_mask and enters the loss as an ended one"
)
# the group entries: the same flag on GRPOTrainer / RLOOTrainer clears a cut completion's completion_mask; the
# documented meaning ("excluded from the loss calculation", grpo_config.py:268-271) is the row masked, so a correct
# implementation leaves it out of its siblings' statistics too (empty_rows "excluded"); TRL keeps its reward there
MASK_TRUNCATED_RLOO = dataclasses.replace(
    MASK_TRUNCATED, cite=f"{_RL}:1518-1523 (1.16.0; rloo_config.py:542 default False)"
)
GROUP_TRUNCATION = {
    "grpo": Truncation(
        cite=f"{_GR}:2488 (1.16.0): with mask_truncated_completions=False a cut completion is scored and trained as "
        "an ended one"
    ),
    "rloo": Truncation(
        cite=f"{_RL}:1519 (1.16.0): with mask_truncated_completions=False a cut completion is scored and trained as "
        "an ended one"
    ),
}
KIND_OVERRIDES["grpo"]["options"] = (SCALE_REWARDS, MASK_TRUNCATED)
KIND_OVERRIDES["grpo"]["truncation"] = GROUP_TRUNCATION["grpo"]
KIND_OVERRIDES["grpo"]["documented_errors"] = (r"GroupShapeError", r"OptionNotAtPin")
KIND_OVERRIDES["rloo"]["options"] = (RLOO_BETA, RLOO_CLIP, MASK_TRUNCATED_RLOO)
KIND_OVERRIDES["rloo"]["truncation"] = GROUP_TRUNCATION["rloo"]
for _name in AGG_ENTRIES:
    KIND_OVERRIDES[_name]["options"] = (MASK_TRUNCATED,)
    KIND_OVERRIDES[_name]["truncation"] = AGG_TRUNCATION


# ---- kl entries (calls_kinds: load_kl_grpo / load_kl_ppo; docs/kinds/trl.md, "KL")
# kl-grpo: `per_token_kl = exp(ref - logp) - (ref - logp) - 1` (grpo_trainer.py:3100-3102 at 1.16.0; 1.12.0
# :3189-3191, git f2cd577 :3071-3073, 0.19.1 :1379-1381) is k3 of d = logp - ref (exp(-d) - 1 + d), no clamp.
# `* coef_1` when use_bias_correction_kl (:3104-3105; absent at 0.19.1), coef_1 = exp(logp - old) from :3083-3095
# (git f2cd577 :3075-3076, :3054-3066): the kl variant's ratio="token" (ratio_level="sequence" under
# importance_sampling_level="sequence"), old = the case's old_logp bound as inputs["old_per_token_logps"].
# Computed at every position; masked by the loss (`per_token_loss * mask`, :3153-3184) and the metric (:3268).
_KL_GRPO_PIPELINE = Domain(
    left_padding=False,
    nonfinite_poison=False,
    why={
        "left_padding": f"{_GR}:2460 completion_mask = pad(..., padding_side='right'): completions are right-padded",
        "nonfinite_poison": f"{_GR}:1494-1499 labels = -100 where attention_mask == 0 and log_probs of the fused LM "
        f"head, which are zero where the label is -100 ({_UT}:1512-1513): policy and reference log-probs under the "
        "padding are 0, finite (the policy and the reference go through the same _get_per_token_logps_and_entropies)",
    },
    # the loss mask it is read under: tool results inside and at the end of a completion, truncated completions
    # cleared (issue 24; the loss entries' citations)
    produces=_AGG_PRODUCES,
)
_KL_GRPO_PIPELINE_0191 = dataclasses.replace(_KL_GRPO_PIPELINE, produces=_AGG_PIPELINE_0191.produces)
# GRPO's KL in TRL's words: the docs page's estimator (git docs/source/grpo_trainer.md:85-86; 0.19.1 :87-88) and the
# importance-ratio correction of use_bias_correction_kl (1.16.0 grpo_config.py:351-352; 1.12.0 :357-358; git
# :359-361, its own words there)
_KL_DOC = (
    "$$\\mathbb{D}_{\\text{KL}}\\left[\\pi_\\theta \\|\\pi_{\\text{ref}}\\right] = \\frac{\\pi_{\\text{ref}}"
    "(o_{i,t} \\mid q, o_{i,<t})}{\\pi_\\theta(o_{i,t} \\mid q, o_{i,<t})} - \\log \\frac{\\pi_{\\text{ref}}(o_{i,t} "
    "\\mid q, o_{i,<t})}{\\pi_\\theta(o_{i,t} \\mid q, o_{i,<t})} - 1,"
)
KL_GRPO_PROMISES = (
    *_upstream(
        "docs/source/grpo_trainer.md",
        {"85-86": (GIT,), "87-88": ("0.19.1",)},
        _KL_DOC,
        ("reference",),
        "the GRPO docs page at the pin: the per-token estimator (k3 of d = logp - ref_logp)",
    ),
    *_upstream(
        _GC,
        {"351-352": ("1.16.0",), "357-358": ("1.12.0",)},
        "Whether to multiply the KL term by the importance sampling ratio, so that the KL gradient becomes the "
        "unbiased reverse-KL gradient",
        ("reference",),
        "the use_bias_correction_kl option (the kl variant's ratio)",
    ),
    *_upstream(
        _GC,
        {"359-361": (GIT,)},
        "Whether to use the unbiased KL divergence estimator with importance sampling correction. This corrects the KL "
        "divergence estimate by multiplying it with the importance sampling ratio.",
        ("reference",),
        "the use_bias_correction_kl option (the kl variant's ratio)",
    ),
)
# PPOConfig.kl_estimator (1.12.0 trl/experimental/ppo/ppo_config.py:94-98; git :95-99; 0.19.1 trl/trainer/ppo_config.py
# :50-54); 0.11.4 has no estimator (k1 only)
_KL_EST = (
    "Which estimator for KL-Divergence to use from [Approximating KL "
    "Divergence](http://joschu.net/blog/kl-approx.html). "
    'Defaults to "k1", a straightforward, unbiased estimator. Can be set to "k3", an unbiased estimator with lower '
    'variance which "appears to be a strictly better estimator".'
)
KL_PPO_PROMISES = (
    *_upstream(
        "trl/experimental/ppo/ppo_config.py",
        {"95-98": ("1.12.0",), "96-99": (GIT,)},
        _KL_EST,
        ("reference",),
        "PPOConfig.kl_estimator: the estimators of Schulman's note, k1 = d and k3 = exp(-d) - 1 + d",
    ),
    *_upstream(
        "trl/trainer/ppo_config.py",
        {"51-54": ("0.19.1",)},
        _KL_EST,
        ("reference",),
        "PPOConfig.kl_estimator: the estimators of Schulman's note, k1 = d and k3 = exp(-d) - 1 + d",
    ),
)
USE_BIAS_CORRECTION_KL = Option(
    "use_bias_correction_kl",
    (True, False),
    True,
    f"{_GR}:3104-3105 (1.16.0; grpo_config.py:972-973 default True; 1.12.0 default True, git f2cd577 default False; "
    "absent at 0.19.1: OptionNotAtPin)",
    "multiply the per-token KL by the importance ratio coef_1 = exp(logp - old_logp) (:3083-3095, unclamped); the "
    "adapter binds old_per_token_logps from the case's old_logp (:3065), so coef_1 is a real ratio (with TRL's "
    "default old = logp.detach(), num_iterations = 1, :3066, it is 1)",
    effect={True: {"variant": {"ratio": "token"}}},
)
IMPORTANCE_SAMPLING_LEVEL = Option(
    "importance_sampling_level",
    ("token", "sequence"),
    "token",
    f"{_GR}:3084-3093 (1.16.0; grpo_config.py:760-761 default 'token'; absent at 0.19.1: OptionNotAtPin)",
    "coef_1 per token or per sequence (exp((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)), :3087-3088); "
    "it weighs the KL only under use_bias_correction_kl (the kl variant's ratio_level)",
    effect={"sequence": {"variant": {"ratio_level": "sequence"}}},
)
# kl-ppo: `logr = ref_logprobs - logprobs; kl = -logr if args.kl_estimator == "k1" else (logr.exp() - 1) - logr`
# (trl/experimental/ppo/ppo_trainer.py:773-774 at 1.12.0 and f2cd577; 0.19.1 trl/trainer/ppo_trainer.py:510-511;
# 0.11.4 ppov2_trainer.py:416 `kl = logprobs - ref_logprobs`, k1 only): k1 = d, k3 = exp(-d) - 1 + d, d = logp - ref.
# Under padding_mask both log-probs are INVALID_LOGPROB = 1.0 (:765-766), so logr = 0 and kl = 0 there.
KL_ESTIMATOR = Option(
    "kl_estimator",
    ("k1", "k3"),
    "k1",
    f"{NEW_FILE}:774 (1.12.0; ppo_config.py:243-251 default 'k1', checked at ppo_trainer.py:404-408; 0.19.1 "
    "trl/trainer/ppo_trainer.py:511; absent at 0.11.4: OptionNotAtPin)",
    "the per-token KL estimator of the KL reward: k1 = logp - ref, k3 = exp(ref - logp) - 1 - (ref - logp)",
    effect={"k3": {"variant": {"estimator": "k3"}}},
)


def _kl_override(variant: dict, masked_zero: bool, why: str, domain: Domain, pipeline: Domain | None, **kw) -> dict:
    return dict(
        kind="kl",
        variant=variant,
        contract="dense",
        whitening=None,
        masked_zero=masked_zero,
        masked_zero_why=why,
        documented_errors=(r"OptionNotAtPin",),
        domain=domain,
        pipeline=pipeline,
        truncation=None,
        **kw,
    )


KL_ENTRIES = ("kl-grpo", "kl-ppo")
KIND_OVERRIDES.update(
    {
        "kl-grpo": _kl_override(
            {"estimator": "k3"},
            False,
            f"{_GR}:3100-3105 (1.16.0) computes per_token_kl at every position; the loss masks it "
            "(per_token_loss * mask, :3153-3184) and so does the KL metric (global_masked_mean, :3259-3268)",
            Domain(),
            _KL_GRPO_PIPELINE,
            pipeline_by_pin={"0.19.1": _KL_GRPO_PIPELINE_0191},
            options=(USE_BIAS_CORRECTION_KL, IMPORTANCE_SAMPLING_LEVEL),
            promises=KL_GRPO_PROMISES,
        ),
        "kl-ppo": _kl_override(
            {"estimator": "k1"},
            True,
            f"{NEW_FILE}:765-766 (1.12.0) fill logprobs and ref_logprobs with INVALID_LOGPROB = 1.0 under "
            "padding_mask: logr = 0 there, and both k1 and k3 of 0 are 0",
            TRAIN_DOMAIN,
            TRAIN_PIPELINE,
            pipeline_by_pin=TRAIN_PIPELINE_BY_PIN,
            options=(KL_ESTIMATOR,),
            promises=KL_PPO_PROMISES,
        ),
    }
)


# ---- policy-loss (calls_kinds: load_policy; docs/kinds/trl.md, "Policy loss"): GRPOTrainer.
# _compute_loss from `advantages = inputs["advantages"]` (1.16.0 grpo_trainer.py:3055; 1.12.0 :3144; git f2cd577
# :3026) through the loss_type chain (:3184 [3273 / 3150]). Per token (1.16.0): coef_1 = exp(logp - old) (:3083,
# :3095), coef_2 = clamp(coef_1, 1 - epsilon_low, 1 + epsilon_high) (:3113), per_token_loss = -min(coef_1 A,
# coef_2 A) (:3118-3120) = max(-A r, -A clamp(r)); A one per completion, unsqueezed (:3055-3059). Defaults of
# GRPOConfig (1.16.0 grpo_config.py): loss_type "dapo" (:801-802; 1.12.0 :794-795; f2cd577 :791-792), so the
# aggregation is the dapo branch sum(l m) / (num_items_in_batch / num_processes * GA / steps_per_generation)
# (grpo_trainer.py:3168-3174): the global token mean of agg-dapo; epsilon 0.2 (:693-695), epsilon_high None ->
# epsilon (grpo_trainer.py:945-946), delta None (:697-698: no two-sided clip), beta 0.0 (:681-682: no KL term).
_POLICY_CITE = f"{_GR}:3055-3184 (1.16.0)"
_POLICY_PIPELINE = Domain(
    left_padding=False,
    uneven_splits=False,
    nonfinite_poison=False,
    masked_logprobs=False,
    why={
        "masked_logprobs": "per_token_logps and old_per_token_logps are log-softmax outputs of the policy before and "
        "after an update, under the mask as elsewhere",
        **_AGG_PIPELINE.why,
        "nonfinite_poison": _KL_GRPO_PIPELINE.why["nonfinite_poison"]
        + "; old_per_token_logps come from the same function (or are per_token_logps.detach(), :3065-3066) and the "
        "advantage is one finite number per completion (nan_to_num, :2832 at 1.12.0)",
    },
    produces=_AGG_PRODUCES,
)
# the clipped objective and its dapo normaliser in TRL's words (GRPOConfig.epsilon, 1.16.0 grpo_config.py:178-179;
# 1.12.0 :184-185; git :185-186; GRPOConfig.loss_type "dapo", the loss entries' promise)
POLICY_PROMISES = (
    *_upstream(
        _GC,
        {"178-179": ("1.16.0",), "184-185": ("1.12.0",), "185-186": (GIT,)},
        "epsilon (`float`, *optional*, defaults to `0.2`): Epsilon value for clipping.",
        ("reference",),
        "the clip range of the ratio (clip_low = clip_high = epsilon at the defaults)",
    ),
    *AGG_DAPO_PROMISES,
)
EPSILON_HIGH = Option(
    "epsilon_high",
    (0.2, 0.28),
    0.2,
    f"{_GR}:946 (1.16.0; grpo_config.py:705-706 default None = epsilon; DAPO recommends 0.28, :184-186)",
    "the upper clip bound 1 + epsilon_high of coef_2",
    effect={0.28: {"variant": {"clip_high": 0.28}}},
)
DELTA = Option(
    "delta",
    ("none", 3.0),
    "none",
    f"{_GR}:3115-3116 (1.16.0; grpo_config.py:697-698 default None)",
    "two-sided GRPO: coef_1 = clamp(coef_1, max=delta) before -min(coef_1 A, coef_2 A); with delta > 1 + "
    "epsilon_high it caps -A r at -A delta where A < 0 (the dual clip) and changes nothing where A > 0",
    effect={3.0: {"variant": {"dual_clip": 3.0}}},
)
POLICY_ENTRIES = ("policy-grpo",)
KIND_OVERRIDES["policy-grpo"] = dict(
    kind="policy-loss",
    variant={"clip_low": 0.2, "clip_high": 0.2, "dual_clip": None, "advantages": "row", "mode": "token-mean"},
    contract="dense",
    whitening=None,
    masked_zero=True,  # d/dlogp of (per_token_loss * mask).sum() / normalizer is 0 where mask is 0 (finite inputs)
    masked_zero_why=f"{_GR}:3168-3174 (1.16.0): the dapo branch sums per_token_loss * mask",
    documented_errors=(r"OptionNotAtPin",),
    domain=_EQUAL_SPLITS,
    pipeline=_POLICY_PIPELINE,
    pipeline_by_pin={},
    promises=POLICY_PROMISES,
    options=(EPSILON_HIGH, DELTA, MASK_TRUNCATED),
    truncation=AGG_TRUNCATION,
    notes=(
        "GRPOTrainer._compute_loss at its defaults (loss_type='dapo', epsilon=0.2, beta=0): the per-row advantage "
        "broadcast over the completion, the clipped ratio objective and the dapo global token mean through "
        "num_items_in_batch; 0.19.1 has no 'dapo' (its default is 'bnpo'): a skip there"
    ),
)

# GSPO: importance_sampling_level "sequence" (1.16.0 grpo_trainer.py:3086-3088: log_importance_weights = the masked
# row mean of logp - old, (B, 1), the gradient through the mean) with loss_type "grpo", the paper's setup TRL's
# warning names (:928-933); the grpo branch per micro-batch, every row counted (:3153-3157, as agg-grpo). The option
# loss_type "dapo" (GRPOConfig's default) is the discovered policy-is:sequence's configuration.
_GSPO_LEVEL = _upstream(
    _GC,
    {"210-211": ("1.16.0",)},
    '`"sequence"` averages the log-probability ratios across valid tokens to produce a single ratio per sequence.',
    ("reference",),
    "the sequence ratio: exp of the mean of logp - old over the completion's trainable tokens",
)
GSPO_LOSS_TYPE = Option(
    "loss_type",
    ("grpo", "dapo"),
    "grpo",
    f"{_GR}:928-933, :3153-3174 (1.16.0; GRPOConfig.loss_type default 'dapo', grpo_config.py:801-802)",
    "the aggregation after the sequence ratio: grpo (the per-sequence objective) or dapo (the global token mean)",
    effect={"dapo": {"variant": {"mode": "token-mean", "scope": "step", "empty_rows": "excluded"}}},
)
POLICY_ENTRIES = (*POLICY_ENTRIES, "policy-gspo")
KIND_OVERRIDES["policy-gspo"] = dict(
    KIND_OVERRIDES["policy-grpo"],
    variant={
        "clip_low": 0.2,
        "clip_high": 0.2,
        "dual_clip": None,
        "advantages": "row",
        "ratio": "sequence-mean",
        "mode": "seq-mean-token-mean",
        "empty_rows": "counted",
        "scope": "micro-batch",
    },  # fmt: skip
    masked_zero_why=f"{_GR}:3154 (1.16.0): the grpo branch sums per_token_loss * mask per row",
    promises=(*POLICY_PROMISES[:3], *_GSPO_LEVEL, *AGG_GRPO_PROMISES),
    options=(GSPO_LOSS_TYPE, EPSILON_HIGH, DELTA, MASK_TRUNCATED),
    notes=(
        "GRPOTrainer._compute_loss with importance_sampling_level='sequence' and loss_type='grpo' (GSPO), epsilon "
        "0.2, beta 0: one ratio per completion, the per-row advantage, the per-micro-batch mean of row token means",
    ),
)

"""ROLL (github.com/alibaba/ROLL, git only): the declaration the fuzzer reads; the worker's calls are `calls.py`
(the GAE entries below) and `calls_kinds.py` (the other kinds).

Entries
    default  `roll/utils/functionals.py::compute_advantage` with `adv_estimator="gae"`, the RLVR pipeline's
             call: `response_mask=` the final response mask, whitening off (ROLL's config default).
    agentic  `roll/pipeline/agentic/utils.py::agentic_compute_advantage`, the agentic pipeline's call: no
             `response_mask=` argument, so ROLL reads `data.batch["response_mask"][:, 1:]` itself.
    default-kl  `default` with a real KL in the reward (`oracles.kinds.gae.kl_reward`): old_log_probs = the case's logp,
             ref_log_probs = its ref_logp, `FixedKLController(KL_COEF)` (`kl_penalty="kl"`, k1), so ROLL's own
             `compute_token_reward` (compute_approx_kl * response_mask, `- beta * kld`) makes every token reward.

How a canonical case becomes ROLL's inputs (everything below is ROLL's own code except the tensor layout):

    ROLL keeps full sequences of length L = T + 1 (prompt, response, right padding) and every token-level
    tensor is the sequence shifted by one (`[:, 1:]`, length T): canonical position t is sequence token t + 1.
    Sequence token 0 is a prompt token, real exactly when canonical position 0 is real.

    attention_mask [B, T+1]  int64, `cat(attention[:, :1], attention)`
    position_ids   [B, T+1]  int64, `clip(cumsum(attention_mask) - 1, 0)`, as `postprocess_generate` makes them
    response_mask  [B, T+1]  int64, `cat(0, trainable)`
    values         [B, T]    the case's values, in the case's dtype
    old_log_probs  [B, T]    `-token_rewards`; ref_log_probs = 0, so ROLL's KL term `-beta * (old - ref)` with
                             `beta = 1` (`FixedKLController(1.0)`, `add_token_level_kl=True`, `kl_penalty="kl"`)
                             adds exactly the canonical token rewards: ROLL's only dense reward is this KL term
    response_level_rewards [B]  the score, run through ROLL's own score path with identity normalisation:
                             default: `reward_postprocess` then `compute_token_reward`;
                             agentic: `compute_response_level_rewards` then `compute_token_reward`.
                             `compute_token_reward` (`expand_to_token_level`) puts it on the last *attended*
                             token, `argmax(position_ids * attention_mask)`, not on the last trainable one.

Reward normalisation, clipping and OPD stay off (ROLL's defaults). Options (calls_kinds "Options and truncation"):
`whiten_advantages` from `case.options` goes to the call as the pipelines pass it; for `default` the RLVR
pipeline's `get_sample_level_mask` makes `final_response_mask` with `max_len_mask` from `case.options`, a cut row
known by its length (`calls.final_response_mask`).

Pipeline domain (`SPEC.pipeline` at c09bc8bc9f43, `pipeline_by_pin` for the other pins: same facts, other lines;
the agentic entry overrides both). RLVR (`default`): every response comes from `postprocess_generate`, which
left-aligns the sequence and marks one contiguous response run ending on the last attended token, and
`get_sample_level_mask` zeroes whole rows only: no gaps, no observation tail, no left padding. Agentic: the env
managers concatenate prompt/observation and response turns (gaps) and right-pad; a masked tail is not ruled out
(pluggable env managers; the shipped trajectory managers drop a trailing observation). Both: the critic's values
are its raw output at every position, unmasked (at the first slot after the response they are the critic's value
of the last real token), so masked values are always there; the only token reward is the KL term
`-beta * kld` with `kld` multiplied by `response_mask[:, 1:]`: non-zero under the mask only in RLVR rows that
`get_sample_level_mask` zeroes (the agentic call reads the same mask the KL used); values and rewards are model
outputs and log-prob differences, finite. Every restriction cites its line in `why`.
"""

from __future__ import annotations

import dataclasses

from maskfuzz.oracles.domain import Domain
from maskfuzz.oracles.promises import Promise
from maskfuzz.targets.registry import COMMON_HEAVY, Pin, TargetSpec
from maskfuzz.targets.roll.calls import KL_COEF
from maskfuzz.targets.roll.calls_kinds import (
    AGENTIC_TRUNCATION,
    DUAL_CLIP_OPTION,
    GRPO_TRUNCATION,
    KIND_ENTRIES,
    MAX_LEN_MASK,
    NORM_STD,
    RLVR_TRUNCATION,
    VALUE_CLIP_OPTION,
    WHITEN,
    WHITEN_AGENTIC_CITE,
    WHITEN_RLVR_CITE,
    whiten_option,
)


def _rlvr_pipeline(rev: str, fn: dict[str, str]) -> Domain:
    """The RLVR pipeline's domain at `rev`; `fn` gives that pin's line references. `produces` cites, for every
    feature it leaves permissive that ROLL's own RLVR code builds, the lines that build it (`Domain.produces`);
    the rest is narrowed with the lines that rule it out, or left uncited (no witness may use it)."""
    values = (
        f"ROLL {rev}: roll/pipeline/base_worker.py:{fn['values']} forward_func_values: values = "
        "output_tensor[:, :-1], the critic's output at every position of the sequence, unmasked (in the [:, 1:] "
        "layout the slot after the last response token holds the critic's value of that last real token, the "
        "later padding slots its outputs at pad tokens); roll/pipeline/rlvr/rlvr_pipeline.py:"
        f"{fn['cv']} critic.compute_values(batch) -> batch.union(values); roll/utils/functionals.py:{fn['gae']} "
        + (
            "compute_advantage masks them (values * response_mask) before compute_gae_advantage_return"
            if fn.get("gae_masks")
            else "compute_advantage stores values * response_mask but hands the unmasked values to "
            f"compute_gae_advantage_return, whose nextvalues = values[:, t + 1] (:{fn['boot']}) reads them"
        )
    )
    return Domain(
        gaps=False,
        masked_real_tail=False,
        left_padding=False,
        nonfinite_poison=False,
        why={
            "gaps": f"ROLL {rev}: roll/utils/functionals.py:{fn['resp']} postprocess_generate sets "
            "new_response_mask[i][prompt_len:valid_length] = 1, one contiguous run; "
            f"roll/utils/functionals.py:{fn['sample']} get_sample_level_mask scales whole rows; "
            f"roll/pipeline/rlvr/rlvr_pipeline.py:{fn['call']} passes that final_response_mask",
            "masked_real_tail": f"ROLL {rev}: roll/utils/functionals.py:{fn['tail']} attention is 1 on "
            "[0, valid_length) and the response mask on [prompt_len, valid_length): the last attended token is "
            "the last response token",
            "left_padding": f"ROLL {rev}: roll/utils/functionals.py:{fn['shift']} postprocess_generate shifts every "
            "row left (output[i, :-shift] = output[i, shift:]) and sets attention 1 on [0, valid_length)",
            "masked_values": f"ROLL {rev}: roll/pipeline/base_worker.py:{fn['values']} values = output_tensor[:, :-1] "
            "over the whole sequence, unmasked: the slot after the last response token holds the critic's value of "
            "that last real token (kept permissive)",
            "nonfinite_poison": f"ROLL {rev}: values are the critic's output, "
            f"roll/pipeline/base_worker.py:{fn['values']} (finite); token rewards are score - beta * kld with "
            f"roll/utils/functionals.py:{fn['kl']} kld = log-prob difference * response_mask (finite "
            "log-probs, 0 under the mask)",
        },
        produces={
            "masked_values": values,
            "leading_mask": f"ROLL {rev}: roll/utils/functionals.py:{fn['resp']} postprocess_generate: attention 1 on "
            "[0, valid_length), response mask 1 on [prompt_len, valid_length) only: in the [:, 1:] layout the "
            "prompt's tokens 1 .. prompt_len - 1 are real masked tokens before the response",
            "all_masked_rows": f"ROLL {rev}: roll/utils/functionals.py:{fn['maxlen']} get_sample_level_mask with "
            f"max_len_mask (and difficulty_mask / error_max_len_clip) zeroes a sample, :{fn['final']} "
            "final_response_mask = response_mask * the sample mask, the row's attention unchanged; "
            f"roll/pipeline/rlvr/rlvr_pipeline.py:{fn['call']} hands final_response_mask to compute_advantage",
            "masked_rewards": f"ROLL {rev}: in a row that get_sample_level_mask zeroes "
            f"(roll/utils/functionals.py:{fn['final']}) compute_token_reward (:{fn['kl']}) still places the score "
            "on the last attended token and the KL under response_mask[:, 1:] (not the final mask): token rewards "
            "under final_response_mask = 0",
            "token_rewards": f"ROLL {rev}: roll/utils/functionals.py:{fn['kl']} compute_token_reward with "
            "add_token_level_kl: token_level_rewards = score - kl_ctrl.value * kld at every response token "
            f"(called at roll/pipeline/rlvr/rlvr_pipeline.py:{fn['trcall']})",
            "truncated_rows": f"ROLL {rev}: roll/utils/functionals.py:{fn['rl']} postprocess_generate: the response "
            "mask ends at EOS or at the generation limit (a response without EOS fills responses.shape[-1] = "
            f"max_new_tokens); get_sample_level_mask tests that length at :{fn['maxlen']}",
            "truncated_padded": f"ROLL {rev}: roll/utils/functionals.py:{fn['shift']} postprocess_generate left-"
            "aligns each row in a window of prompt_length + response_length: a cut response after a prompt "
            "shorter than the longest is followed by padding",
        },
    )


def _agentic_pipeline(rev: str, fn: dict[str, str]) -> Domain:
    """The agentic pipeline's domain at `rev`; `fn` gives that pin's line references (see `_rlvr_pipeline`).
    Every env manager shipped at the pin ends a sample on a response token: the trajectory managers pop the
    trailing observation, the step managers build one prompt + response per step, the VL manager cuts after the
    last response token, the proxy manager's message tracker (8eb27cc2dc34) ends a trajectory on its last recorded
    response. So no pipeline builds an observation tail (a masked real tail)."""
    tail = (
        f"ROLL {rev}: every shipped env manager ends a sample on a response token: "
        f"roll/pipeline/agentic/env_manager/traj_env_manager.py:{fn['pop']} pops the trailing observation before "
        f":{fn['turns']} concatenates prompt/observation + response per turn; step_env_manager.py:{fn['step_pop']} "
        f"pops it and :{fn['step_mask']} builds [0] * prompt + [1] * response per step (StepConcatEnvManager "
        f"inherits it); agent_native_env_manager.py:{fn['native_pop']} pops it and :{fn['native_mask']} builds "
        f"prompt + response per step; vl_traj_env_manager.py:{fn['vl_pop']} pops it and :{fn['vl_cut']} cuts the "
        "sequence after the last response token"
        + (
            f"; message_tracker.py:{fn['mt_leaf']} (ProxyEnvManager, traj mode) builds each sample from the root "
            f"to its last recorded response, :{fn['mt_step']} (step mode) prompt + response"
            if "mt_leaf" in fn
            else ""
        )
    )
    empty = (
        f"ROLL {rev}: roll/pipeline/agentic/env_manager/agent_native_env_manager.py:{fn['ph']} "
        "create_placeholder_rollout (sandbox reset failure, :51) has attention_mask and response_mask all 0; "
        f"GroupFilter.filter keeps its group once half the groups were filtered (:{fn['filt']})"
        + (
            f"; proxy_env_manager.py:{fn['proxy_ph']} a trajectory with no samples becomes one pad token with "
            "response mask 0 (no real token in the [:, 1:] layout)"
            if "proxy_ph" in fn
            else ""
        )
    )
    return Domain(
        left_padding=False,
        masked_real_tail=False,
        masked_rewards=False,
        nonfinite_poison=False,
        why={
            "gaps": f"ROLL {rev}: roll/pipeline/agentic/env_manager/traj_env_manager.py:{fn['turns']} concatenates "
            "[0] * prompt/observation + [1] * response per turn (kept permissive)",
            "masked_real_tail": tail,
            "all_masked_rows": "not cited as produced: the placeholder rollouts have no real token at all "
            "(attention 0 too: `empty_rows`); the shipped managers raise on a sample without a response token "
            f"(response_masks.index(1), traj_env_manager.py:{fn['first']})",
            "left_padding": f"ROLL {rev}: roll/pipeline/agentic/env_manager/traj_env_manager.py:{fn['pad']} right-pads "
            f"the token list with pad_to_length (roll/utils/functionals.py:{fn['padfn']} appends)",
            "masked_rewards": f"ROLL {rev}: the only token reward is -beta * kld, roll/utils/functionals.py:{fn['kl']} "
            "kld * data.batch['response_mask'][:, 1:]; agentic_compute_advantage is called without response_mask "
            f"(roll/pipeline/agentic/agentic_pipeline.py:{fn['call']}) and reads the same mask, "
            f"roll/pipeline/agentic/utils.py:{fn['mask']}",
            "masked_values": f"ROLL {rev}: roll/pipeline/base_worker.py:{fn['values']} values = output_tensor[:, :-1] "
            "over the whole sequence, unmasked: the slot after the last response token holds the critic's value of "
            "that last real token (kept permissive)",
            "nonfinite_poison": f"ROLL {rev}: values are the critic's output, "
            f"roll/pipeline/base_worker.py:{fn['values']} (finite); token rewards are score - beta * kld with "
            f"roll/utils/functionals.py:{fn['kl']} kld = log-prob difference * response_mask (finite "
            "log-probs, 0 under the mask)",
        },
        produces={
            "gaps": f"ROLL {rev}: roll/pipeline/agentic/env_manager/traj_env_manager.py:{fn['turns']} concatenates "
            "[0] * prompt/observation + [1] * response for every turn of a trajectory",
            "leading_mask": f"ROLL {rev}: roll/pipeline/agentic/env_manager/traj_env_manager.py:{fn['turns']} (and "
            f"step_env_manager.py:{fn['step_mask']}) a sample starts with [0] * len(prompt_ids): real masked "
            "tokens before the first response token in the [:, 1:] layout",
            "empty_rows": empty,
            "masked_values": f"ROLL {rev}: roll/pipeline/base_worker.py:{fn['values']} forward_func_values: values = "
            "output_tensor[:, :-1], the critic's output at every position (observation tokens, the slot after a "
            "turn's last token, padding), unmasked; roll/pipeline/agentic/agentic_pipeline.py:"
            f"{fn['cv']} critic.compute_values(batch) -> batch.union(values); roll/pipeline/agentic/utils.py:"
            f"{fn['gae']} agentic_compute_advantage stores values * response_mask but hands the unmasked values to "
            "compute_gae_advantage_return",
            "token_rewards": f"ROLL {rev}: roll/utils/functionals.py:{fn['kl']} compute_token_reward with "
            "add_token_level_kl: token_level_rewards = score - kl_ctrl.value * kld at every response token "
            f"(called at roll/pipeline/agentic/agentic_pipeline.py:{fn['trcall']})",
            "truncated_rows": f"ROLL {rev}: roll/pipeline/agentic/env_manager/traj_env_manager.py:{fn['ml']} "
            f"make_decision stops at the sequence length (GenerateStopReason.MAX_LENGTH) and :{fn['mlf']} "
            "formulates the trajectory cut there",
            "truncated_padded": f"ROLL {rev}: roll/pipeline/agentic/env_manager/traj_env_manager.py:{fn['pad']} "
            "pads every trajectory to sequence_length after its last response token (the cut turn's observation "
            f"is popped, :{fn['pop']})",
        },
    )


_KL = {"c09bc8bc9f43": "208,618-624", "090ac94658ad": "207,625-631", "8eb27cc2dc34": "209,621-627"}
_VALUES = {"c09bc8bc9f43": "675-678", "090ac94658ad": "675-678", "8eb27cc2dc34": "690-693"}
RLVR_PIPELINE = {
    rev: _rlvr_pipeline(rev, dict(fn, kl=_KL[rev], values=_VALUES[rev]))
    for rev, fn in {
        "c09bc8bc9f43": dict(
            resp="930",
            sample="728-729",
            call="652-662",
            tail="925-930",
            shift="919-928",
            cv="574,616",
            gae="819-822",
            boot="527",
            maxlen="692-694",
            final="729",
            trcall="645",
            rl="890-892",
        ),
        "090ac94658ad": dict(
            resp="941",
            sample="735-736",
            call="652-662",
            tail="936-941",
            shift="930-939",
            cv="574,616",
            gae="828-832",
            gae_masks=True,  # PR #447: values = values * response_mask before the GAE call
            boot="534",
            maxlen="699-701",
            final="736",
            trcall="645",
            rl="901-903",
        ),
        "8eb27cc2dc34": dict(
            resp="1292",
            sample="731-732",
            call="710-721",
            tail="1287-1292",
            shift="1281-1290",
            cv="623,665",
            gae="1163-1166",
            boot="530",
            maxlen="695-697",
            final="732",
            trcall="703",
            rl="1235-1237",
        ),
    }.items()
}
_ENV_C09 = dict(
    turns="303-307",
    pop="289-290",
    first="315",
    step_pop="71-72",
    step_mask="78",
    native_pop="235-237",
    native_mask="258",
    vl_pop="413-414",
    vl_cut="453",
    ph="441-444",
    filt="514-516",
    ml="204",
    mlf="125",
    pad="338-341",
    call="454-463",
    mask="469-470",
    cv="413,417",
    gae="503-507",
    trcall="448",
)
AGENTIC_PIPELINE = {
    rev: _agentic_pipeline(rev, dict(fn, kl=_KL[rev], values=_VALUES[rev]))
    for rev, fn in {
        "c09bc8bc9f43": dict(_ENV_C09, padfn="455-465"),
        "090ac94658ad": dict(_ENV_C09, padfn="462-472"),
        "8eb27cc2dc34": dict(
            turns="325-329",
            pop="311-312",
            first="337",
            step_pop="71-72",
            step_mask="78",
            native_pop="234-236",
            native_mask="257",
            vl_pop="413-414",
            vl_cut="453",
            mt_leaf="404-406",
            mt_step="432-433",
            ph="441-443",
            filt="514-515",
            proxy_ph="399-406",
            ml="226",
            mlf="129",
            pad="360-363",
            padfn="456-466",
            call="499-508",
            mask="469-470",
            cv="448,452",
            gae="535-539",
            trcall="492",
        ),
    }.items()
}
_SEED_REV = "c09bc8bc9f43"


# ---------------------------------------------------------------------------------------------
# Entries beyond GAE (loaders in targets/roll/calls_kinds.py). Line references per pin: the math is the same at
# all three pins (reward_norm / masked_mean differ only in formatting at 090ac94658ad), the lines move.
# ---------------------------------------------------------------------------------------------
_LINES = {
    # rev: (functionals: reward_norm def, reshape, torch.std, eps, grpo forces group/group, compute_approx_kl def,
    #       k3 lines, mask product, logits.float(), masked_mean eps, Bessel, masked_whiten def, whiten eps,
    #       compute_advantage .float(), whiten call, advantages * response_mask, final_response_mask float;
    #       agentic/utils.py: agentic reinforce call, advantages * response_mask, .float())
    "c09bc8bc9f43": dict(
        rn=561,
        reshape=566,
        std=583,
        eps=590,
        force=653,
        kl=180,
        k3="200-201",
        klmask=208,
        logits=214,
        mean=289,
        bessel=312,
        whiten=363,
        weps=366,
        flt=813,
        wcall=839,
        amask=840,
        final=729,
        agcall="513-514",
        agmask=528,
        agflt=497,
        pg="539,625",
        prompt="539",
        placeholder="434-478",
    ),
    "8eb27cc2dc34": dict(
        rn=564,
        reshape=569,
        std=586,
        eps=593,
        force=656,
        kl=181,
        k3="201-202",
        klmask=209,
        logits=215,
        mean=290,
        bessel=313,
        whiten=364,
        weps=367,
        flt=1157,
        wcall=1183,
        amask=1184,
        final=732,
        agcall="545-546",
        agmask=560,
        agflt=529,
        pg="574,680",
        prompt="574",
        placeholder="433-477",
    ),
    "090ac94658ad": dict(
        rn=568,
        reshape=573,
        std=590,
        eps=597,
        force=660,
        kl=179,
        k3="199-200",
        klmask=207,
        logits=213,
        mean=294,
        bessel=318,
        whiten=369,
        weps=372,
        flt=822,
        wcall=849,
        amask=850,
        final=736,
        agcall="513-514",
        agmask=528,
        agflt=497,
        pg="539,625",
        prompt="539",
        placeholder="434-478",
    ),
}
_FN = "roll/utils/functionals.py"
_AG = "roll/pipeline/agentic/utils.py"
_F32 = ("float32", "bfloat16", "float16")


def _narrow(base: Domain, **changes) -> Domain:
    """`base` with `changes`; a feature narrowed here loses its production citation (no witness may use it)."""
    why = changes.pop("why", {})
    produces = {k: v for k, v in base.produces.items() if changes.get(k, True) is not False}
    return dataclasses.replace(base, **changes, why={**base.why, **why}, produces=produces)


def _kl_pipeline(rev: str) -> Domain:
    ln = _LINES[rev]
    return Domain(
        dtypes=("float32",),
        nonfinite_poison=False,
        why={
            "dtypes": f"ROLL {rev}: log-probs come from log_probs_from_logits, {_FN}:{ln['logits']} "
            "logits.float(): float32",
            "nonfinite_poison": f"ROLL {rev}: log-probs of real and padding tokens alike are log_softmax outputs "
            f"({_FN}:{ln['logits']}), finite",
        },
    )


# WorkerConfig.apply_loss_scale (default True), the same help text at the three pins: what every worker's training loss
# promises under data parallelism and gradient accumulation (the strategies multiply each micro-batch loss by
# DP x GA, megatron_strategy.py:1295, fsdp2_strategy.py:1588 at 8eb27cc2dc34).
_LOSS_SCALE_TEXT = (
    "Whether to multiply the aggregated loss by the global loss_scale (typically the total number of micro-batches in "
    "a global step, i.e., DP×GA) to cancel the backend’s default gradient-mean behavior under Data Parallel + Gradient "
    "Accumulation. This restores a sum-over-microbatches semantics so the resulting gradients are equivalent to "
    "computing the loss on the full global batch at once with the global denominator"
)
_LOSS_SCALE_NOTE = (
    "apply_loss_scale defaults to True and the strategies apply it to the loss every worker's loss_func returns (the "
    "actor's agg_loss, the critic's CriticWorker.loss_func): the step's loss and gradient must not depend on its "
    "micro-batch split"
)
LOSS_SCALE_PROMISES = (
    Promise(
        id="upstream:roll/configs/worker_config.py:218-223",
        text=_LOSS_SCALE_TEXT,
        covers=("split-invariance",),
        note=_LOSS_SCALE_NOTE,
        pins=("c09bc8bc9f43", "090ac94658ad"),
    ),
    Promise(
        id="upstream:roll/configs/worker_config.py:234-239",
        text=_LOSS_SCALE_TEXT,
        covers=("split-invariance",),
        note=_LOSS_SCALE_NOTE,
        pins=("8eb27cc2dc34",),
    ),
)
# PR #447's own regression test (tests/utils/test_functionals.py, at its head only): a masked critic value of 100 must
# not move the valid advantages of compute_advantage's GAE branch, on the api (no pipeline needed).
PR447_TEST = Promise(
    id="upstream:tests/utils/test_functionals.py:66-93",
    text='response_mask = torch.tensor([[1.0, 1.0, 0.0]]) ... values = torch.tensor([[0.0, 0.0, 100.0]]) ... '
    'expected = torch.tensor([[0.95, 1.0, 0.0]]) ... torch.testing.assert_close(data.batch["advantages"], expected)',
    covers=("poison",),
    note="test_compute_advantage_masks_values_before_gae_bootstrap calls compute_advantage(adv_estimator='gae', "
    "response_mask=...) as the RLVR pipeline does: a masked value must not bootstrap into valid advantages",
    pins=("090ac94658ad",),
)


def _kind_overrides() -> dict:
    """entry -> TargetSpec field changes; pipelines per pin (the seed pin is the default)."""

    def by_pin(make):
        doms = {rev: make(rev) for rev in _LINES}
        return {"pipeline": doms[_SEED_REV], "pipeline_by_pin": {r: d for r, d in doms.items() if r != _SEED_REV}}

    api = Domain(
        dtypes=_F32,
        left_padding=False,
        why={
            "dtypes": "compute_advantage / agentic_compute_advantage cast the token rewards to float32 (`.float()`): "
            "a float64 case would be judged at float64 tolerance on float32 arithmetic",
            "left_padding": "postprocess_generate left-aligns every sequence; expand_to_token_level places the score "
            "by position_ids * attention_mask",
        },
    )
    out: dict = {}
    out["grpo"] = dict(
        kind="group-advantage",
        # estimator grpo; torch.std (unbiased) per (-1, n_sample) block; (r - mean) / (std + 1e-6): the defaults
        # (functionals.py:586, :593 at 8eb27cc2dc34). n_sample = 1 gives std NaN: no singleton rule, left canonical.
        # Rows without a trained token count in the group statistics by design: reward_postprocess normalises every
        # row's score (reward_norm reshapes all of them, functionals.py:569 at 8eb27cc2dc34), whatever the sample mask
        # get_sample_level_mask made (rlvr_pipeline.py:687-696): empty_rows "counted"
        variant={"empty_rows": "counted"},
        domain=api,
        masked_zero=True,  # compute_advantage ends with advantages * response_mask (functionals.py:1184)
        documented_errors=(r"GroupShapeError", r"TruncationShapeError"),
        options=(whiten_option(WHITEN_RLVR_CITE, {"variant": {"whiten_tokens": True}}), MAX_LEN_MASK),
        truncation=GRPO_TRUNCATION,
        **by_pin(lambda rev: _narrow(RLVR_PIPELINE[rev], why={})),
        notes="ROLL has no group ids: reward_norm reshapes to (-1, num_return_sequences); the adapter orders rows "
        "group by group (rlvr_pipeline.py keeps the generation order, prompt_id = arange); unequal group sizes are "
        "a documented GroupShapeError. gamma 1 (the config default) in compute_reinforce_return.",
    )
    out["agentic-grpo"] = dict(
        kind="group-advantage",
        # std unbiased (scores_float.std(), agentic/utils.py:133), eps 1e-6 outside (:140); a group of one element
        # or with |std| <= 1e-6 gets zeros, the code's own comment: "avoid division by zero for a single element
        # or zero std" (agentic/utils.py:138-142): singleton "zero". Rows without a trained token (the agent-native
        # placeholder rollout keeps its episode's traj_group_id, agent_native_env_manager.py:475-477 at
        # 8eb27cc2dc34) count in their group: agentic_reward_norm takes every row of batch.group_by(grouping)
        # (agentic/utils.py:117-135), whatever its response_mask: empty_rows "counted"
        variant={"singleton": "zero", "empty_rows": "counted"},
        domain=api,
        masked_zero=True,  # agentic_compute_advantage ends with advantages * response_mask (agentic/utils.py:560)
        options=(whiten_option(WHITEN_AGENTIC_CITE, {"variant": {"whiten_tokens": True}}), NORM_STD),
        **by_pin(lambda rev: _narrow(AGENTIC_PIPELINE[rev], why={})),
        notes="agentic_reward_norm groups by traj_group_id (batch.group_by, any order and sizes), the shipped GRPO "
        "configs' grouping; group ids passed as traj_group_id strings",
    )
    for name, variant in (
        ("kl", {"estimator": "k1"}),  # kl_penalty "kl": log_probs - log_probs_base (functionals.py:193-194)
        ("kl-abs", {"estimator": "abs"}),
        ("kl-mse", {"estimator": "mse"}),  # 0.5 * d^2 (functionals.py:197-198)
        # k3: exp(base - logp) - (base - logp) - 1, clamped to [-10, 10] (functionals.py:199-202 at 8eb27cc2dc34)
        ("kl-k3", {"estimator": "k3", "clamp": (-10.0, 10.0)}),
    ):
        out[name] = dict(
            kind="kl",
            variant=variant,
            domain=Domain(),
            masked_zero=True,  # `return log_ratio * action_mask` (functionals.py:209 at 8eb27cc2dc34)
            **by_pin(_kl_pipeline),
        )

    def whiten_pipeline(rev: str) -> Domain:
        ln = _LINES[rev]
        return _narrow(
            RLVR_PIPELINE[rev],
            dtypes=("float32",),
            why={
                "dtypes": f"ROLL {rev}: compute_advantage whitens token_level_rewards.float() and the float32 "
                f"advantages ({_FN}:{ln['flt']}, :{ln['wcall']}) with the float32 final_response_mask "
                f"({_FN}:{ln['final']})"
            },
        )

    out["whiten"] = dict(
        kind="normalization",
        # batch level; masked_var with Bessel's correction (functionals.py:313), eps 1e-8 inside the rsqrt
        # (:367), shift_mean True as compute_advantage calls it (:1183): the defaults (lines at 8eb27cc2dc34)
        variant={},
        domain=Domain(),
        masked_zero=False,
        masked_zero_why="masked_whiten returns (values - mean) * rsqrt(var + 1e-8) at every position "
        "(roll/utils/functionals.py:367 at 8eb27cc2dc34); compute_advantage multiplies by the mask after (:1184)",
        documented_errors=(
            r"ValueError: At least one element in the mask has to be 1",
            r"ValueError: The sum of the mask is one",
        ),
        **by_pin(whiten_pipeline),
    )

    def returns_pipeline(rev: str) -> Domain:
        ln = _LINES[rev]
        return _narrow(
            AGENTIC_PIPELINE[rev],
            critic=False,
            why={
                "critic": f"ROLL {rev}: compute_agentic_reinforce_return takes no values and ignores lambd "
                f"({_AG}:391-402, called at :{ln['agcall']})"
            },
        )

    out["agentic-reinforce"] = dict(
        kind="returns",
        # segment-level discount: each contiguous run of response_mask == 1 is one step, G = r[end - 1] + gamma G
        # and every token of the segment gets G (agentic/utils.py:391-455, docstring :395-396): the `segment`
        # contract (a turn's reward is the sum of its tokens' rewards; ROLL reads only the last one, :447)
        contract="segment",
        whitening=None,  # whiten_advantages defaults to False (base_config.py:546)
        domain=dataclasses.replace(api, critic=False),
        masked_zero=True,  # returns written only on segments (agentic/utils.py:450); advantages * mask (:560)
        options=(whiten_option(WHITEN_AGENTIC_CITE, {"whitening": WHITEN}),),
        **by_pin(returns_pipeline),
    )
    # the same call after compute_token_reward with the KL term fed by real log-probs (agentic_pipeline.py:492 at
    # 8eb27cc2dc34, :448 at the older pins; KL_VARIANT): the KL of every token but a turn's last is dropped (:447)
    out["agentic-reinforce-kl"] = dict(
        out["agentic-reinforce"],
        variant=dict(KL_VARIANT),
        domain=kl_reward_domain(out["agentic-reinforce"]["domain"], None),
        **by_pin(lambda rev: kl_reward_domain(returns_pipeline(rev), rev)),
    )

    # agg_loss (roll/utils/functionals.py:228-282 at 8eb27cc2dc34, from :227 at 090ac94658ad, same body) with the
    # strategies' global batch_num_tokens / global_valid_samples (calls_kinds.load_loss). Every mode is left
    # canonical (rows without a trained token excluded: `valid_samples = torch.any(loss_mask > 0, -1)`, :259),
    # so what ROLL does differently is reported:
    # * token-mean sums `loss_mat * weights` without the mask (:253-256): masked per-token losses count;
    # * seq-mean-token-sum-norm divides by `loss_mask.shape[-1]`, the padded width, and not by the rows (:269-278;
    #   its comment: "should ideally be constant ... TODO"): constant = 32 is what the Dr.GRPO reference needs
    #   (the generation limit), no ROLL option sets it.
    def loss_entry(variant: dict) -> dict:
        return dict(
            kind="loss-aggregation",
            variant=variant,
            masked_zero=True,  # canonical: dL/dl is 0 under the mask (masked_sum / masked_mean multiply by it)
            masked_zero_why="",
            whitening=None,
            documented_errors=(),
            # micro-batches may hold different row counts (use_dynamic_batching_in_train, worker_config.py:148 at
            # 8eb27cc2dc34, :140 at c09bc8bc9f43): uneven_splits stays in the api domain
            domain=Domain(),
            pipeline=None,  # not researched as a Domain: every finding is reach api (docs/kinds/roll.md: reach)
            pipeline_by_pin={},
            promises=LOSS_SCALE_PROMISES,
        )

    out["agg-token-mean"] = loss_entry({"mode": "token-mean"})
    out["agg-seq-mean-token-sum"] = loss_entry({"mode": "seq-mean-token-sum"})
    out["agg-seq-mean-token-mean"] = loss_entry({"mode": "seq-mean-token-mean"})
    out["agg-seq-mean-token-sum-norm"] = loss_entry({"mode": "seq-mean-token-sum-norm", "constant": 32})
    # CriticWorker.loss_func (roll/pipeline/base_worker.py:652-688 at 8eb27cc2dc34, :637-673 at c09bc8bc9f43 and
    # 090ac94658ad): 0.5 * masked_mean(max((v - R)^2, (clip(v, v_old - c, v_old + c) - R)^2), response_mask,
    # dim=-1).mean(), value_clip 0.5 (shipped PPO configs; None in base_config.py:524-526), calls_kinds.load_value.
    # The critic's aggregation is the mean over rows of each row's token mean. Left canonical, so the judge
    # reports it: the row mean is per micro-batch (no global normaliser, while apply_loss_scale multiplies every
    # micro-batch loss by DP x GA, worker_config.py:230-238 documenting "sum-over-microbatches semantics ...
    # with the global denominator"), and rows without a trained token count in it (masked_mean(dim=-1) gives 0
    # for them, functionals.py:285-288, then `.mean()` over all rows).
    # Variant as the critic implements it: a row without a trained token gets masked_mean(dim=-1) = 0 (functionals.py
    # :285-288) and counts in `.mean()` over the micro-batch's rows (base_worker.py:678 at 8eb27cc2dc34, :663 at the
    # older pins): empty_rows "counted". The scope stays "step": apply_loss_scale's help promises gradients "equivalent
    # to computing the loss on the full global batch at once with the global denominator" (LOSS_SCALE_PROMISES), which
    # the critic's per-micro-batch row mean breaks (split-invariance, a defect naming that promise).
    out["value-loss"] = dict(
        loss_entry({"clip": 0.5, "half": True, "mode": "seq-mean-token-mean", "empty_rows": "counted"}),
        kind="value-loss",
        options=(VALUE_CLIP_OPTION,),
    )
    # ActorWorker.loss_func (roll/pipeline/rlvr/actor_worker.py:11-167, the same lines at the three pins), its inline
    # policy loss compiled from the source text (calls_kinds.load_policy): ratio = exp(log_probs - old_log_probs)
    # (importance_sampling "token", rlvr_config.py:141-143), surr1 / surr2 with pg_clip 0.2 on both sides
    # (use_pg_clip_range False, base_config.py:515-516), loss = -min(surr1, surr2) (actor_worker.py:80-83); no dual
    # clip (dual_clip_loss False, base_config.py:574); agg_loss with loss_agg_mode "seq-mean-token-mean"
    # (base_config.py:571-573) and the strategies' global_valid_samples (:92-96); per-token advantages
    # (data.batch["advantages"], :20). Lines at 8eb27cc2dc34.
    out["policy-loss"] = dict(
        loss_entry(
            {"clip_low": 0.2, "clip_high": 0.2, "dual_clip": None, "advantages": "token", "mode": "seq-mean-token-mean"}
        ),
        kind="policy-loss",
        options=(DUAL_CLIP_OPTION,),
    )
    return out


# ---- KL in the reward (`oracles.kinds.gae.kl_reward`): the variant the KL entries are judged against; KL_COEF (ROLL's
# init_kl_coef default, cited in calls.py) is the beta the calls hand ROLL's FixedKLController.
KL_VARIANT = {"kl_reward": {"coef": KL_COEF, "estimator": "k1", "clamp_d": None, "clamp": None}}
_BASE_CFG = {"c09bc8bc9f43": "488-497,524", "090ac94658ad": "488-497,524", "8eb27cc2dc34": "527-536,563"}
_TOKEN_REWARD = {"c09bc8bc9f43": "612-624", "090ac94658ad": "619-631", "8eb27cc2dc34": "615-627"}


def kl_reward_domain(base: Domain, rev: str | None) -> Domain:
    """`base` for a KL-in-the-reward entry: the case's token rewards can only be 0 (ROLL's only token reward is the KL
    term, which the entry feeds with the case's log-probs); in a pipeline domain (`rev` given) masked log-probs are
    real log-probs of the sampled tokens (self-evident); the api domain keeps them any number."""
    at = f"ROLL {rev}: " if rev else ""
    line = _TOKEN_REWARD[rev or _SEED_REV]
    why = {
        "token_rewards": f"{at}roll/utils/functionals.py:{line} compute_token_reward builds token_level_rewards "
        "from the score (expand_to_token_level) and - beta * kld only: no other token-level reward reaches the "
        "advantage",
    }
    if rev is None:
        return _narrow(base, token_rewards=False, why=why)
    why["masked_logprobs"] = "old_log_probs / ref_log_probs are log-probs of the sampled tokens at every position"
    return _narrow(base, token_rewards=False, masked_logprobs=False, why=why)


def _kl_overrides() -> dict:
    """`default-kl`: the RLVR GAE path with the KL term fed by real log-probs (the agentic-reinforce-kl entry is in
    `_kind_overrides`)."""
    return {
        "default-kl": dict(
            variant=dict(KL_VARIANT),
            domain=kl_reward_domain(SPEC_DOMAIN, None),
            pipeline=kl_reward_domain(RLVR_PIPELINE[_SEED_REV], _SEED_REV),
            pipeline_by_pin={
                rev: kl_reward_domain(dom, rev) for rev, dom in RLVR_PIPELINE.items() if rev != _SEED_REV
            },
            options=(whiten_option(WHITEN_RLVR_CITE, {"whitening": WHITEN}), MAX_LEN_MASK),
            truncation=RLVR_TRUNCATION,
            documented_errors=(r"TruncationShapeError",),
            promises=(PR447_TEST,),
            notes="kl_reward: coef = init_kl_coef 0.2 (base_config.py default, example_ppo.yaml:69), kl_penalty 'kl'",
        )
    }


KIND_OVERRIDES = _kind_overrides()
SPEC_DOMAIN = Domain(
    dtypes=("float32", "bfloat16", "float16"),
    left_padding=False,
    why={
        "dtypes": "compute_advantage casts rewards and values to float32 (`.float()`): a float64 case would be "
        "judged at float64 tolerance on float32 arithmetic",
        "left_padding": "postprocess_generate left-aligns every sequence (prompt, response, right padding), so "
        "no batch reaching compute_advantage is left-padded",
    },
)

SPEC = TargetSpec(
    id="roll",
    first_run=('default', 'grpo', 'policy-loss'),
    adapter="maskfuzz.targets.roll.calls",
    own=("roll",),
    # ROLL multiplies token rewards and (for storage) values by the response mask and then runs a plain GAE loop
    # over every position: masked tokens are intended as zero-value, zero-reward transitions.
    contract="dense",
    git_url="https://github.com/alibaba/ROLL.git",
    pins=(
        Pin("c09bc8bc9f43", "seed report 000: compute_advantage hands unmasked critic values to GAE", kind="git"),
        Pin("8eb27cc2dc34", "main at the mirror snapshot (2026-08-18): the GAE branch is unchanged", kind="git"),
        Pin(
            "090ac94658ad",
            "PR #447 head (refs/pull/447/head, not merged): masks values before GAE in compute_advantage only",
            kind="git",
        ),
    ),
    entries=("default", "agentic", *KIND_ENTRIES, "default-kl"),
    whitening=None,  # whiten_advantages defaults to False in ROLL's PPOConfig; the adapter keeps it off
    masked_zero=True,  # both entries end with `advantages = advantages * response_mask`
    # tensordict is not stood in for: the batch must be a real TensorDict. imageio/requests are imported by the
    # agentic utilities for rendering and HTTP dumps; transfer_queue by the HEAD protocol's remote batches.
    stand_ins=tuple(n for n in COMMON_HEAVY if n != "tensordict") + ("imageio", "requests", "transfer_queue"),
    # a present torch_npu makes roll.platforms pick the NPU platform (and DataProto convert int64 to int32)
    deny=("torch_npu",),
    domain=SPEC_DOMAIN,
    pipeline=RLVR_PIPELINE[_SEED_REV],
    pipeline_by_pin={rev: dom for rev, dom in RLVR_PIPELINE.items() if rev != _SEED_REV},
    entry_overrides={
        # options and truncation per entry (calls_kinds "Options and truncation"); the kind entries declare theirs
        "default": {
            "promises": (PR447_TEST,),
            "options": (whiten_option(WHITEN_RLVR_CITE, {"whitening": WHITEN}), MAX_LEN_MASK),
            "truncation": RLVR_TRUNCATION,
            "documented_errors": (r"TruncationShapeError",),
        },
        "agentic": {
            "pipeline": AGENTIC_PIPELINE[_SEED_REV],
            "pipeline_by_pin": {rev: dom for rev, dom in AGENTIC_PIPELINE.items() if rev != _SEED_REV},
            "options": (whiten_option(WHITEN_AGENTIC_CITE, {"whitening": WHITEN}),),
            "truncation": AGENTIC_TRUNCATION,
        },
        **KIND_OVERRIDES,
        **_kl_overrides(),
    },
    notes="score on the last attended token (ROLL's expand_to_token_level), token rewards through ROLL's KL term",
)

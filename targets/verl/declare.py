"""Adapter for verl: `verl/trainer/ppo/core_algos.py::compute_gae_advantage_return`.

The function takes `(token_level_rewards, values, <mask>, gamma, lam)`, all [B, T] over the
right-padded response window, and returns `(advantages, returns)`; the advantages are whitened
inside with `verl.utils.torch_functional.masked_whiten` over the mask (the whole batch). The mask
argument is `eos_mask` in 0.1 ... 0.3.x and `response_mask` from 0.4.0 (#878); the adapter reads
the signature at each pin and passes the name that pin uses.

Two behaviours across the releases (read at each pin, nothing is assumed):

* 0.1 ... 0.4.1: a plain GAE loop over all T positions; the mask is used for whitening only.
* 0.5.0 ... 0.9.1 (commit 0332866, #2337 "mask out observation token in GAE"): values and TD
  errors of masked ("observation") positions are skipped; the carry passes through them.

Score placement is verl's own code: the naive reward manager (`verl/workers/reward_manager/
naive.py::NaiveRewardManager.__call__` from 0.2, `verl/trainer/main_ppo.py::RewardManager` in
0.1) writes the score at `valid_response_length - 1`, with `valid_response_length` the number of
attended response tokens: the last *attended* response token, which is an observation token when
a multi-turn episode ends in a tool response. The adapter runs that code on a DataProto built from
the case, with a scorer that returns 1.0, to learn the position, and puts the case's score there
in the case's dtype (the manager's own tensor is float32, which would round a float64 score).

Pipeline domain: what verl's own trainer (`verl/trainer/ppo/ray_trainer.py`), rollouts, reward managers
and critics can hand the function, per pin (every narrowing cites file:line at that pin in `why`).
0.1 and 0.4.1 pass `attention_mask[:, -response_length:]` as the mask (ray_trainer.py:118 in 0.1;
compute_response_mask, set unconditionally at ray_trainer.py:1012 in 0.4.1, where multi-turn + GAE is also
asserted out), so the mask equals the attention of a right-padded response: no gaps, observation tails,
leading masked tokens or all-masked rows with real tokens. From the agent loop (#2124, so at both git pins)
and in 0.5.0 / 0.9.1 the rollout's own response_mask reaches GAE (tool tokens 0), so those shapes stay
allowed (sglang multi-turn truncates a response inside a tool turn; custom agent loops are a config option).
Everywhere: the run dtype is float32 (reward tensors are float32, 0.9.1 casts values with .float()), the
response window is right-padded, and values and rewards are finite critic / scorer outputs. Masked token
rewards: the KL penalty is multiplied by the mask and every built-in reward manager writes only the score at
the last attended token, so they are excluded up to 0.5.0; 0.9.1 loads external reward managers from config
(verl/trainer/ppo/reward.py:96-105), so it stays allowed there. Masked values: 0.1's FSDP critic does not
mask values (model outputs at padding), 0.4.1's critics zero them (mask == attention), 0.5.0 and the git pins'
Megatron critic masks with the attention only and 0.9.1 masks nothing but padding, so tool-token values stay.

Production citations (`Domain.produces`, what a pipeline witness may use): 0.1 the FSDP critic's values at padding and
the KL in the reward at trainable tokens; 0.4.1 the KL only (and, for the GRPO branch, the sglang multi-turn loss_mask
with its tool tokens and their unmasked KL, `declare_pipeline.pipeline_grpo_0_4_1`); 0.5.0 and the git pins gaps and
observation tails (sglang multi-turn, the tool agent loop at 11ee5125d) with the Megatron critic's values under tool
tokens; 0.9.1 the tool agent loop's gaps, the engine critic's values under the mask, and rollout correction's rejection
sampling (`algorithm.rollout_correction.rollout_rs`), which masks tokens *after* the reward manager placed the score
and the KL in the reward was masked: tails holding the score, leading masks, all-masked rows and KL terms under the
mask. Nothing cites NaN / inf (values and rewards are finite everywhere) or a non-score reward under the mask before
0.9.1 (except 0.4.1's GRPO branch).

This module is the declaration (the GAE entry's promises and `SPEC`), with `declare_pipeline.py` (the pipeline
domains and their production citations) and `declare_kinds.py` (the entries beyond GAE, their options and
promises); the calls the worker runs are `calls.py` (GAE) and `calls_kinds.py` (the other kinds).
"""

from __future__ import annotations

from maskfuzz.oracles.domain import Domain
from maskfuzz.oracles.promises import Promise
from maskfuzz.oracles.whitening import Whitening
from maskfuzz.targets.registry import COMMON_HEAVY, Pin, TargetSpec, Truncation
from maskfuzz.targets.verl.declare_kinds import KIND_OVERRIDES
from maskfuzz.targets.verl.declare_pipeline import (
    BEFORE_MASKING,
    MASKING_COMMIT,
    PIPELINE_0_5_0,
    pipeline_0_1,
    pipeline_0_4_1,
    pipeline_0_9_1,
    pipeline_git,
)

# --- verl's own words about the GAE entry (`Promise`): #2337 on, compute_gae_advantage_return says it skips what sits
# at observation (masked) tokens, and verl's own test checks that masked values do not move the advantages. Before
# #2337 (0.1, 0.4.1, 11ee5125d) the docstring only calls the mask an "[EOS] mask" and the loop is dense: its gap
# decay is a semantics fact there, the behaviour change of 0332866.
_SKIP_OBSERVATION = "# skip values and TD-error on observation tokens"
_SKIP_COVERS = (
    "gap-invariance",
    "mechanism:extra-decay",
    "mechanism:masked-value-bootstrap",
    "mechanism:masked-reward-leak",
)
_SKIP_NOTE = (
    "the reverse loop carries nextvalues and lastgaelam through masked positions (the two lines below the comment): "
    "a masked token's value and TD error (its reward included) never enter a trained advantage, and a gap costs no "
    "decay"
)
_GAE_TEST = (
    '"""Test multi-turn GAE skip observation tokens.""" ... response_mask = torch.tensor([[0, 0, 1, 1, 1, 0, 0, 1, 1, '
    "0, 0]], dtype=torch.float) ... adv1, ret1 = compute_gae_advantage_return(rewards, values1, response_mask, gamma, "
    "lam) ... assert torch.equal(adv1, adv2)"
)
_GAE_TEST_NOTE = (
    "verl's own test_multi_turn_compute_gae_advantage_return: values1 and values2 differ only at masked positions "
    "(random there), the advantages must be bitwise equal"
)
GAE_PROMISES = (
    Promise("upstream:verl/trainer/ppo/core_algos.py:232", _SKIP_OBSERVATION, _SKIP_COVERS, _SKIP_NOTE, ("0.5.0",)),
    Promise(
        "upstream:verl/trainer/ppo/core_algos.py:197", _SKIP_OBSERVATION, _SKIP_COVERS, _SKIP_NOTE, (MASKING_COMMIT,)
    ),
    Promise("upstream:verl/trainer/ppo/core_algos.py:254", _SKIP_OBSERVATION, _SKIP_COVERS, _SKIP_NOTE, ("0.9.1",)),
    Promise(
        "upstream:tests/trainer/ppo/test_core_algos_on_cpu.py:134-187",
        _GAE_TEST,
        ("mechanism:masked-value-bootstrap",),
        _GAE_TEST_NOTE,
        ("0.5.0", MASKING_COMMIT),
    ),
    Promise(
        "upstream:tests/trainer/ppo/test_core_algos_on_cpu.py:144-197",
        _GAE_TEST,
        ("mechanism:masked-value-bootstrap",),
        _GAE_TEST_NOTE,
        ("0.9.1",),
    ),
)

# No truncation notion anywhere in verl's advantage code: a row cut by the response length (no EOS) is handed on like
# an ended one. compute_gae_advantage_return starts its reverse loop with nextvalues = 0 and lastgaelam = 0
# (core_algos.py:245-246 at 0.9.1, the same at HEAD; :223-224 in 0.5.0) and carries nextvalues through masked
# positions (:255), so the value after a row's last trained token is 0: terminal. 0.1 / 0.4.1 use 0.0 after the
# window's last position only (nextvalues = values[:, t + 1] ... else 0.0, core_algos.py:97 in 0.1, :187 in 0.4.1): a
# cut row that fills the window is terminal there too, one followed by padding reads the padding's value (the plain
# loop's known leak, judged by the poison property, not a truncation semantics).
GAE_TRUNCATION = Truncation(
    cite="verl/trainer/ppo/core_algos.py:245 (0.9.1): nextvalues = 0 before the reverse loop, carried through masked "
    "positions (:255); no EOS / truncation input (the signature at :216-222), so a cut row gets a zero bootstrap"
)


SPEC = TargetSpec(
    id="verl",
    first_run=('default', 'grpo', 'policy-loss'),
    adapter="maskfuzz.targets.verl.calls",
    own=("verl",),
    contract="compressed",
    git_url="https://github.com/volcengine/verl.git",
    package="verl",
    # "default" is GAE (compute_gae_advantage_return); the others are the kinds beyond GAE (declare_kinds.py)
    entries=("default", *KIND_OVERRIDES),
    entry_overrides=KIND_OVERRIDES,
    # GAE: no option of verl's changes compute_gae_advantage_return's math (whitening is unconditional,
    # core_algos.py:262 at 0.9.1); a cut row is terminal (GAE_TRUNCATION); the other entries set their own
    truncation=GAE_TRUNCATION,
    promises=GAE_PROMISES,
    pins=(
        Pin("0.1", "first release; mask argument named eos_mask; plain GAE loop"),
        Pin("0.4.1", "last release before #2337: plain GAE loop, mask used only for whitening", default=True),
        Pin("0.5.0", "first release with #2337 (GAE skips values and TD errors of masked tokens)", default=True),
        Pin("0.9.1", "newest release", default=True),
        Pin(MASKING_COMMIT, "#2337 [algo] feat: mask out observation token in GAE", kind="git"),
        Pin(BEFORE_MASKING, "parent of #2337: last commit with the plain GAE loop", kind="git"),
    ),
    # verl_F.masked_whiten: (x - masked_mean) * rsqrt(masked_var(unbiased=True) + 1e-8), shift_mean=True,
    # identical in 0.1 ... 0.9.1 (0.4+ divides the mean by mask.sum() + 1e-8, a 1e-8 relative change).
    whitening=Whitening(unbiased=True, eps=1e-8),
    masked_zero=False,
    masked_zero_why=(
        "compute_gae_advantage_return whitens the whole [B, T] advantage tensor, so masked positions hold "
        "(carry - mean) / std, never zeroed (0.5+ also carries lastgaelam through masked positions on purpose); "
        "verl's own test tests/trainer/ppo/test_core_algos_on_cpu.py::test_multi_turn_compute_gae_advantage_return "
        "multiplies returns by response_mask before comparing, and the policy loss aggregates with response_mask"
    ),
    documented_errors=(
        # verl/utils/torch_functional.py::masked_var (unbiased) with < 2 masked elements in the batch
        r"ValueError: At least one element in the mask has to be 1",
        r"ValueError: The sum of the mask is one, which can cause a division by zero",
    ),
    # Missing heavy packages imported at module level by verl, none touched by the GAE math or the
    # reward manager's placement: pkg_resources (verl/__init__.py 0.4.x, an NPU version check),
    # pandas (verl/protocol.py), orjson (verl/utils/tracking.py, 0.9), psutil (memory utilities).
    stand_ins=COMMON_HEAVY + ("pkg_resources", "pandas", "orjson", "psutil"),
    deny=("torch_npu",),
    domain=Domain(
        dtypes=("float32", "float64"),
        left_padding=False,
        why={
            "dtypes": (
                "verl's token_level_rewards are float32 by construction (the reward managers build the score tensor "
                "with torch.zeros_like(responses, dtype=torch.float32); apply_kl_penalty subtracts a float32 KL), so "
                "the TD errors are float32 or wider even when the critic runs in bf16; a case run wholly in bf16 or "
                "fp16 is not an input verl produces (in fp16, finite poison would overflow the masked TD error)"
            ),
            "left_padding": (
                "verl's response window is right-padded (prompts are left-padded, responses right-padded); "
                "the reward manager places the score at attention_mask[prompt_length:].sum() - 1, which is only "
                "the last real token when the response starts at position 0"
            ),
        },
    ),
    pipeline=PIPELINE_0_5_0,
    pipeline_by_pin={
        "0.1": pipeline_0_1(),
        "0.4.1": pipeline_0_4_1(),
        "0.9.1": pipeline_0_9_1(),
        MASKING_COMMIT: pipeline_git(MASKING_COMMIT),
        BEFORE_MASKING: pipeline_git(BEFORE_MASKING),
    },
    notes=(
        "Contract: compressed, what verl intends since #2337 (0.5.0): 'skip values and TD-error on observation "
        "tokens' (core_algos.py); its test checks that values at masked positions do not change the outputs. "
        "0.1 ... 0.4.1 run a plain GAE loop over every position and use the mask only for whitening; 0.4.x relied on "
        "the critic (dp_critic.py: values = values * response_mask) and apply_kl_penalty (kld * response_mask) to "
        "zero masked values and rewards upstream (0.1's FSDP critic does not mask values: the seed report is a "
        "pipeline input there); see pipeline_by_pin for what each pin's pipeline feeds the function. "
        "Masks are passed as int64, as verl's "
        "pipeline does (attention_mask slices; agent_loop.py builds response_mask with dtype=torch.int64). "
        "The score goes where verl's reward manager puts it (last attended response token), so with a masked "
        "observation tail it lands on a masked position: 0.5+ then drops it (lastgaelam is not updated there)."
    ),
)

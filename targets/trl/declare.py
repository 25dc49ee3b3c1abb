"""Adapter for TRL (huggingface/trl): the GAE of its PPO trainers, taken from the source at the pin.

Entries `train` and `compute_advantages` (below), plus the group-advantage entries `grpo`, `dr-grpo` and `rloo`:
the inline advantage blocks of GRPOTrainer / RLOOTrainer._generate_and_score_completions, run from the source at
the pin by `targets/trl/calls_kinds.py` (declarations in declare_kinds.py; see docs/kinds/trl.md); the
loss-aggregation entries `agg-*` (GRPO's `loss_type` chain) and the kl entries `kl-grpo` (GRPO's per-token k3 KL
to the reference) and `kl-ppo` (the PPO trainer's k1 / k3 KL estimator), and the policy-loss entry `policy-grpo`
(GRPOTrainer._compute_loss's clipped objective and loss_type chain at GRPOConfig's defaults), from the same trainers'
source.

* `train` (default): TRL's PPO has no advantage function; the GAE is inline in
  `PPOTrainer.train()` (`trl/experimental/ppo/ppo_trainer.py` from 0.26, `trl/trainer/ppo_trainer.py`
  0.12-0.25, `PPOv2Trainer.train()` in `trl/trainer/ppov2_trainer.py` up to 0.12). The adapter parses
  that file, finds the loop by its structure (`for t in reversed(range(...))` assigning
  `lastgaelam`, inside `train`), and runs the sibling statements from `response_idxs = ...` (the
  padding masks, TRL's KL reward, the score placed at `sequence_lengths + 1`, the optional reward
  whitening) through the last assignment of `advantages` / `returns` after the loop (whitening,
  masked fill). `sequence_lengths` come from TRL's own line
  `sequence_length = first_true_indices(postprocessed_response == pad_token_id) - 1`, also taken
  from `train()`. Helpers the block calls (`masked_whiten`, `first_true_indices`,
  `INVALID_LOGPROB`) are compiled from their own files at the pin (see `extract`).
* `compute_advantages`: the standalone `PPOTrainer.compute_advantages(values, rewards, mask)` of
  the old PPO trainer (`trl/trainer/ppo_trainer.py`, up to 0.11.x), with its score placement
  `PPOTrainer.compute_rewards` (score at the last mask token) and `_kl_penalty`, each compiled
  from the class at the pin and called with `self` a namespace carrying the attributes they read.

Conversion (both entries). The canonical response window is TRL's response tensor; a row's
response is its trainable run (tokens 1, pad 0). Token rewards enter where TRL makes its only
per-token reward, the KL penalty: `logprobs = 0`, `ref_logprobs = token_rewards`, estimator k1 and
`kl_coef = 1`, so `-kl_coef * (logprobs - ref_logprobs)` is exactly `token_rewards`; TRL's own
masking (`INVALID_LOGPROB` fill at padding) then zeroes them where it does. `whiten_rewards` is
False (TRL's default). No trl module is imported, so no stand-ins are needed.

Options and cut rows (docs/kinds/trl.md, "Options and truncation"). `train`: the block starts at TRL's
`contain_eos_token = ...` / `if self.args.missing_eos_penalty ...` filter, run with the case's
`missing_eos_penalty` ("none" = None) and `postprocessed_responses` = tokens 1, pad 0 and EOS 2 as the last token
of every row that is not truncated (`Case.truncated_rows()`); a cut row is terminal (zero bootstrap after the
window, which it fills). `compute_advantages`: step()'s `if self.config.score_clip ...` statement runs on the
scores first.

If the file and trainer class exist but the block is not found, `load` raises `BlockNotFound` (a
load error that names the file); with no PPO trainer at all (trl >= 1.13) it raises `NotPresent`.

Pipeline domain (`SPEC.pipeline` for 1.12.0 and the git pin, `pipeline_by_pin` for 0.19.1 and 0.11.4: the same
facts at each pin's own lines; the `compute_advantages` entry overrides both). `train`: the window is the generated
response (`query_response[:, context_length:]`, right-padded by generation and by `truncate_response`), and what the
policy trains on is `padding_mask = idx > sequence_lengths` with `sequence_length` the first pad token - 1: always a
prefix of the window, so no gaps, no leading mask, no masked real tail, no left padding. An all-masked row is
reachable (a first response token equal to the pad token, e.g. pad == eos, gives `sequence_length = -1`). The block
is handed the raw logprob / ref-logprob / critic tensors at every position and masks them itself (`INVALID_LOGPROB`
fill under padding_mask, values zeroed beyond sequence_lengths + 1), so masked token rewards and masked values stay
permissive; the value kept at the first pad slot is the value model's output there, which TRL trains
(`vf_loss` over `~padding_mask_p1`) and into which it puts the score. Non-finite poison is narrowed: every masked
input the block does not replace by selection is a finite value-model output. Dtypes stay permissive (the policy,
reference, value and reward models are the user's, in any dtype). `compute_advantages` (0.11.4): `step()` takes
user responses and optional `response_masks` over the whole query + response sequence, left- or right-padded, so
gaps, tails, leading (query) masks, left padding and all-masked rows are all reachable, and the KL and values are
non-zero under the mask; narrowed are dtypes (logits are cast to float32 by the value-head wrapper, so the rewards
and the recursion are float32, float64 only with float64 values) and non-finite poison (model outputs).
"""


from __future__ import annotations

from maskfuzz.oracles.declared import Declared
from maskfuzz.oracles.whitening import Whitening
from maskfuzz.targets.registry import Pin, TargetSpec
from maskfuzz.targets.trl.calls import ENTRIES, PACKAGES, entry_or_default
from maskfuzz.targets.trl.declare_kinds import KIND_OVERRIDES
from maskfuzz.targets.trl.declare_ppo import PPO_OVERRIDES, TRAIN_DOMAIN, TRAIN_PIPELINE, TRAIN_PIPELINE_BY_PIN

# the PPO entries' declarations, then the other kinds' (declare_kinds.py), in the entries' order
ENTRY_OVERRIDES: dict[str, dict] = {**PPO_OVERRIDES, **KIND_OVERRIDES}


SPEC = TargetSpec(
    id="trl",
    first_run=('train', 'grpo', 'policy-grpo'),
    adapter="maskfuzz.targets.trl.calls",
    own=PACKAGES,
    contract="dense",
    git_url="https://github.com/huggingface/trl.git",
    package="trl",
    pins=(
        Pin("1.12.0", "newest release with a PPO trainer (trl/experimental/ppo; 1.13.0 dropped it)", default=True),
        Pin(
            "0.11.4",
            "last 0.11: PPOv2Trainer.train inline GAE and the old standalone compute_advantages",
            default=True,
        ),
        Pin("0.19.1", "PPOTrainer in trl/trainer/ppo_trainer.py with the k1/k3 KL estimator"),
        Pin("f2cd57710ae345ea6428ae95363267fcf38a3dc8", "git main as mirrored (v1.9.0-26, Jul 2026)", kind="git"),
        Pin("1.16.0", "newest release: ships no PPO trainer at all (skips with that reason)"),
        Pin("1.9.2", "last release before huggingface/trl#6654: GRPO's luspo loss means over the padded width"),
        Pin("1.10.0", "first release with huggingface/trl#6654: the luspo loss masked before aggregating"),
    ),
    entries=ENTRIES,
    # train(): `advantages = masked_whiten(advantages, ~padding_mask)`; masked_var is unbiased
    # (Bessel mask_sum / (mask_sum - 1)) and masked_whiten adds 1e-8 under the rsqrt.
    whitening=Whitening(unbiased=True, eps=1e-8),
    masked_zero=True,  # train(): `advantages = torch.masked_fill(advantages, padding_mask, 0)`
    # masked_var raises this ValueError when no token of the batch is trained on
    documented_errors=(r"ValueError: The sum of the mask is zero",),
    stand_ins=(),  # no trl module is imported: the block and its helpers are compiled from source
    domain=TRAIN_DOMAIN,
    pipeline=TRAIN_PIPELINE,  # module docstring, "Pipeline domain"
    pipeline_by_pin=TRAIN_PIPELINE_BY_PIN,
    entry_overrides=ENTRY_OVERRIDES,
    notes=(
        "train(): TRL places the score at sequence_lengths + 1 (the first pad slot) and keeps the value there "
        "(padding_mask_p1), while the policy trains on positions <= sequence_lengths (padding_mask)."
    ),
)


def spec_for(entry: str | None) -> TargetSpec:
    """SPEC with the declarations of `entry` applied (the registry holds one SPEC per target)."""
    return SPEC.for_entry(entry_or_default(entry))


def declared_for(entry: str | None) -> Declared:
    return SPEC.declared(entry_or_default(entry))

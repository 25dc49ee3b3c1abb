"""Adapter for ROLL (github.com/alibaba/ROLL, git only).

Entries
    default  `roll/utils/functionals.py::compute_advantage` with `adv_estimator="gae"`, the RLVR pipeline's
             call: `response_mask=` the final response mask, whitening off (ROLL's config default).
    agentic  `roll/pipeline/agentic/utils.py::agentic_compute_advantage`, the agentic pipeline's call: no
             `response_mask=` argument, so ROLL reads `data.batch["response_mask"][:, 1:]` itself.

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

Whitening, reward normalisation, clipping and OPD stay off (ROLL's defaults), so the outputs are the raw GAE.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from types import SimpleNamespace

import torch

from oracles.case import Case
from oracles.domain import Domain
from targets.adapters.base import Loaded, NotPresent, function_from, import_from
from targets.registry import COMMON_HEAVY, Pin, TargetSpec

SPEC = TargetSpec(
    id="roll",
    adapter="targets.adapters.roll",
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
    entries=("default", "agentic"),
    whitening=None,  # whiten_advantages defaults to False in ROLL's PPOConfig; the adapter keeps it off
    masked_zero=True,  # both entries end with `advantages = advantages * response_mask`
    # tensordict is not stood in for: the batch must be a real TensorDict. imageio/requests are imported by the
    # agentic utilities for rendering and HTTP dumps; transfer_queue by the HEAD protocol's remote batches.
    stand_ins=tuple(n for n in COMMON_HEAVY if n != "tensordict") + ("imageio", "requests", "transfer_queue"),
    # a present torch_npu makes roll.platforms pick the NPU platform (and DataProto convert int64 to int32)
    deny=("torch_npu",),
    domain=Domain(
        dtypes=("float32", "bfloat16", "float16"),
        left_padding=False,
        why={
            "dtypes": "compute_advantage casts rewards and values to float32 (`.float()`): a float64 case would be "
            "judged at float64 tolerance on float32 arithmetic",
            "left_padding": "postprocess_generate left-aligns every sequence (prompt, response, right padding), so "
            "no batch reaching compute_advantage is left-padded",
        },
    ),
    notes="score on the last attended token (ROLL's expand_to_token_level), token rewards through ROLL's KL term",
)

_CANDIDATES = {
    "default": [("roll.utils.functionals", "compute_advantage")],
    "agentic": [("roll.pipeline.agentic.utils", "agentic_compute_advantage")],
}


def load(root: Path, entry: str | None) -> Loaded:
    """Import ROLL's advantage function (and its score placement) from the checkout at `root`."""
    entry = entry or "default"
    if entry not in _CANDIDATES:
        raise ValueError(f"roll has entries {sorted(_CANDIDATES)}, not {entry!r}")
    # ROLL's logger writes a file into ./output/logs unless told otherwise: keep the working directory clean.
    os.environ.setdefault("ROLL_LOG_DIR", str(Path(tempfile.gettempdir()) / "maskfuzz-roll-logs"))
    functionals = import_from(root, "roll.utils.functionals")
    protocol = import_from(root, "roll.distributed.scheduler.protocol")
    kl = import_from(root, "roll.utils.kl_controller")
    fn, where = function_from(root, _CANDIDATES[entry])
    needed = ["compute_token_reward"] + (["reward_postprocess"] if entry == "default" else [])
    helpers = {name: getattr(functionals, name, None) for name in needed}
    if entry == "agentic":
        agentic = import_from(root, "roll.pipeline.agentic.utils")
        helpers["compute_response_level_rewards"] = getattr(agentic, "compute_response_level_rewards", None)
    missing = [name for name, f in helpers.items() if f is None]
    if missing:
        raise NotPresent(f"{where} is present but ROLL's score placement is not: {', '.join(missing)} missing")

    def run(case: Case, device: str) -> tuple[torch.Tensor, torch.Tensor]:
        data = _data_proto(case, device, protocol.DataProto, entry)
        config = _pipeline_config()
        if entry == "default":
            data, _ = helpers["reward_postprocess"](data, config, {})
        else:
            data, _ = helpers["compute_response_level_rewards"](batch=data, pipeline_config=config)
        data, _ = helpers["compute_token_reward"](data, config, kl.FixedKLController(kl_coef=1.0))
        kwargs = dict(
            data=data,
            gamma=case.gamma,
            lambd=case.lam,
            adv_estimator="gae",
            advantage_clip=None,
            whiten_advantages=False,
            whiten_rewards=False,
            pipeline_config=config,
        )
        if entry == "default":  # the RLVR pipeline passes final_response_mask; the agentic one passes nothing
            kwargs["response_mask"] = case.trainable.to(device=device, dtype=torch.float32)
        out = fn(**kwargs)
        return out.batch["advantages"], out.batch["returns"]

    notes = [
        "score placed by ROLL's compute_token_reward (last attended token); token rewards via its KL term, beta=1",
        "identity reward normalisation; whitening, clipping and OPD off",
    ]
    return Loaded(run, where, notes)


def _data_proto(case: Case, device: str, data_proto: type, entry: str):
    """The canonical case as ROLL's DataProto: full-sequence masks [B, T+1], token-level tensors [B, T]."""
    inputs = case.inputs(device)
    att = case.attention.to(device=device, dtype=torch.int64)
    attention_mask = torch.cat([att[:, :1], att], dim=1)
    position_ids = torch.clip(torch.cumsum(attention_mask, dim=-1) - 1, min=0)
    prompt = torch.zeros(case.shape[0], 1, dtype=torch.int64, device=device)
    response_mask = torch.cat([prompt, case.trainable.to(device=device, dtype=torch.int64)], dim=1)
    from tensordict import TensorDict  # a real TensorDict: ROLL indexes, renames and pops keys on it

    fields = {
        "attention_mask": attention_mask,
        "position_ids": position_ids,
        "response_mask": response_mask,
        "values": inputs["values"].clone(),
        "old_log_probs": -inputs["token_rewards"],
        "ref_log_probs": torch.zeros_like(inputs["token_rewards"]),
    }
    if entry == "default":
        fields["response_level_rewards"] = inputs["score"].clone()
    else:  # compute_response_level_rewards sums token-level scores per row; the score sits on position 0
        scores = torch.zeros_like(inputs["values"])
        scores[:, 0] = inputs["score"]
        fields["scores"] = scores
    return data_proto(batch=TensorDict(fields, batch_size=[case.shape[0]]), meta_info={})


def _pipeline_config() -> SimpleNamespace:
    """The config fields ROLL's reward and advantage helpers read, at their identity settings."""
    return SimpleNamespace(
        adv_estimator="gae",
        actor_infer=SimpleNamespace(generating_args=SimpleNamespace(num_return_sequences=1)),
        norm_mean_type=None,
        norm_std_type=None,
        reward_clip=None,
        kl_penalty="kl",
        add_token_level_kl=True,
        reward_normalization=SimpleNamespace(
            grouping="batch", norm_mean_type=None, norm_std_type=None, method="identity"
        ),
    )

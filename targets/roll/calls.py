"""ROLL's GAE entries as the worker calls them (`default`, `agentic`, `default-kl`): `compute_advantage` /
`agentic_compute_advantage` on a real DataProto built from the canonical case (full-sequence masks [B, T+1],
token tensors [B, T]), the score through ROLL's own placement, at the pin. The declaration (pins, domains,
entries, options, citations) is `targets/roll/declare.py`; the other kinds' calls are `calls_kinds.py`, which
builds its batches with `data_proto` / `final_response_mask` / `pipeline_config` from here."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

import torch

from maskfuzz.oracles.case import Case
from maskfuzz.targets.adapters.base import Loaded, NotPresent, function_from, import_from

# ---- KL in the reward (`oracles.kinds.gae.kl_reward`): ROLL's only token-level reward is its KL term.
# compute_token_reward
# (roll/utils/functionals.py:615-627 at 8eb27cc2dc34, :612-624 at c09bc8bc9f43, :619-631 at 090ac94658ad) takes
# kld = compute_approx_kl(old_log_probs, ref_log_probs, response_mask[:, 1:], kl_penalty) and, under
# add_token_level_kl, token_level_rewards = expand_to_token_level(data) - kl_ctrl.value * kld. kl_penalty defaults to
# "kl" (base_config.py:527-528; :488-489 at the older pins): log_probs - log_probs_base (functionals.py:192-193;
# :191-192 / :190-191), no clamp, `* action_mask` (:209; :208 / :207). kl_ctrl = get_kl_controller(init_kl_coef,
# target_kl) (rlvr_pipeline.py:188-189, agentic_pipeline.py:67-68), FixedKLController(init_kl_coef) for target_kl None
# (roll/utils/kl_controller.py:34-36); init_kl_coef defaults to 0.2 (base_config.py:535-536; :496-497) and the
# shipped examples/docs_examples/example_ppo.yaml:69 sets 0.2.
KL_COEF = 0.2


_CANDIDATES = {
    "default": [("roll.utils.functionals", "compute_advantage")],
    "agentic": [("roll.pipeline.agentic.utils", "agentic_compute_advantage")],
    "default-kl": [("roll.utils.functionals", "compute_advantage")],
}


def quiet_logs() -> None:
    """ROLL's logger writes a file into ./output/logs unless told otherwise: keep the working directory clean."""
    os.environ.setdefault("ROLL_LOG_DIR", str(Path(tempfile.gettempdir()) / "maskfuzz-roll-logs"))


def modules(root: Path) -> tuple:
    """ROLL's functionals, DataProto protocol and KL controller modules from the checkout (its logs kept out of
    the working directory)."""
    quiet_logs()
    functionals = import_from(root, "roll.utils.functionals")
    protocol = import_from(root, "roll.distributed.scheduler.protocol")
    kl = import_from(root, "roll.utils.kl_controller")
    return functionals, protocol, kl


def load(root: Path, entry: str | None) -> Loaded:
    """Import ROLL's advantage function (and its score placement) from the checkout at `root`."""
    entry = entry or "default"
    if entry not in _CANDIDATES:
        raise ValueError(f"roll has entries {sorted(_CANDIDATES)}, not {entry!r}")
    with_kl = entry.endswith("-kl")  # the KL term fed by the case's logp / ref_logp at beta = KL_COEF
    entry = entry.removesuffix("-kl")
    functionals, protocol, kl = modules(root)
    fn, where = function_from(root, _CANDIDATES[entry])
    needed = ["compute_token_reward"] + (["reward_postprocess", "get_sample_level_mask"] if entry == "default" else [])
    helpers = {name: getattr(functionals, name, None) for name in needed}
    if entry == "agentic":
        agentic = import_from(root, "roll.pipeline.agentic.utils")
        helpers["compute_response_level_rewards"] = getattr(agentic, "compute_response_level_rewards", None)
    missing = [name for name, f in helpers.items() if f is None]
    if missing:
        raise NotPresent(f"{where} is present but ROLL's score placement is not: {', '.join(missing)} missing")

    def run(case: Case, device: str) -> tuple[torch.Tensor, torch.Tensor]:
        data = data_proto(case, device, protocol.DataProto, entry, kl=with_kl)
        config = pipeline_config()
        if entry == "default":  # rlvr_pipeline.py:687-721 (8eb27cc2dc34): the sample mask first
            final = final_response_mask(case, data, config, helpers["get_sample_level_mask"])
            data, _ = helpers["reward_postprocess"](data, config, {})
        else:
            data, _ = helpers["compute_response_level_rewards"](batch=data, pipeline_config=config)
        beta = KL_COEF if with_kl else 1.0
        data, _ = helpers["compute_token_reward"](data, config, kl.FixedKLController(kl_coef=beta))
        kwargs = dict(
            data=data,
            gamma=case.gamma,
            lambd=case.lam,
            adv_estimator="gae",
            advantage_clip=None,
            whiten_advantages=bool(case.options.get("whiten_advantages", False)),  # rlvr_pipeline.py:719
            whiten_rewards=False,
            pipeline_config=config,
        )
        if entry == "default":  # the RLVR pipeline passes final_response_mask; the agentic one passes nothing
            kwargs["response_mask"] = final
        out = fn(**kwargs)
        return out.batch["advantages"], out.batch["returns"]

    notes = [
        "score placed by ROLL's compute_token_reward (last attended token); token rewards via its KL term, beta=1",
        "identity reward normalisation; clipping and OPD off; whiten_advantages from the case's options",
    ]
    if with_kl:
        notes[0] = (
            "score placed by ROLL's compute_token_reward (last attended token); token rewards = its KL term on "
            f"old_log_probs = logp, ref_log_probs = ref_logp, kl_penalty 'kl', beta = {KL_COEF}"
        )
    if entry == "default":
        notes.append(
            "final_response_mask from ROLL's get_sample_level_mask (max_len_mask from the case's options; responses "
            "as wide as the cut rows, the generation limit)"
        )
    return Loaded(run, where, notes)


class TruncationShapeError(ValueError):
    """The case's cut rows cannot be expressed as one ROLL batch with max_len_mask."""


def final_response_mask(case: Case, data: object, config: SimpleNamespace, sample_mask: Callable) -> torch.Tensor:
    """`final_response_mask` as the RLVR pipeline makes it: ROLL's `get_sample_level_mask(data, config)`
    (functionals.py:682-736 at 8eb27cc2dc34, called at rlvr_pipeline.py:687), `max_len_mask` from the case's
    options, difficulty and error-length masks off (their defaults).

    ROLL knows a cut row only by its length: `max_len_mask` zeroes a row whose response length equals
    `responses.shape[-1]`, the generation limit (:689-697). In a ROLL batch every cut row has exactly that length;
    `responses` here is as wide as the case's cut rows (as wide as the window plus one when none is cut: nothing
    reached the limit). Cut rows of different lengths are no ROLL batch: TruncationShapeError (documented)."""
    config.max_len_mask = bool(case.options.get("max_len_mask", False))
    config.difficulty_mask = False
    config.error_max_len_clip = False
    rows, width = case.shape
    limit = width + 1
    cut = case.truncated_rows()
    if config.max_len_mask and bool(cut.any()):
        lengths = sorted({int(n) for n in case.trainable[cut].sum(dim=1).tolist()})
        if len(lengths) != 1:
            raise TruncationShapeError(
                f"cut rows of response lengths {lengths}: ROLL's max_len_mask knows a cut row "
                "by its length == responses.shape[-1] (roll/utils/functionals.py get_sample_level_mask), one limit"
            )
        limit = lengths[0]
    device = data.batch["response_mask"].device
    data.batch["responses"] = torch.zeros(rows, limit, dtype=torch.int64, device=device)
    data, _ = sample_mask(data, config)
    return data.batch["final_response_mask"]


def data_proto(case: Case, device: str, proto: Callable, entry: str, kl: bool = False) -> object:
    """The canonical case as ROLL's DataProto: full-sequence masks [B, T+1], token-level tensors [B, T]. With `kl`,
    old_log_probs / ref_log_probs are the case's logp / ref_logp (its token rewards, 0 in a KL entry's domain, are
    not read)."""
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
    if kl:
        dt = inputs["token_rewards"].dtype
        fields["old_log_probs"] = case.extra["logp"].to(device=device, dtype=dt)
        fields["ref_log_probs"] = case.extra["ref_logp"].to(device=device, dtype=dt)
    if entry == "default":
        fields["response_level_rewards"] = inputs["score"].clone()
    else:  # compute_response_level_rewards sums token-level scores per row; the score sits on position 0
        scores = torch.zeros_like(inputs["values"])
        scores[:, 0] = inputs["score"]
        fields["scores"] = scores
    return proto(batch=TensorDict(fields, batch_size=[case.shape[0]]), meta_info={})


def pipeline_config() -> SimpleNamespace:
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


def rlvr_config(max_len_mask: bool = False) -> SimpleNamespace:
    """`pipeline_config` with the fields the RLVR pipeline's `get_sample_level_mask` reads: `max_len_mask` as
    given, the difficulty and error-length masks off (their defaults). Used by the real-rollout path
    (`targets.roll.rollout`), which calls ROLL's sample mask on the batch ROLL built from a generation."""
    config = pipeline_config()
    config.max_len_mask = max_len_mask
    config.difficulty_mask = False
    config.error_max_len_clip = False
    return config

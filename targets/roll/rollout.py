"""ROLL's own batch code on a real rollout (worker side): the RLVR pipeline's path from `generate()` to
`compute_advantage`, everything ROLL's except the critic's values, which enter at `HOOKED_BOUNDARY`.

The calls, in the pipeline's order (lines at c09bc8bc9f43; the declaration `targets.roll.declare` cites the others):

1. per request (one prompt and its samples), `concatenate_input_and_output(input_ids, response ids, n)` and
   `postprocess_generate(prompts, output, num_return_sequences=n, sequence_length, eos_token_id,
   pad_token_id)`, then `DataProto.concat` of the requests, as the generate scheduler does
   (roll/distributed/scheduler/async_generate_scheduler.py:786-797, user_defined_rollout_loop.py:132-143):
   ROLL left-aligns every row, pads it to `sequence_length` and marks the response from the generation's EOS;
2. `get_sample_level_mask(batch, config)` -> `final_response_mask` (rlvr_pipeline.py:630-631), `max_len_mask`
   from the case's options, the difficulty and error-length masks off;
3. the hooked boundary: `batch["values"]` = the fault's values (the critic's `compute_values` output in the
   pipeline, rlvr_pipeline.py:574), `old_log_probs` / `ref_log_probs` the KL term's inputs;
4. `reward_postprocess` (identity normalisation, :636-639), `compute_token_reward` with
   `FixedKLController(1.0)` (:644-646) and `compute_advantage(..., adv_estimator="gae", response_mask=
   final_response_mask)` (:650-661).

Layout (the adapter's): sequences of length L = sequence_length, token-level tensors `[:, 1:]` of length
T = L - 1, canonical position t = sequence token t + 1. Token rewards enter as ROLL's only dense reward, its KL
term: old_log_probs = -token_rewards, ref_log_probs = 0, `kl_penalty="kl"`, beta = 1, so ROLL's own
`compute_token_reward` adds exactly the canonical token rewards where `response_mask[:, 1:]` is 1 (ROLL masks
the KL, so nothing placed under the mask reaches it); the score is `response_level_rewards`, placed by ROLL on
the last attended token. Stand-ins: the ROLL fuzzing worker's (`targets.roll.declare.SPEC.stand_ins`).
"""

from __future__ import annotations

import inspect
from pathlib import Path

import torch

from maskfuzz.targets.adapters.base import Loaded, import_from
from maskfuzz.targets.roll.calls import quiet_logs, rlvr_config
from maskfuzz.targets.rollout.lm import Generation
from maskfuzz.targets.rollout.requests import Batch, BatchRequest

INFRASTRUCTURE = ("tensordict.TensorDict",)  # what the batch travels in (DataProto), named in the record
HOOKED_BOUNDARY = "after the real rollout, before critic values enter compute_advantage"
# what ROLL's code is given at the boundary, and what it is not given at all (nothing replaced)
BOUNDARY_INPUTS = (
    "batch['values'] [B, T]: the critic's values (the case's at valid tokens, its poison under the mask)",
    "batch['old_log_probs'] = -token_rewards, batch['ref_log_probs'] = 0 [B, T]: ROLL's KL term, beta 1",
    "batch['response_level_rewards'] [B]: the case's score",
)
REPLACED_COMPONENT = None
PRESERVED = (
    ("roll.utils.functionals", "concatenate_input_and_output"),
    ("roll.utils.functionals", "postprocess_generate"),
    ("roll.distributed.scheduler.protocol", "DataProto.concat"),
    ("roll.utils.functionals", "get_sample_level_mask"),
    ("roll.utils.functionals", "reward_postprocess"),
    ("roll.utils.functionals", "compute_token_reward"),
    ("roll.utils.kl_controller", "FixedKLController"),
    ("roll.utils.functionals", "compute_advantage"),
)
_MASK_STAGE = PRESERVED.index(("roll.utils.functionals", "get_sample_level_mask"))  # the last call without a fault


def load(root: Path, entry: str | None) -> Loaded:
    """Import ROLL's batch code from the checkout at `root`; `run(BatchRequest, device)` answers `(Batch,)`."""
    if entry not in (None, "default"):
        raise ValueError(f"the real-rollout path of roll covers its RLVR pipeline (entry default), not {entry!r}")
    quiet_logs()
    modules = {name: import_from(root, name) for name, _ in PRESERVED}
    fns = {attr: _attr(modules[name], attr) for name, attr in PRESERVED}
    called = [f"{_where(root, fns[attr])}::{attr}" for _, attr in PRESERVED]
    data_proto = modules["roll.distributed.scheduler.protocol"].DataProto

    def run(request: BatchRequest, device: str) -> tuple[Batch]:
        return (_step(request, fns, data_proto, called, device),)

    notes = ["the RLVR pipeline's batch code on a real generation; critic values at the hooked boundary"]
    return Loaded(run, " -> ".join(attr for _, attr in PRESERVED), notes)


def _attr(module, dotted: str):
    obj = module
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def _where(root: Path, fn) -> str:
    return str(Path(inspect.getfile(inspect.unwrap(fn))).resolve().relative_to(Path(root).resolve()))


def _step(request: BatchRequest, fns: dict, data_proto: type, called: list, device: str) -> Batch:
    from tensordict import TensorDict  # a real TensorDict: ROLL indexes, renames and pops keys on it

    gen = request.generation
    fault = request.fault
    data = _rollout_batch(gen, request.sequence_length, fns, data_proto, TensorDict)
    t_len = request.sequence_length - 1
    b_rows = data.batch["response_mask"].shape[0]
    zeros = torch.zeros(b_rows, t_len, dtype=torch.float32)
    data.batch["response_level_rewards"] = zeros[:, 0].clone() if fault is None else fault.score.float().clone()
    data.batch["old_log_probs"] = zeros.clone() if fault is None else -fault.token_rewards.float()
    data.batch["ref_log_probs"] = zeros.clone()
    config = rlvr_config(bool(request.options.get("max_len_mask", False)))
    data, mask_metrics = fns["get_sample_level_mask"](data, config)
    final = data.batch["final_response_mask"].clone()
    batch = Batch(
        attention=data.batch["attention_mask"][:, 1:].bool().clone(),
        trainable=final.bool(),
        truncated=~(data.batch["responses"] == gen.eos_token_id).any(dim=-1),
        stages={
            "responses": data.batch["responses"].clone(),
            "input_ids": data.batch["input_ids"].clone(),
            "attention_mask": data.batch["attention_mask"].clone(),
            "response_mask": data.batch["response_mask"].clone(),
            "final_response_mask": final.clone(),
        },
        called=called[: _MASK_STAGE + 1],
        metrics={"get_sample_level_mask": mask_metrics},
    )
    if fault is None:
        return batch
    # ---- the hooked boundary: the critic's values enter here, then ROLL's code runs to the advantages
    data.batch["values"] = fault.values.float().clone()
    batch.stages["values"] = data.batch["values"].clone()
    data, reward_metrics = fns["reward_postprocess"](data, config, {})
    data, token_metrics = fns["compute_token_reward"](data, config, fns["FixedKLController"](kl_coef=1.0))
    batch.stages["token_level_rewards"] = data.batch["token_level_rewards"].clone()
    out = fns["compute_advantage"](
        data=data,
        gamma=fault.gamma,
        lambd=fault.lam,
        adv_estimator="gae",
        advantage_clip=None,
        whiten_advantages=bool(request.options.get("whiten_advantages", False)),
        whiten_rewards=False,
        response_mask=final.clone(),
        pipeline_config=config,
    )
    batch.stages["stored_values"] = out.batch["values"].clone()
    batch.advantages = out.batch["advantages"].clone()
    batch.returns = out.batch["returns"].clone()
    batch.called = list(called)
    batch.metrics.update(reward_postprocess=reward_metrics, compute_token_reward=token_metrics)
    return batch


def _rollout_batch(gen: Generation, sequence_length: int, fns: dict, data_proto: type, tensordict: type):
    """ROLL's batch of `gen`: per request (prompt b and its K samples) ROLL's `concatenate_input_and_output`
    and `postprocess_generate`, then `DataProto.concat`. Each request's DataProto: input_ids, attention_mask,
    position_ids [1, P] (int64, left-padded); the responses [K, N] are `generate()`'s tokens after the prompt."""
    k = gen.num_return_sequences
    p_len = gen.prompt_length
    parts = []
    for b in range(gen.input_ids.shape[0]):
        prompt = data_proto(
            batch=tensordict(
                {
                    "input_ids": gen.input_ids[b : b + 1].clone(),
                    "attention_mask": gen.attention_mask[b : b + 1].clone(),
                    "position_ids": gen.position_ids[b : b + 1].clone(),
                },
                batch_size=[1],
            )
        )
        responses = gen.output[b * k : (b + 1) * k, p_len:].clone()
        output = fns["concatenate_input_and_output"](
            input_ids=prompt.batch["input_ids"], output_ids=responses, num_return_sequences=k
        )
        parts.append(
            fns["postprocess_generate"](
                prompts=prompt,
                output=output,
                num_return_sequences=k,
                sequence_length=sequence_length,
                eos_token_id=gen.eos_token_id,
                pad_token_id=gen.pad_token_id,
            )
        )
    return fns["DataProto.concat"](parts)

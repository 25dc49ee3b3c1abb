"""verl's own batch code on a real rollout (worker side): the PPO trainer's path from the rollout's response
building to `compute_advantage`, everything verl's except the critic's values, which enter at `HOOKED_BOUNDARY`.

The calls, in the trainer's order (the single-turn vLLM rollout; lines at each pin):

1. the rollout's response building, as its `generate_sequences` runs it on the engine's token ids: the prompts
   repeated per sample (`rollout.n`, the trainer's `repeat(interleave=True)`), the responses right-padded to
   `response_length` (0.4+: `pad_2d_list_to_length` of the engine's lists, EOS included: 0.4.1
   vllm_rollout_spmd.py:307, 0.5.0 :341, 11ee5125 :335; 0.1: `pad_sequence_to_length` of its engine's padded
   tensor, vllm_rollout.py:182-184), the response attention from `get_response_mask` (0.4.1 :339, 0.5.0 :364,
   11ee5125 :377) / `get_eos_mask` (0.1 :199): 1 up to and including the first EOS;
2. `ray_trainer.compute_response_mask` (0.5.0 ray_trainer.py:1202-1203, 11ee5125 :1173; 0.1 has none: its
   apply_kl_penalty and compute_advantage slice `attention_mask[:, -response_length:]` themselves, :87, :118);
3. the reward manager with a rule score, through `reward.compute_reward` where the pin has it (0.5.0 :1224,
   11ee5125 :1194; 0.1 calls `self.reward_fn(batch)`, :464): `NaiveRewardManager` (0.1: `main_ppo.RewardManager`)
   writes the score at `valid_response_length - 1`, the last attended response token;
4. the hooked boundary: `batch["values"]` = the fault's values (the critic's `compute_values` output, 0.5.0
   :1274, 11ee5125 :1244, 0.1 :450), `old_log_probs` / `ref_log_prob` the KL term's inputs;
5. `ray_trainer.apply_kl_penalty` with `core_algos.FixedKLController(kl_coef=1.0)`, `kl_penalty="kl"` (0.5.0
   :1289, 11ee5125 :1259, 0.1 :468), then `ray_trainer.compute_advantage(adv_estimator=GAE)` (0.5.0 :1302,
   11ee5125 :1272, 0.1 :474), which calls `core_algos.compute_gae_advantage_return` (seen through a spy that
   calls the real function: it is listed as called only if it ran).

Pins: 0.1 ... 0.6.x (and the git pins between); from 0.7 every rollout goes through the agent loop's server
(no single-turn response building with these helpers), so `load` raises NotPresent there (a skip, not a guess).
The ray_trainer functions are compiled from the pin's source without importing the module (it pulls in the
whole distributed stack; `targets.verl.calls_kinds.trainer_function`, file and line numbers kept).

Layout: verl's token-level tensors are the response window, [B, R] with R = response_length = sequence_length -
prompt width; canonical position t = response token t (`Batch.tokens` = the responses). Token rewards enter as
verl's only dense reward, its KL in the reward: old_log_probs = -token_rewards, ref_log_prob = 0, beta 1, so
`apply_kl_penalty` adds exactly the token rewards where the response mask is 1 (`Batch.reward_mask`); the score
is the rule's, placed by the reward manager. Stand-ins: the verl fuzzing worker's
(`targets.verl.declare.SPEC.stand_ins`); the manager's tokenizer decodes with the tiny LM's vocabulary.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import torch

from maskfuzz.targets.adapters.base import Loaded, NotPresent, import_from
from maskfuzz.targets.rollout import lm
from maskfuzz.targets.rollout.lm import Generation
from maskfuzz.targets.rollout.requests import Batch, BatchRequest
from maskfuzz.targets.verl.calls_kinds import trainer_function

INFRASTRUCTURE = ("tensordict.TensorDict",)  # what the batch travels in (DataProto), named in the record
HOOKED_BOUNDARY = "after the real rollout and the reward manager, before critic values enter compute_advantage"
BOUNDARY_INPUTS = (
    "batch['values'] [B, R]: the critic's values (the case's at valid tokens, its poison under the mask)",
    "batch['old_log_probs'] = -token_rewards, batch['ref_log_prob'] = 0 [B, R]: verl's KL in the reward, beta 1",
    "the rule score of each row, handed to the reward manager as its ground truth (the manager places it)",
)
REPLACED_COMPONENT = None
_TF, _TRAINER, _CORE = "verl.utils.torch_functional", "verl.trainer.ppo.ray_trainer", "verl.trainer.ppo.core_algos"
# The steps in the trainer's order; each is its alternatives (module, name), the first one the pin has is called
# (a later module is not imported when an earlier one answers: 0.5.0's main_ppo imports the whole trainer).
# ray_trainer's are compiled from its source. An optional step all of whose alternatives are absent is skipped
# (compute_response_mask and reward.compute_reward are not at 0.1).
PRESERVED = (
    ((_TF, "pad_2d_list_to_length"), (_TF, "pad_sequence_to_length")),
    ((_TF, "get_response_mask"), (_TF, "get_eos_mask")),
    ((_TRAINER, "compute_response_mask"),),
    (("verl.trainer.ppo.reward", "compute_reward"),),
    (("verl.workers.reward_manager.naive", "NaiveRewardManager"), ("verl.trainer.main_ppo", "RewardManager")),
    ((_CORE, "FixedKLController"),),
    ((_TRAINER, "apply_kl_penalty"),),
    ((_TRAINER, "compute_advantage"),),
    ((_CORE, "compute_gae_advantage_return"),),
)
_OPTIONAL = {"compute_response_mask", "compute_reward"}
# the single-turn vLLM rollout whose response building step 1 follows (0.4 ... 0.6: spmd; 0.1: its own engine);
# from 0.7 no rollout builds responses so (the agent loop's server does), and the pin is skipped there
_ROLLOUTS = (
    "verl/workers/rollout/vllm_rollout/vllm_rollout_spmd.py",
    "verl/trainer/ppo/rollout/vllm_rollout/vllm_rollout.py",
)


class _Vocab:
    """The tokenizer the reward manager decodes with: the tiny LM's vocabulary (`lm.token_text`), no transformers."""

    pad_token_id = lm.SPECIAL_TOKENS.index(lm.PAD)

    def decode(self, ids, skip_special_tokens: bool = False, **kwargs) -> str:
        words = [lm.token_text(int(i)) for i in torch.as_tensor(ids).flatten().tolist()]
        return " ".join(w for w in words if not (skip_special_tokens and w in lm.SPECIAL_TOKENS))

    def batch_decode(self, rows, **kwargs) -> list[str]:
        return [self.decode(r, **kwargs) for r in rows]


def _rule_score(*args, ground_truth: str = "0", **kwargs) -> float:
    """The rule reward: the row's ground truth is its score (the case's), whatever the response says."""
    return float(ground_truth)


def load(root: Path, entry: str | None) -> Loaded:
    """Import verl's batch code from the checkout at `root`; `run(BatchRequest, device)` answers `(Batch,)`."""
    if entry not in (None, "default"):
        raise ValueError(f"verl's real-rollout path covers its PPO trainer with GAE (entry default), not {entry!r}")
    fns, called = {}, {}
    for step in PRESERVED:
        found = next((hit for module, name in step if (hit := _find(root, module, name)) is not None), None)
        if found is None:
            if step[0][1] in _OPTIONAL:
                continue
            raise NotPresent(f"none of {[f'{m}.{n}' for m, n in step]} at this pin")
        name, fn, where = found
        fns[name], called[name] = fn, where
    rollout = _rollout_source(root, [n for n in fns if n.startswith(("pad_", "get_"))])
    core = import_from(root, _CORE)
    from verl import DataProto  # the pin's own DataProto (verl/protocol.py)

    def run(request: BatchRequest, device: str) -> tuple[Batch]:
        return (_step(request, fns, called, core, DataProto),)

    notes = [f"the PPO trainer's batch code on a real generation (the response building of {rollout}); "
             "critic values at the hooked boundary"]  # fmt: skip
    return Loaded(run, " -> ".join(called), notes)


def _rollout_source(root: Path, helpers: list[str]) -> str:
    """The pin's single-turn vLLM rollout file that calls `helpers` (the response building this module follows);
    NotPresent when the pin has none."""
    for rel in _ROLLOUTS:
        path = Path(root) / rel
        if path.is_file():
            text = path.read_text()
            if all(f"{h}(" in text for h in helpers):
                return rel
            raise NotPresent(f"{rel} does not build its responses with {helpers} at this pin")
    raise NotPresent(f"no single-turn vLLM rollout at this pin ({', '.join(_ROLLOUTS)}): the agent loop builds them")


def _find(root: Path, module: str, name: str) -> tuple[str, object, str] | None:
    """`module.name` at the pin with where it lives (`path::name`), or None when the pin has no such module or
    name; an import that fails otherwise fails loudly."""
    if module == _TRAINER:
        try:
            fn, where = trainer_function(root, name)
        except NotPresent:
            return None
        return name, fn, where.split(" ")[0]
    try:
        mod = import_from(root, module)
    except NotPresent:
        return None
    if not hasattr(mod, name):
        return None
    obj = getattr(mod, name)
    return name, obj, f"{_where(root, obj)}::{name}"


def _where(root: Path, obj) -> str:
    return str(Path(inspect.getfile(inspect.unwrap(obj))).resolve().relative_to(Path(root).resolve()))


def _step(request: BatchRequest, fns: dict, called: dict, core, data_proto: type) -> Batch:
    from tensordict import TensorDict  # the real one, as verl's DataProto holds it

    gen, fault = request.generation, request.fault
    response_length = request.sequence_length - gen.prompt_length
    tensors, ran = _rollout(gen, response_length, fns)
    b_rows = tensors["responses"].shape[0]
    score = torch.zeros(b_rows) if fault is None else fault.score.float()
    data = data_proto(
        batch=TensorDict(tensors, batch_size=[b_rows]),
        non_tensor_batch={
            "data_source": _objects(["maskfuzz"] * b_rows),
            "reward_model": _objects([{"ground_truth": repr(float(s))} for s in score.tolist()]),
        },
    )
    if "compute_response_mask" in fns:
        data.batch["response_mask"] = fns["compute_response_mask"](data)
        ran.append("compute_response_mask")
        mask = data.batch["response_mask"]
    else:  # 0.1: the mask its apply_kl_penalty / compute_advantage slice from the attention (ray_trainer.py:87, :118)
        mask = data.batch["attention_mask"][:, -response_length:]
    scores, reward_ran = _reward(data, fns)
    ran += reward_ran
    responses = data.batch["responses"]
    batch = Batch(
        attention=data.batch["attention_mask"][:, -response_length:].bool().clone(),
        trainable=mask.bool().clone(),
        truncated=~(responses == gen.eos_token_id).any(dim=-1),
        stages={name: data.batch[name].clone() for name in (*tensors, "response_mask") if name in data.batch.keys()},
        tokens=responses.clone(),
        reward_mask=mask.bool().clone(),
    )
    batch.stages["token_level_scores"] = scores.clone()
    if fault is None:
        batch.called = [called[n] for n in ran]
        return batch
    # ---- the hooked boundary: the critic's values enter here, then verl's code runs to the advantages
    data.batch["token_level_scores"] = scores
    data.batch["values"] = fault.values.float().clone()
    data.batch["old_log_probs"] = -fault.token_rewards.float()
    data.batch["ref_log_prob"] = torch.zeros_like(fault.token_rewards, dtype=torch.float32)
    batch.stages["values"] = data.batch["values"].clone()
    data, kl_metrics = fns["apply_kl_penalty"](data, kl_ctrl=fns["FixedKLController"](kl_coef=1.0), kl_penalty="kl")
    batch.stages["token_level_rewards"] = data.batch["token_level_rewards"].clone()
    spy = _Spy(core, "compute_gae_advantage_return")
    with spy:
        data = fns["compute_advantage"](data, **_advantage_kwargs(fns["compute_advantage"], core, fault))
    ran += ["FixedKLController", "apply_kl_penalty", "compute_advantage"] + (["compute_gae_advantage_return"] * spy.hit)
    batch.advantages = data.batch["advantages"].clone()
    batch.returns = data.batch["returns"].clone()
    batch.called = [called[n] for n in ran]
    batch.metrics = {"apply_kl_penalty": kl_metrics}
    return batch


def _rollout(gen: Generation, response_length: int, fns: dict) -> tuple[dict, list[str]]:
    """The rollout's batch of `gen` ([B*K] rows, sample r of prompt r // K): prompts, responses [B*K, R],
    input_ids, attention_mask and position_ids [B*K, P + R], built by the pin's own helpers."""
    k, p_len = gen.num_return_sequences, gen.prompt_length
    idx = gen.input_ids.repeat_interleave(k, dim=0)
    prompt_mask = gen.attention_mask.repeat_interleave(k, dim=0)
    position_ids = gen.position_ids.repeat_interleave(k, dim=0)
    out = gen.output[:, p_len:]
    if "pad_2d_list_to_length" in fns:  # 0.4+: the engine's token ids per sample, EOS included, no padding
        lists = [row[: row.index(gen.eos_token_id) + 1] if gen.eos_token_id in row else row for row in out.tolist()]
        response = fns["pad_2d_list_to_length"](lists, gen.pad_token_id, max_length=response_length)
        ran = ["pad_2d_list_to_length"]
    else:  # 0.1: its engine hands a tensor padded with pad_token_id to the batch's longest response
        response = out.clone()
        if response.shape[1] < response_length:
            response = fns["pad_sequence_to_length"](response, response_length, gen.pad_token_id)
        ran = ["pad_sequence_to_length"]
    mask_fn = "get_response_mask" if "get_response_mask" in fns else "get_eos_mask"
    response_attention = fns[mask_fn](response_id=response, eos_token=gen.eos_token_id, dtype=prompt_mask.dtype)
    ran.append(mask_fn)
    delta = torch.arange(1, response.shape[1] + 1).unsqueeze(0).expand(idx.shape[0], -1)
    tensors = {
        "prompts": idx,
        "responses": response,
        "input_ids": torch.cat([idx, response], dim=-1),
        "attention_mask": torch.cat([prompt_mask, response_attention], dim=-1),
        "position_ids": torch.cat([position_ids, position_ids[:, -1:] + delta], dim=-1),
    }
    return tensors, ran


def _reward(data, fns: dict) -> tuple[torch.Tensor, list[str]]:
    """The reward manager's token_level_scores [B, R] float32 with the rule score, and the calls made."""
    if "NaiveRewardManager" in fns:
        manager = fns["NaiveRewardManager"](tokenizer=_Vocab(), num_examine=0, compute_score=_rule_score)
        ran = ["NaiveRewardManager"]
    else:  # 0.1: the manager picks its scorer by data source through main_ppo's module-level _select_rm_score_fn
        main_ppo = inspect.getmodule(fns["RewardManager"])
        main_ppo._select_rm_score_fn = lambda data_source: _rule_score
        manager = fns["RewardManager"](tokenizer=_Vocab(), num_examine=0)
        ran = ["RewardManager"]
    if "compute_reward" in fns:
        scores, _ = fns["compute_reward"](data, manager)
        return scores, ["compute_reward", *ran]
    return manager(data), ran


def _advantage_kwargs(fn, core, fault) -> dict:
    """compute_advantage's arguments as the trainer passes them for GAE at this pin (0.1: gamma, lam,
    adv_estimator="gae"; 0.4+: the AdvantageEstimator, num_repeat, the algorithm config, read with .get)."""
    params = inspect.signature(fn).parameters
    estimator = getattr(getattr(core, "AdvantageEstimator", None), "GAE", "gae")
    given = {"adv_estimator": estimator, "gamma": fault.gamma, "lam": fault.lam, "num_repeat": 1,
             "multi_turn": False, "norm_adv_by_std_in_grpo": True, "config": {"use_pf_ppo": False}}  # fmt: skip
    return {k: v for k, v in given.items() if k in params}


class _Spy:
    """Counts calls of `module.name` for the block (the real function runs): evidence the GAE was reached."""

    def __init__(self, module, name: str):
        self.module, self.name, self.hit = module, name, 0

    def __enter__(self):
        self.real = getattr(self.module, self.name)

        def counted(*args, **kwargs):
            self.hit = 1
            return self.real(*args, **kwargs)

        setattr(self.module, self.name, counted)
        return self

    def __exit__(self, *exc):
        setattr(self.module, self.name, self.real)


def _objects(items: list):
    import numpy as np  # verl's non-tensor batch holds object arrays

    arr = np.empty(len(items), dtype=object)
    arr[:] = items
    return arr

"""SkyRL's own batch code on a real rollout (worker side): the PPO trainer's path from the generator output to
`compute_advantages_and_returns`, everything SkyRL's except the critic's values, which enter at `HOOKED_BOUNDARY`.

The calls, in `RayPPOTrainer.train`'s order (0.3.1: skyrl_train/trainer.py:229-259; lines at 0.3.1):

1. the generator output of SkyRLGymGenerator's single-turn path (`generate_batched`,
   skyrl_train/generators/skyrl_gym_generator.py:598-649): per sample the engine's response ids (the tokens up to
   and including the sampled EOS, cut at `max_tokens`, :618-619), `loss_masks = [1] * len(response)` (:620), the
   environment's scalar reward (the case's score: a rule reward stands in for the environment, :614-616), the
   chat-templated prompt ids (:631-635); `validate_generator_output` checks it (trainer_utils.py:591, called by
   `generate`, trainer.py:650);
2. `postprocess_generator_output` (trainer.py:655-718): the scalar reward on the last response token, :701-702;
3. `convert_to_training_input` (trainer.py:558-628): `convert_prompts_responses_to_batch_tensors`
   (skyrl_train/dataset/preprocess.py:28-132: prompts left-padded, responses right-padded to the longest response
   of the step, response_mask, loss_mask and rewards in the response window), then `pad_batch` (:833, dp size 1);
4. the hooked boundary: `data["values"]` = the fault's values (the critic's `fwd_logprobs_values_reward` output,
   trainer.py:876; action_values are the value head at every response position, model_wrapper.py:500-514),
   `action_log_probs` / `base_action_log_probs` the KL term's inputs;
5. `apply_reward_kl_penalty` (trainer.py:1000-1054, `use_kl_in_reward`) with `get_kl_controller` (fixed, coef 1)
   and `compute_advantages_and_returns` (trainer.py:721-823, `advantage_estimator: gae`), which calls
   ppo_utils.compute_advantages_and_returns -> compute_gae_advantage_return (ppo_utils.py:1087, :999-1026).

The trainer module imports skyrl_gym (not in the wheel, and SkyRL's own: never stood in), so the five trainer
methods are compiled from the pin's trainer.py (`targets.adapters.extract.SourceTree`, file and line numbers
kept) with `self` a namespace holding the config they read; every function they call is SkyRL's, imported from
the wheel (preprocess, training_batch, ppo_utils) or compiled from its source (generators/utils.py,
trainer_utils.py).

Layout: the canonical [B, T] tensors are SkyRL's response window (T = the step's longest response): attention =
response_mask (the response indicator), trainable = loss_mask. Token rewards enter as SkyRL's only dense reward,
its KL term: action_log_probs = -token_rewards, base_action_log_probs = 0, `kl_estimator_type: k1`,
`kl_loss_coef: 1`, so `apply_reward_kl_penalty` adds exactly the token rewards where loss_mask is 1; the score is
the environment's reward. Stage `input_ids` is SkyRL's `sequences` from the last prompt token on, so canonical
position t is column t + 1 (the layout `fuzz.validate` reads tokens in). Stand-ins: the SkyRL fuzzing worker's
(`targets.adapters.skyrl.SPEC.stand_ins`).
"""

from __future__ import annotations

import importlib
import sys
import types
from pathlib import Path

import torch

from maskfuzz.targets.adapters.base import Loaded, import_from
from maskfuzz.targets.adapters.extract import SourceTree, find_class, find_method
from maskfuzz.targets.rollout.requests import Batch, BatchRequest

HOOKED_BOUNDARY = "after the real rollout, before critic values enter compute_advantages_and_returns"
BOUNDARY_INPUTS = (
    "data['values'] [B, T]: the critic's values (the case's at valid tokens, its poison under the mask)",
    "data['action_log_probs'] = -token_rewards, data['base_action_log_probs'] = 0 [B, T]: SkyRL's KL-in-reward "
    "term, k1, coefficient 1",
    "the generator's scalar reward per row: the case's score (a rule reward in place of the environment)",
)
REPLACED_COMPONENT = None
_TRAINER = "skyrl_train/trainer.py"
# (module or file, function): what the step calls, in order; trainer methods are compiled from _TRAINER
PRESERVED = (
    ("skyrl_train/utils/trainer_utils.py", "validate_generator_output"),
    (_TRAINER, "postprocess_generator_output"),
    (_TRAINER, "convert_to_training_input"),
    ("skyrl_train/dataset/preprocess.py", "convert_prompts_responses_to_batch_tensors"),
    (_TRAINER, "pad_batch"),
    (_TRAINER, "apply_reward_kl_penalty"),
    ("skyrl_train/utils/ppo_utils.py", "compute_approx_kl"),
    (_TRAINER, "compute_advantages_and_returns"),
    ("skyrl_train/utils/ppo_utils.py", "compute_advantages_and_returns"),
    ("skyrl_train/utils/ppo_utils.py", "compute_gae_advantage_return"),
)
_MASK_STAGE = PRESERVED.index((_TRAINER, "pad_batch"))  # the last call without a fault
_METHODS = ("postprocess_generator_output", "convert_to_training_input", "pad_batch", "apply_reward_kl_penalty",
            "compute_advantages_and_returns")  # fmt: skip


def load(root: Path, entry: str | None) -> Loaded:
    """Import SkyRL's batch code from the wheel at `root`; `run(BatchRequest, device)` answers `(Batch,)`."""
    if entry not in (None, "default"):
        raise ValueError(f"the real-rollout path of skyrl covers its GAE trainer step (entry default), not {entry!r}")
    root = Path(root)
    if not (root / _TRAINER).is_file():
        raise RuntimeError(f"no {_TRAINER} at {root}: the real-rollout path knows the skyrl_train release layout")
    modules = {m: import_from(root, m) for m in ("skyrl_train.dataset.preprocess", "skyrl_train.training_batch",
                                                 "skyrl_train.utils.ppo_utils")}  # fmt: skip
    ppo = modules["skyrl_train.utils.ppo_utils"]
    tree = SourceTree(root, ("skyrl_train", "skyrl"))
    trainer_path = root / _TRAINER
    # what trainer.py imports from modules that load without skyrl_gym: the real objects (the rest from source)
    ns = tree.namespace(trainer_path)
    ns.update(
        ppo_utils=ppo,
        convert_prompts_responses_to_batch_tensors=modules["skyrl_train.dataset.preprocess"]
        .convert_prompts_responses_to_batch_tensors,
        TrainingInputBatch=modules["skyrl_train.training_batch"].TrainingInputBatch,
        compute_approx_kl=ppo.compute_approx_kl,
        masked_mean=ppo.masked_mean,
        get_kl_controller=ppo.get_kl_controller,
        logger=importlib.import_module("loguru").logger,  # the fuzzing worker's stand-in: logging only
    )
    cls = find_class(tree.file(trainer_path).tree, "RayPPOTrainer")
    if cls is None:
        raise RuntimeError(f"{trainer_path} has no class RayPPOTrainer: update targets/rollout/skyrl.py")
    methods = {}
    for name in _METHODS:
        node = find_method(cls, name)
        if node is None:
            raise RuntimeError(f"RayPPOTrainer has no method {name} at this pin: update targets/rollout/skyrl.py")
        methods[name] = tree.function(trainer_path, node)
    utils_path = root / "skyrl_train/utils/trainer_utils.py"
    validate_output = tree.resolve(utils_path, ["validate_generator_output"]).get("validate_generator_output")
    if validate_output is None:
        raise RuntimeError(f"validate_generator_output did not compile: {tree.unresolved}")
    fns = {"validate_generator_output": validate_output, **methods}

    def run(request: BatchRequest, device: str) -> tuple[Batch]:
        return (_step(request, fns, ppo, root),)

    notes = ["SkyRL's PPO trainer step (GAE) on a real generation; critic values at the hooked boundary",
             f"trainer methods compiled from {_TRAINER} (the module imports skyrl_gym, not in the wheel)"]  # fmt: skip
    return Loaded(run, " -> ".join(fn for _, fn in PRESERVED), notes)


def _trainer_self(request: BatchRequest, fault, ppo, pad_token_id: int, methods: dict) -> types.SimpleNamespace:
    """The trainer's `self` as the compiled methods read it: cfg.trainer.algorithm, cfg.generator, the tokenizer's
    pad id, one data-parallel rank per model, the reward KL controller of `get_kl_controller`."""
    ns = types.SimpleNamespace
    algo = ns(
        advantage_estimator="gae",
        gamma=1.0 if fault is None else fault.gamma,
        lambd=1.0 if fault is None else fault.lam,
        grpo_norm_by_std=True,
        zero_variance_filter=False,
        use_tis=False,
        use_kl_in_reward=True,  # the carrier of the dense token rewards (k1, coefficient 1)
        kl_estimator_type="k1",
        kl_loss_coef=1.0,
        kl_ctrl=ns(type="fixed", kl_target=0.1, horizon=10000),
        advantage_batch_normalize=False,
    )
    gen_cfg = ns(step_wise_trajectories=False, n_samples_per_prompt=request.generation.num_return_sequences,
                 apply_overlong_filtering=False)  # fmt: skip
    rank = ns(actor_infos=[ns(rank=ns(dp_size=1))])
    me = ns(cfg=ns(trainer=ns(algorithm=algo), generator=gen_cfg), tokenizer=ns(pad_token_id=pad_token_id),
            all_metrics={}, policy_model=rank, critic_model=rank, ref_model=None)  # fmt: skip
    me.reward_kl_controller = ppo.get_kl_controller(algo)  # trainer.py:186-187 with use_kl_in_reward
    me.pad_batch = lambda batch: methods["pad_batch"](me, batch)
    return me


def _generator_output(request: BatchRequest, score: list[float]) -> tuple[dict, list[bool]]:
    """SkyRLGymGenerator.generate_batched's output for the generation (skyrl_gym_generator.py:598-649): the engine
    returns each sample's tokens up to its EOS (no padding); `truncated[b]`: the sample hit the length limit."""
    gen = request.generation
    k, p_len = gen.num_return_sequences, gen.prompt_length
    prompts, responses, truncated = [], [], []
    for r in range(gen.output.shape[0]):
        b = r // k
        prompts.append(gen.input_ids[b][gen.attention_mask[b].bool()].tolist())
        row = gen.output[r, p_len:].tolist()
        cut = gen.eos_token_id not in row
        responses.append(row if cut else row[: row.index(gen.eos_token_id) + 1])
        truncated.append(cut)
    output = {
        "prompt_token_ids": prompts,
        "response_ids": responses,
        "rewards": list(score),
        "loss_masks": [[1] * len(resp) for resp in responses],
        "stop_reasons": ["length" if c else "stop" for c in truncated],
        "rollout_metrics": None,
        "rollout_logprobs": None,
    }
    return output, truncated


class _Calls:
    """Which functions of the checkout ran (`sys.setprofile`): (file relative to root, function name)."""

    def __init__(self, root: Path):
        self.root = str(Path(root).resolve())
        self.seen: set[tuple[str, str]] = set()

    def __call__(self, frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(self.root):
            self.seen.add((str(Path(frame.f_code.co_filename).relative_to(self.root)), frame.f_code.co_name))

    def called(self, upto: int) -> list[str]:
        return [f"{path}::{fn}" for path, fn in PRESERVED[: upto + 1] if (path, fn) in self.seen]


def _step(request: BatchRequest, fns: dict, ppo, root: Path) -> Batch:
    gen, fault = request.generation, request.fault
    rows = gen.output.shape[0]
    score = [0.0] * rows if fault is None else [float(s) for s in fault.score.tolist()]
    calls = _Calls(root)
    sys.setprofile(calls)
    try:
        me = _trainer_self(request, fault, ppo, gen.pad_token_id, fns)
        output, truncated = _generator_output(request, score)
        uids = [str(r // gen.num_return_sequences) for r in range(rows)]
        fns["validate_generator_output"](rows, output)
        output = fns["postprocess_generator_output"](me, output, uids)
        data = fns["convert_to_training_input"](me, output, uids)
    finally:
        sys.setprofile(None)
    p_len = len(data["sequences"][0]) - data["response_mask"].shape[1]  # the left-padded prompt width
    batch = Batch(
        attention=data["response_mask"].bool().clone(),
        trainable=data["loss_mask"].bool().clone(),
        truncated=torch.tensor(truncated),
        stages={
            "input_ids": data["sequences"][:, p_len - 1 :].clone(),
            "sequence_attention_mask": data["attention_mask"].clone(),
            "skyrl_response_mask": data["response_mask"].clone(),
            "loss_mask": data["loss_mask"].clone(),
            "rewards": data["rewards"].clone(),
        },
        called=calls.called(_MASK_STAGE),
        metrics={"postprocess_generator_output": dict(me.all_metrics)},
    )
    if fault is None:
        return batch
    # ---- the hooked boundary: the critic's values enter here, then SkyRL's code runs to the advantages
    data["values"] = fault.values.float().clone()
    data["action_log_probs"] = -fault.token_rewards.float() * 1.0
    data["base_action_log_probs"] = torch.zeros_like(data["values"])
    batch.stages["values"] = data["values"].clone()
    sys.setprofile(calls)
    try:
        data = fns["apply_reward_kl_penalty"](me, data)
        batch.stages["token_level_rewards"] = data["rewards"].clone()
        data = fns["compute_advantages_and_returns"](me, data)
    finally:
        sys.setprofile(None)
    batch.advantages = data["advantages"].float().clone()
    batch.returns = data["returns"].float().clone()
    batch.called = calls.called(len(PRESERVED) - 1)
    batch.metrics["compute_advantages_and_returns"] = dict(data.metadata.get("metrics", {}))
    return batch

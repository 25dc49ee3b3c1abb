"""SkyRL's own batch code on a real rollout (worker side): the PPO trainer's path from the generator output to
`compute_advantages_and_returns`, everything SkyRL's except the critic's values, which enter at `HOOKED_BOUNDARY`.

The calls, in `RayPPOTrainer.train`'s order (lines at the 0.3.1 wheel, skyrl_train/trainer.py:229-259; git main
a9564572eb8e has the same steps in skyrl/train/trainer.py, `MAIN`):

1. the generator output of SkyRLGymGenerator's single-turn path (`generate_batched`,
   skyrl_train/generators/skyrl_gym_generator.py:598-649): per sample the engine's response ids (the tokens up to
   and including the sampled EOS, cut at `max_tokens`, :618-619), `loss_masks = [1] * len(response)` (:620), the
   environment's scalar reward (the case's score: a rule reward stands in for the environment, :614-616), the
   chat-templated prompt ids (:631-635); `validate_generator_output` checks it (trainer_utils.py:591, called by
   `generate`, trainer.py:650);
2. `postprocess_generator_output` (trainer.py:655-718): the scalar reward on the last response token, :701-702;
3. `convert_to_training_input` (trainer.py:558-628): `convert_prompts_responses_to_batch_tensors`
   (skyrl_train/dataset/preprocess.py:28-132: prompts left-padded, responses right-padded to the longest response
   of the step; git main right-aligns them, skyrl/train/dataset/preprocess.py:201-217), then `pad_batch` (:833,
   dp size 1; git main: `pad_training_input_batch`);
4. the hooked boundary: `data["values"]` = the fault's values (the critic's `fwd_logprobs_values_reward` output,
   trainer.py:876; action_values are the value head at every response position, model_wrapper.py:500-514),
   `action_log_probs` / `base_action_log_probs` the KL term's inputs;
5. `apply_reward_kl_penalty` (trainer.py:1000-1054, `use_kl_in_reward`) with `get_kl_controller` (fixed, coef 1)
   and `compute_advantages_and_returns` (trainer.py:721-823, `advantage_estimator: gae`), which calls
   ppo_utils.compute_advantages_and_returns -> compute_gae_advantage_return (ppo_utils.py:1087, :999-1026).

The trainer module imports the generator stack and skyrl_gym (SkyRL's own, never stood in; not in the wheel), so
the trainer methods are compiled from the pin's trainer.py (`targets.adapters.extract.SourceTree`, file and line
numbers kept) with `self` a namespace holding the config they read; every function they call is SkyRL's, imported
from the pin (preprocess, training_batch, ppo_utils) or compiled from its source (generators/utils.py,
trainer_utils.py). Which calls ran is recorded with `sys.setprofile` (`Batch.called`).

Layout: the canonical [B, T] tensors are SkyRL's response window (T = the step's longest response): attention =
response_mask (the response indicator), trainable = loss_mask. Token rewards enter as SkyRL's only dense reward,
its KL term: action_log_probs = -token_rewards, base_action_log_probs = 0, `kl_estimator_type: k1`,
`kl_loss_coef: 1`, so `apply_reward_kl_penalty` adds exactly the token rewards where loss_mask is 1; the score is
the environment's reward. Stage `input_ids` is SkyRL's `sequences` from the column before the response window
on, so canonical position t is column t + 1 (the layout `fuzz.validate` reads tokens in). Stand-ins: the SkyRL
fuzzing worker's (`targets.skyrl.declare.SPEC.stand_ins`).
"""

from __future__ import annotations

import importlib
import sys
import types
from dataclasses import dataclass
from pathlib import Path

import torch

from maskfuzz.targets.adapters.base import Loaded, import_from
from maskfuzz.targets.adapters.extract import SourceTree, find_class, find_method
from maskfuzz.targets.rollout.requests import Batch, BatchRequest
from maskfuzz.targets.rollout.trace import CallTrace

HOOKED_BOUNDARY = "after the real rollout, before critic values enter compute_advantages_and_returns"
BOUNDARY_INPUTS = (
    "data['values'] [B, T]: the critic's values (the case's at valid tokens, its poison under the mask)",
    "data['action_log_probs'] = -token_rewards, data['base_action_log_probs'] = 0 [B, T]: SkyRL's KL-in-reward "
    "term, k1, coefficient 1",
    "the generator's scalar reward per row: the case's score (a rule reward in place of the environment)",
)
REPLACED_COMPONENT = None
# convert_prompts_responses_to_batch_tensors pads every response to the longest response of the step it is given
# (0.3.1 skyrl_train/dataset/preprocess.py:28-132; git main right-aligns to it): a row's padding exists only inside
# its step, so `fuzz.validate` executes the whole pool as the step and judges the chosen rows in it
STEP_WIDE_PADDING = True


@dataclass(frozen=True)
class Layout:
    """Where the step's code lives in one package layout: the trainer file, the modules imported for real, the
    calls (`preserved`, (file, function) in order; trainer methods are compiled from `trainer`)."""

    trainer: str
    trainer_utils: str
    preprocess: str
    training_batch: str
    ppo_utils: str
    torch_utils: str
    preserved: tuple[tuple[str, str], ...]
    mask_stage: int  # the index in `preserved` of the last call without a fault


def _layout(pkg: str, trainer: str, utils: str, pad: tuple[str, str]) -> Layout:
    ppo = f"{pkg}/utils/ppo_utils.py"
    preserved = (
        (utils, "validate_generator_output"),
        (trainer, "postprocess_generator_output"),
        (trainer, "convert_to_training_input"),
        (f"{trainer.rsplit('/', 1)[0]}/dataset/preprocess.py", "convert_prompts_responses_to_batch_tensors"),
        pad,
        (trainer, "apply_reward_kl_penalty"),
        (ppo, "compute_approx_kl"),
        (trainer, "compute_advantages_and_returns"),
        (ppo, "compute_advantages_and_returns"),
        (ppo, "compute_gae_advantage_return"),
    )
    dotted = lambda path: path.removesuffix(".py").replace("/", ".")  # noqa: E731
    return Layout(trainer, utils, dotted(preserved[3][0]), f"{dotted(pkg)}.training_batch", dotted(ppo),
                  f"{dotted(pkg)}.utils.torch_utils", preserved, preserved.index(pad))  # fmt: skip


# the skyrl_train wheels (0.1.0 .. 0.3.1) and git main's `skyrl` package (2026-02-15 on)
RELEASE = _layout("skyrl_train", "skyrl_train/trainer.py", "skyrl_train/utils/trainer_utils.py",
                  ("skyrl_train/trainer.py", "pad_batch"))  # fmt: skip
MAIN = _layout("skyrl/backends/skyrl_train", "skyrl/train/trainer.py", "skyrl/train/utils/trainer_utils.py",
               ("skyrl/backends/skyrl_train/training_batch.py", "pad_training_input_batch"))  # fmt: skip
PRESERVED = RELEASE.preserved  # the wheel's calls (git main: MAIN.preserved)
_METHODS = ("postprocess_generator_output", "convert_to_training_input", "pad_batch", "apply_reward_kl_penalty",
            "compute_advantages_and_returns")  # fmt: skip


def load(root: Path, entry: str | None) -> Loaded:
    """Import SkyRL's batch code from the wheel or checkout at `root`; `run(BatchRequest, device)` answers
    `(Batch,)`."""
    if entry not in (None, "default"):
        raise ValueError(f"the real-rollout path of skyrl covers its GAE trainer step (entry default), not {entry!r}")
    root = Path(root)
    layout = next((lay for lay in (RELEASE, MAIN) if (root / lay.trainer).is_file()), None)
    if layout is None:
        raise RuntimeError(f"no {RELEASE.trainer} or {MAIN.trainer} at {root}: update targets/skyrl/rollout.py")
    if (root / "skyrl-gym").is_dir():  # git main's ppo_utils imports skyrl_gym, a subproject of the monorepo
        sys.path.insert(0, str(root / "skyrl-gym"))
    ppo = import_from(root, layout.ppo_utils)
    preprocess = import_from(root, layout.preprocess)
    tree = SourceTree(root, ("skyrl_train", "skyrl"))
    trainer_path = root / layout.trainer
    # what trainer.py imports from modules that load here: the real objects (the rest compiled from source)
    ns = tree.namespace(trainer_path)
    ns.update(
        ppo_utils=ppo,
        convert_prompts_responses_to_batch_tensors=preprocess.convert_prompts_responses_to_batch_tensors,
        TrainingInputBatch=import_from(root, layout.training_batch).TrainingInputBatch,
        compute_approx_kl=ppo.compute_approx_kl,
        masked_mean=getattr(ppo, "masked_mean", None) or import_from(root, layout.torch_utils).masked_mean,
        get_kl_controller=ppo.get_kl_controller,
        logger=importlib.import_module("loguru").logger,  # the fuzzing worker's stand-in: logging only
    )
    cls = find_class(tree.file(trainer_path).tree, "RayPPOTrainer")
    if cls is None:
        raise RuntimeError(f"{trainer_path} has no class RayPPOTrainer: update targets/skyrl/rollout.py")
    fns = {}
    for name in _METHODS:
        node = find_method(cls, name)
        if node is not None:
            fns[name] = tree.function(trainer_path, node)
        elif name != "pad_batch":  # git main pads in convert_to_training_input (pad_training_input_batch)
            raise RuntimeError(f"RayPPOTrainer has no method {name} at this pin: update targets/skyrl/rollout.py")
    utils_path = root / layout.trainer_utils
    fns["validate_generator_output"] = tree.resolve(utils_path, ["validate_generator_output"]).get(
        "validate_generator_output")  # fmt: skip
    if fns["validate_generator_output"] is None:
        raise RuntimeError(f"validate_generator_output did not compile: {tree.unresolved}")

    def run(request: BatchRequest, device: str) -> tuple[Batch]:
        return (_step(request, fns, ppo, root, layout),)

    notes = ["SkyRL's PPO trainer step (GAE) on a real generation; critic values at the hooked boundary",
             f"trainer methods compiled from {layout.trainer} (the module imports the generator stack and "
             "skyrl_gym at top level)"]  # fmt: skip
    return Loaded(run, " -> ".join(fn for _, fn in layout.preserved), notes)


def _trainer_self(request: BatchRequest, fault, ppo, pad_token_id: int, methods: dict) -> types.SimpleNamespace:
    """The trainer's `self` as the compiled methods read it: cfg.trainer (algorithm, batch sizes, no critic
    boundaries), cfg.generator, the tokenizer's pad id, one data-parallel rank per model, the reward KL controller
    of `get_kl_controller`."""
    ns = types.SimpleNamespace
    algo = ns(
        advantage_estimator="gae",
        gamma=1.0 if fault is None else fault.gamma,
        lambd=1.0 if fault is None else fault.lam,
        grpo_norm_by_std=True,
        zero_variance_filter=False,
        zero_variance_filter_tol=0.0,
        use_tis=False,
        use_kl_in_reward=True,  # the carrier of the dense token rewards (k1, coefficient 1)
        kl_estimator_type="k1",
        kl_loss_coef=1.0,
        kl_ctrl=ns(type="fixed", kl_target=0.1, horizon=10000),
        advantage_batch_normalize=False,
        max_seq_len=None,
        off_policy_correction=ns(tis_ratio_type=None, sequence_mask_metric=None),
    )
    k = request.generation.num_return_sequences
    prompts = request.generation.output.shape[0] // k
    gen_cfg = ns(step_wise_trajectories=False, merge_stepwise_output=False, n_samples_per_prompt=k,
                 apply_overlong_filtering=False)  # fmt: skip
    trainer_cfg = ns(algorithm=algo, train_batch_size=prompts, policy_mini_batch_size=prompts,
                     critic_mini_batch_size=prompts, critic=ns(model=ns(path=None)))  # fmt: skip
    rank = ns(actor_infos=[ns(rank=ns(dp_size=1))])
    me = ns(cfg=ns(trainer=trainer_cfg, generator=gen_cfg), tokenizer=ns(pad_token_id=pad_token_id),
            all_metrics={}, policy_model=rank, critic_model=rank, ref_model=None,
            dispatch=ns(get_lcm_dp_size=lambda: 1))  # fmt: skip
    me.reward_kl_controller = ppo.get_kl_controller(algo)  # trainer.py:186-187 with use_kl_in_reward
    if "pad_batch" in methods:
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


def _step(request: BatchRequest, fns: dict, ppo, root: Path, layout: Layout) -> Batch:
    gen, fault = request.generation, request.fault
    rows = gen.output.shape[0]
    score = [0.0] * rows if fault is None else [float(s) for s in fault.score.tolist()]
    calls = CallTrace(root)
    sys.setprofile(calls)
    try:
        me = _trainer_self(request, fault, ppo, gen.pad_token_id, fns)
        output, truncated = _generator_output(request, score)
        uids = [str(r // gen.num_return_sequences) for r in range(rows)]
        fns["validate_generator_output"](rows, output)
        output = fns["postprocess_generator_output"](me, output, uids)
        if isinstance(output, tuple):  # git main returns (generator_output, uids)
            output, uids = output
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
        called=calls.called(layout.preserved[: layout.mask_stage + 1]),
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
    batch.called = calls.called(layout.preserved)
    batch.metrics["compute_advantages_and_returns"] = dict(data.metadata.get("metrics", {}))
    return batch

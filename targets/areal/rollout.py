"""AReaL's own batch code on a real rollout (worker side): the single-turn RLVR workflow's episode, the trainer's
batching and `PPOActor._compute_advantages`, everything AReaL's except the critic's values and the reference
log-probs, which enter at `HOOKED_BOUNDARY`.

The calls, in AReaL's order (lines at the 1.0.4 wheel; the declaration `targets.areal.declare` cites the others):

1. per sample, `RLVRWorkflow.arun_episode(engine, data)` (areal/workflow/rlvr.py:148-182) with `_collect_samples`
   and `_compute_rewards` (:114-146, :84-109): `default_get_input_ids_fn` -> `apply_chat_template`
   (areal/utils/hf_utils.py:36-47) renders the conversation with the tiny LM's tokenizer, the engine answers
   `agenerate` with the tiny LM's sampled tokens (up to and including EOS, or cut at max_new_tokens), the reward
   function is a rule reward (the case's score), and AReaL builds the trajectory: `seq = input_tokens +
   output_tokens`, `loss_mask = [0] * input_len + [1] * output_len`, `attention_mask` all ones, the reward;
2. the hooked boundary, per trajectory as the trainer sets them (areal/trainer/rl_trainer.py:633-635, 650-652):
   `values` (the critic's forward) and `ref_logp` (the reference engine's), [1, L_i] each;
3. `PPOActor.compute_advantages`'s `batched_call(self._compute_advantages, data)` (areal/trainer/ppo/actor.py:
   140-142; areal/utils/data.py:403-429: `concat_batch` -> `concat_padded_tensors`, right padding, then
   `split_batch`) and `_compute_advantages` (actor.py:144-249): the score at `seqlens - 2`, a row as wide as the
   batch taken for one without EOS (`seq_no_eos_mask = seqlens == attn_mask.shape[1]`), the KL reward, GAE.

Compiled from the wheel's source (`targets.adapters.extract.SourceTree`, file and line numbers kept): the three
workflow methods, `default_get_input_ids_fn`, `apply_chat_template`, `batched_call` / `concat_batch` /
`concat_padded_tensors` / `split_batch`, `_compute_advantages` and `KLEstimator`. `areal` itself is not importable
here (its package `__init__` starts the RPC stack: aiohttp, ...); stand-ins, none of them touched by the math: the
inference engine (the tiny LM's answers), `ModelRequest` / `ModelResponse` / `GenerationHyperparameters` (their
dataclasses need the package imported: namespaces with the same fields and `input_len` / `output_len`),
`TrajBatchMeta` (the same), `AsyncRewardWrapper` (the rule reward awaited directly, not in a process pool), the
perf tracer's `atrace_session_phase` and `stats_tracker` / `workflow_context` (metrics), `uuid`.

Layout: AReaL's rolled coordinates (log-prob index t scores token t + 1): the canonical [B, T] tensors are the
batch's columns 0 .. L - 2 (L = the batch width), position t = token t + 1; trainable = the rolled loss mask,
attention = attention_mask[:, 1:] (the prompt's tokens are masked real tokens, padding after the response).
Token rewards enter as AReaL's only dense reward, its KL term (k1): the engine's log-probs 0, `ref_logp` =
token_rewards / kl_ctl with kl_ctl the power of two `targets.areal.calls.kl_scale` picks (exact); AReaL multiplies
both by the rolled loss mask, so nothing placed under the mask reaches the reward. The score is the reward.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import importlib.metadata
import sys
import types
import uuid
from pathlib import Path

import packaging.version
import torch

from maskfuzz.targets.adapters.base import Loaded, NotPresent
from maskfuzz.targets.adapters.extract import SourceTree, find_class, find_method
from maskfuzz.targets.areal.calls import OPTION_DEFAULTS, PACKAGES, SELF_SET, kl_scale
from maskfuzz.targets.rollout import lm
from maskfuzz.targets.rollout.requests import Batch, BatchRequest
from maskfuzz.targets.rollout.trace import CallTrace

HOOKED_BOUNDARY = "after the real rollout, before the critic's values and ref_logp enter compute_advantages"
BOUNDARY_INPUTS = (
    "trajectory['values'] [1, L_i]: the critic's values (the case's at valid positions, its poison under the mask)",
    "trajectory['ref_logp'] [1, L_i] = token_rewards / kl_ctl, the engine's logprobs 0: AReaL's KL reward, k1",
    "the rule reward of each episode: the case's score (in place of the reward function)",
)
REPLACED_COMPONENT = None
WORKFLOW = ("areal/workflow/rlvr.py", "RLVRWorkflow", ("arun_episode", "_collect_samples", "_compute_rewards"))
ACTOR = ("areal/trainer/ppo/actor.py", "PPOActor", "_compute_advantages")
DATA = "areal/utils/data.py"
HF_UTILS = "areal/utils/hf_utils.py"


def load(root: Path, entry: str | None) -> Loaded:
    """Compile AReaL's workflow, batching and advantage code from the wheel at `root`; `run(BatchRequest, device)`
    answers `(Batch,)`."""
    if entry not in (None, "", "default"):
        raise ValueError(f"the real-rollout path of areal covers its PPO actor (entry default), not {entry!r}")
    root = Path(root)
    tree = SourceTree(root, PACKAGES)
    fns = {}
    for rel, cls_name, methods in (WORKFLOW, (ACTOR[0], ACTOR[1], (ACTOR[2],))):
        path = root / rel
        cls = find_class(tree.file(path).tree, cls_name) if path.is_file() else None
        for name in methods:
            node = find_method(cls, name) if cls is not None else None
            if node is None:
                raise NotPresent(f"no {rel}::{cls_name}.{name} at this pin: update targets/areal/rollout.py")
            fns[name] = tree.function(path, node)
    wf = tree.resolve(root / WORKFLOW[0], ["default_get_input_ids_fn"])
    # hf_utils.apply_chat_template is two @overload stubs and the implementation: the implementation, the last def
    hf = root / HF_UTILS
    impl = [n for n in tree.file(hf).tree.body if isinstance(n, ast.FunctionDef) and n.name == "apply_chat_template"]
    if not impl:
        raise NotPresent(f"no {HF_UTILS}::apply_chat_template at this pin: update targets/areal/rollout.py")
    wf["apply_chat_template"] = tree.function(hf, impl[-1])
    version = tree.resolve(root / "areal/utils/pkg_version.py", ["is_version_greater_or_equal"])  # a module import
    version.update(
        get_version=importlib.metadata.version,
        PackageNotFoundError=importlib.metadata.PackageNotFoundError,
        Version=packaging.version.Version,
    )  # the imports SourceTree does not follow (not light)
    tree.namespace(hf)["pkg_version"] = types.SimpleNamespace(**{
        k: version[k] for k in ("is_version_greater_or_equal",)})  # fmt: skip
    data_ns = tree.resolve(root / DATA, ["batched_call", "KLEstimator"])
    actor_ns = tree.resolve(root / ACTOR[0], ["KLEstimator"])
    # stand-ins for what the math never touches (module docstring); set in the compiled modules' globals
    wf.update(uuid=uuid, ModelRequest=_struct, atrace_session_phase=_phase, stats_tracker=_Stats(),
              workflow_context=types.SimpleNamespace(stat_scope=lambda: "rollout"))  # fmt: skip
    data_ns.update(TrajBatchMeta=_struct)
    fns["default_get_input_ids_fn"] = wf["default_get_input_ids_fn"]
    fns["batched_call"] = data_ns["batched_call"]
    kl_estimator = actor_ns["KLEstimator"]("k1")
    tokenizer = lm.build_tokenizer()
    called = [f"{WORKFLOW[0]}::{WORKFLOW[1]}.{m}" for m in WORKFLOW[2]] + [
        f"{WORKFLOW[0]}::default_get_input_ids_fn", "areal/utils/hf_utils.py::apply_chat_template",
        f"{DATA}::batched_call", f"{DATA}::concat_batch", f"{DATA}::concat_padded_tensors", f"{DATA}::split_batch",
        f"{ACTOR[0]}::{ACTOR[1]}.{ACTOR[2]}", f"{DATA}::KLEstimator._compute_approx_kl"]  # fmt: skip

    def run(request: BatchRequest, device: str) -> tuple[Batch]:
        return (_step(request, fns, tokenizer, kl_estimator, called, root),)

    notes = ["AReaL's RLVR workflow episode, batched_call and PPOActor._compute_advantages on a real generation; "
             "critic values and ref_logp at the hooked boundary", "compiled from source: " +
             ", ".join(sorted(tree.provenance))]  # fmt: skip
    return Loaded(run, " -> ".join(c.rsplit("::", 1)[1] for c in called), notes)


def _struct(**fields):
    return types.SimpleNamespace(**fields)


@contextlib.asynccontextmanager
async def _phase(*args, **kwargs):
    yield


class _Stats:
    def get(self, scope):
        return types.SimpleNamespace(scalar=lambda **kw: None)


class _Gconfig(types.SimpleNamespace):
    def new(self, **kw):
        return _Gconfig(**{**vars(self), **kw})


class _Response(types.SimpleNamespace):
    """ModelResponse's fields the workflow reads (areal/api/io_struct.py:63-91)."""

    @property
    def input_len(self) -> int:
        return len(self.input_tokens)

    @property
    def output_len(self) -> int:
        return len(self.output_tokens)


class _Engine:
    """The inference engine: answers `agenerate` with the tiny LM's sampled tokens for this prompt."""

    def __init__(self, prompt: list[int], output: list[int], cut: bool, tokenizer):
        self.prompt, self.output, self.cut, self.tokenizer = prompt, output, cut, tokenizer

    async def agenerate(self, req):
        if list(req.input_ids) != self.prompt:
            raise RuntimeError(
                f"AReaL's chat template rendered {list(req.input_ids)}, the tiny LM sampled for {self.prompt}"
            )
        n = len(self.output)
        return _Response(input_tokens=list(req.input_ids), output_tokens=list(self.output), output_logprobs=[0.0] * n,
                         output_versions=[0] * n, stop_reason="length" if self.cut else "stop",
                         tokenizer=self.tokenizer)  # fmt: skip


def _episodes(request: BatchRequest, fns: dict, tokenizer, score: list[float]) -> tuple[list[dict], list[bool]]:
    """One `RLVRWorkflow.arun_episode` per generated row: the trajectory dicts and whether each was cut."""
    gen = request.generation
    k, p_len = gen.num_return_sequences, gen.prompt_length
    trajectories, cut = [], []
    # each row's conversation (a sub-batch, `Generation.rows`, keeps each row's rendered prompt, not its index)
    conversations = {}
    for conv in gen.request.conversations:
        messages = [{"role": role, "content": text} for role, text in conv]
        conversations[tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)] = messages
    for r in range(gen.output.shape[0]):
        b = r // k
        prompt = gen.input_ids[b][gen.attention_mask[b].bool()].tolist()
        row = gen.output[r, p_len:].tolist()
        ended = gen.eos_token_id in row
        output = row[: row.index(gen.eos_token_id) + 1] if ended else row
        reward = score[r]

        async def reward_fn(*args, _reward=reward, **kwargs):  # a rule reward: the case's score
            return _reward

        me = types.SimpleNamespace(
            reward_fn=reward_fn, async_reward_fn=reward_fn, tokenizer=tokenizer, enable_thinking=False,
            gconfig=_Gconfig(n_samples=1, max_new_tokens=request.generation.request.max_new_tokens),
            get_input_ids_fn=fns["default_get_input_ids_fn"], data_extract_prompt_fn=lambda data: data["messages"],
        )  # fmt: skip
        me._collect_samples = types.MethodType(fns["_collect_samples"], me)
        me._compute_rewards = types.MethodType(fns["_compute_rewards"], me)
        messages = conversations[gen.prompts[b]]
        engine = _Engine(prompt, output, not ended, tokenizer)
        trajectories.append(asyncio.run(fns["arun_episode"](me, engine, {"messages": messages})))
        cut.append(not ended)
    return trajectories, cut


def _actor(options: dict, fault, kl_estimator, kl_ctl: float) -> types.SimpleNamespace:
    """PPOActor's attributes as `__init__` derives them from PPOActorConfig (its defaults, the case's options)."""
    opt = {name: options.get(name, default) for name, default in OPTION_DEFAULTS.items()}
    config = types.SimpleNamespace(overlong_reward_penalty=False, overlong_tokens=None, overlong_penalty_factor=None,
                                   max_new_tokens=None, use_decoupled_loss=False, recompute_logprob=False)  # fmt: skip
    me = types.SimpleNamespace(
        config=config, reward_bias=opt["actor.reward_bias"], reward_scaling=opt["actor.reward_scaling"],
        reward_clip=opt["actor.reward_clip"], reward_norm=None, kl_ctl=kl_ctl, kl_estimator=kl_estimator,
        mask_no_eos_with_zero=opt["actor.mask_no_eos_with_zero"], discount=1.0 if fault is None else fault.gamma,
        gae_lambda=1.0 if fault is None else fault.lam, adv_norm=None, group_reward_norm=False,
        group_adv_norm=False, group_size=1, gae_timestep_unit="token", _gae_lambda_is_custom=False,
        _compute_gae_lambda=None,
    )  # fmt: skip
    assert set(vars(me)) <= set(SELF_SET)
    return me


def _step(request: BatchRequest, fns: dict, tokenizer, kl_estimator, called: list, root: Path) -> Batch:
    gen, fault = request.generation, request.fault
    rows = gen.output.shape[0]
    score = [0.0] * rows if fault is None else [float(s) for s in fault.score.tolist()]
    calls = CallTrace(root)
    sys.setprofile(calls)
    try:
        trajectories, cut = _episodes(request, fns, tokenizer, score)
    finally:
        sys.setprofile(None)
    width = max(t["input_ids"].shape[1] for t in trajectories)
    t_len = width - 1
    kl_ctl = 1.0
    if fault is not None:
        trainable = torch.zeros(rows, t_len, dtype=torch.bool)
        for i, t in enumerate(trajectories):
            trainable[i, : t["loss_mask"].shape[1] - 1] = t["loss_mask"][0, 1:].bool()
        kl_ctl = kl_scale(fault.token_rewards, trainable)
        # ---- the hooked boundary: the critic's values and the reference log-probs, per trajectory
        for i, t in enumerate(trajectories):
            n = t["input_ids"].shape[1]
            values = torch.zeros(1, n, dtype=torch.float32)
            ref_logp = torch.zeros(1, n, dtype=torch.float32)
            values[0, : n - 1] = fault.values[i, : n - 1].float()
            ref_logp[0, : n - 1] = fault.token_rewards[i, : n - 1].float() / kl_ctl
            t["values"], t["ref_logp"] = values, ref_logp
    me = _actor(request.options, fault, kl_estimator, kl_ctl)
    seen: dict = {}

    def compute(data):  # PPOActor._compute_advantages on the batched dict (the batch kept for the record)
        seen["batch"] = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in data.items()}
        seen["out"] = fns["_compute_advantages"](me, data)
        return seen["out"]

    if fault is None:
        for t in trajectories:  # masks only: no critic, no reference (the method reads neither then)
            t["values"] = torch.zeros(1, t["input_ids"].shape[1])
    sys.setprofile(calls)
    try:
        fns["batched_call"](compute, trajectories)
    finally:
        sys.setprofile(None)
    batched, out = seen["batch"], seen["out"]
    att = batched["attention_mask"].bool()
    batch = Batch(
        attention=att[:, 1:].clone(),
        trainable=out["loss_mask"][:, :t_len].bool().clone(),
        truncated=torch.tensor(cut),
        stages={
            "input_ids": batched["input_ids"].long().clone(),
            "attention_mask": batched["attention_mask"].clone(),
            "loss_mask": batched["loss_mask"].clone(),
            "rewards": batched["rewards"].clone(),
        },
        called=calls.called(called),
        tokens=batched["input_ids"][:, 1:].long().clone(),
        reward_mask=out["loss_mask"][:, :t_len].bool().clone(),
    )
    if fault is None:
        return batch
    batch.stages.update(values=batched["values"].clone(), ref_logp=batched["ref_logp"].clone(),
                        tot_rewards=out["tot_rewards"].clone(), kl_ctl=torch.tensor(kl_ctl))  # fmt: skip
    batch.advantages = out["advantages"][:, :t_len].float().clone()
    batch.returns = out["returns"][:, :t_len].float().clone()
    return batch

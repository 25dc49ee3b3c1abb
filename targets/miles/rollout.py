"""miles' own batch code on a real rollout (worker side): the single-turn path from the engine's answer to the PPO
caller `compute_advantages_and_returns`, everything miles' except the engine, the Ray object store and the
critic's values, which enter at `HOOKED_BOUNDARY`. Lines at the wheel miles-rl 0.0.2.

1. per sample, the default generate function `generate(args, sample, sampling_params)`
   (miles/rollout/sglang_rollout.py:132-232): the prompt ids, the engine's output tokens and log-probs appended
   (:200-218), the status from the finish reason (`Sample.update_from_meta_info`, miles/utils/types.py:220-241:
   `length` -> TRUNCATED); the engine is the tiny LM's generation (the router's `/generate` answer: tokens up to
   and including EOS, `finish_reason` stop or length), the reward the case's score (a rule reward in place of
   rm_hub);
2. `RolloutManager._convert_samples_to_train_data` (miles/ray/rollout.py:667-738, `_post_process_rewards`
   :640-665): `loss_mask = [1] * response_length` when the sample has none (:695-696), then
   `_split_train_data_by_dp` (:743-793, dp size 1) and `process_rollout_data` (miles/utils/data.py:272-282);
   `ray.put` / `ray.get` hand the dict through unchanged (a local object store);
3. the train side's `get_rollout_data` (miles/backends/training_utils/data.py:29-46) makes `loss_masks` int
   tensors on the GPU; here the same `torch.tensor(t, dtype=torch.int)` on CPU;
4. the hooked boundary: `rollout_data["values"]` = the fault's values per sample (the critic's `get_values`,
   miles/backends/megatron_utils/actor.py:328-354), `log_probs` = 0 and `ref_log_probs` = token_rewards, then
   `compute_advantages_and_returns(args, rollout_data)` (miles/backends/training_utils/loss.py:291-355: k1 KL times
   -kl_coef, the score added at `k[-1]`, `get_advantages_and_returns_batch`).

The RolloutManager methods and the generate function are compiled from the pin's files
(`targets.adapters.extract.SourceTree`): their modules import sglang, ray and the SGLang engine at top level.

Layout: miles' batch is per-sample lists without padding; the canonical [B, T] puts row b's response at columns
0 .. response_length - 1, padding after it (T = the longest response): attention = a response token, trainable =
loss_mask. Stage `input_ids` is each sample's tokens from its last prompt token on (canonical t = column t + 1).
"""

from __future__ import annotations

import asyncio
import sys
import types
from pathlib import Path

import torch

from maskfuzz.targets.adapters.base import Loaded, import_from
from maskfuzz.targets.adapters.extract import SourceTree, find_class, find_method
from maskfuzz.targets.miles.calls import kl_caller
from maskfuzz.targets.rollout.plumbing import ObjectStore, pad_responses
from maskfuzz.targets.rollout.requests import Batch, BatchRequest
from maskfuzz.targets.rollout.trace import CallTrace
from maskfuzz.targets.slime.calls import caller_args

HOOKED_BOUNDARY = "after the real rollout, before critic values enter compute_advantages_and_returns"
BOUNDARY_INPUTS = (
    "rollout_data['values'] [response_length] per sample: the critic's values (the case's at valid tokens, its "
    "poison under the mask)",
    "rollout_data['log_probs'] = 0, ['ref_log_probs'] = token_rewards per sample: miles' KL term, k1, kl_coef 1",
    "sample.reward: the case's score (a rule reward in place of rm_hub)",
)
REPLACED_COMPONENT = None
_ROLLOUT, _MANAGER = "miles/rollout/sglang_rollout.py", "miles/ray/rollout.py"
PRESERVED = (
    (_ROLLOUT, "generate"),
    ("miles/utils/types.py", "update_from_meta_info"),
    (_MANAGER, "_convert_samples_to_train_data"),
    (_MANAGER, "_post_process_rewards"),
    (_MANAGER, "_split_train_data_by_dp"),
    ("miles/utils/data.py", "process_rollout_data"),
    ("miles/backends/training_utils/loss.py", "compute_advantages_and_returns"),
    ("miles/utils/ppo_utils.py", "compute_approx_kl"),
    ("miles/utils/ppo_utils.py", "get_advantages_and_returns_batch"),
)
_MASK_STAGE = PRESERVED.index(("miles/utils/data.py", "process_rollout_data"))


def load(root: Path, entry: str | None) -> Loaded:
    """miles' single-turn batch code from the wheel at `root`; `run(BatchRequest, device)` answers `(Batch,)`."""
    if entry not in (None, "default"):
        raise ValueError(f"the real-rollout path of miles covers its PPO step (entry default), not {entry!r}")
    root = Path(root)
    types_mod = import_from(root, "miles.utils.types")
    box = import_from(root, "miles.utils.ray_utils").Box
    call, caller_where, notes = kl_caller(root)
    notes = [n for n in notes if not n.startswith("KL in the reward")]  # the step sets kl_coef 1, k1 (caller_args)
    tree = SourceTree(root, ("miles",))
    engine: dict = {}  # the current request's engine answers, by prompt text
    rollout_ns = tree.namespace(root / _ROLLOUT)

    async def post(url: str, payload: dict, headers=None) -> dict:  # the router's /generate, answered by the LM
        return _answer(engine, payload)

    rollout_ns.update(Sample=types_mod.Sample, post=post, GenerateState=lambda args: engine["state"])
    manager_ns = tree.namespace(root / _MANAGER)
    manager_ns.update(Sample=types_mod.Sample, ray=ObjectStore, Box=box)
    tree.namespace(root / "miles/utils/data.py").update(ray=ObjectStore)
    fns = {}
    for path, cls_name, name in ((_ROLLOUT, None, "generate"), (_MANAGER, "RolloutManager", "_post_process_rewards"),
                                 (_MANAGER, "RolloutManager", "_convert_samples_to_train_data"),
                                 (_MANAGER, "RolloutManager", "_split_train_data_by_dp"),
                                 ("miles/utils/data.py", None, "process_rollout_data")):  # fmt: skip
        parsed = tree.file(root / path).tree
        scope = parsed if cls_name is None else find_class(parsed, cls_name)
        node = next((n for n in scope.body if getattr(n, "name", None) == name), None) if cls_name is None else \
            find_method(scope, name)  # fmt: skip
        if node is None:
            raise RuntimeError(f"{path} has no {cls_name or 'module'} function {name}: update targets/miles/rollout.py")
        fns[name] = tree.function(root / path, node)

    def run(request: BatchRequest, device: str) -> tuple[Batch]:
        return (_step(request, fns, types_mod.Sample, call, engine, root),)

    notes = [*notes, "miles' single-turn rollout and PPO step on a real generation; critic values at the boundary"]
    return Loaded(run, f"{' -> '.join(fn for _, fn in PRESERVED)} ({caller_where})", notes)


def _answer(engine: dict, payload: dict) -> dict:
    """The router's `/generate` answer for `payload['input_ids']`: the generation's tokens of that sample."""
    tokens, finish = engine["queue"].pop(0)
    assert payload["input_ids"] == engine["prompt_of"][len(engine["done"])], "the engine answers the samples in order"
    engine["done"].append(tokens)
    # "text" only feeds sample.response (a log field): the ids, the batch worker has no detokenizer
    return {"text": " ".join(map(str, tokens)), "meta_info": {"output_token_logprobs": [[0.0, t] for t in tokens],
            "finish_reason": {"type": finish}}}  # fmt: skip


def _args(request: BatchRequest, fault) -> types.SimpleNamespace:
    """The argparse namespace the compiled functions read (miles' defaults, PPO, one data-parallel rank)."""
    return types.SimpleNamespace(
        ci_test=False, sglang_router_ip="127.0.0.1", sglang_router_port=0, use_rollout_routing_replay=False,
        sglang_router_policy=None, use_miles_router=False, miles_router_middleware_paths=[],
        sglang_speculative_algorithm=None, partial_rollout=False, mask_offpolicy_in_partial_rollout=False,
        lora_rank=0, lora_adapter_path=None, reward_key=None, advantage_estimator="ppo", rewards_normalization=True,
        n_samples_per_prompt=request.generation.num_return_sequences, use_dynamic_global_batch_size=False,
        balance_data=False,
    )  # fmt: skip


def _step(request: BatchRequest, fns: dict, sample_cls, call, engine: dict, root: Path) -> Batch:
    gen, fault = request.generation, request.fault
    k, p_len, rows = gen.num_return_sequences, gen.prompt_length, gen.output.shape[0]
    args = _args(request, fault)
    prompts = [gen.input_ids[r // k][gen.attention_mask[r // k].bool()].tolist() for r in range(rows)]
    answers = []
    for r in range(rows):
        row = gen.output[r, p_len:].tolist()
        cut = gen.eos_token_id not in row
        answers.append((row if cut else row[: row.index(gen.eos_token_id) + 1], "length" if cut else "stop"))
    tokenizer = types.SimpleNamespace(encode=lambda text, add_special_tokens=False: prompts[int(text)])
    engine.update(queue=list(answers), prompt_of=prompts, done=[],
                  state=types.SimpleNamespace(tokenizer=tokenizer, processor=None))  # fmt: skip
    calls = CallTrace(root)
    me = types.SimpleNamespace(args=args, custom_reward_post_process_func=None,
                               custom_convert_samples_to_train_data_func=None)  # fmt: skip
    me._post_process_rewards = lambda samples: fns["_post_process_rewards"](me, samples)
    sys.setprofile(calls)
    try:
        samples = []
        for r in range(rows):  # the prompt "text" is its row: the tokenizer stand-in returns the LM's prompt ids
            sample = sample_cls(group_index=r // k, index=r, prompt=str(r))
            sample = asyncio.run(fns["generate"](args, sample, {"max_new_tokens": gen.output.shape[1] - p_len}))
            sample.reward = 0.0 if fault is None else float(fault.score[r])
            samples.append(sample)
        train = fns["_convert_samples_to_train_data"](me, samples)
        (ref,) = fns["_split_train_data_by_dp"](me, train, 1)
        data = fns["process_rollout_data"](args, [ref], 0, 1)
    finally:
        sys.setprofile(None)
    data["loss_masks"] = [torch.tensor(m, dtype=torch.int) for m in data["loss_masks"]]  # data.py:44-46, on CPU
    lengths = data["response_lengths"]
    t_len = max(lengths)
    attention = torch.zeros(rows, t_len, dtype=torch.bool)
    trainable = torch.zeros(rows, t_len, dtype=torch.bool)
    ids = torch.full((rows, t_len + 1), gen.pad_token_id, dtype=torch.long)
    for b, n in enumerate(lengths):
        attention[b, :n] = True
        trainable[b, :n] = data["loss_masks"][b].bool()
        ids[b, : n + 1] = torch.tensor(data["tokens"][b][-n - 1 :])
    batch = Batch(
        attention=attention,
        trainable=trainable,
        truncated=torch.tensor([bool(t) for t in data["truncated"]]),
        stages={"input_ids": ids, "response_lengths": torch.tensor(lengths), "loss_masks": trainable.int(),
                "rewards": torch.tensor(data["rewards"], dtype=torch.float32)},  # fmt: skip
        called=calls.called(PRESERVED[: _MASK_STAGE + 1]),
    )
    if fault is None:
        return batch
    # ---- the hooked boundary: the critic's values enter here, then miles' PPO caller runs to the advantages
    data["values"] = [fault.values[b, :n].float().clone() for b, n in enumerate(lengths)]
    data["log_probs"] = [torch.zeros(n) for n in lengths]
    data["ref_log_probs"] = [fault.token_rewards[b, :n].float().clone() for b, n in enumerate(lengths)]
    batch.stages["values"] = fault.values.float().clone()
    opts = {"normalize_advantages": bool(request.options.get("normalize_advantages", False))}
    sys.setprofile(calls)
    try:
        call(caller_args(fault.gamma, fault.lam, **opts, qkv_format="thd"), data)
    finally:
        sys.setprofile(None)
    batch.advantages = pad_responses(data["advantages"], lengths, t_len)
    batch.returns = pad_responses(data["returns"], lengths, t_len)
    batch.called = calls.called(PRESERVED)
    return batch

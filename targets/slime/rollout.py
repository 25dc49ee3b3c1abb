"""slime's own batch code on a real rollout (worker side): the Search-R1 agent loop that ships with slime
(examples/search-r1/generate_with_search.py, a multi-turn generate function with tool observations), the rollout
manager's conversion to train data, the train side's fetch and the PPO caller `compute_advantages_and_returns`,
everything slime's except the engine, the search backend, the Ray object store and the critic's values, which
enter at `HOOKED_BOUNDARY`. Lines at 624b824a8 (git only).

1. per sample, the example's `generate(args, sample, sampling_params)` (:165-291) with its `execute_predictions`
   / `postprocess_predictions` (:115-141): the prompt tokenized, the engine's answer appended with loss mask 1
   through `Sample.append_response_tokens` (slime/utils/types.py:253-300), then the observation the loop builds
   from the answer (an invalid action: the tiny LM has no `<search>` / `<answer>` tags) appended with loss mask 0;
   `SEARCH_R1_CONFIGS["max_turns"]` is 1 (the example's default 2 would ask the engine for a continuation of the
   observation, which the LM worker does not sample), so every response that ends at a sampled EOS ends in the
   observation's masked tokens, as the example's last turn does; a response cut by the limit ends the loop
   (`finish_reason` length: TRUNCATED). The engine (the router's `/generate`) answers with the tiny LM's tokens
   for the prompt; `search` (a retrieval server) is a rule search, never reached by these answers;
2. `RolloutManager._convert_samples_to_train_data` with `_post_process_rewards` (slime/ray/rollout.py:608-755),
   `_split_train_data_by_dp` (:757-823, one data-parallel rank: `build_dp_schedule`,
   `tensorize_rollout_data_for_training`, `ray.put`), `process_rollout_data` (slime/utils/data.py:304-327);
3. the hooked boundary: `rollout_data["values"]` per sample (the critic's `get_values`, megatron_utils/actor.py:403),
   `log_probs` = 0 and `ref_log_probs` = token_rewards (slime's KL term, k1, kl_coef 1), then
   `compute_advantages_and_returns(args, rollout_data)` (slime/backends/megatron_utils/loss.py:704).

The example, the manager methods and `process_rollout_data` are compiled from the pin's files
(`targets.adapters.extract.SourceTree`); their modules import sglang and ray at top level. transformers is a stand-in
in slime's worker, so the tokenizer is the tiny LM's vocabulary as a `tokenizers.Tokenizer` (WordLevel, whitespace
split, the special tokens split out): the core `PreTrainedTokenizerFast` wraps in the LM worker.

Layout: slime's batch is per-sample lists without padding; the canonical [B, T] puts row b's response (the answer,
then the observation) at columns 0 .. response_length - 1, padding after it: attention = a response token,
trainable = loss_mask. Stage `input_ids` is each sample's tokens from its last prompt token on.
"""

from __future__ import annotations

import asyncio
import copy
import re
import sys
import types
from pathlib import Path

import torch

from maskfuzz.targets.adapters.base import Loaded, import_from
from maskfuzz.targets.adapters.extract import SourceTree, find_class, find_method
from maskfuzz.targets.rollout import lm
from maskfuzz.targets.rollout.plumbing import ObjectStore, pad_responses
from maskfuzz.targets.rollout.requests import Batch, BatchRequest
from maskfuzz.targets.rollout.trace import CallTrace
from maskfuzz.targets.slime.calls import caller_args, install_mpu_state

HOOKED_BOUNDARY = "after the real rollout, before critic values enter compute_advantages_and_returns"
BOUNDARY_INPUTS = (
    "rollout_data['values'] [response_length] per sample: the critic's values (the case's at valid tokens, its "
    "poison under the mask)",
    "rollout_data['log_probs'] = 0, ['ref_log_probs'] = token_rewards per sample: slime's KL term, k1, kl_coef 1",
    "sample.reward: the case's score (a rule reward in place of the example's exact-match reward_func)",
)
REPLACED_COMPONENT = None
EXAMPLE = "examples/search-r1/generate_with_search.py"
_MANAGER, _DATA = "slime/ray/rollout.py", "slime/utils/data.py"
LOSS = "slime.backends.megatron_utils.loss"
PRESERVED = (
    (EXAMPLE, "generate"),
    ("slime/utils/types.py", "append_response_tokens"),
    (EXAMPLE, "execute_predictions"),
    (EXAMPLE, "postprocess_predictions"),
    (_MANAGER, "_convert_samples_to_train_data"),
    (_MANAGER, "_post_process_rewards"),
    (_MANAGER, "_split_train_data_by_dp"),
    ("slime/utils/dp_schedule.py", "build_dp_schedule"),
    ("slime/observability/rollout_data_utils.py", "tensorize_rollout_data_for_training"),
    (_DATA, "process_rollout_data"),
    ("slime/backends/megatron_utils/loss.py", "compute_advantages_and_returns"),
    ("slime/utils/ppo_utils.py", "compute_approx_kl"),
    ("slime/utils/ppo_utils.py", "get_advantages_and_returns_batch"),
)
_MASK_STAGE = PRESERVED.index((_DATA, "process_rollout_data"))


class _Tokenizer:
    """The tiny LM's vocabulary as the `tokenizer(text, add_special_tokens=False)["input_ids"]` slime calls."""

    def __init__(self):
        from tokenizers import Tokenizer, models, pre_tokenizers

        vocab = {tok: i for i, tok in enumerate(lm.SPECIAL_TOKENS + lm.WORDS)}
        self.core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=lm.UNK))
        self.core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        self.core.add_special_tokens(list(lm.SPECIAL_TOKENS))

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict:
        return {"input_ids": self.core.encode(text, add_special_tokens=add_special_tokens).ids}

    def decode(self, ids: list[int]) -> str:
        return " ".join(lm.token_text(i) for i in ids)


def load(root: Path, entry: str | None) -> Loaded:
    """slime's Search-R1 loop and batch code from the checkout at `root`; `run(BatchRequest, device)` answers
    `(Batch,)`."""
    if entry not in (None, "default"):
        raise ValueError(f"the real-rollout path of slime covers its PPO step (entry default), not {entry!r}")
    root = Path(root)
    if not (root / EXAMPLE).is_file():
        raise RuntimeError(f"no {EXAMPLE} at this pin: update targets/slime/rollout.py")
    mpu = install_mpu_state()
    types_mod = import_from(root, "slime.utils.types")
    loss_mod = import_from(root, LOSS)
    if getattr(loss_mod, "mpu", mpu) is not mpu:
        raise RuntimeError("slime's loss.py bound a megatron mpu other than the single-rank state")
    box = import_from(root, "slime.utils.misc").Box
    tree = SourceTree(root, ("slime",))
    tokenizer = _Tokenizer()
    engine: dict = {}

    async def post(url: str, payload: dict, *args, **kwargs) -> dict:  # the router's /generate, answered by the LM
        return _answer(engine, payload, tokenizer)

    async def search(query: str) -> str:  # the retrieval server: a rule search
        return "Doc 1(Title: answer) the answer is four\n"

    example = tree.namespace(root / EXAMPLE)
    example.update(Sample=types_mod.Sample, post=post, search=search, SEMAPHORE=asyncio.Semaphore(256), re=re,
                   GenerateState=lambda args: types.SimpleNamespace(tokenizer=tokenizer))  # fmt: skip
    configs = tree.resolve(root / EXAMPLE, ["SEARCH_R1_CONFIGS"]).get("SEARCH_R1_CONFIGS")
    if configs is None:
        raise RuntimeError(f"{EXAMPLE} has no SEARCH_R1_CONFIGS: update targets/slime/rollout.py")
    example["SEARCH_R1_CONFIGS"] = {**copy.deepcopy(configs), "max_turns": 1}  # module docstring, step 1
    manager = tree.namespace(root / _MANAGER)
    manager.update(Sample=types_mod.Sample, ray=ObjectStore, Box=box)
    tree.namespace(root / _DATA).update(ray=ObjectStore)
    fns = {}
    for path, cls_name, name in ((EXAMPLE, None, "generate"), (_MANAGER, "RolloutManager", "_post_process_rewards"),
                                 (_MANAGER, "RolloutManager", "_convert_samples_to_train_data"),
                                 (_MANAGER, "RolloutManager", "_split_train_data_by_dp"),
                                 (_DATA, None, "process_rollout_data")):  # fmt: skip
        parsed = tree.file(root / path).tree
        scope = parsed if cls_name is None else find_class(parsed, cls_name)
        node = next((n for n in scope.body if getattr(n, "name", None) == name), None) if cls_name is None else \
            find_method(scope, name)  # fmt: skip
        if node is None:
            raise RuntimeError(f"{path} has no {cls_name or 'module'} function {name}: update targets/slime/rollout.py")
        fns[name] = tree.function(root / path, node)
    caller = loss_mod.compute_advantages_and_returns

    def run(request: BatchRequest, device: str) -> tuple[Batch]:
        return (_step(request, fns, types_mod.Sample, caller, engine, tokenizer, root),)

    notes = ["slime's Search-R1 example loop (max_turns 1), rollout manager and PPO caller on a real generation; "
             "critic values at the hooked boundary"]  # fmt: skip
    return Loaded(run, " -> ".join(fn for _, fn in PRESERVED), notes)


def _answer(engine: dict, payload: dict, tokenizer: _Tokenizer) -> dict:
    """The router's `/generate` answer for `payload['text']`: the generation's tokens of that sample."""
    tokens, finish = engine["queue"].pop(0)
    want = engine["prompt_of"][len(engine["done"])]
    if tokenizer(payload["text"])["input_ids"] != want:
        raise RuntimeError("the engine answers the samples in order: the payload is not this sample's prompt")
    engine["done"].append(tokens)
    return {"text": tokenizer.decode(tokens), "meta_info": {"output_token_logprobs": [[0.0, t] for t in tokens],
            "finish_reason": {"type": finish}}}  # fmt: skip


def _args(request: BatchRequest, rows: int) -> types.SimpleNamespace:
    """The argparse namespace the compiled functions read (slime's defaults, PPO, one data-parallel rank)."""
    return types.SimpleNamespace(
        partial_rollout=False, sglang_router_ip="127.0.0.1", sglang_router_port=0, reward_key=None,
        advantage_estimator="ppo", rewards_normalization=True, n_samples_per_prompt=1, rollout_batch_size=rows,
        global_batch_size=rows, micro_batch_size=1, use_dynamic_batch_size=False, max_tokens_per_gpu=None,
        balance_data=False, balance_by_flops=False, rollout_top_p=1.0, use_rollout_routing_replay=False,
        rollout_data_transport="object-store",
    )  # fmt: skip


def _step(request: BatchRequest, fns: dict, sample_cls, caller, engine: dict, tokenizer, root: Path) -> Batch:
    gen, fault = request.generation, request.fault
    k, p_len, rows = gen.num_return_sequences, gen.prompt_length, gen.output.shape[0]
    args = _args(request, rows)
    prompts = [gen.input_ids[r // k][gen.attention_mask[r // k].bool()].tolist() for r in range(rows)]
    answers = []
    for r in range(rows):
        row = gen.output[r, p_len:].tolist()
        cut = gen.eos_token_id not in row
        answers.append((row if cut else row[: row.index(gen.eos_token_id) + 1], "length" if cut else "stop"))
    engine.update(queue=list(answers), prompt_of=prompts, done=[])
    calls = CallTrace(root)
    me = types.SimpleNamespace(args=args, custom_reward_post_process_func=None,
                               custom_convert_samples_to_train_data_func=None,
                               train_parallel_config={"dp_size": 1, "cp_size": 1, "vpp_size": 1,
                                                      "microbatch_group_size_per_vp_stage": 1})  # fmt: skip
    me._post_process_rewards = lambda samples: fns["_post_process_rewards"](me, samples)
    sys.setprofile(calls)
    try:
        samples = []
        for r in range(rows):
            sample = sample_cls(group_index=r, index=r, prompt=gen.prompts[r // k])
            sample = asyncio.run(fns["generate"](args, sample, {"max_new_tokens": gen.output.shape[1] - p_len}))
            sample.reward = 0.0 if fault is None else float(fault.score[r])
            samples.append(sample)
        train = fns["_convert_samples_to_train_data"](me, samples)
        refs = fns["_split_train_data_by_dp"](me, train)
        data = fns["process_rollout_data"](args, refs, 0, 1)
    finally:
        sys.setprofile(None)
    data["loss_masks"] = [torch.as_tensor(m, dtype=torch.int) for m in data["loss_masks"]]  # actor.py:258-263, CPU
    lengths = [int(n) for n in data["response_lengths"]]
    t_len = max(lengths)
    attention = torch.zeros(rows, t_len, dtype=torch.bool)
    trainable = torch.zeros(rows, t_len, dtype=torch.bool)
    ids = torch.full((rows, t_len + 1), gen.pad_token_id, dtype=torch.long)
    for b, n in enumerate(lengths):
        attention[b, :n] = True
        trainable[b, :n] = data["loss_masks"][b].bool()
        ids[b, : n + 1] = torch.as_tensor(data["tokens"][b][-n - 1 :])
    batch = Batch(
        attention=attention,
        trainable=trainable,
        truncated=torch.tensor([bool(t) for t in data["truncated"]]),
        stages={
            "input_ids": ids,
            "response_lengths": torch.tensor(lengths),
            "loss_masks": trainable.int(),
            "rewards": torch.tensor(data["rewards"], dtype=torch.float32),
        },  # fmt: skip
        called=calls.called(PRESERVED[: _MASK_STAGE + 1]),
    )
    if fault is None:
        return batch
    # ---- the hooked boundary: the critic's values enter here, then slime's PPO caller runs to the advantages
    data["values"] = [fault.values[b, :n].float().clone() for b, n in enumerate(lengths)]
    data["log_probs"] = [torch.zeros(n) for n in lengths]
    data["ref_log_probs"] = [fault.token_rewards[b, :n].float().clone() for b, n in enumerate(lengths)]
    batch.stages["values"] = fault.values.float().clone()
    opts = {"normalize_advantages": bool(request.options.get("normalize_advantages", False))}
    sys.setprofile(calls)
    try:
        caller(caller_args(fault.gamma, fault.lam, **opts), data)
    finally:
        sys.setprofile(None)
    batch.advantages = pad_responses(data["advantages"], lengths, t_len)
    batch.returns = pad_responses(data["returns"], lengths, t_len)
    batch.called = calls.called(PRESERVED)
    return batch

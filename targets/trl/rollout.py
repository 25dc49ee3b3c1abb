"""TRL's own batch code on a real rollout (worker side): the PPO trainer's rollout processing after
`batch_generation`, from the per-micro-batch loop through the GAE, everything TRL's except the models' outputs,
which enter at `HOOKED_BOUNDARY`.

The statements are `PPOTrainer.train()`'s own (trl/experimental/ppo/ppo_trainer.py at 1.12.0, the wheel;
trl/trainer/ppo_trainer.py 0.12-0.25): the body of its `with torch.no_grad():` block of one update, every
statement except the generation itself (`with unwrap_model_for_generation(...): query_responses, logitss =
batch_generation(...)`, :685-698), compiled from the pin's source with its file and line numbers and run in one
namespace:

1. the micro-batch loop (:700-745): `response = query_response[:, context_length:]`, `selective_log_softmax`
   of the policy's logits and of the reference model's, `truncate_response(stop_token_id, pad, response)`
   (the stop token kept, padding after it), `sequence_length = first_true_indices(postprocessed_response ==
   pad_token_id) - 1`, the value model's `get_reward` on the query + response, the reward model's on the
   truncated one; the `torch.cat`s of the lists (:746-752);
2. the EOS filter (`contain_eos_token`, `missing_eos_penalty`, :757-759), the masks (`padding_mask = idx >
   sequence_lengths`, `padding_mask_p1`, :763-769), the KL reward and the score placed at `sequence_lengths + 1`
   (:771-779), GAE and `masked_whiten` of the advantages (:786-798).

`query_responses` is the tiny LM's `generate()` output, the layout `batch_generation` returns with one
micro-batch (`local_rollout_forward_batch_size` = the batch): the left-padded queries, then the response,
`<pad>` after EOS, as wide as the longest response. `stop_token_id` is the EOS (PPOConfig `stop_token="eos"`).

The hooked boundary, the models' outputs: `logitss` (the policy's sampling logits, what `batch_generation`
returns), TRL's `forward` (the reference policy: `.logits`) and `get_reward` (the value model's per-position
values, the reward model's score) are bound to the fault's tensors. They are the models TRL calls, nothing of the
math: `selective_log_softmax`, `truncate_response`, `first_true_indices`, `masked_whiten` are TRL's, compiled
from the pin. Token rewards enter as TRL's only dense reward, its KL penalty (k1, kl_coef 1): the logits are
built so that `selective_log_softmax` gives logprob = -max(r, 0) and ref_logprob = min(r, 0) at the sampled token
(r = ref_logprob - logprob), exact to float32 rounding; TRL fills both with INVALID_LOGPROB under its padding mask,
so nothing placed there reaches the reward. The score is the reward model's output.

Layout: the canonical [B, T] tensors are TRL's response window (T = generated width); trainable = ~padding_mask,
attention = the truncated response's non-pad tokens (the same set: TRL trains the tokens up to the stop token).
No trl module is imported (the fuzzing worker's way: `stand_ins=()`).
"""

from __future__ import annotations

import ast
import gc
import sys
import types
from pathlib import Path

import torch

from maskfuzz.targets.adapters.base import Loaded, NotPresent
from maskfuzz.targets.adapters.extract import BlockNotFound, SourceTree, find_gae_loop, statement_lists
from maskfuzz.targets.rollout import lm
from maskfuzz.targets.rollout.requests import Batch, BatchRequest
from maskfuzz.targets.trl.calls import PACKAGES, ppo_trainers, run_block

HOOKED_BOUNDARY = (
    "after the real rollout, the models' outputs as PPOTrainer.train() receives them: the policy's logits, "
    "the reference policy's (forward), the value model's values and the reward model's score (get_reward)"
)
BOUNDARY_INPUTS = (
    "logitss [B, T, V]: the policy's logits, selective_log_softmax of them = -max(token_rewards, 0) at the sampled "
    "token",
    "forward(ref_policy, ...).logits [B, P+T, V]: the reference policy's, ref_logprob = min(token_rewards, 0) "
    "(TRL's KL reward, k1, kl_coef 1, adds exactly the token rewards)",
    "get_reward(value_model, ...) [B, P+T, 1]: the critic's values (the case's, at positions P-1 .. P+T-2)",
    "get_reward(reward_model, ...) [B]: the case's score",
)
REPLACED_COMPONENT = (
    "TRL's empty_cache (frees accelerator memory between the model calls; its device probes need "
    "transformers.utils) is a no-op on CPU; the models are the hooked boundary's outputs"
)
# the statements of train() the step runs, and the helpers they call (compiled from the pin)
PRESERVED = ("selective_log_softmax", "truncate_response", "first_true_indices", "masked_whiten")
VOCAB = len(lm.SPECIAL_TOKENS) + len(lm.WORDS)
BOUND = ("data", "device", "args", "self", "model", "ref_policy", "reward_model", "processing_class",
         "accelerator", "query_responses", "logitss", "forward", "get_reward", "gc", "empty_cache",
         "unwrapped_model")  # fmt: skip
FAR = -1.0e4  # a logit whose exp underflows to 0 in float32: log-softmax over the rest is exact


def load(root: Path, entry: str | None) -> Loaded:
    """Compile the rollout processing of PPOTrainer.train() from the wheel at `root`; `run(BatchRequest, device)`
    answers `(Batch,)`."""
    if entry not in (None, "default", "train"):
        raise ValueError(f"the real-rollout path of trl covers its PPO trainer (entry train), not {entry!r}")
    tree = SourceTree(Path(root), PACKAGES)
    trainers = ppo_trainers(tree)
    if not trainers:
        raise NotPresent("no PPO trainer at this pin (trl >= 1.13 ships none)")
    path, train, qual = trainers[0]
    stmts = rollout_statements(train, tree.rel(path))
    block = tree.block(path, stmts, BOUND)
    rel = tree.rel(path)

    def run(request: BatchRequest, device: str) -> tuple[Batch]:
        return (_step(request, block, root),)

    notes = [
        f"{rel}:{block.first_line}-{block.last_line} ({qual}: the no_grad rollout block without batch_generation) "
        "run from source on a real generation; the models' outputs at the hooked boundary",
        "helpers compiled from source: " + ", ".join(sorted(tree.provenance)),
    ]
    return Loaded(run, f"{rel}::{qual} (lines {block.first_line}-{block.last_line})", notes)


def rollout_statements(train: ast.FunctionDef, rel: str) -> list[ast.stmt]:
    """The body of train()'s `with torch.no_grad():` that holds the GAE loop, without the generation statement
    (the one calling `batch_generation`)."""
    located = find_gae_loop(train)
    if located is None:
        raise BlockNotFound(f"trl: {rel}: train() has no GAE loop")
    gae_body = located[0]
    for body in statement_lists(train):
        for node in body:
            if isinstance(node, ast.With) and node.body is gae_body:
                kept = [s for s in node.body if not _calls(s, "batch_generation")]
                if len(kept) != len(node.body) - 1:
                    raise BlockNotFound(f"trl: {rel}:{node.lineno}: no single batch_generation statement in the block")
                return kept
    raise BlockNotFound(f"trl: {rel}: the GAE loop is not the body of a `with` block")


def _calls(node: ast.AST, name: str) -> bool:
    return any(isinstance(c, ast.Call) and isinstance(c.func, ast.Name) and c.func.id == name for c in ast.walk(node))


def logits_for(logprob: torch.Tensor, tokens: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """[B, T, V] float32 logits whose log-softmax at `tokens` is `logprob` (<= 0), once divided by `scale`: the
    sampled token 0, one other token log(expm1(-lp)), the rest FAR."""
    b, t = tokens.shape
    out = torch.full((b, t, VOCAB), FAR, dtype=torch.float64)
    idx = tokens.clamp(0, VOCAB - 1)
    other = (idx + 1) % VOCAB
    lp = logprob.double().clamp(max=0.0)
    rest = torch.where(lp < 0, torch.log(torch.expm1(-lp).clamp(min=1e-300)), torch.full_like(lp, FAR))
    out.scatter_(2, idx.unsqueeze(-1), 0.0)
    out.scatter_(2, other.unsqueeze(-1), rest.unsqueeze(-1))
    return (out * scale).float()


class _Calls:
    """Which functions of the checkout ran (`sys.setprofile`): their names."""

    def __init__(self, root: Path):
        self.root = str(Path(root).resolve())
        self.seen: list[str] = []

    def __call__(self, frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(self.root):
            where = f"{Path(frame.f_code.co_filename).relative_to(self.root)}::{frame.f_code.co_name}"
            if where not in self.seen and not frame.f_code.co_name.startswith("<"):
                self.seen.append(where)


def _step(request: BatchRequest, block, root: Path) -> Batch:
    gen, fault = request.generation, request.fault
    p_len = gen.prompt_length
    query_responses = gen.output.clone()
    rows, width = query_responses.shape[0], query_responses.shape[1] - p_len
    response = query_responses[:, p_len:]
    zeros = torch.zeros(rows, width)
    rewards = zeros if fault is None else fault.token_rewards.float()
    values = zeros if fault is None else fault.values.float()
    score = torch.zeros(rows) if fault is None else fault.score.float()
    temperature = 1.0
    ns = types.SimpleNamespace
    args = ns(local_rollout_forward_batch_size=rows, temperature=temperature, missing_eos_penalty=
              None if request.options.get("missing_eos_penalty", "none") == "none" else
              float(request.options["missing_eos_penalty"]), kl_estimator="k1", kl_coef=1.0, whiten_rewards=False,
              gamma=1.0 if fault is None else fault.gamma, lam=1.0 if fault is None else fault.lam)  # fmt: skip
    tok = ns(pad_token_id=gen.pad_token_id, eos_token_id=gen.eos_token_id)
    value_model, reward_model, ref_policy = ns(name="value"), ns(name="reward"), ns(name="ref")
    model = ns(value_model=value_model, policy=ns(name="policy"))
    me = ns(args=args, processing_class=tok, stop_token_id=gen.eos_token_id)
    # ---- the hooked boundary: the models' outputs (policy logits, reference logits, values, score)
    policy_logits = logits_for(-rewards.clamp(min=0), response)
    full_ref = torch.zeros(rows, p_len + width, VOCAB)
    full_ref[:, p_len - 1 : p_len - 1 + width] = logits_for(rewards.clamp(max=0), response, temperature + 1e-7)
    full_value = torch.zeros(rows, p_len + width, 1)
    full_value[:, p_len - 1 : p_len - 1 + width, 0] = values
    seen: dict = {}

    def forward(m, query_response, pad_token_id):
        assert m is ref_policy, m
        return ns(logits=full_ref.clone())

    def get_reward(m, query_response, pad_token_id, context_length):
        if m is value_model:
            return full_value.clone(), None, None
        assert m is reward_model, m
        seen["reward_model_input"] = query_response.clone()
        return None, score.clone(), None

    calls = _Calls(root)
    queries = gen.input_ids.repeat_interleave(gen.num_return_sequences, dim=0)  # TRL: one response per query
    bound = dict(data={"input_ids": queries}, device="cpu", args=args, self=me, model=model,
                 ref_policy=ref_policy, reward_model=reward_model, processing_class=tok,
                 accelerator=ns(unwrap_model=lambda m: m), query_responses=query_responses, logitss=policy_logits,
                 forward=forward, get_reward=get_reward, gc=gc,
                 empty_cache=lambda: None, unwrapped_model=model)  # fmt: skip
    sys.setprofile(calls)
    try:
        out = run_block(block, bound)
    finally:
        sys.setprofile(None)
    padding_mask = out["padding_mask"]
    post = out["postprocessed_responses"]
    batch = Batch(
        attention=(post != gen.pad_token_id).clone(),
        trainable=(~padding_mask).clone(),
        truncated=(~out["contain_eos_token"]).clone(),
        stages={
            "input_ids": torch.cat([query_responses[:, p_len - 1 : p_len], post], dim=1),
            "responses": out["responses"].clone(),
            "postprocessed_responses": post.clone(),
            "sequence_lengths": out["sequence_lengths"].clone(),
            "padding_mask": padding_mask.clone(),
            "padding_mask_p1": out["padding_mask_p1"].clone(),
        },
        called=list(calls.seen),
        tokens=post.clone(),
        reward_mask=(~padding_mask).clone(),
    )
    if fault is None:
        return batch
    batch.stages.update(values=out["values"].clone(), token_level_rewards=out["rewards"].clone(),
                        logprobs=out["logprobs"].clone(), ref_logprobs=out["ref_logprobs"].clone(),
                        scores=out["scores"].clone())  # fmt: skip
    batch.advantages = out["advantages"].float().clone()
    batch.returns = out["returns"].float().clone()
    rel = Path(block.code.co_filename).resolve().relative_to(Path(root).resolve())
    batch.called = [f"{rel}:{block.first_line}-{block.last_line}::PPOTrainer.train (rollout block)", *calls.seen]
    return batch

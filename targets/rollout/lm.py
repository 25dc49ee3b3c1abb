"""A tiny causal LM and its tokenizer, built in code: a real `model.generate()` offline, no download.

The tokenizer is a `tokenizers` WordLevel model over a small vocabulary (`WORDS`, whitespace split) wrapped in
`transformers.PreTrainedTokenizerFast`, with the special tokens a chat needs: `<pad>`, `<s>` (BOS), `<|end|>`
(the end of a turn, and the EOS generation stops at), `<unk>`, and the role markers `<|user|>`,
`<|assistant|>` and `<|tool|>` (a tool / observation turn). Its chat template renders a conversation as

    <s><|user|> search the answer <|end|> <|assistant|> call search <|end|> <|tool|> result four <|end|> <|assistant|>

The model is a `LlamaForCausalLM` from a `LlamaConfig` (2 layers, hidden size 32 by default, `ModelConfig`),
randomly initialised under a seed. `generate` runs `model.generate()` with sampling (temperature 1, no
top-k / top-p cut), EOS and left-padded prompts, so responses end at a sampled EOS or at the length limit and
the batch is right-padded after EOS, as a serving engine returns it. The sampler never draws `<pad>`, `<s>` or
`<unk>` (`suppress_tokens`), as a trained model would not. On CPU the result is a function of the request:
the model's weights of `ModelConfig.init_seed`, the samples of `RolloutRequest.seed` (each under
`torch.random.fork_rng`, so the caller's random state is untouched).

Runs wherever it is imported (the tests build it in-process); `load` makes it a worker adapter
(`targets.worker`), so `maskfuzz validate` generates in a worker process with a real `transformers`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import torch

from maskfuzz.targets.adapters.base import Loaded

PAD, BOS, EOS, UNK = "<pad>", "<s>", "<|end|>", "<unk>"
ROLES = {"user": "<|user|>", "assistant": "<|assistant|>", "tool": "<|tool|>"}
SPECIAL_TOKENS: tuple[str, ...] = (PAD, BOS, EOS, UNK, *ROLES.values())
WORDS: tuple[str, ...] = tuple(
    "ok yes no the a is what two plus four answer say search call result done or not sure".split()
)
# one turn: `<|role|> content <|end|>`; the generation prompt opens an assistant turn
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ '<|' + m['role'] + '|> ' + m['content'] + ' <|end|> ' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)
# Conversations of different lengths (so a left-padded batch has shorter prompts), one with a tool turn.
PROMPTS: tuple[tuple[tuple[str, str], ...], ...] = (
    (("user", "say ok"),),
    (("user", "what is two plus two"),),
    (("user", "search the answer"), ("assistant", "call search"), ("tool", "result four")),
    (("user", "is the answer yes or no"),),
)


def token_text(token_id: int) -> str:
    """The vocabulary entry of `token_id` (the tokenizer's ids are `SPECIAL_TOKENS + WORDS` in order), without
    building the tokenizer; "?" for an id outside it."""
    vocab = SPECIAL_TOKENS + WORDS
    return vocab[token_id] if 0 <= token_id < len(vocab) else "?"


@dataclass(frozen=True)
class ModelConfig:
    """The `LlamaConfig` fields of the tiny model (the vocabulary and special ids come from the tokenizer)."""

    hidden_size: int = 32
    intermediate_size: int = 64
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 128
    initializer_range: float = 0.02
    init_seed: int = 0  # torch.manual_seed before the weights are drawn

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class RolloutRequest:
    """One `generate()` call: `conversations` (each a tuple of (role, content) turns) rendered by the chat
    template with a generation prompt, `num_return_sequences` samples each, at most `max_new_tokens`."""

    conversations: tuple[tuple[tuple[str, str], ...], ...] = PROMPTS
    seed: int = 0
    num_return_sequences: int = 1
    max_new_tokens: int = 8
    temperature: float = 1.0
    model: ModelConfig = field(default_factory=ModelConfig)


@dataclass
class Generation:
    """What a rollout hands the framework, in the layout of a left-padded HF batch (B prompts, K samples each):

    input_ids       [B, P] int64   the rendered prompts, left-padded with `pad_token_id`
    attention_mask  [B, P] int64   1 on prompt tokens
    position_ids    [B, P] int64   clip(cumsum(attention_mask) - 1, 0)
    output          [B*K, P+N] int64  `generate()`'s sequences: the prompt, the response, `pad_token_id` after
                                   EOS (N <= max_new_tokens: the longest response); row r samples prompt r // K
    prompts, responses             the decoded prompts [B] and responses [B*K] (special tokens kept, no <pad>)
    """

    request: RolloutRequest
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    output: torch.Tensor
    eos_token_id: int
    pad_token_id: int
    num_return_sequences: int
    prompts: list[str]
    responses: list[str]

    @property
    def prompt_length(self) -> int:
        return int(self.input_ids.shape[1])

    def rows(self, rows: list[int]) -> "Generation":
        """The batch of the output rows `rows` (in that order), each with its own prompt: K = 1, B = len(rows).
        A sub-batch keeps the columns (prompt width, response width) of the whole generation."""
        k = self.num_return_sequences
        prompt = [r // k for r in rows]
        return dataclasses.replace(
            self,
            input_ids=self.input_ids[prompt].clone(),
            attention_mask=self.attention_mask[prompt].clone(),
            position_ids=self.position_ids[prompt].clone(),
            output=self.output[rows].clone(),
            num_return_sequences=1,
            prompts=[self.prompts[p] for p in prompt],
            responses=[self.responses[r] for r in rows],
        )


def build_tokenizer():
    """The WordLevel tokenizer over `SPECIAL_TOKENS` + `WORDS`, as a left-padding `PreTrainedTokenizerFast`
    with the chat template."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + WORDS)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        additional_special_tokens=list(ROLES.values()),
        padding_side="left",
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def build_model(config: ModelConfig, tokenizer):
    """`LlamaForCausalLM` from `config`, weights drawn under `config.init_seed`, in eval mode."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        **{k: v for k, v in config.as_dict().items() if k != "init_seed"},
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.init_seed)
        model = LlamaForCausalLM(cfg)
    return model.eval()


def generation_kwargs(request: RolloutRequest, tokenizer) -> dict:
    """The sampling settings of `generate()` (also the recipe's)."""
    return dict(
        do_sample=True,
        temperature=request.temperature,
        top_k=0,
        top_p=1.0,
        max_new_tokens=request.max_new_tokens,
        num_return_sequences=request.num_return_sequences,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        suppress_tokens=[tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.unk_token_id],
    )


def generate(request: RolloutRequest, device: str = "cpu", *, tokenizer=None, model=None) -> Generation:
    """Render the request's conversations, sample `generate()` under `request.seed`, return the batch.

    `tokenizer` / `model` may be passed in when already built for `request.model` (a worker keeps them)."""
    if tokenizer is None:
        tokenizer = build_tokenizer()
    if model is None:
        model = build_model(request.model, tokenizer)
    model = model.to(device)
    prompts = [
        tokenizer.apply_chat_template([{"role": r, "content": c} for r, c in conv], tokenize=False,
                                      add_generation_prompt=True)  # fmt: skip
        for conv in request.conversations
    ]
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    input_ids, attention = enc["input_ids"], enc["attention_mask"]
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(request.seed)
        output = model.generate(
            input_ids=input_ids.to(device),
            attention_mask=attention.to(device),
            **generation_kwargs(request, tokenizer),
        )
    output = output.detach().to("cpu")
    return Generation(
        request=request,
        input_ids=input_ids,
        attention_mask=attention,
        position_ids=torch.clip(torch.cumsum(attention, dim=-1) - 1, min=0),
        output=output,
        eos_token_id=int(tokenizer.eos_token_id),
        pad_token_id=int(tokenizer.pad_token_id),
        num_return_sequences=request.num_return_sequences,
        prompts=prompts,
        responses=[_unpadded(t) for t in tokenizer.batch_decode(output[:, input_ids.shape[1]:])],
    )


def _unpadded(text: str) -> str:
    return " ".join(t for t in text.split() if t != PAD)


def describe(request: RolloutRequest) -> dict:
    """The recipe's model part: architecture, config, tokenizer and sampling settings (no weights: they are
    the config's seed)."""
    return {
        "backend": "transformers LlamaForCausalLM.generate (randomly initialised, built in code, CPU)",
        "config": request.model.as_dict(),
        "tokenizer": {
            "kind": "tokenizers WordLevel + WhitespaceSplit in PreTrainedTokenizerFast, left padding",
            "vocab_size": len(SPECIAL_TOKENS) + len(WORDS),
            "special_tokens": {"pad": PAD, "bos": BOS, "eos": EOS, "unk": UNK, **ROLES},
            "chat_template": CHAT_TEMPLATE,
        },
        "generation": {
            "do_sample": True,
            "temperature": request.temperature,
            "top_k": 0,
            "top_p": 1.0,
            "max_new_tokens": request.max_new_tokens,
            "num_return_sequences": request.num_return_sequences,
            "suppress_tokens": [PAD, BOS, UNK],
            "seed": request.seed,
        },
    }


def load(root: Path | None, entry: str | None) -> Loaded:
    """Worker adapter: `run(request, device)` answers a `RolloutRequest` with `(Generation,)`. The tokenizer
    and the model of each `ModelConfig` are built once per worker (kept in this closure); loading runs one
    token of the default model, so the first request costs what the others do."""
    import transformers

    tokenizer = build_tokenizer()
    models: dict[ModelConfig, object] = {ModelConfig(): build_model(ModelConfig(), tokenizer)}
    # one token of the default model now: generate()'s first call imports most of its machinery (seconds)
    generate(RolloutRequest(max_new_tokens=1), tokenizer=tokenizer, model=models[ModelConfig()])

    def run(request: RolloutRequest, device: str) -> tuple[Generation]:
        if request.model not in models:
            models[request.model] = build_model(request.model, tokenizer)
        return (generate(request, device, tokenizer=tokenizer, model=models[request.model]),)

    where = f"transformers {transformers.__version__}: LlamaForCausalLM.generate"
    return Loaded(run, where, ["a tiny random causal LM built in code (maskfuzz.targets.rollout.lm)"])

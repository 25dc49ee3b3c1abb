"""Reach you can run: miles' single-turn batch code on a real rollout (targets/miles/rollout.py, wheel miles-rl 0.0.2).

A tiny random causal LM generates real responses; miles' own code at the pin (the default `generate` of
sglang_rollout.py, `RolloutManager._convert_samples_to_train_data`, `_split_train_data_by_dp`,
`process_rollout_data`, the PPO caller `compute_advantages_and_returns` -> `get_advantages_and_returns_batch`)
runs on them in a worker process; the critic's values enter before `compute_advantages_and_returns`.

Corpus entry 0c21ee5aff74a125 (masked-value-bootstrap) needs the mask `TR`: a trainable token, then a loss-masked
real token at the response's end. miles builds that tail only in its multi-turn tool loop (generate_hub/
multi_turn.py, a tool response appended with loss_mask 0); the single-turn path gives every response token
loss_mask 1 (ray/rollout.py:695-696) and keeps per-sample lists without padding, so the search finds no `TR`
(`maskfuzz validate` exit 2): what that path builds is asserted here.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from maskfuzz.fuzz import corpus
from maskfuzz.fuzz import validate as val
from maskfuzz.oracles.domain import POISON_PROBE
from maskfuzz.targets import registry
from maskfuzz.targets.miles import rollout as miles_batch
from maskfuzz.targets.rollout import lm
from maskfuzz.targets.rollout.requests import BatchRequest, Fault
from maskfuzz.targets.rollout.session import open_rollout

ROOT = Path(__file__).resolve().parents[1]
PIN = "0.0.2"
ENTRY = ROOT / "corpus" / "miles" / "poison-0c21ee5aff74a125.json"  # miles/masked-value-bootstrap, mask TR

pytestmark = pytest.mark.network


@pytest.fixture(scope="module")
def rollout():
    with open_rollout(f"miles@{PIN}", repos={}) as r:
        yield r


def test_the_single_turn_path_never_builds_a_masked_tail(rollout):
    entry = corpus.load(ENTRY)
    assert val.row_classes(entry.case.attention[0], entry.case.trainable[0]) == "TR"
    with pytest.raises(val.CannotValidate, match=r"no batch holding the case's masks \(row 0: TR;"):
        val.search(entry.case, rollout, max_seeds=3)
    (gen,) = rollout.lm(lm.RolloutRequest(seed=0, num_return_sequences=val.POOL_SAMPLES, max_new_tokens=2))
    (pool,) = rollout.batch(BatchRequest(gen, gen.prompt_length + 2))
    # every response token is trainable: no masked real token, the slot the bootstrap reads is never built
    assert torch.equal(pool.attention, pool.trainable) and bool(pool.trainable[:, 0].all())
    ended = ~pool.truncated
    assert bool(ended.any()) and bool(pool.truncated.any())  # EOS at a sampled length, and cut rows (no EOS)
    lengths = pool.stages["response_lengths"]
    assert bool((lengths[pool.truncated] == 2).all())
    assert pool.called == [f"{p}::{fn}" for p, fn in miles_batch.PRESERVED[: miles_batch._MASK_STAGE + 1]]


def test_a_real_step_agrees_with_the_reference_and_padding_never_reaches_miles(rollout):
    """miles' batch has no padding (per-sample lists): a value in the canonical padding never reaches GAE."""
    declared = registry.get("miles").declared(None, PIN)
    (gen,) = rollout.lm(lm.RolloutRequest(seed=1, num_return_sequences=4, max_new_tokens=3))
    (masks,) = rollout.batch(BatchRequest(gen, gen.prompt_length + 3))
    shape = masks.attention.shape
    values = torch.where(masks.attention, torch.linspace(0.0, 1.0, shape[1]).expand(shape), POISON_PROBE)
    rewards = torch.where(masks.attention, 0.25, 0.0)
    fault = Fault(values.float(), rewards.float(), torch.arange(shape[0]).float(), gamma=1.0, lam=0.5)
    (poisoned,) = rollout.batch(BatchRequest(gen, gen.prompt_length + 3, {}, fault))
    clean_fault = Fault(torch.where(masks.attention, values, 0.0), fault.token_rewards, fault.score, 1.0, 0.5)
    (clean,) = rollout.batch(BatchRequest(gen, gen.prompt_length + 3, {}, clean_fault))
    case = corpus.load(ENTRY).case
    judged = val.judge(val.executed_case(case, poisoned, fault), declared, poisoned, clean)
    assert judged["leak"].nonzero().tolist() == [] and judged["clean_off"].nonzero().tolist() == []
    assert torch.equal(poisoned.advantages, clean.advantages) and bool((~masks.attention).any())
    assert poisoned.called == [f"{p}::{fn}" for p, fn in miles_batch.PRESERVED]

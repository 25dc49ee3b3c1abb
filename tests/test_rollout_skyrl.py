"""Reach you can run: SkyRL's masked-value bootstrap on a real rollout (targets/rollout/skyrl.py, released wheel 0.3.1).

A tiny random causal LM generates real responses; SkyRL's own trainer step at the pin (the generator output checked
by `validate_generator_output`, `postprocess_generator_output`, `convert_to_training_input` ->
`convert_prompts_responses_to_batch_tensors`, `apply_reward_kl_penalty`, `compute_advantages_and_returns` -> GAE)
runs on them in a worker process; the only fault is the critic's value under the mask, placed before
`compute_advantages_and_returns`.

* The whole step SkyRL batches (the pool: 4 prompts x 16 samples) holds corpus entry dbee94a8364d80ce's mask `TTP`:
  a two-token response right-padded to the step's longest response. With the critic's value 100 in that padding
  slot, GAE bootstraps it into the valid tokens' returns (the corpus verdict's 25.5, 51.0 against the reference's
  0.5, 1.0); the clean twin agrees with the float64 reference.
* `fuzz.validate` re-batches the chosen row alone, and SkyRL pads the response window to the longest response of
  the batch it is given: a one-row step has no padding, so the case's masked slot does not exist there
  (CannotValidate, `maskfuzz validate` exit 2).

* git main (a9564572eb8e, needs the mirror) right-aligns the response window: padding precedes a shorter response,
  so `TTP` is never built and a value in the leading padding moves no valid output.

No SkyRL commit changes compute_gae_advantage_return (b3280d844 .. a9564572eb8e): there is no fixed pin for the
function; what changed is the layout its inputs are built in.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from maskfuzz.fuzz import corpus
from maskfuzz.fuzz import validate as val
from maskfuzz.targets import registry
from maskfuzz.targets.rollout import lm
from maskfuzz.targets.rollout import skyrl as skyrl_batch
from maskfuzz.targets.rollout.requests import BatchRequest, Fault
from maskfuzz.targets.rollout.session import open_rollout
from maskfuzz.targets.runtime.repos import parse_repos

ROOT = Path(__file__).resolve().parents[1]
PIN, MAIN_PIN = "0.3.1", "a9564572eb8e"
ENTRY = ROOT / "corpus" / "skyrl" / "poison-dbee94a8364d80ce.json"  # skyrl/masked-value-bootstrap

pytestmark = pytest.mark.network


@pytest.fixture(scope="module")
def rollout():
    with open_rollout(f"skyrl@{PIN}", repos={}) as r:
        yield r


def _step_fault(case, scenario: val.Scenario, batch, lam: float) -> Fault:
    """The case at its pool rows of the whole step (fuzz.validate.fault_of places it at rows 0..B-1 of a
    re-batch): its values (the poison under the mask), token rewards and score there, 0 elsewhere."""
    shape = batch.attention.shape
    values, rewards = torch.zeros(shape, dtype=torch.float64), torch.zeros(shape, dtype=torch.float64)
    score = torch.zeros(shape[0])
    width = case.shape[1]
    for b, (row, off) in enumerate(zip(scenario.pool_rows, scenario.offsets)):
        values[row, off : off + width] = case.values[b]
        rewards[row, off : off + width] = case.token_rewards[b]
        score[row] = case.score[b]
    return Fault(values.float(), rewards.float(), score, gamma=case.gamma, lam=lam)


def test_the_masked_value_bootstraps_into_the_returns_of_skyrls_real_step(rollout):
    entry = corpus.load(ENTRY)
    case, declared = entry.case, registry.get("skyrl").declared(None, PIN)
    scenario = val.search(case, rollout)
    (gen,) = rollout.lm(scenario.request)  # the step: every prompt and sample of the pool, as SkyRL batches it
    (masks,) = rollout.batch(BatchRequest(gen, scenario.sequence_length))
    (row,) = scenario.pool_rows
    assert val.row_classes(masks.attention[row], masks.trainable[row]) == "TTP"  # right-padded to the longest
    assert masks.attention.shape[1] == 3 and not bool(masks.truncated[row])
    assert int(masks.stages["input_ids"][row, 2]) == gen.eos_token_id  # the response ends at a sampled EOS

    lam = val.PROBE_LAM  # the case's lam is 1: a value leak telescopes away there
    fault = _step_fault(case, scenario, masks, lam)
    (poisoned,) = rollout.batch(BatchRequest(gen, scenario.sequence_length, {}, fault))
    clean_fault = Fault(torch.where(poisoned.trainable, fault.values, 0.0), fault.token_rewards, fault.score,
                        fault.gamma, lam)  # fmt: skip
    (clean,) = rollout.batch(BatchRequest(gen, scenario.sequence_length, {}, clean_fault))
    executed = val.executed_case(case, poisoned, fault)
    judged = val._judge(executed, declared, poisoned, clean)
    ref_ret = judged["reference"][1][row, :2].tolist()
    # GAE at lam 0.5 reads the padding slot's value 100: 1 + 100 - 0.5 * 100 = 51 at the EOS, 0.5 * 51 before it
    assert poisoned.returns[row, :2].tolist() == [25.5, 51.0] and clean.returns[row, :2].tolist() == [0.5, 1.0]
    assert ref_ret == pytest.approx([0.5, 1.0], abs=1e-6)
    assert judged["leak"].nonzero().tolist() == [[row, 0], [row, 1]]
    assert judged["clean_off"].nonzero().tolist() == []
    # the leak lives in the returns (the critic's target); whitening hides it in the advantages of this step
    assert (poisoned.advantages[row, :2] - clean.advantages[row, :2]).abs().max() < 1e-4
    # every upstream function the module lists ran (sys.setprofile saw it, in the checkout's files)
    assert poisoned.called == [f"{path}::{fn}" for path, fn in skyrl_batch.PRESERVED]
    assert masks.called == [f"{path}::{fn}" for path, fn in skyrl_batch.PRESERVED[: skyrl_batch.RELEASE.mask_stage + 1]]
    assert poisoned.stages["values"][row, 2] == 100.0 and poisoned.stages["token_level_rewards"][row].tolist() == [
        0.0, 1.0, 0.0]  # fmt: skip  (the score on the EOS; the case's token reward 100 at padding never reaches)


def test_validate_cannot_rebuild_the_padding_of_a_one_row_step(rollout):
    """fuzz.validate executes the chosen row as a batch of its own; SkyRL pads responses to the longest one of
    the batch it is given, so that one-row batch is `TT`: the case's masked slot is gone."""
    entry = corpus.load(ENTRY)
    scenario = val.search(entry.case, rollout)
    (alone,) = rollout.batch(BatchRequest(scenario.generation, scenario.sequence_length))
    assert val.row_classes(alone.attention[0], alone.trainable[0]) == "TT"
    with pytest.raises(val.CannotValidate, match="row 0 of the executed batch no longer holds the case's masks"):
        val.validate(entry, rollout, registry.get("skyrl").declared(None, PIN))


@pytest.mark.needs_mirror
def test_git_main_right_aligns_the_response_window_so_no_padding_follows_a_response():
    """At git main (a9564572eb8e) convert_prompts_responses_to_batch_tensors right-aligns every response: the
    padding of a shorter response comes before it, where GAE never reads it for a valid token; the case's `TTP`
    is not built (the search fails) and a value in that leading padding moves nothing."""
    repos = parse_repos(None)
    if "skyrl" not in repos:
        pytest.skip("SkyRL's git main needs a local mirror: set MASKFUZZ_REPOS=skyrl=/path")
    case = corpus.load(ENTRY).case
    with open_rollout(f"skyrl@{MAIN_PIN}", repos=repos) as main:
        with pytest.raises(val.CannotValidate, match=r"no batch holding the case's masks \(row 0: TTP;"):
            val.search(case, main, max_seeds=2)
        (gen,) = main.lm(lm.RolloutRequest(seed=0, num_return_sequences=val.POOL_SAMPLES, max_new_tokens=3))
        (masks,) = main.batch(BatchRequest(gen, gen.prompt_length + 3))
        rows = [val.row_classes(masks.attention[b], masks.trainable[b]) for b in range(masks.attention.shape[0])]
        assert "PTT" in rows and not any(r.rstrip("P") != r for r in rows)  # padding only before a response
        shape = masks.attention.shape
        fault = Fault(torch.where(masks.attention, 0.0, 100.0), torch.zeros(shape), torch.ones(shape[0]), 1.0, 0.5)
        (poisoned,) = main.batch(BatchRequest(gen, gen.prompt_length + 3, {}, fault))
        clean_fault = Fault(torch.zeros(shape), fault.token_rewards, fault.score, 1.0, 0.5)
        (clean,) = main.batch(BatchRequest(gen, gen.prompt_length + 3, {}, clean_fault))
    live = masks.attention
    assert torch.equal(poisoned.returns[live], clean.returns[live])
    assert poisoned.called == [f"{path}::{fn}" for path, fn in skyrl_batch.MAIN.preserved]

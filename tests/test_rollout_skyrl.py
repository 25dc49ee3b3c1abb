"""Reach you can run: SkyRL's masked-value bootstrap on a real rollout (targets/skyrl/rollout.py, released wheel 0.3.1).

A tiny random causal LM generates real responses; SkyRL's own trainer step at the pin (the generator output checked
by `validate_generator_output`, `postprocess_generator_output`, `convert_to_training_input` ->
`convert_prompts_responses_to_batch_tensors`, `apply_reward_kl_penalty`, `compute_advantages_and_returns` -> GAE)
runs on them in a worker process; the only fault is the critic's value under the mask, placed before
`compute_advantages_and_returns`.

* The whole step SkyRL batches (the pool: 4 prompts x 16 samples) holds corpus entry dbee94a8364d80ce's mask `TTP`:
  a two-token response right-padded to the step's longest response. With the critic's value 100 in that padding
  slot, GAE bootstraps it into the valid tokens' returns (the corpus verdict's 25.5, 51.0 against the reference's
  0.5, 1.0); the clean twin agrees with the float64 reference. `maskfuzz validate` shows it: SkyRL's batch code
  declares `STEP_WIDE_PADDING`, so the whole pool runs as the step, the fault only on the matching row.
* Re-batched alone, the row has no padding (SkyRL pads to the longest response of the batch it is given): a
  one-row step is `TT` and the case's masked slot does not exist there (what validate did before the declaration).

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
from maskfuzz.targets.rollout.requests import BatchRequest, Fault
from maskfuzz.targets.rollout.session import open_rollout
from maskfuzz.targets.runtime.repos import parse_repos
from maskfuzz.targets.skyrl import rollout as skyrl_batch

ROOT = Path(__file__).resolve().parents[1]
PIN, MAIN_PIN = "0.3.1", "a9564572eb8e"
ENTRY = ROOT / "corpus" / "skyrl" / "poison-dbee94a8364d80ce.json"  # skyrl/masked-value-bootstrap

pytestmark = pytest.mark.network


@pytest.fixture(scope="module")
def rollout():
    with open_rollout(f"skyrl@{PIN}", repos={}) as r:
        yield r


def test_validate_runs_the_whole_step_and_the_masked_value_bootstraps_into_the_returns(rollout, tmp_path):
    entry = corpus.load(ENTRY)
    assert val.step_wide(rollout) and skyrl_batch.STEP_WIDE_PADDING
    record = val.validate(entry, rollout, registry.get("skyrl").declared(None, PIN))
    scenario = record["recipe"]["constructed_scenario"]
    step = scenario["step"]
    (row,) = step["judged_rows"]
    assert step["whole_pool"] and step["rows"] == scenario["pool"]["rows"] == len(lm.PROMPTS) * val.POOL_SAMPLES
    assert scenario["pool"]["rows_used"] == [row] and scenario["masks"] == ["TTP"]
    # the whole step's batch: right-padded to its longest response (3), the row ends at a sampled EOS
    assert len(record["batch"]["loss_mask"]) == step["rows"] and len(record["batch"]["loss_mask"][row]) == 3
    assert scenario["responses"][0].split()[-1] == lm.EOS
    # the fault only on the judged row: the critic's value 100 in its padding slot, 0 on every other row
    assert scenario["poisoned_positions"] == [[row, 2]] and scenario["masked_critic_values"] == [100.0]
    assert record["batch"]["values"][row] == [0.0, 0.0, 100.0]
    assert all(not any(vals) for b, vals in enumerate(record["batch"]["values"]) if b != row)
    # GAE at lam 0.5 reads the padding slot's value 100: 1 + 100 - 0.5 * 100 = 51 at the EOS, 0.5 * 51 before it
    assert record["verdict"]["reproduced"] and record["resolved"] == "skyrl-train==0.3.1"
    assert [row_ret[:2] for row_ret in record["observed"]["returns"]] == [[25.5, 51.0]]
    assert [row_ret[:2] for row_ret in record["clean_twin"]["returns"]] == [[0.5, 1.0]]
    assert [p["reference_return"] for p in record["positions"]] == pytest.approx([0.5, 1.0], abs=1e-6)
    assert [(p["row"], p["position"]) for p in record["positions"]] == [(row, 0), (row, 1)]
    assert record["verdict"]["leaked_positions"] == [[row, 0], [row, 1]]
    assert record["verdict"]["clean_twin_off_reference"] == []
    # the leak lives in the returns (the critic's target); whitening hides it in the advantages of this step
    assert record["verdict"]["max_abs_moved_by_poison"] < 1e-4 and record["verdict"]["max_abs_return_delta"] == 50.0
    # every upstream function the module lists ran (sys.setprofile saw it, in the checkout's files)
    called = [c for c in record["recipe"]["preserved_infrastructure"] if c.startswith("skyrl_train/")]
    assert called == [f"{path}::{fn}" for path, fn in skyrl_batch.PRESERVED]
    assert record["batch"]["token_level_rewards"][row] == [0.0, 1.0, 0.0]  # the score on the EOS
    assert "64 row(s)" in val.markdown(record) and f"| {row} | " in val.markdown(record)


def test_the_row_alone_has_no_padding_slot_so_validate_needs_the_whole_step(rollout, monkeypatch):
    """SkyRL pads responses to the longest one of the batch it is given: the matching row re-batched alone is
    `TT`, the case's masked slot is gone. Without the module's STEP_WIDE_PADDING declaration validate would
    execute that one-row batch and cannot run the case (exit 2)."""
    entry = corpus.load(ENTRY)
    scenario = val.search(entry.case, rollout)
    (row,) = scenario.pool_rows
    assert scenario.step_wide and scenario.step_rows == (row,) and scenario.generation.output.shape[0] == 64
    (alone,) = rollout.batch(BatchRequest(scenario.generation.rows([row]), scenario.sequence_length))
    assert val.row_classes(alone.attention[0], alone.trainable[0]) == "TT"
    monkeypatch.setattr(skyrl_batch, "STEP_WIDE_PADDING", False)
    with pytest.raises(val.CannotValidate, match="row 0 of the executed batch no longer holds the case's masks"):
        val.validate(entry, rollout, registry.get("skyrl").declared(None, PIN))


def test_a_case_the_single_turn_path_never_builds_is_not_built_and_says_what_was(rollout):
    """Entry 77f071a1acc1d060 needs a loss-masked response tail (`TR`), which SkyRL builds only in its multi-turn
    generator; the single-turn path builds `TT...` and `T...P` rows, and the search names them."""
    entry = corpus.load(ROOT / "corpus" / "skyrl" / "telescoping-77f071a1acc1d060.json")
    built = r"it built instead \(rows over those seeds\): TT x\d+, TP x\d+$"
    with pytest.raises(val.NotBuilt, match=r"\(row 0: TR, row 1: TR;.* " + built):
        val.validate(entry, rollout, registry.get("skyrl").declared(None, PIN), max_seeds=4)


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

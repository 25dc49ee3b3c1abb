"""Reach you can run: verl's masked-value bootstrap on a real rollout (`maskfuzz validate`, targets/verl/rollout.py).

A tiny random causal LM generates real responses; verl's own batch code at the pin (the vLLM rollout's response
building with `pad_*` / `get_response_mask`, `compute_response_mask`, the reward manager placing a rule score,
`apply_kl_penalty`, `compute_advantage` -> `compute_gae_advantage_return`) runs on them in a worker process; the
only fault is the critic's value under the mask, placed before `compute_advantage`.

* 0.1 (corpus reference-a1406ab1912c899c): the plain GAE loop bootstraps the padding slot's critic value into
  the valid tokens: returns 9.9, 11.0 against 0.9, 1.0, reproduced, exit 1.
* 0.5.0: the case is outside verl's pipeline there (the critic zeroes padding values: exit 2, not forced); the
  same real batch with the pipeline check off shows #2337's GAE skipping the masked value: not reproduced.
* 11ee5125 (git, the poison entry's pin): its witness needs a masked real token inside the response (a tool
  turn); the single-turn rollout builds response_mask == attention only, so no batch holds it: exit 2.

The released pins download verl's wheels (`network`); the git pin needs MASKFUZZ_REPOS=verl=/path (a mirror).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from maskfuzz.fuzz import corpus
from maskfuzz.fuzz import validate as val
from maskfuzz.fuzz.cli import main
from maskfuzz.targets import registry
from maskfuzz.targets.rollout import lm
from maskfuzz.targets.rollout.requests import BatchRequest
from maskfuzz.targets.rollout.session import open_rollout
from maskfuzz.targets.runtime.repos import parse_repos

ROOT = Path(__file__).resolve().parents[1]
BUGGY, FIXED, GIT_PIN = "0.1", "0.5.0", "11ee5125d269d657f1edf101d627b4b599eaceae"
REFERENCE = ROOT / "corpus" / "verl" / "reference-a1406ab1912c899c.json"  # masked-value-bootstrap at 0.1
POISON = ROOT / "corpus" / "verl" / "poison-17351e2105c2533b.json"  # masked-value-bootstrap at 11ee5125, a gap
# float32 returns of the case (mask [1, 1, 0], values [0, 0, 100], score 1, lam 0.9): the corpus entry's numbers
LEAKED_RETURNS, RETURNS = [9.899999618530273, 11.0], [0.8999999761581421, 1.0]


def _verl_calls(*names: str) -> list[str]:
    where = {
        "pad_2d_list_to_length": "verl/utils/torch_functional.py",
        "pad_sequence_to_length": "verl/utils/torch_functional.py",
        "get_response_mask": "verl/utils/torch_functional.py",
        "get_eos_mask": "verl/utils/torch_functional.py",
        "compute_response_mask": "verl/trainer/ppo/ray_trainer.py",
        "compute_reward": "verl/trainer/ppo/reward.py",
        "NaiveRewardManager": "verl/workers/reward_manager/naive.py",
        "RewardManager": "verl/trainer/main_ppo.py",
        "FixedKLController": "verl/trainer/ppo/core_algos.py",
        "apply_kl_penalty": "verl/trainer/ppo/ray_trainer.py",
        "compute_advantage": "verl/trainer/ppo/ray_trainer.py",
        "compute_gae_advantage_return": "verl/trainer/ppo/core_algos.py",
    }
    return [f"{where[n]}::{n}" for n in names]


def test_only_the_masked_value_bootstrap_of_the_reference_property_runs_the_poison_recipe():
    """A `reference` finding of another mechanism (score-lost, placed by the reward manager) has no recipe: it is
    refused before any rollout starts."""
    entry = corpus.load(ROOT / "corpus" / "verl" / "reference-b53507026df5502d.json")
    with pytest.raises(val.CannotValidate, match=r"property 'reference' \(mechanism 'score-lost'\)"):
        val.validate(entry, None, registry.get("verl").declared(None, FIXED))
    assert ("reference", "masked-value-bootstrap") in val.SAME_FAULT and corpus.load(REFERENCE).property == "reference"


@pytest.mark.network
def test_the_plain_gae_loop_bootstraps_the_padding_value_on_a_real_rollout_at_0_1(tmp_path, capsys):
    out = tmp_path / "buggy"
    code = main(["validate", str(REFERENCE), "--target", f"verl@{BUGGY}", "-o", str(out)])
    said = capsys.readouterr().out
    assert code == 1, said
    assert "reproduced: the masked critic value(s) [100.0] moved 2 valid-token output(s)" in said
    record = json.loads((out / "validation.json").read_text())
    assert record["verdict"]["reproduced"] and record["resolved"] == "verl==0.1"
    recipe = record["recipe"]
    assert recipe["hooked_boundary"].endswith("before critic values enter compute_advantage")
    assert recipe["replaced_component"] is None and "tensordict" not in recipe["stand_ins"]
    # verl 0.1's own code, in the trainer's order (0.1 has no compute_response_mask / reward.compute_reward)
    want = _verl_calls("pad_sequence_to_length", "get_eos_mask", "RewardManager", "FixedKLController",
                       "apply_kl_penalty", "compute_advantage", "compute_gae_advantage_return")  # fmt: skip
    assert [c for c in recipe["preserved_infrastructure"] if c.startswith("verl/")] == want
    scenario = recipe["constructed_scenario"]
    # the generation decided the mask: one word, a sampled EOS, then the rollout's padding holding the poison
    assert scenario["masks"] == ["TTP"] and scenario["responses"][0].endswith(lm.EOS)
    assert scenario["poisoned_positions"] == [[0, 2]] and scenario["lam"] == 0.9
    # verl's reward manager put the rule score at valid_response_length - 1: the EOS
    assert record["batch"]["token_level_scores"] == [[0.0, 1.0, 0.0]]
    assert [p["token"] for p in record["positions"]] == [scenario["responses"][0].split()[0], lm.EOS]
    assert [p["observed_return"] for p in record["positions"]] == LEAKED_RETURNS
    assert [row[:2] for row in record["clean_twin"]["returns"]] == [RETURNS]
    assert [p["reference_return"] for p in record["positions"]] == pytest.approx(RETURNS, rel=1e-6)
    assert all(p["leaked"] for p in record["positions"]) and record["verdict"]["clean_twin_off_reference"] == []
    assert "**Reproduced.**" in (out / "validation.md").read_text()


@pytest.fixture(scope="module")
def fixed_rollout():
    with open_rollout(f"verl@{FIXED}") as rollout:
        yield rollout


@pytest.mark.network
def test_at_0_5_0_the_padding_value_is_outside_the_pipeline_and_gae_skips_it(fixed_rollout):
    entry = corpus.load(REFERENCE)
    declared = registry.get("verl").declared(None, FIXED)
    # the critic zeroes values at padding at 0.5.0: the declared pipeline refuses the case, nothing is forced
    with pytest.raises(val.CannotValidate, match=r"outside what verl's pipeline builds: critic values at non-train"):
        val.validate(entry, fixed_rollout, declared)
    # the same real batch with the pipeline check off: #2337's GAE skips the masked value, the fix holds
    record = val.validate(entry, fixed_rollout, dataclasses.replace(declared, pipeline=None))
    assert not record["verdict"]["reproduced"] and record["verdict"]["max_abs_moved_by_poison"] == 0.0
    assert [p["observed_return"] for p in record["positions"]] == RETURNS
    want = _verl_calls("pad_2d_list_to_length", "get_response_mask", "compute_response_mask", "compute_reward",
                       "NaiveRewardManager", "FixedKLController", "apply_kl_penalty", "compute_advantage",
                       "compute_gae_advantage_return")  # fmt: skip
    assert [c for c in record["recipe"]["preserved_infrastructure"] if c.startswith("verl/")] == want
    assert record["batch"]["response_mask"] == [[1, 1, 0]]
    assert record["batch"]["token_level_scores"] == [[0.0, 1.0, 0.0]]


@pytest.mark.network
def test_the_single_turn_rollout_builds_the_response_mask_from_the_attention(fixed_rollout):
    """What the search meets at every pin: verl's single-turn rollout marks every real response token trainable
    (response_mask == attention, right-padded), so a case row with a masked real token never embeds."""
    (gen,) = fixed_rollout.lm(lm.RolloutRequest(seed=3, num_return_sequences=16, max_new_tokens=5))
    (pool,) = fixed_rollout.batch(BatchRequest(gen, gen.prompt_length + 5))
    assert pool.attention.shape == (len(lm.PROMPTS) * 16, 5)
    assert bool((pool.trainable == pool.attention).all())
    rows = {val.row_classes(pool.attention[r], pool.trainable[r]) for r in range(pool.attention.shape[0])}
    assert rows <= {"T" * n + "P" * (5 - n) for n in range(1, 6)} and len(rows) > 1
    assert bool(pool.truncated.any()) and bool((~pool.truncated).any())  # both cut and EOS-ended responses


@pytest.mark.needs_mirror
def test_the_gap_witness_at_11ee5125_needs_a_tool_turn_the_single_turn_rollout_never_builds(tmp_path, capsys):
    repos = parse_repos(None)
    if "verl" not in repos:
        pytest.skip("verl@11ee5125 is a git pin: its real rollout needs a local mirror, MASKFUZZ_REPOS=verl=/path")
    code = main(["validate", str(POISON), "--target", f"verl@{GIT_PIN}", "--repo", f"verl={repos['verl']}",
                 "--max-seeds", "4", "-o", str(tmp_path / "git")])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2, err
    assert "the real path built no batch holding the case's masks (row 0: TRT;" in err
    assert not (tmp_path / "git").exists()

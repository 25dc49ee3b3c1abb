"""Reach you can run: slime's Search-R1 agent loop on a real rollout (targets/slime/rollout.py, git pin 624b824a8).

A tiny random causal LM generates real responses; slime's own code at the pin (the multi-turn generate function of
examples/search-r1/generate_with_search.py, which appends the tool observation with loss mask 0, the rollout
manager's `_convert_samples_to_train_data` / `_split_train_data_by_dp`, `process_rollout_data`, the PPO caller
`compute_advantages_and_returns`) runs on them in a worker process; the critic's values enter before the caller.

* score-kept-33109573a5509fa6 (slime/score-lost, mask `TR`): a response that is a lone sampled EOS, then the
  observation the loop appends (an invalid action: 40 loss-masked tokens). slime puts the score on the last
  response token, the observation's last: at gamma 0 the trained token's advantage is 0.0 where the float64
  reference has 1.0 (r + score - V); the same step without the score agrees. Exit 1.
* poison-504440660de9a298 (masked-value-bootstrap, the same `TR`): the masked critic value 100 moves the trained
  token's advantage to 100.0 against the same step with 0 under the mask (the poison promise broken), a twin that is
  itself off the reference (the score lost on the observation's tail, 0.5^40 of it left): reproduced, exit 1, and
  the line names the twin's other defect.

slime is git only: the tests need MASKFUZZ_REPOS=slime=/path/to/a-slime-clone-or-mirror and skip without it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from maskfuzz.fuzz import corpus
from maskfuzz.fuzz import validate as val
from maskfuzz.fuzz.cli import main
from maskfuzz.targets import registry
from maskfuzz.targets.rollout import lm
from maskfuzz.targets.rollout.session import open_rollout
from maskfuzz.targets.runtime.repos import parse_repos

ROOT = Path(__file__).resolve().parents[1]
PIN = "624b824a8"
SCORE_KEPT = ROOT / "corpus" / "slime" / "score-kept-33109573a5509fa6.json"
POISON = ROOT / "corpus" / "slime" / "poison-504440660de9a298.json"
OBSERVATION = 40  # tokens of the loop's invalid-action observation in the tiny LM's vocabulary


def _mirror() -> dict:
    repos = parse_repos(None)
    if "slime" not in repos:
        pytest.skip("slime is git only, its real rollout needs a local mirror: set MASKFUZZ_REPOS=slime=/path")
    return repos


@pytest.mark.needs_mirror
def test_the_score_on_the_observation_tail_is_lost_on_a_real_rollout(tmp_path, capsys):
    repos = _mirror()
    out = tmp_path / "slime"
    code = main(["validate", str(SCORE_KEPT), "--target", f"slime@{PIN}", "--repo", f"slime={repos['slime']}",
                 "-o", str(out)])  # fmt: skip
    said = capsys.readouterr().out
    assert code == 1, said
    assert "reproduced: the outcome score [1.0] does not reach 1 valid-token output(s)" in said
    record = json.loads((out / "validation.json").read_text())
    assert record["resolved"].startswith(PIN)
    called = record["recipe"]["preserved_infrastructure"]
    for fn in ("examples/search-r1/generate_with_search.py::generate", "slime/utils/types.py::append_response_tokens",
               "examples/search-r1/generate_with_search.py::execute_predictions",
               "slime/ray/rollout.py::_convert_samples_to_train_data",
               "slime/backends/megatron_utils/loss.py::compute_advantages_and_returns"):  # fmt: skip
        assert fn in called
    scenario = record["recipe"]["constructed_scenario"]
    assert scenario["masks"] == ["T" + "R" * OBSERVATION] and scenario["responses"] == [lm.EOS]
    assert record["batch"]["response_lengths"] == [1 + OBSERVATION]
    (pos,) = record["positions"]
    assert (pos["observed_advantage"], pos["clean_twin_advantage"], pos["reference_advantage"]) == (0.0, 0.0, 1.0)
    assert record["verdict"]["clean_twin_off_reference"] == []


@pytest.mark.needs_mirror
def test_the_masked_value_moves_the_output_though_the_twin_is_off_too():
    repos = _mirror()
    entry = corpus.load(POISON)
    with open_rollout(f"slime@{PIN}", repos=repos) as rollout:
        record = val.validate(entry, rollout, registry.get("slime").declared(None, PIN))
    verdict = record["verdict"]
    assert verdict["reproduced"] and verdict["leaked_positions"] == [[0, 0]]
    assert verdict["line"].startswith("reproduced: the masked critic value(s) [100.0]")
    assert "moved 1 valid-token output(s)" in verdict["line"]
    assert "that twin is itself off the reference at 1 valid-token output(s): another defect" in verdict["line"]
    (pos,) = record["positions"]
    assert pos["observed_advantage"] == 100.0 and pos["reference_advantage"] == 1.0
    assert float(pos["clean_twin_advantage"]) == pytest.approx(0.5**OBSERVATION)  # the score 40 masked steps away
    assert verdict["max_abs_moved_by_poison"] == pytest.approx(100.0) and verdict["clean_twin_off_reference"]

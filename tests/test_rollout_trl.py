"""Reach you can run: TRL's lost outcome score on a real rollout (targets/trl/rollout.py, released wheel 1.12.0).

A tiny random causal LM generates real responses; TRL's own rollout processing of `PPOTrainer.train()` at the pin
(the no_grad block after `batch_generation`: `selective_log_softmax`, `truncate_response`, `first_true_indices`,
the EOS filter, the masks, the KL reward, the score at `sequence_lengths + 1`, GAE, `masked_whiten`) runs on them
in a worker process, compiled from the wheel's source; the only inputs given are the models' outputs (policy and
reference logits, the value model's values, the reward model's score) at the hooked boundary.

* Corpus entry 83384c4ed0209044 (trl/score-lost): a response that ends at a sampled EOS before the window's end
  (`TTP`: two trained tokens, then padding). TRL trains positions <= sequence_lengths and puts the score at
  sequence_lengths + 1, the first pad slot; at gamma 0 it never reaches a trained token: the advantages are the
  whitened [0, 0] where the float64 reference has [-0.7071, 0.7071] (the corpus verdict's 0.7071 vs 0.0 at the
  last trained token). The same step without the score agrees with its reference. Exit 1.
* A row cut by the length limit (no EOS, the window full): TRL puts the score at sequence_lengths (the last token,
  `actual_end`), so it is kept: not reproduced, exit 0.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from maskfuzz.fuzz import corpus
from maskfuzz.fuzz import validate as val
from maskfuzz.fuzz.cli import main
from maskfuzz.oracles.case import Case
from maskfuzz.oracles.verdict import Verdict
from maskfuzz.targets import registry
from maskfuzz.targets.rollout import lm
from maskfuzz.targets.rollout.session import open_rollout

ROOT = Path(__file__).resolve().parents[1]
PIN = "1.12.0"
ENTRY = ROOT / "corpus" / "trl" / "score-kept-83384c4ed0209044.json"  # trl/score-lost
HALF = 0.7071067741154798  # whitening [0, 1] (unbiased, TRL's masked_whiten): -/+ 1 / sqrt(2)

pytestmark = pytest.mark.network


def test_the_lost_score_reproduces_on_a_real_rollout(tmp_path, capsys):
    out = tmp_path / "trl"
    code = main(["validate", str(ENTRY), "--target", f"trl@{PIN}", "-o", str(out)])
    said = capsys.readouterr().out
    assert code == 1, said
    assert "reproduced: the outcome score [1.0] does not reach 2 valid-token output(s)" in said
    record = json.loads((out / "validation.json").read_text())
    assert record["verdict"]["reproduced"] and record["resolved"] == "trl==1.12.0"
    recipe = record["recipe"]
    assert recipe["hooked_boundary"].startswith("after the real rollout, the models' outputs")
    called = recipe["preserved_infrastructure"]
    assert any(c.startswith("trl/experimental/ppo/ppo_trainer.py:") and "PPOTrainer.train" in c for c in called)
    for fn in (
        "trl/trainer/utils.py::selective_log_softmax",
        "trl/experimental/ppo/ppo_trainer.py::truncate_response",
        "trl/experimental/utils.py::first_true_indices",
        "trl/experimental/ppo/ppo_trainer.py::masked_whiten",
    ):
        assert fn in called  # fmt: skip
    scenario = recipe["constructed_scenario"]
    # the generation decided the mask: a two-token response ending at a sampled EOS, TRL's padding after it
    assert scenario["masks"] == ["TTP"] and scenario["responses"][0].split()[-1] == lm.EOS
    assert scenario["gamma"] == 0.0 and scenario["score"] == [1.0]
    batch = record["batch"]
    assert batch["sequence_lengths"] == [1] and batch["padding_mask"] == [[False, False, True]]
    assert batch["token_level_rewards"] == [[0.0, 0.0, 1.0]]  # TRL's own placement: the first pad slot
    observed = [p["observed_advantage"] for p in record["positions"]]
    reference = [p["reference_advantage"] for p in record["positions"]]
    assert observed == [0.0, 0.0] and reference == pytest.approx([-HALF, HALF], rel=1e-6)
    assert [p["clean_twin_advantage"] for p in record["positions"]] == [0.0, 0.0]
    assert record["verdict"]["clean_twin_off_reference"] == []
    assert "**Reproduced.**" in (out / "validation.md").read_text()


def test_a_row_cut_at_the_window_keeps_its_score():
    """No EOS within the limit: TRL's actual_end is sequence_lengths (the window's last token), the score is kept."""
    case = Case.build(trainable=[[1, 1]], attention=[[1, 1]], token_rewards=[[0, 0]], values=[[0, 0]], score=[1.0],
                      gamma=0.0, lam=1.0, truncated=torch.tensor([True]))  # fmt: skip
    entry = corpus.Entry("trl", PIN, "score-kept", case, Verdict("score-kept", "fail", "a cut row"))
    declared = registry.get("trl").declared(None, PIN)
    with open_rollout(f"trl@{PIN}", repos={}) as rollout:
        record = val.validate(entry, rollout, declared)
    assert not record["verdict"]["reproduced"], record["verdict"]["line"]
    assert record["recipe"]["constructed_scenario"]["masks"] == ["TT"]
    assert record["batch"]["token_level_rewards"] == [[0.0, 1.0]]
    assert [p["observed_advantage"] for p in record["positions"]] == pytest.approx([-HALF, HALF], rel=1e-6)

"""Reach you can run: AReaL's lost outcome score on a real rollout (targets/areal/rollout.py, released wheel 1.0.4).

A tiny random causal LM generates real responses; AReaL's own code at the pin (the RLVR workflow's episode with
its chat template, `batched_call` -> `concat_padded_tensors`, `PPOActor._compute_advantages`) runs on them in a
worker process, compiled from the wheel's source; the critic's values and the reference log-probs enter at the
hooked boundary, the score is a rule reward.

* telescoping-0f4b64754819e107 (areal/score-lost, `actor.mask_no_eos_with_zero: true`): a response that is a lone
  sampled EOS, on the longest prompt. AReaL has no EOS flag: a row as wide as the batch is taken for one cut by the
  length limit (`seq_no_eos_mask = seqlens == attn_mask.shape[1]`), and the option zeroes its score, though the
  response ended. At gamma = lam = 1 the advantage is 0.0 where the float64 reference has 1.0; the same step
  without the score agrees with its reference. Exit 1. Without the option the score is kept (not reproduced).
* score-kept-5d800b2756714248 (a trainable token, then a masked real token, `TR`): the wheel's RLVR workflow
  builds prompt + response + padding, so no trainable token is followed by a masked real one: not built (the
  entry's pipeline label cites examples/tir/tir_workflow.py, which the wheel does not ship).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from maskfuzz.fuzz import corpus
from maskfuzz.fuzz import validate as val
from maskfuzz.fuzz.cli import main
from maskfuzz.oracles.case import Case
from maskfuzz.oracles.verdict import Verdict
from maskfuzz.targets import registry
from maskfuzz.targets.rollout import lm
from maskfuzz.targets.rollout.session import open_rollout

ROOT = Path(__file__).resolve().parents[1]
PIN = "1.0.4"
TELESCOPING = ROOT / "corpus" / "areal" / "telescoping-0f4b64754819e107.json"
SCORE_KEPT = ROOT / "corpus" / "areal" / "score-kept-5d800b2756714248.json"

pytestmark = pytest.mark.network


@pytest.fixture(scope="module")
def rollout():
    with open_rollout(f"areal@{PIN}", repos={}) as r:
        yield r


def test_the_score_of_the_widest_row_is_dropped_on_a_real_rollout(tmp_path, capsys):
    out = tmp_path / "areal"
    code = main(["validate", str(TELESCOPING), "--target", f"areal@{PIN}", "-o", str(out)])
    said = capsys.readouterr().out
    assert code == 1, said
    assert "reproduced: the outcome score [1.0] does not reach 1 valid-token output(s)" in said
    record = json.loads((out / "validation.json").read_text())
    assert record["resolved"] == "areal==1.0.4"
    called = record["recipe"]["preserved_infrastructure"]
    for fn in ("areal/workflow/rlvr.py::RLVRWorkflow.arun_episode", "areal/utils/data.py::concat_padded_tensors",
               "areal/trainer/ppo/actor.py::PPOActor._compute_advantages"):  # fmt: skip
        assert fn in called
    scenario = record["recipe"]["constructed_scenario"]
    (mask,) = scenario["masks"]
    assert mask.endswith("RT") and set(mask[:-1]) == {"R"}  # the prompt (masked real), one token, no padding
    assert scenario["responses"] == [lm.EOS]  # the response ended: a sampled EOS
    assert scenario["options"] == {"actor.mask_no_eos_with_zero": True}
    batch = record["batch"]
    assert batch["rewards"] == [1.0] and not any(batch["tot_rewards"][0])  # the score never reaches the rewards
    (pos,) = record["positions"]
    assert (pos["observed_advantage"], pos["clean_twin_advantage"], pos["reference_advantage"]) == (0.0, 0.0, 1.0)
    assert pos["token"] == lm.EOS and record["verdict"]["clean_twin_off_reference"] == []


def test_without_the_option_the_score_is_kept(rollout):
    entry = corpus.load(TELESCOPING)
    case = Case.build(trainable=[[1]], attention=[[1]], token_rewards=[[0.0]], values=[[0.0]], score=[1.0],
                      gamma=1.0, lam=1.0)  # fmt: skip
    plain = corpus.Entry("areal", PIN, "telescoping", case, Verdict("telescoping", "fail", "no option"))
    record = val.validate(plain, rollout, registry.get("areal").declared(None, PIN))
    assert entry.case.options and not case.options
    assert not record["verdict"]["reproduced"], record["verdict"]["line"]
    assert [p["observed_advantage"] for p in record["positions"]] == [1.0]


def test_a_masked_real_tail_is_not_built_by_the_wheels_workflow(rollout):
    entry = corpus.load(SCORE_KEPT)
    with pytest.raises(val.NotBuilt, match=r"row 0: TR;.* in 2 seeds x 64 generated rows"):
        val.validate(entry, rollout, registry.get("areal").declared(None, PIN), max_seeds=2)

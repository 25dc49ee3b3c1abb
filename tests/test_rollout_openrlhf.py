"""Reach you can run: OpenRLHF's experience maker on a real rollout (targets/openrlhf/rollout.py, 0.3.6.post1).

A tiny random causal LM generates real responses; OpenRLHF's own code (`Actor.process_sequences`,
`compute_reward`, `NaiveExperienceMaker.get_advantages_and_returns`) runs on them in a worker process, the
critic's values entering before compute_reward.

* the masked-zero entry (masked-zero-34ca51fe1b71880f) has no real-rollout recipe, and its witness (a masked real
  token inside the response, `TRT`: an EOS or pad id sampled mid-response) is never built: generate() stops at
  EOS and never samples pad, so process_sequences' action mask equals the attention, right-padded;
* on those real batches a masked critic value does not move anything (the function multiplies values by the
  action mask first) and the advantage at the padding is exactly 0: masked-zero holds there.

Downloads the 0.3.6.post1 wheel (`network`).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from maskfuzz.fuzz import corpus
from maskfuzz.fuzz import validate as val
from maskfuzz.oracles.case import Case
from maskfuzz.oracles.verdict import Verdict
from maskfuzz.targets import registry
from maskfuzz.targets.rollout import lm
from maskfuzz.targets.rollout.requests import BatchRequest
from maskfuzz.targets.rollout.session import open_rollout

ROOT = Path(__file__).resolve().parents[1]
PIN = "0.3.6.post1"
MASKED_ZERO = ROOT / "corpus" / "openrlhf" / "masked-zero-34ca51fe1b71880f.json"
# the masked-value probe (ROLL's seed report 000's example): value 100 on the padding after a one-word response
PROBE = Case.build(
    trainable=[[1, 1, 0]], attention=[[1, 1, 0]], token_rewards=[[0, 1, 0]], values=[[0, 0, 100]], gamma=1.0, lam=0.95
)

pytestmark = pytest.mark.network


@pytest.fixture(scope="module")
def rollout():
    with open_rollout(f"openrlhf@{PIN}") as r:
        yield r


def test_the_masked_zero_witness_needs_a_mid_response_eos_the_real_rollout_never_samples(rollout):
    entry = corpus.load(MASKED_ZERO)
    with pytest.raises(val.CannotValidate, match="no real-rollout recipe for property 'masked-zero'"):
        val.validate(entry, rollout, registry.get("openrlhf").declared(None, PIN))
    with pytest.raises(val.CannotValidate, match=r"built no batch holding the case's masks \(row 0: TRT;"):
        val.search(entry.witness, rollout, max_seeds=4)
    (gen,) = rollout.lm(lm.RolloutRequest(seed=3, num_return_sequences=16, max_new_tokens=5))
    (pool,) = rollout.batch(BatchRequest(gen, gen.prompt_length + 5))
    assert pool.attention.shape == (len(lm.PROMPTS) * 16, 5)
    assert bool((pool.trainable == pool.attention).all())  # the action mask is the attention: no gap, no tail
    rows = {val.row_classes(pool.attention[r], pool.trainable[r]) for r in range(pool.attention.shape[0])}
    assert rows <= {"T" * n + "P" * (5 - n) for n in range(1, 6)} and len(rows) > 1
    assert bool(pool.truncated.any()) and bool((~pool.truncated).any())
    # a cut response: process_sequences writes EOS over its last token (actor.py:154-155)
    cut = int(pool.truncated.nonzero()[0, 0])
    assert int(pool.tokens[cut, -1]) == gen.eos_token_id != int(gen.output[cut, -1])


def test_a_masked_critic_value_moves_nothing_and_the_padding_advantage_is_zero(rollout):
    entry = corpus.Entry("openrlhf", PIN, "poison", PROBE, Verdict("poison", "fail", "the masked-value probe"))
    record = val.validate(entry, rollout, registry.get("openrlhf").declared(None, PIN))
    assert not record["verdict"]["reproduced"] and record["verdict"]["max_abs_moved_by_poison"] == 0.0
    called = [c for c in record["recipe"]["preserved_infrastructure"] if c.startswith("openrlhf/")]
    assert called == [
        "openrlhf/models/actor.py::Actor.process_sequences",
        "openrlhf/models/utils.py::compute_reward",
        "openrlhf/trainer/ppo_utils/experience_maker.py::NaiveExperienceMaker.get_advantages_and_returns",
    ]
    scenario = record["recipe"]["constructed_scenario"]
    assert scenario["masks"] == ["TTP"] and scenario["poisoned_positions"] == [[0, 2]]
    assert record["batch"]["reward"] == [[0.0, 1.0, 0.0]]  # compute_reward: the score on the last action token
    assert [p["observed_advantage"] for p in record["positions"]] == [0.949999988079071, 1.0]
    assert [p["token"] for p in record["positions"]][-1] == lm.EOS
    assert record["observed"]["advantages"][0][2] == 0.0  # the padding's advantage, the value 100 there

"""Kind `token-reward` (oracles/kinds/token_reward/): the per-token reward of a PPO step from a sequence score and
a per-token KL. The reference by hand, the loop against the vectorised form, the reference as a target passing
every property, the mutant of the bug class (the score on the last attended token instead of the last trainable
one) caught by the kind's own `score-kept` and by `reference`, diagnosed `score-lost` (universal:score-kept), and
the two framework entries run from their release wheels (OpenRLHF `compute_reward`, torchtune `get_rewards_ppo`)
on a hand-computed case."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings

from maskfuzz.fuzz import repro_check
from maskfuzz.fuzz.engine import fuzz_target
from maskfuzz.fuzz.repro_kinds import build_kind_check
from maskfuzz.oracles.case import Case
from maskfuzz.oracles.declared import Declared
from maskfuzz.oracles.kinds import KINDS, token_reward
from maskfuzz.oracles.kinds.dispatch import diagnose, judge
from maskfuzz.oracles.kinds.strategies import kind_cases
from maskfuzz.oracles.promises import broken
from maskfuzz.oracles.strategies import Sizes
from maskfuzz.targets.runtime.session import open_target
from tests.test_repro_kinds import script_verdict

pytestmark = pytest.mark.xdist_group("kinds")

# row 0: trainable 0-1, an observation tail at 2 (attended, masked), padding at 3
# row 1: a leading prompt token, trainable 1 and 3 with a gap at 2
# row 2: no trainable token (its score has nowhere to go)
CASE = Case.build(
    attention=[[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 0, 0]],
    trainable=[[1, 1, 0, 0], [0, 1, 0, 1], [0, 0, 0, 0]],
    score=[2.0, -30.0, 5.0],
    extra={"kl": [[0.5, -1.0, 7.0, 9.0], [3.0, 0.25, 8.0, 2.0], [1.0, 1.0, 1.0, 1.0]]},
    dtype="float64",
)


def _reward(case, variant):
    return token_reward.reference(case, variant)["reward"].tolist()


def test_the_reference_by_hand():
    # kl_coef 0.5: -0.5 kl at trainable positions; the score on the last trainable token; 0 elsewhere
    assert _reward(CASE, {"kl_coef": 0.5}) == [
        [-0.25, 0.5 + 2.0, 0.0, 0.0],
        [0.0, -0.125, 0.0, -1.0 - 30.0],
        [0.0, 0.0, 0.0, 0.0],
    ]
    # OpenRLHF's clip to [-10, 10] (kl_coef 0.01): row 1's -30 becomes -10
    clipped = _reward(CASE, {"kl_coef": 0.01, "score_clip": (-10, 10)})
    assert clipped[0] == pytest.approx([-0.005, 0.01 + 2.0, 0.0, 0.0])
    assert clipped[1] == pytest.approx([0.0, -0.0025, 0.0, -0.02 - 10.0])
    # the neighbouring variant: the score on the last attended token, row 0's observation tail (lost to training)
    tail = _reward(CASE, {"kl_coef": 0.5, "score_at": "last-attended"})
    assert tail[0] == [-0.25, 0.5, 2.0, 0.0] and tail[1] == [0.0, -0.125, 0.0, -31.0]
    with pytest.raises(ValueError, match="unknown token-reward option"):
        token_reward.options({"coef": 1.0})


@settings(max_examples=80, deadline=None, database=None)
@given(kind_cases("token-reward", sizes=Sizes(8, 32), nonfinite=False))
def test_loop_and_vectorised_references_agree(case):
    for variant in ({}, {"score_clip": (-10, 10)}, {"score_at": "last-attended", "kl_coef": 0.5}):
        loop = token_reward.reference(case.replace(dtype="float64"), variant)["reward"]
        vec = token_reward.reference(case.replace(dtype="float64"), variant, vectorised=True)["reward"]
        assert torch.allclose(loop, vec, rtol=1e-12, atol=1e-12)


def _as_target(variant):
    def run(case):
        return (token_reward.reference(case, variant, vectorised=True)["reward"].to(case.torch_dtype),)

    return run


def test_the_reference_as_a_target_passes_every_property():
    declared = Declared(kind="token-reward", masked_zero=True)
    result = fuzz_target(_as_target({}), declared, target="reference", max_examples=120, sizes=Sizes(8, 32))
    assert result.findings == [], [(f.property, f.verdict.message, f.case) for f in result.findings]
    assert all(result.checked[p] > 0 for p in KINDS["token-reward"].properties if p != "twin"), result.checked


def test_a_score_on_the_last_attended_token_is_caught_as_score_lost():
    """The mutant of the bug class: an outcome reward on a masked tail token (an observation, an EOS under the mask)
    is lost to training. The kind's own `score-kept` catches it (the moved score does not reach row 0's trainable
    tokens), as does `reference`; both are diagnosed `score-lost`, which breaks universal:score-kept (a defect where
    the pipeline can end a response on a masked token)."""
    mutant = _as_target({"score_at": "last-attended"})
    declared = Declared(kind="token-reward", masked_zero=True)
    verdicts = {v.property: v for v in judge(mutant, CASE, declared)}
    kept, ref = verdicts["score-kept"], verdicts["reference"]
    # row 0's score 2 moves by -4 (towards 0, 2^ceil(log2 3)): the twin's last trainable token should be the case's
    # 0.01 moved by -4; it stays 0.01 (the move went to the masked tail)
    assert kept.failed and kept.positions == [[0, 1]] and kept.expected == [0.01 - 4] and kept.observed == [0.01], kept
    assert ref.failed and ref.positions == [[0, 1]] and ref.expected == [2.01] and ref.observed == [0.01], ref
    assert not verdicts["poison"].failed and not verdicts["permutation"].failed
    assert diagnose(mutant, CASE, declared, "score-kept").mechanism == "score-lost"
    assert diagnose(mutant, CASE, declared, "reference").mechanism == "score-lost"
    result = fuzz_target(mutant, declared, target="mutant", max_examples=150, sizes=Sizes(6, 16))
    found = {f.property: f for f in result.findings}
    assert {"score-kept", "reference"} <= set(found), [(f.property, f.verdict.message) for f in result.findings]
    shrunk = found["reference"].case
    assert diagnose(mutant, shrunk, declared, "reference").mechanism == "score-lost"
    for prop in ("score-kept", "reference"):
        promise = broken(prop, "score-lost", kind="token-reward")
        assert promise is not None and promise.id == "universal:score-kept", promise
        assert broken(prop, "score-lost", kind="token-reward", reach="api") is None  # no pipeline witness: a fact
    # the standalone reproducer's check is the judge's: the reference at the shrunk case
    check = build_kind_check(shrunk, "reference", declared)
    assert check.data["kind"] == "expected" and set(check.data["outputs"]) == {"reward"}
    # the correct placement on the same shrunk case passes both
    fixed = {v.property: v for v in judge(_as_target({}), shrunk, declared)}
    assert fixed["reference"].status == fixed["score-kept"].status == "pass"


def test_the_reproducer_checks_score_kept_by_moving_the_score():
    """`score-kept` has a standalone check (`fuzz/repro_kinds.py`, the template's `check_moved`): TWIN is the case
    with each row's score moved, and the sum of each trainable row's rewards must move with it. The script's
    check gives the judge's verdict: reproduced on the last-attended mutant (row 0's move goes to its masked
    tail), fixed on the correct placement; a case without a trainable token has no check."""
    declared = Declared(kind="token-reward", masked_zero=True)
    check = build_kind_check(CASE, "score-kept", declared)
    assert check.data["kind"] == "moved" and check.data["output"] == "reward"
    # row 0's score 2 moves by -4, row 1's -30 by +32; row 2 has no trainable token: not judged
    assert check.data["moves"] == [-4.0, 32.0, 0.0] and check.twin.score.tolist() == [-2.0, 2.0, -3.0]
    mutant = _as_target({"score_at": "last-attended"})
    assert script_verdict(mutant, check, "token-reward") == "reproduced"
    assert script_verdict(_as_target({}), check, "token-reward") == "fixed"
    empty = CASE.replace(trainable=torch.zeros_like(CASE.trainable))
    with pytest.raises(repro_check.Unsupported, match="no row has a trainable token"):
        build_kind_check(empty, "score-kept", declared)


def test_score_kept_holds_whatever_variant_is_declared():
    """Declaring the lossy placement as the variant makes `reference` pass (a semantics fact) but not `score-kept`:
    the universal invariant does not depend on the variant. A clip that absorbs the move is n/a, not a pass."""
    lossy = {"score_at": "last-attended"}
    verdicts = {v.property: v for v in judge(_as_target(lossy), CASE, Declared(kind="token-reward", variant=lossy))}
    assert verdicts["reference"].status == "pass" and verdicts["score-kept"].failed
    clip = {"score_clip": (2.0, 2.0)}  # every score clipped to 2: no move reaches any row
    verdicts = {v.property: v for v in judge(_as_target(clip), CASE, Declared(kind="token-reward", variant=clip))}
    assert verdicts["score-kept"].status == "n/a" and verdicts["reference"].status == "pass"


# the frameworks' entries, from the release wheels (cached by the suite; network marker as the target tests)
ENTRIES = [("openrlhf", "0.11.2"), ("openrlhf", "0.3.6.post1"), ("torchtune", "0.6.1")]
FW_CASE = CASE.replace(dtype="float32")


@pytest.mark.network
@pytest.mark.parametrize("target,pin", ENTRIES, ids=[f"{t}@{p}" for t, p in ENTRIES])
def test_each_framework_entry_runs_its_own_code_by_hand(target, pin):
    """kl_coef 0.01 at both. OpenRLHF clamps the score to [-10, 10] (the CLI default reward_clip_range; built in at
    0.3.6.post1); torchtune does not clip. Neither masks the KL (OpenRLHF 0.3.6.post1 multiplies the log-ratio by
    the mask: 0 there), and OpenRLHF puts an actionless row's score at T - 1 (masked; not judged)."""
    with open_target(f"{target}:token-reward@{pin}") as h:
        (got,) = h.run(FW_CASE)
        verdicts = {v.property: v for v in judge(h.run, FW_CASE, h.declared)}
    clip = target == "openrlhf"
    row1_score = -10.0 if clip else -30.0
    assert got[0, :2].tolist() == pytest.approx([-0.005, -(0.01 * -1.0) + 2.0], rel=1e-6)
    assert got[1, [1, 3]].tolist() == pytest.approx([-0.0025, -0.02 + row1_score], rel=1e-6)
    masked_kl = 0.0 if pin == "0.3.6.post1" else -0.07
    assert float(got[0, 2]) == pytest.approx(masked_kl, abs=1e-6)  # the masked tail: the unmasked KL term (or 0)
    if target == "openrlhf":
        assert float(got[2, 3]) == pytest.approx(5.0 + (0.0 if pin == "0.3.6.post1" else -0.01), rel=1e-6)
    failed = {p for p, v in verdicts.items() if v.failed}
    assert not failed, {p: verdicts[p].message for p in failed}
    assert verdicts["reference"].status == verdicts["poison"].status == verdicts["score-kept"].status == "pass"
    assert verdicts["masked-zero"].status == "n/a"  # no promise of zeros at masked positions

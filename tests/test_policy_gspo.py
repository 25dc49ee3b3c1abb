"""The policy-loss kind's sequence-level ratio (GSPO, `ratio="sequence"` / `"sequence-mean"`): the float64
reference by hand, where it parts from the token ratio, and mutants the judge must catch."""

from __future__ import annotations

import math

import pytest
import torch

from maskfuzz.fuzz.engine import fuzz_target
from maskfuzz.oracles.case import Case
from maskfuzz.oracles.declared import Declared
from maskfuzz.oracles.kinds import policy_loss
from maskfuzz.oracles.strategies import Sizes
from maskfuzz.targets.adapters.loss_step import run_step

NAN = float("nan")
# row 0: two trained tokens, log-ratios 0 and 0.2 (mean 0.1: s = e^0.1 = 1.105, inside [0.8, 1.2]; the token ratios
# are 1 and e^0.2 = 1.221, the second clipped), advantages 1 and 3, a masked NaN; row 1 wholly masked (NaN log-probs)
CASE = Case.build(
    trainable=[[1, 1, 0], [0, 0, 0]],
    extra={
        "logp": [[-1.0, -0.8, NAN], [NAN, NAN, NAN]],
        "old_logp": [[-1.0, -1.0, NAN], [NAN, -1.0, NAN]],
        "adv": [[1.0, 3.0, NAN], [NAN, 2.0, NAN]],
    },
    dtype="float64",
)
S = math.exp(0.1)


@pytest.mark.parametrize("vectorised", [False, True])
def test_sequence_ratio_by_hand(vectorised):
    seq = policy_loss.reference(CASE, {"ratio": "sequence"}, vectorised=vectorised)
    # token-mean over the 2 tokens: (-1 * s - 3 * s) / 2; straight-through: each token its own -A s / 2
    assert seq["loss"][0, 0].item() == pytest.approx(-4 * S / 2)
    assert seq["grad"].flatten().tolist() == pytest.approx([-S / 2, -3 * S / 2, 0.0, 0.0, 0.0, 0.0])
    mean = policy_loss.reference(CASE, {"ratio": "sequence-mean"}, vectorised=vectorised)
    assert mean["loss"][0, 0].item() == pytest.approx(-4 * S / 2)
    # through the mean: each trained token of the row gets (1/2) * (-S/2 - 3S/2) = -S
    assert mean["grad"].flatten().tolist() == pytest.approx([-S, -S, 0.0, 0.0, 0.0, 0.0])
    token = policy_loss.reference(CASE, {}, vectorised=vectorised)
    # the token ratio: r = 1 (loss -1, slope -1/2) and r = e^0.2 clipped at 1.2 (loss -3.6, slope 0)
    assert token["loss"][0, 0].item() == pytest.approx((-1 - 3.6) / 2)
    assert token["grad"][0].tolist() == pytest.approx([-0.5, 0.0, 0.0])


def test_the_sequence_forms_agree_on_row_advantages_and_the_cap_stops_the_gradient():
    rows = CASE.replace(score=torch.tensor([2.0, 1.0]))
    a = policy_loss.reference(rows, {"ratio": "sequence", "advantages": "row"})
    b = policy_loss.reference(rows, {"ratio": "sequence-mean", "advantages": "row"})
    assert torch.allclose(a["grad"], b["grad"]) and torch.allclose(a["loss"], b["loss"])
    capped = policy_loss.reference(CASE, {"ratio": "sequence", "seq_log_ratio_max": 0.05, "clip_high": 10.0})
    assert capped["loss"][0, 0].item() == pytest.approx(-4 * math.exp(0.05) / 2)
    assert capped["grad"].abs().sum().item() == 0.0  # clamp(max=...) has slope 0 where it binds
    with pytest.raises(ValueError):
        policy_loss.options({"ratio": "token", "seq_log_ratio_max": 10.0})


def _gspo(mean_over_all: bool):
    """verl's straight-through GSPO driven through a step; `mean_over_all`: the mutant whose sequence ratio
    averages the log-ratio over every position of the row, masked ones included (zeroed first)."""

    def micro(rows, logp, mask, step):
        dt, live = logp.dtype, mask > 0
        zero = torch.zeros((), dtype=dt)
        old = step.case.extra["old_logp"][rows].to(dt)
        adv = step.case.extra["adv"][rows].to(dt)
        lp, old, adv = (torch.where(live, x, zero) for x in (logp, old, adv))
        n = torch.full_like(live.sum(-1), live.shape[-1]) if mean_over_all else live.sum(-1).clamp(min=1)
        seq = ((lp - old).sum(-1) / n).detach()[:, None]
        r = torch.exp(lp - lp.detach() + seq)
        per = torch.maximum(-adv * r, -adv * r.clamp(0.8, 1.2))
        return torch.where(live, per, zero).sum() / max(step.tokens, 1) * step.ranks

    return lambda case: run_step(case, "cpu", micro, leaf_name="logp")


gspo_correct = _gspo(False)
gspo_mean_over_all_positions = _gspo(True)
SEQ = {"clip_low": 0.2, "ratio": "sequence"}


@pytest.mark.parametrize(
    ("fn", "variant", "want"),
    [
        (gspo_correct, SEQ, set()),
        (gspo_mean_over_all_positions, SEQ, {"reference"}),  # also pad-invariance: a padding column moves it
        (gspo_correct, {"clip_low": 0.2}, {"reference"}),  # the token reference does not hold for GSPO
    ],
    ids=["correct", "mutant-mean-over-all-positions", "token-reference-rejects-gspo"],
)
def test_gspo_mutants_are_caught(fn, variant, want):
    declared = Declared(kind="policy-loss", variant=variant, masked_zero=True)
    result = fuzz_target(fn, declared, target="zoo-gspo", max_examples=60, sizes=Sizes(4, 8), seed=0)
    found = {f.property for f in result.findings}
    if not want:
        assert not found, [(f.property, f.verdict.message) for f in result.findings]
    assert want <= found, found
    assert result.checked["reference"] > 0

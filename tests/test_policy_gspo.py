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
from maskfuzz.targets.runtime.repos import parse_repos
from maskfuzz.targets.runtime.session import open_target

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


# ---- the hand-written policy-gspo entries on the real upstream code (release wheels) ----------------------------
# row 0: log-ratios 0.1 and -0.1 (mean 0: s = 1, inside every clip range; the token ratios e^+-0.1 are outside verl's
# 3e-4 / 4e-4), advantages 1 and -2; row 1: log-ratios 0.05, 0.05, -0.04 (s = e^0.02), advantages 0.5, 1, -1; float32
# (slime's and miles' dtype); the per-token advantages tell the straight-through form from the gradient through the mean
STEP = Case.build(
    trainable=[[1, 1, 0], [1, 1, 1]],
    extra={
        "old_logp": [[-1.0, -1.0, -1.0], [-0.5, -1.5, -2.0]],
        "logp": [[-0.9, -1.1, -1.0], [-0.45, -1.45, -2.04]],
        "adv": [[1.0, -2.0, 0.0], [0.5, 1.0, -1.0]],
    },
    score=[1.0, -1.0],
    group=[0, 0],
    dtype="float32",
)
WHEELS = {  # entry -> (its function's place, the ratio form the entry declares)
    "verl:policy-gspo@0.9.1": ("core_algos.py::compute_policy_loss_gspo", "sequence"),
    "skyrl:policy-gspo@0.3.1": ("ppo_utils.py::gspo_policy_loss", "sequence"),
    "trl:policy-gspo@1.16.0": ("grpo_trainer.py::GRPOTrainer", "sequence-mean"),
    "miles:policy-gspo@0.0.2": ("loss.py::policy_loss_function", "sequence-mean"),
}


def _check_gspo(target: str, where: str, ratio: str, repos=None) -> None:
    with open_target(target, repos=repos) as h:
        assert where in h.info["where"], h.info["where"]
        assert h.declared.variant["ratio"] == ratio
        loss, grad = h.run(STEP)
    ref = policy_loss.reference(STEP, h.declared.variant)
    assert float(loss[0, 0]) == pytest.approx(float(ref["loss"][0, 0]), rel=1e-5, abs=1e-6)
    assert grad.double().flatten().tolist() == pytest.approx(ref["grad"].flatten().tolist(), rel=1e-5, abs=1e-6)
    token = policy_loss.reference(STEP, {**h.declared.variant, "ratio": "token", "seq_log_ratio_max": None})
    assert not torch.allclose(grad.double(), token["grad"], atol=1e-4)  # the token ratio's gradient is not GSPO's
    if h.declared.variant["advantages"] == "token":  # per-token advantages: the two sequence forms differ here
        other = "sequence-mean" if ratio == "sequence" else "sequence"
        alt = policy_loss.reference(STEP, {**h.declared.variant, "ratio": other})
        assert not torch.allclose(grad.double(), alt["grad"], atol=1e-4)


@pytest.mark.network
@pytest.mark.parametrize("target", list(WHEELS))
def test_policy_gspo_entries_run_the_wheels_sequence_ratio(target):
    _check_gspo(target, *WHEELS[target])


def test_slime_policy_gspo_runs_the_git_pin_sequence_ratio():
    repos = parse_repos(None)
    if "slime" not in repos:
        pytest.skip("slime has no release: set MASKFUZZ_REPOS=slime=/path/to/slime-clone-or-mirror")
    _check_gspo("slime:policy-gspo@624b824a8", "loss.py::policy_loss_function", "sequence-mean", repos=repos)

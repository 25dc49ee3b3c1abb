"""The policy-loss kind's optional rollout-engine log-probs (`extra["rollout_logp"]`, `Domain.rollout_logprobs`):
drawn only where a domain asks, near `old_logp` at trainable positions, poison under the mask; a mutant importance-
sampling loss that reads them unmasked is caught by `poison`. The NeMo-RL part (its importance-sampling correction
and truncations reading them as generation_logprobs) runs when MASKFUZZ_REPOS names a nemo-rl mirror.

The two loss functions below are test input (a deliberately buggy one named as a mutant, and its correct form),
not upstream code."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings

from maskfuzz.fuzz.engine import fuzz_target
from maskfuzz.oracles.case import Case
from maskfuzz.oracles.declared import Declared
from maskfuzz.oracles.domain import Domain
from maskfuzz.oracles.kinds import spec
from maskfuzz.oracles.kinds.dispatch import judge
from maskfuzz.oracles.kinds.policy_loss import INPUTS, ROLLOUT
from maskfuzz.oracles.kinds.policy_loss.strategies import MISMATCH
from maskfuzz.oracles.kinds.strategies import kind_cases
from maskfuzz.oracles.strategies import Sizes
from maskfuzz.targets import discovery
from maskfuzz.targets.adapters.loss_step import run_step
from maskfuzz.targets.miles import calls_kinds as miles_calls
from maskfuzz.targets.miles import discover as miles_discover
from maskfuzz.targets.nemo_rl.calls_kinds import ROLLOUT as NEMO_ROLLOUT
from maskfuzz.targets.registry import get
from maskfuzz.targets.runtime.repos import parse_repos
from maskfuzz.targets.slime import discover as slime_discover

_FEW = settings(
    max_examples=40, derandomize=True, database=None, deadline=None, suppress_health_check=list(HealthCheck)
)
ASKS = Domain(rollout_logprobs=True)


def _draws(domain: Domain) -> list[Case]:
    seen: list[Case] = []

    @_FEW
    @given(kind_cases("policy-loss", domain, Sizes(5, 12)))
    def collect(case):
        seen.append(case)

    collect()
    return seen


def test_rollout_logp_is_drawn_only_where_the_domain_asks():
    assert all(ROLLOUT not in c.extra for c in _draws(Domain()))
    drawn = _draws(ASKS)
    assert all(ROLLOUT in c.extra for c in drawn)
    moved = 0
    for c in drawn:
        live = c.trainable
        rl, old = c.extra[ROLLOUT][live], c.extra["old_logp"][live]
        assert bool(torch.isfinite(rl).all()) and bool((rl <= 0).all())
        # near the trainer's old policy: the largest mismatch drawn, plus the dtype's rounding of both
        assert bool(((rl - old).abs() <= max(MISMATCH) + 0.05 * (1 + old.abs())).all()), c
        moved += int(bool((rl != old).any()))
    assert moved > 0  # some cases carry a mismatch for a truncation to cut


def test_rollout_logp_is_a_poisoned_input_and_no_narrowing_of_the_domain():
    assert ROLLOUT in INPUTS and ROLLOUT in spec("policy-loss").poisoned
    assert ASKS.restrictions() == {} and ASKS.cited() == []  # an input the function takes, not a narrowing
    assert any(bool((c.extra[ROLLOUT][~c.trainable] != 0).any()) for c in _draws(ASKS))  # poison under the mask
    # where masked log-probs are log-probabilities (`masked_logprobs` False), the engine's are too
    for c in _draws(Domain(masked_logprobs=False, rollout_logprobs=True, why={"masked_logprobs": "log-softmax"})):
        rl = c.extra[ROLLOUT]
        assert bool((rl[torch.isfinite(rl)] <= 0).all()), c


# -- an importance-sampling-corrected loss: w = exp(old_logp - rollout_logp), token-mean of w * (-A r) ---------------
def _is_loss(masked_weights: bool):
    """`masked_weights` False is the mutant: the weights are self-normalised by their mean over every position of
    the micro-batch, masked ones included (the poison under the mask reaches every trainable token). The correct
    form weighs each trainable token by its own ratio: a per-micro-batch normaliser would break split-invariance by
    design, which the correct form must not."""

    def micro(rows, logp, mask, step):
        dt, live = logp.dtype, mask > 0
        zero = torch.zeros((), dtype=dt)
        old, adv, rollout = (step.case.extra[n][rows].to(dt) for n in ("old_logp", "adv", ROLLOUT))
        logp, old, adv = (torch.where(live, x, zero) for x in (logp, old, adv))
        if masked_weights:
            w = torch.where(live, torch.exp(old - torch.where(live, rollout, zero)), zero)
        else:
            w = torch.exp(old - rollout)
            w = w / w.mean()
        per_token = w.detach() * -adv * torch.exp(logp - old)
        return torch.where(live, per_token, zero).sum() / max(step.tokens, 1) * step.ranks

    return lambda case: run_step(case, "cpu", micro, leaf_name="logp")


is_loss_correct = _is_loss(masked_weights=True)
is_loss_mutant_reads_rollout_logp_unmasked = _is_loss(masked_weights=False)
INVARIANTS_ONLY = Declared(kind="policy-loss", reference=False, masked_zero=True, domain=ASKS)


def test_a_mutant_reading_rollout_logp_under_the_mask_is_caught_by_poison():
    rows = [[1, 1, 0, 0]]
    case = Case.build(
        trainable=rows,
        attention=rows,
        dtype="float64",
        extra={
            "logp": [[-1.0, -0.5, 0.0, 0.0]],
            "old_logp": [[-1.1, -0.5, 0.0, 0.0]],
            "adv": [[1.0, -1.0, 0.0, 0.0]],
            ROLLOUT: [[-1.0, -0.6, -50.0, 30.0]],  # poison under the mask
        },
    )
    bad = {v.property: v for v in judge(is_loss_mutant_reads_rollout_logp_unmasked, case, INVARIANTS_ONLY)}
    assert bad["poison"].failed, bad["poison"]
    good = {v.property: v for v in judge(is_loss_correct, case, INVARIANTS_ONLY)}
    assert not any(v.failed for v in good.values()), [v for v in good.values() if v.failed]


def test_fuzzing_finds_the_mutant_and_passes_the_correct_form():
    kw = dict(max_examples=60, sizes=Sizes(5, 12))
    found = {
        f.property
        for f in fuzz_target(is_loss_mutant_reads_rollout_logp_unmasked, INVARIANTS_ONLY, target="m", **kw).findings
    }
    assert "poison" in found, found
    clean = fuzz_target(is_loss_correct, INVARIANTS_ONLY, target="c", **kw).findings
    assert not clean, [(f.property, f.verdict.message) for f in clean]


# -- NeMo-RL: the importance-sampling entries read rollout_logp as generation_logprobs ------------------------------
_HEAD = "7ea279abfbeb"
_IS = "loss:use_importance_sampling_correction=true"
_TIS = ("tis", "icepop", "seq-mask-tis")


def test_the_nemo_rl_importance_sampling_entries_ask_for_rollout_logprobs():
    spec_ = get("nemo-rl")
    for entry in (_IS, *(f"loss:truncated_importance_sampling_type={t}" for t in _TIS)):
        assert spec_.declared(entry).domain.rollout_logprobs, entry
    assert not spec_.declared("loss:use_cispo=true").domain.rollout_logprobs
    assert not spec_.declared("policy-loss").domain.rollout_logprobs  # the hand-written entry draws as before
    assert NEMO_ROLLOUT == ROLLOUT  # the worker's literal (a standalone repro imports no maskfuzz) is the kind's name


def test_nemo_rl_generation_logprobs_are_the_cases_rollout_logp():
    from maskfuzz.targets.nemo_rl.calls_discovered import load
    from maskfuzz.targets.runtime.acquire import acquire

    repos = parse_repos(None)
    if "nemo-rl" not in repos:
        pytest.skip("git-only upstream: set MASKFUZZ_REPOS=nemo-rl=/path/to/NVIDIA-NeMo-RL-clone to test the real code")
    root = acquire(get("nemo-rl"), _HEAD, repos).root
    found = {v.entry: v for v in discovery.discover("nemo-rl", root)}
    rows = [[1, 1, 1, 0]]
    base = {"logp": [[-1.0, -0.5, -2.0, 0.0]], "old_logp": [[-1.0, -0.5, -2.0, 0.0]], "adv": [[1.0, 1.0, 1.0, 0.0]]}

    def loss(entry: str, rollout) -> float:
        case = Case.build(trainable=rows, attention=rows, dtype="float32", extra={**base, ROLLOUT: rollout})
        return float(load(root, entry).run(case, "cpu")[0][0, 0])

    same = [[-1.0, -0.5, -2.0, 0.0]]
    far = [[-1.7, -0.5, -2.0, 0.0]]  # weight exp(0.7) ~ 2.01 at token 0: past tis's 2.0, inside icepop's [0.5, 5]
    assert found[_IS].callable and loss(_IS, same) != loss(_IS, far)  # the weights are read
    tis = "loss:truncated_importance_sampling_type=tis"
    assert found[tis].callable and loss(tis, far) == pytest.approx(-(2.0 + 1.0 + 1.0) / 3, rel=1e-5)  # clamped at 2
    seq = "loss:truncated_importance_sampling_type=seq-mask-tis"
    assert found[seq].callable and loss(seq, far) == 0.0  # the row's geometric-mean weight is outside [0.999, 1.002]
    assert not found["loss:truncated_importance_sampling_ratio"].callable


def test_slime_and_miles_switch_entries_draw_the_rollout_log_probs_and_hand_them_over():
    """A switch of slime / miles (TIS, OPSM) asks for the rollout engine's log-probs (its recipe's domain), and the
    per-sample `rollout_log_probs` miles' and slime's loss read are the drawn ones, cut like the old log-probs; without
    them, the derived `old - (logp - old) / 2`."""
    for mod in (miles_discover, slime_discover):
        assert mod.recipe("switch:use_tis")["domain"].rollout_logprobs
        assert not mod.recipe("policy:gspo")["domain"].rollout_logprobs
    case = Case.build(
        attention=[[0, 1, 1, 1]],
        trainable=[[0, 1, 1, 0]],
        extra={"logp": [[-1.0, -2.0, -3.0, -4.0]], "old_logp": [[-1.0, -2.5, -3.5, -4.0]],
               "rollout_logp": [[-9.0, -2.25, -3.25, -4.5]], "adv": [[0.0, 1.0, 1.0, 0.0]]},
    )  # fmt: skip
    pbatch = {"log_probs": [torch.tensor([-2.5, -3.5, -4.0])]}
    got = miles_calls.with_rollout_log_probs(case, torch.tensor([0]), pbatch)["rollout_log_probs"][0]
    assert got.tolist() == [-2.25, -3.25, -4.5]  # the row's real tokens from its first one
    derived = case.replace(extra={k: v for k, v in case.extra.items() if k != "rollout_logp"})
    got = miles_calls.with_rollout_log_probs(derived, torch.tensor([0]), pbatch)["rollout_log_probs"][0]
    assert got.tolist() == [-2.5 - (-2.0 + 2.5) / 2, -3.5 - (-3.0 + 3.5) / 2, -4.0]


def test_a_domain_of_log_probabilities_rejects_a_rollout_logp_that_is_none():
    """Where masked log-probs must be log-probabilities, the rollout engine's are judged by the same rule: a positive
    one under the mask puts the case outside the domain (and the strategy's finish keeps drawn ones inside)."""
    domain = Domain(masked_logprobs=False, rollout_logprobs=True, why={"masked_logprobs": "log-softmax"})
    rows = [[1, 1, 0]]
    extra = {"logp": [[-1.0, -1.0, -1.0]], "old_logp": [[-1.0, -1.0, -1.0]], "adv": [[1.0, 1.0, 0.0]]}
    fine = Case.build(trainable=rows, attention=rows, extra={**extra, ROLLOUT: [[-1.0, -1.0, -1.5]]})
    bad = Case.build(trainable=rows, attention=rows, extra={**extra, ROLLOUT: [[-1.0, -1.0, 30.0]]})
    assert domain.rejects(fine) is None
    assert "not a log-probability" in (domain.rejects(bad) or "")

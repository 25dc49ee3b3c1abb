"""The reference oracles: the spec's worked examples, loops vs vectorised, whitening."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from maskfuzz.oracles.case import Case
from maskfuzz.oracles.kinds.gae.reference import (
    CONTRACTS,
    LOOPS,
    VECTORISED,
    compressed_loop,
    dense_loop,
    discounted_suffix_sum,
    reference,
)
from maskfuzz.oracles.whitening import Whitening, masked_whiten

IMPLS = [(c, f) for c in ("compressed", "dense") for f in (LOOPS[c], VECTORISED[c])]


def _case(**kw) -> Case:
    kw.setdefault("dtype", "float64")
    return Case.build(**kw)


# -- the spec's three worked examples, to the digits given there --------------------------------
@pytest.mark.parametrize("contract,impl", IMPLS, ids=lambda x: getattr(x, "__name__", x))
def test_example_1_masked_padding_poison(contract, impl):
    case = _case(trainable=[[1, 1, 0]], token_rewards=[[0, 1, 0]], values=[[0, 0, 100]], gamma=1, lam=0.95)
    adv, ret = impl(case)
    assert adv[0].tolist() == pytest.approx([0.95, 1.0, 0.0], abs=1e-12)
    assert ret[0].tolist() == pytest.approx([0.95, 1.0, 0.0], abs=1e-12)


@pytest.mark.parametrize("contract,impl", IMPLS, ids=lambda x: getattr(x, "__name__", x))
def test_example_2_gap(contract, impl):
    case = _case(trainable=[[1, 0, 0, 1]], score=[1], values=[[0.5, 9, 9, 0.25]], gamma=0.9, lam=0.8)
    adv, ret = impl(case)
    if contract == "compressed":
        assert adv[0].tolist() == pytest.approx([0.265, 0, 0, 0.75], abs=1e-12)
        assert ret[0].tolist() == pytest.approx([0.765, 0, 0, 1.0], abs=1e-12)
    else:
        assert adv[0].tolist() == pytest.approx([-0.103424, 0, 0, 0.75], abs=1e-12)
        assert ret[0].tolist() == pytest.approx([0.396576, 0, 0, 1.0], abs=1e-12)


@pytest.mark.parametrize("contract,impl", IMPLS, ids=lambda x: getattr(x, "__name__", x))
def test_example_3_observation_tail_gamma0(contract, impl):
    case = _case(trainable=[[1, 1, 1, 0, 0]], attention=[[1, 1, 1, 1, 1]], score=[1], gamma=0, lam=0.95)
    adv, _ = impl(case)
    assert adv.tolist() == [[0.0, 0.0, 1.0, 0.0, 0.0]]


def test_all_masked_row_is_zero_and_drops_score():
    case = _case(trainable=[[0, 0, 0], [1, 1, 0]], score=[5, 1], values=[[3, 3, 3], [0, 0, 0]], gamma=1, lam=1)
    for impl in (compressed_loop, dense_loop):
        adv, ret = impl(case)
        assert adv[0].tolist() == [0, 0, 0] and ret[0].tolist() == [0, 0, 0]
        assert adv[1].tolist() == [1, 1, 0]


@pytest.mark.parametrize("impl", [LOOPS["segment"], VECTORISED["segment"]], ids=lambda f: f.__name__)
def test_segment_by_hand(impl):
    """Two turns {0, 1} and {4, 5}: a turn's reward is the sum of its tokens' rewards (the score joins the
    last), its value the value at its first token, one discount per turn; every token of a turn gets its value."""
    case = _case(
        trainable=[[1, 1, 0, 0, 1, 1, 0]],
        token_rewards=[[0.5, 1, 9, 9, 0, 2, 9]],
        score=[1],
        values=[[1, 7, 9, 9, 2, 5, 9]],
        gamma=0.9,
        lam=0.5,
    )
    adv, ret = impl(case)
    # turn 1: delta = 3 - 2 = 1; turn 0: delta = 1.5 + 0.9 * 2 - 1 = 2.3, A = 2.3 + 0.45 * 1
    assert adv[0].tolist() == pytest.approx([2.75, 2.75, 0, 0, 1, 1, 0], abs=1e-12)
    assert ret[0].tolist() == pytest.approx([3.75, 3.75, 0, 0, 3, 3, 0], abs=1e-12)
    returns = impl(case.replace(values=torch.zeros(1, 7, dtype=torch.float64), lam=1.0))[1]
    assert returns[0].tolist() == pytest.approx([4.2, 4.2, 0, 0, 3, 3, 0], abs=1e-12)  # 1.5 + 0.9 * 3
    # masking token 1 drops its reward and leaves turn 0 one token: the returns at lam = 1 are 0.5 + 0.9 * 3
    split = impl(case.replace(trainable=torch.tensor([[1, 0, 0, 0, 1, 1, 0]], dtype=torch.bool), lam=1.0))[1]
    assert split[0].tolist() == pytest.approx([3.2, 0, 0, 0, 3, 3, 0], abs=1e-12)


def test_nonfinite_poison_is_selected_out():
    nan, inf = float("nan"), float("inf")
    case = _case(
        trainable=[[1, 0, 1, 0]], values=[[1, nan, 2, -inf]], token_rewards=[[0, inf, 1, nan]], gamma=0.9, lam=0.9
    )
    for contract in CONTRACTS:
        for impl in (LOOPS[contract], VECTORISED[contract]):
            adv, ret = impl(case)
            assert torch.isfinite(adv).all() and torch.isfinite(ret).all()


# -- vectorised == loops -------------------------------------------------------------------------
@st.composite
def random_cases(draw, max_b=8, max_t=300):
    b = draw(st.integers(1, max_b))
    t = draw(st.integers(1, max_t))
    seed = draw(st.integers(0, 2**31 - 1))
    p = draw(st.sampled_from([0.0, 0.1, 0.5, 0.9, 1.0]))
    g = torch.Generator().manual_seed(seed)
    trainable = torch.rand(b, t, generator=g) < p
    gamma = draw(st.sampled_from([0.0, 1.0, 0.5, 0.99, 1e-4]))
    lam = draw(st.sampled_from([0.0, 1.0, 0.95, 0.5, 1e-4]))
    return Case(
        attention=torch.ones(b, t, dtype=torch.bool),
        trainable=trainable,
        token_rewards=torch.randn(b, t, generator=g, dtype=torch.float64),
        values=torch.randn(b, t, generator=g, dtype=torch.float64) * 10,
        score=torch.randn(b, generator=g, dtype=torch.float64),
        gamma=gamma,
        lam=lam,
        dtype="float64",
    )


def _close(a: torch.Tensor, b: torch.Tensor, scale: torch.Tensor) -> bool:
    return bool(((a - b).abs() <= 1e-10 * (1 + scale)).all())


@settings(max_examples=60, deadline=None)
@given(random_cases())
def test_vectorised_equals_loops(case):
    for contract in CONTRACTS:
        la, lr = LOOPS[contract](case)
        va, vr = VECTORISED[contract](case)
        scale = case.values.abs().sum() + case.token_rewards.abs().sum() + case.score.abs().sum()
        assert _close(la, va, scale) and _close(lr, vr, scale)


@pytest.mark.parametrize("b,t", [(64, 4096), (3, 4095), (1, 4097)])
def test_vectorised_equals_loops_large(b, t):
    g = torch.Generator().manual_seed(b * t)
    case = Case(
        attention=torch.ones(b, t, dtype=torch.bool),
        trainable=torch.rand(b, t, generator=g) < 0.8,
        token_rewards=torch.randn(b, t, generator=g, dtype=torch.float64),
        values=torch.randn(b, t, generator=g, dtype=torch.float64),
        score=torch.randn(b, generator=g, dtype=torch.float64),
        gamma=0.999,
        lam=0.97,
        dtype="float64",
    )
    rows = list(range(0, b, max(1, b // 4)))  # the loops are slow: check a spread of rows
    sub = case.replace(
        attention=case.attention[rows],
        trainable=case.trainable[rows],
        token_rewards=case.token_rewards[rows],
        values=case.values[rows],
        score=case.score[rows],
    )
    for contract in CONTRACTS:
        va, vr = VECTORISED[contract](case)
        la, lr = LOOPS[contract](sub)
        assert torch.allclose(va[rows], la, rtol=1e-11, atol=1e-9)
        assert torch.allclose(vr[rows], lr, rtol=1e-11, atol=1e-9)


@pytest.mark.parametrize("c", [0.0, 1e-9, 0.5, 0.999, 1.0])
def test_discounted_suffix_sum_matches_serial(c):
    g = torch.Generator().manual_seed(1)
    delta = torch.randn(3, 200, generator=g, dtype=torch.float64)
    out = discounted_suffix_sum(delta, c, chunk=16)
    acc = torch.zeros(3, dtype=torch.float64)
    for t in reversed(range(200)):
        acc = delta[:, t] + c * acc
        assert torch.allclose(out[:, t], acc, rtol=1e-12, atol=1e-12)


def test_reference_rejects_unknown_contract():
    with pytest.raises(ValueError, match="unknown contract"):
        reference(_case(trainable=[[1]]), "sparse")


# -- whitening --------------------------------------------------------------------------------
def test_masked_whiten_ignores_masked_positions():
    x = torch.tensor([[1.0, 2.0, 1e9], [3.0, float("nan"), 4.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0], [1, 0, 1]], dtype=torch.bool)
    w = masked_whiten(x, mask, Whitening(unbiased=True, eps=0.0))
    sel = w[mask]
    assert abs(float(sel.mean())) < 1e-12
    assert abs(float(sel.var(unbiased=True)) - 1.0) < 1e-12


def test_masked_whiten_needs_two_positions_when_unbiased():
    x = torch.zeros(1, 3, dtype=torch.float64)
    with pytest.raises(ValueError):
        masked_whiten(x, torch.tensor([[1, 0, 0]], dtype=torch.bool), Whitening(unbiased=True))
    biased = masked_whiten(x, torch.tensor([[1, 0, 0]], dtype=torch.bool), Whitening(unbiased=False))
    assert biased[0, 0] == 0


def test_kl_in_reward_by_hand():
    """r' = r - coef * k(logp - ref_logp) at trainable positions; a NaN log-prob under the mask is selected out."""
    from maskfuzz.oracles.declared import Declared
    from maskfuzz.oracles.kinds.gae.properties import expected_outputs

    nan = float("nan")
    case = _case(
        trainable=[[1, 1, 0]],
        token_rewards=[[0, 0, 7]],
        score=[1],
        gamma=1,
        lam=1,
        extra={"logp": [[-1.0, -0.5, nan]], "ref_logp": [[-1.5, -0.5, -2.0]]},
    )
    k1 = Declared("compressed", kind="returns", variant={"kl_reward": {"coef": 0.1, "estimator": "k1"}})
    adv, ret = expected_outputs(case, k1)
    assert ret[0].tolist() == pytest.approx([0.95, 1.0, 0.0], abs=1e-12)  # -0.1 * 0.5 + 1, then the score alone
    k3 = Declared("compressed", kind="returns", variant={"kl_reward": {"coef": 0.1, "estimator": "k3"}})
    _, ret3 = expected_outputs(case, k3)
    d = 0.5
    assert ret3[0, 0] == pytest.approx(1.0 - 0.1 * (math.exp(-d) - 1 + d), abs=1e-12)
    with pytest.raises(ValueError, match="unknown kl option"):
        expected_outputs(case, Declared("compressed", kind="returns", variant={"kl_reward": {"coef": 1, "x": 2}}))

"""torchtune (`targets/torchtune/`): `torchtune.rlhf` from the release wheels, judged by the oracles.

The values asserted here were computed by hand from torchtune/rlhf/rewards.py and torchtune/rlhf/loss/ppo.py at
0.6.1 (inside the wheel):

* `estimate_advantages`: delta_t = r_t + gamma V_{t+1} - V_t over every position (V = 0 after the window),
  A_t = delta_t + gamma lmbda A_{t+1}, returns = A + V, then `whiten(A, masks)`: (A - mean) * rsqrt(var + 1e-8)
  + mean (shift_mean=True adds the mean back), the mean over n + 1e-8 and the variance with the Bessel correction
  (n + 1e-8) / (n - 1 + 1e-8), both in float32 (the 1e-8 vanishes for n >= 1); A = 0 where masks is False.
* `PPOLoss`: the policy term max(-A r, -A clamp(r, 1 - eps, 1 + eps)) and the value term
  0.5 max((v - R)^2, (clamp(v, v_old - c, v_old + c) - R)^2), each a masked mean (sum(x m) / (sum m + 1e-8)).

Release pins download wheels (network marker).
"""

from __future__ import annotations

import math
import re

import pytest
import torch
from kind_support import handle_cache, verdicts_by_property

from maskfuzz.fuzz.engine import fuzz_target
from maskfuzz.oracles.case import Case
from maskfuzz.targets import registry
from maskfuzz.targets.adapters.base import NotPresent
from maskfuzz.targets.runtime.acquire import acquire
from maskfuzz.targets.runtime.session import open_target
from maskfuzz.targets.torchtune import calls, calls_kinds
from maskfuzz.targets.torchtune import declare as torchtune

PIN = "0.6.1"
EPS = 1e-8


def f32(x: float) -> float:
    """`x` rounded to float32: masked_mean's `mask.sum() + 1e-8` is an int64 tensor plus a float, i.e. a float32
    tensor, so the 1e-8 vanishes for n >= 1 and the Bessel factor (n + 1e-8) / (n - 1 + 1e-8) is a float32 number."""
    return float(torch.tensor(x, dtype=torch.float32))


def masked_stats(xs: list[float]) -> tuple[float, float]:
    """whiten's mean and variance of `xs` (all masked in), as rewards.py:112, 131-135 at 0.6.1 compute them."""
    n = f32(len(xs) + EPS)
    mean = sum(xs) / n
    bessel = float(torch.tensor(n, dtype=torch.float32) / (torch.tensor(n, dtype=torch.float32) - 1))
    return mean, sum((a - mean) ** 2 for a in xs) / n * bessel


@pytest.fixture(scope="module")
def entry():
    """One worker per entry at 0.6.1, opened on first use and kept for the module."""
    with handle_cache(lambda name: open_target(f"torchtune:{name}@{PIN}")) as get:
        yield get


def fuzz(handle, n: int):
    return fuzz_target(
        handle.run, handle.declared, target="torchtune", pin=PIN, max_examples=n, seed=0, derandomize=True, shrink=False
    )


def failed(result) -> set[str]:
    return {p for p, n in result.failed.items() if n}


# ---------------------------------------------------------------------------------------------
# The declaration (no upstream code needed).
# ---------------------------------------------------------------------------------------------
def test_the_folder_registers_a_release_target_with_a_default_pin():
    spec = registry.get("torchtune")
    assert spec.adapter == "maskfuzz.targets.torchtune.calls" and spec.package == "torchtune"
    assert [p.rev for p in spec.default_pins] == ["0.6.1"]
    assert spec.first_run_entries == ("default", "policy-loss")
    assert "torchtune" not in spec.stand_ins and {"torchao", "omegaconf", "datasets"} <= set(spec.stand_ins)
    assert spec.adapter_for("default") == "maskfuzz.targets.torchtune.calls"
    assert {spec.adapter_for(e) for e in spec.entries[1:]} == {"maskfuzz.targets.torchtune.calls_kinds"}
    kinds = ["gae", "normalization", "kl", "token-reward", "policy-loss", "value-loss"]
    assert [spec.kind_of(e) for e in spec.entries] == kinds
    assert all(spec.for_entry(e).pipeline is None for e in spec.entries)  # not researched: reach api


def test_the_gae_domain_keeps_masked_inputs_out_with_a_reason():
    dom = torchtune.SPEC.domain
    assert set(dom.restrictions()) == {"masked_values", "masked_rewards", "nonfinite_poison"}
    assert all("rewards.py:180-181" in why for why in dom.restrictions().values())
    masked_value = Case.build(trainable=[[1, 0]], attention=[[1, 1]], values=[[0.5, 3.0]])
    assert dom.rejects(masked_value)
    gap = Case.build(trainable=[[1, 0, 1]], attention=[[1, 1, 1]])
    assert dom.rejects(gap) is None  # a gap with zero value and reward is a zero transition: the dense recursion


def test_last_trainable_index_places_the_score():
    mask = torch.tensor([[0, 1, 1, 0], [0, 0, 0, 0], [1, 0, 1, 1]], dtype=torch.bool)
    assert calls.last_trainable_index(mask).tolist() == [2, 0, 3]


# ---------------------------------------------------------------------------------------------
# Pins without the function: `load` on a fake tree, in this process.
# ---------------------------------------------------------------------------------------------
def test_a_tree_without_rlhf_is_a_skip(fake_package):
    root = fake_package("torchtune/modules", "peft.py", "X = 1\n")  # 0.2.x: no torchtune/rlhf
    with pytest.raises(NotPresent, match="torchtune.rlhf.rewards"):
        calls.load(root, "default")
    with pytest.raises(NotPresent, match="torchtune.rlhf.rewards .no module"):
        calls_kinds.load(root, "whiten")


def test_a_tree_without_the_padding_masks_is_a_skip(fake_package):
    src = "class PPOLoss:\n    def forward(self, pi_old_logprobs, pi_logprobs, advantages):\n        pass\n"
    root = fake_package("torchtune/rlhf/loss", "ppo.py", src)
    with pytest.raises(NotPresent, match="padding_masks"):
        calls_kinds.load(root, "policy-loss")


# ---------------------------------------------------------------------------------------------
# The citations exist in the wheels.
# ---------------------------------------------------------------------------------------------
def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def _cited_lines(root, cite: str) -> str:
    path, lines = cite.rsplit(":", 1)
    first, _, last = lines.partition("-")
    text = (root / path).read_text().splitlines()
    return _norm(" ".join(text[int(first) - 1 : int(last or first)]))


@pytest.mark.network
@pytest.mark.parametrize("pin", [p.rev for p in torchtune.SPEC.pins])
def test_the_promises_quote_the_wheel(pin):
    root = acquire(torchtune.SPEC, pin).root
    quoted = 0
    for name in torchtune.SPEC.entries:
        for promise in torchtune.SPEC.declared(name, pin).promises:
            there = _cited_lines(root, promise.id.removeprefix("upstream:"))
            for piece in promise.text.split("[...]"):
                assert _norm(piece) in there, (pin, name, promise.id, piece)
            quoted += 1
    assert quoted >= len(torchtune.SPEC.entries)


@pytest.mark.network
def test_the_cited_code_lines_say_what_the_declaration_says():
    new, old = acquire(torchtune.SPEC, "0.6.1").root, acquire(torchtune.SPEC, "0.5.0").root
    assert "advantages[~masks] = 0.0" in _cited_lines(new, "torchtune/rlhf/rewards.py:218")
    assert "advantages[~masks] = 0.0" in _cited_lines(old, "torchtune/rlhf/rewards.py:233")
    assert "+ 1e-8" in _cited_lines(new, "torchtune/rlhf/rewards.py:112")
    assert "+ 1e-8" not in _cited_lines(old, "torchtune/rlhf/rewards.py:116")
    assert "whitened += mean" in _cited_lines(new, "torchtune/rlhf/rewards.py:160")
    assert "values[value_padding_masks] = 0.0" in _cited_lines(new, "recipes/ppo_full_finetune_single_device.py:865")
    assert "loss /= self._gradient_accumulation_steps" in _cited_lines(
        new, "recipes/ppo_full_finetune_single_device.py:1118"
    )
    assert "epsilon: 0.2" in _cited_lines(new, "recipes/configs/mistral/7B_full_ppo_low_memory.yaml:173")


# ---------------------------------------------------------------------------------------------
# 0.6.1 in a worker: hand-computed values.
# ---------------------------------------------------------------------------------------------
GAE_CASE = Case.build(
    trainable=[[1, 1, 0], [1, 1, 1]],
    attention=[[1, 1, 1], [1, 1, 1]],
    token_rewards=[[0.5, 0.0, 0.0], [0.0, 0.25, 0.0]],
    values=[[1.0, 2.0, 0.0], [0.5, 0.5, 0.5]],
    score=[1.0, 2.0],
    gamma=0.9,
    lam=0.8,
    dtype="float64",
)


@pytest.mark.network
def test_gae_by_hand(entry):
    h = entry("default")
    assert h.info["where"] == "torchtune/rlhf/rewards.py::estimate_advantages" and h.resolved == f"torchtune=={PIN}"
    assert "torchtune" not in h.info["stand_ins_used"] and "torchao" in h.info["stand_ins_used"]
    adv, ret = h.run(GAE_CASE)
    # row 0: r = [0.5, 1 (score at the last trainable token), 0]; row 1: r = [0, 0.25, 2]; gamma lmbda = 0.72
    raw = [0.5 + 0.9 * 2 - 1 + 0.72 * (1 + 0 - 2), 1 - 2, -0.05 + 0.72 * (0.2 + 0.72 * 1.5), 0.2 + 0.72 * 1.5, 1.5]
    assert ret[0, :2].tolist() == pytest.approx([raw[0] + 1, raw[1] + 2], abs=1e-12)
    assert ret[1].tolist() == pytest.approx([raw[2] + 0.5, raw[3] + 0.5, raw[4] + 0.5], abs=1e-12)
    mean, var = masked_stats(raw)
    white = [(a - mean) / math.sqrt(var + EPS) + mean for a in raw]  # the mean added back
    assert adv[0].tolist() == pytest.approx([white[0], white[1], 0.0], abs=1e-9)
    assert adv[1].tolist() == pytest.approx(white[2:], abs=1e-9)
    v = verdicts_by_property(h, GAE_CASE)
    assert all(v[p].status == "pass" for p in ("no-crash", "reference", "masked-zero", "row-independence"))


@pytest.mark.network
def test_a_masked_value_enters_the_recursion(entry):
    """The masks select the whitening statistics only: a value at a masked position is the next state's value."""
    h = entry("default")
    case = GAE_CASE.replace(values=torch.tensor([[1.0, 2.0, 7.0], [0.5, 0.5, 0.5]], dtype=torch.float64))
    _, ret = h.run(case)
    _, base = h.run(GAE_CASE)
    # delta_1 gains gamma V_2 and A_2 = delta_2 = -V_2 joins A_1 with gamma lmbda
    assert ret[0, 1].item() == pytest.approx(base[0, 1].item() + 0.9 * 7.0 - 0.72 * 7.0, abs=1e-12)
    assert torchtune.SPEC.domain.rejects(case)  # outside the api domain: the caller zeroes it (recipe :865)


@pytest.mark.network
def test_whiten_adds_the_mean_back(entry):
    x = [[1.0, 2.0, 100.0], [3.0, 4.0, -50.0]]
    case = Case.build(trainable=[[1, 1, 0], [1, 1, 0]], attention=[[1, 1, 1]] * 2, extra={"x": x}, dtype="float64")
    (out,) = entry("whiten").run(case)
    mean, var = masked_stats([1.0, 2.0, 3.0, 4.0])
    expect = [(a - mean) / math.sqrt(var + EPS) + mean for a in (1, 2, 3, 4)]
    assert [out[0, 0].item(), out[0, 1].item(), out[1, 0].item(), out[1, 1].item()] == pytest.approx(expect, abs=1e-9)
    assert verdicts_by_property(entry("whiten"), case)["reference"].status == "pass"


@pytest.mark.network
def test_kl_is_the_log_ratio(entry):
    case = Case.build(trainable=[[1, 1, 0]], extra={"logp": [[-1.0, -3.0, 5.0]], "ref_logp": [[-1.5, -1.0, 0.0]]})
    (kl,) = entry("kl").run(case)
    assert kl[0].tolist() == pytest.approx([0.5, -2.0, 5.0])  # no mask: the masked position keeps its log-ratio


@pytest.mark.network
def test_policy_and_value_loss_by_hand(entry):
    # one micro-batch, two trainable tokens and a masked one; r = exp(logp - old)
    mask = [[1, 1, 0]]
    lp, old, adv = [[0.5, -0.1, 0.0]], [[0.0, 0.0, 0.0]], [[1.0, -2.0, 3.0]]
    case = Case.build(trainable=mask, extra={"logp": lp, "old_logp": old, "adv": adv}, dtype="float64")
    loss, grad = entry("policy-loss").run(case)
    r0, r1 = math.exp(0.5), math.exp(-0.1)
    # token 0: A > 0, r above 1.2: the clipped term -1.2 binds (grad 0); token 1: A < 0, r inside: -A r = 2 r1
    per = [max(-1.0 * r0, -1.0 * 1.2), 2.0 * r1]
    assert loss[0, 0].item() == pytest.approx(sum(per) / f32(2 + EPS), abs=1e-12)
    assert grad[0].tolist() == pytest.approx([0.0, 2.0 * r1 / f32(2 + EPS), 0.0], abs=1e-12)
    v, v_old, ret = [[1.0, 0.0, 9.0]], [[0.5, 0.0, 0.0]], [[0.0, 1.0, 0.0]]
    case = Case.build(trainable=mask, extra={"v": v, "v_old": v_old, "ret": ret}, dtype="float64")
    loss, grad = entry("value-loss").run(case)
    # token 0: v clipped to 0.7, max(1, 0.49) = 1; token 1: (0 - 1)^2 = 1 either way
    assert loss[0, 0].item() == pytest.approx(0.5 * 2 / f32(2 + EPS), abs=1e-12)
    assert grad[0].tolist() == pytest.approx(
        [0.5 * 2 * 1.0 / f32(2 + EPS), 0.5 * 2 * -1.0 / f32(2 + EPS), 0.0], abs=1e-12
    )


@pytest.mark.network
def test_an_empty_micro_batch_is_nan_before_the_eps_and_zero_after(entry):
    """masked_mean divides by mask.sum() up to 0.5.0 (rewards.py:116 there): 0 / 0; from 0.6.0 by mask.sum() + 1e-8."""
    empty = Case.build(
        trainable=[[0, 0]],
        attention=[[1, 1]],
        extra={"logp": [[0.0, 0.0]], "old_logp": [[0.0, 0.0]], "adv": [[1.0, 1.0]]},
    )
    loss, grad = entry("policy-loss").run(empty)
    assert loss.abs().max().item() == 0.0 and grad.abs().max().item() == 0.0
    with open_target("torchtune:policy-loss@0.5.0") as old:
        loss, _ = old.run(empty)
        assert torch.isnan(loss).all()
        assert verdicts_by_property(old, empty)["empty-step"].failed


# ---------------------------------------------------------------------------------------------
# 0.6.1: short fuzz runs of every entry (seeded, derandomised). What they find (all at api reach,
# `pipeline=None`): masked_mean multiplies by the mask, so NaN / inf under it makes the loss (and the gradient at
# masked positions) NaN, and fp16 overflows the 1 / (0 + 1e-8) of an empty step's gradient. The policy loss's
# masked log-probs are log-probabilities (ppo.py:59-60), so no masked log-ratio overflows exp: no crash.
# ---------------------------------------------------------------------------------------------
@pytest.mark.network
@pytest.mark.parametrize(
    "name, n, may_fail",
    [
        ("default", 25, set()),
        ("whiten", 25, {"poison-nonfinite"}),
        ("kl", 20, set()),
        ("policy-loss", 25, {"poison-nonfinite", "empty-step", "masked-zero"}),
        ("value-loss", 25, {"poison-nonfinite", "empty-step", "masked-zero"}),
    ],
)
def test_short_fuzz(entry, name, n, may_fail):
    res = fuzz(entry(name), n)
    assert failed(res) <= may_fail, failed(res)
    assert res.checked["reference"] > 0 and res.checked["poison"] > 0
    assert not failed(res) & {"reference", "poison", "deterministic", "row-independence", "pad-invariance"}

"""Discovered verl / SkyRL estimators take the pipeline domain of the hand-written entry whose trainer step calls them
with the same inputs (`targets/<fw>/discover_recipe.py`), at the pins where that step was read; none where the step
differs (verl's GRPO branch at 0.4.1), where the sibling has none (policy losses) or at a pin nobody read."""

from __future__ import annotations

import pytest

from maskfuzz.targets.registry import get


def _pipe(fw: str, entry: str, pin: str):
    return get(fw).declared(entry, pin).pipeline


@pytest.mark.parametrize("pin", ["0.4.1", "0.5.0", "0.9.1"])
def test_verl_registry_branch_estimators_take_rloos_pipeline(pin):
    own = _pipe("verl", "rloo", pin)
    assert own is not None and _pipe("verl", "adv:rloo_vectorized", pin) == own
    assert _pipe("verl", "adv:some_new_estimator", pin) == own  # a variant landing upstream: the same branch


def test_verl_grpo_branch_differs_at_0_4_1_and_is_not_shared():
    # 0.4.1: the GRPO branch alone gets the multi-turn loss_mask (gaps allowed); the registry branch the attention
    assert _pipe("verl", "grpo", "0.4.1").gaps and not _pipe("verl", "adv:opo", "0.4.1").gaps
    assert _pipe("verl", "adv:grpo", "0.4.1") is None  # the discovered call is not the trainer's call of grpo
    # GPG scales by a batch-wide count by design: its group-isolation is not promised, the domain still shared
    gpg = get("verl").declared("adv:gpg", "0.9.1")
    assert gpg.pipeline == _pipe("verl", "rloo", "0.9.1") and [p for p, _ in gpg.not_promised] == ["group-isolation"]


@pytest.mark.parametrize("fw,entry", [("verl", "policy-loss:gspo"), ("skyrl", "policy-loss:gspo")])
def test_policy_losses_get_nothing_their_sibling_has_none(fw, entry):
    assert get(fw).declared("policy-loss", "0.3.1" if fw == "skyrl" else "0.9.1").pipeline is None
    assert _pipe(fw, entry, "0.3.1" if fw == "skyrl" else "0.9.1") is None


@pytest.mark.parametrize("fw,entry,pin", [("verl", "adv:rloo", "latest"), ("verl", "adv:rloo", "0.1"),
                                          ("skyrl", "adv:maxrl", "latest")])  # fmt: skip
def test_no_pipeline_at_a_pin_nobody_read(fw, entry, pin):
    assert _pipe(fw, entry, pin) is None


@pytest.mark.parametrize("pin", ["0.1.0", "0.3.1"])
def test_skyrl_estimators_take_grpos_pipeline(pin):
    own = _pipe("skyrl", "grpo", pin)
    assert own is not None and _pipe("skyrl", "adv:maxrl", pin) == own == _pipe("skyrl", "rloo", pin)


def _source(fw: str, pin: str, rel: str) -> str:
    from maskfuzz.targets.runtime.acquire import acquire

    return (acquire(get(fw), pin).root / rel).read_text(encoding="utf-8")


def test_verl_wheels_registry_branch_reads_the_batchs_response_mask():
    """What the recipe rests on, read from the wheels: the registry branch passes data.batch["response_mask"] at
    every pin; only 0.4.1's GRPO branch replaces it with the multi-turn loss_mask."""
    for pin in ("0.4.1", "0.5.0", "0.9.1"):
        text = _source("verl", pin, "verl/trainer/ppo/ray_trainer.py")
        branch = text.split("get_adv_estimator_fn(adv_estimator)", 1)[1].split("adv_estimator_fn(**adv_kwargs)")[0]
        assert '"response_mask": data.batch["response_mask"]' in branch, pin
        grpo = text.split("elif adv_estimator == AdvantageEstimator.GRPO:", 1)[1].split("else:", 1)[0]
        assert ('data.batch["loss_mask"]' in grpo) == (pin == "0.4.1"), pin


def test_skyrl_wheels_dispatch_every_estimator_alike():
    for pin, line in (("0.1.0", 822), ("0.3.1", 1099)):
        text = _source("skyrl", pin, "skyrl_train/utils/ppo_utils.py").splitlines()
        assert "AdvantageEstimatorRegistry.get(adv_estimator)" in text[line - 1], pin

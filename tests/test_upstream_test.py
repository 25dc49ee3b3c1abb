"""fuzz/upstream_test.py: the generated pytest file fails on a framework with the defect and passes
on one without it, importing only torch and the framework (here two small fake frameworks in a
temporary checkout, one with a masked value leak, one correct)."""

from __future__ import annotations

from pathlib import Path

import pytest

from maskfuzz.fuzz import upstream_test
from maskfuzz.oracles.case import Case
from maskfuzz.oracles.declared import Declared
from maskfuzz.oracles.domain import Domain

FRAMEWORK = '''
import torch


def compute_gae_advantage_return(token_level_rewards, values, response_mask, gamma, lam):
    """GAE over the trainable tokens only{note}."""
    b_rows, t_len = values.shape
    adv = torch.zeros_like(values)
    for b in range(b_rows):
        nxt_v, carry = 0.0, 0.0
        for t in reversed(range(t_len)):
            if not {skip}:
                continue
            delta = token_level_rewards[b, t] + gamma * nxt_v - values[b, t]
            carry = delta + gamma * lam * carry
            adv[b, t] = carry
            nxt_v = values[b, t]
    return adv, adv + values
'''
SCRIPT = "def install_stand_ins():\n    return None\n"


def _checkout(tmp: Path, leaky: bool) -> Path:
    root = tmp / ("leaky" if leaky else "fixed")
    (root / "fakefw").mkdir(parents=True)
    (root / "fakefw" / "__init__.py").write_text("")
    skip = "True" if leaky else "bool(response_mask[b, t])"  # the leaky one runs dense over masked values
    (root / "fakefw" / "core.py").write_text(FRAMEWORK.format(note=" (not really)" if leaky else "", skip=skip))
    return root


def test_the_generated_test_fails_with_the_defect_and_passes_without(tmp_path):
    case = Case.build(trainable=[[1, 0, 1]], values=[[0.5, 100.0, 0.25]], score=[1.0], gamma=1.0, lam=1.0)
    declared = Declared(contract="compressed", domain=Domain())
    text = upstream_test.render(
        case,
        declared,
        target="verl",
        pin="1.0",
        resolved="fakefw==1.0",
        where="fakefw/core.py::compute_gae_advantage_return",
        mechanism="masked-value-bootstrap",
        prop="poison",
        fix_pin="1.1",
        entry_id="0123456789abcdef",
    )
    assert "from fakefw.core import compute_gae_advantage_return" in text and "passes at 1.1" in text
    assert "import maskfuzz" not in text and "oracles" not in text and len(text.splitlines()) <= 40
    assert ", 0.5)" in text  # the poison is judged at lam = 0.5, where a leaked value does not telescope away
    out = tmp_path / "out"
    out.mkdir()
    test = out / upstream_test.filename("verl", "masked-value-bootstrap", "0123456789abcdef")
    assert test.name == "test_verl_masked_value_bootstrap_01234567.py"
    test.write_text(text)
    script = out / "repro.py"
    script.write_text(SCRIPT)
    at_pin = upstream_test.check(test, script, _checkout(tmp_path, leaky=True), timeout=300)
    assert at_pin.status == "fails", at_pin.detail
    assert "not close" in at_pin.detail
    fixed = upstream_test.check(test, script, _checkout(tmp_path, leaky=False), timeout=300)
    assert fixed.status == "passes", fixed.detail


def test_a_masked_zero_test_asserts_the_masked_positions(tmp_path):
    case = Case.build(trainable=[[1, 0]], score=[1.0], gamma=1.0, lam=1.0)
    text = upstream_test.render(
        case,
        Declared(),
        target="openrlhf",
        pin="0.3",
        resolved="openrlhf==0.3",
        where="openrlhf/models/utils.py::get_advantages_and_returns",
        mechanism="masked-nonzero",
        prop="masked-zero",
    )
    assert "(advantages[~trainable] == 0).all()" in text


def test_a_test_that_raises_inside_the_call_is_no_test_of_the_defect(tmp_path):
    """A generated test that fails by raising (the recipe called the function wrongly) is "error", not
    "fails": only an assertion shows the defect, or the raise itself for a no-crash finding."""
    root = _checkout(tmp_path, leaky=True)
    out = tmp_path / "out"
    out.mkdir()
    test = out / "test_raises.py"
    test.write_text(
        "from fakefw.core import compute_gae_advantage_return\n\n\n"
        "def test_raises():\n    compute_gae_advantage_return(0.5, None, None, 1.0, 1.0)\n"
    )
    script = out / "repro.py"
    script.write_text(SCRIPT)
    checked = upstream_test.check(test, script, root, timeout=300)
    assert checked.status == "error" and "AttributeError" in checked.detail, checked
    assert upstream_test.check(test, script, root, timeout=300, crash_ok=True).status == "fails"


def test_kinds_beyond_gae_get_no_recipe():
    case = Case.build(trainable=[[1, 1]], extra={"loss": [[1.0, 2.0]]})
    try:
        upstream_test.render(
            case, Declared(kind="loss-aggregation"), target="verl", pin="0.9.1", resolved="verl==0.9.1",
            where="verl/trainer/ppo/core_algos.py::agg_loss", mechanism="split-normaliser", prop="split-invariance",
        )  # fmt: skip
    except ValueError as exc:
        assert "loss-aggregation finding is covered by the standalone reproducer" in str(exc)
    else:
        raise AssertionError("a loss-aggregation finding got a GAE recipe")


@pytest.mark.parametrize(
    "declared",
    [Declared("compressed", kind="returns", variant={"kl_reward": {"coef": 0.1}}), Declared("segment", kind="returns")],
    ids=["kl-in-reward", "segment"],
)
def test_kl_in_reward_and_per_turn_returns_get_no_recipe(declared):
    """The recipes call a GAE function on rewards and values: they would drop the log-probs of a KL in the reward."""
    case = Case.build(trainable=[[1, 1]], extra={"logp": [[-1.0, -2.0]], "ref_logp": [[-1.0, -1.0]]})
    with pytest.raises(ValueError, match="covered by the standalone reproducer"):
        upstream_test.render(
            case, declared, target="verl", pin="0.9.1", resolved="verl==0.9.1",
            where="verl/trainer/ppo/core_algos.py::compute_reinforce_plus_plus_outcome_advantage",
            mechanism="unexplained", prop="reference",
        )  # fmt: skip


def test_a_returns_estimator_without_a_critic_gets_no_recipe():
    """REINFORCE++ / REMAX take no values: the GAE call once went out as `fn(rewards, values, mask, gamma, lam)` and
    the generated test died in a TypeError (verl 0.5.0 remax, 0.9.1 reinforce++, found by a night's repro step)."""
    case = Case.build(trainable=[[1, 1]], score=[1.0])
    with pytest.raises(ValueError, match=r"returns finding \(no critic\) is covered by the standalone reproducer"):
        upstream_test.render(
            case, Declared("compressed", kind="returns"), target="verl", pin="0.9.1", resolved="verl==0.9.1",
            where="verl/trainer/ppo/core_algos.py::compute_reinforce_plus_plus_outcome_advantage",
            mechanism="score-lost", prop="score-kept",
        )  # fmt: skip


def test_the_poisoned_input_is_the_judges_probe_where_the_domain_lets_poison_be():
    """The upstream test poisons what the judge's poison check poisoned (one function, `poison_twins`): without a
    critic only the rewards under the mask carry the probe, the values stay as drawn."""
    case = Case.build(trainable=[[1, 1, 0, 0]], attention=[[1, 1, 1, 0]], gamma=0.9, lam=0.8)
    with_critic = upstream_test.poison_input(case, Declared("dense"))
    no_critic = upstream_test.poison_input(case, Declared("dense", domain=Domain(critic=False)))
    dead = ~case.trainable
    assert bool((with_critic.values[dead] != 0).any())
    assert bool((no_critic.values[dead] == 0).all()) and bool((no_critic.token_rewards[dead] != 0).any())
    assert bool((no_critic.token_rewards[case.trainable] == case.token_rewards[case.trainable]).all())


def test_the_recipes_are_found_in_the_framework_folders():
    """A target has an upstream test iff its folder holds `upstream_recipe.py` (no list of names in fuzz/); a
    target without one is refused with the ones that have one."""
    from maskfuzz.targets.registry import ADAPTER_MODULES

    with_recipe = {t for t in ADAPTER_MODULES if upstream_test.supported(t)}
    assert with_recipe == {"verl", "openrlhf", "skyrl", "torchrl"}
    assert all(upstream_test.recipe_of(t).call.startswith("{fn}(") for t in with_recipe)
    assert upstream_test.recipe_of("trl") is None and not upstream_test.supported("no-such-target")
    case = Case.build(trainable=[[1, 1]], values=[[0.5, 0.25]], score=[1.0])
    with pytest.raises(ValueError, match="no upstream-test recipe for trl; known: openrlhf, skyrl, torchrl, verl"):
        upstream_test.render(
            case, Declared("compressed"), target="trl", pin="1.0", resolved="trl==1.0",
            where="trl/x.py::gae", mechanism="m", prop="reference",
        )  # fmt: skip

"""The kind registry is the one dispatch on kinds: GAE and `returns` are entries like the others, and what
differs for them is what their `KindSpec` says (its family's hooks), not a test of the kind's name."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from maskfuzz.oracles import verdict
from maskfuzz.oracles.case import Case
from maskfuzz.oracles.declared import Declared
from maskfuzz.oracles.kinds import ALL_KINDS, ALL_PROPERTIES, GAE_JUDGE, KINDS, STATISTIC_JUDGE, outputs, spec
from maskfuzz.oracles.kinds.diagnosis import diagnose_kind
from maskfuzz.oracles.kinds.dispatch import diagnose, judge
from maskfuzz.oracles.kinds.gae import diagnosis as gae_diagnosis
from maskfuzz.oracles.kinds.gae import properties as gae_properties
from maskfuzz.oracles.kinds.gae.reference import reference as gae_reference
from maskfuzz.oracles.kinds.judge import judge as statistic_judge
from maskfuzz.targets import discovery


def test_gae_and_returns_lead_the_registry_and_its_properties():
    assert ALL_KINDS == tuple(KINDS) and ALL_KINDS[:2] == ("gae", "returns")
    assert ALL_PROPERTIES[: len(verdict.PROPERTIES)] == verdict.PROPERTIES
    for kind in ("gae", "returns"):
        k = spec(kind)
        assert k.properties == verdict.PROPERTIES and k.family is GAE_JUDGE and not k.grouped
        assert outputs(kind) == ("advantages", "returns") and k.zero_outputs == ("advantages",)


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_each_kind_names_its_judge_and_diagnosis(kind):
    k = spec(kind)
    gae = k.family is GAE_JUDGE
    assert gae or k.family is STATISTIC_JUDGE
    assert k.judge is (gae_properties.judge if gae else statistic_judge)
    assert k.diagnose is (gae_diagnosis.diagnose if gae else diagnose_kind)
    for hook in (k.cases, k.clean, k.card_variant, k.card_reference):
        assert callable(hook)


def test_an_unknown_kind_is_refused_naming_the_known_ones():
    with pytest.raises(ValueError, match="known: gae, returns, group-advantage"):
        spec("entropy")


# --- a discovered variant of kind `returns` is judged on the invariants alone ----------------------------------
def _discovered_returns(monkeypatch) -> Declared:
    """The Declared of `ret:whitened`, a discovered entry of kind `returns` of a framework whose discover module
    maps the prefix `ret` to that kind (`targets.discovery.overrides` gives its spec fields)."""
    monkeypatch.setattr(discovery, "module_of", lambda target_id: SimpleNamespace(PREFIXES={"ret": "returns"}))
    fields = discovery.overrides("some-framework", "ret:whitened")
    assert fields["kind"] == "returns" and fields["reference"] is False and not fields["domain"].critic
    keep = ("kind", "variant", "reference", "masked_zero", "whitening", "documented_errors", "domain", "options")
    return Declared(**{k: fields[k] for k in keep})


# rewards under the mask (poison): a correct function never reads them
CASE = Case.build(
    trainable=[[1, 1, 0, 1, 0], [1, 1, 1, 0, 0]],
    attention=[[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]],
    token_rewards=[[0.5, 0.0, 7.0, 0.25, 3.0], [0.0, 1.0, 0.0, -5.0, 0.0]],
    score=[1.0, -2.0],
    gamma=0.9,
    dtype="float32",
)


def _whitened_returns(case: Case, leak: bool = False):
    """Discounted returns over the trainable tokens with the advantages whitened over the batch: a variant that
    none of our references describes. `leak`: the row's rewards under the mask are added to its returns."""
    _, ret = gae_reference(case, "compressed")
    live = case.trainable
    if leak:
        ret = torch.where(live, ret + torch.where(live, 0.0, case.token_rewards).sum(1, keepdim=True), 0.0)
    mean, std = ret[live].mean(), ret[live].std()
    adv = torch.where(live, (ret - mean) / (std + 1e-8), 0.0)
    return adv.float(), ret.float()


def test_a_discovered_returns_variant_is_judged_on_invariants_only(monkeypatch):
    declared = _discovered_returns(monkeypatch)
    assert declared.domain.rejects(CASE) is None
    verdicts = {v.property: v for v in judge(_whitened_returns, CASE, declared)}
    assert list(verdicts) == list(verdict.PROPERTIES)
    for prop in ("reference", "score-kept", "telescoping", "all-trainable", "gap-invariance"):
        assert verdicts[prop].status == "n/a" and "invariants only" in verdicts[prop].message, verdicts[prop]
    for prop in ("no-crash", "poison", "row-independence", "masked-zero", "deterministic"):
        assert verdicts[prop].status == "pass", verdicts[prop]


def test_a_leak_in_a_discovered_returns_variant_is_still_found(monkeypatch):
    declared = _discovered_returns(monkeypatch)
    verdicts = {v.property: v for v in judge(lambda c: _whitened_returns(c, leak=True), CASE, declared)}
    assert verdicts["poison"].failed, verdicts["poison"]
    assert verdicts["reference"].status == "n/a"
    assert diagnose(lambda c: _whitened_returns(c, leak=True), CASE, declared, "poison").mechanism == (
        "masked-reward-leak"
    )

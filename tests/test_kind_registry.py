"""The kind registry is the one dispatch on kinds: GAE and `returns` are entries like the others, and what
differs for them is what their `KindSpec` says (its family's hooks), not a test of the kind's name."""

from __future__ import annotations

import pytest

from maskfuzz.oracles import verdict
from maskfuzz.oracles.kinds import ALL_KINDS, ALL_PROPERTIES, GAE_JUDGE, KINDS, STATISTIC_JUDGE, outputs, spec
from maskfuzz.oracles.kinds.diagnosis import diagnose_kind
from maskfuzz.oracles.kinds.gae import diagnosis as gae_diagnosis
from maskfuzz.oracles.kinds.gae import properties as gae_properties
from maskfuzz.oracles.kinds.judge import judge as statistic_judge


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

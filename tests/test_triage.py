"""Root causes, promises, reach and severity: every mutant's finding is diagnosed as its own mechanism,
a defect names the promise it breaks (a finding that breaks none is a fact), its findings group into
fewer defects, and reach is `pipeline` only with a witness the pipeline is cited to produce."""

from __future__ import annotations

import dataclasses
import re

import mutant_zoo as zoo
import pytest
import torch

from maskfuzz.fuzz.engine import fuzz_target
from maskfuzz.fuzz.triage import reach, triage
from maskfuzz.oracles.case import Case
from maskfuzz.oracles.domain import FEATURES, Domain
from maskfuzz.oracles.kinds.dispatch import diagnose

MUTANTS = list(zoo.CATCHES.items())


@pytest.mark.parametrize("mutant,want", MUTANTS, ids=[m.__name__ for m, _ in MUTANTS])
def test_each_mutant_is_diagnosed_as_its_mechanism(mutant, want):
    declared, prop = want
    run = zoo.as_run(mutant)
    result = fuzz_target(run, declared, target=mutant.__name__, max_examples=300, seed=0)
    defects = triage(result, run, declared, witness_examples=20)
    mine = result.finding(prop)
    assert mine is not None
    assert mine.mechanism == zoo.MECHANISM[mutant], (mine.mechanism, mine.evidence)
    want_promise = zoo.PROMISE[mutant]
    if want_promise is None:  # no promise covers it: a fact, neither graded nor filed
        assert mine.promise is None and mine.severity == "" and mine.fact, (mine.promise, mine.fact)
        assert any(mine in f.findings for f in result.facts)
    else:  # the zoo's functions are their caller's own: every input of the api domain is theirs
        assert mine.promise is not None and mine.promise.id == want_promise, mine.promise
        assert mine.reach == "pipeline" and mine.severity in ("high", "medium", "low")
        assert any(mine in d.findings and d.promise is not None for d in defects)
    assert len(defects) + len(result.facts) <= len(result.findings)
    # one root cause is one defect: a fact never repeats a defect's mechanism (NaN at a masked advantage too)
    assert not ({f.mechanism for f in result.facts} & {d.mechanism for d in defects}) - {"unexplained"}
    assert all(d.properties and d.id.endswith("/" + d.mechanism) and d.promise for d in defects)


def test_value_leak_findings_group_into_one_defect():
    declared, _ = zoo.CATCHES[zoo.mask_ignored]
    run = zoo.as_run(zoo.mask_ignored)
    result = fuzz_target(run, declared, target="m", max_examples=300, seed=0, nonfinite=False)
    defects = triage(result, run, declared, witness_examples=20)
    leak = [d for d in defects if d.mechanism == "masked-value-bootstrap"]
    assert len(leak) == 1 and {"poison", "reference"} <= set(leak[0].properties)
    assert len(defects) < len(result.findings)
    assert leak[0].severity == "high"


def test_reach_is_pipeline_only_with_a_witness_inside_the_pipeline_domain():
    declared, _ = zoo.CATCHES[zoo.mask_ignored]
    run = zoo.as_run(zoo.mask_ignored)
    leak = Case.build(trainable=[[1, 0]], attention=[[1, 0]], values=[[0.0, 100.0]], gamma=1.0, lam=0.5, score=[1.0])
    mech = diagnose(run, leak, declared, "poison").mechanism
    assert mech == "masked-value-bootstrap"
    registered = dataclasses.replace(declared, own_inputs=False)  # a framework's function, not the caller's own
    assert reach(run, leak, "poison", mech, registered).level == "api"  # no pipeline declared
    # a pipeline domain that leaves masked values permissive without citing the critic that produces them
    # proves nothing: the witness would be "pipeline by reasoning"
    silent = dataclasses.replace(registered, pipeline=Domain(why={}))
    r = reach(run, leak, "poison", mech, silent, examples=20)
    assert r.level == "api" and r.witness is None, r.how
    inside = dataclasses.replace(registered, pipeline=Domain(produces={"masked_values": "critic.py:12"}))
    r = reach(run, leak, "poison", mech, inside)
    assert r.level == "pipeline" and r.witness is leak
    # a pipeline whose critic values are zeroed under the mask cannot leak values: no witness
    zeroed = Domain(
        masked_values=False, masked_rewards=False, why={"masked_values": "x.py:1", "masked_rewards": "x.py:2"}
    )
    r = reach(run, leak, "poison", mech, dataclasses.replace(registered, pipeline=zeroed), examples=40)
    assert r.level == "api" and r.witness is None and "outside the pipeline domain" in r.how


def test_a_witness_is_searched_inside_the_api_domain_too():
    """A returns function (no critic: api `critic=False`) whose pipeline domain narrows gaps only: the witness
    search must keep V = 0, or a function that rightly ignores values fails the reference on every draw (verl
    reinforce++-kl 0.4.1 got reach pipeline from such a witness)."""
    from maskfuzz.oracles.declared import Declared
    from maskfuzz.oracles.kinds.gae.reference import compressed_vec

    def off_by_one_on_gaps(case: Case):
        adv, ret = compressed_vec(case.replace(values=torch.zeros_like(case.values)))  # ignores the critic
        gap = torch.tensor([len(set(r.nonzero().flatten().diff().tolist()) - {1}) > 0 for r in case.trainable])
        wrong = gap[:, None] & case.trainable  # 1 too much on a row with a gap: no probe isolates it
        return (adv + wrong).float(), (ret + wrong).float()

    api = Domain(critic=False, why={"critic": "returns.py:1"})
    pipe = Domain(gaps=False, why={"gaps": "rollout.py:2"})
    assert pipe.within(api).critic is False and pipe.within(api).gaps is False and pipe.within(Domain()) is pipe
    declared = Declared("compressed", kind="returns", domain=api, pipeline=pipe)
    gapped = Case.build(trainable=[[1, 0, 1]], score=[1.0], gamma=1.0, lam=1.0)
    mech = diagnose(off_by_one_on_gaps, gapped, declared, "reference").mechanism
    assert mech == "unexplained"
    r = reach(off_by_one_on_gaps, gapped, "reference", mech, declared, examples=60)
    assert r.level == "api" and r.witness is None, r.how


def test_nan_poison_projects_to_finite_poison_when_the_pipeline_has_no_nan():
    case = Case.build(trainable=[[1, 0]], values=[[0.0, float("nan")]], gamma=1.0, lam=0.5, score=[1.0])
    pipe = Domain(nonfinite_poison=False, why={"nonfinite_poison": "critic.py:10"})
    projected = pipe.project(case)
    assert projected is not None and not projected.has_nonfinite_poison()
    assert pipe.rejects(projected) is None and Domain().cited() == [] and pipe.cited() == []
    assert Domain(gaps=False, why={"gaps": "no citation"}).cited() == ["gaps"]


def test_a_masked_log_prob_projects_to_a_log_prob_with_its_log_ratio_kept():
    """logp = 100 under the mask is no log-probability: projected to -10 (SPAN / 2), the masked KL term stays
    non-zero, so a leak of it can still be witnessed inside the pipeline (miles reinforce++-kl)."""
    case = Case.build(
        trainable=[[1, 0]], score=[1.0], extra={"logp": [[0.0, 100.0]], "ref_logp": [[0.0, -3.0]]}, dtype="float32"
    )
    pipe = Domain(masked_logprobs=False)
    assert pipe.rejects(case) is not None
    projected = pipe.project(case)
    assert projected is not None and pipe.rejects(projected) is None
    assert projected.extra["logp"].tolist() == [[0.0, -10.0]] and projected.extra["ref_logp"].tolist() == [[0.0, -3.0]]


def test_every_declared_pipeline_domain_cites_upstream_lines():
    """A pipeline narrowing without a file:line citation would be an unverifiable claim about
    someone else's code; a target without any pipeline domain reports every finding at reach api."""
    from maskfuzz.targets.registry import registry

    declared = 0
    for tid, spec in registry().items():
        for entry in spec.entries:
            s = spec.for_entry(entry)
            for where, dom in [("pipeline", s.pipeline)] + [(f"pipeline@{r}", d) for r, d in s.pipeline_by_pin.items()]:
                if dom is None:
                    continue
                declared += 1
                assert dom.cited() == [], f"{tid}:{entry} {where}: uncited narrowing of {dom.cited()}"
                unknown = set(dom.produces) - set(FEATURES)
                assert not unknown, f"{tid}:{entry} {where}: produces names no feature: {unknown}"
                uncited = [f for f, why in dom.produces.items() if not re.search(r"[\w/.-]+\.\w+:\d+", why)]
                assert not uncited, f"{tid}:{entry} {where}: production without a file:line: {uncited}"
    assert declared >= 1


def test_every_declared_promise_covers_properties_of_its_entry():
    """A framework's promise quotes its words with a file:line (or a docs URL) and covers properties its
    entry is judged on; a promise that covers nothing the entry checks would make no finding a defect."""
    from maskfuzz.oracles.kinds import properties
    from maskfuzz.oracles.promises import Promise
    from maskfuzz.targets.registry import registry

    for tid, spec in registry().items():
        for entry in spec.entries:
            s = spec.for_entry(entry)
            props = set(properties(s.kind))
            for p in s.promises:
                assert isinstance(p, Promise) and not p.universal, (tid, entry, p)
                covered = {c for c in p.covers if not c.startswith("mechanism:")}
                assert covered <= props, f"{tid}:{entry} {p.id}: covers {covered - props}, not properties of {s.kind}"
                names = {o.name: o for o in s.options}
                for name, value in p.options.items():  # a promise about a configuration names a real one
                    assert name in names and value in names[name].values, (tid, entry, p.id, name, value)


def test_a_leak_the_case_does_not_carry_does_not_explain_its_failure():
    """ROLL c09bc8bc9f43 leaks masked values AND drops a score on a masked tail; a case with zero
    masked values that fails score-kept is score-lost, not a value bootstrap."""

    def leaky_and_drops_tail_score(*, token_rewards, values, trainable, attention, score, gamma, lam):
        rewards = zoo._place_score(token_rewards * trainable, score, attention)  # score on the last real token
        adv, ret = zoo._scan(rewards * trainable, values, gamma, lam)  # masked values bootstrap
        return adv * trainable, ret * trainable

    from maskfuzz.oracles.declared import Declared

    run = zoo.as_run(leaky_and_drops_tail_score)
    case = Case.build(trainable=[[1, 0]], values=[[0.0, 0.0]], score=[1.0], gamma=0.0, lam=1.0)
    assert diagnose(run, case, Declared("dense"), "score-kept").mechanism == "score-lost"
    poisoned = case.replace(values=[[0.0, 100.0]], gamma=1.0, lam=0.5)
    assert diagnose(run, poisoned, Declared("dense"), "poison").mechanism == "masked-value-bootstrap"


def test_a_twin_built_finding_is_api_when_the_pipeline_cannot_build_its_twin():
    """A gap-invariance failure lives on the gap twin: a pipeline without gaps never builds it, so
    neither the case nor its projection is a witness (the verl 0.4.1 extra-decay shape)."""
    declared, _ = zoo.CATCHES[zoo.extra_decay_per_masked_token]
    run = zoo.as_run(zoo.extra_decay_per_masked_token)
    case = Case.build(trainable=[[1, 1]], gamma=1.0, lam=0.9, score=[1.0])
    mech = diagnose(run, case, declared, "gap-invariance").mechanism
    assert mech == "extra-decay"
    anywhere = dataclasses.replace(declared, own_inputs=False, pipeline=Domain(produces={"gaps": "env.py:3"}))
    assert reach(run, case, "gap-invariance", mech, anywhere).level == "pipeline"
    no_gaps = Domain(gaps=False, why={"gaps": "rollout.py:1"})
    r = reach(run, case, "gap-invariance", mech, dataclasses.replace(anywhere, pipeline=no_gaps), examples=20)
    assert r.level == "api" and r.witness is None and "twin" in r.how


def test_a_promise_about_one_configuration_covers_only_that_configuration():
    """verl's docs promise a global token mean for loss_agg_mode token-mean: a split finding under another mode
    breaks no promise of theirs (it is a fact), one under token-mean does."""
    from maskfuzz.fuzz.engine import Finding
    from maskfuzz.fuzz.triage import judge_finding
    from maskfuzz.oracles.declared import Declared
    from maskfuzz.oracles.options import Option
    from maskfuzz.oracles.promises import Promise
    from maskfuzz.oracles.verdict import Verdict

    mode = Option("loss_agg_mode", ("token-mean", "seq-mean"), "token-mean", "cfg.py:1")
    words = Promise("upstream:docs/dapo.md:1", "token-mean averages over all tokens of the mini-batch",
                    covers=("reference",), options={"loss_agg_mode": "token-mean"})  # fmt: skip
    declared = Declared("dense", own_inputs=True, options=(mode,), promises=(words,))
    run = zoo.as_run(zoo.chunked_scan_drops_carry)  # an "unexplained" reference failure: only the words decide
    case = Case.build(trainable=[[1, 1, 1, 1]], token_rewards=[[1.0, 0.0, 2.0, 0.0]], gamma=0.9, lam=0.8)
    for options, want in (({}, words), ({"loss_agg_mode": "seq-mean"}, None)):
        f = Finding("t", "", "", "reference", case.replace(options=options), Verdict("reference", "fail"))
        judge_finding(run, f, declared, examples=0)
        assert f.promise == want, (options, f.promise, f.mechanism)


def test_values_at_padding_and_under_tool_tokens_are_separate_features():
    """A critic that zeroes padding but keeps values under tool tokens (verl's Megatron critic at 11ee5125d):
    a witness with a value at padding is not one its pipeline builds; one under a tool token is."""
    keeps_tool_values = Domain(
        padding_values=False, why={"padding_values": "critic.py:9 values * attention_mask"},
        produces={"masked_values": "critic.py:9 tool tokens are attended", "masked_real_tail": "env.py:4"},
    )  # fmt: skip
    at_padding = Case.build(trainable=[[1, 0]], attention=[[1, 0]], values=[[0.0, 5.0]])
    at_tool = Case.build(trainable=[[1, 0]], attention=[[1, 1]], values=[[0.0, 5.0]])
    assert Domain().features(at_padding) == ["padding_values"] and "masked_values" in Domain().features(at_tool)
    assert keeps_tool_values.rejects(at_padding) and keeps_tool_values.rejects(at_tool) is None
    assert keeps_tool_values.project(at_padding).values.tolist() == [[0.0, 0.0]]
    only = keeps_tool_values.produced_only()
    assert only.rejects(at_tool) is None and only.rejects(at_padding) is not None
    # a production citation of masked values covers padding too unless padding is narrowed apart
    assert Domain(produces={"masked_values": "critic.py:3"}).unproduced(at_padding) == []
    # the old narrowing keeps its meaning: masked_values=False zeroes padding as well
    assert Domain(masked_values=False, why={"masked_values": "c.py:1"}).rejects(at_padding) is not None


def test_a_pipeline_defect_names_the_lines_that_build_its_witness():
    """The configuration a maintainer needs to meet a defect: each feature the witness uses, with the upstream
    lines cited as producing it (`built_from` in the JSON); an api defect names none."""
    declared, _ = zoo.CATCHES[zoo.mask_ignored]
    run = zoo.as_run(zoo.mask_ignored)
    registered = dataclasses.replace(
        declared, own_inputs=False, pipeline=Domain(produces={"masked_values": "critic.py:12", "gaps": "env.py:3"})
    )
    result = fuzz_target(run, registered, target="m", max_examples=200, seed=0, nonfinite=False)
    defects = triage(result, run, registered, witness_examples=20)
    leak = next(d for d in defects if d.mechanism == "masked-value-bootstrap")
    assert leak.reach == "pipeline"
    # a value at padding is produced by the critic cited for masked values (`padding_values` follows it)
    values = {f: c for f, c in leak.built_from.items() if f in ("masked_values", "padding_values")}
    assert values and set(values.values()) == {"critic.py:12"}, leak.built_from
    assert set(leak.built_from) <= {"masked_values", "padding_values", "gaps"}
    assert leak.to_dict()["built_from"] == leak.built_from
    api = triage(fuzz_target(run, declared := dataclasses.replace(declared, own_inputs=False), target="m",
                             max_examples=100, seed=0, nonfinite=False), run, declared, witness_examples=0)  # fmt: skip
    assert all(d.built_from == {} for d in api)

"""Options and truncated rows: the semantics of the references against hand-computed examples,
the case format, the strategy's coverage and a zoo of configuration mutants, each caught.

The mutants below are deliberately wrong implementations (a mutant zoo), never targets."""

from __future__ import annotations

import json

import pytest
import torch

from maskfuzz.fuzz import corpus, corpus_codec
from maskfuzz.fuzz.engine import fuzz_target
from maskfuzz.oracles.case import Case, CaseError
from maskfuzz.oracles.declared import Declared
from maskfuzz.oracles.domain import Domain
from maskfuzz.oracles.kinds import loss_aggregation
from maskfuzz.oracles.kinds.dispatch import judge
from maskfuzz.oracles.kinds.gae.properties import expected_outputs
from maskfuzz.oracles.kinds.gae.reference import classic_gae_loop
from maskfuzz.oracles.options import Option, Truncation, apply, reference_case
from maskfuzz.oracles.whitening import Whitening

BOOT = Truncation(bootstrap="value", cite="test.py:1")


def _one_row(**kw) -> Case:
    base = dict(trainable=[[1, 1]], values=[[1.0, 2.0]], score=[1.0], gamma=0.5, lam=1.0, dtype="float64")
    return Case.build(**{**base, **kw})


def _adv(case: Case, declared: Declared) -> list[float]:
    return expected_outputs(case, declared.configured(case))[0][0].tolist()


# -- the reference under each truncation semantics, by hand -----------------------------------
# V' = [1, 2], gamma 0.5, lam 1, score 1 at the last token.
# terminal:  delta_1 = 1 - 2 = -1; delta_0 = 0 + 0.5 * 2 - 1 = 0;  A = [0 + 0.5 * -1, -1] = [-0.5, -1]
# bootstrap 4: delta_1 = 1 + 0.5 * 4 - 2 = 1;                   A = [0.5, 1]
# score dropped: delta_1 = 0 - 2 = -2;                          A = [-1, -2]
# penalty -1: delta_1 = 0 - 2 = -2 (score 1 - 1);               A = [-1, -2]
# row masked: A = [0, 0]
@pytest.mark.parametrize(
    "truncation, expected",
    [
        (None, [-0.5, -1.0]),
        (Truncation(), [-0.5, -1.0]),
        (BOOT, [0.5, 1.0]),
        (Truncation(score="zero"), [-1.0, -2.0]),
        (Truncation(score=("add", -1.0)), [-1.0, -2.0]),
        (Truncation(row="masked"), [0.0, 0.0]),
        (Truncation(score="zero", bootstrap="value"), [0.0, 0.0]),  # delta_1 = 0 + 2 - 2
    ],
)
def test_truncation_semantics_by_hand(truncation, expected):
    case = _one_row(truncated=[True], bootstrap=[4.0])
    assert _adv(case, Declared(truncation=truncation)) == pytest.approx(expected)


def test_an_ended_row_ignores_the_truncation_semantics():
    case = _one_row(truncated=[False], bootstrap=[4.0])
    for trunc in (BOOT, Truncation(score="zero"), Truncation(row="masked")):
        assert _adv(case, Declared(truncation=trunc)) == pytest.approx([-0.5, -1.0])


def test_the_bootstrap_follows_the_last_trainable_token_past_a_gap_and_a_masked_tail():
    """Compressed view: trainable [1, 0, 1, 0] is the two-step row above; the bootstrap (4) is the
    value after the last trainable token, whatever real tokens follow it."""
    case = Case.build(
        trainable=[[1, 0, 1, 0]],
        values=[[1.0, 9.0, 2.0, 9.0]],
        score=[1.0],
        gamma=0.5,
        lam=1.0,
        dtype="float64",
        truncated=[True],
        bootstrap=[4.0],
    )
    adv = expected_outputs(case, Declared(truncation=BOOT))[0][0].tolist()
    assert adv == pytest.approx([0.5, 0.0, 1.0, 0.0])
    # and it is classic GAE with V after the end = 4 over the packed row
    packed, _ = classic_gae_loop([0.0, 1.0 + 0.5 * 4.0], [1.0, 2.0], 0.5, 1.0)
    assert [adv[0], adv[2]] == pytest.approx(packed)


def test_score_map_ops_apply_in_order():
    """AReaL-like (score + bias) * scale, then clip: (3 + 1) * 0.5 = 2 -> clip 1.5 -> 1.5."""
    case = _one_row(score=[3.0])
    declared = Declared(score_map=(("add", 1.0), ("mul", 0.5), ("clip", 1.5)))
    ref = reference_case(case, declared)
    assert ref.score.tolist() == [1.5]
    # the score map applies before the truncation penalty: (3 clipped to 1) - 1 = 0
    cut = _one_row(score=[3.0], truncated=[True])
    both = Declared(score_map=(("clip", 1.0),), truncation=Truncation(score=("add", -1.0)))
    assert reference_case(cut, both).score.tolist() == [0.0]


# -- options ---------------------------------------------------------------------------------
NORM = Option(
    "norm_adv",
    (False, True),
    False,
    "fw/trainer.py:10",
    "whiten the advantages over the batch",
    effect={True: {"whitening": Whitening(unbiased=False, eps=1e-8)}},
)
CLIP = Option("reward_clip", (0.0, 1.0), 0.0, "fw/trainer.py:20", effect={1.0: {"score_map": (("clip", 1.0),)}})
EOS = Option(
    "mask_no_eos",
    (False, True),
    False,
    "fw/trainer.py:30",
    effect={True: {"truncation": {"score": "zero"}}},
)
SPACE = (NORM, CLIP, EOS)


def test_apply_merges_the_effects_of_the_chosen_values():
    base = Declared(options=SPACE, truncation=BOOT, variant={"a": 1})
    assert apply(base, {}).whitening is None and apply(base, {}).score_map == ()
    got = apply(base, {"norm_adv": True, "reward_clip": 1.0, "mask_no_eos": True})
    assert got.whitening == Whitening(unbiased=False, eps=1e-8)
    assert got.score_map == (("clip", 1.0),)
    assert got.truncation == Truncation(score="zero", bootstrap="value", cite="test.py:1")
    assert got.variant == {"a": 1}


def test_a_variant_effect_merges_into_the_kind_variant():
    opt = Option("std", (True, False), True, "x.py:1", effect={False: {"variant": {"std": None}}})
    got = apply(Declared(options=(opt,), variant={"std": "biased", "eps": 1e-6}), {"std": False})
    assert got.variant == {"std": None, "eps": 1e-6}


def test_unknown_options_and_values_are_clear_errors():
    base = Declared(options=SPACE)
    with pytest.raises(CaseError, match="'nope' is not an option of this target.*mask_no_eos, norm_adv, reward_clip"):
        apply(base, {"nope": 1})
    with pytest.raises(CaseError, match=r"norm_adv=3 is not one of \[False, True\]"):
        apply(base, {"norm_adv": 3})
    with pytest.raises(CaseError, match="is not an option of this target"):
        judge(lambda c: (c.values, c.values), _one_row(options={"nope": True}), Declared())


def test_an_option_must_list_its_default():
    with pytest.raises(ValueError, match="default 2 is not one of"):
        Option("x", (0, 1), 2, "x.py:1")


def test_a_configured_promise_is_not_configured_twice():
    case = _one_row(options={"reward_clip": 1.0})
    once = Declared(options=SPACE).configured(case)
    assert once.configured(case) is once and once.score_map == (("clip", 1.0),)
    with pytest.raises(ValueError, match="configured for options"):
        once.configured(_one_row())


# -- the case format -------------------------------------------------------------------------
def test_case_json_round_trip_with_truncation_and_options():
    case = _one_row(truncated=[True], bootstrap=[4.0], options={"norm_adv": True}, dtype="bfloat16")
    data = corpus_codec.case_to_json(case)
    assert data["truncated"] == [True] and data["options"] == {"norm_adv": True}
    back = corpus_codec.case_from_json(json.loads(json.dumps(data)))
    assert back.truncated.tolist() == [True] and back.bootstrap.tolist() == [4.0]
    assert back.options == {"norm_adv": True}
    plain = corpus_codec.case_to_json(_one_row(truncated=[False]))
    assert "truncated" not in plain and "options" not in plain  # old readers see the old format


def test_corrupt_truncation_fields_name_the_field():
    data = corpus_codec.case_to_json(_one_row(truncated=[True], bootstrap=[4.0]))
    bad = dict(data, truncated=[1])
    with pytest.raises(corpus_codec.CorpusError, match=r"case\.truncated.*booleans"):
        corpus_codec.case_from_json(bad)
    with pytest.raises(corpus_codec.CorpusError, match=r"case\.truncated"):
        corpus_codec.case_from_json(dict(data, truncated=[True, False]))
    with pytest.raises(CaseError, match="bootstrap must be finite"):
        _one_row(truncated=[True], bootstrap=[float("nan")])


def test_row_operations_carry_the_truncation_along():
    case = Case.build(
        trainable=[[1, 1], [1, 0], [0, 0]],
        truncated=[True, False, False],
        bootstrap=[4.0, 0.0, 0.0],
        dtype="float64",
    )
    assert case.rows([2, 0]).truncated.tolist() == [False, True]
    grown = case.with_rows(Case.build(trainable=[[0, 0]], dtype="float64"), at=1)
    assert grown.truncated.tolist() == [True, False, False, False]
    assert grown.bootstrap.tolist() == [4.0, 0.0, 0.0, 0.0]


def test_domain_rejects_a_padded_truncated_row_where_the_pipeline_cannot_build_one():
    dom = Domain(truncated_padded=False, why={"truncated_padded": "fw/rollout.py:1"})
    full = Case.build(trainable=[[1, 1]], truncated=[True], dtype="float64")
    padded = Case.build(trainable=[[1, 0]], attention=[[1, 0]], truncated=[True], dtype="float64")
    assert dom.rejects(full) is None
    assert "followed by padding" in dom.rejects(padded)
    assert "truncated" in Domain(truncated_rows=False).rejects(full)
    assert Domain(truncated_rows=False).project(full).truncated is None


# -- loss aggregation: a truncated row masked (TRL mask_truncated_completions, NeMo overlong) ---
def test_a_masked_truncated_row_leaves_the_loss_and_its_normalisers():
    """token-mean over rows [1, 2] and [4, x]: the row cut and masked leaves (1 + 2) / 2 = 1.5."""
    case = Case.build(
        trainable=[[1, 1], [1, 0]],
        extra={"loss": [[1.0, 2.0], [4.0, 0.0]]},
        truncated=[False, True],
        dtype="float64",
    )
    declared = Declared(kind="loss-aggregation", variant={"mode": "token-mean"}, truncation=Truncation(row="masked"))
    ref = loss_aggregation.reference(reference_case(case, declared), declared.variant)
    assert float(ref["loss"][0, 0]) == pytest.approx(1.5)
    assert ref["grad"][1].tolist() == [0.0, 0.0]
    plain = loss_aggregation.reference(case, declared.variant)
    assert float(plain["loss"][0, 0]) == pytest.approx(7.0 / 3.0)


# -- the strategy and the engine: coverage, and configuration mutants caught --------------------
def _configured_reference(declared: Declared):
    """A correct implementation of the configuration: the float64 reference as configured."""

    def run(case: Case):
        adv, ret = expected_outputs(case, declared.configured(case))
        live = case.trainable
        return (adv * live).to(case.torch_dtype), (ret * live).to(case.torch_dtype)

    return run


def _ignores_options(declared: Declared):
    """Mutant: runs every case at the default configuration (an option the adapter forgot)."""
    run = _configured_reference(declared)
    return lambda case: run(case.replace(options={}))


def _zero_bootstrap(declared: Declared):
    """Mutant: treats a cut row as ended (the bootstrap never read)."""
    run = _configured_reference(declared)
    return lambda case: run(case.replace(truncated=None, bootstrap=None))


def _bootstrap_from_padding(declared: Declared):
    """Mutant: reads the bootstrap from the value at the window's last position, whatever is there
    (a value under the mask for a padded row)."""
    run = _configured_reference(declared)

    def mutant(case: Case):
        if case.truncated is None:
            return run(case)
        return run(case.replace(bootstrap=torch.nan_to_num(case.values[:, -1], nan=0.0, posinf=0.0, neginf=0.0)))

    return mutant


DECLARED = Declared(options=SPACE, truncation=BOOT)


def test_the_correct_configuration_passes_and_every_option_value_is_checked():
    result = fuzz_target(_configured_reference(DECLARED), DECLARED, target="correct", max_examples=150, seed=3)
    assert not result.findings, [f.verdict.message for f in result.findings]
    for name, per in result.options_checked.items():
        assert all(n > 0 for n in per.values()), (name, per)
    assert result.truncated_checked > 0
    pairs = result.interactions_checked
    assert pairs.get("norm_adv=true & reward_clip=1.0", 0) > 0
    assert sum(n for k, n in pairs.items() if k.endswith(" & truncated")) > 0


@pytest.mark.parametrize(
    "mutant, prop",
    [(_ignores_options, "reference"), (_zero_bootstrap, "reference"), (_bootstrap_from_padding, "poison")],
)
def test_configuration_mutants_are_caught(mutant, prop):
    result = fuzz_target(mutant(DECLARED), DECLARED, target="mutant", max_examples=600, seed=0)
    assert result.finding(prop) is not None, {p: n for p, n in result.failed.items() if n}
    found = result.finding(prop)
    if mutant is _ignores_options:
        assert found.case.options  # the shrunk case names the option it needs
        assert found.to_dict()["options"] == found.case.options
    else:
        assert found.case.truncated is not None and bool(found.case.truncated.any())


def test_the_targets_listing_shows_each_entry_option_space_and_truncation(tmp_path):
    from maskfuzz.targets import listing
    from maskfuzz.targets.registry import TargetSpec

    spec = TargetSpec(
        id="toy",
        adapter="toy_adapter",
        own=("toy",),
        contract="compressed",
        entries=("default", "grpo"),
        entry_overrides={"default": {"options": SPACE, "truncation": BOOT}},
    )
    (row,) = listing.rows(cache=tmp_path, specs={"toy": spec})
    conf = row["configuration"]
    assert list(conf) == ["default"]  # grpo has no options and no truncation semantics
    assert [o["name"] for o in conf["default"]["options"]] == ["norm_adv", "reward_clip", "mask_no_eos"]
    assert conf["default"]["truncation"]["semantics"] == "bootstrap from the state value"
    text = listing.render([row], cache=tmp_path, verbose=True, width=400)
    assert "option default" not in listing.render([row], cache=tmp_path)  # details only with --verbose
    assert "option default: norm_adv = false|true (default false; fw/trainer.py:10)" in text
    assert "truncation default: bootstrap from the state value (test.py:1)" in text


def test_a_finding_that_needs_an_option_is_saved_and_replays_with_it(tmp_path):
    result = fuzz_target(_ignores_options(DECLARED), DECLARED, target="mutant", max_examples=300, seed=0)
    found = result.finding("reference")
    path = corpus.save(corpus.entry_from_finding(found), tmp_path)
    data = json.loads(path.read_text())
    assert data["options"] == found.case.options and data["case"]["options"] == found.case.options
    assert "options:" in data["signature"]
    entry = corpus.load(path)
    verdicts = {v.property: v for v in judge(_ignores_options(DECLARED), entry.case, DECLARED)}
    assert verdicts["reference"].failed
    fixed = {v.property: v for v in judge(_configured_reference(DECLARED), entry.case, DECLARED)}
    assert not fixed["reference"].failed


def test_a_finding_keeps_only_the_options_and_the_cut_rows_it_needs():
    """The mutant ignores every option: with the score 3 clipped to 1 the reference fails through
    `reward_clip`; `mask_no_eos` (no row is cut) and `norm_adv` are not needed and go back to their
    defaults, and the cut flag goes too."""
    from maskfuzz.fuzz.engine import _simplest_configuration

    run = _ignores_options(DECLARED)
    case = _one_row(
        score=[3.0],
        dtype="float32",
        truncated=[False],
        options={"reward_clip": 1.0, "mask_no_eos": True, "norm_adv": False},
    )
    (verdict,) = [v for v in judge(run, case, DECLARED) if v.property == "reference"]
    assert verdict.failed
    simple, again = _simplest_configuration(run, DECLARED, case, verdict, "cpu")
    assert simple.options == {"reward_clip": 1.0} and simple.truncated is None and again.failed


def test_values_absent_at_a_pin_leave_the_option_space_with_a_note():
    """A mode the code at a pin lacks (verl's token-sum before 0.6) is never drawn: fuzzing it files a tool error."""
    from maskfuzz.oracles.options import Option, without

    mode = Option("critic.loss_agg_mode", ("token-mean", "token-sum", "seq-mean-token-sum"), "token-mean", "x.py:1",
                  effect={"token-sum": {"variant": {"mode": "token-sum"}}})  # fmt: skip
    other = Option("critic.cliprange_value", (0.5, 0.2), 0.5, "x.py:2")
    space, notes = without((mode, other), {"critic.loss_agg_mode": (("token-sum",), "agg_loss has modes ...")})
    assert space[0].values == ("token-mean", "seq-mean-token-sum") and "token-sum" not in space[0].effect
    assert space[1] is other
    assert len(notes) == 1 and "token-sum not drawn" in notes[0]
    with pytest.raises(ValueError, match="default"):
        without((mode,), {"critic.loss_agg_mode": (("token-mean",), "gone")})

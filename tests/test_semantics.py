"""Semantics cards: the variant an entry implements, inferred on clean cases; a change of a card is a
behaviour change, reported and bisected as such, never a defect."""

from __future__ import annotations

import contextlib
import json

import kind_zoo as kz
import mutant_zoo as mz
import pytest

from maskfuzz.fuzz.bisect import BAD, FOUND, GOOD, SKIP, Revision, bisect
from maskfuzz.fuzz.bisect_env import SemanticsEvaluator
from maskfuzz.fuzz.cli import main as cli
from maskfuzz.fuzz.report import write_report
from maskfuzz.fuzz.semantics import card, clean_cases
from maskfuzz.oracles.declared import Declared
from maskfuzz.oracles.kinds.semantics import MASKED, SCORE_TAIL, changes

GA = Declared(kind="group-advantage", variant=kz.GA)


@pytest.mark.parametrize(
    "fn,dimension,value",
    [
        (kz.grpo_counts_empty_rows, "empty_rows", "counted"),
        (kz.grpo_biased_std, "std", "biased"),
    ],
)
def test_a_group_advantage_card_names_the_variant_the_code_implements(fn, dimension, value):
    c = card(fn, GA, fn.__name__)
    assert c.cases >= 20 and not c.matches_declared
    d = c.dimension(dimension)
    assert d.told and d.observed == (value,) and not d.as_declared, c.lines()
    others = [x for x in c.dimensions if x.name not in (dimension, MASKED) and x.told]
    assert others and all(x.as_declared for x in others), c.lines()  # nothing else is reported as changed


def test_the_correct_implementation_agrees_with_its_declaration_on_every_dimension():
    c = card(kz.grpo_correct, GA, "grpo_correct")
    assert c.matches_declared and all(d.as_declared for d in c.dimensions if d.told), c.lines()
    assert c.dimension(MASKED).observed == ("zero",)


def test_cases_no_variant_fits_are_named_and_the_dimensions_read_from_the_rest():
    """A fallback on some inputs (whole-batch statistics on unequal groups) must not blank every dimension."""
    c = card(kz.grpo_whole_batch_on_unequal_groups, GA, "fallback")
    assert not c.matches_declared
    assert "fit no variant of ours" in c.note and "groups of" in c.note, c.note
    told = [d for d in c.dimensions if d.told and d.name != MASKED]
    assert told and all(d.as_declared for d in told), c.lines()


def test_a_gae_card_tells_the_contract_and_the_fate_of_a_score_on_a_masked_tail():
    dense = card(mz.as_run(mz.correct_dense), Declared("compressed"), "dense")
    assert dense.dimension("contract").observed == ("dense",) and not dense.matches_declared
    assert dense.dimension(SCORE_TAIL).observed == ("kept",)
    lost = card(mz.as_run(mz.score_on_last_real_token), Declared("dense"), "tail")
    # the contract is inferred on responses without a tail, so the lost score does not hide it
    assert lost.dimension("contract").observed == ("dense",), lost.lines()
    assert lost.dimension(SCORE_TAIL).observed[0] in ("lost", "decayed"), lost.lines()


def test_clean_cases_carry_no_poison_and_no_options():
    cases = clean_cases(GA, n=12)
    assert len(cases) == 12 + 4  # the drawn cases after the group advantages' four well-conditioned probes
    for c in cases:
        dead = ~c.trainable
        assert not bool((c.token_rewards[dead] != 0).any()) and c.options == {} and c.truncated is None
    with pytest.raises(ValueError):
        clean_cases(GA, n=0)


def test_changes_lists_the_dimensions_that_differ_and_ignores_what_the_cases_cannot_tell():
    a = card(kz.grpo_correct, GA, "x").to_json()
    b = card(kz.grpo_counts_empty_rows, GA, "x").to_json()
    assert changes(a, b) == [("empty_rows", "excluded", "counted")]
    assert changes(a, a) == []
    hidden = json.loads(json.dumps(b))
    for d in hidden["dimensions"]:
        d["told"] = False
    assert changes(a, hidden) == []


class _Repo:
    def __init__(self, n: int):
        self.revs = [Revision(f"r{i}") for i in range(n + 1)]

    def describe(self, rev):
        return self.revs[int(rev[1:])]

    def revisions(self, old, new, first_parent=False):
        return self.revs[int(old[1:]) + 1 : int(new[1:]) + 1]


class _Handle:
    def __init__(self, run):
        self.run, self.declared = run, GA


def test_a_behaviour_change_bisects_to_the_revision_that_changed_the_card():
    """r0..r9: the code counts empty rows from r6 on; r3 cannot be set up (a skip)."""

    @contextlib.contextmanager
    def opener(ref, repos=None, device="cpu", timeout=60.0):
        n = int(ref[2][1:])
        if n == 3:
            raise RuntimeError("cannot import r3")
        yield _Handle(kz.grpo_counts_empty_rows if n >= 6 else kz.grpo_correct)

    ev = SemanticsEvaluator("zoo", "empty_rows", opener=opener, ref_factory=lambda t, e, p: (t, e, p))
    result = bisect(_Repo(9), ev, "r0", "r9")
    assert result.result == FOUND and result.commit.id == "r6", result.reason
    assert result.old_outcome.verdict == GOOD and result.new_outcome.verdict == BAD
    assert "counted (was excluded)" in result.new_outcome.reason
    assert ev(Revision("r3")).verdict == SKIP


def _night(path, card_json, resolved):
    data = {"profile": "dev", "seed": 0, "targets": [{
        "target": "zoo:grpo@main", "pin": "main", "resolved": resolved, "status": "ok", "examples": 10,
        "findings": [], "defects": [], "checked": {}, "failed": {}, "semantics": card_json,
        "facts": [{"id": "zoo:grpo/variant-mismatch", "kind": "semantics", "mechanism": "variant-mismatch",
                   "properties": ["reference"], "evidence": "the output equals the reference with std='biased'",
                   "why_not_a_defect": "no promise covers reference"}],
    }]}  # fmt: skip
    path.write_text(json.dumps(data))
    return path


def test_the_report_shows_a_changed_card_as_a_behaviour_change_with_its_bisect_command(tmp_path):
    a = card(kz.grpo_correct, GA, "zoo:grpo@main").to_json()
    b = card(kz.grpo_counts_empty_rows, GA, "zoo:grpo@main").to_json()
    prev = _night(tmp_path / "prev.json", a, "a" * 40)
    now = _night(tmp_path / "now.json", b, "b" * 40)
    doc, cmp = write_report([now], tmp_path / "out", previous=[prev], now="2026-12-01T00:00:00Z")
    assert cmp.behaviour == [("zoo:grpo@main", "empty_rows", "excluded", "counted", "a" * 40, "b" * 40)]
    assert not cmp.new and not cmp.still  # a fact or a changed card is never a finding
    md = (tmp_path / "out" / "report.md").read_text()
    assert "Behaviour changes (1)" in md and f"--semantics 'empty_rows' --target zoo:grpo --old {'a' * 40}" in md
    assert "Facts (1)" in md and "std='biased'" in md and "Semantics (1)" in md
    data = json.loads((tmp_path / "out" / "report.json").read_text())
    assert data["behaviour_changes"][0]["tonight"] == "counted" and data["semantics"]["zoo:grpo@main"]
    # the next night compares against the report itself: the same card again is no change
    _, again = write_report([now], tmp_path / "out2", previous=[tmp_path / "out" / "report.json"])
    assert again.behaviour == []


@pytest.mark.parametrize(
    "argv,message",
    [
        (["bisect", "--semantics", "nonsense", "--target", "verl", "--old", "0.4.1", "--new", "0.5.0"], "unknown"),
        (["bisect", "--semantics", "contract", "--old", "0.4.1", "--new", "0.5.0"], "needs --target"),
        (["bisect", "--old", "0.4.1", "--new", "0.5.0", "--target", "verl"], "give a CASE"),
        (["targets", "--semantics", "verl:grpo"], "name the pin"),
        (["targets", "--semantics", "verl:grpo@0.9.1", "--cases", "0"], "whole number >= 1"),
    ],
)
def test_bad_semantics_arguments_are_usage_errors_before_any_work(argv, message, capsys):
    try:
        code = cli(argv)
    except SystemExit as exc:  # argparse refuses a bad count itself
        code = exc.code
    assert code == 2
    assert message in capsys.readouterr().err


def test_the_nightly_bisects_a_behaviour_change_at_a_pin_that_moved(tmp_path):
    from maskfuzz.fuzz import nightly_bisect
    from maskfuzz.fuzz.report import compare, load_night

    a = card(kz.grpo_correct, GA, "zoo:grpo@main").to_json()
    b = card(kz.grpo_counts_empty_rows, GA, "zoo:grpo@main").to_json()
    prev = load_night([_night(tmp_path / "prev.json", a, "a" * 40)])
    now = load_night([_night(tmp_path / "now.json", b, "b" * 40)])
    jobs, not_bisected = nightly_bisect.plan(compare(now, prev), now, prev)
    (job,) = jobs
    assert job.kind == nightly_bisect.BEHAVIOUR and job.case is None and not not_bisected
    argv = job.argv(tmp_path / "j.json", 60.0)
    assert argv[:3] == ["bisect", "--semantics", "empty_rows"] and "a" * 40 in argv and "--commits" in argv
    same = load_night([_night(tmp_path / "same.json", b, "a" * 40)])  # the pin did not move: nothing to bisect
    assert nightly_bisect.plan(compare(same, prev), same, prev)[0] == []

"""Reach evidence (fuzz/evidence.py, issue 27): `executed` only where a stored validation reproduced the finding
at the pin; `cited` for a pipeline reach nothing ran; a validation that did not back the finding is shown, never
turned into evidence. The corpus keeps the validation bit for bit and rejects a malformed one."""

from __future__ import annotations

import dataclasses
import json

import pytest

from maskfuzz.fuzz import corpus, evidence
from maskfuzz.fuzz.corpus_codec import CorpusError
from maskfuzz.fuzz.nights import Failure, Identity
from maskfuzz.fuzz.report import _defect_rows

HASH = "c09bc8bc9f43" + "0" * 28
RECORD = {
    "target": "roll@c09bc8bc9f43",
    "resolved": HASH,
    "recipe": {"hooked_boundary": "after the real rollout, before critic values enter compute_advantage"},
    "verdict": {"reproduced": True, "line": "reproduced: the masked critic value(s) [100.0] moved 1 output"},
}
DEFECT = {"defect": "roll/masked-value-bootstrap", "mechanism": "masked-value-bootstrap", "reach": "pipeline",
          "reach_how": "the recorded pipeline witness still violates it", "severity": "high", "class": "defect",
          "promise": "universal:poison", "promise_text": "what the pipeline can place ...",
          "reach_evidence": "cited"}  # fmt: skip


def test_executed_needs_a_reproduced_validation_at_the_same_code():
    v = evidence.stored(RECORD, date="2026-12-02T00:00:00Z")
    assert evidence.reach_evidence("pipeline", v) == "executed"
    assert evidence.reach_evidence("api", v, HASH[:12]) == "executed"  # a hash prefix is the same code
    assert evidence.reach_evidence("pipeline", v, "090ac94658ad" + "0" * 28) == "cited"  # another pin
    assert evidence.reach_evidence("pipeline", dict(v, reproduced=False)) == "cited"
    assert evidence.reach_evidence("api", None) == ""
    assert evidence.same_rev("verl==0.5.0", "verl==0.5.0") and not evidence.same_rev("verl==0.5.0", "verl==0.5")


def test_applied_upgrades_a_defect_and_only_notes_a_validation_that_does_not_back_it():
    v = evidence.stored(RECORD, date="2026-12-02T00:00:00Z")
    api = dict(DEFECT, reach="api", reach_evidence="")
    up = evidence.applied(api, v, HASH)
    assert (up["reach"], up["reach_evidence"]) == ("pipeline", "executed") and "real rollout" in up["reach_how"]
    nb = evidence.not_built("roll@c09bc8bc9f43", HASH, "the real path built no batch holding ...", date="d")
    kept = evidence.applied(DEFECT, nb, HASH)
    assert (kept["reach"], kept["reach_evidence"]) == ("pipeline", "cited")
    assert kept["reach_note"].startswith("the real path did not build it at roll@c09bc8bc9f43")
    fact = dict(DEFECT, **{"class": "semantics"})
    del fact["promise"]
    assert evidence.applied(fact, v, HASH) == fact  # a fact breaks no promise: no reach to evidence
    assert evidence.label("pipeline", "executed") == "pipeline (executed)" and evidence.label("api", "") == "api"


@pytest.mark.parametrize(
    "bad, field",
    [({"reproduced": "yes"}, "validation.reproduced"), ({"built": False}, "validation.reproduced"),
     ({"line": None}, "validation.line")],
)  # fmt: skip
def test_a_malformed_validation_is_rejected(bad, field):
    v = dict(evidence.stored(RECORD, date="d"), **bad)
    with pytest.raises(evidence.ValidationError) as info:
        evidence.check(v)
    assert info.value.field == field


def test_the_corpus_keeps_a_validation_and_rejects_a_corrupt_one(tmp_path):
    src = next(p for p in corpus.discover(["corpus/roll"]) if "poison-eea9356e" in p.name)
    entry = corpus.load(src)
    copy = tmp_path / entry.relpath
    copy.parent.mkdir(parents=True)
    copy.write_bytes(src.read_bytes())
    entry = corpus.load(copy)
    v = evidence.stored(RECORD, date="2026-12-02T00:00:00Z")
    corpus.rewrite(dataclasses.replace(entry, validation=v))
    again = corpus.load(copy)
    assert again.validation == v and again.id == entry.id
    data = json.loads(copy.read_text())
    data["validation"]["built"] = "no"
    copy.write_text(json.dumps(data))
    with pytest.raises(CorpusError, match="validation.built"):
        corpus.load(copy)
    with pytest.raises(CorpusError, match="not loaded from a file"):
        corpus.rewrite(dataclasses.replace(entry, path=None))


def test_the_report_says_how_the_reach_is_known():
    def failure(evidence_, note=""):
        t = dict(DEFECT, reach_evidence=evidence_) | ({"reach_note": note} if note else {})
        return Failure(Identity("roll", "c09bc8bc9f43", "poison", "sig"), triage=t)

    (row,) = _defect_rows([failure("cited"), failure("executed")], {})
    assert row[3] == "pipeline (executed)"
    (row,) = _defect_rows([failure("cited", "the real path did not build it at roll@x: ...")], {})
    assert row[3] == "pipeline (cited); the real path did not build it at roll@x: ..."
    # one finding of the defect executed, another not built: the note is the other finding's
    (row,) = _defect_rows([failure("executed"), failure("cited", "the real path did not build it at roll@x: ...")], {})
    assert row[3] == "pipeline (executed); another finding: the real path did not build it at roll@x: ..."


def test_record_is_refused_at_another_pin_before_any_work(tmp_path, capsys):
    from maskfuzz.fuzz.cli import main

    src = next(p for p in corpus.discover(["corpus/roll"]) if "poison-eea9356e" in p.name)
    before = src.read_bytes()
    code = main(["validate", str(src), "--target", "roll@090ac94658ad", "--record", "-o", str(tmp_path / "v")])
    assert code == 2 and "record at its pin only" in capsys.readouterr().err
    assert src.read_bytes() == before and not (tmp_path / "v").exists()


# the validations `maskfuzz validate --record` stored in the corpus (each at the entry's own pin): reproduced, or
# the real path built no batch holding the case (then the reach stays cited, with the note)
RECORDED = {
    "corpus/roll/poison-eea9356e726af9b5.json": "executed",  # roll@c09bc8bc9f43, ROLL's RLVR batch code
    "corpus/verl/reference-a1406ab1912c899c.json": "executed",  # verl@0.1, the PPO trainer's single-turn path
    "corpus/skyrl/poison-dbee94a8364d80ce.json": "executed",  # skyrl@0.3.1, the whole 64-row step
    "corpus/skyrl/telescoping-77f071a1acc1d060.json": "cited",  # needs TR: SkyRL's multi-turn generator
    "corpus/verl/poison-17351e2105c2533b.json": "cited",  # needs TRT: a tool turn
}


@pytest.mark.parametrize("path", sorted(RECORDED))
def test_the_recorded_validations_give_the_reach_at_the_entrys_own_pin(path):
    entry = corpus.load(path)
    v = entry.validation
    assert v is not None and v["built"] == (RECORDED[path] == "executed") and v["reproduced"] == v["built"]
    assert v["target"] == f"{entry.key}@{entry.pin}"
    triage = evidence.applied(entry.triage, v, v["resolved"])
    assert (triage["reach"], triage["reach_evidence"]) == ("pipeline", RECORDED[path])
    assert ("reach_note" in triage) == (RECORDED[path] == "cited")
    assert evidence.reach_evidence("pipeline", v, "0" * 40) == "cited"  # at other code: nothing ran

"""The typed result of a fuzz job (`fuzz.job_result`): it writes exactly the fields `maskfuzz fuzz --json` always
wrote, reads them back (a previous night's file included) into an equal value, and a corrupt file is refused
naming the file and the field."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from maskfuzz.fuzz.cli import main
from maskfuzz.fuzz.commands import fuzz as fuzz_cmd
from maskfuzz.fuzz.corpus_codec import case_to_json
from maskfuzz.fuzz.job_result import DefectRow, FactRow, FindingRow, JobResult, ResultFieldError, RunResult
from maskfuzz.oracles.case import Case
from maskfuzz.oracles.verdict import PROPERTIES

CASE = Case.build(trainable=[[1, 1, 0, 1, 0]], values=[[0.5, 0.25, 9.0, 1.0, 3.0]], score=[1.0], dtype="float32")
PROMISE = {"promise": "universal:poison", "promise_text": "a masked value never enters an output"}

SKIPPED_KEYS = ["target", "pin", "resolved", "status", "reason", "examples", "seconds", "defects", "findings",
                "checked", "failed", "notes", "where", "kind", "entry"]  # fmt: skip
FINDING_KEYS = ["property", "defect", "mechanism", "evidence", "reach", "reach_evidence", "severity", "reach_how",
                "class", "promise", "promise_text", "witness", "shape", "output", "message", "positions", "expected",
                "observed", "also", "options", "case", "corpus_file"]  # fmt: skip


def _ran(corpus_file: str = "corpus/usergae/poison-0123456789abcdef.json") -> JobResult:
    case = case_to_json(CASE)
    defect = FindingRow(
        "poison", defect="usergae/masked-value-bootstrap", mechanism="masked-value-bootstrap", reach="api",
        severity="high", klass="defect", promise=PROMISE, shape=(1, 5), output="advantages", message="poison moved",
        positions=((0, 1),), expected=[0.0], observed=[1.5], also=("reference",), case=case, corpus_file=corpus_file,
    )  # fmt: skip
    fact = FindingRow("reference", mechanism="other-variant", klass="semantics", why_not_a_defect="a variant",
                      shape=(1, 5), case=case)  # fmt: skip
    return JobResult(
        "usergae:leaky", "local", status="ok", examples=40, seconds=1.25,
        defects=(DefectRow("usergae/masked-value-bootstrap", "masked-value-bootstrap", reach="api", severity="high",
                           properties=("poison", "reference"), promise=PROMISE, case=case),),
        findings=(defect, fact), checked={p: 40 for p in PROPERTIES}, failed={"poison": 3, "reference": 2},
        notes=("seed 1: flaky",), kind="gae", callable="usergae:leaky", contract="dense",
        domain_restrictions={"gaps": "one response, then padding"}, fixed_options={"norm": True}, card_tried=True,
        semantics=None,
        restarts=1, pipeline_declared=False, first_failure_s=0.5, information={"affine": {"drift": 0.25}},
        configuration={"options": [], "truncation": None}, facts=(FactRow("usergae/other-variant", "semantics"),),
    )  # fmt: skip


def _write(path, *targets: JobResult, profile: str = "nightly"):
    run = RunResult(profile, 20261202, 3.5, tuple(targets))
    path.write_text(json.dumps(run.to_json(), indent=1, allow_nan=True) + "\n")
    return path


def test_a_skipped_job_writes_the_fields_it_always_wrote_and_no_more():
    skipped = JobResult("verl:grpo@0.4.1", "0.4.1", status="skipped", reason="no such function at this pin")
    assert list(skipped.to_json()) == SKIPPED_KEYS
    assert skipped.to_json()["defects"] == [] and skipped.to_json()["checked"] == {}
    # the card tried before the skip: written, null when it could not be inferred
    assert list(JobResult("x@1", "1", status="skipped", card_tried=True).to_json()) == SKIPPED_KEYS + ["semantics"]


def test_a_job_that_ran_writes_its_fields_in_order_and_reads_back_equal(tmp_path):
    job = _ran()
    data = job.to_json()
    assert list(data) == SKIPPED_KEYS + ["callable", "contract", "domain_restrictions", "fixed_options", "semantics",
                                         "restarts", "pipeline_declared", "first_failure_s", "information",
                                         "configuration", "facts"]  # fmt: skip
    assert list(data["findings"][0]) == FINDING_KEYS
    assert "why_not_a_defect" in data["findings"][1] and data["findings"][1]["class"] == "semantics"
    assert data["findings"][0]["positions"] == [[0, 1]] and data["findings"][0]["shape"] == [1, 5]
    assert data["semantics"] is None and data["defects"][0]["promise"] == "universal:poison"
    assert data["domain_restrictions"] == {"gaps": "one response, then padding"}  # field -> the target's reason
    path = _write(tmp_path / "r.json", job)
    back = RunResult.from_json(json.loads(path.read_text()))
    assert back.targets == (job,)
    assert json.dumps(back.to_json()) == json.dumps(json.loads(path.read_text()))  # the same file, byte for byte
    assert back.defects and back.targets[0].label == "usergae:leaky@local"
    assert [f.is_defect for f in back.targets[0].findings] == [True, False]


def test_an_older_file_without_the_newer_fields_still_reads():
    old = {"profile": "ci", "targets": [{"target": "verl@0.4.1", "status": "ok", "findings": [
        {"property": "poison", "case": case_to_json(CASE)}]}]}  # fmt: skip
    (t,) = RunResult.from_json(old).targets
    assert (t.pin, t.kind, t.entry, t.where, t.notes, t.examples) == ("", "gae", "", "", (), 0)
    assert t.findings[0].klass == "" and t.findings[0].is_defect  # untriaged: counted as a defect


@pytest.mark.parametrize("corrupt, field", [
    (lambda t: t.pop("status"), "targets[0].'status' is missing"),
    (lambda t: t["findings"][0].pop("property"), "targets[0].findings[0].'property' is missing"),
    (lambda t: t["findings"][0].pop("case"), "targets[0].findings[0].'case' is missing"),
    (lambda t: t["checked"].update(poison="many"), "targets[0].'checked'['poison'] expected a count, got str"),
    (lambda t: t.update(examples="40"), "targets[0].'examples' expected int or float, got str"),
    (lambda t: t["facts"].append(["not", "a", "fact"]), "targets[0].facts[1] expected an object, got list"),
])  # fmt: skip
def test_a_corrupt_previous_night_names_the_file_and_the_field(tmp_path, capsys, corrupt, field):
    tonight = _write(tmp_path / "tonight.json", _ran())
    data = json.loads(tonight.read_text())
    corrupt(data["targets"][0])
    with pytest.raises(ResultFieldError) as caught:
        RunResult.from_json(data)
    assert str(caught.value) == f"field {field}"
    previous = tmp_path / "previous night.json"
    previous.write_text(json.dumps(data))
    out = tmp_path / "out"
    assert main(["report", str(tonight), "--previous", str(previous), "-o", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"{previous}: field {field}" in err
    assert not out.exists()  # nothing half-written


def test_a_previous_nights_file_written_by_the_type_is_compared_with_tonight(tmp_path):
    """The previous night's `maskfuzz fuzz --json`, read back through the type: the same defect is still failing,
    a defect gone from a target that ran is fixed, and the fact is never a finding."""
    gone = dataclasses.replace(_ran(), target="usergae:gone", callable="usergae:gone")
    previous = _write(tmp_path / "previous.json", _ran(), gone)
    clean = dataclasses.replace(gone, findings=(), defects=(), failed={})
    tonight = _write(tmp_path / "tonight.json", _ran(), clean)
    out = tmp_path / "out"
    assert main(["report", str(tonight), "--previous", str(previous), "-o", str(out), "--quiet"]) == 0
    report = json.loads((out / "report.json").read_text())
    states = {(f["target"], f["property"]): f["state"] for f in report["findings"]}
    assert states == {("usergae:leaky", "poison"): "still-failing", ("usergae:gone", "poison"): "fixed"}
    assert {f["kind"] for f in report["facts"]} == {"semantics"}
    cov = {c["target"]: c for c in report["coverage"]}
    assert cov["usergae:leaky"]["examples"] == 40 and cov["usergae:leaky"]["failed"] == {"poison": 3, "reference": 2}


LEAKY = '''
def leaky(*, token_rewards, values, trainable, attention, score, gamma, lam):
    """Hands the values back as advantages: a masked value leaks into the output."""
    return values.clone(), values.clone()
'''


def test_a_job_run_by_the_engine_writes_the_same_fields_and_reads_back_byte_for_byte(tmp_path, monkeypatch):
    """The producer: `run_job` on a --callable gives a JobResult whose JSON has the fields of a callable job that
    ran, in order, and survives the trip through a results file unchanged."""
    (tmp_path / "userleak.py").write_text(LEAKY)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    job = fuzz_cmd.Job("userleak:leaky", True, "dense", {}, 20, None, 0, True, False, True, "cpu", 30.0,
                       str(tmp_path / "corpus"), True)  # fmt: skip
    result = fuzz_cmd.run_job(job)
    assert isinstance(result, JobResult) and result.ran, result.reason
    data = result.to_json()
    assert [k for k in data if k != "information"] == SKIPPED_KEYS + [
        "callable", "contract", "semantics", "restarts", "pipeline_declared", "first_failure_s", "facts"]  # fmt: skip
    assert result.defects and any(f.corpus_file for f in result.findings)
    assert all((tmp_path / f.corpus_file).is_file() or Path(f.corpus_file).is_file()
               for f in result.findings if f.corpus_file)  # fmt: skip
    path = _write(tmp_path / "r.json", result)
    text = json.dumps(json.loads(path.read_text()))
    assert json.dumps(RunResult.from_json(json.loads(path.read_text())).to_json()) == text

"""JUnit XML of `maskfuzz fuzz --junit`: one testcase per target x property, failures for findings,
skips with reasons; it parses with xml.etree and its counts add up."""

from __future__ import annotations

import json
import textwrap
import xml.etree.ElementTree as ET

import pytest

from maskfuzz.fuzz.cli import main
from maskfuzz.fuzz.corpus_codec import case_to_json
from maskfuzz.fuzz.job_result import RunResult
from maskfuzz.fuzz.junit import write_junit
from maskfuzz.oracles.case import Case
from maskfuzz.oracles.verdict import PROPERTIES

CASE = Case.build(trainable=[[1, 1, 0]], values=[[0.5, 0.25, 9.0]], score=[1.0], dtype="float32")


def _target(label, status="ok", findings=(), reason="", checked=None, failed=None):
    return {
        "target": label,
        "pin": label.partition("@")[2],
        "resolved": "",
        "status": status,
        "reason": reason,
        "examples": 40,
        "seconds": 2.0,
        "findings": list(findings),
        "checked": checked if checked is not None else {p: 40 for p in PROPERTIES},
        "failed": failed if failed is not None else {p: 0 for p in PROPERTIES},
        "notes": [],
        "where": "",
    }


def _finding(prop, message):
    return {
        "property": prop,
        "shape": [1, 3],
        "output": "advantages",
        "message": message,
        "positions": [[0, 1]],
        "expected": [0.0],
        "observed": [float("nan")],
        "also": ["reference"],
        "case": case_to_json(CASE),
        "corpus_file": "corpus/verl/poison-0123456789abcdef.json",
    }


def _cases(root):
    return {(tc.get("classname"), tc.get("name")): tc for tc in root.iter("testcase")}


def test_counts_failures_and_skips(tmp_path):
    n = len(PROPERTIES)
    payload = {"profile": "ci", "seed": 3, "seconds": 9.5, "targets": [
        _target("verl@0.4.1", findings=[_finding("poison", "poison changed <adv> & \x1b[31mred\x07")],
                checked={p: 40 for p in PROPERTIES} | {"masked-zero": 0},
                failed={p: 0 for p in PROPERTIES} | {"poison": 5, "row-independence": 1}),
        _target("skyrl@0.3.1", "skipped", reason="no compute_gae_advantage_return at this pin"),
        _target("trl@1.12.0", "error", reason="cannot download trl==1.12.0\nrun with network"),
    ]}  # fmt: skip
    path = tmp_path / "sub" / "fuzz.xml"
    write_junit(RunResult.from_json(payload), path)  # as `maskfuzz fuzz --json` wrote it, read back
    root = ET.parse(path).getroot()  # parses although a message held control characters
    assert root.tag == "testsuites"
    assert (root.get("tests"), root.get("failures"), root.get("skipped"), root.get("errors")) == (
        str(3 * n),
        "2",
        str(1 + 2 * n),
        "0",
    )
    suites = {s.get("name"): s for s in root.findall("testsuite")}
    assert set(suites) == {"verl@0.4.1", "skyrl@0.3.1", "trl@1.12.0"}
    assert suites["verl@0.4.1"].get("failures") == "2" and suites["verl@0.4.1"].get("skipped") == "1"
    cases = _cases(root)
    assert len(cases) == 3 * n
    poison = cases[("maskfuzz.verl@0.4.1", "poison")].find("failure")
    assert poison.get("type") == "poison" and "poison changed <adv> &" in poison.get("message")
    assert "signature: poison|advantages|" in poison.text and "poison-0123456789abcdef.json" in poison.text
    rows = cases[("maskfuzz.verl@0.4.1", "row-independence")].find("failure")
    assert "not shrunk" in rows.get("message")
    assert "applied to none" in cases[("maskfuzz.verl@0.4.1", "masked-zero")].find("skipped").get("message")
    assert cases[("maskfuzz.verl@0.4.1", "reference")].find("failure") is None
    skip = cases[("maskfuzz.skyrl@0.3.1", "poison")].find("skipped")
    assert "no compute_gae_advantage_return" in skip.get("message")
    err = cases[("maskfuzz.trl@1.12.0", "no-crash")].find("skipped")
    assert "could not be set up: cannot download trl==1.12.0" in err.get("message") and "network" in err.text


MODULE = textwrap.dedent(
    '''
    import torch

    def leaky(*, token_rewards, values, trainable, attention, score, gamma, lam):
        """Raw values at masked positions bootstrap the recursion (the seed bug)."""
        b, t_len = values.shape
        rewards = (token_rewards * trainable).clone()
        idx = torch.arange(t_len).expand(b, t_len)
        last = torch.where(trainable > 0, idx, torch.zeros_like(idx)).max(dim=1).values
        has = trainable.sum(dim=1) > 0
        rewards[torch.arange(b)[has], last[has]] += score[has]
        adv, acc = torch.zeros_like(values), torch.zeros(b, dtype=values.dtype)
        for t in reversed(range(t_len)):
            nxt = values[:, t + 1] if t + 1 < t_len else torch.zeros(b, dtype=values.dtype)
            acc = rewards[:, t] + gamma * nxt - values[:, t] + gamma * lam * acc
            adv[:, t] = acc
        return adv * trainable, (adv + values) * trainable
    '''
)


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "usergae.py").write_text(MODULE)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_fuzz_junit_and_report_end_to_end(user_module):
    """A real `maskfuzz fuzz --json --junit` run (user callable in a worker), then `maskfuzz report`."""
    out = user_module / "out"
    code = main(
        [
            "fuzz",
            "--callable",
            "usergae:leaky",
            "--contract",
            "dense",
            "--max-examples",
            "10",
            "--seed",
            "1",
            "--json",
            str(out / "f.json"),
            "--junit",
            str(out / "f.xml"),
            "--corpus",
            "corpus",
            "--quiet",
        ]
    )
    assert code == 1
    payload = json.loads((out / "f.json").read_text())
    root = ET.parse(out / "f.xml").getroot()
    found = {f["property"] for f in payload["targets"][0]["findings"] if f["class"] == "defect"}
    facts = {f["property"] for f in payload["targets"][0]["findings"] if f["class"] != "defect"} - found
    failing = {tc.get("name") for tc in root.iter("testcase") if tc.find("failure") is not None}
    assert "poison" in found and found <= failing and not (facts & failing)  # a fact is no failed test
    assert int(root.get("tests")) == len(PROPERTIES)
    assert main(["report", str(out / "f.json"), "-o", str(out / "report"), "--quiet"]) == 0
    data = json.loads((out / "report" / "report.json").read_text())
    assert {f["property"] for f in data["findings"] if f["state"] == "new"} == found
    assert all((out / "report" / f["corpus_file"]).is_file() for f in data["open"])

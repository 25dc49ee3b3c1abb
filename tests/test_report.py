"""`maskfuzz report`: the nightly diff (new / still failing / fixed / unknown), the matrix, the
self-contained HTML, links to corpus entries and reproducers, and exit 2 on unreadable input.

Result files are built here in the exact format `maskfuzz fuzz --json` / `maskfuzz replay --json`
write (findings carry a real canonical case, so signatures are computed as the corpus does)."""

from __future__ import annotations

import json
from html.parser import HTMLParser
from pathlib import Path

import pytest

from maskfuzz.fuzz import report as rep
from maskfuzz.fuzz.cli import main
from maskfuzz.fuzz.corpus import save
from maskfuzz.fuzz.corpus_codec import Entry, Found, case_to_json
from maskfuzz.fuzz.signature import signature
from maskfuzz.oracles.case import Case
from maskfuzz.oracles.kinds import ALL_PROPERTIES
from maskfuzz.oracles.verdict import PROPERTIES, Verdict

# one row: trainable, trainable, observation (masked-real), trainable, padding
CASE = Case.build(
    trainable=[[1, 1, 0, 1, 0]],
    attention=[[1, 1, 1, 1, 0]],
    values=[[0.5, 0.25, 9.0, 1.0, 3.0]],
    score=[1.0],
    gamma=1.0,
    lam=1.0,
    dtype="float32",
)


def finding(prop: str, positions: list, output: str = "advantages", message: str = "", corpus_file=None) -> dict:
    """A finding dict as `maskfuzz fuzz --json` writes it (Finding.to_dict + corpus_file)."""
    return {
        "property": prop, "shape": list(CASE.shape), "output": output,
        "message": message or f"{prop} fails ({len(positions)} position(s) of {output})",
        "positions": positions, "expected": [0.0] * len(positions), "observed": [float("nan")] * len(positions),
        "also": [], "case": case_to_json(CASE), "corpus_file": corpus_file,
    }  # fmt: skip


def target(label: str, status: str = "ok", findings=(), reason: str = "", failed=None, checked=None) -> dict:
    pin = label.partition("@")[2]
    checked = {p: 50 for p in PROPERTIES} | {"masked-zero": 0} | (checked or {})
    failed = {p: 0 for p in PROPERTIES} | {f["property"]: 7 for f in findings} | (failed or {})
    if status != "ok":
        checked, failed = {}, {}
    return {
        "target": label,
        "pin": pin,
        "resolved": f"{label.split('@')[0]}=={pin}",
        "status": status,
        "reason": reason,
        "examples": 50 if status == "ok" else 0,
        "seconds": 1.5,
        "findings": list(findings),
        "checked": checked,
        "failed": failed,
        "notes": [],
        "where": "pkg/mod.py::gae",
    }


def write_fuzz(path: Path, *targets: dict) -> Path:
    path.write_text(json.dumps({"profile": "nightly", "seed": 0, "seconds": 3.0, "targets": list(targets)}))
    return path


POISON = finding("poison", [[0, 1]], "returns")  # position kind: before-gap
REFERENCE = finding("reference", [[0, 3]])  # last-trainable
SCORE = finding("score-kept", [[0, 3]])


def run_report(tmp_path: Path, results: list[Path], previous: list[Path] = (), name: str = "out", extra=()) -> dict:
    out = tmp_path / name
    argv = ["report", *map(str, results), "-o", str(out), "--quiet", *extra]
    if previous:
        argv += ["--previous", *map(str, previous)]
    assert main(argv) == 0
    return json.loads((out / "report.json").read_text())


def states(data: dict) -> dict:
    return {(f["target"], f["pin"], f["property"]): f["state"] for f in data["findings"]}


def test_identity_uses_the_corpus_signature(tmp_path):
    v = Verdict("poison", "fail", POISON["message"], "returns", [[0, 1]])
    assert signature("poison", v, CASE) == "poison|returns|before-gap|f32"
    night = rep.load_night([write_fuzz(tmp_path / "t.json", target("torchrl:vec@0.14.1", findings=[POISON]))])
    (ident,) = night.failures
    assert ident == rep.Identity("torchrl:vec", "0.14.1", "poison", "poison|returns|before-gap|f32")


def test_new_still_failing_and_fixed(tmp_path):
    prev = write_fuzz(tmp_path / "prev.json", target("verl@0.4.1", findings=[POISON, REFERENCE]))
    tonight = write_fuzz(tmp_path / "tonight.json", target("verl@0.4.1", findings=[REFERENCE, SCORE]))
    data = run_report(tmp_path, [tonight], [prev])
    assert states(data) == {
        ("verl", "0.4.1", "poison"): "fixed",  # gone, and poison held on every example tonight
        ("verl", "0.4.1", "reference"): "still-failing",
        ("verl", "0.4.1", "score-kept"): "new",
    }
    fixed = next(f for f in data["findings"] if f["state"] == "fixed")
    assert fixed["signature"] == "poison|returns|before-gap|f32" and "held on all 50" in fixed["why"]
    assert {f["property"] for f in data["open"]} == {"reference", "score-kept"}
    md = (tmp_path / "out" / "report.md").read_text()
    new = md.split("## New (1)")[1].split("## Still failing")[0]
    still = md.split("## Still failing (1)")[1].split("## Fixed")[0]
    fixed_md = md.split("## Fixed since the previous night (1)")[1].split("## Unknown")[0]
    assert "score-kept" in new and "reference" not in new
    assert "reference" in still and "score-kept" not in still
    assert "poison" in fixed_md


def test_without_previous_it_is_a_run_report_and_everything_is_new(tmp_path):
    tonight = write_fuzz(tmp_path / "t.json", target("verl@0.4.1", findings=[POISON]))
    data = run_report(tmp_path, [tonight])
    assert set(states(data).values()) == {"new"}
    md = (tmp_path / "out" / "report.md").read_text()
    assert md.startswith("# maskfuzz run report\n") and "no previous night given" in md
    assert "## Findings (1)" in md and "## Still failing" not in md and "## Unknown" not in md
    sections = [line for line in md.splitlines() if line.startswith("## ")]
    assert sections[:2] == ["## Defects per framework", "## Defects (1)"]  # what affects whom leads


@pytest.mark.parametrize("status", ["skipped", "error"])
def test_a_target_not_checked_tonight_is_unknown_not_fixed(tmp_path, status):
    prev = write_fuzz(tmp_path / "prev.json", target("trl@1.12.0", findings=[POISON]), target("verl@0.4.1"))
    tonight = write_fuzz(
        tmp_path / "tonight.json",
        target("trl@1.12.0", status, reason="wheel not reachable\nmore"),
        target("verl@0.4.1"),
    )
    data = run_report(tmp_path, [tonight], [prev])
    assert states(data) == {("trl", "1.12.0", "poison"): "unknown"}
    (item,) = data["findings"]
    assert f"trl@1.12.0 {status} tonight: wheel not reachable" in item["why"]
    assert data["open"] and data["open"][0]["property"] == "poison"  # carried forward
    md = (tmp_path / "out" / "report.md").read_text()
    assert "## Fixed since the previous night (0)" in md
    assert "## Unknown: open, not checked tonight (1)" in md
    skipped = md.split("## Skipped / errors (1)")[1]
    assert "trl@1.12.0" in skipped and "wheel not reachable" in skipped
    matrix_row = next(line for line in md.splitlines() if line.startswith("| trl@1.12.0"))
    assert matrix_row.count(f"| {status} ") == len(ALL_PROPERTIES)  # the matrix has a column per property of every kind


def test_a_target_absent_tonight_is_unknown(tmp_path):
    prev = write_fuzz(tmp_path / "prev.json", target("trl@1.12.0", findings=[POISON]))
    tonight = write_fuzz(tmp_path / "tonight.json", target("verl@0.4.1"))
    data = run_report(tmp_path, [tonight], [prev])
    assert states(data) == {("trl", "1.12.0", "poison"): "unknown"}
    assert "was not run tonight" in data["findings"][0]["why"]


def test_unknown_is_carried_forward_and_fixed_later(tmp_path):
    """night 1 fails; night 2 skips the target (report.json carries it); night 3 checks it clean."""
    n1 = write_fuzz(tmp_path / "n1.json", target("trl@1.12.0", findings=[POISON]))
    n2 = write_fuzz(tmp_path / "n2.json", target("trl@1.12.0", "skipped", reason="absent"))
    n3 = write_fuzz(tmp_path / "n3.json", target("trl@1.12.0"))
    r1 = run_report(tmp_path, [n1], name="r1")
    assert states(r1) == {("trl", "1.12.0", "poison"): "new"}
    r2 = run_report(tmp_path, [n2], [tmp_path / "r1" / "report.json"], name="r2")
    assert states(r2) == {("trl", "1.12.0", "poison"): "unknown"}
    assert r2["open"][0]["last_seen"] == r1["generated"]
    r3 = run_report(tmp_path, [n3], [tmp_path / "r2" / "report.json"], name="r3")
    assert states(r3) == {("trl", "1.12.0", "poison"): "fixed"}
    assert r3["open"] == []


def test_same_property_with_another_signature_is_new_and_the_old_unknown(tmp_path):
    other = finding("poison", [[0, 3]], "returns")  # last-trainable, not before-gap
    prev = write_fuzz(tmp_path / "prev.json", target("verl@0.4.1", findings=[POISON]))
    tonight = write_fuzz(tmp_path / "tonight.json", target("verl@0.4.1", findings=[other]))
    data = run_report(tmp_path, [tonight], [prev])
    by_sig = {f["signature"]: f for f in data["findings"]}
    assert by_sig["poison|returns|last-trainable|f32"]["state"] == "new"
    old = by_sig["poison|returns|before-gap|f32"]
    assert old["state"] == "unknown" and "another signature" in old["why"]


def test_pins_are_separate_findings(tmp_path):
    prev = write_fuzz(tmp_path / "prev.json", target("verl@0.4.1", findings=[POISON]))
    tonight = write_fuzz(tmp_path / "tonight.json", target("verl@0.4.1"), target("verl@0.5.0", findings=[POISON]))
    data = run_report(tmp_path, [tonight], [prev])
    assert states(data) == {("verl", "0.4.1", "poison"): "fixed", ("verl", "0.5.0", "poison"): "new"}


def test_matrix_cells(tmp_path):
    tonight = write_fuzz(
        tmp_path / "t.json",
        target("verl@0.4.1", findings=[POISON], failed={"row-independence": 1}),
        target("skyrl@0.3.1", "skipped", reason="no PPO"),
    )
    run_report(tmp_path, [tonight])
    md = (tmp_path / "out" / "report.md").read_text()
    header = next(line for line in md.splitlines() if line.startswith("| target@pin"))
    row = next(line for line in md.splitlines() if line.startswith("| verl@0.4.1"))
    cells = dict(zip([c.strip() for c in header.split("|")[1:-1]], [c.strip() for c in row.split("|")[1:-1]]))
    assert cells["poison"] == "FAIL (1)"
    assert cells["row-independence"] == "FAIL (not shrunk)"
    assert cells["masked-zero"] == "n/a"
    assert cells["reference"] == "ok"
    assert cells["examples"] == "50" and cells["resolved"] == "verl==0.4.1"


class Checker(HTMLParser):
    """Tag balance (void elements excepted) and the text content."""

    VOID = {"meta", "br", "hr", "img", "link", "input"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack, self.errors, self.text, self.tags, self.hrefs = [], [], [], [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.hrefs += [v for k, v in attrs if k in ("href", "src")]
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"unexpected </{tag}> with open {self.stack}")
        else:
            self.stack.pop()

    def handle_data(self, data):
        self.text.append(data)


def test_html_is_well_formed_self_contained_and_escaped(tmp_path):
    evil = finding("poison", [[0, 1]], "returns", message="<script>alert('x')</script> & a < b | c")
    tonight = write_fuzz(
        tmp_path / "t.json",
        target("verl@0.4.1", findings=[evil]),
        target("trl@1.12.0", "error", reason="cannot import <trl>: see https://x?a=1&b=2"),
    )
    run_report(tmp_path, [tonight])
    page = (tmp_path / "out" / "report.html").read_text()
    assert "<script" not in page and "&lt;script&gt;" in page
    checker = Checker()
    checker.feed(page)
    checker.close()
    assert not checker.errors and not checker.stack, (checker.errors, checker.stack)
    assert checker.tags[:1] == ["html"] and "table" in checker.tags
    text = "".join(checker.text)
    assert "<script>alert('x')</script> & a < b | c" in text  # shown verbatim, as text
    assert "cannot import <trl>" in text
    assert not any(h.startswith(("http:", "https:", "//")) for h in checker.hrefs)  # no external assets
    md = (tmp_path / "out" / "report.md").read_text()
    assert "<script>" not in md and "&lt;script&gt;" in md and "b \\| c" in md


def test_links_to_corpus_entries_and_reproducers(tmp_path):
    corpus = tmp_path / "corpus"
    entry = Entry(
        "verl",
        "0.4.1",
        "poison",
        CASE,
        Verdict("poison", "fail", POISON["message"], "returns", [[0, 1]], [0.0], [1.0]),
        resolved="verl==0.4.1",
        found=Found(date="x"),
    )
    path = save(entry, corpus)
    repro = tmp_path / "repro" / entry.id
    repro.mkdir(parents=True)
    (repro / "report.md").write_text("# repro\n")
    (repro / "repro.py").write_text("print('hi')\n")
    f = finding("poison", [[0, 1]], "returns", corpus_file=str(path))
    tonight = write_fuzz(tmp_path / "t.json", target("verl@0.4.1", findings=[f]))
    data = run_report(tmp_path, [tonight], extra=["--repro-dir", str(tmp_path / "repro")])
    out = tmp_path / "out"
    assert (out / "corpus" / "verl" / path.name).read_bytes() == path.read_bytes()
    assert (out / "repro" / entry.id / "repro.py").is_file()
    md = (out / "report.md").read_text()
    assert f"(corpus/verl/{path.name})" in md and f"(repro/{entry.id}/report.md)" in md
    assert data["open"][0]["corpus_id"] == entry.id and data["open"][0]["corpus_file"] == f"corpus/verl/{path.name}"
    # the next night, without its own reproducers and corpus: both come from the previous report
    f2 = finding("poison", [[0, 1]], "returns", corpus_file="gone/verl/" + path.name)
    again = write_fuzz(tmp_path / "t2.json", target("verl@0.4.1", findings=[f2]))
    data2 = run_report(tmp_path, [again], [out / "report.json"], name="out2")
    md2 = (tmp_path / "out2" / "report.md").read_text()
    assert data2["open"][0]["state"] == "still-failing"
    assert f"(repro/{entry.id}/report.md)" in md2 and (tmp_path / "out2" / "repro" / entry.id / "repro.py").is_file()
    assert (tmp_path / "out2" / "corpus" / "verl" / path.name).is_file()


def test_corpus_file_relative_to_an_unpacked_artifact(tmp_path):
    """CI: out/T.json says corpus_file "corpus/verl/x.json" relative to the job's checkout; the
    artifact unpacks as <artifact>/out/T.json and <artifact>/corpus/verl/x.json."""
    art = tmp_path / "artifacts" / "nightly-verl-0.4.1"
    entry = Entry(
        "verl",
        "0.4.1",
        "poison",
        CASE,
        Verdict("poison", "fail", "m", "returns", [[0, 1]], [0.0], [1.0]),
        found=Found(date="x"),
    )
    path = save(entry, art / "corpus")
    (art / "out").mkdir()
    f = finding("poison", [[0, 1]], "returns", corpus_file=f"corpus/verl/{path.name}")
    data = run_report(tmp_path, [write_fuzz(art / "out" / "verl.json", target("verl@0.4.1", findings=[f]))])
    assert data["open"][0]["corpus_file"] == f"corpus/verl/{path.name}"


def _replay_json(path: Path, results: list[dict]) -> Path:
    path.write_text(
        json.dumps(
            {
                "format": "maskfuzz-replay",
                "version": 1,
                "device": "cpu",
                "dtype": None,
                "exit_code": 1,
                "counts": {},
                "unreadable": [],
                "results": results,
            }
        )
    )
    return path


def _replay_result(entry: Entry, status: str, pin: str | None = None, message: str = "") -> dict:
    v = entry.verdict
    return {
        "id": entry.id,
        "path": str(entry.path),
        "target": entry.key,
        "pin": pin or entry.pin,
        "resolved": None,
        "property": entry.property,
        "device": "cpu",
        "dtype": entry.case.dtype,
        "status": status,
        "expected": "passes",
        "ledger_reason": None,
        "message": message,
        "seconds": 0.1,
        "verdict": None
        if status not in ("fail", "xfail")
        else {
            "property": v.property,
            "status": "fail",
            "message": v.message,
            "output": v.output,
            "positions": v.positions,
            "expected": [0.0],
            "observed": [1.0],
        },
    }


def test_replay_results_are_read_and_a_clean_replay_is_fixed(tmp_path):
    corpus = tmp_path / "corpus"
    verdict = Verdict("poison", "fail", "finite poison changed the output", "returns", [[0, 1]], [0.0], [1.0])
    a = save(Entry("verl", "0.4.1", "poison", CASE, verdict, found=Found(date="x")), corpus)
    b_case = CASE.replace(gamma=0.5)
    b_verdict = Verdict("reference", "fail", "differs", "advantages", [[0, 3]], [0.0], [1.0])
    b = save(Entry("verl", "0.4.1", "reference", b_case, b_verdict, found=Found(date="x")), corpus)
    from maskfuzz.fuzz.corpus import load

    ea, eb = load(a), load(b)
    prev = _replay_json(tmp_path / "prev.json", [_replay_result(ea, "fail"), _replay_result(eb, "xfail")])
    tonight = _replay_json(tmp_path / "tonight.json", [
        _replay_result(ea, "pass"),
        _replay_result(eb, "xfail"),
        _replay_result(eb, "skip", pin="0.5.0", message="cannot set up: no network"),
    ])  # fmt: skip
    data = run_report(tmp_path, [tonight], [prev])
    got = {(f["property"], f["signature"]): f["state"] for f in data["findings"]}
    assert got == {("poison", ea.signature): "fixed", ("reference", eb.signature): "still-failing"}
    assert next(f for f in data["findings"] if f["state"] == "fixed")["why"] == "its corpus entry replays clean"
    md = (tmp_path / "out" / "report.md").read_text()
    assert "verl@0.5.0" in md.split("## Skipped / errors")[1] and "no network" in md


def test_fuzz_and_replay_of_the_same_bug_are_one_finding(tmp_path):
    corpus = tmp_path / "corpus"
    verdict = Verdict("poison", "fail", POISON["message"], "returns", [[0, 1]], [0.0], [1.0])
    entry = Entry("verl", "0.4.1", "poison", CASE, verdict, found=Found(date="x"))
    path = save(entry, corpus)
    from maskfuzz.fuzz.corpus import load

    fz = write_fuzz(tmp_path / "f.json", target("verl@0.4.1", findings=[POISON]))
    rp = _replay_json(tmp_path / "r.json", [_replay_result(load(path), "fail")])
    data = run_report(tmp_path, [fz, rp])
    assert len(data["findings"]) == 1 and data["findings"][0]["corpus_id"]


@pytest.mark.parametrize("content, what", [
    (None, "no such file"),
    ("{not json", "not valid JSON"),
    ('{"hello": 1}', "not a maskfuzz result"),
    ('{"format": "maskfuzz-report", "version": 1, "open": []}', "pass it with --previous"),
    ('{"profile": "ci", "targets": [{"target": "verl@0.4.1"}]}', "status"),
])  # fmt: skip
def test_unreadable_input_exits_2_naming_the_file(tmp_path, capsys, content, what):
    good = write_fuzz(tmp_path / "good.json", target("verl@0.4.1"))
    bad = tmp_path / "bad input.json"
    if content is not None:
        bad.write_text(content)
    out = tmp_path / "out"
    assert main(["report", str(good), str(bad), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and what in err
    assert not out.exists()  # nothing half-written


def test_unreadable_previous_exits_2(tmp_path, capsys):
    good = write_fuzz(tmp_path / "good.json", target("verl@0.4.1"))
    prev = tmp_path / "prev.json"
    prev.write_text('{"format": "maskfuzz-report", "version": 1}')
    assert main(["report", str(good), "--previous", str(prev), "-o", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert str(prev) in err and "open" in err


def test_fuzz_json_with_nan_literals_is_read(tmp_path):
    """`maskfuzz fuzz --json` writes NaN as a bare literal (allow_nan=True)."""
    p = write_fuzz(tmp_path / "t.json", target("verl@0.4.1", findings=[POISON]))
    assert "NaN" in p.read_text()
    assert states(run_report(tmp_path, [p])) == {("verl", "0.4.1", "poison"): "new"}


def test_a_replaced_corpus_file_is_found_by_signature(tmp_path):
    """`record` replaces an entry by a smaller case of the same signature: the finding links to that one."""
    corpus = tmp_path / "corpus"
    small = CASE.replace(values=CASE.values * 0)  # same masks, same failure positions -> same signature
    verdict = Verdict("poison", "fail", POISON["message"], "returns", [[0, 1]], [0.0], [1.0])
    kept = save(Entry("verl", "0.5.0", "poison", small, verdict, found=Found(date="x")), corpus)
    stale = str(corpus / "verl" / "poison-0123456789abcdef.json")  # the file the fuzz run wrote, since replaced
    f = finding("poison", [[0, 1]], "returns", corpus_file=stale)
    data = run_report(
        tmp_path, [write_fuzz(tmp_path / "t.json", target("verl@0.4.1", findings=[f]))], extra=["--corpus", str(corpus)]
    )
    (item,) = data["open"]
    assert item["corpus_file"] == f"corpus/verl/{kept.name}" and kept.name.endswith(f"{item['corpus_id']}.json")


def test_a_replay_that_crashes_is_a_no_crash_finding_and_skips_are_counted(tmp_path):
    verdict = Verdict("poison", "fail", "m", "returns", [[0, 1]], [0.0], [1.0])
    path = save(Entry("verl", "0.4.1", "poison", CASE, verdict, found=Found(date="x")), tmp_path / "corpus")
    from maskfuzz.fuzz.corpus import load

    entry = load(path)
    crashed = _replay_result(entry, "fail", pin="0.9.1")
    crashed["verdict"] = {
        "property": "no-crash",
        "status": "fail",
        "message": "exception: IndexError: boom",
        "output": "",
        "positions": [],
        "expected": [],
        "observed": [],
    }
    skips = [_replay_result(entry, "skip", pin="0.1", message="cannot set up: offline") for _ in range(2)]
    data = run_report(tmp_path, [_replay_json(tmp_path / "r.json", [crashed, *skips])])
    (item,) = data["findings"]
    assert (item["pin"], item["property"], item["signature"]) == ("0.9.1", "no-crash", "no-crash|-|-|f32|IndexError")
    md = (tmp_path / "out" / "report.md").read_text()
    assert "| verl@0.1 | skipped | replay (2 entries) | cannot set up: offline |" in md


def test_the_report_leads_with_defects_grouping_findings_by_mechanism(tmp_path):
    leak = {"defect": "verl/masked-value-bootstrap", "mechanism": "masked-value-bootstrap", "severity": "high"}
    findings = [
        POISON | leak | {"reach": "api"},
        REFERENCE | leak | {"reach": "pipeline"},
        SCORE | {"defect": "verl/score-lost", "mechanism": "score-lost", "severity": "high", "reach": "api"},
    ]
    data = run_report(tmp_path, [write_fuzz(tmp_path / "t.json", target("verl@0.4.1", findings=findings))])
    defects = {d["id"]: d for d in data["defects"]}
    assert set(defects) == {"verl/masked-value-bootstrap", "verl/score-lost"}
    bootstrap = defects["verl/masked-value-bootstrap"]
    assert bootstrap["reach"] == "pipeline" and bootstrap["properties"] == "poison, reference"
    assert bootstrap["reach_evidence"] == "cited"  # nothing ran it: no validation is recorded
    assert all(f["defect"] and f["reach"] for f in data["findings"])
    text = (tmp_path / "out" / "report.md").read_text()
    assert text.index("Defects") < text.index("Matrix")


def test_defects_per_framework_lead_and_report_json_is_strict(tmp_path):
    """One row per framework, most high-severity defects first (two findings of one defect count
    once); a semantics card holding inf is written as strict JSON ("-inf"), never rejected."""
    leak = {"defect": "verl/masked-value-bootstrap", "mechanism": "masked-value-bootstrap", "severity": "high",
            "reach": "pipeline", "promise": "universal:poison"}  # fmt: skip
    lost = {"defect": "trl/score-lost", "mechanism": "score-lost", "severity": "medium", "reach": "api"}
    card = {"kind": "kl", "variant": {"clamp": [float("-inf"), 20.0]}, "dimensions": [], "matches_declared": True}
    tonight = write_fuzz(
        tmp_path / "t.json",
        target("trl@1.12.0", findings=[SCORE | lost]),
        target("verl@0.4.1", findings=[POISON | leak, REFERENCE | leak]) | {"semantics": card},
        target("skyrl@0.3.1", "skipped", reason="no PPO"),
    )
    data = run_report(tmp_path, [tonight])
    json.loads((tmp_path / "out" / "report.json").read_text(), parse_constant=pytest.fail)
    assert data["semantics"]["verl@0.4.1"]["variant"]["clamp"] == ["-inf", 20.0]
    rows = {r["framework"]: r for r in data["frameworks"]}
    assert [r["framework"] for r in data["frameworks"]] == ["verl", "trl", "skyrl"]
    assert (rows["verl"]["defects"], rows["verl"]["high"], rows["verl"]["reach pipeline"]) == ("1", "1", "1")
    assert rows["verl"]["leading defect"] == "universal:poison: masked-value-bootstrap"
    assert (rows["trl"]["medium"], rows["skyrl"]["ran"], rows["skyrl"]["defects"]) == ("1", "0 of 1", "0")
    assert data["history"][-1]["defects"] == {"trl": 1, "verl": 1}  # skyrl did not run: no point for it

"""The nightly's automatic bisection (`fuzz.nightly_bisect`, `maskfuzz report --bisect`).

- planning from two nights' coverage with fakes: which new / fixed findings get a job, and the
  reason for every one that does not (same revision, no previous run, no corpus entry, ...);
- the report with a fake runner: report.md / .html / .json name the commit;
- three local nights (`scripts/nightly_local.sh`) over a git repository built here: clean, a
  regression landed among innocuous commits, its fix: the report names both commits.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import git
import pytest
from fake_framework import build, commit, innocuous
from test_report import CASE, finding, target, write_fuzz

from maskfuzz.fuzz import nightly_bisect as nb
from maskfuzz.fuzz import report as rep
from maskfuzz.fuzz.corpus import save
from maskfuzz.fuzz.corpus_codec import Entry
from maskfuzz.oracles.verdict import Verdict

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "nightly_local.sh"
A, B = "a" * 40, "b" * 40


def _night(tmp_path: Path, name: str, resolved: str, findings=(), pin: str = "main", status: str = "ok") -> Path:
    t = target(f"verl@{pin}", status, findings)
    t["resolved"] = resolved
    return write_fuzz(tmp_path / f"{name}.json", t)


def _corpus_file(tmp_path: Path, prop: str = "poison") -> str:
    entry = Entry("verl", "main", prop, CASE, Verdict(prop, "fail", "x"))
    return str(save(entry, tmp_path / "corpus"))


def _plan(tmp_path: Path, prev: Path | None, tonight: Path):
    t = rep.load_night([tonight])
    p = rep.load_night([prev], allow_report=True) if prev else None
    return nb.plan(rep.compare(t, p), t, p)


def test_a_new_finding_at_a_moved_pin_is_bisected_between_the_two_revisions(tmp_path):
    cf = _corpus_file(tmp_path)
    jobs, skipped = _plan(
        tmp_path, _night(tmp_path, "prev", A), _night(tmp_path, "now", B, [finding("poison", [[0, 1]], corpus_file=cf)])
    )
    assert skipped == [] and len(jobs) == 1
    j = jobs[0]
    assert (j.kind, j.target, j.pin, j.old, j.new, j.unit) == ("cause", "verl", "main", A, B, "commit")
    argv = j.argv(Path("x.json"), 60)
    assert argv[:2] == ["bisect", cf] and argv[argv.index("--old") + 1] == A and "--commits" in argv


def test_a_fixed_finding_is_bisected_for_its_fix_and_releases_by_version(tmp_path):
    cf = _corpus_file(tmp_path)
    prev = _night(tmp_path, "prev", "verl==0.5.0", [finding("poison", [[0, 1]], corpus_file=cf)], pin="latest")
    jobs, skipped = _plan(tmp_path, prev, _night(tmp_path, "now", "verl==0.9.1", pin="latest"))
    assert skipped == [] and [(j.kind, j.old, j.new, j.unit) for j in jobs] == [("fix", "0.5.0", "0.9.1", "version")]
    assert "--releases" in jobs[0].argv(Path("x.json"), 60)


@pytest.mark.parametrize(
    "prev_resolved, prev_status, why",
    [
        (B, "ok", "same revision as the previous night"),
        (A, "error", "the previous night could not run verl@main"),
        ("", "ok", "the previous night did not run verl@main"),
        ("verl==0.5.0", "ok", "moved from a version to a commit"),
    ],
)
def test_what_cannot_be_bisected_says_why(tmp_path, prev_resolved, prev_status, why):
    cf = _corpus_file(tmp_path)
    prev = _night(tmp_path, "prev", prev_resolved, status=prev_status)
    now = _night(tmp_path, "now", B, [finding("poison", [[0, 1]], corpus_file=cf)])
    jobs, skipped = _plan(tmp_path, prev, now)
    assert jobs == [] and len(skipped) == 1 and why in skipped[0][2], skipped


def test_without_a_corpus_entry_or_previous_night_nothing_is_bisected(tmp_path):
    now = _night(tmp_path, "now", B, [finding("poison", [[0, 1]])])
    jobs, skipped = _plan(tmp_path, _night(tmp_path, "prev", A), now)
    assert jobs == [] and "no corpus entry" in skipped[0][2]
    jobs, skipped = _plan(tmp_path, None, now)
    assert jobs == [] and "no previous night" in skipped[0][2]


def test_one_bisection_per_defect(tmp_path):
    a, b = _corpus_file(tmp_path, "poison"), _corpus_file(tmp_path, "reference")
    fs = [finding("poison", [[0, 1]], corpus_file=a), finding("reference", [[0, 3]], corpus_file=b)]
    for f in fs:
        f.update(defect="verl/masked-value-bootstrap", mechanism="masked-value-bootstrap", reach="api")
    jobs, skipped = _plan(tmp_path, _night(tmp_path, "prev", A), _night(tmp_path, "now", B, fs))
    assert len(jobs) == 1 and len(skipped) == 1 and "same defect (verl/masked-value-bootstrap)" in skipped[0][2]


def test_the_report_names_the_commit_from_the_runner(tmp_path):
    """A fake runner writes the JSON `maskfuzz bisect --json` writes; the report carries it."""
    cf = _corpus_file(tmp_path)
    prev = _night(tmp_path, "prev", A)
    now = _night(tmp_path, "now", B, [finding("poison", [[0, 1]], corpus_file=cf)])
    calls = []

    def runner(args, log, seconds):
        calls.append(args)
        log.write_text("bisecting...\n")
        out = Path(args[args.index("--json") + 1])
        c = {"id": "c" * 40, "date": "2026-11-29T10:00:00+00:00", "subject": "refactor: vectorise GAE"}
        out.write_text(json.dumps({"result": "found", "kind": "cause", "commit": c, "evaluations": 6, "skips": 1,
                                   "revisions": 17, "seconds": 12.0, "old": {"verdict": "good"},
                                   "new": {"verdict": "bad"}}))  # fmt: skip
        return 0

    out = tmp_path / "report"
    rep.write_report([now], out, [prev], bisect=lambda jobs, d: nb.run(jobs, d, runner, say=lambda s: None))
    assert len(calls) == 1 and calls[0][calls[0].index("--new") + 1] == B
    md = (out / "report.md").read_text()
    assert "introduced by cccccccccccc 2026-11-29 refactor: vectorise GAE" in md and "6 (1 skipped) over 17" in md
    assert "refactor: vectorise GAE" in (out / "report.html").read_text()
    data = json.loads((out / "report.json").read_text())
    (b,) = data["bisections"]
    assert b["status"] == "found" and b["revision"]["id"] == "c" * 40 and b["log"] == "bisect/cause-poison-" + (
        Path(cf).stem.split("-")[-1] + ".log"
    )
    assert next(f for f in data["findings"] if f["state"] == "new")["bisection"]["summary"].startswith("introduced")


def test_a_runner_without_result_is_an_error_row(tmp_path):
    cf = _corpus_file(tmp_path)
    prev, now = _night(tmp_path, "prev", A), _night(tmp_path, "now", B, [finding("poison", [[0, 1]], corpus_file=cf)])
    out = tmp_path / "report"

    def runner(args, log, seconds):
        log.write_text("Traceback ...\nRuntimeError: worker died\n")
        return 3

    rep.write_report([now], out, [prev], bisect=lambda jobs, d: nb.run(jobs, d, runner, say=lambda s: None))
    (b,) = json.loads((out / "report.json").read_text())["bisections"]
    assert b["status"] == "error" and "exit 3: RuntimeError: worker died" in b["summary"]


def test_three_local_nights_name_the_regressing_and_the_fixing_commit(tmp_path):
    """Night 1 clean; night 2 after a regression among innocuous commits; night 3 after its fix.
    The real script, fuzzer, corpus, report and `maskfuzz bisect` over a repository built here."""
    repo, _ = build(tmp_path / "repo", ["good", "good"])
    env = dict(os.environ, MASKFUZZ_CACHE=str(tmp_path / "cache"))
    env.pop("MASKFUZZ_REPOS", None)
    args = ["-o", "nights", "--max-examples", "40", "--no-replay", "--corpus", "corpus", "--seed", "7", "--",
            "--callable", "fakefw:compute", "--source", "repo", "--quiet"]  # fmt: skip

    def night() -> dict:
        r = subprocess.run(["bash", str(SCRIPT), *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=600)  # fmt: skip
        assert r.returncode == 0, r.stderr[-3000:]
        newest = sorted((tmp_path / "nights").glob("*/report/report.json"))[-1]
        return json.loads(newest.read_text()) | {"_dir": newest.parent}

    first = night()
    assert first["findings"] == [] and first["coverage"][0]["status"] == "ok"

    for i in range(3):
        innocuous(repo, f"docs: typo {i}", 3 + i)
    bad = commit(repo, "bad", "refactor: one loop over all positions", 6)
    for i in range(4):
        innocuous(repo, f"ci: bump {i}", 7 + i)
    second = night()
    assert second["findings"] and {f["state"] for f in second["findings"]} == {"new"}
    found = [b for b in second["bisections"] if b["status"] == "found"]
    assert found and all(b["kind"] == "cause" and b["revision"]["id"] == bad for b in found)
    assert all(b["status"] in ("found", "not bisected") for b in second["bisections"])
    md = (second["_dir"] / "report.md").read_text()
    assert f"introduced by {bad[:12]}" in md and "refactor: one loop over all positions" in md
    repro_links = [x for x in md.splitlines() if x.startswith("| new |") and "repro/" in x]
    assert repro_links, "the bisection rows link the reproducers"

    for i in range(2):
        innocuous(repo, f"docs: more {i}", 11 + i)
    fix = commit(repo, "good", "fix: skip masked positions in the recursion", 13)
    innocuous(repo, "release notes", 14)
    third = night()
    fixed = [f for f in third["findings"] if f["state"] == "fixed"]
    assert fixed and len(fixed) == len(second["findings"])
    found = [b for b in third["bisections"] if b["status"] == "found"]
    assert found and all(b["kind"] == "fix" and b["revision"]["id"] == fix for b in found)
    md = (third["_dir"] / "report.md").read_text()
    assert f"fixed by {fix[:12]}" in md
    assert isinstance(repo, git.Repo)


VERL_FIX = "0332866857d541f5bd4f46ee4d9bd782a6354aa3"  # [algo] feat: mask out observation token in GAE (#2337)


@pytest.fixture
def verl_clone(tmp_path):
    """A clone of the verl mirror (MASKFUZZ_REPOS) whose branch ends at #2337, with a work tree."""
    from maskfuzz.targets.runtime.repos import parse_repos

    repos = parse_repos(None)
    if "verl" not in repos:
        pytest.skip("needs a local verl clone or mirror: set MASKFUZZ_REPOS=verl=/path/to/verl")
    try:
        repo = git.Repo.clone_from(str(repos["verl"]), tmp_path / "verl", shared=True, no_checkout=True)
        repo.git.checkout("-B", "nightly", VERL_FIX)
    except git.GitCommandError as exc:
        pytest.skip(f"the verl repository at {repos['verl']} lacks #2337 ({VERL_FIX[:9]}): {exc}")
    with repo.config_writer() as cw:
        cw.set_value("user", "name", "maskfuzz test").set_value("user", "email", "test@maskfuzz.invalid")
    return repo


def _edit(repo: git.Repo, message: str) -> str:
    notes = Path(repo.working_tree_dir) / "NOTES.maskfuzz.md"
    notes.write_text((notes.read_text() if notes.exists() else "") + f"- {message}\n")
    repo.index.add([notes.name])
    return repo.index.commit(message).hexsha


@pytest.mark.needs_mirror
def test_three_nights_on_verl_with_a_revert_of_its_real_fix(verl_clone, tmp_path):
    """verl@main at #2337 (masked observation tokens skipped in GAE); night 2 reverts #2337 among
    innocuous commits; night 3 reverts the revert. The GAE entry only, so each night is short."""
    repo = verl_clone
    env = dict(os.environ, MASKFUZZ_CACHE=str(tmp_path / "cache"), MASKFUZZ_REPOS=f"verl={repo.working_tree_dir}")
    args = ["-o", "nights", "--max-examples", "300", "--no-replay", "--no-repro", "--corpus", "corpus",
            "--seed", "3", "verl:default@main", "--", "--quiet"]  # fmt: skip

    def night() -> dict:
        r = subprocess.run(["bash", str(SCRIPT), *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=1500)  # fmt: skip
        assert r.returncode == 0, r.stderr[-3000:]
        newest = sorted((tmp_path / "nights").glob("*/report/report.json"))[-1]
        return json.loads(newest.read_text()) | {"_dir": newest.parent}

    first = night()
    assert first["coverage"][0]["resolved"] == VERL_FIX
    gaps_before = [f for f in first["findings"] if f["property"] == "gap-invariance"]
    assert not gaps_before, "verl at #2337 keeps masked tokens out of the GAE recursion"

    _edit(repo, "docs: note 1")
    repo.git.revert("--no-edit", VERL_FIX)
    regression = repo.head.commit.hexsha
    _edit(repo, "docs: note 2")
    second = night()
    new = [f for f in second["findings"] if f["state"] == "new"]
    assert any(f["property"] == "gap-invariance" for f in new), [f["property"] for f in new]
    found = [b for b in second["bisections"] if b["status"] == "found"]
    assert found and all(b["kind"] == "cause" and b["revision"]["id"] == regression for b in found), found
    assert f"introduced by {regression[:12]}" in (second["_dir"] / "report.md").read_text()

    _edit(repo, "docs: note 3")
    repo.git.revert("--no-edit", regression)
    fix = repo.head.commit.hexsha
    third = night()
    fixed = [f for f in third["findings"] if f["state"] == "fixed"]
    assert any(f["property"] == "gap-invariance" for f in fixed)
    found = [b for b in third["bisections"] if b["status"] == "found"]
    assert found and all(b["kind"] == "fix" and b["revision"]["id"] == fix for b in found), found
    text = (third["_dir"] / "report.md").read_text()
    assert f"fixed by {fix[:12]}" in text and "Revert" in text
    for b in second["bisections"] + third["bisections"]:
        print(f"\n[verl nights] {b['kind'] if 'kind' in b else ''} {b['status']}: {b['summary']} "
              f"({b.get('evaluations', 0)} evaluations over {b.get('revisions', 0)} commits)", file=sys.stderr)

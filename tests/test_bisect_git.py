"""Bisection over git histories built here with gitpython: a tiny fake framework whose masked GAE
is right, then wrong (the cause), unimportable for a while, then right again (the fix).

Revisions are walked and checked out by the real machinery (`targets.gitrepo.CachedRepo` over a
local repository, via `fuzz.bisect_env.CommitHistory`). Most tests judge each revision with a
light evaluator that imports the fake framework from the revision's worktree in a plain Python
subprocess (no torch: ~50 ms) and compares with the float64 reference; one test runs the whole
command line with the real worker (`targets.adapters.callable`) and `oracles.kinds.dispatch.judge`.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import git
import pytest
from fake_framework import STATES, build, commit  # noqa: F401

from maskfuzz.fuzz import bisect_env
from maskfuzz.fuzz.bisect import (
    BAD,
    CAUSE,
    FIX,
    FOUND,
    GOOD,
    INCONCLUSIVE,
    SKIP,
    Outcome,
    Revision,
    bisect,
    evaluation_bound,
)
from maskfuzz.oracles.case import Case
from maskfuzz.oracles.kinds.gae.reference import compressed_loop
from maskfuzz.targets.runtime.session import SetupError

# B=1, T=6 with a masked gap whose values are poison: the mask-blind version differs.
CASE = Case.build(
    trainable=[[1, 1, 0, 0, 1, 1]],
    token_rewards=[[0.5, 0.0, 9.0, 9.0, 0.0, 1.0]],
    values=[[1.0, 2.0, 50.0, 60.0, 3.0, 4.0]],
    score=[1.0],
    gamma=0.9,
    lam=0.8,
    dtype="float64",
)


SCRIPT = """
import json, sys
sys.path.insert(0, sys.argv[1])
import fakefw
args = json.loads(sys.argv[2])
print(json.dumps(fakefw.gae(*args)))
"""


class ImportEvaluator:
    """Checks the revision out (once for all runs), imports fakefw from it in a plain Python
    subprocess, compares its advantages with the float64 compressed reference; an import failure
    is a skip."""

    def __init__(self, history, case: Case = CASE):
        self.history = history
        self.case = case
        self.calls: list[str] = []
        self.done_calls: list[str] = []
        self.most_worktrees = 0
        self.trees = bisect_env.Worktrees(history)

    def __call__(self, rev: Revision) -> Outcome:
        self.calls.append(rev.id)
        self.trees.before(rev.id)
        root = self.history.checkout(rev.id)
        self.most_worktrees = max(self.most_worktrees, len(self.history.worktrees()))
        c = self.case
        args = [c.token_rewards.tolist(), c.values.tolist(), c.trainable.tolist(), c.score.tolist(), c.gamma, c.lam]
        proc = subprocess.run(
            [sys.executable, "-c", SCRIPT, str(root), json.dumps(args)], capture_output=True, text=True, timeout=60
        )
        if proc.returncode != 0:
            return Outcome(SKIP, proc.stderr.strip().splitlines()[-1])
        got = json.loads(proc.stdout)
        ref, _ = compressed_loop(c)
        live = c.trainable
        ok = all(abs(got[b][t] - float(ref[b, t])) < 1e-9 for b, t in live.nonzero().tolist())
        return Outcome(GOOD if ok else BAD)

    def done(self, rev: Revision) -> None:
        """Called by `bisect` after the revision's last run: the worktree goes (unless it was there before)."""
        self.done_calls.append(rev.id)
        self.trees.done(rev.id)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv("MASKFUZZ_CACHE", str(d))
    return d


def history_of(path: Path, cache: Path) -> bisect_env.CommitHistory:
    return bisect_env.CommitHistory(bisect_env.local_history(path, "fakefw", cache))


HISTORY = ["good"] * 6 + ["bad", "bad", "bad", "broken", "broken", "bad", "good", "good", "good"]
#           c0..c5          c6 cause            c9, c10 unimportable    c12 fix


def test_cause_and_fix_through_unimportable_commits(tmp_path, cache):
    _, shas = build(tmp_path / "repo", HISTORY)
    hist = history_of(tmp_path / "repo", cache)

    ev = ImportEvaluator(hist.history)
    res = bisect(hist, ev, shas[0], shas[11])
    assert (res.result, res.kind, res.commit.id) == (FOUND, CAUSE, shas[6])
    assert res.commit.subject == "commit 6: fakefw is bad" and res.commit.date.startswith("2024-01-07")
    assert res.evaluations == len(ev.calls) <= evaluation_bound(11, res.skips)
    assert evaluation_bound(11, res.skips) == math.ceil(math.log2(11)) + res.skips + 2

    assert ev.most_worktrees == 1 and hist.history.worktrees() == []

    hist.history.checkout(shas[12])  # a worktree someone else made (a pinned commit): it must stay
    ev = ImportEvaluator(hist.history)
    res = bisect(hist, ev, shas[6], shas[14])
    assert (res.result, res.kind, res.commit.id) == (FOUND, FIX, shas[12])
    assert shas[12] in [t.revision.id for t in res.tested]
    assert res.evaluations <= res.bound()
    skipped = [t for t in res.tested if t.outcome.verdict == SKIP]
    assert skipped, "the probes should have met an unimportable commit"
    assert all(t.revision.id in (shas[9], shas[10]) and "SyntaxError" in t.outcome.reason for t in skipped)
    # every worktree the bisection made was removed after its evaluation; the older one stays
    assert ev.most_worktrees == 2 and hist.history.worktrees() == [shas[12]]


def test_skips_next_to_the_answer_are_inconclusive(tmp_path, cache):
    states = ["good"] * 4 + ["broken", "broken"] + ["bad"] * 5  # the bug may be in c4, c5 or c6
    _, shas = build(tmp_path / "repo", states)
    hist = history_of(tmp_path / "repo", cache)
    res = bisect(hist, ImportEvaluator(hist.history), shas[0], shas[10])
    assert res.result == INCONCLUSIVE and res.kind == CAUSE and res.commit is None
    assert [r.id for r in res.candidates] == shas[4:7]
    assert res.skips == 2 and res.evaluations <= res.bound()
    d = res.to_dict()
    assert d["result"] == "inconclusive" and [c["id"] for c in d["candidates"]] == shas[4:7]


def test_flaky_commit_needs_runs(tmp_path, cache, monkeypatch):
    # c1..c10: the first probe is c5, which gives a wrong answer on every odd call
    states = ["good"] * 5 + ["flaky", "good", "good"] + ["bad"] * 3
    _, shas = build(tmp_path / "repo", states)
    hist = history_of(tmp_path / "repo", cache)

    monkeypatch.setenv("FAKEFW_COUNTER", str(tmp_path / "counter-1"))
    once = bisect(hist, ImportEvaluator(hist.history), shas[0], shas[10])
    assert once.tested[2].revision.id == shas[5] and once.tested[2].outcome.verdict == BAD
    assert once.result == FOUND and once.commit.id == shas[5], "one run believes the flaky commit"

    monkeypatch.setenv("FAKEFW_COUNTER", str(tmp_path / "counter-3"))
    ev = ImportEvaluator(hist.history)
    res = bisect(hist, ev, shas[0], shas[10], runs=3)
    flaky = res.tested[2].outcome
    assert res.tested[2].revision.id == shas[5]
    assert flaky.verdict == SKIP and flaky.flaky and flaky.runs == [BAD, GOOD, BAD] and "flaky" in flaky.reason
    assert (res.result, res.kind, res.commit.id) == (FOUND, CAUSE, shas[8])
    assert all(t.outcome.runs == [t.outcome.verdict] * 3 for t in res.tested if not t.outcome.flaky)
    # three runs per revision, one checkout: `done` once per revision, after its last run
    assert ev.done_calls == [t.revision.id for t in res.tested] and len(ev.calls) == 3 * len(ev.done_calls)
    assert ev.most_worktrees == 1 and hist.history.worktrees() == []


def test_merges_with_and_without_first_parent(tmp_path, cache):
    """main: m0 m1 m2 m3 M m4, side (from m1): s1 (the bug) s2, merged at M. The side branch is
    dated after m3, so both orders are consistent."""
    repo = git.Repo.init(tmp_path / "repo")
    m0 = commit(repo, "good", "m0", 1)
    m1 = commit(repo, "good", "m1", 2)
    m2 = commit(repo, "good", "m2", 3)
    m3 = commit(repo, "good", "m3", 4)
    repo.head.reset(m1, index=True, working_tree=True)
    s1 = commit(repo, "bad", "s1: the bug, on a side branch", 5)
    s2 = commit(repo, "bad", "s2", 6)
    repo.head.reset(m3, index=True, working_tree=True)
    merge = commit(repo, "bad", "Merge side into main", 7, parents=[repo.commit(m3), repo.commit(s2)])
    m4 = commit(repo, "bad", "m4", 8)
    hist = history_of(tmp_path / "repo", cache)

    linear = [r.id for r in hist.revisions(m0, m4, first_parent=True)]
    assert linear == [m1, m2, m3, merge, m4]
    res = bisect(hist, ImportEvaluator(hist.history), m0, m4, first_parent=True)
    assert (res.result, res.commit.id, res.commit.subject) == (FOUND, merge, "Merge side into main")
    assert res.evaluations <= evaluation_bound(5, res.skips)

    assert hist.merges(m0, m4) == 1 and hist.merges(m0, m3) == 0
    full = [r.id for r in hist.revisions(m0, m4)]
    assert set(full) == {m1, m2, m3, s1, s2, merge, m4} and full[-1] == m4
    res = bisect(hist, ImportEvaluator(hist.history), m0, m4)
    assert (res.result, res.commit.id) == (FOUND, s1)
    assert res.evaluations <= evaluation_bound(7, res.skips)


def test_thousand_commits_keep_one_worktree(tmp_path, cache):
    """1000 commits (made with git fast-import), the bug at commit 737: log2 probes, one worktree."""
    path = tmp_path / "repo"
    git.Repo.init(path)
    blobs = {s: STATES[s].encode() for s in ("good", "bad")}
    stream = []
    for i in range(1000):
        data = blobs["bad" if i >= 737 else "good"] + f"\nREVISION = {i}\n".encode()
        stream.append(
            b"commit refs/heads/master\n"
            + f"committer t <t@x> {1_700_000_000 + 60 * i} +0000\n".encode()
            + f"data {len(f'c{i}')}\nc{i}\n".encode()
            + f"M 100644 inline fakefw/__init__.py\ndata {len(data)}\n".encode()
            + data
            + b"\n"
        )
    subprocess.run(["git", "fast-import", "--quiet"], cwd=path, input=b"".join(stream), check=True)
    repo = git.Repo(path)
    shas = [c.hexsha for c in repo.iter_commits("master", reverse=True)]
    assert len(shas) == 1000
    hist = history_of(path, cache)
    ev = ImportEvaluator(hist.history)
    res = bisect(hist, ev, shas[0], shas[-1])
    assert res.result == FOUND and res.commit.id == shas[737] and res.commit.subject == "c737"
    assert res.revisions == 999 and res.evaluations <= math.ceil(math.log2(999)) + 2 == 12
    assert ev.most_worktrees == 1 and hist.history.worktrees() == []
    left = list((cache / "git" / "local-fakefw" / "worktrees").glob("*"))
    assert left == []


def test_command_line_with_the_real_worker(tmp_path, cache, capsys):
    """`maskfuzz bisect CASE --callable fakefw:compute --source REPO`: real worker, real judge."""
    from maskfuzz.fuzz import corpus, corpus_codec
    from maskfuzz.fuzz.cli import main
    from maskfuzz.oracles.verdict import Verdict

    states = ["good"] * 3 + ["bad", "broken", "bad", "bad"]
    _, shas = build(tmp_path / "repo", states)
    entry = corpus_codec.Entry("callable", "local", "reference", CASE, Verdict("reference", "fail", "differs"))
    case_file = corpus.save(entry, tmp_path / "corpus")
    out = tmp_path / "bisect.json"
    argv = [
        "bisect", str(case_file), "--callable", "fakefw:compute", "--source", str(tmp_path / "repo"),
        "--old", shas[0][:10], "--new", shas[-1], "--json", str(out),
    ]  # fmt: skip
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert shas[3] in text and "commit 3: fakefw is bad" in text
    d = json.loads(out.read_text())
    assert d["result"] == "found" and d["kind"] == "cause" and d["commit"]["id"] == shas[3]
    assert d["old"]["verdict"] == GOOD and d["new"]["verdict"] == BAD
    assert d["evaluations"] == len(d["tested"]) <= evaluation_bound(6, d["skips"])
    assert all(t["seconds"] > 0 for t in d["tested"])
    for t in d["tested"]:
        state = states[shas.index(t["revision"]["id"])]
        assert t["verdict"] == {"good": GOOD, "bad": BAD, "broken": SKIP}[state], t
    print(f"\n[real worker] {d['evaluations']} evaluations, {d['seconds_per_evaluation']:.2f} s each", file=sys.stderr)



def test_command_line_usage_errors(tmp_path, cache, capsys):
    """Set-up problems exit 2 with a message, before any evaluation."""
    from maskfuzz.fuzz import corpus, corpus_codec
    from maskfuzz.fuzz.cli import main
    from maskfuzz.oracles.verdict import Verdict

    _, shas = build(tmp_path / "repo", ["good", "bad", "bad"])
    entry = corpus_codec.Entry("callable", "local", "reference", CASE, Verdict("reference", "fail", "differs"))
    case_file = str(corpus.save(entry, tmp_path / "corpus"))
    src = ["--callable", "fakefw:compute", "--source", str(tmp_path / "repo")]
    with pytest.raises(SystemExit) as exc:  # argparse refuses a count below 1 itself
        main(["bisect", case_file, "--old", shas[0], "--new", shas[2], "--runs", "0", *src])
    assert exc.value.code == 2
    assert "--runs: expected a whole number >= 1" in capsys.readouterr().err
    assert main(["bisect", case_file, "--old", shas[0], "--new", shas[2], "--callable", "fakefw:compute"]) == 2
    assert main(["bisect", case_file, "--old", shas[2], "--new", shas[0], *src]) == 2
    assert main(["bisect", case_file, "--old", "nope", "--new", shas[0], *src]) == 2
    assert main(["bisect", case_file, "--old", shas[0], "--new", shas[2]]) == 2  # a callable case needs --callable
    assert main(["bisect", str(tmp_path / "missing.json"), "--old", shas[0], "--new", shas[2], *src]) == 2
    err = capsys.readouterr().err
    assert "needs --source" in err and "does not descend" in err
    assert "'nope'" in err and "give --callable" in err and "missing.json" in err


def test_a_skip_reason_names_the_worker_error_before_a_note_on_absent_files():
    """A commit that cannot be set up is a skip whose reason shows the error the worker hit; the note that the
    mirror lacks some files follows it and does not take its place (it used to be read as the error)."""
    exc = SetupError(
        "cannot load roll:agg-token-mean at 3077befc: check the checkout\n"
        "Traceback ...\n"
        "ValueError: mutable default <class 'list'> for field x is not allowed: use default_factory\n"
        "(the source repository lacks 5 file(s) of this commit: a.png, b.png)"
    )
    reason = bisect_env._skip_reason(exc)
    assert reason.startswith("cannot set up: cannot load roll:agg-token-mean at 3077befc")
    assert "[... ValueError: mutable default" in reason
    assert reason.endswith("(the source repository lacks 5 file(s) of this commit: a.png, b.png)")

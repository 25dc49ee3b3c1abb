"""The seed's bug, bisected in miles' real history: a response that ends in masked (observation)
tokens with gamma = 0 loses its score, because GAE injected the terminal reward at the last
response token; PR #1827 (3d2e0e411) moved it to the last trainable token. The fix bisection of
that case must name 3d2e0e411.

Needs a local miles clone or mirror: MASKFUZZ_REPOS="miles=/path/to/miles" (skipped otherwise).
"""

from __future__ import annotations

import json
import sys

import pytest

from maskfuzz.fuzz.bisect import evaluation_bound
from maskfuzz.oracles.case import Case
from maskfuzz.oracles.verdict import Verdict
from maskfuzz.targets.runtime.repos import parse_repos

PR_1827 = "3d2e0e411c4a20501a1841003880b0245700618a"  # fix: run PPO GAE over trainable tokens only
PR_1720 = "6875694c5a67c8067640de070a76328b7de71faa"  # terminal rewards injected at the last response token
AFTER = "0425ef099f50dbfec594cfc0b8d95eaa5ef46879"  # 12 commits after #1827 (PR #1759)

# The seed's first problem: the response ends in two masked observation tokens, gamma = 0.
SEED_CASE = Case.build(
    trainable=[[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]],
    token_rewards=[[0.0, 0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0, 0.0]],
    values=[[0.5, 0.25, 0.75, 3.0, -2.0], [0.5, 1.0, -0.5, 0.25, 1.5]],
    score=[1.0, -1.0],
    gamma=0.0,
    lam=0.95,
    dtype="float32",
)


@pytest.fixture
def miles_repo():
    repos = parse_repos(None)
    if "miles" not in repos:
        pytest.skip("needs a local miles clone or mirror: set MASKFUZZ_REPOS=miles=/path/to/miles")
    from maskfuzz.targets.runtime import gitrepo

    try:
        gitrepo.rev_parse(gitrepo.open_local(repos["miles"]), PR_1827)
    except gitrepo.GitError as exc:
        pytest.skip(f"the miles repository at {repos['miles']} lacks PR #1827 ({PR_1827[:9]}): {exc}")
    return repos["miles"]


def _bisect(tmp_path, capsys, old: str, new: str) -> dict:
    from maskfuzz.fuzz import corpus, corpus_codec
    from maskfuzz.fuzz.cli import main

    verdict = Verdict("score-kept", "fail", "score lost")
    entry = corpus_codec.Entry("miles", PR_1720[:9], "score-kept", SEED_CASE, verdict)
    case_file = corpus.save(entry, tmp_path / "corpus")
    out = tmp_path / "bisect.json"
    code = main(["bisect", str(case_file), "--old", old, "--new", new, "--json", str(out)])
    text = capsys.readouterr().out
    assert code == 0, text
    d = json.loads(out.read_text())
    times = ", ".join(f"{t['revision']['id'][:9]} {t['verdict']} {t['seconds']:.1f}s" for t in d["tested"])
    cpu = d["cpu_seconds"] / d["evaluations"]
    print(
        f"\n[miles] {d['evaluations']} evaluations over {d['revisions']} commits, {d['seconds']:.1f} s in total, "
        f"{d['seconds_per_evaluation']:.2f} s per evaluation ({cpu:.2f} s cpu): {times}",
        file=sys.stderr,
    )
    return d


@pytest.mark.needs_mirror
def test_fix_bisection_of_the_seed_case_names_pr_1827(miles_repo, tmp_path, capsys):
    d = _bisect(tmp_path, capsys, PR_1720[:9], AFTER[:9])
    assert d["result"] == "found" and d["kind"] == "fix"
    assert d["commit"]["id"] == PR_1827 and "(#1827)" in d["commit"]["subject"]
    assert d["old"]["verdict"] == "bad" and d["new"]["verdict"] == "good"
    assert d["revisions"] == 32 and d["evaluations"] <= evaluation_bound(32, d["skips"])
    assert "score-kept fails" in d["tested"][0]["reason"]


@pytest.mark.needs_mirror
@pytest.mark.slow
def test_fix_bisection_over_the_whole_history_since_pr_1720(miles_repo, tmp_path, capsys):
    d = _bisect(tmp_path, capsys, PR_1720[:9], "HEAD")
    assert (d["result"], d["kind"], d["commit"]["id"]) == ("found", "fix", PR_1827)
    assert d["evaluations"] <= evaluation_bound(d["revisions"], d["skips"])

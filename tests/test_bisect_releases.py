"""Bisection over released versions: PEP 440 ordering, the release list from the index, the
target evaluator's verdict mapping (with a fake session), and a real bisection over verl wheels."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys

import pytest
import torch

from maskfuzz.fuzz.bisect import BAD, FIX, FOUND, GOOD, SKIP, BisectError, Revision, bisect, evaluation_bound
from maskfuzz.fuzz.bisect_env import (
    ReleaseHistory,
    TargetEvaluator,
    is_prerelease,
    outcome_of,
    pep440_key,
    released_versions,
    version_key,
)
from maskfuzz.oracles.case import Case
from maskfuzz.oracles.declared import Declared
from maskfuzz.oracles.kinds.gae.reference import compressed_loop
from maskfuzz.oracles.verdict import Verdict

VERL = (
    "0.9.1, 0.9.0, 0.8.0, 0.7.1, 0.7.0, 0.6.1, 0.6.0, 0.5.0, 0.4.1, 0.4.0, 0.3.0.post1, 0.3.0.post0, "
    "0.2.0.post2, 0.2.0.post1, 0.2, 0.1"
)

# Two rows, a masked gap in the first: verl before #2337 (0.5.0) runs GAE over the gap.
GAP_CASE = Case.build(
    trainable=[[1, 1, 0, 0, 1, 1], [1, 1, 1, 0, 0, 0]],
    attention=[[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]],
    values=[[0.5, 1.0, 4.0, -3.0, 0.25, 2.0], [1.0, 0.0, -1.0, 0.0, 0.0, 0.0]],
    score=[1.0, -1.0],
    gamma=1.0,
    lam=0.95,
    dtype="float32",
)


# -- ordering ---------------------------------------------------------------------------------
ORDERED = (
    "0.1 0.2 0.2.0.post1 0.2.0.post2 0.3.0.dev1 0.3.0a1 0.3.0a2.dev0 0.3.0a2 0.3.0b1 0.3.0rc0 0.3.0rc1 0.3.0 "
    "0.3.0.post0 0.3.0.post1 0.4.0 0.4.1 0.10.0 1.0 1!0.1"
).split()


def test_pep440_key_orders_like_packaging():
    shuffled = ORDERED[::-1][3:] + ORDERED[::-1][:3]
    assert sorted(shuffled, key=pep440_key) == ORDERED
    packaging = pytest.importorskip("packaging.version")
    assert sorted(shuffled, key=packaging.Version) == ORDERED
    assert pep440_key("0.2") == pep440_key("0.2.0") and pep440_key("v1.0") == pep440_key("1.0")
    assert version_key("0.10.0") > version_key("0.9.1")
    pre = "0.3.0.dev1 0.3.0a1 0.3.0a2.dev0 0.3.0a2 0.3.0b1 0.3.0rc0 0.3.0rc1".split()
    assert [v for v in ORDERED if is_prerelease(v)] == pre
    with pytest.raises(ValueError):
        pep440_key("main")


def test_release_history_keeps_the_versions_between_old_and_new():
    hist = ReleaseHistory(VERL.split(", ") + ["not-a-version"], "verl")
    assert hist.versions[0] == "0.1" and hist.versions[-1] == "0.9.1" and "not-a-version" not in hist.versions
    ids = [r.id for r in hist.revisions("0.4.1", "0.9.1")]
    assert ids == ["0.5.0", "0.6.0", "0.6.1", "0.7.0", "0.7.1", "0.8.0", "0.9.0", "0.9.1"]
    assert [r.id for r in hist.revisions("0.2", "0.3.0.post0")] == ["0.2.0.post1", "0.2.0.post2", "0.3.0.post0"]
    assert hist.describe("0.4.1") == Revision("0.4.1", subject="verl 0.4.1")
    with pytest.raises(BisectError, match="no release 0.4.2"):
        hist.revisions("0.4.2", "0.9.1")
    with pytest.raises(BisectError, match="not a later release"):
        hist.revisions("0.9.1", "0.4.1")


def test_release_list_from_pip_index_output():
    out = f"WARNING: pip index is currently an experimental command.\nverl (0.9.1)\nAvailable versions: {VERL}\n"
    calls = []

    def runner(cmd, **kw):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, out, "")

    assert released_versions("verl", runner)[:3] == ["0.9.1", "0.9.0", "0.8.0"]
    assert calls[0][:5] == [sys.executable, "-m", "pip", "index", "versions"] and "verl" in calls[0]
    assert "--pre" not in calls[0]
    released_versions("verl", runner, pre=True)
    assert "--pre" in calls[1]

    def offline(cmd, **kw):
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: No matching distribution found for verl\n")

    with pytest.raises(BisectError, match="No matching distribution"):
        released_versions("verl", offline)


# -- verdict mapping --------------------------------------------------------------------------
def test_outcome_of_maps_verdicts():
    assert outcome_of([Verdict("no-crash", "pass"), Verdict("reference", "pass")], "reference").verdict == GOOD
    bad = outcome_of([Verdict("no-crash", "pass"), Verdict("reference", "fail", "differs")], "reference")
    assert bad.verdict == BAD and "differs" in bad.reason
    crashed = [Verdict("no-crash", "fail", "IndexError: boom"), Verdict("reference", "n/a", "the base run raised")]
    crash = outcome_of(crashed, "reference")
    assert crash.verdict == SKIP and "IndexError" in crash.reason
    assert outcome_of([Verdict("no-crash", "fail", "crash")], "no-crash").verdict == BAD
    na = outcome_of([Verdict("no-crash", "pass"), Verdict("telescoping", "n/a", "needs gamma = 1")], "telescoping")
    assert na.verdict == SKIP and "does not apply" in na.reason


class FakeHandle:
    def __init__(self, run):
        self.run = run
        self.declared = Declared(contract="compressed")


def _mask_blind(case: Case):
    """Classic GAE over every position (the 0.4-style bug), zeroed where not trainable."""
    b, t = case.shape
    adv = torch.zeros(b, t, dtype=torch.float64)
    for row in range(b):
        last = int(case.trainable[row].nonzero().max())
        nxt_v = nxt_a = 0.0
        for i in reversed(range(t)):
            r = float(case.token_rewards[row, i]) + (float(case.score[row]) if i == last else 0.0)
            nxt_a = r + case.gamma * nxt_v - float(case.values[row, i]) + case.gamma * case.lam * nxt_a
            nxt_v = float(case.values[row, i])
            adv[row, i] = nxt_a
    adv = adv * case.trainable
    return adv, (adv + case.values) * case.trainable


class FakeSession:
    """`open_target` for the releases of a pretend package: 0.5.0 introduced the fix, 0.6.0 has no
    such function (Skip), 0.7.0 cannot be imported (SetupError)."""

    class Skip(Exception):
        pass

    class SetupError(Exception):
        pass

    def __init__(self):
        self.opened: list[str] = []

    @contextlib.contextmanager
    def open_target(self, ref, repos=None, device="cpu", timeout=60.0):
        target, entry, pin = ref
        self.opened.append(pin)
        version = pin.removeprefix("==")
        if version == "0.6.0":
            raise self.Skip("verl@==0.6.0 (verl==0.6.0): function not present at this pin")
        if version == "0.7.0":
            raise self.SetupError("verl@==0.7.0: cannot load the target: No module named 'ray'.\n  ModuleNotFoundError")
        fixed = version_key(version) >= version_key("0.5.0")
        yield FakeHandle(compressed_loop if fixed else _mask_blind)


class FakeTrees:
    def __init__(self):
        self.events = []

    def before(self, rev):
        self.events.append(("before", rev))

    def done(self, rev):
        self.events.append(("done", rev))


class GapEntry:
    case = GAP_CASE
    property = "reference"


def test_target_evaluator_over_releases_with_a_fake_session():
    session = FakeSession()
    tree = FakeTrees()
    ev = TargetEvaluator(
        GapEntry(), "verl", releases=True, opener=session.open_target, ref_factory=lambda *a: a, worktrees=tree
    )
    hist = ReleaseHistory(VERL.split(", "), "verl")
    res = bisect(hist, ev, "0.4.0", "0.9.1")
    assert (res.result, res.kind, res.commit.id) == (FOUND, FIX, "0.5.0")
    assert all(p.startswith("==") for p in session.opened), "a release is opened as ==VERSION"
    assert tree.events == [(e, t.revision.id) for t in res.tested for e in ("before", "done")]
    assert res.evaluations <= evaluation_bound(res.revisions, res.skips)

    by_version = {t.revision.id: t.outcome for t in bisect(hist, ev, "0.4.1", "0.8.0").tested}
    assert by_version["0.4.1"].verdict == BAD and by_version["0.8.0"].verdict == GOOD
    assert by_version["0.6.0"].verdict == SKIP and by_version["0.6.0"].reason.startswith("not present")
    if "0.7.0" in by_version:
        assert by_version["0.7.0"].verdict == SKIP and "No module named 'ray'" in by_version["0.7.0"].reason
    assert all(o.seconds > 0 for o in by_version.values())


# -- real wheels --------------------------------------------------------------------------------
@pytest.mark.network
def test_verl_release_bisection_names_0_5_0(tmp_path, capsys, monkeypatch):
    """verl 0.4.1 runs GAE over masked positions; 0.5.0 (#2337) skips them: the fix is 0.5.0.
    Downloads the verl wheels the search probes (about five, ~1 MB each) into the maskfuzz cache."""
    from maskfuzz.fuzz import corpus, corpus_codec
    from maskfuzz.fuzz.cli import main

    monkeypatch.delenv("MASKFUZZ_REPOS", raising=False)  # no --repo for verl: its releases are bisected
    try:
        versions = released_versions("verl")
    except (BisectError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"the package index is not reachable: {exc}")
    assert {"0.4.1", "0.5.0", "0.9.1"} <= set(versions)
    entry = corpus_codec.Entry("verl", "0.4.1", "reference", GAP_CASE, Verdict("reference", "fail", "differs"))
    case_file = corpus.save(entry, tmp_path / "corpus")
    out = tmp_path / "bisect.json"
    code = main(["bisect", str(case_file), "--old", "0.4.1", "--new", "0.9.1", "--json", str(out)])
    text = capsys.readouterr().out
    d = json.loads(out.read_text())
    assert code == 0, text
    assert d["result"] == "found" and d["kind"] == "fix" and d["version"]["id"] == "0.5.0"
    assert d["old"]["verdict"] == BAD and d["new"]["verdict"] == GOOD
    assert d["revisions"] == len([v for v in versions if version_key("0.4.1") < version_key(v) <= version_key("0.9.1")])
    assert d["evaluations"] <= evaluation_bound(d["revisions"], d["skips"])
    assert "0.5.0" in text and "fix" in text
    each = d["seconds_per_evaluation"]
    print(f"\n[verl releases] {d['evaluations']} evaluations, {d['seconds']:.1f} s, {each:.2f} s each", file=sys.stderr)


def _bisect_releases(entry, tmp_path, capsys, versions: str) -> dict:
    """`maskfuzz bisect` of a saved corpus entry over verl's releases `versions` (0.5.0 .. 0.9.1): the JSON
    result; a skip when the package index cannot be reached."""
    from maskfuzz.fuzz import corpus
    from maskfuzz.fuzz.cli import main

    case_file = corpus.save(entry, tmp_path / "corpus")
    out = tmp_path / "bisect.json"
    args = ["bisect", str(case_file), "--old", "0.5.0", "--new", "0.9.1", "--versions", versions]
    code = main([*args, "--json", str(out)])
    text = capsys.readouterr().out
    if code == 2 and "index" in text:
        pytest.skip(f"the package index is not reachable: {text[-200:]}")
    assert code == 0, text
    return json.loads(out.read_text())


@pytest.mark.network
def test_a_kind_entry_bisects_like_gae(tmp_path, capsys, monkeypatch):
    """verl's REINFORCE++ (the returns kind) reset the return at a masked token up to 0.8.0; a gap
    case recorded on the entry `verl:reinforce++` at 0.5.0 passes at 0.9.1. The kind travels with
    the entry: nothing changes on the user's side (`--versions` keeps it to the two cached wheels)."""
    from maskfuzz.fuzz import corpus_codec
    from maskfuzz.oracles.case import Case

    monkeypatch.delenv("MASKFUZZ_REPOS", raising=False)
    gap = Case.build(trainable=[[1, 1]], score=[1.0], gamma=1.0, lam=1.0)  # a gap inserted at 1 resets the return
    entry = corpus_codec.Entry(
        "verl", "0.5.0", "gap-invariance", gap, Verdict("gap-invariance", "fail", "differs"), entry_point="reinforce++"
    )
    d = _bisect_releases(entry, tmp_path, capsys, "0.5.0,0.9.1")
    assert d["result"] == "found" and d["kind"] == "fix" and d["version"]["id"] == "0.9.1", d
    assert d["old"]["verdict"] == BAD and d["new"]["verdict"] == GOOD


@pytest.mark.network
def test_a_loss_aggregation_entry_bisects_to_the_global_normaliser_release(tmp_path, capsys, monkeypatch):
    """verl's agg_loss normalised each micro-batch on its own up to 0.6.x (dp_actor.py scales by the row
    share) and takes the step's global normalisers from 0.7.0: a two-micro-batch step of unequal token
    counts is split-dependent at 0.5.0 and 0.6.1 and invariant from 0.7.0 (measured over the seven
    releases 0.5.0 .. 0.9.1: 5 evaluations)."""
    from maskfuzz.fuzz import corpus_codec
    from maskfuzz.oracles.case import Case

    monkeypatch.delenv("MASKFUZZ_REPOS", raising=False)
    step = Case.build(trainable=[[1, 1], [1, 0]], extra={"loss": [[1.0, 3.0], [5.0, 0.0]]}, split=[0, 1])
    entry = corpus_codec.Entry(
        "verl", "0.5.0", "split-invariance", step, Verdict("split-invariance", "fail", "differs"),
        entry_point="agg-token-mean",
    )  # fmt: skip
    d = _bisect_releases(entry, tmp_path, capsys, "0.5.0,0.6.1,0.7.0,0.9.1")
    assert d["result"] == "found" and d["kind"] == "fix" and d["version"]["id"] == "0.7.0", d
    assert d["old"]["verdict"] == BAD and d["new"]["verdict"] == GOOD

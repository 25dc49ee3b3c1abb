"""A defect in a discovered variant goes the way of any other: `maskfuzz fuzz` files it in the corpus (one entry,
its promise, "invariants only"), `replay` fails it at the pin and passes it before the change, `bisect` names the
commit that brought it, `repro` writes a script that exits 1 at the pin and 0 before it, and `report` lists it.

The upstream is a fake verl git repository the test builds: a registered policy loss, correct on the first day,
made to divide every token's loss by the padded width on the second (a `pad-invariance` defect, which breaks a
universal invariant whatever the reach), and a commit that changes nothing on the third. No entry of maskfuzz names
it."""

from __future__ import annotations

import json
import subprocess
import sys

import git
import pytest
from discovery_nights import VERL_ACTOR, VERL_CORE, commit

from maskfuzz.fuzz.cli import main

_WIDTH_LOSS = '''

@register_policy_loss("width")
def compute_policy_loss_width(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
                                config=None, rollout_is_weights=None):
    old, new, adv = _live(response_mask, old_log_prob, log_prob, advantages)
    loss = -adv * torch.exp(new - old)
    return agg_loss(loss{scale}, response_mask, loss_agg_mode, **config.global_batch_info), {{}}
'''
_WIDTH = " / response_mask.shape[-1]"  # every token's loss over the padded width: a padding column moves it
_CORE = "verl/trainer/ppo/core_algos.py"
_ENTRY = "verl:policy-loss:width"


@pytest.fixture
def history(tmp_path, monkeypatch):
    """The fake verl: (repository path, [the good commit, the cause, an unrelated commit])."""
    monkeypatch.setenv("MASKFUZZ_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("MASKFUZZ_REPOS", f"verl={tmp_path / 'verl'}")
    monkeypatch.chdir(tmp_path)
    repo = git.Repo.init(tmp_path / "verl")
    inits = {f"{p}/__init__.py": "" for p in ("verl", "verl/trainer", "verl/trainer/ppo", "verl/workers",
                                             "verl/workers/config")}  # fmt: skip
    good = commit(repo, {**inits, _CORE: VERL_CORE + _WIDTH_LOSS.format(scale=""),
                         "verl/workers/config/actor.py": VERL_ACTOR}, "register width", 1)  # fmt: skip
    cause = commit(repo, {_CORE: VERL_CORE + _WIDTH_LOSS.format(scale=_WIDTH)}, "divide by the padded width", 2)
    later = commit(repo, {"NOTES.md": "nothing in the code\n"}, "notes", 3)
    return tmp_path / "verl", [good, cause, later]


def test_a_defect_in_a_discovered_variant_is_filed_replayed_bisected_reproduced_and_reported(history, tmp_path):
    root, (good, cause, later) = history
    corpus, results = tmp_path / "corpus", tmp_path / "fuzz.json"
    code = main(["fuzz", f"{_ENTRY}@HEAD", "--max-examples", "15", "--jobs", "1", "--seed", "0", "--corpus",
                 str(corpus), "--json", str(results), "--quiet"])  # fmt: skip
    assert code == 1  # a defect
    (target,) = json.loads(results.read_text())["targets"]
    assert target["judged"] == "invariants only" and target["resolved"] == later
    (defect,) = [f for f in target["findings"] if f["class"] == "defect"]
    assert defect["property"] == "pad-invariance" and defect["promise"] == "universal:pad-invariance"
    assert defect["mechanism"] == "masked-statistics" and defect["reach"] == "api"
    assert all(f["judged"] == "invariants only" for f in target["findings"])
    # one corpus entry per defect, its triage saying what was judged; facts are never filed
    (path,) = sorted(corpus.rglob("*.json"))
    entry = json.loads(path.read_text())
    assert entry["entry_point"] == "policy-loss:width" and entry["resolved"] == later
    assert entry["triage"]["judged"] == "invariants only" and entry["triage"]["promise"] == "universal:pad-invariance"

    # replay: fails at the pin it was found at, passes before the change
    code = main(["replay", str(path), "--json", str(tmp_path / "replay.json")])
    (row,) = json.loads((tmp_path / "replay.json").read_text())["results"]
    assert code == 1 and row["status"] == "fail", row
    assert row["promise"] == "universal:pad-invariance" and row["judged"] == "invariants only"  # triaged at the pin
    code = main(["replay", str(path), "--target", f"{_ENTRY}@{good}", "--json", str(tmp_path / "before.json")])
    (before,) = json.loads((tmp_path / "before.json").read_text())["results"]
    assert code == 0 and before["status"] == "pass", before

    # bisect: the commit that divided by the padded width
    code = main(["bisect", str(path), "--target", _ENTRY, "--old", good, "--new", later, "--repo", f"verl={root}",
                 "--json", str(tmp_path / "bisect.json")])  # fmt: skip
    found = json.loads((tmp_path / "bisect.json").read_text())
    assert code == 0 and found["kind"] == "cause" and found["commit"]["id"] == cause, found

    # repro: a script that exits 1 at the pin, 0 at the good commit, and a report that says what was judged
    out = tmp_path / "repro"
    assert main(["repro", str(path), "--target", f"{_ENTRY}@HEAD", "-o", str(out)]) == 0
    assert "invariants only" in (out / "report.md").read_text()
    repo = git.Repo(root)
    for rev, expected in ((later, 1), (good, 0)):
        tree = tmp_path / f"at-{rev[:8]}"
        repo.git.worktree("add", "--detach", str(tree), rev)
        done = subprocess.run([sys.executable, str(out / "repro.py"), str(tree)], capture_output=True, text=True,
                              timeout=300)  # fmt: skip
        assert done.returncode == expected, done.stdout + done.stderr

    # report: the defect with its promise, judged on the invariants only
    assert main(["report", str(results), str(tmp_path / "replay.json"), "-o", str(tmp_path / "report")]) == 0
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    (listed,) = [d for d in report["defects"] if d["id"] == f"{_ENTRY}/masked-statistics"]
    assert listed["promise"] == "universal:pad-invariance" and listed["judged"] == "invariants only", listed
    assert "universal:pad-invariance (invariants only)" in (tmp_path / "report" / "report.md").read_text()

"""Git acquisition on repositories the tests build in tmp_path: worktrees per revision, cache reuse,
fetching from a mirror that gained commits, errors that say what to do, no half-written trees,
two processes acquiring one pin, and the history interface bisection uses."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import git
import pytest

from maskfuzz.targets.registry import Pin, TargetSpec
from maskfuzz.targets.runtime import acquire as acq
from maskfuzz.targets.runtime import gitrepo

ROOT = Path(__file__).resolve().parent.parent
ENV = {
    "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com",
    "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com",
}  # fmt: skip


def sh(repo: Path, *args: str) -> str:
    out = subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                         env=dict(os.environ, **ENV))
    return out.stdout.strip()


def commit(repo: Path, text: str, date: str = "2026-01-01T00:00:00+00:00") -> str:
    (repo / "toy").mkdir(exist_ok=True)
    (repo / "toy" / "version.txt").write_text(text)
    sh(repo, "add", "-A")
    subprocess.run(["git", "-C", str(repo), "commit", "-q", "-m", f"commit {text}"], check=True,
                   env=dict(os.environ, **ENV, GIT_AUTHOR_DATE=date, GIT_COMMITTER_DATE=date))
    return sh(repo, "rev-parse", "HEAD")


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    c = tmp_path / "cache"
    monkeypatch.setenv("MASKFUZZ_CACHE", str(c))
    return c


@pytest.fixture
def src(tmp_path) -> dict:
    """main: c1 (tag v0.1) - c2 (tag 0.2-rc) - c4 (merge of feature) ; feature: c3 off c2."""
    repo = tmp_path / "src"
    repo.mkdir()
    sh(repo, "init", "-q", "-b", "main")
    c1 = commit(repo, "one", "2026-01-01T00:00:00+00:00")
    sh(repo, "tag", "v0.1")
    c2 = commit(repo, "two", "2026-01-02T00:00:00+00:00")
    sh(repo, "tag", "-a", "release-2", "-m", "annotated")
    sh(repo, "checkout", "-q", "-b", "feature")
    c3 = commit(repo, "three", "2026-01-03T00:00:00+00:00")
    sh(repo, "checkout", "-q", "main")
    subprocess.run(["git", "-C", str(repo), "merge", "-q", "--no-ff", "-m", "merge feature", "feature"], check=True,
                   env=dict(os.environ, **ENV))
    c4 = sh(repo, "rev-parse", "HEAD")
    return {"path": repo, "c1": c1, "c2": c2, "c3": c3, "c4": c4}


def spec(**kw) -> TargetSpec:
    base = dict(id="toy", adapter="maskfuzz.targets.adapters.callable", own=("toy",), contract="compressed")
    return TargetSpec(**(base | kw))


def text_at(checkout: acq.Checkout) -> str:
    return (checkout.root / "toy" / "version.txt").read_text()


def worktree_list(cache: Path) -> list[str]:
    out = subprocess.run(["git", "-C", str(cache / "git" / "toy" / "repo.git"), "worktree", "list", "--porcelain"],
                         check=True, capture_output=True, text=True).stdout
    return [ln.split(" ", 1)[1] for ln in out.splitlines() if ln.startswith("worktree ")]


def test_each_revision_form_gets_its_own_worktree(src, cache):
    repos = {"toy": src["path"]}
    s = spec()
    forms = {
        src["c1"]: "one", src["c1"][:8]: "one", "v0.1": "one", "release-2": "two",  # annotated tag -> its commit
        "feature": "three", "main": "three", "HEAD": "three", "HEAD~1": "two",
    }  # fmt: skip
    roots = {}
    for pin, expected in forms.items():
        c = acq.acquire(s, pin, repos, cache)
        assert c.kind == "git" and c.target == "toy" and c.pin == pin
        assert len(c.resolved) == 40 and c.root.name == c.resolved
        assert text_at(c) == expected, pin
        roots.setdefault(c.resolved, c.root)
        assert roots[c.resolved] == c.root  # one worktree per full hash, whatever the spelling
    assert set(roots) == {src["c1"], src["c2"], src["c3"], src["c4"]}
    assert sorted(worktree_list(cache)[1:]) == sorted(str(r) for r in roots.values())
    # the user's repository was only read: no worktrees registered there
    assert sh(src["path"], "worktree", "list").count("\n") == 0


def test_second_acquire_reuses_the_clone_and_the_worktree(src, cache, monkeypatch):
    repos = {"toy": src["path"]}
    first = acq.acquire(spec(), "v0.1", repos, cache)
    stamp = (first.root / "toy" / "version.txt").stat().st_mtime_ns

    def no_clone(*a, **k):
        raise AssertionError("cloned again")

    monkeypatch.setattr(git.Repo, "clone_from", no_clone)
    again = acq.acquire(spec(), src["c1"], repos, cache)
    assert again.root == first.root and again.resolved == first.resolved
    assert (again.root / "toy" / "version.txt").stat().st_mtime_ns == stamp
    other = acq.acquire(spec(), "main", repos, cache)  # a new worktree from the same clone, no new clone
    assert text_at(other) == "three"


def test_a_mirror_that_gained_commits_is_fetched_from(src, cache):
    repos = {"toy": src["path"]}
    before = acq.acquire(spec(), "main", repos, cache)
    c5 = commit(src["path"], "five")
    detached = commit(src["path"], "six")
    sh(src["path"], "reset", "-q", "--hard", c5)  # "six" is now on no branch: only fetchable by hash
    after = acq.acquire(spec(), "main", repos, cache)
    assert before.resolved == src["c4"] and after.resolved == c5 and text_at(after) == "five"
    assert text_at(acq.acquire(spec(), detached, repos, cache)) == "six"


def test_upstream_url_source_clones_once_and_refreshes_names(src, tmp_path, cache):
    bare = tmp_path / "upstream.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(src["path"]), str(bare)], check=True)
    s = spec(git_url=f"file://{bare}")
    c = acq.acquire(s, "v0.1", None, cache)  # no --repo: a revision of the upstream URL
    assert c.resolved == src["c1"] and c.info["source"] == s.git_url
    c5 = commit(src["path"], "five")
    sh(src["path"], "push", "-q", str(bare), "main")
    assert acq.acquire(s, "main", None, cache).resolved == c5  # a branch name is refreshed from upstream
    assert acq.acquire(s, c5[:10], None, cache).resolved == c5


def test_unknown_revision_names_target_pin_and_what_to_do(src, cache):
    with pytest.raises(acq.AcquireError) as err:
        acq.acquire(spec(), "no-such-branch", {"toy": src["path"]}, cache)
    msg = str(err.value)
    assert "toy@no-such-branch" in msg and "unknown revision" in msg and f"git -C {src['path']} log" in msg
    worktrees = cache / "git" / "toy" / "worktrees"
    assert not worktrees.exists() or not any(worktrees.iterdir())


def test_repo_path_that_is_not_a_repository(tmp_path, cache):
    plain = tmp_path / "plain"
    plain.mkdir()
    for path in (plain, tmp_path / "missing"):
        with pytest.raises(acq.AcquireError) as err:
            acq.acquire(spec(), "HEAD", {"toy": path}, cache)
        msg = str(err.value)
        assert f"--repo toy={path}" in msg and "/path/to/a/clone" in msg
        assert ("not a git repository" in msg) or ("does not exist" in msg)
    assert not (cache / "git").exists()


def test_unreachable_upstream_leaves_nothing_behind(tmp_path, cache):
    s = spec(git_url=f"file://{tmp_path}/nowhere.git")
    with pytest.raises(acq.AcquireError) as err:
        acq.acquire(s, "main", None, cache)
    msg = str(err.value)
    assert "toy@main" in msg and "cannot clone" in msg and "give --repo toy=/path/to/clone" in msg
    assert not (cache / "git" / "toy" / "repo.git").exists()
    assert list((cache / "tmp").iterdir()) == []


def test_failed_checkout_leaves_no_half_written_worktree(src, cache, monkeypatch):
    repos = {"toy": src["path"]}
    acq.acquire(spec(), "v0.1", repos, cache)  # the clone exists; now break the next worktree's last step
    real = git.cmd.Git._call_process

    def failing(self, method, *args, **kw):
        if method == "worktree" and args and args[0] == "move":
            raise git.GitCommandError(["git", "worktree", "move"], 1, "simulated failure")
        return real(self, method, *args, **kw)

    monkeypatch.setattr(git.cmd.Git, "_call_process", failing)
    with pytest.raises(acq.AcquireError, match="toy@main"):
        acq.acquire(spec(), "main", repos, cache)
    monkeypatch.setattr(git.cmd.Git, "_call_process", real)
    assert not (cache / "git" / "toy" / "worktrees" / src["c4"]).exists()
    assert list((cache / "tmp").iterdir()) == []
    assert len(worktree_list(cache)) == 2  # the bare clone and v0.1's worktree; the staged one is gone
    assert text_at(acq.acquire(spec(), "main", repos, cache)) == "three"  # and it works afterwards


_RACE = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    sys.path.insert(0, sys.argv[1])
    from maskfuzz.targets.runtime import acquire as acq
    from maskfuzz.targets.registry import TargetSpec
    spec = TargetSpec(id="toy", adapter="maskfuzz.targets.adapters.callable", own=("toy",), contract="compressed")
    time.sleep(max(0.0, float(sys.argv[4]) - time.time()))  # start together
    print(acq.acquire(spec, sys.argv[3], {"toy": Path(sys.argv[2])}, None).root)
""")


def test_two_processes_acquiring_one_pin_end_with_one_worktree(src, cache):
    import time

    start = f"{time.time() + 1.5:.3f}"
    args = [sys.executable, "-c", _RACE, str(ROOT), str(src["path"]), "feature", start]
    procs = [subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1] for o in outs]
    roots = {o[0].strip() for o in outs}
    assert roots == {str(cache / "git" / "toy" / "worktrees" / src["c3"])}
    assert os.listdir(cache / "git" / "toy" / "worktrees") == [src["c3"]]
    assert len(worktree_list(cache)) == 2 and list((cache / "tmp").iterdir()) == []


def test_history_for_bisection(src, cache):
    h = acq.history(spec(), {"toy": src["path"]}, cache)
    assert h.resolve("v0.1") == src["c1"]
    all_commits = h.revisions("v0.1", "main")
    assert [c.hash for c in all_commits] == [src["c2"], src["c3"], src["c4"]]  # (old, new], oldest first
    assert all_commits[0].date.startswith("2026-01-02") and all_commits[0].subject == "commit two"
    assert [c.hash for c in h.revisions("v0.1", "main", first_parent=True)] == [src["c2"], src["c4"]]
    assert h.revisions("main", "main") == []
    assert h.describe("feature") == gitrepo.Commit(src["c3"], all_commits[1].date, "commit three")
    root = h.checkout(src["c2"])
    assert (root / "toy" / "version.txt").read_text() == "two" and h.worktrees() == [src["c2"]]
    h.remove_worktree(src["c2"])
    assert not root.exists() and h.worktrees() == [] and len(worktree_list(cache)) == 1
    h.remove_worktree(src["c2"])  # removing twice is harmless
    with pytest.raises(gitrepo.UnknownRevision):
        h.resolve("nope")


def test_version_pins_fall_back_to_v_tags_and_offline_availability(src, tmp_path, cache):
    repos = {"toy": src["path"]}
    s = spec()
    assert acq.acquire(s, "0.1", repos, cache).resolved == src["c1"]  # "0.1" names nothing; tag v0.1 does
    assert acq.available_offline(s, "0.1", repos, cache)
    assert acq.available_offline(s, "feature", repos, cache)
    assert not acq.available_offline(s, "nope", repos, cache)
    assert not acq.available_offline(s, "HEAD", {"toy": tmp_path}, cache)  # not a repository
    # without --repo: offline only when the cached clone knows the revision (it was cloned above)
    upstream = spec(git_url="https://example.invalid/toy.git")
    assert acq.available_offline(upstream, src["c3"][:9], None, cache)
    assert not acq.available_offline(upstream, "0123456789abcdef", None, cache)
    assert not acq.available_offline(spec(id="other", git_url="https://example.invalid/o.git"), "HEAD", None, cache)


def test_pin_kind_rules():
    s = spec(package="toy-dist", pins=(Pin("1.0", "a release"), Pin("2.0", "a tag", kind="git")))
    repos = {"toy": Path("/x")}
    assert acq.pin_kind(s, "1.0", repos) == "release"  # a registered pin keeps its kind
    assert acq.pin_kind(s, "2.0", None) == "git"
    assert acq.pin_kind(s, "==3.1", repos) == "release"  # explicit release
    assert acq.pin_kind(s, "3.1", repos) == "git"  # with --repo, a revision
    assert acq.pin_kind(s, "3.1", None) == "release"
    assert acq.pin_kind(s, "0.3.0.post1", None) == "release"
    assert acq.pin_kind(s, "abc1234", None) == "git"
    assert acq.pin_kind(spec(), "3.1", None) == "git"  # no package: the upstream revision
    assert not acq.is_version("1234567") and acq.is_version("0.2") and acq.is_version("1.0rc1")


def test_no_source_at_all_asks_for_a_repo(cache):
    with pytest.raises(acq.AcquireError, match=r"^toy@main: toy has no upstream git URL; give --repo toy="):
        acq.acquire(spec(), "main", None, cache)


def test_cache_dir_lock_and_stale_scratch(tmp_path):
    from maskfuzz.targets.runtime import cache as cachemod

    assert cachemod.cache_dir({"MASKFUZZ_CACHE": "/a", "XDG_CACHE_HOME": "/b"}) == Path("/a")
    assert cachemod.cache_dir({"XDG_CACHE_HOME": "/b"}) == Path("/b/maskfuzz")
    assert cachemod.cache_dir({}) == Path.home() / ".cache" / "maskfuzz"
    with cachemod.lock("git-toy", tmp_path):
        with pytest.raises(cachemod.LockTimeout, match="another process holds"):
            with cachemod.lock("git-toy", tmp_path, timeout=0.2):  # a second open file: flock conflicts
                pass
        with cachemod.lock("git-other", tmp_path, timeout=0.2):  # other keys are independent
            pass
    with cachemod.lock("git-toy", tmp_path, timeout=0.2):  # released with the block
        pass
    old = cachemod.scratch(tmp_path, "killed")
    os.utime(old, (0, 0))  # as if a killed process left it long ago
    fresh = cachemod.scratch(tmp_path, "new")
    assert not old.exists() and fresh.is_dir() and fresh.parent == tmp_path / "tmp"


def test_a_mirror_missing_some_blobs_still_checks_out_the_rest(src, cache):
    # bare mirrors made without their largest files (datasets, PDFs) lack those blobs
    repo = src["path"]
    (repo / "data").mkdir()
    (repo / "data" / "big.jsonl").write_text('{"x": 1}\n' * 1000)
    (repo / "toy" / "gae.py").write_text("def gae():\n    return 1\n")
    sh(repo, "add", "-A")
    sh(repo, "commit", "-q", "-m", "add data")
    blob = sh(repo, "rev-parse", "HEAD:data/big.jsonl")
    (repo / ".git" / "objects" / blob[:2] / blob[2:]).unlink()
    c = acq.acquire(spec(), "main", {"toy": repo}, cache)
    assert (c.root / "toy" / "gae.py").read_text() == "def gae():\n    return 1\n" and text_at(c) == "three"
    assert not (c.root / "data" / "big.jsonl").exists()
    assert c.info["absent"] == ["data/big.jsonl"] and "1 file(s) left out" in c.info["notes"][0]
    assert acq.acquire(spec(), "main", {"toy": repo}, cache).info["absent"] == ["data/big.jsonl"]  # reused: still said
    assert list((cache / "tmp").iterdir()) == [] and len(worktree_list(cache)) == 2


def test_main_is_the_default_branch_fetched_fresh_and_recorded(src, tmp_path, cache):
    bare = tmp_path / "upstream.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(src["path"]), str(bare)], check=True)
    s = spec(git_url=f"file://{bare}")
    assert [p.rev for p in s.moving_pins] == ["main"]
    first = acq.acquire(s, "main", None, cache)
    assert first.pin == "main" and first.resolved == src["c4"] and src["c4"] in first.info["moving"]
    c5 = commit(src["path"], "five")
    sh(src["path"], "push", "-q", str(bare), "main")
    assert acq.acquire(s, "main", None, cache).resolved == c5  # tonight's head, not the cached one

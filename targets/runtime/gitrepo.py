"""The gitpython backend: one bare clone per target in the cache, one detached worktree per commit.

All of maskfuzz's git calls live in this module. `CachedRepo` clones a target's source once
(`git clone --bare`, from the upstream URL or from a local clone / bare mirror given with
`--repo NAME=PATH`), resolves revisions to full hashes, checks each commit out into its own
worktree keyed by the full hash (`git worktree add --detach`), lists the commits of a range for
bisection, and removes worktrees a bisection no longer needs.

With a local source, names (branches, tags, HEAD, short hashes) are resolved in that source, so
they mean what they mean there now; commits the cached clone lacks are fetched from it (a mirror
can gain commits). The user's repository is only ever read: worktrees belong to the cached clone.

`History` is the interface bisection codes against, so it can be tested with fakes.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import git

from maskfuzz.targets.runtime import cache as cachemod

# Never let git wait for credentials on a terminal (a private or mistyped URL would hang a worker).
_GIT_ENV = {
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_ASKPASS": "true",
    "SSH_ASKPASS": "true",
    "GIT_SSH_COMMAND": "ssh -oBatchMode=yes",
}
_NETWORK_MARKERS = (
    "could not resolve host",
    "unable to access",
    "failed to connect",
    "could not read from remote",
    "network is unreachable",
    "connection timed out",
    "connection refused",
    "terminal prompts disabled",
    "temporary failure in name resolution",
)
HEX = re.compile(r"^[0-9a-fA-F]{4,40}$")
ABSENT = ".maskfuzz-absent-files"  # in a worktree: paths left out because the source lacks their blobs


class GitError(Exception):
    """A git operation failed; the message is meant for a person."""


class NotARepository(GitError):
    """A --repo path that is missing or not a git repository."""


class UnknownRevision(GitError):
    """A revision that does not name a commit in the source."""


class Unreachable(GitError):
    """The source could not be cloned or fetched (no network, or a wrong URL)."""


@dataclass(frozen=True)
class Commit:
    """One commit of a range: full hash, ISO-8601 committer date, subject line."""

    hash: str
    date: str
    subject: str


class History(Protocol):
    """What bisection needs from a target's history (a `CachedRepo`, or a fake in tests)."""

    def resolve(self, rev: str) -> str:
        """The full commit hash `rev` names; UnknownRevision otherwise."""
        ...

    def revisions(self, old: str, new: str, first_parent: bool = False) -> list[Commit]:
        """Commits in (old, new], oldest first (`git rev-list --reverse old..new`)."""
        ...

    def describe(self, rev: str) -> Commit:
        """The commit `rev` names, with its date and subject."""
        ...

    def checkout(self, commit: str) -> Path:
        """A worktree of `commit` (a full hash), created if needed."""
        ...

    def remove_worktree(self, commit: str) -> None:
        """Delete the worktree of `commit` if there is one (keeps a long bisection off the disk)."""
        ...


def _stderr(exc: git.GitCommandError) -> str:
    text = (exc.stderr or "").strip().removeprefix("stderr:").strip().strip("'").strip()
    return text or str(exc)


def is_network_error(exc: git.GitCommandError) -> bool:
    text = _stderr(exc).lower()
    return any(m in text for m in _NETWORK_MARKERS)


def open_local(path: Path) -> git.Repo:
    """Open a local clone or bare mirror for reading; NotARepository if it is neither."""
    path = Path(path).expanduser()
    if not path.exists():
        raise NotARepository(f"{path} does not exist")
    try:
        repo = git.Repo(path)  # no search upwards: a folder inside some other repository is not a clone
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        raise NotARepository(f"{path} is not a git repository (a clone or a bare mirror)") from None
    # A bare mirror without a `config` file looks non-bare to gitpython, which would then run git
    # in the folder above it; naming the git dir explicitly makes every command read the right one.
    repo.git.update_environment(GIT_DIR=str(repo.git_dir), **_GIT_ENV)
    return repo


def rev_parse(repo: git.Repo, rev: str) -> str:
    """Full hash of the commit `rev` names in `repo`; UnknownRevision otherwise."""
    if not rev or rev.startswith("-") or any(c.isspace() for c in rev):
        raise UnknownRevision(f"{rev!r} is not a revision")
    try:
        return repo.git.rev_parse("--verify", "--quiet", f"{rev}^{{commit}}").strip()
    except git.GitCommandError as exc:
        detail = _stderr(exc)
        more = f" ({detail})" if detail and "exit code" not in detail else ""
        raise UnknownRevision(f"{rev!r} names no commit in {repo.git_dir}{more}") from None


class CachedRepo:
    """A target's bare clone under `<cache>/git/<target>/repo.git` and its worktrees.

    `source` is the URL or local path commits come from; `local=True` when it is a --repo path,
    in which case names are resolved there and missing commits are fetched from it."""

    def __init__(self, target: str, cache: Path, source: str, local: bool):
        self.target = target
        self.cache = Path(cache)
        self.source = source
        self.local = local
        self.base = self.cache / "git" / target
        self.git_dir = self.base / "repo.git"
        self._repo: git.Repo | None = None
        self._local: git.Repo | None = None
        if local:
            self._local = open_local(Path(source))
        self.notes: list[str] = []  # what happened that a person may want to know (e.g. stale refs)

    # -- paths ------------------------------------------------------------------------------
    def worktree_path(self, commit: str) -> Path:
        return self.base / "worktrees" / commit

    def _lock_key(self) -> str:
        return f"git-{self.target}"

    @property
    def cloned(self) -> bool:
        return (self.git_dir / "HEAD").is_file()

    # -- clone and fetch --------------------------------------------------------------------
    def repo(self) -> git.Repo:
        """The cached bare clone, cloning it from the source first if needed."""
        if self._repo is None:
            if not self.cloned:
                with cachemod.lock(self._lock_key(), self.cache):
                    if not self.cloned:
                        self._clone()
            self._repo = git.Repo(self.git_dir)
            self._repo.git.update_environment(**_GIT_ENV)
        return self._repo

    def _clone(self) -> None:
        tmp = cachemod.scratch(self.cache, f"clone-{self.target}")
        try:
            git.Repo.clone_from(self.source, tmp / "repo.git", bare=True, env=dict(os.environ, **_GIT_ENV))
            self.git_dir.parent.mkdir(parents=True, exist_ok=True)
            if self.git_dir.exists():
                cachemod.remove(self.git_dir)  # a clone without HEAD is incomplete: never trusted
            os.rename(tmp / "repo.git", self.git_dir)
        except git.GitCommandError as exc:
            raise self._unreachable("clone", exc) from None
        finally:
            cachemod.remove(tmp)

    def _unreachable(self, what: str, exc: git.GitCommandError) -> GitError:
        first = _stderr(exc).splitlines()[-1] if _stderr(exc) else str(exc)
        if self.local:
            return NotARepository(f"cannot {what} from {self.source}: {first}")
        why = "no network?" if is_network_error(exc) else "a wrong URL?"
        return Unreachable(f"cannot {what} {self.source} ({why}): {first}")

    def fetch(self, commit: str | None = None) -> None:
        """Fetch branches and tags from the source (into a maskfuzz namespace for a local source,
        so a mirror's refs never shadow upstream's), then `commit` itself if still missing."""
        repo = self.repo()
        if self.local:
            specs = ["+refs/heads/*:refs/maskfuzz/local/heads/*", "+refs/tags/*:refs/maskfuzz/local/tags/*"]
        else:
            specs = ["+refs/heads/*:refs/heads/*", "+refs/tags/*:refs/tags/*"]
        with cachemod.lock(self._lock_key(), self.cache):
            try:
                repo.git.fetch("--quiet", self.source, *specs)
                if commit and not self.has_commit(commit):
                    # a commit on no branch or tag of a local clone (e.g. its detached HEAD)
                    repo.git.fetch("--quiet", self.source, commit)
            except git.GitCommandError as exc:
                raise self._unreachable("fetch", exc) from None

    def has_commit(self, commit: str) -> bool:
        if not self.cloned:
            return False
        try:
            rev_parse(self.repo(), commit)
            return True
        except UnknownRevision:
            return False

    # -- History ----------------------------------------------------------------------------
    def resolve(self, rev: str) -> str:
        """Full hash of `rev`. A local source is asked directly (and the clone fetches what it
        lacks); an upstream clone is asked first and refreshed from upstream when it does not
        know `rev`, or when `rev` is a name (branch, tag, HEAD) that may have moved."""
        if self._local is not None:
            full = rev_parse(self._local, rev)
            if not self.has_commit(full):
                self.fetch(full)
            return full
        repo = self.repo()
        looks_like_hash = bool(HEX.match(rev))
        try:
            known = rev_parse(repo, rev)
        except UnknownRevision:
            known = None
        if known is not None and looks_like_hash:
            return known
        try:
            self.fetch()
        except Unreachable as exc:
            if known is None:
                raise UnknownRevision(f"{rev!r} is not in the cached clone of {self.source}, and {exc}") from None
            self.notes.append(f"{rev} resolved from the cached clone; could not refresh it: {exc}")
            return known
        try:
            return rev_parse(repo, rev)
        except UnknownRevision:
            raise UnknownRevision(f"{rev!r} names no commit in {self.source}") from None

    def revisions(self, old: str, new: str, first_parent: bool = False) -> list[Commit]:
        """Commits in (old, new], oldest first. Without `first_parent`, commits merged in from
        side branches are included (as `git bisect` does)."""
        a, b = self.resolve(old), self.resolve(new)
        # topological order keeps each side branch's commits together, so a linear bisection over
        # the list is consistent with ancestry wherever it can be
        args = ["--reverse", "--topo-order", "--format=%H%x00%cI%x00%s"]
        if first_parent:
            args.append("--first-parent")
        out = self.repo().git.log(*args, f"{a}..{b}", "--")
        commits = []
        for line in out.splitlines():
            if line.strip():
                h, date, subject = line.split("\x00", 2)
                commits.append(Commit(h, date, subject))
        return commits

    def describe(self, rev: str) -> Commit:
        full = self.resolve(rev)
        h, date, subject = self.repo().git.log("-1", "--format=%H%x00%cI%x00%s", full, "--").split("\x00", 2)
        return Commit(h, date, subject)

    def checkout(self, commit: str) -> Path:
        """The worktree of `commit` (a full hash), created in a scratch folder and moved into place
        so a half-checked-out tree is never visible; reused when it already exists."""
        final = self.worktree_path(commit)
        if (final / ".git").exists():
            return final
        repo = self.repo()
        if not self.has_commit(commit):
            self.fetch(commit)
            if not self.has_commit(commit):
                raise UnknownRevision(f"{commit} is not in the cached clone of {self.source}")
        with cachemod.lock(self._lock_key(), self.cache):
            if (final / ".git").exists():
                return final  # another process made it while we waited
            tmp = cachemod.scratch(self.cache, f"wt-{self.target}")
            staged = tmp / commit  # the worktree's admin name is the folder name: keep it the hash
            try:
                repo.git.worktree("prune")  # forget worktrees whose folders a crash or a person removed
                try:
                    repo.git.worktree("add", "--detach", str(staged), commit)
                except git.GitCommandError as exc:
                    if "unable to read sha1 file" not in _stderr(exc) and "missing blob" not in _stderr(exc):
                        raise
                    self._drop(staged)
                    self._add_skipping_missing_blobs(staged, commit)
                final.parent.mkdir(parents=True, exist_ok=True)
                if final.exists():
                    cachemod.remove(final)  # a leftover without .git: never trusted, and `move` would nest into it
                repo.git.worktree("move", str(staged), str(final))
            except (git.GitCommandError, subprocess.CalledProcessError) as exc:
                self._drop(staged)
                detail = _stderr(exc) if isinstance(exc, git.GitCommandError) else (exc.stderr or str(exc)).strip()
                raise GitError(f"cannot check out {commit} from the cached clone of {self.source}: {detail}")
            finally:
                cachemod.remove(tmp)
        return final

    def _add_skipping_missing_blobs(self, staged: Path, commit: str) -> None:
        """Check `commit` out without the files whose blobs the repository lacks (a mirror made
        without its largest files, e.g. datasets and PDFs); their paths are listed in ABSENT inside
        the worktree. Only used after a plain `worktree add` failed on a missing object."""
        repo = self.repo()
        repo.git.worktree("add", "--detach", "--no-checkout", str(staged), commit)
        blobs = []  # (sha, path)
        for item in repo.git.ls_tree("-r", "-z", "--full-tree", commit).split("\x00"):
            if item:
                meta, path = item.split("\t", 1)
                _mode, kind, sha = meta.split()
                if kind == "blob":
                    blobs.append((sha, path))
        check = subprocess.run(
            ["git", "--git-dir", str(self.git_dir), "cat-file", "--batch-check=%(objectname) %(objecttype)"],
            input="".join(f"{sha}\n" for sha, _ in blobs), capture_output=True, text=True, check=True,
        )  # fmt: skip
        missing = {line.split()[0] for line in check.stdout.splitlines() if line.endswith(" missing")}
        present = [path for sha, path in blobs if sha not in missing]
        absent = [path for sha, path in blobs if sha in missing]
        wt = git.Git(str(staged))
        wt.update_environment(**_GIT_ENV)
        wt.reset("-q")  # fill the index from HEAD (trees only, no blobs needed)
        subprocess.run(["git", "-C", str(staged), "checkout-index", "-f", "-z", "--stdin"],
                       input="\x00".join(present), capture_output=True, text=True, check=True)
        (staged / ABSENT).write_text("".join(f"{p}\n" for p in absent))

    def absent_files(self, commit: str) -> list[str]:
        """Files of `commit` missing from its worktree because the source lacks their blobs."""
        marker = self.worktree_path(commit) / ABSENT
        return marker.read_text().splitlines() if marker.is_file() else []

    def remove_worktree(self, commit: str) -> None:
        final = self.worktree_path(commit)
        if not final.exists():
            return
        with cachemod.lock(self._lock_key(), self.cache):
            self._drop(final)

    def _drop(self, path: Path) -> None:
        try:
            self.repo().git.worktree("remove", "--force", str(path))
        except git.GitCommandError:
            cachemod.remove(path)
            try:
                self.repo().git.worktree("prune")
            except git.GitCommandError:
                pass

    def worktrees(self) -> list[str]:
        """Full hashes that have a worktree in the cache."""
        d = self.base / "worktrees"
        return sorted(p.name for p in d.iterdir() if (p / ".git").exists()) if d.is_dir() else []

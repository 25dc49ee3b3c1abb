"""The real histories and evaluators behind `fuzz.bisect`.

Histories (`fuzz.bisect.Repository`):
  * `CommitHistory`: a target's cached git clone (`targets.acquire.history`, gitpython), or any
    local repository (`local_history`); lists (old, new] oldest first, optionally first parents only.
  * `ReleaseHistory`: a target's released versions (from `pip index versions NAME` or given),
    ordered by PEP 440, restricted to [old, new].

Evaluators (`fuzz.bisect.Evaluator`), each judging one corpus case's property at a revision:
  * `TargetEvaluator`: a registered target opened at the revision with
    `targets.session.open_target` (its worker runs the framework's own code), judged with
    `oracles.kinds.dispatch.judge(..., only=(property,))`; the git worktree is removed afterwards.
  * `CallableEvaluator`: a user's function `MODULE:FUNC` (canonical keyword signature, see
    `targets.adapters.callable`) imported from the revision's worktree of a local repository, in
    the same isolated worker.

Verdict mapping (`outcome_of`): the property fails -> bad, passes -> good; the target cannot be
set up, the function is missing, or the property does not apply -> skip.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Callable, Iterable, Protocol

from maskfuzz.fuzz.bisect import BAD, GOOD, SKIP, BisectError, Outcome, Revision
from maskfuzz.fuzz.semantics import card
from maskfuzz.oracles.case import Case
from maskfuzz.oracles.kinds.dispatch import judge
from maskfuzz.targets.runtime import acquire, gitrepo, session
from maskfuzz.targets.runtime import cache as cachemod


class CaseEntry(Protocol):
    """What the evaluators need of a corpus entry (`fuzz.corpus_codec.Entry` has these)."""

    case: Case
    property: str


# ---------------------------------------------------------------------------------------------
# Git history.
# ---------------------------------------------------------------------------------------------
class CommitHistory:
    """A target's git history (`targets.gitrepo.History`, normally the cached clone that
    `targets.acquire.history` returns) as a bisection `Repository`.

    `revisions` lists (old, new] oldest first as the acquisition module does (`git log --reverse
    old..new`, with `--first-parent` on request); `old` must be an ancestor of `new`."""

    def __init__(self, history):
        self.history = history

    def resolve(self, rev: str) -> str:

        try:
            return acquire.resolve_revision(self.history, rev)
        except gitrepo.GitError as exc:
            raise BisectError(str(exc)) from None

    def describe(self, rev: str) -> Revision:
        full = self.resolve(rev)
        if hasattr(self.history, "describe"):
            c = self.history.describe(full)
            return Revision(c.hash, c.date, c.subject)
        repo = self._git()
        if repo is None:
            return Revision(full)
        commit = repo.commit(full)
        return Revision(full, commit.committed_datetime.isoformat(), commit.summary)

    def _git(self):
        """The gitpython Repo behind the history, when it has one (a fake may not)."""
        get = getattr(self.history, "repo", None)
        return get() if callable(get) else None

    def revisions(self, old: str, new: str, first_parent: bool = False) -> list[Revision]:
        a, b = self.resolve(old), self.resolve(new)
        repo = self._git()
        if a == b or (repo is not None and not repo.is_ancestor(a, b)):
            raise BisectError(
                f"{new} ({b[:12]}) does not descend from {old} ({a[:12]}); give --old an ancestor of --new"
            )
        commits = self.history.revisions(a, b, first_parent=first_parent)
        if not commits or commits[-1].hash != b:
            raise BisectError(f"cannot list ({a[:12]}, {b[:12]}]")
        return [Revision(c.hash, c.date, c.subject) for c in commits]

    def merges(self, old: str, new: str) -> int:
        """How many merge commits lie in (old, new] (0 when the history cannot tell)."""
        repo = self._git()
        if repo is None:
            return 0
        a, b = self.resolve(old), self.resolve(new)
        return int(repo.git.rev_list("--count", "--merges", f"{a}..{b}").strip() or 0)

    def remove_worktree(self, rev: str) -> None:
        self.history.remove_worktree(rev)


class Worktrees:
    """Removes the worktrees a bisection creates, and only those: a commit's worktree that was in
    the cache before (a pinned commit another run may be using) stays. `before(hash)` is called
    when a revision's evaluation starts, `done(hash)` after its last run."""

    def __init__(self, history):
        self.history = history  # targets.gitrepo.History
        self._had: dict[str, bool] = {}

    def before(self, commit: str) -> None:
        listed = getattr(self.history, "worktrees", None)
        self._had.setdefault(commit, commit in listed() if callable(listed) else False)

    def done(self, commit: str) -> None:
        if not self._had.pop(commit, True):
            self.history.remove_worktree(commit)


def local_history(path: str | Path, name: str = "local", cache: Path | None = None):
    """A `targets.gitrepo.CachedRepo` over a local clone or bare mirror that is no registered
    target (e.g. the repository of a `--callable` function): cached as `local-<name>`."""

    cache = Path(cache) if cache is not None else cachemod.cache_dir()
    try:
        return gitrepo.CachedRepo(f"local-{name}", cache, str(Path(path).expanduser()), local=True)
    except gitrepo.GitError as exc:
        raise BisectError(str(exc)) from None


# ---------------------------------------------------------------------------------------------
# Released versions.
# ---------------------------------------------------------------------------------------------
_PEP440 = re.compile(
    r"^\s*v?(?:(?P<epoch>\d+)!)?(?P<release>\d+(?:\.\d+)*)"
    r"(?:[-_.]?(?P<pre_l>a|b|c|rc|alpha|beta|pre|preview)[-_.]?(?P<pre_n>\d*))?"
    r"(?:-(?P<post_n1>\d+)|[-_.]?(?P<post_l>post|rev|r)[-_.]?(?P<post_n2>\d*))?"
    r"(?:[-_.]?(?P<dev_l>dev)[-_.]?(?P<dev_n>\d*))?"
    r"(?:\+[a-z0-9]+(?:[-_.][a-z0-9]+)*)?\s*$",
    re.IGNORECASE,
)
_PRE_RANK = {"a": 0, "alpha": 0, "b": 1, "beta": 1, "c": 2, "rc": 2, "pre": 2, "preview": 2}


def pep440_key(version: str) -> tuple:
    """A sort key ordering versions as PEP 440 does (epoch, release without trailing zeros,
    dev < a < b < rc < final < post); local labels are ignored. ValueError if not a version."""
    m = _PEP440.match(version)
    if not m:
        raise ValueError(f"not a PEP 440 version: {version!r}")
    release = [int(x) for x in m["release"].split(".")]
    while len(release) > 1 and release[-1] == 0:
        release.pop()
    post_n = m["post_n1"] or m["post_n2"]
    has_post = m["post_n1"] is not None or m["post_l"] is not None
    if m["pre_l"]:
        pre = (0, _PRE_RANK[m["pre_l"].lower()], int(m["pre_n"] or 0))
    elif m["dev_l"] and not has_post:
        pre = (-1,)  # 1.0.dev1 sorts before 1.0a1
    else:
        pre = (1,)
    post = (int(post_n or 0),) if has_post else (-1,)
    dev = (0, int(m["dev_n"] or 0)) if m["dev_l"] else (1,)
    return (int(m["epoch"] or 0), tuple(release), pre, post, dev)


def is_prerelease(version: str) -> bool:
    """Whether `version` is a pre- or dev-release (pip lists those only with --pre)."""
    key = pep440_key(version)
    return key[2] != (1,) or key[4] != (1,)


def version_key(version: str):
    """`packaging.version.Version` when packaging is installed, else `pep440_key`."""
    try:
        from packaging.version import InvalidVersion, Version
    except ImportError:
        return pep440_key(version)
    try:
        return Version(version)
    except InvalidVersion:
        raise ValueError(f"not a PEP 440 version: {version!r}") from None


def released_versions(
    package: str, runner: Callable[..., subprocess.CompletedProcess] = subprocess.run, pre: bool = False
) -> list[str]:
    """The versions of `package` on the package index, via `python -m pip index versions` (with
    `pre`, pre-releases too). Raises BisectError with pip's message when the index cannot be reached."""
    cmd = [sys.executable, "-m", "pip", "index", "versions", package, "--disable-pip-version-check"]
    if pre:
        cmd.append("--pre")
    proc = runner(cmd, capture_output=True, text=True, timeout=120)
    m = re.search(r"Available versions:\s*(.+)", proc.stdout or "")
    if proc.returncode != 0 or not m:
        detail = (proc.stderr or proc.stdout or "").strip().splitlines()
        raise BisectError(f"cannot list the releases of {package}: {' / '.join(detail[-2:]) or 'no output'}")
    return [v.strip() for v in m.group(1).split(",") if v.strip()]


class ReleaseHistory:
    """A package's released versions in PEP 440 order, as a history: revisions(old, new) are
    the versions v with old < v <= new (both ends must be releases)."""

    def __init__(self, versions: Iterable[str], package: str = ""):
        keyed = {}
        for v in versions:
            try:
                keyed.setdefault(version_key(v), v)
            except ValueError:
                continue  # not a version: never a bisection point
        self.versions = [keyed[k] for k in sorted(keyed)]
        self.package = package

    @classmethod
    def from_index(cls, package: str, runner=subprocess.run, pre: bool = False) -> "ReleaseHistory":
        return cls(released_versions(package, runner, pre), package)

    def _index(self, version: str) -> int:
        try:
            key = version_key(version)
        except ValueError:
            raise BisectError(f"{version!r} is not a version") from None
        for i, v in enumerate(self.versions):
            if version_key(v) == key:
                return i
        shown = ", ".join(self.versions) or "none"
        raise BisectError(f"{self.package or 'the package'} has no release {version}; releases: {shown}")

    def describe(self, rev: str) -> Revision:
        v = self.versions[self._index(rev)]
        return Revision(v, subject=f"{self.package} {v}".strip())

    def revisions(self, old: str, new: str, first_parent: bool = False) -> list[Revision]:
        lo, hi = self._index(old), self._index(new)
        if hi <= lo:
            raise BisectError(f"{new} is not a later release than {old}")
        return [Revision(v, subject=f"{self.package} {v}".strip()) for v in self.versions[lo + 1 : hi + 1]]

    def is_release(self, rev: str) -> bool:
        try:
            self._index(rev)
        except BisectError:
            return False
        return True


# ---------------------------------------------------------------------------------------------
# Judging one case at one revision.
# ---------------------------------------------------------------------------------------------
def outcome_of(verdicts: list, prop: str) -> Outcome:
    """Map the judge's verdicts to good / bad / skip for property `prop`.

    A property the judge could not reach (the base run crashed before it, or n/a) is a skip with
    the reason, unless `prop` is itself the one that failed."""
    by_id = {v.property: v for v in verdicts}
    v = by_id.get(prop)
    if v is not None and v.status == "fail":
        return Outcome(BAD, f"{prop} fails: {v.message}")
    if v is not None and v.status == "pass":
        return Outcome(GOOD)
    crash = by_id.get("no-crash")
    if crash is not None and crash.status == "fail":
        return Outcome(SKIP, f"{prop} not judged: no-crash fails ({crash.message})")
    why = v.message if v is not None else "no verdict"
    return Outcome(SKIP, f"{prop} does not apply: {why}")


def _judge(run, case: Case, declared, device: str, prop: str) -> Outcome:

    return outcome_of(judge(run, case, declared, device, only=(prop,)), prop)


class TargetEvaluator:
    """Judges `entry.case` on a registered target at each revision: a git hash, or a release
    version when `releases=True` (opened as the pin `==VERSION`, so a `--repo` for the target
    never turns a version into a git revision).

    `opener(ref, repos=..., device=..., timeout=...)` is `targets.session.open_target` and
    `ref_factory(target, entry, pin)` is `targets.session.TargetRef` unless injected.
    `worktrees` (git only: a `Worktrees` over the cached clone) removes each revision's checkout
    in `done`, which `bisect` calls after the revision's last run, so a long bisection holds at
    most one checkout on disk."""

    def __init__(
        self,
        entry: CaseEntry,
        target: str,
        *,
        target_entry: str | None = None,
        repos: dict | None = None,
        releases: bool = False,
        device: str = "cpu",
        timeout: float = 60.0,
        opener: Callable | None = None,
        ref_factory: Callable | None = None,
        worktrees: Worktrees | None = None,
    ):
        self.entry = entry
        self.target = target
        self.target_entry = target_entry
        self.repos = repos
        self.releases = releases
        self.device = device
        self.timeout = timeout
        self._opener = opener
        self._ref_factory = ref_factory
        self.worktrees = worktrees

    def _session(self):
        if self._opener is None or self._ref_factory is None:

            self._opener = self._opener or session.open_target
            self._ref_factory = self._ref_factory or session.TargetRef
        return self._opener, self._ref_factory

    def __call__(self, revision: Revision) -> Outcome:
        if self.worktrees is not None:
            self.worktrees.before(revision.id)
        try:
            opener, make_ref = self._session()
            pin = f"=={revision.id}" if self.releases else revision.id
            ref = make_ref(self.target, self.target_entry, pin)
            with opener(ref, repos=self.repos, device=self.device, timeout=self.timeout) as handle:
                return self.verdict(handle)
        except Exception as exc:  # noqa: BLE001 - Skip / SetupError / anything else: not judged here
            return Outcome(SKIP, _skip_reason(exc))

    def verdict(self, handle) -> Outcome:
        """Good / bad / skip of the opened target at one revision: the case's property."""
        return _judge(handle.run, self.entry.case, handle.declared, self.device, self.entry.property)

    def done(self, revision: Revision) -> None:
        if self.worktrees is not None:
            self.worktrees.done(revision.id)


class SemanticsEvaluator(TargetEvaluator):
    """Bisects a behaviour change: good where one dimension of the entry's semantics card
    (`oracles.kinds.semantics`) has the value it has at the old end (`old_value`, as `Dimension.value()`
    prints it), bad where it differs, skip where the cases cannot tell. `entry` is unused (None): no
    corpus case, the card draws its own clean cases (`card`, injectable: fuzz.semantics.card)."""

    def __init__(self, target: str, dimension: str, old_value: str | None = None, *, card=None, **kw):
        super().__init__(None, target, **kw)
        self.dimension = dimension
        self.old_value = old_value
        self._card = card

    def value(self, handle) -> str | None:
        """The dimension's value at the opened revision, or None when the card has no such told dimension."""
        if self._card is None:

            self._card = card
        d = self._card(handle.run, handle.declared).dimension(self.dimension)
        return None if d is None or not d.told else d.value()

    def verdict(self, handle) -> Outcome:
        got = self.value(handle)
        if got is None:
            return Outcome(SKIP, f"{self.dimension}: not told apart (or not a dimension of this entry) here")
        if self.old_value is None:
            self.old_value = got
        if got == self.old_value:
            return Outcome(GOOD)
        return Outcome(BAD, f"{self.dimension}: {got} (was {self.old_value})")


def _skip_reason(exc: BaseException) -> str:
    kind = type(exc).__name__
    label = {"Skip": "not present", "SetupError": "cannot set up", "RefError": "cannot set up"}.get(kind, kind)
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    # the first line says what and what to do; the last one that is not a note is the error the worker hit (a
    # note in parentheses, e.g. the files a mirror lacks, follows it: kept, but it must not hide the error)
    notes = [line for line in lines[1:] if line.startswith("(")]
    rest = [line for line in lines[1:] if not line.startswith("(")]
    text = lines[0] + (f" [... {rest[-1]}]" if rest else "") + "".join(f" {n}" for n in notes) if lines else ""
    return f"{label}: {text}"[:600]


class CallableEvaluator:
    """Judges `entry.case` on a user's function `MODULE:FUNC` (canonical keyword signature, see
    `targets.adapters.callable`) imported from a git history at each revision: the revision's
    worktree (`history.checkout`, below `subdir`) goes first on the worker's sys.path
    (`targets.session.open_callable`); `done` removes it unless it was there before."""

    def __init__(
        self,
        entry: CaseEntry,
        history,
        function: str,
        declared,
        *,
        subdir: str = "",
        device: str = "cpu",
        timeout: float = 60.0,
    ):
        self.entry = entry
        self.history = history  # targets.gitrepo.History
        self.function = function
        self.declared = declared
        self.subdir = subdir
        self.device = device
        self.timeout = timeout
        self.worktrees = Worktrees(history)

    def __call__(self, revision: Revision) -> Outcome:

        self.worktrees.before(revision.id)
        try:
            root = self.history.checkout(revision.id) / self.subdir
            with session.open_callable(
                self.function, declared=self.declared, device=self.device, timeout=self.timeout, path=root
            ) as handle:
                return _judge(handle.run, self.entry.case, handle.declared, self.device, self.entry.property)
        except Exception as exc:  # noqa: BLE001 - missing module / import error / git: a skip
            return Outcome(SKIP, _skip_reason(exc))

    def done(self, revision: Revision) -> None:
        self.worktrees.done(revision.id)

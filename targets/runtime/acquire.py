"""Turn (target, pin) into a checkout on disk: a git worktree or an unpacked release wheel.

How a pin is read (first rule that applies):

1. `==VERSION` is always the release wheel `package==VERSION`.
2. A pin registered in the target's spec has the kind the spec gives it (`Pin.kind`).
3. With a local repository for the target (`--repo NAME=PATH` / MASKFUZZ_REPOS), a git revision
   of that repository: full or short hash, tag, branch, `HEAD`.
4. A version string (0.4.1, 0.3.0.post1, 0.2) is the release wheel when the spec has a `package`.
5. Anything else is a revision of the spec's upstream URL.

A git revision that is a bare version (`0.4.1`) and names nothing is retried as the tag `v0.4.1`.

`Checkout.resolved` is the full commit hash for git pins and `"PACKAGE==VERSION"` for releases
(short, so it reads well in reports); the wheel's file name and sha256 are in `Checkout.info`.
Every failure is an `AcquireError` whose message names the target, the pin and what to do.
"""

from __future__ import annotations

import dataclasses
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from maskfuzz.targets.registry import TargetSpec
from maskfuzz.targets.runtime import cache as cachemod
from maskfuzz.targets.runtime import gitrepo, wheels

VERSION = re.compile(r"^\d+(\.\d+)+((a|b|rc)\d+)?(\.post\d+)?(\.dev\d+)?(\+[A-Za-z0-9.]+)?$")


class AcquireError(Exception):
    """The code of a pin could not be brought into the cache; the message says what to do."""


class PinMissing(AcquireError):
    """The pin names nothing: the package index answered without that version, or the repository
    has no such revision. Bad input, unlike a network that is down."""


@dataclass(frozen=True)
class Checkout:
    """A pin's code on disk. `root` goes first on sys.path in the worker."""

    target: str
    pin: str  # as the user or the registry wrote it
    resolved: str  # full commit hash, or "PACKAGE==VERSION"
    kind: str  # "git" | "release"
    root: Path
    info: dict = field(default_factory=dict, compare=False)  # source, wheel + sha256, notes


def is_version(pin: str) -> bool:
    return bool(VERSION.match(pin))


LATEST, MAIN = "latest", "main"  # moving pins: the newest release, the default branch (resolved at run time)


def pin_kind(spec: TargetSpec, pin: str, repos: Mapping[str, Path] | None = None) -> str:
    """'release' or 'git', by the rules in the module docstring."""
    if pin.startswith("==") or pin == LATEST:
        return "release"
    registered = spec.pin(pin)
    if registered is not None:
        return registered.kind
    if repos and spec.id in repos:
        return "git"
    if spec.package and is_version(pin):
        return "release"
    return "git"


def acquire(
    spec: TargetSpec,
    pin: str,
    repos: Mapping[str, Path] | None = None,
    cache: Path | None = None,
    *,
    downloader: wheels.Downloader | None = None,
    lister: wheels.Lister | None = None,
) -> Checkout:
    """Bring `spec`'s code at `pin` into the cache (once) and return where it is. The moving pins
    resolve now: `latest` to the newest release on the package index, `main` to the head of the
    repository's default branch (fetched fresh); `Checkout.resolved` records what they were."""
    cache = Path(cache) if cache is not None else cachemod.cache_dir()
    if pin == LATEST:
        if not spec.package:
            raise AcquireError(f"{spec.id}@latest: {spec.id} has no releases on PyPI; use {spec.id}@main")
        try:
            version = wheels.latest_version(spec.package, spec.pip_args, lister)
        except wheels.DownloadError as exc:
            raise AcquireError(f"{spec.id}@latest: cannot tell the newest release: {exc}") from None
        out = _acquire_release(spec, version, cache, downloader)
        out.info["moving"] = f"latest = {version} (resolved {time.strftime('%Y-%m-%d %H:%M')})"
        return dataclasses.replace(out, pin=LATEST)
    if pin_kind(spec, pin, repos) == "release":
        return _acquire_release(spec, pin, cache, downloader)
    registered = spec.pin(MAIN)
    if pin == MAIN and (registered is None or registered.moving):
        out = _acquire_git(spec, "HEAD", repos or {}, cache, label=MAIN)  # the source's default branch, fetched
        out.info["moving"] = f"main = {out.resolved} (the default branch of {out.info.get('source')})"
        return dataclasses.replace(out, pin=MAIN)
    return _acquire_git(spec, pin, repos or {}, cache)


# -- releases ---------------------------------------------------------------------------------
def _acquire_release(spec: TargetSpec, pin: str, cache: Path, downloader) -> Checkout:
    version = pin.removeprefix("==")
    where = f"{spec.id}@{pin}"
    if not spec.package:
        raise AcquireError(f"{where}: {spec.id} has no releases on PyPI; pin a git revision ({spec.id}@<commit>)")
    try:
        root, meta = wheels.fetch_release(spec.package, version, cache, spec.pip_args, downloader)
    except wheels.DownloadError as exc:
        error = PinMissing if exc.kind == "version" and exc.versions else AcquireError
        raise error(_release_advice(spec, version, exc)) from None
    except OSError as exc:
        raise AcquireError(f"{where}: cannot write the release into the cache {cache}: {exc}") from None
    info = {"source": f"pypi:{spec.package}", "wheel": meta["wheel"], "sha256": meta["sha256"]}
    if meta.get("pip_args"):
        info["pip_args"] = meta["pip_args"]
    return Checkout(spec.id, pin, f"{spec.package}=={version}", "release", root, info)


def _release_advice(spec: TargetSpec, version: str, exc: wheels.DownloadError) -> str:
    head = f"{spec.id}@{version}: cannot download the {spec.package}=={version} wheel"
    if exc.kind == "network":
        return (
            f"{head}: {exc} -- no network? run once where PyPI is reachable (the wheel is cached in "
            f"{cachemod.cache_dir()}), or give --repo {spec.id}=/path/to/clone and pin a git revision"
        )
    if exc.kind == "version":
        offered = f"; the index offers {', '.join(exc.versions[-12:])}" if exc.versions else ""
        return f"{head}: {exc}{offered} -- check the version with `pip index versions {spec.package}`"
    return f"{head}: {exc}"


# -- git --------------------------------------------------------------------------------------
def source_of(spec: TargetSpec, repos: Mapping[str, Path] | None) -> tuple[str, bool]:
    """(URL or path, is_local) that git pins of `spec` come from."""
    if repos and spec.id in repos:
        return str(Path(repos[spec.id]).expanduser()), True
    if spec.git_url:
        return spec.git_url, False
    raise AcquireError(f"{spec.id} has no upstream git URL; give --repo {spec.id}=/path/to/clone")


def history(spec: TargetSpec, repos: Mapping[str, Path] | None = None, cache: Path | None = None) -> gitrepo.CachedRepo:
    """The target's cached git history (a `gitrepo.History`), for bisection. Raises AcquireError."""
    cache = Path(cache) if cache is not None else cachemod.cache_dir()
    source, local = source_of(spec, repos)
    try:
        return gitrepo.CachedRepo(spec.id, cache, source, local)
    except gitrepo.NotARepository as exc:
        raise AcquireError(f"--repo {spec.id}={source}: {exc}; give --repo {spec.id}=/path/to/a/clone") from None


def resolve_revision(repo: gitrepo.History, rev: str) -> str:
    """Full hash of `rev`, trying the tag `v<rev>` when a bare version names nothing."""
    try:
        return repo.resolve(rev)
    except gitrepo.UnknownRevision:
        if is_version(rev):
            try:
                return repo.resolve(f"v{rev}")
            except gitrepo.UnknownRevision:
                pass
        raise


def _acquire_git(
    spec: TargetSpec, pin: str, repos: Mapping[str, Path], cache: Path, label: str | None = None
) -> Checkout:
    where = f"{spec.id}@{label or pin}"
    try:
        repo = history(spec, repos, cache)
    except AcquireError as exc:
        raise AcquireError(f"{where}: {exc}") from None
    fix = f"give --repo {spec.id}=/path/to/clone" if not repo.local else f"check it with `git -C {repo.source} log`"
    try:
        full = resolve_revision(repo, pin)
        root = repo.checkout(full)
    except gitrepo.UnknownRevision as exc:
        raise PinMissing(f"{where}: unknown revision: {exc} -- {fix} (a full or short hash, tag or branch)") from None
    except gitrepo.Unreachable as exc:
        fix = f"give --repo {spec.id}=/path/to/clone (a clone or a bare mirror)"
        raise AcquireError(f"{where}: {exc} -- {fix}") from None
    except gitrepo.NotARepository as exc:
        raise AcquireError(f"{where}: --repo {spec.id}={repo.source}: {exc}") from None
    except gitrepo.GitError as exc:
        raise AcquireError(f"{where}: {exc}") from None
    except OSError as exc:
        raise AcquireError(f"{where}: cannot write the checkout into the cache {cache}: {exc}") from None
    info = {"source": repo.source, "worktree": str(root)}
    absent = repo.absent_files(full)
    if absent:
        info["absent"] = absent
        shown = ", ".join(absent[:3]) + (", ..." if len(absent) > 3 else "")
        repo.notes.append(f"{len(absent)} file(s) left out: the source lacks their contents ({shown})")
    if repo.notes:
        info["notes"] = list(repo.notes)
    return Checkout(spec.id, pin, full, "git", root, info)


# -- offline availability ---------------------------------------------------------------------
def available_offline(
    spec: TargetSpec, pin: str, repos: Mapping[str, Path] | None = None, cache: Path | None = None
) -> bool:
    """Whether `pin` can be checked out without a network: already in the cache, or resolvable
    from a local --repo (or from the cached clone). Never clones, fetches or downloads."""
    cache = Path(cache) if cache is not None else cachemod.cache_dir()
    try:
        if pin_kind(spec, pin, repos) == "release":
            if not spec.package:
                return False
            return wheels.read_meta(wheels.release_dir(cache, spec.package, pin.removeprefix("=="))) is not None
        candidates = [pin, f"v{pin}"] if is_version(pin) else [pin]
        if repos and spec.id in repos:
            local = gitrepo.open_local(Path(repos[spec.id]))
            return any(_resolves(local, rev) for rev in candidates)
        clone = cache / "git" / spec.id / "repo.git"
        if not (clone / "HEAD").is_file():
            return False
        return any(_resolves(gitrepo.open_local(clone), rev) for rev in candidates)
    except Exception:  # noqa: BLE001 - any failure here just means "not available offline"
        return False


def _resolves(repo, rev: str) -> bool:
    try:
        gitrepo.rev_parse(repo, rev)
        return True
    except gitrepo.UnknownRevision:
        return False

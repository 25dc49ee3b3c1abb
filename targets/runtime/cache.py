"""Where fetched upstream code lives, and the lock that keeps two processes from building it twice.

Layout under `cache_dir()`:

    git/<target>/repo.git               bare clone of the target's upstream (or of a --repo mirror)
    git/<target>/worktrees/<hash>/      one detached worktree per full commit hash
    releases/<package>/<version>/       an unpacked release wheel (+ .maskfuzz-release.json inside)
    locks/<key>.lock                    fcntl lock files, one per key
    tmp/                                half-built trees; renamed into place only when complete

Everything is built in `tmp/` (same filesystem) and renamed into place, so a reader never sees a
half-written tree, and a crash leaves at most a stray directory in `tmp/`.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Iterator

ENV = "MASKFUZZ_CACHE"


class LockTimeout(TimeoutError):
    """Another process held the lock longer than we were willing to wait."""


def cache_dir(env: dict | None = None) -> Path:
    """MASKFUZZ_CACHE, else $XDG_CACHE_HOME/maskfuzz, else ~/.cache/maskfuzz (not created here)."""
    env = os.environ if env is None else env
    if env.get(ENV):
        return Path(env[ENV]).expanduser()
    if env.get("XDG_CACHE_HOME"):
        return Path(env["XDG_CACHE_HOME"]).expanduser() / "maskfuzz"
    return Path.home() / ".cache" / "maskfuzz"


def _safe(key: str) -> str:
    # Lock file names come from target ids, package names and versions: keep them one path component.
    return re.sub(r"[^A-Za-z0-9._-]+", "_", key)


@contextlib.contextmanager
def lock(key: str, cache: Path | None = None, timeout: float | None = None) -> Iterator[Path]:
    """Hold an exclusive fcntl lock named `key` in `cache` for the duration of the block.

    Blocks until the lock is free (or raises LockTimeout after `timeout` seconds). The lock is
    released by the kernel if the holder dies, so a killed process never wedges the cache."""
    root = Path(cache) if cache is not None else cache_dir()
    path = root / "locks" / f"{_safe(key)}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if timeout is None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        else:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise LockTimeout(f"another process holds {path} (waited {timeout:g} s)") from None
                    time.sleep(0.05)
        yield path
    finally:
        os.close(fd)  # closing the descriptor releases the flock


STALE_SECONDS = 24 * 3600  # a scratch folder this old belongs to a process that was killed


def scratch(cache: Path, prefix: str) -> Path:
    """A fresh empty directory under `<cache>/tmp`, on the same filesystem as its final place.

    Scratch folders older than a day (left by killed processes) are removed on the way."""
    base = Path(cache) / "tmp"
    base.mkdir(parents=True, exist_ok=True)
    now = time.time()
    for old in base.iterdir():
        try:
            if now - old.stat().st_mtime > STALE_SECONDS:
                remove(old)
        except OSError:
            pass  # another process removed it first
    return Path(tempfile.mkdtemp(prefix=f"{_safe(prefix)}-", dir=base))


def remove(path: Path) -> None:
    """Remove a file or directory tree if it exists (cleanup after a failed build)."""
    path = Path(path)
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists() or path.is_symlink():
        path.unlink(missing_ok=True)

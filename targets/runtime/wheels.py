"""Release wheels: `pip download --no-deps` one wheel, unpack it into the cache, remember its hash.

The unpacked tree `<cache>/releases/<package>/<version>/` is importable as it is (a wheel is a
site-packages tree). Inside it, `.maskfuzz-release.json` records the wheel's file name, its
sha256, the pip options used and when it was fetched: the tree is complete iff that file exists,
because the tree is built in `<cache>/tmp/` and renamed into place with the file already in it.

The downloader is injectable (`Downloader`), so tests run the unpacking without a network.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from typing import Callable, Sequence

from maskfuzz.targets.runtime import cache as cachemod

META = ".maskfuzz-release.json"
# pip prints these when it cannot reach the index (before "No matching distribution found").
_NETWORK_MARKERS = (
    "NewConnectionError",
    "Failed to establish a new connection",
    "Temporary failure in name resolution",
    "Name or service not known",
    "Network is unreachable",
    "ConnectTimeoutError",
    "ReadTimeoutError",
    "Max retries exceeded",
    "ProxyError",
    "Could not fetch URL",
    "SSLError",
)


class DownloadError(Exception):
    """pip could not deliver the wheel. `kind`: 'version' (no such version or no wheel for this
    interpreter), 'network' (index unreachable) or 'other'; `versions` lists what the index offers
    when pip said so."""

    def __init__(self, kind: str, message: str, versions: tuple[str, ...] = ()):
        super().__init__(message)
        self.kind = kind
        self.versions = versions


# (package, version, destination folder, extra pip options) -> path of the downloaded wheel
Downloader = Callable[[str, str, Path, Sequence[str]], Path]


def normalize(name: str) -> str:
    """PEP 503 normalised distribution name (folder names in the cache)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def pip_download(package: str, version: str, dest: Path, extra: Sequence[str] = ()) -> Path:
    """Download exactly one wheel of `package==version` with this interpreter's pip."""
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable, "-m", "pip", "download",
        "--no-deps", "--only-binary=:all:", "--disable-pip-version-check", "--no-input",
        "--retries", "1", "--timeout", "30",  # fail in seconds, not minutes, when offline
        f"{package}=={version}", "-d", str(dest), *extra,
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    text = f"{proc.stdout}\n{proc.stderr}"
    if proc.returncode != 0:
        raise classify(text, package, version)
    wheels = sorted(dest.glob("*.whl"))
    if len(wheels) != 1:
        raise DownloadError("other", f"pip download left {len(wheels)} wheels in {dest}: {[w.name for w in wheels]}")
    return wheels[0]


# (package, extra pip options) -> the versions the index offers, newest first
Lister = Callable[[str, Sequence[str]], list]


def pip_versions(package: str, extra: Sequence[str] = ()) -> list[str]:
    """The versions of `package` the package index offers this interpreter (or the platform the
    `extra` options name), newest first, from `pip index versions`."""
    cmd = [
        sys.executable, "-m", "pip", "index", "versions", package,
        "--disable-pip-version-check", "--no-input", "--retries", "1", "--timeout", "30", *extra,
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    text = f"{proc.stdout}\n{proc.stderr}"
    m = re.search(r"Available versions:\s*(.+)", text)
    if proc.returncode != 0 or not m:
        raise classify(text, package, "<latest>")
    return [v.strip() for v in m.group(1).split(",") if v.strip()]


def latest_version(package: str, extra: Sequence[str] = (), lister: Lister | None = None) -> str:
    """The newest release of `package` (pre-releases aside) that the index offers: what a moving
    `@latest` pin means tonight."""
    versions = (lister or pip_versions)(package, tuple(extra))
    final = [v for v in versions if re.fullmatch(r"[0-9]+(\.[0-9]+)*(\.post[0-9]+)?", v)]
    if not (final or versions):
        raise DownloadError("version", f"the package index offers no release of {package}")
    return (final or versions)[0]


def classify(pip_output: str, package: str, version: str) -> DownloadError:
    """Turn pip's failure output into a DownloadError of the right kind."""
    versions: tuple[str, ...] = ()
    m = re.search(r"\(from versions: ([^)]*)\)", pip_output)
    if m and m.group(1).strip() != "none":
        versions = tuple(v.strip() for v in m.group(1).split(",") if v.strip())
    last = [ln.strip() for ln in pip_output.strip().splitlines() if ln.strip()]
    tail = last[-1] if last else "pip download failed"
    if any(marker in pip_output for marker in _NETWORK_MARKERS) and not versions:
        return DownloadError("network", f"cannot reach the package index: {tail}")
    if "No matching distribution" in pip_output or "Could not find a version" in pip_output:
        return DownloadError("version", f"no wheel of {package}=={version} for this interpreter: {tail}", versions)
    return DownloadError("other", tail)


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def release_dir(cache: Path, package: str, version: str) -> Path:
    return Path(cache) / "releases" / normalize(package) / version


LAYOUT = 2  # 2: *.data/purelib and platlib moved to the top of the tree, as pip installs them


def read_meta(tree: Path) -> dict | None:
    """The recorded wheel metadata of a complete tree of the current layout, or None."""
    try:
        meta = json.loads((Path(tree) / META).read_text())
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) and meta.get("layout") == LAYOUT else None


def _install_data_libs(tree: Path) -> None:
    """Move `NAME-VER.data/purelib` and `platlib` contents to the top of an unpacked wheel, where pip
    would install them (platform-tagged wheels such as OpenRLHF's keep their code there)."""
    for lib in sorted(tree.glob("*.data/purelib")) + sorted(tree.glob("*.data/platlib")):
        for item in lib.iterdir():
            if not (tree / item.name).exists():
                os.rename(item, tree / item.name)


def fetch_release(
    package: str,
    version: str,
    cache: Path,
    extra: Sequence[str] = (),
    downloader: Downloader | None = None,
) -> tuple[Path, dict]:
    """The unpacked tree of `package==version` and its metadata, downloading it once.

    Raises DownloadError; leaves nothing behind but the complete tree."""
    cache = Path(cache)
    final = release_dir(cache, package, version)
    meta = read_meta(final)
    if meta is not None:
        return final, meta
    with cachemod.lock(f"release-{normalize(package)}-{version}", cache):
        meta = read_meta(final)
        if meta is not None:
            return final, meta  # another process unpacked it while we waited
        tmp = cachemod.scratch(cache, f"release-{normalize(package)}-{version}")
        try:
            wheel = (downloader or pip_download)(package, version, tmp / "download", tuple(extra))
            tree = tmp / "tree"
            tree.mkdir()
            try:
                with zipfile.ZipFile(wheel) as zf:
                    zf.extractall(tree)  # extractall drops absolute and '..' parts of member names
            except zipfile.BadZipFile as exc:
                raise DownloadError("other", f"{wheel.name} is not a valid wheel: {exc}") from None
            _install_data_libs(tree)
            meta = {
                "layout": LAYOUT,
                "package": package,
                "version": version,
                "wheel": wheel.name,
                "sha256": sha256(wheel),
                "pip_args": list(extra),
                "fetched": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            }
            (tree / META).write_text(json.dumps(meta, indent=1) + "\n")
            if final.exists():
                cachemod.remove(final)  # an incomplete tree from an older layout: never trusted
            final.parent.mkdir(parents=True, exist_ok=True)
            os.rename(tree, final)
        finally:
            cachemod.remove(tmp)
    return final, meta

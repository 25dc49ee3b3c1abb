"""Release wheels: unpacking into the cache with an injected downloader (no network), the recorded
hash, errors that say what to do, nothing half-written, and one real `pip download` from PyPI."""

from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path

import pytest

from maskfuzz.targets.registry import Pin, TargetSpec
from maskfuzz.targets.runtime import acquire as acq
from maskfuzz.targets.runtime import wheels


def spec(**kw) -> TargetSpec:
    base = dict(id="toy", adapter="maskfuzz.targets.adapters.callable", own=("toy",), contract="compressed",
                package="toy-dist", pins=(Pin("1.2.3", "a release", default=True),))
    return TargetSpec(**(base | kw))


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    c = tmp_path / "cache"
    monkeypatch.setenv("MASKFUZZ_CACHE", str(c))
    return c


class FakePip:
    """Stands in for `pip download`: writes a small wheel, or fails the way pip does."""

    def __init__(self, fail: wheels.DownloadError | None = None, payload: bytes | None = None):
        self.calls: list[tuple] = []
        self.written: list[bytes] = []  # the bytes of each wheel handed over
        self.fail = fail
        self.payload = payload

    def __call__(self, package: str, version: str, dest: Path, extra) -> Path:
        self.calls.append((package, version, tuple(extra)))
        dest.mkdir(parents=True, exist_ok=True)
        wheel = dest / f"{package.replace('-', '_')}-{version}-py3-none-any.whl"
        if self.payload is not None:
            wheel.write_bytes(self.payload)
        else:
            with zipfile.ZipFile(wheel, "w") as zf:
                zf.writestr("toy/__init__.py", f"VERSION = {version!r}\n")
                zf.writestr("toy/gae.py", "def gae():\n    return 1\n")
                zf.writestr(f"toy_dist-{version}.dist-info/METADATA", f"Name: {package}\nVersion: {version}\n")
        self.written.append(wheel.read_bytes())
        if self.fail is not None:
            raise self.fail  # after writing: a half-finished download must not survive
        return wheel


def leftovers(cache: Path) -> list[str]:
    tmp = cache / "tmp"
    return sorted(p.name for p in tmp.iterdir()) if tmp.exists() else []


def test_release_is_unpacked_once_with_its_hash_recorded(cache):
    pip = FakePip()
    s = spec(pip_args=("--python-version", "3.12"))
    c = acq.acquire(s, "1.2.3", None, cache, downloader=pip)
    assert c.kind == "release" and c.resolved == "toy-dist==1.2.3" and c.pin == "1.2.3"
    assert c.root == cache / "releases" / "toy-dist" / "1.2.3"
    assert (c.root / "toy" / "__init__.py").read_text() == "VERSION = '1.2.3'\n"
    assert pip.calls == [("toy-dist", "1.2.3", ("--python-version", "3.12"))]  # the spec's extra pip options
    meta = json.loads((c.root / wheels.META).read_text())
    assert c.info["wheel"] == meta["wheel"] == "toy_dist-1.2.3-py3-none-any.whl"
    assert len(c.info["sha256"]) == 64 and c.info["sha256"] == meta["sha256"]
    assert c.info["pip_args"] == ["--python-version", "3.12"]
    again = acq.acquire(s, "==1.2.3", None, cache, downloader=pip)  # cached: pip is not called again
    assert again.root == c.root and len(pip.calls) == 1
    assert acq.available_offline(s, "1.2.3", None, cache) and not acq.available_offline(s, "1.2.4", None, cache)
    assert leftovers(cache) == []


def test_recorded_hash_is_the_wheels_sha256(cache):
    pip = FakePip()
    c = acq.acquire(spec(), "1.2.3", None, cache, downloader=pip)
    assert c.info["sha256"] == hashlib.sha256(pip.written[-1]).hexdigest()


def test_unknown_version_says_how_to_check(cache):
    err = wheels.DownloadError("version", "no wheel of toy-dist==9.9 for this interpreter", ("1.0", "1.2.3"))
    with pytest.raises(acq.AcquireError) as e:
        acq.acquire(spec(), "9.9", None, cache, downloader=FakePip(fail=err))
    msg = str(e.value)
    assert msg.startswith("toy@9.9:") and "pip index versions toy-dist" in msg and "1.0, 1.2.3" in msg
    assert not (cache / "releases" / "toy-dist" / "9.9").exists() and leftovers(cache) == []


def test_no_network_says_so(cache):
    err = wheels.DownloadError("network", "cannot reach the package index: ...")
    with pytest.raises(acq.AcquireError, match=r"toy@1\.2\.3: .*no network\?.*--repo toy="):
        acq.acquire(spec(), "1.2.3", None, cache, downloader=FakePip(fail=err))
    assert leftovers(cache) == [] and not (cache / "releases" / "toy-dist" / "1.2.3").exists()


def test_a_corrupt_wheel_leaves_nothing(cache):
    with pytest.raises(acq.AcquireError, match="not a valid wheel"):
        acq.acquire(spec(), "1.2.3", None, cache, downloader=FakePip(payload=b"not a zip"))
    assert leftovers(cache) == [] and not (cache / "releases" / "toy-dist" / "1.2.3").exists()


def test_a_target_without_releases_asks_for_a_revision(cache):
    with pytest.raises(acq.AcquireError, match=r"toy@==1\.0: toy has no releases on PyPI"):
        acq.acquire(spec(package=None), "==1.0", None, cache, downloader=FakePip())


def test_classify_reads_pip_output():
    missing = (
        "ERROR: Could not find a version that satisfies the requirement verl==9.9 (from versions: 0.1, 0.2, 0.4.1)\n"
        "ERROR: No matching distribution found for verl==9.9\n"
    )
    e = wheels.classify(missing, "verl", "9.9")
    assert e.kind == "version" and e.versions == ("0.1", "0.2", "0.4.1")
    offline = (
        "WARNING: Retrying (Retry(total=0, ...)) after connection broken by 'NewConnectionError(...: "
        "Failed to establish a new connection: [Errno -3] Temporary failure in name resolution')': /simple/verl/\n"
        "ERROR: Could not find a version that satisfies the requirement verl==0.4.1 (from versions: none)\n"
        "ERROR: No matching distribution found for verl==0.4.1\n"
    )
    assert wheels.classify(offline, "verl", "0.4.1").kind == "network"
    assert wheels.classify("ERROR: something else", "verl", "0.4.1").kind == "other"


@pytest.mark.network
def test_real_pip_download_of_a_small_wheel(cache):
    s = spec(id="miles", own=("miles",), package="miles-rl", pins=())
    try:
        c = acq.acquire(s, "0.0.2", None, cache)
    except acq.AcquireError as exc:
        if "no network?" in str(exc):
            pytest.skip(f"PyPI is not reachable from here: {exc}")
        raise
    assert c.resolved == "miles-rl==0.0.2" and c.info["wheel"] == "miles_rl-0.0.2-py3-none-any.whl"
    assert (c.root / "miles" / "utils" / "ppo_utils.py").is_file()  # the file targets.md says it ships
    assert (c.root / "miles_rl-0.0.2.dist-info" / "METADATA").is_file()
    assert leftovers(cache) == []
    with pytest.raises(acq.AcquireError) as e:  # an unknown version: pip lists what exists
        acq.acquire(s, "0.0.999", None, cache)
    assert "pip index versions miles-rl" in str(e.value) and "0.0.2" in str(e.value)


def test_latest_resolves_to_the_newest_release_and_records_it(cache):
    asked = []

    def lister(package, extra):
        asked.append((package, extra))
        return ["2.0.0rc1", "1.3.0", "1.2.3"]  # newest first, as `pip index versions` prints them

    s = spec()
    assert [p.rev for p in s.moving_pins] == ["latest"]  # every framework with releases has it
    c = acq.acquire(s, "latest", None, cache, downloader=FakePip(), lister=lister)
    assert c.pin == "latest" and c.resolved == "toy-dist==1.3.0" and "latest = 1.3.0" in c.info["moving"]
    assert asked == [("toy-dist", ())]
    with pytest.raises(acq.AcquireError, match="no releases on PyPI"):
        acq.acquire(spec(package=None), "latest", None, cache, lister=lister)
    assert wheels.latest_version("x", (), lambda p, e: ["0.3.0.post1", "0.3.0"]) == "0.3.0.post1"

"""The isolated worker, driven through the `--callable` adapter with tiny modules in tmp_path:
results come back intact however much the target prints; an exception, a crash and a hang are
verdicts and the worker restarts; a missing function is a skip; stand-ins and the deny-list."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch

from maskfuzz.oracles.case import Case
from maskfuzz.oracles.verdict import TargetFailure
from maskfuzz.targets.runtime.client import LoadSpec, Worker, WorkerSkip

ADAPTER = "maskfuzz.targets.adapters.callable"

TARGET = textwrap.dedent("""
    import os, sys, time

    def gae(*, token_rewards, values, trainable, attention, score, gamma, lam):
        # noise on every channel a target might write to: print, raw fd 1, stderr
        print("chatty target " * 200)
        sys.stdout.flush()
        os.write(1, b"\\x00\\x01 raw bytes straight to fd 1\\n" * 50)
        sys.stderr.write("stderr noise\\n")
        if gamma == 0.25:
            raise ValueError("boom at gamma 0.25")
        if gamma == 0.5:
            os._exit(7)
        if gamma == 0.75:
            time.sleep(120)
        return trainable * 2 + score[:, None], values + token_rewards
""")


def case(gamma: float = 0.9) -> Case:
    return Case.build(trainable=[[1, 1, 0], [0, 1, 1]], values=[[1, 2, 3], [4, 5, 6]],
                      token_rewards=[[0.5, 0, 0], [0, 0, 1]], score=[1.0, -1.0], gamma=gamma, lam=0.5)


@pytest.fixture
def module_dir(tmp_path) -> Path:
    (tmp_path / "wtarget.py").write_text(TARGET)
    return tmp_path


def worker(root: Path, entry: str = "wtarget:gae", timeout: float = 30.0, **kw) -> Worker:
    return Worker(LoadSpec(ADAPTER, str(root), entry, **kw), timeout=timeout)


def test_run_output_and_exceptions(module_dir):
    c = case()
    with worker(module_dir) as w:
        assert w.info["where"].endswith("wtarget.py::gae")
        adv, ret = w(c)  # the target printed kilobytes to stdout and fd 1 first
        assert torch.equal(adv, torch.tensor([[3.0, 3.0, 1.0], [-1.0, 1.0, 1.0]]))
        assert torch.equal(ret, torch.tensor([[1.5, 2.0, 3.0], [4.0, 5.0, 7.0]]))
        with pytest.raises(TargetFailure) as err:
            w(case(gamma=0.25))
        assert err.value.kind == "exception" and "ValueError: boom at gamma 0.25" in str(err.value)
        adv2, _ = w(c)  # the same process goes on after an exception
        assert torch.equal(adv2, adv) and w.restarts == 0 and w.calls == 3
        assert "stderr noise" in w.stderr_tail()


def test_crash_and_hang_are_verdicts_and_the_next_call_restarts(module_dir):
    with worker(module_dir, timeout=2.0) as w:
        with pytest.raises(TargetFailure) as err:
            w(case(gamma=0.5))  # os._exit(7) inside the target
        assert err.value.kind == "crash" and "exit code 7" in str(err.value)
        with pytest.raises(TargetFailure) as err:
            w(case(gamma=0.75))  # restarted for this call, which then sleeps past the timeout
        assert err.value.kind == "hang" and w.restarts == 1
        adv, _ = w(case())
        assert torch.equal(adv, torch.tensor([[3.0, 3.0, 1.0], [-1.0, 1.0, 1.0]])) and w.restarts == 2


def test_missing_function_or_module_is_a_skip(module_dir):
    with pytest.raises(WorkerSkip, match="no attribute 'nope'"):
        worker(module_dir, "wtarget:nope").start()
    with pytest.raises(WorkerSkip, match="not importable"):
        worker(module_dir, "no_such_module_here:gae").start()


STANDIN_TARGET = textwrap.dedent("""
    import fake_heavy_pkg_xyz                       # missing, listed in stand_ins: an inert module
    from fake_heavy_pkg_xyz.sub.deep import decorate  # submodules and attributes too

    try:
        import denied_pkg_abc                       # installed next to this file, but deny-listed
        DENIED_IMPORTED = True
    except ImportError:
        DENIED_IMPORTED = False

    @decorate                                       # an inert decorator returns the function
    def gae(*, token_rewards, values, trainable, attention, score, gamma, lam):
        flag = 1.0 if DENIED_IMPORTED else 0.0
        # any value drawn from a stand-in is inert and falsy
        return trainable * 0 + flag, values * 0 + (1.0 if fake_heavy_pkg_xyz.cuda.is_available() else 2.0)
""")


def test_stand_ins_and_deny_list(tmp_path):
    (tmp_path / "starget.py").write_text(STANDIN_TARGET)
    (tmp_path / "denied_pkg_abc").mkdir()
    (tmp_path / "denied_pkg_abc" / "__init__.py").write_text("")
    with worker(tmp_path, "starget:gae", stand_ins=("fake_heavy_pkg_xyz", "denied_pkg_abc"),
                deny=("denied_pkg_abc",)) as w:
        assert w.info["stand_ins_used"] == ["fake_heavy_pkg_xyz"]
        adv, ret = w(case())
        assert torch.all(adv == 0)  # the deny-listed package stayed missing (neither real nor stood in)
        assert torch.all(ret == 2)
    # (a missing package that is *not* listed fails the import: tests/test_session.py)


def test_workers_never_import_from_the_working_directory(tmp_path, module_dir, monkeypatch):
    """A `targets/` or `fuzz/` folder, an `oracles.py` or a broken `transformers` where maskfuzz
    runs must not shadow maskfuzz's own packages in the worker (spawned, or via the fork server)."""
    import os
    import subprocess
    import sys

    from maskfuzz.targets.runtime.forkserver import NO_CWD_MAIN

    hostile = tmp_path / "hostile"
    for pkg in ("targets", "fuzz", "transformers"):
        (hostile / pkg).mkdir(parents=True)
        (hostile / pkg / "__init__.py").write_text(f"raise ImportError('the hostile {pkg} package was imported')\n")
    (hostile / "oracles.py").write_text("raise ImportError('the hostile oracles module was imported')\n")
    monkeypatch.chdir(hostile)
    monkeypatch.setenv("MASKFUZZ_WORKER_START", "spawn")
    with worker(module_dir) as w:
        adv, _ = w(case())
        assert torch.equal(adv, torch.tensor([[3.0, 3.0, 1.0], [-1.0, 1.0, 1.0]]))
    # the command line the fork server and spawned workers start with: run from that directory
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    for module in ("maskfuzz.targets.runtime.worker", "maskfuzz.targets.runtime.forkserver"):
        proc = subprocess.run(
            [sys.executable, "-c", NO_CWD_MAIN.format(module=module)] + (["-1"] if module.endswith("server") else []),
            cwd=hostile, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120,
        )
        assert "hostile" not in proc.stderr, proc.stderr


def test_a_listed_package_is_stood_in_even_when_installed(tmp_path):
    """Hermetic loading: a broken installed copy of a stood-in package (a transformers that does
    not match the framework, on a typical GPU machine) is never imported."""
    (tmp_path / "htarget.py").write_text(STANDIN_TARGET.replace("fake_heavy_pkg_xyz", "broken_heavy_pkg"))
    (tmp_path / "broken_heavy_pkg").mkdir()
    broken = "raise RuntimeError('the installed copy was imported')\n"
    (tmp_path / "broken_heavy_pkg" / "__init__.py").write_text(broken)
    (tmp_path / "denied_pkg_abc").mkdir()
    (tmp_path / "denied_pkg_abc" / "__init__.py").write_text("")
    with worker(tmp_path, "htarget:gae", stand_ins=("broken_heavy_pkg",), deny=("denied_pkg_abc",)) as w:
        assert w.info["stand_ins_used"] == ["broken_heavy_pkg"]
        _, ret = w(case())
        assert torch.all(ret == 2)

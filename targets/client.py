"""The fuzzer's side of a worker process: start, load, run with a timeout, restart after a crash.

A `Worker` is a `Run` (see `oracles.properties`): calling it with a case returns (advantages,
returns) or raises `TargetFailure` with kind 'exception' (the target raised), 'crash' (the
process died) or 'hang' (no answer within the timeout). After a crash or hang the process is
killed and the next call starts and loads a fresh one, so a run goes on.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from oracles.case import Case
from oracles.properties import TargetFailure
from targets import worker as protocol

_PROJECT_ROOT = Path(__file__).resolve().parent.parent


class WorkerSkip(Exception):
    """The target's function is not present at this pin."""


class WorkerLoadError(Exception):
    """The target could not be imported at this pin (the message holds the worker's traceback)."""


@dataclass
class LoadSpec:
    """What a worker imports: the adapter module and the checkout it reads."""

    adapter: str
    root: str | None
    entry: str | None = None
    stand_ins: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()
    own: tuple[str, ...] = ()
    device: str = "cpu"
    env: dict = field(default_factory=dict)


class Worker:
    """One isolated process per (target, pin)."""

    def __init__(self, spec: LoadSpec, timeout: float = 60.0, load_timeout: float = 300.0):
        self.spec = spec
        self.timeout = timeout
        self.load_timeout = load_timeout
        self.info: dict | None = None
        self.restarts = 0
        self.calls = 0
        self._proc: subprocess.Popen | None = None
        self._stderr = None

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> dict:
        """Start the process and load the target; returns the load info.

        Raises WorkerSkip (function absent at this pin) or WorkerLoadError."""
        self.close()
        env = dict(os.environ)
        env.setdefault("PYTHONHASHSEED", "0")
        env.setdefault("OMP_NUM_THREADS", "1")  # one worker per target: no intra-op thread contention
        env.update(self.spec.env)
        env["PYTHONPATH"] = os.pathsep.join(  # our own packages first, whatever the spec's env says
            [str(_PROJECT_ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        )
        self._stderr = tempfile.TemporaryFile()
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "targets.worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            env=env,
            cwd=os.getcwd(),
        )
        args = {k: getattr(self.spec, k) for k in ("adapter", "root", "entry", "stand_ins", "deny", "own", "device")}
        reply = self._exchange(("load", args), self.load_timeout, during="load")
        if reply[0] == "skip":
            self.close()
            raise WorkerSkip(reply[1])
        if reply[0] == "error":
            self.close()
            raise WorkerLoadError(reply[1])
        self.info = reply[1]
        return self.info

    def close(self) -> None:
        if self._proc is not None:
            try:
                if self._proc.poll() is None:
                    protocol.send(self._proc.stdin, ("exit",))
                    self._proc.wait(timeout=0.5)  # nothing to flush: a slow interpreter exit is killed
            except (OSError, subprocess.TimeoutExpired, ValueError):
                pass
            finally:
                if self._proc.poll() is None:
                    self._proc.kill()
                    self._proc.wait()
                for s in (self._proc.stdin, self._proc.stdout):
                    if s:
                        s.close()
            self._proc = None
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    def __enter__(self) -> "Worker":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- running ----------------------------------------------------------------------------
    def __call__(self, case: Case):
        if self._proc is None or self._proc.poll() is not None:
            self.restarts += self._proc is not None
            try:
                self.start()
            except (WorkerSkip, WorkerLoadError) as exc:  # one failure type for the engine
                raise TargetFailure("crash", f"the worker could not be restarted: {exc}") from None
        self.calls += 1
        reply = self._exchange(("run", case), self.timeout, during="run")
        if reply[0] == "ok":
            return reply[1], reply[2]
        raise TargetFailure("exception", f"{reply[1]}: {reply[2]}")

    def _exchange(self, message, timeout: float, during: str):
        assert self._proc is not None
        try:
            protocol.send(self._proc.stdin, message)
        except (BrokenPipeError, OSError):
            return self._died(during)
        deadline = time.monotonic() + timeout
        out = self._proc.stdout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self._kill()
                if during == "load":
                    raise WorkerLoadError(f"loading took longer than {timeout:.0f} s")
                raise TargetFailure("hang", f"no answer within {timeout:g} s; the worker was restarted")
            ready, _, _ = select.select([out], [], [], min(left, 1.0))
            if ready:
                break
        try:
            reply = protocol.receive(out)
        except (EOFError, OSError):
            reply = None
        if reply is None:
            return self._died(during)
        return reply

    def _died(self, during: str):
        code = self._proc.wait() if self._proc is not None else None
        tail = self.stderr_tail()
        self._kill()
        if during == "load":
            raise WorkerLoadError(f"the worker died while loading (exit code {code}): {tail}")
        raise TargetFailure("crash", f"the worker process died (exit code {code}); stderr ends: {tail}")

    def _kill(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()

    def stderr_tail(self, n: int = 1500) -> str:
        if self._stderr is None:
            return ""
        self._stderr.seek(0, os.SEEK_END)
        size = self._stderr.tell()
        self._stderr.seek(max(0, size - n))
        return self._stderr.read().decode("utf-8", "replace").strip()

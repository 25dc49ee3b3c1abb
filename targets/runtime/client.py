"""The fuzzer's side of a worker process: start, load, run with a timeout, restart after a crash.

A `Worker` is a `Run` (see `oracles.kinds.gae.properties`): calling it with a case returns (advantages,
returns) or raises `TargetFailure` with kind 'exception' (the target raised), 'crash' (the
process died) or 'hang' (no answer within the timeout). After a crash or hang the process is
killed and the next call starts and loads a fresh one, so a run goes on.

Processes are forked from a fork server (targets/runtime/forkserver.py) that has imported torch and its
compiler stack once, so starting a worker costs a fork and the target's own imports instead of a
whole interpreter start (a miles bisection step: about 2 s, worktree included, against about 7 s
with a fresh interpreter). `MASKFUZZ_WORKER_START=spawn` starts each worker as a fresh
`python -m maskfuzz.targets.runtime.worker` instead (slower; for debugging, or where fork is unavailable).
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field

from maskfuzz.oracles.case import Case
from maskfuzz.oracles.verdict import TargetFailure
from maskfuzz.targets.runtime import worker as protocol
from maskfuzz.targets.runtime.forkserver import NO_CWD_MAIN, ForkServer

START_ENV = "MASKFUZZ_WORKER_START"


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


def _worker_env(extra: dict) -> dict:
    env = dict(os.environ)
    env.setdefault("PYTHONHASHSEED", "0")
    env.setdefault("OMP_NUM_THREADS", "1")  # one worker per target: no intra-op thread contention
    env.update(extra)
    # maskfuzz comes from its installation (the `maskfuzz` namespace), never from a path: the
    # repository root on PYTHONPATH would expose bare `fuzz` / `targets` / `oracles` to the target
    return env


class _Spawned:
    """A worker as a fresh interpreter: `python -m maskfuzz.targets.runtime.worker` on pipes."""

    def __init__(self, env: dict, stderr):
        self._proc = subprocess.Popen(
            [sys.executable, "-c", NO_CWD_MAIN.format(module="maskfuzz.targets.runtime.worker")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            env=env,
            cwd=os.getcwd(),
        )

    def send(self, message) -> None:
        protocol.send(self._proc.stdin, message)

    def ready(self, timeout: float) -> bool:
        return bool(select.select([self._proc.stdout], [], [], timeout)[0])

    def receive(self):
        return protocol.receive(self._proc.stdout)

    @property
    def pid(self) -> int:
        return self._proc.pid

    def alive(self) -> bool:
        return self._proc.poll() is None

    def exitcode(self) -> int | None:
        return self._proc.wait()

    def kill(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait()
        for s in (self._proc.stdin, self._proc.stdout):
            if s:
                s.close()


_SERVER = ForkServer()


class _Forked:
    """A worker forked from the fork server, talking over a multiprocessing Connection."""

    def __init__(self, env: dict, stderr_path: str):
        self._pid, self._conn = _SERVER.spawn(stderr_path, env, os.getcwd())
        self._killed = False

    @property
    def pid(self) -> int:
        return self._pid

    def send(self, message) -> None:
        # plain pickle: multiprocessing's pickler would share tensors through a resource sharer
        # that only its own children can reach
        self._conn.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))

    def ready(self, timeout: float) -> bool:
        return self._conn.poll(timeout)

    def receive(self):
        try:
            return pickle.loads(self._conn.recv_bytes())
        except EOFError:
            return None

    def alive(self) -> bool:
        if self._killed:
            return False
        try:
            os.kill(self._pid, 0)  # the fork server reaps its children: a dead one is gone
        except ProcessLookupError:
            return False
        return True

    def exitcode(self) -> int | None:
        return _SERVER.exitcode(self._pid)  # the fork server's child: it keeps the status

    def kill(self) -> None:
        if not self._killed:
            try:
                os.kill(self._pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self._conn.close()
        self._killed = True


class Worker:
    """One isolated process per (target, pin)."""

    def __init__(self, spec: LoadSpec, timeout: float = 60.0, load_timeout: float = 300.0):
        self.spec = spec
        self.timeout = timeout
        self.load_timeout = load_timeout
        self.info: dict | None = None
        self.restarts = 0
        self.calls = 0
        self._proc: _Spawned | _Forked | None = None
        self._stderr = None

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> dict:
        """Start the process and load the target; returns the load info.

        Raises WorkerSkip (function absent at this pin) or WorkerLoadError."""
        self.close()
        env = _worker_env(self.spec.env)
        self._stderr = tempfile.NamedTemporaryFile(prefix="maskfuzz-worker-", suffix=".log")
        if os.environ.get(START_ENV, "forkserver") == "spawn":
            self._proc = _Spawned(env, self._stderr)
        else:
            self._proc = _Forked(env, self._stderr.name)
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
                if self._proc.alive():
                    self._proc.send(("exit",))  # the worker leaves with os._exit at once
            except (OSError, ValueError):
                pass
            finally:
                self._proc.kill()
            self._proc = None
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    @property
    def pid(self) -> int | None:
        """The worker process's id while one runs (None before `start` and after `close`), e.g. to read its
        memory in /proc."""
        return self._proc.pid if self._proc is not None else None

    def __enter__(self) -> Worker:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- running ----------------------------------------------------------------------------
    def __call__(self, case: Case):
        if self._proc is None or not self._proc.alive():
            self.restarts += self._proc is not None
            try:
                self.start()
            except (WorkerSkip, WorkerLoadError) as exc:  # one failure type for the engine
                raise TargetFailure("crash", f"the worker could not be restarted: {exc}") from None
        self.calls += 1
        reply = self._exchange(("run", case), self.timeout, during="run")
        if reply[0] == "ok":
            return tuple(reply[1:])
        raise TargetFailure("exception", f"{reply[1]}: {reply[2]}")

    def _exchange(self, message, timeout: float, during: str):
        assert self._proc is not None
        try:
            self._proc.send(message)
        except (BrokenPipeError, OSError):
            return self._died(during)
        if not self._proc.ready(timeout):
            self._kill()
            if during == "load":
                raise WorkerLoadError(f"loading took longer than {timeout:.0f} s")
            raise TargetFailure("hang", f"no answer within {timeout:g} s; the worker was restarted")
        try:
            reply = self._proc.receive()
        except (EOFError, OSError):
            reply = None
        if reply is None:
            return self._died(during)
        return reply

    def _died(self, during: str):
        code = self._proc.exitcode() if self._proc is not None else None
        tail = self.stderr_tail()
        self._kill()
        how = f"exit code {code}" if code is not None else "exit status unknown"
        if during == "load":
            raise WorkerLoadError(f"the worker died while loading ({how}): {tail}")
        raise TargetFailure("crash", f"the worker process died ({how}); stderr ends: {tail}")

    def _kill(self) -> None:
        if self._proc is not None:
            self._proc.kill()

    def stderr_tail(self, n: int = 1500) -> str:
        if self._stderr is None:
            return ""
        with open(self._stderr.name, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - n))
            return f.read().decode("utf-8", "replace").strip()

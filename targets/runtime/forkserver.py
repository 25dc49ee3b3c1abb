"""A fork server for worker processes: one process imports torch (and its compiler stack, which
some frameworks pull in at import) once, then forks a worker per request.

Unlike multiprocessing's forkserver it never re-imports the caller's `__main__` in a worker, so a
script without a main guard, `python -c` or stdin is fine. The protocol, over a Unix socket pair
given to `python -m maskfuzz.targets.runtime.forkserver FD`:

    -> JSON {"stderr": path, "env": {...}, "cwd": path} with one file descriptor attached (the
       worker's end of its own socket pair, spoken to with multiprocessing.connection)
    <- JSON {"pid": n}
    -> JSON {"op": "status", "pid": n}
    <- JSON {"code": exit code, negative for a signal, or null while it runs}

(a SOCK_SEQPACKET pair: one message per request and per reply). The server reaps its children
and keeps their exit codes until asked; it exits when the control socket closes.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection

from maskfuzz.targets.runtime import worker

# `python -m M` puts the working directory first on sys.path, so a `targets/` folder or an
# `oracles.py` where maskfuzz runs would shadow ours: drop it, then run the module as __main__
SERVER_MODULE = "maskfuzz.targets.runtime.forkserver"  # this module, as the server process runs it
NO_CWD_MAIN = "import runpy, sys; del sys.path[0]; runpy.run_module({module!r}, run_name='__main__', alter_sys=True)"
# imported before the first fork, besides what this module imports (the worker, its adapters.base and torch)
PRELOAD = (
    "torch",
    "torch._dynamo",
    "maskfuzz.oracles.kinds.dispatch",
)


def serve(control: socket.socket) -> None:
    """The server loop (runs in the fork server process)."""
    statuses: dict[int, int] = {}  # pid -> exit code (negative: killed by that signal)

    def reap(signum, frame) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            statuses[pid] = os.waitstatus_to_exitcode(status)
            while len(statuses) > 4096:  # nobody asked: forget the oldest
                statuses.pop(next(iter(statuses)))

    signal.signal(signal.SIGCHLD, reap)
    while True:
        try:
            data, fds, _flags, _addr = socket.recv_fds(control, 1 << 20, 1)
        except OSError:
            return
        if not data:
            return
        request = json.loads(data)
        if request.get("op") == "status":
            control.send(json.dumps({"code": statuses.pop(request["pid"], None)}).encode())
            continue
        pid = os.fork()
        if pid == 0:  # the worker
            try:
                control.close()
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                worker.forked(Connection(fds[0]), request["stderr"], request["env"], request["cwd"])
            finally:
                os._exit(70)
        os.close(fds[0])
        control.send(json.dumps({"pid": pid}).encode())


def main() -> int:
    control = socket.socket(fileno=int(sys.argv[1]))
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:
            pass  # a missing optional module is imported (or not) by the worker itself
    control.send(b"ready")
    serve(control)
    return 0


class ForkServer:
    """The client side: starts the server on first use and asks it for workers."""

    def __init__(self) -> None:
        self._control: socket.socket | None = None
        self._proc: subprocess.Popen | None = None
        self._owner = 0
        self._lock = threading.Lock()

    def _ensure(self) -> socket.socket:
        if self._control is not None and self._owner == os.getpid() and self._proc.poll() is None:
            return self._control
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = dict(os.environ)  # maskfuzz from its installation, as in targets.client
        self._proc = subprocess.Popen(
            [sys.executable, "-c", NO_CWD_MAIN.format(module=SERVER_MODULE), str(theirs.fileno())],
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
            env=env,
        )
        theirs.close()
        if _reply(ours) != b"ready":
            raise RuntimeError("the maskfuzz fork server did not start")
        self._control, self._owner = ours, os.getpid()
        return ours

    def spawn(self, stderr_path: str, env: dict, cwd: str) -> tuple[int, Connection]:
        """A new worker running `targets.worker.forked`; returns its pid and our end of its channel."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        request = json.dumps({"stderr": stderr_path, "env": env, "cwd": cwd}).encode()
        with self._lock:
            control = self._ensure()
            socket.send_fds(control, [request], [theirs.fileno()])
            reply = json.loads(_reply(control))
        theirs.close()
        return int(reply["pid"]), Connection(ours.detach())

    def exitcode(self, pid: int, wait: float = 1.0) -> int | None:
        """The exit code of worker `pid` once the server has reaped it (None if not within `wait`)."""
        deadline = time.monotonic() + wait
        while True:
            with self._lock:
                control = self._ensure()
                control.send(json.dumps({"op": "status", "pid": pid}).encode())
                code = json.loads(_reply(control))["code"]
            if code is not None or time.monotonic() > deadline:
                return code
            time.sleep(0.02)


def _reply(sock: socket.socket) -> bytes:
    data = sock.recv(1 << 16)
    if not data:
        raise RuntimeError("the maskfuzz fork server closed its control socket")
    return data


if __name__ == "__main__":
    sys.exit(main())

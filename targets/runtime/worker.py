"""The worker process: imports one target's real code once and runs the cases sent to it.

Started by `targets.client.Worker`, forked from its fork server (`forked`) or as
`python -m maskfuzz.targets.runtime.worker` (`main`). Messages are pickles between the fuzzer and its own child
(never read from files), over a multiprocessing Connection or length-prefixed on a private
duplicate of stdout; the target's own output goes to a log file or stderr, so whatever the target
prints cannot corrupt the protocol.

    -> ("load", {"adapter", "root", "entry", "stand_ins", "deny", "own", "device"})
    <- ("loaded", {"where", "notes", "stand_ins_used"}) | ("skip", reason) | ("error", text)
    -> ("run", case)
    <- ("ok", *outputs) | ("raised", type_name, message, traceback)
       outputs: (advantages, returns) for GAE and returns, the kind's outputs otherwise
"""

from __future__ import annotations

import importlib
import os
import pickle
import struct
import sys
import traceback
from pathlib import Path
from typing import BinaryIO

from maskfuzz.targets.adapters.base import NotPresent
from maskfuzz.targets.runtime import standins


def send(stream: BinaryIO, message) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(struct.pack("<Q", len(data)))
    stream.write(data)
    stream.flush()


def receive(stream: BinaryIO):
    head = _read_exact(stream, 8)
    if head is None:
        return None
    (size,) = struct.unpack("<Q", head)
    body = _read_exact(stream, size)
    if body is None:
        raise EOFError("truncated message")
    return pickle.loads(body)


def _read_exact(stream: BinaryIO, n: int) -> bytes | None:
    buf = b""
    while len(buf) < n:
        chunk = stream.read(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def _load(args: dict):
    root = args.get("root")
    if root:
        sys.path.insert(0, str(root))
    finder = standins.install(args.get("stand_ins", ()), args.get("deny", ()), args.get("own", ()))
    adapter = importlib.import_module(args["adapter"])
    try:
        loaded = adapter.load(Path(root) if root else None, args.get("entry"))
    except NotPresent as exc:
        return ("skip", str(exc)), None
    info = {"where": loaded.where, "notes": list(loaded.notes), "stand_ins_used": sorted(finder.used)}
    if loaded.absent_options:
        info["absent_options"] = {k: [list(v), why] for k, (v, why) in loaded.absent_options.items()}
    return ("loaded", info), loaded


def serve(receive, reply) -> None:
    """The request loop: `receive()` gives the next message (None at the end of input), `reply`
    sends an answer. Leaves with os._exit: no interpreter teardown, whose atexit hooks and thread
    joins in some frameworks take seconds."""
    loaded = None
    device = "cpu"
    while True:
        msg = receive()
        if msg is None or msg[0] == "exit":
            os._exit(0)
        op = msg[0]
        if op == "load":
            device = msg[1].get("device", "cpu")
            try:
                answer, loaded = _load(msg[1])
            except BaseException as exc:  # noqa: BLE001 - reported to the fuzzer as a load error
                answer = ("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
            reply(answer)
        elif op == "run":
            if loaded is None:
                reply(("raised", "RuntimeError", "run before a successful load", ""))
                continue
            try:
                outputs = loaded.run(msg[1], device)
                reply(("ok", *[_cpu(x) for x in outputs]))
            except Exception as exc:  # noqa: BLE001 - the target's exception is a verdict
                reply(("raised", type(exc).__name__, str(exc), traceback.format_exc()))


def main() -> int:
    """`python -m maskfuzz.targets.runtime.worker`: requests on stdin, replies on a private duplicate of stdout."""
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    requests = sys.stdin.buffer
    serve(lambda: receive(requests), lambda message: send(replies, message))
    return 0


def forked(conn, stderr_path: str, env: dict, cwd: str) -> None:
    """Entry of a worker forked from the fork server (targets.forkserver): the same loop over a
    multiprocessing Connection (plain pickles in its frames), with the caller's environment,
    working directory and PYTHONPATH (the fork server was started earlier, possibly elsewhere)
    and output to `stderr_path`."""
    fd = os.open(stderr_path, os.O_WRONLY | os.O_APPEND)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    for path in reversed([p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]):
        if path not in sys.path:
            sys.path.insert(0, path)
    import torch

    torch.set_num_threads(max(1, int(env.get("OMP_NUM_THREADS") or 1)))

    def receive():
        try:
            return pickle.loads(conn.recv_bytes())
        except EOFError:
            return None

    serve(receive, lambda message: conn.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)))


def _cpu(x):
    import torch

    return x.detach().to("cpu") if isinstance(x, torch.Tensor) else x


if __name__ == "__main__":
    sys.exit(main())

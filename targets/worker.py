"""The worker process: imports one target's real code once and runs the cases sent to it.

Started by `targets.client.Worker` as `python -m targets.worker`. The protocol is length-prefixed
pickles between the fuzzer and its own child (never read from files): the worker keeps a private
duplicate of its stdout for replies and points fd 1 at stderr, so whatever the target prints
cannot corrupt the protocol.

    -> ("load", {"adapter", "root", "entry", "stand_ins", "deny", "own", "device"})
    <- ("loaded", {"where", "notes", "stand_ins_used"}) | ("skip", reason) | ("error", text)
    -> ("run", case)
    <- ("ok", advantages, returns) | ("raised", type_name, message, traceback)
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
    from targets import standins
    from targets.adapters.base import NotPresent

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
    return ("loaded", info), loaded


def main() -> int:
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    requests = sys.stdin.buffer
    loaded = None
    device = "cpu"
    while True:
        msg = receive(requests)
        if msg is None or msg[0] == "exit":
            os._exit(0)  # no interpreter teardown: frameworks' atexit hooks and thread joins take seconds
        op = msg[0]
        if op == "load":
            device = msg[1].get("device", "cpu")
            try:
                reply, loaded = _load(msg[1])
            except BaseException as exc:  # noqa: BLE001 - reported to the fuzzer as a load error
                reply = ("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
            send(replies, reply)
        elif op == "run":
            if loaded is None:
                send(replies, ("raised", "RuntimeError", "run before a successful load", ""))
                continue
            try:
                adv, ret = loaded.run(msg[1], device)
                send(replies, ("ok", _cpu(adv), _cpu(ret)))
            except Exception as exc:  # noqa: BLE001 - the target's exception is a verdict
                send(replies, ("raised", type(exc).__name__, str(exc), traceback.format_exc()))


def _cpu(x):
    import torch

    return x.detach().to("cpu") if isinstance(x, torch.Tensor) else x


if __name__ == "__main__":
    sys.exit(main())

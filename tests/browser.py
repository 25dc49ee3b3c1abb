"""A headless Chromium driven over the DevTools protocol on a pipe (`--remote-debugging-pipe`):
open a local page, evaluate JavaScript in it, take a screenshot. Standard library only, so the
screenshot test needs nothing but Debian's `chromium` (`apt-get install chromium`).

    with Browser.start(width=1024, height=768) as b:
        b.open(path)
        b.eval("document.title")
        png = b.screenshot(full_page=True)
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

# The flags a closed network needs: no background connections, no first-run or sync traffic.
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--hide-scrollbars", "--remote-debugging-pipe")  # fmt: skip


def find_chromium() -> str | None:
    """The Chromium binary (MASKFUZZ_CHROMIUM, else chromium / chromium-browser / google-chrome on PATH)."""
    named = os.environ.get("MASKFUZZ_CHROMIUM")
    if named:
        return named if Path(named).is_file() else None
    return next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)


class BrowserError(RuntimeError):
    pass


class Browser:
    def __init__(self, proc: subprocess.Popen, to_browser, from_browser, profile: str, timeout: float):
        self.proc, self._w, self._r, self._profile, self.timeout = proc, to_browser, from_browser, profile, timeout
        self._id, self._buf, self.session = 0, b"", None

    @classmethod
    def start(cls, binary: str | None = None, width: int = 1024, height: int = 768, timeout: float = 30.0) -> Browser:
        binary = binary or find_chromium()
        if binary is None:
            raise BrowserError("no Chromium found (apt-get install chromium, or set MASKFUZZ_CHROMIUM)")
        profile = tempfile.mkdtemp(prefix="maskfuzz-chromium-")
        r_in, w_in = os.pipe()  # we write, the browser reads on fd 3
        r_out, w_out = os.pipe()  # the browser writes on fd 4, we read
        cmd = [binary, *FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}", "about:blank"]

        def fds():  # in the child, before the fds not kept are closed: its fd 3 and 4 are the pipes' ends
            a, b = fcntl.fcntl(r_in, fcntl.F_DUPFD, 10), fcntl.fcntl(w_out, fcntl.F_DUPFD, 10)
            os.dup2(a, 3)
            os.dup2(b, 4)

        proc = subprocess.Popen(cmd, preexec_fn=fds, pass_fds=(3, 4), stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)  # fmt: skip
        os.close(r_in)
        os.close(w_out)
        b = cls(proc, os.fdopen(w_in, "wb", buffering=0), os.fdopen(r_out, "rb", buffering=0), profile, timeout)
        target = b.call("Target.createTarget", url="about:blank")["targetId"]
        b.session = b.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        b.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)
        return b

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        try:
            self.proc.kill()
            self.proc.wait(10)
        finally:
            shutil.rmtree(self._profile, ignore_errors=True)

    def call(self, method: str, **params):
        """Send one command (to the page's session once attached) and return its result."""
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params}
        if self.session and not method.startswith("Target."):
            msg["sessionId"] = self.session
        self._w.write(json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        while True:
            reply = self._read(deadline)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def _read(self, deadline: float) -> dict:
        while b"\0" not in self._buf:
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise BrowserError("Chromium did not answer (exited or timed out)")
            chunk = self._r.read(65536)
            if not chunk:
                raise BrowserError("Chromium closed its pipe")
            self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        return json.loads(raw)

    def open(self, path: Path) -> None:
        """Navigate to a local file and wait until it has loaded."""
        self.call("Page.navigate", url=Path(path).resolve().as_uri())
        deadline = time.monotonic() + self.timeout
        while self.eval("document.readyState") != "complete":
            if time.monotonic() > deadline:
                raise BrowserError(f"{path} did not finish loading")
            time.sleep(0.05)

    def eval(self, expression: str):
        """The JSON value of a JavaScript expression in the page."""
        res = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in res:
            raise BrowserError(f"{expression!r}: {res['exceptionDetails'].get('text')}")
        return res["result"].get("value")

    def screenshot(self, full_page: bool = False) -> bytes:
        """A PNG of the viewport, or of the whole page."""
        shot = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=full_page)
        return base64.b64decode(shot["data"])


def png_colours(data: bytes) -> tuple[int, int, set[tuple[int, int, int]]]:
    """(width, height, the set of RGB colours) of an 8-bit, non-interlaced RGB or RGBA PNG."""
    import struct
    import zlib

    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    pos, idat, head = 8, b"", None
    while pos < len(data):
        (n,), kind = struct.unpack(">I", data[pos : pos + 4]), data[pos + 4 : pos + 8]
        body = data[pos + 8 : pos + 8 + n]
        if kind == b"IHDR":
            head = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    width, height, depth, colour_type, _, _, interlace = head
    if depth != 8 or colour_type not in (2, 6) or interlace:
        raise ValueError(f"unsupported PNG: depth {depth}, colour type {colour_type}, interlace {interlace}")
    bpp = 3 if colour_type == 2 else 4
    raw, stride, prev, colours = zlib.decompress(idat), width * bpp, bytearray(width * bpp), set()
    for y in range(height):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        colours.update(zip(line[0::bpp], line[1::bpp], line[2::bpp]))
        prev = line
    return width, height, colours

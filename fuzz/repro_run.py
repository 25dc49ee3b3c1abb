"""Running a written reproducer: `run_script` runs DIR/repro.py on a checkout in an isolated interpreter and
reads back its exit code and JSON (`ScriptRun`: 1 reproduced, 0 fixed, 2 error).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

EXIT_CODES = {0: "fixed", 1: "reproduced", 2: "error"}


@dataclass
class ScriptRun:
    """One run of a written script: exit code, its JSON (None if it printed none), stderr."""

    returncode: int
    data: dict | None
    stderr: str

    @property
    def status(self) -> str:
        if self.data and self.data.get("status") in EXIT_CODES.values():
            return self.data["status"]
        if self.returncode < 0 or self.returncode >= 128:
            return "crashed"
        return "error"


def run_script(
    script: Path, root: Path, device: str = "cpu", timeout: float = 600.0, python: str | None = None
) -> ScriptRun:
    """Run `script` on the checkout `root` in an isolated interpreter (`-I`: no PYTHONPATH, no user
    site, not the working directory), from the script's folder."""
    cmd = [python or sys.executable, "-I", str(script), str(root), "--device", device]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MASKFUZZ_TARGET_ROOT")}
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, cwd=script.parent, env=env, stdin=subprocess.DEVNULL
        )
    except subprocess.TimeoutExpired as exc:
        err = exc.stderr.decode() if isinstance(exc.stderr, bytes) else exc.stderr or ""
        return ScriptRun(-9, None, f"{err}\n(no answer within {timeout:.0f} s)")
    try:
        data = json.loads(proc.stdout)
    except json.JSONDecodeError:
        data = None
    return ScriptRun(proc.returncode, data if isinstance(data, dict) else None, proc.stderr)

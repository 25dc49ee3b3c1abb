"""`--repo NAME=PATH` options and the MASKFUZZ_REPOS environment variable (comma-separated
NAME=PATH pairs): local clones or bare mirrors that stand in for a target's upstream URL."""

from __future__ import annotations

import os
from pathlib import Path

ENV = "MASKFUZZ_REPOS"


def parse_repos(items: list[str] | None, env: dict | None = None) -> dict[str, Path]:
    """Merge MASKFUZZ_REPOS with `--repo` items (the options win). Raises ValueError on a bad item."""
    env = os.environ if env is None else env
    out: dict[str, Path] = {}
    pairs = [p for p in env.get(ENV, "").split(",") if p.strip()] + list(items or [])
    for item in pairs:
        name, sep, path = item.partition("=")
        if not sep or not name.strip() or not path.strip():
            raise ValueError(f"--repo expects NAME=PATH (e.g. miles=/src/miles), got {item!r}")
        out[name.strip()] = Path(path.strip()).expanduser()
    return out

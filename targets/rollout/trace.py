"""Which functions of a checkout ran during a batch-code step, for the validation record (`Batch.called`)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path


class CallTrace:
    """A `sys.setprofile` hook: every function under `root` that was called, as (file relative to root, name)."""

    def __init__(self, root: Path):
        self.root = str(Path(root).resolve())
        self.seen: set[tuple[str, str]] = set()

    def __call__(self, frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(self.root):
            self.seen.add((str(Path(frame.f_code.co_filename).relative_to(self.root)), frame.f_code.co_name))

    def called(self, preserved: Iterable[str | tuple[str, str]]) -> list[str]:
        """`preserved` in order, those that ran, as `path::name`: each a (path, name) pair or a `path::name`
        string, a method written `path::Class.method` and matched by the method's name."""
        out = []
        for item in preserved:
            path, name = item if isinstance(item, tuple) else item.split("::", 1)
            if (path, name.rsplit(".", 1)[-1]) in self.seen:
                out.append(item if isinstance(item, str) else f"{path}::{name}")
        return out

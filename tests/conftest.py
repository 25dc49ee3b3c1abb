"""Shared test set-up: the mutant zoo is importable as `mutant_zoo`; oracle math runs single-threaded."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
torch.set_num_threads(1)  # small tensors: threads only add contention on 2 cores


@pytest.fixture
def fake_package(tmp_path, monkeypatch):
    """`make("verl/trainer/ppo", "core_algos.py", source)` writes a package tree under tmp_path
    (`source` None: the module is absent), puts tmp_path on sys.path and returns it; the fake
    top-level package is dropped from sys.modules afterwards, so adapters' `load` can run in-process."""
    monkeypatch.syspath_prepend(str(tmp_path))
    before = set(sys.modules)
    tops = set()

    def make(package: str, module: str, source: str | None) -> Path:
        parts = package.split("/")
        tops.add(parts[0])
        for i in range(1, len(parts) + 1):
            d = tmp_path.joinpath(*parts[:i])
            d.mkdir(exist_ok=True)
            (d / "__init__.py").touch()
        if source is not None:
            tmp_path.joinpath(*parts, module).write_text(textwrap.dedent(source))
        return tmp_path

    yield make
    for name in set(sys.modules) - before:
        if name.split(".")[0] in tops:
            del sys.modules[name]

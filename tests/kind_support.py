"""Helpers the target tests share for entries of every kind: a module-scoped cache of open
handles, and a handle's verdicts on one case (`oracles.kinds.dispatch.judge` dispatches on the
declared kind, GAE and returns included)."""

from __future__ import annotations

import contextlib
from typing import Callable, ContextManager, Iterator

from maskfuzz.oracles.case import Case
from maskfuzz.oracles.kinds.dispatch import judge


@contextlib.contextmanager
def handle_cache(open_one: Callable[..., ContextManager]) -> Iterator[Callable]:
    """`get(*key)` opens `open_one(*key)` once per key and keeps it open until the block ends."""
    handles: dict = {}
    with contextlib.ExitStack() as stack:

        def get(*key):
            if key not in handles:
                handles[key] = stack.enter_context(open_one(*key))
            return handles[key]

        yield get


def verdicts_by_property(handle, case: Case) -> dict:
    return {v.property: v for v in judge(handle.run, case, handle.declared)}


def failed_properties(handle, case: Case) -> set[str]:
    return {v.property for v in judge(handle.run, case, handle.declared) if v.failed}

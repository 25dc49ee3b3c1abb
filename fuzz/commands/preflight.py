"""Refuse a pin that names nothing before any work starts: `maskfuzz fuzz verl@0.9.9` or
`maskfuzz replay --target verl@0.9.9` is bad input, said once, with exit 2, instead of one failed
entry per registered entry after minutes of work. Bringing a pin's code into the cache here costs
nothing extra: the workers find it there. A pin that cannot be fetched for another reason (no
network) is left to the run, which skips it with that reason."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Mapping

from maskfuzz.targets.registry import get
from maskfuzz.targets.runtime import acquire as acquire_mod


def missing_pins(pairs: Iterable[tuple[str, str]], repos: Mapping[str, Path]) -> list[str]:
    """The messages of the (target, pin) pairs whose pin names no release or revision; moving pins
    (main, latest) always name one."""
    problems = []
    for target, pin in dict.fromkeys(pairs):
        if pin in (acquire_mod.MAIN, acquire_mod.LATEST):
            continue
        try:
            acquire_mod.acquire(get(target), pin, repos)
        except acquire_mod.PinMissing as exc:
            problems.append(str(exc))
        except acquire_mod.AcquireError:
            pass  # not a bad pin: the run says why it cannot fetch it
    return problems

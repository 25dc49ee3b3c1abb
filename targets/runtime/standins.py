"""Inert stand-ins for heavy top-level packages that the masked math never touches.

Installed at the *front* of `sys.meta_path` inside a worker process (after the deny-list), the
finder answers for the top-level names a target lists whether or not they are installed, so a
target loads the same way on every machine (an installed transformers that does not match verl
0.9.1 no longer breaks it), and never for a name on the target's deny-list or its own package.
A stand-in module hands out inert objects: callable (a decorator given a function returns it),
usable as a base class, iterable (empty), falsy, subscriptable. Any *use* of one in the math would
give garbage that the judge sees, which is why the list is per target and kept short.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Iterable


class Inert:
    """An object that absorbs attribute access, calls, subscripts and subclassing."""

    def __init__(self, name: str):
        object.__setattr__(self, "_inert_name", name)

    def __getattr__(self, attr: str):
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        return Inert(f"{self._inert_name}.{attr}")

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and not kwargs and callable(args[0]) and not isinstance(args[0], Inert):
            return args[0]  # used as a decorator
        return Inert(f"{self._inert_name}()")

    def __mro_entries__(self, bases):
        return (object,)

    def __getitem__(self, key):
        return Inert(f"{self._inert_name}[]")

    def __iter__(self):
        return iter(())

    def __bool__(self) -> bool:
        return False

    def _compared(self, other):
        # comparing with a value means the code under test reads a stand-in as state (e.g.
        # `mpu.get_context_parallel_rank() == 0`): answering would silently change the math
        raise TypeError(
            f"{self!r} was compared with {other!r}: the target reads a stand-in as state; "
            "give the adapter real state for it instead"
        )

    def __eq__(self, other):
        if isinstance(other, (bool, int, float, complex, str, bytes)):
            self._compared(other)
        return self is other  # typing's Union / Optional dedup compares annotations

    def __ne__(self, other):
        return not self.__eq__(other)

    __lt__ = __le__ = __gt__ = __ge__ = _compared
    __hash__ = object.__hash__

    def __or__(self, other):
        return self

    __ror__ = __or__

    def __repr__(self) -> str:
        return f"<inert stand-in {self._inert_name}>"


class _InertModule(types.ModuleType):
    def __getattr__(self, attr: str):
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        return Inert(f"{self.__name__}.{attr}")


class _Loader(importlib.abc.Loader):
    def create_module(self, spec):
        mod = _InertModule(spec.name)
        mod.__path__ = []  # a package, so submodules import too
        mod.__maskfuzz_standin__ = True
        return mod

    def exec_module(self, module) -> None:
        return None


class StandInFinder(importlib.abc.MetaPathFinder):
    """Supplies inert modules for missing packages whose top-level name is in `allowed`."""

    def __init__(self, allowed: Iterable[str], deny: Iterable[str] = (), own: Iterable[str] = ()):
        self.allowed = set(allowed)
        self.deny = set(deny) | set(own)
        self.used: set[str] = set()

    def find_spec(self, fullname, path=None, target=None):
        top = fullname.split(".")[0]
        if top in self.deny or fullname in self.deny or top not in self.allowed:
            return None
        self.used.add(top)
        return importlib.machinery.ModuleSpec(fullname, _Loader(), is_package=True)


class Blocker(importlib.abc.MetaPathFinder):
    """Makes the deny-listed packages missing even where they are installed: their presence
    changes what a target does (a stubbed `torch_npu` makes verl call `torch.npu`)."""

    def __init__(self, deny: Iterable[str]):
        self.deny = set(deny)

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in self.deny:
            raise ModuleNotFoundError(f"No module named {fullname!r} (kept missing by maskfuzz)", name=fullname)
        return None


def install(allowed: Iterable[str], deny: Iterable[str] = (), own: Iterable[str] = ()) -> StandInFinder:
    """Block `deny` at the front of sys.meta_path and stand in for the `allowed` packages right
    after it, installed or not (hermetic: the machine's packages do not change what loads).
    Returns the stand-in finder, whose `used` says what it supplied."""
    deny = tuple(deny)
    finder = StandInFinder(allowed, deny, own)
    for name in list(sys.modules):
        top = name.split(".")[0]
        if top in deny or (top in finder.allowed and top not in finder.deny):
            del sys.modules[name]
    sys.meta_path.insert(0, finder)
    if deny:
        sys.meta_path.insert(0, Blocker(deny))
    return finder


def is_standin(module: types.ModuleType) -> bool:
    return bool(getattr(module, "__maskfuzz_standin__", False))

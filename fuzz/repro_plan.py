"""What a reproducer is written for: the target as the script needs it (`TargetInfo`: a registered target at a
pin, or a user's --callable) and the `Plan` (the corpus entry, the target, the check, the target's call) that
`make_plan` in `fuzz/repro.py` builds.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from maskfuzz.fuzz.corpus_codec import Entry
from maskfuzz.fuzz.repro_assembly import CallSource
from maskfuzz.fuzz.repro_check import Check
from maskfuzz.oracles.declared import Declared


@dataclass(frozen=True)
class TargetInfo:
    """A registered target at a pin (or a user's --callable) as the script needs it."""

    target: str  # registry id, or "callable"
    entry: str | None  # entry point, None for the default; MODULE:FUNC for a callable
    pin: str
    adapter: str
    declared: Declared
    stand_ins: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()
    own: tuple[str, ...] = ()
    git_url: str | None = None
    package: str | None = None
    pip_args: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        if self.target == "callable":
            return f"{self.entry}"
        return f"{self.target}{':' + self.entry if self.entry else ''}@{self.pin}"

    @classmethod
    def from_spec(cls, spec, entry: str | None, pin: str) -> TargetInfo:
        adapter = spec.adapter_for(entry)
        module = importlib.import_module(adapter)
        declared_for = getattr(module, "declared_for", None)
        declared = declared_for(entry) if callable(declared_for) else spec.declared(entry, pin)
        return cls(
            spec.id,
            entry,
            pin,
            adapter,
            declared,
            tuple(spec.stand_ins),
            tuple(spec.deny),
            tuple(spec.own),
            spec.git_url,
            spec.package,
            tuple(spec.pip_args),
        )

    @classmethod
    def of_callable(cls, function: str, declared: Declared) -> TargetInfo:
        module = function.partition(":")[0]
        adapter = "maskfuzz.targets.adapters.callable"
        return cls("callable", function, "local", adapter, declared, own=(module.split(".")[0],))


@dataclass(frozen=True)
class Plan:
    """Everything the script needs except where the code is."""

    entry: Entry
    target: TargetInfo
    check: Check
    call: CallSource

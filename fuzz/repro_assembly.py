"""Which code a reproducer script is made of: the template `fuzz/templates/repro_script.py`, the target's call
taken from its adapter (`call_source`: `repro_source()`, `REPRO_FUNCTIONS` or `REPRO_UNSUPPORTED`, see
`fuzz/repro.py`), the finding's `judge` (the one check function it calls) and its data, collected by the copier
into one `Closure` (`assemble`).
"""

from __future__ import annotations

import importlib
import textwrap
from dataclasses import dataclass
from pathlib import Path

from maskfuzz.fuzz.repro_check import Unsupported
from maskfuzz.fuzz.repro_copier import Closure, Source

TEMPLATE = Path(__file__).resolve().parent / "templates" / "repro_script.py"


@dataclass(frozen=True)
class CallSource:
    """The target's call for the script: `glue` defines `prepare`; `adapters` are the adapter
    modules whose definitions it copies (the last one is the target's own)."""

    glue: Source
    adapters: tuple[str, ...]
    how: str  # in words, for the script's docstring


def call_source(adapter: str) -> CallSource:
    """How the script calls the target whose adapter module is `adapter` (see the module docstring).
    Raises Unsupported naming what is missing."""
    module = importlib.import_module(adapter)
    reason = getattr(module, "REPRO_UNSUPPORTED", None)
    if reason:
        raise Unsupported(f"{adapter}: {reason}")
    provider = getattr(module, "repro_source", None)
    if callable(provider):
        glue = Source(f"{adapter}.repro_source", textwrap.dedent(provider()).strip() + "\n")
        if "prepare" not in glue.defs:
            raise Unsupported(f"{adapter}.repro_source() does not define prepare(root)")
        return CallSource(glue, (adapter,), f"the reproducer source of {adapter_file(adapter)}")
    names = tuple(getattr(module, "REPRO_FUNCTIONS", ("load",)))
    first = names[0]
    text = f'''
def prepare(root: Path) -> tuple[Callable, str]:
    """The function under test in the checkout, ready to run, and where it is."""
    loaded = {first}(root, ENTRY)
    return loaded.run, loaded.where
'''
    glue = Source(f"{adapter}.prepare", text.strip() + "\n")
    return CallSource(glue, (adapter,), f"{adapter_file(adapter)} ({', '.join(names)}), copied")


CHECK_WORDS = {  # the check kinds `build_check` / `build_kind_check` make, each a `check_<kind>` of the template
    "finite": "finite outputs at trainable positions, or a documented error",
    "expected": "the numbers maskfuzz computed, within tolerance",
    "twin": "the outputs on the case and on its twin agree",
    "at-least": "the outputs on the case do not lie below those on its twin",
    "moved": "each row's output sum follows its moved score",
    "zero": "a finite 0 everywhere, or a documented error",
    "same": "a second run gives the same bits",
}
CHECK_FUNCTIONS = {kind: f"check_{kind.replace('-', '_')}" for kind in CHECK_WORDS}


def judge_source(kind: str) -> str:
    """`judge` for the script: the one check this finding needs."""
    name, words = CHECK_FUNCTIONS[kind], CHECK_WORDS[kind]
    return (
        "def judge(run: Callable, device: str) -> dict:\n"
        f'    """This finding\'s check: {words}."""\n'
        f"    return {name}(run, Case.from_dict(CASE), device)\n"
    )


def adapter_file(adapter: str) -> str:
    """'maskfuzz.targets.verl.calls' -> 'targets/verl/calls.py', the file in this repository."""
    return adapter.removeprefix("maskfuzz.").replace(".", "/") + ".py"


def assemble(call: CallSource, data: dict[str, str], kind: str = "expected") -> tuple[Closure, list[str]]:
    """Collect everything `main` reaches. `data` maps finding names to their generated source;
    `kind` is the check's kind (which check function the script's `judge` calls).
    Returns the closure and the extra names of the adapter's REPRO_FUNCTIONS that were copied."""
    template = Source("maskfuzz.fuzz.templates.repro_script", TEMPLATE.read_text(encoding="utf-8"), str(TEMPLATE))
    overrides = {name: Source(f"finding.{name}", text) for name, text in data.items()}
    overrides["prepare"] = call.glue
    overrides["judge"] = Source("finding.judge", judge_source(kind))
    closure = Closure(template, overrides)
    closure.add_source(template)
    adapter = Source.of_module(call.adapters[-1])
    closure.add_source(adapter)
    closure.add_source(call.glue, [adapter.name, template.name])
    for name, src in overrides.items():
        if src is not call.glue:
            closure.add_source(src, [template.name])
    closure.need(template, "main", "the script's entry point")
    module = importlib.import_module(call.adapters[-1])
    extra = [n for n in getattr(module, "REPRO_FUNCTIONS", ())[1:]]
    for name in extra:
        closure.need(adapter, name, "listed in REPRO_FUNCTIONS")
    closure.check_complete()
    return closure, extra

"""The layout's rules as a test (issue 25): parse every module of oracles/, targets/ and fuzz/
(`scripts/layout_figures.py`, no import of maskfuzz) and fail on

- an import cycle;
- an import against the direction fuzz -> targets -> oracles, or from the oracles vocabulary up
  into a kind (kinds -> vocabulary);
- a maskfuzz import inside a function outside the entry points (fuzz/cli.py, fuzz/commands/, the pytest
  plugin);
- a private name imported from another module;
- a comparison of a kind with a kind's name outside that kind's own package, `oracles/kinds/<kind>/` (the kind
  registry, `KindSpec`, is the dispatch);
- a file over 800 lines;
- a framework's name outside its folder `targets/<fw>/` (an import of `maskfuzz.targets.<fw>` or a string
  constant naming the framework: its id, `<fw>:...`, `<fw>@...`, its module path): the registry, the rollout
  session and the upstream-test writer find a framework's parts from its folder.

The tree meets every rule: the allowances below are empty. They stay as the one place an exception
would be written, per file, and they may only shrink: a new violation fails, and so does a listed one
that is gone. `python scripts/layout_figures.py` prints the figures.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _figures_module():
    spec = importlib.util.spec_from_file_location("layout_figures", ROOT / "scripts" / "layout_figures.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


LAYOUT = _figures_module()
FIGURES = LAYOUT.figures()

# Exceptions to the rules, per file (see the module docstring): none. Each number may only go down.
ALLOWED: dict[str, dict[str, int]] = {
    "function_local_imports": {},
    "kind_string_dispatch": {},
    "private_imports": {},
    "against_direction": {},
    "framework_names": {},
}
LONG_FILES: set[str] = set()  # none left: every file is at most 800 lines
CYCLES: list[set[str]] = []  # none left


def test_the_kind_names_the_figures_look_for_are_the_registered_kinds():
    from maskfuzz.oracles.kinds import ALL_KINDS

    assert set(LAYOUT.KIND_NAMES) == set(ALL_KINDS)


def test_the_frameworks_the_figures_look_for_are_the_registered_targets():
    from maskfuzz.targets.registry import ADAPTER_MODULES

    assert set(LAYOUT.framework_folders().values()) == set(ADAPTER_MODULES)


@pytest.mark.parametrize("rule", ["function_local_imports", "private_imports", "against_direction",
                                  "kind_string_dispatch", "framework_names"])  # fmt: skip
def test_no_new_violation_and_the_allowances_are_current(rule):
    found, allowed = FIGURES["by_file"][rule], ALLOWED.get(rule, {})
    new = {f: n for f, n in found.items() if n > allowed.get(f, 0)}
    assert not new, f"{rule}: new violations (file: count now, allowed {allowed and 'per file'}): {new}"
    stale = {f: (n, found.get(f, 0)) for f, n in allowed.items() if found.get(f, 0) < n}
    assert not stale, f"{rule}: fewer violations than allowed, lower ALLOWED in tests/test_layout.py: {stale}"


def test_no_file_over_800_lines_beyond_the_listed_ones():
    long = set(FIGURES["long_file_lines"])
    assert not long - LONG_FILES, f"over 800 lines: {sorted(long - LONG_FILES)} (split it by idea)"
    assert not LONG_FILES - long, f"no longer over 800 lines, drop from LONG_FILES: {sorted(LONG_FILES - long)}"


def test_no_new_import_cycle():
    cycles = [set(c) for c in FIGURES["cycles"]]
    new = [c for c in cycles if c not in CYCLES]
    assert not new, f"new import cycle(s): {[sorted(c) for c in new]}"
    gone = [c for c in CYCLES if c not in cycles]
    assert not gone, f"cycle(s) broken, drop from CYCLES: {[sorted(c) for c in gone]}"


def test_the_rules_catch_what_they_name(tmp_path):
    """The detector itself: a cycle, an upward import, a private import, a local import, a kind
    dispatch and a framework named outside its folder planted in a throwaway tree are each found."""
    for pkg in ("oracles", "targets", "fuzz"):
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text("")
    (tmp_path / "oracles" / "a.py").write_text("from maskfuzz.oracles.b import _x\n")
    (tmp_path / "oracles" / "b.py").write_text("from maskfuzz.oracles import a\nfrom maskfuzz.fuzz import c\n")
    (tmp_path / "targets" / "t.py").write_text("")
    (tmp_path / "fuzz" / "c.py").write_text("def f(kind):\n    from maskfuzz.targets import t\n"
                                            "    return kind == 'gae'\n" + "\n" * 801)  # fmt: skip
    # a literal name given to importlib is a static import: counted (a name from a table is not)
    (tmp_path / "fuzz" / "d.py").write_text("import importlib\ndef g(m):\n    importlib.import_module(m)\n"
                                            "    return importlib.import_module('maskfuzz.oracles.a')\n")  # fmt: skip
    # a membership test against a module-level tuple of kind names is a comparison with those names
    (tmp_path / "fuzz" / "e.py").write_text("PAIR = ('gae', 'returns')\ndef f(d):\n    return d.kind not in PAIR\n")
    (tmp_path / "oracles" / "kinds" / "gae").mkdir(parents=True)
    (tmp_path / "oracles" / "kinds" / "kl").mkdir()
    (tmp_path / "oracles" / "kinds" / "gae" / "p.py").write_text("def f(kind):\n    return kind == 'returns'\n")
    (tmp_path / "oracles" / "kinds" / "kl" / "q.py").write_text("def f(kind):\n    return kind in ('kl', 'gae')\n")
    # a framework (a folder with a declare.py) named outside its folder: an import, a literal importlib name and
    # a pin string count; docstrings and bare strings do not, nor does the framework's own folder
    (tmp_path / "targets" / "fake_fw").mkdir()
    for name in ("__init__", "declare", "calls"):
        (tmp_path / "targets" / "fake_fw" / f"{name}.py").write_text("ID = 'fake-fw'\n")
    (tmp_path / "fuzz" / "g.py").write_text('"""fake-fw"""\nimport importlib\n'
                                            "from maskfuzz.targets.fake_fw import calls\n"
                                            "M = importlib.import_module('maskfuzz.targets.fake_fw.calls')\n"
                                            "'fake_fw'\nPIN = 'fake-fw@1.0'\nOTHER = 'fake-fwx'\n")  # fmt: skip
    old = LAYOUT.ROOT
    LAYOUT.ROOT = tmp_path
    try:
        f = LAYOUT.figures()
    finally:
        LAYOUT.ROOT = old
    assert [set(c) for c in f["cycles"]] == [{"maskfuzz.oracles.a", "maskfuzz.oracles.b"}]
    assert f["by_file"]["private_imports"] == {"oracles/a.py": 1}
    assert f["by_file"]["against_direction"] == {"oracles/b.py": 1}
    assert f["by_file"]["function_local_imports"] == {"fuzz/c.py": 1, "fuzz/d.py": 1}
    # a kind's own package may name its own kinds (GAE's: gae, returns), never another's
    assert f["by_file"]["kind_string_dispatch"] == {"fuzz/c.py": 1, "fuzz/e.py": 1, "oracles/kinds/kl/q.py": 1}
    assert set(f["long_file_lines"]) == {"fuzz/c.py"}
    assert f["by_file"]["framework_names"] == {"fuzz/g.py": 3}

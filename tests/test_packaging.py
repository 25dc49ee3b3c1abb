"""maskfuzz installs under one namespace: `maskfuzz.fuzz`, `maskfuzz.targets`, `maskfuzz.oracles`.

No top-level `fuzz`, `targets` or `oracles` is installed (a package named `fuzz` exists on PyPI),
and no module of the repository imports those bare names: a bare import would pick up whatever
`fuzz/`, `targets/` or `oracles.py` sits in the working directory or on the path."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BARE = ("fuzz", "targets", "oracles")


def _python_files() -> list[Path]:
    return [p for d in ("fuzz", "targets", "oracles", "tests", "benchmarks") for p in (ROOT / d).rglob("*.py")]


def _bare_imports(path: Path, base: Path = ROOT) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        bad += [f"{path.relative_to(base)}:{node.lineno} {n}" for n in names if n.split(".")[0] in BARE]
    return bad


def test_no_module_imports_a_bare_top_level_name():
    files = _python_files()
    assert len(files) > 50
    bad = [b for f in files for b in _bare_imports(f)]
    assert not bad, "import these through the maskfuzz namespace:\n" + "\n".join(bad)


def test_the_checker_sees_a_bare_import(tmp_path):
    f = tmp_path / "x.py"
    f.write_text("import os\nimport targets.session as s\nfrom fuzz.corpus import load\nfrom maskfuzz import fuzz\n")
    assert _bare_imports(f, tmp_path) == ["x.py:2 targets.session", "x.py:3 fuzz.corpus"]


def test_installed_modules_live_under_maskfuzz():
    import maskfuzz.fuzz.cli
    import maskfuzz.oracles.kinds
    import maskfuzz.targets.registry

    for mod in (maskfuzz.fuzz.cli, maskfuzz.oracles.kinds, maskfuzz.targets.registry):
        assert Path(mod.__file__).resolve().is_relative_to(ROOT), mod.__file__
    code = "import importlib.util, sys; sys.path[:] = [p for p in sys.path if p not in ('', '.')]; " + (
        "print([n for n in ('fuzz', 'targets', 'oracles') if importlib.util.find_spec(n)])"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd="/", capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", f"bare top-level packages importable outside the checkout: {out.stdout}"


def test_the_wheel_installs_nothing_at_the_top_level_but_maskfuzz(tmp_path):
    """Builds the wheel (pip wheel, no dependencies) from a copy of the sources (a stale build/ folder
    of an older layout would leak into it) and lists its top-level names."""
    src = tmp_path / "src"
    skip = shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", "corpus", ".*cache*")
    shutil.copytree(ROOT, src, ignore=skip)
    r = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path),
         str(src)],  # fmt: skip
        capture_output=True,
        text=True,
        timeout=600,
    )
    if r.returncode != 0 and "No module named" in r.stderr:
        pytest.skip(f"cannot build a wheel here: {r.stderr.strip().splitlines()[-1]}")
    assert r.returncode == 0, r.stderr[-2000:]
    (wheel,) = tmp_path.glob("maskfuzz-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"maskfuzz"}, tops
    assert "maskfuzz/__init__.py" not in names  # a namespace package: the folders stay where they are
    wanted = ("maskfuzz/fuzz/cli.py", "maskfuzz/targets/verl/calls_kinds.py", "maskfuzz/oracles/kinds/kl/__init__.py",
              "maskfuzz/oracles/kinds/kl/strategies.py", "maskfuzz/oracles/kinds/gae/properties.py")  # fmt: skip
    for module in wanted:
        assert module in names
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    assert "maskfuzz = maskfuzz.fuzz.cli:main" in zipfile.ZipFile(wheel).read(entry).decode()

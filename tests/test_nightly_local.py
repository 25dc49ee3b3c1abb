"""The nightly job's scripts: every `maskfuzz` option the workflow and scripts/nightly_local.sh use
exists, the matrix comes from the registry, the local script validates its options, and (slow)
two local nights in a row give a report with the second night's findings still failing."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from maskfuzz.fuzz.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = ROOT / ".github" / "workflows" / "nightly.yml"
SCRIPT = ROOT / "scripts" / "nightly_local.sh"


def _subcommand_options() -> dict[str, set[str]]:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    return {name: {s for a in p._actions for s in a.option_strings} for name, p in sub.choices.items()}


def _invocations(text: str) -> list[tuple[str, list[str]]]:
    """(subcommand, options) of every `maskfuzz SUB ...` in a shell / workflow text, continuation
    lines joined; bash arrays written as FUZZ=(maskfuzz fuzz ...) and FUZZ+=(--opt ...) included."""
    text = text.replace("\\\n", " ")
    # commands only: not comments, not messages
    text = "\n".join(line for line in text.splitlines() if not re.match(r"\s*#", line))
    text = re.sub(r'echo\s+"[^"]*"', "", text)
    out = []
    for m in re.finditer(r"maskfuzz (\w+)([^\n]*)", text):
        sub, rest = m.group(1), m.group(2)
        opts = re.findall(r"(?<![\w-])(--[a-z][a-z-]*|-[a-z])\b", rest)
        out.append((sub, opts))
    for m in re.finditer(r"^\s*(\w+)=\(maskfuzz (\w+)([^)]*)\)", text, re.M):
        var, sub = m.group(1), m.group(2)
        out.append((sub, re.findall(r"(?<![\w-])(--[a-z][a-z-]*|-[a-z])\b", m.group(3))))
        for add in re.finditer(rf"{var}\+=\(([^)]*)\)", text):
            out.append((sub, re.findall(r"(?<![\w-])(--[a-z][a-z-]*)\b", add.group(1))))
    return out


@pytest.mark.parametrize("path", [WORKFLOW, SCRIPT], ids=["workflow", "script"])
def test_every_maskfuzz_option_used_exists(path):
    known = _subcommand_options()
    used = _invocations(path.read_text())
    assert {"fuzz", "replay", "report"} <= {sub for sub, _ in used}, "the nightly steps are fuzz, replay, report"
    bad = [(sub, o) for sub, opts in used for o in opts if sub in known and o not in known[sub] and o != "-h"]
    missing = sorted({sub for sub, _ in used} - set(known) - {"repro"})  # repro is optional (guarded)
    assert not bad and not missing, f"{path.name}: unknown options {bad}, unknown commands {missing}"


def test_workflow_shape():
    text = WORKFLOW.read_text()
    assert re.search(r"^\s+schedule:\s*\n\s+- cron:", text, re.M) and "workflow_dispatch:" in text
    assert "maskfuzz targets --json" in text and "fromJSON(needs.plan.outputs.matrix)" in text
    assert 'pip install "$TORCH_SPEC" --index-url "$TORCH_INDEX"' in text
    assert "TORCH_SPEC: torch==2.13.0" in text and "download.pytorch.org/whl/cpu" in text
    assert 'PYTHON_VERSION: "3.11"' in text
    assert text.count("actions/upload-artifact@v4") >= 3 and "--profile nightly" in text
    assert "--previous previous/report.json" in text and "name: nightly-report" in text
    assert "\t" not in text, "YAML must not contain tabs"


def test_matrix_selection_matches_the_registry(tmp_path):
    """Run the plan job's inline Python against `maskfuzz targets --json` of this checkout."""
    text = WORKFLOW.read_text()
    code = textwrap.dedent(re.search(r"python - <<'EOF'\n(.*?)\n\s*EOF\n", text, re.S).group(1))
    from maskfuzz.targets.registry import registry

    listing = [
        {"id": s.id, "pins": [{"rev": p.rev, "default": p.default, "kind": p.kind} for p in s.pins]}
        for s in registry().values()
    ]
    (tmp_path / "targets.json").write_text(json.dumps({"targets": listing}))
    got = {}
    for mode in ("default", "nightly", "all"):
        out = tmp_path / f"out-{mode}"
        subprocess.run(
            [sys.executable, "-c", code],
            cwd=tmp_path,
            check=True,
            capture_output=True,
            env=dict(os.environ, PINS=mode, GITHUB_OUTPUT=str(out)),
        )
        lines = dict(line.split("=", 1) for line in out.read_text().splitlines())
        got[mode] = [i["ref"] for i in json.loads(lines["matrix"])["include"]]
        assert int(lines["count"]) == len(got[mode]) and re.fullmatch(r"20\d{6}", lines["seed"])
    specs = registry().values()
    assert got["default"] == [f"{s.id}@{p.rev}" for s in specs for p in s.default_pins]
    assert set(got["default"]) < set(got["nightly"]) < set(got["all"]) or got["nightly"] == got["all"]
    assert len(got["all"]) == sum(len(s.pins) for s in specs)


def _script(*args: str, cwd: Path, env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env or os.environ.copy(),
    )


def test_script_help_and_bad_options(tmp_path):
    r = _script("--help", cwd=tmp_path)
    assert r.returncode == 0 and "--jobs" in r.stdout and "--budget" in r.stdout
    for bad in (["--jobs", "two"], ["--frobnicate"], ["--budget"]):
        r = _script(*bad, cwd=tmp_path)
        assert r.returncode == 2 and "nightly_local.sh:" in r.stderr, (bad, r.stderr)
    assert not (tmp_path / "nightly-out").exists()


MODULE = textwrap.dedent(
    """
    import torch

    def zeros(*, token_rewards, values, trainable, attention, score, gamma, lam):
        z = torch.zeros_like(values)
        return z, z
    """
)


@pytest.mark.slow
def test_two_local_nights(tmp_path):
    """Night 1 finds the zero estimator's bugs (new); night 2, same seed, finds them again (still failing)."""
    (tmp_path / "userzero.py").write_text(MODULE)
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    args = ["-o", "nights", "--max-examples", "10", "--no-replay", "--", "--callable", "userzero:zeros", "--quiet"]
    first = _script(*args, cwd=tmp_path, env=env, timeout=600)
    assert first.returncode == 0, first.stderr[-2000:]
    second = _script(*args, cwd=tmp_path, env=env, timeout=600)
    assert second.returncode == 0, second.stderr[-2000:]
    reports = sorted((tmp_path / "nights").glob("*/report/report.json"))
    assert len(reports) == 2
    r1, r2 = (json.loads(p.read_text()) for p in reports)
    assert r1["findings"] and {f["state"] for f in r1["findings"]} == {"new"}
    assert {f["state"] for f in r2["findings"]} == {"still-failing"}
    assert "--previous" in second.stderr and shlex.quote(str(reports[0].relative_to(tmp_path))) in second.stderr

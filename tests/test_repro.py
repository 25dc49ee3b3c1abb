"""`maskfuzz repro`: standalone reproducer scripts and maintainer reports.

What is checked:

* for every kind of check the script can make (numbers computed by maskfuzz, a twin run, a second
  run, finite outputs), the generated script's verdict equals `oracles.kinds.dispatch.judge`'s on a buggy
  and on a correct implementation (callables written into tmp_path: plain torch, no maskfuzz);
* a script runs in a clean interpreter in which maskfuzz is not importable: exit 1 on the bug,
  0 on the fix; it lints clean under the project's ruff settings;
* the command: files written, exit 0 / 1, no file when the script cannot run or disagrees with the
  judge, exit 2 with the missing names for an adapter that cannot be copied;
* adapters built on `targets.adapters.extract` (TRL, AReaL, NeMo-RL): the helper module's definitions
  the call reaches are copied (under their own banner, before the adapter), SPEC and what only it uses
  are not; a copied helper that imports more than stdlib + torch, or a call that reads SPEC, is refused;
* the report: title, summary, the example, the table, the property, bisection, environment, rerun;
* real targets: verl 0.4.1 (poison leaks) vs 0.5.0 (fixed) from release wheels (network); a corpus
  finding of trl@1.12.0, trl:compute_advantages@0.11.4 and areal@1.0.4 (release wheels, network)
  and of nemo-rl@7ea279abfbeb (MASKFUZZ_REPOS=nemo-rl=/path) reproduced by its script in a clean
  interpreter; the ROLL seed case at c09bc8bc9f43 from a mirror (MASKFUZZ_REPOS=roll=/path).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import torch

from maskfuzz.fuzz import repro, repro_assembly, repro_copier, repro_render
from maskfuzz.fuzz.cli import main as cli
from maskfuzz.fuzz.corpus import save
from maskfuzz.fuzz.corpus_codec import Entry, Found
from maskfuzz.oracles.case import Case
from maskfuzz.oracles.declared import Declared
from maskfuzz.oracles.domain import Domain
from maskfuzz.oracles.kinds.dispatch import judge
from maskfuzz.oracles.verdict import Verdict
from maskfuzz.targets import registry
from maskfuzz.targets.runtime.repos import parse_repos

ROOT = Path(__file__).resolve().parents[1]
FUNCTION = "gae_impl:gae"

# ---------------------------------------------------------------------------------------------
# Implementations written into tmp_path as `gae_impl.py` (canonical keyword signature).
# ---------------------------------------------------------------------------------------------
HEADER = """
import torch


def _loop(rewards, values, gamma, lam):
    # plain GAE over a list with a zero bootstrap after it (python floats)
    adv, nxt_v, nxt_a = [0.0] * len(rewards), 0.0, 0.0
    for t in reversed(range(len(rewards))):
        nxt_a = rewards[t] + gamma * nxt_v - values[t] + gamma * lam * nxt_a
        adv[t], nxt_v = nxt_a, values[t]
    return adv


def _last(row):
    idx = [t for t, x in enumerate(row) if x]
    return idx[-1] if idx else None
"""
COMPRESSED = """
def gae(*, token_rewards, values, trainable, attention, score, gamma, lam):
    adv, ret = torch.zeros_like(values), torch.zeros_like(values)
    for b in range(values.shape[0]):
        idx = [t for t in range(values.shape[1]) if trainable[b, t] > 0]
        r = [float(token_rewards[b, t]) for t in idx]
        v = [float(values[b, t]) for t in idx]
        if idx:
            r[-1] += float(score[b])
        for k, a in enumerate(_loop(r, v, gamma, lam)):
            adv[b, idx[k]], ret[b, idx[k]] = a, a + v[k]
    return adv, ret
"""
DENSE = """
def gae(*, token_rewards, values, trainable, attention, score, gamma, lam):
    adv, ret = torch.zeros_like(values), torch.zeros_like(values)
    for b in range(values.shape[0]):
        live = [bool(x > 0) for x in trainable[b]]
        r = [float(token_rewards[b, t]) if live[t] else 0.0 for t in range(len(live))]
        v = [float(values[b, t]) if live[t] else 0.0 for t in range(len(live))]
        if _last(live) is not None:
            r[_last(live)] += float(score[b])
        for t, a in enumerate(_loop(r, v, gamma, lam)):
            if live[t]:
                adv[b, t], ret[b, t] = a, a + v[t]
    return adv, ret
"""
BUGS = {
    # ROLL's seed bug: rewards masked, the raw values go into the loop
    "storage_only": """
def gae(*, token_rewards, values, trainable, attention, score, gamma, lam):
    adv, ret = torch.zeros_like(values), torch.zeros_like(values)
    for b in range(values.shape[0]):
        live = [bool(x > 0) for x in trainable[b]]
        r = [float(token_rewards[b, t]) if live[t] else 0.0 for t in range(len(live))]
        v = [float(x) for x in values[b]]
        if _last(live) is not None:
            r[_last(live)] += float(score[b])
        for t, a in enumerate(_loop(r, v, gamma, lam)):
            if live[t]:
                adv[b, t], ret[b, t] = a, a + v[t]
    return adv, ret
""",
    # masks by multiplying: NaN * 0 is NaN
    "multiply": """
def gae(*, token_rewards, values, trainable, attention, score, gamma, lam):
    rewards, values = token_rewards * trainable, values * trainable
    adv, ret = torch.zeros_like(values), torch.zeros_like(values)
    for b in range(values.shape[0]):
        last = _last([bool(x > 0) for x in trainable[b]])
        r = [float(x) for x in rewards[b]]
        if last is not None:
            r[last] += float(score[b])
        a = torch.tensor(_loop(r, [float(x) for x in values[b]], gamma, lam), dtype=values.dtype)
        adv[b], ret[b] = a * trainable[b], (a + values[b]) * trainable[b]
    return adv, ret
""",
    "dense": DENSE,
    # the score goes on the last real token, which may be masked
    "score_last_real": """
def gae(*, token_rewards, values, trainable, attention, score, gamma, lam):
    rewards = token_rewards.clone()
    for b in range(values.shape[0]):
        last = _last([bool(x > 0) for x in attention[b]])
        if last is not None:
            rewards[b, last] += score[b]
    return _gae(token_rewards=rewards, values=values, trainable=trainable, score=score * 0, gamma=gamma, lam=lam)
""",
    # the score is never added
    "no_score": """
def gae(*, token_rewards, values, trainable, attention, score, gamma, lam):
    return _gae(token_rewards=token_rewards, values=values, trainable=trainable, score=score * 0, gamma=gamma, lam=lam)
""",
    # the carry is left at masked positions instead of 0
    "carry_left": """
def gae(*, token_rewards, values, trainable, attention, score, gamma, lam):
    adv, ret = _gae(token_rewards=token_rewards, values=values, trainable=trainable, score=score, gamma=gamma, lam=lam)
    for b in range(adv.shape[0]):
        for t in reversed(range(adv.shape[1] - 1)):
            if trainable[b, t] == 0:
                adv[b, t] = adv[b, t + 1]
    return adv, ret
""",
    # subtracts a batch mean over every position, masked ones included
    "batch_mean": """
def gae(*, token_rewards, values, trainable, attention, score, gamma, lam):
    adv, ret = _gae(token_rewards=token_rewards, values=values, trainable=trainable, score=score, gamma=gamma, lam=lam)
    return (adv - adv.mean()) * trainable, ret
""",
    "noise": """
def gae(*, token_rewards, values, trainable, attention, score, gamma, lam):
    adv, ret = _gae(token_rewards=token_rewards, values=values, trainable=trainable, score=score, gamma=gamma, lam=lam)
    return adv + 1e-3 * torch.rand(adv.shape, dtype=adv.dtype) * trainable, ret
""",
    "crash_empty_row": """
def gae(*, token_rewards, values, trainable, attention, score, gamma, lam):
    for b in range(values.shape[0]):
        [t for t in range(values.shape[1]) if trainable[b, t] > 0][-1]  # IndexError on an all-masked row
    return _gae(token_rewards=token_rewards, values=values, trainable=trainable, score=score, gamma=gamma, lam=lam)
""",
    "documented_error": """
def gae(*, token_rewards, values, trainable, attention, score, gamma, lam):
    if any(row.sum() == 0 for row in trainable):
        raise ValueError("every row needs a trainable token")
    return _gae(token_rewards=token_rewards, values=values, trainable=trainable, score=score, gamma=gamma, lam=lam)
""",
}


def _source(body: str, contract: str) -> str:
    helper = (COMPRESSED if contract == "compressed" else DENSE).replace("def gae(*,", "def _gae(*,")
    helper = helper.replace("trainable, attention, score", "trainable, score", 1)  # _gae takes no attention
    return HEADER + helper + body


def write_impl(folder: Path, body: str, contract: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "gae_impl.py").write_text(_source(body, contract), encoding="utf-8")
    return folder


SEED = Case.build(trainable=[[1, 1, 0]], token_rewards=[[0, 1, 0]], values=[[0, 0, 100]], gamma=1.0, lam=0.95)
# the seed with its masked token as padding (TRL's response-only domain has no masked real token)
SEED_PADDED = Case.build(trainable=[[1, 1, 0]], attention=[[1, 1, 0]], token_rewards=[[0, 1, 0]], values=[[0, 0, 100]],
                         gamma=1.0, lam=0.95)
# adapters that compile the framework's code with targets.adapters.extract: (target, entry)
EXTRACT_TARGETS = [("trl", None), ("trl", "compute_advantages"), ("areal", None), ("nemo-rl", None)]
GAP = Case.build(trainable=[[1, 0, 0, 1]], values=[[0.5, 9, 9, 0.25]], score=[1.0], gamma=0.9, lam=0.8)
OBS_TAIL = Case.build(trainable=[[1, 1, 1, 0, 0]], score=[1.0], gamma=0.0, lam=0.9)
# (property, case, buggy implementation, contract, documented errors)
SCENARIOS = [
    ("poison", SEED, "storage_only", "dense", ()),
    ("poison-nonfinite", Case.build(trainable=[[1, 1, 0]], token_rewards=[[0, 1, 0]], values=[[0, 0, math.nan]],
                                    gamma=0.9, lam=0.95), "multiply", "dense", ()),
    ("reference", GAP, "dense", "compressed", ()),
    ("score-kept", OBS_TAIL, "score_last_real", "compressed", ()),
    ("telescoping", Case.build(trainable=[[1, 0, 1]], token_rewards=[[0.5, 0, 0.25]], values=[[1, 0, 2]], score=[2.0]),
     "no_score", "compressed", ()),
    ("all-trainable", Case.build(trainable=[[1, 1]], values=[[0.5, 1]], score=[1.0], gamma=0.9, lam=0.8),
     "no_score", "compressed", ()),
    ("masked-zero", Case.build(trainable=[[1, 0, 1]], token_rewards=[[0, 0, 1]], gamma=0.9, lam=0.8),
     "carry_left", "compressed", ()),
    ("gap-invariance", Case.build(trainable=[[1, 1]], token_rewards=[[0, 1]], gamma=0.9, lam=0.8),
     "dense", "compressed", ()),
    ("row-independence", Case.build(trainable=[[1, 1]], token_rewards=[[0, 1]], gamma=0.9, lam=0.8),
     "batch_mean", "compressed", ()),
    ("deterministic", Case.build(trainable=[[1, 1]], token_rewards=[[0, 1]], gamma=0.9, lam=0.8),
     "noise", "compressed", ()),
    ("no-crash", Case.build(trainable=[[1, 1], [0, 0]], token_rewards=[[0, 1], [0, 0]]),
     "crash_empty_row", "compressed", ()),
]


def _entry(prop: str, case: Case, target: str = "callable", pin: str = "local", entry_point: str | None = FUNCTION):
    verdict = Verdict(prop, "fail", "hand-made", "advantages", [], [], [])
    return Entry(target, pin, prop, case, verdict, entry_point=entry_point, found=Found.now(0))


@contextlib.contextmanager
def _imported_from(folder: Path):
    """`gae_impl` importable from `folder` for the block (and forgotten afterwards)."""
    sys.path.insert(0, str(folder))
    sys.modules.pop("gae_impl", None)
    try:
        yield
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop("gae_impl", None)


def judge_status(folder: Path, case: Case, prop: str, declared: Declared) -> str:
    with _imported_from(folder):
        fn = importlib.import_module("gae_impl").gae
        verdicts = judge(lambda c: fn(**c.inputs("cpu")), case, declared, only=(prop,))
    return next(v.status for v in verdicts if v.property == prop)


def script_status(script: Path, folder: Path) -> str:
    """The script's verdict, run in this process (its `prepare` and `judge`, not `main`)."""
    name = f"repro_{abs(hash((script, folder)))}"
    spec = importlib.util.spec_from_file_location(name, script)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is made
    try:
        spec.loader.exec_module(module)
        with _imported_from(folder):
            run, where = module.prepare(folder)
            assert where.endswith("gae")
            return module.judge(run, "cpu")["status"]
    finally:
        sys.modules.pop(name, None)


def plan_for(prop: str, case: Case, contract: str, documented=()) -> repro.Plan:
    declared = Declared(contract=contract, documented_errors=documented)
    return repro.make_plan(_entry(prop, case), repro.TargetInfo.of_callable(FUNCTION, declared))


# ---------------------------------------------------------------------------------------------
# The script's checks agree with the judge, on the bug and on the fix.
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("prop,case,bug,contract,documented", SCENARIOS, ids=[s[0] for s in SCENARIOS])
def test_script_verdict_equals_judge(tmp_path, prop, case, bug, contract, documented):
    plan = plan_for(prop, case, contract, documented)
    script = tmp_path / "repro.py"
    script.write_text(repro.render_script(plan), encoding="utf-8")
    buggy = write_impl(tmp_path / "buggy", BUGS[bug], contract)
    fixed = write_impl(tmp_path / "fixed", COMPRESSED if contract == "compressed" else DENSE, contract)
    declared = plan.target.declared
    assert judge_status(buggy, case, prop, declared) == "fail"  # the scenario really is a bug
    assert script_status(script, buggy) == "reproduced"
    assert judge_status(fixed, case, prop, declared) == "pass"
    assert script_status(script, fixed) == "fixed"


def test_documented_error_counts_as_fixed(tmp_path):
    case = Case.build(trainable=[[1, 1], [0, 0]], token_rewards=[[0, 1], [0, 0]])
    plan = plan_for("no-crash", case, "compressed", (r"ValueError: every row needs",))
    script = tmp_path / "repro.py"
    script.write_text(repro.render_script(plan), encoding="utf-8")
    documented = write_impl(tmp_path / "documented", BUGS["documented_error"], "compressed")
    crashing = write_impl(tmp_path / "crashing", BUGS["crash_empty_row"], "compressed")
    assert judge_status(documented, case, "no-crash", plan.target.declared) == "pass"
    assert script_status(script, documented) == "fixed"
    assert script_status(script, crashing) == "reproduced"


def test_poison_probe_follows_the_judge(tmp_path):
    """No poison in the case and lam = 1: the script runs the judge's probe (100 under the mask, lam 0.5)."""
    case = Case.build(trainable=[[1, 1, 0]], token_rewards=[[0, 1, 0]], gamma=1.0, lam=1.0)
    plan = plan_for("poison", case, "dense")
    assert plan.check.case.lam == 0.5 and plan.check.twin.lam == 0.5
    assert plan.check.case.values[0, 2] == 100.0 and plan.check.twin.values[0, 2] == 0.0
    script = tmp_path / "repro.py"
    script.write_text(repro.render_script(plan), encoding="utf-8")
    assert script_status(script, write_impl(tmp_path / "b", BUGS["storage_only"], "dense")) == "reproduced"


def test_property_that_does_not_apply_is_refused():
    with pytest.raises(repro.Unsupported, match="gamma = 0"):
        plan_for("score-kept", SEED, "compressed")
    with pytest.raises(repro.Unsupported, match="cannot express"):
        declared = Declared(domain=Domain(gaps=False))
        repro.make_plan(_entry("reference", GAP), repro.TargetInfo.of_callable(FUNCTION, declared))


# ---------------------------------------------------------------------------------------------
# A clean interpreter: torch yes, maskfuzz no.
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def clean_python(tmp_path_factory) -> Path:
    """A venv whose only extra path is this venv's site-packages, without its .pth files (so the
    editable maskfuzz install is not active); maskfuzz must not be importable there."""
    folder = tmp_path_factory.mktemp("clean") / "venv"
    done = subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot create a virtual environment for the clean run: {done.stderr.strip()[-300:]}")
    python = folder / "bin" / "python"
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], capture_output=True, text=True
    ).stdout.strip()
    Path(purelib, "torch_only.pth").write_text(sysconfig.get_paths()["purelib"] + "\n", encoding="utf-8")
    probe = "import torch\nfor name in ('fuzz', 'oracles', 'targets'):\n    try:\n        __import__(name)\n" \
            "    except ImportError:\n        continue\n    raise SystemExit(name + ' is importable')\n"
    done = subprocess.run([python, "-c", probe], capture_output=True, text=True, cwd=folder, env=_clean_env())
    assert done.returncode == 0, done.stdout + done.stderr
    return python


def _clean_env() -> dict:
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MASKFUZZ_TARGET_ROOT", "VIRTUAL_ENV")}


def run_clean(python: Path, script: Path, root: Path, cwd: Path) -> tuple[int, dict]:
    done = subprocess.run(
        [python, str(script), str(root)], capture_output=True, text=True, cwd=cwd, env=_clean_env(), timeout=300
    )
    try:
        return done.returncode, json.loads(done.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"no JSON from the script (exit {done.returncode}):\n{done.stdout}\n{done.stderr}")


def test_script_runs_without_maskfuzz(tmp_path, clean_python):
    plan = plan_for("poison", SEED, "dense")
    out = tmp_path / "out"
    out.mkdir()
    script = out / "repro.py"
    script.write_text(repro.render_script(plan), encoding="utf-8")
    assert not re.search(r"^\s*(from|import) (maskfuzz|fuzz|oracles|targets)\b", script.read_text(), re.M)
    buggy = write_impl(tmp_path / "buggy", BUGS["storage_only"], "dense")
    fixed = write_impl(tmp_path / "fixed", DENSE, "dense")
    code, data = run_clean(clean_python, script, buggy, tmp_path)
    assert code == 1 and data["status"] == "reproduced"
    assert data["observed"]["advantages"][0][:2] == pytest.approx([5.7, 6.0])
    assert data["expected"]["advantages"][0][:2] == pytest.approx([0.95, 1.0])
    assert data["inputs"]["case"]["values"] == [[0.0, 0.0, 100.0]]
    assert data["function"].endswith("gae_impl.py::gae")
    code, data = run_clean(clean_python, script, fixed, tmp_path)
    assert code == 0 and data["status"] == "fixed"
    # the environment variable instead of the argument (exit 2 when the code cannot run: see below)
    env = _clean_env() | {"MASKFUZZ_TARGET_ROOT": str(buggy)}
    done = subprocess.run([clean_python, str(script)], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert done.returncode == 1


# ---------------------------------------------------------------------------------------------
# Lint: the written scripts pass the project's ruff settings.
# ---------------------------------------------------------------------------------------------
def _ruff() -> list[str] | None:
    if shutil.which("ruff"):
        return [shutil.which("ruff")]
    probe = subprocess.run([sys.executable, "-m", "ruff", "--version"], capture_output=True)
    return [sys.executable, "-m", "ruff"] if probe.returncode == 0 else None


def test_scripts_pass_ruff(tmp_path):
    ruff = _ruff()
    if ruff is None:
        pytest.skip("ruff is not installed (pip install ruff)")
    written = []
    for prop, case, _, contract, documented in SCENARIOS:
        path = tmp_path / f"repro_{prop.replace('-', '_')}.py"
        path.write_text(repro.render_script(plan_for(prop, case, contract, documented)), encoding="utf-8")
        written.append(path)
    for target, entry in [(t, None) for t in ("verl", "openrlhf", "roll", "miles", "slime", "skyrl", "torchrl")] + \
            EXTRACT_TARGETS:
        spec = registry.get(target)
        info = repro.TargetInfo.from_spec(spec, entry, spec.pins[0].rev)
        plan = repro.make_plan(_entry("poison", SEED_PADDED, target, info.pin, entry), info)
        path = tmp_path / f"repro_{target}_{entry}.py"
        path.write_text(repro.render_script(plan, "x==1" if spec.package else "0" * 40), encoding="utf-8")
        written.append(path)
    done = subprocess.run(
        [*ruff, "check", "--no-cache", "--config", str(ROOT / "pyproject.toml"), *map(str, written)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr


# ---------------------------------------------------------------------------------------------
# The command.
# ---------------------------------------------------------------------------------------------
def test_command_writes_script_and_report(tmp_path, capsys):
    buggy = write_impl(tmp_path / "buggy", BUGS["storage_only"], "dense")
    fixed = write_impl(tmp_path / "fixed", DENSE, "dense")
    path = save(_entry("poison", SEED), tmp_path / "corpus")
    bisect = {
        "result": "found",
        "kind": "fix",
        "version": {"id": "0.5.0", "date": "", "subject": ""},
        "old": {"id": "0.4.1", "verdict": "bad"},
        "new": {"id": "0.9.1", "verdict": "good"},
        "revisions": 5,
        "evaluations": 4,
        "skips": 0,
    }
    (tmp_path / "bisect.json").write_text(json.dumps(bisect), encoding="utf-8")
    args = ["repro", str(path), "--callable", FUNCTION, "--contract", "dense", "-o", str(tmp_path / "out")]
    code = cli(args + ["--path", str(buggy), "--bisect", str(tmp_path / "bisect.json")])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "judge agrees (fail)" in captured.out
    report = (tmp_path / "out" / "report.md").read_text()
    assert report.startswith("# gae_impl:gae: `gae`: values at masked positions change the outputs")
    assert "gives advantages [5.7, 6.0] at 2 position(s)" in report
    assert "| advantages | 0 | 1 | last-trainable | 6.0 | 1.0 |" in report
    assert "`poison` (severity high)" in report and "## Bisection" in report
    assert "First version where the verdict changed: `0.5.0` (it fixed the failure)." in report
    assert "python repro.py" in report and re.search(r"values +0\.0 +0\.0 +100\.0", report)
    # at a folder where the case passes: written, exit 1
    code = cli(args + ["--path", str(fixed)])
    assert code == 1
    assert "does not fail" in capsys.readouterr().err
    assert "No difference at this pin" in (tmp_path / "out" / "report.md").read_text()


def test_nothing_written_when_the_script_cannot_run_or_disagrees(tmp_path):
    plan = plan_for("poison", SEED, "dense")
    buggy = write_impl(tmp_path / "buggy", BUGS["storage_only"], "dense")
    out = tmp_path / "out"
    with pytest.raises(repro.ReproFailed, match="cannot run.*gae_impl"):  # the script exited 2
        repro.produce(plan, out, repro.Environment(tmp_path / "nothing-here"), timeout=120)
    with pytest.raises(repro.ReproFailed, match="disagrees"):
        repro.produce(plan, out, repro.Environment(buggy), judge=lambda: "pass", timeout=120)
    assert not list(out.iterdir())


def test_unsupported_adapter_exits_2_naming_what_is_missing(tmp_path, capsys, monkeypatch):
    # every registered adapter can be copied now: make TRL's helper module one that a script may not copy
    not_followed = repro_copier.NOT_FOLLOWED + ("maskfuzz.targets.adapters.extract",)
    monkeypatch.setattr(repro_copier, "NOT_FOLLOWED", not_followed)
    path = save(_entry("poison", SEED_PADDED, "trl", "0.11.4", None), tmp_path / "corpus")
    assert cli(["repro", str(path), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "no reproducer for poison on trl@0.11.4" in err and "maskfuzz.targets.adapters.extract" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("target,entry", EXTRACT_TARGETS, ids=[f"{t}:{e or 'default'}" for t, e in EXTRACT_TARGETS])
def test_extract_helpers_are_copied_and_spec_is_not(target, entry):
    spec = registry.get(target)
    info = repro.TargetInfo.from_spec(spec, entry, spec.pins[0].rev)
    plan = repro.make_plan(_entry("poison", SEED_PADDED, target, info.pin, entry), info)
    text = repro.render_script(plan)
    helper = text.index("# From maskfuzz's targets/adapters/extract.py, copied")
    assert helper < text.index("# How maskfuzz calls") < text.index("\ndef load(root: Path, entry: str | None)")
    assert "\nclass SourceTree:" in text and "\nclass BlockNotFound(RuntimeError):" in text
    # the registry entry and what only it uses stay out; the script imports nothing of maskfuzz
    for absent in ("SPEC", "TargetSpec", "Domain(", "Pin(", "from maskfuzz", "import maskfuzz"):
        assert absent not in text, absent
    # only what the call reaches: NeMo-RL's adapter locates its class by name, not by the GAE loop
    assert ("\ndef find_gae_loop(" in text) == (target != "nemo-rl")
    adapter = importlib.import_module(spec.adapter)
    assert adapter.PACKAGES == spec.own  # what load passes to SourceTree is the registry's `own`, copied as written
    assert f"\nPACKAGES = ({json.dumps(adapter.PACKAGES[0])},)" in text


def test_an_adapter_module_used_as_an_object_is_copied_member_by_member():
    """`from maskfuzz.targets.nemo_rl import calls_kinds` then `calls_kinds.KL_TYPE` (a framework's calls module
    bound as an object, as slime's kind adapter binds its adapter): the member is copied to the script's top level
    and the `calls_kinds.` prefix is cut."""
    template_text = repro_assembly.TEMPLATE.read_text(encoding="utf-8")
    template = repro_copier.Source("maskfuzz.fuzz.templates.repro_script", template_text)
    closure = repro_copier.Closure(template)
    text = (
        "from maskfuzz.targets.nemo_rl import calls_kinds\n\n\n"
        "def f():\n"
        "    from maskfuzz.targets.nemo_rl import calls_kinds as nr\n\n"
        "    return calls_kinds.KL_TYPE, 'é', nr.KL_IN_CLAMP\n"
    )
    user = repro_copier.Source("maskfuzz.targets.adapters.user_of_nemo", text)
    closure.add_source(user)
    closure.need(user, "f", "test")
    code = "\n".join(closure.code("maskfuzz.targets.adapters.user_of_nemo"))
    assert "return KL_TYPE, 'é', KL_IN_CLAMP" in code and "import" not in code
    assert closure.bound["KL_TYPE"] == closure.bound["KL_IN_CLAMP"] == "maskfuzz.targets.nemo_rl.calls_kinds"
    assert not closure.missing
    # a re-export `KL_TYPE = calls_kinds.KL_TYPE` is the module's one definition, not a second one
    again = repro_copier.Source(
        "maskfuzz.targets.adapters.reexporter",
        "from maskfuzz.targets.nemo_rl import calls_kinds\n\nKL_TYPE = calls_kinds.KL_TYPE\n\n\n"
        "def g():\n    return KL_TYPE\n",
    )
    closure.add_source(again)
    closure.need(again, "g", "test")
    assert closure.bound["KL_TYPE"] == "maskfuzz.targets.nemo_rl.calls_kinds"
    assert "KL_TYPE = calls_kinds.KL_TYPE" not in "\n".join(closure.code("maskfuzz.targets.adapters.reexporter"))
    bare_text = text.replace("calls_kinds.KL_TYPE", "getattr(calls_kinds, 'x')")
    bare = repro_copier.Source("maskfuzz.targets.adapters.bare", bare_text)
    closure = repro_copier.Closure(template)
    closure.add_source(bare)
    with pytest.raises(repro.Unsupported, match="uses the module calls_kinds itself"):
        closure.need(bare, "f", "test")


def test_copied_helper_must_be_stdlib_and_torch():
    template_text = repro_assembly.TEMPLATE.read_text(encoding="utf-8")
    template = repro_copier.Source("maskfuzz.fuzz.templates.repro_script", template_text)
    closure = repro_copier.Closure(template)
    extract = "maskfuzz.targets.adapters.extract"
    helper = repro_copier.Source(extract, "import numpy\n\n\ndef f():\n    return numpy.zeros(1)\n")
    closure.add_source(helper)
    with pytest.raises(repro.Unsupported, match="imports numpy .*only the standard library and torch"):
        closure.need(helper, "f", "test")
    torch_only = repro_copier.Source(extract, "import torch\n\n\ndef f():\n    return torch.zeros(1)\n")
    closure = repro_copier.Closure(template)
    closure.add_source(torch_only)
    closure.need(torch_only, "f", "test")  # torch is fine
    assert repro_copier.ImportLine("torch") in closure.imports


def test_call_that_reads_spec_is_refused_with_the_fix(tmp_path, monkeypatch):
    (tmp_path / "spec_reading_adapter.py").write_text(
        "from pathlib import Path\n\n"
        "from maskfuzz.targets.adapters.base import Loaded\n"
        "from maskfuzz.targets.registry import TargetSpec\n\n"
        'SPEC = TargetSpec(id="x", adapter="spec_reading_adapter", own=("x",), contract="compressed")\n\n\n'
        "def load(root: Path, entry: str | None) -> Loaded:\n"
        "    return Loaded(None, SPEC.own[0])\n",
        encoding="utf-8",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    call = repro_assembly.call_source("spec_reading_adapter")
    with pytest.raises(repro.Unsupported, match=r"TargetSpec from maskfuzz\.targets\.registry.*reads SPEC; give what"):
        repro_assembly.assemble(call, {name: f"{name} = None\n" for name in repro_render.DATA_NAMES})


def test_adapter_hooks(monkeypatch):
    """REPRO_UNSUPPORTED refuses; repro_source() replaces the copied call."""
    import maskfuzz.targets.torchrl.calls as adapter

    monkeypatch.setattr(adapter, "REPRO_UNSUPPORTED", "needs a GPU kernel", raising=False)
    with pytest.raises(repro.Unsupported, match="needs a GPU kernel"):
        repro_assembly.call_source("maskfuzz.targets.torchrl.calls")
    monkeypatch.delattr(adapter, "REPRO_UNSUPPORTED")
    source = '''
        import functools


        def prepare(root: Path) -> tuple[Callable, str]:
            fn, where = function_from(root, [("mypkg.gae", "gae")])
            return functools.partial(fn), where
    '''
    monkeypatch.setattr(adapter, "repro_source", lambda: source, raising=False)
    call = repro_assembly.call_source("maskfuzz.targets.torchrl.calls")
    plan = repro.make_plan(_entry("poison", SEED, "torchrl", "0.14.1", None),
                           repro.TargetInfo.from_spec(registry.get("torchrl"), None, "0.14.1"))
    text = repro.render_script(repro.Plan(plan.entry, plan.target, plan.check, call))
    assert "import functools" in text and 'function_from(root, [("mypkg.gae", "gae")])' in text
    assert "def framework_inputs" not in text  # nothing of the adapter itself is copied


def test_bisect_field_of_the_entry_and_literals(tmp_path):
    path = save(_entry("poison", SEED), tmp_path)
    raw = json.loads(path.read_text())
    raw["bisect"] = {"result": "no-change", "reason": "verdict bad at both ends"}
    path.write_text(json.dumps(raw))
    from maskfuzz.fuzz.corpus import load

    assert repro.bisect_of(load(path)) == raw["bisect"]
    with pytest.raises(ValueError, match="not the output of"):
        (tmp_path / "x.json").write_text("[]")
        repro.bisect_of(load(path), tmp_path / "x.json")
    value = {"a": [[1.5, -0.0, math.inf], [math.nan, 2.0, -math.inf]], "b": ("x" * 150, None), "c": 3}
    back = eval(repro_render.py_literal(value, top=True), {"math": math})  # noqa: S307 - our own literal
    assert back["a"][0] == [1.5, -0.0, math.inf] and math.isnan(back["a"][1][0]) and back["b"][0] == "x" * 150


def test_script_case_matches_oracles_case():
    """The script's Case.build / inputs behave as oracles.case.Case's (adapters call both)."""
    from maskfuzz.fuzz.templates import repro_script

    kwargs = dict(trainable=[[1, 0, 1]], attention=[[1, 1, 1]], values=[[0.1, 7.3, 1 / 3]], score=[0.7],
                  gamma=0.9, lam=0.8, dtype="bfloat16")
    ours, theirs = repro_script.Case.build(**kwargs), Case.build(**kwargs)
    for name in ("attention", "trainable", "token_rewards", "values", "score"):
        assert torch.equal(getattr(ours, name), getattr(theirs, name)), name
    assert ours.shape == theirs.shape and ours.torch_dtype == theirs.torch_dtype
    for key, value in theirs.inputs("cpu").items():
        got = ours.inputs("cpu")[key]
        assert (torch.equal(got, value) and got.dtype == value.dtype) if torch.is_tensor(value) else got == value
    assert repro_script.Case.from_dict(repro_render.case_dict(theirs)).values.equal(theirs.values)


def test_identify_git_and_wheel(tmp_path):
    from maskfuzz.fuzz.templates import repro_script

    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "a.py").write_text("x = 1\n")
    subprocess.run(git + ["add", "a.py"], check=True)
    subprocess.run(git + ["commit", "-q", "-m", "one"], check=True)
    head = subprocess.run(git + ["rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    found = repro_script.identify(repo.resolve())
    assert found["commit"] == head and found["changed"] == [] and found["version"] is None
    (repo / "a.py").write_text("x = 2\n")
    assert repro_script.identify(repo.resolve())["changed"] == [" M a.py"]
    # a folder inside the repository is not a checkout of it
    (repo / "sub").mkdir()
    assert repro_script.identify((repo / "sub").resolve())["commit"] is None
    wheel = tmp_path / "wheel"
    (wheel / "pkg-1.2.dist-info").mkdir(parents=True)
    (wheel / "pkg-1.2.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: pkg\nVersion: 1.2\n\nbody\n")
    assert repro_script.identify(wheel.resolve()) == {"commit": None, "changed": None, "version": "pkg==1.2"}


# ---------------------------------------------------------------------------------------------
# Real targets.
# ---------------------------------------------------------------------------------------------
@pytest.mark.network
def test_verl_poison_reproduces_at_041_and_is_fixed_at_050(tmp_path, capsys, clean_python):
    from maskfuzz.targets.runtime.acquire import AcquireError, acquire

    spec = registry.get("verl")
    try:
        fixed_root = acquire(spec, "0.5.0").root
    except AcquireError as exc:
        pytest.skip(f"verl 0.5.0 wheel unavailable: {exc}")
    path = save(_entry("poison", SEED, "verl", "0.4.1", None), tmp_path / "corpus")
    code = cli(["repro", str(path), "--target", "verl@0.4.1", "-o", str(tmp_path / "out")])
    captured = capsys.readouterr()
    if code == 2 and "no network" in captured.err:
        pytest.skip(f"verl 0.4.1 wheel unavailable: {captured.err.strip()[-300:]}")
    assert code == 0, captured.err
    assert "judge agrees (fail)" in captured.out
    script, failing_root = tmp_path / "out" / "repro.py", acquire(spec, "0.4.1").root
    code, data = run_clean(clean_python, script, failing_root, tmp_path)
    assert code == 1 and data["version"] == "verl==0.4.1"
    # the seed's numbers, in the returns (verl whitens the advantages)
    assert data["observed"]["returns"][0][:2] == pytest.approx([5.7, 6.0])
    assert data["expected"]["returns"][0][:2] == pytest.approx([0.95, 1.0])
    code, data = run_clean(clean_python, script, fixed_root, tmp_path)
    assert code == 0 and data["status"] == "fixed" and data["version"] == "verl==0.5.0"
    report = (tmp_path / "out" / "report.md").read_text()
    assert "verl-0.4.1-py2.py3-none-any.whl" in report and "pip download --no-deps" in report


@pytest.mark.needs_mirror
def test_roll_seed_case_at_c09bc8bc9f43(tmp_path, capsys, clean_python):
    repos = parse_repos(None)
    if "roll" not in repos:
        pytest.skip("needs a ROLL mirror: MASKFUZZ_REPOS=roll=/path/to/ROLL (e.g. /work/.mirror/alibaba+ROLL/repo)")
    from maskfuzz.targets.runtime.acquire import acquire

    path = save(_entry("poison", SEED, "roll", "c09bc8bc9f43", None), tmp_path / "corpus")
    code = cli(["repro", str(path), "-o", str(tmp_path / "out")])
    assert code == 0, capsys.readouterr().err
    root = acquire(registry.get("roll"), "c09bc8bc9f43", repos).root
    code, data = run_clean(clean_python, tmp_path / "out" / "repro.py", root, tmp_path)
    assert code == 1 and data["commit"].startswith("c09bc8bc9f43")
    assert data["function"] == "roll/utils/functionals.py::compute_advantage"
    assert data["observed"]["advantages"] == [pytest.approx([5.7, 6.0, 0.0])]
    assert data["expected"]["advantages"] == [pytest.approx([0.95, 1.0, 0.0])]
    assert "| advantages | 0 | 0 | trainable | 5.7 | 0.95 |" in (tmp_path / "out" / "report.md").read_text()


def _failing_entry(label: str) -> Path:
    """A corpus file of the finding the ledger expects to fail at `label` (T[:ENTRY]@PIN), the first by id."""
    ledger = json.loads((ROOT / "corpus" / "ledger.json").read_text(encoding="utf-8"))["entries"]
    for key in sorted(ledger):
        expect = ledger[key].get(label) or {}
        if expect.get("expect") == "fails" and not expect.get("reason", "").startswith("no-crash: hang"):  # fast ones
            found = sorted((ROOT / "corpus").glob(f"*/*-{key}.json"))
            if found:
                return found[0]
    pytest.fail(f"corpus/ledger.json names no failing finding at {label}")


def _reproduce_in_clean_python(tmp_path, capsys, clean_python, label: str) -> dict:
    """`maskfuzz repro` of a failing corpus finding at `label`: exit 0 with the judge agreeing, and the
    script exits 1 on the same code in an interpreter without maskfuzz and passes ruff. Its JSON."""
    from maskfuzz.targets.runtime.acquire import acquire
    from maskfuzz.targets.runtime.session import parse_ref

    path = _failing_entry(label)
    code = cli(["repro", str(path), "--target", label, "-o", str(tmp_path / "out")])
    captured = capsys.readouterr()
    if code == 2 and "no network" in captured.err:
        pytest.skip(f"{label} unavailable: {captured.err.strip()[-300:]}")
    assert code == 0, captured.err
    assert "judge agrees (fail)" in captured.out
    ref = parse_ref(label)
    root = acquire(registry.get(ref.target), ref.pin, parse_repos(None)).root
    script = tmp_path / "out" / "repro.py"
    code, data = run_clean(clean_python, script, root, tmp_path)
    assert code == 1 and data["status"] == "reproduced", data.get("message")
    assert data["property"] == json.loads(path.read_text())["property"]
    ruff = _ruff()
    if ruff is not None:
        done = subprocess.run([*ruff, "check", "--no-cache", "--config", str(ROOT / "pyproject.toml"), str(script)],
                              capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr
    return data


EXTRACT_WHEELS = [
    ("trl@1.12.0", "trl==1.12.0", "trl/experimental/ppo/ppo_trainer.py::PPOTrainer.train (lines "),
    ("areal@1.0.4", "areal==1.0.4", "areal/trainer/ppo/actor.py::PPOActor._compute_advantages"),
]


@pytest.mark.network
@pytest.mark.parametrize("label,version,function", EXTRACT_WHEELS, ids=[w[0] for w in EXTRACT_WHEELS])
def test_extract_target_finding_reproduces_from_wheel(tmp_path, capsys, clean_python, label, version, function):
    data = _reproduce_in_clean_python(tmp_path, capsys, clean_python, label)
    assert data["version"] == version and data["function"].startswith(function)


# TRL 0.11.4's standalone compute_advantages keeps a NaN reward at a masked (left-padding) position through
# `rewards * mask` (a robustness fact since issue 24: TRL's step() holds finite outputs there), still a case the
# extracted function reproduces: the AST extraction from an old wheel stays under test
_TRL_OLD_NAN = Case.build(
    trainable=[[0, 1, 1]], attention=[[0, 1, 1]], token_rewards=[[float("nan"), 0.0, 0.0]],
    values=[[100.0, 0.0, 0.0]], score=[1.0], gamma=0.0, lam=1.0, dtype="float32",
)  # fmt: skip


@pytest.mark.network
def test_an_old_wheels_extracted_function_reproduces(tmp_path, capsys, clean_python):
    label = "trl:compute_advantages@0.11.4"
    entry = Entry("trl", "0.11.4", "poison-nonfinite", _TRL_OLD_NAN, Verdict("poison-nonfinite", "fail", "hand-made"),
                  entry_point="compute_advantages", found=Found.now(0))  # fmt: skip
    path = save(entry, tmp_path / "corpus")
    code = cli(["repro", str(path), "--target", label, "-o", str(tmp_path / "out")])
    captured = capsys.readouterr()
    assert code == 0 and "judge agrees (fail)" in captured.out, captured.err
    from maskfuzz.targets.runtime.acquire import acquire

    root = acquire(registry.get("trl"), "0.11.4", parse_repos(None)).root
    code, data = run_clean(clean_python, tmp_path / "out" / "repro.py", root, tmp_path)
    assert code == 1 and data["status"] == "reproduced", data.get("message")
    assert data["version"] == "trl==0.11.4"
    assert data["function"].startswith("trl/trainer/ppo_trainer.py::PPOTrainer.compute_advantages")


@pytest.mark.needs_mirror
def test_nemo_rl_finding_reproduces_at_7ea279abfbeb(tmp_path, capsys, clean_python):
    if "nemo-rl" not in parse_repos(None):
        pytest.skip("NeMo-RL is git only: needs MASKFUZZ_REPOS=nemo-rl=/path/to/a/clone/of/NVIDIA-NeMo/RL")
    data = _reproduce_in_clean_python(tmp_path, capsys, clean_python, "nemo-rl@7ea279abfbeb")
    assert data["commit"].startswith("7ea279abfbeb")
    where = "nemo_rl/algorithms/advantage_estimator.py::GeneralizedAdvantageEstimator.compute_advantage"
    assert data["function"] == where


def test_a_script_without_torch_exits_2_not_1(tmp_path, clean_python):
    """1 means "reproduced": a script that cannot even import torch must say "cannot run" (2)."""
    plan = plan_for("poison", SEED, "dense")
    script = tmp_path / "repro.py"
    script.write_text(repro.render_script(plan), encoding="utf-8")
    buggy = write_impl(tmp_path / "buggy", BUGS["storage_only"], "dense")
    no_torch = "import runpy, sys; sys.modules['torch'] = None; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"  # noqa: E501
    done = subprocess.run([clean_python, "-c", no_torch, str(script), str(buggy)], capture_output=True, text=True,
                          cwd=tmp_path, env=_clean_env())  # fmt: skip
    assert done.returncode == 2, done.stderr[-2000:]
    assert "cannot run" in done.stderr and "torch" in done.stderr

"""Upstream-ready tests: `test_<target>_<defect>.py`, a pytest test in the framework's own style.

The test imports only torch and the framework's function (the module and name the adapter found
at the pin, `handle.info["where"]`), builds the inputs the adapter builds (the framework's score
placement written out, with the upstream place it follows), calls the function and compares the
outputs at trainable positions with the float64 reference maskfuzz computed for the case, within
the suite's tolerance. It fails at the pin that has the defect and passes where it is fixed.

A recipe per target says how the canonical case becomes the call: `RECIPE` of the framework's
`targets/<framework>/upstream_recipe.py` (`targets.adapters.upstream_recipe.Recipe`), found from the
folder; targets without a recipe get no upstream test (the reproducer script still covers them) and
`write` says so.
"""

from __future__ import annotations

import importlib
import math
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from maskfuzz.oracles.case import Case
from maskfuzz.oracles.declared import Declared
from maskfuzz.oracles.kinds import GAE_JUDGE, spec
from maskfuzz.oracles.kinds.gae.properties import baseline, expected_outputs, poison_twins
from maskfuzz.oracles.kinds.gae.tolerance import bounds
from maskfuzz.oracles.mechanisms import MECHANISMS
from maskfuzz.oracles.tolerance import FLOOR
from maskfuzz.targets import registry
from maskfuzz.targets.adapters.upstream_recipe import RECIPE_MODULE, Recipe


def recipe_of(target: str) -> Recipe | None:
    """The target's recipe, `RECIPE` of `targets/<framework>/upstream_recipe.py`, or None when its folder has none."""
    module = registry.folder_module(target, RECIPE_MODULE)
    return None if module is None else importlib.import_module(module).RECIPE


def supported(target: str) -> bool:
    return registry.folder_module(target, RECIPE_MODULE) is not None


def _num(x: float) -> str:
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return repr(float(x))


def _literal(name: str, t: torch.Tensor, dtype: str) -> str:
    rows = t.tolist()
    body = repr(rows) if t.dtype == torch.bool or not t.is_floating_point() else _floats(rows)
    kind = {torch.bool: "torch.bool", torch.int64: "torch.long"}.get(t.dtype, f"torch.{dtype}")
    return f"    {name} = torch.tensor({body}, dtype={kind})"


def _floats(rows) -> str:
    if isinstance(rows, list):
        return "[" + ", ".join(_floats(r) for r in rows) + "]"
    s = _num(rows)
    return s if s not in ("nan", "inf", "-inf") else f'float("{s}")'


def _snake(text: str) -> str:
    return re.sub(r"[^0-9a-zA-Z]+", "_", text).strip("_").lower()


def render(
    case: Case,
    declared: Declared,
    *,
    target: str,
    pin: str,
    resolved: str,
    where: str,
    mechanism: str,
    prop: str,
    fix_pin: str | None = None,
    entry_id: str = "",
) -> str:
    """The test module's text (about 30 lines); ValueError when the target has no recipe.

    A poison finding is rendered on the input the judge compared: the case's own poison (or the
    judge's probe under the mask when the case carries none), at lam = 0.5 where the case has
    lam = 1 (a leaked value telescopes away at lam = 1). A masked-zero finding also asserts the
    zeros at the masked positions."""
    recipe = recipe_of(target)
    if recipe is None:
        known = ", ".join(registry.folders_with(RECIPE_MODULE))
        raise ValueError(f"no upstream-test recipe for {target}; known: {known}")
    if spec(declared.kind).family is not GAE_JUDGE:
        raise ValueError(
            f"the upstream-test recipes call the framework's GAE function; a {declared.kind} finding is covered by "
            "the standalone reproducer"
        )
    if not spec(declared.kind).domain.critic:  # REINFORCE++, REMAX: no values, a signature of their own
        raise ValueError(
            "the upstream-test recipes call the framework's GAE function on rewards and values; a "
            f"{declared.kind} finding (no critic) is covered by the standalone reproducer"
        )
    if declared.variant.get("kl_reward") or declared.contract == "segment":
        raise ValueError(
            "the upstream-test recipes call the framework's GAE function on rewards and values; a finding of the KL "
            "in the reward or of per-turn returns is covered by the standalone reproducer"
        )
    if case.options or bool(case.truncated_rows().any()):
        raise ValueError(
            "the finding needs a non-default option or a truncated row, which the upstream-test recipes do not set up; "
            "use the standalone reproducer"
        )
    if prop == "poison":
        case = poison_input(case, declared)
    path, _, attr = where.partition("::")
    module = path.removesuffix(".py").replace("/", ".")
    top, _, rest = attr.partition(".")
    fn = attr if not rest else f"{top}.{rest}"
    exp = expected_outputs(case, declared)
    if exp is None:
        raise ValueError("the reference is undefined for this case (whitening over < 2 trainable tokens)")
    bnd = bounds(case, declared.contract, exp[0], exp[1], declared.whitening, baseline=baseline(case, declared))
    live = case.trainable
    rtol, atol = FLOOR[case.dtype]
    tol = {n: 2.0 * float(b[live].max()) + atol for n, b in (("advantages", bnd.advantages), ("returns", bnd.returns))}
    tensors = recipe.tensors(case)
    call = recipe.call.format(fn=fn, gamma=repr(case.gamma), lam=repr(case.lam))
    name = _snake(f"{target} {mechanism} {entry_id[:8]}")
    squeeze = ".squeeze(-1)" if recipe.squeeze else ""
    fixed = f"; passes at {fix_pin}, where it is fixed" if fix_pin else ""
    lines = [
        f'"""maskfuzz {target}/{mechanism}: {MECHANISMS.get(mechanism, mechanism)}.',
        "",
        f"Found by maskfuzz (property {prop}) at {target}@{pin} ({resolved}); fails there{fixed}.",
        f"Expected: the float64 reference ({declared.contract} masked GAE"
        + (", whitened over trainable tokens" if declared.whitening else "")
        + ") at the trainable positions.",
        '"""',
        "",
        "import torch",
        "",
        f"from {module} import {top}",
        "",
        "",
        f"def test_{name}():",
        f"    # {recipe.placement}",
        *[_literal(k, v, case.dtype) for k, v in tensors.items()],
        f"    trainable = torch.tensor({repr(case.trainable.tolist())})",
        f"    advantages, returns = {call}",
    ]
    for out, ref in (("advantages", exp[0]), ("returns", exp[1])):
        lines.append(
            f"    torch.testing.assert_close({out}{squeeze}[trainable].double(), "
            f"torch.tensor({_floats(ref[live].tolist())}, dtype=torch.float64), rtol={rtol!r}, atol={tol[out]:.3g})"
        )
    if prop == "masked-zero":
        zeros = f"(advantages{squeeze}[~trainable] == 0).all()"
        lines.append(f"    assert {zeros}, 'non-zero advantages at masked positions'")
    return "\n".join(lines) + "\n"


def poison_input(case: Case, declared: Declared) -> Case:
    """The poisoned input the judge's poison check ran (`oracles.kinds.gae.properties.poison_twins`)."""
    return poison_twins(case, declared)[0]


def filename(target: str, mechanism: str, entry_id: str = "") -> str:
    tail = f"_{entry_id[:8]}" if entry_id else ""
    return f"test_{_snake(target)}_{_snake(mechanism)}{tail}.py"


_RUNNER = """
import runpy, sys
root, script, test = sys.argv[1:4]
sys.path.insert(0, root)
runpy.run_path(script, run_name="maskfuzz_repro_lib")["install_stand_ins"]()
import pytest
args = ["-q", "-p", "no:cacheprovider", "--noconftest", "-o", "addopts=", "--rootdir", sys.argv[4], test]
sys.exit(pytest.main(args))
"""


@dataclass(frozen=True)
class Checked:
    """The written test run at a pin: `status` "fails" (pytest exit 1: what a test of a defect
    must do there), "passes" (exit 0) or "error" (it could not be collected or run)."""

    status: str
    detail: str  # the lines that say why (pytest's E lines or its summary)


def check(
    test: Path, script: Path, root: Path, timeout: float = 600.0, python: str | None = None, crash_ok: bool = False
) -> Checked:
    """Run `test` with pytest on the checkout `root`, in an isolated interpreter that installs the
    stand-ins of the reproducer `script` (the heavy packages the framework imports but the math
    never uses), from the test's folder. A failure that is not an assertion (the call raised) is
    "error", unless `crash_ok` (a no-crash finding: the raise is the defect)."""
    import os
    import subprocess
    import sys

    cmd = [python or sys.executable, "-I", "-c", _RUNNER, str(root), str(script), str(test), str(test.parent)]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MASKFUZZ_TARGET_ROOT")}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, cwd=test.parent, env=env, stdin=subprocess.DEVNULL
        )
    except subprocess.TimeoutExpired:
        return Checked("error", f"no answer within {timeout:.0f} s")
    lines = (proc.stdout + proc.stderr).splitlines()
    errors = [ln for ln in lines if ln.startswith("E ")]
    why = errors[:6] or lines[-3:]
    status = {0: "passes", 1: "fails"}.get(proc.returncode, "error")
    if status == "fails" and not crash_ok and not any("AssertionError" in ln or "assert " in ln for ln in errors):
        status = "error"  # it raised inside the call: a test that cannot run is no test of the defect
    return Checked(status, "\n".join(why))

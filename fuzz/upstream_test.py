"""Upstream-ready tests: `test_<target>_<defect>.py`, a pytest test in the framework's own style.

The test imports only torch and the framework's function (the module and name the adapter found
at the pin, `handle.info["where"]`), builds the inputs the adapter builds (the framework's score
placement written out, with the upstream place it follows), calls the function and compares the
outputs at trainable positions with the float64 reference maskfuzz computed for the case, within
the suite's tolerance. It fails at the pin that has the defect and passes where it is fixed.

A recipe per target says how the canonical case becomes the call; targets without a recipe get
no upstream test (the reproducer script still covers them) and `write` says so.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from maskfuzz.oracles.case import Case
from maskfuzz.oracles.declared import Declared
from maskfuzz.oracles.kinds import GAE_JUDGE, spec
from maskfuzz.oracles.kinds.gae.properties import baseline, expected_outputs, poison_twins
from maskfuzz.oracles.kinds.gae.tolerance import bounds
from maskfuzz.oracles.mechanisms import MECHANISMS
from maskfuzz.oracles.tolerance import FLOOR
from maskfuzz.targets.skyrl import calls as skyrl_calls
from maskfuzz.targets.torchrl import calls as torchrl_calls


@dataclass(frozen=True)
class Recipe:
    """How a target's function is called: `tensors(case)` gives the named input tensors (in the
    order of the call), `call` the call expression over those names, gamma and lam."""

    tensors: Callable[[Case], dict[str, torch.Tensor]]
    call: str  # e.g. "{fn}(rewards, values, mask, {gamma}, {lam})"
    placement: str  # one comment line: where the score goes, after which upstream code
    squeeze: bool = False  # outputs are [B, T, 1]


def _last(mask: torch.Tensor) -> torch.Tensor:
    pos = torch.arange(mask.shape[1]).expand(mask.shape)
    last = torch.where(mask, pos, torch.full_like(pos, -1)).max(dim=1).values
    return (pos == last[:, None]) & mask


def _rewards_with_score(case: Case, at: torch.Tensor) -> torch.Tensor:
    return case.token_rewards + torch.where(at, case.score[:, None], torch.zeros_like(case.token_rewards))


def _verl(case: Case) -> dict:
    return {
        "rewards": _rewards_with_score(case, _last(case.attention)),
        "values": case.values,
        "mask": case.trainable.long(),
    }


def _openrlhf(case: Case) -> dict:
    return {"values": case.values, "rewards": _rewards_with_score(case, _last(case.trainable)), "mask": case.trainable}


def _skyrl(case: Case) -> dict:
    x = skyrl_calls.framework_inputs(case, "cpu")
    return {"rewards": x["token_level_rewards"], "values": x["values"], "mask": x["response_mask"]}


def _torchrl(case: Case) -> dict:
    x = torchrl_calls.framework_inputs(case, "cpu")
    return {k: x[k] for k in ("state_value", "next_state_value", "reward", "done", "terminated")}


RECIPES: dict[str, Recipe] = {
    "verl": Recipe(
        _verl,
        "{fn}(rewards, values, mask, {gamma}, {lam})",
        "score at the last attended response token, where verl's NaiveRewardManager writes it",
    ),
    "openrlhf": Recipe(
        _openrlhf,
        "{fn}(None, values, rewards, mask, {gamma}, {lam})",
        "score at the last action-mask token, where OpenRLHF's compute_reward puts it",
    ),
    "skyrl": Recipe(
        _skyrl,
        "{fn}(token_level_rewards=rewards, values=values, response_mask=mask, gamma={gamma}, lambd={lam})",
        "score on the last real response token, as SkyRL's trainer places scalar rewards",
    ),
    "torchrl": Recipe(
        _torchrl,
        "{fn}({gamma}, {lam}, state_value, next_state_value, reward, done, terminated)",
        "one trajectory per row, done = terminated at its last trainable token (score added there)",
        squeeze=True,
    ),
}


def supported(target: str) -> bool:
    return target in RECIPES


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
    if target not in RECIPES:
        raise ValueError(f"no upstream-test recipe for {target}; known: {', '.join(RECIPES)}")
    if spec(declared.kind).family is not GAE_JUDGE:
        raise ValueError(
            f"the upstream-test recipes call the framework's GAE function; a {declared.kind} finding is covered by "
            "the standalone reproducer"
        )
    if declared.variant.get("kl_reward") or declared.contract == "segment":
        raise ValueError(
            "the upstream-test recipes call the framework's GAE function on rewards and values; a finding of the KL "
            "in the reward or of per-turn returns is covered by the standalone reproducer"
        )
    recipe = RECIPES[target]
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

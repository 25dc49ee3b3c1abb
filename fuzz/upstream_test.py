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
from typing import Callable

import torch

from oracles.case import Case
from oracles.diagnosis import MECHANISMS
from oracles.properties import Declared, expected_outputs
from oracles.tolerance import FLOOR, bounds


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
    from targets.adapters.skyrl import framework_inputs

    x = framework_inputs(case, "cpu")
    return {"rewards": x["token_level_rewards"], "values": x["values"], "mask": x["response_mask"]}


def _torchrl(case: Case) -> dict:
    from targets.adapters.torchrl import framework_inputs

    x = framework_inputs(case, "cpu")
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
) -> str:
    """The test module's text (about 30 lines); ValueError when the target has no recipe."""
    if target not in RECIPES:
        raise ValueError(f"no upstream-test recipe for {target}; known: {', '.join(RECIPES)}")
    recipe = RECIPES[target]
    path, _, attr = where.partition("::")
    module = path.removesuffix(".py").replace("/", ".")
    top, _, rest = attr.partition(".")
    fn = attr if not rest else f"{top}.{rest}"
    exp = expected_outputs(case, declared)
    if exp is None:
        raise ValueError("the reference is undefined for this case (whitening over < 2 trainable tokens)")
    bnd = bounds(case, declared.contract, exp[0], exp[1], declared.whitening)
    live = case.trainable
    rtol, atol = FLOOR[case.dtype]
    tol = {n: 2.0 * float(b[live].max()) + atol for n, b in (("advantages", bnd.advantages), ("returns", bnd.returns))}
    tensors = recipe.tensors(case)
    call = recipe.call.format(fn=fn, gamma=repr(case.gamma), lam=repr(case.lam))
    name = _snake(f"{target} {mechanism}")
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
    return "\n".join(lines) + "\n"


def filename(target: str, mechanism: str) -> str:
    return f"test_{_snake(target)}_{_snake(mechanism)}.py"

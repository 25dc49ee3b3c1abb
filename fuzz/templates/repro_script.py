"""Template of the standalone reproducer that `maskfuzz repro` writes (see `fuzz/repro.py`).

maskfuzz never runs this module. `fuzz.repro` parses it, replaces the placeholders of the finding
section (TARGET ... CHECK) and `prepare` with a finding's data and the target's own call, and
writes out only the definitions `main` needs, in this order. It is a real module so that ruff
checks it and tests can exercise its pieces. Everything here must stay plain Python + torch: the
written script may not import maskfuzz. Docstrings and comments are written for the maintainer
who reads the reproducer.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import importlib
import importlib.abc
import importlib.machinery
import inspect
import json
import math
import os
import platform
import re
import signal
import subprocess
import sys
import traceback
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from maskfuzz.targets.runtime.standins import StandInFinder, install

# ---------------------------------------------------------------------------------------------
# The finding (placeholders: `maskfuzz repro` writes the real values).
# ---------------------------------------------------------------------------------------------
TARGET = "example"
PIN = "0"
PROPERTY = "reference"
INVARIANT = "outputs at trainable positions equal the float64 reference of the declared contract"
ENTRY: str | None = None
STAND_INS: tuple[str, ...] = ()
DENY: tuple[str, ...] = ()
OWN: tuple[str, ...] = ()
DOCUMENTED_ERRORS: tuple[str, ...] = ()
ROOT_ENV = "MASKFUZZ_TARGET_ROOT"
CASE: dict = {
    "dtype": "float32",
    "gamma": 1.0,
    "lam": 0.95,
    "attention": ["111"],
    "trainable": ["110"],
    "token_rewards": [[0.0, 1.0, 0.0]],
    "values": [[0.0, 0.0, 100.0]],
    "score": [0.0],
}
TWIN: dict | None = None
OUTPUTS: tuple[str, ...] = ("advantages", "returns")
CHECK: dict = {
    "kind": "expected",
    "outputs": {
        "advantages": {"expected": [[0.95, 1.0, 0.0]], "tolerance": [[1e-5, 1e-5, 1e-5]], "where": ["110"]},
    },
}


def prepare(root: Path) -> tuple[Callable, str]:
    """Placeholder: the written script defines how the target is called (run(case, device), where)."""
    raise NotImplementedError("maskfuzz repro writes the target's call here")


# ---------------------------------------------------------------------------------------------
# Heavy packages the computation never uses: inert stand-ins when missing, a blocker for DENY.
# (targets/runtime/standins.py, the worker's own, is copied into the script with what it needs.)
# ---------------------------------------------------------------------------------------------
def install_stand_ins() -> StandInFinder:
    """Keep the DENY packages missing, stand in for the STAND_INS packages that are not installed
    (never for OWN); the returned finder's `used` says which it supplied."""
    return install(STAND_INS, DENY, OWN)


# ---------------------------------------------------------------------------------------------
# The inputs, and how the target's code is found in the checkout.
# ---------------------------------------------------------------------------------------------
def mask(rows: list[str]) -> torch.Tensor:
    """'0'/'1' strings, one per row, as a bool tensor [B, T]."""
    return torch.tensor([[c == "1" for c in row] for row in rows], dtype=torch.bool)


@dataclass(frozen=True)
class Case:
    """One batch of masked inputs: B rows padded to T positions.

    attention[b, t]      bool: a real token (assistant or tool/observation token); False is padding
    trainable[b, t]      bool: the loss mask; True for the tokens the policy is trained on
    token_rewards[b, t]  float64: dense per-token rewards (e.g. a KL penalty)
    values[b, t]         float64: critic values; at non-trainable positions they must never matter
    score[b]             float64: the outcome reward of the row
    gamma, lam           discount and GAE lambda
    dtype                the precision the target runs in (the numbers above are exact in it)
    truncated[b]         bool: the row was cut by the length limit (no EOS); None: no row was
    bootstrap[b]         float64: the critic value after a cut row's last token
    options              the framework options the run uses (only those that differ from defaults)
    group[b]             int: the prompt group of the row (None: no groups)
    extra[name][b, t]    float64: the computation's other per-token inputs (log-probs, per-token losses,
                         critic predictions, ...); at non-trainable positions they must never matter
    split[b]             int: the micro-batch of the row in one optimizer step (None: one micro-batch);
                         micro-batches run in increasing id order, the i-th on simulated rank i % ranks
    ranks                the number of simulated data-parallel ranks
    """

    attention: torch.Tensor
    trainable: torch.Tensor
    token_rewards: torch.Tensor
    values: torch.Tensor
    score: torch.Tensor
    gamma: float
    lam: float
    dtype: str
    truncated: torch.Tensor | None = None
    bootstrap: torch.Tensor | None = None
    options: dict = field(default_factory=dict)
    group: torch.Tensor | None = None
    extra: dict = field(default_factory=dict)
    split: torch.Tensor | None = None
    ranks: int = 1

    @classmethod
    def from_dict(cls, data: dict) -> Case:
        def floats(x) -> torch.Tensor:
            return torch.tensor(x, dtype=torch.float64)

        def ids(name: str) -> torch.Tensor | None:
            return torch.tensor(data[name], dtype=torch.int64) if name in data else None

        return cls(
            attention=mask(data["attention"]),
            trainable=mask(data["trainable"]),
            token_rewards=floats(data["token_rewards"]),
            values=floats(data["values"]),
            score=floats(data["score"]),
            gamma=float(data["gamma"]),
            lam=float(data["lam"]),
            dtype=data["dtype"],
            truncated=torch.tensor(data["truncated"], dtype=torch.bool) if "truncated" in data else None,
            bootstrap=floats(data["bootstrap"]) if "bootstrap" in data else None,
            options=dict(data.get("options", {})),
            group=ids("group"),
            extra={name: floats(rows) for name, rows in data.get("extra", {}).items()},
            split=ids("split"),
            ranks=int(data.get("ranks", 1)),
        )

    def replace(self, **changes) -> Case:
        return type(self)(**{**self.__dict__, **changes})

    def rows(self, idx) -> Case:
        """The case of rows `idx` (in that order), every per-row field taken along; a split whose
        micro-batches no longer cover its ranks falls back to one rank."""
        idx = torch.as_tensor(idx, dtype=torch.int64)
        split = None if self.split is None else self.split[idx]
        ranks = self.ranks if split is not None and len(set(split.tolist())) >= self.ranks else 1
        return self.replace(
            attention=self.attention[idx],
            trainable=self.trainable[idx],
            token_rewards=self.token_rewards[idx],
            values=self.values[idx],
            score=self.score[idx],
            group=None if self.group is None else self.group[idx],
            extra={n: x[idx] for n, x in self.extra.items()},
            split=split,
            ranks=ranks,
            truncated=None if self.truncated is None else self.truncated[idx],
            bootstrap=None if self.bootstrap is None else self.bootstrap[idx],
        )

    def truncated_rows(self) -> torch.Tensor:
        """bool [B]: the rows cut by the length limit."""
        return self.truncated if self.truncated is not None else torch.zeros(self.shape[0], dtype=torch.bool)

    def bootstrap_values(self) -> torch.Tensor:
        """float64 [B]: the bootstrap value of each row (0 where none)."""
        return self.bootstrap if self.bootstrap is not None else torch.zeros(self.shape[0], dtype=torch.float64)

    @classmethod
    def build(
        cls,
        *,
        trainable: list,
        attention: list | None = None,
        token_rewards: list | None = None,
        values: list | None = None,
        score: list | None = None,
        gamma: float = 1.0,
        lam: float = 1.0,
        dtype: str = "float32",
    ) -> Case:
        """A case from nested lists; omitted: every position real, zero rewards, values and score.
        The numbers are rounded to `dtype`, so they are exactly what the target receives."""
        live = torch.as_tensor(trainable) != 0
        zeros = torch.zeros(live.shape, dtype=torch.float64)

        def rounded(x, default: torch.Tensor) -> torch.Tensor:
            x = default if x is None else torch.as_tensor(x, dtype=torch.float64)
            return x.to(getattr(torch, dtype)).to(torch.float64)

        return cls(
            attention=torch.ones_like(live) if attention is None else torch.as_tensor(attention) != 0,
            trainable=live,
            token_rewards=rounded(token_rewards, zeros),
            values=rounded(values, zeros),
            score=rounded(score, torch.zeros(live.shape[0], dtype=torch.float64)),
            gamma=float(gamma),
            lam=float(lam),
            dtype=dtype,
        )

    @property
    def shape(self) -> tuple[int, int]:
        return (int(self.trainable.shape[0]), int(self.trainable.shape[1]))

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    def inputs(self, device: str = "cpu") -> dict:
        """Keyword tensors in the case's dtype on `device`; masks as 1.0 / 0.0 of that dtype."""
        dt = self.torch_dtype
        return {
            "token_rewards": self.token_rewards.to(device=device, dtype=dt),
            "values": self.values.to(device=device, dtype=dt),
            "trainable": self.trainable.to(device=device, dtype=dt),
            "attention": self.attention.to(device=device, dtype=dt),
            "score": self.score.to(device=device, dtype=dt),
            "gamma": self.gamma,
            "lam": self.lam,
        }


class NotPresent(Exception):
    """The function under test does not exist in this checkout."""


@dataclass
class Loaded:
    """The function under test, ready: run(case, device) -> OUTPUTS, [B, T] each."""

    run: Callable
    where: str  # "path/in/checkout.py::function"
    notes: list = field(default_factory=list)
    absent_options: dict = field(default_factory=dict)  # option values the checkout lacks (not used here)


def import_from(root: Path, module: str) -> types.ModuleType:
    """Import `module` and insist that it comes from the checkout `root`, never from site-packages.
    Raises NotPresent when the checkout has no such module."""
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        top = module.split(".")[0]
        if exc.name and (exc.name == module or module.startswith(exc.name + ".")) and exc.name.split(".")[0] == top:
            raise NotPresent(f"module {module} is not present in this checkout") from None
        raise
    path = Path(inspect.getfile(mod)).resolve()
    if not path.is_relative_to(Path(root).resolve()):
        raise RuntimeError(f"{module} was imported from {path}, not from the checkout {root}")
    return mod


def function_from(root: Path, candidates: list[tuple[str, str]]) -> tuple[Callable, str]:
    """The first (module, attribute) of `candidates` present in the checkout, and where it is."""
    looked = []
    for module, attr in candidates:
        try:
            mod = import_from(root, module)
        except NotPresent:
            looked.append(f"{module} (no module)")
            continue
        obj = mod
        for part in attr.split("."):
            obj = getattr(obj, part, None)
            if obj is None:
                break
        if obj is None:
            looked.append(f"{module}.{attr} (no attribute)")
            continue
        rel = Path(inspect.getfile(mod)).resolve().relative_to(Path(root).resolve())
        return obj, f"{rel}::{attr}"
    raise NotPresent("function not present in this checkout; looked for " + ", ".join(looked))


# ---------------------------------------------------------------------------------------------
# The check.
# ---------------------------------------------------------------------------------------------
UNIT_ROUNDOFF = {"float64": 2.0**-53, "float32": 2.0**-24, "bfloat16": 2.0**-8, "float16": 2.0**-11}


def number(x: float) -> float | str:
    """A float for JSON: non-finite ones as the strings 'nan', 'inf', '-inf'."""
    x = float(x)
    return x if math.isfinite(x) else str(x)


def jsonable(data):
    """`data` with every non-finite float replaced by its string, so the output is strict JSON."""
    if isinstance(data, dict):
        return {k: jsonable(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [jsonable(v) for v in data]
    return number(data) if isinstance(data, float) else data


def dumps(data, indent: int = 0) -> str:
    """Strict JSON, one key per line, a list of numbers or strings on one line (a row per line)."""
    pad = "  " * (indent + 1)
    if isinstance(data, dict) and data:
        items = [f"{pad}{json.dumps(k)}: {dumps(v, indent + 1)}" for k, v in data.items()]
        return "{\n" + ",\n".join(items) + "\n" + "  " * indent + "}"
    if isinstance(data, list) and any(isinstance(v, (dict, list)) for v in data):
        return "[\n" + ",\n".join(pad + dumps(v, indent + 1) for v in data) + "\n" + "  " * indent + "]"
    return json.dumps(data, allow_nan=False)


def outputs(run: Callable, case: Case, device: str) -> dict[str, torch.Tensor]:
    """Run the target on `case`: its OUTPUTS by name, float64 on the CPU, checked to be [B, T] each."""
    out = run(case, device)
    if not (isinstance(out, (tuple, list)) and len(out) == len(OUTPUTS)):
        raise TypeError(f"the target returned {type(out).__name__}, not ({', '.join(OUTPUTS)})")
    result = {}
    for name, x in zip(OUTPUTS, out):
        if not isinstance(x, torch.Tensor) or tuple(x.shape) != case.shape:
            got = list(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise TypeError(f"{name} has shape {got}, expected {list(case.shape)}")
        result[name] = x.detach().to("cpu", torch.float64)
    return result


def rounding_slack(dtype: str, tensors: list[torch.Tensor]) -> float:
    """Slack for comparing the target with itself on two inputs that round differently:
    8 u (log2 n + 1) max |x| over the n finite numbers of `tensors` (u: unit roundoff of dtype)."""
    xs = torch.cat([x.flatten() for x in tensors])
    xs = xs[torch.isfinite(xs)]
    if not xs.numel():
        return 0.0
    return 8.0 * UNIT_ROUNDOFF[dtype] * (math.log2(xs.numel()) + 1) * float(xs.abs().max())


def differences(name: str, observed, expected, tolerance, where, exact: bool = False, at_least: bool = False) -> list:
    """Positions in `where` at which `observed` is not within `tolerance` of `expected`
    (|observed - expected| <= tolerance; NaN never agrees). `exact`: bitwise equal, NaN == NaN;
    `at_least`: observed >= expected - tolerance."""
    if exact:
        ok = (observed == expected) | (torch.isnan(observed) & torch.isnan(expected))
    elif at_least:
        ok = observed >= expected - tolerance
    else:
        ok = ((observed - expected).abs() <= tolerance) | ((observed == expected) & torch.isinf(expected))
    return [
        {
            "output": name,
            "position": [b, t],
            "observed": number(observed[b, t]),
            "expected": number(expected[b, t]),
            "tolerance": 0.0 if exact else number(tolerance[b, t]),
        }
        for b, t in (where & ~ok).nonzero().tolist()
    ]


def check_finite(run: Callable, case: Case, device: str) -> dict:
    """The case must give finite outputs at trainable positions, or raise a documented error (CHECK
    'raises_only': only an undocumented error fails)."""
    timeout = CHECK.get("timeout")
    if timeout:  # the finding was a hang: give up after `timeout` seconds

        def alarm(signum, frame):
            raise TimeoutError(f"no answer within {timeout} s")

        signal.signal(signal.SIGALRM, alarm)
        signal.alarm(int(timeout))
    try:
        got = outputs(run, case, device)
    except Exception as exc:  # noqa: BLE001 - whatever the target raises is the answer
        text = f"{type(exc).__name__}: {exc}"
        if any(re.search(p, text) for p in DOCUMENTED_ERRORS):
            return {"status": "fixed", "message": f"raised a documented error: {text}"}
        return {"status": "reproduced", "message": f"raised {text}", "traceback": traceback.format_exc()}
    finally:
        if timeout:
            signal.alarm(0)
    if CHECK.get("raises_only"):  # NaN / inf under the mask may reach the outputs: that is another property's
        return {"status": "fixed", "message": "no error", "observed": {name: x.tolist() for name, x in got.items()}}
    bad = case.trainable & ~torch.stack([torch.isfinite(x) for x in got.values()]).all(dim=0)
    found = [
        {"output": name, "position": [b, t], "observed": number(got[name][b, t]), "expected": "finite"}
        for b, t in bad.nonzero().tolist()
        for name in OUTPUTS
        if not math.isfinite(float(got[name][b, t]))
    ]
    status = "reproduced" if found else "fixed"
    message = f"non-finite output at {len(found)} trainable position(s)" if found else "finite outputs"
    observed = {name: x.tolist() for name, x in got.items()}
    return {"status": status, "message": message, "observed": observed, "differences": found}


def check_expected(run: Callable, case: Case, device: str) -> dict:
    """The outputs must match the numbers maskfuzz computed in float64 (CHECK), within tolerance."""
    observed = outputs(run, case, device)
    expected = {name: torch.tensor(c["expected"], dtype=torch.float64) for name, c in CHECK["outputs"].items()}
    return compare(case, observed, expected)


def check_twin(run: Callable, case: Case, device: str) -> dict:
    """The outputs on the case and on its twin (TWIN, rows / columns mapped onto the case's) must agree."""
    first = outputs(run, case, device)
    second = outputs(run, Case.from_dict(TWIN), device)
    rows, columns = CHECK["rows"], CHECK["columns"]
    mapped = {name: x[rows][:, columns] for name, x in second.items()}
    observed, expected = (mapped, first) if CHECK["observed"] == "twin" else (first, mapped)
    # the two runs round differently: rounding slack in the magnitude of the outputs at trainable positions
    trainable = mask(next(iter(CHECK["outputs"].values()))["where"])
    slack = rounding_slack(case.dtype, [expected[name][trainable] for name in OUTPUTS])
    return compare(case, observed, expected, slack)


def check_at_least(run: Callable, case: Case, device: str) -> dict:
    """The outputs on the case must not lie below those on its twin (TWIN) by more than the tolerance."""
    first = outputs(run, case, device)
    second = outputs(run, Case.from_dict(TWIN), device)
    trainable = mask(next(iter(CHECK["outputs"].values()))["where"])
    slack = rounding_slack(case.dtype, [x[trainable] for x in (*first.values(), *second.values())])
    return compare(case, first, second, slack, at_least=True)


def check_moved(run: Callable, case: Case, device: str) -> dict:
    """TWIN moves each row's score: the sum of the row's trainable outputs must move by CHECK's 'moves' (rows
    with a move of 0 are not judged), within its per-row tolerance plus rounding slack."""
    first = outputs(run, case, device)
    second = outputs(run, Case.from_dict(TWIN), device)
    name = CHECK["output"]
    where = mask(CHECK["outputs"][name]["where"])
    live = case.trainable
    zero = torch.zeros(case.shape, dtype=torch.float64)
    change = torch.where(live, second[name] - first[name], zero).sum(dim=1)
    slack = rounding_slack(case.dtype, [x[live] for x in (first[name], second[name])])
    found = []
    for b, (move, tol) in enumerate(zip(CHECK["moves"], CHECK["tolerance"])):
        if move != 0 and abs(float(change[b]) - move) > tol + slack:
            last = max(t for t in range(case.shape[1]) if where[b, t])  # where the moved score belongs
            found.append({"output": name, "position": [b, last], "observed": number(change[b]), "expected": move})
    missed = f"{len(found)} row(s) whose {name} sum did not follow the moved score"
    return {
        "status": "reproduced" if found else "fixed",
        "message": missed if found else f"every row's {name} sum followed its moved score",
        "observed": {n: x.tolist() for n, x in first.items()},
        "expected": {"moves": CHECK["moves"], "change": change.tolist()},
        "differences": found,
    }


def check_zero(run: Callable, case: Case, device: str) -> dict:
    """The outputs must be a finite 0 everywhere (CHECK), or the target raises a documented error."""
    try:
        observed = outputs(run, case, device)
    except Exception as exc:  # noqa: BLE001 - whatever the target raises is the answer
        text = f"{type(exc).__name__}: {exc}"
        if any(re.search(p, text) for p in DOCUMENTED_ERRORS):
            return {"status": "fixed", "message": f"raised a documented error: {text}"}
        return {"status": "reproduced", "message": f"raised {text}", "traceback": traceback.format_exc()}
    expected = {name: torch.tensor(c["expected"], dtype=torch.float64) for name, c in CHECK["outputs"].items()}
    return compare(case, observed, expected)


def check_same(run: Callable, case: Case, device: str) -> dict:
    """A second run of the same case must give the same bits."""
    first = outputs(run, case, device)
    return compare(case, outputs(run, case, device), first, exact=True)


def compare(
    case: Case, observed: dict, expected: dict, slack: float = 0.0, exact: bool = False, at_least: bool = False
) -> dict:
    """The verdict of comparing `observed` with `expected` at each output's 'where' positions: the
    tolerance is CHECK's absolute one, plus its 'relative' share of |expected| where given, plus `slack`."""
    found = []
    for name, spec in CHECK["outputs"].items():
        tolerance = torch.tensor(spec.get("tolerance", 0.0), dtype=torch.float64).expand(case.shape) + slack
        if "relative" in spec:
            tolerance = tolerance + spec["relative"] * expected[name].abs().nan_to_num(posinf=0.0, neginf=0.0)
        where = mask(spec["where"])
        found += differences(name, observed[name], expected[name], tolerance, where, exact, at_least)
    differing = " and ".join(dict.fromkeys(d["output"] for d in found))
    checked = " and ".join(CHECK["outputs"])
    return {
        "status": "reproduced" if found else "fixed",
        "message": f"{len(found)} position(s) of {differing} differ" if found else f"{checked} as expected",
        "observed": {name: x.tolist() for name, x in observed.items()},
        "expected": {name: expected[name].tolist() for name in CHECK["outputs"]},
        "differences": found,
    }


def judge(run: Callable, device: str) -> dict:
    """Run the check CHECK names on the case (the written script calls its one check directly)."""
    checks = {
        "finite": check_finite,
        "expected": check_expected,
        "twin": check_twin,
        "same": check_same,
        "at-least": check_at_least,
        "moved": check_moved,
        "zero": check_zero,
    }
    return checks[CHECK["kind"]](run, Case.from_dict(CASE), device)


# ---------------------------------------------------------------------------------------------
# Which code this is, and the command line.
# ---------------------------------------------------------------------------------------------
def git(root: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True)
    return done.stdout.rstrip() if done.returncode == 0 else ""  # porcelain lines start with a space


def identify(root: Path) -> dict:
    """The commit of a git checkout (and the tracked files that differ from it), else the name and
    version of an unpacked wheel (its *.dist-info/METADATA)."""
    found: dict = {"commit": None, "changed": None, "version": None}
    with contextlib.suppress(OSError):  # no git installed
        top = git(root, "rev-parse", "--show-toplevel")
        if top and Path(top).resolve() == root:
            found["commit"] = git(root, "rev-parse", "HEAD")
            # tracked files that differ from the commit (" M file", " D file"), the first 20
            status = git(root, "-c", "core.quotePath=false", "status", "--porcelain", "--untracked-files=no")
            found["changed"] = status.splitlines()[:20]
    for meta in sorted(root.glob("*.dist-info/METADATA")):
        head = meta.read_text(encoding="utf-8", errors="replace").split("\n\n", 1)[0]
        fields = dict(line.split(": ", 1) for line in head.splitlines() if ": " in line)
        if "Name" in fields and "Version" in fields:
            found["version"] = f"{fields['Name']}=={fields['Version']}"
    return found


EXIT = {"fixed": 0, "reproduced": 1, "error": 2}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=f"Reproduce the {TARGET} {PROPERTY} finding.")
    parser.add_argument("root", nargs="?", help=f"the {TARGET} checkout or unpacked wheel (default: ${ROOT_ENV})")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    args = parser.parse_args(argv)
    if not (args.root or os.environ.get(ROOT_ENV)):
        parser.error(f"give the path of the {TARGET} checkout, or set {ROOT_ENV}")
    root = Path(args.root or os.environ[ROOT_ENV]).resolve()
    if not root.is_dir():
        parser.error(f"{root} is not a directory")
    identity = identify(root)
    faulthandler.enable()  # a crash inside the target prints where it happened
    stand_ins = install_stand_ins()
    sys.path.insert(0, str(root))
    function = None
    try:
        with contextlib.redirect_stdout(sys.stderr):  # what the framework prints stays off the JSON
            run, function = prepare(root)
            result = judge(run, args.device)
    except NotPresent as exc:
        result = {"status": "error", "message": f"cannot run: {exc}"}
    except Exception as exc:  # noqa: BLE001 - reported, with the traceback, as "cannot run"
        text = f"{type(exc).__name__}: {exc}"
        result = {"status": "error", "message": f"cannot run: {text}", "traceback": traceback.format_exc()}
    versions = {name: getattr(sys.modules.get(name), "__version__", None) for name in ("torch", "tensordict")}
    report = {"target": TARGET, "pin": PIN, "property": PROPERTY}
    report |= {"status": result.pop("status"), "message": result.pop("message"), "invariant": INVARIANT}
    report |= {"checkout": str(root), **identity, "function": function, "device": args.device}
    report |= {"python": platform.python_version(), **{n: v for n, v in versions.items() if isinstance(v, str)}}
    report["stand_ins_used"] = sorted(stand_ins.used)
    report["inputs"] = {"case": CASE} | ({"twin": TWIN} if TWIN else {})
    report |= result
    print(dumps(jsonable(report)))
    return EXIT[report["status"]]


if __name__ == "__main__":
    sys.exit(main())

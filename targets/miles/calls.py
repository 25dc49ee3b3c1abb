"""miles' GAE entries as the worker calls them (`default`, `vanilla`, `gae-kl`): `get_advantages_and_returns_batch`
called directly where it takes `terminal_rewards` (it places the score itself), else through the PPO caller
`compute_advantages_and_returns(args, rollout_data)`, with the single-rank parallel state the pin needs, at the pin.
The declaration (pins, domains, entries, options, promises) is `targets/miles/declare.py`; the other kinds' calls
are `calls_kinds.py`, which reads the parallel state and the KL caller from here."""

from __future__ import annotations

import dataclasses
import inspect
import re
from pathlib import Path
from typing import Callable

from maskfuzz.oracles.case import Case
from maskfuzz.targets.adapters.base import Loaded, NotPresent, function_from, import_from
from maskfuzz.targets.slime.calls import (
    KL_COEF,
    Samples,
    bind_flavour,
    entry_name,
    install_mpu_state,
    kl_smoke,
    run_caller,
    run_kl_caller,
    smoke,
)

FUNCTION_HOMES = [
    ("miles.backends.training_utils.loss_hub.math_utils", "get_advantages_and_returns_batch"),
    ("miles.utils.ppo_utils", "get_advantages_and_returns_batch"),
]
CALLER_HOMES = [
    ("miles.backends.training_utils.loss", "compute_advantages_and_returns"),
    ("miles.backends.megatron_utils.loss", "compute_advantages_and_returns"),
]
MPU_IMPORT = re.compile(r"from megatron\.core import[^\n]*\bmpu\b|megatron\.core\.mpu")
# modules that may call the function by its global name (rebound for entry 'vanilla')
CALLER_MODULES = (
    "miles.backends.training_utils.loss_hub.advantages",
    "miles.backends.training_utils.loss",
    "miles.backends.megatron_utils.loss",
)


# ---------------------------------------------------------------------------------------------
# Parallel state, as the framework's tests set it.
# ---------------------------------------------------------------------------------------------
def trivial_parallel_state(parallel) -> object:
    """A `ParallelState` of one rank, built from the dataclass fields at this pin: `GroupInfo`
    fields get `GroupInfo(rank=0, size=1, group=None)`; the older flat layout gets ranks 0, sizes 1,
    groups None. Any other required field is unknown here: raise, rather than guess."""
    cls = parallel.ParallelState
    group_info = getattr(parallel, "GroupInfo", None)
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING:
            continue
        ann = str(f.type)
        if group_info is not None and "GroupInfo" in ann:
            kwargs[f.name] = group_info(rank=0, size=1, group=None)
        elif f.name.endswith("_size"):
            kwargs[f.name] = 1
        elif f.name.endswith("_rank"):
            kwargs[f.name] = 0
        elif "group" in f.name:
            kwargs[f.name] = None
        else:
            raise RuntimeError(f"ParallelState field {f.name}: {ann} has no known single-rank value")
    return cls(**kwargs)


def needs_mpu(root: Path) -> bool:
    """Whether any module on the way (function, callers) imports `megatron.core.mpu`. Read from the
    files, before anything is imported: a caller that binds `mpu` at import time must get the
    single-rank state, never the inert stand-in (whose CP rank is not 0, so the score would be
    silently dropped)."""
    modules = {m for m, _ in FUNCTION_HOMES + CALLER_HOMES} | set(CALLER_MODULES)
    for module in modules:
        path = Path(root, *module.split(".")).with_suffix(".py")
        if path.is_file() and MPU_IMPORT.search(path.read_text(encoding="utf-8")):
            return True
    return False


def provide_parallel_state(root: Path) -> tuple[object | None, list[str]]:
    """Set miles' own parallel state where the pin has one. Returns the ParallelState (None where
    the pin has none) and notes saying what was provided."""
    try:
        parallel = import_from(root, "miles.backends.training_utils.parallel")
    except NotPresent:
        return None, []
    state = trivial_parallel_state(parallel)
    if hasattr(parallel, "set_parallel_state"):
        parallel.set_parallel_state(state)
        return state, ["state: set_parallel_state(ParallelState(...)) with every group trivial (rank 0, size 1)"]
    return state, ["state: a single-rank ParallelState passed as the `parallel_state` argument"]


def check_mpu(modules: list, mpu) -> None:
    """Fail loudly if a module bound `mpu` to anything but the single-rank state (an inert
    stand-in answers every question with garbage the math would silently use)."""
    for mod in modules:
        bound = getattr(mod, "mpu", None)
        if bound is not None and bound is not mpu:
            raise RuntimeError(f"{mod.__name__} bound a megatron mpu other than the single-rank state: {bound!r}")


# ---------------------------------------------------------------------------------------------
# The two routes.
# ---------------------------------------------------------------------------------------------
def direct_runner(fn: Callable, chunked: bool | None, parallel_state) -> Callable:
    """Call `fn` with the canonical lists by keyword, the score as `terminal_rewards`."""
    params = inspect.signature(fn).parameters

    def run(case: Case, device: str):
        s = Samples.from_case(case, device)
        kwargs = {
            "total_lengths": s.total_lengths,
            "response_lengths": s.response_lengths,
            "values_list": [v.clone() for v in s.values],
            "rewards_list": [r.clone() for r in s.token_rewards],
            "terminal_rewards": list(s.scores),
            "gamma": case.gamma,
            "lambd": case.lam,
        }
        optional = {
            "qkv_format": "thd",
            "max_seq_lens": None,
            "loss_masks": [m.clone() for m in s.loss_masks],
            "parallel_state": parallel_state,
        }
        kwargs.update({k: v for k, v in optional.items() if k in params})
        if chunked is not None:
            kwargs["chunked"] = chunked
        missing = [p.name for p in params.values() if p.default is p.empty and p.name not in kwargs]
        if missing:
            raise RuntimeError(f"get_advantages_and_returns_batch needs {missing}, which the adapter does not know")
        adv, ret = fn(**kwargs)
        return s.scatter(case, list(adv)), s.scatter(case, list(ret))

    return run


def _single_rank(root: Path) -> tuple[object, list[str]]:
    """The single-rank megatron mpu state where the pin needs one: (state or None, notes)."""
    if not needs_mpu(root):
        return None, []
    return install_mpu_state(), ["state: megatron.core.mpu answers CP size 1, CP rank 0, last pipeline stage"]


def _trainer_call(root: Path, fn: Callable, mpu: object) -> tuple[Callable, str, list, list[str]]:
    """The trainer's `compute_advantages_and_returns(args, rollout_data)` bound to the pin's parallel state:
    (call, where, the caller's modules, notes); the modules and `fn`'s must see the single-rank `mpu`."""
    caller, caller_where = function_from(root, CALLER_HOMES)
    state, notes = provide_parallel_state(root)
    if "parallel_state" in inspect.signature(caller).parameters:
        if state is None:
            raise RuntimeError(f"{caller_where} takes a parallel_state, but this pin has no ParallelState")
        call = lambda args, data: caller(args, parallel_state=state, rollout_data=data)  # noqa: E731
    else:
        call = caller
    modules = []
    for mod_name in CALLER_MODULES:
        try:
            modules.append(import_from(root, mod_name))
        except NotPresent:
            continue
    check_mpu(modules + [inspect.getmodule(fn)], mpu)
    return call, caller_where, modules, list(notes)


def kl_caller(root: Path) -> tuple[Callable, str, list[str]]:
    """The trainer's `compute_advantages_and_returns(args, rollout_data)` at every pin (it computes the KL,
    shapes it and calls the estimator), with the single-rank state the pin needs: (call, where, notes)."""
    mpu, notes = _single_rank(root)
    fn, _ = function_from(root, FUNCTION_HOMES)
    call, caller_where, _, more = _trainer_call(root, fn, mpu)
    notes += more
    notes.append(
        f"KL in the reward through {caller_where}: log_probs = logp, ref_log_probs = ref_logp, kl_loss_type 'k1', "
        f"kl_coef {KL_COEF}, qkv_format 'thd'; the caller computes compute_approx_kl and shapes it itself"
    )
    return call, caller_where, notes


def load(root: Path, entry: str | None) -> Loaded:
    """Import miles' GAE from `root` (wheel or worktree) and the route that places the score; the
    entries of the other kinds load from `targets.miles.calls_kinds`."""
    if entry == "gae-kl":
        call, caller_where, notes = kl_caller(root)
        _, where = function_from(root, FUNCTION_HOMES)

        def run_kl(case: Case, device: str):
            return run_kl_caller(call, case, device, advantage_estimator="ppo", qkv_format="thd")

        return Loaded(run_kl, f"{where} via {caller_where}", notes + kl_smoke(run_kl))
    name = entry_name(entry)
    mpu, notes = _single_rank(root)
    fn, where = function_from(root, FUNCTION_HOMES)
    params = inspect.signature(fn).parameters
    if name == "vanilla" and "chunked" not in params:
        raise NotPresent("entry 'vanilla': get_advantages_and_returns_batch has no `chunked` flag at this pin")

    if "terminal_rewards" in params:
        state, more = provide_parallel_state(root)
        notes += more
        check_mpu([inspect.getmodule(fn)], mpu)
        run = direct_runner(fn, False if name == "vanilla" else None, state)
        notes.insert(0, "called directly; the function places terminal_rewards itself")
        notes.append("loss_masks passed" if "loss_masks" in params else "the function takes no loss mask")
        return Loaded(run, where, notes + smoke(run))

    call, caller_where, modules, more = _trainer_call(root, fn, mpu)
    notes += more
    notes.insert(0, f"called through {caller_where} (it places the score on the last response token)")
    notes.append("token rewards enter as KL: log_probs = 0, ref_log_probs = token_rewards, k1, kl_coef = 1")
    notes += bind_flavour(modules, fn, name)

    def run(case: Case, device: str):
        return run_caller(call, case, device)

    return Loaded(run, f"{where} via {caller_where}", notes + smoke(run))

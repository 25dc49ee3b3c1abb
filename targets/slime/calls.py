"""slime's GAE entries as the worker calls them: `slime/utils/ppo_utils.py::get_advantages_and_returns_batch`
through its PPO caller `slime/backends/megatron_utils/loss.py::compute_advantages_and_returns`, with megatron's
parallel state answered as one rank, at the pin. The declaration (pins, domains, entries, options, promises) is
`targets/slime/declare.py`; the other kinds' calls are `calls_kinds.py`.

The shared machinery here (mpu state, per-sample lists, caller arguments) also serves the miles
adapter: miles is a fork of slime and its older pins run the same caller.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import sys
import types
from argparse import Namespace
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from maskfuzz.oracles.case import Case
from maskfuzz.targets.adapters.base import Loaded, NotPresent, function_from, import_from

PROMPT_LEN = 1  # total_length = prompt + response; only read for CP slicing, which is off (CP size 1)
# the KL in the reward (entries gae-kl, reinforce++-kl; the declaration's KL_REWARD_VARIANT): --kl-coef, whose
# default 0.00 turns the shaping off and which no shipped script sets otherwise, so 0.1; --kl-loss-type's default k1
KL_COEF = 0.1
KL_ESTIMATOR = "k1"


# ---------------------------------------------------------------------------------------------
# State the functions need: megatron's parallel state, answered as one rank.
# ---------------------------------------------------------------------------------------------
def install_mpu_state() -> types.ModuleType:
    """Make `from megatron.core import mpu` give a module that answers as a single rank: CP size 1,
    CP rank 0, last pipeline stage (the stub slime's own tests install). Returns that module.

    `megatron` itself is an inert stand-in here (it is missing); only `mpu` carries state."""
    mpu = types.ModuleType("megatron.core.mpu")
    mpu.__maskfuzz_state__ = True
    mpu.get_context_parallel_world_size = lambda: 1
    mpu.get_context_parallel_rank = lambda: 0
    mpu.get_context_parallel_group = lambda *args, **kwargs: None  # all_gather_with_cp asks before the size (CP 1)
    mpu.is_pipeline_last_stage = lambda *args, **kwargs: True
    # --normalize-advantages all-reduces over the DP(-CP) group: the default group, one gloo rank
    # (`one_rank_group`), as slime's tests/test_advantage_whiten_cp.py stubs it over its gloo world
    mpu.get_data_parallel_group = lambda *args, **kwargs: None
    core = importlib.import_module("megatron.core")
    setattr(core, "mpu", mpu)
    sys.modules["megatron.core.mpu"] = mpu
    return mpu


# ---------------------------------------------------------------------------------------------
# The canonical case as per-sample lists, and back.
# ---------------------------------------------------------------------------------------------
@dataclass
class Samples:
    """One case as slime/miles per-sample lists (no padding). `spans[i] = (lo, hi)` is the real run
    of row i in the canonical window; every list entry has shape [hi - lo]."""

    spans: list[tuple[int, int]]
    response_lengths: list[int]
    total_lengths: list[int]
    values: list[torch.Tensor]  # case dtype
    token_rewards: list[torch.Tensor]  # case dtype
    loss_masks: list[torch.Tensor]  # torch.int, as miles/slime data.py build them
    scores: list[float]

    @classmethod
    def from_case(cls, case: Case, device: str) -> "Samples":
        inp = case.inputs(device)
        spans, values, rewards, masks = [], [], [], []
        for b in range(case.shape[0]):
            real = case.attention[b].nonzero().flatten()
            lo, hi = (int(real[0]), int(real[-1]) + 1) if real.numel() else (0, 0)
            spans.append((lo, hi))
            values.append(inp["values"][b, lo:hi].clone())
            rewards.append(inp["token_rewards"][b, lo:hi].clone())
            masks.append(case.trainable[b, lo:hi].to(device=device, dtype=torch.int))
        lengths = [hi - lo for lo, hi in spans]
        return cls(
            spans=spans,
            response_lengths=lengths,
            total_lengths=[n + PROMPT_LEN for n in lengths],
            values=values,
            token_rewards=rewards,
            loss_masks=masks,
            scores=[float(s) for s in case.score],
        )

    def scatter(self, case: Case, per_sample: list[torch.Tensor]) -> torch.Tensor:
        """Per-sample outputs [response_lengths[i]] back into the canonical [B, T] window (0 at padding)."""
        if len(per_sample) != len(self.spans):
            raise RuntimeError(f"the target returned {len(per_sample)} samples for {len(self.spans)} rows")
        ref = next((x for x in per_sample if isinstance(x, torch.Tensor)), None)
        dtype = ref.dtype if ref is not None else case.torch_dtype
        out = torch.zeros(case.shape, dtype=dtype)
        for b, ((lo, hi), x) in enumerate(zip(self.spans, per_sample)):
            if list(x.shape) != [hi - lo]:
                raise RuntimeError(f"sample {b}: output has shape {list(x.shape)}, expected [{hi - lo}]")
            out[b, lo:hi] = x.detach().to("cpu", dtype)
        return out


# ---------------------------------------------------------------------------------------------
# The PPO caller (compute_advantages_and_returns(args, rollout_data)), shared with old miles pins.
# ---------------------------------------------------------------------------------------------
class CallerArgs(Namespace):
    """The training arguments the PPO caller reads. Attributes not set explicitly answer None
    (off, for the feature switches the caller tests: use_opd, custom_advantage_function_path, ...)
    and are recorded in `unknown`, so a report can say what was defaulted."""

    unknown: set[str] = set()

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        CallerArgs.unknown.add(name)
        return None


def caller_args(gamma: float, lam: float, **options) -> CallerArgs:
    """PPO with the canonical token rewards expressed as KL (see `rollout_data`); the case's options
    (`normalize_advantages`, ...) as the argparse namespace attributes the caller reads, else off."""
    args = CallerArgs(
        advantage_estimator="ppo",
        kl_coef=1.0,
        kl_loss_type="k1",
        use_rollout_logprobs=False,
        normalize_advantages=False,
        custom_advantage_function_path=None,
        use_opd=False,
        gamma=gamma,
        lambd=lam,
    )
    for name, value in options.items():
        setattr(args, name, value)
    if args.normalize_advantages:
        one_rank_group()
    return args


def one_rank_group() -> None:
    """A one-rank gloo default process group for this worker (idempotent): the group
    `distributed_masked_whiten` all-reduces over when `--normalize-advantages` is on."""
    import os
    import tempfile

    import torch.distributed as dist

    if dist.is_available() and not dist.is_initialized():
        fd, path = tempfile.mkstemp(prefix="maskfuzz-gloo-")
        os.close(fd)
        os.unlink(path)
        dist.init_process_group("gloo", init_method=f"file://{path}", rank=0, world_size=1)


def rollout_data(s: Samples) -> dict:
    """The caller's `rollout_data` dict: KL = log_probs - ref_log_probs = -token_rewards (k1), so
    -kl_coef * KL with kl_coef = 1 is the token reward, exactly, in float32 as in production."""
    return {
        "log_probs": [torch.zeros_like(r) for r in s.token_rewards],
        "ref_log_probs": [r.clone() for r in s.token_rewards],
        "rewards": list(s.scores),
        "values": [v.clone() for v in s.values],
        "response_lengths": list(s.response_lengths),
        "total_lengths": list(s.total_lengths),
        "loss_masks": [m.clone() for m in s.loss_masks],
    }


def bind_flavour(caller_modules: list, fn: Callable, entry: str) -> list[str]:
    """For entry 'vanilla', make the caller call `fn(..., chunked=False)`: rebind the name in every
    caller module whose global is `fn` itself. Returns notes. NotPresent when `fn` has no flag."""
    if entry == "default":
        return []
    if "chunked" not in inspect.signature(fn).parameters:
        raise NotPresent("entry 'vanilla': get_advantages_and_returns_batch has no `chunked` flag at this pin")
    rebound = []
    for mod in caller_modules:
        if getattr(mod, "get_advantages_and_returns_batch", None) is fn:
            mod.get_advantages_and_returns_batch = functools.partial(fn, chunked=False)
            rebound.append(mod.__name__)
    if not rebound:
        raise RuntimeError("entry 'vanilla': no caller module calls get_advantages_and_returns_batch by that name")
    return [f"entry vanilla: {', '.join(rebound)} call get_advantages_and_returns_batch(..., chunked=False)"]


def entry_name(entry: str | None) -> str:
    name = entry or "default"
    if name not in ("default", "vanilla"):
        raise NotPresent(f"unknown entry {entry!r}; entries: default, vanilla")
    return name


def run_caller(caller: Callable, case: Case, device: str, **fixed) -> tuple[torch.Tensor, torch.Tensor]:
    """One case through `caller(args, rollout_data)`, configured by the case's options (the
    attributes of the argparse namespace: `normalize_advantages`) and `fixed` namespace attributes;
    canonical [B, T] (advantages, returns)."""
    s = Samples.from_case(case, device)
    data = rollout_data(s)
    options = {"normalize_advantages": bool(case.options.get("normalize_advantages", False)), **fixed}
    caller(caller_args(case.gamma, case.lam, **options), data)
    if "advantages" not in data or "returns" not in data:
        raise RuntimeError("the PPO caller returned without setting rollout_data['advantages'] / ['returns']")
    return s.scatter(case, list(data["advantages"])), s.scatter(case, list(data["returns"]))


def kl_rollout_data(case: Case, s: Samples, device: str, critic: bool = True) -> dict:
    """The caller's `rollout_data` for a KL in the reward: the case's `logp` / `ref_logp` cut per sample as
    `log_probs` / `ref_log_probs` (the case's dtype; compute_approx_kl casts .float()), the scores as the rewards;
    the case's token rewards are 0 (the entries' domains): slime has no per-token reward besides the KL."""
    dt = case.torch_dtype

    def cut(x: torch.Tensor) -> list[torch.Tensor]:
        return [x[b, lo:hi].to(device=device, dtype=dt).clone() for b, (lo, hi) in enumerate(s.spans)]

    return {
        "log_probs": cut(case.extra["logp"]),
        "ref_log_probs": cut(case.extra["ref_logp"]),
        "rewards": list(s.scores),
        "values": [v.clone() for v in s.values] if critic else None,
        "response_lengths": list(s.response_lengths),
        "total_lengths": list(s.total_lengths),
        "loss_masks": [m.clone() for m in s.loss_masks],
    }


def run_kl_caller(
    caller: Callable, case: Case, device: str, critic: bool = True, **fixed
) -> tuple[torch.Tensor, torch.Tensor]:
    """One case through `caller(args, rollout_data)` with the KL in the reward: the caller computes
    compute_approx_kl(log_probs, ref_log_probs, kl_loss_type) and shapes it with -kl_coef itself; `fixed`
    namespace attributes (advantage_estimator, ...); lam = 1 without a critic. Canonical (advantages, returns)."""
    s = Samples.from_case(case, device)
    data = kl_rollout_data(case, s, device, critic)
    options = {
        "normalize_advantages": bool(case.options.get("normalize_advantages", False)),
        "kl_coef": KL_COEF,
        "kl_loss_type": KL_ESTIMATOR,
        **fixed,
    }
    caller(caller_args(case.gamma, case.lam if critic else 1.0, **options), data)
    if "advantages" not in data or "returns" not in data:
        raise RuntimeError("the PPO caller returned without setting rollout_data['advantages'] / ['returns']")
    return s.scatter(case, list(data["advantages"])), s.scatter(case, list(data["returns"]))


def kl_smoke(run: Callable) -> list[str]:
    """`smoke` for a KL-in-the-reward runner: the trivial case with log-probs."""
    return smoke(run, {"logp": [[-1.0, -2.0]], "ref_logp": [[-1.5, -1.0]]})


def smoke(run: Callable, extra: dict | None = None) -> list[str]:
    """Run one trivial case (with `extra` inputs) at load, so an adapter that cannot drive this pin fails loudly
    at load (never as a crash finding); returns a note naming the caller arguments left unset (None)."""
    CallerArgs.unknown.clear()
    run(Case.build(trainable=[[1, 1]], score=[1.0], gamma=0.5, lam=0.5, extra=extra), "cpu")
    if CallerArgs.unknown:
        return ["caller arguments left unset (None): " + ", ".join(sorted(CallerArgs.unknown))]
    return []


# ---------------------------------------------------------------------------------------------
# load
# ---------------------------------------------------------------------------------------------
def load(root: Path, entry: str | None) -> Loaded:
    """Import slime's GAE and its PPO caller from `root`; run cases through the caller. The entries
    of the other kinds load from `targets.slime.calls_kinds`."""
    name = "gae-kl" if entry == "gae-kl" else entry_name(entry)
    mpu = install_mpu_state()
    fn, where = function_from(root, [("slime.utils.ppo_utils", "get_advantages_and_returns_batch")])
    caller, caller_where = function_from(
        root, [("slime.backends.megatron_utils.loss", "compute_advantages_and_returns")]
    )
    loss_mod = import_from(root, "slime.backends.megatron_utils.loss")
    if getattr(loss_mod, "mpu", mpu) is not mpu:
        raise RuntimeError("slime's loss.py bound a megatron mpu other than the single-rank state")
    notes = [
        f"called through {caller_where} (it places the score on the last response token)",
        "state: megatron.core.mpu answers CP size 1, CP rank 0, last pipeline stage (as slime's tests stub it)",
        "token rewards enter as KL: log_probs = 0, ref_log_probs = token_rewards, k1, kl_coef = 1",
    ]
    if name == "gae-kl":
        notes[-1] = (
            f"KL in the reward: log_probs = logp, ref_log_probs = ref_logp, kl_loss_type 'k1', kl_coef {KL_COEF}; "
            "the caller computes compute_approx_kl and -kl_coef * kl itself"
        )

        def run_kl(case: Case, device: str):
            return run_kl_caller(caller, case, device, advantage_estimator="ppo")

        return Loaded(run_kl, f"{where} via {caller_where}", notes + kl_smoke(run_kl))
    notes += bind_flavour([loss_mod], fn, name)

    def run(case: Case, device: str):
        return run_caller(caller, case, device)

    return Loaded(run, f"{where} via {caller_where}", notes + smoke(run))

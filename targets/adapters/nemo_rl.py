"""Adapter for NeMo-RL (github.com/NVIDIA-NeMo/RL, git only).

Target: `nemo_rl/algorithms/advantage_estimator.py::GeneralizedAdvantageEstimator.compute_advantage` (which calls
`_build_token_level_rewards` and `_compute_gae`), present since 857b11522 (2026-06-11, "PPO with MCore").

Why the source is executed rather than imported: importing `nemo_rl.algorithms.advantage_estimator` pulls in
`nemo_rl.algorithms.utils` -> `nemo_rl.models.policy` (asserts `transformers.__version__ < 5.12`) and
`nemo_rl.utils.logger` (`torch.utils.tensorboard` checks `tensorboard.__version__`), and declares pydantic models
with class keywords (`BaseModel, extra="allow"`). Inert stand-ins have no `__version__` and cannot be pydantic
bases, so the module cannot be imported without the real transformers, tensorboard and pydantic. The adapter
therefore compiles the estimator class from the pinned source file, plus exactly the helpers it uses
(`calculate_kl`, `masked_mean`, `masked_var` from `nemo_rl/algorithms/utils.py`), each with its real file name and
line numbers, with annotations left unevaluated. Every other name the class needs must be torch/numpy/stdlib; any
other dependency fails the load loudly instead of being guessed.

How a canonical case becomes NeMo-RL's inputs (the PPO loop in `nemo_rl/algorithms/ppo.py`):

    mask      [B, T]  the trainable mask: the loop passes `token_mask * sample_mask` over the whole flat sequence
                      (prompt, turns, padding); NeMo-RL has no separate attention input, so real and padding
                      non-trainable positions look the same to it
    values    [B, T]  the case's values; rewards [B] the score (placed by NeMo-RL on the last mask=1 token)
    logprobs  [B, T]  `-token_rewards / c`, reference_logprobs = 0, with `use_kl_in_reward=True`, k1 KL and
                      `reference_policy_kl_penalty = c`: NeMo-RL's only dense reward is `-c * kl`, which is then
                      exactly the canonical token reward. `calculate_kl` clamps at +-10, so `c` is the smallest
                      power of two (>= 1) keeping |r / c| <= 8 at trainable positions; powers of two keep it exact.
    estimator config as the framework's own unit tests build it (tests/unit/algorithms/test_ppo.py): gae_gamma,
    gae_lambda, normalize_advantages=False, no VAPO decoupling (gae_lambda_value/policy None, alpha 0).
"""

from __future__ import annotations

import __future__
import ast
import builtins
import importlib
import importlib.util
import math
from pathlib import Path
from types import SimpleNamespace

import torch

from oracles.case import Case
from oracles.domain import Domain
from targets.adapters.base import Loaded, NotPresent
from targets.registry import Pin, TargetSpec

SPEC = TargetSpec(
    id="nemo-rl",
    adapter="targets.adapters.nemo_rl",
    own=("nemo_rl",),
    # carry-forward masking: at masked positions next_values and last_gae_lam keep the last trainable token's,
    # so a gap costs nothing and the score sits on the last mask=1 token: the trainable-subsequence GAE.
    contract="compressed",
    git_url="https://github.com/NVIDIA-NeMo/RL.git",
    pins=(
        Pin("7ea279abfbeb", "main at the mirror snapshot (2026-08-22)", kind="git"),
        Pin("857b11522612", "PR #2530 'PPO with MCore' (2026-06-11): GeneralizedAdvantageEstimator added", kind="git"),
        Pin("f6e91870a807", "parent of 857b11522612: no GeneralizedAdvantageEstimator yet (not present)", kind="git"),
    ),
    whitening=None,  # normalize_advantages=False as in NeMo-RL's unit tests (examples/configs/ppo_math_1B.yaml whitens)
    masked_zero=True,  # compute_advantage ends with masked_fill(advantages, ~mask, 0)
    stand_ins=(),  # nothing of nemo_rl is imported (see the module docstring), so nothing is stood in for
    domain=Domain(),  # mask, values, score and token rewards are independent inputs in any dtype; no narrowing
    notes="source of GeneralizedAdvantageEstimator executed from the pin (its module needs real transformers, "
    "tensorboard and pydantic to import); token rewards through its KL-in-reward term",
)

_MODULE = "nemo_rl.algorithms.advantage_estimator"
_CLASS = "GeneralizedAdvantageEstimator"
# Modules whose objects the extracted code may use as they are installed here (pure math and the stdlib).
_REAL_MODULES = ("torch", "numpy", "math", "typing", "functools", "warnings", "random", "collections")
_MAX_KL = 8.0  # below calculate_kl's output clamp of 10


def load(root: Path, entry: str | None) -> Loaded:
    """Compile NeMo-RL's GAE estimator from the checkout at `root`; NotPresent before it existed."""
    if entry not in (None, "default"):
        raise ValueError(f"nemo-rl has one entry, 'default', not {entry!r}")
    extractor = _Extractor(Path(root))
    path = extractor.module_file(_MODULE)
    if path is None:
        raise NotPresent(f"{_MODULE} is not present at this pin")
    if _CLASS not in extractor.definitions(_MODULE):
        raise NotPresent(f"{_MODULE} has no {_CLASS} at this pin")
    estimator_cls = extractor.get(_MODULE, _CLASS)
    where = f"{path.relative_to(Path(root).resolve())}::{_CLASS}.compute_advantage"

    def run(case: Case, device: str) -> tuple[torch.Tensor, torch.Tensor]:
        inputs = case.inputs(device)
        scale = _kl_scale(case)
        estimator = estimator_cls(
            {
                "gae_lambda": case.lam,
                "gae_gamma": case.gamma,
                "normalize_advantages": False,
                "length_adaptive_alpha": 0.0,
                "gae_lambda_value": None,
                "gae_lambda_policy": None,
            },
            # the three fields the estimator reads from ClippedPGLossConfig (as its test helper notes)
            SimpleNamespace(use_kl_in_reward=True, reference_policy_kl_penalty=scale, reference_policy_kl_type="k1"),
        )
        logprobs = (-case.token_rewards / scale).to(device=device, dtype=case.torch_dtype)
        return estimator.compute_advantage(
            prompt_ids=torch.zeros(case.shape[0], 1, dtype=torch.long, device=device),
            rewards=inputs["score"],
            mask=inputs["trainable"],
            values=inputs["values"],
            reference_logprobs=torch.zeros_like(logprobs),
            logprobs=logprobs,
        )

    helpers = ", ".join(f"{m}.{n}" for m, n in extractor.loaded if (m, n) != (_MODULE, _CLASS))
    notes = [
        f"compiled from the pinned source (import needs real transformers/tensorboard/pydantic); helpers: {helpers}",
        "token rewards as -c * k1 KL with c a power of two; score placed by NeMo-RL on the last mask=1 token",
    ]
    return Loaded(run, where, notes)


def _kl_scale(case: Case) -> float:
    """The smallest power of two c >= 1 with |token_rewards| / c <= 8 at trainable positions."""
    live = case.token_rewards[case.trainable]
    peak = float(live.abs().max()) if live.numel() else 0.0
    return 2.0 ** max(0, math.ceil(math.log2(peak / _MAX_KL))) if peak > _MAX_KL else 1.0


class _Extractor:
    """Compiles top-level definitions of the checkout's own modules from their source text, one namespace per
    module, resolving each name a definition uses: another definition of the checkout (recursively), an object of
    a `_REAL_MODULES` module, or a load error naming it. Annotations are never evaluated."""

    def __init__(self, root: Path):
        self.root = root.resolve()
        self.spaces: dict[str, dict] = {}
        self.trees: dict[str, ast.Module] = {}
        self.loaded: list[tuple[str, str]] = []

    def module_file(self, module: str) -> Path | None:
        base = self.root.joinpath(*module.split("."))
        for path in (base.with_suffix(".py"), base / "__init__.py"):
            if path.is_file():
                return path
        return None

    def _tree(self, module: str) -> ast.Module:
        if module not in self.trees:
            path = self.module_file(module)
            if path is None:
                raise RuntimeError(f"{module} is not in the checkout {self.root}")
            self.trees[module] = ast.parse(path.read_text(), filename=str(path))
        return self.trees[module]

    def definitions(self, module: str) -> dict[str, ast.stmt]:
        return {
            n.name: n
            for n in self._tree(module).body
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        }

    def _assigned(self, module: str) -> set[str]:
        targets = [t for n in self._tree(module).body if isinstance(n, (ast.Assign, ast.AnnAssign))
                   for t in (n.targets if isinstance(n, ast.Assign) else [n.target])]
        return {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}

    def _imports(self, module: str) -> dict[str, tuple[str, str | None]]:
        """Top-level import bindings of `module`: local name -> (module, attribute or None)."""
        out: dict[str, tuple[str, str | None]] = {}
        package = module.rsplit(".", 1)[0] if self.module_file(module).name != "__init__.py" else module
        for node in self._tree(module).body:
            if isinstance(node, ast.Import):
                for a in node.names:
                    out[a.asname or a.name.split(".")[0]] = (a.name if a.asname else a.name.split(".")[0], None)
            elif isinstance(node, ast.ImportFrom):
                source = node.module or ""
                if node.level:
                    source = importlib.util.resolve_name("." * node.level + source, package)
                for a in node.names:
                    out[a.asname or a.name] = (source, a.name)
        return out

    def get(self, module: str, name: str):
        """The object `name` of the checkout's `module`, compiled from source on first use."""
        space = self.spaces.setdefault(module, {"__name__": f"maskfuzz.extracted.{module}", "__builtins__": builtins})
        if name in space:
            return space[name]
        node = self.definitions(module).get(name)
        if node is None:
            target = self._imports(module).get(name)
            if target is None:
                raise RuntimeError(f"{module} neither defines nor imports {name!r}")
            space[name] = self._resolve(module, name, *target)
            return space[name]
        for dep in sorted(_runtime_names(node)):
            if dep in space or hasattr(builtins, dep):
                continue
            if dep in self.definitions(module):
                self.get(module, dep)
            elif dep in self._imports(module):
                space[dep] = self._resolve(module, dep, *self._imports(module)[dep])
            elif dep in self._assigned(module):
                raise RuntimeError(f"{module}.{name} uses the module-level variable {dep!r}: refusing to guess it")
        path = self.module_file(module)
        code = compile(
            ast.Module(body=[node], type_ignores=[]),
            str(path),
            "exec",
            flags=__future__.annotations.compiler_flag,
            dont_inherit=True,
        )
        exec(code, space)  # noqa: S102 - the pinned upstream definition itself
        self.loaded.append((module, name))
        return space[name]

    def _resolve(self, module: str, name: str, source: str, attr: str | None):
        top = source.split(".")[0]
        if top in _REAL_MODULES:
            mod = importlib.import_module(source)
            return mod if attr is None else getattr(mod, attr)
        if self.module_file(source) is not None and attr is not None:
            return self.get(source, attr)
        raise RuntimeError(
            f"{module}.{name} comes from {source}{'.' + attr if attr else ''}, which is neither the checkout's own "
            f"code nor one of {_REAL_MODULES}: refusing to guess it"
        )


def _runtime_names(node: ast.AST) -> set[str]:
    """Names a definition loads at run time (annotations excluded: they are never evaluated here)."""
    names: set[str] = set()

    def visit(n: ast.AST) -> None:
        if isinstance(n, ast.arg):
            return  # only its annotation could hold names
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for d in n.decorator_list:
                visit(d)
            for d in n.args.defaults + [d for d in n.args.kw_defaults if d is not None]:
                visit(d)
            for stmt in n.body:
                visit(stmt)
            return
        if isinstance(n, ast.AnnAssign):
            for part in (n.target, n.value):
                if part is not None:
                    visit(part)
            return
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
            names.add(n.id)
        for child in ast.iter_child_nodes(n):
            visit(child)

    visit(node)
    return names

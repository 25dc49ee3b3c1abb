"""The worker side of SkyRL's discovered variants, each run through SkyRL's own registry at the pin.

`policy-loss:<name>`: `PolicyLossRegistry.get(name)` (the worker's lookup, 0.3.1 skyrl_train/workers/worker.py:611;
git main skyrl/backends/skyrl_train/workers/worker.py:840), called per micro-batch as the worker calls it
(`loss_fn(log_probs, old_log_probs, advantages, config=cfg.trainer.algorithm, loss_mask, rollout_logprobs)`, 0.3.1
worker.py:657-664, git main :988-996) and reduced over the step as the hand-written `policy-loss` entry is
(`calls_kinds.load_policy`): releases `/ accumulation steps` per micro-batch; git main the step's advantages
pre-scaled by `apply_loss_reduction_to_advantages_minibatch` and the summed loss `* dp_size`.
`adv:<name>`: `AdvantageEstimatorRegistry.get(name)` called with what `compute_advantages_and_returns` passes it
(0.3.1 skyrl_train/utils/ppo_utils.py:1087-1110): the rewards with the score on the last real token, the response
mask, the uids, `values` None, `grpo_norm_by_std`, gamma / lambd and the config at their defaults.

`config` is `cfg.trainer.algorithm` at the pin's own defaults, read from its source without importing it: the
`trainer.algorithm` block of `config/ppo_base_config.yaml` (releases) or the `AlgorithmConfig` dataclass
(git main skyrl/train/config/config.py:821-935, nested dataclasses by their default factories; __post_init__ not
run), with `policy_loss_type` the variant's name (ppo_policy_loss asserts it is "regular" or "dual_clip") and
`max_seq_len` = `calls_kinds.MAX_SEQ_LEN` where the pin leaves it unset. `rollout_logprobs` = the old log-probs:
the generator's log-probs of an on-policy step (rollout_is requires them, git main ppo_utils.py:844; with every
off-policy correction at its default None they change nothing for the others).
"""

from __future__ import annotations

import ast
import inspect
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import torch

from maskfuzz.oracles.case import Case
from maskfuzz.oracles.kinds.loss_aggregation import microbatches
from maskfuzz.targets.adapters import cov_selection
from maskfuzz.targets.adapters.base import Loaded, NotPresent, function_from
from maskfuzz.targets.adapters.loss_step import run_step
from maskfuzz.targets.adapters.selection import selection_problem
from maskfuzz.targets.skyrl.calls import import_roots
from maskfuzz.targets.skyrl.calls_kinds import MAX_SEQ_LEN, NORM_BY_STD, outcome_inputs

# what the worker passes a policy loss (0.3.1 worker.py:657-664; git main worker.py:988-996)
POLICY_REQUIRED = ("log_probs", "old_log_probs", "advantages", "config")
POLICY_ACCEPTED = (*POLICY_REQUIRED, "loss_mask", "rollout_logprobs")
# what compute_advantages_and_returns passes an estimator (0.3.1 ppo_utils.py:1101-1110): of them, an outcome
# estimator over groups needs only the rewards, the response mask and the uids
ADV_PASSED = ("token_level_rewards", "response_mask", "index", "values", "grpo_norm_by_std", "gamma", "lambd", "config")
ADV_GROUP = ("token_level_rewards", "response_mask", "index")


def policy_problem(function: str, required: tuple[str, ...], params: tuple[str, ...]) -> str:
    """Why a policy loss cannot be called as the worker calls it ("" when it can)."""
    missing = [p for p in POLICY_REQUIRED if p not in params]
    extra = [p for p in required if p not in POLICY_ACCEPTED]
    if not missing and not extra:
        return ""
    wants = "lacks " + ", ".join(missing) if missing else "requires " + ", ".join(extra)
    return f"{function}{params} is not the worker's call signature ({', '.join(POLICY_ACCEPTED)}): {wants}"


def adv_kind(required: tuple[str, ...]) -> str:
    """The kind an estimator computes, by what it requires: a critic's values (gae), a discount (returns), else
    an outcome advantage over groups."""
    if "values" in required:
        return "gae"
    if "gamma" in required:
        return "returns"
    return "group-advantage"


def adv_problem(function: str, required: tuple[str, ...]) -> str:
    """Why an estimator cannot be judged as a group advantage ("" when it can): one that requires a critic's values
    or a discount is a GAE or returns estimator (`adv_kind`), which no discovered entry calls yet (`adv:` entries are
    group advantages)."""
    critic = [p for p in required if p in ("values", "gamma", "lambd")]
    if critic:
        return (
            f"{function} requires {', '.join(critic)}: a {adv_kind(required)} estimator, which no discovered entry "
            "calls yet (adv: entries are group advantages)"
        )
    extra = [p for p in required if p not in ADV_GROUP]
    if extra:
        passed = [p for p in extra if p in ADV_PASSED]
        why = "inputs the group-advantage case does not hold" if passed else "not passed by the trainer"
        return f"{function} requires {', '.join(extra)} ({why})"
    return ""


_UTILS = ("skyrl_train.utils.ppo_utils", "skyrl.backends.skyrl_train.utils.ppo_utils")  # releases, git main


def _function(root: Path, name: str):
    """`name` from the pin's ppo_utils (the monorepo's subproject dirs put on sys.path first)."""
    for extra in reversed(import_roots(Path(root))):
        if str(extra) not in sys.path:
            sys.path.insert(0, str(extra))
    return function_from(root, [(m, name) for m in _UTILS])


_DATACLASS_CONFIGS = ("skyrl/train/config/config.py",)
_YAML_CONFIGS = ("config/ppo_base_config.yaml",)  # under the package dir


# --- cfg.trainer.algorithm at the pin's defaults, from its source ----------------------------------------------


def _scalar(text: str):
    text = text.strip()
    if not text or text in ("null", "~"):
        return None
    if text in ("true", "True"):
        return True
    if text in ("false", "False"):
        return False
    if text == "{}":
        return {}
    if text == "[]":
        return []
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
        return text[1:-1]
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text


def yaml_block(text: str, path: tuple[str, ...]) -> dict:
    """The mapping at `path` of a YAML file of nested mappings and scalars (comments dropped, list items and flow
    collections beyond {} / [] skipped): enough for SkyRL's `trainer.algorithm` block, without importing yaml
    (a stand-in in the worker)."""
    root: dict = {}
    stack: list[tuple[int, dict]] = [(-1, root)]
    for raw in text.splitlines():
        line = re.sub(r"\s+#.*$", "", raw) if not raw.lstrip().startswith("#") else ""
        if not line.strip() or line.lstrip().startswith("-"):
            continue
        indent = len(line) - len(line.lstrip())
        key, colon, value = line.strip().partition(":")
        if not colon:
            continue
        while stack and stack[-1][0] >= indent:
            stack.pop()
        parent = stack[-1][1]
        if value.strip():
            parent[key.strip()] = _scalar(value)
        else:
            parent[key.strip()] = child = {}
            stack.append((indent, child))
    node = root
    for part in path:
        node = node.get(part, {}) if isinstance(node, dict) else {}
    return node


def _dataclass_defaults(tree: ast.Module, name: str, depth: int = 0) -> dict:
    """The defaults of the dataclass `name` of `tree`: literals evaluated, `field(default_factory=Cls)` of a class of
    the same module recursed into, anything else None."""
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    out: dict = {}
    if name not in classes or depth > 4:
        return out
    for item in classes[name].body:
        if not isinstance(item, ast.AnnAssign) or not isinstance(item.target, ast.Name) or item.value is None:
            continue
        value = item.value
        if isinstance(value, ast.Call) and getattr(value.func, "id", "") == "field":
            kw = {k.arg: k.value for k in value.keywords}
            if "default_factory" in kw:
                factory = kw["default_factory"]
                fname = getattr(factory, "id", "")
                out[item.target.id] = _dataclass_defaults(tree, fname, depth + 1) if fname in classes else None
                continue
            value = kw.get("default", ast.Constant(None))
        try:
            out[item.target.id] = ast.literal_eval(value)
        except ValueError:
            out[item.target.id] = None
    return out


def _namespace(d):
    return SimpleNamespace(**{k: _namespace(v) for k, v in d.items()}) if isinstance(d, dict) and d else d


def algorithm_defaults(root: Path, package: str) -> tuple[SimpleNamespace, str]:
    """`cfg.trainer.algorithm` at the pin's defaults, and the file they were read from."""
    root = Path(root)
    for rel in _DATACLASS_CONFIGS if package.startswith("skyrl/") else ():  # git main's layout only
        path = root / rel
        if path.is_file():
            tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
            found = _dataclass_defaults(tree, "AlgorithmConfig")
            if found:
                return _namespace(found), f"{rel}::AlgorithmConfig"
    for rel in _YAML_CONFIGS:
        path = root / package / rel
        if path.is_file():
            found = yaml_block(path.read_text(encoding="utf-8", errors="replace"), ("trainer", "algorithm"))
            if found:
                return _namespace(found), f"{package}/{rel}: trainer.algorithm"
    raise NotPresent("no AlgorithmConfig dataclass or ppo_base_config.yaml at this pin to read the defaults from")


def _config(root: Path, package: str, loss_type: str) -> tuple[SimpleNamespace, str]:
    config, at = algorithm_defaults(root, package)
    config.policy_loss_type = loss_type
    if getattr(config, "max_seq_len", None) is None:
        config.max_seq_len = MAX_SEQ_LEN
    return config, at


# --- loaders -----------------------------------------------------------------------------------------------------


def _registry(root: Path, name: str):
    registry, where = _function(root, name)  # imports ppo_utils: the decorators run, the registry is complete
    return registry, where.rpartition("::")[0]


def _package_of(root: Path, where: str) -> str:
    """The package dir of the pin (`skyrl_train`, `skyrl/backends/skyrl_train`, ...) from ppo_utils' path."""
    return str(Path(where).parent.parent)


def _source(root: Path, fn) -> str:
    inner = inspect.unwrap(fn)
    file = Path(inspect.getsourcefile(inner)).resolve().relative_to(Path(root).resolve())
    return f"{file}:{inspect.getsourcelines(inner)[1]}"


def _lookup(registry, name: str, what: str):
    known = list(registry.list_available())
    if name not in known:
        raise NotPresent(f"no {what} {name!r} is registered at this pin (registered: {', '.join(known) or 'none'})")
    return registry.get(name)


def _required(fn) -> tuple[tuple[str, ...], tuple[str, ...]]:
    params = inspect.signature(inspect.unwrap(fn)).parameters
    kinds = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    named = tuple(n for n, p in params.items() if p.kind not in kinds)
    return tuple(n for n in named if params[n].default is inspect.Parameter.empty), named


def load_policy(root: Path, name: str) -> Loaded:
    registry, utils = _registry(root, "PolicyLossRegistry")
    fn = _lookup(registry, name, "policy loss")
    at = _source(root, fn)
    where = f"{at} ({inspect.unwrap(fn).__name__}, PolicyLossRegistry.get({name!r}))"
    required, named = _required(fn)
    # Clip-Cov / KL-Cov: their selection declared, the draw seeded (adapters.cov_selection), at the config's own
    # clip_cov / kl_cov defaults, which the example scripts set to the same values
    # (git a9564572e examples/train/algorithms/clip_cov_kl_cov/run_clip_cov.sh:18-20, run_kl_cov.sh:19-20; 0.3.1
    # skyrl_train/config/ppo_base_config.yaml:144-152)
    recipe = name in cov_selection.NAMES
    problem = policy_problem(inspect.unwrap(fn).__name__, required, named)
    why = problem or ("" if recipe else selection_problem(fn, root, False))
    if why:
        raise NotPresent(f"{at}: not callable outside the trainer: {why}")
    loss_fn = cov_selection.seeded(fn) if recipe else fn
    config, config_at = _config(root, _package_of(root, utils), name)
    reduce_loss, _ = _function(root, "reduce_loss")
    prescaled = "loss_reduction" not in inspect.signature(reduce_loss).parameters
    scale = _function(root, "apply_loss_reduction_to_advantages_minibatch")[0] if prescaled else None
    accepts = set(named) & set(POLICY_ACCEPTED)

    def call(logp, old, adv, mask):
        kwargs = dict(config=config, loss_mask=mask, rollout_logprobs=old)
        got = loss_fn(logp, old, adv, **{k: v for k, v in kwargs.items() if k in accepts})
        return got[0] if isinstance(got, (tuple, list)) else got

    def micro(rows, logp, mask, step):
        case = step.case
        old = case.extra["old_logp"][rows].to(device=logp.device, dtype=logp.dtype)
        if scale is None:  # releases: per micro-batch reduction, / accumulation steps (0.3.1 worker.py:691-693)
            adv = case.extra["adv"][rows].to(device=logp.device, dtype=logp.dtype)
            return call(logp, old, adv, mask) / step.rank_micro_batches
        full = case.extra["adv"].to(device=logp.device, dtype=logp.dtype)
        largest = max(len(r) for _, r in microbatches(case))
        scaled = scale(
            advantages=full,
            loss_mask=step.mask,
            loss_reduction=config.loss_reduction,
            micro_batch_size=largest,
            max_seq_len=config.max_seq_len,
            prompt_boundaries=None,
        )
        return call(logp, old, scaled[rows], mask) * step.ranks

    def run(case: Case, device: str):
        return run_step(case, device, micro, leaf_name="logp")

    _needs_no_setting(call, where)
    how = "the step's advantages pre-scaled, the summed loss * dp_size" if prescaled else "/ accumulation steps"
    notes = [
        f"discovered: @register_policy_loss -> {name!r} at {at}; invariants only (no float64 reference)",
        f"config: cfg.trainer.algorithm at the defaults of {config_at} (policy_loss_type {name!r}, loss_reduction "
        f"{config.loss_reduction!r}); rollout_logprobs = old log-probs; loss_mask float; {how}",
    ]
    if recipe:
        notes.append(f"call recipe: each call under a CPU RNG seeded {cov_selection.SEED} (adapters.cov_selection)")
    return Loaded(run, where, notes)


def _needs_no_setting(call, where: str) -> None:
    """One call on a plain valid micro-batch at the defaults: a variant that rejects them (an assertion or a
    ValueError on its config) needs a setting a user makes, listed with that reason instead of crashing on every
    case."""
    x = torch.zeros(1, 2)
    try:
        call(x, x, torch.ones(1, 2), torch.ones(1, 2))
    except (AssertionError, ValueError) as exc:
        raise NotPresent(f"{where}: needs a setting its defaults do not give: {exc}") from None
    except Exception:  # noqa: BLE001 - anything else is for the fuzzer to see and judge
        return


def load_adv(root: Path, name: str) -> Loaded:
    registry, utils = _registry(root, "AdvantageEstimatorRegistry")
    fn = _lookup(registry, name, "advantage estimator")
    at = _source(root, fn)
    where = f"{at} ({inspect.unwrap(fn).__name__}, AdvantageEstimatorRegistry.get({name!r}))"
    required, named = _required(fn)
    why = adv_problem(inspect.unwrap(fn).__name__, required) or selection_problem(fn, root, True)
    if why:
        raise NotPresent(f"{at}: not judged as a group advantage: {why}")
    config, config_at = _config(root, _package_of(root, utils), "regular")
    gamma, lambd = getattr(config, "gamma", 1.0), getattr(config, "lambd", 1.0)

    def run(case: Case, device: str):
        x = outcome_inputs(case, device)
        extra = dict(values=None, grpo_norm_by_std=case.options.get(NORM_BY_STD, True), gamma=gamma, lambd=lambd)
        adv, _ = fn(**{k: x[k] for k in ADV_GROUP}, **extra, config=config)
        return (adv,)

    notes = [
        f"discovered: @register_advantage_estimator -> {name!r} at {at}; invariants only (no float64 reference)",
        "called as compute_advantages_and_returns calls it: score on the last real response token, response_mask "
        f"= attention, index = uids, values None, grpo_norm_by_std True, gamma {gamma}, lambd {lambd}, config at "
        f"the defaults of {config_at}",
    ]
    return Loaded(run, where, notes)


def load(root: Path, entry: str) -> Loaded:
    prefix, _, name = entry.partition(":")
    if prefix == "policy-loss":
        return load_policy(root, name)
    if prefix == "adv":
        return load_adv(root, name)
    raise NotPresent(f"skyrl has no discovered entry prefix {prefix!r} (policy-loss, adv)")

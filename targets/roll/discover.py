"""ROLL's advantage estimators, read from its config dataclass at the pin by AST (no import).

ROLL has no registry: `PPOConfig.adv_estimator` is a `Literal[...]` field (git 8eb27cc2dc34
roll/configs/base_config.py:548; c09bc8bc9f43 and 090ac94658ad :509) and `compute_advantage` switches on it
(8eb27cc2dc34 roll/utils/functionals.py:1162-1177: "gae" -> compute_gae_advantage_return, "reinforce" / "grpo" /
"gigpo" / "step_reinforce" -> compute_reinforce_return, "agentic_reinforce" -> compute_agentic_reinforce_return, else
NotImplementedError), as does the agentic pipeline's `agentic_compute_advantage` (roll/pipeline/agentic/utils.py:534-
546) and its step-level reward shaping (:74, :182, :210). Every value of the Literal is a variant `adv:<value>`; the
values a hand-written entry already runs through `compute_advantage` / `agentic_compute_advantage` with a float64
reference are `COVERED`. "reinforce" has a call recipe (`RECIPES`; `calls_discovered.py`): it is the returns of the
token rewards (`compute_reinforce_return`, no critic), so it is `ret:reinforce` of kind `returns`, run through
compute_advantage's own branch with the config's default reward normalisation and judged against the invariants of
returns. The others are listed, not callable, with the reason ("no call recipe for this estimator yet" and
`compute_advantage`'s branch, with every other place of the pin that switches on the value), never left out:
"gigpo" / "step_reinforce" are shaped per step by the agentic pipeline before `compute_advantage` sees them
(utils.py:182-230), which no entry builds.
"""

from __future__ import annotations

import ast
from pathlib import Path

from maskfuzz.targets.discovery import Variant, literal_field, parse_file

PREFIXES = {"adv": "group-advantage", "ret": "returns"}  # entry prefix -> kind (values without a hand-written entry)
# the values with a call recipe (`calls_discovered.py`), invariants only: value -> (its prefix, what its branch runs)
RECIPES = {"reinforce": ("ret", "compute_reinforce_return")}
CONFIG, CLASS, FIELD = "roll/configs/base_config.py", "PPOConfig", "adv_estimator"
DISPATCH = "roll/utils/functionals.py"
ALSO = ("roll/pipeline/agentic/utils.py",)  # other places that switch on the estimator, cited in the reason
REGISTRY = "PPOConfig.adv_estimator Literal"
# value -> why it is not callable: compute_advantage runs for it the compute_reinforce_return branch `ret:reinforce`
# runs; its own math is the agentic pipeline's per-step shaping over multi-turn state no kind's case holds
# (8eb27cc2dc34 roll/pipeline/agentic/utils.py, the same lines at c09bc8bc9f43 and 090ac94658ad)
_STEPS = (
    "non_tensor_batch traj_id, step and step_scores of each turn (compute_discounted_returns, "
    "roll/pipeline/agentic/utils.py:61-94, the discounted step returns along a trajectory)"
)
STEP_SHAPED = {
    "gigpo": f"needs {_STEPS}, episode_scores (:185) and traj_group_id / state_hash (build_state_group :156-177, "
    "the anchor-state groups of step rewards): multi-turn env state the group-advantage case cannot express; "
    "compute_advantage's own branch for it is compute_reinforce_return, run by ret:reinforce",
    "step_reinforce": f"needs {_STEPS}, normalised by compute_response_level_rewards (:210-215): multi-turn env "
    "state the group-advantage case cannot express; compute_advantage's own branch for it is "
    "compute_reinforce_return, run by ret:reinforce",
}
# value -> (the hand-written entry that runs it with a reference, that entry's kind)
COVERED = {
    "gae": ("default", "gae"),  # compute_advantage, RLVR; `agentic` runs agentic_compute_advantage("gae")
    "grpo": ("grpo", "group-advantage"),  # `agentic-grpo` too
    "agentic_reinforce": ("agentic-reinforce", "returns"),
}


def _is_estimator(node: ast.AST) -> bool:
    return (isinstance(node, ast.Name) and node.id == FIELD) or (isinstance(node, ast.Attribute) and node.attr == FIELD)


def _tested(test: ast.AST) -> list[str]:
    if not (isinstance(test, ast.Compare) and _is_estimator(test.left) and len(test.comparators) == 1):
        return []
    right = test.comparators[0]
    elts = right.elts if isinstance(right, (ast.List, ast.Tuple, ast.Set)) else [right]
    return [e.value for e in elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]


def _branches(tree: ast.AST | None) -> dict[str, list[int]]:
    """value -> the lines of every `if` in `tree` that tests the estimator against it."""
    out: dict[str, list[int]] = {}
    for node in ast.walk(tree) if tree is not None else ():
        if isinstance(node, ast.If):
            for name in _tested(node.test):
                out.setdefault(name, []).append(node.lineno)
    return {k: sorted(v) for k, v in out.items()}


def _dispatcher(tree: ast.Module | None) -> tuple[int, dict[str, list[int]]]:
    """`compute_advantage`'s line (0 when absent) and the branches it has per value."""
    for node in tree.body if tree is not None else ():
        if isinstance(node, ast.FunctionDef) and node.name == "compute_advantage":
            return node.lineno, _branches(node)
    return 0, {}


def discover(root: Path) -> list[Variant]:
    """Every value of `PPOConfig.adv_estimator`'s Literal under `root`, in the order written; [] without it."""
    root = Path(root)
    config = parse_file(root / CONFIG)
    values, _ = literal_field(config, CLASS, FIELD) if config is not None else ([], 0)
    fn_line, branches = _dispatcher(parse_file(root / DISPATCH))
    also = {rel: _branches(parse_file(root / rel)) for rel in ALSO}
    out = []
    for name, line in values:
        entry, kind = COVERED.get(name, (None, PREFIXES["adv"]))
        recipe = RECIPES.get(name) if entry is None else None
        prefix, function = recipe or ("adv", "compute_advantage")
        kind = PREFIXES[prefix] if entry is None else kind
        reason = ""
        if entry is None and not (recipe and name in branches):  # a recipe runs compute_advantage's own branch
            if name in branches:
                at = f"{DISPATCH}:{branches[name][0]} (compute_advantage)"
            elif fn_line:
                at = f"{DISPATCH}:{fn_line} (compute_advantage has no branch for it: NotImplementedError)"
            else:
                at = f"{DISPATCH} (no compute_advantage found)"
            reason = f"{STEP_SHAPED.get(name, 'no call recipe for this estimator yet')}: {at}"
            elsewhere = [f"{rel}:{','.join(map(str, found[name]))}" for rel, found in also.items() if name in found]
            if elsewhere:
                reason += f"; also switched at {'; '.join(elsewhere)}"
        out.append(
            Variant(
                framework="roll",
                kind=kind,
                prefix=prefix,
                name=name,
                registry=REGISTRY,
                file=CONFIG,
                line=line,
                function=function,
                callable=entry is not None or not reason,
                reason=reason,
                covered_by=entry,
            )
        )
    return out

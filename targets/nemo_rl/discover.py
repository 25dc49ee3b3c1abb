"""NeMo-RL's config-switched variants, read from its code at the pin by AST (no import: its modules need the real
transformers, tensorboard and pydantic, see declare.py).

NeMo-RL has no registry. Two config sections switch the masked math:

- the advantage estimator, by name: `adv_estimator_name == "<name>"` in the loops' factory functions (7ea279abf
  nemo_rl/algorithms/grpo.py:2266-2297: "gdpo", "grpo", "opd", "reinforce_plus_plus"; nemo_rl/algorithms/ppo.py
  :1147-1160: "gae", "raw_reward"; each branch builds one class of nemo_rl/algorithms/advantage_estimator.py).
  Each name is a variant `adv:<name>` at the line it is compared. "grpo" (AdvEstimatorConfig's defaults, leave-one-
  out baseline and normalize_rewards) is the hand-written `grpo-loo` (`grpo` and `rloo` run its other settings),
  "gae" the entry `default`; "reinforce_plus_plus" and "raw_reward" have a call recipe (`ADV_RECIPES`, their class
  on the group-advantage inputs, invariants only, group-isolation not promised: both normalise over the whole
  batch); the others are listed with the reason (`ADV_LISTED`, by the class the branch builds), a name new upstream
  with "no call recipe for this estimator yet".
- the policy loss, by the fields of `ClippedPGLossConfig` (nemo_rl/algorithms/loss/loss_functions.py:110-161 at
  7ea), read by `ClippedPGLossFn.__init__` / `__call__`. Every field is a variant at its line: a bool the setting
  that is not its default (`loss:disable_ppo_ratio=true`), a string each value the loss compares it with
  (`__init__`'s `assert ... in (...)`, `calculate_kl`'s `kl_type == ...`: `kl:reference_policy_kl_type=k1`), any
  other field its name (a number: run at its default). A field a hand-written entry runs is `COVERED_LOSS`; a bool
  that no entry runs is an invariants-only entry (`calls_discovered.py` runs `ClippedPGLossFn` compiled from the pin
  with the field set; `KL_KEYS`, read only by the KL-to-reference term, through the `kl` entry's block), unless the
  code it guards reads `data[...]` beyond what the policy-loss case fills (`DATA_KEYS`) or it is a bound of another
  setting (`NEEDS`): those are listed with the reason. A string value with settings (`VALUE_SETTINGS`: the three
  truncated importance-sampling types at the bounds of the pin's example configs) is an invariants-only entry too,
  any other value listed. The importance-sampling entries (`ROLLOUT_FIELDS`) read the inference engine's log-probs
  apart from prev_logprobs: their `recipe` asks the policy-loss strategy for them (`Domain.rollout_logprobs`, the
  case's `rollout_logp`). A bool added upstream is fuzzed the night it lands.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from maskfuzz.oracles.domain import Domain
from maskfuzz.targets.discovery import Variant, parse_file

PREFIXES = {"adv": "group-advantage", "loss": "policy-loss", "kl": "kl"}  # entry prefix -> kind
ESTIMATORS = "nemo_rl/algorithms/advantage_estimator.py"
LOOPS = ("nemo_rl/algorithms/grpo.py", "nemo_rl/algorithms/ppo.py")
LOSS_FILES = ("nemo_rl/algorithms/loss/loss_functions.py", "nemo_rl/algorithms/loss_functions.py")
UTILS = "nemo_rl/algorithms/utils.py"
CONFIG, LOSS = "ClippedPGLossConfig", "ClippedPGLossFn"
NAME = "adv_estimator_name"
# the hand-written entry -> its kind (declare.py)
ENTRY_KIND = {"default": "gae", "grpo-loo": "group-advantage", "policy-loss": "policy-loss", "kl": "kl"}
COVERED_ADV = {"grpo": "grpo-loo", "gae": "default"}
# the class an estimator's branch builds -> why it is not judged as a group advantage
ADV_LISTED = {
    "GDPOAdvantageEstimator": "reads the reward components of repeated_batch (the reward/<name> keys) and raises "
    "ValueError below two of them (get_gdpo_reward_component_keys, 'GDPO requires multiple reward components'), "
    "beyond the group-advantage case's one score; then whitens their weighted sum over the whole batch",
    "OPDAdvantageEstimator": "requires teacher_logprobs and prev_logprobs (a token-level distillation advantage): "
    "inputs beyond what the group-advantage case holds",
}
# the class an estimator's branch builds -> its call recipe (`calls_discovered.load_estimator`): the config it is
# built with and why group-isolation is not its promise (a statistic over the whole batch, cited at 7ea279abf)
ADV_RECIPES = {
    # minus_baseline True (AdvEstimatorConfig's default, advantage_estimator.py:54 at 7ea), use_kl_in_reward False
    "ReinforcePlusPlusAdvantageEstimator": (
        {"minus_baseline": True},
        {"use_kl_in_reward": False, "reference_policy_kl_penalty": 0.0, "reference_policy_kl_type": "k3"},
        "advantages are 'globally normalized across valid tokens' (7ea279abf nemo_rl/algorithms/"
        "advantage_estimator.py:231; the batch mean and variance over mask at :262-265)",
    ),
    # normalize_advantages True: PPOConfig's default (ppo.py) and examples/configs/ppo_math_1B.yaml
    "RawRewardAdvantageEstimator": (
        {"normalize_advantages": True},
        {},
        "'Optionally normalizes across the batch' (7ea279abf nemo_rl/algorithms/advantage_estimator.py:265; the "
        "batch mean and variance over mask at :285-288, normalize_advantages True as in PPO's defaults)",
    ),
}
_ADV_MASKED = (
    "the row's advantage at every position, not masked (7ea279abf nemo_rl/algorithms/advantage_estimator.py:267, "
    ":299): the loss multiplies by the token mask"
)
# config field -> the hand-written entry that runs it with a float64 reference (its values as options or defaults)
COVERED_LOSS = {
    "token_level_loss": "policy-loss",  # option loss_fn.token_level_loss (True / False)
    "ratio_clip_min": "policy-loss",  # at its default 0.2
    "ratio_clip_max": "policy-loss",  # at its default 0.2
    "ratio_clip_c": "policy-loss",  # option loss_fn.ratio_clip_c (None / 3.0)
    "reference_policy_kl_penalty": "kl",  # the per-token term, coefficient 1
    "reference_policy_kl_type": "kl",  # option loss_fn.reference_policy_kl_type (k3, k1, k2)
    "kl_input_clamp_value": "kl",  # option (20.0 / None)
    "kl_output_clamp_value": "kl",  # option (10.0 / None)
    "use_kl_in_reward": "default",  # the GAE entry runs the KL in the reward
}
KL_KEYS = ("use_on_policy_kl_approximation",)  # read only inside `if self.reference_policy_kl_penalty != 0:`
# what `calls_kinds.load_policy` puts in the loss's data dict
DATA_KEYS = ("token_mask", "sample_mask", "advantages", "prev_logprobs", "generation_logprobs",
             "reference_policy_logprobs")  # fmt: skip
# the fields whose entries read the inference engine's log-probs (generation_logprobs) apart from prev_logprobs:
# their cases hold the policy-loss kind's `rollout_logp` (`Domain.rollout_logprobs`, `recipe`)
ROLLOUT_FIELDS = ("use_importance_sampling_correction", "truncated_importance_sampling_type")
# variant name -> its settings beyond the field, at the bounds the pin's own configs run it with (7ea279abf; __init__
# asserts truncated IS only with use_importance_sampling_correction, a positive ratio, and a ratio_min for the two
# filters, loss_functions.py:292-319)
_TIS_AT = "truncated_importance_sampling"
VALUE_SETTINGS = {
    # examples/configs/grpo_math_1B_dynamo.yaml:17-19 (ratio 2.0; ratio_min unset: 0)
    f"{_TIS_AT}_type=tis": {"use_importance_sampling_correction": True, f"{_TIS_AT}_ratio": 2.0},
    # examples/configs/prorlv2.v2.yaml:89-93 (also docs/guides/prorlv2.md:159-161)
    f"{_TIS_AT}_type=icepop": {
        "use_importance_sampling_correction": True,
        f"{_TIS_AT}_ratio": 5.0,
        f"{_TIS_AT}_ratio_min": 0.5,
    },
    # examples/configs/prorlv2_1_moe.v2.yaml:45-47 (the geometric-mean bounds)
    f"{_TIS_AT}_type=seq-mask-tis": {
        "use_importance_sampling_correction": True,
        f"{_TIS_AT}_ratio": 1.002,
        f"{_TIS_AT}_ratio_min": 0.999,
    },
}
# field -> why it is not an entry of its own
_BOUND = (
    "a bound of truncated importance sampling, read only with truncated_importance_sampling_type (7ea279abf "
    "loss_functions.py:596-668: a ratio without a type raises 'Invalid truncated importance sampling type'), run "
    "by the truncated_importance_sampling_type=<tis|icepop|seq-mask-tis> "
    "entries at the pin's example values (examples/configs/grpo_math_1B_dynamo.yaml, prorlv2.v2.yaml, "
    "prorlv2_1_moe.v2.yaml): no call recipe for other values yet"
)
NEEDS = {f"{_TIS_AT}_ratio": _BOUND, f"{_TIS_AT}_ratio_min": _BOUND}
# field -> the other fields its __init__ asserts with it (GSPO: "mutually exclusive with token-level loss")
REQUIRES = {"sequence_level_importance_ratios": {"token_level_loss": False}}


def _strs(node: ast.AST) -> list[str]:
    elts = node.elts if isinstance(node, (ast.List, ast.Tuple, ast.Set)) else [node]
    return [e.value for e in elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]


def _compared(node: ast.AST, is_subject) -> list[tuple[str, int]]:
    """The strings `subject == "x"` / `subject in ("x", ...)` compares with, anywhere under `node`, with lines."""
    out: dict[str, int] = {}
    for sub in ast.walk(node):
        if isinstance(sub, ast.Compare) and is_subject(sub.left) and isinstance(sub.ops[0], (ast.Eq, ast.In)):
            for e in sub.comparators[0].elts if hasattr(sub.comparators[0], "elts") else sub.comparators:
                if isinstance(e, ast.Constant) and isinstance(e.value, str):
                    out.setdefault(e.value, e.lineno)
    return list(out.items())


def _class(tree: ast.Module | None, name: str) -> ast.ClassDef | None:
    for node in tree.body if tree is not None else ():
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    return None


def _method(cls: ast.ClassDef | None, name: str) -> ast.FunctionDef | None:
    for node in cls.body if cls is not None else ():
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    return None


# --- advantage estimators ------------------------------------------------------------------------------------------


def _estimator_branches(tree: ast.Module | None) -> list[tuple[str, int, str]]:
    """(name, line, the class its branch builds) for every `adv_estimator_name == "<name>"` of `tree`."""
    out = []
    for node in ast.walk(tree) if tree is not None else ():
        if not (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)):
            continue
        left = node.test.left
        if not (isinstance(left, ast.Name) and left.id == NAME) or not isinstance(node.test.ops[0], ast.Eq):
            continue
        built = [
            c.func.id
            for st in node.body
            for c in ast.walk(st)
            if isinstance(c, ast.Call) and isinstance(c.func, ast.Name) and c.func.id.endswith("AdvantageEstimator")
        ]
        for name in _strs(node.test.comparators[0]):
            out.append((name, node.test.lineno, built[0] if built else ""))
    return sorted(out, key=lambda t: t[1])


def _estimators(root: Path) -> list[Variant]:
    classes = _class_lines(parse_file(root / ESTIMATORS))
    out = []
    for rel in LOOPS:
        for name, line, built in _estimator_branches(parse_file(root / rel)):
            covered = COVERED_ADV.get(name)
            at = f"{ESTIMATORS}:{classes[built]} ({built})" if built in classes else f"{rel}:{line}"
            reason = ""
            if covered is None and built not in ADV_RECIPES:
                why = ADV_LISTED.get(built, "no call recipe for this estimator yet")
                reason = f"{why}: {at}"
            out.append(
                Variant(
                    framework="nemo-rl",
                    kind=ENTRY_KIND[covered] if covered else PREFIXES["adv"],
                    prefix="adv",
                    name=name,
                    registry=f"{NAME} == ... ({Path(rel).name})",
                    file=rel,
                    line=line,
                    function=f"{built}.compute_advantage" if built else "",
                    callable=not reason,
                    reason=reason,
                    covered_by=covered,
                )
            )
    return out


def _class_lines(tree: ast.Module | None) -> dict[str, int]:
    return {n.name: n.lineno for n in (tree.body if tree is not None else ()) if isinstance(n, ast.ClassDef)}


# --- ClippedPGLossConfig fields ------------------------------------------------------------------------------------


def _attrs_of(init: ast.FunctionDef | None) -> tuple[dict[str, set[str]], dict[str, object]]:
    """config field -> the `self.<attr>` names `__init__` assigns from it (`self.x = cfg.field`, `cfg["field"]` or
    `cfg.get("field", default)`: the TypedDict configs of older pins), and the literal defaults of those `.get`s."""
    out: dict[str, set[str]] = {}
    defaults: dict[str, object] = {}
    for node in ast.walk(init) if init is not None else ():
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1):
            continue
        target = node.targets[0]
        if not (isinstance(target, ast.Attribute) and ast.unparse(target.value) == "self"):
            continue
        for sub in ast.walk(node.value):
            key = None
            if isinstance(sub, ast.Call) and ast.unparse(sub.func) == "cfg.get" and sub.args:
                key = next(iter(_strs(sub.args[0])), None)
                if key and len(sub.args) > 1 and isinstance(sub.args[1], ast.Constant):
                    defaults[key] = sub.args[1].value
            elif isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) and sub.value.id == "cfg":
                key = None if sub.attr == "get" else sub.attr
            elif isinstance(sub, ast.Subscript) and ast.unparse(sub.value) == "cfg":
                key = next(iter(_strs(sub.slice)), None)
            if key:
                out.setdefault(key, set()).add(target.attr)
    return out, defaults


def _reads_self(node: ast.AST, attrs: set[str]) -> bool:
    return any(
        isinstance(s, ast.Attribute) and s.attr in attrs and ast.unparse(s.value) == "self" for s in ast.walk(node)
    )


def _data_reads(call: ast.FunctionDef | None, attrs: set[str]) -> list[tuple[str, int]]:
    """The `data["k"]` / `"k" in data` keys read by the `if` statements of `__call__` whose test reads one of
    `attrs`, beyond `DATA_KEYS`, with the line of that `if`."""
    out: dict[str, int] = {}
    for node in ast.walk(call) if call is not None else ():
        if not (isinstance(node, ast.If) and _reads_self(node.test, attrs)):
            continue
        for sub in ast.walk(node):
            keys = []
            if isinstance(sub, ast.Subscript) and ast.unparse(sub.value) == "data":
                keys = _strs(sub.slice)
            elif isinstance(sub, ast.Compare) and isinstance(sub.ops[0], ast.In):
                if [ast.unparse(c) for c in sub.comparators] == ["data"]:
                    keys = _strs(sub.left)
            for k in keys:
                if k not in DATA_KEYS:
                    out.setdefault(k, node.lineno)
    return list(out.items())


def _fields(cls: ast.ClassDef) -> list[tuple[str, str, object, int]]:
    """(name, annotation, default, line) of every annotated field (default `...` when absent or not a literal)."""
    out = []
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            try:
                default = ast.literal_eval(node.value) if node.value is not None else ...
            except (ValueError, TypeError, SyntaxError):
                default = ...
            out.append((node.target.id, ast.unparse(node.annotation), default, node.lineno))
    return out


def _settings(field: str, annotation: str, default, choices: list[str]) -> list[str]:
    """The variant names of one field: a bool's non-default setting, a string's values, else the field itself."""
    if re.search(r"\bbool\b", annotation) or isinstance(default, bool):
        return [f"{field}={'false' if default is True else 'true'}"]
    if choices:
        return [f"{field}={c}" for c in choices]
    return [field]


def _losses(root: Path) -> list[Variant]:
    rel = next((r for r in LOSS_FILES if (root / r).is_file()), None)
    tree = parse_file(root / rel) if rel else None
    config, loss = _class(tree, CONFIG), _class(tree, LOSS)
    if config is None or loss is None:
        return []
    init, call = _method(loss, "__init__"), _method(loss, "__call__")
    attrs, get_defaults = _attrs_of(init)
    kl_chain = _compared(_function(parse_file(root / UTILS), "calculate_kl"), lambda n: ast.unparse(n) == "kl_type")
    out = []
    for field, annotation, default, line in _fields(config):
        default = get_defaults.get(field, ...) if default is ... else default
        mine = attrs.get(field, set())
        choices = [c for c, _ in _compared(loss, lambda n, a=mine: _attr_in(n, a))]
        if field == "reference_policy_kl_type":
            choices = list(dict.fromkeys([*choices, *(c for c, _ in kl_chain)]))
        covered = COVERED_LOSS.get(field)
        extra = _data_reads(call, mine)
        for name in _settings(field, annotation, default, choices):
            reason = ""
            if covered is None:
                if not mine:
                    reason = f"{LOSS}.__init__ does not read it at this pin: nothing to run"
                elif extra:
                    reads = ", ".join(f"data[{k!r}] ({rel}:{at})" for k, at in extra)
                    reason = f"reads {reads}: inputs beyond what the policy-loss case holds"
                elif field in NEEDS:
                    reason = NEEDS[field]
                elif name in VALUE_SETTINGS:
                    pass
                elif "=" not in name or name.split("=", 1)[1] not in ("true", "false"):
                    shown = "None" if default is None else "no literal" if default is ... else repr(default)
                    reason = f"a {annotation} setting (default {shown}): no call recipe for its values yet"
            prefix = "kl" if field in KL_KEYS or covered == "kl" else "loss"
            out.append(
                Variant(
                    framework="nemo-rl",
                    kind=ENTRY_KIND[covered] if covered else PREFIXES[prefix],
                    prefix=prefix,
                    name=name,
                    registry=f"{CONFIG} field",
                    file=rel,
                    line=line,
                    function=f"{LOSS}.__call__",
                    callable=covered is not None or not reason,
                    reason=reason,
                    covered_by=covered,
                )
            )
    return out


def _attr_in(node: ast.AST, attrs: set[str]) -> bool:
    return isinstance(node, ast.Attribute) and node.attr in attrs and ast.unparse(node.value) == "self"


def _function(tree: ast.Module | None, name: str) -> ast.AST:
    for node in tree.body if tree is not None else ():
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    return ast.Module(body=[], type_ignores=[])


def setting(name: str) -> dict:
    """The config a variant name sets: `use_cispo=true` -> {"use_cispo": True} plus what __init__ requires with it
    (`REQUIRES`); a string setting its value with the bounds it runs at (`VALUE_SETTINGS`)."""
    field, _, value = name.partition("=")
    if name in VALUE_SETTINGS:
        return {field: value, **VALUE_SETTINGS[name]}
    return {field: value == "true", **REQUIRES.get(field, {})}


def estimator_class(name: str) -> str:
    """The class the branch of estimator `name` builds at 7ea279abf (the recipes' key), "" when it has no recipe."""
    return _RECIPE_CLASS.get(name, "")


_RECIPE_CLASS = {
    "reinforce_plus_plus": "ReinforcePlusPlusAdvantageEstimator",
    "raw_reward": "RawRewardAdvantageEstimator",
}


def recipe(entry: str) -> dict:
    """The spec fields `entry`'s call needs declared (`targets.discovery.overrides`, `RECIPE_FIELDS`): for the
    importance-sampling correction and its truncations (`ROLLOUT_FIELDS`) an api domain whose cases hold the rollout
    engine's log-probs (`Domain.rollout_logprobs`); for an estimator with a recipe (`ADV_RECIPES`) its unmasked
    output and group-isolation not promised; nothing for the others."""
    prefix, _, name = entry.partition(":")
    if prefix == "adv" and estimator_class(name):
        why = ADV_RECIPES[estimator_class(name)][2]
        return dict(masked_zero=False, masked_zero_why=_ADV_MASKED, not_promised=(("group-isolation", why),))
    field = name.partition("=")[0]
    return {"domain": Domain(rollout_logprobs=True)} if field in ROLLOUT_FIELDS else {}


def discover(root: Path) -> list[Variant]:
    """The estimator names (grpo.py, then ppo.py, in line order), then every ClippedPGLossConfig field in order."""
    root = Path(root)
    return _estimators(root) + _losses(root)

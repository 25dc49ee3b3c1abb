"""The variants of a trainer configured by one argparse namespace, as discovered entries (framework-neutral).

For a trainer whose loss code reads `args.<option>` (a Megatron-style RL trainer), every variant is read at the pin
by AST (`argparse_variants`, no import), from the arguments file and the functions that switch on them:

* `adv:<choice>` - a choice of the advantage-estimator option, as the advantage dispatcher (the function that calls
  `get_grpo_returns` and compares the option) takes it. A choice tested in the same branch as "grpo" is callable
  through the group-advantage calls with the option set (invariants only); one with a branch of its own, or none,
  is listed with that branch's line.
* `policy:<choice>` - the same choice as `policy_loss_function` reads it: a choice it compares the option with
  (a sequence-level ratio, another loss) is callable through the policy-loss calls with the option set; a choice it
  never tests runs the code of "grpo", which the hand-written policy entry runs.
* `kl:<choice>` - a choice of the KL-estimator option (`compute_approx_kl(..., kl_loss_type=<choice>)`).
* `loss:<choice>` - a choice of the loss-type option (`loss_function` dispatches on it).
* `switch:<dest>` - a boolean option `policy_loss_function` reads (`--use-tis`, `--use-opsm`, ...): callable through
  the policy-loss calls with it turned on, unless the framework says what it needs that the kind does not hold.
* `adv-switch:<dest>` - a boolean option the advantage dispatcher reads: listed unless a hand-written entry runs it.

`Layout` is what a framework says: where its options are, which hand-written entry runs which variant
(`covered`, prefix -> name -> entry), the kinds of those entries, and why a switch cannot be called (`needs`).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from maskfuzz.targets.adapters import argparse_variants as av
from maskfuzz.targets.discovery import Variant

PREFIXES = {
    "adv": "group-advantage",
    "policy": "policy-loss",
    "kl": "kl",
    "loss": "loss-aggregation",
    "switch": "policy-loss",
    "adv-switch": "group-advantage",
}
ESTIMATOR, KL_TYPE, LOSS_TYPE = "--advantage-estimator", "--kl-loss-type", "--loss-type"
GROUP_MARK = "get_grpo_returns"  # the call that marks the advantage dispatcher
POLICY_FN, LOSS_FN = "policy_loss_function", "loss_function"
BASE_CHOICE = "grpo"  # the estimator the hand-written group-advantage and policy entries run


# the kinds of the hand-written entries slime and its fork declare alike (a covered variant takes its entry's kind)
ENTRY_KINDS = {
    "default": "gae",
    "grpo": "group-advantage",
    "reinforce++": "returns",
    "policy-loss": "policy-loss",
    "kl": "kl",
    "kl-k2": "kl",
    "kl-k3": "kl",
    "kl-low-var": "kl",
    "agg-seq-mean-token-mean": "loss-aggregation",
}


# switch dest -> the options set with it. The KL loss at the coefficient and estimator of slime's example that
# trains with it (git 624b824a8 examples/search-r1/run_qwen2.5_3B.sh:72-74: --use-kl-loss --kl-loss-coef 0.001
# --kl-loss-type low_var_kl; at the default coefficient 0 "KL divergence will only be displayed as an observation
# metric", docs/en/get_started/quick_start.md:259); --use-unbiased-kl weights that loss, read only inside
# `if args.use_kl_loss:` (slime loss.py:1116-1120 at git HEAD; miles 0.0.2 backends/training_utils/loss.py:783-787)
_KL_LOSS = {"use_kl_loss": True, "kl_loss_coef": 0.001, "kl_loss_type": "low_var_kl"}
WITH = {"use_kl_loss": _KL_LOSS, "use_unbiased_kl": _KL_LOSS}


def needs(arguments: str) -> dict[str, str]:
    """Switch dest (or "adv-switch:<dest>") -> what it needs that the kind (log-probs, old log-probs, advantages,
    the mask) does not hold; `arguments` is the arguments file whose check one reason cites."""
    teacher = "needs the teacher's log-probs (on-policy distillation): the kind draws no teacher"
    return {
        "get_mismatch_metrics": f"requires --custom-tis-function-path ({arguments}'s check), a user's function",
        "use_opd": teacher,
        "adv-switch:use_opd": teacher,
        "loss:sft_loss": "sft_loss_function is -sum_of_sample_mean(log_probs) (slime loss.py:1269 at git HEAD): the "
        "policy-loss kind's input, but a `loss:` entry is of the loss-aggregation kind, which draws per-token losses",
        "adv-switch:use_rollout_logprobs": "takes the log-probs of the reward's KL from the rollout engine: the "
        "group-advantage kind draws no log-probs (its KL is 0 at --kl-coef 0, the default)",
    }


@dataclass(frozen=True)
class Layout:
    framework: str
    package: str  # the top-level package under the checkout
    arguments: str  # the arguments file, relative to the checkout
    covered: dict[str, dict[str, str]]  # prefix -> variant name -> the hand-written entry that runs it
    kinds: dict[str, str]  # hand-written entry -> its kind
    # switch dest (or "adv-switch:<dest>") -> what it needs that the kind does not hold
    needs: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Found:
    """What the pin has: the options, and the advantage and policy dispatchers (rel, def), or None."""

    args: dict[str, av.Argument]
    advantage: tuple[str, ast.FunctionDef] | None
    policy: tuple[str, ast.FunctionDef] | None


def read(root: Path, layout: Layout) -> Found:
    root = Path(root)
    args = av.arguments(av.parse_file(root / layout.arguments))
    adv = None
    for rel, node in _defs_calling(root, layout.package, GROUP_MARK):
        if av.compared(node, "advantage_estimator"):
            adv = (rel, node)
            break
    policy = next(iter(av.function_defs(root, layout.package, POLICY_FN)), None)
    return Found(args, adv, policy)


def _defs_calling(root: Path, package: str, name: str) -> list[tuple[str, ast.FunctionDef]]:
    """Top-level defs under `root/package` that call `name` (files that mention `name(` only)."""
    out = []
    for path in sorted((root / package).rglob("*.py")):
        try:
            if f"{name}(" not in path.read_text(encoding="utf-8", errors="replace"):
                continue
        except OSError:
            continue
        tree = av.parse_file(path)
        for node in tree.body if tree is not None else ():
            if isinstance(node, ast.FunctionDef) and name in av.calls(node):
                out.append((str(path.relative_to(root)), node))
    return out


def _at(where: tuple[str, ast.FunctionDef] | None, line: int | None = None) -> str:
    if where is None:
        return "(not found at this pin)"
    rel, node = where
    return f"{rel}:{line or node.lineno} ({node.name})"


def _variant(layout: Layout, prefix: str, name: str, arg: av.Argument, line: int, function: str, reason: str):
    entry = layout.covered.get(prefix, {}).get(name)
    kind = layout.kinds.get(entry, PREFIXES[prefix]) if entry else PREFIXES[prefix]
    return Variant(
        framework=layout.framework,
        kind=kind,
        prefix=prefix,
        name=name,
        registry=f"argparse {arg.flag}" + (" choices" if arg.choices else " (store_true)"),
        file=layout.arguments,
        line=line,
        function=function,
        callable=entry is not None or not reason,
        reason="" if entry else reason,
        covered_by=entry,
    )


def _estimators(layout: Layout, found: Found) -> list[Variant]:
    arg = found.args.get(ESTIMATOR)
    if arg is None:
        return []
    out = []
    adv = av.compared(found.advantage[1], "advantage_estimator") if found.advantage else {}
    pol = av.compared(found.policy[1], "advantage_estimator") if found.policy else {}
    for name, line in arg.choices:
        comps = adv.get(name, [])
        if any(BASE_CHOICE in c.shared for c in comps):
            reason = ""
        elif comps:
            reason = f"no call recipe for this estimator yet: its own branch at {_at(found.advantage, comps[0].line)}"
        else:
            reason = f"the advantage dispatcher has no branch for it: {_at(found.advantage)}"
        out.append(_variant(layout, "adv", name, arg, line, "advantage dispatcher", reason))
    base = layout.covered.get("policy", {}).get(BASE_CHOICE)
    for name, line in arg.choices:
        v = _variant(layout, "policy", name, arg, line, POLICY_FN, "" if found.policy else f"no {POLICY_FN} here")
        if name not in pol and BASE_CHOICE not in pol and base and found.policy:  # runs the base choice's code
            v = replace(v, covered_by=base, kind=layout.kinds.get(base, v.kind), callable=True, reason="")
        out.append(v)
    return out


def _choices(layout: Layout, found: Found, flag: str, prefix: str, function: str, reason: str) -> list[Variant]:
    arg = found.args.get(flag)
    return [_variant(layout, prefix, n, arg, line, function, reason) for n, line in arg.choices] if arg else []


def _dispatched_at(root: Path, layout: Layout, name: str) -> str:
    """Where the package (its arguments file aside) first writes the string `name`: the loss-type dispatch."""
    for path in sorted((root / layout.package).rglob("*.py")):
        rel = str(path.relative_to(root))
        try:
            if rel == layout.arguments or f'"{name}"' not in path.read_text(encoding="utf-8", errors="replace"):
                continue
        except OSError:
            continue
        for sub in ast.walk(av.parse_file(path) or ast.Module(body=[], type_ignores=[])):
            if isinstance(sub, ast.Constant) and sub.value == name:
                return f"{rel}:{sub.lineno}"
    return "(no dispatch found)"


def _switches(layout: Layout, found: Found, where, prefix: str, default_reason: str) -> list[Variant]:
    if where is None:
        return []
    bools = {a.dest: a for a in found.args.values() if a.boolean}
    out = []
    for dest, line in sorted(av.reads(where[1], set(bools)).items(), key=lambda kv: kv[1]):
        arg = bools[dest]
        # a switch's reason is keyed by its dest; one of the advantage dispatcher's by "adv-switch:<dest>"
        reason = layout.needs.get(dest if prefix == "switch" else f"{prefix}:{dest}", default_reason)
        if reason:
            reason = f"{reason} (read at {_at(where, line)})"
        out.append(_variant(layout, prefix, dest, arg, arg.line, where[1].name, reason))
    return out


def discover(root: Path, layout: Layout) -> list[Variant]:
    """Every variant of the trainer's options under `root` (see the module docstring); [] at a pin without them."""
    found = read(root, layout)
    out = _estimators(layout, found)
    out += _choices(layout, found, KL_TYPE, "kl", "compute_approx_kl", "")
    for v in _choices(layout, found, LOSS_TYPE, "loss", LOSS_FN, ""):
        if v.covered_by is None:
            at = _dispatched_at(Path(root), layout, v.name)
            why = layout.needs.get(f"loss:{v.name}")
            why = f" ({why})" if why else ""
            v = replace(v, callable=False, reason=f"no call recipe for this loss type yet{why}: dispatched at {at}")
        out.append(v)
    out += _switches(layout, found, found.policy, "switch", "")
    out += _switches(layout, found, found.advantage, "adv-switch", "no call recipe for this switch of the advantage "
                     "dispatcher yet")  # fmt: skip
    return out


def defaults_read(root: Path, layout: Layout) -> dict[str, object]:
    """dest -> the literal default of every option of the arguments file: the namespace the trainer's parser gives
    when the command line sets nothing, for the worker to fill what its own namespace leaves unset (a TIS clip, an
    OPSM threshold: read by helpers the policy loss calls, not only by the policy loss itself)."""
    return {a.dest: a.default for a in read(root, layout).args.values() if a.has_default}


# the spec fields a variant takes from the hand-written entry that runs the same code (never its reference or promises)
SHARED_FIELDS = ("domain", "masked_zero", "masked_zero_why", "pipeline", "pipeline_by_pin")


def entry_fields(hand_written: dict[str, dict]) -> dict[str, dict]:
    """prefix -> the spec fields the framework's code fixes for its variants: those of the hand-written entry that
    runs the same code (`hand_written`: entry -> its declared fields; its dtypes, masked outputs, pipeline domain
    and variant), the `adv` variants grpo's, the `policy` and `switch` ones policy-loss's, `kl` the kl entry's."""
    own = {p: {k: hand_written[e][k] for k in SHARED_FIELDS} for p, e in
           (("adv", "grpo"), ("policy", "policy-loss"), ("kl", "kl"))}  # fmt: skip
    own["adv"]["variant"] = dict(hand_written["grpo"]["variant"])
    own["policy"]["variant"] = dict(hand_written["policy-loss"]["variant"])
    # a switch may turn on an importance-sampling correction (TIS, OPSM): its entries draw the rollout engine's
    # log-probs as well (`Domain.rollout_logprobs`), which a switch that reads none leaves unused
    own["switch"] = {**own["policy"], "domain": replace(own["policy"]["domain"], rollout_logprobs=True)}
    return own


def sibling_recipe(fields: dict[str, dict]) -> Callable[[str], dict]:
    """A discover module's `recipe(entry)` (`discovery.overrides`): the spec fields of the entry in `fields`, else
    those of its prefix (`entry_fields`), those of its hand-written sibling; {} for neither."""

    def recipe(entry: str) -> dict:
        return dict(fields.get(entry, fields.get(entry.partition(":")[0], {})))

    return recipe


def pinned(sibling: dict, names: tuple[str, ...], pins: tuple[str, ...]) -> dict:
    """The fields `names` of a hand-written entry's declaration `sibling`, its pipeline domain kept at `pins` only
    (each pin's own, as `TargetSpec.pipeline_at` resolves it: `pipeline_by_pin`, else `pipeline`) and None at any
    other pin: a discovered variant's step is shared with the sibling's where the code was read, not at a pin (a
    moving one, a new release) nobody read."""
    out = {k: sibling[k] for k in names if k not in ("pipeline", "pipeline_by_pin")}
    by_pin = sibling.get("pipeline_by_pin", {})
    at = {pin: by_pin.get(pin, sibling.get("pipeline")) for pin in pins}
    return out | dict(pipeline=None, pipeline_by_pin={pin: dom for pin, dom in at.items() if dom is not None})

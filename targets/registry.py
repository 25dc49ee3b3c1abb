"""The target registry: one entry per upstream framework, as data.

Each entry says where the code comes from (git URL and/or PyPI package), its named default pins
(each with the reason it is pinned), the adapter that calls it, the contract it intends, whether
it whitens inside, which heavy top-level packages may be stood in for and which must stay
missing, and the inputs its framework can express (`Domain`).

A pin is a release version (a wheel from PyPI) or a git revision. `default=True` pins form the
set `maskfuzz fuzz` runs with no target named: release pins only, so it needs no git access.
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass, field
from pathlib import Path

from maskfuzz.oracles.declared import DEFAULT_KIND, Declared
from maskfuzz.oracles.domain import Domain
from maskfuzz.oracles.options import Option, Truncation
from maskfuzz.oracles.whitening import Whitening
from maskfuzz.targets import discovery  # entries read from a framework's code at the pin


@dataclass(frozen=True)
class Pin:
    rev: str  # a release version ("0.4.1") or a git revision (hash, tag, branch)
    label: str  # why this pin
    kind: str = "release"  # "release" | "git"
    default: bool = False  # in the default fuzz set (release pins only)
    moving: bool = False  # `latest` / `main`: resolved at run time (targets.acquire)


@dataclass(frozen=True)
class TargetSpec:
    id: str
    adapter: str  # module path of the adapter, run inside the worker
    own: tuple[str, ...]  # the framework's own top-level package(s): never stood in for
    contract: str  # "compressed" | "dense": what the framework intends
    git_url: str | None = None
    package: str | None = None  # PyPI distribution name, when there are releases
    # extra `pip download` options for its release wheels, e.g. ("--python-version", "3.12") for a
    # pure-python wheel tagged for another Python; compiled wheels (torchrl) need none
    pip_args: tuple[str, ...] = ()
    pins: tuple[Pin, ...] = ()
    entries: tuple[str, ...] = ("default",)  # entry points; the first is the default
    # the entries `maskfuzz fuzz` with no target covers (a first run in minutes; `--all` covers every entry):
    # the GAE or PPO-trainer entry, the GRPO advantage and the policy loss at its default mode
    first_run: tuple[str, ...] = ()
    whitening: Whitening | None = None
    masked_zero: bool = True  # promises advantages == 0 at masked positions
    masked_zero_why: str = ""  # where it documents otherwise
    documented_errors: tuple[str, ...] = ()  # regexes over "ExcType: message"
    stand_ins: tuple[str, ...] = ()  # heavy top-level packages the math never touches
    deny: tuple[str, ...] = ()  # must stay missing even if installed
    domain: Domain = field(default_factory=Domain)  # api: what the function accepts (fuzzed)
    # pipeline: what the framework's own rollout / reward / batching code hands the function, every
    # narrowing citing file:line at the pin; None = not researched, so every finding is `reach: api`
    pipeline: Domain | None = None
    pipeline_by_pin: dict = field(default_factory=dict, hash=False)  # pin rev -> Domain where it differs
    notes: str = ""
    entry_overrides: dict = field(default_factory=dict, hash=False)  # entry -> field changes for that entry
    # the kind of masked math (shared/design/kinds.md) and its variant (oracles/kinds/<kind>/);
    # set per entry through entry_overrides: one framework has entries of several kinds
    kind: str = DEFAULT_KIND
    variant: dict = field(default_factory=dict, hash=False)
    # another entry of the framework computing the same thing (a vectorised twin of a loop): the
    # `twin` property runs both on each case and compares them (set per entry)
    twin_of: str | None = None
    # the framework's options that touch this entry's math at the pin (`oracles.options.Option`,
    # each with its citation and effect), and what it does with a row cut by the length limit
    # (None: not declared, so no truncated row is drawn for the entry); both set per entry
    options: tuple[Option, ...] = field(default=(), hash=False)
    truncation: Truncation | None = None
    score_map: tuple = ()  # a transform of the score the framework applies with no option to turn it off
    # the framework's own contract (`oracles.promises.Promise`: a docstring, config help, docs page, its own
    # test, the paper it says it implements; quoted, with file:line and the pins that say it): a finding that
    # no universal invariant covers is a defect only where one of these covers its property (set per entry)
    promises: tuple = field(default=(), hash=False)
    # False for an entry no float64 reference describes (a variant discovered at the pin, `targets.discovery`):
    # judged against the universal invariants of its kind only
    reference: bool = True
    # (property, why) the variant's design makes no promise of (`Declared.not_promised`; set per discovered entry)
    not_promised: tuple = ()

    @property
    def moving_pins(self) -> tuple[Pin, ...]:
        """The moving pins every framework has (resolved at run time, recorded in every output):
        `latest`, the newest release on PyPI, and `main`, the default branch fetched fresh. Not in
        `pins`: those are the fixed, reproducible ones."""
        out = []
        if self.package and not self.pin("latest"):
            why = "moving: the newest release on PyPI, resolved at run time"
            out.append(Pin("latest", why, "release", moving=True))
        if self.git_url and not self.pin("main"):
            why = "moving: the head of the default branch, fetched fresh at run time"
            out.append(Pin("main", why, "git", moving=True))
        return tuple(out)

    def for_entry(self, entry: str | None) -> "TargetSpec":
        """This spec with `entry_overrides[entry]` applied (entries of one framework may promise
        different things: TRL's old standalone `compute_advantages` is not its trainer block)."""
        key = entry or self.entries[0]
        if key in self.entry_overrides:
            return dataclasses.replace(self, **self.entry_overrides[key])
        found = discovery.overrides(self.id, key)
        return dataclasses.replace(self, **found) if found is not None else self

    def declared(self, entry: str | None = None, pin: str | None = None) -> Declared:
        spec = self.for_entry(entry)
        return Declared(
            contract=spec.contract,
            whitening=spec.whitening,
            masked_zero=spec.masked_zero,
            documented_errors=spec.documented_errors,
            domain=spec.domain,
            pipeline=spec.pipeline_at(pin),
            kind=spec.kind,
            variant=dict(spec.variant),
            options=tuple(spec.options),
            truncation=spec.truncation,
            score_map=tuple(spec.score_map),
            promises=tuple(p for p in spec.promises if p.at(pin)),
            reference=spec.reference,
            not_promised=tuple(spec.not_promised),
        )

    def adapter_for(self, entry: str | None) -> str:
        """The module that loads `entry`: the adapter for GAE, `<adapter>_kinds` for the entries of
        the other kinds (so the GAE adapter, which `maskfuzz repro` copies, never refers to them)."""
        key = entry or self.entries[0]
        if key not in self.entry_overrides:
            calls = discovery.calls_module(self.id, key)
            if calls is not None:  # a discovered variant: the framework's calls for discovered entries
                return calls
        kind = self.entry_overrides.get(key, {}).get("kind", DEFAULT_KIND)
        return self.adapter if kind == DEFAULT_KIND else f"{self.adapter}_kinds"  # other kinds: `<adapter>_kinds`

    def kind_of(self, entry: str | None) -> str:
        return self.for_entry(entry).kind

    def entry_name(self, entry: str | None) -> str:
        """`entry`, or the name of the default entry for None."""
        return entry or self.entries[0]

    def pipeline_at(self, pin: str | None) -> Domain | None:
        """The pipeline domain at `pin` (a rev, as named or resolved; prefixes of a hash match)."""
        if pin:
            for rev, dom in self.pipeline_by_pin.items():
                if rev == pin or (len(pin) >= 7 and (rev.startswith(pin) or pin.startswith(rev))):
                    return dom
        return self.pipeline

    @property
    def first_run_entries(self) -> tuple[str, ...]:
        """`first_run`, or the default entry alone."""
        return tuple(e for e in self.entries if e in self.first_run) or self.entries[:1]

    def pin(self, rev: str) -> Pin | None:
        return next((p for p in self.pins if p.rev == rev), None)

    @property
    def default_pins(self) -> tuple[Pin, ...]:
        return tuple(p for p in self.pins if p.default)


COMMON_HEAVY = (
    "ray",
    "vllm",
    "sglang",
    "megatron",
    "deepspeed",
    "transformers",
    "flash_attn",
    "omegaconf",
    "hydra",
    "wandb",
    "datasets",
    "accelerate",
    "peft",
    "codetiming",
)  # not tensordict: maskfuzz installs it (torchrl needs it), and verl's DataProto uses the real one

DECLARATION, CALLS = "declare", "calls"


def framework_folders(root: Path = Path(__file__).resolve().parent) -> dict[str, str]:
    """The frameworks in a folder of their own, `targets/<name>/` (the id is the folder's name with
    `-` for `_`): `declare.py` is what the fuzzer reads (`SPEC`: pins, domains, entries, options,
    citations), `calls.py` and `calls_kinds.py` what the worker runs. Found from the folders, so a
    new framework is a new folder."""
    return {
        p.name.replace("_", "-"): f"maskfuzz.targets.{p.name}.{DECLARATION}"
        for p in sorted(root.iterdir())
        if (p / f"{DECLARATION}.py").is_file()
    }


def folder_module(target_id: str, name: str, root: Path = Path(__file__).resolve().parent) -> str | None:
    """`maskfuzz.targets.<folder>.<name>` when the framework's folder holds `<name>.py` (an optional part:
    `rollout`, `upstream_recipe`), else None; the module path is built from the id, so no table names it."""
    folder = target_id.replace("-", "_")
    if not (root / folder / f"{DECLARATION}.py").is_file() or not (root / folder / f"{name}.py").is_file():
        return None
    return f"maskfuzz.targets.{folder}.{name}"


def folders_with(name: str, root: Path = Path(__file__).resolve().parent) -> tuple[str, ...]:
    """The ids of the frameworks whose folder holds `<name>.py`, sorted."""
    return tuple(t for t in framework_folders(root) if folder_module(t, name, root))


# target id -> the module that defines its SPEC (one place per target)
ADAPTER_MODULES: dict[str, str] = framework_folders()


def _calls_of(module: str) -> str:
    """The worker-side module a SPEC in `module` must name as its adapter."""
    head, _, last = module.rpartition(".")
    return f"{head}.{CALLS}" if last == DECLARATION else module


def registry() -> dict[str, TargetSpec]:
    """Every registered target, by id (declarations import no upstream code at import time)."""
    out = {}
    for target_id, module in ADAPTER_MODULES.items():
        spec = importlib.import_module(module).SPEC
        if spec.id != target_id or spec.adapter != _calls_of(module):
            raise RuntimeError(
                f"{module}.SPEC says id={spec.id!r} adapter={spec.adapter!r}; expected {target_id!r}, "
                f"{_calls_of(module)!r}"
            )
        out[target_id] = spec
    return out


def get(target_id: str) -> TargetSpec:
    """The spec of `target_id`; KeyError naming the known targets otherwise."""
    if target_id not in ADAPTER_MODULES:
        known = ", ".join(sorted(ADAPTER_MODULES))
        raise KeyError(f"unknown target {target_id!r}; known targets: {known}")
    return registry()[target_id]

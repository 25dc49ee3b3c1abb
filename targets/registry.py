"""The target registry: one entry per upstream framework, as data.

Each entry says where the code comes from (git URL and/or PyPI package), its named default pins
(each with the reason it is pinned), the adapter that calls it, the contract it intends, whether
it whitens inside, which heavy top-level packages may be stood in for and which must stay
missing, and the inputs its framework can express (`Domain`).

A pin is a release version (a wheel from PyPI) or a git revision. `default=True` pins form the
set `maskfuzz fuzz` runs with no target named: release pins only, so it needs no git access.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from oracles.domain import Domain
from oracles.properties import Declared
from oracles.reference import Whitening


@dataclass(frozen=True)
class Pin:
    rev: str  # a release version ("0.4.1") or a git revision (hash, tag, branch)
    label: str  # why this pin
    kind: str = "release"  # "release" | "git"
    default: bool = False  # in the default fuzz set (release pins only)


@dataclass(frozen=True)
class TargetSpec:
    id: str
    adapter: str  # module path of the adapter, run inside the worker
    own: tuple[str, ...]  # the framework's own top-level package(s): never stood in for
    contract: str  # "compressed" | "dense": what the framework intends
    git_url: str | None = None
    package: str | None = None  # PyPI distribution name, when there are releases
    pins: tuple[Pin, ...] = ()
    entries: tuple[str, ...] = ("default",)  # entry points; the first is the default
    whitening: Whitening | None = None
    masked_zero: bool = True  # promises advantages == 0 at masked positions
    masked_zero_why: str = ""  # where it documents otherwise
    documented_errors: tuple[str, ...] = ()  # regexes over "ExcType: message"
    stand_ins: tuple[str, ...] = ()  # heavy top-level packages the math never touches
    deny: tuple[str, ...] = ()  # must stay missing even if installed
    domain: Domain = field(default_factory=Domain)
    notes: str = ""

    def declared(self) -> Declared:
        return Declared(
            contract=self.contract,
            whitening=self.whitening,
            masked_zero=self.masked_zero,
            documented_errors=self.documented_errors,
            domain=self.domain,
        )

    def pin(self, rev: str) -> Pin | None:
        return next((p for p in self.pins if p.rev == rev), None)

    @property
    def default_pins(self) -> tuple[Pin, ...]:
        return tuple(p for p in self.pins if p.default)


_COMMON_HEAVY = (
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
    "tensordict",
)

REGISTRY: dict[str, TargetSpec] = {}


def register(spec: TargetSpec) -> TargetSpec:
    if spec.id in REGISTRY:
        raise ValueError(f"target {spec.id!r} registered twice")
    REGISTRY[spec.id] = spec
    return spec


def get(target_id: str) -> TargetSpec:
    try:
        return REGISTRY[target_id]
    except KeyError:
        known = ", ".join(sorted(REGISTRY))
        raise KeyError(f"unknown target {target_id!r}; known targets: {known}") from None


# ---------------------------------------------------------------------------------------------
# Entries. Each block is owned by its adapter (targets/adapters/<name>.py).
# ---------------------------------------------------------------------------------------------
# BEGIN verl
register(
    TargetSpec(
        id="verl",
        adapter="targets.adapters.verl",
        own=("verl",),
        contract="compressed",
        git_url="https://github.com/volcengine/verl.git",
        package="verl",
        pins=(
            Pin("0.4.1", "last 0.4 release", default=True),
            Pin("0.9.1", "newest release", default=True),
        ),
        whitening=Whitening(unbiased=True, eps=1e-8),
        stand_ins=_COMMON_HEAVY,
        deny=("torch_npu",),
    )
)
# END verl

# BEGIN openrlhf
register(
    TargetSpec(
        id="openrlhf",
        adapter="targets.adapters.openrlhf",
        own=("openrlhf",),
        contract="dense",
        git_url="https://github.com/OpenRLHF/OpenRLHF.git",
        package="openrlhf",
        pins=(Pin("0.11.2", "newest release", default=True),),
        stand_ins=_COMMON_HEAVY,
    )
)
# END openrlhf

# BEGIN miles
register(
    TargetSpec(
        id="miles",
        adapter="targets.adapters.miles",
        own=("miles",),
        contract="compressed",
        git_url="https://github.com/radixark/miles.git",
        package="miles-rl",
        pins=(
            Pin("0.0.2", "only usable release (May 2026), old location miles/utils/ppo_utils.py", default=True),
            Pin("3d2e0e411", "PR #1827: run PPO GAE over trainable tokens only", kind="git"),
        ),
        stand_ins=_COMMON_HEAVY,
        deny=("fla",),
    )
)
# END miles

# BEGIN slime
register(
    TargetSpec(
        id="slime",
        adapter="targets.adapters.slime",
        own=("slime",),
        contract="compressed",
        git_url="https://github.com/THUDM/slime.git",
        stand_ins=_COMMON_HEAVY,
        deny=("fla",),
    )
)
# END slime

# BEGIN roll
register(
    TargetSpec(
        id="roll",
        adapter="targets.adapters.roll",
        own=("roll",),
        contract="dense",
        git_url="https://github.com/alibaba/ROLL.git",
        pins=(Pin("c09bc8bc9f43", "the seed report 000: masked critic values bootstrap", kind="git"),),
        entries=("default", "agentic"),
        stand_ins=_COMMON_HEAVY,
    )
)
# END roll

# BEGIN trl
register(
    TargetSpec(
        id="trl",
        adapter="targets.adapters.trl",
        own=("trl",),
        contract="dense",
        git_url="https://github.com/huggingface/trl.git",
        package="trl",
        stand_ins=_COMMON_HEAVY,
    )
)
# END trl

# BEGIN nemo-rl
register(
    TargetSpec(
        id="nemo-rl",
        adapter="targets.adapters.nemo_rl",
        own=("nemo_rl",),
        contract="compressed",
        git_url="https://github.com/NVIDIA-NeMo/RL.git",
        stand_ins=_COMMON_HEAVY,
    )
)
# END nemo-rl

# BEGIN areal
register(
    TargetSpec(
        id="areal",
        adapter="targets.adapters.areal",
        own=("areal",),
        contract="dense",
        git_url="https://github.com/inclusionAI/AReaL.git",
        package="areal",
        stand_ins=_COMMON_HEAVY,
    )
)
# END areal

# BEGIN skyrl
register(
    TargetSpec(
        id="skyrl",
        adapter="targets.adapters.skyrl",
        own=("skyrl", "skyrl_train"),
        contract="compressed",
        git_url="https://github.com/NovaSky-AI/SkyRL.git",
        package="skyrl-train",
        stand_ins=_COMMON_HEAVY,
    )
)
# END skyrl

# BEGIN torchrl
register(
    TargetSpec(
        id="torchrl",
        adapter="targets.adapters.torchrl",
        own=("torchrl",),
        contract="dense",
        git_url="https://github.com/pytorch/rl.git",
        package="torchrl",
        entries=("default", "vec"),
    )
)
# END torchrl

"""AReaL's GAE entries as the worker calls them: `PPOActor._compute_advantages(data)` (1.0.x, git main;
`compute_advantages` at 0.3 - 0.5), compiled from the pin's source with `self` a namespace of the attributes it reads,
on AReaL's padded batch dict [B, P + T] (`_data`; the layout is in the module docstring of `declare.py`), with
`KLEstimator` compiled from `areal/utils/data.py`. The declaration (pins, domains, entries, options, citations) is
`targets/areal/declare.py`; the other kinds' calls are `calls_kinds.py`."""

from __future__ import annotations

import ast
import types
from pathlib import Path

import torch

from maskfuzz.oracles.case import Case
from maskfuzz.targets.adapters.base import Loaded, NotPresent
from maskfuzz.targets.adapters.extract import BlockNotFound, SourceTree, find_class, find_gae_loop, find_method

PACKAGES = ("areal",)  # the framework's own packages: followed in its source, never imported
PROMPT = 2  # prompt tokens before the response window
KL_CLAMP = 10.0  # KLEstimator clamps the log-ratio to [-10, 10]; token rewards are scaled inside it
METHODS: tuple[tuple[str, str], ...] = (  # (file, method of PPOActor) in the order they are looked at
    ("areal/trainer/ppo/actor.py", "_compute_advantages"),
    ("areal/engine/ppo/actor.py", "_compute_advantages"),
    ("areal/engine/ppo/actor.py", "compute_advantages"),
)
SELF_SET = (
    "config",
    "reward_bias",
    "reward_scaling",
    "reward_clip",
    "reward_norm",
    "kl_ctl",
    "kl_estimator",
    "mask_no_eos_with_zero",
    "discount",
    "gae_lambda",
    "adv_norm",
    # the AReaL-lite layout (094adbb6c, #154) until the Normalization refactor (#303): group norms off
    "group_reward_norm",
    "group_adv_norm",
    "group_size",
    # turn-level GAE and per-trajectory lambdas (2026): off, the token-level GAE with a static lambda
    "gae_timestep_unit",
    "_gae_lambda_is_custom",
    "_compute_gae_lambda",
)
# read only inside `if self.config.overlong_reward_penalty:` (False here)
CONFIG_SET = (
    "overlong_reward_penalty",
    "overlong_tokens",
    "overlong_penalty_factor",
    "max_new_tokens",
    "use_decoupled_loss",
    "recompute_logprob",
)

# the defaults the call reads (a plain dict, so a standalone repro script copies no Option)
OPTION_DEFAULTS = {
    "actor.reward_bias": 0.0,
    "actor.reward_scaling": 1.0,
    "actor.reward_clip": 20.0,
    "actor.mask_no_eos_with_zero": False,
}
# config.kl_ctl's default (1.0.4 areal/api/cli_args.py:1522): the default-kl entry's coefficient (declare.py
# cites the method's KL reward chain)
KL_CTL = 0.1


def load(root: Path, entry: str | None) -> Loaded:
    if entry not in (None, "", "default", "default-kl"):
        raise ValueError(f"the GAE adapter loads 'default' and 'default-kl'; {entry!r} loads from calls_kinds")
    with_kl = entry == "default-kl"  # logprobs / ref_logp from the case's logp / ref_logp, kl_ctl = KL_CTL
    tree = SourceTree(Path(root), PACKAGES)
    path, method = _locate(tree)
    rel = tree.rel(path)
    _check_reads(rel, method)
    fn = tree.function(path, method)
    # before #408 (a80d33f05, Sep 2025) the method computes the KL reward inline, -kl_ctl * (old - ref), and has
    # no self.kl_estimator: that layout loads too, so a bisection across it does not fall into skips
    reads_estimator = any(
        isinstance(n, ast.Attribute)
        and n.attr == "kl_estimator"
        and isinstance(n.value, ast.Name)
        and n.value.id == "self"
        for n in ast.walk(method)
    )
    kl_estimator = None
    if reads_estimator:
        ns = tree.resolve(path, ["KLEstimator"])
        if "KLEstimator" not in ns:
            why = tree.unresolved.get(f"{rel}::KLEstimator", "not imported by the module")
            raise BlockNotFound(f"areal: {rel} has no KLEstimator to build self.kl_estimator from ({why})")
        kl_estimator = ns["KLEstimator"]("k1")

    def run(case: Case, device: str) -> tuple[torch.Tensor, torch.Tensor]:
        data, kl_ctl = _data(case, device, kl=with_kl)
        me = _self(case, kl_estimator, kl_ctl)
        out = fn(me, data)
        out = data if out is None else out  # 0.3 - 0.5 mutate `data` and return None
        cols = slice(PROMPT - 1, PROMPT - 1 + case.shape[1])
        adv = out["advantages"][:, cols]
        if "returns" not in out:  # the AReaL-lite layout stores no returns: the GAE identity A + V
            return adv, adv + out["values"][:, cols].to(adv.dtype)
        return adv, out["returns"][:, cols]

    notes = [
        f"{rel}::PPOActor.{method.name} (line {method.lineno}) compiled from source, decorators dropped, "
        "called with self = namespace of: " + ", ".join(SELF_SET),
        (
            "self.kl_estimator = KLEstimator('k1') compiled from " + tree.provenance.get(_kl_key(tree), "source")
            if reads_estimator
            else "the KL reward is inline at this pin (-kl_ctl * (old_logp - ref_logp)); no KLEstimator"
        ),
        f"data: prompt of {PROMPT} tokens + window (L = {PROMPT} + T); window k = rolled index {PROMPT - 1} + k; the "
        "bootstrap value at the index of the last real token of full-width and truncated rows",
        (
            f"KL in the reward: logprobs[:, {PROMPT} + k] = logp[k], ref_logp[:, {PROMPT - 1} + k] = ref_logp[k] "
            f"(0 on the prompt), kl_ctl = {KL_CTL}; the case's token rewards (0 in the domain) are not read"
            if with_kl
            else "token rewards as ref_logp = token_rewards / kl_ctl with logprobs 0 (kl_ctl a power of two)"
        ),
        "helpers compiled from source: " + ", ".join(sorted(tree.provenance)),
    ]
    if tree.unresolved:
        notes.append("unresolved (unused) names: " + "; ".join(f"{k}: {v}" for k, v in sorted(tree.unresolved.items())))
    return Loaded(run, f"{rel}::PPOActor.{method.name}", notes)


def _kl_key(tree: SourceTree) -> str:
    keys = [k for k in sorted(tree.provenance) if k.endswith("::KLEstimator") and "(ClassDef)" in tree.provenance[k]]
    return keys[0] if keys else ""


def _locate(tree: SourceTree) -> tuple[Path, ast.FunctionDef]:
    """The PPOActor method holding the GAE loop; NotPresent when there is no PPOActor with an
    advantage method, BlockNotFound when there is one but the loop is not in it."""
    seen = []
    for rel, name in METHODS:
        path = Path(tree.root, rel)
        if not path.is_file():
            continue
        cls = find_class(tree.file(path).tree, "PPOActor")
        method = find_method(cls, name) if cls is not None else None
        if method is None:
            continue
        seen.append(f"{rel}::PPOActor.{name}")
        if find_gae_loop(method) is not None or _delegated_gae(tree, path, method) is not None:
            return path, method
    if not seen:
        looked = ", ".join(f"{rel}::PPOActor.{name}" for rel, name in METHODS)
        raise NotPresent(f"no PPOActor advantage method at this pin; looked for {looked}")
    raise BlockNotFound(
        f"areal: {', '.join(seen)} exist(s) but none holds the GAE loop (`for t in reversed(range(...))` assigning "
        "lastgaelam); the adapter must learn the new shape before this pin can be tested"
    )


def _delegated_gae(tree: SourceTree, path: Path, method: ast.FunctionDef) -> str | None:
    """The module-level function of `path` that `method` calls and that holds the GAE loop (AReaL
    2026 moved it into `_compute_token_level_gae`), or None."""
    module = tree.file(path).tree
    defs = {n.name: n for n in module.body if isinstance(n, ast.FunctionDef)}
    imported = {
        a.asname or a.name: (node.module, a.name)
        for node in module.body
        if isinstance(node, ast.ImportFrom) and node.module
        for a in node.names
    }
    for n in ast.walk(method):
        if not (isinstance(n, ast.Call) and isinstance(n.func, ast.Name)):
            continue
        func = defs.get(n.func.id)
        if func is None and n.func.id in imported:  # from areal.trainer.ppo.gae import _compute_token_level_gae
            mod, name = imported[n.func.id]
            other = tree.module_file(mod)
            if other is not None:
                func = next(
                    (d for d in tree.file(other).tree.body if isinstance(d, ast.FunctionDef) and d.name == name), None
                )
        if func is not None and find_gae_loop(func) is not None:
            return n.func.id
    return None


def _check_reads(rel: str, method: ast.FunctionDef) -> None:
    """Fail loudly when the method reads an attribute of self the adapter does not provide."""
    reads, config = set(), set()
    for n in ast.walk(method):
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self":
            reads.add(n.attr)
        if (
            isinstance(n, ast.Attribute)
            and isinstance(n.value, ast.Attribute)
            and n.value.attr == "config"
            and isinstance(n.value.value, ast.Name)
            and n.value.value.id == "self"
        ):
            config.add(n.attr)
    unknown = sorted(reads - set(SELF_SET)) + [f"config.{c}" for c in sorted(config - set(CONFIG_SET))]
    if unknown:
        reads = ", ".join(f"self.{u}" for u in unknown)
        raise BlockNotFound(f"areal: {rel}::PPOActor.{method.name} reads {reads}, which the adapter does not set")


def _self(case: Case, kl_estimator, kl_ctl: float) -> types.SimpleNamespace:
    """The actor's attributes as `PPOActor.__init__` derives them from the config (the case's options over
    PPOActorConfig's defaults)."""
    opt = {name: case.options.get(name, default) for name, default in OPTION_DEFAULTS.items()}
    config = types.SimpleNamespace(
        overlong_reward_penalty=False,
        overlong_tokens=None,
        overlong_penalty_factor=None,
        max_new_tokens=None,
        use_decoupled_loss=False,
        recompute_logprob=False,
    )
    return types.SimpleNamespace(
        config=config,
        reward_bias=opt["actor.reward_bias"],
        reward_scaling=opt["actor.reward_scaling"],
        reward_clip=opt["actor.reward_clip"],
        reward_norm=None,
        kl_ctl=kl_ctl,
        kl_estimator=kl_estimator,
        mask_no_eos_with_zero=opt["actor.mask_no_eos_with_zero"],
        discount=case.gamma,
        gae_lambda=case.lam,
        adv_norm=None,
        group_reward_norm=False,
        group_adv_norm=False,
        group_size=1,
        gae_timestep_unit="token",
        _gae_lambda_is_custom=False,
        _compute_gae_lambda=None,
    )


def kl_scale(token_rewards: torch.Tensor, trainable: torch.Tensor) -> float:
    """The smallest power of two >= 1 with |token_rewards| / scale <= KL_CLAMP at trainable
    positions (masked ones are zeroed by AReaL before the clamp)."""
    live = token_rewards[trainable.bool() & torch.isfinite(token_rewards)]
    top = float(live.abs().max()) if live.numel() else 0.0
    scale = 1.0
    while top / scale > KL_CLAMP:
        scale *= 2.0
    return scale


def _data(case: Case, device: str, kl: bool = False) -> tuple[dict, float]:
    """AReaL's padded batch dict for `case` (see the module docstring) and the kl_ctl it needs. With `kl`, the
    log-probs are the case's logp (token coordinates, the method rolls them) and ref_logp (log-prob coordinates),
    0 on the prompt and padding, and kl_ctl is KL_CTL: the method's KL reward is the whole token reward."""
    if case.attention.any(dim=1).logical_and(~case.attention[:, 0]).any():
        raise ValueError("AReaL cannot express a left-padded response window (outside its domain)")
    x = case.inputs(device)
    b_rows, t_len = case.shape
    length = PROMPT + t_len  # the batch is as wide as its longest row: prompt + window
    win = slice(PROMPT, length)  # token coordinates of the window
    rolled = slice(PROMPT - 1, length - 1)  # log-prob / value coordinates of the window
    att = torch.zeros(b_rows, length, dtype=torch.bool, device=device)
    att[:, :PROMPT] = True
    att[:, win] = case.attention.to(device)
    loss_mask = torch.zeros(b_rows, length, dtype=torch.int32, device=device)
    loss_mask[:, win] = case.trainable.to(device=device, dtype=torch.int32)
    scale = kl_scale(case.token_rewards, case.trainable)
    ref_logp = torch.zeros(b_rows, length, dtype=torch.float32, device=device)
    ref_logp[:, rolled] = x["token_rewards"].float() / scale
    values = torch.zeros(b_rows, length, dtype=case.torch_dtype, device=device)
    values[:, rolled] = x["values"]
    # the critic value of the state after each row's last real token sits at that token's index: the last column
    # for a row as wide as the batch, the row's first padding slot otherwise (padding stays 0.0 past it)
    boot = case.bootstrap_values().to(device=device, dtype=case.torch_dtype)
    full = case.attention[:, -1].to(device)
    values[:, length - 1] = torch.where(full, boot, torch.zeros_like(boot))
    cut = case.truncated_rows().to(device) & ~full
    if bool(cut.any()):
        last = PROMPT + case.attention.to(device).sum(dim=1) - 1  # index of the last real token
        rows = cut.nonzero().flatten()
        values[rows, last[rows]] = boot[rows]
    logprobs = torch.zeros(b_rows, length, dtype=torch.float32, device=device)
    if kl:
        scale = KL_CTL
        logprobs[:, win] = case.extra["logp"].to(device=device, dtype=case.torch_dtype).float()
        ref_logp[:, rolled] = case.extra["ref_logp"].to(device=device, dtype=case.torch_dtype).float()
    data = {
        "input_ids": att.long(),
        "attention_mask": att,
        "loss_mask": loss_mask,
        "logprobs": logprobs,
        "ref_logp": ref_logp,
        "values": values,
        # float32 whatever the case's dtype: every workflow builds torch.tensor(reward, dtype=torch.float32)
        # (areal/workflow/rlvr.py:176, multi_turn.py:132 at 4aef98d8d818; :178 / :134 at cbff54d64)
        "rewards": x["score"].float(),
    }
    return data, scale

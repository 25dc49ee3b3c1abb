"""Discovered variants (`targets.discovery`): verl's registered policy losses read from the checkout by AST, made
entries of the `policy-loss` kind and judged against its universal invariants only, never the reference; a
variant that a new upstream commit registers is discovered and fuzzed without a change to maskfuzz."""

from __future__ import annotations

import json
import textwrap

import git
import pytest
import torch
from discovery_nights import VERL_ACTOR as _ACTOR
from discovery_nights import VERL_CORE as _CORE
from discovery_nights import commit, job

from maskfuzz.fuzz.commands import fuzz as fuzz_cmd
from maskfuzz.fuzz.report import write_report
from maskfuzz.oracles.declared import Declared
from maskfuzz.oracles.kinds import judge as kinds_judge
from maskfuzz.oracles.kinds import policy_loss
from maskfuzz.oracles.kinds.judge import judge
from maskfuzz.targets import discovery
from maskfuzz.targets.registry import get
from maskfuzz.targets.runtime.session import open_target, parse_ref

# -- a fake verl tree (discovery_nights.VERL_CORE, VERL_ACTOR); a second commit adds a third loss --------------
_LEAKY = '''

@register_policy_loss("leaky")
def compute_policy_loss_leaky(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
                              config=None, rollout_is_weights=None):
    """Mask-blind: every position enters the numerator (a masked log-prob reaches the loss)."""
    ratio = torch.exp(log_prob - old_log_prob)
    n = config.global_batch_info["batch_num_tokens"]
    return (-advantages * ratio).sum() / n * config.global_batch_info["dp_size"], {}
'''


@pytest.fixture
def fake_verl(tmp_path, monkeypatch):
    """A git repository of a fake verl: night 1 registers vanilla, plain_pg and needs_values; night 2 adds leaky."""
    monkeypatch.setenv("MASKFUZZ_CACHE", str(tmp_path / "cache"))
    repo = git.Repo.init(tmp_path / "verl")
    inits = {f"{p}/__init__.py": "" for p in ("verl", "verl/trainer", "verl/trainer/ppo", "verl/workers",
                                             "verl/workers/config")}  # fmt: skip
    core = "verl/trainer/ppo/core_algos.py"
    commit(repo, {**inits, core: _CORE, "verl/workers/config/actor.py": _ACTOR}, "night 1", 1)
    return {"verl": tmp_path / "verl"}, repo


def _poisoned_case():
    from maskfuzz.oracles.case import Case

    extra = {"logp": [[-0.5, 3.0]], "old_logp": [[-0.4, -1.0]], "adv": [[1.0, 2.0]]}
    return Case.build(trainable=[[1, 0]], extra=extra, dtype="float64")


def test_a_policy_loss_registered_upstream_is_discovered_and_fuzzed_the_next_night(fake_verl, tmp_path):
    repos, repo = fake_verl
    nights = []
    for day in (1, 2):  # the moving pin HEAD, read each night after the code is acquired
        if day == 2:
            commit(repo, {"verl/trainer/ppo/core_algos.py": _CORE + _LEAKY}, "register the leaky policy loss", 2)
        found = fuzz_cmd._discover(["verl@HEAD"], [], repos)
        payload = {"profile": "nightly", "targets": [], "discovered": found}  # what `maskfuzz fuzz --json` writes
        (tmp_path / f"night{day}.json").write_text(json.dumps(payload))
        nights.append(found["verl@HEAD"])
    first, second = nights
    night1, night2 = first["resolved"], second["resolved"]
    assert night1 != night2 == repo.head.commit.hexsha
    names = [v["name"] for v in first["variants"]]
    assert names == ["vanilla", "plain_pg", "needs_values"]
    by_name = {v["name"]: v for v in second["variants"]}
    assert by_name["vanilla"]["covered_by"] == "policy-loss" and by_name["vanilla"]["judged"] == "reference"
    assert by_name["leaky"]["at"].startswith("verl/trainer/ppo/core_algos.py:") and by_name["leaky"]["callable"]
    assert not by_name["needs_values"]["callable"] and "values" in by_name["needs_values"]["reason"]
    # the hand-written entry keeps vanilla; the others are entries, the uncallable one too (a skip with its reason)
    assert second["labels"] == [f"verl:policy-loss:{n}@HEAD" for n in ("plain_pg", "needs_values", "leaky")]
    # the nightly report says what appeared since the previous night
    write_report([tmp_path / "night1.json"], tmp_path / "r1", now="2026-01-01 00:00")
    _, cmp = write_report([tmp_path / "night2.json"], tmp_path / "r2", previous=[tmp_path / "r1" / "report.json"],
                          now="2026-01-02 00:00")  # fmt: skip
    assert [(w, c, v["entry"]) for w, c, v in cmp.variants] == [("verl@HEAD", "appeared", "policy-loss:leaky")]
    report = json.loads((tmp_path / "r2" / "report.json").read_text())
    assert report["variant_changes"][0]["entry"] == "policy-loss:leaky"

    # the new variant is judged as the fuzzer judges it, without a change to maskfuzz: a masked log-prob leaks
    leaky = next(label for label in second["labels"] if ":leaky@" in label)
    with open_target(leaky, repos=repos, timeout=30) as handle:
        assert handle.resolved == night2
        assert handle.declared.reference is False and "compute_policy_loss_leaky" in handle.info["where"]
        verdicts = {v.property: v for v in judge(handle.run, _poisoned_case(), handle.declared)}
    assert verdicts["poison"].failed and verdicts["reference"].status == "n/a"
    assert "invariants only" in verdicts["reference"].message

    plain = fuzz_cmd.run_job(job(f"verl:policy-loss:plain_pg@{night2}", repos, examples=15))
    assert plain.status == "ok" and plain.judged == "invariants only", plain.reason
    assert plain.kind == "policy-loss" and plain.checked["reference"] == 0
    assert plain.checked["poison"] > 0 and plain.checked["permutation"] > 0 and not plain.findings

    skipped = fuzz_cmd.run_job(job(f"verl:policy-loss:needs_values@{night2}", repos, examples=15))
    assert skipped.status == "skipped" and "not the common signature" in skipped.reason
    gone = fuzz_cmd.run_job(job(f"verl:policy-loss:leaky@{night1}", repos, examples=15))  # not registered on night 1
    assert gone.status == "skipped" and "no policy loss 'leaky' is registered" in gone.reason


def test_a_discovered_entry_parses_and_declares_no_reference():
    ref = parse_ref("verl:policy-loss:anything@0.9.1")
    assert ref.entry == "policy-loss:anything"
    spec = get("verl")
    declared = spec.declared(ref.entry, ref.pin)
    assert declared.kind == "policy-loss" and declared.reference is False and declared.promises == ()
    assert spec.adapter_for(ref.entry) == "maskfuzz.targets.verl.calls_discovered"
    assert spec.declared("policy-loss").reference is True  # the hand-written entry keeps its reference
    with pytest.raises(ValueError, match="no entry"):
        parse_ref("verl:no-such-prefix:x@0.9.1")


def test_invariants_only_never_runs_the_reference(monkeypatch):
    """A loss twice verl's vanilla one breaks no invariant; with reference=False the judge never computes the
    reference and says `reference` is not judged (n/a), where the same run fails it with a reference."""
    from maskfuzz.oracles.case import Case

    real = policy_loss.reference

    def doubled(case: Case):
        ref = real(case, {})
        return ref["loss"] * 2, ref["grad"] * 2

    gen = torch.Generator().manual_seed(0)
    trainable = torch.rand(3, 5, generator=gen) > 0.3
    trainable[:, 0] = True
    extra = {n: torch.randn(3, 5, generator=gen, dtype=torch.float64) * 0.1 for n in ("logp", "old_logp", "adv")}
    case = Case.build(trainable=trainable, extra=extra, dtype="float64")
    with_ref = {v.property: v for v in kinds_judge.judge(doubled, case, Declared(kind="policy-loss"))}
    assert with_ref["reference"].failed

    def forbidden(*args, **kwargs):
        raise AssertionError("the reference ran for an invariants-only entry")

    monkeypatch.setattr(policy_loss, "reference", forbidden)
    verdicts = {v.property: v for v in kinds_judge.judge(doubled, case, Declared(kind="policy-loss", reference=False))}
    assert verdicts["reference"].status == "n/a" and "invariants only" in verdicts["reference"].message
    assert all(verdicts[p].status == "pass" for p in ("no-crash", "poison", "pad-invariance", "permutation",
                                                       "deterministic")), verdicts  # fmt: skip


@pytest.mark.network
def test_verl_release_policy_losses_are_discovered_from_the_wheel():
    from maskfuzz.targets.runtime.acquire import acquire

    checkout = acquire(get("verl"), "0.9.1")
    variants = discovery.discover("verl", checkout.root)
    found = {v.name: v for v in variants if v.prefix == "policy-loss"}
    assert {"vanilla", "gspo", "sapo", "gpg", "clip_cov", "kl_cov", "geo_mean", "dro", "cispo"} <= set(found)
    assert found["vanilla"].covered_by == "policy-loss" and found["gspo"].covered_by == "policy-gspo"
    assert all(v.file == "verl/trainer/ppo/core_algos.py" for v in found.values())
    # Clip-Cov draws with randperm, KL-Cov ranks with topk: callable through their recipe (adapters.cov_selection),
    # the invariants their selection does not make declared, never judged as if order-free
    assert all(v.callable for v in found.values()), [n for n, v in found.items() if not v.callable]
    assert "call recipe" in found["clip_cov"].reason and "call recipe" in found["kl_cov"].reason
    assert "torch.randperm at verl/trainer/ppo/core_algos.py:1823" in found["clip_cov"].reason
    assert "torch.topk at verl/trainer/ppo/core_algos.py:1907" in found["kl_cov"].reason
    # the advantage estimators, keyed by `AdvantageEstimator` members resolved to their values
    adv = {v.name: v for v in variants if v.prefix == "adv"}
    assert {"gae", "grpo", "rloo", "opo", "gpg", "remax", "gdpo", "optimal_token_baseline"} <= set(adv), sorted(adv)
    assert adv["grpo"].covered_by == "grpo" and adv["gae"].covered_by == "default" and adv["gae"].kind == "gae"
    new = {n for n, v in adv.items() if v.covered_by is None}
    assert new == {"gdpo", "optimal_token_baseline", "tir_optimal_token_baseline"}, new
    assert "masked_whiten at verl/trainer/ppo/core_algos.py:" in adv["gdpo"].reason and not adv["gdpo"].callable
    assert "sum_pi_squared" in adv["optimal_token_baseline"].reason


# -- a fake SkyRL (release layout): enum-keyed registries, a def under two decorators; night 2 adds two variants ---
_SKY_UTILS = '''
from enum import StrEnum
from functools import wraps

import torch


class BaseFunctionRegistry:
    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls._functions = {}

    @classmethod
    def register(cls, name, func):
        cls._functions[name.value if isinstance(name, StrEnum) else name] = func

    @classmethod
    def get(cls, name):
        return cls._functions[name]

    @classmethod
    def list_available(cls):
        return list(cls._functions)


class PolicyLossRegistry(BaseFunctionRegistry):
    pass


class AdvantageEstimatorRegistry(BaseFunctionRegistry):
    pass


class PolicyLossType(StrEnum):
    REGULAR = "regular"
    DUAL_CLIP = "dual_clip"
    PLAIN_PG = "plain_pg"
    LEAKY = "leaky"


class AdvantageEstimator(StrEnum):
    GAE = "gae"
    GRPO = "grpo"
    MEAN_BASELINE = "mean_baseline"
    WHITENED = "whitened"


def _register(registry, name):
    def decorator(func):
        @wraps(func)
        def wrapper(*args, **kwargs):
            return func(*args, **kwargs)

        registry.register(name, wrapper)
        return wrapper

    return decorator


def register_policy_loss(name):
    return _register(PolicyLossRegistry, name)


def register_advantage_estimator(name):
    return _register(AdvantageEstimatorRegistry, name)


def masked_whiten(x, mask):
    m = mask > 0
    mean = x[m].mean()
    return torch.where(m, (x - mean) / (x[m].std() + 1e-8), 0.0)


def reduce_loss(loss, loss_mask, loss_reduction, max_seq_len=None):
    assert loss_reduction == "token_mean"
    live = loss_mask > 0
    return torch.where(live, loss, 0.0).sum() / live.sum().clamp(min=1)


@register_policy_loss(PolicyLossType.REGULAR)
@register_policy_loss(PolicyLossType.DUAL_CLIP)
def ppo_policy_loss(log_probs, old_log_probs, advantages, config, loss_mask=None, rollout_logprobs=None):
    assert config.policy_loss_type in ["regular", "dual_clip"]
    live = loss_mask > 0
    ratio = torch.exp(torch.where(live, log_probs - old_log_probs, 0.0))
    adv = torch.where(live, advantages, 0.0)
    loss = -torch.min(ratio * adv, ratio.clamp(1 - config.eps_clip_low, 1 + config.eps_clip_high) * adv)
    if config.policy_loss_type == "dual_clip":
        loss = torch.where(adv < 0, torch.min(-adv * config.clip_ratio_c, loss), loss)
    return reduce_loss(loss, loss_mask, config.loss_reduction, config.max_seq_len), 0.0


@register_policy_loss(PolicyLossType.PLAIN_PG)
def plain_pg_loss(log_probs, old_log_probs, advantages, config, loss_mask=None, rollout_logprobs=None):
    live = loss_mask > 0
    loss = -torch.where(live, advantages, 0.0) * torch.where(live, log_probs, 0.0)
    return reduce_loss(loss, loss_mask, config.loss_reduction, config.max_seq_len), 0.0


@register_advantage_estimator(AdvantageEstimator.GAE)
def compute_gae_advantage_return(token_level_rewards, values, response_mask, gamma, lambd, **kwargs):
    raise NotImplementedError


@register_advantage_estimator(AdvantageEstimator.GRPO)
def compute_grpo_outcome_advantage(token_level_rewards, response_mask, index, epsilon=1e-6, **kwargs):
    raise NotImplementedError


@register_advantage_estimator(AdvantageEstimator.MEAN_BASELINE)
def compute_mean_baseline_advantage(token_level_rewards, response_mask, index, **kwargs):
    """score - the mean score of its group, on the response tokens."""
    scores = torch.where(response_mask > 0, token_level_rewards, 0.0).sum(-1)
    out = torch.zeros_like(scores)
    for uid in set(index.tolist()):
        rows = torch.tensor([u == uid for u in index.tolist()])
        out[rows] = scores[rows] - scores[rows].mean()
    return torch.where(response_mask > 0, out[:, None], 0.0), None
'''
_SKY_NIGHT2 = '''

@register_policy_loss(PolicyLossType.LEAKY)
def leaky_loss(log_probs, old_log_probs, advantages, config, loss_mask=None, rollout_logprobs=None):
    """Mask-blind: every position's log-ratio enters the loss."""
    return (-advantages * torch.exp(log_probs - old_log_probs)).mean(), 0.0


@register_advantage_estimator(AdvantageEstimator.WHITENED)
def compute_whitened_advantage(token_level_rewards, response_mask, index, **kwargs):
    scores = token_level_rewards.sum(-1, keepdim=True) * response_mask
    return masked_whiten(scores, response_mask), None
'''
_SKY_CONFIG = """
trainer:
  epochs: 1  # not read
  algorithm:
    advantage_estimator: "grpo"  # "grpo", "gae"
    policy_loss_type: "regular"
    loss_reduction: "token_mean"
    eps_clip_low: 0.2
    eps_clip_high: 0.2
    clip_ratio_c: 3.0
    sapo:
      tau_pos: 1.0
generator:
  n_samples_per_prompt: 5
"""


@pytest.fixture
def fake_skyrl(tmp_path, monkeypatch):
    """A git repository of a fake SkyRL release layout (skyrl_train/utils/ppo_utils.py, the trainer config)."""
    monkeypatch.setenv("MASKFUZZ_CACHE", str(tmp_path / "cache"))
    repo = git.Repo.init(tmp_path / "skyrl")
    files = {f"{p}/__init__.py": "" for p in ("skyrl_train", "skyrl_train/utils", "skyrl_train/config")}
    files["skyrl_train/utils/ppo_utils.py"] = _SKY_UTILS
    files["skyrl_train/config/ppo_base_config.yaml"] = _SKY_CONFIG
    commit(repo, files, "night 1", 1)
    return {"skyrl": tmp_path / "skyrl"}, repo


def test_skyrl_enum_keyed_registries_are_discovered_and_fuzzed_the_next_night(fake_skyrl):
    repos, repo = fake_skyrl
    first = fuzz_cmd._discover(["skyrl@HEAD"], [], repos)["skyrl@HEAD"]
    # `@register_policy_loss(PolicyLossType.REGULAR)` read as "regular"; the def under two decorators is two variants
    assert [v["entry"] for v in first["variants"]] == [
        "policy-loss:regular", "policy-loss:dual_clip", "policy-loss:plain_pg",
        "adv:gae", "adv:grpo", "adv:mean_baseline",
    ]  # fmt: skip
    by = {v["entry"]: v for v in first["variants"]}
    assert by["policy-loss:regular"]["covered_by"] == "policy-loss" and by["adv:grpo"]["covered_by"] == "grpo"
    # dual_clip is judged against the policy-loss reference by its hand-written entry (discover.COVERED)
    assert by["policy-loss:dual_clip"]["covered_by"] == "policy-dual-clip"
    assert by["policy-loss:dual_clip"]["judged"] == "reference"
    assert by["adv:gae"]["kind"] == "gae" and not by["adv:gae"]["callable"] and "values" in by["adv:gae"]["reason"]
    assert by["adv:mean_baseline"]["kind"] == "group-advantage" and by["adv:mean_baseline"]["callable"]
    assert first["labels"] == [f"skyrl:{e}@HEAD" for e in ("policy-loss:plain_pg", "adv:mean_baseline")]

    night1 = first["resolved"]
    commit(repo, {"skyrl_train/utils/ppo_utils.py": _SKY_UTILS + _SKY_NIGHT2}, "register leaky and whitened", 2)
    second = fuzz_cmd._discover(["skyrl@HEAD"], [], repos)["skyrl@HEAD"]
    night2 = second["resolved"]
    assert night2 != night1 and set(second["labels"]) - set(first["labels"]) == {
        "skyrl:policy-loss:leaky@HEAD", "skyrl:adv:whitened@HEAD"}  # fmt: skip
    whitened = next(v for v in second["variants"] if v["entry"] == "adv:whitened")
    assert not whitened["callable"] and "masked_whiten at skyrl_train/utils/ppo_utils.py:" in whitened["reason"]

    # judged as the fuzzer judges them, through SkyRL's own registry and the pin's config defaults
    dual = fuzz_cmd.run_job(job(f"skyrl:policy-loss:plain_pg@{night2}", repos, examples=20))
    assert dual.status == "ok" and dual.judged == "invariants only", dual.reason
    assert dual.checked["reference"] == 0 and dual.checked["poison"] > 0 and not dual.findings, dual.checked
    assert any("ppo_base_config.yaml" in n for n in dual.notes), dual.notes
    mean = fuzz_cmd.run_job(job(f"skyrl:adv:mean_baseline@{night2}", repos, examples=8))
    assert mean.status == "ok" and mean.kind == "group-advantage", mean.reason
    assert mean.checked["group-isolation"] > 0 and mean.checked["permutation"] > 0
    # response_mask is SkyRL's response indicator (calls_kinds.outcome_inputs): rewards on loss-masked response
    # tokens enter the sum, a fact without a pipeline domain (api), never a defect
    assert not mean.defects and all(f.property != "group-isolation" for f in mean.findings), mean.findings
    skipped = fuzz_cmd.run_job(job(f"skyrl:adv:whitened@{night2}", repos, examples=15))
    assert skipped.status == "skipped" and "normalises over the whole batch" in skipped.reason
    gone = fuzz_cmd.run_job(job(f"skyrl:policy-loss:leaky@{night1}", repos, examples=15))
    assert gone.status == "skipped" and "no policy loss 'leaky' is registered" in gone.reason
    with open_target(f"skyrl:policy-loss:leaky@{night2}", repos=repos, timeout=30) as handle:
        assert handle.declared.reference is False and "leaky_loss" in handle.info["where"]
        verdicts = {v.property: v for v in judge(handle.run, _poisoned_case(), handle.declared)}
    assert verdicts["poison"].failed and verdicts["reference"].status == "n/a"


def test_skyrl_config_defaults_are_read_from_the_source(tmp_path):
    """git main's AlgorithmConfig dataclass (nested default factories) and a release's YAML block, without import."""
    from maskfuzz.targets.skyrl.calls_discovered import algorithm_defaults, yaml_block

    path = tmp_path / "skyrl/train/config/config.py"
    path.parent.mkdir(parents=True)
    path.write_text(
        textwrap.dedent("""
        from dataclasses import dataclass, field

        @dataclass
        class CISPOConfig:
            cispo_eps_clip_low: float = 1.0
            cispo_anchor: str = "old"

        @dataclass
        class AlgorithmConfig:
            loss_reduction: str = "token_mean"
            cispo: CISPOConfig = field(default_factory=CISPOConfig)
            max_seq_len: int | None = None
    """)
    )
    config, at = algorithm_defaults(tmp_path, "skyrl/backends/skyrl_train")
    assert at == "skyrl/train/config/config.py::AlgorithmConfig"
    assert config.cispo.cispo_eps_clip_low == 1.0 and config.cispo.cispo_anchor == "old" and config.max_seq_len is None
    block = yaml_block(_SKY_CONFIG, ("trainer", "algorithm"))
    assert block["clip_ratio_c"] == 3.0 and block["sapo"] == {"tau_pos": 1.0} and block["advantage_estimator"] == "grpo"
    assert "n_samples_per_prompt" not in block


def test_fuzz_discovered_runs_only_the_discovered_entries_and_tables_count_them(fake_verl, tmp_path, monkeypatch,
                                                                                capsys):  # fmt: skip
    """`maskfuzz fuzz verl@HEAD --discovered`: the variants no hand-written entry runs, and nothing else;
    `scripts/discovered_tables.py` counts them from the JSON (found, no entry before, fuzzed, listed)."""
    import importlib.util
    from pathlib import Path

    from maskfuzz.fuzz.cli import main

    repos, repo = fake_verl
    commit(repo, {"verl/trainer/ppo/core_algos.py": _CORE + _LEAKY}, "register the leaky policy loss", 2)
    out = tmp_path / "found.json"
    code = main(["fuzz", "verl@HEAD", "--discovered", "--max-examples", "3", "--jobs", "1", "--repo",
                 f"verl={repos['verl']}", "--json", str(out), "--quiet"])  # fmt: skip
    data = json.loads(out.read_text())
    assert code == 0  # leaky's masked log-prob is a robustness fact here: the fake declares no pipeline domain
    ran = sorted(t["target"] for t in data["targets"])
    assert ran == [f"verl:policy-loss:{n}@HEAD" for n in ("leaky", "needs_values", "plain_pg")], ran
    assert all(t["judged"] == "invariants only" for t in data["targets"] if t["status"] == "ok")

    path = Path(__file__).resolve().parent.parent / "scripts" / "discovered_tables.py"
    spec = importlib.util.spec_from_file_location("discovered_tables", path)
    tables = importlib.util.module_from_spec(spec)
    monkeypatch.syspath_prepend(str(path.parent))
    spec.loader.exec_module(tables)
    found, results = tables.load([out])
    (row,) = tables.summary(found, results)[2:]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1:6] == ["4", "3", "2", "1", "1"], row  # found, no entry before, fuzzed, run by vanilla's, listed
    assert int(cells[6]) == sum(t["examples"] for t in data["targets"] if t["status"] == "ok")
    table = "\n".join(tables.pin_table("verl@HEAD", found["verl@HEAD"], results))
    assert "reference: hand-written `policy-loss`" in table and "listed, not fuzzed:" in table

    # an entry or a --callable is refused, and a framework that registers nothing we read runs nothing: exit 2
    capsys.readouterr()
    assert main(["fuzz", "verl:policy-loss:leaky@HEAD", "--discovered", "--repo", f"verl={repos['verl']}"]) == 2
    assert main(["fuzz", "torchrl@0.14.1", "--discovered"]) == 2
    assert "nothing was run" in capsys.readouterr().err

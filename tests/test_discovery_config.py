"""Variants a framework switches by a config field (`targets/<fw>/discover.py` for OpenRLHF, ROLL, AReaL): the
choices are read from the code at the pin by AST, each mapped to the hand-written entry that already runs it, and
a choice added upstream is a listed variant the next night (with its reason), without a change to maskfuzz."""

from __future__ import annotations

import json

import git
import pytest
from discovery_nights import commit, job

from maskfuzz.fuzz.commands import fuzz as fuzz_cmd
from maskfuzz.fuzz.report import write_report
from maskfuzz.targets import discovery, listing

# -- a fake OpenRLHF: the CLI flag with its choices, and the dispatcher that switches on it ------------------------
_CLI = """
import argparse


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--algo.advantage.estimator",
        type=str,
        choices={choices},
        default="gae",
    )
    return parser
"""
_EM = """
import torch


class ExperienceMaker:
    def compute_advantages_and_returns(self, experiences, rewards, args):
        if args.algo.advantage.estimator == "rloo":
            rewards = rewards - (rewards.sum(-1, keepdim=True) - rewards) / (rewards.shape[-1] - 1)
        elif args.algo.advantage.estimator == "group_norm":
            rewards = (rewards - rewards.mean(-1, keepdim=True)) / (rewards.std(-1, keepdim=True) + 1e-9)
        elif args.algo.advantage.estimator == "flash_reinforce":
            rewards = rewards - rewards.mean()
        if args.algo.advantage.estimator in ["gae", "reinforce"]:
            var = rewards.var()
            rewards = rewards * var.clamp(min=1e-8).rsqrt()
        return rewards
"""
_NIGHT1 = ["gae", "reinforce", "rloo", "group_norm", "flash_reinforce"]


@pytest.fixture
def fake_openrlhf(tmp_path, monkeypatch):
    monkeypatch.setenv("MASKFUZZ_CACHE", str(tmp_path / "cache"))
    repo = git.Repo.init(tmp_path / "openrlhf")
    files = {f"{p}/__init__.py": "" for p in ("openrlhf", "openrlhf/cli", "openrlhf/trainer",
                                             "openrlhf/trainer/ppo_utils")}  # fmt: skip
    files["openrlhf/cli/train_ppo_ray.py"] = _CLI.replace("{choices}", repr(_NIGHT1))
    files["openrlhf/trainer/ppo_utils/experience_maker.py"] = _EM
    commit(repo, files, "night 1", 1)
    return {"openrlhf": tmp_path / "openrlhf"}, repo


def test_an_openrlhf_estimator_choice_added_upstream_is_listed_the_next_night(fake_openrlhf, tmp_path):
    repos, repo = fake_openrlhf
    nights = []
    for day in (1, 2):
        if day == 2:  # upstream adds a choice (and nothing else): maskfuzz has no recipe for it
            cli = _CLI.replace("{choices}", repr([*_NIGHT1, "new_estimator"]))
            commit(repo, {"openrlhf/cli/train_ppo_ray.py": cli}, "add an estimator", 2)
        found = fuzz_cmd._discover(["openrlhf@HEAD"], [], repos)
        payload = {"profile": "nightly", "targets": [], "discovered": found}  # what `maskfuzz fuzz --json` writes
        (tmp_path / f"night{day}.json").write_text(json.dumps(payload))
        nights.append(found["openrlhf@HEAD"])
    first, second = nights
    assert first["resolved"] != second["resolved"] == repo.head.commit.hexsha
    assert [v["name"] for v in first["variants"]] == _NIGHT1
    by = {v["name"]: v for v in second["variants"]}
    # the choices a hand-written entry runs keep it (and its reference); each at the line it is written
    assert {n: v["covered_by"] for n, v in by.items() if v["covered_by"]} == {
        "gae": "default", "reinforce": "reinforce", "rloo": "rloo", "group_norm": "group_norm"}  # fmt: skip
    assert by["gae"]["judged"] == "reference" and by["gae"]["kind"] == "gae" and by["reinforce"]["kind"] == "returns"
    assert by["new_estimator"]["at"] == "openrlhf/cli/train_ppo_ray.py:10"
    # the new one is listed with the dispatcher's file:line, never silently left out
    new = by["new_estimator"]
    assert not new["callable"] and new["judged"] == "invariants only"
    assert new["reason"] == "no call recipe for this estimator yet: openrlhf/trainer/ppo_utils/experience_maker.py:7"
    # a whole-batch baseline is said, read from the dispatcher (`rewards.mean()` with no dim)
    assert (
        "mean over the whole rollout batch (openrlhf/trainer/ppo_utils/experience_maker.py:12)"
        in (by["flash_reinforce"]["reason"])
    )
    assert second["labels"] == ["openrlhf:adv:flash_reinforce@HEAD", "openrlhf:adv:new_estimator@HEAD"]
    assert first["labels"] == ["openrlhf:adv:flash_reinforce@HEAD"]

    # the nightly's variant_changes say what appeared
    write_report([tmp_path / "night1.json"], tmp_path / "r1", now="2026-01-01 00:00")
    _, cmp = write_report([tmp_path / "night2.json"], tmp_path / "r2", previous=[tmp_path / "r1" / "report.json"],
                          now="2026-01-02 00:00")  # fmt: skip
    assert [(w, c, v["entry"]) for w, c, v in cmp.variants] == [("openrlhf@HEAD", "appeared", "adv:new_estimator")]
    report = json.loads((tmp_path / "r2" / "report.json").read_text())
    assert [c["entry"] for c in report["variant_changes"]] == ["adv:new_estimator"]

    # `maskfuzz targets` shows coverage and the new variant with its reason
    text = " ".join(listing._discovered_lines({"discovered": {second["resolved"]: second}}))
    assert "gae -> default" in text and "group_norm -> group_norm" in text
    assert "adv:new_estimator (no call recipe for this estimator yet: openrlhf/trainer/ppo_utils/" in text

    # fuzzed, it is a skip that says why; the night before, not a choice at all
    skipped = fuzz_cmd.run_job(job(f"openrlhf:adv:new_estimator@{second['resolved']}", repos))
    assert skipped.status == "skipped" and "no call recipe for this estimator yet" in skipped.reason, skipped.reason
    gone = fuzz_cmd.run_job(job(f"openrlhf:adv:new_estimator@{first['resolved']}", repos))
    assert gone.status == "skipped" and "'new_estimator' is a choice" in gone.reason, gone.reason


def test_openrlhf_flag_choices_are_read_at_each_form(tmp_path):
    """`--advantage_estimator` (older pins) reads the same; a pin without the flag has no variants."""
    (tmp_path / "openrlhf/cli").mkdir(parents=True)
    cli = tmp_path / "openrlhf/cli/train_ppo_ray.py"
    cli.write_text(_CLI.replace("--algo.advantage.estimator", "--advantage_estimator").replace("{choices}", '["gae"]'))
    found = discovery.discover("openrlhf", tmp_path)
    at = "openrlhf/cli/train_ppo_ray.py:10"
    assert [(v.name, v.covered_by, v.citation) for v in found] == [("gae", "default", at)]
    cli.write_text("import argparse\n")
    assert discovery.discover("openrlhf", tmp_path) == []


# -- a fake ROLL: PPOConfig.adv_estimator a Literal, compute_advantage its dispatcher -----------------------------
_ROLL_CONFIG = """
from dataclasses import dataclass, field
from typing import Literal


@dataclass
class PPOConfig:
    gamma: float = field(default=1.0)
    adv_estimator: Literal[{values}] = field(default="gae")
"""
_ROLL_FN = """
def compute_reinforce_return(token_level_rewards, gamma, lambd):
    return token_level_rewards, token_level_rewards


def compute_advantage(data, gamma, lambd, adv_estimator, response_mask=None):
    if adv_estimator == "gae":
        raise NotImplementedError
    elif adv_estimator in ["reinforce", "grpo"]:
        advantages, returns = compute_reinforce_return(data, gamma, lambd)
    else:
        raise NotImplementedError
    return advantages * response_mask
"""


def test_a_roll_estimator_value_added_upstream_is_listed_the_next_night(tmp_path, monkeypatch):
    monkeypatch.setenv("MASKFUZZ_CACHE", str(tmp_path / "cache"))
    repo = git.Repo.init(tmp_path / "roll")
    repos = {"roll": tmp_path / "roll"}
    files = {f"{p}/__init__.py": "" for p in ("roll", "roll/configs", "roll/utils")}
    files["roll/configs/base_config.py"] = _ROLL_CONFIG.replace("{values}", '"gae", "reinforce", "grpo"')
    files["roll/utils/functionals.py"] = _ROLL_FN
    commit(repo, files, "night 1", 1)
    first = fuzz_cmd._discover(["roll@HEAD"], [], repos)["roll@HEAD"]
    cfg = _ROLL_CONFIG.replace("{values}", '"gae", "reinforce", "grpo", "new_estimator"')
    commit(repo, {"roll/configs/base_config.py": cfg}, "add an estimator", 2)
    second = fuzz_cmd._discover(["roll@HEAD"], [], repos)["roll@HEAD"]
    assert [v["name"] for v in first["variants"]] == ["gae", "reinforce", "grpo"]
    by = {v["name"]: v for v in second["variants"]}
    assert by["gae"]["covered_by"] == "default" and by["grpo"]["covered_by"] == "grpo"
    assert by["new_estimator"]["at"] == "roll/configs/base_config.py:9"
    # reinforce has a call recipe through compute_advantage's branch: `ret:reinforce`, the returns kind, callable;
    # a value the function does not test is listed with the function cited
    assert by["reinforce"]["entry"] == "ret:reinforce" and by["reinforce"]["kind"] == "returns"
    assert by["reinforce"]["callable"] and by["reinforce"]["reason"] == ""
    assert by["new_estimator"]["reason"] == (
        "no call recipe for this estimator yet: roll/utils/functionals.py:6 (compute_advantage has no branch for it: "
        "NotImplementedError)"
    )
    assert set(second["labels"]) - set(first["labels"]) == {"roll:adv:new_estimator@HEAD"}
    skipped = fuzz_cmd.run_job(job(f"roll:adv:new_estimator@{second['resolved']}", repos))
    assert skipped.status == "skipped" and "no call recipe for this estimator yet" in skipped.reason, skipped.reason


# -- a fake AReaL: NormConfig's level choices, PPOActorConfig.kl_estimator's, the Normalization that reads them ----
_AREAL_CONFIG = """
from dataclasses import dataclass, field


@dataclass
class NormConfig:
    mean_level: str | None = field(default="batch", metadata={"choices": ["batch", "group", None]})
    std_level: str | None = field(default="batch", metadata={"choices": ["batch", "group", None]})


@dataclass
class PPOActorConfig:
    kl_estimator: str = field(default="k1", metadata={"help": "KL divergence estimator", "choices": {kl}})
"""
_AREAL_DATA = """
class Normalization:
    def __init__(self, config):
        if config.mean_level not in {"batch", "group", None}:
            raise ValueError(config.mean_level)
        self.mean_level, self.std_level = config.mean_level, config.std_level

    def __call__(self, x):
        if self.mean_level == "batch":
            x = x - x.mean()
        elif self.mean_level == "group":
            x = x - x.mean(-1, keepdim=True)
        if self.std_level == "batch":
            x = x / (x.std() + 1e-5)
        return x


class KLEstimator:
    pass
"""


def test_an_areal_kl_choice_added_upstream_is_listed_the_next_night(tmp_path, monkeypatch):
    monkeypatch.setenv("MASKFUZZ_CACHE", str(tmp_path / "cache"))
    repo = git.Repo.init(tmp_path / "areal")
    repos = {"areal": tmp_path / "areal"}
    files = {f"{p}/__init__.py": "" for p in ("areal", "areal/api", "areal/utils")}
    files["areal/api/cli_args.py"] = _AREAL_CONFIG.replace("{kl}", '["k1", "k2", "k3"]')
    files["areal/utils/data.py"] = _AREAL_DATA
    commit(repo, files, "night 1", 1)
    first = fuzz_cmd._discover(["areal@HEAD"], [], repos)["areal@HEAD"]
    by = {v["entry"]: v for v in first["variants"]}
    assert len(by) == 2 * 2 * 3 + 3  # two fields of three choices, per use (reward_norm, adv_norm); three KLs
    assert by["reward-norm:reward_norm.std_level=none"]["covered_by"] == "grpo" and by["kl:k3"]["covered_by"] == "kl-k3"
    assert by["adv-norm:adv_norm.mean_level=batch"]["covered_by"] == "adv-norm" and by["kl:k1"]["kind"] == "kl"
    # the branch of Normalization that reads the choice, not the validation above it
    assert by["reward-norm:reward_norm.mean_level=batch"]["reason"].endswith("areal/utils/data.py:9")
    assert by["adv-norm:adv_norm.std_level=none"]["reason"].endswith("areal/utils/data.py:2 (class Normalization)")
    cfg = _AREAL_CONFIG.replace("{kl}", '["k1", "k2", "k3", "k4"]')
    commit(repo, {"areal/api/cli_args.py": cfg}, "add a KL estimator", 2)
    second = fuzz_cmd._discover(["areal@HEAD"], [], repos)["areal@HEAD"]
    new = next(v for v in second["variants"] if v["entry"] == "kl:k4")
    assert new["at"] == "areal/api/cli_args.py:13" and not new["callable"]
    assert new["reason"] == "no call recipe for this estimator yet: areal/utils/data.py:18 (class KLEstimator)"
    assert set(second["labels"]) - set(first["labels"]) == {"areal:kl:k4@HEAD"}
    skipped = fuzz_cmd.run_job(job(f"areal:kl:k4@{second['resolved']}", repos))
    assert skipped.status == "skipped" and "no call recipe for this estimator yet" in skipped.reason, skipped.reason
    level = fuzz_cmd.run_job(job(f"areal:adv-norm:adv_norm.std_level=none@{second['resolved']}", repos))
    assert level.status == "skipped" and level.kind == "normalization", level.reason
    # the level has a call recipe, but its not-promised group-isolation rests on Normalization's own words that a
    # batch level is over the entire batch: where the pin lacks them, the recipe is not run
    assert "areal/api/cli_args.py:8: areal/utils/data.py no longer says" in level.reason, level.reason


def test_the_real_rolls_step_shaped_estimators_are_listed_with_what_they_need():
    """gigpo / step_reinforce at ROLL's pins: listed, the reason naming the multi-turn state their math reads."""
    from maskfuzz.targets.registry import get
    from maskfuzz.targets.runtime.acquire import acquire
    from maskfuzz.targets.runtime.repos import parse_repos

    repos = parse_repos(None)
    if "roll" not in repos:
        pytest.skip("git-only upstream: set MASKFUZZ_REPOS=roll=/path/to/alibaba-ROLL-clone to test the real code")
    checkout = acquire(get("roll"), "8eb27cc2dc34", repos)
    found = {v.name: v for v in discovery.discover("roll", checkout.root)}
    for name in ("gigpo", "step_reinforce"):
        assert not found[name].callable, name
        assert "traj_id, step and step_scores" in found[name].reason, found[name].reason
        assert "roll/utils/functionals.py:1168 (compute_advantage)" in found[name].reason
    assert "build_state_group :156-177" in found["gigpo"].reason

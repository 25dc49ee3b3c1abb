"""NeMo-RL's config-switched variants (`targets/nemo_rl/discover.py`): the estimator names its loops compare and the
fields of `ClippedPGLossConfig`, read from the code at the pin by AST, each mapped to the hand-written entry that runs
it, an invariants-only entry, or listed with the reason; a field or name added upstream appears the next night.

The fake checkout below is test input (a few lines in NeMo-RL's file layout, nothing that runs as a target); the
real mirror is exercised when MASKFUZZ_REPOS names nemo-rl."""

from __future__ import annotations

import textwrap

import git
import pytest
from discovery_nights import commit, job, run

from maskfuzz.fuzz.commands import fuzz as fuzz_cmd
from maskfuzz.targets import discovery
from maskfuzz.targets.registry import get
from maskfuzz.targets.runtime.repos import parse_repos
from maskfuzz.targets.runtime.session import parse_ref

_LOSS = "nemo_rl/algorithms/loss/loss_functions.py"
_GRPO = "nemo_rl/algorithms/grpo.py"
_HEAD = "7ea279abfbeb"  # main at the mirror snapshot (declare.py)


# -- a fake checkout in NeMo-RL's layout: the loops' factories, the estimator classes, the loss config and loss -----
_GRPO_PY = """
def create_advantage_estimator(master_config):
    adv_estimator_name = master_config.grpo.adv_estimator.name
    if adv_estimator_name == "gdpo":
        adv_estimator = GDPOAdvantageEstimator(None, None)
    elif adv_estimator_name == "grpo":
        adv_estimator = GRPOAdvantageEstimator(None, None)
    {extra}else:
        raise ValueError(adv_estimator_name)
    return adv_estimator
"""
_PPO_PY = """
def create_advantage_estimator(master_config):
    adv_estimator_name = master_config.ppo.adv_estimator["name"]
    if adv_estimator_name == "gae":
        adv_estimator = GeneralizedAdvantageEstimator(None, None)
    return adv_estimator
"""
_ESTIMATORS = """
class GRPOAdvantageEstimator:
    pass


class GDPOAdvantageEstimator:
    pass


class GeneralizedAdvantageEstimator:
    pass


class NewAdvantageEstimator:
    pass
"""
_UTILS = """
def calculate_kl(logprobs, logprobs_reference, kl_type="k3"):
    logr = logprobs_reference - logprobs
    if kl_type == "k1":
        kl = -logr
    elif kl_type == "k3":
        kl = logr.exp() - 1 - logr
    return kl
"""
_LOSS_PY = """
from typing import Optional


class ClippedPGLossConfig(BaseModel, extra="allow"):
    disable_ppo_ratio: bool = False
    token_level_loss: bool = True
    ratio_clip_c: Optional[float] = None
    reference_policy_kl_type: str = "k3"
    truncated_importance_sampling_type: Optional[str] = None
    positive_example_nll_weight: float = 0.0
{fields}

class ClippedPGLossFn:
    def __init__(self, cfg):
        self.disable_ppo_ratio = cfg.disable_ppo_ratio
        self.loss_type = "token" if cfg.token_level_loss else "seq"
        self.ratio_clip_c = cfg.ratio_clip_c
        self.reference_policy_kl_type = cfg.reference_policy_kl_type
        self.truncated_importance_sampling_type = cfg.truncated_importance_sampling_type
        if self.truncated_importance_sampling_type is not None:
            assert self.truncated_importance_sampling_type in ("tis", "icepop")
        self.positive_example_nll_weight = cfg["positive_example_nll_weight"]
{init}
    def __call__(self, next_token_logprobs, data, global_valid_seqs, global_valid_toks):
        loss = -data["advantages"][:, 1:] * next_token_logprobs
        if self.positive_example_nll_weight > 0 and "rewards" in data:
            loss = loss + data["rewards"]
{call}
        return loss.sum(), {{}}
"""
_NIGHT2_FIELDS = "    use_new_trick: bool = False\n    use_teacher: bool = False\n"
_NIGHT2_INIT = "        self.use_new_trick = cfg.use_new_trick\n        self.use_teacher = cfg.use_teacher\n"
_NIGHT2_CALL = (
    "        if self.use_new_trick:\n            loss = loss * 2\n"
    "        if self.use_teacher:\n            loss = loss - data['teacher_logprobs'][:, 1:]\n"
)


def _loss(night: int) -> str:
    fields, init, call = (_NIGHT2_FIELDS, _NIGHT2_INIT, _NIGHT2_CALL) if night == 2 else ("", "", "")
    return _LOSS_PY.format(fields=fields, init=init, call=call)


def _grpo(night: int) -> str:
    extra = (
        'elif adv_estimator_name == "new_est":\n        adv_estimator = NewAdvantageEstimator(None, None)\n    '
        if night == 2
        else ""
    )
    return _GRPO_PY.replace("{extra}", extra)


def _line(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(textwrap.dedent(text).splitlines(), 1) if needle in line)


@pytest.fixture
def fake_nemo(tmp_path, monkeypatch):
    monkeypatch.setenv("MASKFUZZ_CACHE", str(tmp_path / "cache"))
    repo = git.Repo.init(tmp_path / "nemo")
    files = {
        _GRPO: _grpo(1),
        "nemo_rl/algorithms/ppo.py": _PPO_PY,
        "nemo_rl/algorithms/advantage_estimator.py": _ESTIMATORS,
        "nemo_rl/algorithms/utils.py": _UTILS,
        _LOSS: _loss(1),
    }
    commit(repo, files, "night 1", 1)
    return {"nemo-rl": tmp_path / "nemo"}, repo


def test_a_loss_field_and_an_estimator_added_upstream_are_discovered_the_next_night(fake_nemo):
    repos, repo = fake_nemo
    first = fuzz_cmd._discover(["nemo-rl@HEAD"], [], repos)["nemo-rl@HEAD"]
    by = {v["entry"]: v for v in first["variants"]}
    assert list(by) == [
        "adv:gdpo", "adv:grpo", "adv:gae", "loss:disable_ppo_ratio=true", "loss:token_level_loss=false",
        "loss:ratio_clip_c", "kl:reference_policy_kl_type=k1", "kl:reference_policy_kl_type=k3",
        "loss:truncated_importance_sampling_type=tis", "loss:truncated_importance_sampling_type=icepop",
        "loss:positive_example_nll_weight",
    ]  # fmt: skip
    # what a hand-written entry runs keeps it (and its reference), with the kind of that entry
    covered = {e: (v["covered_by"], v["kind"]) for e, v in by.items() if v["covered_by"]}
    assert covered == {
        "adv:grpo": ("grpo-loo", "group-advantage"), "adv:gae": ("default", "gae"),
        "loss:token_level_loss=false": ("policy-loss", "policy-loss"),
        "loss:ratio_clip_c": ("policy-loss", "policy-loss"),
        "kl:reference_policy_kl_type=k1": ("kl", "kl"), "kl:reference_policy_kl_type=k3": ("kl", "kl"),
    }  # fmt: skip
    # each at the line it is written: the comparison of the loop, the field of the config
    gdpo_at = _line(_grpo(1), '== "gdpo"')
    assert by["adv:gdpo"]["at"] == f"{_GRPO}:{gdpo_at}"
    assert by["loss:disable_ppo_ratio=true"]["at"] == f"{_LOSS}:{_line(_loss(1), 'disable_ppo_ratio: bool')}"
    # a bool no entry runs is an invariants-only entry; the others are listed with the reason
    plain = by["loss:disable_ppo_ratio=true"]
    assert plain["callable"] and plain["judged"] == "invariants only" and plain["kind"] == "policy-loss"
    assert not by["adv:gdpo"]["callable"] and "GDPOAdvantageEstimator" in by["adv:gdpo"]["reason"]
    nll = by["loss:positive_example_nll_weight"]
    assert not nll["callable"] and nll["reason"].startswith("reads data['rewards'] (nemo_rl/algorithms/loss/")
    # a string setting with a recipe (the pin's example bounds) is an entry; one without is listed
    tis = by["loss:truncated_importance_sampling_type=tis"]
    assert tis["callable"] and tis["judged"] == "invariants only" and not tis["reason"]
    assert first["labels"] == [f"nemo-rl:{e}@HEAD" for e, v in by.items() if not v["covered_by"]]

    night1 = first["resolved"]
    commit(repo, {_LOSS: _loss(2), _GRPO: _grpo(2)}, "a loss trick, a teacher term, an estimator", 2)
    second = fuzz_cmd._discover(["nemo-rl@HEAD"], [], repos)["nemo-rl@HEAD"]
    assert second["resolved"] != night1
    new = {v["entry"]: v for v in second["variants"]}
    added = discovery.changes(list(by), list(new))
    assert added == {
        "appeared": ["adv:new_est", "loss:use_new_trick=true", "loss:use_teacher=true"], "disappeared": []}  # fmt: skip
    trick, teacher, est = new["loss:use_new_trick=true"], new["loss:use_teacher=true"], new["adv:new_est"]
    assert trick["callable"] and trick["covered_by"] is None and trick["kind"] == "policy-loss"
    assert not teacher["callable"] and "data['teacher_logprobs']" in teacher["reason"]
    assert not est["callable"] and est["reason"].startswith("no call recipe for this estimator yet: ")
    assert "NewAdvantageEstimator" in est["reason"]

    # fuzzed, a listed variant is a skip that says why; a setting absent on night 1 is a skip there
    skipped = run(job(f"nemo-rl:loss:use_teacher=true@{second['resolved']}", repos, timeout=60.0))
    assert skipped["status"] == "skipped" and "teacher_logprobs" in skipped["reason"], skipped["reason"]
    gone = run(job(f"nemo-rl:loss:use_new_trick=true@{night1}", repos, timeout=60.0))
    assert gone["status"] == "skipped" and "no loss:use_new_trick=true is a NeMo-RL" in gone["reason"], gone["reason"]


def test_a_discovered_setting_parses_and_declares_no_reference():
    ref = parse_ref(f"nemo-rl:loss:use_cispo=true@{_HEAD}")
    assert ref.entry == "loss:use_cispo=true"
    spec = get("nemo-rl")
    declared = spec.declared(ref.entry, ref.pin)
    assert declared.kind == "policy-loss" and declared.reference is False and declared.promises == ()
    assert spec.adapter_for(ref.entry) == "maskfuzz.targets.nemo_rl.calls_discovered"
    assert spec.declared("kl:use_on_policy_kl_approximation=true").kind == "kl"
    assert spec.declared("policy-loss").reference is True  # the hand-written entry keeps its reference


def _mirror() -> dict:
    repos = parse_repos(None)
    if "nemo-rl" not in repos:
        pytest.skip("git-only upstream: set MASKFUZZ_REPOS=nemo-rl=/path/to/NVIDIA-NeMo-RL-clone to test the real code")
    return repos


def test_the_variants_of_the_real_pin_are_discovered_and_one_is_fuzzed_invariants_only():
    from maskfuzz.targets.runtime.acquire import acquire

    repos = _mirror()
    checkout = acquire(get("nemo-rl"), _HEAD, repos)
    found = {v.entry: v for v in discovery.discover("nemo-rl", checkout.root)}
    assert [e for e, v in found.items() if v.prefix == "adv"] == [
        "adv:gdpo", "adv:grpo", "adv:opd", "adv:reinforce_plus_plus", "adv:gae", "adv:raw_reward"]  # fmt: skip
    invariants_only = sorted(e for e, v in found.items() if v.callable and not v.covered_by)
    assert invariants_only == [
        "adv:raw_reward", "adv:reinforce_plus_plus", "kl:use_on_policy_kl_approximation=true",
        "loss:disable_ppo_ratio=true", "loss:force_on_policy_ratio=true",
        "loss:sequence_level_importance_ratios=true", "loss:truncated_importance_sampling_type=icepop",
        "loss:truncated_importance_sampling_type=seq-mask-tis", "loss:truncated_importance_sampling_type=tis",
        "loss:use_cispo=true", "loss:use_importance_sampling_correction=true",
    ]  # fmt: skip
    assert not found["loss:truncated_importance_sampling_ratio"].callable  # a bound the type entries run
    assert found["loss:use_cispo=true"].citation == "nemo_rl/algorithms/loss/loss_functions.py:160"
    assert found["adv:grpo"].covered_by == "grpo-loo" and found["loss:ratio_clip_c"].covered_by == "policy-loss"
    out = run(job(f"nemo-rl:loss:disable_ppo_ratio=true@{_HEAD}", repos, examples=10, timeout=60.0))
    assert out["status"] == "ok" and out["judged"] == "invariants only", out.get("reason")
    assert out["kind"] == "policy-loss" and out["checked"]["reference"] == 0
    assert out["checked"]["split-invariance"] > 0 and out["checked"]["pad-invariance"] > 0
    assert not out["defects"], out["defects"]
    assert any("discovered: ClippedPGLossConfig field disable_ppo_ratio=true at" in n for n in out["notes"])


def test_the_typeddict_config_of_older_pins_reads_the_same(tmp_path):
    """Before the pydantic config (v0.5.0: nemo_rl/algorithms/loss_functions.py) the fields are a TypedDict without
    defaults, read by `cfg["x"]` or `cfg.get("x", False)`: a `NotRequired[bool]` is still a bool setting, its
    default taken from the `.get`; a pin without the class has no loss variants."""
    path = tmp_path / "nemo_rl/algorithms/loss_functions.py"
    path.parent.mkdir(parents=True)
    path.write_text(
        textwrap.dedent(
            """
            class ClippedPGLossConfig(TypedDict):
                ratio_clip_c: float | None
                use_importance_sampling_correction: bool
                disable_ppo_ratio: NotRequired[bool]


            class ClippedPGLossFn:
                def __init__(self, cfg):
                    self.ratio_clip_c = cfg["ratio_clip_c"]
                    self.use_importance_sampling_correction = cfg["use_importance_sampling_correction"]
                    self.disable_ppo_ratio = cfg.get("disable_ppo_ratio", False)
            """
        )
    )
    found = {v.entry: v for v in discovery.discover("nemo-rl", tmp_path)}
    assert list(found) == ["loss:ratio_clip_c", "loss:use_importance_sampling_correction=true",
                           "loss:disable_ppo_ratio=true"]  # fmt: skip
    assert found["loss:disable_ppo_ratio=true"].callable and found["loss:disable_ppo_ratio=true"].line == 5
    assert found["loss:ratio_clip_c"].covered_by == "policy-loss"
    path.write_text("class ClippedPGLossConfig(TypedDict):\n    ratio_clip_c: float\n")  # no loss class
    assert discovery.discover("nemo-rl", tmp_path) == []


def test_the_whole_batch_estimators_are_called_with_group_isolation_not_promised():
    """reinforce_plus_plus and raw_reward run NeMo-RL's own classes on the group-advantage inputs; both normalise
    over the whole batch, so their recipe sets group-isolation aside with the upstream line; the values below are
    computed by hand (float32: calculate_baseline_and_std_per_prompt builds a float32 mask matrix)."""
    from types import SimpleNamespace

    import torch

    from maskfuzz.targets.nemo_rl.calls_discovered import load
    from maskfuzz.targets.runtime.acquire import acquire

    checkout = acquire(get("nemo-rl"), _HEAD, _mirror())
    for entry in ("adv:reinforce_plus_plus", "adv:raw_reward"):
        declared = discovery.overrides("nemo-rl", entry)
        assert [p for p, _ in declared["not_promised"]] == ["group-isolation"], entry
        assert "advantage_estimator.py:" in declared["not_promised"][0][1] and declared["masked_zero"] is False

    def case(group, score, trainable):
        t = torch.tensor(trainable, dtype=torch.float32)
        return SimpleNamespace(group=torch.tensor(group), score=torch.tensor(score, dtype=torch.float32),
                               trainable=t, shape=t.shape, torch_dtype=torch.float32)  # fmt: skip

    # minus the group mean: [0.5, -0.5, 0, 0]; batch mean 0, var 0.125 over the 4 tokens: times 1 / sqrt(0.125)
    (adv,) = load(checkout.root, "adv:reinforce_plus_plus").run(
        case([0, 0, 1, 1], [1.0, 0.0, 2.0, 2.0], [[1]] * 4), "cpu"
    )
    torch.testing.assert_close(adv, torch.tensor([[2**0.5], [-(2**0.5)], [0.0], [0.0]], dtype=torch.float32))
    # the raw score, whitened over the batch's 4 tokens: mean 2, var 1
    (adv,) = load(checkout.root, "adv:raw_reward").run(case([0, 1], [1.0, 3.0], [[1, 1], [1, 1]]), "cpu")
    torch.testing.assert_close(adv, torch.tensor([[-1.0, -1.0], [1.0, 1.0]], dtype=torch.float32))

"""TRL's loss types discovered (`targets/trl/discover.py`): every value GRPOTrainer's `if self.loss_type ...: loss =`
chain tests, read from the checkout by AST, becomes an invariants-only `agg:<loss_type>` entry run through the same
chain; a value that lands upstream is found and fuzzed the next night without a change to maskfuzz."""

from __future__ import annotations

import textwrap

import git
import pytest
from discovery_nights import commit, job, run

from maskfuzz.fuzz.commands import fuzz as fuzz_cmd
from maskfuzz.oracles.case import Case
from maskfuzz.oracles.kinds.judge import judge
from maskfuzz.targets import discovery
from maskfuzz.targets.registry import get
from maskfuzz.targets.runtime.repos import parse_repos
from maskfuzz.targets.runtime.session import open_target, parse_ref

_TRAINER = '''
import torch


class GRPOTrainer:
    loss_is_scaled_for_ga = True  # the Trainer does not divide again: the chain divides by the accumulation steps

    def _generate_and_score_completions(self, inputs):
        completion_ids_list = inputs["completion_ids_list"]
        completion_mask = inputs["completion_mask"]
        device = "cpu"
        if self.mask_truncated_completions:
            eos_and_pad = [*self.eos_token_ids, self._tokenizer.pad_token_id]
            is_truncated = torch.tensor([ids[-1] not in eos_and_pad for ids in completion_ids_list], device=device)
            completion_mask = completion_mask * (~is_truncated).unsqueeze(1).int()
        return completion_mask

    def _compute_loss(self, model, inputs):
        per_token_loss = inputs["per_token_loss"]
        mask = inputs["completion_mask"]
        advantages = inputs["advantages"]
        log_ratio = inputs["per_token_logps"] - inputs["old_per_token_logps"]
        if self.importance_sampling_level == "token":
            log_importance_weights = log_ratio
        elif self.importance_sampling_level == "sequence":
            log_importance_weights = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
#LEVEL2#
        else:
            raise ValueError("Unknown importance sampling level")
        if self.loss_type == "grpo":
            per_token_loss = per_token_loss * 1.0
        mode = "train" if self.model.training else "eval"
        if self.loss_type == "grpo":
            loss = ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
            loss = loss / self.current_gradient_accumulation_steps
        elif self.loss_type == "bnpo":
            loss = (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0)
            loss = loss / self.current_gradient_accumulation_steps
        elif self.loss_type == "dapo":
            normalizer = inputs["num_items_in_batch"].clamp(min=1.0) / self.accelerator.num_processes
            normalizer = normalizer * self.current_gradient_accumulation_steps / self.args.steps_per_generation
            loss = (per_token_loss * mask).sum() / normalizer
#NIGHT2#
        else:
            raise ValueError(f"Unknown loss type: {self.loss_type}")
        return loss
'''
# night 2: three loss types land; one runs on what the kind holds, one reads the advantages (a method local), one
# drops tokens at random, and one ignores the mask (a masked per-token loss reaches the step's loss)
_NIGHT2 = '''
        elif self.loss_type in ["seq_sum", "leaky"]:
            if self.loss_type == "leaky":
                loss = per_token_loss.sum() / mask.sum().clamp(min=1.0)
            else:
                loss = (per_token_loss * mask).sum(-1).mean()
            loss = loss / self.current_gradient_accumulation_steps
        elif self.loss_type == "adv_weighted":
            loss = (per_token_loss * mask * advantages.abs()).sum() / mask.sum().clamp(min=1.0)
        elif self.loss_type == "dropout":
            keep = torch.rand(mask.shape) > 0.1
            loss = (per_token_loss * mask * keep).sum() / mask.sum().clamp(min=1.0)
'''
_LEVEL2 = """
        elif self.importance_sampling_level == "by_advantage":
            log_importance_weights = log_ratio * advantages
"""
_GR = "trl/trainer/grpo_trainer.py"


def _trainer(night: int) -> str:
    text = _TRAINER.replace("#NIGHT2#\n", _NIGHT2.lstrip("\n") if night == 2 else "")
    return text.replace("#LEVEL2#\n", _LEVEL2.lstrip("\n") if night == 2 else "")


def _line(text: str, needle: str, nth: int = 0) -> int:
    """The 1-based line of the `nth` line of `text` (as committed, dedented) holding `needle`."""
    lines = textwrap.dedent(text).splitlines()
    return [i + 1 for i, line in enumerate(lines) if needle in line][nth]


@pytest.fixture
def fake_trl(tmp_path, monkeypatch):
    """A git repository of a fake trl: night 1's chain tests grpo, bnpo and dapo."""
    monkeypatch.setenv("MASKFUZZ_CACHE", str(tmp_path / "cache"))
    repo = git.Repo.init(tmp_path / "trl")
    files = {"trl/__init__.py": "", "trl/trainer/__init__.py": "", _GR: _trainer(1)}
    commit(repo, files, "night 1", 1)
    return {"trl": tmp_path / "trl"}, repo


def _poisoned_case() -> Case:
    """One row, its second token masked with a large per-token loss there."""
    return Case.build(trainable=[[1, 0]], extra={"loss": [[0.5, 1000.0]]}, dtype="float64")


def test_a_loss_type_added_upstream_is_discovered_and_fuzzed_the_next_night(fake_trl):
    repos, repo = fake_trl
    first = fuzz_cmd._discover(["trl@HEAD"], [], repos)["trl@HEAD"]
    # the aggregation chain (the one assigning `loss`), not the per-token `if self.loss_type == "grpo"` before it
    assert [(v["entry"], v["covered_by"]) for v in first["variants"]] == [
        ("agg:grpo", "agg-grpo"), ("agg:bnpo", "agg-bnpo"), ("agg:dapo", "agg-dapo"),
        ("policy-is:token", "policy-grpo"), ("policy-is:sequence", "policy-gspo"),
    ]  # fmt: skip
    grpo_at = _line(_trainer(1), 'self.loss_type == "grpo"', 1)
    assert first["variants"][0]["at"] == f"{_GR}:{grpo_at}" and first["variants"][0]["kind"] == "loss-aggregation"
    assert first["variants"][-1]["kind"] == "policy-loss" and first["variants"][-1]["callable"]
    # every loss type and both importance-sampling levels have a hand-written entry with a reference
    assert first["labels"] == []

    night1 = first["resolved"]
    commit(repo, {_GR: _trainer(2)}, "add four loss types", 2)
    second = fuzz_cmd._discover(["trl@HEAD"], [], repos)["trl@HEAD"]
    night2 = second["resolved"]
    assert night2 != night1 == repo.commit("HEAD~1").hexsha
    new = ("agg:seq_sum", "agg:leaky", "agg:adv_weighted", "agg:dropout")
    new += ("policy-is:by_advantage",)
    assert second["labels"] == [f"trl:{n}@HEAD" for n in new]
    by = {v["name"]: v for v in second["variants"]}
    at = _GR + ":" + str(_line(_trainer(2), 'in ["seq_sum", "leaky"]'))
    assert by["seq_sum"]["at"] == by["leaky"]["at"] == at and by["seq_sum"]["judged"] == "invariants only"
    assert by["seq_sum"]["callable"] and by["leaky"]["callable"]
    assert not by["adv_weighted"]["callable"] and "reads advantages" in by["adv_weighted"]["reason"]
    assert not by["dropout"]["callable"] and f"torch.rand at {_GR}:" in by["dropout"]["reason"]
    level = next(v for v in second["variants"] if v["entry"] == "policy-is:by_advantage")
    assert not level["callable"] and "reads advantages" in level["reason"]

    # fuzzed as the night's run fuzzes it, through the chain at the pin, beside branches the kind cannot run
    seq = run(job(f"trl:agg:seq_sum@{night2}", repos, examples=10))
    assert seq["status"] == "ok" and seq["judged"] == "invariants only", seq.get("reason")
    assert seq["kind"] == "loss-aggregation" and seq["checked"]["reference"] == 0
    assert seq["checked"]["poison"] > 0 and seq["checked"]["permutation"] > 0 and seq["checked"]["split-invariance"] > 0
    assert not seq["defects"], seq["defects"]
    assert any("loss_type 'seq_sum' tested at" in n for n in seq["notes"]), seq["notes"]
    # the mask-blind one: a masked per-token loss moves the step's loss
    with open_target(f"trl:agg:leaky@{night2}", repos=repos, timeout=30) as handle:
        assert handle.resolved == night2 and handle.declared.reference is False
        verdicts = {v.property: v for v in judge(handle.run, _poisoned_case(), handle.declared)}
    assert verdicts["poison"].failed and verdicts["reference"].status == "n/a"
    # listed ones are skips with the reason; a value absent on night 1 is a skip there
    adv = run(job(f"trl:agg:adv_weighted@{night2}", repos, examples=15))
    assert adv["status"] == "skipped" and "inputs beyond what the loss-aggregation kind holds" in adv["reason"]
    drop = run(job(f"trl:agg:dropout@{night2}", repos, examples=15))
    assert drop["status"] == "skipped" and "random draw or a rank" in drop["reason"]
    gone = run(job(f"trl:agg:seq_sum@{night1}", repos, examples=15))
    assert gone["status"] == "skipped" and "no loss_type 'seq_sum'" in gone["reason"]


def test_a_discovered_loss_type_parses_and_declares_no_reference():
    ref = parse_ref("trl:agg:sapo@1.16.0")
    assert ref.entry == "agg:sapo"
    spec = get("trl")
    declared = spec.declared(ref.entry, ref.pin)
    assert declared.kind == "loss-aggregation" and declared.reference is False and declared.promises == ()
    assert spec.adapter_for(ref.entry) == "maskfuzz.targets.trl.calls_discovered"
    assert spec.declared("agg-grpo").reference is True  # the hand-written entry keeps its reference


def test_a_discovered_loss_type_runs_in_agg_grpo_step_where_that_step_was_read():
    """The call recipe: an `agg:<loss_type>` is a branch of the chain `agg-grpo` runs, on the same micro-batches, so
    it takes agg-grpo's equal-splits api domain everywhere and its pipeline domain at the pins where the batch code
    was read; elsewhere (a release nobody read, a moving pin) none, and its findings stay reach api."""
    from maskfuzz.targets.trl.discover import AGG_PINS

    spec = get("trl")
    for pin in AGG_PINS:
        found, hand = spec.declared("agg:luspo", pin), spec.declared("agg-grpo", pin)
        assert found.pipeline is not None and found.pipeline == hand.pipeline, pin
        assert found.domain == hand.domain and found.domain.uneven_splits is False
        assert found.reference is False and found.promises == ()  # still invariants only, no promise of its own
    for pin in ("1.9.2", "1.10.0", "latest", "main"):
        assert spec.declared("agg:luspo", pin).pipeline is None, pin


def test_trl_release_loss_types_are_discovered_from_the_wheel():
    from maskfuzz.targets.runtime.acquire import acquire

    checkout = acquire(get("trl"), "1.16.0")
    found = {v.name: v for v in discovery.discover("trl", checkout.root) if v.prefix == "agg"}
    assert list(found) == ["grpo", "sapo", "bnpo", "dr_grpo", "cispo", "dapo", "vespo", "luspo"]
    found = {v.entry: v for v in discovery.discover("trl", checkout.root)}
    assert [e for e, v in found.items() if v.covered_by is None] == [
        "agg:sapo", "agg:cispo", "agg:vespo", "agg:luspo",
    ]  # fmt: skip
    assert all(v.callable for v in found.values()) and found["agg:luspo"].citation == f"{_GR}:3175"
    assert found["policy-is:token"].covered_by == "policy-grpo" and found["policy-is:sequence"].kind == "policy-loss"
    assert found["policy-is:sequence"].covered_by == "policy-gspo"


_LONE = Case.build(trainable=[[1]], extra={"loss": [[0.3]]}, dtype="float64")
_PADDED = Case.build(trainable=[[1, 0]], extra={"loss": [[0.3, 0.0]]}, dtype="float64")


def _luspo(label: str, repos: dict) -> list[float]:
    with open_target(label, repos=repos, timeout=60) as handle:
        return [float(handle.run(case)[1][0, 0]) for case in (_LONE, _PADDED)]  # d loss / d l at the trained token


def test_luspo_at_git_main_breaks_pad_invariance():
    """The defect of docs/kinds/trl.md: at f2cd577 `(per_token_loss * mask.sum(1, keepdim=True)).mean()` means over the
    padding column too, so one padding column halves the trained token's gradient."""
    repos = parse_repos(None)
    if "trl" not in repos:
        pytest.skip("git pin: set MASKFUZZ_REPOS=trl=/path/to/trl-clone-or-mirror to test trl at git main")
    assert _luspo("trl:agg:luspo@f2cd57710ae345ea6428ae95363267fcf38a3dc8", repos) == pytest.approx([1.0, 0.5])


@pytest.mark.network
def test_luspo_at_1_16_0_is_pad_invariant():
    """1.16.0 masks before aggregating (`(per_token_loss * mask).sum(-1).mean()`): padding changes nothing."""
    assert _luspo("trl:agg:luspo@1.16.0", {}) == pytest.approx([1.0, 1.0])

"""slime's and miles' variants discovered from their argparse options (`targets/{slime,miles}/discover.py`, the shared
reader `targets/adapters/trainer_options.py`): the choices of --advantage-estimator / --kl-loss-type / --loss-type and
the switches the policy loss reads, each mapped to the hand-written entry that runs it or made an invariants-only
entry; a choice or switch that lands upstream is found, and fuzzed, the next night without a change to maskfuzz."""

from __future__ import annotations

import shutil
from pathlib import Path

import git
import pytest
from discovery_nights import commit, job, run

from maskfuzz.fuzz.commands import fuzz as fuzz_cmd
from maskfuzz.oracles.case import Case
from maskfuzz.oracles.kinds.judge import judge
from maskfuzz.targets import discovery
from maskfuzz.targets.registry import get
from maskfuzz.targets.runtime.repos import parse_repos
from maskfuzz.targets.runtime.session import open_target

# -- a fake slime (test input, not a target): the argparse layout and the two functions that switch on it ---------
_ARGS = """
def add_args(parser, reset_arg):
    reset_arg(parser, "--calculate-per-token-loss", action="store_true")
    parser.add_argument("--loss-type", type=str, choices=["policy_loss", "sft_loss", "custom_loss"])
    parser.add_argument("--kl-loss-type", type=str, choices=["k1", "k2", "k3", "low_var_kl"], default="k1")
    parser.add_argument(
        "--advantage-estimator",
        type=str,
        choices={estimators},
        default="grpo",
    )
    parser.add_argument("--normalize-advantages", action="store_true", default=False)
    parser.add_argument("--use-tis", action="store_true", default=False)
    parser.add_argument("--tis-clip", type=float, default=2.0)
    parser.add_argument("--use-kl-loss", action="store_true", default=False){more}
    return parser
"""
_LOSS = """
def compute_advantages_and_returns(args, rollout_data):
    if args.advantage_estimator in {grpo_branch}:
        returns = get_grpo_returns(rollout_data["rewards"], rollout_data["kl"])
    elif args.advantage_estimator == "ppo":
        returns = None
    else:
        raise NotImplementedError(args.advantage_estimator)
    if args.normalize_advantages:
        returns = returns
    return returns


def policy_loss_function(args, batch, logits, sum_of_sample_mean):
    if args.advantage_estimator == "gspo":
        ppo_kl = None
    if args.use_tis:
        ppo_kl = None
    if args.use_kl_loss:
        ppo_kl = None{reads}
    return sum_of_sample_mean(logits, args.calculate_per_token_loss)


def loss_function(args, batch, logits):
    match args.loss_type:
        case "policy_loss":
            return policy_loss_function(args, batch, logits, None)
        case "sft_loss":
            return None
"""
_NIGHT1 = ["grpo", "gspo", "ppo"]


def _slime_files(estimators: list[str], grpo_branch: list[str], new_switch: bool) -> dict[str, str]:
    more = '\n    parser.add_argument("--use-new-fix", action="store_true", default=False)' if new_switch else ""
    reads = "\n    if args.use_new_fix:\n        ppo_kl = None" if new_switch else ""
    return {
        "slime/__init__.py": "",
        "slime/utils/arguments.py": _ARGS.replace("{estimators}", repr(estimators)).replace("{more}", more),
        "slime/backends/megatron_utils/loss.py": _LOSS.replace("{grpo_branch}", repr(grpo_branch)).replace(
            "{reads}", reads
        ),
    }


@pytest.fixture
def fake_slime(tmp_path, monkeypatch):
    monkeypatch.setenv("MASKFUZZ_CACHE", str(tmp_path / "cache"))
    repo = git.Repo.init(tmp_path / "slime")
    commit(repo, _slime_files(_NIGHT1, ["grpo", "gspo"], False), "night 1", 1)
    return {"slime": tmp_path / "slime"}, repo


def test_slime_options_are_read_at_the_pin_and_a_new_choice_is_an_entry_the_next_night(fake_slime):
    repos, repo = fake_slime
    first = fuzz_cmd._discover(["slime@HEAD"], [], repos)["slime@HEAD"]
    by = {v["entry"]: v for v in first["variants"]}
    # the choices a hand-written entry runs keep it; each at the line it is written
    assert by["adv:grpo"]["covered_by"] == "grpo" and by["adv:ppo"]["covered_by"] == "default"
    assert by["adv:ppo"]["kind"] == "gae" and by["adv:gspo"]["at"] == "slime/utils/arguments.py:9"
    assert by["adv:gspo"]["covered_by"] is None and by["adv:gspo"]["callable"]  # grpo's branch, the option set
    assert by["kl:k2"]["covered_by"] == "kl-k2" and by["kl:k3"]["covered_by"] == "kl-k3"
    assert by["kl:k2"]["judged"] == "reference"
    # the policy loss tests gspo (its own code): the policy-gspo entry's; ppo it never tests: the policy entry's code
    assert by["policy:gspo"]["covered_by"] == "policy-gspo" and by["policy:ppo"]["covered_by"] == "policy-loss"
    # switches the policy loss reads, read from `reset_arg` too; a switch the kind cannot hold is listed with why
    assert by["switch:calculate_per_token_loss"]["covered_by"] == "policy-loss"
    assert by["switch:use_tis"]["callable"] and by["switch:use_tis"]["judged"] == "invariants only"
    # --use-kl-loss runs with the KL loss of slime's example (trainer_options.WITH), the reference = old log-probs
    kl_loss = by["switch:use_kl_loss"]
    assert kl_loss["callable"] and kl_loss["reason"] == "" and kl_loss["judged"] == "invariants only"
    assert by["adv-switch:normalize_advantages"]["covered_by"] == "default"
    sft = by["loss:sft_loss"]
    assert not sft["callable"] and sft["reason"].endswith("slime/backends/megatron_utils/loss.py:28")
    assert "adv:new_est" not in by and "switch:use_new_fix" not in by

    # night 2: upstream adds an estimator in grpo's branch, one with its own branch, and a switch of the policy loss
    commit(repo, _slime_files([*_NIGHT1, "new_est", "odd_est"], ["grpo", "gspo", "new_est"], True), "night 2", 2)
    second = fuzz_cmd._discover(["slime@HEAD"], [], repos)["slime@HEAD"]
    assert second["resolved"] == repo.head.commit.hexsha != first["resolved"]
    now = {v["entry"]: v for v in second["variants"]}
    changes = discovery.changes(list(by), list(now))
    assert changes == {"appeared": ["adv:new_est", "adv:odd_est", "policy:new_est", "policy:odd_est",
                                    "switch:use_new_fix"], "disappeared": []}  # fmt: skip
    assert now["adv:new_est"]["callable"] and now["switch:use_new_fix"]["callable"]
    assert now["policy:new_est"]["covered_by"] == "policy-loss"  # the policy loss does not test it
    odd = now["adv:odd_est"]
    assert not odd["callable"] and "has no branch for it: slime/backends/megatron_utils/loss.py:2" in odd["reason"]
    labels = second["labels"]
    assert "slime:adv:new_est@HEAD" in labels and "slime:switch:use_new_fix@HEAD" in labels
    assert "slime:adv:grpo@HEAD" not in labels  # covered: fuzzed by its hand-written entry

    # a listed one is a skip that says why; a choice absent the night before is a skip there
    listed = run(job(f"slime:loss:sft_loss@{second['resolved']}", repos, timeout=60.0))
    assert listed["status"] == "skipped" and "no call recipe for this loss type yet" in listed["reason"]
    gone = run(job(f"slime:adv:new_est@{first['resolved']}", repos, timeout=60.0))
    assert gone["status"] == "skipped" and "no variant 'adv:new_est'" in gone["reason"], gone["reason"]


def test_a_discovered_slime_or_miles_variant_declares_no_reference_and_the_code_s_dtypes():
    for target in ("slime", "miles"):
        spec = get(target)
        declared = spec.declared("policy:gspo")
        assert declared.kind == "policy-loss" and declared.reference is False and declared.promises == ()
        assert declared.domain.dtypes == ("float32",)  # the logits' float32 assertion, as the hand-written entry's
        assert spec.adapter_for("switch:use_tis") == f"maskfuzz.targets.{target}.calls_discovered"
        adv = spec.declared("adv:gspo")
        assert adv.kind == "group-advantage" and adv.masked_zero is False  # broadcast over every token, as grpo's
        assert spec.declared("policy-loss").reference is True


# -- miles from the released wheel (PyPI into the cache) ------------------------------------------------------------
def _wheel_root() -> Path:
    from maskfuzz.targets.runtime.acquire import acquire

    return acquire(get("miles"), "0.0.2").root


def test_miles_release_variants_are_discovered_from_the_wheel_and_k2_is_judged_by_its_entry():
    root = _wheel_root()
    found = {v.entry: v for v in discovery.discover("miles", root)}
    adv = [e for e in found if e.startswith("adv:")]
    assert adv == ["adv:grpo", "adv:gspo", "adv:reinforce_plus_plus", "adv:reinforce_plus_plus_baseline", "adv:ppo",
                   "adv:on_policy_distillation"]  # fmt: skip
    assert found["adv:gspo"].callable and found["adv:gspo"].citation == "miles/utils/arguments.py:928"
    opd = found["adv:on_policy_distillation"]
    assert not opd.callable and "miles/backends/training_utils/loss.py:383" in opd.reason
    new = sorted(e for e, v in found.items() if v.covered_by is None and v.callable)
    # policy:gspo: policy-gspo's
    assert new == ["adv:gspo", "switch:use_kl_loss", "switch:use_opsm", "switch:use_rollout_logprobs",
                   "switch:use_tis", "switch:use_unbiased_kl"], new  # fmt: skip
    # k2 is the hand-written kl-k2 entry's (discover.COVERED): miles' compute_approx_kl(kl_loss_type="k2") judged
    # against the kl reference's (log r)^2 / 2
    assert found["kl:k2"].covered_by == "kl-k2"
    case = Case.build(trainable=[[1, 1, 0]], extra={"logp": [[-1.0, -0.5, -3.0]], "ref_logp": [[-1.2, -0.1, 0.0]]},
                      dtype="float32")  # fmt: skip
    with open_target("miles:kl-k2@0.0.2", repos={}, timeout=60) as handle:
        assert handle.declared.reference is True
        verdicts = {v.property: v for v in judge(handle.run, case, handle.declared)}
    assert verdicts["reference"].status == "pass" and verdicts["no-crash"].status == "pass"
    assert all(verdicts[p].status == "pass" for p in ("poison", "pad-invariance", "deterministic")), verdicts


def test_a_switch_added_to_the_miles_release_is_fuzzed_the_next_night(tmp_path, monkeypatch):
    """Night 1 is the release's own package in a git repository the test builds; night 2 adds a switch that the
    policy loss reads (and does nothing with): it is an entry, and it runs through miles' own loss code."""
    monkeypatch.setenv("MASKFUZZ_CACHE", str(tmp_path / "cache"))
    repo = git.Repo.init(tmp_path / "miles")
    shutil.copytree(_wheel_root() / "miles", tmp_path / "miles" / "miles")
    night1 = commit(repo, {}, "night 1: the 0.0.2 release", 1)
    args_rel, loss_rel = "miles/utils/arguments.py", "miles/backends/training_utils/loss.py"
    args_text = (tmp_path / "miles" / args_rel).read_text()
    anchor = '                "--use-opsm",\n'
    assert anchor in args_text
    args_text = args_text.replace(
        anchor, '                "--use-new-fix", action="store_true", default=False,\n            )\n'
        "            parser.add_argument(\n" + anchor, 1)  # fmt: skip
    loss_text = (tmp_path / "miles" / loss_rel).read_text()
    anchor = "    if args.use_opsm:\n"
    assert anchor in loss_text
    loss_text = loss_text.replace(anchor, "    if args.use_new_fix:\n        pass\n" + anchor, 1)
    night2 = commit(repo, {args_rel: args_text, loss_rel: loss_text}, "night 2: a new switch", 2)
    repos = {"miles": tmp_path / "miles"}
    entries = [v["entry"] for v in fuzz_cmd._discover([f"miles@{night2}"], [], repos)[f"miles@{night2}"]["variants"]]
    assert "switch:use_new_fix" in entries
    ran = run(job(f"miles:switch:use_new_fix@{night2}", repos, examples=3, timeout=60.0))
    assert ran["status"] == "ok" and ran["examples"] >= 3, ran  # it ran through miles' own loss code
    assert any("set: use_new_fix=True" in n for n in ran["notes"]), ran["notes"]
    gone = run(job(f"miles:switch:use_new_fix@{night1}", repos, timeout=60.0))
    assert gone["status"] == "skipped" and "no variant 'switch:use_new_fix'" in gone["reason"]


# -- slime at the mirror (git only) --------------------------------------------------------------------------------
def test_slime_variants_at_the_mirror_head():
    repos = parse_repos(None)
    if "slime" not in repos:
        pytest.skip("slime is git only: set MASKFUZZ_REPOS=slime=/path/to/slime-clone-or-mirror to read its options")
    from maskfuzz.targets.runtime.acquire import acquire

    root = acquire(get("slime"), "624b824a8", repos=repos).root
    found = {v.entry: v for v in discovery.discover("slime", root)}
    assert [e for e in found if e.startswith("adv:")] == [
        "adv:grpo",
        "adv:gspo",
        "adv:cispo",
        "adv:reinforce_plus_plus",
        "adv:reinforce_plus_plus_baseline",
        "adv:ppo",
    ]
    assert found["adv:cispo"].citation == "slime/utils/arguments.py:946"
    new = sorted(e for e, v in found.items() if v.covered_by is None and v.callable)
    assert new == ["adv:gspo", "policy:cispo", "switch:use_kl_loss", "switch:use_opsm",
                   "switch:use_rollout_logprobs", "switch:use_tis", "switch:use_unbiased_kl"], new  # fmt: skip
    assert found["kl:k2"].covered_by == "kl-k2" and found["adv:cispo"].covered_by == "grpo"  # grpo's option
    extra = {
        "logp": [[-1.0, -0.4, -2.0], [-0.3, -1.2, -0.6]],
        "old_logp": [[-1.1, -0.5, -2.0], [-0.2, -1.0, -0.9]],
        "adv": [[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]],
    }
    case = Case.build(trainable=[[1, 1, 0], [1, 1, 1]], extra=extra, dtype="float32")
    with open_target("slime:policy:cispo@624b824a8", repos=repos, timeout=120) as handle:
        verdicts = {v.property: v for v in judge(handle.run, case, handle.declared)}
    assert verdicts["reference"].status == "n/a"
    assert all(verdicts[p].status == "pass" for p in ("no-crash", "poison", "pad-invariance", "permutation")), verdicts

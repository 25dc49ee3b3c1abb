"""TRL through its adapter: the inline GAE block of PPOTrainer.train() and the old standalone
PPOTrainer.compute_advantages, run from the source at each pin, judged by the oracle.

The verdicts asserted here were derived by reading TRL's code:

* train(): `padding_mask = idx > sequence_lengths` (what the policy trains on) but
  `padding_mask_p1 = idx > sequence_lengths + 1` keeps the value at the first pad slot, and the
  score goes to `sequence_lengths + 1` when that slot exists. So the value of the first pad slot
  bootstraps into the last response token (poison leaks, lam < 1) and at gamma = 0 the score never
  reaches a trained token (score lost). A row without padding places the score on its last token
  and is plain GAE. `masked_var` divides by mask_sum - 1: one trained token in the batch gives NaN.
* compute_advantages (<= 0.11): values and rewards multiplied by the mask, plain loop (dense
  contract), score at the last mask token by compute_rewards, whitening with no masked fill.
  `compute_rewards` indexes `mask.nonzero()[-1]`: a row without a mask token raises IndexError.

Release pins download wheels (network marker); the git pin needs MASKFUZZ_REPOS=trl=/path.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from maskfuzz.fuzz.engine import fuzz_target
from maskfuzz.oracles.case import Case
from maskfuzz.oracles.kinds.dispatch import judge
from maskfuzz.targets.adapters.base import NotPresent
from maskfuzz.targets.adapters.extract import BlockNotFound
from maskfuzz.targets.runtime.repos import parse_repos
from maskfuzz.targets.runtime.session import Skip, open_target
from maskfuzz.targets.trl import calls as trl_calls
from maskfuzz.targets.trl import declare as trl
from maskfuzz.targets.trl import declare_ppo
from maskfuzz.targets.trl.declare_kinds import DEFERRED_PROMISES, KL_ENTRIES

NEWEST_PPO = "1.12.0"
OLD = "0.11.4"
NO_PPO = "1.16.0"
GIT_PIN = next(p.rev for p in trl.SPEC.pins if p.kind == "git")


def verdicts(run, case: Case, entry: str | None = None) -> dict:
    return {v.property: v for v in judge(run, case, trl.declared_for(entry))}


# The seed report's case: a masked padding slot with a poisoned value.
SEED = Case.build(trainable=[[1, 1, 0]], token_rewards=[[0, 1, 0]], values=[[0, 0, 100]], gamma=1.0, lam=0.95)


# ---------------------------------------------------------------------------------------------
# Release pins (wheels): one worker per pin and entry for the whole module.
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module", params=[NEWEST_PPO, OLD])
def train(request):
    with open_target(f"trl@{request.param}") as h:
        yield h


@pytest.fixture(scope="module")
def old():
    with open_target(f"trl:compute_advantages@{OLD}") as h:
        yield h


@pytest.mark.network
def test_train_is_found_in_the_trainer_file_of_the_pin(train):
    want = "trl/experimental/ppo/ppo_trainer.py" if train.pin == NEWEST_PPO else "trl/trainer/ppov2_trainer.py"
    assert train.info["where"].startswith(want), train.info["where"]
    assert train.info["stand_ins_used"] == []  # nothing of trl is imported


@pytest.mark.network
def test_train_leaks_the_value_of_the_first_pad_slot(train):
    adv, ret = train.run(SEED)
    # returns are not whitened: A_2 = -100 (score slot), A_1 = 1 + 100 - 95 = 6, A_0 = 0.95 * 6
    assert ret[0, :2].tolist() == pytest.approx([5.7, 6.0], rel=1e-6)
    assert adv[0, 2] == 0  # masked fill
    v = verdicts(train.run, SEED)
    assert v["poison"].failed and v["reference"].failed
    assert v["masked-zero"].status == "pass" and v["deterministic"].status == "pass"


@pytest.mark.network
def test_train_ignores_values_past_the_first_pad_slot(train):
    # only the slot two after the response is poisoned: padding_mask_p1 zeroes it
    case = Case.build(trainable=[[1, 1, 0, 0]], token_rewards=[[0, 1, 0, 0]], values=[[0, 0, 0, 100]], gamma=1, lam=0.5)
    assert verdicts(train.run, case)["poison"].status == "pass"


@pytest.mark.network
def test_train_loses_the_score_at_gamma_zero(train):
    case = Case.build(trainable=[[1, 1, 0], [1, 0, 0]], score=[1.0, 1.0], gamma=0.0, lam=0.9)
    adv, ret = train.run(case)
    assert ret[0, 1] == 0 and ret[1, 0] == 0  # the score sits at the first pad slot, not trained on
    v = verdicts(train.run, case)
    assert v["score-kept"].failed and v["score-kept"].positions == [[0, 1], [1, 0]]


@pytest.mark.network
def test_train_rows_without_padding_are_plain_gae(train):
    g = torch.Generator().manual_seed(0)
    case = Case.build(
        trainable=[[1, 1, 1, 1]] * 3,
        token_rewards=torch.randn(3, 4, generator=g, dtype=torch.float64),
        values=torch.randn(3, 4, generator=g, dtype=torch.float64),
        score=[1.0, -0.5, 2.0],
        gamma=0.9,
        lam=0.7,
    )
    v = verdicts(train.run, case)
    for prop in ("all-trainable", "reference", "deterministic", "no-crash"):
        assert v[prop].status == "pass", (prop, v[prop].message)
    # The row twin adds a padding column (issue 24: padding, never a new sample). To TRL that column is a first pad
    # slot, its terminal state after the last token (padding_mask_p1, trl/experimental/ppo/ppo_trainer.py:767-769,
    # 778-779 at 1.12.0): the score moves onto it and reaches the last token decayed. The same ended sample's advantage
    # depends on whether padding follows it: the root cause of corpus entry 83384c4ed0209044 (universal:score-kept)
    assert v["row-independence"].failed


@pytest.mark.network
def test_train_single_trained_token_gives_nan(train):
    # masked_var: Bessel correction mask_sum / (mask_sum - 1) = 1 / 0 (TRL's own comment says so)
    # the judge treats whitening over < 2 trained tokens as undefined: every property is n/a there
    case = Case.build(trainable=[[1, 0]], score=[1.0], gamma=1, lam=1)
    adv, _ = train.run(case)
    assert torch.isnan(adv[0, 0])
    v = verdicts(train.run, case)
    assert v["no-crash"].status == "n/a" and "undefined for < 2" in v["no-crash"].message


@pytest.mark.network
def test_train_all_masked_batch_is_a_documented_error(train):
    # masked_var raises "The sum of the mask is zero" (a documented error); the judge calls the case n/a
    case = Case.build(trainable=[[0, 0]], attention=[[0, 0]], gamma=1, lam=1)
    with pytest.raises(Exception, match="The sum of the mask is zero"):
        train.run(case)
    v = verdicts(train.run, case)
    assert v["no-crash"].status == "n/a"


@pytest.mark.network
def test_old_compute_advantages_is_dense_and_selects_finite_poison(old):
    assert old.info["where"] == "trl/trainer/ppo_trainer.py::PPOTrainer.compute_advantages"
    v = verdicts(old.run, SEED, "compute_advantages")
    assert v["poison"].status == "pass" and v["reference"].status == "pass"
    assert v["masked-zero"].status == "n/a"  # declared: whitened everywhere, no masked fill
    # worked example 2 (a gap): the dense contract, returns unwhitened
    gap = Case.build(trainable=[[1, 0, 0, 1]], values=[[0.5, 9, 9, 0.25]], score=[1.0], gamma=0.9, lam=0.8)
    _, ret = old.run(gap)
    assert [ret[0, 0].item(), ret[0, 3].item()] == pytest.approx([0.396576, 1.0], rel=1e-5)
    assert verdicts(old.run, gap, "compute_advantages")["reference"].status == "pass"


@pytest.mark.network
def test_old_compute_advantages_multiplies_nan_poison_in(old):
    case = Case.build(trainable=[[1, 1, 0]], values=[[0.0, 1.0, math.nan]], score=[1.0], gamma=1, lam=0.5)
    v = verdicts(old.run, case, "compute_advantages")
    assert v["poison-nonfinite"].failed


@pytest.mark.network
def test_old_compute_rewards_crashes_on_a_row_without_mask_tokens(old):
    case = Case.build(trainable=[[1, 1], [0, 0]], attention=[[1, 1], [0, 0]], score=[1.0, 1.0], gamma=1, lam=1)
    v = verdicts(old.run, case, "compute_advantages")
    assert v["no-crash"].failed and "IndexError" in v["no-crash"].message


@pytest.mark.network
def test_release_without_ppo_trainer_skips_with_the_reason():
    with pytest.raises(Skip, match="no PPO trainer at this pin"):
        with open_target(f"trl@{NO_PPO}"):
            pass


@pytest.mark.network
def test_old_entry_exists_up_to_0_11_only(train):
    # the adapter imports nothing of trl, so it can look at the checkout in this process
    if train.pin == OLD:
        assert trl_calls.load(train.checkout.root, "compute_advantages").where.endswith("PPOTrainer.compute_advantages")
    else:
        with pytest.raises(NotPresent, match="standalone method exists up to 0.11"):
            trl_calls.load(train.checkout.root, "compute_advantages")


@pytest.mark.network
@pytest.mark.parametrize("train", [NEWEST_PPO], indirect=True)
def test_short_fuzz_of_train_finds_the_leak(train):
    result = fuzz_target(
        train.run, train.declared, target="trl", pin=train.pin, max_examples=60, seed=0, derandomize=True, shrink=False
    )
    failed = {p for p, n in result.failed.items() if n}
    assert {"poison", "reference"} <= failed, failed
    # row-independence: the twin's padding column is a new first pad slot to TRL (see the test above)
    assert not failed & {"masked-zero", "deterministic", "all-trainable"}, failed


# ---------------------------------------------------------------------------------------------
# Pipeline domains (no source needed).
# ---------------------------------------------------------------------------------------------
def test_pipeline_domains_are_cited_and_reject_what_the_ppo_loops_never_build():
    spec = trl.SPEC
    narrowed = {"gaps", "masked_real_tail", "leading_mask", "left_padding", "nonfinite_poison", "truncated_padded"}
    for pin in (NEWEST_PPO, GIT_PIN, "0.19.1", OLD):
        pipe = spec.pipeline_at(pin)
        assert pipe.cited() == [] and set(pipe.restrictions()) == narrowed, pin
    assert spec.pipeline_at(GIT_PIN) is spec.pipeline_at(NEWEST_PPO) is spec.pipeline
    assert "trl/trainer/ppov2_trainer.py:408" in spec.pipeline_at(OLD).why["gaps"]  # each pin cites its own lines
    train = spec.declared("train", NEWEST_PPO).pipeline
    # what PPOTrainer.train builds: a prefix of trained tokens then padding, an all-masked row (first token = pad),
    # raw KL and critic values under the mask (the block masks them itself), half precision
    built = Case.build(
        trainable=[[1, 1, 0], [0, 0, 0]],
        attention=[[1, 1, 0], [0, 0, 0]],
        dtype="bfloat16",
        token_rewards=[[0.1, -0.2, 0.3]] * 2,
        values=[[0.5, 0.25, 4.0]] * 2,
        score=[1.0, 0.0],
    )
    assert train.rejects(built) is None
    assert "gap" in train.rejects(Case.build(trainable=[[1, 0, 1]]))  # gaps
    assert "ends in real" in train.rejects(Case.build(trainable=[[1, 1, 0]], attention=[[1, 1, 1]]))  # tail
    assert "starts with real" in train.rejects(Case.build(trainable=[[0, 1, 1]], attention=[[1, 1, 1]]))  # leading
    assert "left-padded" in train.rejects(Case.build(trainable=[[0, 1, 1]], attention=[[0, 1, 1]]))  # left pad
    nan_value = Case.build(trainable=[[1, 1, 0]], attention=[[1, 1, 0]], values=[[0.5, 0.25, math.nan]])
    assert "NaN / inf" in train.rejects(nan_value)  # nonfinite_poison
    assert spec.declared("train", NEWEST_PPO).domain.rejects(nan_value) is None  # the api domain is unchanged
    # the old compute_advantages: step(response_masks=...) over query + response, float32 recursion
    old = spec.declared("compute_advantages", OLD).pipeline
    assert old is declare_ppo.OLD_PIPELINE and old.cited() == []
    assert set(old.restrictions()) == {"dtypes", "nonfinite_poison"}
    multi = Case.build(
        trainable=[[0, 1, 0, 1, 0], [0, 0, 0, 0, 0]],
        attention=[[0, 1, 1, 1, 1], [1, 1, 1, 1, 1]],
        token_rewards=[[0.5, -0.1, 0.2, 0.0, 3.0]] * 2,
        values=[[7.0, 1.0, -2.0, 0.5, 9.0]] * 2,
    )
    assert old.rejects(multi) is None and old.rejects(multi.replace(dtype="float64")) is None
    assert "dtype float16" in old.rejects(multi.replace(dtype="float16"))  # dtypes
    assert "NaN / inf" in old.rejects(nan_value)  # nonfinite_poison


# ---------------------------------------------------------------------------------------------
# Git pin (mirror).
# ---------------------------------------------------------------------------------------------
def test_git_head_has_the_same_block():
    repos = parse_repos(None)
    if "trl" not in repos:
        pytest.skip("git pin: set MASKFUZZ_REPOS=trl=/path/to/trl-clone-or-mirror to test trl at git main")
    with open_target(f"trl@{GIT_PIN}", repos=repos) as h:
        assert h.info["where"].startswith("trl/experimental/ppo/ppo_trainer.py::PPOTrainer.train")
        v = verdicts(h.run, SEED)
        assert v["poison"].failed and v["masked-zero"].status == "pass"
        assert h.run(CUT.replace(options={"missing_eos_penalty": 1.0}))[1].tolist() == [[1.0, 1.0], [0.0, 0.0]]
        with pytest.raises(Skip):
            with open_target(f"trl:compute_advantages@{GIT_PIN}", repos=repos):
                pass


# ---------------------------------------------------------------------------------------------
# Fake source trees: the adapter fails loudly, never guesses.
# ---------------------------------------------------------------------------------------------
def _tree(tmp_path, rel: str, text: str):
    path = tmp_path / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return tmp_path


def test_trainer_without_the_block_fails_loudly(tmp_path):
    text = "class PPOTrainer:\n    def train(self):\n        return 0\n"
    root = _tree(tmp_path, "trl/experimental/ppo/ppo_trainer.py", text)
    # BlockNotFound is a RuntimeError, not NotPresent: the worker reports it as a load error
    # (a SetupError in a session), never as a skip
    with pytest.raises(BlockNotFound, match="no GAE loop"):
        trl_calls.load(root, None)
    assert not issubclass(BlockNotFound, NotPresent)


def test_block_reading_unknown_args_fails_loudly(tmp_path):
    body = (
        "class PPOTrainer:\n"
        "    def train(self):\n"
        "        args = self.args\n"
        "        contain_eos_token = torch.any(postprocessed_responses == self.processing_class.eos_token_id, dim=-1)\n"
        "        if self.args.missing_eos_penalty is not None:\n"
        "            scores[~contain_eos_token] -= self.args.missing_eos_penalty\n"
        "        response_idxs = torch.arange(responses.shape[1])\n"
        "        padding_mask = response_idxs > sequence_lengths.unsqueeze(1)\n"
        "        lastgaelam = 0\n"
        "        for t in reversed(range(3)):\n"
        "            lastgaelam = scores + values[:, t] * args.new_discount + lastgaelam\n"
        "        advantages = lastgaelam\n"
        "        returns = advantages + values\n"
    )
    root = _tree(tmp_path, "trl/trainer/ppo_trainer.py", body)
    with pytest.raises(BlockNotFound, match="args.new_discount"):
        trl_calls.load(root, None)


def test_tree_without_any_ppo_trainer_is_not_present(tmp_path):
    root = _tree(tmp_path, "trl/trainer/grpo_trainer.py", "class GRPOTrainer:\n    def train(self):\n        pass\n")
    with pytest.raises(NotPresent, match="no PPO trainer"):
        trl_calls.load(root, None)
    with pytest.raises(NotPresent, match="compute_advantages"):
        trl_calls.load(root, "compute_advantages")


def test_helpers_are_followed_in_source_and_heavy_names_fail_loudly(tmp_path):
    from maskfuzz.targets.adapters.extract import SourceTree, find_class, find_gae_loop, find_method

    core = "import torch\nSCALE = 2.0\n\ndef helper(x):\n    return torch.as_tensor(x) * SCALE\n"
    _tree(tmp_path, "trl/core.py", core)
    body = (
        "import ray\n"
        "from ..core import helper\n"
        "class PPOTrainer:\n"
        "    def train(self):\n"
        "        lastgaelam = 0\n"
        "        for t in reversed(range(2)):\n"
        "            lastgaelam = helper(lastgaelam + t)\n"
        "        out = ray.get(lastgaelam)\n"
    )
    root = _tree(tmp_path, "trl/trainer/ppo_trainer.py", body)
    tree = SourceTree(root, ("trl",))
    path = root / "trl/trainer/ppo_trainer.py"
    stmts, i = find_gae_loop(find_method(find_class(tree.file(path).tree, "PPOTrainer"), "train"))
    # `helper` is compiled from trl/core.py with its own globals (torch, SCALE): (0 + 1) * 2, then (2 + 0) * 2
    ns = tree.block(path, stmts[i - 1 : i + 1], ()).run()
    assert float(ns["lastgaelam"]) == 4.0
    assert "trl/trainer/ppo_trainer.py::helper" in tree.provenance
    with pytest.raises(BlockNotFound, match="ray: `import ray` is not a light package"):
        tree.block(path, stmts[i - 1 :], ())


# ---------------------------------------------------------------------------------------------
# Group-advantage entries (targets/trl/calls_group.py): the inline advantage blocks of
# GRPOTrainer / RLOOTrainer._generate_and_score_completions, run from the source at the pin.
# Values below are hand-computed from TRL's code (nanstd unbiased, std + 1e-4, nan_to_num).
# ---------------------------------------------------------------------------------------------

from kind_support import handle_cache, verdicts_by_property  # noqa: E402

from maskfuzz.oracles.strategies import Sizes  # noqa: E402
from maskfuzz.targets.trl import calls_group, calls_kinds  # noqa: E402


@pytest.fixture(scope="module")
def group_entry():
    with handle_cache(lambda name, pin=NEWEST_PPO: open_target(f"trl:{name}@{pin}")) as get:
        yield get


kind_verdicts = verdicts_by_property


# groups 7 and 4 interleaved (ids are labels), group 9 a singleton; row 2 starts with a masked token
GROUPS = Case.build(
    trainable=[[1, 1], [1, 1], [0, 1], [1, 1], [1, 1]],
    attention=[[1, 1]] * 5,
    score=[1.0, 0.0, 3.0, 2.0, 5.0],
    group=[7, 4, 7, 4, 9],
    dtype="float32",
)


@pytest.mark.network
def test_grpo_dr_grpo_rloo_by_hand(group_entry):
    # group 7: 1, 3 (mean 2, nanstd sqrt 2); group 4: 0, 2 (mean 1, sqrt 2); the singleton group 9 is a group of one
    # scorable row in a num_generations = 2 layout (the filler is unscorable): nanstd NaN -> nan_to_num 0
    z = 1 / (2**0.5 + 1e-4)
    (adv,) = group_entry("grpo").run(GROUPS)
    assert adv[:, 1].tolist() == pytest.approx([-z, -z, z, z, 0.0], rel=1e-6)
    assert adv[2, 0].item() == pytest.approx(z, rel=1e-6)  # one value per completion, broadcast (not masked)
    (adv,) = group_entry("dr-grpo").run(GROUPS)  # r - mean_g
    assert adv[:, 1].tolist() == pytest.approx([-1.0, -1.0, 1.0, 1.0, 0.0])
    (adv,) = group_entry("rloo").run(GROUPS)  # r - (sum_g - r) / (count_g - 1); a singleton 0 / 0 -> 0
    assert adv[:, 1].tolist() == pytest.approx([-2.0, -2.0, 2.0, 2.0, 0.0])
    for name in ("grpo", "dr-grpo", "rloo"):
        h = group_entry(name)
        assert h.info["where"].startswith("trl/trainer/"), h.info["where"]
        v = kind_verdicts(h, GROUPS)
        for prop in ("no-crash", "reference", "permutation", "group-isolation", "affine", "deterministic"):
            assert v[prop].status == "pass", (name, v[prop])


@pytest.mark.network
def test_an_all_masked_row_counts_in_its_group(group_entry):
    """A completion whose completion_mask is all 0 (mask_truncated_completions=True, grpo_trainer.py:2506-2510 at
    1.12.0) still enters its group's nanmean / nanstd (grpo_trainer.py:2785-2793): the block reads the rewards
    alone. Issue 24: a variant (empty_rows="counted", declared), not a defect; mask_truncated_completions speaks of
    the loss ("excluded from the loss calculation", grpo_config.py:268-271 at 1.16.0), not of the group statistics."""
    case = Case.build(trainable=[[1], [1], [0]], attention=[[1], [1], [1]], score=[1.0, 0.0, 5.0], group=[0, 0, 0])
    (adv,) = group_entry("grpo").run(case)
    std = 7**0.5  # scores 1, 0, 5: mean 2, unbiased var (1 + 4 + 9) / 2
    assert adv[:2, 0].tolist() == pytest.approx([-1 / (std + 1e-4), -2 / (std + 1e-4)], rel=1e-6)
    assert trl.SPEC.for_entry("grpo").variant["empty_rows"] == "counted"
    v = kind_verdicts(group_entry("grpo"), case)
    assert v["reference"].status == "pass"  # the declared variant: the row counts, as TRL counts it


@pytest.mark.network
def test_rloo_nan_under_the_mask_makes_the_row_unscorable(group_entry):
    """Low (api): per_token_kl * completion_mask keeps a NaN (rloo_trainer.py:1578 at 1.12.0); the NaN reward is then
    taken for an unscorable row, zeroed by nan_to_num, and its sibling becomes a group of one (0)."""
    nan = Case.build(
        trainable=[[1, 1], [0, 1]],
        attention=[[1, 1], [0, 1]],
        score=[0.0, 1.0],
        group=[0, 0],
        token_rewards=[[0.0, 0.0], [math.nan, 0.0]],
        dtype="float32",
    )
    (adv,) = group_entry("rloo").run(nan)
    assert adv.tolist() == [[0.0, 0.0], [0.0, 0.0]]
    clean = nan.replace(token_rewards=torch.zeros(2, 2, dtype=torch.float64))
    assert group_entry("rloo").run(clean)[0][:, 1].tolist() == [-1.0, 1.0]
    assert kind_verdicts(group_entry("rloo"), nan)["poison-nonfinite"].failed
    finite = nan.replace(token_rewards=torch.tensor([[0.0, 0.0], [1e4, 0.0]], dtype=torch.float64))
    assert kind_verdicts(group_entry("rloo"), finite)["poison"].status == "pass"  # finite poison * 0 is 0


@pytest.mark.network
def test_group_entries_at_old_pins(group_entry):
    # 0.19.1: GRPO without unscorable rows (plain .mean() / .std(), scale_rewards a bool): equal groups only
    v = kind_verdicts(group_entry("grpo", "0.19.1"), GROUPS)
    assert v["no-crash"].status == "pass" and "GroupShapeError" in v["no-crash"].message
    two = Case.build(trainable=[[1]] * 4, score=[1.0, 0.0, 3.0, 2.0], group=[7, 4, 7, 4])
    (adv,) = group_entry("dr-grpo", "0.19.1").run(two)
    assert adv[:, 0].tolist() == pytest.approx([-1.0, -1.0, 1.0, 1.0])
    with pytest.raises(Skip, match="older RLOOTrainers are PPO-style"):
        group_entry("rloo", "0.19.1")
    with pytest.raises(Skip, match="GRPO arrived"):
        group_entry("grpo", OLD)


def _group_fuzz(h, n=40):
    return fuzz_target(h.run, h.declared, target="trl", pin=NEWEST_PPO, max_examples=n, seed=0, sizes=Sizes(4, 6))


@pytest.mark.network
@pytest.mark.parametrize(
    "name, failing",
    [
        ("grpo", {"reference", "affine"}),
        ("dr-grpo", set()),
        ("rloo", {"reference", "affine", "poison-nonfinite"}),
    ],
)
def test_short_fuzz_of_the_group_entries(group_entry, name, failing):
    """Issue 24: empty rows counted is the declared variant and the padding twin adds a column, never a sample, so
    pad-invariance holds. What is left on `grpo` / `rloo`: `reference` / `affine` on a row mask_truncated_completions
    clears, judged at its original positions where TRL's broadcast advantage is never read (a judge artefact, see
    DEFERRED_PROMISES); `poison-nonfinite` on rloo (api: the log-probs under the mask are finite)."""
    res = _group_fuzz(group_entry(name))
    found = {f.property for f in res.findings}
    assert found <= failing, found
    assert "pad-invariance" not in found
    assert res.checked["reference"] > 0 and res.checked["permutation"] > 0


def test_group_layout_fills_short_groups_with_unscorable_rows():
    pos, n, k = calls_group.layout(torch.tensor([7, 4, 7, 9]), 4, fill=True)
    assert (pos, n, k) == ([0, 2, 1, 4], 2, 3)  # group 7 -> slots 0, 1; group 4 -> 2 (3 filler); 9 -> 4 (5 filler)
    with pytest.raises(calls_group.GroupShapeError, match="sizes"):
        calls_group.layout(torch.tensor([7, 4, 7]), 3, fill=False)
    with pytest.raises(calls_group.GroupShapeError, match="num_generations < 2"):
        calls_group.layout(torch.tensor([1, 2]), 2, fill=False)


@pytest.mark.parametrize("name", ("grpo", "dr-grpo", "rloo"))
def test_each_group_entry_declares_a_cited_pipeline(name):
    assert name in trl.SPEC.entries
    spec = trl.SPEC.for_entry(name)
    assert spec.kind == "group-advantage" and spec.variant["singleton"] == "zero"
    assert spec.pipeline is not None and spec.pipeline.cited() == [], spec.pipeline.restrictions()
    assert spec.domain.cited() == []
    assert spec.masked_zero is False and spec.masked_zero_why
    assert spec.pipeline_at(NEWEST_PPO) is spec.pipeline  # the PPO entry's per-pin domains do not leak in


# ---------------------------------------------------------------------------------------------
# loss-aggregation: the `if self.loss_type ...` normalisation chain of GRPOTrainer._compute_loss, run from source per
# micro-batch (calls_aggregate.load_aggregate). Values hand-computed from the 1.16.0 block (grpo_trainer.py:3152-3184).
# ---------------------------------------------------------------------------------------------
NEWEST = "1.16.0"
AGG = ("agg-grpo", "agg-bnpo", "agg-dr_grpo", "agg-dapo")
# 2 x 3, row 0 two tokens, row 1 one; 9 under the mask; one row per micro-batch (gradient accumulation 2)
TWO_MB = Case.build(trainable=[[1, 1, 0], [1, 0, 0]], extra={"loss": [[1.0, 2.0, 9.0], [4.0, 9.0, 9.0]]}, split=[0, 1])


def _flat(grad):
    return grad.flatten().tolist()


@pytest.mark.network
def test_aggregation_blocks_by_hand_over_two_micro_batches(group_entry):
    h = {name: group_entry(name, NEWEST) for name in AGG}
    # dapo: sum / (num_items_in_batch 3 / 1 process * GA 2 / steps_per_generation 2) per micro-batch: 3/3 + 4/3
    loss, grad = h["agg-dapo"].run(TWO_MB)
    assert loss[0, 0].item() == pytest.approx(7 / 3, rel=1e-6)
    assert _flat(grad) == pytest.approx([1 / 3, 1 / 3, 0, 1 / 3, 0, 0], rel=1e-6)
    # grpo: micro-batch mean of row token means / GA: 1.5 / 2 + 4 / 2 = 2.75 (= the step's mean of row means)
    loss, grad = h["agg-grpo"].run(TWO_MB)
    assert loss[0, 0].item() == pytest.approx(2.75, rel=1e-6)
    assert _flat(grad) == pytest.approx([0.25, 0.25, 0, 0.5, 0, 0], rel=1e-6)
    # bnpo: the micro-batch's own token mean / GA: 3/2/2 + 4/1/2 = 2.75, not the step's 7/3 (documented "local")
    loss, grad = h["agg-bnpo"].run(TWO_MB)
    assert loss[0, 0].item() == pytest.approx(2.75, rel=1e-6)
    # dr_grpo: sum / (1 row * max_completion_length 512) / GA: 7 / 1024
    loss, grad = h["agg-dr_grpo"].run(TWO_MB)
    assert loss[0, 0].item() == pytest.approx(7 / 1024, rel=1e-6)
    assert _flat(grad) == pytest.approx([1 / 1024, 1 / 1024, 0, 1 / 1024, 0, 0], rel=1e-6)
    for name in AGG:
        assert h[name].info["where"].startswith("trl/trainer/grpo_trainer.py::GRPOTrainer._compute_loss (lines 3152-")
        v = kind_verdicts(h[name], TWO_MB)
        for prop in ("poison", "permutation", "masked-zero", "deterministic"):
            assert v[prop].status == "pass", (name, prop, v[prop])
        # bnpo declares its documented per-micro-batch normaliser (scope="micro-batch"), grpo the micro-batch row
        # mean it runs (no global normaliser, grpo_trainer.py:3154-3157): their reference is that, and
        # split-invariance does not apply to them
        want = "n/a" if name in ("agg-bnpo", "agg-grpo") else "pass"
        assert v["split-invariance"].status == want and v["reference"].status == "pass", (name, v["reference"])


@pytest.mark.network
def test_grpo_counts_all_masked_rows_and_bnpo_normalises_per_micro_batch(group_entry):
    """grpo: `.mean()` over the micro-batch's rows counts a row with no token (grpo_trainer.py:3154), e.g. a
    completion zeroed by mask_truncated_completions=True (:2488-2492). Issue 24: by design (every completion of the
    micro-batch counts, as the docs' 1/G sum_i 1/|o_i| writes it), declared empty_rows="counted"; the cleared row's
    tokens are out of the loss ("excluded from the loss calculation", grpo_config.py:268-271): no gradient, not
    penalised. A semantics fact, not a defect. bnpo: the micro-batch's token count (:3159), documented
    (grpo_config.py:249-252)."""
    case = Case.build(trainable=[[1, 1], [0, 0]], extra={"loss": [[1.0, 3.0], [5.0, 5.0]]})
    loss, _ = group_entry("agg-grpo", NEWEST).run(case)
    assert loss[0, 0].item() == pytest.approx(1.0)  # (2 + 0) / 2 rows; with the empty row excluded 2
    v = kind_verdicts(group_entry("agg-grpo", NEWEST), case)
    assert v["reference"].status == "pass"  # the declared variant: the empty row counts
    # equal micro-batches without empty rows (TRL's split_tensor_dict chunks equally): grpo and dr_grpo are invariant
    equal = Case.build(
        trainable=[[1, 1], [1, 0], [1, 0], [1, 0]],
        extra={"loss": [[1.0, 3.0], [5.0, 0], [2.0, 0], [7.0, 1.0]]},
        split=[0, 1, 0, 1],
    )  # 3 and 2 tokens: bnpo's local token means differ
    for name in ("agg-dr_grpo", "agg-dapo"):
        assert kind_verdicts(group_entry(name, NEWEST), equal)["split-invariance"].status == "pass", name
    assert kind_verdicts(group_entry("agg-grpo", NEWEST), equal)["split-invariance"].status == "n/a"  # micro-batch
    bnpo = kind_verdicts(group_entry("agg-bnpo", NEWEST), equal)
    assert bnpo["split-invariance"].status == "n/a" and bnpo["reference"].status == "pass"
    # an all-masked step: the clamps give 0 in every mode
    empty = Case.build(trainable=[[0, 0]], extra={"loss": [[1.0, 2.0]]})
    for name in AGG:
        loss, grad = group_entry(name, NEWEST).run(empty)
        assert loss.abs().sum() == 0 and grad.abs().sum() == 0


@pytest.mark.network
def test_aggregation_at_old_pins(group_entry):
    # 0.19.1: the chain has no normaliser; transformers' Trainer divides by gradient accumulation (the adapter does)
    loss, _ = group_entry("agg-grpo", "0.19.1").run(TWO_MB)
    assert loss[0, 0].item() == pytest.approx(2.75, rel=1e-6)
    with pytest.raises(Skip, match="no loss_type 'dapo'"):
        group_entry("agg-dapo", "0.19.1")
    with pytest.raises(Skip, match="GRPO arrived"):
        group_entry("agg-grpo", OLD)


def test_git_head_aggregation_block():
    repos = parse_repos(None)
    if "trl" not in repos:
        pytest.skip("git pin: set MASKFUZZ_REPOS=trl=/path/to/trl-clone-or-mirror to test trl at git main")
    with open_target(f"trl:agg-dapo@{GIT_PIN}", repos=repos) as h:
        loss, _ = h.run(TWO_MB)  # no GA / steps_per_generation rescale at this commit: equal when spg == GA
        assert loss[0, 0].item() == pytest.approx(7 / 3, rel=1e-6)


@pytest.mark.network
@pytest.mark.parametrize(
    "name, failing",
    [
        # issue 24: uneven micro-batches are outside the api domain (TRL's loader cuts equal ones), grpo is judged
        # as the micro-batch row mean it runs (empty rows counted): what is left is NaN through the mask (api)
        ("agg-grpo", {"empty-step", "poison-nonfinite"}),
        ("agg-bnpo", {"poison-nonfinite"}),
        # dr_grpo: split-invariance / reference on uneven micro-batches only: the case strategy does not honour the
        # api domain's uneven_splits=False yet (oracles/kinds/strategies.py draws every split), so they are still drawn
        ("agg-dr_grpo", {"poison-nonfinite", "split-invariance", "reference"}),
        ("agg-dapo", {"poison-nonfinite"}),
    ],
)
def test_short_fuzz_of_the_aggregation_entries(group_entry, name, failing):
    h = group_entry(name, NEWEST)
    res = fuzz_target(h.run, h.declared, target="trl", pin=NEWEST, max_examples=30, seed=0, sizes=Sizes(4, 6))
    found = {f.property for f in res.findings}
    assert found <= failing, found
    for f in res.findings:  # every split finding is on a split TRL's loader never cuts (outside the api domain)
        if f.property in ("split-invariance", "reference"):
            assert "micro-batches of different sizes" in (h.declared.domain.rejects(f.case) or ""), f.case
    micro = name in ("agg-bnpo", "agg-grpo")  # scope="micro-batch": split-invariance does not apply
    assert res.checked["reference"] > 0 and (res.checked["split-invariance"] > 0 or micro)


@pytest.mark.parametrize("name", AGG)
def test_each_aggregation_entry_is_declared(name):
    spec = trl.SPEC.for_entry(name)
    assert spec.kind == "loss-aggregation" and spec.masked_zero is True and spec.masked_zero_why
    assert spec.pipeline is not None and spec.pipeline.cited() == [], spec.pipeline.restrictions()
    assert trl.SPEC.adapter_for(name).endswith("trl.calls_kinds")


# ---------------------------------------------------------------------------------------------
# Options and truncated rows (docs/kinds/trl.md, "Options and truncation").
# ---------------------------------------------------------------------------------------------
# PPO train(): two full rows, gamma = lam = 1, values 0, score 1 each; row 1 is cut (no EOS).
# missing_eos_penalty = 1: row 1's score 1 - 1 = 0, so returns [[1, 1], [0, 0]]; the advantages are the returns
# whitened over the 4 trained tokens: mean 0.5, unbiased var 4 * 0.25 / 3 = 1/3, so +-0.5 / sqrt(1/3) = +-0.8660.
# Default (None): both rows keep score 1 (a cut row is terminal): returns all 1.
CUT = Case.build(trainable=[[1, 1], [1, 1]], score=[1.0, 1.0], gamma=1.0, lam=1.0, dtype="float64", truncated=[0, 1])


@pytest.mark.network
@pytest.mark.parametrize("train", [NEWEST_PPO, OLD], indirect=True)
def test_train_missing_eos_penalty_by_hand(train):
    adv, ret = train.run(CUT.replace(options={"missing_eos_penalty": 1.0}))
    assert ret.tolist() == [[1.0, 1.0], [0.0, 0.0]]
    assert adv.flatten().tolist() == pytest.approx([0.8660254, 0.8660254, -0.8660254, -0.8660254], rel=1e-6)
    _, ret = train.run(CUT)
    assert ret.tolist() == [[1.0, 1.0], [1.0, 1.0]]
    for case in (CUT, CUT.replace(options={"missing_eos_penalty": 1.0})):
        v = verdicts(train.run, case)
        assert v["reference"].status == "pass", v["reference"].message


@pytest.mark.network
def test_old_compute_advantages_score_clip_by_hand(old):
    # score 3 clipped to 1 by step()'s statement; gamma = lam = 1, values 0: returns [1, 1]
    case = Case.build(trainable=[[1, 1]], score=[3.0], gamma=1.0, lam=1.0, dtype="float64")
    _, ret = old.run(case.replace(options={"score_clip": 1.0}))
    assert ret.tolist() == [[1.0, 1.0]]
    assert old.run(case)[1].tolist() == [[3.0, 3.0]]
    assert verdicts(old.run, case.replace(options={"score_clip": 1.0}), "compute_advantages")["reference"].status == (
        "pass"
    )


# groups 0: scores 0, 2; 1: scores 1, 5 (one token each)
FOUR = Case.build(trainable=[[1]] * 4, score=[0.0, 2.0, 1.0, 5.0], group=[0, 0, 1, 1], dtype="float64")


@pytest.mark.network
def test_grpo_scale_rewards_option_by_hand(group_entry):
    h = group_entry("grpo", NEWEST)
    # "none": r - mean_g = [-1, 1, -2, 2]
    assert h.run(FOUR.replace(options={"scale_rewards": "none"}))[0].flatten().tolist() == [-1.0, 1.0, -2.0, 2.0]
    # "batch": / (nanstd of all rewards (mean 2, var (4 + 0 + 1 + 9) / 3) + 1e-4): -1 / (2.1602 + 1e-4) = -0.46290
    got = h.run(FOUR.replace(options={"scale_rewards": "batch"}))[0].flatten().tolist()
    assert got == pytest.approx([-0.46290, 0.46290, -0.92580, 0.92580], rel=1e-4)
    for value in ("none", "batch"):
        v = kind_verdicts(h, FOUR.replace(options={"scale_rewards": value}))
        assert v["reference"].status == "pass", v["reference"].message


@pytest.mark.network
def test_rloo_reward_clip_and_beta_options_by_hand(group_entry):
    h = group_entry("rloo", NEWEST)
    # clip to [-1, 1]: scores 0, 1 | 1, 1; leave-one-out: [-1, 1] and [0, 0]
    case = FOUR.replace(options={"reward_clip_range": 1.0, "beta": 0.0})
    assert h.run(case)[0].flatten().tolist() == [-1.0, 1.0, 0.0, 0.0]
    assert kind_verdicts(h, case)["reference"].status == "pass"


# token-mean (dapo) over rows [1, 2] and [4, x]; row 1 is cut. mask_truncated_completions=True clears row 1's mask:
# (1 + 2) / 2 = 1.5 and num_items_in_batch counts 2 tokens; off: (1 + 2 + 4) / 3.
CUT_LOSS = Case.build(
    trainable=[[1, 1], [1, 0]], extra={"loss": [[1.0, 2.0], [4.0, 9.0]]}, truncated=[False, True], dtype="float64"
)


@pytest.mark.network
def test_mask_truncated_completions_by_hand(group_entry):
    h = group_entry("agg-dapo", NEWEST)
    loss, grad = h.run(CUT_LOSS.replace(options={"mask_truncated_completions": True}))
    assert loss[0, 0].item() == pytest.approx(1.5)
    assert _flat(grad) == pytest.approx([0.5, 0.5, 0.0, 0.0])
    assert h.run(CUT_LOSS)[0][0, 0].item() == pytest.approx(7 / 3)
    for case in (CUT_LOSS, CUT_LOSS.replace(options={"mask_truncated_completions": True})):
        assert kind_verdicts(h, case)["reference"].status == "pass"


@pytest.mark.network
@pytest.mark.parametrize("name", ["grpo", "rloo"])
def test_a_masked_truncated_completion_stays_in_its_group(group_entry, name):
    """mask_truncated_completions=True clears the cut row 3's completion_mask, yet its reward 5 stays in group 1:
    grpo row 2 = (1 - 3) / (nanstd(1, 5) = 2.8284 + 1e-4) = -0.70708, rloo row 2 = 1 - 5 = -4. Issue 24: the option
    speaks of the loss (the cleared row gets no loss and no gradient), not of the group statistics, and counting a
    sampled completion's reward in its baseline is the unbiased choice: the entry declares empty_rows="counted", so
    the reference agrees (the old "true defect" of docs/kinds/trl.md was our variant used as the contract)."""
    h = group_entry(name, NEWEST)
    case = FOUR.replace(truncated=[False, False, False, True], options={"mask_truncated_completions": True})
    got = h.run(case)[0].flatten().tolist()
    assert got[2] == pytest.approx(-0.70708 if name == "grpo" else -4.0, rel=1e-4)
    assert kind_verdicts(h, case)["reference"].status == "pass"
    assert kind_verdicts(h, case.replace(options={}))["reference"].status == "pass"  # off: the row is kept
    # the variant the code implements, shown as such: with empty rows excluded the reference would differ
    excluded = dataclasses.replace(h.declared, variant={**h.declared.variant, "empty_rows": "excluded"})
    assert kind_verdicts(dataclasses.replace(h, declared=excluded), case)["reference"].failed


@pytest.mark.network
@pytest.mark.parametrize("name, pin", [("agg-dapo", NEWEST), ("grpo", NEWEST), ("rloo", NEWEST)])
def test_short_fuzz_checks_every_option_value(group_entry, name, pin):
    h = group_entry(name, pin)
    res = fuzz_target(
        h.run,
        h.declared,
        target="trl",
        pin=pin,
        max_examples=30,
        seed=1,
        sizes=Sizes(4, 6),
        derandomize=True,
        shrink=False,
    )
    for opt, per in res.options_checked.items():
        assert all(n > 0 for n in per.values()), (opt, per)
    assert set(res.options_checked) == {o.name for o in h.declared.options}
    # an adapter or effect error would be a crash, or a reference failure that goes away at the default options
    assert not [f for f in res.findings if f.property == "no-crash"]
    for f in res.findings:
        if f.case.options.get("mask_truncated_completions") and name in ("grpo", "rloo"):
            continue  # the masked cut row kept in its group (test_a_masked_truncated_completion_stays_in_its_group)
        if f.case.options and f.property == "reference":
            assert kind_verdicts(h, f.case.replace(options={}))["reference"].failed, f.case.options


@pytest.mark.network
@pytest.mark.parametrize("train", [NEWEST_PPO], indirect=True)
def test_short_fuzz_of_train_checks_the_penalty_and_cut_rows(train):
    res = fuzz_target(
        train.run, train.declared, target="trl", pin=NEWEST_PPO, max_examples=30, seed=1, derandomize=True, shrink=False
    )
    assert all(n > 0 for n in res.options_checked["missing_eos_penalty"].values()), res.options_checked
    assert res.truncated_checked > 0


# ---------------------------------------------------------------------------------------------
# kl: GRPO's per-token k3 KL to the reference (the `if self.beta != 0.0:` statement of GRPOTrainer._compute_loss,
# with TRL's coef_1 lines before it) and the PPO trainer's k1 / k3 KL (`logr = ref_logprobs - logprobs; kl = ...` of
# PPOTrainer.train, with its padding masks and INVALID_LOGPROB fills), run from source (calls_kl.load_kl_*).
# ---------------------------------------------------------------------------------------------
# d = logp - ref = 0.5 and -1 at the trained tokens; the third position is padding (poison there)
KL_CASE = Case.build(
    trainable=[[1, 1, 0]],
    attention=[[1, 1, 0]],
    extra={"logp": [[-1.0, -3.0, 1e4]], "ref_logp": [[-1.5, -2.0, -7.0]]},
)
KL_NAN = KL_CASE.replace(extra={"logp": torch.tensor([[-1.0, -3.0, math.nan]]), "ref_logp": KL_CASE.extra["ref_logp"]})
# k3 = exp(ref - logp) - (ref - logp) - 1 = exp(-d) - 1 + d: d = 0.5 -> e^-0.5 - 0.5 = 0.1065307;
# d = -1 -> e - 2 = 0.7182818
K3 = [math.exp(-0.5) - 0.5, math.e - 2.0]


@pytest.mark.network
def test_kl_grpo_by_hand(group_entry):
    for pin in (NEWEST, NEWEST_PPO, "0.19.1"):
        h = group_entry("kl-grpo", pin)
        assert h.info["where"].startswith("trl/trainer/grpo_trainer.py::GRPOTrainer._compute_loss"), h.info["where"]
        (kl,) = h.run(KL_CASE)
        assert kl[0, :2].tolist() == pytest.approx(K3, rel=1e-6)
        # computed at every position (the loss masks it): d = 1e4 - (-7) there, e^(-10007) - 1 + 10007
        assert kl[0, 2].item() == pytest.approx(1e4 + 7 - 1, rel=1e-6)
        assert torch.isnan(h.run(KL_NAN)[0][0, 2]) and h.run(KL_NAN)[0][0, :2].tolist() == pytest.approx(K3, rel=1e-6)
        v = kind_verdicts(h, KL_CASE)
        for prop in ("no-crash", "poison", "reference", "deterministic"):
            assert v[prop].status == "pass", (pin, prop, v[prop])
        assert v["masked-zero"].status == "n/a"  # masked_zero=False: TRL masks in the loss
    h = group_entry("kl-grpo", NEWEST)
    # use_bias_correction_kl=False drops `* coef_1`; coef_1 = exp(logp - logp.detach()) = 1, so the same values
    assert h.run(KL_CASE.replace(options={"use_bias_correction_kl": False}))[0][0, :2].tolist() == pytest.approx(K3)
    # importance_sampling_level="sequence": coef_1 = exp((log_ratio * mask).sum(-1) / mask.sum(-1)); log_ratio =
    # logp - logp is 0 at finite positions, but NaN - NaN = NaN and NaN * 0 = NaN: the whole row turns NaN
    seq = {"importance_sampling_level": "sequence"}
    assert h.run(KL_CASE.replace(options=seq))[0][0, :2].tolist() == pytest.approx(K3, rel=1e-6)
    assert torch.isnan(h.run(KL_NAN.replace(options=seq))[0]).all()
    assert kind_verdicts(h, KL_NAN.replace(options=seq))["poison-nonfinite"].failed
    assert kind_verdicts(h, KL_NAN)["poison-nonfinite"].status == "pass"  # token level: pointwise, nothing leaks
    # 0.19.1: no coef_1 in the KL, neither option exists
    v = kind_verdicts(group_entry("kl-grpo", "0.19.1"), KL_CASE.replace(options=seq))
    assert v["no-crash"].status == "pass" and "OptionNotAtPin" in v["no-crash"].message
    with pytest.raises(Skip, match="GRPO arrived"):
        group_entry("kl-grpo", OLD)


@pytest.mark.network
def test_kl_ppo_by_hand(group_entry):
    k3 = {"kl_estimator": "k3"}
    for pin in (NEWEST_PPO, "0.19.1", OLD):
        h = group_entry("kl-ppo", pin)
        # k1: kl = -logr = logp - ref = 0.5, -1; at the padding slot both log-probs are INVALID_LOGPROB = 1.0, so
        # logr = 0 and kl = -0.0 whatever the poison was (masked_fill selects: NaN cannot survive)
        assert h.run(KL_CASE)[0].tolist() == [[0.5, -1.0, 0.0]]
        assert h.run(KL_NAN)[0].tolist() == [[0.5, -1.0, 0.0]]
        v = kind_verdicts(h, KL_CASE)
        for prop in ("no-crash", "poison", "masked-zero", "reference", "deterministic"):
            assert v[prop].status == "pass", (pin, prop, v[prop])
        if pin == OLD:  # ppov2_trainer.py:416 `kl = logprobs - ref_logprobs`: k1 only
            v = kind_verdicts(h, KL_CASE.replace(options=k3))
            assert v["no-crash"].status == "pass" and "OptionNotAtPin" in v["no-crash"].message
            continue
        # k3: (e^logr - 1) - logr with logr = -d: e^-0.5 - 1 + 0.5, e - 1 - 1; padding: e^0 - 1 - 0 = 0
        (kl,) = h.run(KL_CASE.replace(options=k3))
        assert kl[0, :2].tolist() == pytest.approx(K3, rel=1e-6) and kl[0, 2].item() == 0.0
        assert kind_verdicts(h, KL_CASE.replace(options=k3))["reference"].status == "pass"
    with pytest.raises(Skip, match="no PPO trainer"):
        group_entry("kl-ppo", NEWEST)


def test_git_head_kl_blocks():
    repos = parse_repos(None)
    if "trl" not in repos:
        pytest.skip("git pin: set MASKFUZZ_REPOS=trl=/path/to/trl-clone-or-mirror to test trl at git main")
    with open_target(f"trl:kl-grpo@{GIT_PIN}", repos=repos) as h:
        assert h.run(KL_CASE)[0][0, :2].tolist() == pytest.approx(K3, rel=1e-6)
        assert torch.isnan(h.run(KL_NAN.replace(options={"importance_sampling_level": "sequence"}))[0]).all()
    with open_target(f"trl:kl-ppo@{GIT_PIN}", repos=repos) as h:
        assert h.run(KL_CASE.replace(options={"kl_estimator": "k3"}))[0][0].tolist() == pytest.approx([*K3, 0.0])


@pytest.mark.network
@pytest.mark.parametrize(
    "name, pin, failing", [("kl-grpo", NEWEST, {"poison-nonfinite"}), ("kl-ppo", NEWEST_PPO, set())]
)
def test_short_fuzz_of_the_kl_entries(group_entry, name, pin, failing):
    h = group_entry(name, pin)
    res = fuzz_target(h.run, h.declared, target="trl", pin=pin, max_examples=40, seed=0, sizes=Sizes(3, 6))
    found = {f.property for f in res.findings}
    assert found <= failing, found
    assert "no-crash" not in found and res.checked["reference"] > 0
    for opt, per in res.options_checked.items():
        assert all(n > 0 for n in per.values()), (opt, per)
    # the one finding needs importance_sampling_level="sequence" (NaN through the masked mean of coef_1)
    assert all(f.case.options.get("importance_sampling_level") == "sequence" for f in res.findings)


@pytest.mark.parametrize("name", KL_ENTRIES)
def test_each_kl_entry_is_declared(name):
    spec = trl.SPEC.for_entry(name)
    assert spec.kind == "kl" and trl.SPEC.adapter_for(name).endswith("trl.calls_kinds")
    assert spec.variant["estimator"] == ("k3" if name == "kl-grpo" else "k1") and spec.masked_zero_why
    assert spec.masked_zero is (name == "kl-ppo") and spec.truncation is None and spec.whitening is None
    for pin in (NEWEST_PPO, GIT_PIN, "0.19.1", OLD):
        assert spec.pipeline_at(pin).cited() == [], (pin, spec.pipeline_at(pin).restrictions())
    opts = {o.name: o for o in spec.options}
    if name == "kl-ppo":
        assert opts["kl_estimator"].effect == {"k3": {"variant": {"estimator": "k3"}}}
        assert "gap" in spec.domain.rejects(Case.build(trainable=[[1, 0, 1]]))  # TRL's mask is a prefix
    else:
        assert set(opts) == {"use_bias_correction_kl", "importance_sampling_level"}
        assert spec.domain.rejects(Case.build(trainable=[[1, 0, 1]])) is None  # pointwise: any mask


def test_kl_blocks_reading_unknown_names_fail_loudly(tmp_path):
    body = (
        "class GRPOTrainer:\n"
        "    def _compute_loss(self, model, inputs):\n"
        "        if self.beta != 0.0:\n"
        "            ref = inputs['ref_per_token_logps']\n"
        "            per_token_kl = torch.exp(ref - per_token_logps) * self.kl_scale\n"
    )
    root = _tree(tmp_path, "trl/trainer/grpo_trainer.py", body)
    with pytest.raises(BlockNotFound, match="self.kl_scale"):
        calls_kinds.load(root, "kl-grpo")
    body = "class PPOTrainer:\n    def train(self):\n        kl = logprobs - ref_logprobs\n"
    root = _tree(tmp_path, "trl/trainer/ppo_trainer.py", body)
    with pytest.raises(BlockNotFound, match="no `kl = ...` after the padding masks"):
        calls_kinds.load(root, "kl-ppo")


# ---------------------------------------------------------------------------------------------
# policy-loss: GRPOTrainer._compute_loss from `advantages = inputs["advantages"]` through the loss_type chain, run
# from source per micro-batch (calls_policy.load_policy) at GRPOConfig's defaults: loss_type "dapo" (grpo_config.py:
# 801-802 at 1.16.0), epsilon 0.2 (:693-695), epsilon_high None = epsilon (grpo_trainer.py:946), delta None, beta 0.
# ---------------------------------------------------------------------------------------------
_OLD = -1.0
# row 0, A = 1: r = 1; r = 1.5 (the upper clip binds: -1.2, grad 0); r = 0.5 (the lower clip does not bind for A > 0:
# -0.5, grad -0.5); a masked token with a finite poisoned log-ratio of 8. Row 1, A = -2: r = 1.5 (does not bind for
# A < 0: 3, grad 3); r = 0.5 (binds: -(-2) 0.8 = 1.6, grad 0). dapo: sum / num_items_in_batch 5 = 1.9 / 5 = 0.38.
POLICY_STEP = Case.build(
    trainable=[[1, 1, 1, 0], [1, 1, 0, 0]],
    score=[1.0, -2.0],
    extra={
        "old_logp": [[_OLD, _OLD, _OLD, -3.0], [_OLD, _OLD, _OLD, _OLD]],
        "logp": [
            [_OLD, _OLD + math.log(1.5), _OLD + math.log(0.5), 5.0],
            [_OLD + math.log(1.5), _OLD + math.log(0.5), _OLD, _OLD],
        ],
        "adv": [[0.0] * 4] * 2,  # per-token advantages: not read (advantages="row")
    },
    dtype="float64",
)
POLICY_GRAD = [-0.2, 0.0, -0.1, 0.0, 0.6, 0.0, 0.0, 0.0]


def _policy_by_hand(h):
    loss, grad = h.run(POLICY_STEP)
    assert loss[0, 0].item() == pytest.approx(0.38, rel=1e-12)
    assert _flat(grad) == pytest.approx(POLICY_GRAD, rel=1e-12, abs=1e-15)
    v = kind_verdicts(h, POLICY_STEP)
    for prop in ("reference", "poison", "pad-invariance", "masked-zero", "permutation", "deterministic", "no-crash"):
        assert v[prop].status == "pass", (prop, v[prop])
    # one row per micro-batch (GA 2): dapo's num_items_in_batch is the step's 5 tokens, each micro-batch divides by
    # 5 / 1 process * GA 2 / steps_per_generation 2: the same loss and gradient (split-invariance holds)
    split = POLICY_STEP.replace(split=torch.tensor([0, 1]))
    loss, grad = h.run(split)
    assert loss[0, 0].item() == pytest.approx(0.38, rel=1e-12)
    assert kind_verdicts(h, split)["split-invariance"].status == "pass"
    # a NaN old log-prob under the mask: `per_token_loss * mask` (grpo_trainer.py:3173) is NaN * 0 = NaN: the loss is
    # NaN, and so is dL/dlogp at that masked token (a model's backward carries it into every parameter); reach api:
    # TRL's log-probs under the padding are 0 (see _POLICY_PIPELINE)
    old = POLICY_STEP.extra["old_logp"].clone()
    old[1, 3] = math.nan
    nan = POLICY_STEP.replace(extra={**POLICY_STEP.extra, "old_logp": old})
    loss, grad = h.run(nan)
    assert math.isnan(loss[0, 0].item()) and math.isnan(grad[1, 3].item())
    assert _flat(grad)[:7] == pytest.approx(POLICY_GRAD[:7], rel=1e-12, abs=1e-15)
    assert kind_verdicts(h, nan)["poison-nonfinite"].failed


@pytest.mark.network
def test_policy_grpo_by_hand(group_entry):
    h = group_entry("policy-grpo", NEWEST)
    assert h.info["where"] == "trl/trainer/grpo_trainer.py::GRPOTrainer._compute_loss (lines 3055-3184)"
    _policy_by_hand(h)
    # epsilon_high = 0.28 (DAPO's clip-higher): row 0's r = 1.5 now clipped at 1.28: 1.28 + ... = (-1 - 1.28 - 0.5
    # + 3 + 1.6) / 5; delta = 3.0 on r = 1.5, A < 0: min(1.5, 3) = 1.5 unchanged (the cap binds only for r > 3)
    loss, _ = h.run(POLICY_STEP.replace(options={"epsilon_high": 0.28}))
    assert loss[0, 0].item() == pytest.approx(1.82 / 5, rel=1e-12)
    far = POLICY_STEP.extra["logp"].clone()
    far[1, 0] = _OLD + math.log(4.0)  # r = 4, A = -2: -A r = 8 capped by delta at 6
    case = POLICY_STEP.replace(extra={**POLICY_STEP.extra, "logp": far}, options={"delta": 3.0})
    loss, grad = h.run(case)
    assert loss[0, 0].item() == pytest.approx((-1 - 1.2 - 0.5 + 6 + 1.6) / 5, rel=1e-12)
    assert grad[1, 0].item() == 0.0
    assert kind_verdicts(h, case)["reference"].status == "pass"
    with pytest.raises(Skip, match="no loss_type 'dapo'"):
        group_entry("policy-grpo", "0.19.1")


def test_git_head_policy_block():
    repos = parse_repos(None)
    if "trl" not in repos:
        pytest.skip("git pin: set MASKFUZZ_REPOS=trl=/path/to/trl-clone-or-mirror to test trl at git main")
    with open_target(f"trl:policy-grpo@{GIT_PIN}", repos=repos) as h:
        assert h.info["where"] == "trl/trainer/grpo_trainer.py::GRPOTrainer._compute_loss (lines 3026-3150)"
        _policy_by_hand(h)


def test_policy_grpo_is_declared_with_citations():
    spec = trl.SPEC.for_entry("policy-grpo")
    assert spec.kind == "policy-loss" and trl.SPEC.adapter_for("policy-grpo").endswith("trl.calls_kinds")
    assert spec.variant == {
        "clip_low": 0.2,
        "clip_high": 0.2,
        "dual_clip": None,
        "advantages": "row",
        "mode": "token-mean",
    }
    assert spec.masked_zero is True and "3168-3174" in spec.masked_zero_why
    assert spec.pipeline.cited() == [] and not spec.pipeline.nonfinite_poison
    opts = {o.name: o for o in spec.options}
    assert set(opts) == {"epsilon_high", "delta", "mask_truncated_completions"}
    assert opts["delta"].effect == {3.0: {"variant": {"dual_clip": 3.0}}}
    assert opts["epsilon_high"].effect == {0.28: {"variant": {"clip_high": 0.28}}}


@pytest.mark.network
def test_short_fuzz_of_the_policy_loss(group_entry):
    """What 15 examples find at 1.16.0: only the non-finite leak through `per_token_loss * mask` (grpo_trainer.py:
    3173): a NaN, or a masked log-ratio above ~88 that exp overflows to inf in float32 (coef_1, :3095), times the
    mask 0 is NaN. No reference, split or poison finding: the clipped objective and dapo's global token mean are
    right."""
    h = group_entry("policy-grpo", NEWEST)
    res = fuzz_target(
        h.run, h.declared, target="trl", pin=NEWEST, max_examples=15, seed=0, sizes=Sizes(3, 5), shrink=False
    )
    found = {f.property for f in res.findings}
    assert found <= {"poison-nonfinite", "no-crash", "empty-step", "masked-zero"}, found
    assert res.checked["reference"] > 0 and res.failed["reference"] == 0 and res.failed["poison"] == 0


# kl-grpo with a real importance ratio: the case's old_logp is bound as inputs["old_per_token_logps"] (read at
# grpo_trainer.py:3065 at 1.16.0, git f2cd577 :3036), so coef_1 = exp(logp - old) (:3083-3095; :3054-3066) is not 1.
# x = logp - old = 0.25, -2 at the trained tokens; at the padding slot 1e4 - 0 (finite: (log_ratio * mask) is 0 there)
KL_OFF = KL_CASE.replace(extra={**KL_CASE.extra, "old_logp": torch.tensor([[-1.25, -1.0, 0.0]])})
W_TOKEN = [math.exp(0.25), math.exp(-2.0)]
W_SEQ = math.exp((0.25 - 2.0) / 2)


@pytest.mark.network
def test_kl_grpo_bias_correction_with_a_real_ratio_by_hand(group_entry):
    from maskfuzz.oracles.options import apply

    h = group_entry("kl-grpo", NEWEST)
    on = {"use_bias_correction_kl": True}
    # per_token_kl * coef_1 (:3104-3105), coef_1 = exp(logp - old) per token, unclamped
    (kl,) = h.run(KL_OFF.replace(options=on))
    assert kl[0, :2].tolist() == pytest.approx([k * w for k, w in zip(K3, W_TOKEN)], rel=1e-6)
    assert apply(h.declared, on).variant == {"estimator": "k3", "ratio": "token"}
    assert apply(h.declared, {"importance_sampling_level": "sequence"}).variant["ratio_level"] == "sequence"
    assert apply(h.declared, {"use_bias_correction_kl": False}).variant == {"estimator": "k3"}
    v = kind_verdicts(h, KL_OFF.replace(options=on))
    for prop in ("no-crash", "poison", "reference", "deterministic"):
        assert v[prop].status == "pass", (prop, v[prop])
    # sequence level: one weight per row, exp of the masked mean of the log-ratio (:3087)
    seq = {**on, "importance_sampling_level": "sequence"}
    assert h.run(KL_OFF.replace(options=seq))[0][0, :2].tolist() == pytest.approx([k * W_SEQ for k in K3], rel=1e-6)
    assert kind_verdicts(h, KL_OFF.replace(options=seq))["reference"].status == "pass"
    # the correction off: the plain k3 whatever old is (coef_1 is computed, not used by the KL)
    off = {"use_bias_correction_kl": False, "importance_sampling_level": "sequence"}
    assert h.run(KL_OFF.replace(options=off))[0][0, :2].tolist() == pytest.approx(K3, rel=1e-6)
    assert kind_verdicts(h, KL_OFF.replace(options=off))["reference"].status == "pass"
    # the inverse ratio (pi_old / pi) is what the reference rejects: the check is not vacuous
    inverted = KL_OFF.replace(extra={**KL_OFF.extra, "old_logp": torch.tensor([[-0.75, -5.0, 0.0]])}, options=on)
    assert h.run(inverted)[0][0, :2].tolist() == pytest.approx([k / w for k, w in zip(K3, W_TOKEN)], rel=1e-6)
    # 0.19.1 has no coef_1: with old != logp the correction cannot be run (OptionNotAtPin); on-policy it can
    old_pin = group_entry("kl-grpo", "0.19.1")
    v = kind_verdicts(old_pin, KL_OFF)
    assert v["no-crash"].status == "pass" and "OptionNotAtPin" in v["no-crash"].message
    on_policy = KL_OFF.replace(extra={**KL_OFF.extra, "old_logp": KL_CASE.extra["logp"]})
    assert kind_verdicts(old_pin, on_policy)["reference"].status == "pass"
    # ... and use_bias_correction_kl=False is what 0.19.1 computes: the plain k3 whatever old is
    v = kind_verdicts(old_pin, KL_OFF.replace(options={"use_bias_correction_kl": False}))
    assert v["reference"].status == "pass"


def test_git_head_kl_bias_correction_with_a_real_ratio():
    repos = parse_repos(None)
    if "trl" not in repos:
        pytest.skip("git pin: set MASKFUZZ_REPOS=trl=/path/to/trl-clone-or-mirror to test trl at git main")
    with open_target(f"trl:kl-grpo@{GIT_PIN}", repos=repos) as h:  # :3075-3076, default False at this commit
        (kl,) = h.run(KL_OFF.replace(options={"use_bias_correction_kl": True}))
        assert kl[0, :2].tolist() == pytest.approx([k * w for k, w in zip(K3, W_TOKEN)], rel=1e-6)
        assert h.run(KL_OFF.replace(options={"use_bias_correction_kl": False}))[0][0, :2].tolist() == pytest.approx(K3)


@pytest.mark.network
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_short_fuzz_of_kl_grpo_with_the_bias_correction_on(group_entry, level):
    """15 examples with use_bias_correction_kl on (the real ratio): token level finds nothing; sequence level at most
    the known NaN through the masked mean of the log-ratio (poison-nonfinite, api reach)."""
    h = group_entry("kl-grpo", NEWEST)
    opts = {"use_bias_correction_kl": True, "importance_sampling_level": level}
    res = fuzz_target(
        h.run, h.declared, target="trl", pin=NEWEST, max_examples=15, seed=0, sizes=Sizes(3, 6), options=opts
    )
    found = {f.property for f in res.findings}
    assert found <= ({"poison-nonfinite"} if level == "sequence" else set()), found
    assert res.checked["reference"] > 0


# ---------------------------------------------------------------------------------------------
# The promise model (issue 24; docs/audit/trl.md, "Promise audit"): which findings are defects (they break a
# promise, universal or TRL's own words at the pin) and which are facts, as `fuzz.triage.judge_finding` decides.
# ---------------------------------------------------------------------------------------------
from maskfuzz.fuzz.engine import Finding  # noqa: E402
from maskfuzz.fuzz.triage import judge_finding  # noqa: E402
from maskfuzz.oracles.promises import broken  # noqa: E402


def triaged(handle, case: Case, prop: str, run=None) -> Finding:
    """`case`'s failure of `prop` on `handle` (or on `run`, a changed implementation of the same entry), judged as
    a finding of the fuzzer: root cause, reach (no search, the case itself or its projection), promise or fact."""
    run = run or handle.run
    v = next(v for v in judge(run, case, handle.declared) if v.property == prop)
    assert v.failed, v
    f = Finding(target="trl", pin=handle.pin, resolved="", property=prop, case=case, verdict=v)
    judge_finding(run, f, handle.declared, examples=0)
    return f


@pytest.mark.network
@pytest.mark.parametrize("train", [NEWEST_PPO], indirect=True)
def test_train_first_pad_slot_findings_are_facts(train):
    """TRL's terminal state after the last token is the first pad slot: it keeps the value model's output there
    (padding_mask_p1, ppo_trainer.py:767-769 at 1.12.0), trains it (vf_loss over ~padding_mask_p1, :837) and puts the
    score there (:778-779). The defect of that design is filed once, as score-kept (next test); judged as `poison`
    the value's bootstrap breaks nothing (a trained state value is not poison; the pipeline cites no masked critic
    value as produced): a robustness fact; as `reference` the lam-decayed score a semantics fact. Both corpus
    entries (ec324cc011e9112f, ca5c7a200d7adfc0) are retired as repeats of 83384c4ed0209044."""
    seed = SEED.replace(attention=SEED.trainable.clone())  # the response and its padding, as TRL's window holds it
    f = triaged(train, seed, "poison")
    assert not f.is_defect and f.fact == "robustness" and "critic values" in f.why_fact, f.why_fact
    ref = Case.build(
        trainable=[[1, 1], [1, 0]],
        attention=[[1, 1], [1, 0]],
        token_rewards=[[0, 0], [0, 100]],
        score=[1.0, 1.0],
        gamma=1.0,
        lam=0.9,
    )  # corpus entry ca5c7a200d7adfc0 (retired): the short row's score sits on its pad slot, decayed by lam
    f = triaged(train, ref, "reference")
    assert not f.is_defect and f.fact == "semantics"


@pytest.mark.network
@pytest.mark.parametrize("train", [NEWEST_PPO], indirect=True)
def test_train_score_at_the_pad_slot_is_a_score_kept_defect(train):
    """Corpus entry 83384c4ed0209044 (kept): TRL ends an ended response on the first pad slot, a masked position,
    and puts the score there (ppo_trainer.py:778-779); at gamma = 0 it never reaches a trained token, and whether
    it sits there or on the last token depends on the padding after the row. A pipeline input: a prefix of trained
    tokens, then padding (no masked critic value, no masked tail). universal:score-kept, reach pipeline."""
    case = Case.build(trainable=[[1, 1, 0]], attention=[[1, 1, 0]], score=[1.0], gamma=0.0, lam=1.0)
    assert train.declared.pipeline.unproduced(case) == []
    f = triaged(train, case, "score-kept")
    assert f.is_defect and f.promise.id == "universal:score-kept" and f.reach == "pipeline", (f.promise, f.reach_how)
    assert f.mechanism == "score-lost"


@pytest.mark.network
@pytest.mark.parametrize(
    "name, pin, prop, promise",
    [
        ("agg-dapo", NEWEST, "split-invariance", "upstream:trl/trainer/grpo_config.py:246-247"),
        ("agg-dapo", NEWEST_PPO, "reference", "upstream:trl/trainer/grpo_config.py:252-253"),
        ("agg-dr_grpo", NEWEST, "reference", "upstream:trl/trainer/grpo_config.py:243-245"),
        ("agg-dr_grpo", "0.19.1", "split-invariance", "upstream:trl/trainer/grpo_config.py:169-171"),
        ("agg-grpo", NEWEST, "reference", "upstream:trl/trainer/grpo_config.py:240"),
        ("agg-bnpo", "0.19.1", "reference", "upstream:trl/trainer/grpo_config.py:165-167"),
        ("dr-grpo", NEWEST, "reference", "upstream:trl/trainer/grpo_config.py:234"),
        ("dr-grpo", "0.19.1", "reference", "upstream:trl/trainer/grpo_config.py:156-157"),
        ("grpo-batch", NEWEST_PPO, "reference", "upstream:trl/trainer/grpo_config.py:238-239"),
        ("kl-grpo", NEWEST, "reference", "upstream:trl/trainer/grpo_config.py:351-352"),
        ("kl-grpo", "0.19.1", "reference", "upstream:docs/source/grpo_trainer.md:87-88"),
        ("kl-ppo", NEWEST_PPO, "reference", "upstream:trl/experimental/ppo/ppo_config.py:95-98"),
        ("kl-ppo", "0.19.1", "reference", "upstream:trl/trainer/ppo_config.py:51-54"),
        ("policy-grpo", NEWEST, "reference", "upstream:trl/trainer/grpo_config.py:178-179"),
        ("policy-grpo", NEWEST, "split-invariance", "upstream:trl/trainer/grpo_config.py:246-247"),
    ],
)
def test_trl_promises_name_its_words_at_each_pin(name, pin, prop, promise):
    """Each declared promise makes a failure of the property it covers a defect naming TRL's words at that pin
    (config docstrings quoted from the release, the docs page at the git pin and 0.19.1)."""
    declared = trl.SPEC.declared(name, pin)
    p = broken(prop, "unexplained", declared.promises, reach="api", kind=declared.kind)
    assert p is not None and p.id == promise, (p, promise)
    assert not p.universal and p.text.strip()


def test_grpo_and_rloo_promises_wait_for_the_judge():
    """TRL's words for the `grpo` and `rloo` advantages are real but not attached (DEFERRED_PROMISES): with
    mask_truncated_completions the judge compares a cleared row at its original positions, where TRL's broadcast
    advantage is never read; a reference failure there stays a fact until the judge compares on the reference
    case's mask."""
    for name in ("grpo", "rloo"):
        assert trl.SPEC.for_entry(name).promises == ()
        assert DEFERRED_PROMISES[name] and all(p.covers == ("reference",) for p in DEFERRED_PROMISES[name])


@pytest.mark.network
def test_a_dapo_normaliser_off_its_documented_count_is_a_defect_naming_it(group_entry):
    """An implementation of `agg-dapo` that normalised by anything but the active tokens of the accumulated batch
    (here: the real block, its loss and gradient scaled by 1.5) breaks GRPOConfig's words at 1.16.0
    (grpo_config.py:246-247) and is filed as that defect."""
    h = group_entry("agg-dapo", NEWEST)
    wrong = lambda *a, **k: tuple(x * 1.5 for x in h.run(*a, **k))  # noqa: E731
    f = triaged(h, TWO_MB, "reference", run=wrong)
    assert f.is_defect and f.promise.id == "upstream:trl/trainer/grpo_config.py:246-247", (f.promise, f.fact)
    assert kind_verdicts(h, TWO_MB)["reference"].status == "pass"  # TRL's own block keeps it


@pytest.mark.network
def test_a_kl_ppo_estimator_off_schulmans_is_a_defect_naming_ppo_config(group_entry):
    """kl-ppo at 1.12.0: an estimator that is not k1 of d = logp - ref (here TRL's own block, its sign flipped)
    breaks PPOConfig.kl_estimator's words (trl/experimental/ppo/ppo_config.py:95-98)."""
    h = group_entry("kl-ppo", NEWEST_PPO)
    case = Case.build(
        trainable=[[1, 1, 0]],
        attention=[[1, 1, 0]],
        extra={"logp": [[-1.0, -2.0, 0.0]], "ref_logp": [[-1.5, -1.0, 0.0]]},
    )
    wrong = lambda *a, **k: tuple(-x for x in h.run(*a, **k))  # noqa: E731
    f = triaged(h, case, "reference", run=wrong)
    assert f.is_defect and f.promise.id == "upstream:trl/experimental/ppo/ppo_config.py:95-98"

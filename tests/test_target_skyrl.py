"""SkyRL's `compute_gae_advantage_return` through its adapter, judged by the oracle.

The verdicts asserted here were derived by reading `skyrl_train/utils/ppo_utils.py` and
`skyrl_train/trainer.py` (releases 0.1.0-0.3.1; the same function at git main under
`skyrl/backends/skyrl_train/`):

* The GAE loop reads `values[:, t + 1]` and `token_level_rewards[:, t]` at every position with no
  mask, so the value of a right-padding slot or of an observation token bootstraps into the tokens
  before it (poison leaks whenever lam < 1), while left padding, which precedes every response
  token, is never read by the backward recursion.
* `response_mask` (the response indicator, canonical `attention`) is only used for
  `masked_whiten`: observation tokens and rows whose loss mask was zeroed (zero-variance filtering)
  enter the mean and variance, so another row's real-but-untrained tokens move a row's advantages.
* The trainer places a scalar reward on `per_token_reward[-1]`, the last *real* response token: with
  an observation tail at gamma = 0 the score never reaches a trained token.
* `masked_mean` multiplies by the mask (NaN * 0 = NaN); `masked_var` raises ValueError, on purpose,
  when the mask holds fewer than two tokens.

Release pins download wheels (network marker); git pins need MASKFUZZ_REPOS=skyrl=/path.
"""

from __future__ import annotations

import math
import textwrap

import pytest
import torch

from maskfuzz.fuzz.engine import fuzz_target
from maskfuzz.fuzz.triage import retriage
from maskfuzz.oracles.case import Case
from maskfuzz.oracles.kinds.dispatch import judge
from maskfuzz.oracles.kinds.gae.reference import classic_gae_loop
from maskfuzz.targets.runtime.client import LoadSpec, Worker, WorkerLoadError, WorkerSkip
from maskfuzz.targets.runtime.repos import parse_repos
from maskfuzz.targets.runtime.session import open_target
from maskfuzz.targets.skyrl import calls as skyrl_calls
from maskfuzz.targets.skyrl import declare as skyrl

PIN = "0.3.1"
FIRST = "0.1.0"


def verdicts(handle, case: Case) -> dict:
    return {v.property: v for v in judge(handle.run, case, handle.declared)}


def triaged(handle, case: Case, prop: str, kinds: bool = False) -> dict:
    """The failing `prop` of `case` triaged as a replay triages it: its class (defect or fact), promise, reach."""
    v = (kind_verdicts if kinds else verdicts)(handle, case)[prop]
    assert v.failed, v
    return retriage(handle.run, v.case if v.case is not None else case, v, handle.declared, "skyrl")


@pytest.fixture(scope="module")
def h():
    with open_target(f"skyrl@{PIN}") as handle:
        yield handle


# ---------------------------------------------------------------------------------------------
# The inputs SkyRL gets (no upstream code needed).
# ---------------------------------------------------------------------------------------------
def test_framework_inputs_put_the_score_on_the_last_real_token():
    case = Case.build(
        trainable=[[1, 1, 0, 0], [0, 1, 1, 0]],
        attention=[[1, 1, 1, 0], [0, 1, 1, 1]],
        token_rewards=[[0.5, 0, 0.25, 7], [3, 0, 0, 0.5]],
        values=[[1, 2, 3, 4], [5, 6, 7, 8]],
        score=[10, 20],
        dtype="float64",
    )
    x = skyrl_calls.framework_inputs(case, "cpu")
    # row 0: observation at 2 gets the score, padding at 3 has no reward; row 1: left pad at 0
    assert x["token_level_rewards"].tolist() == [[0.5, 0, 10.25, 0], [0, 0, 0, 20.5]]
    assert x["response_mask"].tolist() == [[1, 1, 1, 0], [0, 1, 1, 1]]
    assert torch.equal(x["values"], case.values)


def test_spec_declares_the_whitening_and_the_wheel_options():
    assert skyrl.SPEC.contract == "dense"
    assert skyrl.SPEC.whitening is not None and skyrl.SPEC.whitening.unbiased and skyrl.SPEC.whitening.eps == 1e-8
    assert skyrl.SPEC.pip_args == ("--python-version", "3.12")
    assert skyrl.SPEC.domain.restrictions() == {}
    # masked-zero is judged (issue 24): the batch normalisation reads every advantage, padding included, unmasked
    assert skyrl.SPEC.masked_zero
    for pin, line in ((PIN, 142), (FIRST, 143), ("skyrl_train-v0.4.0", 139), ("a9564572eb8e", 1479)):
        for entry in ("default", "gae-kl"):
            (read,) = skyrl.SPEC.declared(entry, pin).promises
            assert read.covers == ("masked-zero",) and read.id.endswith(f":{line}") and "advantages.mean()" in read.text
    assert skyrl.SPEC.declared("grpo", PIN).promises == ()  # the outcome estimators multiply by response_mask


def test_pipeline_domain_is_cited_and_rejects_what_skyrl_never_builds():
    spec = skyrl.SPEC
    release, head = spec.pipeline, spec.pipeline_at("a9564572eb8e")
    first, v040 = spec.pipeline_at(FIRST), spec.pipeline_at("skyrl_train-v0.4.0")
    assert spec.pipeline_at(PIN) is release and head is not release
    for dom in (release, first, v040, head):
        assert dom.cited() == [] and set(dom.restrictions()) <= {"dtypes", "left_padding", "nonfinite_poison"}
        # what each pin's generator / trainer / critic is cited as producing (issue 24): never a masked reward,
        # SkyRL's own turn reward on a masked EOS, which the judge would call a leak
        assert {"gaps", "masked_real_tail", "all_masked_rows", "token_rewards", "masked_values"} <= set(dom.produces)
        assert "masked_rewards" not in dom.produces
    assert "leading_mask" in first.produces and "leading_mask" not in release.produces
    assert "left_padding" in head.produces and "left_padding" not in release.produces
    assert set(release.restrictions()) == {"dtypes", "left_padding", "nonfinite_poison"}
    assert set(head.restrictions()) == {"dtypes", "nonfinite_poison"}
    # what the multi-turn generator and trainer do build: a leading template token, an observation gap, a masked
    # tail (appended EOS), a row whose loss mask was zeroed, critic values and turn rewards under the mask
    multi = Case.build(
        trainable=[[0, 1, 0, 1, 0], [0, 0, 0, 0, 0]],
        token_rewards=[[0.0, -0.1, 0.0, 0.0, 1.0]] * 2,
        values=[[7.0, 1.0, -2.0, 0.5, 9.0]] * 2,
        score=[1.0, 0.0],
    )
    assert release.rejects(multi) is None and head.rejects(multi) is None
    assert "dtype bfloat16" in release.rejects(multi.replace(dtype="bfloat16"))  # dtypes
    assert "dtype float64" in head.rejects(multi.replace(dtype="float64"))
    left = Case.build(trainable=[[0, 1, 1]], attention=[[0, 1, 1]])
    assert "left-padded" in release.rejects(left) and head.rejects(left) is None  # left_padding: git main only
    nan_value = Case.build(trainable=[[1, 1, 0]], values=[[0.5, 0.25, math.nan]])
    assert "NaN / inf" in release.rejects(nan_value) and "NaN / inf" in head.rejects(nan_value)  # nonfinite_poison
    assert spec.domain.rejects(nan_value) is None and spec.domain.rejects(left) is None  # api domain unchanged


# ---------------------------------------------------------------------------------------------
# Release 0.3.1.
# ---------------------------------------------------------------------------------------------
@pytest.mark.network
def test_function_and_placement_rule_come_from_the_wheel(h):
    assert h.info["where"] == "skyrl_train/utils/ppo_utils.py::compute_gae_advantage_return"
    assert "skyrl_train/trainer.py" in h.info["notes"][0]
    assert set(h.info["stand_ins_used"]) <= set(skyrl.SPEC.stand_ins)
    assert not set(h.info["stand_ins_used"]) & set(skyrl.SPEC.own)


@pytest.mark.network
def test_all_trainable_rows_are_classic_gae_whitened(h):
    g = torch.Generator().manual_seed(0)
    case = Case.build(
        trainable=[[1, 1, 1, 1]] * 3,
        token_rewards=torch.randn(3, 4, generator=g, dtype=torch.float64),
        values=torch.randn(3, 4, generator=g, dtype=torch.float64),
        score=[1.0, -0.5, 2.0],
        gamma=0.9,
        lam=0.7,
        dtype="float64",
    )
    v = verdicts(h, case)
    for prop in ("no-crash", "all-trainable", "reference", "deterministic"):
        assert v[prop].status == "pass", (prop, v[prop].message)
    adv, ret = h.run(case)
    rewards = case.token_rewards[0].tolist()
    rewards[-1] += 1.0
    _, ret0 = classic_gae_loop(rewards, case.values[0].tolist(), 0.9, 0.7)
    assert ret[0].tolist() == pytest.approx(ret0, rel=1e-12)  # returns are not whitened
    assert adv.mean().item() == pytest.approx(0.0, abs=1e-12)


@pytest.mark.network
def test_right_padding_value_bootstraps_into_the_last_token(h):
    case = Case.build(
        trainable=[[1, 1, 0], [1, 1, 1]],
        attention=[[1, 1, 0], [1, 1, 1]],
        token_rewards=[[0, 0.5, 0], [0, 0, 0]],
        values=[[0.5, 0.25, 100], [0.5, 0.25, 0.5]],
        score=[1, 1],
        gamma=1,
        lam=0.5,
    )
    _, ret = h.run(case)
    # A_2 = -100 at the pad, A_1 = (1.5 + 100 - 0.25) + 0.5 * -100 = 51.25: returns 51.5, not 1.5
    assert ret[0, 1].item() == pytest.approx(51.5)
    v = verdicts(h, case)
    assert v["poison"].failed and v["reference"].failed
    assert [0, 1] in v["poison"].positions
    # the whitened pad is not 0, and advantage_batch_normalize's advantages.mean() reads it unmasked: a defect that
    # names the consumer (issue 24; the loss itself reads advantages under loss_mask only)
    t = triaged(h, case, "masked-zero")
    assert t["class"] == "defect" and t["promise"] == "upstream:skyrl_train/utils/ppo_utils.py:142", t


@pytest.mark.network
def test_left_padding_is_never_read(h):
    case = Case.build(
        trainable=[[0, 1, 1], [1, 1, 1]],
        attention=[[0, 1, 1], [1, 1, 1]],
        values=[[100, 0.5, 0.25], [0.5, 1, 0.25]],
        score=[1, 0.5],
        gamma=1,
        lam=0.5,
        dtype="float64",
    )
    v = verdicts(h, case)
    assert v["poison"].status == "pass" and v["reference"].status == "pass"
    adv, _ = h.run(case)
    assert adv[0, 0].item() != 0.0  # whitened, never zeroed, and read by the batch normalisation's mean
    t = triaged(h, case, "masked-zero")
    assert t["class"] == "defect" and t["promise"] == "upstream:skyrl_train/utils/ppo_utils.py:142", t
    assert t["reach"] == "api", t  # the releases right-pad (preprocess.py:101): a left pad is never built there


@pytest.mark.network
def test_observation_tail_takes_the_score_at_gamma_zero(h):
    case = Case.build(trainable=[[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], score=[1, 1], gamma=0, lam=0.95)
    _, ret = h.run(case)
    assert ret[0].tolist() == [0, 0, 0, 0, 1]  # the score sits on the last observation token
    v = verdicts(h, case)
    assert v["score-kept"].failed and [0, 2] in v["score-kept"].positions


@pytest.mark.network
def test_rows_with_a_zeroed_loss_mask_enter_the_whitening(h):
    two = Case.build(
        trainable=[[1, 1], [1, 1]], values=[[0.5, 0.25], [1, 0]], score=[1, 0], gamma=1, lam=1, dtype="float64"
    )
    three = Case.build(
        trainable=[[1, 1], [1, 1], [0, 0]],
        values=[[0.5, 0.25], [1, 0], [0, 0]],
        score=[1, 0, 0],
        gamma=1,
        lam=1,
        dtype="float64",
    )  # row 2: real tokens, loss mask zeroed
    a2, _ = h.run(two)
    a3, _ = h.run(three)
    assert (a2 - a3[:2]).abs().max().item() > 0.1
    # the row twin adds padding only now (issue 24): the filtered row is no padding, it carries the leak itself. Its
    # untrained critic values move the other rows through masked_whiten(advantages, response_mask): universal:poison
    # with a pipeline witness (zero_variance_filter zeroes the loss mask, the value head runs on every position)
    assert verdicts(h, two)["row-independence"].status == "pass"
    poisoned = three.replace(values=torch.tensor([[0.5, 0.25], [1, 0], [9.0, -4.0]], dtype=torch.float64))
    t = triaged(h, poisoned, "poison")
    assert t["class"] == "defect" and t["promise"] == "universal:poison" and t["reach"] == "pipeline", t


@pytest.mark.network
def test_fewer_than_two_response_tokens_is_a_documented_error(h):
    for case, text in (
        (Case.build(trainable=[[1]], score=[1]), "The sum of the mask is one"),
        (Case.build(trainable=[[0, 0]], attention=[[0, 0]]), "At least one element in the mask has to be 1"),
    ):
        with pytest.raises(Exception, match=text):  # the documented error itself
            h.run(case)
        v = verdicts(h, case)  # the judge declares whitening of < 2 trainable tokens undefined: nothing judged
        assert v["no-crash"].status == "n/a" and "undefined" in v["no-crash"].message


@pytest.mark.network
def test_nan_at_padding_reaches_every_row(h):
    case = Case.build(
        trainable=[[1, 1, 0], [1, 1, 1]],
        attention=[[1, 1, 0], [1, 1, 1]],
        values=[[0.5, 0.25, math.nan], [0.5, 0.25, 0.5]],
        score=[1, 1],
        gamma=1,
        lam=0.5,
    )
    v = verdicts(h, case)
    assert v["poison-nonfinite"].failed and [1, 0] in v["poison-nonfinite"].positions  # via the whitening mean


@pytest.mark.network
def test_short_fuzz(h):
    result = fuzz_target(
        h.run, h.declared, target="skyrl", pin=PIN, max_examples=40, seed=0, derandomize=True, shrink=False
    )
    bad = {p for p, n in result.failed.items() if n}
    # row-independence is no sure finding any more (issue 24): its twin adds a padding column only, which leaks only
    # where a row fills the window; the loss-masked rows in the whitening show up as poison
    assert {"poison", "reference"} <= bad, bad
    assert "deterministic" not in bad, bad


@pytest.mark.network
def test_first_release_leaks_the_same_way():
    case = Case.build(
        trainable=[[1, 1, 0], [1, 1, 1]],
        attention=[[1, 1, 0], [1, 1, 1]],
        values=[[0.5, 0.25, 100], [0.5, 0.25, 0.5]],
        score=[1, 1],
        gamma=1,
        lam=0.5,
    )
    with open_target(f"skyrl@{FIRST}") as first:
        assert first.info["where"] == "skyrl_train/utils/ppo_utils.py::compute_gae_advantage_return"
        assert verdicts(first, case)["poison"].failed


# ---------------------------------------------------------------------------------------------
# Git pins (mirror): the monorepo layouts.
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "pin, where",
    [
        ("a9564572eb8e", "skyrl/backends/skyrl_train/utils/ppo_utils.py"),
        ("skyrl_train-v0.4.0", "skyrl-train/skyrl_train/utils/ppo_utils.py"),
    ],
)
def test_git_layouts(pin, where):
    repos = parse_repos(None)
    if "skyrl" not in repos:
        pytest.skip("git pins: set MASKFUZZ_REPOS=skyrl=/path/to/SkyRL-clone-or-mirror to test SkyRL's layouts")
    case = Case.build(
        trainable=[[1, 1, 0], [1, 1, 1]],
        attention=[[1, 1, 0], [1, 1, 1]],
        values=[[0.5, 0.25, 100], [0.5, 0.25, 0.5]],
        score=[1, 1],
        gamma=1,
        lam=0.5,
    )
    with open_target(f"skyrl@{pin}", repos=repos) as handle:
        assert handle.info["where"] == f"{where}::compute_gae_advantage_return"
        v = verdicts(handle, case)
        assert v["poison"].failed and v["deterministic"].status == "pass"


# ---------------------------------------------------------------------------------------------
# Fake trees: the adapter fails loudly when the placement rule changes, skips when the function is gone.
# ---------------------------------------------------------------------------------------------
def _tree(root, trainer: str, ppo: str) -> None:
    pkg = root / "skyrl_train"
    (pkg / "utils").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "utils" / "__init__.py").write_text("")
    (pkg / "utils" / "ppo_utils.py").write_text(textwrap.dedent(ppo))
    (pkg / "trainer.py").write_text(textwrap.dedent(trainer))


def _worker(root) -> Worker:
    s = skyrl.SPEC
    return Worker(LoadSpec(s.adapter, str(root), None, s.stand_ins, s.deny, s.own), timeout=30)


def test_a_changed_placement_rule_fails_loudly(tmp_path):
    _tree(tmp_path, "per_token_reward[0] = float(reward)\n", "def compute_gae_advantage_return(**kw):\n    pass\n")
    with pytest.raises(WorkerLoadError, match="score placement changed"):
        _worker(tmp_path).start()


def test_a_tree_without_the_function_is_a_skip(tmp_path):
    _tree(tmp_path, "per_token_reward[-1] = float(reward)\n", "def something_else():\n    pass\n")
    with pytest.raises(WorkerSkip, match="compute_gae_advantage_return"):
        _worker(tmp_path).start()


# ---------------------------------------------------------------------------------------------
# Kinds beyond GAE (release 0.3.1): the outcome estimators, REINFORCE++, compute_approx_kl and
# normalize_advantages_dict, each SkyRL's own function from the wheel (targets/skyrl/calls_kinds.py).
#
# * The outcome estimators sum token_level_rewards over every column (ppo_utils.py:1053 / :970): a reward on
#   a real token outside the loss mask (an observation, a masked tail) enters the score -- SkyRL's rewards are
#   per response position by design: the poison finding is a fact (masked rewards are not cited as produced:
#   SkyRL's own turn rewards sit there, summed by design), never a defect.
# * They group by uid with no loss mask: a row whose loss mask was zeroed (overlong filtering,
#   generators/utils.py:216-232) still enters its group's mean / std: the declared variant (empty_rows
#   "counted", issue 24), no longer a defect (the padding twin adds no sample to a group).
# * normalize_advantages_dict takes advantages.mean() over every position, padding included (:141).
# ---------------------------------------------------------------------------------------------
def kind_verdicts(handle, case: Case) -> dict:
    from maskfuzz.oracles.kinds.judge import judge as kind_judge

    return {v.property: v for v in kind_judge(handle.run, case, handle.declared.configured(case))}


def kind_fuzz(handle, entry: str) -> set:
    result = fuzz_target(
        handle.run,
        handle.declared,
        target=f"skyrl:{entry}",
        pin=PIN,
        max_examples=40,
        seed=0,
        derandomize=True,
        shrink=False,
    )
    return {p for p, n in result.failed.items() if n}


def test_kind_entries_are_declared_with_cited_pipelines():
    spec = skyrl.SPEC
    assert spec.entries[0] == "default"
    kinds = {e: spec.kind_of(e) for e in spec.entries}
    assert kinds == {
        "default": "gae",
        "grpo": "group-advantage",
        "dr-grpo": "group-advantage",
        "rloo": "group-advantage",
        "reinforce++": "returns",
        "kl-k3": "kl",
        "kl-k1": "kl",
        "kl-k2": "kl",
        "kl-abs": "kl",
        "batch-norm": "normalization",
        "agg-token-mean": "loss-aggregation",
        "agg-sequence-mean": "loss-aggregation",
        "agg-seq-mean-token-sum-norm": "loss-aggregation",
        "agg-prompt-mean": "loss-aggregation",
        "value-loss": "value-loss",
        "policy-loss": "policy-loss",
        "policy-dual-clip": "policy-loss",
        "policy-gspo": "policy-loss",
        "gae-kl": "gae",
        "reinforce++-kl": "returns",
    }
    for e in spec.entries:
        if e.startswith("agg-") or e in ("value-loss", "policy-loss", "policy-dual-clip", "policy-gspo"):  # losses
            continue
        for pin in (PIN, "a9564572eb8e"):
            dom = spec.for_entry(e).pipeline_at(pin)
            assert dom is not None and dom.cited() == [], (e, pin)
    assert spec.declared("rloo").variant == {"estimator": "rloo", "singleton": "zero", "empty_rows": "counted"}
    assert spec.declared("kl-k3").variant["clamp"] == (-10.0, 10.0)
    assert not spec.declared("reinforce++").domain.critic


def test_declared_promises_are_skyrls_words_at_each_pin():
    """issue 24: each loss mode's promise quotes SkyRL at the pin that says it (the wheels' reduce_loss comments, the
    v0.4.0 docs page, git main's config help) and decides a split failure; the estimators declare none; the
    variants say what the code does by design (rows without a trainable token counted)."""
    from maskfuzz.oracles.promises import broken

    spec = skyrl.SPEC
    words = {
        FIRST: "upstream:skyrl_train/utils/ppo_utils.py:617",
        PIN: "upstream:skyrl_train/utils/ppo_utils.py:888",
        "skyrl_train-v0.4.0": "upstream:skyrl-train/docs/configuration/config.rst:485",
        "a9564572eb8e": "upstream:skyrl/train/config/config.py:877",
    }
    for pin, pid in words.items():
        for entry in ("agg-token-mean", "policy-loss"):
            d = spec.declared(entry, pin)
            p = broken("split-invariance", "split-normaliser", d.promises, reach="api", kind=d.kind)
            assert p is not None and p.id == pid, (entry, pin, p)
        d = spec.declared("agg-sequence-mean", pin)
        assert d.variant["empty_rows"] == "counted" and not d.domain.uneven_splits
        assert broken("reference", "variant-mismatch", d.promises, reach="api", kind=d.kind) is None
    assert spec.declared("agg-prompt-mean", FIRST).promises == ()
    (pm,) = spec.declared("agg-prompt-mean", "a9564572eb8e").promises
    assert pm.covers == ("split-invariance",) and "averaged over prompts" in pm.text
    for entry in ("grpo", "dr-grpo", "rloo", "reinforce++", "kl-k3", "batch-norm", "value-loss"):
        assert spec.declared(entry, PIN).promises == (), entry
    assert spec.declared("value-loss", PIN).variant["empty_rows"] == "counted"


@pytest.mark.network
def test_grpo_hand_computed_and_loss_masked_rows_enter_the_group():
    with open_target(f"skyrl:grpo@{PIN}") as h:
        assert h.info["where"] == "skyrl_train/utils/ppo_utils.py::compute_grpo_outcome_advantage"
        # group 3: scores 1, 0, 1: mean 2/3, unbiased std 1/sqrt(3); group 9 a singleton: raw score / (1 + 1e-6)
        case = Case.build(
            trainable=[[1, 1], [1, 1], [1, 1], [1, 1]], score=[1, 0, 1, 5], group=[3, 3, 3, 9], dtype="float64"
        )
        (adv,) = h.run(case)
        s = 1 / math.sqrt(3) + 1e-6
        assert adv[:, 0].tolist() == pytest.approx([(1 / 3) / s, (-2 / 3) / s, (1 / 3) / s, 5 / (1 + 1e-6)])
        v = kind_verdicts(h, case)
        assert all(v[p].status == "pass" for p in ("reference", "permutation", "group-isolation", "affine")), v
        # a row with real tokens but a zeroed loss mask (overlong filtering) still counts: 1, 0 | 0 -> mean 1/3
        masked = Case.build(
            trainable=[[1, 1], [1, 1], [0, 0]],
            attention=[[1, 1]] * 3,
            score=[1, 0, 0],
            group=[0, 0, 0],
            dtype="float64",
        )
        (adv,) = h.run(masked)
        assert adv[0, 0].item() == pytest.approx((2 / 3) / (1 / math.sqrt(3) + 1e-6))
        assert adv[2, 0].item() != 0.0  # broadcast by response_mask, not the loss mask (masked_zero=False)
        v = kind_verdicts(h, masked)  # the declared variant counts the row: nothing fails
        assert v["reference"].status == "pass" and v["pad-invariance"].status == "pass", v
        # a reward on an observation token (attention 1, loss mask 0) is summed into the score
        obs = Case.build(
            trainable=[[1, 0], [1, 1]],
            attention=[[1, 1], [1, 1]],
            token_rewards=[[0, 2], [0, 0]],
            score=[1, 0],
            group=[0, 0],
            dtype="float64",
        )
        t = triaged(h, obs, "poison", kinds=True)  # no witness may use a masked reward: a robustness fact
        assert t["class"] == "robustness" and t["reach"] == "api", t
        bad = kind_fuzz(h, "grpo")
        assert "poison" in bad and "pad-invariance" not in bad, bad
        assert not bad & {"no-crash", "permutation", "group-isolation", "deterministic"}, bad


@pytest.mark.network
def test_rloo_hand_computed_singleton_zero():
    with open_target(f"skyrl:rloo@{PIN}") as h:
        case = Case.build(
            trainable=[[1, 1], [1, 1], [1, 1], [1, 1]], score=[1, 0, 2, 5], group=[0, 0, 0, 1], dtype="float64"
        )
        (adv,) = h.run(case)
        assert adv[:, 0].tolist() == pytest.approx([0.0, -1.5, 1.5, 0.0])  # r - mean of the others; singleton 0
        v = kind_verdicts(h, case)
        assert v["reference"].status == "pass" and v["group-isolation"].status == "pass"
        bad = kind_fuzz(h, "rloo")
        assert "poison" in bad and "pad-invariance" not in bad, bad  # loss-masked rows counted: the variant
        assert not bad & {"no-crash", "permutation", "group-isolation", "deterministic"}, bad


@pytest.mark.network
def test_reinforce_pp_returns_and_whitening():
    with open_target(f"skyrl:reinforce++@{PIN}") as h:
        case = Case.build(
            trainable=[[1, 1, 1], [1, 1, 0]], attention=[[1, 1, 1], [1, 1, 0]], score=[1, 2], gamma=0.5, dtype="float64"
        )
        adv, ret = h.run(case)
        assert ret.flatten().tolist() == pytest.approx([0.25, 0.5, 1.0, 1.0, 2.0, 0.0])
        live = torch.tensor([0.25, 0.5, 1.0, 1.0, 2.0], dtype=torch.float64)
        w = (live - live.mean()) / torch.sqrt(live.var() + 1e-8)
        assert adv[case.trainable].tolist() == pytest.approx(w.tolist())
        # fewer than two response tokens: masked_var's own ValueError (documented)
        with pytest.raises(Exception, match="The sum of the mask is one"):
            h.run(Case.build(trainable=[[1]], score=[1]))
        result = fuzz_target(
            h.run,
            h.declared,
            target="skyrl:reinforce++",
            pin=PIN,
            max_examples=40,
            seed=0,
            derandomize=True,
            shrink=False,
        )
        bad = {p for p, n in result.failed.items() if n}
        assert {"poison", "reference"} <= bad, bad
        assert "deterministic" not in bad, bad


@pytest.mark.network
def test_kl_k3_clamps_and_masks():
    with open_target(f"skyrl:kl-k3@{PIN}") as h:
        assert h.info["where"] == "skyrl_train/utils/ppo_utils.py::compute_approx_kl"
        case = Case.build(
            trainable=[[1, 1, 0]],
            dtype="float64",
            extra={"logp": [[-1.0, -30.0, -5.0]], "ref_logp": [[-2.0, -1.0, -1.0]]},
        )
        (kl,) = h.run(case)
        # d = 1: exp(-1) - 1 + 1; d = -29 clamped to -20, exp(20) - 21 clamped to 10; masked: 0
        assert kl[0].tolist() == pytest.approx([math.exp(-1.0), 10.0, 0.0])
        v = kind_verdicts(h, case)
        assert all(v[p].status == "pass" for p in ("reference", "poison", "masked-zero")), v
        # the wheel multiplies by the mask: a NaN log-prob at a masked position stays NaN there (git main routes it
        # to 0 with torch.where); trainable positions are untouched
        nan = Case.build(trainable=[[1, 0]], extra={"logp": [[-1.0, math.nan]], "ref_logp": [[-1.0, -1.0]]})
        (kl,) = h.run(nan)
        assert kl[0, 0].item() == 0.0 and math.isnan(kl[0, 1].item())
        assert kind_fuzz(h, "kl-k3") == {"masked-zero"}  # kld * loss_mask: NaN * 0 at a masked position


@pytest.mark.network
def test_batch_norm_mean_counts_padding():
    with open_target(f"skyrl:batch-norm@{PIN}") as h:
        case = Case.build(
            trainable=[[1, 1, 0], [1, 0, 0]],
            attention=[[1, 1, 0], [1, 0, 0]],
            dtype="float64",
            extra={"x": [[1.0, 2.0, 0.0], [3.0, 0.0, 0.0]]},
        )
        (out,) = h.run(case)
        # mean over all 6 positions = 1; var over the 3 response positions (biased) = 5/3
        r = 1 / math.sqrt(5 / 3)
        assert out.flatten().tolist() == pytest.approx([0.0, r, -r, 2 * r, -r, -r])
        v = kind_verdicts(h, case)
        assert v["reference"].failed and v["pad-invariance"].failed
        bad = kind_fuzz(h, "batch-norm")
        assert {"poison", "pad-invariance", "reference"} <= bad, bad
        assert not bad & {"permutation", "deterministic"}, bad


def test_batch_norm_is_not_present_at_git_main():
    repos = parse_repos(None)
    if "skyrl" not in repos:
        pytest.skip("git pins: set MASKFUZZ_REPOS=skyrl=/path/to/SkyRL-clone-or-mirror to test SkyRL's layouts")
    with pytest.raises(Exception, match="inlines the batch normalisation"):
        with open_target("skyrl:batch-norm@a9564572eb8e", repos=repos):
            pass


# ---------------------------------------------------------------------------------------------
# Loss aggregation (calls_kinds.load_aggregation). Releases: reduce_loss per micro-batch, / accumulation
# steps (0.3.1 worker.py:692); git main: the advantages of the whole step pre-scaled by
# apply_loss_reduction_to_advantages_minibatch, then reduce_loss (a sum) per micro-batch times dp_size.
# ---------------------------------------------------------------------------------------------
# row 0: 2 tokens (losses 1, 3), row 1: 1 token (loss 2), row 2: none; 100 under the mask; micro-batches {0}, {1, 2}
AGG_STEP = Case.build(
    trainable=[[1, 1, 0], [1, 0, 0], [0, 0, 0]],
    extra={"loss": [[1.0, 3.0, 100.0], [2.0, 100.0, 100.0], [100.0, 100.0, 100.0]]},
    split=[0, 1, 1],
    group=[0, 0, 1],
    dtype="float64",
)
# micro-batches of equal row counts, as SkyRL's loader cuts them (utils.py:100-103, worker_utils.py:31): {0, 1}, {2, 3}
# with 3 and 1 trainable tokens, row 3 empty
AGG_EVEN = Case.build(
    trainable=[[1, 1, 0], [1, 0, 0], [1, 0, 0], [0, 0, 0]],
    extra={"loss": [[1.0, 3.0, 100.0], [2.0, 100.0, 100.0], [4.0, 100.0, 100.0], [100.0, 100.0, 100.0]]},
    split=[0, 0, 1, 1],
    group=[0, 0, 1, 1],
    dtype="float64",
)


@pytest.mark.network
@pytest.mark.parametrize(
    "name, value, grads",
    [
        # micro-batch means 2 and 2, / 2 accumulation steps
        ("agg-token-mean", 2.0, [0.25, 0.25, 0.5]),
        # micro-batch 1 averages row 1 (2) with the empty row (0): (2 + 1) / 2
        ("agg-sequence-mean", 1.5, [0.25, 0.25, 0.25]),
        # (4/32 over 1 row + 2/32 over 2 rows) / 2
        ("agg-seq-mean-token-sum-norm", (4 / 32 + 1 / 32) / 2, [1 / 64, 1 / 64, 1 / 128]),
    ],
)
def test_release_reduce_loss_by_hand(name, value, grads):
    with open_target(f"skyrl:{name}@{PIN}") as h:
        assert h.info["where"] == "skyrl_train/utils/ppo_utils.py::reduce_loss"
        loss, grad = h.run(AGG_STEP)
        assert loss[0, 0].item() == pytest.approx(value)
        assert [grad[0, 0].item(), grad[0, 1].item(), grad[1, 0].item()] == pytest.approx(grads)
        assert grad[:, 2].abs().sum().item() == 0.0 and grad[2].abs().sum().item() == 0.0
        assert kind_verdicts(h, AGG_STEP)["poison"].status == "pass"
        # the api domain draws only equal-row micro-batches (SkyRL's loader); the sequence modes count every row
        # (empty_rows "counted", the declared variant) and are then the step's mean whatever the split
        assert "uneven_splits" in h.declared.domain.restrictions()
        v = kind_verdicts(h, AGG_EVEN)
        if name != "agg-token-mean":
            assert v["split-invariance"].status == "pass" and v["reference"].status == "pass", v
            return
        # token_mean: the mean of the micro-batch token means, / 2, is not the step's token mean (3 and 1 tokens):
        # it breaks SkyRL's own words, "sum over *all* valid tokens, divide by total valid-token count"
        t = triaged(h, AGG_EVEN, "split-invariance", kinds=True)
        assert t["class"] == "defect" and t["promise"] == "upstream:skyrl_train/utils/ppo_utils.py:888", t
        assert "total valid-token count" in t["promise_text"]
        bad = kind_fuzz(h, name)
        assert {"split-invariance", "reference"} <= bad <= {"split-invariance", "reference", "poison-nonfinite"}, bad


@pytest.mark.network
def test_prompt_mean_is_not_present_in_the_release():
    with pytest.raises(Exception, match="no prompt_mean at this pin"):
        with open_target(f"skyrl:agg-prompt-mean@{PIN}"):
            pass


def test_git_main_prescaled_advantages_by_hand():
    repos = parse_repos(None)
    if "skyrl" not in repos:
        pytest.skip("git pins: set MASKFUZZ_REPOS=skyrl=/path/to/SkyRL-clone-or-mirror to test SkyRL's layouts")
    with open_target("skyrl:agg-token-mean@a9564572eb8e", repos=repos) as h:
        loss, grad = h.run(AGG_STEP)  # the step's token mean, whatever the split
        assert loss[0, 0].item() == pytest.approx(2.0)
        assert [grad[0, 0].item(), grad[1, 0].item(), grad[0, 2].item()] == pytest.approx([1 / 3, 1 / 3, 0.0])
        bad = kind_fuzz(h, "agg-token-mean")
        assert bad == {"poison-nonfinite"}, bad  # (A / N) * loss_mask: NaN * 0 (ppo_utils.py:1149)
    with open_target("skyrl:agg-sequence-mean@a9564572eb8e", repos=repos) as h:
        loss, _ = h.run(AGG_STEP)  # A / (batch_size * n_b), batch_size = 3 rows with the empty one
        assert loss[0, 0].item() == pytest.approx(4.0 / 3.0)
        v = kind_verdicts(h, AGG_STEP)  # the empty row counted: the declared variant (issue 24)
        assert v["reference"].status == "pass" and v["split-invariance"].status == "pass"
    with open_target("skyrl:agg-prompt-mean@a9564572eb8e", repos=repos) as h:
        loss, _ = h.run(AGG_STEP)  # prompt 1 (the empty row) counts in num_prompts: 6 / (2 * 3)
        assert loss[0, 0].item() == pytest.approx(1.0)
        v = kind_verdicts(h, AGG_STEP)
        # counting the empty prompt is SkyRL's variant (empty_rows="counted"), which the reference's prompt-mean
        # now counts too: the reference agrees; its own words ("then averaged over prompts", config.py:886) cover
        # the split
        assert v["reference"].status == "pass" and v["split-invariance"].status == "pass"
        interleaved = AGG_STEP.replace(group=torch.tensor([0, 1, 0]))  # compute_prompt_boundaries asserts
        assert kind_verdicts(h, interleaved)["no-crash"].status == "pass"


# ---------------------------------------------------------------------------------------------
# Critic loss (calls_kinds.load_value): ppo_critic_loss per micro-batch, / accumulation steps.
# ---------------------------------------------------------------------------------------------
# row 0: v - v_old = 0.1 inside the clip range 0.2: 0.5 (1 - 0)^2, dl/dv = 1; row 1: v_old = 2, clipped to 1.8:
# 0.5 * 1.8^2 = 1.62 beats 0.5 * 1^2, dl/dv = 0 (clamp saturated); 100 under the mask
VALUE_STEP = Case.build(
    trainable=[[1, 0], [1, 0]],
    extra={"v": [[1.0, 100.0], [1.0, 100.0]], "v_old": [[0.9, 100.0], [2.0, 100.0]], "ret": [[0.0, 0.0], [0.0, 0.0]]},
    dtype="float32",
)


def _value_by_hand(h):
    loss, grad = h.run(VALUE_STEP)  # the mean over the 2 rows of their token means
    assert loss[0, 0].item() == pytest.approx((0.5 + 1.62) / 2)
    assert grad.flatten().tolist() == pytest.approx([0.5, 0.0, 0.0, 0.0])
    v = kind_verdicts(h, VALUE_STEP)
    assert v["reference"].status == "pass" and v["clip-bound"].status == "pass"
    padded = VALUE_STEP.replace(trainable=torch.tensor([[1, 0], [0, 0]], dtype=torch.bool))
    loss, _ = h.run(padded)  # the empty row counts in the row mean (clamp(min=1), ppo_utils.py:88)
    assert loss[0, 0].item() == pytest.approx(0.25)


@pytest.mark.network
def test_critic_loss_by_hand_and_short_fuzz():
    with open_target(f"skyrl:value-loss@{PIN}") as h:
        assert h.info["where"] == "skyrl_train/utils/ppo_utils.py::ppo_critic_loss"
        _value_by_hand(h)
        bad = kind_fuzz(h, "value-loss")
        # empty rows counted is the declared variant and the loader's equal-row micro-batches keep the mean of
        # micro-batch row means the step's (issue 24); what is left is NaN * loss_mask (poison-nonfinite, masked-zero)
        assert "poison-nonfinite" in bad and not bad & {"pad-invariance", "reference", "split-invariance"}, bad
        assert bad <= {"poison-nonfinite", "masked-zero"}, bad


def test_critic_loss_at_git_main():
    repos = parse_repos(None)
    if "skyrl" not in repos:
        pytest.skip("git pins: set MASKFUZZ_REPOS=skyrl=/path/to/SkyRL-clone-or-mirror to test SkyRL's layouts")
    with open_target("skyrl:value-loss@a9564572eb8e", repos=repos) as h:
        assert h.info["where"] == "skyrl/backends/skyrl_train/utils/ppo_utils.py::ppo_critic_loss"
        _value_by_hand(h)


# ---------------------------------------------------------------------------------------------
# Options (trainer.algorithm.*), through the real functions at the release pin.
# ---------------------------------------------------------------------------------------------
def test_grpo_norm_by_std_off_by_hand():
    """group 3: scores 1, 0, 1: mean 2/3; grpo_norm_by_std=False: 1/3, -2/3, 1/3 (no std division);
    group 9 a singleton: mean 0 and std 1 in SkyRL, so the raw score 5."""
    with open_target(f"skyrl:grpo@{PIN}") as h:
        case = Case.build(
            trainable=[[1, 1]] * 4,
            score=[1, 0, 1, 5],
            group=[3, 3, 3, 9],
            dtype="float64",
            options={skyrl.NORM_BY_STD: False},
        )
        (adv,) = h.run(case)
        assert adv[:, 0].tolist() == pytest.approx([1 / 3, -2 / 3, 1 / 3, 5.0])
        assert kind_verdicts(h, case)["reference"].status == "pass"
        result = fuzz_target(
            h.run, h.declared, target="skyrl:grpo", pin=PIN, max_examples=40, seed=0, derandomize=True, shrink=False
        )
        assert all(n > 0 for n in result.options_checked[skyrl.NORM_BY_STD].values()), result.options_checked
        assert not any("is not an option" in f.verdict.message for f in result.findings)


@pytest.mark.parametrize(
    "kind, expected",
    [("k1", [1.0, -29.0]), ("k2", [0.5, 420.5]), ("abs", [1.0, 29.0])],  # d = logp - ref: 1, -29 (unclamped)
)
def test_kl_estimator_type_by_hand(kind, expected):
    with open_target(f"skyrl:kl-k3@{PIN}") as h:
        case = Case.build(
            trainable=[[1, 1, 0]],
            dtype="float64",
            extra={"logp": [[-1.0, -30.0, -5.0]], "ref_logp": [[-2.0, -1.0, -1.0]]},
            options={skyrl.KL_TYPE: kind},
        )
        (kl,) = h.run(case)
        assert kl[0, :2].tolist() == pytest.approx(expected) and kl[0, 2].item() == 0.0
        assert kind_verdicts(h, case)["reference"].status == "pass"


# generator.apply_overlong_filtering: the generator zeroes the loss mask of a response cut by the length limit
# (SkyRL's own apply_overlong_filtering, compiled from the pin). One micro-batch; row 0 (losses 1, 3) is cut.
OVERLONG_STEP = Case.build(
    trainable=[[1, 1, 0], [1, 0, 0], [0, 0, 0]],
    extra={"loss": [[1.0, 3.0, 100.0], [5.0, 100.0, 100.0], [100.0, 100.0, 100.0]]},
    truncated=[True, False, False],
    dtype="float64",
)


def test_overlong_filtering_token_mean_by_hand():
    with open_target(f"skyrl:agg-token-mean@{PIN}") as h:
        (loss, grad) = h.run(OVERLONG_STEP)  # filter off: (1 + 3 + 5) / 3 = 3
        assert loss[0, 0].item() == pytest.approx(3.0)
        on = OVERLONG_STEP.replace(options={skyrl.OVERLONG: True})
        loss, grad = h.run(on)  # filter on: row 0 leaves: 5 / 1, all the gradient on row 1
        assert loss[0, 0].item() == pytest.approx(5.0) and grad.flatten().tolist() == [0, 0, 0, 1, 0, 0, 0, 0, 0]
        assert kind_verdicts(h, on)["reference"].status == "pass"


def test_overlong_filtering_sequence_mean_counts_the_filtered_row():
    """sequence_mean: row means over the micro-batch's rows with clamp(min=1) on each row's token count, so the
    filtered row (now empty) and the empty row 2 stay in the batch mean: 5 / 3, as the declared variant
    (empty_rows "counted", issue 24) says; the canonical excluded rows would give 5 / 1."""
    with open_target(f"skyrl:agg-sequence-mean@{PIN}") as h:
        on = OVERLONG_STEP.replace(options={skyrl.OVERLONG: True})
        loss, _ = h.run(on)
        assert loss[0, 0].item() == pytest.approx(5.0 / 3.0)
        assert kind_verdicts(h, on)["reference"].status == "pass"


def test_overlong_filtering_short_fuzz_checks_both_values():
    with open_target(f"skyrl:agg-token-mean@{PIN}") as h:
        result = fuzz_target(
            h.run,
            h.declared,
            target="skyrl:agg-token-mean",
            pin=PIN,
            max_examples=40,
            seed=0,
            derandomize=True,
            shrink=False,
        )
        assert all(n > 0 for n in result.options_checked[skyrl.OVERLONG].values()), result.options_checked
        assert result.truncated_checked > 0
        assert not any("is not an option" in f.verdict.message for f in result.findings)


# ---------------------------------------------------------------------------------------------
# policy-loss (calls_kinds.load_policy): ppo_policy_loss (PolicyLossRegistry "regular") at cfg.trainer.algorithm's
# defaults; releases reduce per micro-batch (reduce_loss, / accumulation steps), git main pre-scales the advantages.
# ---------------------------------------------------------------------------------------------
# row 0: r = 1 (A 1: l -1, slope -1); r = e^0.5 > 1.2 with A 1 (the clip binds: l -1.2, slope 0);
# row 1: r = e^0.5 with A -1 (outside the range, the unclipped term is the max: l e^0.5, slope e^0.5);
# r = e^-0.1 inside with A 2 (l -2 e^-0.1); 100 under the mask; one row per micro-batch
POLICY_STEP = Case.build(
    trainable=[[1, 1, 0], [1, 1, 0]],
    extra={
        "logp": [[-1.0, -0.5, 100.0], [-0.5, -1.1, 100.0]],
        "old_logp": [[-1.0, -1.0, 100.0], [-1.0, -1.0, 100.0]],
        "adv": [[1.0, 1.0, 100.0], [-1.0, 2.0, 100.0]],
    },
    split=[0, 1],
    dtype="float32",
)
_R = math.exp(0.5)
# row 1 keeps one token: micro-batches of 2 and 1 tokens
POLICY_UNEVEN = POLICY_STEP.replace(trainable=torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool))


def test_policy_loss_entry_is_declared_with_the_config_defaults():
    d = skyrl.SPEC.declared("policy-loss")
    assert d.variant == {
        "clip_low": 0.2,
        "clip_high": 0.2,
        "dual_clip": None,
        "advantages": "token",
        "mode": "token-mean",
    }
    assert d.masked_zero and "float64" not in d.domain.dtypes  # the ratio is exponentiated in float32
    names = {o.name for o in skyrl.SPEC.for_entry("policy-loss").options}
    assert names == {skyrl.POLICY_LOSS_TYPE, skyrl.LOSS_REDUCTION, skyrl.OVERLONG}


def _policy_even(h):
    loss, grad = h.run(POLICY_STEP)  # equal micro-batches: the token mean of the 4 tokens
    assert loss[0, 0].item() == pytest.approx((-1.0 - 1.2 + _R - 2 * math.exp(-0.1)) / 4, rel=1e-6)
    assert grad.flatten().tolist() == pytest.approx([-0.25, 0.0, 0.0, _R / 4, -2 * math.exp(-0.1) / 4, 0.0], rel=1e-6)
    v = kind_verdicts(h, POLICY_STEP)
    for prop in ("reference", "split-invariance", "pad-invariance", "poison", "masked-zero", "empty-step"):
        assert v[prop].status == "pass", (prop, v[prop])


@pytest.mark.network
def test_policy_loss_by_hand_at_the_release():
    with open_target(f"skyrl:policy-loss@{PIN}") as h:
        assert h.info["where"] == "skyrl_train/utils/ppo_utils.py::ppo_policy_loss"
        _policy_even(h)
        # uneven micro-batches: reduce_loss's token mean per micro-batch (ppo_utils.py:887-889), / 2 accumulation
        # steps (worker.py:692): (-2.2 / 2 + e^0.5 / 1) / 2, not the step's (-2.2 + e^0.5) / 3 (true defect, as
        # agg-token-mean)
        loss, _ = h.run(POLICY_UNEVEN)
        assert loss[0, 0].item() == pytest.approx((-1.1 + _R) / 2, rel=1e-6)
        assert kind_verdicts(h, POLICY_UNEVEN)["split-invariance"].failed
        # dual_clip (policy_loss_type) caps row 1's first token at -A * 3 = 3 > e^0.5: unchanged; sequence_mean:
        # the mean of the row means, per micro-batch
        opts = {skyrl.POLICY_LOSS_TYPE: "dual_clip", skyrl.LOSS_REDUCTION: "sequence_mean"}
        loss, _ = h.run(POLICY_STEP.replace(options=opts))
        assert loss[0, 0].item() == pytest.approx((-1.1 + (_R - 2 * math.exp(-0.1)) / 2) / 2, rel=1e-6)
        # float16: a log-ratio of 15 under the mask gives exp in float32 = 3.3e6, inf once cast back to half
        # (_safe_exp_delta, ppo_utils.py:551); with a 0 advantage there, inf * 0 = NaN survives `* loss_mask` (:88)
        x = {k: v.clone() for k, v in POLICY_STEP.extra.items()}
        x["logp"][0, 2], x["old_logp"][0, 2], x["adv"][0, 2] = 15.0, 0.0, 0.0
        half = POLICY_STEP.replace(dtype="float16", extra=x)
        assert torch.isnan(h.run(half)[0]).all()


def test_policy_loss_by_hand_at_git_main():
    repos = parse_repos(None)
    if "skyrl" not in repos:
        pytest.skip("git pins: set MASKFUZZ_REPOS=skyrl=/path/to/SkyRL-clone-or-mirror to test SkyRL's layouts")
    with open_target("skyrl:policy-loss@a9564572eb8e", repos=repos) as h:
        assert h.info["where"] == (
            "skyrl/backends/skyrl_train/utils/ppo_utils.py::apply_loss_reduction_to_advantages_minibatch"
            " + ppo_policy_loss"
        )
        _policy_even(h)
        loss, _ = h.run(POLICY_UNEVEN)  # the pre-scaled advantages: the step's token mean whatever the split
        assert loss[0, 0].item() == pytest.approx((-2.2 + _R) / 3, rel=1e-6)
        assert kind_verdicts(h, POLICY_UNEVEN)["split-invariance"].status == "pass"


def test_policy_dual_clip_entry_is_the_policy_loss_with_the_cap():
    d = skyrl.SPEC.declared("policy-dual-clip")
    assert d.variant == {**skyrl.SPEC.declared("policy-loss").variant, "dual_clip": 3.0}  # clip_ratio_c's default
    assert {o.name for o in skyrl.SPEC.for_entry("policy-dual-clip").options} == {skyrl.LOSS_REDUCTION, skyrl.OVERLONG}


@pytest.mark.network
def test_policy_dual_clip_by_hand_at_the_release():
    """Row 1's first token: r = e^1.5 with A -1, the unclipped -r A = e^1.5 > -A * 3: the loss is capped at 3 (slope
    0) by policy_loss_type "dual_clip" (ppo_utils.py:579-582); the regular entry keeps e^1.5."""
    x = {k: v.clone() for k, v in POLICY_STEP.extra.items()}
    x["logp"][1, 0] = 0.5
    case = POLICY_STEP.replace(extra=x)
    rest = -1.0 - 1.2 - 2 * math.exp(-0.1)
    with open_target(f"skyrl:policy-dual-clip@{PIN}") as h:
        loss, grad = h.run(case)
        assert loss[0, 0].item() == pytest.approx((rest + 3.0) / 4, rel=1e-6)
        assert grad[1, 0].item() == 0.0
        v = kind_verdicts(h, case)
        for prop in ("reference", "split-invariance", "poison", "masked-zero"):
            assert v[prop].status == "pass", (prop, v[prop])
    with open_target(f"skyrl:policy-loss@{PIN}") as h:
        assert h.run(case)[0][0, 0].item() == pytest.approx((rest + math.exp(1.5)) / 4, rel=1e-6)


@pytest.mark.network
def test_policy_loss_short_fuzz():
    """0.3.1: the per-micro-batch token mean (split-invariance, and reference on a split step: ppo_utils.py:887-889,
    worker.py:692), NaN through `loss * loss_mask` (poison-nonfinite / masked-zero, ppo_utils.py:88) and, in float16,
    a masked log-ratio > 11 whose float32 exp overflows when cast back to half (no-crash, ppo_utils.py:551)."""
    with open_target(f"skyrl:policy-loss@{PIN}") as h:
        result = fuzz_target(
            h.run, h.declared, target="skyrl:policy-loss", pin=PIN, max_examples=15, seed=0, derandomize=True,
            shrink=False,
        )  # fmt: skip
        bad = {p for p, n in result.failed.items() if n}
        # empty-step: an all-masked step divides 0 by 0 in the token mean (a degenerate configuration, graded low)
        allowed = {"split-invariance", "reference", "poison-nonfinite", "masked-zero", "no-crash", "empty-step"}
        assert bad <= allowed, bad
        assert "poison-nonfinite" in bad, bad


# ---------------------------------------------------------------------------------------------
# KL in the reward (gae-kl, reinforce++-kl; use_kl_in_reward): the score on the last real token, then the trainer's
# own apply_reward_kl_penalty (0.3.1 skyrl_train/trainer.py:1000-1030, compiled from the source) with the default
# k3 estimator and kl_loss_coef 0.001 (ppo_base_config.yaml:103, :109), then compute_gae_advantage_return /
# compute_reinforce_plus_plus_outcome_advantage. Verdicts by reading SkyRL: compute_approx_kl clamps k3 and
# multiplies it by the loss mask (0.3.1 ppo_utils.py:116-126), so a finite masked KL is dropped, but NaN * 0 = NaN
# reaches the rewards and, through the batch whitening, every advantage (poison-nonfinite, reach api: masked
# log-probs are log-probabilities); git main routes masked positions to 0 with torch.where (ppo_utils.py:125).
# Everything else is the default / reinforce++ entries' (values and rewards on masked real tokens, the score on
# the last real token, loss-masked rows in the whitening).
# ---------------------------------------------------------------------------------------------
_NAN = float("nan")
KL_REWARD = Case.build(  # row 0: a NaN log-prob on a masked token in a gap; row 1: every token trainable
    trainable=[[1, 0, 1], [1, 1, 1]],
    score=[1.0, 2.0],
    gamma=0.5,
    lam=1.0,
    extra={"logp": [[-1.0, _NAN, -2.0], [-0.5, -1.0, -3.0]], "ref_logp": [[-1.5, -1.0, -1.0], [-1.0, -1.0, -1.0]]},
)
_K3 = [math.exp(-0.5) - 0.5, 0.0, math.exp(2.0) - 3.0]  # row 1: d = [0.5, 0, -2], k3 = exp(-d) - 1 + d
_R1 = [-0.001 * _K3[0], 0.0, 2.0 - 0.001 * _K3[2]]  # r - 0.001 * kl, the score on the last token
_RET1 = [_R1[0] + 0.5 * (_R1[1] + 0.5 * _R1[2]), _R1[1] + 0.5 * _R1[2], _R1[2]]  # V = 0, lam 1: discounted sums
_R0 = [-0.001 * (math.exp(-0.5) - 0.5), 0.0, 1.0 - 0.001 * (math.exp(1.0) - 2.0)]  # row 0 at git main (masked -> 0)
_RET0 = [_R0[0] + 0.5 * (_R0[1] + 0.5 * _R0[2]), _R0[1] + 0.5 * _R0[2], _R0[2]]


def test_kl_reward_entries_are_declared_with_the_shipped_coefficient():
    spec = skyrl.SPEC
    for entry, kind in (("gae-kl", "gae"), ("reinforce++-kl", "returns")):
        d = spec.declared(entry)
        assert d.kind == kind and d.contract == "dense"
        k3 = {"coef": 0.001, "estimator": "k3", "clamp_d": (-20.0, 20.0), "clamp": (-10.0, 10.0)}
        assert d.variant == {"kl_reward": k3}
        assert [o.name for o in d.options] == ["trainer.algorithm.kl_estimator_type"]
        for pin in (PIN, "a9564572eb8e"):
            dom = spec.declared(entry, pin).pipeline
            assert dom.cited() == [] and not dom.masked_logprobs, (entry, pin)


@pytest.mark.network
@pytest.mark.parametrize("entry", ["gae-kl", "reinforce++-kl"])
def test_kl_reward_by_hand_at_the_release(entry):
    with open_target(f"skyrl:{entry}@{PIN}") as h:
        adv, ret = h.run(KL_REWARD)
        assert ret[1].tolist() == pytest.approx(_RET1, rel=1e-5)
        # kld * loss_mask: NaN * 0 (ppo_utils.py:126) enters the rewards, then masked_whiten's batch mean
        assert torch.isnan(ret[0, :2]).all() and torch.isnan(adv).all()


@pytest.mark.parametrize("entry", ["gae-kl", "reinforce++-kl"])
def test_kl_reward_by_hand_at_git_main(entry):
    repos = parse_repos(None)
    if "skyrl" not in repos:
        pytest.skip("git pins: set MASKFUZZ_REPOS=skyrl=/path/to/SkyRL-clone-or-mirror to test SkyRL's layouts")
    with open_target(f"skyrl:{entry}@a9564572eb8e", repos=repos) as h:
        adv, ret = h.run(KL_REWARD)
        # torch.where(loss_mask.bool(), kld * loss_mask, 0.0) (ppo_utils.py:125): the NaN never reaches the rewards
        assert ret.flatten().tolist() == pytest.approx(_RET0 + _RET1, rel=1e-5) and torch.isfinite(adv).all()


SKYRL_KL_FUZZ = {  # entry -> (must fail, may fail), 20 unshrunk examples at 0.3.1
    # the default entry's: masked values bootstrap and masked real-token rewards enter the dense GAE, loss-masked rows
    # in masked_whiten(advantages, response_mask) (poison, reference); the whitened masked advantages (masked-zero,
    # read by the batch normalisation); NaN (api). row-independence adds padding only now (issue 24)
    "gae-kl": (
        {"poison"},
        {"reference", "poison-nonfinite", "score-kept", "telescoping", "masked-zero", "row-independence"},
    ),
    # the reinforce++ entry's: rewards on observation tokens (poison, reference, telescoping), the whitening
    "reinforce++-kl": (
        {"poison"},
        {"reference", "row-independence", "poison-nonfinite", "score-kept", "telescoping", "no-crash"},
    ),
}


@pytest.mark.network
@pytest.mark.parametrize("entry", list(SKYRL_KL_FUZZ))
def test_kl_reward_short_fuzz(entry):
    must, may = SKYRL_KL_FUZZ[entry]
    with open_target(f"skyrl:{entry}@{PIN}") as h:
        res = fuzz_target(h.run, h.declared, target=f"skyrl:{entry}", pin=PIN, max_examples=20, seed=0, shrink=False)
    found = {f.property for f in res.findings}
    assert must <= found <= must | may, found

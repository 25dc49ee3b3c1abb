"""torchrl's functional GAE through its adapter (`torchrl:default` = generalized_advantage_estimate,
`torchrl:vec` = vec_generalized_advantage_estimate), judged by the oracle.

The adapter maps a row to one trajectory that ends at its last trainable token (done = terminated
there, next_state_value = values shifted left). The verdicts asserted here were derived by reading
`torchrl/objectives/value/functional.py` at 0.14.1 (the same code from 0.6.0 to git main):

* Both: `not_terminated = (~terminated).int()`; the value after the terminal step is multiplied by
  `gamma * not_terminated` = 0, so a finite value there never leaks but NaN / inf does (NaN * 0).
* Loop: `gamma * not_terminated` and `lmbda * gamma * not_done` are an int tensor times a Python
  float, i.e. float32 tensors: a float64 run computes with gamma and gamma * lambda rounded to float32.
* Vec (scalar gamma, lambda -> `_fast_vec_gae`): `_geom_series_like` returns `zeros_like(t)` (no
  trailing dim) when gamma * lambda == 0, so `_custom_conv1d` raises IndexError; when
  0 < gamma * lambda < 1e-7 it keeps `int(log(1e-7) / log(r)) = 0` terms and `rs[0] = 1.0` raises
  IndexError on the empty series; otherwise it drops the terms below thr = 1e-7, which float64
  outputs show (A_0 of a length-24 trajectory at gamma * lambda = 0.5 loses 0.5**23).

Release pins download wheels (network marker); the git pin needs MASKFUZZ_REPOS=torchrl=/path.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from maskfuzz.fuzz.engine import fuzz_target
from maskfuzz.oracles.case import Case
from maskfuzz.oracles.kinds.dispatch import judge
from maskfuzz.targets.runtime.repos import parse_repos
from maskfuzz.targets.runtime.session import open_target
from maskfuzz.targets.torchrl import calls as torchrl_calls
from maskfuzz.targets.torchrl import declare as torchrl

PIN = "0.14.1"
ENTRIES = ("default", "vec")


def verdicts(handle, case: Case) -> dict:
    return {v.property: v for v in judge(handle.run, case, handle.declared)}


def failed(v: dict) -> set[str]:
    return {p for p, x in v.items() if x.failed}


@pytest.fixture(scope="module")
def loop():
    with open_target(f"torchrl@{PIN}") as h:
        yield h


@pytest.fixture(scope="module")
def vec():
    with open_target(f"torchrl:vec@{PIN}") as h:
        yield h


@pytest.fixture(params=ENTRIES)
def gae(request):
    """Each entry in turn, on the two module-wide workers (a torchrl worker takes seconds to start)."""
    return request.getfixturevalue("loop" if request.param == "default" else "vec")


# ---------------------------------------------------------------------------------------------
# The mapping (no upstream code needed).
# ---------------------------------------------------------------------------------------------
def test_mapping_ends_each_row_at_its_last_trainable_token():
    case = Case.build(
        trainable=[[0, 1, 1, 0], [0, 0, 0, 0]],
        attention=[[1, 1, 1, 1], [0, 0, 1, 1]],
        token_rewards=[[1, 2, 3, 4], [5, 6, 7, 8]],
        values=[[0.5, 1.5, 2.5, 3.5], [1, 2, 3, 4]],
        score=[10, 20],
        dtype="float64",
    )
    x = torchrl_calls.framework_inputs(case, "cpu")
    assert all(t.shape == (2, 4, 1) for t in x.values())
    assert x["done"].squeeze(-1).tolist() == [[False, False, True, False], [False] * 4]
    assert torch.equal(x["terminated"], x["done"])
    assert x["reward"].squeeze(-1).tolist() == [[1, 2, 13, 4], [5, 6, 7, 8]]  # score at the last trainable token
    assert x["next_state_value"].squeeze(-1).tolist() == [[1.5, 2.5, 3.5, 0.0], [2, 3, 4, 0]]
    assert x["state_value"].dtype == torch.float64 and x["done"].dtype == torch.bool


def test_gaps_are_outside_the_domain_with_a_reason():
    gap = Case.build(trainable=[[1, 0, 1]])
    assert torchrl.SPEC.domain.rejects(gap) == "row 0 has a gap between trainable tokens"
    assert "no token mask" in torchrl.SPEC.domain.restrictions()["gaps"]
    tail = Case.build(trainable=[[0, 1, 1, 0]], attention=[[1, 1, 1, 1]])
    assert torchrl.SPEC.domain.rejects(tail) is None  # a masked head and an observation tail are expressible
    assert not torchrl.SPEC.masked_zero and "after `done`" in torchrl.SPEC.masked_zero_why


def test_pipeline_domain_is_cited_and_follows_the_nan_sanitising_of_the_gae_module():
    spec = torchrl.SPEC
    old, new, head = spec.pipeline, spec.pipeline_at("0.14.1"), spec.pipeline_at("ae9719f17b15")
    assert all(spec.pipeline_at(p) is old for p in ("0.12.0", "0.10.1", "0.8.1", "0.6.0"))
    assert old.cited() == [] and new.cited() == [] and head.cited() == []
    assert set(old.restrictions()) == {"gaps"}  # a general library: everything else stays permissive
    assert set(new.restrictions()) == set(head.restrictions()) == {"gaps", "nonfinite_poison"}
    gap = Case.build(trainable=[[1, 0, 1]])
    assert "gap" in old.rejects(gap) and "gap" in new.rejects(gap)  # gaps, as the api domain
    # AutoResetTransform's NaN next observation: V(next) at the done step is NaN up to 0.12.0, sanitised from 0.14.1
    nan_next = Case.build(trainable=[[1, 1, 0]], attention=[[1, 1, 1]], values=[[0.5, 0.25, math.nan]])
    assert old.rejects(nan_next) is None
    assert "NaN / inf" in new.rejects(nan_next) and "NaN / inf" in head.rejects(nan_next)  # nonfinite_poison
    anything = Case.build(
        trainable=[[0, 1, 1, 0], [0, 0, 0, 0]],
        attention=[[1, 1, 1, 1], [0, 0, 1, 1]],
        token_rewards=[[1.0, 2.0, 3.0, 4.0]] * 2,
        values=[[9.0, 1.0, 2.0, -9.0]] * 2,
        dtype="bfloat16",
    )
    assert old.rejects(anything) is None and new.rejects(anything) is None


# ---------------------------------------------------------------------------------------------
# Release 0.14.1, both entries.
# ---------------------------------------------------------------------------------------------
@pytest.mark.network
def test_entries_load_the_functional_module_of_the_wheel(gae):
    name = "vec_generalized_advantage_estimate" if gae.ref.entry == "vec" else "generalized_advantage_estimate"
    assert gae.info["where"] == f"torchrl/objectives/value/functional.py::{name}"
    assert gae.info["stand_ins_used"] == []
    assert gae.resolved == f"torchrl=={PIN}"


@pytest.mark.network
def test_finite_poison_after_done_and_before_the_first_token_never_leaks(gae):
    case = Case.build(
        trainable=[[0, 1, 1, 0, 0], [1, 1, 1, 1, 1]],
        attention=[[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]],  # masked head, observation tail, padding
        token_rewards=[[50, 0, 1, -30, 9], [0, 0.5, 0, 0, 0]],
        values=[[7, 0.5, 0.25, 100, -100], [0.5, 0.25, 0.125, 1, 2]],
        score=[1, 2],
        gamma=0.9,
        lam=0.75,
    )
    v = verdicts(gae, case)
    for prop in ("no-crash", "poison", "row-independence", "deterministic", "reference"):
        assert v[prop].status == "pass", (prop, v[prop].message)
    assert v["masked-zero"].status == "n/a"  # declared: the tail is a trajectory of its own
    adv, _ = gae.run(case)
    assert adv[0, 3].item() != 0  # ... and it does get advantages


@pytest.mark.network
def test_nan_value_after_done_is_multiplied_in(gae):
    case = Case.build(
        trainable=[[1, 1, 0], [1, 1, 1]],
        attention=[[1, 1, 0], [1, 1, 1]],
        values=[[0.5, 0.25, math.nan], [0.5, 0.25, 0.5]],
        score=[1, 1],
        gamma=1,
        lam=0.5,
    )
    v = verdicts(gae, case)
    assert v["poison-nonfinite"].failed
    assert [0, 1] in v["poison-nonfinite"].positions  # next_state_value * (gamma * 0) at the terminal step


@pytest.mark.network
def test_loop_keeps_the_score_at_gamma_zero_vec_raises(loop, vec):
    case = Case.build(
        trainable=[[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]],
        values=[[0.5, 0, 0.25, 9, 9], [0] * 5],
        score=[1, 1],
        gamma=0,
        lam=0.95,
    )
    v = verdicts(loop, case)
    assert v["score-kept"].status == "pass" and v["reference"].status == "pass"
    v = verdicts(vec, case)
    assert v["no-crash"].failed and "IndexError: tuple index out of range" in v["no-crash"].message


@pytest.mark.network
def test_vec_raises_when_gamma_lambda_is_below_its_threshold(loop, vec):
    case = Case.build(
        trainable=[[1, 1, 1, 0], [1, 1, 1, 1]],
        values=[[0.5, 0.25, 1, 0], [0.5, 0.25, 0.5, 1]],
        score=[1, 1],
        gamma=1e-4,
        lam=1e-4,
    )  # gamma * lam = 1e-8 < thr = 1e-7
    assert failed(verdicts(loop, case)) == set()
    v = verdicts(vec, case)
    assert v["no-crash"].failed and "IndexError: index 0 is out of bounds" in v["no-crash"].message


@pytest.mark.network
def test_vec_truncates_the_series_in_float64(loop, vec):
    # rewards and values 0, score 1 at the end: A_0 = 0.5**23 = 1.19e-7, a term below thr = 1e-7
    case = Case.build(trainable=[[1] * 24], score=[1], gamma=1, lam=0.5, dtype="float64")
    adv, _ = vec.run(case)
    assert adv[0, 0].item() == 0.0 and adv[0, 1].item() == 0.5**22
    v = verdicts(vec, case)
    assert v["reference"].failed and v["all-trainable"].failed and v["reference"].positions == [[0, 0]]
    adv, _ = loop.run(case)
    assert adv[0, 0].item() == 0.5**23
    assert failed(verdicts(loop, case)) == set()


@pytest.mark.network
def test_loop_runs_float64_with_float32_gamma(loop):
    rewards, values, gamma, lam = [1.0, 2, 3, 4], [10.0, 20, 30, 40], 0.9, 0.8
    case = Case.build(
        trainable=[[1] * 4], token_rewards=[rewards], values=[values], gamma=gamma, lam=lam, dtype="float64"
    )
    v = verdicts(loop, case)
    assert v["reference"].failed and v["all-trainable"].failed
    f32 = lambda x: float(torch.tensor(x, dtype=torch.float32))  # noqa: E731
    g, c, nxt, a = f32(gamma), f32(gamma * lam), 0.0, 0.0
    expected = []
    for t in reversed(range(4)):  # the same recursion with torchrl's float32 constants
        a = rewards[t] + g * nxt - values[t] + c * a
        expected.insert(0, a)
        nxt = values[t]
    adv, _ = loop.run(case)
    assert adv[0].tolist() == pytest.approx(expected, rel=1e-14, abs=1e-13)


@pytest.mark.network
def test_short_fuzz_of_the_loop(loop):
    result = fuzz_target(
        loop.run, loop.declared, target="torchrl", pin=PIN, max_examples=40, seed=0, derandomize=True, shrink=False
    )
    bad = {p for p, n in result.failed.items() if n}
    assert "poison-nonfinite" in bad, bad
    assert not bad & {"no-crash", "poison", "score-kept", "telescoping", "row-independence", "deterministic"}, bad
    # the only deviation from the reference is float32 gamma, which only float64 cases can see
    assert all(f.case.dtype == "float64" for f in result.findings if f.property in ("reference", "all-trainable"))


@pytest.mark.network
def test_short_fuzz_of_vec(vec):
    result = fuzz_target(
        vec.run, vec.declared, target="torchrl", pin=PIN, max_examples=100, seed=0, derandomize=True, shrink=False
    )
    bad = {p for p, n in result.failed.items() if n}
    assert {"no-crash", "poison-nonfinite"} <= bad, bad
    assert not bad & {"poison", "row-independence", "deterministic"}, bad
    crash = result.finding("no-crash")
    assert "IndexError" in crash.verdict.message and crash.case.gamma * crash.case.lam < 1e-7


# ---------------------------------------------------------------------------------------------
# Git pin (mirror).
# ---------------------------------------------------------------------------------------------
def test_git_main_has_the_same_functions():
    repos = parse_repos(None)
    if "torchrl" not in repos:
        pytest.skip("git pin: set MASKFUZZ_REPOS=torchrl=/path/to/pytorch-rl-clone-or-mirror to test torchrl at main")
    case = Case.build(trainable=[[1, 1, 0]], values=[[0.5, 0.25, 100]], score=[1], gamma=0.0, lam=0.9)
    with open_target("torchrl:vec@ae9719f17b15", repos=repos) as h:
        assert h.info["where"] == "torchrl/objectives/value/functional.py::vec_generalized_advantage_estimate"
        assert verdicts(h, case)["no-crash"].failed
    with open_target("torchrl@ae9719f17b15", repos=repos) as h:
        v = verdicts(h, case)
        assert v["score-kept"].status == "pass" and v["poison"].status == "pass"


# ---------------------------------------------------------------------------------------------
# Entries beyond GAE (targets/torchrl/calls_kinds.py) at 0.14.1: MCAdvantage (mc-advantage: the
# per-step branch, mc-advantage-sum: trajectory_return="sum") and KLComputation (kl). Values are
# hand-computed from torchrl/objectives/llm/grpo.py:1502-1512, 1583 and envs/llm/transforms/kl.py:1558-1563.
# ---------------------------------------------------------------------------------------------

from kind_support import handle_cache, verdicts_by_property  # noqa: E402


@pytest.fixture(scope="module")
def entry():
    with handle_cache(lambda name: open_target(f"torchrl:{name}@{PIN}")) as get:
        yield get


kind_verdicts = verdicts_by_property


# two groups interleaved (ids are labels); row 2 starts with a masked prompt token
GROUPS = Case.build(
    trainable=[[1, 1], [1, 1], [0, 1], [1, 1]],
    attention=[[1, 1]] * 4,
    score=[1.0, 0.0, 3.0, 2.0],
    group=[7, 4, 7, 4],
    dtype="float32",
)


@pytest.mark.network
@pytest.mark.parametrize("name", ["mc-advantage", "mc-advantage-sum"])
def test_mc_advantage_by_hand(entry, name):
    # group 7: 1, 3 (mean 2, unbiased std sqrt 2); group 4: 0, 2 -> -+1/sqrt 2, broadcast to every position
    (adv,) = entry(name).run(GROUPS)
    z = 2**-0.5
    assert adv.flatten().tolist() == pytest.approx([-z, -z, -z, -z, z, z, z, z], rel=1e-6)
    v = kind_verdicts(entry(name), GROUPS)
    for prop in ("no-crash", "reference", "permutation", "group-isolation", "affine", "poison"):
        assert v[prop].status == "pass", (name, v[prop])


@pytest.mark.network
@pytest.mark.parametrize("name", ["mc-advantage", "mc-advantage-sum"])
def test_a_row_without_trainable_tokens_counts_in_its_group(entry, name):
    """MCAdvantage has no mask: a trajectory whose response has no trainable token enters the mean and std."""
    case = Case.build(trainable=[[1], [1], [0]], attention=[[1], [1], [1]], score=[1.0, 0.0, 5.0], group=[0, 0, 0])
    (adv,) = entry(name).run(case)
    std = (((1 - 2) ** 2 + (0 - 2) ** 2 + (5 - 2) ** 2) / 2) ** 0.5
    assert adv[:, 0].tolist() == pytest.approx([(1 - 2) / std, (0 - 2) / std, (5 - 2) / std], rel=1e-6)
    assert kind_verdicts(entry(name), case)["reference"].failed  # canonical: +-0.7071 for the two real rows


@pytest.mark.network
def test_singleton_groups_nan_per_step_refused_with_a_return(entry):
    case = Case.build(trainable=[[1], [1]], score=[1.0, 2.0], group=[0, 1])
    (adv,) = entry("mc-advantage").run(case)  # std of one element is NaN, NaN.clamp_min(1e-6) is NaN
    assert torch.isnan(adv).all()
    assert kind_verdicts(entry("mc-advantage"), case)["no-crash"].failed
    v = kind_verdicts(entry("mc-advantage-sum"), case)  # grpo.py:1165-1170 refuses grpo_size < 2
    assert v["no-crash"].status == "pass" and "grpo_size >= 2" in v["no-crash"].message
    unequal = GROUPS.replace(group=torch.tensor([0, 0, 0, 1]))
    v = kind_verdicts(entry("mc-advantage"), unequal)
    assert v["no-crash"].status == "pass" and "GroupShapeError" in v["no-crash"].message


@pytest.mark.network
def test_kl_computation_by_hand(entry):
    nan = float("nan")
    case = Case.build(
        trainable=[[1, 1, 0]], dtype="float32", extra={"logp": [[-1.0, -3.0, nan]], "ref_logp": [[-1.5, -1.0, 0.0]]}
    )
    (kl,) = entry("kl").run(case)
    assert kl[0].tolist() == pytest.approx([0.5, -2.0, 0.0])  # k1, a NaN position set to 0 (kl.py:1560-1562)
    v = kind_verdicts(entry("kl"), case)
    assert v["poison-nonfinite"].status == "pass"


@pytest.mark.network
@pytest.mark.parametrize(
    "name, failing",
    [
        ("mc-advantage", {"no-crash", "reference", "pad-invariance", "affine"}),
        ("kl", set()),
    ],
)
def test_short_fuzz_of_the_entries(entry, name, failing):
    h = entry(name)
    res = fuzz_target(h.run, h.declared, target="torchrl", pin=PIN, max_examples=40, seed=0, shrink=False)
    bad = {p for p, n in res.failed.items() if n}
    assert bad <= failing, bad
    assert res.checked["reference"] > 0 and res.checked["poison"] > 0


@pytest.mark.parametrize(
    "name",
    [
        e
        for e in torchrl.SPEC.entries
        if torchrl.SPEC.for_entry(e).kind not in ("gae", "loss-aggregation", "value-loss", "policy-loss")
    ],
)
def test_each_entry_declares_a_cited_pipeline(name):
    spec = torchrl.SPEC.for_entry(name)
    assert spec.kind in ("group-advantage", "kl")
    assert spec.pipeline is not None and spec.pipeline.cited() == []
    assert spec.masked_zero is False and spec.masked_zero_why


# ---------------------------------------------------------------------------------------------
# Loss aggregation: GRPOLoss._aggregate_loss_value per micro-batch (torchrl_kinds.load_aggregation), each
# micro-batch loss / gradient_accumulation_steps (trainers.py:479 at 0.14.1); no global normaliser.
# ---------------------------------------------------------------------------------------------
# row 0: 2 tokens (losses 1, 3), row 1: 1 token (loss 2), row 2: none; 100 under the mask; micro-batches {0}, {1, 2}
AGG_STEP = Case.build(
    trainable=[[1, 1, 0], [1, 0, 0], [0, 0, 0]],
    extra={"loss": [[1.0, 3.0, 100.0], [2.0, 100.0, 100.0], [100.0, 100.0, 100.0]]},
    split=[0, 1, 1],
    dtype="float64",
)


@pytest.mark.network
def test_agg_token_mean_normalises_each_micro_batch(entry):
    h = entry("agg-token-mean")
    loss, grad = h.run(AGG_STEP)
    # (mean 2 of micro-batch 0 + mean 2 of micro-batch 1) / 2 accumulation steps: 2, the step's 6/3 by luck
    assert loss[0, 0].item() == pytest.approx(2.0)
    assert grad.flatten().tolist() == pytest.approx([0.25, 0.25, 0.0, 0.5, 0.0, 0.0, 0.0, 0.0, 0.0])
    # the call's own mean by design (scope "micro-batch", issue 24): no split-invariance to break; the reference
    # (the per-call "global masked token mean", grpo.py:401) holds
    v = kind_verdicts(h, AGG_STEP)
    assert v["split-invariance"].status == "n/a" and v["reference"].status == "pass" and v["poison"].status == "pass"


@pytest.mark.network
def test_agg_prompt_mean_is_a_row_mean_counting_empty_rows(entry):
    h = entry("agg-prompt-mean")
    loss, grad = h.run(AGG_STEP)
    # micro-batch 0: row mean 2; micro-batch 1: (2 + 0 for the empty row) / 2 = 1; (2 + 1) / 2
    assert loss[0, 0].item() == pytest.approx(1.5)
    assert grad.flatten().tolist() == pytest.approx([0.25, 0.25, 0.0, 0.25, 0.0, 0.0, 0.0, 0.0, 0.0])
    whole = AGG_STEP.replace(split=None)
    # one micro-batch: (2 + 2 + 0) / 3, the empty row counted. That is torchrl's variant and its docstring's:
    # "per-sample masked mean over tokens, then mean across samples (equal sample weight)" (grpo.py:402), declared as
    # empty_rows "counted" (issue 24): the reference agrees, and the padding twin (a padding column, no new sample)
    # changes nothing. Against the canonical variant (empty rows excluded, (2 + 2) / 2) it is a semantics fact.
    v = kind_verdicts(h, whole)
    assert v["reference"].status == "pass" and v["pad-invariance"].status == "pass", v
    assert h.declared.variant["empty_rows"] == "counted"
    from maskfuzz.fuzz.triage import retriage
    from maskfuzz.oracles.kinds.judge import judge as kind_judge

    canonical = dataclasses.replace(h.declared, variant={**h.declared.variant, "empty_rows": "excluded"}, promises=())
    ref = {x.property: x for x in kind_judge(h.run, whole, canonical)}["reference"]
    assert ref.failed
    t = retriage(h.run, whole, ref, canonical, "torchrl:agg-prompt-mean")
    assert t["class"] == "semantics" and t["mechanism"] == "variant-mismatch", t


@pytest.mark.network
def test_kl_to_ref_averages_over_every_position(entry):
    """GRPOLoss._kl_to_ref: k3 of the masked log-ratio, then .mean() over all B x T positions (grpo.py:920 at
    0.14.1): padding and masked tokens dilute the term (the hand finding of the previous audit, now a property)."""
    import math

    h = entry("kl-to-ref")
    case = Case.build(trainable=[[1, 0]], attention=[[1, 0]], extra={"loss": [[1.0, 0.0]]})
    loss, grad = h.run(case)
    assert loss[0, 0].item() == pytest.approx((math.expm1(1.0) - 1.0) / 2, rel=1e-6)  # over 2 positions
    assert grad[0].tolist() == pytest.approx([math.expm1(1.0) / 2, 0.0], rel=1e-6)
    v = kind_verdicts(h, case)
    assert v["reference"].failed and v["poison"].status == "pass"


@pytest.mark.network
@pytest.mark.parametrize(
    "name, failing",
    [
        # per call by design (scope "micro-batch") and the empty rows of prompt_mean counted (issue 24): what is left
        # is NaN through the prompt_mean's `value * mask_exp` (grpo.py:807) and its all-masked step
        ("agg-token-mean", {"poison-nonfinite", "empty-step"}),
        ("agg-prompt-mean", {"poison-nonfinite", "empty-step"}),
    ],
)
def test_short_fuzz_of_the_aggregations(entry, name, failing):
    h = entry(name)
    res = fuzz_target(h.run, h.declared, target="torchrl", pin=PIN, max_examples=60, seed=0, shrink=False)
    bad = {p for p, n in res.failed.items() if n}
    # the kind strategies still draw uneven splits the api domain excludes (uneven_splits=False: the GRPO recipe's
    # equal micro-batches on one process); a reference finding there is the adapter's per-rank accumulation against
    # the reference's configured one, on a step torchrl never builds (see docs/audit/torchrl.md)
    for f in res.findings:
        if f.property == "reference":
            assert "micro-batches of different sizes" in (h.declared.domain.rejects(f.case) or ""), f.case
    assert bad - {"reference"} <= failing, bad
    assert res.checked["poison"] > 0 and res.checked["permutation"] > 0
    if name == "agg-token-mean":  # the prompt_mean defects, reached through the `aggregation` option
        assert all(n > 0 for n in res.options_checked["aggregation"].values()), res.options_checked
        for f in res.findings:
            if f.property in ("pad-invariance", "poison-nonfinite", "empty-step"):
                assert f.case.options == {"aggregation": "prompt_mean"}, (f.property, f.case.options)


# ---------------------------------------------------------------------------------------------
# Options and truncated rows at 0.14.1. A truncated row (cut by the length limit) ends its trajectory with
# `done` but not `terminated` at its last trainable token, and ("next", "state_value") there is the case's
# bootstrap value (functional.py:164-172: delta = r + gamma * (~terminated) * V' - V, the recursion cut by done).
# The GAE module (`torchrl:module`) takes the options average_gae and vectorized.
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def module():
    with open_target(f"torchrl:module@{PIN}") as h:
        yield h


@pytest.fixture(params=("default", "vec", "module"))
def any_gae(request):
    return request.getfixturevalue({"default": "loop", "vec": "vec", "module": "module"}[request.param])


def test_truncation_and_options_are_declared_with_citations():
    for name in ("default", "vec", "module"):
        trunc = torchrl.SPEC.for_entry(name).truncation
        assert trunc.bootstrap == "value" and trunc.score == "kept" and trunc.row == "kept"
        assert "functional.py:164-172" in trunc.cite
    opts = {o.name: o for o in torchrl.SPEC.for_entry("module").options}
    assert set(opts) == {"average_gae", "vectorized"}
    assert opts["average_gae"].default is False and opts["vectorized"].default is False
    assert {o.name for o in torchrl.SPEC.for_entry("agg-token-mean").options} == {"aggregation"}
    assert {o.name for o in torchrl.SPEC.for_entry("mc-advantage-sum").options} == {"trajectory_return"}


def test_a_truncated_row_is_done_but_not_terminated_with_the_bootstrap_as_next_value():
    case = Case.build(
        trainable=[[1, 1, 0], [1, 1, 0]],
        attention=[[1, 1, 0], [1, 1, 0]],
        values=[[1.0, 2.0, 99.0], [1.0, 2.0, 99.0]],
        truncated=[True, False],
        bootstrap=[4.0, 7.0],
        dtype="float64",
    )
    x = torchrl_calls.framework_inputs(case, "cpu")
    assert x["done"].squeeze(-1).tolist() == [[False, True, False]] * 2
    assert x["terminated"].squeeze(-1).tolist() == [[False, False, False], [False, True, False]]
    # the bootstrap where the critic's V(state after the last token) goes; the ended row keeps its shifted value
    assert x["next_state_value"].squeeze(-1).tolist() == [[2.0, 4.0, 0.0], [2.0, 99.0, 0.0]]


# V = [1, 2], then padding holding 99; gamma 0.5, lambda 1, score 1 at the last token, bootstrap 4:
# cut:   delta_1 = 1 + 0.5 * 4 - 2 = 1, delta_0 = 0 + 0.5 * 2 - 1 = 0, A_0 = 0 + 0.5 * 1 = 0.5 -> A = [0.5, 1]
# ended: delta_1 = 1 - 2 = -1,           delta_0 = 0,                 A_0 = 0.5 * -1 = -0.5   -> A = [-0.5, -1]
TRUNC = Case.build(
    trainable=[[1, 1, 0], [1, 1, 0]],
    attention=[[1, 1, 0], [1, 1, 0]],
    values=[[1.0, 2.0, 99.0], [1.0, 2.0, 99.0]],
    score=[1.0, 1.0],
    gamma=0.5,
    lam=1.0,
    truncated=[True, False],
    bootstrap=[4.0, 4.0],
    dtype="float64",
)


@pytest.mark.network
def test_truncated_row_bootstraps_from_the_next_state_value_by_hand(any_gae):
    adv, ret = any_gae.run(TRUNC)
    assert adv[:, :2].tolist() == [[0.5, 1.0], [-0.5, -1.0]]
    assert ret[0, :2].tolist() == [1.5, 3.0]  # A + V
    v = verdicts(any_gae, TRUNC)
    for prop in ("no-crash", "reference", "poison", "row-independence"):
        assert v[prop].status == "pass", (prop, v[prop].message)


@pytest.mark.network
def test_average_gae_standardises_over_every_position_of_the_batch(module):
    # two one-token rows, scores 1 and 3, V = 0: A = [1, 3]; mean 2, unbiased std sqrt 2 -> -+1/sqrt 2
    case = Case.build(trainable=[[1], [1]], score=[1.0, 3.0], dtype="float64", options={"average_gae": True})
    adv, _ = module.run(case)
    z = 2**-0.5
    assert adv.flatten().tolist() == pytest.approx([-z, z], rel=1e-12)
    assert verdicts(module, case)["reference"].status == "pass"
    # a padding position after each row is a transition of its own for torchrl (A = 0 - 0 = 0 there) and enters
    # the statistics (advantages.py:2390-2393): A = [1, 0, 3, 0], mean 1, unbiased std sqrt(6 / 3) = sqrt 2
    # -> [0, -1/sqrt 2, 2/sqrt 2, -1/sqrt 2], where the masked reference whitens the trainable [1, 3] to -+1/sqrt 2
    padded = Case.build(
        trainable=[[1, 0], [1, 0]],
        attention=[[1, 0], [1, 0]],
        score=[1.0, 3.0],
        dtype="float64",
        options={"average_gae": True},
    )
    adv, _ = module.run(padded)
    assert adv.flatten().tolist() == pytest.approx([0.0, -z, 2 * z, -z], rel=1e-12, abs=1e-15)
    assert verdicts(module, padded)["reference"].failed


@pytest.mark.network
def test_vectorized_runs_the_vec_functional_with_its_series_threshold(module):
    # rewards and values 0, score 1 at the end of 24 tokens, gamma 1, lambda 0.5: A_0 = 0.5**23 = 1.19e-7,
    # a term the vectorised filter drops (thr = 1e-7); the default loop keeps it
    case = Case.build(trainable=[[1] * 24], score=[1], gamma=1, lam=0.5, dtype="float64")
    adv, _ = module.run(case)
    assert adv[0, 0].item() == 0.5**23
    vec_case = case.replace(options={"vectorized": True})
    adv, _ = module.run(vec_case)
    assert adv[0, 0].item() == 0.0 and adv[0, 1].item() == 0.5**22
    v = verdicts(module, vec_case)
    assert v["reference"].failed and v["reference"].positions == [[0, 0]]


@pytest.mark.network
def test_aggregation_prompt_mean_option_on_the_token_mean_entry(entry):
    h = entry("agg-token-mean")
    case = AGG_STEP.replace(options={"aggregation": "prompt_mean"})
    loss, _ = h.run(case)
    # micro-batch 0: row mean 2; micro-batch 1: (2 + 0 for the empty row) / 2 = 1; (2 + 1) / 2 accumulation steps
    assert loss[0, 0].item() == pytest.approx(1.5)
    assert h.run(AGG_STEP)[0][0, 0].item() == pytest.approx(2.0)  # the default token mean, as above


@pytest.mark.network
@pytest.mark.parametrize("reduce", ["max", "mean"])
def test_trajectory_return_option_on_one_step_trajectories(entry, reduce):
    # one reward per trajectory: its sum, max and mean are the score; the group advantages stay -+1/sqrt 2
    (adv,) = entry("mc-advantage-sum").run(GROUPS.replace(options={"trajectory_return": reduce}))
    z = 2**-0.5
    assert adv.flatten().tolist() == pytest.approx([-z, -z, -z, -z, z, z, z, z], rel=1e-6)


_TOOL_ERRORS = ("CaseError", "TypeError", "KeyError", "AttributeError", "not an option")


@pytest.mark.network
def test_short_fuzz_of_the_module_covers_every_option_value_and_truncated_rows(module):
    res = fuzz_target(module.run, module.declared, target="torchrl", pin=PIN, max_examples=60, seed=0, shrink=False)
    for name, per in res.options_checked.items():
        assert all(n > 0 for n in per.values()), (name, per)
    assert set(res.options_checked) == {"average_gae", "vectorized"} and res.truncated_checked > 0
    for f in res.findings:
        assert not any(e in f.verdict.message for e in _TOOL_ERRORS), (f.property, f.verdict.message)
    bad = {p for p, n in res.failed.items() if n}
    assert "deterministic" not in bad, bad
    for f in res.findings:
        if f.property == "no-crash":  # the vec functional at gamma * lambda == 0 or below its threshold
            assert f.case.options.get("vectorized") is True and "IndexError" in f.verdict.message
        elif f.property in ("poison", "row-independence", "score-kept"):
            # average_gae standardises over every position, the masked ones included (design: no token mask)
            assert f.case.options.get("average_gae") is True, (f.property, f.case.options)


# ---------------------------------------------------------------------------------------------
# Critic loss (torchrl_kinds.load_value): ClipPPOLoss(clip_value=0.2, loss_critic_type="l2")(td)["loss_critic"]
# per micro-batch, the loss mask as ("collector", "mask"), / accumulation steps. l2 is F.mse_loss: (v - R)^2 with
# no 1/2 (objectives/utils.py:357-358 at 0.14.1); _reduce_loss: where(mask, l, 0).sum() / mask.sum().clamp_min(1)
# (objectives/common.py:368, 374), "sum": .sum() (:376).
# ---------------------------------------------------------------------------------------------
# row 0: t0 v - v_old = 0.1 inside 0.2: l = (1 - 0)^2 = 1, dl/dv = 2; t1 v = v_old: l = (0.5 - 1.5)^2 = 1, dl/dv = -2
# row 1: v_old = 2 clipped to 1.8: l = max(1^2, 1.8^2) = 3.24, dl/dv = 0 (the clamp saturated); row 2 empty;
# 99 under the mask. Token mean: (1 + 1 + 3.24) / 3 = 1.74667, grads 2/3, -2/3, 0.
VALUE_STEP = Case.build(
    trainable=[[1, 1, 0], [1, 0, 0], [0, 0, 0]],
    extra={
        "v": [[1.0, 0.5, 99.0], [1.0, 99.0, 99.0], [99.0] * 3],
        "v_old": [[0.9, 0.5, 99.0], [2.0, 99.0, 99.0], [99.0] * 3],
        "ret": [[0.0, 1.5, 99.0], [0.0, 99.0, 99.0], [99.0] * 3],
    },
    dtype="float32",
)
_NO_GRAD_TAIL = [0.0] * 7


def _value_by_hand(h):
    loss, grad = h.run(VALUE_STEP)
    assert loss[0, 0].item() == pytest.approx(5.24 / 3, rel=1e-6)
    assert grad.flatten().tolist() == pytest.approx([2 / 3, -2 / 3, *_NO_GRAD_TAIL], rel=1e-6)
    v = kind_verdicts(h, VALUE_STEP)
    for prop in ("reference", "clip-bound", "poison", "pad-invariance", "masked-zero", "empty-step"):
        assert v[prop].status == "pass", (prop, v[prop])
    # reduction="sum": 1 + 1 + 3.24, grads 2, -2 (the token-sum variant)
    loss, grad = h.run(VALUE_STEP.replace(options={"reduction": "sum"}))
    assert loss[0, 0].item() == pytest.approx(5.24, rel=1e-6)
    assert grad.flatten().tolist() == pytest.approx([2.0, -2.0, *_NO_GRAD_TAIL], rel=1e-6)
    # clip_value=None: row 1 unclipped, l = 1, dl/dv = 2: (1 + 1 + 1) / 3 = 1, grads 2/3 each
    unclipped = VALUE_STEP.replace(options={"clip_value": None})
    loss, grad = h.run(unclipped)
    assert loss[0, 0].item() == pytest.approx(1.0, rel=1e-6)
    assert grad.flatten().tolist() == pytest.approx([2 / 3, -2 / 3, 0.0, 2 / 3, 0.0, 0.0, 0.0, 0.0, 0.0], rel=1e-6)
    assert kind_verdicts(h, unclipped)["reference"].status == "pass"
    # micro-batches {row 0}, {rows 1, 2}: each its own token mean, / 2 accumulation steps: (2 / 2 + 3.24 / 1) / 2
    # = 2.12 against the step's 1.74667; row 0's grads 2 / 2 / 2 = 0.5, -0.5
    split = VALUE_STEP.replace(split=torch.tensor([0, 1, 1]))
    loss, grad = h.run(split)
    assert loss[0, 0].item() == pytest.approx(2.12, rel=1e-6)
    assert grad.flatten().tolist() == pytest.approx([0.5, -0.5, *_NO_GRAD_TAIL], rel=1e-6)
    v = kind_verdicts(h, split)  # the documented per-call mean: scope "micro-batch", the reference is 2.12 too
    assert v["split-invariance"].status == "n/a" and v["reference"].status == "pass" and v["poison"].status == "pass"


def _nan_target_under_the_mask(h):
    """A NaN value target at a masked step: the loss is finite (torch.where, common.py:368) but dl/dv there is
    0 * 2 (v - NaN) = NaN (mse backward), which a real critic network carries into every parameter gradient."""
    extra = {**VALUE_STEP.extra, "ret": VALUE_STEP.extra["ret"].clone()}
    extra["ret"][0, 2] = math.nan
    case = VALUE_STEP.replace(extra=extra)
    loss, grad = h.run(case)
    assert loss[0, 0].item() == pytest.approx(5.24 / 3, rel=1e-6)
    assert math.isnan(grad[0, 2].item())
    assert grad.flatten().tolist()[:2] == pytest.approx([2 / 3, -2 / 3], rel=1e-6)
    v = kind_verdicts(h, case)
    assert v["masked-zero"].failed and v["poison-nonfinite"].status == "pass"


@pytest.mark.network
def test_value_loss_by_hand(entry):
    h = entry("value-loss")
    assert h.info["where"] == "torchrl/objectives/ppo.py::ClipPPOLoss.loss_critic"
    _value_by_hand(h)
    _nan_target_under_the_mask(h)


def test_value_loss_at_git_main():
    repos = parse_repos(None)
    if "torchrl" not in repos:
        pytest.skip("git pin: set MASKFUZZ_REPOS=torchrl=/path/to/pytorch-rl-clone-or-mirror to test torchrl at main")
    with open_target("torchrl:value-loss@ae9719f17b15", repos=repos) as h:
        assert h.info["where"] == "torchrl/objectives/ppo.py::ClipPPOLoss.loss_critic"
        _value_by_hand(h)
        _nan_target_under_the_mask(h)


@pytest.mark.network
def test_value_loss_is_absent_before_the_loss_mask():
    """0.12.0: PPO reduces every loss_* key with _reduce(value, reduction) over all elements (ppo.py:1307): no
    loss mask to express the case's mask with, so the entry is not present."""
    from maskfuzz.targets.runtime.session import Skip

    with pytest.raises(Skip, match="take no loss mask at this pin"):
        with open_target("torchrl:value-loss@0.12.0"):
            pass


def test_value_loss_is_declared_with_citations():
    spec = torchrl.SPEC.for_entry("value-loss")
    assert spec.kind == "value-loss" and spec.masked_zero is True
    assert spec.variant == {"clip": 0.2, "half": False, "mode": "token-mean", "scope": "micro-batch"}
    opts = {o.name: o for o in spec.options}
    assert set(opts) == {"clip_value", "reduction"}
    assert opts["clip_value"].effect == {None: {"variant": {"clip": float("inf")}}}
    assert opts["reduction"].effect == {"sum": {"variant": {"mode": "token-sum"}}}
    assert all("ppo.py:" in o.cite for o in spec.options)


@pytest.mark.network
def test_short_fuzz_of_the_value_loss(entry):
    h = entry("value-loss")
    res = fuzz_target(h.run, h.declared, target="torchrl", pin=PIN, max_examples=60, seed=0, shrink=False)
    for f in res.findings:
        assert not any(e in f.verdict.message for e in _TOOL_ERRORS), (f.property, f.verdict.message)
    bad = {p for p, n in res.failed.items() if n}
    # NaN gradient at a masked position (mse backward); the per-micro-batch mean is declared (scope micro-batch)
    assert bad == {"masked-zero"}, bad
    assert all(n > 0 for per in res.options_checked.values() for n in per.values()), res.options_checked
    assert res.checked["poison-nonfinite"] > 0 and res.checked["clip-bound"] > 0


# ---------------------------------------------------------------------------------------------
# Policy loss: GRPOLoss(trivial actor, entropy_bonus=False)(td)["loss_objective"] per micro-batch
# (torchrl_kinds.load_policy), / gradient_accumulation_steps. Defaults: clip_epsilon 0.2 (grpo.py:498 at 0.14.1),
# aggregation "token_mean" (:500) through _aggregate_loss_value (:784-816).
# ---------------------------------------------------------------------------------------------
_OLD = -1.0
# row 0, A = 1: r = 1 (-1, grad -1); r = 1.5 (the upper clip binds: -1.2, grad 0); r = 0.5 (does not bind for A > 0:
# -0.5, grad -0.5); NaN old log-prob and advantage under the mask. Row 1, A = -2: r = 1.5 (does not bind for A < 0:
# 3, grad 3); r = 0.5 (binds: 1.6, grad 0). Token mean over 5 tokens: 1.9 / 5 = 0.38.
POLICY_STEP = Case.build(
    trainable=[[1, 1, 1, 0], [1, 1, 0, 0]],
    extra={
        "old_logp": [[_OLD, _OLD, _OLD, math.nan], [_OLD, _OLD, _OLD, _OLD]],
        "logp": [
            [_OLD, _OLD + math.log(1.5), _OLD + math.log(0.5), 5.0],
            [_OLD + math.log(1.5), _OLD + math.log(0.5), _OLD, _OLD],
        ],
        "adv": [[1.0, 1.0, 1.0, math.nan], [-2.0, -2.0, -2.0, -2.0]],
    },
    dtype="float64",
)


def _policy_by_hand(h):
    loss, grad = h.run(POLICY_STEP)
    # rel 1e-7, not float64's: the clip bounds are float32 buffers (clip_epsilon_low / _high, grpo.py:536-537, and
    # log1p of them, :551-556), so the binding clip 1.2 is float32's 1.2000000477 in a float64 run (-1.2e-9 here)
    assert loss[0, 0].item() == pytest.approx(0.38, rel=1e-7)
    assert grad.flatten().tolist() == pytest.approx([-0.2, 0.0, -0.1, 0.0, 0.6, 0.0, 0.0, 0.0], rel=1e-12, abs=1e-15)
    v = kind_verdicts(h, POLICY_STEP)  # NaN under the mask: torch.where (grpo.py:961-967, common.py:368) drops it
    assert v["poison-nonfinite"].status == "pass" and v["masked-zero"].status == "pass"
    finite = POLICY_STEP.extra["old_logp"].nan_to_num(-3.0), POLICY_STEP.extra["adv"].nan_to_num(7.0)
    finite = POLICY_STEP.replace(extra={**POLICY_STEP.extra, "old_logp": finite[0], "adv": finite[1]})
    assert h.run(finite)[0][0, 0].item() == pytest.approx(0.38, rel=1e-7)
    v = kind_verdicts(h, finite)
    for prop in ("reference", "poison", "pad-invariance", "masked-zero", "permutation", "deterministic"):
        assert v[prop].status == "pass", (prop, v[prop])
    # one row per micro-batch: each its own token mean, / 2 accumulation steps: (-2.7 / 3 + 4.6 / 2) / 2 = 0.7, not
    # the step's 0.38. By design (issue 24): GRPOLoss's "global masked token mean" (grpo.py:401) is the call's, and
    # the trainer sums each call's loss_* keys "and normalise by accumulation steps" (trainers.py:472-479), no global
    # normaliser passed: scope "micro-batch", the reference is the per-call mean and split-invariance does not apply
    split = finite.replace(split=torch.tensor([0, 1]))
    loss, grad = h.run(split)
    assert loss[0, 0].item() == pytest.approx(0.7, rel=1e-7)
    assert grad.flatten().tolist() == pytest.approx([-1 / 6, 0.0, -1 / 12, 0.0, 0.75, 0.0, 0.0, 0.0], rel=1e-12)
    v = kind_verdicts(h, split)
    assert v["split-invariance"].status == "n/a" and v["reference"].status == "pass", v


@pytest.mark.network
def test_policy_loss_by_hand(entry):
    h = entry("policy-loss")
    assert h.info["where"] == "torchrl/objectives/llm/grpo.py::GRPOLoss.forward"
    _policy_by_hand(h)


def test_policy_loss_at_git_main():
    repos = parse_repos(None)
    if "torchrl" not in repos:
        pytest.skip("git pin: set MASKFUZZ_REPOS=torchrl=/path/to/pytorch-rl-clone-or-mirror to test torchrl at main")
    with open_target("torchrl:policy-loss@ae9719f17b15", repos=repos) as h:
        _policy_by_hand(h)


def test_policy_loss_is_declared_with_citations():
    spec = torchrl.SPEC.for_entry("policy-loss")
    assert spec.kind == "policy-loss" and spec.masked_zero is True and spec.options == ()
    assert spec.variant == {
        "clip_low": 0.2,
        "clip_high": 0.2,
        "dual_clip": None,
        "advantages": "token",
        "mode": "token-mean",
        "scope": "micro-batch",
    }
    assert torchrl.SPEC.adapter_for("policy-loss").endswith("torchrl.calls_kinds")


@pytest.mark.network
def test_short_fuzz_of_the_policy_loss(entry):
    """15 examples at 0.14.1: the clipped objective is right; the per-micro-batch token mean is the declared scope
    (issue 24), so nothing fails."""
    h = entry("policy-loss")
    res = fuzz_target(h.run, h.declared, target="torchrl", pin=PIN, max_examples=15, seed=0, shrink=False)
    bad = {p for p, n in res.failed.items() if n}
    assert not bad, bad
    assert res.checked["reference"] > 0 and res.checked["poison-nonfinite"] > 0


def test_declared_production_and_promises_issue_24():
    """What torchrl's code is cited as producing in the adapter's mapping (the collector's multi-episode rows, the
    value network's outputs at every step, StepCounter's cut rows; NaN next values up to 0.12.0 only), the GAE
    module's narrower domain (average_gae standardises every step by design), and GRPOLoss's own words for its
    aggregations at each pin, which decide a reference failure; prompt_mean counts every sample, as they say."""
    from maskfuzz.oracles.promises import broken

    spec = torchrl.SPEC
    old, new = spec.pipeline_at("0.12.0"), spec.pipeline_at(PIN)
    for dom in (old, new, spec.pipeline_at("ae9719f17b15")):
        assert {"masked_values", "masked_rewards", "masked_real_tail", "truncated_rows"} <= set(dom.produces)
        assert dom.cited() == []
    assert "nonfinite_poison" in old.produces and "AutoResetTransform" in old.produces["nonfinite_poison"]
    assert "nonfinite_poison" not in new.produces and not new.nonfinite_poison
    module = spec.for_entry("module").pipeline_at(PIN)
    assert "masked_values" not in module.produces and "masked_rewards" not in module.produces
    for pin, line in (("0.12.0", 110), (PIN, 401), ("ae9719f17b15", 395)):
        for entry, off, words in (("agg-token-mean", 0, "global masked token mean"), ("agg-prompt-mean", 1, "equal")):
            d = spec.declared(entry, pin)
            p = broken("reference", "variant-mismatch", d.promises, reach="api", kind=d.kind)
            assert p is not None and p.id == f"upstream:torchrl/objectives/llm/grpo.py:{line + off}", (entry, pin, p)
            assert words in p.text and d.variant["scope"] == "micro-batch" and not d.domain.uneven_splits
    assert spec.declared("agg-prompt-mean", PIN).variant["empty_rows"] == "counted"
    assert spec.declared("agg-token-mean", "0.10.1").promises == ()  # no `aggregation` before 0.12.0

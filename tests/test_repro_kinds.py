"""Standalone reproducers of the kinds beyond GAE (`fuzz/repro_kinds.py`, the template's checks).

The script's check of every property must give the judge's verdict: the kind zoo's mutants and
correct implementations run through the template's own check functions in this process, on drawn
cases, for every property the judge decides. Then real findings of verl (released wheel) are
written by `maskfuzz repro`, run in an interpreter without maskfuzz, and judged the same.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from maskfuzz.fuzz import repro, repro_assembly, repro_check, repro_render
from maskfuzz.fuzz.cli import main as cli
from maskfuzz.fuzz.corpus import save
from maskfuzz.fuzz.corpus_codec import Entry, Found
from maskfuzz.fuzz.engine import fuzz_target
from maskfuzz.fuzz.repro_kinds import build_kind_check
from maskfuzz.fuzz.templates import repro_script
from maskfuzz.oracles.case import Case
from maskfuzz.oracles.declared import Declared
from maskfuzz.oracles.kinds import KINDS
from maskfuzz.oracles.kinds.judge import judge
from maskfuzz.oracles.kinds.strategies import kind_cases
from maskfuzz.oracles.strategies import Sizes
from maskfuzz.oracles.verdict import Verdict
from tests import kind_zoo as zoo
from tests import test_repro
from tests.test_repro import run_clean

pytestmark = pytest.mark.xdist_group("repro-kinds")
clean_python = test_repro.clean_python  # the module-scoped fixture: a Python without maskfuzz

# one mutant and one correct implementation per kind (the zoo's), and the properties each must show
PICKS = [
    zoo.grpo_correct,
    zoo.grpo_counts_empty_rows,
    zoo.grpo_fixed_group_size,
    zoo.grpo_unmasked_reward_sum,
    zoo.whiten_one_pass,
    zoo.k3_mask_by_multiply,
    zoo.agg_correct,
    zoo.agg_per_microbatch_normaliser,
    zoo.agg_nan_on_empty_step,
    zoo.value_correct,
    zoo.value_min_not_max,
    zoo.policy_correct,
    zoo.policy_mask_by_multiply,
]


def script_verdict(fn, check: repro_check.Check, kind: str, documented=()) -> str:
    """The template's check for `check`, run in this process on `fn`: 'reproduced' or 'fixed'."""
    data = {
        "CASE": repro_render.case_dict(check.case),
        "TWIN": repro_render.case_dict(check.twin) if check.twin is not None else None,
        "CHECK": check.data,
        "OUTPUTS": KINDS[kind].outputs,
        "DOCUMENTED_ERRORS": tuple(documented),
    }
    saved = {name: getattr(repro_script, name) for name in data}
    try:
        for name, value in data.items():
            setattr(repro_script, name, value)
        return repro_script.judge(lambda case, device: fn(case), "cpu")["status"]
    finally:
        for name, value in saved.items():
            setattr(repro_script, name, value)


@pytest.mark.parametrize("fn", PICKS, ids=lambda f: f.__name__)
def test_the_script_check_gives_the_judge_verdict(fn):
    kind, variant, want = zoo.CATCHES[fn]
    declared = Declared(kind=kind, variant=variant, masked_zero=True)
    agreed: dict[str, set[str]] = {}

    @settings(max_examples=80, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(kind_cases(kind, sizes=Sizes(5, 8)), st.just(0))
    def check(case, _):
        for verdict in judge(fn, case, declared):
            if verdict.status not in ("pass", "fail") or (verdict.case is not None and verdict.property == "no-crash"):
                continue  # n/a, or a no-crash finding on a twin's own case (empty-step names its empty step)
            try:
                built = build_kind_check(case, verdict.property, declared)
            except repro.Unsupported as exc:
                # a finding always has a script check, except twin (two functions); a pass may be vacuous
                # (masked-zero on a case without a masked position), which a script does not check
                assert verdict.status == "pass" or verdict.property == "twin", (verdict.property, str(exc))
                continue
            got = script_verdict(fn, built, kind)
            assert got == {"fail": "reproduced", "pass": "fixed"}[verdict.status], (
                verdict.property, verdict.message, case,
            )  # fmt: skip
            agreed.setdefault(verdict.property, set()).add(verdict.status)

    check()
    assert len(agreed) >= 5, agreed


MUTANTS = [fn for fn in PICKS if zoo.CATCHES[fn][2]]


@pytest.mark.parametrize("fn", MUTANTS, ids=lambda f: f.__name__)
def test_every_shrunk_finding_of_a_mutant_reproduces_in_the_script(fn):
    """The findings the fuzzer saves (shrunk, the property that failed first) each get a script check
    that reproduces them; the mutant's own property is among them."""
    kind, variant, want = zoo.CATCHES[fn]
    declared = Declared(kind=kind, variant=variant, masked_zero=True)
    result = fuzz_target(fn, declared, target=fn.__name__, max_examples=200, sizes=Sizes(6, 16))
    reproduced = set()
    for finding in result.findings:
        check = build_kind_check(finding.case, finding.property, declared)
        assert script_verdict(fn, check, kind) == "reproduced", (finding.property, finding.verdict.message)
        reproduced.add(finding.property)
    assert set(want) <= reproduced, (want, reproduced)


def test_clip_bound_split_and_empty_step_checks_by_hand():
    """The three checks that exist only for the loss kinds, on hand cases: the clipped value loss
    below the unclipped one (at-least), a per-micro-batch normaliser (split), NaN on an empty step."""
    value = Case.build(
        trainable=[[1, 1]], extra={"v": [[1.0, 3.0]], "v_old": [[0.75, 0.0]], "ret": [[0.0, 0.0]]}, dtype="float64"
    )
    vd = Declared(kind="value-loss", variant={}, masked_zero=True)
    bound = build_kind_check(value, "clip-bound", vd)
    assert bound.data["kind"] == "at-least" and bound.twin.extra["v_old"].equal(value.extra["v"])
    assert script_verdict(zoo.value_min_not_max, bound, "value-loss") == "reproduced"
    assert script_verdict(zoo.value_correct, bound, "value-loss") == "fixed"

    split = Case.build(trainable=[[1, 1, 1], [1, 0, 0]], extra={"loss": [[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]]},
                       split=[0, 1], dtype="float64")  # fmt: skip
    ad = Declared(kind="loss-aggregation", variant={}, masked_zero=True)
    check = build_kind_check(split, "split-invariance", ad)
    assert check.twin.split is None and check.twin.ranks == 1
    assert script_verdict(zoo.agg_per_microbatch_normaliser, check, "loss-aggregation") == "reproduced"
    assert script_verdict(zoo.agg_correct, check, "loss-aggregation") == "fixed"

    empty = build_kind_check(split, "empty-step", ad)
    assert empty.data["kind"] == "zero" and not empty.case.trainable.any()
    assert script_verdict(zoo.agg_nan_on_empty_step, empty, "loss-aggregation") == "reproduced"

    def raises_on_empty(case):
        if not case.trainable.any():
            raise ZeroDivisionError("no trainable token in the step")
        return zoo.agg_correct(case)

    assert script_verdict(raises_on_empty, empty, "loss-aggregation") == "reproduced"
    assert script_verdict(raises_on_empty, empty, "loss-aggregation", [r"ZeroDivisionError: no trainable"]) == "fixed"
    with pytest.raises(repro.Unsupported, match="twin property compares two functions"):
        build_kind_check(split, "twin", ad)
    with pytest.raises(repro.Unsupported, match="not a property of the loss-aggregation kind"):
        build_kind_check(split, "clip-bound", ad)


def test_the_script_case_carries_the_kind_fields():
    case = Case.build(
        trainable=[[1, 0], [1, 1]], extra={"loss": [[1.5, float("nan")], [2.0, -1.0]]}, group=[3, 3], split=[1, 0],
        ranks=2, dtype="bfloat16",
    )  # fmt: skip
    back = repro_script.Case.from_dict(repro_render.case_dict(case))
    assert back.group.tolist() == [3, 3] and back.split.tolist() == [1, 0] and back.ranks == 2
    assert back.extra["loss"][0, 0] == 1.5 and torch.isnan(back.extra["loss"][0, 1])
    two = back.rows([1])
    assert two.extra["loss"].tolist() == [[2.0, -1.0]] and two.split.tolist() == [0] and two.ranks == 1
    assert back.replace(ranks=1).ranks == 1 and back.ranks == 2


# ---------------------------------------------------------------------------------------------
# Real findings from verl's released wheel, end to end.
# ---------------------------------------------------------------------------------------------
PIN = "0.9.1"
GROUP = Case.build(trainable=[[1, 1], [1, 1]], score=[0.0, 1.0], group=[0, 0], dtype="float32")
MASKED_REWARD = Case.build(
    trainable=[[1, 0], [1, 1]], token_rewards=[[0.0, 5.0], [0.0, 0.0]], score=[0.0, 1.0], group=[0, 0],
    dtype="float32",
)  # fmt: skip
LOSSES = Case.build(
    trainable=[[1, 1, 0], [1, 0, 0]], extra={"loss": [[1.0, 2.0, float("nan")], [4.0, 0.0, 0.0]]}, dtype="float32"
)
FINDINGS = [
    # (target, entry, property, case, status at 0.9.1, what the report says)
    # an all-masked row is a sample, and verl's GRPO counting it in its group is a variant: padding is a column
    ("grpo", "pad-invariance", GROUP, "fixed", "padding (a column, a padding row) changes the outputs"),
    ("grpo", "poison", MASKED_REWARD, "reproduced", "values at masked positions change the outputs"),
    ("agg-seq-mean-token-sum", "poison-nonfinite", LOSSES, "reproduced", "NaN / inf at masked positions reach"),
    ("agg-token-mean", "poison-nonfinite", LOSSES, "fixed", "NaN / inf at masked positions reach"),
]


@pytest.mark.network
@pytest.mark.parametrize("entry,prop,case,status,title", FINDINGS, ids=[f"{f[0]}-{f[1]}" for f in FINDINGS])
def test_verl_kind_findings_reproduce_from_the_wheel(
    tmp_path,
    capsys,
    clean_python,
    entry,
    prop,
    case,
    status,
    title,
):
    from maskfuzz.targets import registry
    from maskfuzz.targets.runtime.acquire import acquire
    from maskfuzz.targets.runtime.repos import parse_repos

    label = f"verl:{entry}@{PIN}"
    found = Entry("verl", PIN, prop, case, Verdict(prop, "fail", "hand-made"), entry_point=entry, found=Found.now(0))
    path = save(found, tmp_path / "corpus")
    code = cli(["repro", str(path), "--target", label, "-o", str(tmp_path / "out")])
    captured = capsys.readouterr()
    if code == 2 and "no network" in captured.err:
        pytest.skip(f"{label} unavailable: {captured.err.strip()[-300:]}")
    assert code == (0 if status == "reproduced" else 1), captured.err
    verdict = {"reproduced": "fail", "fixed": "pass"}[status]
    assert f"judge agrees ({verdict})" in captured.out
    report = (tmp_path / "out" / "report.md").read_text()
    assert report.startswith(f"# {label}: `") and title in report.splitlines()[0]
    root = acquire(registry.get("verl"), PIN, parse_repos(None)).root
    code, data = run_clean(clean_python, tmp_path / "out" / "repro.py", root, tmp_path)
    assert data["status"] == status and code == {"reproduced": 1, "fixed": 0}[status], data.get("message")
    assert data["version"] == f"verl=={PIN}" and data["function"].startswith("verl/")
    assert json.loads(Path(path).read_text())["property"] == prop


CORPUS_KIND_FINDINGS = [
    # (corpus file, target, what the report's root-cause line names)
    ("miles/reference-39af16296080970b.json", "miles:policy-loss@0.0.2", "variant-mismatch"),
    ("verl/split-invariance-7f5b7f98235d08e9.json", "verl:policy-loss@0.5.0", "split-normaliser"),
]


@pytest.mark.network
@pytest.mark.parametrize("path,label,mechanism", CORPUS_KIND_FINDINGS, ids=[f[1] for f in CORPUS_KIND_FINDINGS])
def test_corpus_policy_loss_findings_reproduce_standalone(
    tmp_path,
    capsys,
    clean_python,
    path,
    label,
    mechanism,
):
    """The committed policy-loss findings (a dual clip that an option never reaches, a per-micro-batch
    normaliser bisected to its fix) give a script that reproduces them without maskfuzz, and a report
    with the configured variant, the root cause and (verl) the bisection."""
    from maskfuzz.targets import registry
    from maskfuzz.targets.runtime.acquire import acquire
    from maskfuzz.targets.runtime.repos import parse_repos
    from maskfuzz.targets.runtime.session import parse_ref

    corpus = Path(__file__).resolve().parents[1] / "corpus"
    code = cli(["repro", str(corpus / path), "--target", label, "-o", str(tmp_path / "out")])
    captured = capsys.readouterr()
    if code == 2 and "no network" in captured.err:
        pytest.skip(f"{label} unavailable: {captured.err.strip()[-300:]}")
    assert code == 0 and "judge agrees (fail)" in captured.out, captured.err
    assert "no upstream test" in captured.err  # the GAE recipes never claim a policy-loss finding
    report = (tmp_path / "out" / "report.md").read_text()
    assert f"Root cause (maskfuzz's diagnosis): `{mechanism}`" in report
    if label.startswith("miles"):
        assert "options: eps_clip_c = 3.0" in report and "dual_clip=3.0" in report
    else:
        assert "## Bisection" in report and "`0.7.0`" in report
    ref = parse_ref(label)
    root = acquire(registry.get(ref.target), ref.pin, parse_repos(None)).root
    code, data = run_clean(clean_python, tmp_path / "out" / "repro.py", root, tmp_path)
    assert code == 1 and data["status"] == "reproduced", data.get("message")


GIT_KIND_FINDINGS = [
    # (target, pin, a module name the script must not keep, property, case): shrunk findings of
    # `maskfuzz fuzz <t>:grpo@<pin>`: slime's batch-wide fallback for groups of unequal size (slime/ray/rollout.py:
    # 621-623 at 624b824a8) mixes the groups; NeMo-RL's float32 group statistics at an offset of 1e4
    ("nemo-rl", "7ea279abfbeb", "nemo_rl", "reference",
     Case.build(trainable=[[1, 1], [1, 1]], score=[10000.0, 10001.0], group=[0, 0], dtype="float32")),
    ("slime", "624b824a8", "mk", "group-isolation",
     Case.build(trainable=[[1, 1]] * 4, score=[0.0, 1.0, 1.0, 0.0], group=[0, 0, 0, 1], dtype="float32")),
]  # fmt: skip


@pytest.mark.needs_mirror
@pytest.mark.parametrize("target,pin,alias,prop,case", GIT_KIND_FINDINGS, ids=[f[0] for f in GIT_KIND_FINDINGS])
def test_git_only_kind_finding_reproduces_standalone(tmp_path, capsys, clean_python, target, pin, alias, prop, case):
    """NeMo-RL's kind calls import names from its GAE calls (`targets/nemo_rl/calls.py`) and slime's kind adapter
    reads another adapter as a module object (miles' `calls_kinds as mk`): the script copies those members, no module
    prefix is left and nothing of maskfuzz is imported."""
    from maskfuzz.targets import registry
    from maskfuzz.targets.runtime.acquire import acquire
    from maskfuzz.targets.runtime.repos import parse_repos

    if target not in parse_repos(None):
        pytest.skip(f"{target} is git only: needs MASKFUZZ_REPOS={target}=/path/to/a/clone")
    found = Entry(target, pin, prop, case, Verdict(prop, "fail", "hand-made"), entry_point="grpo", found=Found.now(0))
    path = save(found, tmp_path / "corpus")
    code = cli(["repro", str(path), "-o", str(tmp_path / "out")])
    captured = capsys.readouterr()
    assert code == 0 and "judge agrees (fail)" in captured.out, captured.err
    tree = ast.parse((tmp_path / "out" / "repro.py").read_text())
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id == alias]  # the prefix is cut
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and "maskfuzz" in (n.module or "")]
    root = acquire(registry.get(target), pin, parse_repos(None)).root
    code, data = run_clean(clean_python, tmp_path / "out" / "repro.py", root, tmp_path)
    assert data["status"] == "reproduced" and code == 1, data.get("message")
    assert data["commit"].startswith(pin)


def test_every_check_kind_renders_a_script_judge():
    """Each check kind the builders make has its `check_<kind>` in the template; an empty-step (`zero`) and a
    clip-bound (`at-least`) finding get a script (a KeyError in `maskfuzz repro` before)."""
    from maskfuzz.targets import registry

    template = repro_assembly.TEMPLATE.read_text(encoding="utf-8")
    for kind, fn in repro_assembly.CHECK_FUNCTIONS.items():
        assert f"\ndef {fn}(run: Callable, case: Case, device: str) -> dict:" in template, kind
        assert f"    return {fn}(run, Case.from_dict(CASE), device)" in repro_assembly.judge_source(kind)
    steps = Case.build(trainable=[[1, 1], [1, 0]], extra={"v": [[1.0, 3.0], [2.0, 0.0]], "v_old": [[0.75, 0.0],
                       [2.0, 0.0]], "ret": [[0.0, 0.0], [1.0, 0.0]]}, dtype="float32")  # fmt: skip
    for prop, fn in (("empty-step", "check_zero"), ("clip-bound", "check_at_least")):
        found = Entry("verl", "0.9.1", prop, steps, Verdict(prop, "fail", "hand-made"), entry_point="value-loss",
                      found=Found.now(0))  # fmt: skip
        plan = repro.make_plan(found, repro.TargetInfo.from_spec(registry.get("verl"), "value-loss", "0.9.1"))
        assert f"    return {fn}(run, Case.from_dict(CASE), device)" in repro.render_script(plan, "verl==0.9.1")

"""Replay logic, the ledger's strict expected-failure semantics, and `maskfuzz replay` exit codes,
with fake targets (an injected opener) so no upstream code is needed."""

from __future__ import annotations

import contextlib
import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from maskfuzz.fuzz import replay as rp
from maskfuzz.fuzz.cli import main as cli_main
from maskfuzz.fuzz.corpus import load, save
from maskfuzz.fuzz.corpus_codec import CorpusError, Entry, Found
from maskfuzz.fuzz.ledger import Expectation, Ledger
from maskfuzz.oracles.case import Case
from maskfuzz.oracles.declared import Declared
from maskfuzz.oracles.domain import Domain
from maskfuzz.oracles.kinds.dispatch import judge
from maskfuzz.oracles.kinds.gae.reference import reference
from maskfuzz.targets.runtime import acquire as acquire_mod
from maskfuzz.targets.runtime import session

pytest_plugins = ["pytester"]


# -- fake targets ---------------------------------------------------------------------------------
def correct(case: Case):
    return reference(case, "compressed")


def leaky(case: Case):
    """The seed bug: values are masked for storage only; raw values bootstrap the recursion."""
    x = case.inputs()
    m, v = x["trainable"], x["values"]
    b, t = m.shape
    r = x["token_rewards"] * m
    last = (torch.arange(t, dtype=m.dtype) * m).argmax(1)
    r[torch.arange(b), last] += x["score"] * (m.sum(1) > 0)
    adv, a = torch.zeros_like(r), torch.zeros(b, dtype=r.dtype)
    for i in reversed(range(t)):
        nxt = v[:, i + 1] if i + 1 < t else torch.zeros(b, dtype=r.dtype)
        a = r[:, i] + case.gamma * nxt - v[:, i] + case.gamma * case.lam * a
        adv[:, i] = a
    return adv * m, (adv + v) * m


def crashing(case: Case):
    raise RuntimeError("boom")


class FakeTargets:
    """An opener: (target, pin) -> a run, or an Unavailable to raise. Records opens and inputs."""

    def __init__(self, runs: dict):
        self.runs = runs
        self.opened: list[tuple] = []
        self.closed = 0
        self.dtypes: set[str] = set()

    def __call__(self, target, entry_point, pin, repos, device):
        return self._open(target, entry_point, pin, device)

    @contextlib.contextmanager
    def _open(self, target, entry_point, pin, device):
        self.opened.append((target, entry_point, pin, device))
        run = self.runs[(target, pin)]
        if isinstance(run, Exception):
            raise run

        def recorded(case: Case):
            self.dtypes.add(case.dtype)
            return run(case)

        try:
            yield SimpleNamespace(run=recorded, declared=Declared(own_inputs=True), resolved=f"{target}=={pin}")
        finally:
            self.closed += 1


# -- corpus helpers -------------------------------------------------------------------------------
CASE_A = Case.build(
    trainable=[[1, 1, 0]], attention=[[1, 1, 0]], token_rewards=[[0, 1, 0]], values=[[0, 0, 100]], lam=0.95
)
CASE_B = Case.build(
    trainable=[[1, 0, 1, 0]], token_rewards=[[0, 0, 1, 0]], values=[[0.5, 9, 0.25, 7]], gamma=0.9, lam=0.8
)
CASE_C = Case.build(trainable=[[1, 1, 0], [1, 0, 0]], values=[[0, 0, 5], [1, 3, 3]], score=[1, 0], lam=0.5)


def make_entry(case: Case, pin: str = "0.4.1", target: str = "verl", prop: str = "poison") -> Entry:
    verdict = next(v for v in judge(leaky, case, Declared()) if v.property == prop)
    assert verdict.failed, "the fake bug must trip the property the entry records"
    return Entry(
        target=target,
        pin=pin,
        resolved=f"{target}=={pin}",
        property=prop,
        case=case,
        verdict=verdict,
        found=Found(seed=0, date="2026-01-01T00:00:00Z"),
    )


def write_corpus(root: Path, entries: list[Entry], ledger: dict | None = None) -> list[Path]:
    paths = [save(e, root) for e in entries]
    Ledger({i: {k: Expectation(*v) for k, v in pins.items()} for i, pins in (ledger or {}).items()}).save(
        root / "ledger.json"
    )
    return paths


A, B, C = make_entry(CASE_A), make_entry(CASE_B), make_entry(CASE_C, pin="0.9.1")
LEDGER = {
    B.id: {"verl@0.4.1": ("fails", "known leak"), "verl@0.9.1": ("passes", "fixed upstream")},
    C.id: {"verl@0.9.1": ("fails", "believed still broken")},
}
RUNS = {("verl", "0.4.1"): leaky, ("verl", "0.9.1"): correct}


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    root = tmp_path / "corpus"
    write_corpus(root, [A, B, C], LEDGER)
    return root


def outcomes_by_name(outcomes) -> dict[str, str]:
    return {f"{o.job.entry.id}@{o.job.pin}": o.status for o in outcomes}


# -- semantics ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "state,expect,status",
    [
        ("fail", Expectation("fails", "r"), "xfail"),
        ("pass", Expectation("fails", "r"), "fixed"),
        ("fail", None, "fail"),
        ("fail", Expectation("passes", "r"), "fail"),
        ("pass", None, "pass"),
        ("n/a", Expectation("fails", "r"), "n/a"),
    ],
)
def test_classify_is_strict(state, expect, status):
    assert rp.classify(state, expect) == status


def test_replay_with_ledger_opens_each_pin_once(corpus: Path):
    entries = [load(p) for p in sorted(corpus.rglob("poison-*.json"))]
    jobs = rp.plan(entries, rp.ledger_for)
    fake = FakeTargets(RUNS)
    outcomes = rp.replay(jobs, opener=fake)
    assert outcomes_by_name(outcomes) == {
        f"{A.id}@0.4.1": "fail",  # the leak, not in the ledger: a failure
        f"{B.id}@0.4.1": "xfail",  # the leak, known
        f"{B.id}@0.9.1": "pass",  # the ledger's regression pin
        f"{C.id}@0.9.1": "fixed",  # expected to fail, passes: strict
    }
    assert sorted(p for _, _, p, _ in fake.opened) == ["0.4.1", "0.9.1"] and fake.closed == 2
    assert rp.exit_code(outcomes) == 1
    fixed = next(o for o in outcomes if o.status == "fixed")
    assert "believed still broken" in fixed.message and "ledger" in fixed.message
    assert all(o.resolved == f"verl=={o.job.pin}" for o in outcomes)


def test_all_as_expected_is_exit_0(corpus: Path):
    entries = [load(p) for p in sorted(corpus.rglob("poison-*.json")) if load(p).id == B.id]
    outcomes = rp.replay(rp.plan(entries, rp.ledger_for), opener=FakeTargets(RUNS))
    assert [o.status for o in outcomes] == ["xfail", "pass"] and rp.exit_code(outcomes) == 0


def test_unavailable_target_is_a_skip_with_its_reason():
    fake = FakeTargets({("verl", "0.4.1"): rp.Unavailable("cannot acquire: no mirror, set MASKFUZZ_REPOS")})
    outcomes = rp.replay(rp.plan([A, B]), opener=fake)
    assert [o.status for o in outcomes] == ["skip", "skip"]
    assert all("no mirror" in o.message for o in outcomes)
    assert len(fake.opened) == 1  # an unavailable target is tried once
    assert rp.exit_code(outcomes) == 0 and "SKIPPED" in rp.summary(outcomes)


def test_cuda_without_a_device_skips_loudly():
    fake = FakeTargets(RUNS)
    outcomes = rp.replay(rp.plan([A, C]), opener=fake, device="cuda", cuda_available=False)
    assert [(o.status, o.message) for o in outcomes] == [("skip", rp.NO_CUDA)] * 2
    assert fake.opened == [] and rp.exit_code(outcomes) == 0
    text = rp.summary(outcomes, device="cuda")
    assert "WARNING: --device cuda but no CUDA device" in text and "nothing was checked" in text


def test_a_crash_fails_the_entry_whatever_its_property():
    outcomes = rp.replay(rp.plan([A]), opener=FakeTargets({("verl", "0.4.1"): crashing}))
    assert outcomes[0].status == "fail" and "boom" in outcomes[0].message
    assert outcomes[0].verdict.property == "no-crash"
    known = rp.plan([A], Ledger({A.id: {"verl@0.4.1": Expectation("fails", "crashes now")}}))
    assert rp.replay(known, opener=FakeTargets({("verl", "0.4.1"): crashing}))[0].status == "xfail"


def test_dtype_override_reruns_in_that_dtype():
    fake = FakeTargets(RUNS)
    out = rp.replay(rp.plan([A]), opener=fake, dtype="float64")
    assert out[0].dtype == "float64" and fake.dtypes == {"float64"} and out[0].status == "fail"


def test_outside_the_domain_is_na():
    declared = Declared(domain=Domain(dtypes=("float64",)))
    judged = rp.judge_entry(correct, declared, A)
    assert judged.state == "n/a" and "dtype float32" in judged.message
    assert rp.judge_entry(correct, declared, A, dtype="float64").state == "pass"


def test_plan_pins_and_overrides():
    ledger = Ledger(LEDGER | {A.id: {"torchrl@0.9.1": Expectation("fails", "other target")}})
    jobs = rp.plan([A, B], ledger)
    assert [(j.entry.id, j.pin) for j in jobs] == [(A.id, "0.4.1"), (B.id, "0.4.1"), (B.id, "0.9.1")]
    other = make_entry(CASE_A, target="openrlhf", pin="0.11.2")
    jobs = rp.plan([A, other], ledger, overrides=[("verl", None, "0.9.1"), ("verl", None, "0.8.0")])
    assert [(j.entry.target, j.pin) for j in jobs] == [("verl", "0.9.1"), ("verl", "0.8.0"), ("openrlhf", "0.11.2")]
    assert rp.plan([A], ledger, overrides=[("verl", "vec", "0.9.1")])[0].pin == "0.4.1"  # another entry point


def test_ledger_matching_and_errors(tmp_path: Path):
    full = "c09bc8bc9f43" + "a" * 28
    led = Ledger(
        {A.id: {"roll@c09bc8bc9f43": Expectation("fails", "r"), "torchrl:vec@0.8.0": Expectation("fails", "v")}}
    )
    assert led.expectation(A.id, "roll", "main", resolved=full) is not None  # a hash prefix of the resolved commit
    assert led.expectation(A.id, "roll", full) is not None
    assert led.expectation(A.id, "roll", "c09bc8b") is not None
    assert led.expectation(A.id, "roll", "deadbeef") is None
    assert (
        led.expectation(A.id, "torchrl", "0.8.0") is None and led.expectation(A.id, "torchrl:vec", "0.8.0") is not None
    )

    def ledger(pins) -> str:
        return json.dumps({"format": "maskfuzz-ledger", "version": 1, "entries": {A.id: pins}})

    bad = {
        '{"format": "maskfuzz-ledger", "version": 2, "entries": {}}': ("version", "newer"),
        '{"format": "maskfuzz-ledger", "version": 1, "entries": {"xyz": {}}}': ("entries.xyz", "16 hex digits"),
        ledger({"verl@0.4.1": {"expect": "fails"}}): (f"entries.{A.id}.verl@0.4.1.reason", "reason"),
        ledger({"verl": {"expect": "fails", "reason": "r"}}): (f"entries.{A.id}.verl", "TARGET@PIN"),
        ledger({"verl@1": {"expect": "flaky", "reason": "r"}}): (f"entries.{A.id}.verl@1", "expect"),
        '{"format": "maskfuzz-ledger", "version": 1, "entries": [] ': (None, "not valid JSON"),
    }
    path = tmp_path / "ledger.json"
    for text, (field, needle) in bad.items():
        path.write_text(text)
        with pytest.raises(CorpusError) as info:
            Ledger.load(path)
        assert info.value.field == field and needle in str(info.value) and str(path) in str(info.value)
        assert path.read_text() == text


# -- the default opener translates the session's exceptions -----------------------------------------
def test_open_handle_turns_session_errors_into_skips(monkeypatch):

    def raising(exc):
        @contextlib.contextmanager
        def fake_open(ref, repos=None, device="cpu", **kw):
            assert str(ref) == "verl@0.4.1"
            raise exc
            yield  # pragma: no cover

        return fake_open

    monkeypatch.setattr(session, "open_target", raising(session.SetupError("no wheel in the cache and no network")))
    out = rp.replay(rp.plan([A]))
    assert out[0].status == "skip" and "cannot set up" in out[0].message and "no wheel" in out[0].message
    monkeypatch.setattr(session, "open_target", raising(session.Skip("function not present at this pin")))
    out = rp.replay(rp.plan([A]))
    assert out[0].status == "skip" and out[0].message.startswith("not present")
    unknown = make_entry(CASE_A, target="nosuchtarget")
    assert rp.replay(rp.plan([unknown]))[0].status == "skip"  # an unknown target is a RefError (a SetupError)


# -- the command line -----------------------------------------------------------------------------
@pytest.fixture
def fake_opener(monkeypatch):
    fake = FakeTargets(dict(RUNS))
    monkeypatch.setattr(rp, "open_handle", fake)
    return fake


def test_cli_exit_1_on_unexpected_failure_and_fixed(corpus: Path, fake_opener, capsys, tmp_path: Path):
    out_json = tmp_path / "out" / "replay.json"
    assert cli_main(["replay", str(corpus), "--json", str(out_json)]) == 1
    captured = capsys.readouterr()
    assert "FAIL" in captured.out and "FIXED" in captured.out and "[4/4]" in captured.err
    report = json.loads(out_json.read_text(), parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c}"))
    assert report["exit_code"] == 1 and report["counts"] == {
        "pass": 1,
        "xfail": 1,
        "fail": 1,
        "fixed": 1,
        "skip": 0,
        "n/a": 0,
        "error": 0,
    }


def test_cli_exit_0_when_all_as_expected(tmp_path: Path, fake_opener, capsys):
    root = tmp_path / "corpus"
    write_corpus(root, [A, B], {A.id: {"verl@0.4.1": ("fails", "known")}, B.id: {"verl@0.4.1": ("fails", "known")}})
    assert cli_main(["replay", str(root)]) == 0
    assert "2 xfail" in capsys.readouterr().out


def test_cli_target_override_replays_at_other_pins(tmp_path: Path, fake_opener, capsys):
    root = tmp_path / "corpus"
    write_corpus(root, [A])
    assert cli_main(["replay", str(root), "--target", "verl@0.9.1"]) == 0  # A passes on the fixed pin
    assert [p for _, _, p, _ in fake_opener.opened] == ["0.9.1"]


def test_cli_exit_2_on_unreadable_file_which_stays_untouched(corpus: Path, fake_opener, capsys):
    bad = corpus / "verl" / "poison-ffffffffffffffff.json"
    bad.write_text('{"format": "maskfuzz-corpus", "version": 1, "id": "ffff')
    before = bad.read_bytes()
    assert cli_main(["replay", str(corpus)]) == 2
    captured = capsys.readouterr()
    assert str(bad) in captured.err and "UNREADABLE" in captured.out
    assert "[4/4]" in captured.err  # the readable entries were still replayed
    assert bad.read_bytes() == before


def test_cli_exit_2_on_unreadable_ledger_or_usage(corpus: Path, fake_opener, capsys):
    (corpus / "ledger.json").write_text('{"format": "maskfuzz-ledger", "version": 9, "entries": {}}')
    assert cli_main(["replay", str(corpus)]) == 2
    assert "newer" in capsys.readouterr().err and fake_opener.opened == []
    assert cli_main(["replay", str(corpus), "--target", "nosuch@1"]) == 2
    assert cli_main(["replay", str(corpus), "--target", "verl"]) == 2
    assert cli_main(["replay", str(corpus / "missing.json")]) == 2
    assert cli_main(["replay", str(corpus), "--dtype", "int8"]) == 2


def test_cli_cuda_without_gpu_is_a_set_up_error(corpus: Path, fake_opener, capsys, monkeypatch):
    """Not a pass: nothing would be checked (issue: a living nightly, CUDA)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cli_main(["replay", str(corpus), "--device", "cuda"]) == 2
    err = capsys.readouterr().err
    assert "sees no CUDA device" in err and "--device cpu" in err and fake_opener.opened == []
    assert cli_main(["fuzz", "verl@0.5.0", "--device", "cuda", "--max-examples", "1"]) == 2
    assert cli_main(["repro", str(next(corpus.rglob("*.json"))), "--device", "cuda", "-o", str(corpus / "x")]) == 2


# -- the pytest collection of a corpus ---------------------------------------------------------------
def test_corpus_collection_module_on_a_fake_corpus(pytester: pytest.Pytester, corpus: Path, fake_opener, monkeypatch):
    git_entry = make_entry(CASE_A, target="roll", pin="c09bc8bc9f43")
    save(git_entry, corpus)
    monkeypatch.setenv("MASKFUZZ_CORPUS", str(corpus))
    monkeypatch.delenv("MASKFUZZ_REPOS", raising=False)
    shutil.copy(Path(__file__).with_name("test_corpus_entries.py"), pytester.path / "test_entries_copy.py")
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-rsxX")
    # 4 corpus checks + B@0.9.1 pass; A fails; C is XPASS(strict); B@0.4.1 xfails; the git pin skips
    result.assert_outcomes(passed=6, failed=2, xfailed=1, skipped=1)
    result.stdout.fnmatch_lines(["*XPASS(strict)*believed still broken*", "*git pin: set MASKFUZZ_REPOS=roll=*"])
    assert [p for _, _, p, _ in fake_opener.opened].count("0.4.1") == 1  # one worker per target@pin per session


def test_corpus_collection_reports_unreadable_files(pytester: pytest.Pytester, corpus: Path, fake_opener, monkeypatch):
    (corpus / "verl" / "poison-0123456789abcdef.json").write_text("[")
    (corpus / "ledger.json").write_text(
        json.dumps(
            {
                "format": "maskfuzz-ledger",
                "version": 1,
                "entries": {"0123456789abcdef": {"verl@1": {"expect": "fails", "reason": "r"}}},
            }
        )
    )
    monkeypatch.setenv("MASKFUZZ_CORPUS", str(corpus))
    shutil.copy(Path(__file__).with_name("test_corpus_entries.py"), pytester.path / "test_entries_copy.py")
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-k", "not test_replay")
    result.assert_outcomes(passed=3, failed=2)  # the unreadable file, and the ledger naming no entry
    result.stdout.fnmatch_lines(
        [
            "*unreadable corpus files:",
            "*poison-0123456789abcdef.json: not valid JSON*",
            "*names entries that are not in*",
        ]
    )


def test_at_another_dtype_the_ledger_does_not_apply():
    """`replay --dtype D` on an entry recorded in another dtype: plain pass / fail, never "fixed"
    or "xfail" against a ledger written for the recorded dtype."""
    ledger = Ledger({A.id: {"verl@0.4.1": Expectation("fails", "the leak")}})
    fixed = FakeTargets({("verl", "0.4.1"): correct})
    same = rp.replay(rp.plan([A], ledger), opener=fixed)
    assert same[0].status == "fixed"  # at the recorded dtype the ledger applies
    other = rp.replay(rp.plan([A], ledger), opener=fixed, dtype="float64")
    assert other[0].status == "pass" and "the ledger's expectation is for float32" in other[0].message
    leaky = rp.replay(rp.plan([A], ledger), opener=FakeTargets(RUNS), dtype="float64")
    assert leaky[0].status == "fail"


def test_cli_target_at_a_pin_that_cannot_be_set_up_exits_2(corpus: Path, monkeypatch, capsys):
    """`replay --target verl@0.9.9` (no such release) once exited 0 with every replay skipped; `fuzz` exits 2."""
    from maskfuzz.targets.runtime import session

    @contextlib.contextmanager
    def no_such_release(ref, repos=None, device="cpu", **kw):
        raise session.SetupError(f"{ref}: no wheel of verl==0.9.9 for this interpreter")
        yield  # pragma: no cover

    def offline(spec, pin, repos=None, cache=None, **kw):  # the index cannot be asked: not a bad pin
        raise acquire_mod.AcquireError(f"{spec.id}@{pin}: no network")

    monkeypatch.setattr(session, "open_target", no_such_release)
    monkeypatch.setattr(acquire_mod, "acquire", offline)
    assert cli_main(["replay", str(corpus), "--target", "verl@0.9.9"]) == 2
    err = capsys.readouterr().err
    assert "cannot set up" in err and "--target verl@0.9.9: no replay could set it up" in err


def test_cli_target_at_a_pin_that_names_nothing_is_refused_before_any_replay(corpus: Path, monkeypatch, capsys):
    """The index answers without 0.9.9: bad input, said once, exit 2, and no entry is replayed."""
    def missing(spec, pin, repos=None, cache=None, **kw):
        raise acquire_mod.PinMissing(f"{spec.id}@{pin}: no wheel of verl=={pin}; the index offers 0.9.0, 0.9.1")

    monkeypatch.setattr(acquire_mod, "acquire", missing)
    assert cli_main(["replay", str(corpus), "--target", "verl@0.9.9"]) == 2
    err = capsys.readouterr().err
    assert "--target names no such pin, nothing was replayed" in err and "the index offers 0.9.0, 0.9.1" in err
    assert "[1/" not in err  # refused before the first replay

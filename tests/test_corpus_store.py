"""The corpus store and `record`: de-duplication by failure signature, smaller replaces larger,
triaged entries stay, corrupt neighbours are never touched."""

from __future__ import annotations

import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest

from maskfuzz.fuzz.corpus import DirectoryStore, case_size, discover, entry_from_finding, load, record
from maskfuzz.fuzz.ledger import Expectation, Ledger
from maskfuzz.fuzz.signature import failure_kind, position_kind, signature
from maskfuzz.oracles.case import Case
from maskfuzz.oracles.verdict import Verdict


def poison_verdict(positions) -> Verdict:
    n = len(positions)
    return Verdict(
        "poison",
        "fail",
        "finite poison under the mask changed the output",
        "advantages",
        positions,
        [1.0] * n,
        [6.0] * n,
    )


def finding(case: Case, verdict: Verdict, target="verl", pin="0.4.1", prop=None, **kw):
    return SimpleNamespace(
        target=target,
        pin=pin,
        resolved=f"verl=={pin}",
        property=prop or verdict.property,
        case=case,
        verdict=verdict,
        also=kw.pop("also", ["reference"]),
        seed=kw.pop("seed", 1),
        **kw,
    )


# A masked padding slot with a poisoned value, as a small and as a larger case: same bug, same signature.
SMALL = Case.build(
    trainable=[[1, 1, 0]], attention=[[1, 1, 0]], token_rewards=[[0, 1, 0]], values=[[0, 0, 100]], lam=0.95
)
LARGE = Case.build(
    trainable=[[1, 1, 0, 0]], attention=[[1, 1, 0, 0]], token_rewards=[[0, 1, 0, 0]], values=[[0, 0, 100, 3]], lam=0.95
)
SAME_SIZE_MORE_NONZERO = Case.build(
    trainable=[[1, 1, 0]], attention=[[1, 1, 0]], token_rewards=[[2, 1, 0]], values=[[0, 0, 100]], lam=0.95
)
LEAK = poison_verdict([[0, 0], [0, 1]])


def files(root: Path) -> list[Path]:
    return discover([root])  # corpus files only, not the ledger


def test_position_kinds():
    # row 0: trainable, before-gap, masked-real (gap), last-trainable, masked-real (tail), padding
    case = Case.build(trainable=[[1, 1, 0, 1, 0, 0]], attention=[[1, 1, 1, 1, 1, 0]])
    kinds = [position_kind(case, 0, t) for t in range(6)]
    assert kinds == ["trainable", "before-gap", "masked-real", "last-trainable", "masked-real", "padding"]


@pytest.mark.parametrize(
    "message,kind",
    [
        ("exception: ValueError: shapes do not match", "ValueError"),
        ("raised IndexError: index 3 is out of bounds", "IndexError"),
        ("crash: worker exited with signal 11", "crash"),
        ("hang: no answer in 60 s", "hang"),
        ("perturbed rerun failed: raised ZeroDivisionError: x", "rerun-ZeroDivisionError"),
        ("non-finite output on finite inputs (1 position(s) of advantages)", "nonfinite"),
        ("differs from the compressed reference (2 position(s) of advantages)", ""),
    ],
)
def test_failure_kind(message, kind):
    assert failure_kind(message) == kind


def test_signature_is_structural():
    assert signature("poison", LEAK, SMALL) == "poison|advantages|last-trainable+trainable|f32"
    assert signature("poison", LEAK, SMALL) == signature("poison", LEAK, LARGE)  # size does not matter
    # half precision is one class; a crash carries its kind
    assert signature("poison", LEAK, SMALL.replace(dtype="bfloat16")) == signature(
        "poison", LEAK, SMALL.replace(dtype="float16")
    )
    assert signature("poison", LEAK, SMALL) != signature("poison", LEAK, SMALL.replace(dtype="float64"))
    crash = Verdict("no-crash", "fail", "crash: worker died")
    assert signature("no-crash", crash, SMALL) == "no-crash|-|-|f32|crash"
    assert signature("poison", poison_verdict([[0, 1]]), SMALL) != signature("poison", LEAK, SMALL)


def test_case_size_orders_by_cells_then_nonzeros():
    assert case_size(SMALL) < case_size(LARGE)
    assert case_size(SMALL) < case_size(SAME_SIZE_MORE_NONZERO)
    assert case_size(SMALL)[0] == case_size(SAME_SIZE_MORE_NONZERO)[0]


def test_record_new_then_duplicate_leaves_the_file_alone(tmp_path: Path):
    first = record(finding(SMALL, LEAK), tmp_path)
    assert first.action == "new" and first.path.exists()
    assert first.path == tmp_path / "verl" / f"poison-{first.entry.id}.json"
    before = first.path.read_bytes()
    for f in (finding(SMALL, LEAK, seed=99), finding(LARGE, LEAK), finding(SAME_SIZE_MORE_NONZERO, LEAK)):
        again = record(f, tmp_path)
        assert again.action == "duplicate" and again.path == first.path
    assert files(tmp_path) == [first.path] and first.path.read_bytes() == before


def test_smaller_case_replaces_larger(tmp_path: Path):
    big = record(finding(LARGE, LEAK), tmp_path)
    mid = record(finding(SAME_SIZE_MORE_NONZERO, LEAK), tmp_path)  # fewer B*T
    assert mid.action == "replaced" and mid.replaced == big.path and not big.path.exists()
    small = record(finding(SMALL, LEAK), tmp_path)  # same B*T, fewer non-zeros
    assert small.action == "replaced" and small.replaced == mid.path
    assert files(tmp_path) == [small.path]
    assert load(small.path).case.shape == (1, 3)


def test_different_property_target_entry_or_signature_are_kept_apart(tmp_path: Path):
    paths = {
        record(finding(SMALL, LEAK), tmp_path).path,
        record(finding(SMALL, LEAK, target="openrlhf"), tmp_path).path,
        record(finding(SMALL, LEAK, target="torchrl:vec"), tmp_path).path,
        record(
            finding(SMALL, Verdict("reference", "fail", "differs", "advantages", [[0, 0]], [1.0], [2.0])), tmp_path
        ).path,
        record(finding(LARGE, poison_verdict([[0, 1]])), tmp_path).path,  # other positions: other signature
    }
    assert len(paths) == 5 and len(files(tmp_path)) == 5
    assert load(tmp_path / "torchrl" / next(p.name for p in paths if "torchrl" in str(p))).entry_point == "vec"
    # one case, target and property is one file whatever the verdict says
    assert record(finding(SMALL, poison_verdict([[0, 1]])), tmp_path).action == "duplicate"


def test_triaged_entry_is_never_replaced(tmp_path: Path):
    big = record(finding(LARGE, LEAK), tmp_path)
    Ledger({big.entry.id: {"verl@0.4.1": Expectation("fails", "known")}}).save(tmp_path / "ledger.json")
    small = record(finding(SMALL, LEAK), tmp_path)
    assert small.action == "duplicate" and small.path == big.path and big.path.exists()
    assert files(tmp_path) == [big.path]


def test_unreadable_ledger_means_no_replacement(tmp_path: Path):
    big = record(finding(LARGE, LEAK), tmp_path)
    (tmp_path / "ledger.json").write_text("{")
    with pytest.warns(UserWarning, match="ledger is unreadable"):
        small = record(finding(SMALL, LEAK), tmp_path)
    assert small.action == "duplicate" and big.path.exists()


def test_corrupt_neighbour_is_skipped_and_untouched(tmp_path: Path):
    (tmp_path / "verl").mkdir()
    bad = tmp_path / "verl" / "poison-0000000000000000.json"
    bad.write_text('{"format": "maskfuzz-corpus", "version": 1, "id":')
    before = bad.read_bytes()
    with pytest.warns(UserWarning, match="skipping unreadable corpus file"):
        got = record(finding(SMALL, LEAK), tmp_path)
    assert got.action == "new" and bad.read_bytes() == before


def test_fetch_and_delete(tmp_path: Path):
    store = DirectoryStore(tmp_path)
    a = record(finding(SMALL, LEAK), store)
    record(finding(SMALL, LEAK, target="torchrl:vec"), store)
    assert [e.id for e in store.fetch("verl", "poison")] == [a.entry.id]
    assert [e.key for e in store.fetch("torchrl:vec", "poison")] == ["torchrl:vec"]
    assert list(store.fetch("torchrl", "poison")) == []  # the default entry point is another key
    store.delete(a.entry)
    assert list(store.fetch("verl", "poison")) == []


def test_entry_from_finding_shapes():
    pin = SimpleNamespace(rev="0.9.1")
    f = finding(SMALL, LEAK, target="torchrl:vec", also=["poison", "reference"])
    f.pin = pin
    e = entry_from_finding(f)
    assert (e.target, e.entry_point, e.pin, e.also) == ("torchrl", "vec", "0.9.1", ("reference",))
    assert e.found.seed == 1 and e.found.torch and e.found.date.endswith("Z")
    ref = SimpleNamespace(target="torchrl", entry="default", pin="0.9.1")
    assert entry_from_finding(finding(SMALL, LEAK, target=ref)).entry_point is None


def test_record_accepts_the_engines_finding(tmp_path: Path):
    engine = pytest.importorskip("maskfuzz.fuzz.engine", reason="fuzz/engine.py is not in this checkout")
    if not hasattr(engine, "Finding"):
        pytest.skip("maskfuzz.fuzz.engine has no Finding class")
    f = engine.Finding(
        target="verl",
        pin="0.4.1",
        resolved="verl==0.4.1",
        property="poison",
        case=SMALL,
        verdict=LEAK,
        also=["reference"],
        seed=3,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = record(f, tmp_path)
    assert got.action == "new" and load(got.path).found.seed == 3


def test_record_holds_a_lock_on_the_corpus(tmp_path: Path, monkeypatch):
    from maskfuzz.targets.runtime.cache import LockTimeout

    monkeypatch.setenv("MASKFUZZ_CACHE", str(tmp_path / "cache"))
    store = DirectoryStore(tmp_path / "corpus")
    other = DirectoryStore(tmp_path / "corpus" / ".." / "corpus")  # the same directory, spelled differently
    with store.lock(), pytest.raises(LockTimeout), other.lock(timeout=0.1):  # a second recorder waits
        pass


def test_an_entry_holding_a_path_of_the_machine_that_wrote_it_is_refused(tmp_path):
    import dataclasses

    from maskfuzz.fuzz.corpus import machine_path, save
    from maskfuzz.fuzz.corpus_codec import CorpusError, Entry, Found
    from maskfuzz.oracles.case import Case
    from maskfuzz.oracles.verdict import Verdict

    case = Case.build(trainable=[[1, 0]])
    e = Entry("verl", "0.5.0", "poison", case, Verdict("poison", "fail", "x"), found=Found.now(0))
    bad = dataclasses.replace(e, triage={"defect": "verl/x", "mechanism": "x", "severity": "low", "reach": "api",
                                         "bisection": {"case": "/tmp/pk/corpus/verl/x.json"}})  # fmt: skip
    with pytest.raises(CorpusError, match="path of the machine"):
        save(bad, tmp_path)
    assert machine_path({"a": ["ok", {"b": "C:\\\\x"}]}) == ("a.1.b", "C:\\\\x")
    assert machine_path({"case": "corpus/verl/x.json"}) is None
    save(e, tmp_path)

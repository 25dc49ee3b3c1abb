"""The bisection algorithm against fake histories and evaluators (no git, no workers)."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from maskfuzz.fuzz.bisect import (
    BAD,
    CAUSE,
    FIX,
    FOUND,
    GOOD,
    INCONCLUSIVE,
    NO_CHANGE,
    SKIP,
    BisectError,
    Outcome,
    Revision,
    bisect,
    evaluation_bound,
    repeated,
)


class FakeRepo:
    """r0 .. r{n}: r0 is `old`."""

    def __init__(self, n: int):
        self.revs = [Revision(f"r{i}", subject=f"revision {i}") for i in range(n + 1)]
        self.index = {r.id: i for i, r in enumerate(self.revs)}

    def describe(self, rev: str) -> Revision:
        return self.revs[self.index[rev]]

    def revisions(self, old: str, new: str, first_parent: bool = False) -> list[Revision]:
        return self.revs[self.index[old] + 1 : self.index[new] + 1]


class FakeEval:
    def __init__(self, verdicts: dict[str, str]):
        self.verdicts = verdicts
        self.calls: list[str] = []

    def __call__(self, rev: Revision) -> Outcome:
        self.calls.append(rev.id)
        return Outcome(self.verdicts[rev.id], seconds=0.01)


def history(n: int, first_new: int, old_verdict: str = GOOD, skips: set[int] = frozenset()) -> dict[str, str]:
    """r0..r{n}: old's verdict before `first_new`, the other one from it on; `skips` are skip."""
    new_verdict = BAD if old_verdict == GOOD else GOOD
    return {
        f"r{i}": SKIP if i in skips else (old_verdict if i < first_new else new_verdict) for i in range(n + 1)
    }


@pytest.mark.parametrize("old_verdict,kind", [(GOOD, CAUSE), (BAD, FIX)])
def test_every_answer_in_every_length_is_found_within_log2(old_verdict, kind):
    for n in range(1, 70):
        for k in range(1, n + 1):
            ev = FakeEval(history(n, k, old_verdict))
            res = bisect(FakeRepo(n), ev, "r0", f"r{n}")
            assert (res.result, res.kind, res.commit.id) == (FOUND, kind, f"r{k}"), (n, k)
            assert res.evaluations == len(ev.calls) <= math.ceil(math.log2(n)) + 2, (n, k)
            assert res.evaluations <= res.bound()
            assert ev.calls[:2] == ["r0", f"r{n}"]
            assert len(set(ev.calls)) == len(ev.calls), "a revision was evaluated twice"


def test_random_skips_never_guess_and_keep_the_bound():
    rng = random.Random(7)
    found = inconclusive = 0
    for _ in range(3000):
        n = rng.randint(2, 80)
        k = rng.randint(1, n)
        density = rng.choice([0.1, 0.3, 0.7])
        skips = {i for i in range(1, n) if rng.random() < density}  # old and new are judged
        ev = FakeEval(history(n, k, rng.choice([GOOD, BAD]), skips))
        res = bisect(FakeRepo(n), ev, "r0", f"r{n}")
        assert res.evaluations <= evaluation_bound(n, res.skips), (n, k, sorted(skips))
        if res.result == FOUND:
            found += 1
            assert res.commit.id == f"r{k}"
        else:
            inconclusive += 1
            assert res.result == INCONCLUSIVE
            ids = [r.id for r in res.candidates]
            assert f"r{k}" in ids
            # every candidate but the last was tested and skipped; the last behaves like new
            assert all(ev.verdicts[i] == SKIP for i in ids[:-1]) and ev.verdicts[ids[-1]] != SKIP
            assert set(ids[:-1]) <= set(ev.calls)
            # the revision just before the range behaves like old (r0 is old)
            before = int(ids[0][1:]) - 1
            assert before == 0 or ev.verdicts[f"r{before}"] == ev.verdicts["r0"]
    assert found > 500 and inconclusive > 200


def test_skip_next_to_answer_is_inconclusive_with_the_range():
    # r1..r3 good, r4 r5 unimportable, r6 first bad: the answer is r4, r5 or r6
    ev = FakeEval(history(10, 4, GOOD, {4, 5}) | {"r6": BAD})
    res = bisect(FakeRepo(10), ev, "r0", "r10")
    assert res.result == INCONCLUSIVE and res.kind == CAUSE and res.commit is None
    assert [r.id for r in res.candidates] == ["r4", "r5", "r6"]
    assert res.skips == 2 and res.evaluations <= res.bound()


def test_skip_at_the_midpoint_probes_the_neighbours():
    ev = FakeEval(history(16, 3, GOOD, {8}))
    res = bisect(FakeRepo(16), ev, "r0", "r16")
    assert res.result == FOUND and res.commit.id == "r3"
    assert ev.calls[2] == "r8" and ev.calls[3] in ("r7", "r9")


def test_no_change_and_unjudgeable_ends():
    ev = FakeEval({f"r{i}": GOOD for i in range(6)})
    res = bisect(FakeRepo(5), ev, "r0", "r5")
    assert (res.result, res.kind, res.evaluations) == (NO_CHANGE, None, 2)

    ev = FakeEval(history(5, 2, GOOD, {0}))
    res = bisect(FakeRepo(5), ev, "r0", "r5")
    assert res.result == INCONCLUSIVE and "at old" in res.reason and res.evaluations == 2
    assert len(res.candidates) == 5

    ev = FakeEval(history(5, 2, GOOD) | {"r5": SKIP})
    res = bisect(FakeRepo(5), ev, "r0", "r5")
    assert res.result == INCONCLUSIVE and "at new" in res.reason


def test_single_revision_range_needs_no_probe():
    ev = FakeEval(history(1, 1, BAD))
    res = bisect(FakeRepo(1), ev, "r0", "r1")
    assert (res.result, res.kind, res.commit.id, res.evaluations) == (FOUND, FIX, "r1", 2)


def test_empty_range_is_an_error():
    with pytest.raises(BisectError):
        bisect(FakeRepo(3), FakeEval({}), "r2", "r2")


def test_evaluator_exception_is_a_skip():
    verdicts = history(8, 3, GOOD)

    def ev(rev: Revision) -> Outcome:
        if rev.id == "r4":
            raise ImportError("no module named framework")
        return Outcome(verdicts[rev.id])

    res = bisect(FakeRepo(8), ev, "r0", "r8")
    assert res.result == FOUND and res.commit.id == "r3"
    tested = {t.revision.id: t.outcome for t in res.tested}
    assert tested["r4"].verdict == SKIP and "ImportError" in tested["r4"].reason


class Flaky:
    """Deterministic pseudo-flakiness: revisions in `flaky` alternate good/bad per call."""

    def __init__(self, verdicts: dict[str, str], flaky: set[str]):
        self.verdicts, self.flaky, self.count = verdicts, flaky, itertools.count()

    def __call__(self, rev: Revision) -> Outcome:
        if rev.id in self.flaky:
            return Outcome(GOOD if next(self.count) % 2 else BAD)
        return Outcome(self.verdicts[rev.id])


def test_runs_turn_disagreement_into_a_flaky_skip():
    res = bisect(FakeRepo(12), Flaky(history(12, 9, GOOD), {"r6"}), "r0", "r12", runs=3)
    by_id = {t.revision.id: t.outcome for t in res.tested}
    assert by_id["r6"].verdict == SKIP and by_id["r6"].flaky and "flaky" in by_id["r6"].reason
    assert len(by_id["r6"].runs) == 3
    assert res.result == FOUND and res.commit.id == "r9"  # the flaky r6 is not next to the answer
    assert all(t.outcome.runs == [t.outcome.verdict] * 3 for t in res.tested if not t.outcome.flaky)

    # flaky right before the answer: inconclusive between the two, never a guess
    res = bisect(FakeRepo(12), Flaky(history(12, 7, GOOD), {"r6"}), "r0", "r12", runs=2)
    assert res.result == INCONCLUSIVE and [r.id for r in res.candidates] == ["r6", "r7"]

    # with one run the flaky revision is taken at face value (no flaky label)
    single = bisect(FakeRepo(12), Flaky(history(12, 9, GOOD), {"r6"}), "r0", "r12", runs=1)
    assert all(not t.outcome.flaky for t in single.tested)


def test_done_is_called_once_per_revision_after_its_last_run():
    events = []
    verdicts = history(9, 4, GOOD)

    class Ev:
        def __call__(self, rev):
            events.append(("run", rev.id))
            return Outcome(verdicts[rev.id])

        def done(self, rev):
            events.append(("done", rev.id))
            raise OSError("a failing clean-up changes nothing")

    res = bisect(FakeRepo(9), Ev(), "r0", "r9", runs=2)
    assert res.result == FOUND and res.commit.id == "r4"
    expected = []
    for t in res.tested:
        expected += [("run", t.revision.id)] * 2 + [("done", t.revision.id)]
    assert events == expected
    assert all(t.outcome.seconds > 0 and t.outcome.cpu >= 0 for t in res.tested)


def test_repeated_stops_at_the_first_skip_and_sums_time():
    calls = []

    def ev(rev):
        calls.append(rev.id)
        return Outcome(SKIP if len(calls) == 2 else GOOD, "missing", seconds=1.0)

    out = repeated(ev, 5)(Revision("x"))
    assert out.verdict == SKIP and out.runs == [GOOD, SKIP] and out.seconds == 2.0 and not out.flaky
    with pytest.raises(ValueError):
        repeated(ev, 0)


def test_json_form_names_the_answer_and_every_tested_revision():
    ev = FakeEval(history(20, 13, BAD))
    res = bisect(FakeRepo(20), ev, "r0", "r20")
    d = res.to_dict(unit="version")
    assert d["result"] == FOUND and d["kind"] == FIX and d["version"]["id"] == "r13"
    assert d["evaluations"] == len(d["tested"]) == len(ev.calls)
    assert [t["revision"]["id"] for t in d["tested"]] == ev.calls
    assert all({"verdict", "seconds"} <= set(t) for t in d["tested"])
    assert d["old"]["verdict"] == BAD and d["new"]["verdict"] == GOOD

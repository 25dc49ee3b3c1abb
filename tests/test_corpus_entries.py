"""The corpus as tests: every entry of corpus/ x every pin it applies to is one test.

An entry applies at its recorded pin and at every pin corpus/ledger.json names for it. The
ledger's "fails" expectations become `xfail(strict=True)`: a known bug that still fails is an
xfail, one that passes is XPASS(strict), a failure ("fixed": update the ledger). Release pins
need no git; a git pin is skipped unless MASKFUZZ_REPOS names a clone or mirror of its target.
One worker per (target, entry point, pin) is opened per test session and reused
(`fuzz.replay.HandleCache`); with `-n 2 --dist loadgroup` each target@pin stays on one worker.

Environment: MASKFUZZ_CORPUS (another corpus directory), MASKFUZZ_DEVICE (cpu | cuda),
MASKFUZZ_REPOS (git mirrors), MASKFUZZ_CACHE (where released wheels and clones are kept).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from maskfuzz.fuzz import replay as rp
from maskfuzz.fuzz.corpus import LEDGER_NAME, load_all
from maskfuzz.fuzz.corpus_codec import CorpusError
from maskfuzz.fuzz.ledger import Ledger
from maskfuzz.targets.runtime.repos import parse_repos

ROOT = Path(os.environ.get("MASKFUZZ_CORPUS") or Path(__file__).resolve().parents[1] / "corpus")
DEVICE = os.environ.get("MASKFUZZ_DEVICE", "cpu")

# Collection never raises: an unreadable file or ledger becomes a failing test below.
ENTRIES, ERRORS = load_all([ROOT]) if ROOT.is_dir() else ([], [])
try:
    LEDGER, LEDGER_ERROR = Ledger.load(ROOT / LEDGER_NAME), None
except CorpusError as exc:
    LEDGER, LEDGER_ERROR = Ledger(), exc
try:
    REPOS, REPOS_ERROR = parse_repos(None), None
except ValueError as exc:
    REPOS, REPOS_ERROR = {}, exc
JOBS = rp.plan(ENTRIES, LEDGER)


def _param(job: rp.Job):
    marks = [pytest.mark.xdist_group(f"{job.entry.key}-{job.pin}".replace("@", "_"))]  # xdist cuts names at "@"
    if job.expect and job.expect.fails:
        where = f"{job.entry.key}@{job.pin}"
        why = f"ledger: fails at {where}: {job.expect.reason} (if this passes it was fixed: update {LEDGER_NAME})"
        # only the expected failure is an xfail: an entry that fails as a fact (no promise broken) is a real failure
        marks.append(pytest.mark.xfail(strict=True, reason=why, raises=AssertionError))
    return pytest.param(job, id=f"{job.entry.key}@{job.pin}-{job.entry.property}-{job.entry.id}", marks=marks)


PARAMS = [_param(j) for j in JOBS] or [
    pytest.param(None, id="empty", marks=pytest.mark.skip(reason=f"{ROOT} has no entries yet: nothing to replay"))
]


def test_corpus_directory_and_ledger_parse():
    assert ROOT.is_dir(), f"the corpus directory {ROOT} does not exist"
    empty = '{"format": "maskfuzz-ledger", "version": 1, "entries": {}}'
    assert (ROOT / LEDGER_NAME).is_file(), f"{ROOT / LEDGER_NAME} is missing (an empty ledger is {empty})"
    assert LEDGER_ERROR is None, str(LEDGER_ERROR)
    assert REPOS_ERROR is None, f"MASKFUZZ_REPOS: {REPOS_ERROR}"


def test_every_corpus_file_is_readable():
    assert not ERRORS, "unreadable corpus files:\n" + "\n".join(map(str, ERRORS))


def test_entries_live_where_their_content_says():
    misplaced = [
        f"{e.path} should be {ROOT / e.relpath}" for e in ENTRIES if e.path.resolve() != (ROOT / e.relpath).resolve()
    ]
    assert not misplaced, "\n".join(misplaced)


def test_no_entry_holds_a_path_of_the_machine_that_wrote_it():
    from maskfuzz.fuzz.corpus import machine_path
    from maskfuzz.fuzz.corpus_codec import parse_json

    held = {str(e.path): machine_path(parse_json(e.path.read_bytes())) for e in ENTRIES}
    assert not {k: v for k, v in held.items() if v}, held


def test_ledger_names_only_existing_entries():
    dangling = sorted(set(LEDGER.entries) - {e.id for e in ENTRIES})
    assert not dangling, f"{LEDGER_NAME} names entries that are not in {ROOT}: {dangling}"


@pytest.fixture(scope="session")
def open_targets():
    cache = rp.HandleCache(repos=REPOS or None, device=DEVICE)
    yield cache
    cache.close()


@pytest.mark.parametrize("job", PARAMS)
def test_replay(job: rp.Job, open_targets: rp.HandleCache):
    e = job.entry
    if DEVICE == "cuda" and not torch.cuda.is_available():
        pytest.skip(rp.NO_CUDA)
    if rp.pin_kind(e.target, job.pin) == "git" and e.target not in REPOS:
        pytest.skip(
            f"{e.key}@{job.pin} is a git pin: set MASKFUZZ_REPOS={e.target}=/path/to/clone-or-mirror to replay it"
        )
    try:
        handle = open_targets.get(e.target, e.entry_point, job.pin)
    except rp.Unavailable as exc:
        pytest.skip(f"{e.key}@{job.pin}: {exc.reason}")
    judged = rp.judge_entry(handle.run, handle.declared, e, device=DEVICE)
    if judged.state == "n/a":
        pytest.skip(judged.message)
    if judged.state == "fail":  # the corpus holds defects: what fails must still break a promise here
        triaged = rp.retriage(handle, e, judged.verdict, None)
        if triaged and triaged.get("class") != "defect":
            raise NotADefect(
                f"{job.name} ({e.path}) fails as a {triaged.get('class')} fact, not a defect: "
                f"{triaged.get('why_not_a_defect')} ({triaged.get('mechanism')}: {triaged.get('evidence')}); "
                "retire it (docs/audit/retired.md) or declare the promise it breaks"
            )
    assert judged.state == "pass", f"{job.name} ({e.path}) fails: {judged.message}\n{_detail(judged)}"


class NotADefect(Exception):
    """A corpus entry whose failure breaks no promise at this pin: not what the corpus is for."""


def _detail(judged: rp.Judged) -> str:
    v = judged.verdict
    if v is None or not v.positions:
        return ""
    rows = [f"  {v.output}{p}: expected {x!r}, observed {y!r}" for p, x, y in zip(v.positions, v.expected, v.observed)]
    return "\n".join(rows[:8])

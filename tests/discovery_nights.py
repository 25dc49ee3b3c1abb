"""What the night-over-night discovery tests share: a git repository the test builds, committed one night at a
time, and a fuzz job of the command line (`fuzz.commands.fuzz.Job`) run on it."""

from __future__ import annotations

import textwrap
from datetime import datetime, timezone
from pathlib import Path

import git

from maskfuzz.fuzz.commands import fuzz as fuzz_cmd

WHO = git.Actor("maskfuzz test", "test@maskfuzz.invalid")


def commit(repo: git.Repo, files: dict[str, str], message: str, day: int) -> str:
    """Write `files` (path -> text, dedented) into the work tree, commit everything on 2026-01-`day`; the sha."""
    root = Path(repo.working_tree_dir)
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    repo.git.add(A=True)
    date = f"{int(datetime(2026, 1, day, tzinfo=timezone.utc).timestamp())} +0000"
    return repo.index.commit(message, author=WHO, committer=WHO, author_date=date, commit_date=date).hexsha


def job(label: str, repos: dict, examples: int = 5, timeout: float = 30.0) -> fuzz_cmd.Job:
    """The job `maskfuzz fuzz LABEL --max-examples N` runs, on the CPU, with the repositories in `repos`."""
    return fuzz_cmd.Job(
        label, False, "compressed", {k: str(v) for k, v in repos.items()}, examples, None, 0, True, False, True,
        "cpu", timeout, None, True,
    )  # fmt: skip


def run(job: fuzz_cmd.Job) -> dict:
    """run_job's result as its JSON dict (a typed JobResult: `to_json`)."""
    out = fuzz_cmd.run_job(job)
    return out if isinstance(out, dict) else out.to_json()

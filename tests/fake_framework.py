"""A tiny fake framework in a git history the tests build with gitpython: its masked GAE
(`fakefw.gae`, plain Python lists) is right ("good"), mask-blind ("bad"), a SyntaxError ("broken")
or right only on even calls ("flaky"); `fakefw.compute` is the canonical keyword signature of a
`--callable` (targets.adapters.callable). Shared by the bisection and nightly tests."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import git

# -- the fake framework, one source text per state of its history -------------------------------
_COMMON = '''
def compute(*, token_rewards, values, trainable, attention, score, gamma, lam):
    """Canonical keyword signature (targets.adapters.callable): [B, T] tensors -> (adv, ret)."""
    import torch

    adv = torch.tensor(gae(token_rewards.tolist(), values.tolist(), trainable.tolist(), score.tolist(), gamma, lam),
                       dtype=torch.float64)
    return adv, (adv + values.double()) * trainable.double()
'''
GOOD_SRC = '''
def gae(rewards, values, mask, score, gamma, lam):
    """GAE over the trainable positions of each row only (the compressed contract)."""
    out = []
    for r, v, m, s in zip(rewards, values, mask, score):
        idx = [t for t, x in enumerate(m) if x]
        adv = [0.0] * len(r)
        nxt_v = nxt_a = 0.0
        for k in reversed(range(len(idx))):
            t = idx[k]
            delta = r[t] + (s if k == len(idx) - 1 else 0.0) + gamma * nxt_v - v[t]
            nxt_a = delta + gamma * lam * nxt_a
            adv[t], nxt_v = nxt_a, v[t]
        out.append(adv)
    return out
''' + _COMMON
BUGGY_SRC = '''
def gae(rewards, values, mask, score, gamma, lam):
    """Mask-blind: every position is a transition, masked values leak into the recursion."""
    out = []
    for r, v, m, s in zip(rewards, values, mask, score):
        last = max([t for t, x in enumerate(m) if x], default=-1)
        adv = [0.0] * len(r)
        nxt_v = nxt_a = 0.0
        for t in reversed(range(len(r))):
            delta = r[t] + (s if t == last else 0.0) + gamma * nxt_v - v[t]
            nxt_a = delta + gamma * lam * nxt_a
            adv[t], nxt_v = nxt_a * m[t], v[t]
        out.append(adv)
    return out
''' + _COMMON
BROKEN_SRC = "def gae(rewards, values, mask, score, gamma, lam)\n    return None  # half-done refactor: a SyntaxError\n"
FLAKY_SRC = (
    """
import os


def gae(rewards, values, mask, score, gamma, lam):
    \"\"\"Right on even calls, off by one on odd calls (a call counter in the file $FAKEFW_COUNTER).\"\"\"
    path = os.environ["FAKEFW_COUNTER"]
    n = int(open(path).read()) + 1 if os.path.exists(path) else 1
    open(path, "w").write(str(n))
    return [[a + n % 2 for a in row] for row in _right(rewards, values, mask, score, gamma, lam)]
"""
    + GOOD_SRC.replace("def gae(", "def _right(").replace("def compute(", "def _unused(")
    + _COMMON
)
STATES = {"good": GOOD_SRC, "bad": BUGGY_SRC, "broken": BROKEN_SRC, "flaky": FLAKY_SRC}
WHO = git.Actor("maskfuzz test", "test@maskfuzz.invalid")


def build(path: Path, states: list[str]) -> tuple[git.Repo, list[str]]:
    """A repository whose commit i holds fakefw in states[i]; returns (repo, hashes)."""
    repo = git.Repo.init(path)
    shas = []
    for i, state in enumerate(states):
        commit(repo, state, f"commit {i}: fakefw is {state}", day=i + 1)
        shas.append(repo.head.commit.hexsha)
    return repo, shas


def commit(repo: git.Repo, state: str, message: str, day: int, parents=None) -> str:
    pkg = Path(repo.working_tree_dir) / "fakefw"
    pkg.mkdir(exist_ok=True)
    (pkg / "__init__.py").write_text(STATES[state])
    repo.index.add(["fakefw/__init__.py"])
    when = datetime(2024, 1, 1, tzinfo=timezone.utc) + timedelta(days=day - 1)
    date = f"{int(when.timestamp())} +0000"  # git's internal format: gitpython reads it exactly
    c = repo.index.commit(
        message, author=WHO, committer=WHO, author_date=date, commit_date=date, parent_commits=parents
    )
    return c.hexsha


def innocuous(repo: git.Repo, message: str, day: int) -> str:
    """A commit that leaves fakefw alone (a line appended to NOTES.md)."""
    notes = Path(repo.working_tree_dir) / "NOTES.md"
    notes.write_text((notes.read_text() if notes.exists() else "") + f"- {message}\n")
    repo.index.add(["NOTES.md"])
    when = datetime(2024, 1, 1, tzinfo=timezone.utc) + timedelta(days=day - 1)
    date = f"{int(when.timestamp())} +0000"
    return repo.index.commit(message, author=WHO, committer=WHO, author_date=date, commit_date=date).hexsha

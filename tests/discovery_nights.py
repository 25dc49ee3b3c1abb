"""What the night-over-night discovery tests share: a git repository the test builds, committed one night at a
time, a fuzz job of the command line (`fuzz.commands.fuzz.Job`) run on it, and the files of a fake verl tree
(`VERL_CORE`, `VERL_ACTOR`) that test_discovery and test_discovery_findings commit into it."""

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


# A fake verl tree: the policy-loss registry and two losses of the common signature, one of another signature.
VERL_CORE = '''
import torch

POLICY_LOSS_REGISTRY = {}


def register_policy_loss(name):
    def decorator(func):
        POLICY_LOSS_REGISTRY[name] = func
        return func

    return decorator


def get_policy_loss_fn(name):
    return POLICY_LOSS_REGISTRY[name]


def agg_loss(loss_mat, loss_mask, loss_agg_mode, dp_size=1, batch_num_tokens=None, global_batch_size=None,
             loss_scale_factor=None):
    """token-mean over the step's tokens (the global normaliser), times dp_size as verl does."""
    return torch.where(loss_mask, loss_mat, 0.0).sum() / max(int(batch_num_tokens), 1) * dp_size


def _live(mask, *xs):
    return [torch.where(mask, x, torch.zeros_like(x)) for x in xs]


@register_policy_loss("vanilla")
def compute_policy_loss_vanilla(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
                                config=None, rollout_is_weights=None):
    old, new, adv = _live(response_mask, old_log_prob, log_prob, advantages)
    return agg_loss(-adv * torch.exp(new - old), response_mask, loss_agg_mode, **config.global_batch_info), {}


@register_policy_loss("plain_pg")
def compute_policy_loss_plain_pg(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
                                 config=None, rollout_is_weights=None):
    new, adv = _live(response_mask, log_prob, advantages)
    return agg_loss(-adv * new, response_mask, loss_agg_mode, **config.global_batch_info), {}


@register_policy_loss("needs_values")
def compute_policy_loss_needs_values(old_log_prob, log_prob, advantages, response_mask, values):
    raise NotImplementedError
'''
VERL_ACTOR = """
from dataclasses import dataclass, field


@dataclass
class ActorConfig:
    clip_ratio: float = 0.2
    loss_agg_mode: str = "token-mean"
    loss_scale_factor: float | None = None
    global_batch_info: dict = field(default_factory=dict)
"""

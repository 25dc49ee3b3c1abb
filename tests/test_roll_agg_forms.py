"""ROLL's `agg_loss` followed through its signature changes (`targets/roll/calls_kinds.py::load_loss`, `AGG_FORMS`).

Before 3077befc ("publish roll v0.2.0") `agg_loss(loss_mat, loss_mask, loss_agg_mode)` took no global normalisers;
the entry calls that older form there (each micro-batch normalised by itself, / gradient_accumulation_steps, as the
strategies ran it) instead of skipping, so a bisection across the change has a baseline and concludes.

The git tests run on a repository built here: a tiny `roll/utils/functionals.py` whose `agg_loss` is first the old
signature (a right masked token mean per micro-batch), then the new one with the step's normalisers and a numerator
that forgets the mask (the defect arrives with the signature change), with commits that touch nothing between. It
is test input, not a target: the real ROLL adapter and worker run on it. The mirror test (MASKFUZZ_REPOS with
roll) opens the real ROLL at 35bea6a2 and at 8eb27cc2dc34.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import git
import pytest

from maskfuzz.oracles.case import Case
from maskfuzz.targets.adapters.base import NotPresent
from maskfuzz.targets.adapters.signature_forms import Form, choose, signature_text
from maskfuzz.targets.roll.calls_kinds import AGG_FORMS
from maskfuzz.targets.runtime.repos import parse_repos
from maskfuzz.targets.runtime.session import open_target

OLD_SRC = """import torch


def agg_loss(loss_mat, loss_mask, loss_agg_mode):
    if loss_agg_mode != "token-mean":
        raise ValueError(loss_agg_mode)
    return (loss_mat * loss_mask).sum() / loss_mask.sum().clamp(min=1)
"""
NEW_SRC = """import torch


def agg_loss(loss_mat, loss_mask, loss_agg_mode, batch_num_tokens=None, global_valid_samples=None, weights=None):
    if loss_agg_mode != "token-mean":
        raise ValueError(loss_agg_mode)
    if batch_num_tokens is None:
        batch_num_tokens = loss_mask.sum()
    return loss_mat.sum() / batch_num_tokens  # the mask forgotten: masked losses count
"""
WHO = git.Actor("maskfuzz test", "test@maskfuzz.invalid")

# row 0: 2 tokens (losses 1, 3), row 1: 1 token (loss 2); 100 under the mask; micro-batches {0}, {1}
STEP = Case.build(
    trainable=[[1, 1, 0], [1, 0, 0]],
    extra={"loss": [[1.0, 3.0, 100.0], [2.0, 100.0, 100.0]]},
    split=[0, 1],
)
CLEAN = STEP.replace(extra={"loss": [[1.0, 3.0, 0.0], [2.0, 0.0, 0.0]]})


def _commit(repo: git.Repo, files: dict[str, str], message: str, day: int) -> str:
    root = Path(repo.working_tree_dir)
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    repo.index.add(list(files))
    when = datetime(2025, 1, 1, tzinfo=timezone.utc) + timedelta(days=day)
    date = f"{int(when.timestamp())} +0000"
    return repo.index.commit(message, author=WHO, committer=WHO, author_date=date, commit_date=date).hexsha


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    """(path, [c0 .. c4]): c0 the old signature, c1 notes, c2 the new signature with the leak, c3 and c4 notes."""
    path = tmp_path_factory.mktemp("rollish") / "repo"
    repo = git.Repo.init(path)
    pkg = {"roll/__init__.py": "", "roll/utils/__init__.py": ""}
    shas = [
        _commit(repo, {**pkg, "roll/utils/functionals.py": OLD_SRC}, "init: agg_loss(loss_mat, loss_mask, mode)", 0),
        _commit(repo, {"NOTES.md": "- one\n"}, "notes one", 1),
        _commit(repo, {"roll/utils/functionals.py": NEW_SRC}, "agg_loss takes the step's normalisers", 2),
        _commit(repo, {"NOTES.md": "- one\n- two\n"}, "notes two", 3),
        _commit(repo, {"NOTES.md": "- one\n- two\n- three\n"}, "notes three", 4),
    ]
    return path, shas


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MASKFUZZ_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("MASKFUZZ_REPOS", raising=False)


def test_choose_takes_the_newest_form_the_signature_has():
    def old(loss_mat, loss_mask, loss_agg_mode):
        return None

    def new(loss_mat, loss_mask, loss_agg_mode, batch_num_tokens=None, global_valid_samples=None, weights=None):
        return None

    assert choose(new, AGG_FORMS).name == "global-normalisers"
    assert choose(old, AGG_FORMS).name == "micro-batch"
    assert AGG_FORMS[1].note(old).endswith("): old(loss_mat, loss_mask, loss_agg_mode)")
    assert signature_text(new).startswith("(loss_mat, loss_mask, loss_agg_mode, batch_num_tokens=None")
    with pytest.raises(NotPresent, match="none of the known signature forms"):
        choose(lambda x: x, AGG_FORMS, "f")
    # only the newest form listed: the old signature is no call at all (what every older commit was before)
    with pytest.raises(NotPresent, match="global-normalisers"):
        choose(old, (AGG_FORMS[0],), "agg_loss")
    assert choose(old, (Form("x", ("loss_mask",)),)).name == "x"


@pytest.mark.parametrize("at, form", [(0, "micro-batch"), (2, "global-normalisers")])
def test_the_entry_calls_the_form_of_each_commit(history, cache, at, form):
    path, shas = history
    with open_target(f"roll:agg-token-mean@{shas[at]}", repos={"roll": str(path)}) as h:
        notes = h.info["notes"]
        assert notes[0].startswith(f"signature form {form!r}"), notes
        loss, grad = h.run(CLEAN)
    if form == "micro-batch":
        # each micro-batch's own token mean (2 and 2) / gradient_accumulation_steps 2: row 0's tokens get 1/4 each,
        # row 1's single token 1/2; the whole step's mean would give every token 1/3
        assert loss[0, 0].item() == pytest.approx(2.0)
        assert grad.flatten().tolist() == pytest.approx([0.25, 0.25, 0.0, 0.5, 0.0, 0.0])
        assert any("no global normaliser" in n for n in notes)
    else:
        # the step's 3 tokens as batch_num_tokens, each micro-batch loss * dp_size: the global token mean
        assert loss[0, 0].item() == pytest.approx(2.0)
        assert grad.flatten().tolist() == pytest.approx([1 / 3] * 6)


def _bisect(tmp_path, capsys, path, old, new, prop, case=STEP) -> tuple[int, dict]:
    from maskfuzz.fuzz import corpus, corpus_codec
    from maskfuzz.fuzz.cli import main
    from maskfuzz.oracles.verdict import Verdict

    verdict = Verdict(prop, "fail", "test")
    entry = corpus_codec.Entry("roll", old[:12], prop, case, verdict, entry_point="agg-token-mean")
    case_file = corpus.save(entry, tmp_path / "corpus")
    out = tmp_path / f"bisect-{prop}.json"
    argv = ["bisect", str(case_file), "--target", "roll:agg-token-mean", "--repo", f"roll={path}"]
    code = main([*argv, "--old", old, "--new", new, "--json", str(out)])
    text = capsys.readouterr().out
    return code, json.loads(out.read_text()) | {"log": text}


def test_bisect_across_the_signature_change_concludes(history, cache, tmp_path, capsys):
    path, shas = history
    code, d = _bisect(tmp_path, capsys, path, shas[0], shas[4], "poison")
    assert code == 0, d["log"]
    assert (d["result"], d["kind"], d["commit"]["id"]) == ("found", "cause", shas[2]), d["log"]
    assert d["old"]["verdict"] == "good" and d["new"]["verdict"] == "bad" and d["skips"] == 0
    # the old end was judged through the older form, not skipped
    assert d["tested"][0]["revision"]["id"] == shas[0] and d["tested"][0]["verdict"] == "good"


def test_split_invariance_at_the_old_commit_reflects_the_per_micro_batch_step(history, cache, tmp_path, capsys):
    path, shas = history
    # the clean step: split-invariance fails where each micro-batch normalised by itself, holds with the normalisers
    code, d = _bisect(tmp_path, capsys, path, shas[0], shas[4], "split-invariance", case=CLEAN)
    assert code == 0, d["log"]
    assert (d["result"], d["kind"], d["commit"]["id"]) == ("found", "fix", shas[2]), d["log"]
    assert "split-invariance fails" in d["tested"][0]["reason"]


# ---------------------------------------------------------------------------------------------
# The real ROLL history (MASKFUZZ_REPOS=roll=/path/to/ROLL mirror).
# ---------------------------------------------------------------------------------------------
INIT, HEAD = "35bea6a2", "8eb27cc2dc34"
POISONED = Case.build(
    trainable=[[1, 1, 0], [1, 0, 0], [0, 0, 0]],
    extra={"loss": [[1.0, 3.0, 100.0], [2.0, 100.0, 100.0], [100.0, 100.0, 100.0]]},
    split=[0, 1, 1],
)


@pytest.fixture(scope="module")
def roll_repos():
    repos = parse_repos(None)
    if "roll" not in repos:
        pytest.skip("ROLL is git only: set MASKFUZZ_REPOS=roll=/path/to/ROLL-clone-or-mirror to load its old pins")
    return repos


@pytest.mark.needs_mirror
def test_real_agg_loss_at_the_init_and_head_pins(roll_repos):
    with open_target(f"roll:agg-token-mean@{INIT}", repos=roll_repos) as h:
        assert h.info["notes"][0] == (
            "signature form 'micro-batch' (since 35bea6a2 roll/utils/functionals.py:206; + weights bc391211 "
            ":206-207; + loss_scale cec5234a :211-212): agg_loss(loss_mat: torch.Tensor, loss_mask: torch.Tensor, "
            "loss_agg_mode: str)"
        )
        loss, grad = h.run(POISONED)
    # masked_mean per micro-batch ({0}: 2, {1, 2}: 2 over its one token), / gradient_accumulation_steps 2
    assert loss[0, 0].item() == pytest.approx(2.0)
    assert grad.flatten().tolist() == pytest.approx([0.25, 0.25, 0.0, 0.5, 0.0, 0.0, 0.0, 0.0, 0.0])
    with open_target(f"roll:agg-token-mean@{HEAD}", repos=roll_repos) as h:
        assert h.info["notes"][0].startswith("signature form 'global-normalisers' (since 3077befc")
        loss, _ = h.run(POISONED)
    assert loss[0, 0].item() == pytest.approx(606.0 / 3.0)  # every entry over the step's 3 tokens (the leak)


@pytest.mark.needs_mirror
def test_policy_loss_before_cec5234a_is_no_call_rather_than_a_crash(roll_repos):
    from maskfuzz.targets.runtime.session import SetupError

    # the entropy is computed from the model's logits whatever entropy_loss_coef (actor_worker.py:62-67 at 35bea6a2)
    with pytest.raises(Exception, match="reads self.strategy") as info:
        with open_target(f"roll:policy-loss@{INIT}", repos=roll_repos):
            pass
    assert not isinstance(info.value, SetupError), "a skip (NotPresent), not a set-up error"


@pytest.mark.needs_mirror
def test_the_discovered_reinforce_estimator_is_the_returns_of_the_token_rewards(roll_repos):
    """`ret:reinforce` (discover.py's call recipe) runs compute_advantage's own branch: compute_reinforce_return, the
    discounted returns of the token rewards with the score on the last token, advantages = returns, no critic."""
    case = Case.build(trainable=[[1, 1, 1]], token_rewards=[[1.0, 0.0, 2.0]], score=[4.0], gamma=0.5, lam=1.0)
    with open_target(f"roll:ret:reinforce@{HEAD}", repos=roll_repos) as h:
        assert h.info["where"].endswith("compute_advantage (adv_estimator='reinforce')"), h.info["where"]
        adv, ret = h.run(case)
    # 6 at the last token (2 + the score 4), 0 + 0.5 * 6 = 3, 1 + 0.5 * 3 = 2.5
    assert adv.flatten().tolist() == pytest.approx([2.5, 3.0, 6.0]) and ret.flatten().tolist() == adv.flatten().tolist()

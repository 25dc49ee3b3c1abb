"""Sessions: `TARGET[:ENTRY][@PIN]` references, and `open_target` end to end on a toy target whose
adapter and git history the tests write in tmp_path (present, absent, unimportable, unknown pin)."""

from __future__ import annotations

import os
import subprocess
import textwrap
from pathlib import Path

import pytest
import torch

from maskfuzz.oracles.case import Case
from maskfuzz.targets import registry as registry_mod
from maskfuzz.targets.registry import Pin, TargetSpec
from maskfuzz.targets.runtime.session import (
    RefError,
    SetupError,
    Skip,
    TargetRef,
    open_callable,
    open_target,
    parse_ref,
)

ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com",
       "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com"}

ADAPTER = textwrap.dedent('''
    """A toy adapter in the shape of targets/adapters/*.py."""
    from maskfuzz.targets.adapters.base import Loaded, function_from
    from maskfuzz.targets.registry import Pin, TargetSpec

    SPEC = TargetSpec(
        id="toy", adapter="toy_adapter", own=("toy",), contract="dense",
        pins=(Pin("v2", "has gae", kind="git"), Pin("v1", "before gae", kind="git")),
        entries=("default", "double"), stand_ins=("heavy_standin_pkg",),
    )

    def load(root, entry):
        fn, where = function_from(root, [("toy.gae", "gae")])
        k = 2.0 if entry == "double" else 1.0

        def run(case, device):
            x = case.inputs(device)
            adv, ret = fn(x["values"], x["trainable"])
            return adv * k, ret

        return Loaded(run, where, [f"entry={entry}"])
''')


def specs() -> dict[str, TargetSpec]:
    mk = lambda tid, **kw: TargetSpec(id=tid, adapter=f"a.{tid}", own=(tid,), contract="dense", **kw)  # noqa: E731
    return {
        "verl": mk("verl", pins=(Pin("0.4.1", "x"), Pin("0.9.1", "y", default=True))),
        "torchrl": mk("torchrl", entries=("default", "vec"), pins=(Pin("0.8.0", "x"),)),
        "nemo-rl": mk("nemo-rl"),
    }


def test_parse_ref():
    s = specs()
    assert parse_ref("torchrl:vec@0.8.0", s) == TargetRef("torchrl", "vec", "0.8.0")
    assert parse_ref("torchrl:default@0.9", s) == TargetRef("torchrl", None, "0.9")  # one spelling for the default
    assert parse_ref("verl", s) == TargetRef("verl", None, "0.9.1")  # the spec's first default pin
    assert parse_ref("torchrl", s) == TargetRef("torchrl", None, "0.8.0")  # no default pin: the first pin
    assert parse_ref(" VERL@abc123 ", s) == TargetRef("verl", None, "abc123")
    assert str(parse_ref("torchrl:vec@0.8.0", s)) == "torchrl:vec@0.8.0"
    with pytest.raises(RefError, match="unknown target 'nope'.*known targets: nemo-rl, torchrl, verl"):
        parse_ref("nope@1.0", s)
    with pytest.raises(RefError, match="torchrl has no entry 'gpu'; its entries: default, vec"):
        parse_ref("torchrl:gpu", s)
    with pytest.raises(RefError, match="nemo-rl has no registered pins"):
        parse_ref("nemo-rl", s)
    for bad in ("verl@", "verl:", "@1.0", ""):
        with pytest.raises(RefError, match="TARGET"):
            parse_ref(bad, s)
    assert isinstance(RefError("x"), SetupError) and isinstance(RefError("x"), ValueError)


def test_parse_ref_uses_the_registry_by_default():
    ref = parse_ref("verl@0.4.1")
    assert ref == TargetRef("verl", None, "0.4.1")
    with pytest.raises(RefError, match="known targets: .*verl"):
        parse_ref("no-such-framework")


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, env=dict(os.environ, **ENV))


@pytest.fixture
def toy(tmp_path, monkeypatch) -> dict:
    """A toy target: adapter module on the path, a registry of just it, and a history
    v1 (no toy.gae) - v2 (toy.gae.gae) - v3 (toy.gae imports an unlisted missing package)."""
    adapters = tmp_path / "adapters"
    adapters.mkdir()
    (adapters / "toy_adapter.py").write_text(ADAPTER)
    monkeypatch.syspath_prepend(str(adapters))
    monkeypatch.setenv("PYTHONPATH", str(adapters))  # the worker imports the adapter too
    monkeypatch.setattr(registry_mod, "ADAPTER_MODULES", {"toy": "toy_adapter"})
    monkeypatch.setenv("MASKFUZZ_CACHE", str(tmp_path / "cache"))
    repo = tmp_path / "toy-src"
    (repo / "toy").mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    (repo / "toy" / "__init__.py").write_text("")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "v1")
    git(repo, "tag", "v1")
    (repo / "toy" / "gae.py").write_text("def gae(values, mask):\n    return values * mask, values + 1\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "v2")
    git(repo, "tag", "v2")
    (repo / "toy" / "gae.py").write_text("import unlisted_missing_pkg_q\n\ndef gae(values, mask):\n    return values\n")
    git(repo, "commit", "-q", "-am", "v3")
    git(repo, "tag", "v3")
    return {"repos": {"toy": repo}, "cache": tmp_path / "cache"}


def test_open_target_runs_the_checkouts_code_and_closes_its_worker(toy):
    case = Case.build(trainable=[[1, 1, 0]], values=[[1.0, 2.0, 3.0]])
    with pytest.raises(RuntimeError, match="leave the block"):
        with open_target("toy:double@v2", repos=toy["repos"], timeout=30) as h:
            proc = h.run._proc
            assert h.ref == TargetRef("toy", "double", "v2") and h.pin == "v2" and h.label == "toy:double@v2"
            assert len(h.resolved) == 40 and h.checkout.root.name == h.resolved and h.checkout.kind == "git"
            assert h.checkout.root.is_relative_to(toy["cache"])
            assert h.declared.contract == "dense" and h.spec.id == "toy"
            assert h.info["where"] == "toy/gae.py::gae" and h.info["notes"] == ["entry=double"]
            adv, ret = h.run(case)
            assert torch.equal(adv, torch.tensor([[2.0, 4.0, 0.0]]))
            assert torch.equal(ret, torch.tensor([[2.0, 3.0, 4.0]]))
            raise RuntimeError("leave the block")
    assert not proc.alive() and h.run._proc is None  # the worker is gone with the block


def test_function_absent_at_the_pin_is_a_skip(toy):
    with pytest.raises(Skip, match=r"toy@v1 \([0-9a-f]{40}\): .*not present"):
        with open_target("toy@v1", repos=toy["repos"]):
            pass


def test_unimportable_pin_is_a_setup_error_that_says_what_to_do(toy):
    with pytest.raises(SetupError) as err:
        with open_target("toy@v3", repos=toy["repos"]):
            pass
    msg = str(err.value)
    assert msg.startswith("toy@v3 (") and "cannot load the target" in msg
    assert "add it to the stand_ins of toy_adapter.SPEC" in msg and "pip install unlisted_missing_pkg_q" in msg
    assert "ModuleNotFoundError: No module named 'unlisted_missing_pkg_q'" in msg  # the worker's traceback tail


def test_unknown_pin_is_a_setup_error_before_any_worker(toy, monkeypatch):
    import maskfuzz.targets.runtime.session as session

    monkeypatch.setattr(session, "Worker", None)  # a worker start would fail with a TypeError
    with pytest.raises(SetupError, match=r"toy@nope: unknown revision.*git -C"):
        with open_target("toy@nope", repos=toy["repos"]):
            pass
    with pytest.raises(SetupError, match=r"known targets: toy"):
        with open_target("verl@0.4.1", repos=toy["repos"]):
            pass


def test_open_callable(tmp_path):
    (tmp_path / "usergae.py").write_text(
        "def estimate(*, token_rewards, values, trainable, attention, score, gamma, lam):\n"
        "    return values * trainable, values * 0 + gamma\n"
    )
    case = Case.build(trainable=[[1, 0]], values=[[3.0, 4.0]], gamma=0.5)
    with open_callable("usergae:estimate", "dense", path=tmp_path) as h:
        assert h.declared.contract == "dense" and h.resolved == "usergae:estimate" and h.checkout is None
        assert h.info["where"].endswith("usergae.py::estimate")
        adv, ret = h.run(case)
        assert torch.equal(adv, torch.tensor([[3.0, 0.0]])) and torch.equal(ret, torch.tensor([[0.5, 0.5]]))
    for bad, contract in (("usergae", "dense"), ("usergae:estimate", "sparse"), ("a b:c", "dense")):
        with pytest.raises(RefError):
            with open_callable(bad, contract):
                pass



def test_targets_command_lists_pins_and_offline_availability(toy, capsys, monkeypatch):
    import argparse
    import json

    from maskfuzz.fuzz.commands import targets as command

    monkeypatch.delenv("MASKFUZZ_REPOS", raising=False)  # the toy registry knows none of the real targets
    assert command.run(argparse.Namespace(repo=[f"toy={toy['repos']['toy']}"], json=True, verbose=False)) == 0
    out = json.loads(capsys.readouterr().out)
    (t,) = out["targets"]
    assert out["cache"] == str(toy["cache"]) and t["id"] == "toy" and t["entries"] == ["default", "double"]
    assert [(p["rev"], p["kind"], p["offline"]) for p in t["pins"]] == [("v2", "git", True), ("v1", "git", True)]
    monkeypatch.setenv("COLUMNS", "80")
    assert command.run(argparse.Namespace(repo=[], json=False, verbose=False)) == 0  # nothing cached: needs network
    text = capsys.readouterr().out
    assert "toy  (dense)" in text and "entries (2): gae: default, double (the first is the default)" in text
    shown = [line for line in text.splitlines() if not line.startswith("cache: ")]  # a path is never cut
    assert max(map(len, shown)) <= 80 and "--verbose" in text  # fits the terminal; details on ask
    assert "v2" in text and "needs network" in text and "1 targets, 2 pins (0 available offline)" in text

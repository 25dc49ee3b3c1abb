"""`maskfuzz fuzz` end to end on user callables in worker processes: exit codes, JSON, corpus."""

from __future__ import annotations

import json
import textwrap

import pytest

from maskfuzz.fuzz.cli import main
from maskfuzz.fuzz.job_result import DefectRow, FactRow, FindingRow, JobResult

MODULE = textwrap.dedent(
    '''
    import torch

    def leaky(*, token_rewards, values, trainable, attention, score, gamma, lam):
        """Masks values only for storage: the raw ones bootstrap (the seed bug)."""
        b, t_len = values.shape
        rewards = token_rewards * trainable
        idx = torch.arange(t_len).expand(b, t_len)
        last = torch.where(trainable > 0, idx, torch.zeros_like(idx)).max(dim=1).values
        rewards = rewards.clone()
        has = trainable.sum(dim=1) > 0
        rewards[torch.arange(b)[has], last[has]] += score[has]
        adv = torch.zeros_like(values)
        acc = torch.zeros(b, dtype=values.dtype)
        for t in reversed(range(t_len)):
            nxt = values[:, t + 1] if t + 1 < t_len else torch.zeros(b, dtype=values.dtype)
            acc = rewards[:, t] + gamma * nxt - values[:, t] + gamma * lam * acc
            adv[:, t] = acc
        return adv * trainable, (adv + values) * trainable

    def zeros(*, token_rewards, values, trainable, attention, score, gamma, lam):
        z = torch.zeros_like(values)
        return z, z
    '''
)


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "usergae.py").write_text(MODULE)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_callable_with_a_bug_exits_1_and_writes_json_and_corpus(user_module, capsys):
    out = user_module / "out.json"
    code = main(
        [
            "fuzz",
            "--callable",
            "usergae:leaky",
            "--contract",
            "dense",
            "--max-examples",
            "40",
            "--json",
            str(out),
            "--corpus",
            str(user_module / "corpus"),
            "--quiet",
        ]
    )
    assert code == 1
    data = json.loads(out.read_text())
    (target,) = data["targets"]
    assert target["target"] == "usergae:leaky" and target["status"] == "ok"
    props = {f["property"] for f in target["findings"]}
    assert "poison" in props
    finding = next(f for f in target["findings"] if f["property"] == "poison")
    assert set(finding) >= {"property", "shape", "positions", "expected", "observed", "case", "corpus_file"}
    # a callable's inputs are its caller's own: its api domain is its pipeline
    assert finding["reach"] == "pipeline" and finding["severity"] == "high"
    assert finding["class"] == "defect" and finding["promise"] == "universal:poison" and finding["promise_text"]
    assert finding["defect"] == "usergae:leaky/masked-value-bootstrap"
    (leak,) = [d for d in target["defects"] if d["mechanism"] == "masked-value-bootstrap"]
    assert "poison" in leak["properties"] and set(leak) >= {
        "id",
        "mechanism",
        "reach",
        "severity",
        "properties",
        "case",
        "promise",
        "promise_text",
    }
    # one defect, one corpus entry: every property the leak explains shares the defect's file
    files = {f["corpus_file"] for f in target["findings"] if f["mechanism"] == "masked-value-bootstrap"}
    assert len(files) == 1 and len(list((user_module / "corpus").rglob("*.json"))) == len(target["defects"])
    assert finding["corpus_file"] and (user_module / "corpus").exists()
    text = capsys.readouterr().out
    assert text.index("Defects") < text.index("Property findings")


def test_a_function_that_ignores_the_score_is_found(user_module):
    code = main(["fuzz", "--callable", "usergae:zeros", "--contract", "compressed", "--max-examples", "30", "--quiet"])
    assert code == 1


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["fuzz", "nosuchtarget@1.0"], "unknown target"),
        (["fuzz", "--profile", "weekly"], "invalid choice"),
    ],
)
def test_usage_errors_exit_2(argv, needle, capsys):
    with pytest.raises(SystemExit) if "--profile" in argv else _nullcontext():
        code = main(argv)
        assert code == 2
    assert needle in capsys.readouterr().err


def test_missing_callable_is_a_setup_error_exit_2(user_module, capsys):
    code = main(["fuzz", "--callable", "usergae:nope", "--max-examples", "5", "--quiet"])
    assert code == 2
    assert "nope" in capsys.readouterr().err


class _nullcontext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_a_run_without_json_or_corpus_leaves_its_results_in_the_working_directory(user_module, monkeypatch, capsys):
    monkeypatch.chdir(user_module)
    code = main(["fuzz", "--callable", "usergae:leaky", "--contract", "dense", "--max-examples", "30", "--quiet"])
    assert code == 1
    (folder,) = (user_module / "maskfuzz-results").iterdir()
    data = json.loads((folder / "results.json").read_text())
    assert data["targets"][0]["findings"] and list((folder / "corpus").rglob("*.json"))
    err = capsys.readouterr().err.splitlines()
    assert any(line.startswith(f"results: {folder}") for line in err[-4:])
    assert any("maskfuzz repro" in line and "--callable usergae:leaky" in line for line in err[-4:])
    assert any("maskfuzz replay" in line for line in err[-4:])


def test_a_framework_named_without_an_entry_means_every_entry():
    from maskfuzz.fuzz.commands.fuzz import _kind_of, resolve_labels
    from maskfuzz.targets.registry import get

    spec = get("torchrl")
    labels = resolve_labels(["torchrl@0.14.1"], [], {})
    assert labels[0] == "torchrl@0.14.1" and len(labels) == len(spec.entries)
    assert "torchrl:vec@0.14.1" in labels and "torchrl:kl@0.14.1" in labels
    assert resolve_labels(["torchrl:vec@0.14.1"], [], {}) == ["torchrl:vec@0.14.1"]
    assert _kind_of("torchrl@0.14.1") == ("gae", "default")
    assert _kind_of("torchrl:mc-advantage@0.14.1") == ("group-advantage", "mc-advantage")
    assert _kind_of("torchrl:kl@0.14.1") == ("kl", "kl")


@pytest.mark.network
def test_a_hostile_working_directory_gives_the_same_results(tmp_path):
    """`maskfuzz fuzz verl@0.9.1` (GAE and GRPO) from a directory holding its own `targets/`, `fuzz/`,
    `oracles.py` and a broken `transformers` (importable: it is on PYTHONPATH) gives the results of a
    clean directory: workers import maskfuzz from its installation and stand transformers in."""
    import os
    import subprocess

    hostile = tmp_path / "hostile"
    for pkg in ("targets", "fuzz", "transformers"):
        (hostile / pkg).mkdir(parents=True)
        (hostile / pkg / "__init__.py").write_text(f"raise ImportError('the hostile {pkg} package was imported')\n")
    (hostile / "oracles.py").write_text("raise ImportError('the hostile oracles module was imported')\n")
    clean = tmp_path / "clean"
    clean.mkdir()

    def run(cwd, extra_path: str = "") -> dict:
        env = dict(os.environ, PYTHONPATH=extra_path)
        argv = ["maskfuzz", "fuzz", "verl:default@0.9.1", "verl:grpo@0.9.1", "--max-examples", "25", "--seed", "5"]
        argv += ["--jobs", "1", "--json", "out.json"]
        r = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
        assert r.returncode in (0, 1), r.stderr[-2000:]
        assert "hostile" not in r.stderr
        return json.loads((cwd / "out.json").read_text())

    a, b = run(clean), run(hostile, str(hostile))

    def summary(d: dict) -> list:
        return [(t["target"], t["status"], t["examples"], t["checked"], sorted(f["property"] for f in t["findings"]))
                for t in d["targets"]]  # fmt: skip

    assert summary(a) == summary(b) and all(t["status"] == "ok" for t in b["targets"])


@pytest.mark.network
def test_option_fixes_a_framework_option_for_every_case(tmp_path, capsys):
    """--option runs every case with the value (its coverage says so, and the findings keep it);
    an option the target does not have is a set-up error naming its options."""
    out = tmp_path / "r.json"
    argv = ["fuzz", "verl:grpo@0.9.1", "--option", "algorithm.norm_adv_by_std_in_grpo=false"]
    code = main([*argv, "--max-examples", "15", "--quiet", "--json", str(out), "--corpus", str(tmp_path / "c")])
    assert code in (0, 1)
    (t,) = json.loads(out.read_text())["targets"]
    assert t["fixed_options"] == {"algorithm.norm_adv_by_std_in_grpo": False}
    assert t["configuration"]["options_checked"]["algorithm.norm_adv_by_std_in_grpo"]["true"] == 0
    assert all(f["options"] == t["fixed_options"] for f in t["findings"])
    code = main(["fuzz", "verl:grpo@0.9.1", "--option", "nope=1", "--max-examples", "5", "--quiet", "--json", str(out)])
    assert code == 2
    assert "option 'nope' is not an option of this target (its options: algorithm.norm_adv_by_std_in_grpo)" in (
        capsys.readouterr().err
    )
    assert main(["fuzz", "verl:grpo@0.9.1", "--option", "novalue"]) == 2


@pytest.mark.parametrize(
    "flag,value",
    [("--max-examples", "-1"), ("--max-examples", "0"), ("--jobs", "0"), ("--budget", "-5"), ("--timeout", "nan")],
)
def test_a_bad_count_or_duration_is_refused_before_any_work(flag, value, capsys):
    """`--max-examples -1` once exited 0 with nothing checked and `0` silently meant the profile's 200."""
    with pytest.raises(SystemExit) as exc:
        main(["fuzz", "verl@0.9.1", flag, value])
    assert exc.value.code == 2
    assert flag in capsys.readouterr().err


def test_outputs_that_cannot_be_written_are_refused_before_any_work(tmp_path, capsys, monkeypatch):
    import maskfuzz.fuzz.commands.fuzz as cmd

    monkeypatch.setattr(cmd, "run_job", lambda job: pytest.fail("fuzzed although the output was unusable"))
    a_file = tmp_path / "corpus-file"
    a_file.write_text("x")
    assert main(["fuzz", "verl@0.9.1", "--corpus", str(a_file)]) == 2
    assert "not a directory" in capsys.readouterr().err
    assert main(["fuzz", "verl@0.9.1", "--json", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err
    assert main(["fuzz", "verl@0.9.1", "--json", str(a_file / "r.json")]) == 2
    assert "cannot create" in capsys.readouterr().err


def test_a_pin_that_names_nothing_is_refused_once_before_any_work(capsys, monkeypatch):
    """`maskfuzz fuzz verl@0.9.9` once fuzzed for 21 s and printed the same download error on 27 rows."""
    import maskfuzz.fuzz.commands.fuzz as cmd
    from maskfuzz.targets.runtime import acquire as acquire_mod

    def missing(spec, pin, repos=None, cache=None, **kw):
        raise acquire_mod.PinMissing(f"{spec.id}@{pin}: no wheel of verl=={pin}; the index offers 0.9.0, 0.9.1")

    monkeypatch.setattr(acquire_mod, "acquire", missing)
    monkeypatch.setattr(cmd, "run_job", lambda job: pytest.fail("fuzzed although the pin names nothing"))
    assert main(["fuzz", "verl@0.9.9"]) == 2
    err = capsys.readouterr().err
    assert err.count("the index offers 0.9.0, 0.9.1") == 1 and "nothing was run" in err


def test_a_skip_reason_is_printed_once_below_the_table():
    from maskfuzz.fuzz.commands.fuzz import summary_table

    rows = [JobResult(f"verl:{e}@0.9.1", "0.9.1", status="skipped", reason="verl@0.9.1: no network\nmore")
            for e in ("a", "b", "c")]  # fmt: skip

    text = summary_table(rows)
    assert text.count("no network") == 1 and text.count("reason 1") == 4  # three rows and the legend


def test_an_interrupted_run_writes_what_finished_and_names_the_rest(tmp_path, capsys, monkeypatch):
    """Ctrl-C during the third entry: the two finished ones are in the JSON, the rest are named, exit 130."""
    import maskfuzz.fuzz.commands.fuzz as cmd

    calls = []

    def fake(job):
        calls.append(job.label)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return JobResult(job.label.partition("@")[0], "0.9.1", examples=1)

    monkeypatch.setattr(cmd, "run_job", fake)
    out = tmp_path / "r.json"
    code = main(["fuzz", "verl@0.9.1", "--jobs", "1", "--json", str(out), "--corpus", str(tmp_path / "c"), "--quiet"])
    assert code == 130
    data = json.loads(out.read_text())
    assert data["interrupted"] is True and len(data["targets"]) == 2
    assert calls[2] in data["not_run"] and len(data["not_run"]) >= 1
    assert "interrupted after" in capsys.readouterr().err


def test_the_next_command_after_a_callable_run_works_as_printed(user_module, capsys):
    """The printed `maskfuzz repro ...` once named `--target usergae:leaky@local`, which repro cannot open."""
    import shlex

    code = main(["fuzz", "--callable", "usergae:leaky", "--contract", "dense", "--max-examples", "30",
                 "--json", str(user_module / "r.json"), "--corpus", str(user_module / "c"), "--quiet"])  # fmt: skip
    assert code == 1
    line = next(x for x in capsys.readouterr().err.splitlines() if x.startswith("next: maskfuzz repro"))
    argv = shlex.split(line.removeprefix("next: maskfuzz "))
    assert "--callable" in argv and "--target" not in argv
    assert main(argv + ["--no-judge"]) == 0  # the script was written and checked
    assert "reproduced" in capsys.readouterr().out
    assert (user_module / argv[argv.index("-o") + 1] / "repro.py").is_file()


def test_a_run_without_targets_is_the_first_run_set_with_its_budget_split_and_says_what_it_left_out(
    tmp_path, capsys, monkeypatch
):
    """`maskfuzz fuzz` alone: every default framework's first-run entries at its default pins, 120 s of fuzzing
    split across them, and a last line naming what it left out and the command that covers everything."""
    import maskfuzz.fuzz.commands.fuzz as cmd
    from maskfuzz.targets.registry import registry

    seen = []

    def fake(job):
        seen.append(job)
        return JobResult(job.label.partition("@")[0], job.label.partition("@")[2], examples=1)

    monkeypatch.setattr(cmd, "run_job", fake)
    code = main(["fuzz", "--jobs", "1", "--json", str(tmp_path / "r.json"), "--corpus", str(tmp_path / "c")])
    assert code == 0
    newest = {"miles": "0.0.2", "verl": "0.9.1", "openrlhf": "0.11.2", "trl": "1.12.0", "areal": "1.0.4",
              "skyrl": "0.3.1", "torchrl": "0.14.1", "torchtune": "0.6.1"}  # fmt: skip
    want = {(s.id, newest[s.id]) for s in registry().values() if s.default_pins}
    assert {(j.label.split(":")[0].split("@")[0], j.label.split("@")[1]) for j in seen} == want
    assert len(seen) == sum(len(s.first_run_entries) for s in registry().values() if s.default_pins)
    assert all(j.budget == pytest.approx(cmd.FIRST_RUN_BUDGET / len(seen)) or j.budget == 1.0 for j in seen)
    err = capsys.readouterr().err
    assert "left out:" in err and "maskfuzz fuzz --all" in err
    # --all: every entry, no split budget unless asked
    seen.clear()
    out = ["--json", str(tmp_path / "a.json"), "--corpus", str(tmp_path / "c")]
    assert main(["fuzz", "--all", "--jobs", "1", *out]) == 0
    assert len(seen) > 100 and all(j.budget is None for j in seen)
    assert main(["fuzz", "verl@0.9.1", "--all"]) == 2


def test_the_nightly_profiles_budget_is_the_runs_so_a_pin_with_many_entries_fits_its_job(tmp_path, monkeypatch):
    """The nightly workflow fuzzes one pin per job with a 60-minute limit; the profile's 1200 s were once each
    entry's, so verl 0.9.1's dozens of entries asked for hours. Now the 1200 s are split like --budget."""
    import maskfuzz.fuzz.commands.fuzz as cmd
    from maskfuzz.fuzz.profiles import PROFILES, run_share

    seen = []

    def run_all(jobs, workers, started):  # in place of the process pool: the jobs as planned
        seen.extend(jobs)
        return [JobResult(j.label.partition("@")[0], "0.9.1", examples=1) for j in jobs], []

    monkeypatch.setattr(cmd, "_run_all", run_all)
    out = ["--json", str(tmp_path / "r.json"), "--corpus", str(tmp_path / "c")]
    assert main(["fuzz", "verl@0.9.1", "--profile", "nightly", "--jobs", "2", *out]) == 0
    total = PROFILES["nightly"].budget
    assert len(seen) > 20 and all(j.budget == pytest.approx(total * 2 / len(seen)) for j in seen)
    assert sum(j.budget for j in seen) / 2 == pytest.approx(total)  # the job's fuzzing wall time: its budget
    seen.clear()
    assert main(["fuzz", "verl:grpo@0.9.1", "--profile", "nightly", "--jobs", "2", *out]) == 0
    assert [j.budget for j in seen] == [total]  # one entry gets the whole run, not jobs x the run
    assert run_share(10.0, 4, 3) == pytest.approx(10.0) and run_share(10.0, 2, 100) == 1.0
    with pytest.raises(ValueError, match="jobs >= 1"):
        run_share(10.0, 0, 3)


def test_the_last_block_says_per_framework_what_affects_it_and_each_skip_reason_once():
    import dataclasses

    from maskfuzz.fuzz.commands.fuzz import framework_summary

    defect = DefectRow("verl@0.9.1/score-lost", "score-lost", reach="pipeline", severity="high",
                       promise={"promise": "universal:score-kept"}, properties=("score-kept",),
                       case={"shape": [1, 2]})  # fmt: skip
    low = dataclasses.replace(defect, id="verl:grpo@0.9.1/crash-degenerate", severity="low",
                              mechanism="crash-degenerate")  # fmt: skip
    finding = FindingRow("score-kept", defect=defect.id, corpus_file="c/verl/score-kept-1.json")
    results = [
        JobResult("verl:grpo", "0.9.1", defects=(low,)),
        JobResult("verl", "0.9.1", defects=(defect,), findings=(finding,), facts=(FactRow("f", "semantics"),)),
        *[JobResult(f"verl:e{i}", "0.4.1", status="skipped",
                    reason=f"verl:e{i}@0.4.1 (verl==0.4.1): function not present at this pin") for i in range(3)],
    ]  # fmt: skip
    text = framework_summary(results)
    lines = text.splitlines()
    assert "verl (0.4.1, 0.9.1): 2 of 5 entries ran" in text
    high = next(i for i, x in enumerate(lines) if "high" in x)
    assert high < next(i for i, x in enumerate(lines) if "low " in x)  # most severe first
    assert "maskfuzz repro c/verl/score-kept-1.json --target verl@0.9.1" in lines[high + 1]
    assert text.count("function not present at this pin") == 1 and "3 entries skipped" in text
    assert "1 semantics" in text


def test_every_first_run_entry_is_a_registered_entry():
    from maskfuzz.targets.registry import registry

    for spec in registry().values():
        assert set(spec.first_run) <= set(spec.entries), (spec.id, set(spec.first_run) - set(spec.entries))
        assert spec.first_run_entries[0] == spec.entries[0]  # the GAE / trainer entry leads

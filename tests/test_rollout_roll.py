"""Reach you can run: ROLL's masked-value bootstrap on a real rollout (`maskfuzz validate`, targets/rollout/).

A tiny random causal LM built in code generates real responses; ROLL's own batch code at the pin
(`postprocess_generate`, `get_sample_level_mask`, `reward_postprocess`, `compute_token_reward`,
`compute_advantage`) runs on them in a worker process; the only fault is the critic's value under the mask,
placed after the rollout and before `compute_advantage`.

* c09bc8bc9f43 (seed report 000): `compute_advantage` hands the unmasked values to GAE, so the padding slot's
  critic value moves the valid-token advantage off the float64 reference: reproduced, exit 1.
* 090ac94658ad (PR #447 head): the values are masked first: not reproduced, exit 0.

The tests of ROLL need MASKFUZZ_REPOS=roll=/path/to/a-ROLL-clone-or-mirror (git only) and skip without it; the
tiny LM and tokenizer, the embedding search and the refusals run everywhere.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from maskfuzz.fuzz import corpus
from maskfuzz.fuzz import validate as val
from maskfuzz.fuzz.cli import main
from maskfuzz.oracles.case import Case
from maskfuzz.oracles.verdict import Verdict
from maskfuzz.targets import registry
from maskfuzz.targets.rollout import lm
from maskfuzz.targets.rollout.session import batch_code, open_rollout
from maskfuzz.targets.runtime.repos import parse_repos
from maskfuzz.targets.runtime.session import SetupError, parse_ref

ROOT = Path(__file__).resolve().parents[1]
SEED_PIN, FIX_PIN = "c09bc8bc9f43", "090ac94658ad"
ENTRY = ROOT / "corpus" / "roll" / "poison-eea9356e726af9b5.json"  # roll/masked-value-bootstrap, shrunk
# seed report 000's own example, its masked slot the padding after the response (as the RLVR pipeline builds it)
SEED = Case.build(
    trainable=[[1, 1, 0]], attention=[[1, 1, 0]], token_rewards=[[0, 1, 0]], values=[[0, 0, 100]], gamma=1.0, lam=0.95
)
LEAKED, FIXED = [5.699999809265137, 6.0], [0.949999988079071, 1.0]  # the seed report's float32 numbers


def _mirror() -> dict:
    repos = parse_repos(None)
    if "roll" not in repos:
        pytest.skip("ROLL is git only, its real rollout needs a local mirror: set MASKFUZZ_REPOS=roll=/path")
    return repos


# ---------------------------------------------------------------------------------------------
# The tiny LM and its tokenizer (always run).
# ---------------------------------------------------------------------------------------------
def test_the_tiny_lm_generates_deterministically_with_eos_and_padding():
    tok = lm.build_tokenizer()
    assert (tok.eos_token, tok.pad_token, tok.bos_token) == (lm.EOS, lm.PAD, lm.BOS)
    assert len(tok) == len(lm.SPECIAL_TOKENS) + len(lm.WORDS)
    tool_turn = [{"role": r, "content": c} for r, c in lm.PROMPTS[2]]
    text = tok.apply_chat_template(tool_turn, tokenize=False, add_generation_prompt=True)
    assert text.startswith("<s><|user|> search the answer <|end|>") and "<|tool|> result four <|end|>" in text
    assert text.endswith("<|assistant|>")
    assert tok.convert_ids_to_tokens(tok(text, add_special_tokens=False)["input_ids"]) == text.replace(
        "<s><|user|>", "<s> <|user|>").split()  # fmt: skip
    assert [lm.token_text(i) for i in range(len(tok))] == tok.convert_ids_to_tokens(list(range(len(tok))))

    state = torch.random.get_rng_state()
    request = lm.RolloutRequest(seed=0, num_return_sequences=8, max_new_tokens=6)
    model = lm.build_model(request.model, tok)
    one = lm.generate(request, tokenizer=tok, model=model)
    two = lm.generate(request, tokenizer=tok, model=model)
    other = lm.generate(lm.RolloutRequest(seed=1, num_return_sequences=8, max_new_tokens=6), tokenizer=tok, model=model)
    assert torch.equal(torch.random.get_rng_state(), state)  # the caller's random state is untouched
    assert torch.equal(one.output, two.output) and one.responses == two.responses
    assert not torch.equal(one.output[:, one.prompt_length :], other.output[:, other.prompt_length :])

    b, p = one.input_ids.shape
    assert one.output.shape[0] == b * 8 and b == len(lm.PROMPTS)
    assert (one.input_ids[one.attention_mask == 0] == one.pad_token_id).all()  # prompts left-padded with <pad>
    assert bool((one.attention_mask[:, 0] == 0).any()) and bool(one.attention_mask[:, -1].all())
    responses = one.output[:, p:]
    ended = 0
    for row in responses.tolist():
        if one.eos_token_id in row:  # EOS, then padding only
            k = row.index(one.eos_token_id)
            assert all(t == one.pad_token_id for t in row[k + 1 :])
            assert one.pad_token_id not in row[:k]
            ended += k + 1 < len(row)
        else:  # no EOS: the response filled the length limit, no padding (<pad> is never sampled)
            assert one.pad_token_id not in row
    assert ended, "no response stopped at a sampled EOS before the limit: the pool shows no padding"


def test_a_case_row_embeds_at_its_trainable_span():
    assert val.embed("TP", "RRRRTPPP") == 4
    assert val.embed("RTP", "RRRRTPPP") == 3
    assert val.embed("TP", "RRRRTTPP") is None  # the span differs
    assert val.embed("TP", "RRRRRRRT") is None  # no padding after it
    assert val.embed("PTP", "RRRRTPPP") is None  # no left padding in the batch
    assert val.embed("TRT", "RRTRTPPP") == 2 and val.embed("TRT", "RRTTTPPP") is None
    assert val.embed("PP", "RRRRPPPP") == 6 and val.embed("PP", "RRRRTPPP") is None
    assert val.new_tokens(SEED) == 3  # a span of 2 and one padding slot after it


def test_validate_says_when_there_is_no_real_rollout_path(tmp_path, capsys):
    agentic = ROOT / "corpus" / "roll" / "poison-51f8cd0de042c0cd.json"
    assert main(["validate", str(agentic), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "cannot run" in err and "no real-rollout path for roll:agentic" in err
    assert not (tmp_path / "out").exists()


def test_the_batch_code_is_found_in_the_framework_folder():
    """`targets/<framework>/rollout.py` is a target's real-rollout path (no list of names in targets/rollout/); a
    folder without one, or an entry named in the ref, has none, and the refusal lists the targets that have one."""
    assert batch_code(parse_ref("roll@c09bc8bc9f43")) == "maskfuzz.targets.roll.rollout"
    assert batch_code(parse_ref("nemo-rl@v0.4.0")) is None and batch_code(parse_ref("roll:agentic@main")) is None
    assert registry.folders_with("rollout") == ("areal", "miles", "openrlhf", "roll", "skyrl", "slime", "trl", "verl")
    with pytest.raises(SetupError, match=r"no real-rollout path for nemo-rl yet \(covered: areal, miles, .*verl\)"):
        with open_rollout("nemo-rl@v0.4.0"):
            pass


# ---------------------------------------------------------------------------------------------
# ROLL's batch code at the pins (needs the mirror).
# ---------------------------------------------------------------------------------------------
@pytest.mark.needs_mirror
def test_the_masked_value_bootstrap_reproduces_on_a_real_rollout_at_the_seed_pin(tmp_path, capsys):
    repos = _mirror()
    out = tmp_path / "seed"
    code = main(["validate", str(ENTRY), "--target", f"roll@{SEED_PIN}", "--repo", f"roll={repos['roll']}",
                 "-o", str(out)])  # fmt: skip
    said = capsys.readouterr().out
    assert code == 1, said
    assert "reproduced: the masked critic value(s) [100.0] moved 1 valid-token output(s)" in said
    record = json.loads((out / "validation.json").read_text())
    assert record["verdict"]["reproduced"] and record["resolved"].startswith(SEED_PIN)
    recipe = record["recipe"]
    assert recipe["hooked_boundary"] == "after the real rollout, before critic values enter compute_advantage"
    assert recipe["replaced_component"] is None and "tensordict" not in recipe["stand_ins"]
    called = recipe["preserved_infrastructure"]
    for fn in ("postprocess_generate", "get_sample_level_mask", "reward_postprocess", "compute_token_reward",
               "compute_advantage"):  # fmt: skip
        assert f"roll/utils/functionals.py::{fn}" in called
    scenario = recipe["constructed_scenario"]
    # the generation decided the mask: one response token (a sampled EOS), then ROLL's padding holding the poison
    (mask,) = scenario["masks"]
    first = mask.index("T")
    assert mask[first:].startswith("TP") and mask.count("T") == 1 and set(mask[:first]) == {"R"}
    assert scenario["responses"][0].startswith(lm.EOS)
    assert scenario["poisoned_positions"] == [[0, first + 1]] and scenario["lam"] == 0.5
    (pos,) = record["positions"]
    assert pos["position"] == first and pos["token"] == lm.EOS and pos["leaked"]
    # the valid-token advantage moves with the masked critic value: 1 + 0.5 * 100 (ROLL bootstraps it) vs 1
    assert (pos["observed_advantage"], pos["clean_twin_advantage"], pos["reference_advantage"]) == (51.0, 1.0, 1.0)
    assert record["verdict"]["clean_twin_off_reference"] == []
    md = (out / "validation.md").read_text()
    assert "**Reproduced.**" in md and "## Recipe" in md and "hooked boundary" in md


@pytest.mark.needs_mirror
def test_pr_447_masks_the_value_first_not_reproduced(tmp_path, capsys):
    repos = _mirror()
    out = tmp_path / "fixed"
    code = main(["validate", str(ENTRY), "--target", f"roll@{FIX_PIN}", "--repo", f"roll={repos['roll']}",
                 "-o", str(out)])  # fmt: skip
    said = capsys.readouterr().out
    assert code == 0, said
    assert "not reproduced: every valid-token advantage and return agrees with the float64 reference" in said
    record = json.loads((out / "validation.json").read_text())
    (pos,) = record["positions"]
    assert not record["verdict"]["reproduced"] and not pos["leaked"]
    assert pos["observed_advantage"] == pos["reference_advantage"] == 1.0
    assert "**Not reproduced.**" in (out / "validation.md").read_text()


@pytest.mark.needs_mirror
@pytest.mark.parametrize("pin, expected", [(SEED_PIN, LEAKED), (FIX_PIN, FIXED)])
def test_the_seed_reports_own_example_gives_its_numbers_on_a_real_rollout(pin, expected):
    """Seed report 000's trigger (mask [1, 1, 0], token rewards [0, 1, 0], values [0, 0, 100], lam 0.95) embedded
    in a real batch: ROLL's outputs at the two valid tokens are the report's, buggy and fixed."""
    repos = _mirror()
    entry = corpus.Entry("roll", SEED_PIN, "poison", SEED, Verdict("poison", "fail", "seed report 000"))
    declared = registry.get("roll").declared(None, pin)
    with open_rollout(f"roll@{pin}", repos=repos) as rollout:
        record = val.validate(entry, rollout, declared)
    observed = [p["observed_advantage"] for p in record["positions"]]
    assert observed == expected
    assert [p["reference_advantage"] for p in record["positions"]] == pytest.approx(FIXED, rel=1e-6)
    assert record["verdict"]["reproduced"] == (pin == SEED_PIN)
    assert record["recipe"]["constructed_scenario"]["lam"] == 0.95

"""The corpus file format: bit-exact round trip, reviewable text, and strict, non-destructive loading."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from maskfuzz.fuzz.corpus import load, save
from maskfuzz.fuzz.corpus_codec import (
    CorpusError,
    Entry,
    Found,
    case_from_json,
    case_to_json,
    dumps,
    encode_bits,
    encode_float,
    parse_json,
)
from maskfuzz.oracles.case import DTYPES, Case, quantize
from maskfuzz.oracles.verdict import Verdict

NAN_BITS = {
    "default": 0x7FF8000000000000,
    "negative": 0xFFF8000000000000,  # what x86 produces for 0 * inf
    "payload": 0x7FF8000000000001,
    "signalling": 0x7FF0000000000001,
}


def _f(u: int) -> float:
    return struct.unpack("<d", struct.pack("<Q", u))[0]


def _bits_of(t: torch.Tensor) -> list:
    return t.contiguous().view(torch.int64).flatten().tolist()


def assert_bit_identical(a: Case, b: Case) -> None:
    assert a.dtype == b.dtype
    assert struct.pack("<d", a.gamma) == struct.pack("<d", b.gamma)
    assert struct.pack("<d", a.lam) == struct.pack("<d", b.lam)
    assert torch.equal(a.attention, b.attention) and torch.equal(a.trainable, b.trainable)
    for name in ("token_rewards", "values", "score"):
        assert _bits_of(getattr(a, name)) == _bits_of(getattr(b, name)), name


# -- a Hypothesis strategy for arbitrary valid cases, non-finite poison and NaN payloads included --
any_bits = st.one_of(
    st.integers(0, (1 << 64) - 1),  # every float64, subnormals and every NaN payload included
    st.sampled_from([0, 1 << 63, 0x7FF0000000000000, 0xFFF0000000000000, *NAN_BITS.values()]),
    st.floats(-1e4, 1e4).map(lambda x: struct.unpack("<Q", struct.pack("<d", x))[0]),
)


@st.composite
def cases(draw) -> Case:
    b, t = draw(st.integers(1, 3)), draw(st.integers(1, 6))
    dtype = draw(st.sampled_from(sorted(DTYPES)))
    att, tr = [], []
    for _ in range(b):
        lo = draw(st.integers(0, t))
        hi = draw(st.integers(lo, t))
        a = [lo <= i < hi for i in range(t)]
        att.append(a)
        tr.append([x and draw(st.booleans()) for x in a])
    trainable = torch.tensor(tr, dtype=torch.bool)

    def floats(shape: tuple, finite_where: torch.Tensor) -> torch.Tensor:
        n = 1
        for s in shape:
            n *= s
        bits = draw(st.lists(any_bits, min_size=n, max_size=n))
        x = torch.tensor([u - (1 << 64) if u >= 1 << 63 else u for u in bits], dtype=torch.int64).view(torch.float64)
        x = x.reshape(shape)
        # finite numbers must be numbers of the dtype; non-finite poison keeps its exact bits
        x = torch.where(torch.isfinite(x), quantize(x, dtype), x)
        # only poison may be non-finite (float16 rounds large numbers to inf: zero those too)
        return torch.where(finite_where & ~torch.isfinite(x), torch.zeros_like(x), x)

    case = Case(
        attention=torch.tensor(att, dtype=torch.bool),
        trainable=trainable,
        token_rewards=floats((b, t), trainable),
        values=floats((b, t), trainable),
        score=floats((b,), torch.ones(b, dtype=torch.bool)),
        gamma=draw(st.floats(0, 1)),
        lam=draw(st.floats(0, 1)),
        dtype=dtype,
    )
    return case


@settings(max_examples=300, deadline=None)
@given(cases())
def test_case_json_text_round_trip_is_bit_identical(case: Case):
    text = dumps(case_to_json(case))
    back = case_from_json(parse_json(text))
    assert_bit_identical(case, back)
    assert dumps(case_to_json(back)) == text  # the canonical text is a fixed point (stable ids)


def test_special_floats_are_readable_strings_and_exact():
    assert encode_float(float("inf")) == "inf" and encode_float(float("-inf")) == "-inf"
    assert encode_float(float("nan")) == "nan"
    assert encode_bits(NAN_BITS["negative"]) == "0xfff8000000000000"
    assert encode_bits(NAN_BITS["payload"]) == "0x7ff8000000000001"
    assert json.dumps(encode_float(-0.0)) == "-0.0"
    assert encode_float(0.1) == 0.1 and isinstance(encode_float(0.1), float)


def test_negative_zero_and_nan_payloads_survive_a_file(tmp_path: Path):
    values = torch.tensor([[0.0, _f(NAN_BITS["negative"]), _f(NAN_BITS["payload"]), -0.0]], dtype=torch.float64)
    case = Case(
        attention=torch.tensor([[True, True, True, True]]),
        trainable=torch.tensor([[True, False, False, True]]),
        token_rewards=torch.tensor([[-0.0, float("inf"), _f(NAN_BITS["signalling"]), 1.0]], dtype=torch.float64),
        values=values,
        score=torch.tensor([-0.0], dtype=torch.float64),
        gamma=1.0,
        lam=0.5,
        dtype="float64",
    )
    entry = _entry(case)
    path = save(entry, tmp_path)
    text = path.read_text()
    assert '"0xfff8000000000000"' in text and '"0x7ff0000000000001"' in text and "-0.0" in text
    assert_bit_identical(case, load(path).case)


def test_file_is_pretty_one_row_per_line(tmp_path: Path):
    case = Case.build(
        trainable=[[1, 1, 0, 0], [1, 0, 1, 0]],
        attention=[[1, 1, 1, 0], [1, 1, 1, 1]],
        values=[[0, 0, 100, 7], [1, 2, 3, 4]],
    )
    path = save(_entry(case), tmp_path)
    lines = path.read_text().splitlines()
    assert '      "1110",' in lines and '      "1111"' in lines  # one mask row per line
    assert "      [0.0, 0.0, 100.0, 7.0]," in lines and "      [1.0, 2.0, 3.0, 4.0]" in lines
    assert path == tmp_path / "verl" / f"poison-{load(path).id}.json"


def test_entry_round_trip_keeps_everything(tmp_path: Path):
    case = Case.build(trainable=[[1, 1, 0]], token_rewards=[[0, 1, 0]], values=[[0, 0, 100]], gamma=1, lam=0.95)
    entry = _entry(case, resolved="verl==0.4.1", also=("reference",), entry_point="vec")
    back = load(save(entry, tmp_path))
    assert (back.target, back.entry_point, back.pin, back.resolved) == ("verl", "vec", "0.4.1", "verl==0.4.1")
    assert back.property == "poison" and back.also == ("reference",) and back.id == entry.id
    assert back.verdict.to_dict() == entry.verdict.to_dict()
    assert back.found == entry.found and back.found.seed == 7
    assert_bit_identical(entry.case, back.case)


def test_id_depends_on_case_target_and_property_not_on_pin():
    case = Case.build(trainable=[[1, 0]])
    a = _entry(case)
    assert a.id == _entry(case, pin="0.9.1").id  # one bug, two pins: one entry
    assert a.id != _entry(case, prop="reference").id
    assert a.id != _entry(case, entry_point="vec").id
    assert a.id != _entry(case.replace(lam=0.5)).id
    assert a.id != _entry(case.replace(dtype="bfloat16")).id


# -- unreadable files: a clear error naming file and field, and the bytes untouched -------------------
def _mutate(key_path: str, value):
    def apply(d: dict) -> dict:
        *head, last = key_path.split(".")
        node = d
        for k in head:
            node = node[k]
        if value is _DELETE:
            del node[last]
        else:
            node[last] = value
        return d

    return apply


_DELETE = object()
DATA_CASES = [
    ("future version", _mutate("version", 4), "version", "newer"),
    ("version as text", _mutate("version", "1"), "version", "expected int"),
    ("other format", _mutate("format", "something-else"), "format", "not a maskfuzz corpus entry"),
    ("missing case", _mutate("case", _DELETE), "case", "expected an object"),
    ("gamma wrong type", _mutate("case.gamma", [1]), "case.gamma", "expected"),
    ("gamma out of range", _mutate("case.gamma", 2.0), "case", "gamma=2.0 is outside [0, 1]"),
    ("mask with a letter", _mutate("case.trainable", ["11x"]), "case.trainable[0]", "'0'/'1'"),
    ("row too short", _mutate("case.values", [[0.0, 0.0]]), "case.values[0]", "expected 3 items"),
    ("bad float string", _mutate("case.values", [[0.0, "NaN!", 0.0]]), "case.values[0][1]", "is not a float"),
    ("bool as float", _mutate("case.score", [True]), "case.score[0]", "expected a number"),
    ("not a float32 number", _mutate("case.values", [[0.0, 0.0, 0.1]]), "case.values[0][2]", "not a float32 number"),
    ("edited case, stale id", _mutate("case.values", [[0.0, 0.0, 99.0]]), "id", "does not match the content"),
    ("unknown property", _mutate("property", "vibes"), "property", "unknown property"),
    ("position outside the case", _mutate("verdict.positions", [[0, 9], [0, 1]]), "verdict.positions[0]", "inside"),
    ("missing found", _mutate("found", _DELETE), "found", "missing"),
    ("seed as list", _mutate("found.seed", [1]), "found.seed", "expected int or str"),
]
TEXT_CASES = [
    ("truncated", lambda t: t[: len(t) // 2], None, "not valid JSON"),
    ("empty", lambda t: "", None, "not valid JSON"),
    ("NaN literal", lambda t: t.replace('"lam": 0.95', '"lam": NaN'), None, "non-standard JSON constant NaN"),
    ("duplicate key", lambda t: t.replace('"pin": "0.4.1"', '"pin": "0.4.1", "pin": "0.9.1"'), "pin", "twice"),
    ("number beyond float64", lambda t: t.replace("100.0", "1e999"), "case.values[0][2]", "out of float64 range"),
    ("top level list", lambda t: "[1, 2]", None, "top level"),
]


@pytest.fixture
def good_file(tmp_path: Path) -> Path:
    case = Case.build(trainable=[[1, 1, 0]], token_rewards=[[0, 1, 0]], values=[[0, 0, 100]], gamma=1, lam=0.95)
    return save(_entry(case), tmp_path)


@pytest.mark.parametrize("name,mutate,field,needle", DATA_CASES, ids=[c[0] for c in DATA_CASES])
def test_bad_field_is_rejected_naming_file_and_field(good_file: Path, name, mutate, field, needle):
    data = mutate(json.loads(good_file.read_text()))
    good_file.write_text(json.dumps(data, indent=2))
    _assert_rejected(good_file, field, needle)


@pytest.mark.parametrize("name,mutate,field,needle", TEXT_CASES, ids=[c[0] for c in TEXT_CASES])
def test_corrupt_text_is_rejected_naming_the_file(good_file: Path, name, mutate, field, needle):
    good_file.write_text(mutate(good_file.read_text()))
    _assert_rejected(good_file, field, needle)


def test_non_utf8_and_missing_files(tmp_path: Path):
    bad = tmp_path / "x.json"
    bad.write_bytes(b'{"format": "\xff\xfe"}')
    _assert_rejected(bad, None, "not UTF-8")
    with pytest.raises(CorpusError, match="cannot read"):
        load(tmp_path / "nope.json")


def test_save_never_overwrites_an_unreadable_file(good_file: Path):
    entry = load(good_file)
    good_file.write_text('{"format": "maskfuzz-corpus", "vers')  # same name, now corrupt
    before = good_file.read_bytes()
    with pytest.raises(CorpusError, match="not valid JSON"):
        save(entry, good_file.parents[1])
    assert good_file.read_bytes() == before


def _assert_rejected(path: Path, field: str | None, needle: str) -> None:
    before = path.read_bytes()
    with pytest.raises(CorpusError) as info:
        load(path)
    exc = info.value
    assert exc.path == path and str(path) in str(exc)
    assert exc.field == field, str(exc)
    if field:
        assert repr(field) in str(exc)
    assert needle in str(exc)
    assert path.read_bytes() == before  # loading never rewrites


def _entry(case: Case, prop: str = "poison", pin: str = "0.4.1", **kw) -> Entry:
    t = case.shape[1]
    verdict = Verdict(
        prop,
        "fail",
        "finite poison under the mask changed the output",
        "advantages",
        [[0, 0], [0, min(1, t - 1)]],
        [0.95, 1.0],
        [5.7, 6.0],
    )
    found = Found(seed=7, date="2026-01-02T03:04:05Z", hypothesis="6.0", torch="2.13.0", maskfuzz="0.1.0")
    return Entry(target="verl", pin=pin, property=prop, case=case, verdict=verdict, found=found, **kw)

"""Validation of the canonical case: a bad case never reaches a target."""

from __future__ import annotations

import pytest
import torch

from maskfuzz.oracles.case import Case, CaseError, dtype_name, quantize
from maskfuzz.oracles.domain import Domain


def test_build_defaults_and_shape():
    c = Case.build(trainable=[[1, 0], [1, 1]])
    assert c.shape == (2, 2) and c.dtype == "float32"
    assert c.attention.all() and (c.values == 0).all() and c.score.tolist() == [0, 0]


@pytest.mark.parametrize(
    "kwargs,needle",
    [
        (dict(trainable=[[1, 0]], values=[[1, 2, 3]]), "shape mismatch: values"),
        (dict(trainable=[[1, 1]], attention=[[1, 0]]), "trainable outside attention"),
        (dict(trainable=[[1, 0, 1]], attention=[[1, 0, 1]]), "not contiguous"),
        (dict(trainable=[[1]], gamma=1.5), "gamma=1.5 is outside"),
        (dict(trainable=[[1]], lam=-0.1), "lam=-0.1 is outside"),
        (dict(trainable=[[]]), "empty batch"),
        (dict(trainable=torch.zeros(0, 3)), "empty batch"),
        (dict(trainable=[[1, 0]], score=[1, 2]), "score has shape"),
        (dict(trainable=[[2, 0]]), "only 0 and 1"),
        (dict(trainable=[1, 0]), "2-D"),
        (dict(trainable=[[1, 0]], values=[[float("nan"), 0]]), "not finite at trainable"),
        (dict(trainable=[[1]], dtype="int8"), "dtype 'int8'"),
        (dict(trainable=[[1]], values=[[1e6]], dtype="float16"), "not finite at trainable"),
        (dict(trainable=[[1]], values="abc"), "not a numeric array"),
    ],
)
def test_invalid_cases_are_rejected_with_clear_errors(kwargs, needle):
    with pytest.raises(CaseError, match=needle):
        Case.build(**kwargs)


def test_nonfinite_poison_is_allowed_under_the_mask():
    c = Case.build(trainable=[[1, 0]], values=[[0, float("nan")]], token_rewards=[[0, float("-inf")]])
    assert c.has_nonfinite_poison()


def test_left_padding_is_valid():
    Case.build(trainable=[[0, 1, 1]], attention=[[0, 1, 1]])


def test_values_are_rounded_to_the_run_dtype():
    c = Case.build(trainable=[[1]], values=[[0.1]], dtype="bf16")
    assert c.dtype == "bfloat16"
    assert float(c.values[0, 0]) == float(torch.tensor(0.1, dtype=torch.bfloat16))
    assert quantize(torch.tensor([0.1], dtype=torch.float64), "fp64").item() == 0.1
    assert dtype_name("torch.float16") == "float16"


def test_replace_revalidates_and_requantizes():
    c = Case.build(trainable=[[1, 0]], values=[[0.1, 0]], dtype="float64")
    with pytest.raises(CaseError):
        c.replace(gamma=2.0)
    half = c.replace(dtype="float16")
    assert float(half.values[0, 0]) == float(torch.tensor(0.1, dtype=torch.float16))


def test_domain_rejections_name_the_reason():
    gap = Case.build(trainable=[[1, 0, 1]])
    tail = Case.build(trainable=[[1, 0, 0]])
    left = Case.build(trainable=[[0, 1]], attention=[[0, 1]])
    narrow = Domain(gaps=False, masked_real_tail=False, left_padding=False, why={"gaps": "no token mask"})
    assert "gap" in narrow.rejects(gap)
    assert "ends in real non-trainable" in narrow.rejects(tail)
    assert "left-padded" in narrow.rejects(left)
    assert Domain().rejects(gap) is None
    assert narrow.restrictions()["gaps"] == "no token mask"
    assert narrow.restrictions()["left_padding"] == "(no reason recorded)"


def test_domain_tells_an_empty_row_from_an_all_masked_row():
    empty = Case.build(trainable=[[1, 1], [0, 0]], attention=[[1, 1], [0, 0]])
    masked = Case.build(trainable=[[1, 1], [0, 0]], attention=[[1, 1], [1, 1]])
    no_empty = Domain(empty_rows=False)
    assert "zero-length response" in no_empty.rejects(empty)
    assert no_empty.rejects(masked) is None
    assert "no trainable token" in Domain(all_masked_rows=False).rejects(masked)
    assert Domain(all_masked_rows=False).rejects(empty) is None

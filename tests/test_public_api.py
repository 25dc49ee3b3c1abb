"""The README's "In your own test suite" example runs as written (its two tests, through the installed pytest
plugin), and the public API refuses bad arguments before any work."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

README = Path(__file__).resolve().parents[1] / "README.md"


def _example() -> str:
    text = README.read_text(encoding="utf-8")
    section = text.split("## In your own test suite", 1)[1].split("\n## ", 1)[0]
    (code,) = re.findall(r"```python\n(.*?)```", section, re.S)
    return code


def test_the_readme_example_fails_the_leaky_gae_and_passes_the_correct_one(pytester):
    pytester.makepyfile(test_readme_example=_example())
    result = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider", "-p", "no:randomly")
    result.assert_outcomes(passed=2)


def test_the_leaky_gae_is_reported_with_its_promise_and_smallest_case():
    namespace: dict = {}
    exec(compile(_example(), "README example", "exec"), namespace)  # noqa: S102 - our own README
    from maskfuzz.fuzz.testing import defects

    found = defects(lambda **kw: namespace["masked_gae"](**kw, skip_masked=False), "compressed", max_examples=60)
    assert found and found[0].promise.id == "universal:poison" and found[0].severity == "high"
    assert found[0].case.shape[1] <= 4  # shrunk


@pytest.mark.parametrize(
    "kwargs,message",
    [({"contract": "nope"}, "contract"), ({"dtypes": ("float8",)}, "dtypes"), ({"max_examples": 0}, "max_examples")],
)
def test_bad_arguments_are_refused_before_any_work(kwargs, message):
    from maskfuzz.fuzz.testing import defects

    with pytest.raises(ValueError, match=message):
        defects(lambda **kw: pytest.fail("ran"), **kwargs)

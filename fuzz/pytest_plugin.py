"""The pytest plugin (entry point `maskfuzz`): the fixture `maskfuzz_invariants`, which is
`maskfuzz.fuzz.testing.assert_invariants` (imported when a test asks for it, so the plugin costs
nothing in a run that does not)."""

from __future__ import annotations

import pytest


@pytest.fixture
def maskfuzz_invariants():
    """`check(fn, contract="compressed", **kwargs)`: AssertionError naming each broken promise of `fn`."""
    from maskfuzz.fuzz.testing import assert_invariants

    return assert_invariants

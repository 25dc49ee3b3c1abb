"""Fuzzing profiles: how long and how random a run is.

    dev      local work: 200 examples per target, random seeds
    ci       the default test run: 40 examples, derandomized (the same cases every run)
    nightly  the nightly job: 20 minutes per target in batches of fresh seeds, up to 100,000 examples

Select with `--profile NAME` or the MASKFUZZ_PROFILE environment variable (the option wins);
`--max-examples` and `--budget` override a profile's numbers. The same names are registered as
Hypothesis settings profiles, so `pytest --hypothesis-profile=ci` uses the matching settings.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from hypothesis import HealthCheck, settings

ENV = "MASKFUZZ_PROFILE"


@dataclass(frozen=True)
class Profile:
    name: str
    max_examples: int
    budget: float | None  # seconds per target, None = stop at max_examples
    derandomize: bool


PROFILES = {
    "dev": Profile("dev", 200, None, False),
    "ci": Profile("ci", 40, None, True),
    "nightly": Profile("nightly", 100_000, 1200.0, False),
}

for _p in PROFILES.values():
    settings.register_profile(
        _p.name,
        max_examples=min(_p.max_examples, 1000),
        derandomize=_p.derandomize,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


def select(name: str | None = None, env: dict | None = None) -> Profile:
    """The profile named by `name`, else by MASKFUZZ_PROFILE, else `dev`; ValueError if unknown."""
    env = os.environ if env is None else env
    chosen = name or env.get(ENV) or "dev"
    if chosen not in PROFILES:
        raise ValueError(f"unknown profile {chosen!r}; choose one of {', '.join(PROFILES)}")
    return PROFILES[chosen]

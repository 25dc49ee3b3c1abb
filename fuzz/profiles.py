"""Fuzzing profiles: how long and how random a run is.

    dev      local work: 200 examples per target, random seeds
    ci       the default test run: 40 examples, derandomized (the same cases every run)
    nightly  the nightly job: 20 minutes of fuzzing per run in batches of fresh seeds, split evenly across the
             run's entries (`run_share`), up to 100,000 examples each

Select with `--profile NAME` or the MASKFUZZ_PROFILE environment variable (the option wins);
`--max-examples` and `--budget` override a profile's numbers. A budget is a run's, never an entry's: a night
fuzzes one target pin per job of the workflow, and a pin may register dozens of entries (verl 0.9.1: 41), so a
budget per entry would put the job's wall time at entries x budget / workers, past the job's time limit. The same
names are registered as Hypothesis settings profiles, so `pytest --hypothesis-profile=ci` uses the matching settings.
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
    budget: float | None  # seconds of fuzzing per run (see run_share), None = stop at max_examples
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


def run_share(total: float, jobs: int, entries: int) -> float:
    """Seconds of fuzzing each of `entries` entries gets from a run budget of `total` seconds over `jobs` workers:
    total x min(jobs, entries) / entries, at least a second. The run's fuzzing then takes about `total` of wall
    time (plus set-up and shrinking), whatever the number of entries."""
    if total < 0 or jobs < 1 or entries < 0:
        raise ValueError(f"run_share needs total >= 0, jobs >= 1, entries >= 0; got {total}, {jobs}, {entries}")
    return max(1.0, total * min(jobs, max(1, entries)) / max(1, entries))


def select(name: str | None = None, env: dict | None = None) -> Profile:
    """The profile named by `name`, else by MASKFUZZ_PROFILE, else `dev`; ValueError if unknown."""
    env = os.environ if env is None else env
    chosen = name or env.get(ENV) or "dev"
    if chosen not in PROFILES:
        raise ValueError(f"unknown profile {chosen!r}; choose one of {', '.join(PROFILES)}")
    return PROFILES[chosen]

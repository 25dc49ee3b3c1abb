"""argparse types for counts and durations: a bad value is a usage error before any work starts
(`--max-examples -1` once exited 0 with nothing checked, `--max-examples 0` silently meant the profile's)."""

from __future__ import annotations

import argparse


def positive_int(text: str) -> int:
    """An integer >= 1 (a count of examples, jobs, runs, cases)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {value}")
    return value


def positive_float(text: str) -> float:
    """A finite number of seconds > 0 (a budget, a timeout)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a finite number of seconds > 0, got {text}")
    return value

"""Every registered entry runs once at every default pin, with each value of each of its options, on one
regular clean case: an exception there is a tool error (a mode, option or function the code at that pin lacks,
or an adapter that calls it wrongly), which `maskfuzz fuzz` would otherwise file as a crash finding. An entry
absent at a pin is a skip with its reason, printed, never a pass."""

from __future__ import annotations

import re

import pytest

from maskfuzz.fuzz.semantics import clean_cases
from maskfuzz.oracles.options import resolve
from maskfuzz.targets.registry import registry
from maskfuzz.targets.runtime.session import SetupError, Skip, open_target

DEFAULT_PINS = [(spec.id, pin.rev) for spec in registry().values() for pin in spec.default_pins]


def _regular_case(declared):
    """A clean case in the api domain whose every row trains a token, several rows if any, at gamma 0.9 and
    lam 0.95: no degenerate input (gamma * lam = 0 crashes torchrl's vectorised GAE, a defect of its own)."""
    cases = [c for c in clean_cases(declared, 8, 0) if bool(c.trainable.any(dim=1).all())]
    best = max(cases, key=lambda c: c.shape[0], default=None)
    return None if best is None else best.replace(gamma=0.9, lam=0.95)


@pytest.mark.network
@pytest.mark.parametrize("target,pin", DEFAULT_PINS, ids=[f"{t}@{p}" for t, p in DEFAULT_PINS])
def test_every_entry_runs_at_its_default_pin_with_every_option_value(target, pin, capsys):
    spec = registry()[target]
    errors, skipped, ran = [], [], 0
    for i, entry in enumerate(spec.entries):
        label = f"{target}{'' if i == 0 else ':' + entry}@{pin}"
        try:
            with open_target(label, {}, "cpu", 120) as h:
                d = h.declared
                case = _regular_case(d)
                assert case is not None, f"{label}: no clean case where every row trains a token"
                configs = [{}] + [{o.name: v} for o in d.options for v in o.values if v != o.default]
                for cfg in configs:
                    c = case.replace(options=resolve(tuple(d.options), cfg)) if d.options else case
                    try:
                        h.run(c)
                        ran += 1
                    except Exception as exc:  # noqa: BLE001 - every one is reported below
                        text = getattr(exc, "detail", "") or f"{type(exc).__name__}: {exc}"
                        if not any(re.search(p, text) for p in d.documented_errors):
                            errors.append(f"{label} options {cfg or 'default'}: {text[:300]}")
        except Skip as exc:
            skipped.append(f"{label}: {exc}")
        except SetupError as exc:
            pytest.skip(f"{target}@{pin} cannot be set up here (no wheel in the cache and no index?): {exc}")
    with capsys.disabled():
        for line in skipped:
            print(f"\n  skipped (absent at this pin): {line[:220]}", end="")
    assert ran > 0, f"{target}@{pin}: no entry ran"
    assert not errors, "tool errors (fix the adapter or skip the entry at this pin):\n" + "\n".join(errors)

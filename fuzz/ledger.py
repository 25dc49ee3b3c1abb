"""The known-findings ledger (`corpus/ledger.json`): what each corpus entry is expected to do at
a pin, and why. Strict expected-failure semantics, applied by `fuzz.replay.classify`:

    expected "fails", it fails    -> xfail  (as expected)
    expected "fails", it passes   -> fixed  (a failure of the replay: update the ledger)
    no expectation, it fails      -> fail   (a new or re-opened bug)
    no expectation, it passes     -> pass

Format (version 1):

    {
      "format": "maskfuzz-ledger",
      "version": 1,
      "entries": {
        "<entry id>": {
          "<target[:entry]>@<pin>": {"expect": "fails", "reason": "why; upstream issue"},
          "<target[:entry]>@<pin>": {"expect": "passes", "reason": "fixed by <commit>"}
        }
      }
    }

"passes" is the default and need not be written; writing it adds that pin to the pins the entry
is replayed at (a regression check that the fix stays). A pin matches the pin as asked, the
resolved pin, or, for commit hashes, a prefix of at least 7 hex digits of either.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from maskfuzz.fuzz.corpus_codec import CorpusError, dumps, parse_json

FORMAT = "maskfuzz-ledger"
VERSION = 1
EXPECTS = ("fails", "passes")
_HASH = re.compile(r"[0-9a-f]{7,40}")


@dataclass(frozen=True)
class Expectation:
    expect: str  # "fails" | "passes"
    reason: str

    @property
    def fails(self) -> bool:
        return self.expect == "fails"


def split_key(key: str) -> tuple[str, str]:
    """'torchrl:vec@0.14.1' -> ('torchrl:vec', '0.14.1')."""
    target, sep, pin = key.partition("@")
    if not sep or not target or not pin:
        raise ValueError(f"expected TARGET@PIN (e.g. verl@0.4.1), got {key!r}")
    return target, pin


def _pin_matches(written: str, pin: str, resolved: str | None) -> bool:
    if written in (pin, resolved):
        return True
    for other in (pin, resolved):
        if (
            other
            and _HASH.fullmatch(written)
            and _HASH.fullmatch(other)
            and (other.startswith(written) or written.startswith(other))
        ):
            return True
    return False


@dataclass
class Ledger:
    """entry id -> {'target@pin': Expectation}."""

    entries: dict[str, dict[str, Expectation]] = field(default_factory=dict)
    path: Path | None = None

    @classmethod
    def load(cls, path: Path | str) -> Ledger:
        """Read a ledger; a missing file is an empty ledger. CorpusError naming file and field."""
        path = Path(path)
        if not path.exists():
            return cls(path=path)
        try:
            return cls(entries=_entries_from_json(parse_json(path.read_bytes())), path=path)
        except CorpusError as exc:
            raise exc.at(path) from None
        except OSError as exc:
            raise CorpusError(f"cannot read: {exc.strerror or exc}", path) from None

    def expectation(self, entry_id: str, key: str, pin: str, resolved: str | None = None) -> Expectation | None:
        """What the ledger says of entry `entry_id` on target `key` ('verl', 'torchrl:vec') at `pin`."""
        for written, exp in self.entries.get(entry_id, {}).items():
            w_key, w_pin = split_key(written)
            if w_key == key and _pin_matches(w_pin, pin, resolved):
                return exp
        return None

    def pins(self, entry_id: str, key: str) -> list[str]:
        """The pins the ledger names for entry `entry_id` on target `key`, in file order."""
        return [split_key(w)[1] for w in self.entries.get(entry_id, {}) if split_key(w)[0] == key]

    def to_json(self) -> dict:
        return {
            "format": FORMAT,
            "version": VERSION,
            "entries": {
                i: {k: {"expect": e.expect, "reason": e.reason} for k, e in pins.items()}
                for i, pins in self.entries.items()
            },
        }

    def save(self, path: Path | str | None = None) -> Path:
        path = Path(path or self.path)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(dumps(self.to_json()), encoding="utf-8")
        os.replace(tmp, path)
        return path


def _entries_from_json(d: object) -> dict[str, dict[str, Expectation]]:
    if not isinstance(d, dict):
        raise CorpusError(f"expected a JSON object at the top level, got {type(d).__name__}")
    if d.get("format") != FORMAT:
        raise CorpusError(f"expected {FORMAT!r}, got {d.get('format')!r}", field="format")
    version = d.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise CorpusError(f"expected a positive integer, got {version!r}", field="version")
    if version > VERSION:
        raise CorpusError(
            f"version {version} is newer than this maskfuzz reads ({VERSION}): upgrade maskfuzz", field="version"
        )
    raw = d.get("entries")
    if not isinstance(raw, dict):
        raise CorpusError(f"expected an object of entry id -> pins, got {type(raw).__name__}", field="entries")
    out: dict[str, dict[str, Expectation]] = {}
    for entry_id, pins in raw.items():
        where = f"entries.{entry_id}"
        if not re.fullmatch(r"[0-9a-f]{16}", entry_id):
            raise CorpusError("an entry id is 16 hex digits (the 'id' of a corpus file)", field=where)
        if not isinstance(pins, dict):
            raise CorpusError(
                f"expected an object of 'target@pin' -> expectation, got {type(pins).__name__}", field=where
            )
        out[entry_id] = {}
        for key, exp in pins.items():
            here = f"{where}.{key}"
            try:
                split_key(key)
            except ValueError as exc:
                raise CorpusError(str(exc), field=here) from None
            if not isinstance(exp, dict) or exp.get("expect") not in EXPECTS:
                raise CorpusError(
                    f'expected {{"expect": "fails" | "passes", "reason": "..."}}, got {exp!r}', field=here
                )
            reason = exp.get("reason")
            if not isinstance(reason, str) or not reason.strip():
                raise CorpusError("every expectation needs a non-empty 'reason'", field=f"{here}.reason")
            extra = set(exp) - {"expect", "reason"}
            if extra:
                raise CorpusError(f"unknown key(s) {sorted(extra)}", field=here)
            out[entry_id][key] = Expectation(exp["expect"], reason)
    return out

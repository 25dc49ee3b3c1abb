"""The corpus store: one shrunk finding per JSON file under a folder, kept once per defect.

A file lives at `<root>/<target>/<property>-<id>.json` (its format, `maskfuzz-corpus`, is
`fuzz.corpus_codec`). The corpus holds defects, one entry each: `record` de-duplicates a triaged
finding by (target, root cause), an untriaged one by (target, property, signature) (both
`fuzz.signature.identity`), and keeps the smallest case of each identity (`case_size`). A ledger
(`<root>/ledger.json`, `fuzz.ledger`) names the triaged entries, which are never replaced.

Loading parses JSON only (no pickle, no torch.load): a corrupt, truncated or newer file raises
`CorpusError` naming the file and the field, and is never rewritten.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
import warnings
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from maskfuzz.fuzz.corpus_codec import CorpusError, Entry, Found, dumps, entry_from_json, parse_json
from maskfuzz.fuzz.evidence import reach_evidence
from maskfuzz.fuzz.ledger import Ledger
from maskfuzz.fuzz.signature import identity
from maskfuzz.oracles.case import Case
from maskfuzz.targets.runtime.cache import lock as cache_lock  # an fcntl lock in the maskfuzz cache, released if we die

LEDGER_NAME = "ledger.json"


def case_size(case: Case) -> tuple[int, int]:
    """How big a counterexample is, smaller first: (B * T, number of non-zero floats)."""
    b, t = case.shape
    nnz = sum(int((x != 0).sum()) for x in (case.token_rewards, case.values, case.score))  # NaN != 0
    return (b * t, nnz)


# ---------------------------------------------------------------------------------------------
# Files: read one, write one atomically, find them under folders.
# ---------------------------------------------------------------------------------------------
def load(path: Path | str) -> Entry:
    """Read one corpus file. Raises CorpusError naming the file (and the field); never writes."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise CorpusError(f"cannot read: {exc.strerror or exc}", path) from None
    try:
        entry = entry_from_json(parse_json(data))
    except CorpusError as exc:
        raise exc.at(path) from None
    return _with_path(entry, path)


def _with_path(entry: Entry, path: Path) -> Entry:
    object.__setattr__(entry, "path", path)
    return entry


def save(entry: Entry, root: Path | str) -> Path:
    """Write `entry` to `<root>/<target>/<property>-<id>.json` atomically and return the path.

    An existing file of the same id is left alone (same content by construction); an unreadable
    one is never overwritten (CorpusError).
    """
    path = Path(root) / entry.relpath
    if path.exists():
        load(path)  # raises CorpusError for a corrupt file: keep it for a human to look at
        return _with_path(entry, path).path
    return _write(entry, path)


def rewrite(entry: Entry) -> Path:
    """Write `entry` over its own file (`entry.path`, read before: the same id) atomically, e.g. with a
    validation recorded; CorpusError when the file is not that entry's."""
    if entry.path is None:
        raise CorpusError("the entry was not loaded from a file, so there is nothing to rewrite")
    if load(entry.path).id != entry.id:
        raise CorpusError(f"holds another entry than {entry.id}", entry.path)
    return _write(entry, entry.path)


def _write(entry: Entry, path: Path) -> Path:
    where = machine_path(entry.to_json())
    if where is not None:
        raise CorpusError(
            f"holds a path of the machine that wrote it ({where[1]!r}): store paths relative", field=where[0]
        )
    text = dumps(entry.to_json())
    entry_from_json(parse_json(text))  # what is written must read back
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)  # atomic: a reader never sees half a file
    return _with_path(entry, path).path


_ABSOLUTE = re.compile(r"^(/|[A-Za-z]:[\\/]|~)")


def machine_path(data: Any, where: str = "") -> tuple[str, str] | None:
    """(field, value) of the first string in `data` that is an absolute path of some machine, or None: a
    corpus entry travels between machines, so what it records must not point into one."""
    if isinstance(data, str):
        return (where, data) if _ABSOLUTE.match(data) else None
    items = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, list) else ()
    for k, v in items:
        found = machine_path(v, f"{where}.{k}" if where else str(k))
        if found is not None:
            return found
    return None


def discover(paths: Iterable[Path | str]) -> list[Path]:
    """Corpus files under `paths` (files as given; directories searched recursively for *.json,
    skipping the ledger and hidden files), sorted, without repeats."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            out.extend(
                f
                for f in sorted(p.rglob("*.json"))
                if f.name != LEDGER_NAME and not any(s.startswith(".") for s in f.relative_to(p).parts)
            )
        else:
            out.append(p)
    seen: set[Path] = set()
    return [f for f in out if not (f.resolve() in seen or seen.add(f.resolve()))]


def load_all(paths: Iterable[Path | str]) -> tuple[list[Entry], list[CorpusError]]:
    """Every readable entry under `paths`, and one CorpusError per file that is not."""
    entries, errors = [], []
    for f in discover(paths):
        try:
            entries.append(load(f))
        except CorpusError as exc:
            errors.append(exc)
    return entries, errors


# ---------------------------------------------------------------------------------------------
# The store (after Hypothesis' database.py: save / fetch / delete) and de-duplicating `record`.
# ---------------------------------------------------------------------------------------------
class Store(ABC):
    """Where corpus entries live. `fetch` yields the entries of one target key (of one property)."""

    @abstractmethod
    def save(self, entry: Entry) -> Path: ...

    @abstractmethod
    def fetch(self, key: str, prop: str | None = None) -> Iterator[Entry]: ...

    @abstractmethod
    def delete(self, entry: Entry) -> None: ...

    def protected(self) -> set[str]:
        """Ids that must not be replaced (triaged in a ledger)."""
        return set()

    def lock(self, timeout: float = 120.0) -> AbstractContextManager:
        """Held by `record` around its read-compare-write, so parallel fuzzers do not race."""
        return nullcontext()


class DirectoryStore(Store):
    """The corpus directory: `<root>/<target>/<property>-<id>.json`, `<root>/ledger.json`."""

    def __init__(self, root: Path | str):
        self.root = Path(root)

    def save(self, entry: Entry) -> Path:
        return save(entry, self.root)

    def fetch(self, key: str, prop: str | None = None) -> Iterator[Entry]:
        target = key.split(":", 1)[0]
        for f in sorted((self.root / target).glob(f"{prop}-*.json" if prop else "*.json")):
            try:
                entry = load(f)
            except CorpusError as exc:  # a corrupt neighbour must not stop a fuzzing night
                warnings.warn(f"skipping unreadable corpus file: {exc}", stacklevel=2)
                continue
            if entry.key == key and prop in (None, entry.property):
                yield entry

    def delete(self, entry: Entry) -> None:
        (self.root / entry.relpath).unlink(missing_ok=True)

    def lock(self, timeout: float = 120.0) -> AbstractContextManager:
        key = hashlib.sha256(str(self.root.resolve()).encode()).hexdigest()[:16]
        return cache_lock(f"corpus-{key}", timeout=timeout)

    def protected(self) -> set[str]:
        path = self.root / LEDGER_NAME
        if not path.exists():
            return set()
        return set(Ledger.load(path).entries)


@dataclass(frozen=True)
class Recorded:
    """What `record` did: action 'new' | 'replaced' | 'duplicate'; `path` is the entry that now
    stands for the signature; `replaced` the file it superseded (action 'replaced')."""

    action: str
    path: Path
    entry: Entry
    replaced: Path | None = None


def entry_from_finding(finding: Any, found: Found | None = None) -> Entry:
    """An Entry from an engine finding: any object with .target, .pin, .resolved, .property,
    .case, .verdict, .also, .seed (optional: .entry_point / .entry, .device). `.target` may be
    'torchrl:vec' or an object with .target / .entry; `.pin` a string or an object with .rev."""
    target, entry_point = finding.target, getattr(finding, "entry_point", None) or getattr(finding, "entry", None)
    if not isinstance(target, str):
        target, entry_point = target.target, getattr(target, "entry", None) or entry_point
    if ":" in target:
        target, entry_point = target.split(":", 1)
    pin = finding.pin if isinstance(finding.pin, str) else finding.pin.rev
    device = getattr(finding, "device", "cpu")
    return Entry(
        target=target,
        pin=str(pin),
        property=finding.property,
        case=finding.case,
        verdict=finding.verdict,
        entry_point=None if entry_point in (None, "default") else entry_point,
        resolved=getattr(finding, "resolved", None),
        also=tuple(p for p in (getattr(finding, "also", ()) or ()) if p != finding.property),
        found=found or Found.now(getattr(finding, "seed", None), device),
        triage=_finding_triage(finding),
        witness=None if getattr(finding, "witness", None) is finding.case else getattr(finding, "witness", None),
    )


def _finding_triage(finding: Any) -> dict | None:
    if not getattr(finding, "mechanism", ""):
        return None
    keys = ("defect", "mechanism", "evidence", "severity", "reach", "reach_how")
    out = {k: getattr(finding, k, "") for k in keys}
    if getattr(finding, "judged", ""):  # no float64 reference at the pin: the kind's invariants only
        out["judged"] = finding.judged
    promise = getattr(finding, "promise", None)
    if promise is not None:
        out |= promise.to_json() | {"reach_evidence": reach_evidence(out["reach"])}
    return out


def record(finding: Any, root: Path | str | Store) -> Recorded:
    """Store a finding unless one with the same identity (`identity`: the target and root cause of a
    triaged finding) is there already.

    - no entry with that identity: write it ('new');
    - one with a larger case (by `case_size`: fewer B*T, then fewer non-zero floats) that no
      ledger names: write the new one and delete the old ('replaced');
    - otherwise keep what is there ('duplicate'; the path is the existing entry's).
    A triaged entry (its id is in the ledger) is never replaced: its id is what the ledger means.
    """
    store = root if isinstance(root, Store) else DirectoryStore(root)
    entry = finding if isinstance(finding, Entry) else entry_from_finding(finding)
    with store.lock():
        return _record(entry, store)


def _record(entry: Entry, store: Store) -> Recorded:
    ident = identity(entry)
    same = [e for e in store.fetch(entry.key) if e.id == entry.id or identity(e) == ident]
    if not same:
        return Recorded("new", store.save(entry), entry)
    best = min(same, key=lambda e: case_size(e.case))
    if best.id == entry.id or case_size(entry.case) >= case_size(best.case):
        return Recorded("duplicate", best.path or store.save(best), best)
    try:
        triaged = store.protected()
    except CorpusError as exc:  # cannot tell which entries are triaged: change nothing
        warnings.warn(f"not replacing a corpus entry, the ledger is unreadable: {exc}", stacklevel=2)
        return Recorded("duplicate", best.path or store.save(best), best)
    if any(e.id in triaged for e in same):
        return Recorded("duplicate", best.path or store.save(best), best)
    path = store.save(entry)
    for old in same:
        store.delete(old)
    return Recorded("replaced", path, entry, best.path)


if __name__ == "__main__":  # pragma: no cover - `python -m maskfuzz.fuzz.corpus FILE...` validates files
    bad = 0
    for f in discover(sys.argv[1:] or ["corpus"]):
        try:
            e = load(f)
            print(f"ok   {f}  {e.key}@{e.pin} {e.property} {e.signature}")
        except CorpusError as exc:
            bad += 1
            print(f"BAD  {exc}")
    sys.exit(2 if bad else 0)

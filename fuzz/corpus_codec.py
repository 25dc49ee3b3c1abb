"""The corpus file format: a case or an entry <-> JSON, bit-exact, and the strict reading of a file.

Format `maskfuzz-corpus`, version 3 (versions 1 and 2 still load; `corpus/README.md` is the full
description). An entry holds:

    the canonical case   masks as "0"/"1" strings per row, floats bit-exact (see `encode_float`)
    where it failed      target, entry point, the pin as asked and as resolved
    what failed          the property, the verdict (output, positions, expected, observed,
                         message), the other failing properties
    how it was found     seed, date, Hypothesis / torch / maskfuzz versions, device

`id` is a hash of the case content, the target (with its entry point) and the property, so the
same counterexample found twice has one name; `signature` is `fuzz.signature.signature`.

Reading parses JSON only (no pickle, no torch.load): a corrupt, truncated or newer file raises
`CorpusError` naming the file and the field. Where files live and how findings are kept is
`fuzz.corpus` (the store).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
import struct
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from maskfuzz.fuzz import evidence
from maskfuzz.fuzz.signature import signature
from maskfuzz.oracles.case import DTYPES, Case, CaseError, quantize
from maskfuzz.oracles.kinds import ALL_KINDS, outputs
from maskfuzz.oracles.kinds import ALL_PROPERTIES as PROPERTIES
from maskfuzz.oracles.verdict import Verdict

FORMAT = "maskfuzz-corpus"
# 2 adds "triage" (defect, mechanism, severity, reach, witness); 3 adds the promise a defect breaks to the triage
# ("promise", "promise_text", "reach_evidence"); version 1 and 2 files still load
VERSION = 3
REACHES = ("pipeline", "api")
SEVERITY_LEVELS = ("high", "medium", "low")


def _all_outputs() -> tuple[str, ...]:
    return tuple(dict.fromkeys(["advantages", "returns", "", *(o for k in ALL_KINDS for o in outputs(k))]))


OUTPUTS = _all_outputs()  # every output name of every kind (GAE / returns first), "" for a crash
STATUSES = ("fail", "pass", "n/a")

_U64 = (1 << 64) - 1
_EXP = 0x7FF0000000000000
_NAN = 0x7FF8000000000000  # what float("nan") is; any other NaN is written as hex bits
_INF = 0x7FF0000000000000
_NINF = 0xFFF0000000000000
_HEX = re.compile(r"0x[0-9a-fA-F]{16}")


class CorpusError(ValueError):
    """An unreadable corpus (or ledger) file: `path` and `field` say where, the message says why."""

    def __init__(self, message: str, path: Path | str | None = None, field: str | None = None):
        self.message = message
        self.path = Path(path) if path is not None else None
        self.field = field
        super().__init__(self._text())

    def _text(self) -> str:
        where = f"{self.path}: " if self.path is not None else ""
        what = f"field {self.field!r}: " if self.field else ""
        return f"{where}{what}{self.message}"

    def at(self, path: Path | str) -> CorpusError:
        """The same error, naming `path` (used when a decoder without a file raised it)."""
        return CorpusError(self.message, path, self.field)


# ---------------------------------------------------------------------------------------------
# Floats: finite as JSON numbers (repr round-trips float64 exactly), non-finite as strings.
# ---------------------------------------------------------------------------------------------
def _bits(x: float) -> int:
    return struct.unpack("<Q", struct.pack("<d", x))[0]


def encode_bits(u: int) -> float | str:
    """The JSON value of the float64 with bit pattern `u` (0 <= u < 2**64).

    Finite: the float itself (json writes repr, which reads back to the same bits, -0.0 included).
    +inf / -inf / the default quiet NaN: "inf" / "-inf" / "nan". Any other NaN (a sign bit or a
    payload): its 16 hex digits, "0x7ff8000000000001", so nothing is lost.
    """
    if (u & _EXP) != _EXP:
        return struct.unpack("<d", struct.pack("<Q", u))[0]
    return {_INF: "inf", _NINF: "-inf", _NAN: "nan"}.get(u) or f"0x{u:016x}"


def encode_float(x: float) -> float | str:
    return encode_bits(_bits(float(x)))


def decode_bits(v: Any, where: str) -> int:
    """The float64 bit pattern of a JSON value written by `encode_bits` (or a plain JSON integer)."""
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        raise CorpusError(
            f"expected a number or one of 'nan', 'inf', '-inf', '0x<16 hex digits>', got {v!r}", field=where
        )
    if isinstance(v, str):
        named = {"nan": _NAN, "inf": _INF, "-inf": _NINF}.get(v)
        if named is not None:
            return named
        if _HEX.fullmatch(v):
            return int(v, 16)
        raise CorpusError(
            f"{v!r} is not a float: expected a number or 'nan', 'inf', '-inf', '0x<16 hex digits>'", field=where
        )
    if isinstance(v, int):
        if float(v) != v:
            raise CorpusError(f"integer {v} is not exactly a float64", field=where)
        v = float(v)
    if not math.isfinite(v):  # e.g. 1e999 in the file: json reads it as inf
        raise CorpusError("number out of float64 range (write 'inf' / '-inf' for infinities)", field=where)
    return _bits(v)


def decode_float(v: Any, where: str) -> float:
    return struct.unpack("<d", struct.pack("<Q", decode_bits(v, where)))[0]


def _tensor_rows(t: torch.Tensor) -> list:
    """float64 [B, T] or [B] -> nested JSON values, bit-exact (read through an int64 view)."""
    ints = t.detach().to("cpu").contiguous().view(torch.int64)
    if ints.dim() == 1:
        return [encode_bits(i & _U64) for i in ints.tolist()]
    return [[encode_bits(i & _U64) for i in row] for row in ints.tolist()]


def _signed(u: int) -> int:
    return u - (1 << 64) if u >= (1 << 63) else u


def _floats(v: Any, where: str, shape: tuple[int, ...]) -> torch.Tensor:
    """Nested JSON values -> float64 tensor of `shape`, built from the bit patterns."""
    if len(shape) == 1:
        _list(v, where, shape[0])
        bits = [_signed(decode_bits(x, f"{where}[{i}]")) for i, x in enumerate(v)]
    else:
        _list(v, where, shape[0])
        bits = []
        for b, row in enumerate(v):
            _list(row, f"{where}[{b}]", shape[1])
            bits.extend(_signed(decode_bits(x, f"{where}[{b}][{t}]")) for t, x in enumerate(row))
    return torch.tensor(bits, dtype=torch.int64).view(torch.float64).reshape(shape)


def _masks(v: Any, where: str, shape: tuple[int, int]) -> torch.Tensor:
    _list(v, where, shape[0])
    rows = []
    for b, row in enumerate(v):
        if not isinstance(row, str) or len(row) != shape[1] or set(row) - {"0", "1"}:
            raise CorpusError(
                f"row {b} must be a string of {shape[1]} characters '0'/'1', got {row!r}", field=f"{where}[{b}]"
            )
        rows.append([c == "1" for c in row])
    return torch.tensor(rows, dtype=torch.bool).reshape(shape)


def _list(v: Any, where: str, n: int | None = None) -> list:
    if not isinstance(v, list):
        raise CorpusError(f"expected a list, got {type(v).__name__}", field=where)
    if n is not None and len(v) != n:
        raise CorpusError(f"expected {n} items (from 'shape'), got {len(v)}", field=where)
    return v


def _get(d: dict, key: str, kind: type | tuple, where: str = "", optional: bool = False) -> Any:
    name = f"{where}.{key}" if where else key
    if key not in d:
        if optional:
            return None
        raise CorpusError("missing", field=name)
    v = d[key]
    if optional and v is None:
        return None
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if (isinstance(v, bool) and bool not in kinds) or not isinstance(v, kinds):
        want = " or ".join(k.__name__ for k in kinds)
        raise CorpusError(f"expected {want}, got {type(v).__name__} {v!r}"[:200], field=name)
    return v


# ---------------------------------------------------------------------------------------------
# The case.
# ---------------------------------------------------------------------------------------------
def case_to_json(case: Case) -> dict:
    """The canonical case as JSON data: masks as '0'/'1' strings per row, floats bit-exact.
    (`case.meta` is not part of the canonical content and is not written.)"""
    return {
        "dtype": case.dtype,
        "gamma": encode_float(case.gamma),
        "lam": encode_float(case.lam),
        "shape": list(case.shape),
        "attention": ["".join("1" if x else "0" for x in row) for row in case.attention.tolist()],
        "trainable": ["".join("1" if x else "0" for x in row) for row in case.trainable.tolist()],
        "token_rewards": _tensor_rows(case.token_rewards),
        "values": _tensor_rows(case.values),
        "score": _tensor_rows(case.score),
        **({"group": case.group.tolist()} if case.group is not None else {}),
        **({"extra": {k: _tensor_rows(v) for k, v in case.extra.items()}} if case.extra else {}),
        **({"split": case.split.tolist()} if case.split is not None else {}),
        **({"ranks": case.ranks} if case.ranks != 1 else {}),
        **(
            {"truncated": case.truncated.tolist(), "bootstrap": _tensor_rows(case.bootstrap_values())}
            if case.truncated is not None and bool(case.truncated.any())
            else {}
        ),
        **({"options": dict(sorted(case.options.items()))} if case.options else {}),
    }


def case_from_json(d: Any, where: str = "case") -> Case:
    """The `Case` written by `case_to_json`, bit for bit. Raises CorpusError naming the field.

    The floats must already be numbers of the case's dtype (the file shows exactly what a target
    receives); a hand-edited 0.1 in a bfloat16 case is rejected rather than silently rounded.
    """
    if not isinstance(d, dict):
        raise CorpusError(f"expected an object, got {type(d).__name__}", field=where)
    dtype = _get(d, "dtype", str, where)
    if dtype not in DTYPES:
        raise CorpusError(f"{dtype!r} is not one of {sorted(DTYPES)}", field=f"{where}.dtype")
    shape = _list(_get(d, "shape", list, where), f"{where}.shape", 2)
    if not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in shape):
        raise CorpusError(f"expected two positive integers [B, T], got {shape!r}", field=f"{where}.shape")
    b, t = shape
    fields_ = {
        "attention": _masks(_get(d, "attention", list, where), f"{where}.attention", (b, t)),
        "trainable": _masks(_get(d, "trainable", list, where), f"{where}.trainable", (b, t)),
        "token_rewards": _floats(_get(d, "token_rewards", list, where), f"{where}.token_rewards", (b, t)),
        "values": _floats(_get(d, "values", list, where), f"{where}.values", (b, t)),
        "score": _floats(_get(d, "score", list, where), f"{where}.score", (b,)),
    }
    extra = _get(d, "extra", dict, where, optional=True) or {}
    for key in extra:
        fields_[key] = _floats(extra[key], f"{where}.extra.{key}", (b, t))
    for key in ("token_rewards", "values", "score", *extra):
        x = fields_[key]
        ok = ~torch.isfinite(x) | (quantize(x, dtype) == x)
        if not ok.all():
            pos = [int(i) for i in (~ok).nonzero()[0].tolist()]
            idx = "".join(f"[{i}]" for i in pos)
            val, near = float(x[tuple(pos)]), float(quantize(x, dtype)[tuple(pos)])
            raise CorpusError(
                f"{val!r} is not a {dtype} number (nearest {near!r}); a case holds exactly what the target receives",
                field=f"{where}.{key}{idx}",
            )
    gamma = decode_float(_get(d, "gamma", (int, float, str), where), f"{where}.gamma")
    lam = decode_float(_get(d, "lam", (int, float, str), where), f"{where}.lam")
    group = _get(d, "group", list, where, optional=True)
    if group is not None:
        group = _list(group, f"{where}.group", b)
        if not all(isinstance(g, int) and not isinstance(g, bool) for g in group):
            raise CorpusError(f"expected {b} integer group ids, got {group!r}", field=f"{where}.group")
        group = torch.tensor(group, dtype=torch.int64)
    split = _get(d, "split", list, where, optional=True)
    if split is not None:
        split = _list(split, f"{where}.split", b)
        if not all(isinstance(g, int) and not isinstance(g, bool) and g >= 0 for g in split):
            raise CorpusError(f"expected {b} micro-batch ids >= 0, got {split!r}", field=f"{where}.split")
        split = torch.tensor(split, dtype=torch.int64)
    ranks = _get(d, "ranks", int, where, optional=True) or 1
    truncated = _get(d, "truncated", list, where, optional=True)
    bootstrap = None
    if truncated is not None:
        truncated = _list(truncated, f"{where}.truncated", b)
        if not all(isinstance(x, bool) for x in truncated):
            raise CorpusError(
                f"expected {b} booleans (true: the row was cut by the length limit)", field=f"{where}.truncated"
            )
        truncated = torch.tensor(truncated, dtype=torch.bool)
        raw = _get(d, "bootstrap", list, where, optional=True)
        bootstrap = torch.zeros(b, dtype=torch.float64) if raw is None else _floats(raw, f"{where}.bootstrap", (b,))
        if not (quantize(bootstrap, dtype) == bootstrap).all():
            raise CorpusError(f"a bootstrap value is not a {dtype} number", field=f"{where}.bootstrap")
    options = _get(d, "options", dict, where, optional=True) or {}
    tensors = {k: fields_.pop(k) for k in list(extra)}
    try:
        return Case(
            **fields_,
            gamma=gamma,
            lam=lam,
            dtype=dtype,
            group=group,
            extra=tensors,
            split=split,
            ranks=ranks,
            truncated=truncated,
            bootstrap=bootstrap,
            options=options,
        )
    except CaseError as exc:
        raise CorpusError(f"not a valid case: {exc}", field=where) from None


# ---------------------------------------------------------------------------------------------
# The entry.
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Found:
    """How a finding was found (informative; not part of the id)."""

    seed: int | str | None = None
    date: str = ""
    hypothesis: str | None = None
    torch: str | None = None
    maskfuzz: str | None = None
    device: str = "cpu"

    @classmethod
    def now(cls, seed: int | str | None = None, device: str = "cpu") -> Found:
        return cls(
            seed=seed,
            date=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            hypothesis=_version("hypothesis"),
            torch=torch.__version__,
            maskfuzz=_version("maskfuzz"),
            device=device,
        )


def _version(dist: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(dist)
    except Exception:  # noqa: BLE001 - informative only
        return None


def target_key(target: str, entry_point: str | None) -> str:
    """'verl' or 'torchrl:vec': the target with its entry point (None / 'default' are omitted)."""
    return f"{target}:{entry_point}" if entry_point and entry_point != "default" else target


def entry_id(case: Case, key: str, prop: str) -> str:
    """16 hex digits of sha256 over the canonical case JSON, the target key and the property."""
    blob = json.dumps(
        {"case": case_to_json(case), "target": key, "property": prop}, sort_keys=True, separators=(",", ":")
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


@dataclass(frozen=True, eq=False)
class Entry:
    """One corpus finding. `pin` is the pin as asked (a version, tag, branch or short hash),
    `resolved` what it resolved to (full commit hash or 'NAME==VERSION')."""

    target: str
    pin: str
    property: str
    case: Case
    verdict: Verdict
    entry_point: str | None = None
    resolved: str | None = None
    also: tuple[str, ...] = ()
    found: Found = field(default_factory=Found)
    path: Path | None = None  # where it was loaded from / saved to
    # version 2: the triage when it was found; replay recomputes it at each pin (None: a version 1 file)
    triage: dict | None = None  # defect, mechanism, evidence, severity, reach, reach_how
    witness: Case | None = None  # the pipeline-domain case behind `reach: pipeline`, when not `case`
    bisect: dict | None = None  # a `maskfuzz bisect --json` result recorded with the entry (the repro report shows it)
    validation: dict | None = None  # `maskfuzz validate --record`: the real rollout's verdict (fuzz.evidence)

    @property
    def key(self) -> str:
        return target_key(self.target, self.entry_point)

    @property
    def id(self) -> str:
        return entry_id(self.case, self.key, self.property)

    @property
    def signature(self) -> str:
        return signature(self.property, self.verdict, self.case)

    @property
    def relpath(self) -> Path:
        return Path(self.target) / f"{self.property}-{self.id}.json"

    def to_json(self) -> dict:
        v = self.verdict
        return {
            "format": FORMAT,
            "version": VERSION,
            "id": self.id,
            "target": self.target,
            "entry_point": self.entry_point,
            "pin": self.pin,
            "resolved": self.resolved,
            "property": self.property,
            "also": list(self.also),
            "signature": self.signature,
            "options": dict(sorted(self.case.options.items())),  # the configuration (also in the case)
            "case": case_to_json(self.case),
            "verdict": {
                "status": v.status,
                "output": v.output,
                "message": v.message,
                "positions": [[int(b), int(t)] for b, t in v.positions],
                "expected": [encode_float(x) for x in v.expected],
                "observed": [encode_float(x) for x in v.observed],
            },
            "found": {
                "seed": self.found.seed,
                "date": self.found.date,
                "hypothesis": self.found.hypothesis,
                "torch": self.found.torch,
                "maskfuzz": self.found.maskfuzz,
                "device": self.found.device,
            },
            "triage": None if self.triage is None else dict(self.triage),
            "witness": None if self.witness is None else case_to_json(self.witness),
        } | ({"bisect": self.bisect} if self.bisect is not None else {}) | (
            {"validation": self.validation} if self.validation is not None else {}
        )


def entry_from_json(d: Any) -> Entry:
    """Validate and decode a parsed corpus file. Raises CorpusError naming the field."""
    if not isinstance(d, dict):
        raise CorpusError(f"expected a JSON object at the top level, got {type(d).__name__}")
    fmt = _get(d, "format", str)
    if fmt != FORMAT:
        raise CorpusError(f"expected {FORMAT!r}, got {fmt!r}: not a maskfuzz corpus entry", field="format")
    version = _get(d, "version", int)
    if version > VERSION:
        raise CorpusError(
            f"version {version} is newer than this maskfuzz reads ({VERSION}): upgrade maskfuzz", field="version"
        )
    if version < 1:
        raise CorpusError(f"version {version} is not a valid format version", field="version")
    target = _get(d, "target", str)
    if not re.fullmatch(r"[a-z0-9][a-z0-9_.-]*", target):
        raise CorpusError(f"{target!r} is not a target id", field="target")
    prop = _get(d, "property", str)
    if prop not in PROPERTIES:
        raise CorpusError(f"unknown property {prop!r}; known: {', '.join(PROPERTIES)}", field="property")
    also = _list(_get(d, "also", list), "also")
    for i, p in enumerate(also):
        if p not in PROPERTIES:
            raise CorpusError(f"unknown property {p!r}", field=f"also[{i}]")
    case = case_from_json(d.get("case"), "case")
    verdict = _verdict_from_json(_get(d, "verdict", dict), prop, case)
    fd = _get(d, "found", dict)
    found = Found(
        seed=_get(fd, "seed", (int, str), "found", optional=True),
        date=_get(fd, "date", str, "found"),
        hypothesis=_get(fd, "hypothesis", str, "found", optional=True),
        torch=_get(fd, "torch", str, "found", optional=True),
        maskfuzz=_get(fd, "maskfuzz", str, "found", optional=True),
        device=_get(fd, "device", str, "found"),
    )
    entry = Entry(
        target=target,
        pin=_get(d, "pin", str),
        property=prop,
        case=case,
        verdict=verdict,
        entry_point=_get(d, "entry_point", str, optional=True),
        resolved=_get(d, "resolved", str, optional=True),
        also=tuple(also),
        found=found,
    )
    stored = _get(d, "id", str)
    if stored != entry.id:
        raise CorpusError(
            f"{stored!r} does not match the content (hash {entry.id!r}): the case, target or property was edited; "
            "save the edited entry again (maskfuzz computes the id) instead of editing the file",
            field="id",
        )
    _get(d, "signature", str)  # informative: recomputed on use, so a stale one is not an error
    if version >= 2:
        witness = None if d.get("witness") is None else case_from_json(d["witness"], "witness")
        entry = dataclasses.replace(entry, triage=_triage_from_json(d.get("triage")), witness=witness)
    if d.get("bisect") is not None:
        entry = dataclasses.replace(entry, bisect=_get(d, "bisect", dict))
    if d.get("validation") is not None:
        try:
            entry = dataclasses.replace(entry, validation=evidence.check(d["validation"]))
        except evidence.ValidationError as exc:
            raise CorpusError(str(exc), field=exc.field) from None
    return entry


def _triage_from_json(t: Any) -> dict | None:
    if t is None:
        return None
    if not isinstance(t, dict):
        raise CorpusError(f"expected an object or null, got {type(t).__name__}", field="triage")
    for key, allowed in (("reach", REACHES), ("severity", SEVERITY_LEVELS)):
        if t.get(key) not in allowed:
            raise CorpusError(f"{t.get(key)!r} is not one of {', '.join(allowed)}", field=f"triage.{key}")
    for key in ("defect", "mechanism"):
        _get(t, key, str, "triage")
    for key in ("promise", "promise_text", "judged"):
        if key in t:
            _get(t, key, str, "triage")
    if "promise" in t and not t.get("promise_text", "").strip():
        raise CorpusError("a promise without its words: quote them in promise_text", field="triage.promise_text")
    return dict(t)


def _verdict_from_json(d: dict, prop: str, case: Case) -> Verdict:
    status = _get(d, "status", str, "verdict")
    if status not in STATUSES:
        raise CorpusError(f"expected one of {STATUSES}, got {status!r}", field="verdict.status")
    output = _get(d, "output", str, "verdict")
    if output not in OUTPUTS:
        raise CorpusError(f"expected one of {OUTPUTS}, got {output!r}", field="verdict.output")
    positions = _list(_get(d, "positions", list, "verdict"), "verdict.positions")
    b_max, t_max = case.shape
    for i, p in enumerate(positions):
        ok = isinstance(p, list) and len(p) == 2 and all(isinstance(x, int) and not isinstance(x, bool) for x in p)
        if not ok or not (0 <= p[0] < b_max and 0 <= p[1] < t_max):
            raise CorpusError(
                f"expected [row, position] inside the case's shape {[b_max, t_max]}, got {p!r}",
                field=f"verdict.positions[{i}]",
            )
    numbers = {}
    for key in ("expected", "observed"):
        vals = _list(_get(d, key, list, "verdict"), f"verdict.{key}")
        if vals and len(vals) != len(positions):
            raise CorpusError(f"{len(vals)} numbers for {len(positions)} positions", field=f"verdict.{key}")
        numbers[key] = [decode_float(x, f"verdict.{key}[{i}]") for i, x in enumerate(vals)]
    return Verdict(
        property=prop,
        status=status,
        message=_get(d, "message", str, "verdict"),
        output=output,
        positions=[list(p) for p in positions],
        expected=numbers["expected"],
        observed=numbers["observed"],
    )


# ---------------------------------------------------------------------------------------------
# Text: strict JSON in, pretty JSON out (one row per line, so a diff is reviewable).
# ---------------------------------------------------------------------------------------------
def _no_constant(name: str):
    raise CorpusError(f'non-standard JSON constant {name}; write non-finite floats as "nan", "inf", "-inf"')


def _no_duplicates(pairs: list) -> dict:
    out = {}
    for k, v in pairs:
        if k in out:
            raise CorpusError("appears twice in one object", field=k)
        out[k] = v
    return out


def parse_json(text: str | bytes, path: Path | str | None = None) -> Any:
    """Strict JSON (no NaN/Infinity literals, no duplicate keys); CorpusError naming the file."""
    try:
        if isinstance(text, bytes):
            text = text.decode("utf-8")
        return json.loads(text, parse_constant=_no_constant, object_pairs_hook=_no_duplicates)
    except CorpusError as exc:
        raise exc.at(path) if path is not None else exc
    except UnicodeDecodeError as exc:
        raise CorpusError(f"not UTF-8 text ({exc.reason} at byte {exc.start})", path) from None
    except json.JSONDecodeError as exc:
        raise CorpusError(
            f"not valid JSON (truncated or corrupt?): {exc.msg} at line {exc.lineno} column {exc.colno}", path
        ) from None


def dumps(data: Any) -> str:
    """Pretty JSON: objects one key per line; a list of numbers on one line; a list of lists or of
    strings one item per line (so each row of a case, mask or floats, is one line)."""
    return _pretty(data, 0) + "\n"


def _pretty(v: Any, level: int) -> str:
    pad, inner = "  " * level, "  " * (level + 1)
    if isinstance(v, dict):
        if not v:
            return "{}"
        items = [f"{inner}{json.dumps(k)}: {_pretty(x, level + 1)}" for k, x in v.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(v, list):
        if v and (any(isinstance(x, (list, dict)) for x in v) or all(isinstance(x, str) for x in v)):
            return "[\n" + ",\n".join(inner + _pretty(x, level + 1) for x in v) + "\n" + pad + "]"
        return "[" + ", ".join(_pretty(x, level + 1) for x in v) + "]"
    return json.dumps(v, allow_nan=False, ensure_ascii=False)

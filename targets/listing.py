"""What `maskfuzz targets` shows: every target, its contract, entries, pins and their availability.

`rows()` gives plain data (also the `--json` output); `render()` formats it as text. Availability
is checked without a network (`targets.acquire.available_offline`): a pin is offline when its
code is already in the cache or resolvable from a local --repo.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Mapping

from maskfuzz.targets import discovery
from maskfuzz.targets.registry import TargetSpec, registry
from maskfuzz.targets.runtime import acquire as acquire_mod
from maskfuzz.targets.runtime import cache as cachemod


def rows(
    repos: Mapping[str, Path] | None = None, cache: Path | None = None, specs: Mapping[str, TargetSpec] | None = None
) -> list[dict]:
    """One dict per target: id, contract, whitening, source, entries, pins (rev, label, kind,
    default, offline), and whether a --repo was given for it."""
    cache = Path(cache) if cache is not None else cachemod.cache_dir()
    repos = repos or {}
    specs = registry() if specs is None else specs
    out = []
    for tid, spec in specs.items():
        pins = []
        for p in spec.pins + spec.moving_pins:
            pins.append({
                "rev": p.rev,
                "label": p.label,
                "kind": acquire_mod.pin_kind(spec, p.rev, repos),
                "default": p.default,
                "moving": p.moving,
                "offline": False if p.moving else acquire_mod.available_offline(spec, p.rev, repos, cache),
            })  # fmt: skip
        out.append({
            "id": tid,
            "contract": spec.contract,
            "whitens": spec.whitening is not None,
            "git_url": spec.git_url,
            "package": spec.package,
            "repo": str(repos[tid]) if tid in repos else None,
            "entries": list(spec.entries),
            "kinds": {e: spec.kind_of(e) for e in spec.entries},
            "pins": pins,
            "notes": spec.notes,
            "api": spec.domain.restrictions(),
            "pipeline": None if spec.pipeline is None else spec.pipeline.restrictions(),
            "pipeline_by_pin": {rev: d.restrictions() for rev, d in spec.pipeline_by_pin.items()},
            "configuration": _configuration(spec),
            "discovered": _discovered(spec, pins, repos, cache),
        })  # fmt: skip
    return out


def _discovered(spec: TargetSpec, pins: list[dict], repos: Mapping[str, Path], cache: Path) -> dict:
    """Per pin available offline: the variants the framework registers there (`targets.discovery`, read from the
    code by AST), shown apart from the hand-written entries; {} for a framework without a discover module."""
    if discovery.module_of(spec.id) is None:
        return {}
    out = {}
    for p in pins:
        if not p["offline"]:
            continue
        try:
            root = acquire_mod.acquire(spec, p["rev"], repos, cache).root
        except acquire_mod.AcquireError as exc:
            out[p["rev"]] = {"error": str(exc), "variants": []}
            continue
        out[p["rev"]] = {"variants": [v.to_json() for v in discovery.discover(spec.id, root)]}
    return out


def _configuration(spec: TargetSpec) -> dict:
    """Per entry: its option space (name, values, default, citation) and its truncation semantics."""
    out = {}
    for entry in spec.entries:
        e = spec.for_entry(entry)
        if e.options or e.truncation is not None:
            out[entry] = {
                "options": [o.to_json() for o in e.options],
                "truncation": None if e.truncation is None else e.truncation.to_json(),
            }
    return out


def render(data: list[dict], cache: Path | None = None, verbose: bool = False, width: int = 100) -> str:
    """Human-readable listing: one block per target, `*` marks a default pin. The default fits a
    terminal `width` columns wide (entries grouped by kind, one line per pin); `verbose` adds each
    target's domains, options and truncation semantics with their citations, wrapped to `width`."""
    lines = []
    rev_w = max([len(_short(p["rev"])) for t in data for p in t["pins"]] + [8])
    for t in data:
        source = []
        if t["repo"]:
            source.append(f"--repo {t['repo']}")
        elif t["git_url"]:
            source.append(t["git_url"])
        if t["package"]:
            source.append(f"pypi:{t['package']}")
        whitens = ", whitens" if t["whitens"] else ""
        lines.append(_fit(f"{t['id']}  ({t['contract']}{whitens})  {'  '.join(source)}", width))
        lines += _wrap(f"entries ({len(t['entries'])}): {_by_kind(t)}", width, "    ")
        lines += [x for text in _discovered_lines(t) for x in _wrap(text, width, "    ")]
        if verbose:
            lines += [x for text in _details(t) for x in _wrap(text, width, "    ")]
        if not t["pins"]:
            lines.append(f"    pins: none registered; name one, e.g. {t['id']}@<commit>")
        for p in t["pins"]:
            mark = "*" if p["default"] else " "
            where = "offline" if p["offline"] else "needs network"
            lines.append(_fit(f"  {mark} {_short(p['rev']):<{rev_w}} {p['kind']:<8} {where:<14} {p['label']}", width))
    n_pins = sum(len(t["pins"]) for t in data)
    n_off = sum(p["offline"] for t in data for p in t["pins"])
    cache = Path(cache) if cache is not None else cachemod.cache_dir()
    lines.append("")
    lines.append(f"{len(data)} targets, {n_pins} pins ({n_off} available offline); * = in the default fuzz set")
    lines.append(f"cache: {cache}")
    if not verbose:
        lines.append("details (domains, options, truncation, cited): --verbose; data: --json")
    return "\n".join(lines)


def _discovered_lines(t: dict) -> list[str]:
    """One line per pin with discovered variants: those without a hand-written entry (invariants only), those
    a hand-written entry calls with a reference, and those not callable outside the trainer (with the reason)."""
    out = []
    for rev, found in t.get("discovered", {}).items():
        vs = found["variants"]
        if found.get("error"):
            out.append(f"discovered at {_short(rev)}: cannot read the code: {found['error'][:120]}")
            continue
        only = [v["entry"] for v in vs if not v["covered_by"] and v["callable"]]
        ref = [f"{v['name']} -> {v['covered_by']}" for v in vs if v["covered_by"]]
        cannot = [f"{v['entry']} ({v['reason']})" for v in vs if not v["covered_by"] and not v["callable"]]
        text = f"discovered at {_short(rev)} ({len(vs)} registered): invariants only: {', '.join(only) or 'none'}"
        text += f"; reference (hand-written): {', '.join(ref) or 'none'}"
        if cannot:
            text += f"; not callable outside the trainer: {'; '.join(cannot)}"
        out.append(text)
    return out


def _by_kind(t: dict) -> str:
    """Entries grouped by kind, in registry order: `gae: default, agentic; kl: kl, kl-k3`."""
    groups: dict[str, list[str]] = {}
    for e in t["entries"]:
        groups.setdefault(t.get("kinds", {}).get(e, "gae"), []).append(e)
    return "; ".join(f"{kind}: {', '.join(es)}" for kind, es in groups.items()) + " (the first is the default)"


def _details(t: dict) -> list[str]:
    """The --verbose lines of one target: domains, per-pin narrowing, options, truncation."""
    out = [f"api: no {name}: {why}" for name, why in t.get("api", {}).items()]
    if t.get("pipeline") is None:
        out.append("pipeline: not declared (every finding reported at reach api)")
    else:
        out += [f"pipeline: no {name}: {why}" for name, why in t["pipeline"].items()]
        for rev, narrowed in t.get("pipeline_by_pin", {}).items():
            out.append(f"pipeline at {_short(rev)}: " + "; ".join(f"no {k}: {v}" for k, v in narrowed.items()))
    for entry, conf in t.get("configuration", {}).items():
        for o in conf["options"]:
            values = "|".join(json.dumps(v) for v in o["values"])
            out.append(f"option {entry}: {o['name']} = {values} (default {json.dumps(o['default'])}; {o['cite']})")
        if conf["truncation"] is not None:
            tr = conf["truncation"]
            out.append(f"truncation {entry}: {tr['semantics']} ({tr['cite']})")
    return out


def _wrap(text: str, width: int, indent: str) -> list[str]:
    return textwrap.wrap(text, width, initial_indent=indent, subsequent_indent=indent + "  ",
                         break_long_words=True, break_on_hyphens=False) or [indent]  # fmt: skip


def _fit(line: str, width: int) -> str:
    """One line cut to `width` columns, marked where it was cut."""
    return line if len(line) <= width else line[: width - 3] + "..."


def _short(rev: str) -> str:
    """Full hashes shortened to 12 characters in the text listing (JSON keeps them whole)."""
    return rev[:12] if len(rev) == 40 and all(c in "0123456789abcdef" for c in rev) else rev

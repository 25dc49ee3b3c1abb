"""JUnit XML for `maskfuzz fuzz --junit PATH`: one test per target x property, for CI test views.

    <testsuites name="maskfuzz" tests= failures= errors="0" skipped= time=>
      <testsuite name="verl@0.4.1" ...>              one per fuzzed target (a `targets[]` item)
        <properties> resolved, where, examples, seed, profile </properties>
        <testcase classname="maskfuzz.verl@0.4.1" name="poison" time=>
          <failure type="poison" message="...">      the shrunk finding: signature, shape, positions, corpus file
          <skipped message="..."/>                   the property never applied to a drawn case,
                                                     or the target was skipped / could not be set up
        </testcase>

A property fails when the target has a shrunk defect for it (a finding that breaks a promise), or
failing examples without a finding ("not shrunk": the search ran out of budget while shrinking);
a property whose findings are all facts (semantics, robustness) passes, the fact in its system-out.
A target with status `skipped` or `error` gives a skipped test per property with its reason (set-up
errors also make `maskfuzz fuzz` exit 2, so CI still sees them). Text that XML 1.0 cannot hold
(control characters from an exception message) is replaced, never dropped silently.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from maskfuzz.fuzz.corpus_codec import case_from_json
from maskfuzz.fuzz.signature import signature
from maskfuzz.oracles.kinds import INVARIANT as KIND_INVARIANT
from maskfuzz.oracles.kinds import properties as kind_properties
from maskfuzz.oracles.kinds.gae.properties import INVARIANT as GAE_INVARIANT
from maskfuzz.oracles.verdict import Verdict

INVARIANT = {**GAE_INVARIANT, **KIND_INVARIANT}

_BAD_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def _text(value: Any) -> str:
    return _BAD_XML.sub("\ufffd", str(value))


def _finding_text(f: dict) -> str:
    lines = [
        f"property:  {f.get('property')}: {INVARIANT.get(f.get('property', ''), '')}",
        f"message:   {f.get('message', '')}",
        f"shape:     B x T = {' x '.join(map(str, f.get('shape') or []))}",
        f"output:    {f.get('output') or '-'}",
        f"positions: {f.get('positions')}",
        f"expected:  {f.get('expected')}",
        f"observed:  {f.get('observed')}",
    ]
    if f.get("also"):
        lines.append(f"also fails: {', '.join(f['also'])}")
    if f.get("corpus_file"):
        lines.append(f"corpus:    {f['corpus_file']}  (maskfuzz replay {f['corpus_file']})")
    sig = _signature(f)
    if sig:
        lines.insert(1, f"signature: {sig}")
    return "\n".join(lines)


def _signature(f: dict) -> str:
    """The corpus signature of a finding dict, or '' when its case cannot be read."""
    try:
        case = case_from_json(f["case"])
        v = Verdict(f["property"], "fail", f.get("message", ""), f.get("output", ""), f.get("positions") or [])
        return signature(f["property"], v, case)
    except Exception:  # noqa: BLE001 - informative only; the failure is reported either way
        return ""


def build_junit(payload: dict) -> ET.Element:
    """The <testsuites> element for a `maskfuzz fuzz --json` payload."""
    root = ET.Element("testsuites", name="maskfuzz")
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for t in payload.get("targets", []):
        label = t["target"]
        suite = ET.SubElement(root, "testsuite", name=_text(label))
        props = ET.SubElement(suite, "properties")
        for key in ("pin", "resolved", "status", "where", "examples"):
            ET.SubElement(props, "property", name=key, value=_text(t.get(key, "")))
        for key in ("seed", "profile"):
            ET.SubElement(props, "property", name=key, value=_text(payload.get(key, "")))
        counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
        findings: dict[str, list[dict]] = {}
        facts: dict[str, list[dict]] = {}
        for f in t.get("findings", []):  # untriaged findings (no class) count as defects
            (facts if f.get("class") not in (None, "", "defect") else findings).setdefault(f["property"], []).append(f)
        status = t.get("status", "ok")
        for prop in kind_properties(t.get("kind") or "gae"):
            case = ET.SubElement(suite, "testcase", classname=_text(f"maskfuzz.{label}"), name=prop, time="0")
            counts["tests"] += 1
            checked = int((t.get("checked") or {}).get(prop, 0))
            failed = int((t.get("failed") or {}).get(prop, 0))
            if status != "ok":
                why = "could not be set up" if status == "error" else "skipped"
                msg = f"{label} {why}: {(t.get('reason') or '').strip().splitlines()[0] if t.get('reason') else ''}"
                el = ET.SubElement(case, "skipped", message=_text(msg))
                el.text = _text(t.get("reason", ""))
                counts["skipped"] += 1
            elif findings.get(prop):
                first = findings[prop][0]
                el = ET.SubElement(
                    case,
                    "failure",
                    type=prop,
                    message=_text(f"{first.get('message', '')} (failing examples: {failed}/{checked})"),
                )
                el.text = _text("\n\n".join(_finding_text(f) for f in findings[prop]))
                counts["failures"] += 1
            elif facts.get(prop):
                out = ET.SubElement(case, "system-out")
                out.text = _text("\n\n".join(
                    f"a {f['class']} fact, not a defect ({f.get('why_not_a_defect', '')}):\n{_finding_text(f)}"
                    for f in facts[prop]
                ))  # fmt: skip
            elif failed:
                el = ET.SubElement(
                    case,
                    "failure",
                    type=prop,
                    message=_text(f"{failed}/{checked} examples failed (not shrunk to a finding)"),
                )
                el.text = _text(INVARIANT.get(prop, ""))
                counts["failures"] += 1
            elif not checked:
                ET.SubElement(
                    case,
                    "skipped",
                    message=_text(f"{prop} applied to none of the {t.get('examples', 0)} cases drawn for this target"),
                )
                counts["skipped"] += 1
            else:
                out = ET.SubElement(case, "system-out")
                out.text = _text(f"{checked} example(s) checked: {INVARIANT.get(prop, '')}")
        suite.set("time", f"{float(t.get('seconds') or 0.0):.2f}")
        for k, v in counts.items():
            suite.set(k, str(v))
            totals[k] += v
    for k, v in totals.items():
        root.set(k, str(v))
    root.set("time", f"{float(payload.get('seconds') or 0.0):.2f}")
    return root


def write_junit(payload: dict, path: Path) -> None:
    """Write the JUnit XML of a `maskfuzz fuzz --json` payload to `path` (folders created)."""
    root = build_junit(payload)
    ET.indent(root)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)

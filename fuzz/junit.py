"""JUnit XML for `maskfuzz fuzz --junit PATH`: one test per target x property, for CI test views.

    <testsuites name="maskfuzz" tests= failures= errors="0" skipped= time=>
      <testsuite name="verl@0.4.1" ...>              one per fuzzed target (a `JobResult`)
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
from maskfuzz.fuzz.job_result import FindingRow, RunResult
from maskfuzz.fuzz.signature import signature
from maskfuzz.oracles.declared import DEFAULT_KIND
from maskfuzz.oracles.kinds import INVARIANT as KIND_INVARIANT
from maskfuzz.oracles.kinds import properties as kind_properties
from maskfuzz.oracles.kinds.gae.properties import INVARIANT as GAE_INVARIANT
from maskfuzz.oracles.verdict import Verdict

INVARIANT = {**GAE_INVARIANT, **KIND_INVARIANT}

_BAD_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def _text(value: Any) -> str:
    return _BAD_XML.sub("\ufffd", str(value))


def _finding_text(f: FindingRow) -> str:
    lines = [
        f"property:  {f.property}: {INVARIANT.get(f.property, '')}",
        f"message:   {f.message}",
        f"shape:     B x T = {' x '.join(map(str, f.shape))}",
        f"output:    {f.output or '-'}",
        f"positions: {[list(p) for p in f.positions]}",
        f"expected:  {f.expected}",
        f"observed:  {f.observed}",
    ]
    if f.also:
        lines.append(f"also fails: {', '.join(f.also)}")
    if f.corpus_file:
        lines.append(f"corpus:    {f.corpus_file}  (maskfuzz replay {f.corpus_file})")
    sig = _signature(f)
    if sig:
        lines.insert(1, f"signature: {sig}")
    return "\n".join(lines)


def _signature(f: FindingRow) -> str:
    """The corpus signature of a finding, or '' when its case cannot be read."""
    try:
        case = case_from_json(dict(f.case or {}))
        v = Verdict(f.property, "fail", f.message, f.output, [list(p) for p in f.positions])
        return signature(f.property, v, case)
    except Exception:  # noqa: BLE001 - informative only; the failure is reported either way
        return ""


def build_junit(run: RunResult) -> ET.Element:
    """The <testsuites> element of a `maskfuzz fuzz` run."""
    root = ET.Element("testsuites", name="maskfuzz")
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for t in run.targets:
        label = t.target
        suite = ET.SubElement(root, "testsuite", name=_text(label))
        props = ET.SubElement(suite, "properties")
        for key, value in (("pin", t.pin), ("resolved", t.resolved), ("status", t.status), ("where", t.where),
                           ("examples", t.examples), ("seed", run.seed), ("profile", run.profile)):  # fmt: skip
            ET.SubElement(props, "property", name=key, value=_text(value))
        counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
        findings: dict[str, list[FindingRow]] = {}
        facts: dict[str, list[FindingRow]] = {}
        for f in t.findings:  # untriaged findings (no class) count as defects
            (findings if f.is_defect else facts).setdefault(f.property, []).append(f)
        for prop in kind_properties(t.kind or DEFAULT_KIND):
            case = ET.SubElement(suite, "testcase", classname=_text(f"maskfuzz.{label}"), name=prop, time="0")
            counts["tests"] += 1
            checked, failed = t.checked.get(prop, 0), t.failed.get(prop, 0)
            if not t.ran:
                why = "could not be set up" if t.status == "error" else "skipped"
                msg = f"{label} {why}: {t.reason.strip().splitlines()[0] if t.reason.strip() else ''}"
                el = ET.SubElement(case, "skipped", message=_text(msg))
                el.text = _text(t.reason)
                counts["skipped"] += 1
            elif findings.get(prop):
                first = findings[prop][0]
                el = ET.SubElement(
                    case,
                    "failure",
                    type=prop,
                    message=_text(f"{first.message} (failing examples: {failed}/{checked})"),
                )
                el.text = _text("\n\n".join(_finding_text(f) for f in findings[prop]))
                counts["failures"] += 1
            elif facts.get(prop):
                out = ET.SubElement(case, "system-out")
                out.text = _text("\n\n".join(
                    f"a {f.klass} fact, not a defect ({f.why_not_a_defect}):\n{_finding_text(f)}" for f in facts[prop]
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
                    message=_text(f"{prop} applied to none of the {t.examples} cases drawn for this target"),
                )
                counts["skipped"] += 1
            else:
                out = ET.SubElement(case, "system-out")
                out.text = _text(f"{checked} example(s) checked: {INVARIANT.get(prop, '')}")
        suite.set("time", f"{t.seconds:.2f}")
        for k, v in counts.items():
            suite.set(k, str(v))
            totals[k] += v
    for k, v in totals.items():
        root.set(k, str(v))
    root.set("time", f"{run.seconds:.2f}")
    return root


def write_junit(run: RunResult, path: Path) -> None:
    """Write the JUnit XML of a `maskfuzz fuzz` run to `path` (folders created)."""
    root = build_junit(run)
    ET.indent(root)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)

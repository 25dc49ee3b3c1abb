"""The report page in a real headless Chromium (`tests/browser.py`, the DevTools protocol on a pipe):
titled as a run or a night, defects per framework first with the plot, severity and reach in
colour, wide tables scrolling inside the page with every link reachable, and a screenshot whose
pixels show those colours. Needs Debian's `chromium` (the README's test command installs it where
it can); without it the test is skipped and says why."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from browser import Browser, find_chromium, png_colours
from test_report import CASE, POISON, REFERENCE, SCORE, finding, run_report, target, write_fuzz

from maskfuzz.fuzz.corpus import save
from maskfuzz.fuzz.corpus_codec import Entry, Found
from maskfuzz.oracles.verdict import Verdict

CHROMIUM = find_chromium()
pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason="no Chromium on this machine, so the report page was not checked in a browser: "
    "apt-get install chromium (or MASKFUZZ_CHROMIUM=PATH)",
)
HIGH, PIPELINE = (0xD9, 0x30, 0x25), (0xA1, 0x42, 0xF4)  # td.sev-high, td.reach-pipeline backgrounds
WIDTH, HEIGHT = 900, 700

LEAK = {"defect": "verl/masked-value-bootstrap", "mechanism": "masked-value-bootstrap", "severity": "high",
        "reach": "pipeline", "promise": "universal:poison"}  # fmt: skip
LOST = {"defect": "trl/score-lost", "mechanism": "score-lost", "severity": "medium", "reach": "api",
        "promise": "universal:score-kept"}  # fmt: skip


def _night(tmp_path: Path, name: str) -> Path:
    """A run over many target@pins (so the matrix is wider than the window) with defects of two
    frameworks, one of them behind a very long message, and a corpus entry with its reproducer
    (links in the last columns of a wide table)."""
    verdict = Verdict("poison", "fail", POISON["message"], "returns", [[0, 1]], [0.0], [1.0])
    entry = Entry("verl", "0.4.1", "poison", CASE, verdict, resolved="verl==0.4.1", found=Found(date="x"))
    path = save(entry, tmp_path / "corpus")
    (tmp_path / "repro" / entry.id).mkdir(parents=True, exist_ok=True)
    (tmp_path / "repro" / entry.id / "report.md").write_text("# repro\n")
    poison = finding("poison", [[0, 1]], "returns", corpus_file=str(path)) | LEAK
    long = finding("reference", [[0, 3]], message="advantages differ at " + "a-long-unbroken-token-" * 20)
    return write_fuzz(
        tmp_path / name,
        target("verl@0.4.1", findings=[poison, REFERENCE | LEAK]),
        target("trl@1.12.0", findings=[SCORE | LOST, long | LOST]),
        *(target(f"torchrl:vec@0.{k}.0") for k in range(6, 14)),
        target("skyrl@0.3.1", "skipped", reason="no PPO"),
    )


def _page_facts(b: Browser) -> dict:
    return b.eval("""(() => {
        const doc = document.documentElement, boxes = [...document.querySelectorAll('.scroll')];
        const links = [...document.querySelectorAll('a[href]')].map(a => {
            const box = a.closest('.scroll'), r = a.getBoundingClientRect(), c = box.getBoundingClientRect();
            return {text: a.textContent, width: r.width,
                    reachable: r.left >= c.left - 1 && r.right <= c.left + box.scrollWidth + 1};
        });
        const bg = sel => { const e = document.querySelector(sel); return e && getComputedStyle(e).backgroundColor; };
        return {
            title: document.title, h1: document.querySelector('h1').textContent,
            first: document.querySelector('h2').textContent,
            pageWidth: doc.scrollWidth, window: innerWidth,
            scrolling: boxes.filter(d => d.scrollWidth > d.clientWidth
                                         && getComputedStyle(d).overflowX === 'auto').length,
            links, high: bg('td.sev-high'), pipeline: bg('td.reach-pipeline'),
            plot: (() => { const s = document.querySelector('figure svg'); const r = s && s.getBoundingClientRect();
                           return s && {width: r.width, height: r.height, dots: s.querySelectorAll('circle').length,
                                        bars: s.querySelectorAll('rect.bar').length,
                                        lines: s.querySelectorAll('polyline').length}; })(),
        };
    })()""")


def test_a_run_report_in_a_browser(tmp_path):
    run_report(tmp_path, [_night(tmp_path, "run.json")], name="run", extra=["--repro-dir", str(tmp_path / "repro")])
    page = tmp_path / "run" / "report.html"
    with Browser.start(CHROMIUM, width=WIDTH, height=HEIGHT) as b:
        b.open(page)
        facts = _page_facts(b)
        b.eval("[...document.querySelectorAll('h2')].find(h => h.textContent.startsWith('Defects (')).scrollIntoView()")
        shot = b.screenshot()
        page_shot = b.screenshot(full_page=True)
    assert facts["title"] == facts["h1"] == "maskfuzz run report"
    assert facts["first"] == "Defects per framework"
    assert facts["pageWidth"] <= facts["window"], "the page itself scrolls sideways: a table is not contained"
    assert facts["scrolling"] >= 1, "the matrix (wider than the window) should scroll inside its box"
    assert {link["text"] for link in facts["links"]} >= {"report"}, "the reproducer's link is missing"
    assert facts["links"] and all(link["reachable"] and link["width"] > 0 for link in facts["links"]), facts["links"]
    assert facts["high"] == "rgb(217, 48, 37)" and facts["pipeline"] == "rgb(161, 66, 244)"
    # one night: a bar per framework that ran (torchrl, trl, verl; skyrl was skipped, so it is not among them)
    assert facts["plot"]["width"] > 100 and facts["plot"]["bars"] == 3 and facts["plot"]["lines"] == 0
    width, height, colours = png_colours(shot)
    assert (width, height) == (WIDTH, HEIGHT)
    assert HIGH in colours and PIPELINE in colours, "the screenshot does not show severity and reach in colour"
    keep = os.environ.get("MASKFUZZ_SCREENSHOTS")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(page, Path(keep) / "run-report.html")
        (Path(keep) / "run-report.png").write_bytes(page_shot)


def test_a_nightly_report_plots_the_nights(tmp_path):
    run_report(tmp_path, [_night(tmp_path, "n1.json")], name="night1")
    tonight = write_fuzz(tmp_path / "n2.json", target("verl@0.4.1", findings=[POISON | LEAK]))
    data = run_report(tmp_path, [tonight], [tmp_path / "night1" / "report.json"], name="night2")
    assert [n["defects"] for n in data["history"]] == [{"torchrl": 0, "trl": 1, "verl": 1}, {"verl": 1}]
    with Browser.start(CHROMIUM, width=WIDTH, height=HEIGHT) as b:
        b.open(tmp_path / "night2" / "report.html")
        facts = _page_facts(b)
    assert facts["title"] == "maskfuzz nightly report"
    assert facts["plot"]["lines"] == 3 and facts["plot"]["dots"] == 6  # three frameworks over two nights

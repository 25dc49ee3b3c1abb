"""The report's page model (sections of tables) and its two renderings, markdown and one
self-contained HTML page (inline CSS and SVG, no scripts, no external assets)."""

from __future__ import annotations

import html
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote


@dataclass(frozen=True)
class Link:
    text: str
    href: str


# Columns coloured by their value, by header: the cell's class is `<prefix>-<value>`.
STYLED_COLUMNS = {"severity": "sev", "reach": "reach", "state": "state", "status": "status"}


@dataclass
class Table:
    header: list[str]
    rows: list[list]
    kind: str = ""  # "matrix" colours its cells


@dataclass
class Plot:
    """A small line plot: one series per name over the x labels (nights), y counts >= 0."""

    title: str
    x: list[str]
    series: dict[str, list[int]]


@dataclass
class Section:
    title: str
    intro: str = ""
    table: Table | None = None
    empty: str = "none"
    plot: Plot | None = None


@dataclass
class Document:
    title: str
    lines: list[str]  # summary paragraph lines
    sections: list[Section]




# ---------------------------------------------------------------------------------------------
# Rendering.
# ---------------------------------------------------------------------------------------------
def _md_text(s: str) -> str:
    """Text safe inside a markdown table cell: no pipes or newlines, no raw HTML."""
    s = str(s).replace("\\", "\\\\").replace("|", "\\|").replace("\r", " ").replace("\n", " ")
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _md_cell(c: Any) -> str:
    if isinstance(c, Link):
        return f"[{_md_text(c.text)}]({quote(c.href, safe='/.-_~')})"
    if isinstance(c, tuple):
        return " ".join(_md_cell(x) for x in c)
    return _md_text(c)


def render_markdown(doc: Document) -> str:
    out = [f"# {doc.title}", ""]
    out += [f"{_md_text(line)}  " for line in doc.lines]
    for s in doc.sections:
        out += ["", f"## {s.title}", ""]
        if s.intro:
            out += [_md_text(s.intro), ""]
        if s.plot is not None and s.plot.x:
            out += _md_plot(s.plot)
        if s.table is None or not s.table.rows:
            out.append(f"_{s.empty}_")
            continue
        out.append("| " + " | ".join(_md_text(h) for h in s.table.header) + " |")
        out.append("|" + "|".join("---" for _ in s.table.header) + "|")
        for row in s.table.rows:
            out.append("| " + " | ".join(_md_cell(c) for c in row) + " |")
    return "\n".join(out) + "\n"


def _md_plot(plot: Plot) -> list[str]:
    """The plot's numbers as a table (markdown has no pictures of its own): nights down, names across."""
    names = list(plot.series)
    out = [f"{_md_text(plot.title)}:", "", "| night | " + " | ".join(map(_md_text, names)) + " |"]
    out.append("|" + "|".join("---" for _ in range(len(names) + 1)) + "|")
    for i, x in enumerate(plot.x):
        out.append(f"| {_md_text(x)} | " + " | ".join(str(plot.series[n][i]) for n in names) + " |")
    return out + [""]


_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; max-width: 100%; }
h1 { margin-bottom: 0.2em; }
.scroll { overflow-x: auto; max-width: 100%; margin: 0.5em 0 1.5em; }
table { border-collapse: collapse; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.5em; text-align: left; vertical-align: top; }
td { max-width: 36em; overflow-wrap: anywhere; }
th { background: #f3f3f3; }
table.matrix td, table.matrix th { white-space: nowrap; }
td.ok { background: #e6f4ea; } td.fail { background: #fce8e6; font-weight: bold; }
td.skipped, td.error { background: #eee; color: #666; } td.na { color: #999; }
td[class^="sev-"], td[class^="reach-"], td[class^="state-"], td[class^="status-"] { white-space: nowrap; }
td.sev-high { background: #d93025; color: #fff; font-weight: bold; }
td.sev-medium { background: #f9ab00; color: #222; font-weight: bold; }
td.sev-low { background: #fde293; color: #222; }
td.reach-pipeline { background: #a142f4; color: #fff; font-weight: bold; }
td.reach-api { background: #e8eaed; color: #333; }
td.state-new { color: #d93025; font-weight: bold; } td.state-fixed { color: #188038; font-weight: bold; }
td.status-ran, td.status-ok { color: #188038; } td.status-failed, td.status-error { color: #d93025; font-weight: bold; }
td.status-skipped { color: #666; }
p.empty { color: #777; font-style: italic; }
figure { margin: 0.5em 0 1em; } figcaption { font-size: 0.85em; color: #555; }
"""


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def _css_class(text: str) -> str:
    if text.startswith("FAIL"):
        return "fail"
    return {"ok": "ok", "skipped": "skipped", "error": "error", "n/a": "na"}.get(text, "")


def _html_cell(c: Any) -> str:
    if isinstance(c, Link):
        return f'<a href="{html.escape(quote(c.href, safe="/.-_~"), quote=True)}">{html.escape(c.text)}</a>'
    if isinstance(c, tuple):
        return " ".join(_html_cell(x) for x in c)
    return html.escape(str(c))


def render_html(doc: Document) -> str:
    """One self-contained page (inline CSS, no scripts, no external assets); all text escaped."""
    out = [
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        f"<title>{html.escape(doc.title)}</title>",
        f"<style>{_CSS}</style>",
        "</head>",
        "<body>",
        f"<h1>{html.escape(doc.title)}</h1>",
    ]
    out += [f"<p>{html.escape(line)}</p>" for line in doc.lines]
    for s in doc.sections:
        out.append(f"<h2>{html.escape(s.title)}</h2>")
        if s.intro:
            out.append(f"<p>{html.escape(s.intro)}</p>")
        if s.plot is not None and s.plot.x:
            out.append(render_svg(s.plot))
        if s.table is None or not s.table.rows:
            out.append(f'<p class="empty">{html.escape(s.empty)}</p>')
            continue
        out.append('<div class="scroll">')
        out.append(f'<table class="{s.table.kind}">' if s.table.kind else "<table>")
        out.append("<thead><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in s.table.header) + "</tr></thead>")
        out.append("<tbody>")
        styled = {k: STYLED_COLUMNS[h] for k, h in enumerate(s.table.header) if h in STYLED_COLUMNS}
        for row in s.table.rows:
            tds = []
            for k, c in enumerate(row):
                cls = _css_class(c) if s.table.kind == "matrix" and k >= 3 and isinstance(c, str) else ""
                if k in styled and isinstance(c, str) and c:
                    cls = f"{styled[k]}-{_slug(c.split(' (')[0])}"  # "pipeline (executed)": styled as pipeline
                tds.append((f'<td class="{cls}">' if cls else "<td>") + _html_cell(c) + "</td>")
            out.append("<tr>" + "".join(tds) + "</tr>")
        out.append("</tbody>")
        out.append("</table>")
        out.append("</div>")
    out += ["</body>", "</html>"]
    return "\n".join(out) + "\n"



# Ten distinguishable colours (Tableau 10), one per series in order.
PALETTE = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f",
           "#bab0ac")  # fmt: skip


def render_svg(plot: Plot, width: int = 640, height: int = 220) -> str:
    """The plot as inline SVG: axes, one polyline with dots per series, a legend on the right.
    A single night draws one bar per series; the y axis runs from 0 to the largest count (at least 1)."""
    left, right, top, bottom = 36, 150, 12, 36
    w, h = width - left - right, height - top - bottom
    top_y = max([1] + [v for vs in plot.series.values() for v in vs])
    n = len(plot.x)
    x_at = (lambda i: left + w / 2) if n == 1 else (lambda i: left + w * i / (n - 1))  # noqa: E731
    y_at = lambda v: top + h - h * v / top_y  # noqa: E731
    aria = html.escape(plot.title, quote=True)
    out = [f'<figure><svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" role="img" aria-label="{aria}">']  # fmt: skip
    out.append(f'<line x1="{left}" y1="{top + h}" x2="{left + w}" y2="{top + h}" stroke="#888"/>')
    out.append(f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + h}" stroke="#888"/>')
    for v in sorted({0, top_y // 2, top_y}):
        out.append(f'<text x="{left - 6}" y="{y_at(v) + 4:.1f}" font-size="11" text-anchor="end">{v}</text>')
    step = max(1, n // 6)
    days = [x[:10] for x in plot.x]
    labels = days if len(set(days)) == n else [x[:16].replace("T", " ") for x in plot.x]
    for i, label in enumerate(labels):
        if i % step == 0 or i == n - 1:
            out.append(f'<text x="{x_at(i):.1f}" y="{top + h + 16}" font-size="11" text-anchor="middle">'
                       f"{html.escape(label)}</text>")  # fmt: skip
    bar = w / max(1, len(plot.series)) * 0.6
    for k, (name, values) in enumerate(plot.series.items()):
        colour = PALETTE[k % len(PALETTE)]
        if n == 1:  # one night: a bar per series, side by side
            bx = left + w * (k + 0.2) / max(1, len(plot.series))
            out.append(f'<rect class="bar" x="{bx:.1f}" y="{y_at(values[0]):.1f}" width="{bar:.1f}" '
                       f'height="{top + h - y_at(values[0]):.1f}" fill="{colour}"/>')  # fmt: skip
        else:
            pts = " ".join(f"{x_at(i):.1f},{y_at(v):.1f}" for i, v in enumerate(values))
            out.append(f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="{pts}"/>')
            for i, v in enumerate(values):
                out.append(f'<circle cx="{x_at(i):.1f}" cy="{y_at(v):.1f}" r="3" fill="{colour}"/>')
        ly = top + 14 * k + 8
        out.append(f'<rect x="{left + w + 12}" y="{ly - 8}" width="10" height="10" fill="{colour}"/>')
        out.append(f'<text x="{left + w + 26}" y="{ly + 1}" font-size="11">{html.escape(name)} ({values[-1]})</text>')
    out.append("</svg>")
    out.append(f"<figcaption>{html.escape(plot.title)}</figcaption></figure>")
    return "\n".join(out)

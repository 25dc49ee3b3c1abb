"""The report's page model (sections of tables) and its two renderings, markdown and one
self-contained HTML page (inline CSS and SVG, no scripts, no external assets)."""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote


@dataclass(frozen=True)
class Link:
    text: str
    href: str


@dataclass
class Table:
    header: list[str]
    rows: list[list]
    kind: str = ""  # "matrix" colours its cells


@dataclass
class Section:
    title: str
    intro: str = ""
    table: Table | None = None
    empty: str = "none"


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
        if s.table is None or not s.table.rows:
            out.append(f"_{s.empty}_")
            continue
        out.append("| " + " | ".join(_md_text(h) for h in s.table.header) + " |")
        out.append("|" + "|".join("---" for _ in s.table.header) + "|")
        for row in s.table.rows:
            out.append("| " + " | ".join(_md_cell(c) for c in row) + " |")
    return "\n".join(out) + "\n"


_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.5em; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
td.ok { background: #e6f4ea; } td.fail { background: #fce8e6; font-weight: bold; }
td.skipped, td.error { background: #eee; color: #666; } td.na { color: #999; }
p.empty { color: #777; font-style: italic; }
"""


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
        if s.table is None or not s.table.rows:
            out.append(f'<p class="empty">{html.escape(s.empty)}</p>')
            continue
        out.append("<table>")
        out.append("<thead><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in s.table.header) + "</tr></thead>")
        out.append("<tbody>")
        for row in s.table.rows:
            tds = []
            for k, c in enumerate(row):
                cls = _css_class(c) if s.table.kind == "matrix" and k >= 3 and isinstance(c, str) else ""
                tds.append((f'<td class="{cls}">' if cls else "<td>") + _html_cell(c) + "</td>")
            out.append("<tr>" + "".join(tds) + "</tr>")
        out.append("</tbody>")
        out.append("</table>")
    out += ["</body>", "</html>"]
    return "\n".join(out) + "\n"


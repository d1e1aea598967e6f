"""The Markdown writer: comparison.md from the report document, one block per section, a blank line between blocks."""

from __future__ import annotations

from gptlab.compare.render import words
from gptlab.compare.render.sections import (
    Document,
    Figures,
    LoggedLines,
    Notes,
    Preformatted,
    Section,
    Sentences,
    Shown,
    Table,
)


def _escape(text: str) -> str:
    return text.replace("|", "\\|")


def _heading(heading: str | None) -> list[str]:
    return [f"## {heading}", ""] if heading else []


def _table(t: Table) -> list[str]:
    lines = [*_heading(t.heading), "| " + " | ".join(t.headers) + " |", "|" + "---|" * len(t.headers)]
    lines += ["| " + " | ".join(_escape(c) for c in row) + " |" for row in t.rows]
    return lines + (["", t.note] if t.note else [])


def block(s: Section) -> list[str]:
    """The lines of one section (none for a kind the page does not show: the legend, the compared runs)."""
    if isinstance(s, Table):
        return _table(s)
    if isinstance(s, Sentences):
        return [*_heading(s.heading), *(f"- {line}" for line in s.lines)]
    if isinstance(s, Notes):
        return [f"- {words.note(n)}" for n in s.notes]
    if isinstance(s, LoggedLines):
        return [*_heading(s.heading), *(f"- {_escape(x.describe())}" for x in s.items)]
    if isinstance(s, Preformatted):
        return [*_heading(s.heading), "```", s.text, "```"]
    if isinstance(s, Figures):
        return [f"![{f.name}]({f.path.name})" for f in s.figures]
    return []


def write(doc: Document) -> str:
    """comparison.md: the title, then every section the files are shown."""
    blocks = [[f"# {doc.title}"], *(block(s) for s in doc.sections if s.shown is not Shown.TERMINAL)]
    return "\n\n".join("\n".join(b) for b in blocks if b) + "\n"

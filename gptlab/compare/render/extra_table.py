"""A report's extra per-arm tables (capability probes, downstream evals) rendered alike in Markdown, on the terminal and in HTML."""

from __future__ import annotations

import html
from dataclasses import dataclass


@dataclass(frozen=True)
class ExtraTable:
    """One table: its section heading, terminal title, HTML class, header row, text rows and the note under it."""

    section: str
    title: str
    css: str
    headers: list[str]
    body: list[list[str]]
    note: str


def markdown(t: ExtraTable | None) -> list[str]:
    """The table as Markdown lines (none for no table)."""
    if t is None:
        return []
    lines = ["", f"## {t.section}", "", "| " + " | ".join(t.headers) + " |", "|" + "---|" * len(t.headers)]
    return lines + ["| " + " | ".join(row) + " |" for row in t.body] + ["", t.note]


def print_table(t: ExtraTable | None, console) -> None:
    """The table on the terminal (rich); its first column, the metric, left-aligned."""
    if t is None:
        return
    from rich.table import Table

    out = Table(title=t.title)
    for i, h in enumerate(t.headers):
        out.add_column(h, justify="left" if i == 0 else "right")
    for row in t.body:
        out.add_row(*row)
    console.print(out)


def html_table(t: ExtraTable | None) -> str:
    """The table as an HTML fragment (empty for no table)."""
    if t is None:
        return ""
    esc = html.escape
    head = "".join(f"<th>{esc(h)}</th>" for h in t.headers)
    lines = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>\n" for row in t.body)
    return (
        f'<h2>{esc(t.section)}</h2>\n<table class="{t.css}">\n<tr>{head}</tr>\n{lines}</table>\n<p>{esc(t.note)}</p>\n'
    )

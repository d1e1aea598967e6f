"""A report's extra per-arm tables (capability probes, downstream evals): their modules make the headers and cells,
this one renders them alike in Markdown, on the terminal and in HTML."""

from __future__ import annotations

import html
from dataclasses import asdict, dataclass

from gptlab.compare import stats, verdict
from gptlab.compare.stats import ALPHA
from gptlab.compare.verdict import Verdict


@dataclass
class ArmCell:
    """One arm's value of one metric: mean ± std over seeds, Δ vs the baseline and its verdict (None: baseline)."""

    label: str
    values: list[float]
    mean: float | None
    std: float | None
    delta: float | None = None
    verdict: Verdict | None = None

    def to_json(self) -> dict:
        return {**asdict(self), "verdict": self.verdict.to_json() if self.verdict else None}


def arm_cell(metric: str, label: str, values: list[float], base: ArmCell | None) -> ArmCell:
    """The cell of `values` (one per seed) against the baseline's cell (None: this is the baseline)."""
    cell = ArmCell(label, values, stats.mean(values) if values else None, stats.std(values) if values else None)
    if base is None or cell.mean is None or base.mean is None:
        return cell
    cell.delta = cell.mean - base.mean
    cell.verdict = verdict.difference(metric, values, base.values, ALPHA)
    return cell


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

"""The main table's cells as the paper writers need them (render/paper.py): each verdict with its 95% interval spelled
out and the caveats each verdict carries, attached to the table section the other writers draw as it is."""

from __future__ import annotations

from dataclasses import replace

from gptlab.compare.render import words
from gptlab.compare.render.sections import Table
from gptlab.compare.tables.analysis import Comparison

DELTA, SPEED_UP = "Δ val loss", "speed-up"  # how the main table's two verdict columns begin


def _column(headers: tuple[str, ...], start: str) -> int | None:
    return next((j for j, h in enumerate(headers) if h.startswith(start)), None)


def _with_interval(cell: str, interval: tuple[float, float] | None) -> str:
    """`-0.0456 significant (p=0.003)` -> `-0.0456 [-0.0700, -0.0212] significant (p=0.003)`."""
    if interval is None:
        return cell
    head, _, tail = cell.partition(" ")
    return f"{head} [{interval[0]:+.4f}, {interval[1]:+.4f}] {tail}".rstrip()


def main_table(t: Table, cmp: Comparison) -> Table:
    """The main table marked for comparison.csv/.tex: Δ val loss with its interval, the loss and speed verdicts'
    caveats on their cells (the rows are the comparison's, baseline first)."""
    delta, speed = _column(t.headers, DELTA), _column(t.headers, SPEED_UP)
    if len(t.rows) != len(cmp.rows):
        return replace(t, paper=True)
    rows, marks = [], []
    for line, row in zip(t.rows, cmp.rows):
        cells, notes = list(line), [list[str]() for _ in line]
        if delta is not None:
            cells[delta] = _with_interval(line[delta], row.loss.interval)
            notes[delta] = words.caveats(row.loss)
        if speed is not None:
            notes[speed] = words.caveats(row.speed)
        rows.append(tuple(cells))
        marks.append(tuple(tuple(n) for n in notes))
    return replace(t, paper=True, paper_rows=tuple(rows), marks=tuple(marks))

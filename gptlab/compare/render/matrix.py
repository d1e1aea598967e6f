"""The verdict matrix (compare/tables/matrix.py) as a terminal table, Markdown, HTML and one sentence per arm."""

from __future__ import annotations

import html

from gptlab.compare.render import words
from gptlab.compare.tables.matrix import ArmLenses, Matrix


def headers(m: Matrix) -> list[str]:
    """`arm`, one column per lens any arm was measured under, `speed`."""
    mode = next((a.matched_mode for a in m.arms if a.matched_arm), None)
    return ["arm", *(f"Δ val loss at {words.lens(x.value, mode, m.lr_grid)}" for x in m.lenses), "speed-up"]


def _label(arm: ArmLenses) -> str:
    if arm.matched_arm:
        return f"{arm.label} (matched: {arm.matched_arm})"
    return f"{arm.label} ({words.lens('matched', arm.matched_mode)})" if arm.matched_mode else arm.label


def _speed(arm: ArmLenses) -> str:
    v = arm.speed
    if v.effect is None:
        return "–"
    span = f" [{v.interval[0]:.2f}, {v.interval[1]:.2f}]" if v.interval else ""
    return f"{v.effect:.2f}×{span} {words.speed(v)}"


def body(m: Matrix) -> list[list[str]]:
    """One row of cells per arm: its label, a cell per lens (– where the lens did not measure it), its speed-up."""
    return [
        [_label(a), *(words.loss_cell(a.cells[x]) if x in a.cells else "–" for x in m.lenses), _speed(a)]
        for a in m.arms
    ]


def sentences(m: Matrix) -> list[str]:
    """The reconciled sentence of every arm: where its lenses agree and disagree, and what that means."""
    out = []
    for a in m.arms:
        named = {
            o.value: [words.lens(x.value, a.matched_mode, m.lr_grid) for x in lenses]
            for o, lenses in a.by_outcome().items()
        }
        out.append(words.reconciled(_label(a), named, [f.value for f in a.findings], words.speed_headline(a.speed)))
    return out


def title(m: Matrix) -> str:
    where = " (an lr grid: each arm at its own best lr, unless the column says otherwise)" if m.lr_grid else ""
    return f"Verdict matrix: each arm against {m.baseline} under every lens the runs support{where}"


def print_matrix(m: Matrix | None, console) -> None:
    """The matrix as a rich table, then its sentences."""
    if m is None or not m.arms:
        return
    from rich.table import Table

    table = Table(title=title(m))
    for h in headers(m):
        table.add_column(h, justify="left")
    for line in body(m):
        table.add_row(*line)
    console.print(table)
    for s in sentences(m):
        console.print(s, highlight=False, markup=False)


def markdown(m: Matrix | None) -> list[str]:
    """The matrix's Markdown lines (a heading, the table, the sentences), or none."""
    if m is None or not m.arms:
        return []
    esc = lambda t: t.replace("|", "\\|")  # noqa: E731
    hs = headers(m)
    lines = [f"## {title(m)}", "", "| " + " | ".join(hs) + " |", "|" + "---|" * len(hs)]
    lines += ["| " + " | ".join(esc(c) for c in row) + " |" for row in body(m)]
    return [*lines, "", *(f"- {s}" for s in sentences(m)), ""]


def html_matrix(m: Matrix | None) -> str:
    """The matrix as an HTML table (class `matrix`) and its sentences (class `reconciled`), or ''."""
    if m is None or not m.arms:
        return ""
    esc = html.escape
    head = "".join(f"<th>{esc(h)}</th>" for h in headers(m))
    rows = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>\n" for row in body(m))
    items = "".join(f"<li>{esc(s)}</li>" for s in sentences(m))
    return (
        f'<h2>{esc(title(m))}</h2>\n<table class="matrix">\n<tr>{head}</tr>\n{rows}</table>\n'
        f'<ul class="reconciled">{items}</ul>\n'
    )

"""The verdict matrix (compare/tables/matrix.py) as sections of the report: its table and one sentence per arm."""

from __future__ import annotations

from gptlab.compare.render import words
from gptlab.compare.render.sections import Section, Sentences, Table
from gptlab.compare.statistics.verdict import Verdict
from gptlab.compare.tables.matrix import ArmLenses, Matrix


def headers(m: Matrix) -> list[str]:
    """`arm`, one column per lens any arm was measured under, `speed`."""
    mode = next((a.matched_mode for a in m.arms if a.matched_arm), None)
    names = (words.lens(x.value, mode, m.lr_grid, m.one_lr is not None) for x in m.lenses)
    return ["arm", *(f"Δ val loss at {name}" for name in names), "speed-up"]


def _label(arm: ArmLenses) -> str:
    if arm.matched_arm:
        return f"{arm.label} (matched: {arm.matched_arm})"
    return f"{arm.label} ({words.lens('matched', arm.matched_mode)})" if arm.matched_mode else arm.label


def _speed(arm: ArmLenses) -> str:
    v = arm.speed
    if v.effect is None:
        return words.speed(v)  # "not timed", or "–"
    span = f" [{v.interval[0]:.2f}, {v.interval[1]:.2f}]" if v.interval else ""
    return f"{v.effect:.2f}×{span} {words.speed(v)}"


def body(m: Matrix) -> list[list[str]]:
    """One row of cells per arm: its label, a cell per lens (– where the lens did not measure it), its speed-up."""
    return [
        [_label(a), *(words.loss_cell(a.cells[x]) if x in a.cells else "–" for x in m.lenses), _speed(a)]
        for a in m.arms
    ]


def marks(m: Matrix) -> tuple[tuple[tuple[str, ...], ...], ...]:
    """Per arm and column, the caveats its cell carries (none for the label), for the paper writers' footnotes."""
    cells: list[list[Verdict | None]] = [[None, *(a.cells.get(x) for x in m.lenses), a.speed] for a in m.arms]
    return tuple(tuple(tuple(words.caveats(v)) if v is not None else () for v in row) for row in cells)


def sentences(m: Matrix) -> list[str]:
    """The reconciled sentence of every arm: where its lenses agree and disagree, and what that means; under an lr
    grid whose arms all picked the baseline's lr, why it has one lr column."""
    out = []
    for a in m.arms:
        named = {
            o.value: [words.lens(x.value, a.matched_mode, m.lr_grid, m.one_lr is not None) for x in lenses]
            for o, lenses in a.by_outcome().items()
        }
        findings = [f.value for f in a.findings]
        out.append(words.reconciled(_label(a), named, findings, words.speed_headline(a.speed), m.remeasure))
    return out + ([words.one_lr(m.one_lr)] if m.one_lr is not None else [])


def title(m: Matrix) -> str:
    """The matrix's heading: against which baseline, under which lenses."""
    where = " (an lr grid: each arm at its own best lr, unless the column says otherwise)" if m.lr_grid else ""
    return f"Verdict matrix: each arm against {m.baseline} under every lens the runs support{where}"


def sections(m: Matrix | None) -> list[Section]:
    """The matrix as a table (every column left-aligned; also the paper writers') and its reconciled sentences; none
    without arms."""
    if m is None or not m.arms:
        return []
    hs = tuple(headers(m))
    rows = tuple(tuple(line) for line in body(m))
    return [
        Table("matrix", title(m), hs, rows, heading=title(m), left=hs, paper=True, marks=marks(m)),
        Sentences("reconciled", tuple(sentences(m))),
    ]

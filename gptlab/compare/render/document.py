"""The report document of a comparison, built once: every section in reading order, which the terminal, Markdown,
HTML, W&B and paper (CSV, LaTeX) writers walk (render/terminal.py, markdown.py, html_page.py, wandb_log.py,
paper.py)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from gptlab.compare.render import compute, decode, matrix, paper_cells, per_arm, report, runs, target_report
from gptlab.compare.render.sections import Document, Figure, Figures, Notes, Section, Sentences, Shown
from gptlab.compare.tables.analysis import Comparison


def figures(images: dict[str, Path]) -> Figures | None:
    """The comparison's PNGs, captioned by name (None without any)."""
    found = tuple(Figure(name, name.replace("_", " "), path) for name, path in images.items())
    return Figures(found) if found else None


def build(
    cmp: Comparison, images: dict[str, Path] | None = None, power: bool = False, studies: Sequence[Section] = ()
) -> Document:
    """The whole report of `cmp`: the verdict matrix, the per-arm sentences, the main table (the terminal adds the
    lead notes), power (with `power`), the flags' legend, targets, equal compute, the per-arm tables, the notes, what
    the runs logged, decode, the `studies` (factorial effects, an lr grid), the PNGs and the compared runs."""
    lines = compute.lines(cmp.compute)
    parts: list[Section | None] = [
        *matrix.sections(cmp.matrix),
        report.verdict_sentences(cmp),
        paper_cells.main_table(report.main_table(cmp), cmp),
        Notes(tuple(report.lead_notes(cmp)), shown=Shown.TERMINAL),
        report.power_table(cmp) if power else None,
        report.legend(cmp),
        *target_report.sections(cmp),
        Sentences("equal_compute", tuple(lines), heading="Equal compute") if lines else None,
        per_arm.table(per_arm.VAL_SETS, [(r.metric, "lower", r.cells) for r in cmp.val_sets]),
        per_arm.table(per_arm.PROBES, [(r.metric, r.better, r.cells) for r in cmp.probes]),
        per_arm.table(per_arm.EVALS, [(r.metric, None, r.cells) for r in cmp.evals]),
        Notes(tuple(report.notes(cmp)), shown=Shown.FILES),
        report.logged(cmp),
        decode.table(cmp.decode, cmp.baseline) if cmp.decode else None,
        *studies,
        figures(images or {}),
        runs.section(cmp),
    ]
    found = tuple(p for p in parts if p is not None)
    return Document(report.title(cmp), f" (baseline: {cmp.baseline})", found)

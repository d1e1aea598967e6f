"""The report's per-arm tables (validation sets, capability probes, downstream evals): one metric per row, one arm per
column, each cell the arm's mean ± std over seeds with its Δ and verdict against the baseline (words.arm_cell).

A new per-arm table is one PerArm here (its headings and note) and one line in document.py handing it its rows;
every writer (terminal, Markdown, HTML, W&B) draws it as it draws any table.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gptlab.compare.render import words
from gptlab.compare.render.sections import Table
from gptlab.compare.statistics.stats import ALPHA
from gptlab.compare.tables.cells import ArmCell


@dataclass(frozen=True)
class PerArm:
    """What a per-arm table says around its cells: its key (HTML class, W&B table), the files' heading, the
    terminal's title, the first column's header, the note under it and whether each Δ shows its 95% interval."""

    key: str
    heading: str
    title: str
    first: str
    note: str
    interval: bool = False


VAL_SETS = PerArm(
    "val_sets",
    "Validation sets",
    "validation sets (mean ± std over seeds; Δ vs baseline, Welch)",
    "validation set",
    "Validation-set table: each extra validation set's loss (data.val_sets, val/<name>/loss) at the compared point, "
    f"mean ± std over seeds; Δ vs the baseline with its 95% Welch interval and Welch's t-test as for val loss "
    f"(p < {ALPHA}: {words.BETTER_WORSE}, lower is better); every run scored a row on the same set (summary.json "
    "val_sets: fingerprint and sequences).",
    interval=True,
)
PROBES = PerArm(
    "probes",
    "Probes",
    "probes (mean ± std over seeds; Δ vs baseline, Welch)",
    "probe",
    "Probe table: each probe/* value at the compared point, mean ± std over seeds; Δ vs the baseline with Welch's "
    f"t-test as for val loss (p < {ALPHA}: {words.BETTER_WORSE}; accuracies are better higher, losses lower); every "
    "run measured a row on one fixed set (summary.json probe_sets).",
)
EVALS = PerArm(
    "evals",
    "Downstream evals",
    "downstream evals (mean ± std over seeds; Δ vs baseline, Welch)",
    "eval",
    "Eval table: lm-evaluation-harness metrics from each run's eval.json (gptlab-eval) at the run's last step, mean ± "
    f"std over seeds; Δ vs the baseline with Welch's t-test (p < {ALPHA}); every run of a row measured it the same "
    "way.",
)


def table(kind: PerArm, rows: Sequence[tuple[str, str | None, Sequence[ArmCell]]]) -> Table | None:
    """The table of `rows`, each (metric, its better side "higher"/"lower" or None for none, the arms' cells,
    baseline first); None without rows."""
    if not rows:
        return None
    headers = (kind.first, *(c.label for c in rows[0][2]))
    body = tuple(
        (metric, *(words.arm_cell(c.mean, c.std, c.delta, c.verdict, better, kind.interval) for c in cells))
        for metric, better, cells in rows
    )
    return Table(kind.key, kind.title, headers, body, heading=kind.heading, left=(kind.first,), note=kind.note)

"""The probe table in words: each probe metric per arm, better / worse by the metric's direction."""

from __future__ import annotations

from gptlab.compare.render import words
from gptlab.compare.render.extra_table import ExtraTable
from gptlab.compare.statistics.stats import ALPHA
from gptlab.compare.statistics.verdict import Status
from gptlab.compare.tables.cells import ArmCell
from gptlab.compare.tables.probes import ProbeRow


def _verdict(cell: ArmCell, better: str) -> str:
    v = cell.verdict
    if cell.delta is None or v is None:
        return ""
    if v.status is Status.NO_TEST:
        return f" Δ {cell.delta:+.4f} n/a (1 seed)"
    word = words.better_or_worse(v, better) if v.decided else words.significance(v)
    return f" Δ {cell.delta:+.4f} {word} (p={words.p_value(v.p)})"


def cell_text(cell: ArmCell, better: str) -> str:
    """`0.5120 ± 0.0200 Δ +0.1180 better (p=0.003)`; the baseline's without Δ; `–` where the arm has no value."""
    if cell.mean is None:
        return "–"
    spread = f" ± {cell.std:.4f}" if cell.std is not None else ""
    return f"{cell.mean:.4f}{spread}{_verdict(cell, better)}"


def table(rows: list[ProbeRow]) -> tuple[list[str], list[list[str]]]:
    """Headers (metric, then each arm) and one line of display strings per metric."""
    headers = ["probe", *(c.label for c in rows[0].cells)] if rows else []
    return headers, [[r.metric, *(cell_text(c, r.better) for c in r.cells)] for r in rows]


NOTE = (
    "Probe table: each probe/* value at the compared point, mean ± std over seeds; Δ vs the baseline with Welch's "
    f"t-test as for val loss (p < {ALPHA}: better/worse; accuracies are better higher, losses lower); every run "
    "measured a row on one fixed set (summary.json probe_sets)."
)


def extra_table(rows: list[ProbeRow]) -> ExtraTable | None:
    """The probe table for the report (None without probes)."""
    if not rows:
        return None
    headers, body = table(rows)
    return ExtraTable("Probes", "probes (mean ± std over seeds; Δ vs baseline, Welch)", "probes", headers, body, NOTE)

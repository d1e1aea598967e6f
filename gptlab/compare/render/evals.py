"""The downstream-eval table in words: each eval.json metric per arm with its verdict."""

from __future__ import annotations

from gptlab.compare.render import words
from gptlab.compare.render.extra_table import ExtraTable
from gptlab.compare.statistics.stats import ALPHA
from gptlab.compare.statistics.verdict import Status
from gptlab.compare.tables.cells import ArmCell
from gptlab.compare.tables.evals import EvalRow


def cell_text(cell: ArmCell) -> str:
    """`0.5120 ± 0.0200 Δ +0.1180 (p=0.003, significant)`; `–` where the arm has no value."""
    if cell.mean is None:
        return "–"
    text = f"{cell.mean:.4f}" + (f" ± {cell.std:.4f}" if cell.std is not None else "")
    if cell.delta is None:
        return text
    v = cell.verdict
    if v is None or v.status is Status.NO_TEST:
        return f"{text} Δ {cell.delta:+.4f} n/a (1 seed)"
    return f"{text} Δ {cell.delta:+.4f} {words.significance(v)} (p={words.p_value(v.p)})"


def table(rows: list[EvalRow]) -> tuple[list[str], list[list[str]]]:
    """Headers (metric, then each arm) and one line of display strings per metric."""
    headers = ["eval", *(c.label for c in rows[0].cells)] if rows else []
    return headers, [[r.metric, *(cell_text(c) for c in r.cells)] for r in rows]


NOTE = (
    "Eval table: lm-evaluation-harness metrics from each run's eval.json (gptlab-eval) at the run's last step, mean ± "
    f"std over seeds; Δ vs the baseline with Welch's t-test (p < {ALPHA}); every run of a row measured it the same way."
)


def extra_table(rows: list[EvalRow]) -> ExtraTable | None:
    """The eval table for the report (None without evals)."""
    if not rows:
        return None
    headers, body = table(rows)
    title = "downstream evals (mean ± std over seeds; Δ vs baseline, Welch)"
    return ExtraTable("Downstream evals", title, "evals", headers, body, NOTE)

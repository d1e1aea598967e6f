"""A report's extra per-arm tables (capability probes, downstream evals): their modules make the headers and cells,
this one renders them alike in Markdown, on the terminal and in HTML."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from gptlab.compare.statistics import stats, verdict
from gptlab.compare.statistics.stats import ALPHA
from gptlab.compare.statistics.verdict import Verdict


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

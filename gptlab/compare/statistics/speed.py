"""Speed with its noise: tokens/s and step ms per run and over seeds, and the outside load each run recorded (the
speed-up's verdict is compare/statistics/verdict.py's ratio)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from gptlab.compare.reading.runs import Run
from gptlab.compare.statistics import stats

# A run whose machine gave this share of its cores to other processes has speed figures not worth trusting.
OUTSIDE_LOAD_LIMIT = 0.25


def run_speed(run: Run, summary_key: str, metric: str, agg) -> float | None:
    """A speed figure from summary.json, else aggregated from the metrics records."""
    value = run.summary.get(summary_key)
    if value is not None:
        return float(value)
    vals = [float(r[metric]) for r in run.records if r.get(metric) is not None]
    return agg(vals) if vals else None


def per_run(runs: list[Run], summary_key: str, metric: str) -> list[float]:
    """Each run's median of `metric` (runs without it are left out)."""
    values = [run_speed(r, summary_key, metric, stats.median) for r in runs]
    return [v for v in values if v is not None and math.isfinite(v) and v > 0]


def spread(values: Sequence[float]) -> tuple[float | None, float | None]:
    """(mean, std over seeds); std None for one value, both None for none."""
    return (stats.mean(values), stats.std(values)) if values else (None, None)


def geometric(values: Sequence[float]) -> tuple[float | None, float | None]:
    """(geometric mean, geometric sd factor exp(std of logs)) over seeds: the statistic a speed-up is a ratio of;
    the factor None for one value, both None for none."""
    if not values:
        return None, None
    logs = [math.log(v) for v in values]
    sd = stats.std(logs)
    return math.exp(stats.mean(logs)), (math.exp(sd) if sd is not None else None)


def run_load(run: Run) -> float | None:
    """The outside load one run recorded (summary `outside_load`: share of the cores other processes used)."""
    value = run.summary.get("outside_load")
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def loaded(run: Run, limit: float = OUTSIDE_LOAD_LIMIT) -> bool:
    """True when the run's speed was taken under outside load above `limit` (not to be trusted); the limit is
    OUTSIDE_LOAD_LIMIT, or the measured noise floor's (compare/statistics/noise_floor.py)."""
    load = run_load(run)
    return load is not None and load > limit


def outside_load(runs: list[Run]) -> float | None:
    """The worst recorded outside load among the runs (summary `outside_load`); None when no run recorded it."""
    loads = [load for run in runs if (load := run_load(run)) is not None]
    return max(loads) if loads else None


def mem_text(x: float | None) -> str:
    """Bytes for a table cell in binary units (1.50 GiB, 12.00 MiB, 512 B); '–' when not measured."""
    if x is None:
        return "–"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if x >= scale:
            return f"{x / scale:.2f} {unit}"
    return f"{x:.0f} B"

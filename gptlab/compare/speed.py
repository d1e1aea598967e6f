"""Speed with its noise: tokens/s and step ms over seeds, a speed-up with a CI and a Welch verdict, outside load."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

from gptlab.compare import stats
from gptlab.compare.runs import Run

# A run whose machine gave this share of its cores to other processes has speed figures not worth trusting.
OUTSIDE_LOAD_LIMIT = 0.25
IDENTICAL = "within noise (identical model)"


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


def outside_load(runs: list[Run]) -> float | None:
    """The worst recorded outside load among the runs (summary `outside_load`); None when no run recorded it."""
    loads = []
    for run in runs:
        value = run.summary.get("outside_load")
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            loads.append(float(value))
    return max(loads) if loads else None


@dataclass(frozen=True)
class SpeedUp:
    """tokens/s of an arm over the baseline's: ratio of geometric means, 95% CI, Welch p and the verdict."""

    ratio: float | None
    ci: tuple[float, float] | None
    p: float | None
    verdict: str


def speedup(arm: Sequence[float], base: Sequence[float], alpha: float) -> SpeedUp:
    """Welch's t-test on log tokens/s (speed-ups are ratios); one seed on either side gives no verdict."""
    if not arm or not base:
        return SpeedUp(None, None, None, "–")
    la, lb = [math.log(v) for v in arm], [math.log(v) for v in base]
    diff = stats.mean(la) - stats.mean(lb)
    test = stats.welch_test(la, lb)
    if test is None:
        return SpeedUp(math.exp(diff), None, None, f"n/a: {min(len(arm), len(base))} seed")
    # welch_test gave a verdict, so both sides have >= 2 seeds and a std
    se = math.sqrt(cast(float, stats.std(la)) ** 2 / len(la) + cast(float, stats.std(lb)) ** 2 / len(lb))
    half = stats.t_critical(alpha, test.df) * se if se > 0 else 0.0
    ci = (math.exp(diff - half), math.exp(diff + half))
    if test.p >= alpha:
        word = "within noise"
    else:
        word = "faster" if diff > 0 else "slower"
    return SpeedUp(math.exp(diff), ci, test.p, word)


def mem_text(x: float | None) -> str:
    """Bytes for a table cell in binary units (1.50 GiB, 12.00 MiB, 512 B); '–' when not measured."""
    if x is None:
        return "–"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if x >= scale:
            return f"{x / scale:.2f} {unit}"
    return f"{x:.0f} B"

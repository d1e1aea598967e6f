"""The numbers the verdict-carrying plots draw, computed without matplotlib so that a test can hold them against the
table (gptlab.compare.render.plots only draws them).

- delta_curves: per arm, Δ val loss vs the baseline at every eval point both have (x = step, or tokens when the
  runs are compared at equal tokens) with its 95% Welch interval: the table's test on the seeds present there, so
  at the compared point the Δ is the table's and the interval excludes 0 exactly when the table calls it
  significant (an identical-model arm is noise whatever its interval: `identical` says so);
- train_band: per group, each run's train loss smoothed by a trailing mean over SMOOTH_FRACTION of its logged
  points, then mean and min–max over the seeds at each step;
- speed_points: per group, each run's tokens/s (the table's per-seed values, in order) and whether that run was
  taken under outside load;
- loaded_runs: per group, the runs whose speed was taken under outside load.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gptlab.compare.reading.align import tokens_at
from gptlab.compare.reading.group import Group
from gptlab.compare.reading.runs import Run
from gptlab.compare.statistics import speed, stats
from gptlab.compare.statistics.stats import ALPHA
from gptlab.compare.tables.analysis import Comparison

SMOOTH_FRACTION = 0.1  # the trailing mean over this share of a run's logged train-loss points (at least 1)


@dataclass
class DeltaCurve:
    """One arm's Δ val loss vs the baseline: at each x, mean(arm) - mean(baseline) over the seeds evaluated there,
    and its 95% Welch interval (lo/hi NaN where a side has fewer than 2 seeds). `at` is the compared point's x."""

    label: str
    by: str
    x: list[float]
    delta: list[float]
    lo: list[float]
    hi: list[float]
    at: float
    identical: bool

    def at_point(self) -> tuple[float, float, float]:
        """(Δ, lo, hi) at the compared point."""
        i = self.x.index(self.at)
        return self.delta[i], self.lo[i], self.hi[i]


def _evals(run: Run, by: str) -> dict[float, float]:
    """x -> the run's val loss at each eval (x = step, or tokens seen by then)."""
    out = {}
    for step in run.val_steps():
        x = float(step) if by == "step" else tokens_at(run, step)
        if x is not None:
            out[float(x)] = float(run.by_step[step]["val/loss"])
    return out


def delta_curves(cmp: Comparison) -> list[DeltaCurve]:
    """One DeltaCurve per arm (the baseline has none), in table order."""
    by = cmp.point.by if cmp.point else "step"
    at = float(cmp.point.value if cmp.point else cmp.step)
    base = [_evals(r, by) for r in cmp.groups[0].runs]
    curves = []
    for g, row in zip(cmp.groups[1:], cmp.rows[1:]):
        arm = [_evals(r, by) for r in g.runs]
        xs = sorted({x for e in arm for x in e} & {x for e in base for x in e})
        curve = DeltaCurve(row.label, by, [], [], [], [], at, cmp.rows[0].label in row.identical_to)
        for x in xs:
            a, b = [e[x] for e in arm if x in e], [e[x] for e in base if x in e]
            interval = stats.welch_interval(a, b, ALPHA)
            curve.x.append(x)
            curve.delta.append(stats.mean(a) - stats.mean(b))
            curve.lo.append(interval.lo if interval else math.nan)
            curve.hi.append(interval.hi if interval else math.nan)
        curves.append(curve)
    return curves


def smoothed_train_loss(run: Run) -> tuple[list[int], list[float]]:
    """(steps, train loss) with a trailing mean over max(1, round(SMOOTH_FRACTION × points)) logged points."""
    points = sorted(
        (s, float(rec["train/loss"])) for s, rec in run.by_step.items() if rec.get("train/loss") is not None
    )
    points = [(s, v) for s, v in points if math.isfinite(v)]
    window = max(1, round(SMOOTH_FRACTION * len(points)))
    values = [v for _, v in points]
    smooth = [stats.mean(values[max(0, i + 1 - window) : i + 1]) for i in range(len(values))]
    return [s for s, _ in points], smooth


@dataclass
class Band:
    """A group's curve over its seeds: at each x the mean, min and max, and how many seeds had a value."""

    x: list[float]
    mean: list[float]
    lo: list[float]
    hi: list[float]
    n: list[int]


def train_band(g: Group) -> Band | None:
    """The group's smoothed train loss: mean and min–max over seeds at each logged step; None without train loss."""
    per_run = [dict(zip(*smoothed_train_loss(r))) for r in g.runs]
    steps = sorted({s for c in per_run for s in c})
    if not steps:
        return None
    band = Band([], [], [], [], [])
    for s in steps:
        values = [c[s] for c in per_run if s in c]
        band.x.append(float(s))
        band.mean.append(stats.mean(values))
        band.lo.append(min(values))
        band.hi.append(max(values))
        band.n.append(len(values))
    return band


def speed_points(g: Group, limit: float = speed.OUTSIDE_LOAD_LIMIT) -> list[tuple[float, bool]]:
    """(tokens/s, under outside load) of each run that measured its speed: the table's per-seed values, in order."""
    out = []
    for run in g.runs:
        value = speed.run_speed(run, "tokens_per_s_median", "perf/tokens_per_s", stats.median)
        if value is not None and math.isfinite(value) and value > 0:
            out.append((value, speed.loaded(run, limit)))
    return out


def loaded_runs(g: Group, limit: float = speed.OUTSIDE_LOAD_LIMIT) -> list[Run]:
    """The group's runs whose speed was taken under outside load (above `limit`: the comparison's load limit)."""
    return [r for r in g.runs if speed.loaded(r, limit)]

"""Equal compute: val loss at equal training FLOPs and at equal time, and what each matched arm re-solved.

Equal steps stay the comparison's contract; this is the cost view beside it. Every eval row of metrics.jsonl carries
`flops`, the cumulative training FLOPs (tokens × the cost model's training FLOPs per token, the MFU numerator); a run
written before that column has it rebuilt from its summary's `flops_per_token` × the row's `tokens`, and is "not
available" without them. Each run's val loss is interpolated linearly between its eval points (step 0 at x = 0: no
FLOPs, no training time yet) at the largest x every compared run reached — or, when the runs share a train.eval_flops
grid (every run evaluated a step either side of each point), at the largest grid point they all reached, so the
reading is all but measured. Each arm is held against the baseline there with a 95% Welch interval over seeds. A
chord between two evals is not the curve (over a convex curve it sits above it, favouring the arm read nearer an
eval), so a decided verdict is held against each seed's bracket (the two evals around its reading) and is
"unresolved" when the bracket could flip it. Time is the comparison's clock (reading/clock.py): training time
(`train_s`) where every run recorded it, else wall time. The equal-time verdict depends on speed, so it carries the
table's under-load and run-order caveats; an identical model is noise on both axes.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from gptlab.compare.reading.clock import NAMES
from gptlab.compare.reading.runs import Run
from gptlab.compare.statistics import stats, verdict
from gptlab.compare.statistics.stats import ALPHA
from gptlab.compare.statistics.verdict import Caveat, Verdict
from gptlab.compare.tables.analysis import Comparison

AXES = {"flops": "training FLOPs", **NAMES}  # x key -> its name (the time keys: reading/clock.py)


def fill_flops(run: Run) -> str | None:
    """Give an older run's eval rows `flops` (= tokens × summary flops_per_token); the reason when it cannot."""
    evals = [run.by_step[s] for s in run.val_steps()]
    if all(rec.get("flops") is not None for rec in evals):
        return None
    per_token = run.summary.get("flops_per_token")
    if not isinstance(per_token, (int, float)) or isinstance(per_token, bool) or not per_token > 0:
        return f"{run.path}: no flops column and no flops_per_token in summary.json"
    for step, rec in zip(run.val_steps(), evals):
        tokens = 0 if step == 0 else rec.get("tokens")
        if tokens is None:
            return f"{run.path}: eval rows without tokens (step {step})"
        rec.setdefault("flops", float(tokens) * float(per_token))
    return None


def curve(run: Run, axis: str) -> tuple[list[float], list[float]] | None:
    """(x, val loss) at the run's eval points, x increasing; step 0 at x = 0; None when an eval lacks x."""
    xs, ys = [], []
    for step in run.val_steps():
        rec = run.by_step[step]
        x = 0.0 if step == 0 else rec.get(axis)
        if x is None or not math.isfinite(float(x)):
            return None
        xs.append(float(x))
        ys.append(float(rec["val/loss"]))
    if not xs or any(b < a for a, b in zip(xs, xs[1:])):
        return None
    return xs, ys


def loss_at(xs: list[float], ys: list[float], x: float) -> float:
    """Val loss at x, linear between the two eval points around it (x within [xs[0], xs[-1]], never extrapolated)."""
    if not xs[0] <= x <= xs[-1]:
        raise ValueError(f"x={x} outside the run's evals [{xs[0]}, {xs[-1]}]")
    return float(np.interp(x, xs, ys))


def bracket(xs: list[float], ys: list[float], x: float) -> tuple[float, float]:
    """(low, high) of the two evals' val losses around x: where the truth may lie on a curve that is not a straight
    line between them (the chord over a convex curve sits above it); (y, y) when x is an eval point."""
    i = int(np.searchsorted(xs, x))
    if i < len(xs) and xs[i] == x:
        return ys[i], ys[i]
    lo, hi = ys[i - 1], ys[i]
    return min(lo, hi), max(lo, hi)


@dataclass
class ArmAt:
    """One group at the common x: its seeds' interpolated losses, Δ vs the baseline with a 95% Welch CI, verdict."""

    label: str
    losses: list[float]
    mean: float
    delta: float
    verdict: Verdict
    under_load: bool = False
    brackets: list[tuple[float, float]] = field(default_factory=list)  # per seed: the evals' losses around x

    @property
    def ci(self) -> list[float] | None:
        """The 95% Welch interval of delta (None with 1 seed on a side, and for the baseline)."""
        return list(self.verdict.interval) if self.verdict.interval else None


@dataclass
class AxisResult:
    """Val loss at equal `axis` (flops, train_s or wall_s): the common x and one ArmAt per group (baseline first); or
    why not."""

    axis: str
    x: float | None
    arms: list[ArmAt] = field(default_factory=list)
    missing: str | None = None
    planned: bool = False  # x is a point of the runs' shared train.eval_flops grid, not only the most all reached


def shared_grid(runs: list[Run]) -> list[float]:
    """The cumulative-FLOPs grid every run evaluated around (train.eval_flops), when all share one; else []."""
    grids = set()
    for run in runs:
        given = (run.config.get("train") or {}).get("eval_flops") if isinstance(run.config, dict) else None
        if not isinstance(given, list) or not given:
            return []
        grids.add(tuple(sorted(float(f) for f in given)))
    return list(grids.pop()) if len(grids) == 1 else []


def at_equal(cmp: Comparison, axis: str) -> AxisResult:
    """Every group's val loss at the largest `axis` value every run reached, against the baseline's."""
    curves = [[(run, curve(run, axis)) for run in g.runs] for g in cmp.groups]
    lacking = [str(run.path) for per in curves for run, c in per if c is None]
    if lacking:
        return AxisResult(axis, None, missing=f"not available: no {axis} at every eval in {lacking[0]}")
    x = min(c[0][-1] for per in curves for _, c in per if c is not None)
    if not x > 0:
        return AxisResult(axis, None, missing=f"not available: a run has no {AXES[axis]} past its first eval")
    grid = shared_grid([run for g in cmp.groups for run in g.runs]) if axis == "flops" else []
    on_grid = [f for f in grid if f <= x]
    x = max(on_grid) if on_grid else x  # a planned point: every run evaluated a step either side of it
    result = AxisResult(axis, x, planned=bool(on_grid))
    base = [loss_at(*c, x) for _, c in curves[0] if c is not None]
    base_brackets = [bracket(*c, x) for _, c in curves[0] if c is not None]
    for g, row, per in zip(cmp.groups, cmp.rows, curves):
        losses = [loss_at(*c, x) for _, c in per if c is not None]
        brackets = [bracket(*c, x) for _, c in per if c is not None]
        timed = axis != "flops"  # a time axis: speed is in it
        loaded = timed and (row.under_load or cmp.rows[0].under_load)  # the table's own flags
        if g is cmp.groups[0]:
            found = verdict.baseline(f"val/loss@{axis}")
        else:
            identical = cmp.rows[0].label in row.identical_to
            found = verdict.difference(f"val/loss@{axis}", losses, base, ALPHA, identical)
            found = verdict.bracketed(found, brackets, base_brackets)
        if loaded:
            found = found.with_caveat(Caveat.UNDER_LOAD)
        if timed and Caveat.CONFOUNDED in row.speed.caveats:  # time is speed: the same confound
            found = found.with_caveat(Caveat.CONFOUNDED)
        delta = stats.mean(losses) - stats.mean(base)
        result.arms.append(ArmAt(row.label, losses, stats.mean(losses), delta, found, loaded, brackets))
    return result


@dataclass
class EqualCompute:
    """Both equal-compute views and the matched arms' records (label -> summary.json `match`)."""

    axes: list[AxisResult]
    matched: dict[str, dict] = field(default_factory=dict)
    rebuilt: list[str] = field(default_factory=list)  # runs whose flops column came from flops_per_token × tokens

    def to_json(self) -> dict[str, Any]:
        return {
            "alpha": ALPHA,
            "axes": [
                {**asdict(a), "arms": [{**asdict(arm), "verdict": arm.verdict.to_json()} for arm in a.arms]}
                for a in self.axes
            ],
            "matched": self.matched,
            "flops_rebuilt_from_summary": self.rebuilt,
        }


def equal_compute(cmp: Comparison) -> EqualCompute:
    """The equal-FLOPs and equal-time verdicts (on the comparison's clock) of a comparison (older runs get their
    flops column rebuilt)."""
    rebuilt, why = [], []
    for g in cmp.groups:
        for run in g.runs:
            had = all(run.by_step[s].get("flops") is not None for s in run.val_steps())
            reason = fill_flops(run)
            why += [reason] if reason else []
            if not had and not reason:
                rebuilt.append(str(run.path))
    axes = [at_equal(cmp, axis) for axis in ("flops", cmp.clock.key)]
    if why:
        axes[0] = AxisResult("flops", None, missing=f"not available: {why[0]}")
    matched = {
        g.label: rec
        for g in cmp.groups
        if isinstance(rec := next((r.summary.get("match") for r in g.runs if r.summary.get("match")), None), dict)
    }
    return EqualCompute(axes, matched, rebuilt)

"""Steps to target (--target) and the smallest arm value that reaches it in every seed (--threshold)."""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, cast

from gptlab.compare.reading.group import Group
from gptlab.compare.reading.runs import Run
from gptlab.compare.statistics import stats, verdict
from gptlab.compare.statistics.speed import OUTSIDE_LOAD_LIMIT, outside_load
from gptlab.compare.statistics.stats import ALPHA
from gptlab.compare.statistics.verdict import Status, Verdict
from gptlab.errors import ConfigError

_SPEC = re.compile(r"^\s*([^<>=\s]+)\s*(<=|>=|=)\s*(\S+)\s*$")
ALLOWED = "METRIC=X (lower is better for *loss*, higher for *acc*), METRIC<=X or METRIC>=X"
NOT_METRICS = frozenset({"step"})


@dataclass(frozen=True)
class Target:
    """A metric and the side of a value it must reach: `val/loss <= 3.2` or `val/acc >= 0.9`."""

    metric: str
    op: str
    value: float

    @property
    def text(self) -> str:
        """Human form, e.g. `val/loss <= 3.2`."""
        return f"{self.metric} {self.op} {self.value:g}"

    def reached(self, x: float) -> bool:
        """True when x is at or past the target (a NaN, a diverged run, never is)."""
        return x <= self.value if self.op == "<=" else x >= self.value


def direction(metric: str) -> str | None:
    """`<=` for a loss-like metric, `>=` for an accuracy-like one, None when the name does not say."""
    name = metric.rsplit("/", 1)[-1].lower()
    if "loss" in name or name in ("ppl", "perplexity") or "err" in name:
        return "<="
    if "acc" in name:
        return ">="
    return None


def parse_target(spec: str, flag: str = "--target") -> Target:
    """Parse `METRIC=X`, `METRIC<=X` or `METRIC>=X`; anything else is a one-line ConfigError naming the flag."""
    m = _SPEC.match(spec)
    if not m:
        raise ConfigError(f"{flag} '{spec}': expected {ALLOWED}")
    metric, op, raw = m.groups()
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise ConfigError(f"{flag} '{spec}': '{raw}' is not a finite number; expected {ALLOWED}")
    if op == "=":
        op = direction(metric) or ""
        if not op:
            raise ConfigError(
                f"{flag} '{spec}': cannot tell whether lower or higher {metric} is better; "
                f"write {metric}<={raw} or {metric}>={raw}"
            )
    return Target(metric, op, value)


def logged_metrics(runs: list[Run]) -> list[str]:
    """Numeric keys any run recorded in metrics.jsonl, in first-seen order."""
    seen: dict[str, None] = {}
    for run in runs:
        for rec in run.records:
            for key, v in rec.items():
                if key not in NOT_METRICS and isinstance(v, (int, float)) and not isinstance(v, bool):
                    seen.setdefault(key, None)
    return list(seen)


def check_metric(target: Target, runs: list[Run], flag: str = "--target") -> None:
    """Refuse a metric that some run never logged, naming the metrics the runs did log."""
    for run in runs:
        if not any(r.get(target.metric) is not None for r in run.by_step.values()):
            have = logged_metrics(runs)
            where = "no run logged it" if target.metric not in have else f"run {run.path} never logged it"
            raise ConfigError(
                f"{flag} {target.text}: unknown metric '{target.metric}' ({where}); "
                f"metrics logged: {', '.join(have) or 'none'}"
            )


def x_at(run: Run, step: int, key: str) -> float | None:
    """`tokens`/`wall_s` at step: as recorded, else interpolated from neighbouring rows; never extrapolated."""
    if step == 0:
        return 0.0  # the initial model: no token seen, no training time (an eval row's own duration is not training)
    known = {s: float(r[key]) for s, r in run.by_step.items() if r.get(key) is not None}
    if step in known:
        return known[step]
    known[0] = 0.0
    below = max((s for s in known if s < step), default=None)
    above = min((s for s in known if s > step), default=None)
    if below is None or above is None:
        return None
    frac = (step - below) / (above - below)
    return known[below] + frac * (known[above] - known[below])


@dataclass
class SeedHit:
    """One run's first step at or past the target (None: not reached by last_step) and tokens/wall there."""

    seed: Any
    run: str
    reached: bool
    step: int | None
    tokens: float | None
    wall_s: float | None
    value: float | None
    last_step: int


def first_hit(run: Run, target: Target) -> SeedHit:
    """Scan the steps where the run recorded the metric, in order, for the first one at or past the target."""
    steps = sorted(s for s, r in run.by_step.items() if r.get(target.metric) is not None)
    seed = run.config.get("seed")
    for s in steps:
        value = float(run.by_step[s][target.metric])
        if target.reached(value):
            return SeedHit(
                seed, str(run.path), True, s, x_at(run, s, "tokens"), x_at(run, s, "wall_s"), value, steps[-1]
            )
    return SeedHit(seed, str(run.path), False, None, None, None, None, steps[-1] if steps else 0)


def _spread(xs: list[float | None]) -> tuple[float | None, float | None]:
    """Mean and std of the values, or (None, None) when any is unknown or there are none."""
    if not xs or any(x is None for x in xs):
        return None, None
    known = cast(list[float], xs)  # none is None (checked above)
    return stats.mean(known), stats.std(known)


@dataclass
class TargetRow:
    """One arm's steps/tokens/wall to the target: mean ± std over the seeds that reached it, and how many did."""

    label: str
    n_seeds: int
    n_reached: int
    steps_mean: float | None
    steps_std: float | None
    tokens_mean: float | None
    tokens_std: float | None
    wall_s_mean: float | None
    wall_s_std: float | None
    not_reached_by: list[int]
    # Speed-ups to target (rates: 1 / steps, 1 / wall time), Welch on the logs; NOT_MEASURED until compared.
    speedup_steps: Verdict = field(default_factory=lambda: Verdict("steps", Status.NOT_MEASURED, ratio=True))
    speedup_wall: Verdict = field(default_factory=lambda: Verdict("wall_s", Status.NOT_MEASURED, ratio=True))
    under_load: bool = False  # wall times taken while other processes held the cores (not worth trusting)
    seeds: list[SeedHit] = field(default_factory=list)

    @property
    def all_reached(self) -> bool:
        """Every seed reached the target."""
        return self.n_reached == self.n_seeds


def target_row(g: Group, target: Target) -> TargetRow:
    """Per-seed hits of one group summarised; the unreached seeds are counted, never averaged away."""
    hits = [first_hit(r, target) for r in g.runs]
    ok = [h for h in hits if h.reached]
    steps = _spread([float(cast(int, h.step)) for h in ok])  # a seed that reached the target has its step
    tokens, wall = _spread([h.tokens for h in ok]), _spread([h.wall_s for h in ok])
    return TargetRow(
        g.label, len(hits), len(ok), *steps, *tokens, *wall, [h.last_step for h in hits if not h.reached], seeds=hits
    )


def _rates(hits: list[SeedHit], key: str) -> list[float]:
    """1 / (steps or wall time) to target per seed: a rate, so verdict.ratio's higher-is-faster test applies."""
    values = [getattr(h, key) for h in hits]
    return [1.0 / v for v in values if v]


def _versus(row: TargetRow, base: TargetRow) -> None:
    """Speed-ups to target with their noise: ratio of geometric means, 95% CI and Welch verdict (never bare)."""
    row.speedup_steps = verdict.ratio("steps", _rates(row.seeds, "step"), _rates(base.seeds, "step"), ALPHA)
    arm_wall, base_wall = _rates(row.seeds, "wall_s"), _rates(base.seeds, "wall_s")
    if len(arm_wall) == row.n_seeds and len(base_wall) == base.n_seeds:  # every seed's wall time known
        row.speedup_wall = verdict.ratio("wall_s", arm_wall, base_wall, ALPHA)


def resolution(runs: list[Run], metric: str) -> list[int]:
    """The usual gap between consecutive steps that recorded the metric, per run (e.g. train.eval_interval)."""
    gaps = set()
    for run in runs:
        steps = sorted(s for s, r in run.by_step.items() if r.get(metric) is not None)
        diffs = Counter(b - a for a, b in zip(steps, steps[1:]))
        if diffs:
            gaps.add(diffs.most_common(1)[0][0])
    return sorted(gaps)


@dataclass
class TargetResult:
    """The target, its step resolution and one row per group (baseline first)."""

    target: Target
    resolution: list[int]
    rows: list[TargetRow]

    def to_json(self) -> dict[str, Any]:
        """The comparison.json `targets` entry."""
        return {
            "metric": self.target.metric,
            "op": self.target.op,
            "value": self.target.value,
            "text": self.target.text,
            "resolution_steps": self.resolution,
            "rows": [
                {
                    **asdict(r),
                    "speedup_steps": r.speedup_steps.to_json(),
                    "speedup_wall": r.speedup_wall.to_json(),
                    "all_reached": r.all_reached,
                }
                for r in self.rows
            ],
        }


def steps_to_target(groups: list[Group], target: Target, limit: float = OUTSIDE_LOAD_LIMIT) -> TargetResult:
    """Rows for every group (groups[0] is the baseline) with speed-ups where both reached it in every seed; a group
    above `limit` outside load (the comparison's) is under load."""
    rows = [target_row(g, target) for g in groups]
    base = rows[0]
    for row, g in zip(rows, groups):
        load = outside_load(g.runs)
        row.under_load = load is not None and load > limit
        if row is base and row.all_reached and row.steps_mean:
            row.speedup_steps = verdict.baseline("steps", ratio=True)
            if len(_rates(row.seeds, "wall_s")) == row.n_seeds:
                row.speedup_wall = verdict.baseline("wall_s", ratio=True)
        elif row.all_reached and base.all_reached and row.steps_mean:
            _versus(row, base)
    return TargetResult(target, resolution([r for g in groups for r in g.runs], target.metric), rows)

"""Steps to target (--target) and the smallest arm value that reaches it in every seed (--threshold)."""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from typing import Any, cast

from gptlab.compare.reading.clock import Clock
from gptlab.compare.reading.group import Group
from gptlab.compare.reading.runs import Run
from gptlab.compare.statistics import stats, verdict
from gptlab.compare.statistics.speed import outside_load
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
    """`tokens`/`train_s`/`wall_s` at step: as recorded, else interpolated from neighbouring rows; never extrapolated."""
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
    """One run's first step at or past the target (None: not reached by last_step) and tokens/time there (time: the
    comparison's clock, training time or wall time).

    The target was crossed after the previous record of the metric (`prev_step`, 0 when the hit is the first
    record: the start) and at or before `step`: each seed's steps to target lie in (prev_step, step], its time in
    (prev_time_s, time_s] (the times of the same two evals; None where unknown)."""

    seed: Any
    run: str
    reached: bool
    step: int | None
    tokens: float | None
    time_s: float | None
    value: float | None
    last_step: int
    prev_step: int | None = None
    prev_time_s: float | None = None

    @property
    def at_start(self) -> bool:
        """Met the target at initialisation (step 0, or no training time yet): a rate of 1/0, no speed-up."""
        return self.reached and (self.step == 0 or self.time_s == 0.0)


def first_hit(run: Run, target: Target, clock: Clock) -> SeedHit:
    """Scan the steps where the run recorded the metric, in order, for the first one at or past the target."""
    steps = sorted(s for s, r in run.by_step.items() if r.get(target.metric) is not None)
    seed = run.config.get("seed")
    for i, s in enumerate(steps):
        value = float(run.by_step[s][target.metric])
        if target.reached(value):
            prev = steps[i - 1] if i else 0  # the first record: crossed since the start
            hit = SeedHit(
                seed, str(run.path), True, s, x_at(run, s, "tokens"), x_at(run, s, clock.key), value, steps[-1]
            )
            if s > 0:
                hit.prev_step, hit.prev_time_s = prev, x_at(run, prev, clock.key)
            return hit
    return SeedHit(seed, str(run.path), False, None, None, None, None, steps[-1] if steps else 0)


def _spread(xs: list[float | None]) -> tuple[float | None, float | None]:
    """Mean and std of the values, or (None, None) when any is unknown or there are none."""
    if not xs or any(x is None for x in xs):
        return None, None
    known = cast(list[float], xs)  # none is None (checked above)
    return stats.mean(known), stats.std(known)


@dataclass
class TargetRow:
    """One arm's steps/tokens/time to the target: mean ± std over the seeds that reached it, and how many did."""

    label: str
    n_seeds: int
    n_reached: int
    steps_mean: float | None
    steps_std: float | None
    tokens_mean: float | None
    tokens_std: float | None
    time_s_mean: float | None
    time_s_std: float | None
    not_reached_by: list[int]
    # Speed-ups to target (rates: 1 / steps, 1 / time), Welch on the logs; NOT_MEASURED until compared.
    speedup_steps: Verdict = field(default_factory=lambda: Verdict("steps", Status.NOT_MEASURED, ratio=True))
    speedup_time: Verdict = field(default_factory=lambda: Verdict("time_s", Status.NOT_MEASURED, ratio=True))
    under_load: bool = False  # times taken while other processes held the cores (not worth trusting)
    seeds: list[SeedHit] = field(default_factory=list)

    @property
    def all_reached(self) -> bool:
        """Every seed reached the target."""
        return self.n_reached == self.n_seeds

    @property
    def at_start(self) -> list[SeedHit]:
        """The seeds that met the target at initialisation: no speed-up to it is defined for this row's pairs."""
        return [h for h in self.seeds if h.at_start]


def target_row(g: Group, target: Target, clock: Clock) -> TargetRow:
    """Per-seed hits of one group summarised; the unreached seeds are counted, never averaged away."""
    hits = [first_hit(r, target, clock) for r in g.runs]
    ok = [h for h in hits if h.reached]
    steps = _spread([float(cast(int, h.step)) for h in ok])  # a seed that reached the target has its step
    tokens, time = _spread([h.tokens for h in ok]), _spread([h.time_s for h in ok])
    return TargetRow(
        g.label, len(hits), len(ok), *steps, *tokens, *time, [h.last_step for h in hits if not h.reached], seeds=hits
    )


def _rates(values: list[float | None]) -> list[float] | None:
    """1 / (steps or time) to target per seed: a rate, so verdict.ratio's higher-is-faster test applies; None
    unless every seed's value is known and positive (a seed is never dropped from a test silently)."""
    if not values or any(v is None or v <= 0 for v in values):
        return None
    return [1.0 / cast(float, v) for v in values]


def _brackets(hits: list[SeedHit], key: str) -> list[tuple[float, float]]:
    """Each seed's (low, high) steps or time to target: the two evals around its crossing (low 0 when the previous
    eval's time is unknown: the widest bracket the data allow)."""
    if key == "step":
        return [(float(cast(int, h.prev_step)), float(cast(int, h.step))) for h in hits]
    out = []
    for h in hits:
        high = cast(float, h.time_s)
        out.append((min(h.prev_time_s or 0.0, high), high))
    return out


def _held(found: Verdict, arm: list[tuple[float, float]], base: list[tuple[float, float]]) -> Verdict:
    """verdict.bracketed for a speed-up to target: a decided speed-up must still be decided the same way with each
    arm seed at the end of its bracket nearest the baseline and each baseline seed at the end nearest the arm
    (faster: the arm at its slowest, the baseline at its quickest), else UNRESOLVED. Only ever adds caution."""
    if not found.decided:
        return found
    faster = found.direction > 0
    arm_worst = _rates([hi if faster else lo for lo, hi in arm])
    base_worst = _rates([lo if faster else hi for lo, hi in base])
    if arm_worst is None or base_worst is None:  # a bracket open to the start: any rate is possible
        return replace(found, status=Status.UNRESOLVED)
    worst = verdict.ratio(found.metric, arm_worst, base_worst, ALPHA)
    return found if worst.direction == found.direction else replace(found, status=Status.UNRESOLVED)


def _versus(row: TargetRow, base: TargetRow) -> None:
    """Speed-ups to target with their noise: ratio of geometric means, 95% CI and Welch verdict (never bare), held
    against the evals around each seed's crossing; each needs every seed's value."""
    for key, attr in (("step", "speedup_steps"), ("time_s", "speedup_time")):
        arm, ref = _rates([getattr(h, key) for h in row.seeds]), _rates([getattr(h, key) for h in base.seeds])
        if arm is not None and ref is not None:
            found = verdict.ratio(getattr(row, attr).metric, arm, ref, ALPHA)
            setattr(row, attr, _held(found, _brackets(row.seeds, key), _brackets(base.seeds, key)))


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
    """The target, its step resolution, one row per group (baseline first) and the clock its times are on."""

    target: Target
    resolution: list[int]
    rows: list[TargetRow]
    clock: Clock

    def to_json(self) -> dict[str, Any]:
        """The comparison.json `targets` entry."""
        return {
            "metric": self.target.metric,
            "op": self.target.op,
            "value": self.target.value,
            "text": self.target.text,
            "resolution_steps": self.resolution,
            "clock": self.clock.key,  # what time_s is: train_s (training time) or wall_s (wall time)
            "rows": [
                {
                    **asdict(r),
                    "speedup_steps": r.speedup_steps.to_json(),
                    "speedup_time": r.speedup_time.to_json(),
                    "all_reached": r.all_reached,
                }
                for r in self.rows
            ],
        }


def steps_to_target(groups: list[Group], target: Target, limit: float, clock: Clock) -> TargetResult:
    """Rows for every group (groups[0] is the baseline) with speed-ups where both reached it in every seed, none of
    them at initialisation (a rate of 1/0: the speed-up is undefined, NOT_MEASURED); a group above `limit` outside
    load (the comparison's) is under load; times on `clock` (the comparison's)."""
    rows = [target_row(g, target, clock) for g in groups]
    base = rows[0]
    for row, g in zip(rows, groups):
        load = outside_load(g.runs)
        row.under_load = load is not None and load > limit
        if not (row.all_reached and base.all_reached) or row.at_start or base.at_start:
            continue
        if row is base:
            row.speedup_steps = verdict.baseline("steps", ratio=True)
            if _rates([h.time_s for h in row.seeds]) is not None:
                row.speedup_time = verdict.baseline("time_s", ratio=True)
        else:
            _versus(row, base)
    return TargetResult(target, resolution([r for g in groups for r in g.runs], target.metric), rows, clock)

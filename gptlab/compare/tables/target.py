"""Steps to target (--target) and the smallest arm value that reaches it in every seed (--threshold).

Time to target is each seed's steps to it at its arm's timed step time (the timing session's, compare/tables/timed.py),
never a training run's own clock: a run's clock holds whatever shared its machine (the queue's other runs, outside
load, the run order), so a time-to-target ratio of two runs' clocks is not a measurement of the arms. The speed-up in
time is the seeds' ratio (Welch on the logs, held against the evals around each crossing, as the steps' is) widened
by the timed step-time ratio's own interval (statistics/verdict.widened), with its caveats; a group no session times
has no time to target ("not timed").
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, cast

from gptlab.compare.reading.group import Group
from gptlab.compare.reading.runs import Run
from gptlab.compare.reading.timing import AXIS, TIME_TO_TARGET_METRIC
from gptlab.compare.statistics import stats, verdict
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
    step at the arm's timed step time; None where the arm is not timed).

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


def first_hit(run: Run, target: Target, step_s: float | None) -> SeedHit:
    """Scan the steps where the run recorded the metric, in order, for the first one at or past the target; times
    at the arm's timed `step_s` seconds a step (None: not timed)."""
    steps = sorted(s for s, r in run.by_step.items() if r.get(target.metric) is not None)
    seed = run.config.get("seed")
    for i, s in enumerate(steps):
        value = float(run.by_step[s][target.metric])
        if target.reached(value):
            prev = steps[i - 1] if i else 0  # the first record: crossed since the start
            time_s = None if step_s is None else s * step_s
            hit = SeedHit(seed, str(run.path), True, s, x_at(run, s, "tokens"), time_s, value, steps[-1])
            if s > 0:
                hit.prev_step, hit.prev_time_s = prev, None if step_s is None else prev * step_s
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
    # Speed-ups to target (rates: 1 / steps, 1 / time), Welch on the logs; NOT_MEASURED until compared (time: also
    # where the arm or the baseline is not timed).
    speedup_steps: Verdict = field(default_factory=lambda: Verdict("steps", Status.NOT_MEASURED, ratio=True))
    speedup_time: Verdict = field(
        default_factory=lambda: Verdict(TIME_TO_TARGET_METRIC, Status.NOT_MEASURED, ratio=True)
    )
    seeds: list[SeedHit] = field(default_factory=list)

    @property
    def all_reached(self) -> bool:
        """Every seed reached the target."""
        return self.n_reached == self.n_seeds

    @property
    def at_start(self) -> list[SeedHit]:
        """The seeds that met the target at initialisation: no speed-up to it is defined for this row's pairs."""
        return [h for h in self.seeds if h.at_start]


@dataclass(frozen=True)
class Timed:
    """A group's timed step (compare/tables/timed.py): seconds a training step, and the speed verdict (tokens/s,
    paired rounds) of its arm against the baseline group's arm."""

    step_s: float
    speed: Verdict


def target_row(g: Group, target: Target, timed: Timed | None) -> TargetRow:
    """Per-seed hits of one group summarised; the unreached seeds are counted, never averaged away."""
    hits = [first_hit(r, target, None if timed is None else timed.step_s) for r in g.runs]
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


Widen = Callable[[Verdict], Verdict]


def _held(found: Verdict, arm: list[tuple[float, float]], base: list[tuple[float, float]], widen: Widen) -> Verdict:
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
    worst = widen(verdict.ratio(found.metric, arm_worst, base_worst, ALPHA))
    return found if worst.direction == found.direction else replace(found, status=Status.UNRESOLVED)


def _step_time_spread(speed: Verdict) -> Widen | None:
    """How the timed step-time ratio's own noise widens a time-to-target verdict (statistics/verdict.widened): by its
    relative interval, and within the session's A/A floor where it is below it; the identity for one build timed for
    both; None where the timed ratio has no interval (one round: no time verdict can be tested)."""
    if speed.status in (Status.IDENTICAL, Status.BASELINE):
        return lambda v: v
    if speed.effect is None or speed.interval is None:
        return None
    low, high = speed.interval[0] / speed.effect, speed.interval[1] / speed.effect
    if speed.status is Status.BELOW_FLOOR and speed.floor is not None:  # the A/A could make the whole ratio
        low, high = min(low, 1.0 / (speed.floor * speed.effect)), max(high, speed.floor / speed.effect)
    return lambda v: verdict.widened(v, low, high, speed.caveats)


def _versus(row: TargetRow, base: TargetRow, timed: Timed | None, timed_base: Timed | None) -> None:
    """Speed-ups to target with their noise: ratio of geometric means, 95% CI and Welch verdict (never bare), held
    against the evals around each seed's crossing; each needs every seed's value. In time, only where both groups
    are timed, widened by the timed step-time ratio's interval (the module docstring)."""
    arm, ref = _rates([h.step for h in row.seeds]), _rates([h.step for h in base.seeds])
    if arm is None or ref is None:
        return
    found = verdict.ratio(row.speedup_steps.metric, arm, ref, ALPHA)
    row.speedup_steps = _held(found, _brackets(row.seeds, "step"), _brackets(base.seeds, "step"), lambda v: v)
    widen = None if timed is None or timed_base is None else _step_time_spread(timed.speed)
    arm, ref = _rates([h.time_s for h in row.seeds]), _rates([h.time_s for h in base.seeds])
    if widen is None or arm is None or ref is None:
        return
    found = widen(verdict.ratio(row.speedup_time.metric, arm, ref, ALPHA))
    row.speedup_time = _held(found, _brackets(row.seeds, "time_s"), _brackets(base.seeds, "time_s"), widen)


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
    """The target, its step resolution, one row per group (baseline first) and whether its times are timed steps
    (False: no session times the baseline, so no time to target)."""

    target: Target
    resolution: list[int]
    rows: list[TargetRow]
    timed: bool

    def to_json(self) -> dict[str, Any]:
        """The comparison.json `targets` entry."""
        return {
            "metric": self.target.metric,
            "op": self.target.op,
            "value": self.target.value,
            "text": self.target.text,
            "resolution_steps": self.resolution,
            "time_axis": AXIS if self.timed else None,  # time_s: steps at the arm's timed step time (None: not timed)
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


def steps_to_target(groups: list[Group], target: Target, timed: Sequence[Timed | None]) -> TargetResult:
    """Rows for every group (groups[0] is the baseline; `timed` in the same order, None for an untimed group) with
    speed-ups where both reached it in every seed, none of them at initialisation (a rate of 1/0: the speed-up is
    undefined, NOT_MEASURED); time to target only where the group and the baseline are timed."""
    rows = [target_row(g, target, t) for g, t in zip(groups, timed)]
    base = rows[0]
    for row, t in zip(rows, timed):
        if not (row.all_reached and base.all_reached) or row.at_start or base.at_start:
            continue
        if row is base:
            row.speedup_steps = verdict.baseline("steps", ratio=True)
            if t is not None:
                row.speedup_time = verdict.baseline(TIME_TO_TARGET_METRIC, ratio=True)
        else:
            _versus(row, base, t, timed[0])
    found = resolution([r for g in groups for r in g.runs], target.metric)
    return TargetResult(target, found, rows, timed[0] is not None)

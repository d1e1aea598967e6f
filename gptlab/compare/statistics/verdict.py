"""One verdict type: what comparing an arm with its baseline decided, as a value.

Every analysis of gptlab-compare (the main table's val loss and speed, equal compute, steps to a target, probes,
downstream evals, decode, the lr grid) builds a Verdict, from Welch's test on the seeds here (on the logs for a
ratio) or, for the training speed-up, from a timing session's paired rounds (rounds.py). Only the rendering room words it (compare/render/words.py); nothing reads words back: code that
needs to know whether a verdict was decided asks `status`, `direction` or `caveats`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any

from gptlab.compare.statistics import stats
from gptlab.compare.statistics.stats import ALPHA


class Status(str, Enum):
    """What a comparison decided (the str value is the JSON spelling)."""

    BASELINE = "baseline"  # the baseline against itself
    NOT_MEASURED = "not_measured"  # a side has no value
    NO_TEST = "no_test"  # fewer than 2 seeds on a side: an effect, no test
    IDENTICAL = "identical"  # both sides build the same model: every difference is noise by construction
    WITHIN_NOISE = "within_noise"  # p >= alpha (the interval holds the null)
    BELOW_FLOOR = "below_floor"  # p < alpha, but no larger than the timing session's A/A (its floor)
    UNRESOLVED = "unresolved"  # p < alpha at the interpolated reading, but the evals around it could flip it
    INTERPOLATED = "interpolated"  # read between evals where the runs could have been measured (no shared grid)
    DECIDED = "decided"  # p < alpha and beyond the floor: `direction` says which way


class Caveat(str, Enum):
    """Why a verdict should be read with care (the str value is the JSON spelling)."""

    UNDER_LOAD = "under_load"  # speed taken while other processes used the machine
    CONFOUNDED = "confounded"  # arm is confounded with run order or load (compare/statistics/order.py)
    OPTIMISTIC = "optimistic"  # lr picked on the same seeds it is reported on
    ONE_PROCESS = "one_process"  # speed timed as repeats within one process: run-to-run spread not in the interval
    EDGE_LR = "edge_lr"  # an lr grid's best lr (the arm's or the baseline's) at the grid's edge: optimum may lie beyond


class Trend(str, Enum):
    """How an arm's gap to the baseline moves over a scale ladder (compare/studies/ladder.py decides it)."""

    NOT_MEASURED = "not_measured"  # fewer than 2 rungs with both arms, or no residual degrees of freedom
    CROSSES_OVER = "crosses_over"  # the gap's intervals at the smallest and largest rung exclude 0, opposite signs
    STEADY = "steady"  # the slope's interval holds 0
    GROWS = "grows"  # |gap| widens with size beyond noise
    SHRINKS = "shrinks"  # |gap| narrows with size beyond noise
    SHRINKS_MAY_CROSS = "shrinks_may_cross"  # narrows, and the fitted gap changes sign within the measured range


@dataclass(frozen=True)
class Verdict:
    """An arm against the baseline on one metric: the effect (arm - base, or arm / base for a ratio) with its
    (1 - alpha) interval, Welch p, the smallest effect these seeds could detect, the floor used and the decision."""

    metric: str
    status: Status
    effect: float | None = None
    interval: tuple[float, float] | None = None
    p: float | None = None
    ratio: bool = False  # effect and interval are arm / base (null 1), else arm - base (null 0)
    seeds: tuple[int, int] = (0, 0)  # seeds on the arm's side and the baseline's
    mde: float | None = None  # smallest effect these seeds detect (compare/statistics/power.py), when computed
    floor: float | None = None  # the far end of the timing session's A/A interval, for a timed speed-up
    caveats: tuple[Caveat, ...] = ()

    @property
    def decided(self) -> bool:
        return self.status is Status.DECIDED

    @property
    def direction(self) -> int:
        """+1 when decided above the null (higher loss, faster), -1 when decided below it, else 0."""
        if not self.decided or self.effect is None:
            return 0
        return 1 if self.effect > (1.0 if self.ratio else 0.0) else -1

    def with_caveat(self, caveat: Caveat) -> Verdict:
        return self if caveat in self.caveats else replace(self, caveats=(*self.caveats, caveat))

    def with_mde(self, mde: float | None) -> Verdict:
        return replace(self, mde=mde)

    def to_json(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "status": self.status.value,
            "direction": self.direction,
            "effect": self.effect,
            "interval": list(self.interval) if self.interval else None,
            "p": self.p,
            "ratio": self.ratio,
            "seeds": list(self.seeds),
            "mde": self.mde,
            "floor": self.floor,
            "caveats": [c.value for c in self.caveats],
        }


def from_json(doc: dict[str, Any]) -> Verdict:
    """The Verdict a report's JSON holds (Verdict.to_json's document)."""
    interval = doc.get("interval")
    return Verdict(
        str(doc["metric"]),
        Status(doc["status"]),
        doc.get("effect"),
        (float(interval[0]), float(interval[1])) if interval else None,
        doc.get("p"),
        bool(doc.get("ratio")),
        tuple(doc.get("seeds") or (0, 0)),
        doc.get("mde"),
        doc.get("floor"),
        tuple(Caveat(c) for c in doc.get("caveats") or ()),
    )


def bracketed(found: Verdict, arm: Sequence[tuple[float, float]], base: Sequence[tuple[float, float]]) -> Verdict:
    """A decided difference read between eval points, held against the worst end of each seed's bracket (the two
    evals around the reading, (low, high)): UNRESOLVED unless the arm is still decided the same way with its seeds
    at the end nearest the baseline and the baseline's at the end nearest the arm. Only ever adds caution."""
    if not found.decided:
        return found
    up = found.direction > 0
    worst = difference(found.metric, [lo if up else hi for lo, hi in arm], [hi if up else lo for lo, hi in base])
    return found if worst.direction == found.direction else replace(found, status=Status.UNRESOLVED)


def widened(v: Verdict, low: float, high: float, caveats: Sequence[Caveat] = ()) -> Verdict:
    """A ratio verdict times an independent factor known to within [low, high] of its value (low <= 1 <= high: the
    relative interval of a timed step time, say): the interval's ends are multiplied by low and high, so on the logs
    the two half-widths add. That is at least as wide as the exact interval of a sum of two independent errors (whose
    half-width is the root of the sum of squares), never narrower: it covers at least 1 - alpha when each part does.
    p is dropped (it tested the narrower interval); DECIDED only when the widened interval excludes 1. A verdict
    without an interval keeps its status; every verdict gains `caveats`."""
    for c in caveats:
        v = v.with_caveat(c)
    if v.interval is None or v.status not in (Status.DECIDED, Status.WITHIN_NOISE):
        return v
    lo, hi = v.interval[0] * low, v.interval[1] * high
    status = Status.DECIDED if lo > 1.0 or hi < 1.0 else Status.WITHIN_NOISE
    return replace(v, status=status, interval=(lo, hi), p=None)


def baseline(metric: str, ratio: bool = False) -> Verdict:
    """The baseline's own cell."""
    return Verdict(metric, Status.BASELINE, 1.0 if ratio else 0.0, ratio=ratio)


def _finite(metric: str, arm: Sequence[float], base: Sequence[float]) -> None:
    """A NaN or infinite seed makes Welch's p NaN, which no threshold decides: it would read "within noise". The
    readers refuse such figures (compare/reading/runs.py); one reaching a test here is a bug, so it fails loudly."""
    bad = [v for v in (*arm, *base) if not math.isfinite(v)]
    if bad:
        raise ValueError(f"{metric}: non-finite values {bad} reached a test (arm {list(arm)}, baseline {list(base)})")


def difference(
    metric: str, arm: Sequence[float], base: Sequence[float], alpha: float = ALPHA, identical: bool = False
) -> Verdict:
    """mean(arm) - mean(base) with Welch's test and interval; IDENTICAL for two arms that build one model."""
    seeds = (len(arm), len(base))
    if not arm or not base:
        return Verdict(metric, Status.NOT_MEASURED, seeds=seeds)
    _finite(metric, arm, base)
    effect = stats.mean(arm) - stats.mean(base)
    test, interval = stats.welch_test(arm, base), stats.welch_interval(arm, base, alpha)
    span = (interval.lo, interval.hi) if interval else None
    if identical:
        return Verdict(metric, Status.IDENTICAL, effect, span, test.p if test else None, seeds=seeds)
    if test is None or interval is None:
        return Verdict(metric, Status.NO_TEST, effect, seeds=seeds)
    status = Status.DECIDED if test.p < alpha else Status.WITHIN_NOISE
    return Verdict(metric, status, effect, span, test.p, seeds=seeds)


def ratio(
    metric: str, arm: Sequence[float], base: Sequence[float], alpha: float = ALPHA, identical: bool = False
) -> Verdict:
    """Geometric mean(arm) / geometric mean(base): Welch's test on the logs (ratios of per-run figures: decode
    tokens/s, time to a target). A training speed-up is no such ratio: it comes from a timing session's rounds
    (compare/statistics/rounds.py), whose A/A is its floor."""
    seeds = (len(arm), len(base))
    if not arm or not base:
        return Verdict(metric, Status.NOT_MEASURED, ratio=True, seeds=seeds)
    _finite(metric, arm, base)
    la, lb = [math.log(v) for v in arm], [math.log(v) for v in base]
    diff = stats.mean(la) - stats.mean(lb)
    test, interval = stats.welch_test(la, lb), stats.welch_interval(la, lb, alpha)
    if test is None or interval is None:
        return Verdict(metric, Status.NO_TEST, math.exp(diff), ratio=True, seeds=seeds)
    span = (math.exp(interval.lo), math.exp(interval.hi))
    if identical:
        status = Status.IDENTICAL
    else:
        status = Status.WITHIN_NOISE if test.p >= alpha else Status.DECIDED
    return Verdict(metric, status, math.exp(diff), span, test.p, True, seeds)

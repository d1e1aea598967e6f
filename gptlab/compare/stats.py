"""Seed statistics without scipy: mean/std and Welch's two-sided t-test (t distribution via the incomplete beta)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Sequence


ALPHA = 0.05  # significance level of every Welch test in gptlab-compare


def mean(xs: Sequence[float]) -> float:
    """Arithmetic mean of a non-empty sequence."""
    return math.fsum(xs) / len(xs)


def std(xs: Sequence[float]) -> float | None:
    """Sample standard deviation (ddof=1); None for fewer than 2 values."""
    if len(xs) < 2:
        return None
    m = mean(xs)
    return math.sqrt(math.fsum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def median(xs: Sequence[float]) -> float | None:
    """Median of the values that are not None; None when there are none."""
    vals = sorted(x for x in xs if x is not None)
    if not vals:
        return None
    mid = len(vals) // 2
    return float(vals[mid]) if len(vals) % 2 else (vals[mid - 1] + vals[mid]) / 2.0


def _beta_cf(a: float, b: float, x: float) -> float:
    """Continued fraction for the incomplete beta (modified Lentz); converges fast for x < (a+1)/(a+b+2)."""
    tiny, eps = 1e-300, 1e-15
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    frac = d
    for m in range(1, 500):
        # Even step then odd step of the standard expansion.
        for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                    -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            frac *= d * c
        if abs(d * c - 1.0) < eps:
            break
    return frac


def betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta I_x(a, b) for a, b > 0 and 0 <= x <= 1."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = (math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
                 + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_cf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_cf(b, a, 1.0 - x) / b


def t_two_sided_p(t: float, df: float) -> float:
    """Two-sided p-value P(|T| >= |t|) for Student's t with df degrees of freedom."""
    if math.isinf(t):
        return 0.0
    if math.isnan(t) or df <= 0:
        return float("nan")
    return betainc(df / 2.0, 0.5, df / (df + t * t))


@dataclass(frozen=True)
class Welch:
    """Result of Welch's unequal-variance t-test of mean(a) - mean(b)."""

    t: float
    df: float
    p: float


def welch_test(a: Sequence[float], b: Sequence[float]) -> Welch | None:
    """Welch's t-test for two samples; None unless both have at least 2 values."""
    if len(a) < 2 or len(b) < 2:
        return None
    va, vb = std(a) ** 2 / len(a), std(b) ** 2 / len(b)
    diff = mean(a) - mean(b)
    se2 = va + vb
    if se2 == 0.0:
        # Zero seed noise on both sides: any difference at all is beyond noise.
        return Welch(0.0, float("inf"), 1.0) if diff == 0.0 else Welch(math.copysign(math.inf, diff), float("inf"), 0.0)
    df = se2 * se2 / (va * va / (len(a) - 1) + vb * vb / (len(b) - 1))
    t = diff / math.sqrt(se2)
    return Welch(t, df, t_two_sided_p(t, df))


def t_critical(alpha: float, df: float) -> float:
    """t such that P(|T| >= t) = alpha for Student's t with df degrees of freedom (bisection on the p-value)."""
    if df > 1e7:  # the normal limit (the incomplete beta loses digits out there)
        return NormalDist().inv_cdf(1.0 - alpha / 2.0)
    lo, hi = 0.0, 1.0
    while t_two_sided_p(hi, df) > alpha:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if t_two_sided_p(mid, df) > alpha else (lo, mid)
        if hi - lo < 1e-12 * hi:
            break
    return 0.5 * (lo + hi)

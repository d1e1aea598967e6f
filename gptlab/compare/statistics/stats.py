"""Seed statistics: mean/std/median from Python's statistics module, Welch's two-sided t-test from scipy.stats.

scipy.stats is imported on first use: it takes about a second to import, and gptlab-compare's
--help and bad-input paths never need it.
"""

from __future__ import annotations

import math
import statistics
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

ALPHA = 0.05  # significance level of every Welch test in gptlab-compare


def _scipy_stats():
    from scipy import stats as sps

    return sps


def mean(xs: Sequence[float]) -> float:
    """Arithmetic mean of a non-empty sequence, always a float (fsum-exact; NaN in, NaN out)."""
    return statistics.fmean(xs)


def std(xs: Sequence[float]) -> float | None:
    """Sample standard deviation (ddof=1, n - 1 in the denominator); None for fewer than 2 values.

    A NaN or infinite seed gives NaN (statistics.stdev cannot take non-finite floats); +inf and -inf
    together raise ValueError from the mean, as the hand-written version did.
    """
    if len(xs) < 2:
        return None
    if not math.isfinite(mean(xs)):
        return math.nan
    return statistics.stdev(xs)


def median(xs: Sequence[float]) -> float | None:
    """Median of the values that are not None; None when there are none."""
    vals = [x for x in xs if x is not None]
    return float(statistics.median(vals)) if vals else None


def t_two_sided_p(t: float, df: float) -> float:
    """Two-sided p-value P(|T| >= |t|) for Student's t with df degrees of freedom."""
    if math.isinf(t):
        return 0.0
    if math.isnan(t) or not df > 0:
        return float("nan")
    return float(2.0 * _scipy_stats().t.sf(abs(t), df))


@dataclass(frozen=True)
class Welch:
    """Result of Welch's unequal-variance t-test of mean(a) - mean(b)."""

    t: float
    df: float
    p: float


def _var(xs: Sequence[float]) -> float:
    """Sample variance of at least 2 values (std(xs) ** 2, which is never None here)."""
    s = std(xs)
    assert s is not None, "a variance needs at least 2 values"
    return s * s


def welch_df(a: Sequence[float], b: Sequence[float]) -> float:
    """Welch-Satterthwaite degrees of freedom of two samples with at least 2 values each (not both constant)."""
    return welch_df_of(_var(a), len(a), _var(b), len(b))


def welch_df_of(var_a: float, n_a: int, var_b: float, n_b: int) -> float:
    """Welch-Satterthwaite degrees of freedom from two sample variances and sizes (n >= 2 each, not both zero)."""
    va, vb = var_a / n_a, var_b / n_b
    return (va + vb) ** 2 / (va * va / (n_a - 1) + vb * vb / (n_b - 1))


def welch_test(a: Sequence[float], b: Sequence[float]) -> Welch | None:
    """Welch's t-test for two samples; None unless both have at least 2 values."""
    if len(a) < 2 or len(b) < 2:
        return None
    diff = mean(a) - mean(b)
    se2 = _var(a) / len(a) + _var(b) / len(b)
    if se2 == 0.0:
        # Zero seed noise on both sides: any difference at all is beyond noise (scipy would give NaN here).
        return Welch(0.0, float("inf"), 1.0) if diff == 0.0 else Welch(math.copysign(math.inf, diff), float("inf"), 0.0)
    with warnings.catch_warnings():
        # One arm with every seed equal (the other noisy) is a valid test, but scipy warns of "precision loss"
        # whenever a sample's values are (nearly) identical; gptlab-compare's output should not carry that.
        warnings.filterwarnings("ignore", message="Precision loss occurred", category=RuntimeWarning)
        res = _scipy_stats().ttest_ind(a, b, equal_var=False)
    return Welch(float(res.statistic), welch_df(a, b), float(res.pvalue))


@dataclass(frozen=True)
class Interval:
    """mean(a) - mean(b) with its two-sided (1 - alpha) Welch confidence interval [lo, hi] and degrees of freedom."""

    diff: float
    lo: float
    hi: float
    df: float

    def excludes_zero(self) -> bool:
        """True exactly when Welch's test of the same samples gives p < alpha (zero noise: any gap at all)."""
        return self.lo > 0.0 or self.hi < 0.0


def welch_interval(a: Sequence[float], b: Sequence[float], alpha: float) -> Interval | None:
    """Welch CI of mean(a) - mean(b): diff ± t_{1-alpha/2, Welch df} · se; None unless both have 2+ values.

    The interval excludes 0 exactly when welch_test(a, b).p < alpha (the same df and standard error); with zero
    seed noise on both sides it is the point [diff, diff].
    """
    if len(a) < 2 or len(b) < 2:
        return None
    diff = mean(a) - mean(b)
    se = math.sqrt(_var(a) / len(a) + _var(b) / len(b))
    if se == 0.0:
        return Interval(diff, diff, diff, math.inf)
    df = welch_df(a, b)
    half = t_critical(alpha, df) * se
    return Interval(diff, diff - half, diff + half, df)


def t_critical(alpha: float, df: float) -> float:
    """t such that P(|T| >= t) = alpha for Student's t with df degrees of freedom (df = inf: the normal limit)."""
    return float(_scipy_stats().t.isf(alpha / 2.0, df))

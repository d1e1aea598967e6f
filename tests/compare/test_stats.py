"""gptlab.compare.statistics.stats against values worked out by hand, and its edge cases (1 seed, zero variance, NaN)."""

from __future__ import annotations

import math

import pytest

from gptlab.compare.statistics import stats


def test_welch_matches_a_hand_computed_example():
    # a = [1, 2, 3, 4], b = [3, 4, 5, 6]: means 2.5 and 4.5, sample variances 5/3 each,
    # se^2 = 5/12 + 5/12 = 5/6, t = -2 / sqrt(5/6) = -2.19089...
    # Welch-Satterthwaite df = (5/6)^2 / (2 * (5/12)^2 / 3) = 6 exactly.
    # For even df the t CDF is closed-form: with sin^2(theta) = t^2 / (df + t^2) = 4.8 / 10.8 = 4/9,
    # P(|T| < |t|) = sin(theta) * (1 + cos^2/2 + 3 cos^4/8) = 2/3 * (1 + 5/18 + 75/648) = 301/324,
    # so the two-sided p = 23/324 = 0.070987...
    w = stats.welch_test([1.0, 2.0, 3.0, 4.0], [3.0, 4.0, 5.0, 6.0])
    assert w.t == pytest.approx(-2 / math.sqrt(5 / 6), rel=1e-12) and round(w.t, 4) == -2.1909
    assert w.df == pytest.approx(6.0, rel=1e-12)
    assert w.p == pytest.approx(23 / 324, rel=1e-10) and round(w.p, 4) == 0.0710
    flipped = stats.welch_test([3.0, 4.0, 5.0, 6.0], [1.0, 2.0, 3.0, 4.0])
    assert flipped.t == pytest.approx(-w.t) and flipped.p == pytest.approx(w.p)


def test_t_two_sided_p_matches_closed_forms():
    # df = 1 is Cauchy: P(|T| >= t) = 1 - 2 atan(t) / pi; df = 2: P(|T| >= t) = 1 - t / sqrt(2 + t^2).
    assert stats.t_two_sided_p(1.0, 1) == pytest.approx(0.5, rel=1e-12)
    assert stats.t_two_sided_p(3.0, 1) == pytest.approx(1 - 2 * math.atan(3.0) / math.pi, rel=1e-12)
    assert stats.t_two_sided_p(-2.0, 2) == pytest.approx(1 - 2 / math.sqrt(6), rel=1e-12)
    assert stats.t_two_sided_p(0.0, 5) == pytest.approx(1.0)
    assert stats.t_two_sided_p(math.inf, 3) == 0.0
    assert math.isnan(stats.t_two_sided_p(math.nan, 3)) and math.isnan(stats.t_two_sided_p(1.0, 0))


def test_t_critical_inverts_the_p_value():
    for df in (1, 2.5, 6, 40, math.inf):
        assert stats.t_two_sided_p(stats.t_critical(0.05, df), df) == pytest.approx(0.05, rel=1e-9)
    assert stats.t_critical(0.05, 2) == pytest.approx(math.sqrt(2 / (0.95**-2 - 1)), rel=1e-12)  # df=2 closed form


def test_edge_cases():
    assert stats.welch_test([1.0], [2.0, 3.0]) is None and stats.welch_test([1.0, 2.0], []) is None
    assert stats.welch_test([2.0, 2.0], [2.0, 2.0]) == stats.Welch(0.0, math.inf, 1.0)  # identical, no noise
    assert stats.welch_test([2.0, 2.0], [1.0, 1.0]) == stats.Welch(math.inf, math.inf, 0.0)
    same = stats.welch_test([1.0, 2.0, 4.0], [1.0, 2.0, 4.0])
    assert same.t == 0.0 and same.p == pytest.approx(1.0) and same.df == pytest.approx(4.0)
    nan = stats.welch_test([math.nan, 1.0], [2.0, 3.0])
    assert math.isnan(nan.t) and math.isnan(nan.df) and math.isnan(nan.p)
    assert (
        stats.std([1.0]) is None and math.isnan(stats.std([math.nan, 1.0])) and math.isnan(stats.std([math.inf, 1.0]))
    )
    assert stats.std([1.0, 2.0, 3.0, 4.0]) == pytest.approx(math.sqrt(5 / 3))  # sample std, n - 1
    assert stats.mean([1, 3]) == 2.0 and isinstance(stats.mean([1, 3]), float) and math.isnan(stats.mean([math.nan, 1]))
    assert stats.median([3.0, None, 1.0, 2.0]) == 2.0 and stats.median([4, 1]) == 2.5 and stats.median([None]) is None


def test_one_constant_arm_is_tested_quietly(recwarn):
    # scipy warns of precision loss for a constant sample; one quiet arm against a noisy one is a valid test.
    w = stats.welch_test([7.13089883, 7.13089883], [7.0, 7.1, 7.2])
    se = math.sqrt(0.01 / 3)
    assert w.t == pytest.approx((7.13089883 - 7.1) / se) and w.df == pytest.approx(2.0)
    assert not [r for r in recwarn if issubclass(r.category, RuntimeWarning)]

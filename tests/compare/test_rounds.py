"""Paired-round speed statistics (gptlab/compare/statistics/rounds.py), verified by simulating timing sessions.

Noise model of one session (per window: a rate in tokens/s): a per-round load drift common to every window of the
round (log sd DRIFT), optionally a trend across the session (the machine slower round after round), per-window
lognormal noise (log sd WINDOW) and occasional outlier windows that run at half speed (probability OUTLIER each).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from gptlab.compare.statistics.rounds import arm_speed, paired, round_rates, second, session_speeds
from gptlab.compare.statistics.stats import ALPHA
from gptlab.compare.statistics.verdict import Caveat, Status

DRIFT, WINDOW, OUTLIER = 0.10, 0.03, 0.01
BASE, ARM = "base", "arm"
LABELS = (BASE, second(BASE), ARM)  # window columns of the simulated rates


def simulate(sessions: int, rounds: int, effect: float, seed: int, outlier: float = OUTLIER, trend: float = 0.0):
    """(sessions, rounds, 3) rates of LABELS: the arm `effect` times the baseline's speed, noise as the docstring."""
    rng = np.random.default_rng(seed)
    logs = rng.normal(0.0, DRIFT, (sessions, rounds, 1))  # common to the round's windows
    logs = logs - trend * np.arange(rounds)[None, :, None]  # slower round after round
    logs = logs + rng.normal(0.0, WINDOW, (sessions, rounds, len(LABELS)))
    logs = logs - math.log(2.0) * (rng.random((sessions, rounds, len(LABELS))) < outlier)
    logs[:, :, 2] += math.log(effect)
    return np.exp(logs + math.log(5000.0))


def rows(rates: np.ndarray) -> list[dict[str, float]]:
    """One simulated session's rates as the per-round {label: rate} the statistics take."""
    return [dict(zip(LABELS, map(float, r))) for r in rates]


def statuses(rates: np.ndarray) -> list[Status]:
    return [arm_speed(rows(s), ARM, BASE).verdict.status for s in rates]


def margin(p: float, n: int) -> float:
    """Three binomial standard errors of a rate p over n sessions."""
    return 3.0 * math.sqrt(p * (1.0 - p) / n)


def test_aa_sessions_decide_no_more_often_than_alpha():
    n = 1000
    rates = simulate(n, 5, 1.0, seed=11, outlier=0.02)
    found = [arm_speed(rows(s), ARM, BASE) for s in rates]
    decided = sum(f.verdict.status is Status.DECIDED for f in found) / n
    assert decided <= ALPHA + margin(ALPHA, n)
    # the paired test alone is calibrated, not merely cautious: without outliers its p < alpha about alpha of the time
    clean = [arm_speed(rows(s), ARM, BASE) for s in simulate(n, 5, 1.0, seed=12, outlier=0.0)]
    rejected = sum(f.verdict.p < ALPHA for f in clean) / n
    aa_rejected = sum(f.aa.p < ALPHA for f in clean) / n
    assert abs(rejected - ALPHA) <= margin(ALPHA, n)
    assert abs(aa_rejected - ALPHA) <= margin(ALPHA, n)


def test_a_real_speedup_is_decided_with_power():
    n = 500
    found = [arm_speed(rows(s), ARM, BASE) for s in simulate(n, 5, 1.15, seed=21)]
    power = sum(f.verdict.decided and f.verdict.direction == 1 for f in found) / n
    assert power >= 0.8
    assert abs(np.median([f.speedup.ratio for f in found]) / 1.15 - 1.0) < 0.01
    slower = [arm_speed(rows(s), ARM, BASE) for s in simulate(n, 5, 1 / 1.15, seed=22)]
    assert sum(f.verdict.decided and f.verdict.direction == -1 for f in slower) / n >= 0.8


def test_a_slowing_machine_makes_no_speedup():
    """The machine gets 20 % slower every round and the session was killed before the arm's last two rounds: the
    pairing uses complete rounds only and a ratio within each, so nothing is decided; pooling the windows instead
    reads the baseline's late, slow windows as a speed-up of the arm."""
    n, trend = 300, math.log(1.2)
    rates = simulate(n, 7, 1.0, seed=31, outlier=0.0, trend=trend)
    killed = [rows(s)[:5] + [{BASE: float(r[0]), second(BASE): float(r[1])} for r in s[5:]] for s in rates]
    found = [arm_speed(k, ARM, BASE) for k in killed]
    assert sum(f.verdict.decided for f in found) / n <= ALPHA + margin(ALPHA, n)
    assert abs(np.median([math.log(f.speedup.ratio) for f in found])) < 0.01
    assert all(f.speedup.rounds == 5 for f in found)
    pooled = [
        math.exp(np.mean(np.log(s[:5, 2])) - np.mean(np.log(s[:, :2]))) for s in rates
    ]  # every window of each label, rounds ignored
    assert np.median(pooled) > 1.15  # the arm's rounds average 2 slow-downs, the baseline's 3: a fake 1.2x
    # a real 1.15x effect under the same drift is read as 1.15x
    real = [arm_speed(rows(s), ARM, BASE) for s in simulate(n, 5, 1.15, seed=32, outlier=0.0, trend=trend)]
    assert abs(np.median([f.speedup.ratio for f in real]) / 1.15 - 1.0) < 0.01
    assert sum(f.verdict.decided for f in real) / n >= 0.8


def test_paired_figures_by_hand():
    logs = [0.1, 0.2, 0.15, 0.05]
    found = paired(logs)
    mean, sd = np.mean(logs), np.std(logs, ddof=1)
    from scipy import stats as sps

    half = sps.t.isf(ALPHA / 2, 3) * sd / 2
    assert found.ratio == pytest.approx(math.exp(mean))
    assert found.interval == pytest.approx((math.exp(mean - half), math.exp(mean + half)))
    assert found.p == pytest.approx(sps.ttest_1samp(logs, 0.0).pvalue)
    assert found.far_end() == pytest.approx(math.exp(mean + half))


def test_speedup_pairs_the_mean_of_both_baseline_windows():
    pairs = [(100.0, 102.0), (50.0, 49.0), (80.0, 80.8)]
    # each round's arm window is 1.2x the geometric mean of that round's two baseline windows
    session = [{BASE: a, second(BASE): b, ARM: 1.2 * math.sqrt(a * b)} for a, b in pairs]
    found = arm_speed(session, ARM, BASE)
    assert found.speedup.ratio == pytest.approx(1.2)
    assert found.aa.ratio == pytest.approx(math.exp(np.mean([math.log(b / a) for a, b in pairs])))
    assert 1.0 < found.floor < 1.2
    # every round agrees exactly (zero spread), beyond the A/A's floor: decided faster
    assert found.verdict.status is Status.DECIDED and found.verdict.direction == 1
    assert found.verdict.seeds == (3, 3) and found.verdict.ratio


def test_an_effect_within_the_sessions_aa_is_below_floor():
    """p < alpha, but the baseline's own two windows differ as much: BELOW_FLOOR, never decided."""
    session = [
        {BASE: 100.0, second(BASE): 110.0, ARM: 112.0},
        {BASE: 100.0, second(BASE): 90.0, ARM: 103.0},
        {BASE: 100.0, second(BASE): 112.0, ARM: 114.0},
    ]
    found = arm_speed(session, ARM, BASE)
    assert found.verdict.p < ALPHA
    assert found.speedup.ratio < found.floor
    assert found.verdict.status is Status.BELOW_FLOOR and found.verdict.floor == found.floor


def test_one_round_no_rounds_identical_and_loaded():
    one = [{BASE: 100.0, second(BASE): 100.0, ARM: 150.0}]
    assert arm_speed(one, ARM, BASE).verdict.status is Status.NO_TEST
    assert arm_speed(one, ARM, BASE).verdict.effect == pytest.approx(1.5)
    incomplete = [{BASE: 100.0, ARM: 150.0}]  # the A/A window never ran: no round pairs
    assert arm_speed(incomplete, ARM, BASE).verdict.status is Status.NOT_MEASURED
    session = [{BASE: 100.0, second(BASE): 101.0, ARM: 150.0}, {BASE: 90.0, second(BASE): 92.0, ARM: 140.0}]
    speeds = session_speeds(session, BASE, identical={ARM}, loaded={BASE})
    assert list(speeds) == [ARM]
    assert speeds[ARM].verdict.status is Status.IDENTICAL
    assert speeds[ARM].verdict.caveats == (Caveat.UNDER_LOAD,)
    with pytest.raises(ValueError, match="round 1, window arm"):
        arm_speed([session[0], {**session[1], ARM: math.nan}], ARM, BASE)


def test_timing_windows_become_round_rates():
    windows = [
        {"round": 1, "position": 0, "arm": BASE, "repeat": 1, "tokens_per_s": 90.0},
        {"round": 0, "position": 2, "arm": ARM, "repeat": 0, "tokens_per_s": 120.0},
        {"round": 0, "position": 0, "arm": BASE, "repeat": 1, "tokens_per_s": 101.0},
        {"round": 0, "position": 1, "arm": BASE, "repeat": 0, "tokens_per_s": 100.0},
    ]
    assert round_rates(windows) == [{ARM: 120.0, second(BASE): 101.0, BASE: 100.0}, {second(BASE): 90.0}]
    # round 1 is incomplete (a session killed mid-round): the arm is paired over round 0 alone
    assert arm_speed(round_rates(windows), ARM, BASE).speedup.rounds == 1
    assert round_rates([]) == []

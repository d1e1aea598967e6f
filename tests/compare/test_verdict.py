"""One verdict type: gptlab/compare/statistics/verdict.py decides, gptlab/compare/render/words.py words, and no code reads words back.

The decisions are checked against scipy directly and by simulation (false decisions on A/A data stay at alpha); the
words for every status are pinned ("not timed" for a speed verdict no timing session made); tests/test_layout.py keeps verdict words out of
every comparison in gptlab/ and benchmarks/."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps

from gptlab.compare.reading.timing import EQUAL_TIME_METRIC
from gptlab.compare.render import words
from gptlab.compare.statistics.rounds import METRIC as TIMED
from gptlab.compare.statistics.verdict import Caveat, Status, Verdict, baseline, difference, from_json, ratio


def test_difference_matches_welch_and_decides_only_below_alpha():
    arm, base = [2.10, 2.12, 2.11], [2.00, 2.01, 2.02]
    v = difference("val/loss", arm, base)
    ref = sps.ttest_ind(arm, base, equal_var=False)
    assert v.p == pytest.approx(ref.pvalue) and v.effect == pytest.approx(0.1)
    assert v.status is Status.DECIDED and v.direction == 1 and v.interval[0] > 0
    same = difference("val/loss", [2.0, 2.1, 1.9], [2.0, 2.05, 1.95])
    assert same.status is Status.WITHIN_NOISE and same.direction == 0 and same.interval[0] < 0 < same.interval[1]
    assert difference("val/loss", [2.0], base).status is Status.NO_TEST
    assert difference("val/loss", [], base).status is Status.NOT_MEASURED
    twin = difference("val/loss", arm, base, identical=True)
    assert twin.status is Status.IDENTICAL and not twin.decided and twin.p == v.p  # the test is kept, never decided


def test_ratio_is_tested_on_logs():
    arm, base = [1100.0, 1110.0, 1090.0], [1000.0, 1005.0, 995.0]
    v = ratio("tokens_per_s", arm, base)
    logs = sps.ttest_ind(np.log(arm), np.log(base), equal_var=False)
    assert v.p == pytest.approx(logs.pvalue) and v.effect == pytest.approx(
        math.exp(np.log(arm).mean() - np.log(base).mean())
    )
    assert v.decided and v.direction == 1 and v.ratio and v.floor is None
    slower = ratio("tokens_per_s", base, arm)
    assert slower.direction == -1 and words.speed(slower) == "slower"


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_a_non_finite_seed_is_never_within_noise(bad):
    """Welch's p over a NaN or infinite seed is NaN, and `NaN < alpha` is false: a diverged arm read "within noise".
    The readers refuse such figures (test_compare_like); one reaching a test raises, naming the values."""
    for test in (difference, ratio):
        with pytest.raises(ValueError, match=r"val/loss: non-finite values \[(nan|inf)\] reached a test"):
            test("val/loss", [3.50, 3.51, bad], [3.00, 3.01, 3.02])


def test_words_for_every_status():
    arm, base = [1100.0, 1110.0, 1090.0], [1000.0, 1005.0, 995.0]
    assert words.speed(ratio("t", arm, base)) == "faster"
    assert words.speed(ratio("t", arm, base).with_caveat(Caveat.UNDER_LOAD)) == "faster, under outside load"
    assert words.speed(ratio("t", arm, base).with_caveat(Caveat.UNDER_LOAD), caveats=False) == "faster"
    assert words.speed(ratio("t", arm, base, identical=True)) == "within noise (identical model)"
    assert words.speed(Verdict("t", Status.BELOW_FLOOR, 1.02, (1.01, 1.03), 0.01, True, floor=1.05)) == (
        "within noise floor"
    )
    assert words.speed(ratio("t", [1000.0], base)) == "n/a: 1 seed"
    assert words.speed(ratio("t", [], base)) == "–"
    # a timed speed-up (or a val loss at equal training time) with no timing session behind it is "not timed"
    assert words.speed(Verdict(TIMED, Status.NOT_MEASURED, ratio=True)) == "not timed"
    assert words.loss_cell(Verdict(EQUAL_TIME_METRIC, Status.NOT_MEASURED)) == "not timed"
    assert words.speed(baseline("t", ratio=True).with_caveat(Caveat.UNDER_LOAD)) == "baseline"
    loss = difference("val/loss", [2.10, 2.12, 2.11], [2.00, 2.01, 2.02])
    assert words.change(loss, "val loss") == "higher val loss" and words.significance(loss) == "significant"
    assert words.better_or_worse(loss, "lower") == "worse" and words.better_or_worse(loss, "higher") == "better"
    assert words.side(loss) == "higher" and words.side(difference("x", [1.0, 2.0], [1.1, 1.9])) == "within noise"


def test_json_round_trip_keeps_the_decision():
    v = ratio("tokens_per_s", [1100.0, 1110.0, 1090.0], [1000.0, 1005.0, 995.0]).with_caveat(Caveat.UNDER_LOAD)
    doc = v.to_json()
    assert doc["status"] == "decided" and doc["direction"] == 1 and doc["caveats"] == ["under_load"]
    assert from_json(doc) == v
    assert from_json(Verdict("x", Status.NO_TEST, 1.5, seeds=(1, 3)).to_json()).seeds == (1, 3)


@pytest.mark.parametrize("kind", ["difference", "ratio"])
def test_false_decisions_on_aa_data_stay_at_alpha(kind):
    """2,000 simulated A/A comparisons (3 seeds a side, the same distribution): decided in about 5 % of them."""
    rng = np.random.default_rng(11)
    decided = 0
    for _ in range(2000):
        a, b = rng.normal(1000.0, 20.0, 3), rng.normal(1000.0, 20.0, 3)
        found = difference("x", list(a), list(b)) if kind == "difference" else ratio("x", list(a), list(b))
        decided += found.decided
    assert 0.03 <= decided / 2000 <= 0.07, decided  # binomial sd at 5 %: 0.5 points


def test_a_printed_p_never_rounds_across_the_threshold():
    """Two significant digits printed 0.0498 (significant) and 0.0502 (not) both as 'p=0.05', beside opposite words;
    the table's p keeps as many digits as its side of alpha (or a look's threshold) needs."""
    assert words.p_value(0.0498) == "0.0498" and words.p_value(0.0502) == "0.05"  # 0.05 is not below 0.05
    assert words.p_value(0.03) == "0.03" and words.p_value(0.12345) == "0.12" and words.p_value(None) == "n/a"
    assert words.p_value(0.00559, threshold=0.0056) == "0.00559"  # a look's threshold, not alpha
    base = [1.70, 1.71, 1.72]
    for shift, decided in ((0.0227, True), (0.0226, False)):  # Welch p 0.04981 / 0.05044
        found = difference("val/loss", [x + shift for x in base], base, 0.05)
        assert found.decided is decided and round(found.p, 2) == 0.05
        assert (float(words.p_value(found.p)) < 0.05) is decided

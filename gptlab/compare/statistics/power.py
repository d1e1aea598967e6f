"""Power of a comparison: the smallest difference these seeds could detect, and the seeds that would decide an arm.

The test is the table's: two-sided Welch t-test at alpha = stats.ALPHA, here with power POWER = 0.8. Under a true
difference d the Welch statistic follows a noncentral t (scipy.stats.nct) with the Welch-Satterthwaite degrees of
freedom and noncentrality d / se, where se = sqrt(s_a²/n_a + s_b²/n_b) uses the observed seed standard deviations;
power = P(T > t_crit) + P(T < -t_crit), t_crit = t_{1 - alpha/2, df}.

- minimum detectable difference (MDE): the d at which that power reaches POWER with these seeds;
- seeds to decide an undecided arm: the fewest seeds n per arm (the same on both sides) at which the observed
  difference, taken as the true one, is detected with power POWER, given the observed standard deviations
  (searched up to MAX_SEEDS).

Val loss is tested as it is. Speed is judged from a timing session (compare/statistics/rounds.py): the one-sample t
over the rounds' log ratios, R - 1 degrees of freedom, noncentrality d / (sd / sqrt(R)) with sd the rounds' own
spread; its MDE is a ratio (the smallest speed-up, or inverted slow-down, these rounds detect, never below the
session's A/A floor) and an undecided arm gets the rounds that would decide it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from gptlab.compare.statistics import stats
from gptlab.compare.statistics.rounds import Paired
from gptlab.compare.statistics.verdict import Status, Verdict

POWER = 0.8  # probability of detecting a difference of the MDE's size
MAX_SEEDS = 1000  # seeds per arm searched for a decision; more is Decision.BEYOND_CAP


def power_at(nc: float, df: float, alpha: float = stats.ALPHA) -> float:
    """Power of a two-sided t-test at level alpha with df degrees of freedom when the noncentrality is nc.

    Symmetric in nc. The far tail P(T < -t_crit) of a large nc is below 1e-16, where scipy's nct.cdf can return
    NaN: it is counted as 0 then.
    """
    from scipy import stats as sps

    crit, nc = stats.t_critical(alpha, df), abs(nc)
    far = float(sps.nct.cdf(-crit, df, nc))
    return float(sps.nct.sf(crit, df, nc)) + (0.0 if math.isnan(far) else far)


def _noncentrality(df: float, alpha: float, power: float) -> float:
    """The noncentrality at which power_at reaches `power` (power_at rises with nc from alpha at nc = 0)."""
    from scipy.optimize import brentq

    hi = stats.t_critical(alpha, df) + 4.0
    while power_at(hi, df, alpha) < power:
        hi *= 2.0
    return float(brentq(lambda nc: power_at(nc, df, alpha) - power, 0.0, hi, xtol=1e-12, rtol=1e-12))


def detectable(sd_a: float, n_a: int, sd_b: float, n_b: int, alpha: float = stats.ALPHA, power: float = POWER):
    """Minimum detectable |mean(a) - mean(b)| for Welch's test with these seed standard deviations and counts.

    None when either side has fewer than 2 seeds (no noise estimate); 0.0 when both are noiseless (Welch's test
    then calls any difference real).
    """
    if n_a < 2 or n_b < 2:
        return None
    var_a, var_b = sd_a * sd_a, sd_b * sd_b
    se = math.sqrt(var_a / n_a + var_b / n_b)
    if se == 0.0:
        return 0.0
    df = stats.welch_df_of(var_a, n_a, var_b, n_b)
    return _noncentrality(df, alpha, power) * se


def power_with(n: int, delta: float, sd_a: float, sd_b: float, alpha: float = stats.ALPHA) -> float:
    """Power of Welch's test with n seeds per arm when the true difference is delta and the seed sds are sd_a, sd_b."""
    var_a, var_b = sd_a * sd_a, sd_b * sd_b
    if var_a + var_b == 0.0:
        return 1.0 if delta else alpha
    se = math.sqrt((var_a + var_b) / n)
    return power_at(abs(delta) / se, stats.welch_df_of(var_a, n, var_b, n), alpha)


def seeds_to_decide(
    delta: float, sd_a: float, sd_b: float, alpha: float = stats.ALPHA, power: float = POWER, cap: int = MAX_SEEDS
) -> int | None:
    """Fewest seeds per arm (>= 2) at which a true difference `delta` is detected with `power`; None when delta is
    0 or more than `cap` seeds would be needed. Power rises with n (se falls, df grows): a bisection finds it."""
    if delta == 0.0 or not math.isfinite(delta) or power_with(cap, delta, sd_a, sd_b, alpha) < power:
        return None
    lo, hi = 1, cap  # power_with(hi) >= power; lo is below the answer (n >= 2)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if power_with(mid, delta, sd_a, sd_b, alpha) >= power:
            hi = mid
        else:
            lo = mid
    return hi


class Decision(Enum):
    """Why an arm needs the seeds it does on one measure: SEEDS (the count is beside it) or why no count applies;
    compare/render/words.py (`seeds_to_decide`) words it."""

    DECIDED = "decided"  # the arm is decided: it needs no more seeds
    SEEDS = "seeds"  # the observed difference, if true, is found with POWER at the count given
    ROUNDS = "rounds"  # the same for a timed speed-up: rounds of the timing session at the count given
    IDENTICAL = "identical"  # the identical model: every difference is noise, no count decides it
    ONE_SEED = "one_seed"  # a side has 1 seed: no noise estimate
    NOT_MEASURED = "not_measured"  # a side has no figure (speed not timed)
    WITHIN_FLOOR = "within_floor"  # the observed speed-up is within the timing session's A/A
    ZERO = "zero"  # the observed difference is 0
    BEYOND_CAP = "beyond_cap"  # more than MAX_SEEDS seeds per arm


@dataclass(frozen=True)
class Power:
    """One arm against the baseline at POWER and stats.ALPHA (comparison.json rows' `power`).

    mde_val_loss: smallest |Δ val loss| these seeds detect; mde_speedup: smallest speed-up ratio (> 1; its inverse
    for a slow-down) the timing session's rounds detect; None where a side has 1 seed, or 1 round, or speed is not
    timed. seeds_val_loss: seeds per arm, seeds_speed: rounds, that would decide the arm if the observed difference
    is the true one (None: the decision says why).
    """

    mde_val_loss: float | None
    mde_speedup: float | None
    seeds_val_loss: int | None
    seeds_speed: int | None
    val_loss_decision: Decision
    speed_decision: Decision


def _decision(decided: bool, identical: bool, a: Sequence[float], b: Sequence[float]) -> tuple[int | None, Decision]:
    """(seeds per arm, why) for val loss: a decided arm needs none; an undecided one the seeds_to_decide."""
    if identical:
        return None, Decision.IDENTICAL
    if decided:
        return None, Decision.DECIDED
    if len(a) < 2 or len(b) < 2:
        return None, Decision.ONE_SEED
    delta = stats.mean(a) - stats.mean(b)
    needed = seeds_to_decide(delta, stats.std(a) or 0.0, stats.std(b) or 0.0)
    if needed is not None:
        return needed, Decision.SEEDS
    return None, Decision.ZERO if delta == 0.0 else Decision.BEYOND_CAP


def rounds_to_decide(delta: float, sd: float, alpha: float = stats.ALPHA, power: float = POWER) -> int | None:
    """Fewest rounds (>= 2) at which the paired test over rounds (sd: one round's log-ratio spread) finds a true
    mean log ratio `delta` with `power`; None when delta is 0 or more than MAX_SEEDS rounds would be needed."""

    def reached(n: int) -> bool:
        return sd == 0.0 or power_at(abs(delta) / (sd / math.sqrt(n)), n - 1, alpha) >= power

    if delta == 0.0 or not math.isfinite(delta) or not reached(MAX_SEEDS):
        return None
    lo, hi = 1, MAX_SEEDS  # reached(hi); lo is below the answer (n >= 2)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if reached(mid) else (mid, hi)
    return hi


def rounds_power(
    found: Paired | None, decided: bool, identical: bool, floor: float | None, alpha: float = stats.ALPHA
) -> tuple[float | None, int | None, Decision]:
    """(the smallest speed-up these rounds detect, the rounds that would decide, why) from a timed arm's paired
    speed-up (None: not timed). The rounds' sd is read back from the interval: half-width = t(R - 1) x sd / sqrt(R);
    a speed-up within the A/A `floor` is never decided, and no MDE is below it."""
    if found is None or found.interval is None:
        none = Decision.NOT_MEASURED if found is None else Decision.ONE_SEED
        return None, None, Decision.IDENTICAL if identical else none
    n, delta = found.rounds, math.log(found.ratio)
    sd = math.log(found.interval[1] / found.interval[0]) / (2.0 * stats.t_critical(alpha, n - 1)) * math.sqrt(n)
    least = math.log(floor) if floor is not None else 0.0
    mde = math.exp(max(_noncentrality(n - 1, alpha, POWER) * sd / math.sqrt(n), least))
    if identical:
        return mde, None, Decision.IDENTICAL
    if decided:
        return mde, None, Decision.DECIDED
    if 0.0 < abs(delta) <= least:
        return mde, None, Decision.WITHIN_FLOOR
    needed = rounds_to_decide(delta, sd, alpha)
    if needed is not None:
        return mde, needed, Decision.ROUNDS
    return mde, None, Decision.ZERO if delta == 0.0 else Decision.BEYOND_CAP


def _mde(a: Sequence[float], b: Sequence[float]) -> float | None:
    """The smallest difference these seeds detect (Welch)."""
    if not (len(a) and len(b)):
        return None
    return detectable(stats.std(a) or 0.0, len(a), stats.std(b) or 0.0, len(b))


def arm_power(
    losses: Sequence[float],
    base_losses: Sequence[float],
    loss_decided: bool,
    identical: bool = False,
    speed: Verdict | None = None,
    rounds: Paired | None = None,
) -> Power:
    """Power of one arm vs the baseline: val loss from each side's per-seed losses, speed from the arm's timed
    verdict (`speed`; None or NOT_MEASURED: not timed) and its paired rounds (compare/statistics/rounds.py)."""
    seeds_loss, loss_why = _decision(loss_decided, identical, losses, base_losses)
    decided = speed is not None and speed.decided
    same = speed is not None and speed.status is Status.IDENTICAL
    mde, needed, speed_why = rounds_power(rounds, decided, same, speed.floor if speed is not None else None)
    return Power(
        mde_val_loss=_mde(losses, base_losses),
        mde_speedup=mde,
        seeds_val_loss=seeds_loss,
        seeds_speed=needed,
        val_loss_decision=loss_why,
        speed_decision=speed_why,
    )

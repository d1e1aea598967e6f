"""Power of a comparison: the smallest difference these seeds could detect, and the seeds that would decide an arm.

The test is the table's: two-sided Welch t-test at alpha = stats.ALPHA, here with power POWER = 0.8. Under a true
difference d the Welch statistic follows a noncentral t (scipy.stats.nct) with the Welch-Satterthwaite degrees of
freedom and noncentrality d / se, where se = sqrt(s_a²/n_a + s_b²/n_b) uses the observed seed standard deviations;
power = P(T > t_crit) + P(T < -t_crit), t_crit = t_{1 - alpha/2, df}.

- minimum detectable difference (MDE): the d at which that power reaches POWER with these seeds;
- seeds to decide an undecided arm: the fewest seeds n per arm (the same on both sides) at which the observed
  difference, taken as the true one, is detected with power POWER, given the observed standard deviations
  (searched up to MAX_SEEDS).

Val loss is tested as it is; speed on log tokens/s (as the speed-up's verdict), so its MDE is a ratio: the
smallest speed-up (or, inverted, slow-down) these seeds detect.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from gptlab.compare.statistics import stats

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
    IDENTICAL = "identical"  # the identical model: every difference is noise, no count decides it
    ONE_SEED = "one_seed"  # a side has 1 seed: no noise estimate
    NOT_MEASURED = "not_measured"  # a side has no figure (speed not measured)
    WITHIN_FLOOR = "within_floor"  # the observed difference is within the machine's noise floor
    ZERO = "zero"  # the observed difference is 0
    BEYOND_CAP = "beyond_cap"  # more than MAX_SEEDS seeds per arm


@dataclass(frozen=True)
class Power:
    """One arm against the baseline at POWER and stats.ALPHA (comparison.json rows' `power`).

    mde_val_loss: smallest |Δ val loss| these seeds detect; mde_speedup: smallest speed-up ratio (> 1; its inverse
    for a slow-down) they detect; None where a side has 1 seed. seeds_val_loss / seeds_speed: seeds per arm that
    would decide the arm if the observed difference is the true one (None: the decision says why).
    """

    mde_val_loss: float | None
    mde_speedup: float | None
    seeds_val_loss: int | None
    seeds_speed: int | None
    val_loss_decision: Decision
    speed_decision: Decision


def _decision(
    decided: bool, identical: bool, a: Sequence[float], b: Sequence[float], sd_floor: float = 0.0, within: float = 0.0
) -> tuple[int | None, Decision]:
    """(seeds per arm, why) for one measure: a decided arm needs none; an undecided one the seeds_to_decide, with
    each side's sd at least `sd_floor`; an observed |difference| <= `within` (a noise floor) is never decided."""
    if identical:
        return None, Decision.IDENTICAL
    if decided:
        return None, Decision.DECIDED
    if len(a) < 2 or len(b) < 2:
        return None, Decision.ONE_SEED
    delta = stats.mean(a) - stats.mean(b)
    if within and 0.0 < abs(delta) <= within:
        return None, Decision.WITHIN_FLOOR
    sd_a, sd_b = stats.std(a) or 0.0, stats.std(b) or 0.0
    needed = seeds_to_decide(delta, max(sd_a, sd_floor), max(sd_b, sd_floor))
    if needed is not None and sd_floor and (sd_a or sd_b):  # a floor only adds caution (see _mde)
        plain = seeds_to_decide(delta, sd_a, sd_b)
        needed = None if plain is None else max(needed, plain)
    if needed is not None:
        return needed, Decision.SEEDS
    return None, Decision.ZERO if delta == 0.0 else Decision.BEYOND_CAP


def _mde(a: Sequence[float], b: Sequence[float], sd_floor: float = 0.0) -> float | None:
    """The smallest difference these seeds detect, each side's sd at least `sd_floor`, and never smaller than without
    the floor: raising one side's sd also raises Welch's df, which shrank it (5 steady seeds against 2 noisy ones:
    0.25 with a 0.05 floor, 0.58 without)."""
    if not (len(a) and len(b)):
        return None
    sd_a, sd_b = stats.std(a) or 0.0, stats.std(b) or 0.0
    floored = detectable(max(sd_a, sd_floor), len(a), max(sd_b, sd_floor), len(b))
    plain = detectable(sd_a, len(a), sd_b, len(b)) if sd_floor and (sd_a or sd_b) else None
    return floored if plain is None or floored is None else max(floored, plain)


def arm_power(
    losses: Sequence[float],
    base_losses: Sequence[float],
    tps: Sequence[float],
    base_tps: Sequence[float],
    loss_decided: bool,
    speed_decided: bool,
    identical: bool = False,
    speed_sd_floor: float = 0.0,
    speed_min_ratio: float = 1.0,
) -> Power:
    """Power of one arm vs the baseline from each side's per-seed val losses and tokens/s; with a measured noise
    floor, speed uses each side's sd of log tokens/s at least `speed_sd_floor` and detects no speed-up within
    `speed_min_ratio` (the test compare/verdict.ratio makes with a floor)."""
    log_a, log_b = [math.log(v) for v in tps], [math.log(v) for v in base_tps]
    mde_log = _mde(log_a, log_b, speed_sd_floor)
    if mde_log is not None:
        mde_log = max(mde_log, math.log(speed_min_ratio))
    seeds_loss, loss_why = _decision(loss_decided, identical, losses, base_losses)
    if log_a and log_b:
        seeds_speed, speed_why = _decision(
            speed_decided, identical, log_a, log_b, speed_sd_floor, math.log(speed_min_ratio)
        )
    else:
        seeds_speed, speed_why = None, Decision.NOT_MEASURED
    return Power(
        mde_val_loss=_mde(losses, base_losses),
        mde_speedup=math.exp(mde_log) if mde_log is not None else None,
        seeds_val_loss=seeds_loss,
        seeds_speed=seeds_speed,
        val_loss_decision=loss_why,
        speed_decision=speed_why,
    )

"""Seeds until decided: a group-sequential comparison of one arm with the baseline, adding seeds in looks.

The design is the alpha-spending approach of Lan & DeMets (1983, "Discrete sequential boundaries for clinical
trials", Biometrika 70:659-663), as set out in Jennison & Turnbull (2000, "Group Sequential Methods with
Applications to Clinical Trials", ch. 7 and ch. 19). Look k has n_k seeds per arm (first, first + step, ..., up to
max_seeds, the last look always at max_seeds); its information fraction is t_k = n_k / max_seeds (a difference of
two means with n seeds on each side has information proportional to n). A spending function alpha(t) says how much
of the two-sided alpha may be spent by fraction t:

- "obrien_fleming": alpha(t) = 2 - 2 Phi(z_{1 - alpha/2} / sqrt(t))   (spends almost nothing early),
- "pocock":         alpha(t) = alpha ln(1 + (e - 1) t)                 (spends about evenly).

Under H0 the look statistics Z_k are jointly normal with corr(Z_i, Z_j) = sqrt(t_i / t_j) (i <= j): Z_k sqrt(t_k)
is a Brownian motion at time t_k. The boundary c_k solves P(|Z_1| < c_1, ..., |Z_{k-1}| < c_{k-1}, |Z_k| >= c_k)
= alpha(t_k) - alpha(t_{k-1}), computed by the recursive numerical integration of Armitage, McPherson & Rowe (1969)
(Jennison & Turnbull ch. 19): the density of the Brownian motion on the continuation region is carried from look
to look on a Simpson grid, so the total chance of a decision under H0, over all looks, is alpha(1) = alpha.

Seeds are few (2 to ~10 per arm), and a z boundary applied to a Welch t statistic with 2-10 degrees of freedom would
decide far too often. Each look's boundary is therefore turned into its nominal two-sided p threshold
p_k = 2 Phi(-c_k), and the arm is decided at look k when Welch's two-sided p at that look is below p_k: the
"significance level approach" to normal data with unknown variance (nominal significance levels as in Pocock 1977;
Jennison & Turnbull ch. 11).

One adjustment, found and checked by simulation: every look re-estimates the seed variance, so successive t
statistics are less correlated than the z statistics' sqrt(n_i / n_j) (about z^2 / (4n) relatively, at a boundary
z), and boundaries computed with that correlation overspend: 0.0510 at 2..10 seeds step 1 (1,000,000 studies), 0.0514 at
2..20, for alpha = 0.05 with O'Brien-Fleming spending. The boundaries are therefore computed with the correlation of a Brownian
motion at times (n_k - CORRELATION_OFFSET) / (max_seeds - CORRELATION_OFFSET), CORRELATION_OFFSET = 1.5 seeds (the
alpha spent at each look still follows n_k / max_seeds). Simulated A/A false-decision rates then stay at or below
alpha within simulation error for 2-30 seeds per arm and up to 29 looks, with either spending function (the highest:
0.0504 +- 0.0004 at 2..30 step 1; 0.0488 at 2..10 step 1; tests/compare/test_sequential.py keeps 2-10 seed layouts).
A one-look plan is exactly the fixed Welch test at alpha.

Which spending: O'Brien-Fleming (the default). With the cap held fixed it keeps most of the fixed design's power
(a true difference of the fixed design's MDE: power 0.75 against 0.79, 6.65 seeds per arm on average instead of 8,
at 2..8 step 1). Pocock spends alpha also at 2-3 seeds, where Welch's test has about 2 degrees of freedom and
almost no power, so at the same cap its power falls to about 0.61-0.65.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gptlab.compare.statistics import stats
from gptlab.errors import ConfigError

SPENDINGS = ("obrien_fleming", "pocock")  # the spending functions plan() takes
CORRELATION_OFFSET = 1.5  # seeds taken off n in the looks' correlation (see the module docstring)
MAX_LOOKS = 50  # looks one plan may take (the numerical integration grows with the square of the grid per look)
_GRID = 801  # Simpson grid points (odd) over one look's continuation region


@dataclass(frozen=True)
class Plan:
    """A group-sequential design: seeds per arm at each look and the nominal two-sided p threshold of each look.

    seeds: seeds per arm at look 0, 1, ... (increasing; the last is max_seeds); thresholds: decide at look k when
    Welch's p < thresholds[k]; z: the same boundaries on the normal scale; spent: the cumulative alpha spent by
    each look (the last is alpha); alpha and spending as given to plan(). Look k tests at thresholds[k], whatever
    happened at earlier looks; an arm decided at a look takes no more seeds.
    """

    seeds: tuple[int, ...]
    thresholds: tuple[float, ...]
    z: tuple[float, ...]
    spent: tuple[float, ...]
    alpha: float
    spending: str

    @property
    def looks(self) -> int:
        """How many looks the plan takes at most."""
        return len(self.seeds)


@dataclass(frozen=True)
class Look:
    """One look's test: Welch's p, the look's threshold, whether it decides, and which way (arm minus baseline).

    direction: -1 (the arm's mean is lower), +1 (higher), 0 when not decided; final: this is the plan's last look
    (not decided there means undecided at the cap); seeds: seeds per arm at this look.
    """

    look: int
    seeds: int
    diff: float
    p: float
    threshold: float
    decided: bool
    direction: int
    final: bool

    @property
    def stop(self) -> bool:
        """True when no more seeds should be added: decided, or the plan's cap was reached."""
        return self.decided or self.final


def spend(spending: str, t: float, alpha: float) -> float:
    """Two-sided alpha spent by information fraction t in [0, 1] (Lan-DeMets O'Brien-Fleming- or Pocock-type)."""
    from scipy.stats import norm

    if t <= 0.0:
        return 0.0
    if t >= 1.0:
        return alpha
    if spending == "obrien_fleming":
        return float(2.0 * norm.sf(norm.isf(alpha / 2.0) / math.sqrt(t)))
    if spending == "pocock":
        return alpha * math.log1p((math.e - 1.0) * t)
    raise ConfigError(f"spending={spending!r}: allowed are {', '.join(SPENDINGS)}")


def _simpson(lo: float, hi: float) -> tuple[np.ndarray, np.ndarray]:
    """Grid points over [lo, hi] and their composite Simpson weights."""
    x = np.linspace(lo, hi, _GRID)
    w = np.ones(_GRID)
    w[1:-1:2], w[2:-1:2] = 4.0, 2.0
    return x, w * (hi - lo) / (3.0 * (_GRID - 1))


def _exit_chance(c: float, t: float, sd: float, x: np.ndarray, mass: np.ndarray, target: float = 0.0) -> float:
    """Chance of first crossing |Z| >= c at time t from the sub-density `mass` on grid x by a N(0, sd^2) step,
    minus `target`."""
    from scipy.stats import norm

    b = c * math.sqrt(t)
    return float(mass @ (norm.cdf((-b - x) / sd) + norm.sf((b - x) / sd))) - target


def boundaries(fractions: Sequence[float], increments: Sequence[float]) -> list[float]:
    """z boundaries c_k such that a two-sided crossing first at look k has chance increments[k] under H0.

    fractions: increasing times t_k in (0, 1] of the Brownian motion B(t_k) = Z_k sqrt(t_k), so that
    corr(Z_i, Z_j) = sqrt(t_i / t_j); increments: alpha spent at each look (positive). Recursive numerical
    integration (Armitage, McPherson & Rowe 1969; Jennison & Turnbull ch. 19).
    """
    from scipy.optimize import brentq
    from scipy.stats import norm

    c = float(norm.isf(increments[0] / 2.0))
    out = [c]
    # grid, Simpson weights and sub-density of B(t) on the continuation region |B(t)| < c sqrt(t)
    x, w = _simpson(-c * math.sqrt(fractions[0]), c * math.sqrt(fractions[0]))
    f = norm.pdf(x, scale=math.sqrt(fractions[0]))
    for prev, t, inc in zip(fractions, fractions[1:], increments[1:]):
        sd, mass = math.sqrt(t - prev), w * f
        hi = 1.0
        while _exit_chance(hi, t, sd, x, mass, inc) > 0.0:
            hi *= 2.0
        c = float(brentq(_exit_chance, 0.0, hi, args=(t, sd, x, mass, inc), xtol=1e-10))
        out.append(c)
        y, w = _simpson(-c * math.sqrt(t), c * math.sqrt(t))
        f = norm.pdf((y[:, None] - x[None, :]) / sd) / sd @ mass
        x = y
    return out


def _positive_int(name: str, value: object, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ConfigError(f"{name}={value!r}: must be an integer >= {least}")
    return value


def plan(first: int, step: int, max_seeds: int, alpha: float = stats.ALPHA, spending: str = "obrien_fleming") -> Plan:
    """The group-sequential plan: looks at first, first + step, ... seeds per arm, the last at max_seeds."""
    first = _positive_int("first", first, 2)
    step = _positive_int("step", step, 1)
    max_seeds = _positive_int("max_seeds", max_seeds, 2)
    if max_seeds < first:
        raise ConfigError(f"max_seeds={max_seeds}: must be >= first ({first})")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0.0 < alpha < 1.0:
        raise ConfigError(f"alpha={alpha!r}: must be a number in (0, 1)")
    if spending not in SPENDINGS:
        raise ConfigError(f"spending={spending!r}: allowed are {', '.join(SPENDINGS)}")
    seeds = list(range(first, max_seeds, step)) + [max_seeds]
    if len(seeds) > MAX_LOOKS:
        raise ConfigError(
            f"step={step}: gives {len(seeds)} looks from {first} to {max_seeds} seeds; at most {MAX_LOOKS}"
        )
    from scipy.stats import norm

    spent = [spend(spending, n / max_seeds, float(alpha)) for n in seeds]
    increments = [s - p for s, p in zip(spent, [0.0] + spent[:-1])]
    z = boundaries([(n - CORRELATION_OFFSET) / (max_seeds - CORRELATION_OFFSET) for n in seeds], increments)
    thresholds = [float(2.0 * norm.sf(c)) for c in z]
    thresholds[0] = increments[0]  # exactly: the first look alone spends its share (a one-look plan tests at alpha)
    return Plan(tuple(seeds), tuple(thresholds), tuple(z), tuple(spent), float(alpha), spending)


def decide(plan: Plan, look: int, arm_values: Sequence[float], base_values: Sequence[float]) -> Look:
    """Test look `look` (0-based) of the plan: Welch's p of the arm's against the baseline's per-seed values."""
    if isinstance(look, bool) or not isinstance(look, int) or not 0 <= look < plan.looks:
        raise ConfigError(f"look={look!r}: must be an integer in 0..{plan.looks - 1}")
    n = plan.seeds[look]
    for name, values in (("arm_values", arm_values), ("base_values", base_values)):
        if len(values) != n:
            raise ConfigError(f"{name}: {len(values)} values; look {look} of this plan takes {n} seeds per arm")
    welch = stats.welch_test(arm_values, base_values)
    assert welch is not None  # n >= 2 on both sides
    diff = stats.mean(arm_values) - stats.mean(base_values)
    threshold = plan.thresholds[look]
    decided = welch.p < threshold  # NaN (a NaN seed) never decides
    direction = (1 if diff > 0 else -1) if decided else 0
    return Look(look, n, diff, welch.p, threshold, decided, direction, look == plan.looks - 1)

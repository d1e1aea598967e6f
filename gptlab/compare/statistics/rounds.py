"""Speed-ups from a timing session (gptlab/train/timing.py): paired within rounds, held against the session's own A/A.

A timing session times every arm alone, in R interleaved rounds, each round in a shuffled order, with the baseline
timed twice per round (windows `baseline` and `baseline#2`): per round r and window w a rate x[r, w] (tokens/s, the
median of the window's timed steps). The figures:

- speed-up of an arm = geometric mean over rounds of x[r, arm] / b[r], with b[r] = sqrt(x[r, baseline] *
  x[r, baseline#2]), the geometric mean of the round's two baseline windows. Pairing within a round cancels whatever
  the round's windows share (load, clock, thermal drift: the machine getting slower round after round moves every
  window of a round alike); across rounds it would be read as an arm's effect. Both baseline windows are used,
  rather than one: the ratio's window noise falls from 2 s^2 to 1.5 s^2 on the logs (s: one window's log sd), the
  two shuffled positions average a drift inside the round, and with equal window noise the A/A contrast
  log x[baseline#2] - log x[baseline] is uncorrelated with log b[r], so the A/A below is independent of every
  speed-up it guards;
- its interval: Student's t over the rounds' log ratios (R - 1 degrees of freedom), p from the one-sample t-test of
  mean log ratio = 0;
- the A/A: geometric mean of x[r, baseline#2] / x[r, baseline] over the same rounds, with its interval and p (~1:
  two windows of one build);
- the floor: the far end of the A/A's interval, max(hi, 1 / lo): the largest session-average ratio between two
  windows of identical code that this session's noise allows. A speed-up whose p < alpha but whose size is within
  the floor is BELOW_FLOOR, never decided: an A/A-level wobble is never a finding. A floor only ever adds caution.

Only complete rounds count for an arm (its window and both baseline windows present), so a session killed mid-round
or grown by rounds never pairs windows of different rounds. One round gives an effect and no test (NO_TEST).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gptlab.compare.statistics import stats
from gptlab.compare.statistics.stats import ALPHA
from gptlab.compare.statistics.verdict import Caveat, Status, Verdict

SECOND = "#2"  # the baseline's second window of a round is labelled baseline + SECOND
METRIC = "tokens_per_s"  # what a speed verdict compares (the main table's speed metric)


def second(baseline: str) -> str:
    """The label of the baseline's second (A/A) window in a round."""
    return baseline + SECOND


def round_rates(windows: Iterable[Mapping[str, Any]]) -> list[dict[str, float]]:
    """Per round, {label: tokens/s} from a timing session's window records (timing.json `windows`: round, arm,
    repeat, tokens_per_s); an arm's window is labelled by its name, the baseline's repeat-1 window second(name)."""
    rows: dict[int, dict[str, float]] = {}
    for w in windows:
        label = second(str(w["arm"])) if w["repeat"] else str(w["arm"])
        rows.setdefault(int(w["round"]), {})[label] = float(w["tokens_per_s"])
    return [rows.get(r, {}) for r in range(max(rows) + 1)] if rows else []


@dataclass(frozen=True)
class Paired:
    """exp(mean) of per-round log ratios, its (1 - alpha) Student-t interval over the rounds and the one-sample
    t-test's p against ratio 1; interval and p are None with one round."""

    ratio: float
    interval: tuple[float, float] | None
    p: float | None
    rounds: int

    def far_end(self) -> float | None:
        """The interval's end farthest from 1, as a ratio >= 1 (max(hi, 1/lo)); None without an interval."""
        if self.interval is None:
            return None
        lo, hi = self.interval
        return max(hi, 1.0 / lo, 1.0)


def paired(log_ratios: Sequence[float], alpha: float = ALPHA) -> Paired:
    """The paired statistic of per-round log ratios (at least one): t over the rounds, R - 1 degrees of freedom."""
    n = len(log_ratios)
    mean = stats.mean(log_ratios)
    sd = stats.std(log_ratios)
    if sd is None:
        return Paired(math.exp(mean), None, None, n)
    se = sd / math.sqrt(n)
    if se == 0.0:  # every round gave the same ratio: any difference at all is beyond noise (as stats.welch_test)
        return Paired(math.exp(mean), (math.exp(mean), math.exp(mean)), 1.0 if mean == 0.0 else 0.0, n)
    half = stats.t_critical(alpha, n - 1) * se
    p = stats.t_two_sided_p(mean / se, n - 1)
    return Paired(math.exp(mean), (math.exp(mean - half), math.exp(mean + half)), p, n)


@dataclass(frozen=True)
class RoundSpeed:
    """One arm against the baseline over a timing session: the paired speed-up (arm rate / baseline rate, > 1 faster),
    the A/A over the same rounds, the floor it sets and the Verdict (effect = speed-up; `seeds` holds rounds)."""

    arm: str
    speedup: Paired | None
    aa: Paired | None
    floor: float | None
    verdict: Verdict


def _log(rate: float, label: str, r: int) -> float:
    """log of a positive finite rate; anything else is a bug upstream (the reader refuses it), so it fails loudly."""
    if not (isinstance(rate, (int, float)) and math.isfinite(rate) and rate > 0):
        raise ValueError(f"round {r}, window {label}: rate {rate!r} is not a positive finite number")
    return math.log(rate)


def _contrasts(
    rates: Sequence[Mapping[str, float]], arm: str, baseline: str
) -> tuple[list[float], list[float], list[int]]:
    """(log arm / baseline mean, log baseline#2 / baseline, the rounds used) over the rounds holding all three."""
    speed, aa, used = [], [], []
    for r, row in enumerate(rates):
        if not {arm, baseline, second(baseline)} <= set(row):
            continue
        b1, b2 = _log(row[baseline], baseline, r), _log(row[second(baseline)], second(baseline), r)
        speed.append(_log(row[arm], arm, r) - (b1 + b2) / 2)
        aa.append(b2 - b1)
        used.append(r)
    return speed, aa, used


def _status(found: Paired, floor: float | None, alpha: float, identical: bool) -> Status:
    if found.p is None:
        return Status.NO_TEST
    if identical:
        return Status.IDENTICAL
    if found.p >= alpha:
        return Status.WITHIN_NOISE
    if floor is not None and abs(math.log(found.ratio)) <= math.log(floor):
        return Status.BELOW_FLOOR
    return Status.DECIDED


def arm_speed(
    rates: Sequence[Mapping[str, float]],
    arm: str,
    baseline: str,
    alpha: float = ALPHA,
    identical: bool = False,
    loaded: bool = False,
    metric: str = METRIC,
) -> RoundSpeed:
    """`arm` against `baseline` from per-round rates ({window label: rate} per round; see the module docstring).
    `identical`: the arm builds the baseline's model (IDENTICAL); `loaded`: its windows ran under outside load."""
    speed, aa, used = _contrasts(rates, arm, baseline)
    if not used:
        return RoundSpeed(arm, None, None, None, Verdict(metric, Status.NOT_MEASURED, ratio=True))
    found, control = paired(speed, alpha), paired(aa, alpha)
    floor = control.far_end()
    verdict = Verdict(
        metric,
        _status(found, floor, alpha, identical),
        found.ratio,
        found.interval,
        found.p,
        ratio=True,
        seeds=(len(used), len(used)),
        floor=floor,
    )
    return RoundSpeed(arm, found, control, floor, verdict.with_caveat(Caveat.UNDER_LOAD) if loaded else verdict)


def session_speeds(
    rates: Sequence[Mapping[str, float]],
    baseline: str,
    alpha: float = ALPHA,
    identical: Collection[str] = (),
    loaded: Collection[str] = (),
    metric: str = METRIC,
) -> dict[str, RoundSpeed]:
    """Every arm of a session (each label of `rates` but the baseline's two windows) against the baseline, in the
    order first seen; `identical` / `loaded` name the arms that build the baseline's model / ran under load."""
    arms = list(dict.fromkeys(label for row in rates for label in row if label not in (baseline, second(baseline))))
    base_loaded = baseline in loaded
    return {
        arm: arm_speed(rates, arm, baseline, alpha, arm in identical, base_loaded or arm in loaded, metric)
        for arm in arms
    }

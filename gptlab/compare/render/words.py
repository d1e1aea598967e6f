"""The one place a Verdict becomes words: every table cell, sentence and W&B column that states a verdict asks here.

One vocabulary: a ratio is faster / slower, a difference is lower / higher (or better / worse where the metric has
a better side), and every report says "within noise", "within noise floor", "within noise (identical model)" and
"n/a: k seed" alike. Nothing may parse these words back (tests/test_layout.py checks): code asks the Verdict.
"""

from __future__ import annotations

from gptlab.compare.statistics.verdict import Caveat, Status, Trend, Verdict

UNDER_LOAD = "under outside load"
CONFOUNDED = "confounded with run order"
IDENTICAL = "within noise (identical model)"


def _undecided(v: Verdict) -> str | None:
    """The words every kind of verdict shares when it is not decided; None when it is."""
    return {
        Status.BASELINE: "baseline",
        Status.NOT_MEASURED: "–",
        Status.NO_TEST: f"n/a: {min(v.seeds)} seed",
        Status.IDENTICAL: IDENTICAL,
        Status.WITHIN_NOISE: "within noise",
        Status.BELOW_FLOOR: "within noise floor",
        Status.UNRESOLVED: "undecided (the evals around the reading could flip it)",
    }.get(v.status)


def _loaded(v: Verdict, text: str) -> str:
    """The verdict's word with its caveats about how the speed was taken (load, run order)."""
    if v.status in (Status.BASELINE, Status.NOT_MEASURED):
        return text
    said = {Caveat.UNDER_LOAD: UNDER_LOAD, Caveat.CONFOUNDED: CONFOUNDED}
    return ", ".join([text, *(said[c] for c in said if c in v.caveats)])


def speed(v: Verdict, caveats: bool = True) -> str:
    """A ratio of speeds: `faster`, `slower`, `within noise`, ..., with `, under outside load` where it was (unless
    `caveats` is False: a sentence that says so in its own words)."""
    word = _undecided(v) or ("faster" if v.direction > 0 else "slower")
    return _loaded(v, word) if caveats else word


def change(v: Verdict, what: str) -> str:
    """A difference of `what` (e.g. "val loss"): `lower val loss`, `higher val loss`, `within noise`, ..."""
    word = _undecided(v) or f"{'higher' if v.direction > 0 else 'lower'} {what}"
    return _loaded(v, word)


def significance(v: Verdict) -> str:
    """The table's test column: `significant` / `not significant` (identical models are never significant)."""
    return "significant" if v.decided else "not significant"


def better_or_worse(v: Verdict, better: str) -> str:
    """A decided difference on a metric whose `better` side is "higher" or "lower": `better` / `worse`."""
    return "better" if (v.direction > 0) == (better == "higher") else "worse"


def side(v: Verdict) -> str:
    """`lower` / `higher` for a decided difference, `within noise` otherwise (lr grid, one-word cells)."""
    if not v.decided:
        return "within noise"
    return "higher" if v.direction > 0 else "lower"


def trend(t: Trend) -> str:
    """A ladder gap's trend: `grows`, `steady (no trend beyond noise)`, `crosses over`, ..."""
    return {
        Trend.NOT_MEASURED: "n/a",
        Trend.CROSSES_OVER: "crosses over",
        Trend.STEADY: "steady (no trend beyond noise)",
        Trend.GROWS: "grows",
        Trend.SHRINKS: "shrinks",
        Trend.SHRINKS_MAY_CROSS: "shrinks (may cross: the fitted gap changes sign in range)",
    }[t]

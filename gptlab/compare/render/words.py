"""The one place a Verdict becomes words: every table cell, sentence and W&B column that states a verdict asks here.

One vocabulary: a ratio is faster / slower, a difference is lower / higher (or better / worse where the metric has
a better side), and every report says "within noise", "within noise floor", "within noise (identical model)" and
"n/a: k seed" alike. Nothing may parse these words back (tests/test_layout.py checks): code asks the Verdict.
"""

from __future__ import annotations

from gptlab.compare.statistics.stats import ALPHA
from gptlab.compare.statistics.verdict import Caveat, Status, Trend, Verdict
from gptlab.util.note import Note

UNDER_LOAD = "under outside load"
CONFOUNDED = "confounded with run order"
ONE_PROCESS = "repeats of one process (run-to-run spread not measured)"
IDENTICAL = "within noise (identical model)"


def p_value(p: float | None, threshold: float = ALPHA) -> str:
    """p to two significant digits, or as many more as keep it on its own side of `threshold` (the test's alpha, or
    a look's): 0.0498 and 0.0502 both read '0.05' at two, beside 'significant' and 'not significant'."""
    if p is None:
        return "n/a"
    for digits in range(2, 7):
        shown = f"{p:.{digits}g}"
        if (float(shown) < threshold) == (p < threshold):
            return shown
    return f"{p:.6g}"


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
    """The verdict's word with its caveats about how the speed was taken (load, run order, one process)."""
    if v.status in (Status.BASELINE, Status.NOT_MEASURED):
        return text
    said = {Caveat.UNDER_LOAD: UNDER_LOAD, Caveat.CONFOUNDED: CONFOUNDED, Caveat.ONE_PROCESS: ONE_PROCESS}
    return ", ".join([text, *(said[c] for c in said if c in v.caveats)])


def speed(v: Verdict, caveats: bool = True) -> str:
    """A ratio of speeds: `faster`, `slower`, `within noise`, ..., with `, under outside load` where it was (unless
    `caveats` is False: a sentence that says so in its own words)."""
    word = _undecided(v) or ("faster" if v.direction > 0 else "slower")
    return _loaded(v, word) if caveats else word


def speed_headline(v: Verdict) -> str:
    """A speed verdict where a sentence would lead with it: a speed-up confounded with run order is named as such,
    never as faster or slower."""
    if Caveat.CONFOUNDED in v.caveats:
        return f"{CONFOUNDED} (not a finding)"
    return speed(v)


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


LENSES = {  # a verdict-matrix column, and how a sentence names it
    "equal_steps": "equal steps",
    "equal_flops": "equal FLOPs",
    "equal_training_time": "equal training time",
    "equal_wall_time": "equal wall time",
    "own_best_lr": "own best lr",
    "matched": "matched",
}


def lens(name: str, mode: str | None = None, lr_grid: bool = False) -> str:
    """A lens's name; the matched lens says what was held equal (`FLOP-matched`, `param-matched`); in an lr grid's
    matrix equal steps is read at the baseline's best lr."""
    if name == "matched":
        return {"params": "param-matched"}.get(mode or "", "FLOP-matched")
    if lr_grid and name == "equal_steps":
        return "the baseline's best lr"
    return LENSES[name]


def loss_cell(v: Verdict) -> str:
    """A verdict-matrix cell on val loss: `+0.0360 [+0.0110, +0.0610] worse`, `-0.0020 [..] within noise`, ..."""
    if v.status is Status.BASELINE:
        return "baseline"
    if v.status is Status.NOT_MEASURED or v.effect is None:
        return "–"
    span = f" [{v.interval[0]:+.4f}, {v.interval[1]:+.4f}]" if v.interval and v.status is not Status.IDENTICAL else ""
    word = "undecided (evals too sparse)" if v.status is Status.UNRESOLVED else _undecided(v)
    return f"{v.effect:+.4f}{span} {word or better_or_worse(v, 'lower')}"


def _join(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def reconciled(label: str, by_outcome: dict[str, list[str]], findings: list[str], speed: str) -> str:
    """One arm's lenses in one sentence: where they agree, where they disagree, and what that means.

    `by_outcome`: outcome value (better, worse, within_noise, undecided) -> the lens names with that outcome, in
    column order; `findings`: matrix.Finding values; `speed`: the speed verdict in words."""
    said = {"better": "better", "worse": "worse", "within_noise": "within noise", "undecided": "undecided"}
    parts = [f"{said[o]} at {_join(names)}" for o, names in by_outcome.items() if o in said and names]
    meaning = {
        "agree": "every lens agrees",
        "all_noise": "no lens tells it from the baseline",
        "opposite": "the lenses disagree in direction, so no single verdict stands: report each lens",
        "not_at_equal_flops": "at equal FLOPs the gap is not seen, and the arm's cost per step differs from the "
        "baseline's: part of the gap may be compute, not architecture",
        "not_at_own_lr": "at each arm's own best lr the gap is not seen: part of it may be the learning rate, not "
        "the architecture",
        "holds_matched": "matched in cost it holds, so it is not only compute",
        "needs_seeds": "a lens with one seed on a side needs more seeds (gptlab-sweep NAME --until-decided)",
        "needs_evals": "a lens read between evals needs denser evals to decide (a smaller train.eval_interval; "
        "for FLOPs, one train.eval_flops grid for every run)",
    }
    why = [meaning[f] for f in findings if f in meaning]
    text = f"{label}: {'; '.join(parts) or 'not measured'}"
    return text + (f" — {'; '.join(why)}" if why else "") + f"; speed {speed}."


def note(n: Note) -> str:
    """A Note as the one line every report prints: `warning: <text>` for a warning, the text alone for a note; the
    fix, where there is one and the text does not already carry it, after the text."""
    text = n.text if not n.fix or n.fix in n.text else f"{n.text} ({n.fix})"
    return f"warning: {text}" if n.is_warning else text

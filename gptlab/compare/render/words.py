"""The one place a Verdict becomes words: every table cell, sentence and W&B column that states a verdict asks here.

One vocabulary: a ratio is faster / slower, a difference is lower / higher (or better / worse where the metric has
a better side), and every report says "within noise", "within noise floor", "within noise (identical model)" and
"n/a: k seed" alike. Nothing may parse these words back (tests/test_layout.py checks): code asks the Verdict.
"""

from __future__ import annotations

from gptlab.compare.reading.timing import EQUAL_TIME_METRIC, TIME_TO_TARGET_METRIC, Source
from gptlab.compare.statistics.power import MAX_SEEDS, Decision
from gptlab.compare.statistics.rounds import METRIC as TIMED_SPEED
from gptlab.compare.statistics.stats import ALPHA
from gptlab.compare.statistics.verdict import Caveat, Status, Trend, Verdict
from gptlab.util.note import Note

UNDER_LOAD = "under outside load"
CONFOUNDED = "confounded with run order"
ONE_PROCESS = "repeats of one process (run-to-run spread not measured)"
NOISE = "within noise"
IDENTICAL = f"{NOISE} (identical model)"
FASTER_SLOWER = "faster / slower"  # how a note names the decided speed verdicts it explains
RATIO_WORDS = f"{FASTER_SLOWER} / {NOISE}"  # ... and every speed verdict
BETTER_WORSE = "better/worse"  # ... and the decided verdicts on a metric with a better side
NOT_AT_EQUAL_FLOPS = "not measured at equal FLOPs"  # a reading between evals that a shared grid could have measured
EDGE_LR = "best lr at the grid's edge"
NOT_TIMED = "not timed"  # a speed (or equal-training-time) verdict with no timing session behind it
TIMED_METRICS = (
    TIMED_SPEED,
    EQUAL_TIME_METRIC,
    TIME_TO_TARGET_METRIC,
)  # the verdicts a timing session makes: NOT_MEASURED is NOT_TIMED


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
        Status.NOT_MEASURED: NOT_TIMED if v.metric in TIMED_METRICS else "–",
        Status.NO_TEST: f"n/a: {min(v.seeds)} {'round' if v.metric == TIMED_SPEED else 'seed'}",
        Status.IDENTICAL: IDENTICAL,
        Status.WITHIN_NOISE: "within noise",
        Status.BELOW_FLOOR: "within noise floor",
        Status.UNRESOLVED: "undecided (the evals around the reading could flip it)",
        Status.INTERPOLATED: NOT_AT_EQUAL_FLOPS,
    }.get(v.status)


def _loaded(v: Verdict, text: str) -> str:
    """The verdict's word with its caveats about how the speed was taken (load, run order, one process)."""
    if v.status in (Status.BASELINE, Status.NOT_MEASURED):
        return text
    said = {Caveat.UNDER_LOAD: UNDER_LOAD, Caveat.CONFOUNDED: CONFOUNDED, Caveat.ONE_PROCESS: ONE_PROCESS}
    return ", ".join([text, *(said[c] for c in said if c in v.caveats)])


CAVEATS = {  # a caveat as a footnote (the paper writers') says it: every one, so none is ever dropped
    Caveat.UNDER_LOAD: f"{UNDER_LOAD}: speed taken while other processes used the machine, not to be trusted",
    Caveat.CONFOUNDED: f"{CONFOUNDED}: the arms ran one after another or under different load, so the run order "
    "may have made the difference",
    Caveat.OPTIMISTIC: "optimistic: the lr was picked and reported on the same seeds (the minimum of a noisy curve)",
    Caveat.ONE_PROCESS: ONE_PROCESS,
    Caveat.EDGE_LR: f"{EDGE_LR}: the optimum may lie beyond the lrs tried (widen the grid)",
}


def caveats(v: Verdict) -> list[str]:
    """Every caveat of a verdict as a footnote says it, and a reading that is not measured (interpolated, not timed)
    as one."""
    out = [CAVEATS.get(c, c.value.replace("_", " ")) for c in v.caveats]
    if v.status is Status.INTERPOLATED:
        out.insert(0, f"interpolated: {NOT_AT_EQUAL_FLOPS}, the runs share no train.eval_flops grid")
    if v.status is Status.NOT_MEASURED and v.metric in TIMED_METRICS:
        out.insert(0, f"{NOT_TIMED}: no timing session times this arm and the baseline (gptlab-compare ... --time)")
    return out


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
    "own_best_lr": "own best lr",
    "matched": "matched",
}


def lens(name: str, mode: str | None = None, lr_grid: bool = False, one_lr: bool = False) -> str:
    """A lens's name; the matched lens says what was held equal (`FLOP-matched`, `param-matched`); in an lr grid's
    matrix equal steps is read at the baseline's best lr (`one_lr`: which is every arm's own best lr too)."""
    if name == "matched":
        return {"params": "param-matched"}.get(mode or "", "FLOP-matched")
    if lr_grid and name == "equal_steps":
        return "own best lr (the baseline's)" if one_lr else "the baseline's best lr"
    return LENSES[name]


def one_lr(lr: str) -> str:
    """The sentence under an lr grid's matrix whose arms all picked the baseline's lr: one column, not two."""
    return (
        f"Every arm's own best lr is the baseline's ({lr}), so at its own best lr and at the baseline's best lr are "
        "one reading: one column."
    )


def loss_cell(v: Verdict) -> str:
    """A verdict-matrix cell on val loss: `+0.0360 [+0.0110, +0.0610] worse`, `-0.0020 [..] within noise`, ..."""
    if v.status is Status.BASELINE:
        return "baseline"
    if v.status is Status.INTERPOLATED:
        return NOT_AT_EQUAL_FLOPS
    if v.status is Status.NOT_MEASURED or v.effect is None:
        return (_undecided(v) if v.status is Status.NOT_MEASURED else None) or "–"
    span = f" [{v.interval[0]:+.4f}, {v.interval[1]:+.4f}]" if v.interval and v.status is not Status.IDENTICAL else ""
    word = "undecided (evals too sparse)" if v.status is Status.UNRESOLVED else _undecided(v)
    edge = f" ({EDGE_LR})" if Caveat.EDGE_LR in v.caveats else ""
    return f"{v.effect:+.4f}{span} {word or better_or_worse(v, 'lower')}{edge}"


def _join(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def reconciled(
    label: str, by_outcome: dict[str, list[str]], findings: list[str], speed: str, remeasure: str = ""
) -> str:
    """One arm's lenses in one sentence: where they agree, where they disagree, and what that means.

    `by_outcome`: outcome value (better, worse, within_noise, undecided) -> the lens names with that outcome, in
    column order; `findings`: matrix.Finding values; `speed`: the speed verdict in words; `remeasure`: the command
    that measures equal FLOPs where it was not."""
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
        "flops_not_measured": f"{NOT_AT_EQUAL_FLOPS} (the runs share no train.eval_flops grid; a reading between "
        f"evals favours the cheaper arm): {remeasure or 'relaunch the sweep into a new dir'} measures it",
        "edge_lr": f"the {EDGE_LR} (the arm's or the baseline's): the optimum may lie beyond it, widen the grid",
    }
    why = [meaning[f] for f in findings if f in meaning]
    text = f"{label}: {'; '.join(parts) or 'not measured'}"
    return text + (f" — {'; '.join(why)}" if why else "") + f"; speed {speed}."


def test_result(v: Verdict, better: str | None = None) -> str:
    """A test's words after its Δ: `significant (p=0.003)` / `not significant (p=0.31)`, or on a metric whose
    `better` side is "higher" or "lower" `better (p=0.003)` / `worse (p=0.003)` once decided; without a test
    `n/a: 1 seed`, `within noise (identical model)`, `baseline`."""
    if v.status in (Status.BASELINE, Status.NOT_MEASURED, Status.NO_TEST, Status.IDENTICAL):
        return _undecided(v) or "–"
    word = better_or_worse(v, better) if better and v.decided else significance(v)
    return f"{word} (p={p_value(v.p)})"


def loss_delta(v: Verdict, delta: float) -> str:
    """The main table's Δ cell: `-0.0456 significant (p=0.003)`, `+0.0000 (baseline)`, `+0.0100 n/a: 1 seed`, ..."""
    return f"{delta:+.4f} " + ("(baseline)" if v.status is Status.BASELINE else test_result(v))


def arm_cell(
    mean: float | None,
    std: float | None,
    delta: float | None,
    v: Verdict | None,
    better: str | None,
    interval: bool = False,
) -> str:
    """A per-arm table's cell: `0.5120 ± 0.0200 Δ +0.1180 better (p=0.003)` (with `interval`, Δ's 95% interval
    after it: `Δ +0.1180 [+0.0800, +0.1560] better (p=0.003)`); the baseline's without Δ; `–` where the arm has no
    value."""
    if mean is None:
        return "–"
    text = f"{mean:.4f}" + (f" ± {std:.4f}" if std is not None else "")
    if delta is None or v is None:
        return text
    span = f" [{v.interval[0]:+.4f}, {v.interval[1]:+.4f}]" if interval and v.interval else ""
    return f"{text} Δ {delta:+.4f}{span} {test_result(v, better)}"


def detectable(v: Verdict, fmt: str, suffix: str = "") -> str:
    """The smallest effect these seeds detect (`0.0324`, `1.08×`), or why there is none (`n/a: 1 seed`)."""
    if v.mde is not None:
        return format(v.mde, fmt) + suffix
    return (_undecided(v) if v.status in (Status.NO_TEST, Status.NOT_MEASURED) else None) or "n/a"


def no_verdict(why: str) -> str:
    """A cell or clause with no verdict, and why: `n/a (needs 2+ seeds each)`."""
    return f"n/a ({why})"


def _loss_clause(v: Verdict) -> str:
    """`val loss +0.0140 ± 0.0200 (within noise, could have detected ≥ 0.0307)` and its kin."""
    delta = f"{v.effect or 0.0:+.4f}"
    if v.interval is None or v.status in (Status.NO_TEST, Status.NOT_MEASURED):
        return f"val loss {delta} (1 seed on a side: no verdict; a verdict needs ≥ 2 seeds per arm)"
    shown = f"val loss {delta} ± {(v.interval[1] - v.interval[0]) / 2.0:.4f}"
    if v.decided:
        return f"{shown} ({side(v)} than the baseline beyond noise, p={p_value(v.p)})"
    could = f", could have detected ≥ {v.mde:.4f}" if v.mde is not None else ""
    return f"{shown} ({NOISE}{could})"


def timed_alone(source: Source) -> str:
    """Where a timed speed figure comes from: `timed alone: 5 interleaved rounds on NVIDIA H100 80GB HBM3`, and how
    far short of its plan a session stopped."""
    short = "" if source.finished else f" (of {source.planned} planned: the session has not finished)"
    return f"timed alone: {source.rounds} interleaved rounds{short} on {source.machine}"


def _speed_clause(v: Verdict, source: str = "") -> str:
    """`1.18× faster [1.10, 1.27] (timed alone: 5 interleaved rounds on ...)`, `0.99× within noise [0.95, 1.03]
    (could have detected ≥ 1.05×; timed alone: ...)`, `speed not timed`, ..."""
    if v.effect is None:
        return f"speed {NOT_TIMED}" if v.status is Status.NOT_MEASURED else "speed not measured"
    x = f"{v.effect:.2f}×"
    loaded = "under outside load: not to be trusted" if Caveat.UNDER_LOAD in v.caveats else ""
    if Caveat.CONFOUNDED in v.caveats:  # never a headline: the order may have made it
        return f"speed {CONFOUNDED} ({x} measured, not a finding)"
    if v.interval is None:
        return f"{x} ({'; '.join(part for part in ('1 round: no speed verdict', loaded, source) if part)})"
    ci = f"[{v.interval[0]:.2f}, {v.interval[1]:.2f}]"
    could = f"could have detected ≥ {v.mde:.2f}×" if v.mde is not None and not v.decided else ""
    said = f" ({'; '.join(part for part in (could, loaded, source) if part)})" if could or loaded or source else ""
    if v.decided:
        return f"{x} {speed(v, caveats=False)} {ci}{said}"
    if v.status is Status.BELOW_FLOOR:  # the CI may exclude 1: the A/A decides it
        return f"{x} within the timing session's A/A {ci}{said}"
    return f"{x} {NOISE} {ci}{said}"


def arm_sentence(label: str, base: str, loss: Verdict, speed_up: Verdict, source: str = "") -> str:
    """One sentence per arm against the baseline `base`: Δ val loss ± its 95% interval's half-width with the verdict
    (and, within noise, the smallest Δ these seeds could have detected), then the timed speed-up with its interval
    and `source` (timed_alone), or `speed not timed`."""
    if loss.status is Status.IDENTICAL:
        said = f", speed {speed_up.effect:.2f}×" + (f", {source}" if source else "") if speed_up.effect else ""
        return (
            f"{label}: the identical model to {base} (equal fingerprint), so every difference is noise "
            f"(Δ val loss {loss.effect or 0.0:+.4f}{said})."
        )
    return f"{label}: {_loss_clause(loss)}; {_speed_clause(speed_up, source)}."


def look(v: Verdict, threshold: float, final: bool, base: str) -> str:
    """One sequential look's test of one arm: `decided: val loss lower than 'mha' (Δ -0.0400, p=0.001 < 0.017)`,
    `undecided (p=0.2, needs < 0.017): more seeds`, or at the plan's last look `undecided at the cap of 8 seeds`."""
    p = p_value(v.p, threshold)
    if v.decided:
        return f"decided: val loss {side(v)} than '{base}' (Δ {v.effect or 0.0:+.4f}, p={p} < {threshold:.2g})"
    if final:
        return f"undecided at the cap of {v.seeds[0]} seeds (p={p}, needed < {threshold:.2g})"
    return f"undecided (p={p}, needs < {threshold:.2g}): more seeds"


def swap(v: Verdict) -> str:
    """Whether a ladder's ranking swap between two rungs is beyond noise: `(decided)` / `(within noise)`."""
    return "(decided)" if v.decided else f"({NOISE})"


def lr_moves(moves: bool | None, base: str) -> str:
    """Whether an arm's best lr moves with size as the baseline's does (a ladder with an lr grid at every rung)."""
    if moves:
        return f"its best lr MOVES DIFFERENTLY with size from {base}'s: a transferred lr would be off"
    if moves is None:
        return f"undecided whether its best lr moves like {base}'s"
    return f"its best lr moves like {base}'s (the interval holds 0)"


def note(n: Note) -> str:
    """A Note as the one line every report prints: `warning: <text>` for a warning, the text alone for a note; the
    fix, where there is one and the text does not already carry it, after the text."""
    text = n.text if not n.fix or n.fix in n.text else f"{n.text} ({n.fix})"
    return f"warning: {text}" if n.is_warning else text


def rounds_to_decide(why: Decision, rounds: int | None) -> str:
    """A --power cell on a timed speed-up: the rounds of the timing session that would decide it (`12 rounds`),
    `decided`, or why no count applies (`unknown: not timed`, `never: within the timing session's A/A`, ...)."""
    if why is Decision.ONE_SEED:
        return "unknown: 1 round (no noise estimate)"
    if why is Decision.BEYOND_CAP:
        return f"more than {MAX_SEEDS} rounds"
    return seeds_to_decide(why, rounds)


def seeds_to_decide(why: Decision, seeds: int | None) -> str:
    """A --power cell: the seeds per arm that would decide an arm (`19 seeds per arm`), `decided`, or why no count
    applies (`never: the identical model ...`)."""
    if why is Decision.SEEDS:
        return f"{seeds} seeds per arm"
    return {
        Decision.DECIDED: "decided",
        Decision.IDENTICAL: "never: the identical model (every difference is noise)",
        Decision.ONE_SEED: "unknown: a side has 1 seed (no noise estimate)",
        Decision.ROUNDS: f"{seeds} rounds",
        Decision.NOT_MEASURED: f"unknown: {NOT_TIMED}",
        Decision.WITHIN_FLOOR: "never: within the timing session's A/A",
        Decision.ZERO: "never: the observed difference is 0",
        Decision.BEYOND_CAP: f"more than {MAX_SEEDS} seeds per arm",
    }[why]

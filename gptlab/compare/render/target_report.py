"""The steps-to-target tables and the threshold sentences as sections of the report document, and their notes."""

from __future__ import annotations

from typing import Any

from gptlab.compare.render import words
from gptlab.compare.render.sections import Notes, Section, Sentences, Shown, Table
from gptlab.compare.statistics.verdict import Status, Verdict
from gptlab.compare.tables.target import TargetResult, TargetRow
from gptlab.util.note import Note, note, warning

TIME = "time at the timed step"  # the time column: steps to target at the arm's timed step time


def headers() -> list[str]:
    """The table's columns."""
    return ["label", "seeds reached", "steps", "tokens", TIME, "speed-up (steps)", "speed-up (time)"]


def _n(x: float) -> str:
    """A step count: whole numbers without decimals, means with one."""
    return f"{x:.0f}" if abs(x - round(x)) < 1e-9 else f"{x:.1f}"


def _si(x: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.3g}{unit}"
    return f"{x:.3g}"


def _pm(mean: float | None, std: float | None, fmt) -> str:
    """`mean ± std` with fmt applied to both; std left out with one value, `–` when unknown."""
    if mean is None:
        return "–"
    return fmt(mean) + (f" ± {fmt(std)}" if std is not None else "")


def _time_unit(seconds: float) -> tuple[str, float]:
    return ("h", 3600.0) if seconds >= 7200 else ("min", 60.0) if seconds >= 120 else ("s", 1.0)


def _time(mean: float | None, std: float | None) -> str:
    """A time in s, min or h (the unit the mean needs), e.g. `12.3 ± 0.4 s`."""
    if mean is None:
        return "–"
    unit, scale = _time_unit(mean)
    return _pm(mean / scale, None if std is None else std / scale, lambda v: f"{v:.1f}") + f" {unit}"


def _by(row: TargetRow) -> str:
    steps = sorted(set(row.not_reached_by))
    return f"step {steps[0]}" if len(steps) == 1 else "steps " + ", ".join(map(str, steps))


def steps_cell(row: TargetRow) -> str:
    """`340 ± 20 steps`, `2/3 reached: 340 ± 20 steps; 1 not reached by step 500` or `0/3 reached: ...`."""
    k, n = row.n_reached, row.n_seeds
    if k == 0:
        return f"0/{n} reached: not reached by {_by(row)}"
    steps = _pm(row.steps_mean, row.steps_std, _n) + " steps"
    if k == n:
        return steps
    return f"{k}/{n} reached: {steps}; {n - k} not reached by {_by(row)}"


def _partial(row: TargetRow, text: str) -> str:
    """Tokens/time cell: `not reached` for none, the seed count appended when only some reached it."""
    if row.n_reached == 0:
        return "not reached"
    return text if row.all_reached or text == "–" else f"{text} ({row.n_reached}/{row.n_seeds} reached)"


def _ratio(up: Verdict) -> str:
    """A speed-up to target with its noise: `1.86× [0.4, 8.1] within noise`, never a bare ratio; `not timed` in time
    without a timing session."""
    if up.effect is None:
        return words.speed(up) if up.metric in words.TIMED_METRICS else "–"
    if up.status is Status.BASELINE:
        return f"{up.effect:.2f}× (baseline)"
    bounds = f" [{up.interval[0]:.2f}, {up.interval[1]:.2f}]" if up.interval else ""
    return f"{up.effect:.2f}×{bounds} {words.speed(up)}"


def target_cells(result: TargetResult) -> tuple[str, list[str], list[list[str]]]:
    """Title, headers and one line per group (baseline first) for one target."""
    body = []
    for row in result.rows:
        timed = row.time_s_mean is not None or any(h.time_s is not None for h in row.seeds)
        time = _partial(row, _time(row.time_s_mean, row.time_s_std)) if timed or not row.n_reached else words.NOT_TIMED
        body.append(
            [
                row.label,
                f"{row.n_reached}/{row.n_seeds}",
                steps_cell(row),
                _partial(row, _pm(row.tokens_mean, row.tokens_std, _si)),
                time,
                _ratio(row.speedup_steps),
                _ratio(row.speedup_time),
            ]
        )
    return f"Steps to {result.target.text}", headers(), body


def _every(result: TargetResult) -> str:
    gaps = result.resolution
    return "every " + " or ".join(map(str, gaps)) + " steps" if gaps else "at the steps it was logged"


_UNSURE = Verdict("steps", Status.UNRESOLVED, ratio=True)


def at_start_warnings(result: TargetResult) -> list[Note]:
    """One warning per row with a seed that met the target at initialisation: its speed-ups are not measured."""
    out = []
    for i, row in enumerate(result.rows):
        seeds = [str(h.seed) for h in row.at_start]
        if seeds:
            whose = "every arm's speed-up to it is" if i == 0 else "its speed-ups to it are"
            text = (
                f"{result.target.text}: '{row.label}' met it at initialisation (before any training) in seed "
                f"{', '.join(seeds)}, so {whose} not measured (a speed-up from a start already past the target is "
                "undefined; a harder target measures one)"
            )
            out.append(warning(text, subject=row.label))
    return out


def target_notes(cmp: Any) -> list[Note]:
    """The rule behind the steps-to-target tables and the threshold sentences, in plain sentences."""
    if not cmp.targets:
        return []
    out = [
        note(
            "Steps to target: for each seed, the first step at which the metric was recorded at or past the target "
            "(METRIC=X means ≤ X for a loss, ≥ X for an accuracy); mean ± std over the seeds that reached it, with "
            "'k/n reached' and the step by which each other seed had still not reached it (its last recorded step) "
            "— an unreached seed is never averaged away. Tokens are those of that step (interpolated between "
            "neighbouring logged rows when the eval row lacks them, 0 at step 0; '–' when unknown, never "
            f"extrapolated). The {TIME} is that step count times the arm's step time measured by the timing "
            "session (each arm timed alone, in interleaved rounds), never a training run's own clock, which holds "
            f"whatever shared its machine; '{words.NOT_TIMED}' where no session times the arm. Speed-up = the ratio "
            "of the geometric means of the baseline's steps (or time) to target and the arm's, with a 95% CI and a "
            f"verdict ({words.RATIO_WORDS}: Welch's t-test on the logs, p < 0.05; n/a with 1 seed), shown only when "
            "both reached it in every seed and none at step 0 (a speed-up from initialisation is undefined); in "
            "time, its interval is widened by the timed step-time ratio's own interval (the two half-widths added "
            "on the logs, never narrower than the exact one) and it keeps the timed speed's caveats. Each seed's "
            "crossing lies between the previous record and the reported one, so a "
            f"{words.FASTER_SLOWER} verdict must also hold with every seed at the end of that bracket least "
            f"favourable to it, else it reads '{words.speed(_UNSURE)}'."
        )
    ]
    out += [
        note(
            f"{r.target.text}: the metric was recorded {_every(r)} (val/* metrics every train.eval_interval), so "
            "a step count is exact only to that interval: the target was crossed after the previous record, at "
            "or before the reported step."
        )
        for r in cmp.targets
    ]
    out += [n for r in cmp.targets for n in at_start_warnings(r)]
    out += [note(f"Threshold: {t.sentence}.") for t in cmp.thresholds]
    return out


def sections(cmp: Any) -> list[Section]:
    """A table per target; on the terminal the rule in one line and the targets met at initialisation; then the
    threshold sentences."""
    out: list[Section] = []
    for result in cmp.targets:
        title, headers, body = target_cells(result)
        caption = f"gptlab-compare: {title} (first eval at or past it; resolution {_every(result)})"
        rows = tuple(tuple(line) for line in body)
        out.append(Table("target", caption, tuple(headers), rows, heading=title, left=("label", "steps")))
    if cmp.targets:
        rule = (
            "steps/tokens/time: mean ± std over the seeds that reached the target, the others "
            "counted as not reached; speed-up only where both arms reached it in every seed after step 0, undecided "
            "where the evals around a crossing could flip it (rule: comparison.md)"
        )
        out.append(Sentences("target_rule", (rule,), shown=Shown.TERMINAL))
        at_start = tuple(n for result in cmp.targets for n in at_start_warnings(result))
        out += [Notes(at_start, shown=Shown.TERMINAL)] * bool(at_start)
    if cmp.thresholds:
        out.append(Sentences("threshold", tuple(t.sentence for t in cmp.thresholds), heading="Threshold"))
    return out

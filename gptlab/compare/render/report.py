"""The main comparison's own sections of the report document: the per-arm sentences, the main table with its flags and
their legend, the --power table, the notes every report carries and what the runs logged (document.py orders them)."""

from __future__ import annotations

from gptlab.compare.render import words
from gptlab.compare.render.layers import layer_notes
from gptlab.compare.render.sections import Flag, Legend, LoggedLines, Sentences, Table
from gptlab.compare.render.target_report import target_notes
from gptlab.compare.statistics.power import MAX_SEEDS, POWER
from gptlab.compare.statistics.speed import OUTSIDE_LOAD_LIMIT, mem_text
from gptlab.compare.statistics.stats import ALPHA
from gptlab.compare.statistics.verdict import Status
from gptlab.compare.tables.analysis import Comparison, Row
from gptlab.compare.tables.machine import peak_note
from gptlab.util.note import Note, note

BAND = "min–max over seeds"  # what the shaded band on every loss plot spans (titles, legends, notes)
BARS = "bar = mean ± std over seeds, dots = each run"
GEO_BARS = "bar = geometric mean ×/÷ geometric sd over seeds, dots = each run"  # tokens/s: what speed-ups divide


def loaded_label(limit: float) -> str:
    """How every speed-dependent plot labels a run (and its group's band or bar) taken under outside load."""
    return f"under outside load (> {100 * limit:.0f}% of cores busy): speed not to be trusted"


LOADED = loaded_label(OUTSIDE_LOAD_LIMIT)  # the label without a measured noise floor
SPEED_UP = "speed-up (timed, 95% CI)"
TRAINING_TPS, TRAINING_MS = "tokens/s during training", "step ms during training"  # records, never verdicts
# The honest-report flags, in legend order: the text in the table's "flags" column, what it means (legend and notes)
# and the columns it highlights in the HTML table besides the flags column.
FLAGS = {
    f.key: f
    for f in (
        Flag(
            "identical",
            "identical model",
            "builds the same model as another arm (equal fingerprint): every difference between them is noise",
            ("Δ val loss vs baseline", "identical model"),
        ),
        Flag(
            "noise",
            f"speed {words.NOISE}",
            f"the timed speed-up is not beyond the timing session's noise (paired t over its rounds p ≥ {ALPHA}, or no "
            "larger than its A/A; always so for two arms that build one model)",
            (SPEED_UP,),
        ),
        Flag(
            "load",
            "under load",
            f"other processes used more than {100 * OUTSIDE_LOAD_LIMIT:.0f}% of the cores (or, with a measured noise "
            "floor, more than its A/A saw plus 5 points) while it trained: its tokens/s during training is not to be "
            "trusted (a record; no verdict uses it)",
            (TRAINING_TPS, TRAINING_MS),
        ),
        Flag(
            "order",
            "confounded",
            "the arms' training runs ran one after another, or arm explains when they trained or the load they saw: "
            "their tokens/s during training may be the run order's (a record; the timed speed-up is not touched)",
            (TRAINING_TPS,),
        ),
        Flag(
            "mem",
            "peak mem varies",
            "peak memory differs between seeds of one config by more than the measurement's own spread (the noise "
            "floor's, else 5%): the table shows the largest",
            ("peak mem",),
        ),
    )
}
HEADERS = [
    "label",
    "seeds",
    "params",
    "FLOPs/token",
    "val loss @ {step}",
    "Δ val loss vs baseline",
    "tokens/s (timed)",
    "step ms (timed)",
    "MFU (timed)",
    "peak mem",
    SPEED_UP,
    TRAINING_TPS,
    TRAINING_MS,
    "flags",
]
LEFT = ("label", "flags", "identical model", "claimed vs measured")  # the main table's text columns
TERMINAL_HIDDEN = (  # md / html only
    "params", "FLOPs/token", "step ms (timed)", "MFU (timed)", "peak mem", TRAINING_TPS, TRAINING_MS,
    "claimed vs measured",
)  # fmt: skip


def _si(x: float | None) -> str:
    if x is None:
        return "–"
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.3g}{unit}"
    return f"{x:g}"


def _spread(mean: float | None, std: float | None, fmt: str) -> str:
    if mean is None:
        return "–"
    return format(mean, fmt) + (f" ± {format(std, fmt)}" if std is not None else "")


def _geo(gmean: float | None, factor: float | None, fmt: str) -> str:
    """`1,249 ×/÷ 1.041`: a geometric mean over seeds and its geometric sd factor."""
    if gmean is None:
        return "–"
    return format(gmean, fmt) + (f" ×/÷ {factor:.3f}" if factor is not None else "")


def speed_cell(row: Row) -> str:
    """Timed speed-up with its 95% CI and verdict, e.g. `1.25× [1.10, 1.42] faster`, `0.73× n/a: 1 seed` or `not
    timed`."""
    if row.speedup is None:
        return words.speed(row.speed)
    # An identical model's CI would describe a gap that by construction is not there (comparison.json keeps it).
    show_ci = row.speedup_ci and row.speed.status is not Status.IDENTICAL
    ci = f" [{row.speedup_ci[0]:.2f}, {row.speedup_ci[1]:.2f}]" if show_ci and row.speedup_ci else ""
    return f"{row.speedup:.2f}×{ci} {words.speed(row.speed)}"


def row_flags(row: Row) -> list[str]:
    """Keys of FLAGS that apply to this row, in FLAGS order."""
    found = {
        "identical": bool(row.identical_to),
        "noise": row.speed.status in (Status.WITHIN_NOISE, Status.BELOW_FLOOR, Status.IDENTICAL),
        "load": row.under_load,
        "order": row.order_confounded,
        "mem": row.mem_varies,
    }
    return [k for k in FLAGS if found[k]]


def _claim(row: Row) -> str:
    if not row.claimed:
        return ""
    parts = []
    if "speedup" in row.claimed:
        measured = f"{row.speedup:.2f}×" if row.speedup is not None else "–"
        parts.append(f"speed-up {row.claimed['speedup']:.2f}× claimed / {measured} measured")
    if "delta_val_loss" in row.claimed:
        parts.append(f"Δ {row.claimed['delta_val_loss']:+.4f} claimed / {row.delta_val_loss:+.4f} measured")
    return "; ".join(parts)


def source(cmp: Comparison) -> str:
    """Where the timed speed figures come from, in words ('' without a timing session)."""
    return words.timed_alone(cmp.timing.session.source) if cmp.timing is not None else ""


def verdicts(cmp: Comparison) -> list[str]:
    """The one-sentence verdict of every arm (not the baseline), in table order, the speed's source named."""
    return [words.arm_sentence(row.label, cmp.baseline, row.loss, row.speed, source(cmp)) for row in cmp.rows[1:]]


def verdict_sentences(cmp: Comparison) -> Sentences | None:
    """The per-arm sentences at equal steps, under a heading when the verdict matrix above them has arms."""
    lines = verdicts(cmp)
    if not lines:
        return None
    lr = cmp.matrix and cmp.matrix.lr_grid
    heading = "At equal steps, each arm at its own best lr" if lr else "At equal steps"
    return Sentences("verdicts", tuple(lines), heading if cmp.matrix and cmp.matrix.arms else None)


def power_line(cmp: Comparison) -> Note:
    """The one line on power every report carries: what these seeds could detect, per arm."""
    parts = []
    for row in cmp.rows[1:]:
        if row.power is None:
            continue
        loss, speed = words.detectable(row.loss, ".4f"), words.detectable(row.speed, ".2f", "×")
        undecided = [
            f"{what} needs {n} {unit}"
            for what, n, unit in (
                ("val loss", row.power.seeds_val_loss, "seeds per arm"),
                ("speed", row.power.seeds_speed, "rounds"),
            )
            if n is not None
        ]
        speed = f"speed {speed}" if row.speed.status is Status.NOT_MEASURED else f"speed-up ≥ {speed}"
        parts.append(
            f"'{row.label}' Δ val loss ≥ {loss}, {speed}" + (f" ({'; '.join(undecided)})" if undecided else "")
        )
    if not parts:
        return note("Power: no arm besides the baseline.")
    return note(
        f"Power (α = {ALPHA}, power {POWER}; val loss: two-sided Welch t from the seeds' spread; speed: paired t from "
        f"the timing session's rounds): the smallest differences detected: {'; '.join(parts)}. --power lists the seeds "
        "per arm (rounds, for speed) that would decide each undecided arm."
    )


POWER_HEADERS = [
    "label",
    "seeds",
    "detectable Δ val loss",
    "val loss: seeds per arm to decide",
    "detectable speed-up",
    "speed: rounds to decide",
]
POWER_NOTE = (
    f"Power table: detectable = the smallest difference found with probability {POWER} at α = {ALPHA} "
    "(two-sided Welch t; noncentral t with the seeds' standard deviations); seeds per arm to decide = the fewest "
    f"seeds per arm (searched up to {MAX_SEEDS}) at which the observed difference, if true, is found with "
    f"probability {POWER}. Speed is the timed speed-up's: a paired t over the timing session's rounds (log ratios, "
    f"R - 1 degrees of freedom), never below its A/A, and the rounds that would decide it; 'unknown: {words.NOT_TIMED}' "
    "without a timing session."
)


def power_cells(cmp: Comparison) -> list[list[str]]:
    """--power: one row per arm, POWER_HEADERS."""
    base = cmp.rows[0]
    return [
        [
            row.label,
            f"{row.n_seeds} vs {base.n_seeds}",
            words.detectable(row.loss, ".4f"),
            words.seeds_to_decide(p.val_loss_decision, p.seeds_val_loss),
            words.detectable(row.speed, ".3f", "×"),
            words.rounds_to_decide(p.speed_decision, p.seeds_speed),
        ]
        for row in cmp.rows[1:]
        if (p := row.power) is not None
    ]


def power_table(cmp: Comparison) -> Table:
    """The --power table and what it means."""
    left = tuple(h for h in POWER_HEADERS if h == "label" or "decide" in h)
    rows = tuple(tuple(line) for line in power_cells(cmp))
    title = f"power (α = {ALPHA}, power {POWER})"
    return Table("power", title, tuple(POWER_HEADERS), rows, heading="Power", left=left, note=POWER_NOTE)


def cells(cmp: Comparison) -> tuple[list[str], list[list[str]]]:
    """Table headers and one list of display strings per row (baseline first)."""
    at = str(cmp.step) if cmp.point is None or cmp.point.by == "step" else cmp.at()
    headers = [h.format(step=at) for h in HEADERS]
    extra_twin = any(r.identical_to for r in cmp.rows)
    extra_acc = any(r.val_acc_mean is not None for r in cmp.rows)
    extra_claim = any(r.claimed for r in cmp.rows)
    headers += ["identical model"] * extra_twin + ["val acc"] * extra_acc + ["claimed vs measured"] * extra_claim
    body = []
    for r in cmp.rows:
        loaded = " (under load)" if r.under_load else ""
        line = [
            r.label,
            str(r.n_seeds),
            _si(r.params),
            _si(r.flops_per_token),
            _spread(r.val_loss_mean, r.val_loss_std, ".4f"),
            words.loss_delta(r.loss, r.delta_val_loss),
            f"{r.timed_tokens_per_s:,.0f}" if r.timed_tokens_per_s is not None else "–",
            f"{r.timed_step_ms:.1f}" if r.timed_step_ms is not None else "–",
            f"{100 * r.mfu:.2f}%" if r.mfu is not None else "–",
            mem_text(r.peak_mem_bytes),
            speed_cell(r),
            _geo(r.tokens_per_s_gmean, r.tokens_per_s_gsd, ",.0f") + loaded,
            _geo(r.step_ms_gmean, r.step_ms_gsd, ".1f") + loaded,
            "; ".join(FLAGS[k].text for k in row_flags(r)) or "–",
        ]
        if extra_twin:
            line.append("; ".join(f"= {t}" for t in r.identical_to))
        if extra_acc:
            line.append(f"{r.val_acc_mean:.4f}" if r.val_acc_mean is not None else "–")
        if extra_claim:
            line.append(_claim(r))
        body.append(line)
    return headers, body


def _part(cmp: Comparison) -> str:
    """` [key=value, ...]` for one part of --split-by, else empty."""
    return f" [{', '.join(f'{k}={v}' for k, v in cmp.split.items())}]" if cmp.split else ""


def title(cmp: Comparison) -> str:
    """The report's title: where the runs are compared, and which --split-by part."""
    return f"Comparison at {cmp.at()}{_part(cmp)}"


def main_table(cmp: Comparison) -> Table:
    """The main table: one row per arm (baseline first), its flags highlighted; the terminal leaves the cost
    columns to the files."""
    headers, body = cells(cmp)
    return Table(
        "",
        f"gptlab-compare: val loss @ {cmp.at()} vs baseline '{cmp.baseline}'{_part(cmp)}",
        tuple(headers),
        tuple(tuple(line) for line in body),
        left=LEFT,
        hidden=tuple(h for h in headers if h in TERMINAL_HIDDEN),
        flags=tuple(tuple(FLAGS[k] for k in row_flags(r)) for r in cmp.rows),
        flag_column="flags",
    )


def legend(cmp: Comparison) -> Legend:
    """What each flag colour means (the flags of the shipped three always, any other only where a row has it)."""
    shown = {k for row in cmp.rows for k in row_flags(row)} | {"identical", "noise", "load"}
    return Legend(tuple(f for k, f in FLAGS.items() if k in shown))


def _where(cmp: Comparison) -> Note:
    if cmp.point is not None and cmp.point.by == "tokens":
        return note(
            f"Compared at {cmp.at()} (the largest number of tokens every run evaluated at: the arms differ in tokens "
            f"per step, so each is compared at its own step); baseline: {cmp.baseline}."
        )
    return note(
        f"Compared at step {cmp.step} (the largest step every run evaluated, unless --step was given); "
        f"baseline: {cmp.baseline}."
    )


def lead_notes(cmp: Comparison) -> list[Note]:
    """The notes the terminal prints under the main table too: where, what Δ means, power and the noise floor."""
    delta = note(
        f"Δ is mean val loss minus the baseline's; 'significant' means Welch's t-test p < {ALPHA} "
        "over seeds (needs ≥ 2 seeds on both sides); in the verdicts ± is the half-width of its 95% Welch interval."
    )
    timed = [n for n in [speed_note(cmp)] if n is not None]
    return [_where(cmp), delta, *timed, power_line(cmp), *[note(cmp.floor_note)] * bool(cmp.floor_note)]


def speed_note(cmp: Comparison) -> Note | None:
    """Where every speed figure of the report comes from: the timing session, its rounds, windows, machine, peak
    and A/A (None without one: the comparison's own note says "not timed" and how to time it)."""
    if cmp.timing is None:
        return None
    session = cmp.timing.session
    src = session.source
    aa = next((r.speed_aa for r in cmp.rows if r.speed_aa is not None), None)
    floor = next((r.speed.floor for r in cmp.rows if r.speed.floor is not None), None)
    control = (
        f" The session's A/A (the baseline against itself, two windows per round): {aa.ratio:.3f}×"
        + (f" [{aa.interval[0]:.3f}, {aa.interval[1]:.3f}]" if aa.interval else "")
        + (f"; no speed-up within {floor:.3f}× of 1 is decided." if floor is not None else ".")
        if aa is not None
        else ""
    )
    peak = f"--peak-flops {cmp.peak.flops:.4g}" if cmp.peak and cmp.peak.source == "--peak-flops" else None
    return note(
        f"Speed {source(cmp)} ({session.path}, host {src.hostname}): each window {src.warmup} warm-up then "
        f"{src.steps} timed steps of one arm alone, each round every arm once and the baseline twice, in a shuffled "
        "order. tokens/s, step ms and MFU (timed) are the median of each arm's windows (MFU = FLOPs/token × timed "
        f"tokens/s / {peak or f'the session peak {session.peak_flops:.4g} FLOP/s'}: the same in every report of these "
        "runs); the speed-up is the geometric mean over rounds of the arm's rate over the baseline's two windows, a "
        f"95% t interval over the rounds and a verdict ({words.RATIO_WORDS}) paired per round.{control}"
    )


def _flag_notes(cmp: Comparison) -> list[Note]:
    """What the flags in the table mean, for those a row carries."""
    flagged = {k for r in cmp.rows for k in row_flags(r)}
    return [
        *[note(f"'{FLAGS['noise'].text}': {FLAGS['noise'].meaning}.")] * ("noise" in flagged),
        *[
            note(
                f"'{FLAGS['identical'].text}': the arms build the same model (equal model fingerprint) and differ "
                "only in model config, so they are one experiment run twice and every difference between them is "
                "noise."
            )
        ]
        * ("identical" in flagged),
        *[
            note(
                f"'{FLAGS['load'].text}': other processes used more than {100 * cmp.load_limit:.0f}% of the "
                "machine's cores while a run trained, so its tokens/s during training is not to be trusted (a record: "
                "no verdict uses it)."
            )
        ]
        * any(r.under_load for r in cmp.rows),
    ]


def _one_set(vs: dict[str, str]) -> list[Note]:
    """The validation set every run was scored on, in one sentence (none where the runs recorded none)."""
    if not vs:
        return []
    scored = ", ".join(f"{k} {vs[k]}" if vs[k] != "unset" else f"{k} not recorded" for k in vs)
    return [
        note(
            f"Every run is scored on one validation set: {scored} (runs scored on different sets are never put in one "
            "table)."
        )
    ]


def notes(cmp: Comparison) -> list[Note]:
    """Every footnote of the report, the lead notes first, the comparison's own notes and warnings last."""
    clock = cmp.clock.name
    return [
        *lead_notes(cmp),
        *_one_set(cmp.validation_set),
        *([note(peak_note(cmp.peak))] if cmp.peak is not None else []),
        note(
            "tokens/s and step ms during training are the geometric mean over seeds of each run's median ×/÷ the "
            "geometric standard deviation: records of what the machine gave the runs while they trained (other runs "
            "beside them, outside load), never a verdict; comparison.json also keeps their arithmetic mean ± std and "
            "each group's MFU during training (mfu_during_training). A group not timed shows '–' for tokens/s, step "
            "ms and MFU (timed): a training run's own MFU moves with whatever else the machine ran."
        ),
        note(
            "Plots: loss curves show the mean over seeds with a marker at each eval point and a shaded band = "
            f"{BAND}; on the {clock} plot each point sits at the seeds' mean {clock} at that step. Memory bars: "
            f"{BARS} (the table's peak mem is each group's max); tokens/s bars: {GEO_BARS}. On the {clock} and "
            f"tokens/s plots a run {loaded_label(cmp.load_limit)} is grey (its group hatched). Δ val loss plot: each "
            "arm minus the baseline at every shared eval with its 95% Welch interval and a zero line (the table's "
            "test, at the compared point the table's Δ)."
        ),
        *_flag_notes(cmp),
        *layer_notes(cmp.groups, [r.label for r in cmp.rows], cmp.step),
        *target_notes(cmp),
        *cmp.notes,
        *cmp.warnings,
    ]


LOGGED_HEADING = "What the runs logged while training (train.log warnings, beside each arm)"


def logged(cmp: Comparison) -> LoggedLines | None:
    """The arms' train.log warnings, each beside its arm (None when the runs logged none)."""
    return LoggedLines(LOGGED_HEADING, tuple(cmp.logged)) if cmp.logged else None

"""Render a Comparison as text cells, then as a rich terminal table, Markdown and one self-contained HTML file."""

from __future__ import annotations

import base64
import html
from pathlib import Path

from gptlab.compare.render import compute, evals, extra_table, matrix, probes, val_sets, words
from gptlab.compare.render.layers import layer_notes
from gptlab.compare.render.target_report import html_targets, markdown_targets, print_targets, target_notes
from gptlab.compare.statistics.power import MAX_SEEDS, POWER
from gptlab.compare.statistics.speed import OUTSIDE_LOAD_LIMIT, mem_text
from gptlab.compare.statistics.stats import ALPHA
from gptlab.compare.statistics.verdict import Caveat, Status
from gptlab.compare.tables.analysis import Comparison, Row
from gptlab.compare.tables.machine import peak_note

BAND = "min–max over seeds"  # what the shaded band on every loss plot spans (titles, legends, notes)
BARS = "bar = mean ± std over seeds, dots = each run"
GEO_BARS = "bar = geometric mean ×/÷ geometric sd over seeds, dots = each run"  # tokens/s: what speed-ups divide


def loaded_label(limit: float) -> str:
    """How every speed-dependent plot labels a run (and its group's band or bar) taken under outside load."""
    return f"under outside load (> {100 * limit:.0f}% of cores busy): speed not to be trusted"


LOADED = loaded_label(OUTSIDE_LOAD_LIMIT)  # the label without a measured noise floor
# The honest-report flags: key -> (text in the table's "flags" column, what it means; legend and notes).
FLAGS = {
    "identical": (
        "identical model",
        "builds the same model as another arm (equal fingerprint): every difference between them is noise",
    ),
    "noise": (
        "speed within noise",
        f"no speed difference beyond seed noise (Welch p ≥ {ALPHA} on log tokens/s; "
        "always so for two arms that build one model)",
    ),
    "load": (
        "under load",
        f"other processes used more than {100 * OUTSIDE_LOAD_LIMIT:.0f}% of the cores (or, with a measured noise "
        "floor, more than its A/A saw plus 5 points) while it trained: its speed figures are not to be trusted",
    ),
    "order": (
        "confounded",
        "the arms ran one after another, or arm explains when the runs trained or the load they saw: the speed-up "
        "may be the run order's, not the arm's",
    ),
    "mem": (
        "peak mem varies",
        "peak memory differs between seeds of one config by more than the measurement's own spread (the noise "
        "floor's, else 5%): the table shows the largest",
    ),
}
# Columns a flag highlights in the HTML table (besides the flags column itself).
FLAG_COLUMNS = {
    "identical": ("Δ val loss vs baseline", "identical model"),
    "noise": ("speed-up (95% CI)",),
    "load": ("tokens/s", "step ms"),
    "order": ("speed-up (95% CI)",),
    "mem": ("peak mem",),
}
HEADERS = [
    "label",
    "seeds",
    "params",
    "FLOPs/token",
    "val loss @ {step}",
    "Δ val loss vs baseline",
    "tokens/s",
    "step ms",
    "MFU",
    "peak mem",
    "speed-up (95% CI)",
    "flags",
]


# The terminal table fits TERMINAL_WIDTH columns: these columns are left to comparison.md / .html.
TERMINAL_WIDTH = 120
TERMINAL_HIDDEN = ("params", "FLOPs/token", "step ms", "MFU", "peak mem", "claimed vs measured")


def _si(x: float | None) -> str:
    if x is None:
        return "–"
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.3g}{unit}"
    return f"{x:g}"


def verdict(row: Row, base: str | None) -> str:
    """Δ with its verdict vs the baseline labelled `base` (None = this is the baseline), e.g. `-0.0456 significant (p=0.003)`."""
    delta = f"{row.delta_val_loss:+.4f}"
    if base is None:
        return f"{delta} (baseline)"
    if base in row.identical_to:
        return f"{delta} noise: identical model"
    if row.significant is None:
        return f"{delta} n/a (1 seed)"
    return f"{delta} {words.significance(row.loss)} (p={words.p_value(row.p_value)})"


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
    """Speed-up with its 95% CI and verdict, e.g. `1.25× [1.10, 1.42] faster` or `0.73× n/a: 1 seed`."""
    if row.speedup is None:
        return "–"
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
        "order": Caveat.CONFOUNDED in row.speed.caveats,
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


def _half(row: Row) -> float | None:
    return (row.delta_ci[1] - row.delta_ci[0]) / 2.0 if row.delta_ci else None


def _loss_clause(row: Row) -> str:
    """`val loss +0.0140 ± 0.0200 (within noise, could have detected ≥ 0.0307)` and its kin."""
    delta, half = f"{row.delta_val_loss:+.4f}", _half(row)
    if half is None or row.significant is None:
        return f"val loss {delta} (1 seed on a side: no verdict; a verdict needs ≥ 2 seeds per arm)"
    shown = f"val loss {delta} ± {half:.4f}"
    if row.loss.decided:
        return f"{shown} ({words.side(row.loss)} than the baseline beyond noise, p={words.p_value(row.p_value)})"
    mde = row.power.mde_val_loss if row.power else None
    could = f", could have detected ≥ {mde:.4f}" if mde is not None else ""
    return f"{shown} (within noise{could})"


def _speed_clause(row: Row) -> str:
    """`1.18× faster [1.10, 1.27]`, `0.99× within noise [0.95, 1.03] (could have detected ≥ 1.05×)`, ..."""
    if row.speedup is None:
        return "speed not measured"
    loaded = " (under outside load: not to be trusted)" if Caveat.UNDER_LOAD in row.speed.caveats else ""
    if Caveat.CONFOUNDED in row.speed.caveats:  # never a headline: the order may have made it
        return f"speed confounded with run order ({row.speedup:.2f}× measured, not a finding){loaded}"
    if row.speedup_ci is None:
        return f"{row.speedup:.2f}× (1 seed on a side: no speed verdict){loaded}"
    ci = f"[{row.speedup_ci[0]:.2f}, {row.speedup_ci[1]:.2f}]"
    if row.speed.decided:
        return f"{row.speedup:.2f}× {words.speed(row.speed, caveats=False)} {ci}{loaded}"
    if row.speed.status is Status.BELOW_FLOOR:  # the CI may exclude 1: the floor decides it
        return f"{row.speedup:.2f}× within the machine's noise floor {ci}{loaded}"
    mde = row.power.mde_speedup if row.power else None
    could = f" (could have detected ≥ {mde:.2f}×)" if mde is not None else ""
    return f"{row.speedup:.2f}× within noise {ci}{could}{loaded}"


def arm_verdict(row: Row, base: Row) -> str:
    """One sentence per arm vs the baseline: Δ val loss ± the 95% interval's half-width with its verdict (and,
    within noise, the smallest Δ these seeds could have detected), then the speed-up with its 95% interval."""
    if base.label in row.identical_to:
        speed = f", speed {row.speedup:.2f}×" if row.speedup is not None else ""
        return (
            f"{row.label}: the identical model to {base.label} (equal fingerprint), so every difference is noise "
            f"(Δ val loss {row.delta_val_loss:+.4f}{speed})."
        )
    return f"{row.label}: {_loss_clause(row)}; {_speed_clause(row)}."


def verdicts(cmp: Comparison) -> list[str]:
    """The one-sentence verdict of every arm (not the baseline), in table order."""
    return [arm_verdict(row, cmp.rows[0]) for row in cmp.rows[1:]]


def _mde_text(x: float | None, fmt: str, suffix: str = "") -> str:
    return "n/a (1 seed)" if x is None else format(x, fmt) + suffix


def power_line(cmp: Comparison) -> str:
    """The one line on power every report carries: what these seeds could detect, per arm."""
    parts = []
    for row in cmp.rows[1:]:
        if row.power is None:
            continue
        loss, speed = _mde_text(row.power.mde_val_loss, ".4f"), _mde_text(row.power.mde_speedup, ".2f", "×")
        undecided = [
            f"{what} needs {n} seeds per arm"
            for what, n in (("val loss", row.power.seeds_val_loss), ("speed", row.power.seeds_speed))
            if n is not None
        ]
        parts.append(
            f"'{row.label}' Δ val loss ≥ {loss}, speed-up ≥ {speed}"
            + (f" ({'; '.join(undecided)})" if undecided else "")
        )
    if not parts:
        return "Power: no arm besides the baseline."
    return (
        f"Power (two-sided Welch t, α = {ALPHA}, power {POWER}, from the seeds' spread): the smallest differences "
        f"these seeds detect: {'; '.join(parts)}. --power lists the seeds per arm that would decide each undecided arm."
    )


POWER_HEADERS = [
    "label",
    "seeds",
    "detectable Δ val loss",
    "val loss: seeds per arm to decide",
    "detectable speed-up",
    "speed: seeds per arm to decide",
]


def power_cells(cmp: Comparison) -> list[list[str]]:
    """--power: one row per arm, POWER_HEADERS."""
    base = cmp.rows[0]
    out = []
    for row in cmp.rows[1:]:
        p = row.power
        if p is None:
            continue
        out.append(
            [
                row.label,
                f"{row.n_seeds} vs {base.n_seeds}",
                _mde_text(p.mde_val_loss, ".4f"),
                p.val_loss_decision,
                _mde_text(p.mde_speedup, ".3f", "×"),
                p.speed_decision,
            ]
        )
    return out


def power_note() -> str:
    """What the --power table means."""
    return (
        f"Power table: detectable = the smallest difference found with probability {POWER} at α = {ALPHA} "
        "(two-sided Welch t; noncentral t with the seeds' standard deviations); seeds per arm to decide = the fewest "
        f"seeds per arm (searched up to {MAX_SEEDS}) at which the observed difference, if true, is found with "
        f"probability {POWER}. Speed is tested on log tokens/s."
    )


def cells(cmp: Comparison) -> tuple[list[str], list[list[str]]]:
    """Table headers and one list of display strings per row (baseline first)."""
    at = str(cmp.step) if cmp.point is None or cmp.point.by == "step" else cmp.at()
    headers = [h.format(step=at) for h in HEADERS]
    extra_twin = any(r.identical_to for r in cmp.rows)
    extra_acc = any(r.val_acc_mean is not None for r in cmp.rows)
    extra_claim = any(r.claimed for r in cmp.rows)
    headers += ["identical model"] * extra_twin + ["val acc"] * extra_acc + ["claimed vs measured"] * extra_claim
    body = []
    for i, r in enumerate(cmp.rows):
        loaded = " (under load)" if r.under_load else ""
        line = [
            r.label,
            str(r.n_seeds),
            _si(r.params),
            _si(r.flops_per_token),
            _spread(r.val_loss_mean, r.val_loss_std, ".4f"),
            verdict(r, cmp.rows[0].label if i else None),
            _geo(r.tokens_per_s_gmean, r.tokens_per_s_gsd, ",.0f") + loaded,
            _geo(r.step_ms_gmean, r.step_ms_gsd, ".1f") + loaded,
            f"{100 * r.mfu:.2f}%" if r.mfu is not None else "–",
            mem_text(r.peak_mem_bytes),
            speed_cell(r),
            "; ".join(FLAGS[k][0] for k in row_flags(r)) or "–",
        ]
        if extra_twin:
            line.append("; ".join(f"= {t}" for t in r.identical_to))
        if extra_acc:
            line.append(f"{r.val_acc_mean:.4f}" if r.val_acc_mean is not None else "–")
        if extra_claim:
            line.append(_claim(r))
        body.append(line)
    return headers, body


def notes(cmp: Comparison) -> list[str]:
    """Plain-sentence footnotes shared by every output format."""
    if cmp.point is not None and cmp.point.by == "tokens":
        where = (
            f"Compared at {cmp.at()} (the largest number of tokens every run evaluated at: the arms differ in tokens "
            f"per step, so each is compared at its own step); baseline: {cmp.baseline}."
        )
    else:
        where = (
            f"Compared at step {cmp.step} (the largest step every run evaluated, unless --step was given); "
            f"baseline: {cmp.baseline}."
        )
    vs = cmp.validation_set
    return [
        where,
        f"Δ is mean val loss minus the baseline's; 'significant' means Welch's t-test p < {ALPHA} "
        "over seeds (needs ≥ 2 seeds on both sides); in the verdicts ± is the half-width of its 95% Welch interval.",
        power_line(cmp),
        *[cmp.floor_note] * bool(cmp.floor_note),
        *[
            "Every run is scored on one validation set: "
            + ", ".join(f"{k} {vs[k]}" if vs[k] != "unset" else f"{k} not recorded" for k in vs)
            + " (runs scored on different sets are never put in one table)."
        ]
        * bool(vs),
        *([peak_note(cmp.peak)] if cmp.peak is not None else []),
        "tokens/s and step ms are the geometric mean over seeds of each run's median ×/÷ the geometric standard "
        "deviation (one statistic: the speed-up is their ratio); comparison.json also keeps the arithmetic mean ± "
        "std. speed-up = ratio of the geometric "
        f"mean tokens/s with a 95% CI and a verdict (faster / slower / within noise) from Welch's t-test on "
        f"log tokens/s, p < {ALPHA}; n/a with 1 seed.",
        f"Plots: loss curves show the mean over seeds with a marker at each eval point and a shaded band = "
        f"{BAND}; on the {cmp.clock.name} plot each point sits at the seeds' mean {cmp.clock.name} at that step. "
        f"Memory bars: {BARS} (the table's peak mem is each group's max); tokens/s bars: {GEO_BARS}. On the "
        f"{cmp.clock.name} and tokens/s "
        f"plots a run {loaded_label(cmp.load_limit)} is grey (its group hatched). Δ val loss plot: each arm minus "
        "the baseline at every "
        "shared eval with its 95% Welch interval and a zero line (the table's test, at the compared point the "
        "table's Δ).",
        *[f"'speed within noise': {FLAGS['noise'][1]}."] * any("noise" in row_flags(r) for r in cmp.rows),
        *[
            "'identical model': the arms build the same model (equal model fingerprint) and differ only in model "
            "config, so they are one experiment run twice and every difference between them is noise."
        ]
        * any(r.identical_to for r in cmp.rows),
        *[
            f"'under load': other processes used more than {100 * cmp.load_limit:.0f}% of the machine's "
            "cores while a run trained, so its speed figures are not to be trusted."
        ]
        * any(r.under_load for r in cmp.rows),
        *layer_notes(cmp.groups, [r.label for r in cmp.rows], cmp.step),
        *target_notes(cmp),
        *cmp.notes,
        *cmp.warnings,
    ]


def _part(cmp: Comparison) -> str:
    """` [key=value, ...]` for one part of --split-by, else empty."""
    return f" [{', '.join(f'{k}={v}' for k, v in cmp.split.items())}]" if cmp.split else ""


def _title(cmp: Comparison) -> str:
    return f"Comparison at {cmp.at()}{_part(cmp)}"


def print_table(cmp: Comparison, console=None, power: bool = False) -> None:
    """Print the verdicts, the table (rich, wide enough not to wrap in a pipe), the first notes and, with power,
    the --power table."""
    import sys

    from rich.console import Console
    from rich.table import Table

    own = console is None  # our own console: the table at most TERMINAL_WIDTH wide, the text lines unwrapped
    console = console or Console(width=None if sys.stdout.isatty() else 220)
    headers, body = cells(cmp)
    keep = [i for i, h in enumerate(headers) if h not in TERMINAL_HIDDEN]
    table = Table(title=f"gptlab-compare: val loss @ {cmp.at()} vs baseline '{cmp.baseline}'{_part(cmp)}")
    for h in (headers[i] for i in keep):
        left = h in ("label", "flags", "identical model", "claimed vs measured")
        table.add_column(h, justify="left" if left else "right")
    for line in body:
        table.add_row(*(line[i] for i in keep))
    matrix.print_matrix(cmp.matrix, console)
    for sentence in verdicts(cmp):
        console.print(sentence, highlight=False, markup=False)
    console.print(table, width=min(console.width, TERMINAL_WIDTH) if own else None)
    hidden = [h for h in headers if h in TERMINAL_HIDDEN]
    console.print(f"({', '.join(hidden)}: in comparison.md and comparison.html)", highlight=False, markup=False)
    for n in notes(cmp)[: 3 + bool(cmp.floor_note)]:  # where, Δ, power and the noise floor
        console.print(n, highlight=False, markup=False)
    if power:
        ptable = Table(title=f"power (α = {ALPHA}, power {POWER})")
        for h in POWER_HEADERS:
            ptable.add_column(h, justify="left" if h == "label" or "decide" in h else "right")
        for line in power_cells(cmp):
            ptable.add_row(*line)
        console.print(ptable)
        console.print(power_note(), highlight=False, markup=False)
    print_targets(cmp, console)
    for sentence in compute.lines(cmp.compute):  # val loss at equal FLOPs / time, matched arms
        console.print(sentence, highlight=False, markup=False)
    extra_table.print_table(val_sets.extra_table(cmp.val_sets), console)
    extra_table.print_table(probes.extra_table(cmp.probes), console)
    extra_table.print_table(evals.extra_table(cmp.evals), console)
    for said in logged_lines(cmp):
        console.print(said, highlight=False, markup=False)


LOGGED_HEADING = "What the runs logged while training (train.log warnings, beside each arm)"


def logged_lines(cmp: Comparison) -> list[str]:
    """The arms' train.log warnings, one line each (the terminal and comparison.md list them all)."""
    return [f"logged: {x.describe()}" for x in cmp.logged]


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|")


def _steps_heading(cmp: Comparison) -> str:
    """The heading over the per-arm equal-steps sentences (below the verdict matrix)."""
    return "At equal steps, each arm at its own best lr" if cmp.matrix and cmp.matrix.lr_grid else "At equal steps"


def markdown(cmp: Comparison, images: dict[str, Path], power: bool = False) -> str:
    """comparison.md: title, one verdict sentence per arm, the table, the --power table (with power), notes and
    warnings, and links to the PNGs next to it."""
    headers, body = cells(cmp)
    lines = [f"# {_title(cmp)}", "", *matrix.markdown(cmp.matrix)]
    lines += [f"## {_steps_heading(cmp)}", ""] * bool(cmp.matrix and cmp.matrix.arms)
    lines += [f"- {v}" for v in verdicts(cmp)] + [""] * bool(verdicts(cmp))
    lines += ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(_md_escape(c) for c in row) + " |" for row in body]
    if power:
        lines += ["", "## Power", "", "| " + " | ".join(POWER_HEADERS) + " |", "|" + "---|" * len(POWER_HEADERS)]
        lines += ["| " + " | ".join(_md_escape(c) for c in row) + " |" for row in power_cells(cmp)]
        lines += ["", power_note()]
    lines += markdown_targets(cmp)
    lines += (["", "## Equal compute", ""] + [f"- {c}" for c in compute.lines(cmp.compute)]) if cmp.compute else []
    lines += extra_table.markdown(val_sets.extra_table(cmp.val_sets))
    lines += extra_table.markdown(probes.extra_table(cmp.probes))
    lines += extra_table.markdown(evals.extra_table(cmp.evals))
    lines += [""] + [f"- {n}" for n in notes(cmp)] + [""]
    if cmp.logged:
        lines += [f"## {LOGGED_HEADING}", ""] + [f"- {_md_escape(x.describe())}" for x in cmp.logged] + [""]
    lines += [f"![{name}]({p.name})" for name, p in images.items()]
    return "\n".join(lines) + "\n"


_FLAG_COLORS = {"identical": "#dbe8ff", "noise": "#fff1c2", "load": "#ffd6d6", "mem": "#e6d9ff"}
_CSS = (
    "body{font-family:sans-serif;margin:2em;color:#222}table{border-collapse:collapse;font-size:14px}"
    "th,td{border:1px solid #ccc;padding:4px 8px;text-align:right}td:first-child,th:first-child"
    "{text-align:left}tr:nth-child(2) td{background:#f4f4f4}img{max-width:100%;display:block}"
    ".warn{color:#a40}.verdicts{font-size:15px;line-height:1.5}.figs{display:grid;grid-template-columns:repeat(auto-fill,minmax(600px,1fr));gap:1em}"
    ".matrix td,.matrix th{text-align:left}table.matrix tr:nth-child(2) td{background:none}.shared{columns:3}"
    "figure{margin:0}figcaption{font-weight:bold;margin:.5em 0}"
    ".flag{padding:1px 6px;border-radius:3px;white-space:nowrap;display:inline-block;margin:1px}"
    + "".join(f"table tr td.flag-{k},.flag-{k}{{background:{c}}}" for k, c in _FLAG_COLORS.items())
)


def _td(header: str, text: str, flags: list[str]) -> str:
    """One table cell: the flags column as labelled badges, flagged columns with their flag classes."""
    esc = html.escape
    if header == "flags":
        inner = " ".join(f'<span class="flag flag-{k}">{esc(FLAGS[k][0])}</span>' for k in flags) or esc(text)
        return f"<td>{inner}</td>"
    classes = " ".join(f"flag-{k}" for k in flags if header in FLAG_COLUMNS[k])
    return f'<td class="{classes}">{esc(text)}</td>' if classes else f"<td>{esc(text)}</td>"


def _html_rows(cmp: Comparison, headers: list[str], body: list[list[str]]) -> str:
    """The table body; a row carries data-flags and its flagged cells carry flag-<key> classes."""
    out = []
    for row, line in zip(cmp.rows, body):
        flags = row_flags(row)
        tds = "".join(_td(h, c, flags) for h, c in zip(headers, line))
        out.append(f'<tr data-flags="{" ".join(flags)}">{tds}</tr>\n')
    return "".join(out)


def _legend(cmp: Comparison) -> str:
    """What each flag colour means (the flags of the shipped three always, any other only where a row has it)."""
    shown = {k for row in cmp.rows for k in row_flags(row)} | {"identical", "noise", "load"}
    items = "".join(
        f'<li><span class="flag flag-{k}">{html.escape(text)}</span> {html.escape(meaning)}</li>'
        for k, (text, meaning) in FLAGS.items()
        if k in shown
    )
    return f'<p>Flags, highlighted in the table:</p><ul class="legend">{items}</ul>\n'


def _figures(images: dict[str, Path]) -> str:
    """Every PNG embedded as a base64 data URI, two columns on a wide page."""
    figs = "".join(
        f'<figure><figcaption>{html.escape(name.replace("_", " "))}</figcaption><img alt="{html.escape(name)}" '
        f'src="data:image/png;base64,{base64.b64encode(p.read_bytes()).decode()}"></figure>\n'
        for name, p in images.items()
    )
    return f'<div class="figs">\n{figs}</div>\n'


def _html_power(cmp: Comparison) -> str:
    """The --power table and what it means."""
    esc = html.escape
    rows = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in line) + "</tr>\n" for line in power_cells(cmp))
    head = "".join(f"<th>{esc(h)}</th>" for h in POWER_HEADERS)
    return f'<h2>Power</h2>\n<table class="power">\n<tr>{head}</tr>\n{rows}</table>\n<p>{esc(power_note())}</p>\n'


def _html_compute(cmp: Comparison) -> str:
    """The equal-compute sentences (compare.compute), if any."""
    items = "".join(f"<li>{html.escape(c)}</li>" for c in compute.lines(cmp.compute))
    return f"<h2>Equal compute</h2>\n<ul>{items}</ul>\n" if items else ""


SHARED_KEYS = (
    "model",
    "model.n_layer",
    "model.d_model",
    "model.n_head",
    "optimizer",
    "optimizer.lr",
    "schedule",
    "schedule.warmup_steps",
    "train.max_steps",
    "train.batch_size",
    "tokens_per_step",
    "data",
    "data_fingerprint",
    "data_seed",
    "train.eval_sequences",
    "seq_len",
)


def _wandb_text(run) -> str:
    """The run's W&B path as text (entity/project/id; no URL: the page stays self-contained), or why there is none."""
    from gptlab.compare.reading.runs import wandb_identity

    ident = wandb_identity(run)
    if not ident["id"]:
        return "–"
    where = "/".join(p for p in (ident["entity"], ident["project"]) if p)
    return f"{where}/runs/{ident['id']}" if where else f"run id {ident['id']}"


def shared_settings(cmp: Comparison) -> list[tuple[str, str]]:
    """(key, value) of SHARED_KEYS over every compared run: the value, 'not recorded' where no run's files hold
    the key (an older run, a key that arrived later), or 'differs between arms'."""
    from gptlab.compare.reading.like import UNSET, value

    runs = [r for g in cmp.groups for r in g.runs]
    out = []
    for key in SHARED_KEYS:
        seen = {value(r, key) for r in runs}
        one = seen.pop() if len(seen) == 1 else "differs between arms (see the notes)"
        out.append((key, "not recorded" if one == UNSET else one))
    return out


def _html_logged(cmp: Comparison) -> str:
    """The arms' train.log warnings: a table of arm, runs, level and message ('' when none)."""
    if not cmp.logged:
        return ""
    esc = html.escape
    rows = "".join(
        f'<tr><td>{esc(x.arm)}</td><td>{x.runs} of {x.of}</td><td class="warn">{esc(x.level.lower())}</td>'
        f'<td style="text-align:left">{esc(x.message)}</td></tr>\n'
        for x in cmp.logged
    )
    return (
        f'<h2>{esc(LOGGED_HEADING)}</h2>\n<table class="logged">\n<tr><th>arm</th><th>runs</th><th>level</th>'
        f"<th>message</th></tr>\n{rows}</table>\n"
    )


def _html_runs(cmp: Comparison) -> str:
    """The compared runs (label, seed, dir, W&B run, outside load) and the settings every run shares."""
    import os

    esc = html.escape
    runs = [(g.label, r) for g in cmp.groups for r in g.runs]
    paths = [str(r.path) for _, r in runs]
    root = os.path.commonpath(paths) if len(paths) > 1 else str(runs[0][1].path.parent)
    rows = "".join(
        f"<tr><td>{esc(label)}</td><td>{esc(str(r.config.get('seed')))}</td>"
        f"<td>{esc(os.path.relpath(r.path, root))}</td><td>{esc(_wandb_text(r))}</td>"
        f"<td>{'–' if (load := r.summary.get('outside_load')) is None else f'{100 * float(load):.0f}%'}</td></tr>\n"
        for label, r in runs
    )
    shared = "".join(f"<li>{esc(k)}: {esc(v)}</li>" for k, v in shared_settings(cmp))
    return (
        f'<h2>Compared runs</h2>\n<p>Run dirs under {esc(root)}</p>\n<table class="runs">\n<tr><th>label</th>'
        f"<th>seed</th><th>run dir</th><th>W&amp;B run</th><th>outside load</th></tr>\n{rows}</table>\n"
        f'<p>Settings every run shares:</p><ul class="shared">{shared}</ul>\n'
    )


def html_report(cmp: Comparison, images: dict[str, Path], extra: str = "", power: bool = False) -> str:
    """comparison.html: one file, inline CSS, PNGs embedded as base64 data URIs, no scripts or URLs; one verdict
    sentence per arm at the top; `extra` is more HTML placed before the figures (the decode table); with power,
    the --power table after the main one."""
    headers, body = cells(cmp)
    esc = html.escape
    note_items = "".join(f'<li class="{"warn" if n.startswith("warning") else ""}">{esc(n)}</li>' for n in notes(cmp))
    sentences = "".join(f"<li>{esc(v)}</li>" for v in verdicts(cmp))
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>gptlab {esc(_title(cmp).lower())}</title><style>{_CSS}</style></head><body>\n"
        f"<h1>{esc(_title(cmp))} (baseline: {esc(cmp.baseline)})</h1>\n"
        + matrix.html_matrix(cmp.matrix)
        + (f"<h2>{esc(_steps_heading(cmp))}</h2>\n" if cmp.matrix and cmp.matrix.arms else "")
        + (f'<ul class="verdicts">{sentences}</ul>\n' if sentences else "")
        + "<table>\n<tr>"
        + "".join(f"<th>{esc(h)}</th>" for h in headers)
        + f"</tr>\n{_html_rows(cmp, headers, body)}</table>\n"
        + (_html_power(cmp) if power else "")
        + f"{_legend(cmp)}{html_targets(cmp)}{_html_compute(cmp)}{extra_table.html_table(val_sets.extra_table(cmp.val_sets))}{extra_table.html_table(probes.extra_table(cmp.probes))}{extra_table.html_table(evals.extra_table(cmp.evals))}<ul>{note_items}</ul>\n{_html_logged(cmp)}{extra}{_figures(images)}{_html_runs(cmp)}</body></html>\n"
    )

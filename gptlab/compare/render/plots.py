"""Comparison plots as PNG files (matplotlib, Agg backend): loss curves with seed bands, Δ val loss vs the baseline
with its 95% interval, smoothed train loss, speed/memory bars.

Plots carry the verdict: the numbers the Δ, train-loss and speed plots draw come from gptlab.compare.tables.curves (the
table's statistics), and every speed-dependent plot (the time axis, tokens/s) marks runs taken under outside load in
grey / hatched with a legend note. The time axis is the comparison's clock (reading/clock.py): training time where
every run recorded it, else wall time; one of the two is drawn, never both.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import cast

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.ticker import EngFormatter, FuncFormatter  # noqa: E402

from gptlab.compare.reading.clock import NAMES  # noqa: E402
from gptlab.compare.reading.group import Group  # noqa: E402
from gptlab.compare.reading.runs import Run  # noqa: E402
from gptlab.compare.render import words  # noqa: E402
from gptlab.compare.render.layers import layer_figures  # noqa: E402
from gptlab.compare.render.report import BAND, BARS, GEO_BARS, LOADED, loaded_label  # noqa: E402
from gptlab.compare.statistics import speed, stats  # noqa: E402
from gptlab.compare.statistics.verdict import Status, Verdict  # noqa: E402
from gptlab.compare.tables import curves
from gptlab.compare.tables.analysis import Comparison  # noqa: E402

# x-axis key -> (axis label, file/plot name)
CURVES = {
    "step": ("step", "val_loss_vs_step"),
    "train_s": ("training time", "val_loss_vs_training_time"),
    "wall_s": ("wall time", "val_loss_vs_wall_time"),
    "tokens": ("tokens", "val_loss_vs_tokens"),
    "flops": ("training FLOPs", "val_loss_vs_flops"),  # metrics.jsonl `flops` (compare.compute rebuilds old runs')
}
TIMES = set(NAMES)  # the time keys: train_s, wall_s


def _color(i: int):
    return plt.get_cmap("tab10")(i % 10)


@dataclass
class LossBand:
    """One group's val loss at each eval point: x, mean over seeds, min and max over seeds, seeds counted."""

    x: np.ndarray
    mean: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    n: np.ndarray


def x_at_evals(run: Run, key: str) -> dict[int, float]:
    """Eval step -> x (the step, or `tokens`/a time interpolated between the steps that recorded it)."""
    steps = run.val_steps()
    if key == "step":
        return {s: float(s) for s in steps}
    known = {s: float(r[key]) for s, r in run.by_step.items() if r.get(key) is not None}
    if not known:
        return {}
    # The step-0 loss is the initial model's: 0 tokens seen, at 0 s on the run's clock. Older runs' step-0 row
    # carries neither; newer ones stamp it with the time the eval itself took, which is not training time.
    known[0] = 0.0
    xs, ys = zip(*sorted(known.items()))
    return {s: float(np.interp(s, xs, ys)) for s in steps if xs[0] <= s <= xs[-1]}  # never extrapolated


def loss_band(g: Group, key: str) -> LossBand | None:
    """Mean and min–max of val loss over the seeds at each eval step, placed at x = the seeds' mean `key`.

    Tokens per step are identical across seeds, so their x is exact. Time differs per seed: each eval point sits
    at the seeds' mean time at that step, and the band is the loss spread at equal steps.
    """
    xs = [x_at_evals(r, key) for r in g.runs]
    points = []
    for s in sorted({s for x in xs for s in x}):
        seen = [(x[s], float(r.by_step[s]["val/loss"])) for x, r in zip(xs, g.runs) if s in x]
        losses = [v for _, v in seen]
        points.append((stats.mean([x for x, _ in seen]), stats.mean(losses), min(losses), max(losses), len(seen)))
    if not points:
        return None
    return LossBand(*(np.array(col, dtype=float) for col in zip(*points)))


def _time_unit(seconds: float) -> tuple[float, str]:
    """(divisor, unit) that keeps time ticks short: s below 2 min, min below 2 h, else h."""
    if seconds < 120:
        return 1.0, "s"
    return (60.0, "min") if seconds < 7200 else (3600.0, "h")


def _plain(value: float, _pos=None) -> str:
    return f"{value:g}"


def _draw_band(ax, band: LossBand, color, label: str, hatched: bool = False) -> None:
    """Mean line with a marker at every eval point, shaded min–max band where a step had ≥ 2 seeds (hatched grey
    edges for a group whose speed was taken under outside load)."""
    ax.plot(band.x, band.mean, color=color, marker="o", markersize=4, label=label)
    if band.n.max() > 1:
        if hatched:
            ax.fill_between(band.x, band.lo, band.hi, facecolor=color, alpha=0.2, hatch="//", edgecolor="grey")
        else:
            ax.fill_between(band.x, band.lo, band.hi, color=color, alpha=0.2, linewidth=0)


def _loaded_patch(label: str = LOADED) -> Patch:
    return Patch(facecolor="none", edgecolor="grey", hatch="//", label=label)


def _mark_loaded_runs(ax, cmp: Comparison, scale: float) -> bool:
    """Each run taken under outside load as its own grey dashed val-loss curve on the time axis; True if any."""
    first = True
    for g in cmp.groups:
        for run in curves.loaded_runs(g, cmp.load_limit):
            xs = x_at_evals(run, cmp.clock.key)
            if not xs:
                continue
            steps = sorted(xs)
            ax.plot(
                [xs[s] / scale for s in steps],
                [float(run.by_step[s]["val/loss"]) for s in steps],
                color="grey",
                linestyle="--",
                marker="x",
                markersize=4,
                linewidth=1,
                label=f"one run, {loaded_label(cmp.load_limit)}" if first else "_loaded run",
            )
            first = False
    return not first


def _loss_figure(cmp: Comparison, key: str):
    """val loss vs `key` (step, tokens, flops or a time) for every group; None when no group has that x."""
    found = [(i, row, loss_band(g, key)) for i, (g, row) in enumerate(zip(cmp.groups, cmp.rows))]
    bands = [(i, row, b) for i, row, b in found if b is not None]
    if not bands:
        return None
    name, _ = CURVES[key]
    timed = key in TIMES  # the one loss axis that depends on speed
    scale, unit = _time_unit(max(b.x.max() for _, _, b in bands)) if timed else (1.0, "")
    fig, ax = plt.subplots(figsize=(8, 5))
    for i, row, b in bands:
        b.x = b.x / scale
        loaded = timed and row.under_load
        _draw_band(
            ax, b, _color(i), f"{row.label} (n={int(b.n.max())}{', under outside load' if loaded else ''})", loaded
        )
    marked = _mark_loaded_runs(ax, cmp, scale) if timed else False
    by = cmp.point.by if cmp.point else "step"
    if key == by == "step":
        ax.axvline(cmp.step, color="grey", linestyle="--", linewidth=1, label=f"common step {cmp.step}")
    elif key == by == "tokens" and cmp.point:
        ax.axvline(cmp.point.value, color="grey", linestyle="--", linewidth=1, label=f"compared at {cmp.at()}")
    ax.xaxis.set_major_formatter(FuncFormatter(_plain) if timed else EngFormatter(sep=""))
    where = ", x = mean over seeds" if timed else ""
    ax.set_xlabel(f"{name} ({unit}){where}" if unit else name)
    ax.set_ylabel("val loss")
    ax.set_title(f"val loss vs {name}: mean over seeds, band = {BAND}")
    if timed and _confounded(cmp):
        fig.suptitle(CONFOUNDED_NOTE, color="firebrick", fontsize=9)
    ax.grid(alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    handles.append(Patch(color="grey", alpha=0.3, label=f"band: {BAND}"))
    if marked:
        handles.append(_loaded_patch(loaded_label(cmp.load_limit)))
    ax.legend(handles=handles, fontsize=8)
    fig.tight_layout()
    return fig


def _mem_unit(peak: float) -> tuple[float, str]:
    """(divisor, unit) for bytes: GiB from 1 GiB up, else MiB."""
    return (2.0**30, "GiB") if peak >= 2**30 else (2.0**20, "MiB")


def _bar_heights(values: list[list[float]], geometric: bool) -> tuple[list[float], list[float], list]:
    """(bar heights, how far each error bar reaches up, matplotlib's yerr): the mean ± std over each group's runs, or
    the geometric mean ×/÷ the geometric sd factor."""
    if geometric:
        geo = [speed.geometric(v) for v in values]
        means = [g or 0.0 for g, _ in geo]
        ups = [m * (f or 1.0) - m for m, (_, f) in zip(means, geo)]  # up to gmean × factor
        return means, ups, [[m - m / (f or 1.0) for m, (_, f) in zip(means, geo)], ups]  # down to gmean / factor
    means = [stats.mean(v) if v else 0.0 for v in values]
    ups = [cast(float, stats.std(v)) if len(v) > 1 else 0.0 for v in values]  # >= 2 values have a std
    return means, ups, ups


def _run_dots(ax, values: list[list[float]], flags: list[list[bool]], label: str) -> None:
    """Each run's own value as a dot beside its group's bar; runs under outside load as grey crosses."""
    first_loaded = True
    for i, (v, f) in enumerate(zip(values, flags)):
        jitter = np.linspace(-0.15, 0.15, len(v)) if len(v) > 1 else np.zeros(len(v))
        calm = [j for j in range(len(v)) if not f[j]]
        busy = [j for j in range(len(v)) if f[j]]
        if calm:
            each = "each run" if i == 0 else None
            ax.scatter(i + jitter[calm], [v[j] for j in calm], color="black", s=18, zorder=3, label=each)
        if busy:
            one = f"one run, {label}" if first_loaded else None
            ax.scatter(i + jitter[busy], [v[j] for j in busy], color="grey", marker="X", s=70, zorder=4, label=one)
            first_loaded = False


def _bar_figure(
    labels: list[str],
    values: list[list[float]],
    title: str,
    ylabel: str,
    formatter,
    loaded: list[list[bool]] | None = None,
    label: str = LOADED,
    geometric: bool = False,
):
    """One bar per group at the mean over its runs, ± std error bars, and each run's own value as a dot.

    `loaded` (per group, per run): runs taken under outside load are grey crosses, their group's bar hatched;
    `label` names them (the comparison's load limit). `geometric`: bars at the geometric mean ×/÷ the geometric sd
    (tokens/s, beside geometric-mean speed-ups).
    """
    if not any(values):
        return None
    flags = loaded or [[False] * len(v) for v in values]
    hot = any(any(f) for f in flags)
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(values) + 2), 5.5 if hot else 4.5))
    xs = np.arange(len(values))
    means, ups, yerr = _bar_heights(values, geometric)
    bars = ax.bar(xs, means, color=[_color(int(i)) for i in xs], alpha=0.6)
    for bar, f in zip(bars, flags):
        if any(f):
            bar.set_hatch("//")
            bar.set_edgecolor("grey")
    spread = "×/÷ geometric sd over seeds" if geometric else "± std over seeds"
    ax.errorbar(xs, means, yerr=yerr, fmt="none", ecolor="black", capsize=6, linewidth=1.2, label=spread)
    _run_dots(ax, values, flags, label)
    ax.set_xticks(xs, labels, rotation=20, ha="right", fontsize=8)
    ax.yaxis.set_major_formatter(formatter)
    ax.set_ylabel(ylabel)
    ax.set_title(f"{title} ({GEO_BARS if geometric else BARS})", fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    top = max((max(v) for v in values if v), default=1.0)
    ax.set_ylim(0, 1.2 * max(top, max(m + s for m, s in zip(means, ups))))  # headroom for the legend
    handles, _ = ax.get_legend_handles_labels()
    if hot:  # the long note goes in a band below the tick labels, where it has the figure's width
        handles.append(_loaded_patch(label))
        fig.legend(handles=handles, fontsize=7, loc="lower center", ncol=1)
        fig.tight_layout(rect=(0.0, 0.2, 1.0, 1.0))
    else:
        ax.legend(handles=handles, fontsize=8, loc="upper center", ncol=2)
        fig.tight_layout()
    return fig


def _speed_figure(cmp: Comparison):
    """tokens/s per group from each run's median (the numbers the table's geometric mean ×/÷ sd comes from); runs
    under outside load grey, their groups' bars hatched."""
    points = [curves.speed_points(g, cmp.load_limit) for g in cmp.groups]
    values = [[v for v, _ in p] for p in points]
    loaded = [[hot for _, hot in p] for p in points]
    labels = [r.label for r in cmp.rows]
    fig = _bar_figure(
        labels,
        values,
        "tokens/s during training (records)",
        "tokens/s",
        EngFormatter(sep=""),
        loaded,
        loaded_label(cmp.load_limit),
        True,
    )
    if _confounded(cmp):
        fig.suptitle(CONFOUNDED_NOTE, color="firebrick", fontsize=9)
        fig.tight_layout()
    return fig


# What a speed-dependent plot says when the table's speed verdicts carry the run-order confound
CONFOUNDED_NOTE = "tokens/s during training confounded with run order (see the report's warning): records, not findings"


def _confounded(cmp: Comparison) -> bool:
    return any(row.order_confounded for row in cmp.rows)


def _train_figure(cmp: Comparison):
    """Smoothed train loss vs step per group (mean over seeds, min–max band); None when no run logged train loss."""
    found = [(i, row, curves.train_band(g)) for i, (g, row) in enumerate(zip(cmp.groups, cmp.rows))]
    bands = [(i, row, b) for i, row, b in found if b is not None]
    if not bands:
        return None
    fig, ax = plt.subplots(figsize=(8, 5))
    for i, row, b in bands:
        ax.plot(b.x, b.mean, color=_color(i), label=f"{row.label} (n={max(b.n)})")
        if max(b.n) > 1:
            ax.fill_between(b.x, b.lo, b.hi, color=_color(i), alpha=0.2, linewidth=0)
    ax.xaxis.set_major_formatter(EngFormatter(sep=""))
    ax.set_xlabel("step")
    ax.set_ylabel("train loss (smoothed)")
    share = f"{100 * curves.SMOOTH_FRACTION:.0f}%"
    ax.set_title(
        f"train loss, trailing mean over {share} of the logged steps: mean over seeds, band = {BAND}", fontsize=9
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def _delta_title(curve: curves.DeltaCurve, v: Verdict, where: str) -> str:
    """The arm's Δ at the compared point with the table's own verdict on it (`v`: its row's val-loss Verdict), so the
    plot never says more than the table."""
    delta, lo, hi = curve.at_point()
    span = "" if np.isnan(lo) or v.status is Status.IDENTICAL else f" [{lo:+.4f}, {hi:+.4f}]"
    return f"{curve.label}: Δ {delta:+.4f}{span} at {where}: {words.change(v, 'val loss')}"


def _delta_figure(cmp: Comparison):
    """Δ val loss vs the baseline per arm (one panel each): the Δ line, its 95% Welch interval, a zero line and the
    compared point; None with the baseline alone."""
    found = [c for c in curves.delta_curves(cmp) if c.x]
    if not found:
        return None
    loss = {row.label: row.loss for row in cmp.rows}  # the table's verdict at the compared point
    cols = 1 if len(found) <= 3 else 2
    rows = -(-len(found) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(8 * cols, 2.6 * rows + 0.8), squeeze=False, sharex=True)
    for k, curve in enumerate(found):
        ax = axes[k // cols][k % cols]
        color = _color(k + 1)
        ax.axhline(0.0, color="black", linewidth=1, label="zero: no difference")
        ax.plot(curve.x, curve.delta, color=color, marker="o", markersize=3, label="Δ val loss (mean − baseline mean)")
        ax.fill_between(curve.x, curve.lo, curve.hi, color=color, alpha=0.25, linewidth=0, label="95% interval (Welch)")
        ax.axvline(curve.at, color="grey", linestyle="--", linewidth=1, label=f"compared at {cmp.at()}")
        ax.set_title(_delta_title(curve, loss[curve.label], cmp.at()), fontsize=9)
        ax.xaxis.set_major_formatter(EngFormatter(sep=""))
        ax.grid(alpha=0.3)
        if k == 0:
            ax.legend(fontsize=7, loc="upper right")
    for k in range(len(found), rows * cols):
        axes[k // cols][k % cols].set_visible(False)
    x_name = "step" if found[0].by == "step" else "tokens"
    for ax in axes[-1]:
        ax.set_xlabel(x_name)
    fig.supylabel(f"Δ val loss vs {cmp.baseline}", fontsize=9)
    fig.tight_layout()
    return fig


def _memory_figure(cmp: Comparison):
    """Peak memory of each run (the table shows each group's max)."""
    values = [
        [float(p) for r in g.runs if (p := speed.run_speed(r, "peak_mem_bytes", "mem/peak_bytes", max))]
        for g in cmp.groups
    ]
    if not any(values):
        return None
    scale, unit = _mem_unit(max(max(v) for v in values if v))
    values = [[p / scale for p in v] for v in values]
    return _bar_figure(
        [r.label for r in cmp.rows], values, "peak memory", f"peak memory ({unit})", FuncFormatter(_plain)
    )


def save_png(fig, path: Path, dpi: int) -> Path:
    """fig as a PNG at path. First drops the placeholder layout engine that fig.tight_layout() leaves on the figure:
    with any engine set, savefig draws the whole figure once more before it renders (a layout pass with nothing to
    lay out, ~20 % of a save's CPU; the PNG's bytes are the same without it)."""
    fig.set_layout_engine(None)
    fig.savefig(path, dpi=dpi)
    return path


def make_plots(cmp: Comparison, out: Path, figures: dict | None = None) -> dict[str, Path]:
    """Write the PNGs into out; returns name -> path for those that had data (`figures` keeps them open)."""
    by = cmp.point.by if cmp.point else "step"
    made = {"val_loss_vs_step": _loss_figure(cmp, "step"), "train_loss_vs_step": _train_figure(cmp)}
    made[f"delta_val_loss_vs_{by}"] = _delta_figure(cmp)  # train loss sits beside val loss in the two columns
    skip = {"step", *(TIMES - {cmp.clock.key})}  # the time axis: the comparison's clock alone
    made |= {name: _loss_figure(cmp, key) for key, (_, name) in CURVES.items() if key not in skip}
    made["tokens_per_s"] = _speed_figure(cmp)
    made["peak_memory"] = _memory_figure(cmp)
    made |= layer_figures(cmp.groups, [r.label for r in cmp.rows])  # runs with train.diagnostics=true
    paths = {}
    for name, fig in made.items():
        if fig is None:
            continue
        paths[name] = save_png(fig, out / f"{name}.png", dpi=100)
        if figures is None:
            plt.close(fig)
        else:
            figures[name] = fig
    return paths

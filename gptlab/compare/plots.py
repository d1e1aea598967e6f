"""Comparison plots as PNG files (matplotlib, Agg backend): loss curves with seed bands, speed/memory bars."""

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

from gptlab.compare import speed, stats  # noqa: E402
from gptlab.compare.analysis import Comparison  # noqa: E402
from gptlab.compare.group import Group  # noqa: E402
from gptlab.compare.layers import layer_figures  # noqa: E402
from gptlab.compare.report import BAND, BARS  # noqa: E402
from gptlab.compare.runs import Run  # noqa: E402

# x-axis key -> (axis label, file/plot name)
CURVES = {
    "step": ("step", "val_loss_vs_step"),
    "wall_s": ("wall time", "val_loss_vs_wall_time"),
    "tokens": ("tokens", "val_loss_vs_tokens"),
}


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
    """Eval step -> x (the step, or `tokens`/`wall_s` interpolated between the steps that recorded it)."""
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

    Tokens per step are identical across seeds, so their x is exact. Wall time differs per seed: each eval
    point sits at the seeds' mean wall time at that step, and the band is the loss spread at equal steps.
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
    """(divisor, unit) that keeps wall-time ticks short: s below 2 min, min below 2 h, else h."""
    if seconds < 120:
        return 1.0, "s"
    return (60.0, "min") if seconds < 7200 else (3600.0, "h")


def _plain(value: float, _pos=None) -> str:
    return f"{value:g}"


def _draw_band(ax, band: LossBand, color, label: str) -> None:
    """Mean line with a marker at every eval point, shaded min–max band where a step had ≥ 2 seeds."""
    ax.plot(band.x, band.mean, color=color, marker="o", markersize=4, label=label)
    if band.n.max() > 1:
        ax.fill_between(band.x, band.lo, band.hi, color=color, alpha=0.2, linewidth=0)


def _loss_figure(cmp: Comparison, key: str):
    """val loss vs `key` (step, wall_s or tokens) for every group; None when no group has that x."""
    found = [(i, row, loss_band(g, key)) for i, (g, row) in enumerate(zip(cmp.groups, cmp.rows))]
    bands = [(i, row, b) for i, row, b in found if b is not None]
    if not bands:
        return None
    name, _ = CURVES[key]
    scale, unit = _time_unit(max(b.x.max() for _, _, b in bands)) if key == "wall_s" else (1.0, "")
    fig, ax = plt.subplots(figsize=(8, 5))
    for i, row, b in bands:
        b.x = b.x / scale
        _draw_band(ax, b, _color(i), f"{row.label} (n={int(b.n.max())})")
    if key == "step":
        ax.axvline(cmp.step, color="grey", linestyle="--", linewidth=1, label=f"common step {cmp.step}")
    ax.xaxis.set_major_formatter(FuncFormatter(_plain) if key == "wall_s" else EngFormatter(sep=""))
    where = ", x = mean over seeds" if key == "wall_s" else ""
    ax.set_xlabel(f"{name} ({unit}){where}" if unit else name)
    ax.set_ylabel("val loss")
    ax.set_title(f"val loss vs {name}: mean over seeds, band = {BAND}")
    ax.grid(alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    handles.append(Patch(color="grey", alpha=0.3, label=f"band: {BAND}"))
    ax.legend(handles=handles, fontsize=8)
    fig.tight_layout()
    return fig


def _mem_unit(peak: float) -> tuple[float, str]:
    """(divisor, unit) for bytes: GiB from 1 GiB up, else MiB."""
    return (2.0**30, "GiB") if peak >= 2**30 else (2.0**20, "MiB")


def _bar_figure(labels: list[str], values: list[list[float]], title: str, ylabel: str, formatter):
    """One bar per group at the mean over its runs, ± std error bars, and each run's own value as a dot."""
    if not any(values):
        return None
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(values) + 2), 4.5))
    xs = np.arange(len(values))
    means = [stats.mean(v) if v else 0.0 for v in values]
    stds = [cast(float, stats.std(v)) if len(v) > 1 else 0.0 for v in values]  # >= 2 values have a std
    ax.bar(xs, means, color=[_color(int(i)) for i in xs], alpha=0.6)
    ax.errorbar(xs, means, yerr=stds, fmt="none", ecolor="black", capsize=6, linewidth=1.2, label="± std over seeds")
    for i, v in enumerate(values):
        jitter = np.linspace(-0.15, 0.15, len(v)) if len(v) > 1 else np.zeros(len(v))
        ax.scatter(i + jitter, v, color="black", s=18, zorder=3, label="each run" if i == 0 else None)
    ax.set_xticks(xs, labels, rotation=20, ha="right", fontsize=8)
    ax.yaxis.set_major_formatter(formatter)
    ax.set_ylabel(ylabel)
    ax.set_title(f"{title} ({BARS})", fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    top = max((max(v) for v in values if v), default=1.0)
    ax.set_ylim(0, 1.2 * max(top, max(m + s for m, s in zip(means, stds))))  # headroom for the legend
    ax.legend(fontsize=8, loc="upper center", ncol=2)
    fig.tight_layout()
    return fig


def _speed_figure(cmp: Comparison):
    """tokens/s per group from each run's median (the numbers the table's mean ± std come from)."""
    values = [list(r.tokens_per_s_seeds) for r in cmp.rows]
    return _bar_figure([r.label for r in cmp.rows], values, "tokens/s", "tokens/s", EngFormatter(sep=""))


def _memory_figure(cmp: Comparison):
    """Peak memory of each run (the table shows each group's max)."""
    values = [
        [float(p) for r in g.runs if (p := speed.run_speed(r, "peak_mem_bytes", "peak_mem_bytes", max))]
        for g in cmp.groups
    ]
    if not any(values):
        return None
    scale, unit = _mem_unit(max(max(v) for v in values if v))
    values = [[p / scale for p in v] for v in values]
    return _bar_figure(
        [r.label for r in cmp.rows], values, "peak memory", f"peak memory ({unit})", FuncFormatter(_plain)
    )


def make_plots(cmp: Comparison, out: Path, figures: dict | None = None) -> dict[str, Path]:
    """Write the PNGs into out; returns name -> path for those that had data (`figures` keeps them open)."""
    made = {name: _loss_figure(cmp, key) for key, (_, name) in CURVES.items()}
    made["tokens_per_s"] = _speed_figure(cmp)
    made["peak_memory"] = _memory_figure(cmp)
    made |= layer_figures(cmp.groups, [r.label for r in cmp.rows])  # runs with train.diagnostics=true
    paths = {}
    for name, fig in made.items():
        if fig is None:
            continue
        paths[name] = out / f"{name}.png"
        fig.savefig(paths[name], dpi=100)
        if figures is None:
            plt.close(fig)
        else:
            figures[name] = fig
    return paths

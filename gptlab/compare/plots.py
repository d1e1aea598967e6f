"""Comparison plots as PNG files (matplotlib, Agg backend): curves with seed bands and speed/memory bars."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from gptlab.compare.analysis import Comparison  # noqa: E402
from gptlab.compare.group import Group  # noqa: E402
from gptlab.compare.runs import Run  # noqa: E402


def _color(i: int):
    return plt.get_cmap("tab10")(i % 10)


def _x_at(run: Run, key: str) -> tuple[list[int], np.ndarray] | None:
    """(eval steps, `key` at them) interpolated from the steps that recorded `key`; no extrapolation."""
    known = dict((s, float(r[key])) for s, r in run.by_step.items() if r.get(key) is not None)
    if key == "tokens":
        known.setdefault(0, 0.0)  # no tokens have been seen before step 1, by definition
    if not known:
        return None
    xs, ys = zip(*sorted(known.items()))
    steps = [s for s in run.val_steps() if xs[0] <= s <= xs[-1]]
    return steps, np.interp(steps, xs, ys)


def _loss_vs_step(ax, g: Group, color, label: str) -> None:
    """Mean line over the seeds that reached each step, shaded min..max band across seeds."""
    steps = sorted({s for r in g.runs for s in r.val_steps()})
    per_step = [[r.by_step[s]["val/loss"] for r in g.runs if s in r.by_step and "val/loss" in r.by_step[s]]
                for s in steps]
    mean = np.array([np.mean(v) for v in per_step])
    ax.plot(steps, mean, color=color, label=f"{label} (n={len(g.runs)})")
    if len(g.runs) > 1:
        ax.fill_between(steps, [min(v) for v in per_step], [max(v) for v in per_step], color=color, alpha=0.2)


def _curves(cmp: Comparison, out: Path, xkey: str | None, xlabel: str, fname: str) -> Path | None:
    fig, ax = plt.subplots(figsize=(8, 5))
    ax.set_title(f"val loss vs {xlabel}" + (" (mean over seeds, band = min..max)" if xkey is None else " (one line per run)"))
    drawn = False
    for i, (g, row) in enumerate(zip(cmp.groups, cmp.rows)):
        if xkey is None:
            _loss_vs_step(ax, g, _color(i), row.label)
            drawn = True
            continue
        for j, run in enumerate(g.runs):
            found = _x_at(run, xkey)
            if found is None or not found[0]:
                continue
            steps, xs = found
            ys = [run.by_step[s]["val/loss"] for s in steps]
            ax.plot(xs, ys, color=_color(i), alpha=0.8, label=row.label if j == 0 else None)
            drawn = True
    if not drawn:
        plt.close(fig)
        return None
    if xkey is None:
        ax.axvline(cmp.step, color="grey", linestyle="--", linewidth=1, label=f"common step {cmp.step}")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("val loss")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = out / fname
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _bars(cmp: Comparison, out: Path, attr: str, scale: float, ylabel: str, fname: str,
          err: str | None = None) -> Path | None:
    """One bar per group; `err` names the Row attribute drawn as ± error bars (std over seeds)."""
    values = [getattr(r, attr) for r in cmp.rows]
    if all(v is None for v in values):
        return None
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(values) + 2), 4.5))
    xs = np.arange(len(values))
    yerr = [(getattr(r, err) or 0) / scale for r in cmp.rows] if err else None
    ax.bar(xs, [(v or 0) / scale for v in values], yerr=yerr, capsize=4 if err else 0,
           color=[_color(i) for i in range(len(values))])
    ax.set_xticks(xs, [r.label for r in cmp.rows], rotation=20, ha="right", fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(ylabel)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    path = out / fname
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def make_plots(cmp: Comparison, out: Path) -> dict[str, Path]:
    """Write the PNGs into out; returns name -> path for those that had data to plot."""
    made = {
        "val_loss_vs_step": _curves(cmp, out, None, "step", "val_loss_vs_step.png"),
        "val_loss_vs_wall_time": _curves(cmp, out, "wall_s", "wall time (s)", "val_loss_vs_wall_time.png"),
        "val_loss_vs_tokens": _curves(cmp, out, "tokens", "tokens", "val_loss_vs_tokens.png"),
        "tokens_per_s": _bars(cmp, out, "tokens_per_s", 1.0, "tokens/s (mean ± std over seeds)", "tokens_per_s.png",
                              err="tokens_per_s_std"),
        "peak_memory": _bars(cmp, out, "peak_mem_bytes", 2**20, "peak memory (MiB)", "peak_memory.png"),
    }
    return {k: v for k, v in made.items() if v is not None}

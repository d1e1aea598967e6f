"""The scale ladder in words and one figure: per-arm fits and gap trends, the ranking line; the fits and gaps plot."""

from __future__ import annotations

from pathlib import Path

from gptlab.compare.render import words
from gptlab.compare.statistics.verdict import Status, Trend, Verdict
from gptlab.compare.studies.ladder import SIZE_LABEL, Ladder


def _ci(t) -> str:
    return f"{t[0]:+.4f} [{t[1]:+.4f}, {t[2]:+.4f}]"


def _swap(s: dict) -> Verdict:
    """A ranking swap's test between two rungs as a Verdict (the ladder records whether it was decided)."""
    return Verdict("val/loss", Status.DECIDED if s["decided"] else Status.WITHIN_NOISE)


def format_report(doc: dict) -> str:
    """The terminal text: per arm its fit and gap verdict, then the ranking line, notes and warnings."""
    lines = [
        f"scale ladder: {len(doc['arms'])} arms x {len(doc['rungs'])} rungs ({', '.join(doc['rungs'])}), baseline {doc['baseline']}"
    ]
    for arm in doc["arms"]:
        fit = arm["power_law"]
        span = f"N {arm['range'][0]:.3g}..{arm['range'][1]:.3g}" if arm["range"] else "no runs"
        if fit.get("fitted"):
            b = f"b = {fit['b']:.3f}" + (
                f" [{fit['b_lo']:.3f}, {fit['b_hi']:.3f}]" if "b_lo" in fit else f" ({fit['why_no_interval']})"
            )
            law = f"L = {fit['a']:.3g}·N^-{fit['b']:.3f}, {b}"
        else:
            law = f"no fit ({fit['why']})"
        off = arm["offset"]
        c = f"c = {off['c']:.3f} ± {off['c_se']:.3f}" if off["identifiable"] else f"c not identifiable: {off['why']}"
        lines.append(f"{arm['arm']:<14} {span}: {law}; {c}")
        means = "  ".join(
            f"{r['rung']} {r['mean']:.4f}" + (f" (gap {r['gap']:+.4f})" if "gap" in r else "") for r in arm["rungs"]
        )
        lines.append(f"{'':<14} {means}")
        gap = arm.get("gap")
        if gap and gap["trend"] is not Trend.NOT_MEASURED:
            lines.append(
                f"{'':<14} gap vs {doc['baseline']}: {words.trend(gap['trend'])}; slope/doubling {_ci(gap['slope_per_doubling'])}, "
                f"smallest {_ci(gap['gap_at_smallest'])}, largest {_ci(gap['gap_at_largest'])}"
            )
        elif gap:
            lines.append(f"{'':<14} gap vs {doc['baseline']}: {words.no_verdict(gap['why'])}")
    rank = doc["ranking"]
    gaps = rank.get("missing") or {}
    absent = "; ".join(f"{', '.join(arms)} not at {r}" for r, arms in gaps.items())
    if rank["same_at_every_rung"]:
        fullest = max(rank["per_rung"].values(), key=len)
        lines.append(
            f"ranking: the same at every rung ({' < '.join(fullest)})"
            + (f", where both arms of a pair ran ({absent})" if absent else "")
        )
    else:
        swaps = "; ".join(
            f"{s['pair'][0]} vs {s['pair'][1]} between {s['rungs'][0]} and {s['rungs'][1]} {words.swap(_swap(s))}"
            for s in rank["swaps"]
        )
        lines.append(f"ranking CHANGES with size: {swaps}" + (f" ({absent})" if absent else ""))
        lines += [f"  {r}: {' < '.join(order)}" for r, order in rank["per_rung"].items()]
    lines += [f"note: {n}" for n in doc["notes"]]
    lines += [words.note(w) for w in doc["warnings"]]
    return "\n".join(lines)


def plot(ladder: Ladder, doc: dict, path: Path) -> Path:
    """Loss vs size per arm (log-log: seeds as dots, fits over each arm's measured range only) and the gaps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from gptlab.compare.render.plots import save_png

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for arm in doc["arms"]:
        own = [p for p in ladder.points if p.arm == arm["arm"]]
        dots = left.scatter([p.size for p in own], [p.loss for p in own], s=12, alpha=0.6)
        fit = arm["power_law"]
        if fit.get("fitted"):
            grid = np.geomspace(arm["range"][0], arm["range"][1], 50)
            label = f"{arm['arm']}: b={fit['b']:.3f}"
            left.plot(grid, fit["a"] * grid ** (-fit["b"]), color=dots.get_facecolor()[0], label=label)
        gap = arm.get("gap")
        if gap and "gap_at_smallest" in gap:
            rows = [r for r in arm["rungs"] if r.get("gap_ci")]
            xs = [ladder.size(doc["baseline"], r["rung"]) for r in rows]
            ys = [r["gap"] for r in rows]
            err = [[r["gap"] - r["gap_ci"][0] for r in rows], [r["gap_ci"][1] - r["gap"] for r in rows]]
            right.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=f"{arm['arm']}: {words.trend(gap['trend'])}")
    left.set(xscale="log", yscale="log", xlabel=SIZE_LABEL[doc["x"]], ylabel="final val loss")
    left.set_title("power-law fits, drawn over the measured sizes only", fontsize=9)
    left.legend(fontsize=8)
    right.axhline(0.0, color="grey", lw=0.8)
    right.set(xscale="log", xlabel=f"{doc['baseline']}'s size at the rung", ylabel=f"Δ val loss vs {doc['baseline']}")
    right.set_title(f"gap at equal rung, {100 * (1 - doc['alpha']):.0f}% Welch intervals", fontsize=9)
    if doc["arms"][1:]:
        right.legend(fontsize=8)
    fig.tight_layout()
    save_png(fig, path, dpi=120)
    plt.close(fig)
    return path


def _lr(lr: float | None) -> str:
    return "—" if lr is None else f"{lr:g}"


NO_OPTIMUM = (
    "not measured (the best lr is at the grid's edge at every rung it was picked at: the optimum lies outside the "
    "grid, so the slope is not known; widen the grid)"
)


def format_lr_trend(doc: dict) -> str:
    """A ladder with an lr grid at every rung: each arm's best lr by rung, the slope of log10 best lr on log10 size
    with its interval and, against the baseline, whether it moves differently; then the ladder at own best lr."""
    lines = [
        f"ladder x lr grid: {len(doc['lr_trend'])} arms x {len(doc['rungs'])} rungs ({', '.join(doc['rungs'])}), "
        f"each arm at its own best lr at every rung; baseline {doc['baseline']}"
    ]
    for entry in doc["lr_trend"]:
        picks = " -> ".join(f"{_lr(entry['best_lr'].get(r))} ({r})" for r in doc["rungs"])
        lines.append(f"{entry['arm']:<14} best lr {picks}")
        slope = entry["slope"]
        ci = entry["slope_ci"]
        shown = (
            NO_OPTIMUM
            if entry.get("all_at_grid_edge")
            else words.no_verdict("fewer than 2 rungs with a best lr")
            if slope is None
            else f"{slope:+.2f}" + (f" [{ci[0]:+.2f}, {ci[1]:+.2f}]" if ci else " (no interval: 1 seed per cell)")
        )
        lines.append(f"{'':<14} decades of best lr per decade of size: {shown}")
        if entry["at_grid_edge"]:
            lines.append(
                f"{'':<14} best lr at the grid's edge at {', '.join(entry['at_grid_edge'])}: the slope is a bound "
                "(widen the grid: the same sweep with a wider --lr-grid extends it in place)"
            )
        vs = entry.get("vs_baseline")
        edge_bound = entry.get("all_at_grid_edge") or doc["lr_trend"][0].get("all_at_grid_edge")
        if vs and vs["difference"] is None and edge_bound:
            lines.append(f"{'':<14} vs {doc['baseline']}: slope difference {NO_OPTIMUM}")
        if vs and vs["difference"] is not None:
            ci = vs["ci"]
            where = f"{vs['difference']:+.2f}" + (f" [{ci[0]:+.2f}, {ci[1]:+.2f}]" if ci else " (no interval)")
            said = words.lr_moves(vs["moves_differently"], doc["baseline"])
            lines.append(f"{'':<14} vs {doc['baseline']}: slope difference {where}: {said}")
    for rung, found in doc["grids"].items():  # each rung's grid: unfinished, refused or diverged cells, edges
        lines += [f"{rung}: {w}" for w in found["warnings"]]
    boot = doc["bootstrap"]
    lines.append(
        f"note: slope intervals: {100 * (1 - boot['alpha']):.0f}% percentile intervals of {boot['draws']} seed-bootstrap "
        "draws (each cell's seeds resampled, the best lr re-picked at every rung); the best lr lies on the grid, so "
        "slopes move in the grid's steps"
    )
    lines.append("the ladder, each arm at its own best lr at every rung:")
    lines.append(format_report(doc["ladder"]))
    return "\n".join(lines)

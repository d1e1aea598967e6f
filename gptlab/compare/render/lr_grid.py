"""The lr grid in words and one plot: the per-arm table, warnings, the selection note and the lr curves."""

from __future__ import annotations

from pathlib import Path

from gptlab.compare.render import words
from gptlab.compare.render.sections import Figure, Figures, Preformatted, Section
from gptlab.compare.statistics.stats import mean
from gptlab.compare.statistics.verdict import Status, Verdict
from gptlab.compare.studies.lr_grid import FINISHED, ArmCurve, GridReport, GridRow, finals_at


def _verdict_text(v: Verdict, why: str | None = None) -> str:
    """A verdict cell; `why`: what the arm or the baseline lacks there (no best lr, not run at that lr, ...)."""
    if v.status is Status.NOT_MEASURED or v.interval is None or v.effect is None:
        return words.no_verdict(why or "needs 2+ seeds each")
    return f"{v.effect:+.4f} [{v.interval[0]:+.4f}, {v.interval[1]:+.4f}] {words.side(v)}"


def _why_not(row: GridRow, base: GridRow, shared: bool) -> str | None:
    """Why a verdict cell has no verdict, in words: a missing best lr, the arm's cells at the baseline's lr, or
    verdict seeds that diverged at the lr judged (on either side)."""
    if base.best_lr is None:
        return f"{base.arm} has no best lr"
    if not shared and row.best_lr is None:
        return "no best lr"
    vs = row.versus
    if shared and vs and vs.states_at_baseline_lr and FINISHED not in vs.states_at_baseline_lr:
        return f"{'/'.join(vs.states_at_baseline_lr)} at {vs.baseline_lr:g}"
    lrs = (base.best_lr, base.best_lr) if shared else (row.best_lr, base.best_lr)
    counts = (vs.shared_lr_diverged if shared else vs.own_best_diverged) if vs else [0, 0]
    gone = [
        f"{who.arm}: {n} seed{'s' * (n > 1)} diverged at {lr:g}" for who, lr, n in zip((row, base), lrs, counts) if n
    ]
    return "; ".join(gone) or None


def _count(n: int | None) -> str:
    """A count, or '—' for one that was not measured (spike detection off)."""
    return "—" if n is None else str(n)


def format_report(doc: GridReport) -> str:
    """The terminal table: one line per arm, then the warnings and the selection note."""
    lines = [
        f"{'arm':<12} {'best lr':>8} {'val loss':>16} {'max stable lr':>13} {'diverged':>8} {'spikes':>6} "
        f"{'unfinished':>10} {'refused':>7} {'not run':>7}  vs {doc.baseline} at own best | at {doc.baseline}'s lr"
    ]
    base = doc.rows[0]
    for r in doc.rows:
        loss = "-" if r.val_loss_at_best is None else f"{r.val_loss_at_best:.4f}"
        loss += f" ± {r.val_loss_std:.4f}" if r.val_loss_std is not None else ""
        best = "-" if r.best_lr is None else f"{r.best_lr:g}"
        stable = "-" if r.max_stable_lr is None else f"{r.max_stable_lr:g}"
        if r.versus is not None:
            own = _verdict_text(r.versus.own_best, _why_not(r, base, shared=False))
            verdicts = f"{own} | {_verdict_text(r.versus.shared_lr, _why_not(r, base, shared=True))}"
        else:
            verdicts = "baseline | "
        lines.append(
            f"{r.arm:<12} {best:>8} {loss:>16} {stable:>13} {r.diverged_runs:>8} {_count(r.spikes_at_best):>6} "
            f"{r.unfinished_runs:>10} {r.refused_runs:>7} {r.not_run:>7}  {verdicts}"
        )
    lines += [words.note(w) for w in doc.warnings]
    lines.append(
        f"note: {words.note(doc.selection)}; diverged = non-finite or final val loss > {doc.diverge_factor}x step 0; "
        "unfinished = started, never finished (neither picked nor counted as diverged)"
    )
    return "\n".join(lines)


def plot_curves(curves: dict[str, ArmCurve], path: Path) -> Path:
    """Final val loss vs lr per arm (log x), mean with the seeds' min-max band; diverged lrs marked with an x."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from gptlab.compare.render.plots import save_png

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for curve in curves.values():
        grid = sorted({r.lr for r in curve.runs})
        lrs = [lr for lr in grid if finals_at(curve, lr, None)]
        means = [mean(finals_at(curve, lr, None)) for lr in lrs]
        line = ax.plot(lrs, means, marker="o", label=curve.arm)[0]
        ax.fill_between(
            lrs, [min(finals_at(curve, lr, None)) for lr in lrs], [max(finals_at(curve, lr, None)) for lr in lrs],
            color=line.get_color(), alpha=0.2,
        )  # fmt: skip
        bad = [lr for lr in grid if any(r.diverged for r in curve.at(lr))]
        if bad and means:
            ax.scatter(bad, [max(means)] * len(bad), marker="x", color=line.get_color())
    ax.set_xscale("log")
    ax.set_xlabel("learning rate")
    ax.set_ylabel("final val loss (seed mean, band: min-max)")
    ax.set_title("each arm's lr curve (x: a seed diverged)")
    ax.legend()
    fig.tight_layout()
    save_png(fig, path, dpi=120)
    plt.close(fig)
    return path


def sections(text: str, curves_png: Path) -> list[Section]:
    """The grid as the sections closing an lr grid's comparison report: its table as text and the lr curves."""
    curves = Figure("lr curves", "final val loss against lr, per arm", curves_png)
    return [Preformatted("The lr grid", text, key="grid"), Figures((curves,))]

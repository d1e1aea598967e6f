"""Each arm at its own best learning rate: the arm x lr x seed grid `gptlab-sweep NAME --lr-grid ...` writes.

Run dirs are `<sweep>/<arm>/lr<value>/seed<k>`. Per arm: final val loss vs lr (mean and spread over seeds), the best
lr (lowest mean final val loss; a diverged seed makes its lr ineligible), a warning when the best lr is the smallest
or the largest tried (the optimum may lie outside the grid), and the stability margin: the largest lr at which every
seed trained without diverging, with the spike events (train.spike_factor) and the largest attention logit
(train.diagnostics) at the best and at that lr.

Diverged: the run stopped on a non-finite loss, a val loss is non-finite, or its final val loss is above
DIVERGE_FACTOR x its step-0 val loss (it ended worse than it began).

Two verdicts per arm against the baseline (the first arm): at each arm's own best lr (the headline) and at the
baseline's best lr (the shared-lr comparison most ablations report). Selection bias: picking the minimum of a noisy
curve and reporting the same seeds' losses flatters the pick. With `holdout` seeds the lr is picked on the other
seeds and the verdicts use only the holdout seeds; without, the report says the figures are optimistic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gptlab.compare.reading.like import check_like
from gptlab.compare.reading.runs import Run, load_run
from gptlab.compare.statistics import verdict
from gptlab.compare.statistics.stats import ALPHA, mean, std
from gptlab.compare.statistics.verdict import Caveat, Verdict
from gptlab.errors import ConfigError
from gptlab.sweep.layout import parse_lr_part, parse_seed_part, read_sweep

DIVERGE_FACTOR = 1.5


@dataclass
class GridRun:
    """One run of the grid, as read from its run dir."""

    arm: str
    lr: float
    seed: int
    final: float | None  # final val loss; None when the run diverged or never finished
    diverged: bool
    spikes: int | None  # None: the run had spike detection off (train.spike_factor null), so none were counted
    max_logit: float | None


@dataclass
class ArmCurve:
    """One arm's runs by lr, its pick and its stability margin."""

    arm: str
    runs: list[GridRun]
    lrs: list[float] = field(default_factory=list)
    best_lr: float | None = None
    edge: str | None = None  # "smallest" | "largest": the best lr is at that end of the grid
    max_stable_lr: float | None = None

    def at(self, lr: float, seeds: set[int] | None = None) -> list[GridRun]:
        return [r for r in self.runs if r.lr == lr and (seeds is None or r.seed in seeds)]


def _grid_run(arm: str, lr: float, seed: int, run: Run) -> GridRun:
    """A grid run from the one run reader's Run: its final val loss, whether it diverged, spikes and max logit."""
    rows, summary = run.records, run.summary
    vals = [float(r["val/loss"]) for r in rows if "val/loss" in r and r["val/loss"] is not None]
    train = [float(r["train/loss"]) for r in rows if r.get("train/loss") is not None]
    nonfinite = any(not math.isfinite(v) for v in vals + train)
    final = summary.get("final_val_loss") if summary.get("status") == "finished" else None
    blew_up = final is not None and vals and math.isfinite(vals[0]) and final > DIVERGE_FACTOR * vals[0]
    diverged = bool(nonfinite or blew_up or (final is None and rows))  # started, never finished: it stopped
    logits = [float(v) for r in rows for k, v in r.items() if k.endswith("/max_logit") and v is not None]
    return GridRun(
        arm=arm,
        lr=lr,
        seed=seed,
        final=None if diverged else final,
        diverged=diverged,
        spikes=sum(1 for r in rows if "spike/loss" in r) if _spikes_on(run) else None,
        max_logit=max(logits) if logits else None,
    )


def _spikes_on(run: Run) -> bool:
    """Whether the run looked for loss spikes (train.spike_factor set); a run without a config is taken as on."""
    train = run.config.get("train") if isinstance(run.config, dict) else None
    return not isinstance(train, dict) or "spike_factor" not in train or train["spike_factor"] is not None


def _spike_total(runs: list[GridRun]) -> int | None:
    """Spikes over the runs; None when any of them did not look for spikes (a 0 would claim it had)."""
    counts = [r.spikes for r in runs]
    return None if not counts or any(c is None for c in counts) else sum(c for c in counts if c is not None)


def read_grid(sweep_dir: Path) -> dict[str, ArmCurve]:
    """{arm: its curve} from `<sweep>/<arm>/lr<v>/seed<k>/` (arms in sweep.yaml's order when it lists them), each
    run read by compare/reading/runs.py; runs scored on different validation sets are refused (check_like)."""
    recorded = read_sweep(sweep_dir, strict=False)  # none or unreadable: arms in folder order
    order = recorded.arms if recorded else []
    curves: dict[str, ArmCurve] = {}
    runs: list[Run] = []
    for lr_dir in sorted(sweep_dir.glob("*/lr*")):
        lr = parse_lr_part(lr_dir.name)
        if lr is None or not lr_dir.is_dir():
            continue
        arm = lr_dir.parent.name
        for seed_dir in sorted(lr_dir.iterdir()):
            seed = parse_seed_part(seed_dir.name)
            if seed is not None and ((seed_dir / "metrics.jsonl").exists() or (seed_dir / "summary.json").exists()):
                runs.append(load_run(seed_dir))
                curves.setdefault(arm, ArmCurve(arm, [])).runs.append(_grid_run(arm, lr, seed, runs[-1]))
    if not curves:
        raise ConfigError(
            f"{sweep_dir}: no lr grid runs (<arm>/lr<value>/seed<k>/); run gptlab-sweep NAME --lr-grid ..."
        )
    check_like(runs)  # one sweep's runs share their data: only a mixed-in foreign run can differ
    ranked = sorted(curves, key=lambda a: order.index(a) if a in order else len(order))
    return {arm: curves[arm] for arm in ranked}


def analyse(curves: dict[str, ArmCurve], holdout: set[int] | None = None) -> None:
    """Fill each curve's lrs, best lr (picked on the non-holdout seeds), edge and max stable lr."""
    for curve in curves.values():
        curve.lrs = sorted({r.lr for r in curve.runs})
        pick = [s for s in {r.seed for r in curve.runs} if not holdout or s not in holdout]
        scores = {}
        for lr in curve.lrs:
            runs = curve.at(lr, set(pick))
            if runs and not any(r.diverged for r in runs) and all(r.final is not None for r in runs):
                scores[lr] = mean([r.final for r in runs if r.final is not None])
        curve.best_lr = min(scores, key=lambda lr: scores[lr]) if scores else None
        if curve.best_lr is not None and len(curve.lrs) > 1:
            curve.edge = (
                "smallest" if curve.best_lr == curve.lrs[0] else "largest" if curve.best_lr == curve.lrs[-1] else None
            )
        stable = [lr for lr in curve.lrs if curve.at(lr) and not any(r.diverged for r in curve.at(lr))]
        curve.max_stable_lr = max(stable) if stable else None


def finals_at(curve: ArmCurve, lr: float | None, seeds: set[int] | None) -> list[float]:
    if lr is None:
        return []
    return [r.final for r in curve.at(lr, seeds) if r.final is not None]


def _verdict(arm: list[float], base: list[float], optimistic: bool) -> Verdict:
    found = verdict.difference("val/loss", arm, base, ALPHA)
    return found.with_caveat(Caveat.OPTIMISTIC) if optimistic else found


def to_json(doc: dict) -> dict:
    """lr_grid.json: the report with each verdict as its value."""
    rows = [{k: v.to_json() if isinstance(v, Verdict) else v for k, v in row.items()} for row in doc["rows"]]
    return {**doc, "rows": rows}


def report(curves: dict[str, ArmCurve], holdout: set[int] | None = None) -> dict:
    """The per-arm table (JSON-ready) and the warning lines: picks, edges, both verdicts, stability columns."""
    analyse(curves, holdout)
    base = next(iter(curves.values()))
    verdict_seeds = holdout or None
    rows, warnings = [], []
    for curve in curves.values():
        best_runs = curve.at(curve.best_lr) if curve.best_lr is not None else []
        stable_runs = curve.at(curve.max_stable_lr) if curve.max_stable_lr is not None else []
        finals = finals_at(curve, curve.best_lr, verdict_seeds)
        row: dict[str, Any] = {
            "arm": curve.arm,
            "lrs": curve.lrs,
            "best_lr": curve.best_lr,
            "val_loss_at_best": mean(finals) if finals else None,
            "val_loss_std": std(finals) if len(finals) > 1 else None,
            "max_stable_lr": curve.max_stable_lr,
            "diverged_runs": sum(r.diverged for r in curve.runs),
            "spikes_at_best": _spike_total(best_runs),
            "spikes_at_max_stable": _spike_total(stable_runs),
            "max_logit_at_best": max((r.max_logit for r in best_runs if r.max_logit is not None), default=None),
            "max_logit_at_max_stable": max((r.max_logit for r in stable_runs if r.max_logit is not None), default=None),
            "curve": {f"{lr:g}": finals_at(curve, lr, None) for lr in curve.lrs},
        }
        if curve is not base:
            row["vs_baseline_own_best"] = _verdict(finals, finals_at(base, base.best_lr, verdict_seeds), not holdout)
            row["vs_baseline_shared_lr"] = _verdict(
                finals_at(curve, base.best_lr, verdict_seeds), finals_at(base, base.best_lr, verdict_seeds), not holdout
            )
        rows.append(row)
        if curve.best_lr is None:
            warnings.append(f"{curve.arm}: no lr trained every seed without diverging: widen the grid downwards")
        elif curve.edge:
            way = "larger" if curve.edge == "largest" else "smaller"
            warnings.append(
                f"{curve.arm}'s best lr {curve.best_lr:g} is the {curve.edge} tried: extend the grid to {way} lrs"
            )
    if holdout:
        note = f"lr picked on seeds other than {sorted(holdout)}; verdicts on the holdout seeds {sorted(holdout)}"
    else:
        note = (
            "lr picked and reported on the same seeds: the minimum of a noisy curve is optimistic (use --holdout-seeds)"
        )
    return {
        "baseline": base.arm,
        "rows": rows,
        "warnings": warnings,
        "selection": note,
        "diverge_factor": DIVERGE_FACTOR,
    }

"""A scale ladder with an lr grid at every rung (`gptlab-sweep NAME --ladder KEY=V1,V2,... --lr-grid ...`): each arm
at its own best lr at every size, the ladder fitted on those runs, and how the best lr moves with size.

Run dirs are `<sweep>/<arm>/<rung>/lr<v>/seed<k>`. At each rung the grid is read and analysed as
compare/studies/lr_grid.py does (the best lr: the lowest mean final val loss over the seeds that finished; an lr
where a seed diverged is never picked). The ladder (compare/studies/ladder.py: power-law fits, the gap to the
baseline and its trend, the rankings) is then fitted on each arm's runs at its own best lr at each rung, so an arm
is never judged at a size by an lr that suits only the baseline.

How the best lr moves with size (the question muP answers): per arm, the least-squares slope of log10(best lr) on
log10(size) over the rungs, i.e. decades of lr per decade of size (0: the best lr does not move). Its interval is
a seed bootstrap: every cell's finished seeds are resampled with replacement, the best lr re-picked at every rung
and the slope refitted, BOOTSTRAP times with a fixed generator; the percentile interval is reported, and the
interval of each arm's slope minus the baseline's (the two resampled independently: different runs). An arm whose
difference interval excludes 0 is flagged: its best lr moves differently from the baseline's, so a baseline-tuned
lr transferred to that arm at another size would be off. The best lr lies on the grid, so the slope moves in steps
of the grid's spacing; with 1 seed per cell the bootstrap has nothing to resample and no interval is given; a best
lr at the grid's edge at any rung makes that arm's slope a bound, and the report says which rungs (widen the grid:
the same sweep with a wider --lr-grid extends it in place). At the edge at every rung, no optimum was found at any
size: the slope (every resample picking the same edge) and its difference from the baseline's are not measured, never
a zero-width interval.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gptlab.compare.reading.runs import load_run
from gptlab.compare.statistics.stats import ALPHA
from gptlab.compare.studies import ladder as scale
from gptlab.compare.studies import lr_grid as grid
from gptlab.errors import ConfigError
from gptlab.sweep.layout import parse_lr_part, read_sweep
from gptlab.util.note import warning

BOOTSTRAP = 2000
RNG_SEED = 20261127


def is_ladder_lr(sweep_dir: Path) -> bool:
    """True for a sweep dir gptlab-sweep ran with both a ladder and an lr grid (sweep.yaml records both)."""
    recorded = read_sweep(sweep_dir, strict=False)
    return recorded is not None and recorded.ladder is not None and bool(recorded.lrs)


def _rungs(sweep_dir: Path) -> list[str]:
    """The rung folders the sweep's runs sit in (<arm>/<rung>/lr<v>/...), in first-seen order."""
    found: dict[str, None] = {}
    for lr_dir in sorted(sweep_dir.glob("*/*/lr*")):
        if lr_dir.is_dir() and parse_lr_part(lr_dir.name) is not None and not lr_dir.parent.name.startswith("."):
            found.setdefault(lr_dir.parent.name, None)
    return list(found)


def read(sweep_dir: Path, x: str = "params", baseline: str | None = None) -> tuple[dict[str, grid.Grid], scale.Ladder]:
    """({rung: its lr grid, analysed}, the ladder of each arm's runs at its own best lr at each rung)."""
    if x not in scale.SIZE_KEYS:
        raise ConfigError(f"ladder size {x!r}: allowed: {', '.join(scale.SIZE_KEYS)}")
    rungs = _rungs(sweep_dir)
    if not rungs:
        raise ConfigError(
            f"{sweep_dir}: no ladder x lr grid runs (<arm>/<rung>/lr<value>/seed<k>/); run gptlab-sweep NAME "
            "--ladder KEY=V1,V2 --lr-grid LRS"
        )
    grids = {}
    for rung in rungs:
        try:
            grids[rung] = grid.read_grid(sweep_dir, rung=rung)
        except ConfigError as err:
            raise ConfigError(f"rung {rung}: {err}") from None
        grid.analyse(grids[rung])
    arms = list(dict.fromkeys(a for g in grids.values() for a in g))
    if baseline is not None:
        if baseline not in arms:
            raise ConfigError(f"--baseline '{baseline}': on a ladder give an arm's name; arms: {', '.join(arms)}")
        arms = [baseline, *(a for a in arms if a != baseline)]
    points, warnings = [], []
    for rung, g in grids.items():
        for arm in arms:
            curve = g.get(arm)
            if curve is None or curve.best_lr is None:
                warnings.append(warning(f"{arm}/{rung}: no lr finished without diverging: left out", f"{arm}/{rung}"))
                continue
            for cell in curve.at(curve.best_lr):
                if cell.state != grid.FINISHED or cell.final is None:
                    continue
                run = load_run(sweep_dir / cell.where)
                size = run.summary.get(scale.SIZE_KEYS[x])
                if not isinstance(size, (int, float)) or not size > 0:
                    raise ConfigError(
                        f"{run.path}/summary.json: no {scale.SIZE_KEYS[x]} recorded; the ladder needs each run's size"
                    )
                points.append(scale.Point(arm, rung, cell.seed, float(size), cell.final))
    ladder = scale.Ladder(points, arms, [], x, warnings)
    ladder.rungs = sorted(grids, key=lambda r: ladder.size(arms[0], r) or math.inf)
    return {r: grids[r] for r in ladder.rungs}, ladder


def _finals(g: grid.Grid, arm: str) -> dict[float, tuple[list[float], bool]]:
    """lr -> (the finished seeds' final val losses, whether a seed diverged there) of one arm at one rung."""
    return {lr: grid.finals_and_diverged(g[arm].at(lr)) for lr in g[arm].lrs}


def _slope(sizes: list[float], lrs: list[float]) -> float | None:
    """Least-squares slope of log10 lr on log10 size; None with fewer than two distinct sizes."""
    xs, ys = [math.log10(s) for s in sizes], [math.log10(lr) for lr in lrs]
    if len(set(xs)) < 2:
        return None
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((a - mx) * (b - my) for a, b in zip(xs, ys)) / sum((a - mx) ** 2 for a in xs)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def lr_trend(grids: dict[str, grid.Grid], ladder: scale.Ladder, alpha: float = ALPHA) -> list[dict[str, Any]]:
    """Per arm: its best lr and size at each rung, the slope of log10 best lr on log10 size with its seed-bootstrap
    interval, the rungs where the best lr sits at the grid's edge, and (not the baseline) the slope's difference
    from the baseline's with its interval and whether it excludes 0."""
    rng = random.Random(RNG_SEED)
    cells = {(arm, rung): _finals(g, arm) for rung, g in grids.items() for arm in ladder.arms if arm in g}
    sizes: dict[tuple[str, str], float] = {}
    for arm, rung in cells:
        size = ladder.size(arm, rung)
        if size is not None:
            sizes[arm, rung] = size
    usable = {k: v for k, v in cells.items() if k in sizes}

    def slope_of(arm: str, resample: bool) -> float | None:
        picked, at = [], []
        for rung in ladder.rungs:
            found = usable.get((arm, rung))
            if found is None:
                continue
            if resample:
                found = {lr: ([rng.choice(v) for _ in v], d) for lr, (v, d) in found.items()}
            best = grid.best_lr(found)
            if best is not None:
                picked.append(best)
                at.append(sizes[arm, rung])
        return _slope(at, picked)

    seeds = max((len(v) for c in usable.values() for v, _ in c.values()), default=0)
    draws = {arm: [slope_of(arm, True) for _ in range(BOOTSTRAP)] if seeds > 1 else [] for arm in ladder.arms}
    base = ladder.arms[0]
    out: list[dict[str, Any]] = []
    for arm in ladder.arms:
        best = {rung: grids[rung][arm].best_lr for rung in ladder.rungs if arm in grids[rung]}
        edges = [rung for rung in ladder.rungs if arm in grids[rung] and grids[rung][arm].edge is not None]
        picked = [rung for rung, lr in best.items() if lr is not None]
        all_edge = bool(picked) and set(picked) <= set(edges)  # no optimum inside the grid at any size
        entry: dict[str, Any] = {
            "arm": arm,
            "best_lr": best,
            "size": {rung: sizes.get((arm, rung)) for rung in ladder.rungs},
            "slope": None if all_edge else slope_of(arm, False),
            "slope_ci": None if all_edge else _interval(draws[arm], alpha),
            "at_grid_edge": edges,
            "all_at_grid_edge": all_edge,
        }
        if arm != base:
            paired = [a - b for a, b in zip(draws[arm], draws[base]) if a is not None and b is not None]
            own, theirs = entry["slope"], next(e for e in out if e["arm"] == base)["slope"]
            measured = own is not None and theirs is not None
            ci = _interval(paired, alpha) if measured and len(paired) == len(draws[arm]) else None
            entry["vs_baseline"] = {
                "difference": None if own is None or theirs is None else own - theirs,
                "ci": ci,
                "moves_differently": None if ci is None else (ci[0] > 0 or ci[1] < 0),
            }
        out.append(entry)
    return out


def _interval(draws: Sequence[float | None], alpha: float) -> list[float] | None:
    """The percentile interval of bootstrap draws; None without draws or when a draw had no slope."""
    if not draws or any(d is None for d in draws):
        return None
    values = [d for d in draws if d is not None]
    return [_percentile(values, alpha / 2), _percentile(values, 1 - alpha / 2)]


def report(grids: dict[str, grid.Grid], ladder: scale.Ladder, alpha: float = ALPHA) -> dict[str, Any]:
    """The JSON-ready document: the best-lr trend per arm, the ladder at each arm's own best lr, each rung's grid."""
    fitted = scale.report(ladder, alpha)
    fitted["notes"].append(
        "each arm at its own best lr at every rung, picked and reported on the same seeds: the minimum of a noisy "
        "curve flatters every arm a little (more seeds narrow it)"
    )
    return {
        "baseline": ladder.arms[0],
        "x": ladder.x,
        "rungs": ladder.rungs,
        "lr_trend": lr_trend(grids, ladder, alpha),
        "ladder": fitted,
        "grids": {rung: grid.report(g).to_json() for rung, g in grids.items()},
        "bootstrap": {"draws": BOOTSTRAP, "seed": RNG_SEED, "alpha": alpha},
    }

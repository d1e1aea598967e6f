"""A scale ladder: the sweep's arms at several sizes (`gptlab-sweep NAME --ladder KEY=V1,V2,...`), fitted per arm.

Run dirs are `<sweep>/<arm>/<rung>/seed<k>`. Per arm, final val loss against its size N (non-embedding parameters,
or training FLOPs per token with x="flops", both from summary.json) is fitted as a power law L = a·N^-b by ordinary
least squares on log L vs log N over every seed's run (statsmodels OLS: b's interval comes from the seeds' scatter
around the line). L = a·N^-b + c (scipy curve_fit) is tried only with 4 or more sizes, and reported only when c is
identifiable (finite covariance, c > 0, below every measured loss, its standard error below its value); otherwise
the report says why not.

Gap to the baseline (the first arm) is taken at equal rung (the decision a study at that size would make): per rung
a Welch interval, and over the ladder an OLS of loss on log N_baseline × arm whose interaction is the gap's slope per
doubling of size. The verdict: "crosses over" when the gap's intervals at the smallest and the largest rung exclude
zero with opposite signs; else, when the slope's interval excludes zero, "grows" or "shrinks" as the fitted |gap|
widens or narrows from the smallest rung to the largest ("shrinks, may cross" when the fitted gap changes sign on the
way); else "steady". Nothing is predicted outside the measured sizes: fits are drawn and reported over
[N_min, N_max] only, and the report says so. Every rung trains the same steps and tokens, so this is L(N) at fixed
data, not a compute-optimal frontier.

The ranking of the arms (by mean final val loss) is given per rung, with every pair whose order changes between
rungs, and whether the change is decided (the pair's Welch intervals exclude zero, opposite signs, at both rungs).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gptlab.compare.reading.like import check_like
from gptlab.compare.reading.runs import Run, load_run
from gptlab.compare.statistics.stats import ALPHA, mean, std, welch_interval
from gptlab.compare.statistics.verdict import Trend
from gptlab.errors import ConfigError
from gptlab.sweep.layout import is_arm_name, parse_rung_part, parse_seed_part, read_sweep
from gptlab.util.note import Note, warning

SIZE_KEYS = {"params": "params_non_embedding", "flops": "flops_per_token"}
SIZE_LABEL = {"params": "non-embedding parameters N", "flops": "training FLOPs per token"}
MIN_RUNGS_FOR_OFFSET = 4  # a + b + c need a 4th size before c can be told apart from a and b


@dataclass(frozen=True)
class Point:
    """One finished run of the ladder: its arm, rung, seed, size and final val loss."""

    arm: str
    rung: str
    seed: int
    size: float
    loss: float


@dataclass
class Ladder:
    """Every finished run of a ladder sweep, the arms (baseline first), the rungs (by the baseline's size)."""

    points: list[Point]
    arms: list[str]
    rungs: list[str]
    x: str
    warnings: list[Note]

    def losses(self, arm: str, rung: str) -> list[float]:
        return [p.loss for p in self.points if p.arm == arm and p.rung == rung]

    def size(self, arm: str, rung: str) -> float | None:
        sizes = {p.size for p in self.points if p.arm == arm and p.rung == rung}
        return sizes.pop() if sizes else None


def _sweep_order(sweep_dir: Path) -> list[str]:
    recorded = read_sweep(sweep_dir, strict=False)  # none or unreadable: arms in folder order
    return recorded.arms if recorded else []


def is_ladder(sweep_dir: Path) -> bool:
    """True for a sweep dir gptlab-sweep ran with a ladder (its sweep.yaml records `ladder:`)."""
    recorded = read_sweep(sweep_dir, strict=False)
    return recorded is not None and recorded.ladder is not None


def _finished(run_dir: Path) -> Run | None:
    if not (run_dir / "summary.json").is_file():
        return None
    run = load_run(run_dir)
    return run if run.status == "finished" and run.summary.get("final_val_loss") is not None else None


def _collect(sweep_dir: Path) -> tuple[dict[tuple[str, str], list[tuple[int, Run]]], list[str]]:
    """{(arm, rung): [(seed, run)]} of the finished runs, and the run dirs left out (unfinished)."""
    cells: dict[tuple[str, str], list[tuple[int, Run]]] = {}
    left_out = []
    for seed_dir in sorted(sweep_dir.glob("*/*/seed*")):
        seed = parse_seed_part(seed_dir.name)
        arm, rung = seed_dir.parent.parent.name, seed_dir.parent.name
        if seed is None or not seed_dir.is_dir() or not is_arm_name(arm) or parse_rung_part(rung) is None:
            continue
        run = _finished(seed_dir)
        if run is None:
            left_out.append(f"{arm}/{rung}/{seed_dir.name}")
        else:
            cells.setdefault((arm, rung), []).append((seed, run))
    return cells, left_out


def read_ladder(sweep_dir: Path, x: str = "params", baseline: str | None = None) -> Ladder:
    """The ladder's finished runs (baseline: an arm's name, default the sweep's first arm); refuses a rung whose arms
    were scored on different validation sets."""
    if x not in SIZE_KEYS:
        raise ConfigError(f"ladder size {x!r}: allowed: {', '.join(SIZE_KEYS)}")
    cells, left_out = _collect(sweep_dir)
    if not cells:
        raise ConfigError(
            f"{sweep_dir}: no finished ladder runs (<arm>/<rung>/seed<k>/); run gptlab-sweep NAME --ladder ..."
        )
    order = _sweep_order(sweep_dir)
    arms = sorted({a for a, _ in cells}, key=lambda a: (order.index(a) if a in order else len(order), a))
    if baseline is not None:
        if baseline not in arms:
            raise ConfigError(f"--baseline '{baseline}': on a ladder give an arm's name; arms: {', '.join(arms)}")
        arms = [baseline, *(a for a in arms if a != baseline)]
    warnings = [warning(f"left out (not finished): {', '.join(left_out)}")] if left_out else []
    points = []
    for (arm, rung), members in cells.items():
        for seed, run in members:
            size = run.summary.get(SIZE_KEYS[x])
            if not isinstance(size, (int, float)) or not size > 0:
                raise ConfigError(
                    f"{run.path}/summary.json: no {SIZE_KEYS[x]} recorded; the ladder needs each run's size"
                )
            points.append(Point(arm, rung, seed, float(size), float(run.summary["final_val_loss"])))
    by_rung: dict[str, list[Run]] = {}
    for (_, rung), members in cells.items():
        by_rung.setdefault(rung, []).extend(run for _, run in members)
    for rung, runs in by_rung.items():
        try:
            check_like(runs)
        except ConfigError as err:
            raise ConfigError(f"rung {rung}: {err}") from None
    try:
        check_like([run for runs in by_rung.values() for run in runs])
    except ConfigError as err:
        warnings.append(
            warning(f"the rungs are not scored on one validation set, so size is not all that differs: {err}")
        )
    ladder = Ladder(points, arms, [], x, warnings)
    base = arms[0]
    ladder.rungs = sorted(by_rung, key=lambda r: ladder.size(base, r) or math.inf)
    for arm in arms:
        for rung in ladder.rungs:
            sizes = {p.size for p in points if p.arm == arm and p.rung == rung}
            if len(sizes) > 1:
                raise ConfigError(f"{arm}/{rung}: its seeds record different sizes {sorted(sizes)}: not one model")
    missing = [f"{a}/{r}" for a in arms for r in ladder.rungs if not ladder.losses(a, r)]
    if missing:
        ladder.warnings.append(warning(f"no finished run at {', '.join(missing)}: left out of the fits and ranking"))
    return ladder


def _ols(y: list[float], columns: dict[str, list[float]]):
    """statsmodels OLS of y on the named columns (with an intercept `const`)."""
    import numpy as np
    import pandas as pd
    from statsmodels.regression.linear_model import OLS
    from statsmodels.tools.tools import add_constant

    exog = add_constant(pd.DataFrame(columns), has_constant="add")
    return OLS(np.asarray(y, dtype=float), exog).fit()


def fit_power_law(sizes: list[float], losses: list[float], alpha: float = ALPHA) -> dict:
    """L = a·N^-b by OLS on log L vs log N over every run: a, b, b's (1 - alpha) interval, residual df."""
    if len(set(sizes)) < 2:
        return {"fitted": False, "why": "fewer than 2 sizes"}
    model = _ols([math.log(v) for v in losses], {"logN": [math.log(s) for s in sizes]})
    b = -float(model.params["logN"])
    out: dict[str, Any] = {
        "fitted": True,
        "a": math.exp(float(model.params["const"])),
        "b": b,
        "df_resid": int(model.df_resid),
    }
    if model.df_resid > 0:
        lo, hi = model.conf_int(alpha).loc["logN"]
        out |= {"b_lo": -float(hi), "b_hi": -float(lo), "r2": float(model.rsquared)}
    else:
        out["why_no_interval"] = "one run per size: no residual to estimate b's uncertainty (add seeds)"
    return out


def fit_offset(sizes: list[float], losses: list[float]) -> dict:
    """L = a·N^-b + c by scipy curve_fit; {"identifiable": False, "why": ...} unless c is pinned down."""
    import warnings

    import numpy as np
    from scipy.optimize import OptimizeWarning, curve_fit

    distinct = len(set(sizes))
    if distinct < MIN_RUNGS_FOR_OFFSET:
        return {
            "identifiable": False,
            "why": f"{distinct} sizes for 3 parameters (a, b, c): needs {MIN_RUNGS_FOR_OFFSET}+",
        }
    n, y = np.asarray(sizes, dtype=float), np.asarray(losses, dtype=float)
    scale = float(n.min())

    def law(v, a, b, c):
        return a * (v / scale) ** (-b) + c

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", OptimizeWarning)
            params, cov = curve_fit(
                law, n, y, p0=(float(y.max() - y.min()) or 1.0, 0.3, float(y.min()) * 0.5), maxfev=20000
            )
    except (RuntimeError, OptimizeWarning, ValueError) as err:
        return {"identifiable": False, "why": f"curve_fit did not converge ({str(err).splitlines()[0][:80]})"}
    se = np.sqrt(np.diag(cov)) if np.all(np.isfinite(cov)) else None
    a, b, c = (float(v) for v in params)
    if se is None or not (0 < c < float(y.min())) or not float(se[2]) < c:
        why = "its covariance is not finite" if se is None else f"c = {c:.3g} ± {float(se[2]):.2g} is not pinned down"
        return {"identifiable": False, "why": why}
    return {"identifiable": True, "a": a * scale**b, "b": b, "c": c, "c_se": float(se[2]), "b_se": float(se[1])}


def _gap_trend(ladder: Ladder, arm: str, alpha: float) -> dict:
    """OLS of loss on log N_baseline(rung) x is_arm over both arms' runs: the gap's slope and its ends with intervals."""
    base = ladder.arms[0]
    rungs = [r for r in ladder.rungs if ladder.losses(arm, r) and ladder.losses(base, r)]
    if len(rungs) < 2:
        return {"trend": Trend.NOT_MEASURED, "why": "fewer than 2 rungs with both arms"}
    xs = {r: math.log2(ladder.size(base, r) or 1.0) for r in rungs}  # per doubling of the baseline's size
    centre = mean(list(xs.values()))
    y, x, is_arm = [], [], []
    for who in (base, arm):
        for r in rungs:
            for loss in ladder.losses(who, r):
                y.append(loss)
                x.append(xs[r] - centre)
                is_arm.append(float(who == arm))
    model = _ols(y, {"x": x, "arm": is_arm, "x_arm": [a * b for a, b in zip(x, is_arm)]})
    if model.df_resid < 1:
        return {"trend": Trend.NOT_MEASURED, "why": "no residual degrees of freedom (add seeds)"}
    names = list(model.params.index)

    def contrast(weights: dict[str, float]) -> tuple[float, float, float]:
        row = [[weights.get(n, 0.0) for n in names]]
        test = model.t_test(row)
        lo, hi = (float(v) for v in test.conf_int(alpha)[0])
        return float(test.effect[0]), lo, hi

    slope = contrast({"x_arm": 1.0})
    first = contrast({"arm": 1.0, "x_arm": xs[rungs[0]] - centre})
    last = contrast({"arm": 1.0, "x_arm": xs[rungs[-1]] - centre})
    return {
        "slope_per_doubling": slope,
        "gap_at_smallest": first,
        "gap_at_largest": last,
        "trend": _trend(slope, first, last),
    }


def _decided(ci: tuple[float, float, float]) -> int:
    """+1 / -1 when the interval excludes zero above / below, else 0."""
    return 1 if ci[1] > 0 else -1 if ci[2] < 0 else 0


def _trend(slope, first, last) -> Trend:
    if _decided(first) * _decided(last) == -1:
        return Trend.CROSSES_OVER
    if _decided(slope) == 0:
        return Trend.STEADY
    if abs(last[0]) > abs(first[0]):  # the fitted |gap|, not the slope's sign: a gap narrowing past 0 shrinks
        return Trend.GROWS
    return Trend.SHRINKS_MAY_CROSS if first[0] * last[0] < 0 else Trend.SHRINKS


def _rankings(ladder: Ladder, alpha: float) -> dict:
    """Per rung the arms by mean final loss, and every pair whose order differs between two rungs."""
    per_rung = {}
    for r in ladder.rungs:
        present = [a for a in ladder.arms if ladder.losses(a, r)]
        per_rung[r] = sorted(present, key=lambda a: mean(ladder.losses(a, r)))
    swaps = []
    for i, a in enumerate(ladder.arms):
        for b in ladder.arms[i + 1 :]:
            signs = {}
            for r in ladder.rungs:
                la, lb = ladder.losses(a, r), ladder.losses(b, r)
                if la and lb:
                    iv = welch_interval(la, lb, alpha)
                    signs[r] = (1 if mean(la) > mean(lb) else -1, iv is not None and iv.excludes_zero())
            ordered = [r for r in ladder.rungs if r in signs]
            flips = [r for r in ordered[1:] if signs[r][0] != signs[ordered[0]][0]]
            if flips:  # the order at the smallest rung this pair has, against the first rung where it turns
                decided = signs[ordered[0]][1] and any(signs[r][1] for r in flips)
                swaps.append({"pair": [a, b], "rungs": [ordered[0], flips[0]], "decided": bool(decided)})
    # an arm missing at a rung (not run, or no finished seed) makes that rung's list shorter, not the order different
    missing = {r: [a for a in ladder.arms if a not in per_rung[r]] for r in ladder.rungs}
    return {
        "per_rung": per_rung,
        "same_at_every_rung": not swaps,
        "swaps": swaps,
        "missing": {r: arms for r, arms in missing.items() if arms},
    }


def report(ladder: Ladder, alpha: float = ALPHA) -> dict:
    """The ladder report: per arm its points, fits and gap verdict; the rankings; notes and warnings (JSON-ready but
    its warnings, Note values: compare/render/json_report.plain writes them)."""
    base = ladder.arms[0]
    arms = []
    for arm in ladder.arms:
        own = [p for p in ladder.points if p.arm == arm]
        sizes, losses = [p.size for p in own], [p.loss for p in own]
        rows = []
        for r in ladder.rungs:
            vals = ladder.losses(arm, r)
            if not vals:
                continue
            row: dict[str, Any] = {
                "rung": r,
                "size": ladder.size(arm, r),
                "seeds": len(vals),
                "mean": mean(vals),
                "std": std(vals),
            }
            if arm != base and ladder.losses(base, r):
                iv = welch_interval(vals, ladder.losses(base, r), alpha)
                row["gap"] = mean(vals) - mean(ladder.losses(base, r))
                row["gap_ci"] = [iv.lo, iv.hi] if iv is not None else None
            rows.append(row)
        entry = {
            "arm": arm,
            "range": [min(sizes), max(sizes)] if sizes else None,
            "rungs": rows,
            "power_law": fit_power_law(sizes, losses, alpha),
            "offset": fit_offset(sizes, losses),
        }
        if arm != base:
            entry["gap"] = _gap_trend(ladder, arm, alpha)
        arms.append(entry)
    notes = [
        f"size = {SIZE_LABEL[ladder.x]} (summary.json {SIZE_KEYS[ladder.x]}); fits hold over each arm's measured range "
        "only and nothing is extrapolated past it",
        "every rung trains the same steps and tokens: L(N) at fixed data, not a compute-optimal frontier",
        f"gap = arm - {base} at equal rung; slope per doubling of {base}'s size; {100 * (1 - alpha):.0f}% intervals",
    ]
    return {
        "baseline": base,
        "x": ladder.x,
        "rungs": ladder.rungs,
        "arms": arms,
        "ranking": _rankings(ladder, alpha),
        "notes": notes,
        "warnings": ladder.warnings,
        "alpha": alpha,
    }

"""Is arm confounded with run order? A speed-up is the arm's only when neither time nor load can stand in for it.

Each run records when it trained (summary `started_at`) and the outside load it saw. The arms are confounded with
run order when
- the runs of each arm ran one after another (arm-major: in start order the arms form contiguous blocks, and some arm
  has 2 or more runs), the design an arm-major queue makes and a load that drifts turns into a "speed-up"; or
- arm explains start time or outside load beyond chance (Kruskal-Wallis over the arms, p < alpha; scipy).
gptlab-sweep launches arms interleaved (gptlab/sweep/plan.py `interleave`), which passes both. Runs that did not
record their start (older runs) are not tested, and the report says so.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence

from gptlab.compare.reading.runs import Run
from gptlab.compare.statistics.speed import run_load
from gptlab.compare.statistics.stats import ALPHA


def started(run: Run) -> float | None:
    """When the run trained (epoch seconds), None when it did not record it."""
    value = run.summary.get("started_at")
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _blocks(arms_in_order: list[str]) -> bool:
    """True when each arm's runs are contiguous in this order and some arm has 2 or more runs."""
    changes = sum(a != b for a, b in zip(arms_in_order, arms_in_order[1:]))
    return changes == len(set(arms_in_order)) - 1 and len(arms_in_order) > len(set(arms_in_order))


def _kruskal(groups: Sequence[Sequence[float]]) -> float | None:
    """Kruskal-Wallis p over the groups; None when it cannot be computed (a group empty, all values equal)."""
    if len(groups) < 2 or any(not g for g in groups) or len({v for g in groups for v in g}) < 2:
        return None
    from scipy import stats as sps

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        p = float(sps.kruskal(*groups).pvalue)
    return p if math.isfinite(p) else None


def confounded(arms: Sequence[Sequence[Run]], alpha: float = ALPHA) -> str | None:
    """Why the arms' speed cannot be told apart from run order or load (one clause), or None when it can, or when
    the runs did not record their start."""
    if len(arms) < 2:
        return None
    starts = [[started(r) for r in runs] for runs in arms]
    if any(s is None for per in starts for s in per):
        return None
    order = sorted((s, i) for i, per in enumerate(starts) for s in per)
    if _blocks([str(i) for _, i in order]):
        return "each arm's runs ran one after another (arm-major order)"
    p = _kruskal([[float(s) for s in per if s is not None] for per in starts])
    if p is not None and p < alpha:
        return f"arm explains when the runs trained (Kruskal-Wallis p={p:.2g})"
    loads = [[load for r in runs if (load := run_load(r)) is not None] for runs in arms]
    p = _kruskal(loads) if all(len(per) == len(runs) for per, runs in zip(loads, arms)) else None
    if p is not None and p < alpha:
        return f"arm explains the outside load the runs saw (Kruskal-Wallis p={p:.2g})"
    return None


def recorded(runs: Sequence[Run]) -> bool:
    """True when every run recorded when it trained."""
    return all(started(r) is not None for r in runs)

"""Equal compute: val loss at equal training FLOPs and at equal time, and what each matched arm re-solved.

Equal steps stay the comparison's contract; this is the cost view beside it. Every eval row of metrics.jsonl carries
`flops`, the cumulative training FLOPs (tokens × the cost model's training FLOPs per token, the MFU numerator); a run
written before that column has it rebuilt from its summary's `flops_per_token` × the row's `tokens`, and is "not
available" without them. Each run's val loss is interpolated linearly between its eval points (step 0 at x = 0: no
FLOPs, no training time yet) at the largest x every compared run reached — or, when the runs share a train.eval_flops
grid (every run evaluated a step either side of each point), at the largest grid point they all reached, so the
reading is all but measured. Each arm is held against the baseline there with a 95% Welch interval over seeds. A
chord between two evals is not the curve (over a convex curve it sits above it, favouring the arm read nearer an
eval): at equal FLOPs, where the runs could have been measured (a shared grid) and were not, a reading that falls
between evals of the arm's or the baseline's runs is INTERPOLATED, never a verdict, and names the command that
measures it (the sweep relaunched into a new dir plans the grid); on a grid a decided verdict is held against each
seed's bracket (the evals a step either side) and is "unresolved" when the bracket could flip it; equal time, which no
grid can plan, keeps the bracket rule alone. Time is training time timed alone (reading/timing.py AXIS): each eval
at its step × the group's step time from the timing session (matching.arm_of(g).seconds), so a run's equal-time
reading is the same in every report that holds it; a group not timed reads "not timed" (no verdict), and every group
does when the baseline is not. It carries the timed speed verdict's under-load caveat (the session's windows); an
identical model is noise on both axes.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from gptlab.compare.reading.clock import NAMES
from gptlab.compare.reading.group import Group
from gptlab.compare.reading.runs import Run
from gptlab.compare.reading.timing import AXIS as TIMED
from gptlab.compare.reading.timing import EQUAL_TIME_METRIC
from gptlab.compare.statistics import stats, verdict
from gptlab.compare.statistics.stats import ALPHA
from gptlab.compare.statistics.verdict import Caveat, Status, Verdict
from gptlab.compare.tables.analysis import Comparison
from gptlab.sweep.layout import SWEEP_FILE
from gptlab.util.note import Note, note, warning

AXES = {"flops": "training FLOPs", **NAMES, TIMED: "training time, timed alone"}  # x key -> its name


def fill_flops(run: Run) -> str | None:
    """Give an older run's eval rows `flops` (= tokens × summary flops_per_token); the reason when it cannot."""
    evals = [run.by_step[s] for s in run.val_steps()]
    if all(rec.get("flops") is not None for rec in evals):
        return None
    per_token = run.summary.get("flops_per_token")
    if not isinstance(per_token, (int, float)) or isinstance(per_token, bool) or not per_token > 0:
        return f"{run.path}: no flops column and no flops_per_token in summary.json"
    for step, rec in zip(run.val_steps(), evals):
        tokens = 0 if step == 0 else rec.get("tokens")
        if tokens is None:
            return f"{run.path}: eval rows without tokens (step {step})"
        rec.setdefault("flops", float(tokens) * float(per_token))
    return None


def curve(run: Run, axis: str) -> tuple[list[float], list[float]] | None:
    """(x, val loss) at the run's eval points, x increasing; step 0 at x = 0; None when an eval lacks x."""
    xs, ys = [], []
    for step in run.val_steps():
        rec = run.by_step[step]
        x = 0.0 if step == 0 else rec.get(axis)
        if x is None or not math.isfinite(float(x)):
            return None
        xs.append(float(x))
        ys.append(float(rec["val/loss"]))
    if not xs or any(b < a for a, b in zip(xs, xs[1:])):
        return None
    return xs, ys


def loss_at(xs: list[float], ys: list[float], x: float) -> float:
    """Val loss at x, linear between the two eval points around it (x within [xs[0], xs[-1]], never extrapolated)."""
    if not xs[0] <= x <= xs[-1]:
        raise ValueError(f"x={x} outside the run's evals [{xs[0]}, {xs[-1]}]")
    return float(np.interp(x, xs, ys))


def bracket(xs: list[float], ys: list[float], x: float) -> tuple[float, float]:
    """(low, high) of the two evals' val losses around x: where the truth may lie on a curve that is not a straight
    line between them (the chord over a convex curve sits above it); (y, y) when x is an eval point."""
    i = int(np.searchsorted(xs, x))
    if i < len(xs) and xs[i] == x:
        return ys[i], ys[i]
    lo, hi = ys[i - 1], ys[i]
    return min(lo, hi), max(lo, hi)


def at_eval(xs: list[float], x: float) -> bool:
    """Whether x is one of the run's eval points (to rounding): a reading there is measured, not interpolated."""
    return any(math.isclose(v, x, rel_tol=1e-9) for v in xs)


def remeasure(runs: list[Run]) -> str:
    """The one command that measures val loss at equal FLOPs for these runs: their sweep relaunched into a new dir
    (gptlab-sweep plans the shared train.eval_flops grid by default for arms that differ in cost)."""
    names = {str(r.config.get("sweep")) for r in runs if isinstance(r.config, dict)}
    name = names.pop() if len(names) == 1 else "NAME"
    name = name if name not in ("None", "") and "${" not in name else "NAME"
    homes = {p for r in runs for p in r.path.parents if (p / SWEEP_FILE).is_file()}
    home = homes.pop() if len(homes) == 1 else None
    return f"gptlab-sweep {name} --out {f'{home}-grid' if home else 'NEW_DIR'}"


@dataclass
class ArmAt:
    """One group at the common x: its seeds' interpolated losses, Δ vs the baseline with a 95% Welch CI, verdict."""

    label: str
    losses: list[float]
    mean: float
    delta: float
    verdict: Verdict
    under_load: bool = False
    brackets: list[tuple[float, float]] = field(default_factory=list)  # per seed: the evals' losses around x

    @property
    def ci(self) -> list[float] | None:
        """The 95% Welch interval of delta (None with 1 seed on a side, and for the baseline)."""
        return list(self.verdict.interval) if self.verdict.interval else None


@dataclass
class AxisResult:
    """Val loss at equal `axis` (flops, train_s or wall_s): the common x and one ArmAt per group (baseline first); or
    why not."""

    axis: str
    x: float | None
    arms: list[ArmAt] = field(default_factory=list)
    missing: str | None = None
    planned: bool = False  # x is a point of the runs' shared train.eval_flops grid, not only the most all reached
    interpolated: bool = False  # an arm's reading fell between evals where a grid could have measured it: no verdict
    remeasure: str = ""  # the command that measures it, when interpolated


def shared_grid(runs: list[Run]) -> list[float]:
    """The cumulative-FLOPs grid every run evaluated around (train.eval_flops), when all share one; else []."""
    grids = set()
    for run in runs:
        given = (run.config.get("train") or {}).get("eval_flops") if isinstance(run.config, dict) else None
        if not isinstance(given, list) or not given:
            return []
        grids.add(tuple(sorted(float(f) for f in given)))
    return list(grids.pop()) if len(grids) == 1 else []


def at_equal(cmp: Comparison, axis: str) -> AxisResult:
    """Every group's val loss at the largest `axis` value every run reached, against the baseline's."""
    curves = [[(run, curve(run, axis)) for run in g.runs] for g in cmp.groups]
    lacking = [str(run.path) for per in curves for run, c in per if c is None]
    if lacking:
        return AxisResult(axis, None, missing=f"not available: no {axis} at every eval in {lacking[0]}")
    x = min(c[0][-1] for per in curves for _, c in per if c is not None)
    if not x > 0:
        return AxisResult(axis, None, missing=f"not available: a run has no {AXES[axis]} past its first eval")
    grid = shared_grid([run for g in cmp.groups for run in g.runs]) if axis == "flops" else []
    on_grid = [f for f in grid if f <= x]
    x = max(on_grid) if on_grid else x  # a planned point: every run evaluated a step either side of it
    result = AxisResult(axis, x, planned=bool(on_grid))
    measured = [all(at_eval(c[0], x) for _, c in per if c is not None) for per in curves]
    base = [loss_at(*c, x) for _, c in curves[0] if c is not None]
    base_brackets = [bracket(*c, x) for _, c in curves[0] if c is not None]
    for i, (g, row, per) in enumerate(zip(cmp.groups, cmp.rows, curves)):
        losses = [loss_at(*c, x) for _, c in per if c is not None]
        brackets = [bracket(*c, x) for _, c in per if c is not None]
        # equal FLOPs can be planned (a shared grid): a reading between evals there is a chord, never a verdict
        chord = axis == "flops" and not on_grid and not (measured[i] and measured[0])
        found = _verdict(cmp, i, axis, losses, base, brackets, base_brackets, chord)
        result.interpolated |= chord and g is not cmp.groups[0]
        loaded = Caveat.UNDER_LOAD in found.caveats
        delta = stats.mean(losses) - stats.mean(base)
        result.arms.append(ArmAt(row.label, losses, stats.mean(losses), delta, found, loaded, brackets))
    if result.interpolated:
        result.remeasure = remeasure([run for g in cmp.groups for run in g.runs])
    return result


def _verdict(
    cmp: Comparison,
    i: int,
    axis: str,
    losses: list[float],
    base: list[float],
    brackets: list[tuple[float, float]],
    base_brackets: list[tuple[float, float]],
    chord: bool,
) -> Verdict:
    """Group i's verdict against the baseline at the common x: INTERPOLATED for a chord that a grid could have
    measured, else Welch's, held against the brackets, with the time axis's load and run-order caveats."""
    row, metric = cmp.rows[i], f"val/loss@{axis}"
    if i == 0:
        found = verdict.baseline(metric)
    else:
        identical = cmp.rows[0].label in row.identical_to
        found = verdict.difference(metric, losses, base, ALPHA, identical)
        if chord and found.status is not Status.IDENTICAL:
            return Verdict(metric, Status.INTERPOLATED, seeds=found.seeds)
        found = verdict.bracketed(found, brackets, base_brackets)
    if axis == TIMED and any(Caveat.UNDER_LOAD in r.speed.caveats for r in (row, cmp.rows[0])):  # timed under load
        found = found.with_caveat(Caveat.UNDER_LOAD)
    return found


def fill_timed(cmp: Comparison) -> None:
    """Give each timed group's runs' eval rows TIMED, the step at the group's timed step time (reading/timing.py
    TimedArm.seconds); an untimed group's rows get none."""
    for g in cmp.groups:
        arm = cmp.timing.arm_of(g) if cmp.timing is not None else None
        for run in g.runs:
            for step in run.val_steps():
                run.by_step[step].pop(TIMED, None)
                if arm is not None and (seconds := arm.seconds(step)) is not None:
                    run.by_step[step][TIMED] = seconds


def at_equal_time(cmp: Comparison) -> AxisResult:
    """Val loss at equal training time, timed alone: the timed groups at the largest timed time all their runs
    reached, against the baseline; an untimed group "not timed", every group when the baseline is not timed."""
    fill_timed(cmp)
    keep = [i for i, g in enumerate(cmp.groups) if cmp.timing is not None and cmp.timing.arm_of(g) is not None]
    found = (
        at_equal(replace(cmp, groups=[cmp.groups[i] for i in keep], rows=[cmp.rows[i] for i in keep]), TIMED)
        if keep and keep[0] == 0
        else AxisResult(TIMED, None, missing="not timed: no timing session times the baseline")
    )
    timed = dict(zip(keep, found.arms)) if found.arms else {}
    untimed = Verdict(EQUAL_TIME_METRIC, Status.NOT_MEASURED)
    found.arms = [timed.get(i) or ArmAt(row.label, [], math.nan, math.nan, untimed) for i, row in enumerate(cmp.rows)]
    return found


@dataclass
class EqualCompute:
    """Both equal-compute views and the matched arms' records (label -> summary.json `match`)."""

    axes: list[AxisResult]
    matched: dict[str, dict] = field(default_factory=dict)
    rebuilt: list[str] = field(default_factory=list)  # runs whose flops column came from flops_per_token × tokens
    # matched arms sized against another baseline than the comparison's (label -> the keys it differs in): no
    # matched cell is read for them (compare/tables/matrix.py); `warnings` say so, and where a record cannot tell
    other_baseline: dict[str, list[str]] = field(default_factory=dict)
    warnings: list[Note] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "alpha": ALPHA,
            "axes": [
                {**asdict(a), "arms": [{**asdict(arm), "verdict": arm.verdict.to_json()} for arm in a.arms]}
                for a in self.axes
            ],
            "matched": self.matched,
            "matched_to_another_baseline": self.other_baseline,
            "flops_rebuilt_from_summary": self.rebuilt,
        }


# Keys of a component that change neither its parameters nor its FLOPs per token: a baseline that differs only in
# them is the one an arm was matched to. The model keys that size every component are compared besides.
COST_FREE = frozenset({"name", "impl", "dropout"})
SIZE_KEYS = ("n_layer", "n_head", "d_model", "block_size", "vocab_size", "vocab_multiple", "tie_embeddings", "bias")


def baseline_differs(record: dict, arm: Group, base: Group) -> list[str] | None:
    """The keys in which the comparison's baseline group differs from the baseline `arm` was matched to (its match
    record's components: conf defaults + model.match_to, at the arm's model sizes): [] when it is that baseline,
    None when the record does not say (a run from before the components were recorded)."""
    components = (record.get("baseline") or {}).get("components")
    if not isinstance(components, dict):
        return None
    have, own = base.runs[0].config, arm.runs[0].config
    out = []
    for group, recorded in components.items():
        found = have.get(group)
        got: dict = found if isinstance(found, dict) else {}
        want: dict = recorded if isinstance(recorded, dict) else {}
        out += [
            f"{group}.{k}" for k in sorted(set(want) | set(got)) if k not in COST_FREE and want.get(k) != got.get(k)
        ]
    knob = str(record.get("key") or "")
    sizes = [(own.get("model") or {}, have.get("model") or {})]
    out += [f"model.{k}" for k in SIZE_KEYS for a, b in sizes if f"model.{k}" != knob and a.get(k) != b.get(k)]
    return out


def _match_checks(cmp: Comparison, matched: dict[str, dict]) -> tuple[dict[str, list[str]], list[Note]]:
    """(matched arms sized against another baseline: label -> keys, the warnings and notes that say so)."""
    base = cmp.groups[0]
    other, out = {}, []
    for g in cmp.groups[1:]:
        if g.label not in matched:
            continue
        differs = baseline_differs(matched[g.label], g, base)
        mode = matched[g.label].get("mode") or "flops"
        if differs is None:
            out.append(
                note(
                    f"note: '{g.label}' records no baseline it was {mode}-matched to (a run from before it was kept): "
                    f"its matched reading assumes the comparison's baseline '{base.label}'",
                    subject=g.label,
                )
            )
        elif differs:
            other[g.label] = differs
            out.append(
                warning(
                    f"'{g.label}' was {mode}-matched to another baseline than the comparison's '{base.label}' (it "
                    f"differs in {', '.join(differs)}): no matched reading is made against a baseline it was not "
                    "sized to",
                    subject=g.label,
                    fix="give --baseline the arm of conf defaults + its model.match_to",
                )
            )
    return other, out


def equal_compute(cmp: Comparison) -> EqualCompute:
    """The equal-FLOPs and equal-training-time (timed alone) verdicts of a comparison (older runs get their flops
    column rebuilt)."""
    rebuilt, why = [], []
    for g in cmp.groups:
        for run in g.runs:
            had = all(run.by_step[s].get("flops") is not None for s in run.val_steps())
            reason = fill_flops(run)
            why += [reason] if reason else []
            if not had and not reason:
                rebuilt.append(str(run.path))
    axes = [at_equal(cmp, "flops"), at_equal_time(cmp)]
    if why:
        axes[0] = AxisResult("flops", None, missing=f"not available: {why[0]}")
    matched = {
        g.label: rec
        for g in cmp.groups
        if isinstance(rec := next((r.summary.get("match") for r in g.runs if r.summary.get("match")), None), dict)
    }
    other, notes = _match_checks(cmp, matched)
    return EqualCompute(axes, matched, rebuilt, other, notes)

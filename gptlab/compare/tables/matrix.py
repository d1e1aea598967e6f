"""One verdict matrix: every arm against the baseline under every lens the runs support, and what the lenses say
together.

A lens is a way of holding the comparison fair: equal steps (the main table's contract), equal training FLOPs and
equal training time timed alone (tables/compute.py: each arm's steps at its step time from the timing session; a
column of "not timed" cells where the baseline is not timed), each arm at its own best lr
(studies/lr_grid.py) and the arm re-solved to the baseline's FLOPs or params (`model.match`, folded into the row of
the arm it was matched from). Each cell is the
Verdict that lens already made; nothing is recomputed here. `reconcile` then names where the lenses agree and where
they disagree — as values (Finding), worded only in compare/render/words.py. A reading that had to be interpolated
(equal FLOPs between evals, where a shared grid could have measured it) is not measured: it draws no finding but the
one that says how to measure it. In an lr grid whose arms all picked the baseline's lr, the own-best-lr column is the
baseline's-lr column again: it is left out (`one_lr`), and the report says why.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from gptlab.compare.reading.group import diff_items
from gptlab.compare.reading.timing import AXIS as TIMED
from gptlab.compare.statistics.verdict import Caveat, Status, Verdict
from gptlab.compare.tables.analysis import Comparison

COST_TOLERANCE = 0.01  # FLOPs per token within 1 % of the baseline's: equal FLOPs is equal steps, no new lens


class Lens(str, Enum):
    """How a cell holds the comparison fair (the str value is the JSON spelling; the order is the columns')."""

    EQUAL_STEPS = "equal_steps"
    EQUAL_FLOPS = "equal_flops"
    EQUAL_TRAIN_TIME = "equal_training_time"  # steps at each arm's timed step time (the timing session)
    OWN_BEST_LR = "own_best_lr"
    MATCHED = "matched"  # the arm re-solved to the baseline's FLOPs/token or params (model.match), at equal steps


class Outcome(str, Enum):
    """A loss cell's answer, for reconciling: lower is better."""

    BETTER = "better"
    WORSE = "worse"
    NOISE = "within_noise"  # within noise, below the floor, or the identical model
    UNDECIDED = "undecided"  # one seed on a side, or a reading its bracket could flip
    MISSING = "not_measured"


class Finding(str, Enum):
    """What the lenses say together (a row can have several)."""

    AGREE = "agree"  # every measured lens decided the same way
    ALL_NOISE = "all_noise"  # every measured lens within noise
    OPPOSITE = "opposite"  # lenses decided in opposite directions: no single verdict
    NOT_AT_EQUAL_FLOPS = "not_at_equal_flops"  # the equal-steps decision does not hold at equal FLOPs (costs differ)
    NOT_AT_OWN_LR = "not_at_own_lr"  # the equal-steps decision does not hold at each arm's own best lr
    HOLDS_MATCHED = "holds_matched"  # the equal-steps decision holds when the arm is matched in FLOPs/params
    NEEDS_SEEDS = "needs_seeds"  # a lens has one seed on a side: no test
    NEEDS_EVALS = "needs_evals"  # a lens read between evals, and the evals around the reading could flip it
    FLOPS_NOT_MEASURED = "flops_not_measured"  # equal FLOPs fell between evals and no shared grid measured it
    EDGE_LR = "edge_lr"  # an lr-grid cell's best lr (the arm's or the baseline's) is at the grid's edge


def outcome(v: Verdict) -> Outcome:
    """The cell's answer on a loss (lower is better)."""
    if v.status is Status.DECIDED:
        return Outcome.WORSE if v.direction > 0 else Outcome.BETTER
    if v.status in (Status.WITHIN_NOISE, Status.BELOW_FLOOR, Status.IDENTICAL):
        return Outcome.NOISE
    if v.status in (Status.NO_TEST, Status.UNRESOLVED):
        return Outcome.UNDECIDED
    return Outcome.MISSING  # not measured, the baseline, or a reading interpolated where it could have been measured


@dataclass
class ArmLenses:
    """One arm's row: a Verdict per lens it was measured under, its speed-up, the matched arm folded in, findings."""

    label: str
    cells: dict[Lens, Verdict]
    speed: Verdict
    matched_arm: str | None = None  # the label of the arm whose equal-steps verdict fills the MATCHED cell
    matched_mode: str | None = None  # "flops" | "params"
    cost: float | None = None  # FLOPs per token / the baseline's
    findings: list[Finding] = field(default_factory=list)

    def by_outcome(self) -> dict[Outcome, list[Lens]]:
        """The lenses of each outcome, in column order."""
        out: dict[Outcome, list[Lens]] = {}
        for lens in Lens:
            if lens in self.cells:
                out.setdefault(outcome(self.cells[lens]), []).append(lens)
        return out

    def to_json(self) -> dict:
        return {
            "label": self.label,
            "cells": {lens.value: v.to_json() for lens, v in self.cells.items()},
            "speed": self.speed.to_json(),
            "matched_arm": self.matched_arm,
            "matched_mode": self.matched_mode,
            "cost": self.cost,
            "findings": [f.value for f in self.findings],
        }


@dataclass
class Matrix:
    """The arms (baseline excluded) and the lenses any of them was measured under, in column order."""

    baseline: str
    arms: list[ArmLenses]
    lenses: list[Lens]
    lr_grid: bool = False  # an lr grid's: equal steps at the baseline's best lr, FLOPs and time at each own best
    one_lr: str | None = None  # an lr grid's arms all picked the baseline's best lr (this one): one column, not two
    remeasure: str = ""  # the command that measures equal FLOPs, where a reading was interpolated

    def to_json(self) -> dict:
        return {
            "baseline": self.baseline,
            "lenses": [x.value for x in self.lenses],
            "arms": [a.to_json() for a in self.arms],
            "lr_grid": self.lr_grid,
            "one_lr": self.one_lr,
            "remeasure": self.remeasure or None,
        }


def reconcile(arm: ArmLenses) -> list[Finding]:
    """What the lenses say together, from the cells' outcomes alone."""
    cells = {lens: outcome(v) for lens, v in arm.cells.items()}
    measured = {lens: o for lens, o in cells.items() if o is not Outcome.MISSING}
    decided = {o for o in measured.values() if o in (Outcome.BETTER, Outcome.WORSE)}
    found: list[Finding] = []
    if len(decided) == 2:
        found.append(Finding.OPPOSITE)
    elif measured and all(o is Outcome.NOISE for o in measured.values()):
        found.append(Finding.ALL_NOISE)
    elif decided and all(o in decided for o in measured.values()) and len(measured) > 1:
        found.append(Finding.AGREE)
    steps = cells.get(Lens.EQUAL_STEPS)
    if steps in (Outcome.BETTER, Outcome.WORSE) and Finding.AGREE not in found:
        costs_differ = arm.cost is not None and abs(arm.cost - 1.0) > COST_TOLERANCE
        flops = cells.get(Lens.EQUAL_FLOPS)
        if costs_differ and flops in (Outcome.NOISE, *({Outcome.BETTER, Outcome.WORSE} - {steps})):
            found.append(Finding.NOT_AT_EQUAL_FLOPS)
        if cells.get(Lens.OWN_BEST_LR) in (Outcome.NOISE, *({Outcome.BETTER, Outcome.WORSE} - {steps})):
            found.append(Finding.NOT_AT_OWN_LR)
        if cells.get(Lens.MATCHED) is steps:
            found.append(Finding.HOLDS_MATCHED)
    statuses = {v.status for v in arm.cells.values()}
    if Status.NO_TEST in statuses:
        found.append(Finding.NEEDS_SEEDS)
    if Status.UNRESOLVED in statuses:
        found.append(Finding.NEEDS_EVALS)
    if Status.INTERPOLATED in statuses:
        found.append(Finding.FLOPS_NOT_MEASURED)
    if any(Caveat.EDGE_LR in v.caveats for v in arm.cells.values()):
        found.append(Finding.EDGE_LR)
    return found


def _matched_from(cmp: Comparison) -> dict[int, tuple[int, str]]:
    """{row index of an arm: (row index of the arm matched from it, mode)}: a matched arm (its runs carry a
    `match` record) folds into the one arm that differs from it only in model.match* and the re-solved knob, unless
    it was matched to another baseline than the comparison's (compute.baseline_differs: its own row then)."""
    records = cmp.compute.matched if cmp.compute is not None else {}
    other = cmp.compute.other_baseline if cmp.compute is not None else {}
    out: dict[int, tuple[int, str]] = {}
    for j, g in enumerate(cmp.groups):
        rec = records.get(g.label)
        if j == 0 or not isinstance(rec, dict) or g.label in other:  # sized against another baseline: no reading
            continue
        knob = str(rec.get("key") or "")
        sources = [
            i
            for i, h in enumerate(cmp.groups)
            if i not in (0, j)
            and h.label not in records
            and all(k.startswith("model.match") or k == knob for k, _ in diff_items(g, h, hide_implied=False))
        ]
        if len(sources) == 1 and sources[0] not in out:
            out[sources[0]] = (j, str(rec.get("mode") or "flops"))
    return out


def build(
    cmp: Comparison,
    own_best_lr: dict[str, Verdict] | None = None,
    at_baseline_lr: dict[str, Verdict] | None = None,
    one_lr: str | None = None,
) -> Matrix:
    """The matrix of one comparison: equal steps from its rows, equal FLOPs / time from its equal-compute
    axes (where measured). For an lr grid (`cmp` holds each arm at its own best lr): `own_best_lr` and
    `at_baseline_lr` are the grid's verdicts by row label, the latter filling the equal-steps column (every arm at
    the baseline's best lr: the comparison a plain ablation makes); `one_lr`, the baseline's best lr when every arm
    picked it too: the own-best-lr column would repeat that one, so it is left out."""
    if one_lr is not None:
        own_best_lr = None
    found = cmp.compute.axes if cmp.compute is not None else []
    axes = {ax.axis: ax for ax in found if ax.x is not None or (ax.axis == TIMED and ax.arms)}  # "not timed" cells
    lens_of_axis = {"flops": Lens.EQUAL_FLOPS, TIMED: Lens.EQUAL_TRAIN_TIME}
    folded = _matched_from(cmp)
    into = {j for j, _ in folded.values()}
    arms = []
    for i, row in enumerate(cmp.rows):
        if i == 0 or i in into:
            continue
        steps = (at_baseline_lr or {}).get(row.label) if at_baseline_lr is not None else row.loss
        cells = {Lens.EQUAL_STEPS: steps} if steps is not None else {}
        for axis, ax in axes.items():
            cells[lens_of_axis[axis]] = ax.arms[i].verdict
        if own_best_lr and row.label in own_best_lr:
            cells[Lens.OWN_BEST_LR] = own_best_lr[row.label]
        base_cost = cmp.rows[0].flops_per_token
        cost = row.flops_per_token / base_cost if row.flops_per_token and base_cost else None
        arm = ArmLenses(row.label, cells, row.speed, cost=cost)
        record = cmp.compute.matched.get(row.label) if cmp.compute is not None else None
        if isinstance(record, dict):  # matched with no unmatched sibling here: its own row, marked as matched
            arm.matched_mode = str(record.get("mode") or "flops")
        if i in folded:
            j, mode = folded[i]
            arm.cells[Lens.MATCHED] = cmp.rows[j].loss
            arm.matched_arm, arm.matched_mode = cmp.rows[j].label, mode
        arm.cells = {lens: arm.cells[lens] for lens in Lens if lens in arm.cells}
        arm.findings = reconcile(arm)
        arms.append(arm)
    used = [lens for lens in Lens if any(lens in a.cells for a in arms)]
    remeasure = next((ax.remeasure for ax in axes.values() if ax.remeasure), "")
    return Matrix(cmp.baseline, arms, used, at_baseline_lr is not None, one_lr, remeasure)

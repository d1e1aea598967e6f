"""The validation-set table: each extra validation set's loss (`val/<name>/loss`, data.val_sets) per arm at the
compared point, with the same seed statistics and Welch verdicts as val loss (lower is better). Like with like per
set: a set's loss is pooled only over runs that scored the very same set (summary.json `val_sets`: its fingerprint
and the number of windows); runs that scored different sets under one name leave it out with a one-line warning."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from gptlab.compare.statistics import verdict
from gptlab.compare.statistics.stats import ALPHA
from gptlab.compare.tables.cells import ArmCell, arm_cell
from gptlab.util.note import Note, warning

UNRECORDED = "unrecorded"


@dataclass
class ValSetRow:
    """One validation set across the arms (baseline first): its metric, what it is, and a cell per arm."""

    name: str
    metric: str
    fingerprint: str
    sequences: int | None
    tokens: int | None
    cells: list[ArmCell] = field(default_factory=list)


def set_name(metric: str) -> str | None:
    """`code` for `val/code/loss`; None for any other metric (val/loss and val/acc included)."""
    parts = metric.split("/")
    return parts[1] if len(parts) == 3 and parts[0] == "val" and parts[2] == "loss" else None


def _record(run, name: str) -> dict:
    """The run's summary.json entry for set `name` ({} when it recorded none)."""
    sets = run.summary.get("val_sets")
    entry = sets.get(name) if isinstance(sets, dict) else None
    return entry if isinstance(entry, dict) else {}


def _identity(run, name: str) -> str:
    """What the run scored as set `name`: its fingerprint and number of windows, or 'unrecorded'."""
    entry = _record(run, name)
    if not entry.get("fingerprint"):
        return UNRECORDED
    return f"{entry['fingerprint']} ({entry.get('sequences')} sequences)"


def val_set_rows(
    groups: list, labels: list[str], point, identical: list[bool] | None = None
) -> tuple[list[ValSetRow], list[Note]]:
    """A ValSetRow per validation set any run logged at the compared point (groups baseline first, `labels` theirs;
    `identical[i]`: group i builds the baseline's model, so its differences are noise), and one warning per set left
    out because its runs scored different sets."""
    evals = [[r.by_step.get(point.step_of(r), {}) for r in g.runs] for g in groups]
    metrics = sorted({k for rows in evals for e in rows for k in e if set_name(k)})
    out, warnings = [], []
    for metric in metrics:
        name = str(set_name(metric))
        runs = [r for g, rows in zip(groups, evals) for r, e in zip(g.runs, rows) if metric in e]
        seen = {_identity(r, name) for r in runs}
        if len(seen) > 1:
            warnings.append(
                warning(
                    f"{metric}: the runs scored different sets under this name ({', '.join(sorted(seen))}; "
                    "summary.json val_sets), so it is left out of the validation-set table",
                    subject=metric,
                )
            )
            continue
        entry = _record(runs[0], name)
        row = ValSetRow(name, metric, seen.pop(), entry.get("sequences"), entry.get("tokens"))
        for i, (label, rows) in enumerate(zip(labels, evals)):
            values = [float(e[metric]) for e in rows if e.get(metric) is not None]
            base = row.cells[0] if row.cells else None
            cell = arm_cell(metric, label, values, base)
            if base is not None and cell.verdict is not None and identical and identical[i]:
                cell.verdict = verdict.difference(metric, values, base.values, ALPHA, identical=True)
            row.cells.append(cell)
        out.append(row)
    return out, warnings


def to_json(rows: list[ValSetRow]) -> list[dict[str, Any]]:
    """comparison.json's `val_sets`: one object per set with its cells."""
    return [{**asdict(r), "cells": [c.to_json() for c in r.cells]} for r in rows]

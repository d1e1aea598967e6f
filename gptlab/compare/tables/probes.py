"""The probe table: each probe/* metric (gptlab.train.probes) per arm at the compared point, with the same seed
statistics and Welch verdicts as val loss, and only where every run measured it on the same fixed set."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from gptlab.compare.tables.cells import ArmCell, arm_cell
from gptlab.util.note import Note, warning

PREFIX = "probe/"


@dataclass
class ProbeRow:
    """One probe metric across the arms (baseline first); `better` is the direction that is an improvement."""

    metric: str
    better: str
    cells: list[ArmCell] = field(default_factory=list)


def _fingerprint(run, metric: str) -> str:
    """The fixed set a run measured a metric's probe on (summary.json probe_sets), 'unrecorded' without one."""
    sets = run.summary.get("probe_sets")
    return str(sets.get(metric.split("/")[1], "unrecorded")) if isinstance(sets, dict) else "unrecorded"


def probe_rows(groups: list, labels: list[str], point) -> tuple[list[ProbeRow], list[Note]]:
    """A ProbeRow per probe metric any run logged at the compared point (groups baseline first, `labels` theirs),
    and one warning per metric left out because its runs measured it on different fixed sets."""
    evals = [[r.by_step.get(point.step_of(r), {}) for r in g.runs] for g in groups]
    metrics = sorted({k for rows in evals for e in rows for k in e if k.startswith(PREFIX)})
    out, warnings = [], []
    for metric in metrics:
        sets = {_fingerprint(r, metric) for g, rows in zip(groups, evals) for r, e in zip(g.runs, rows) if metric in e}
        if len(sets) > 1:
            warnings.append(
                warning(
                    f"{metric}: the runs measured it on different fixed sets ({', '.join(sorted(sets))}; "
                    "summary.json probe_sets), so it is left out of the probe table",
                    subject=metric,
                )
            )
            continue
        row = ProbeRow(metric, "lower" if metric.endswith("loss") else "higher")
        for label, rows in zip(labels, evals):
            values = [float(e[metric]) for e in rows if e.get(metric) is not None]
            row.cells.append(arm_cell(metric, label, values, row.cells[0] if row.cells else None))
        out.append(row)
    return out, warnings


def to_json(rows: list[ProbeRow]) -> list[dict[str, Any]]:
    """comparison.json's `probes`: one object per metric with its cells."""
    return [{**asdict(r), "cells": [c.to_json() for c in r.cells]} for r in rows]

"""The eval table: each downstream-task metric gptlab-eval wrote (eval.json, lm-evaluation-harness) per arm, mean ±
std over seeds, Δ vs the baseline with Welch's t-test as for val loss. A metric is pooled only over runs that measured
it the same way (lm-eval version, task version and config, few-shot count, limit) at their own last step; anything
else leaves it out with a warning, never mixed."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from gptlab.compare.tables.cells import ArmCell, arm_cell
from gptlab.util.note import Note, warning

# what must be equal for one task's numbers to be comparable across runs
SAME = ("lm_eval", "version", "config_sha256", "num_fewshot", "limit", "prefix_token_id")


@dataclass
class EvalRow:
    """One `eval/<task>/<metric>` across the arms (baseline first)."""

    metric: str
    cells: list[ArmCell] = field(default_factory=list)


def _entries(run, task: str) -> dict:
    """The run's eval.json entry for `task` ({} when it has none)."""
    tasks = run.evals.get("tasks") if isinstance(run.evals, dict) else None
    entry = tasks.get(task) if isinstance(tasks, dict) else None
    return entry if isinstance(entry, dict) else {}


def _task_warning(task: str, runs: list) -> Note | None:
    """Why `task`'s numbers cannot be pooled over `runs` (measured differently, or not at the run's last step)."""
    stale = [r for r in runs if _entries(r, task).get("step") != r.last_step]
    if stale:
        return warning(
            f"eval/{task}: {stale[0].path} measured it at step {_entries(stale[0], task).get('step')}, not its last "
            f"step {stale[0].last_step}; run gptlab-eval again; left out of the eval table",
            subject=f"eval/{task}",
            fix="run gptlab-eval again",
        )
    for key in SAME:
        seen = {repr(_entries(r, task).get(key)) for r in runs}
        if len(seen) > 1:
            return warning(
                f"eval/{task}: the runs measured it with different {key} ({', '.join(sorted(seen))}); left out",
                subject=f"eval/{task}",
            )
    return None


def eval_rows(groups: list, labels: list[str]) -> tuple[list[EvalRow], list[Note]]:
    """An EvalRow per task metric any run's eval.json holds (groups baseline first, `labels` theirs), and one warning
    per task left out; per-run standard errors (`*_stderr`) are not pooled."""
    tasks = sorted({t for g in groups for r in g.runs for t in (r.evals.get("tasks") or {}) if _entries(r, t)})
    rows, warnings = [], []
    for task in tasks:
        runs = [r for g in groups for r in g.runs if _entries(r, task)]
        why = _task_warning(task, runs)
        if why:
            warnings.append(why)
            continue
        names = sorted({m for r in runs for m in (_entries(r, task).get("metrics") or {}) if not m.endswith("_stderr")})
        for name in names:
            row = EvalRow(f"eval/{task}/{name}")
            for label, group in zip(labels, groups):
                values = [
                    float(v)
                    for r in group.runs
                    if (e := _entries(r, task)) and isinstance(v := (e.get("metrics") or {}).get(name), (int, float))
                ]
                row.cells.append(arm_cell(row.metric, label, values, row.cells[0] if row.cells else None))
            rows.append(row)
    return rows, warnings


def to_json(rows: list[EvalRow]) -> list[dict[str, Any]]:
    """comparison.json's `evals`: one object per metric with its cells."""
    return [{**asdict(r), "cells": [c.to_json() for c in r.cells]} for r in rows]

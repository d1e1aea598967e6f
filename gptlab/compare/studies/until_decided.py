"""Seeds until decided: one look of a group-sequential design over a sweep dir, and the record of the looks taken.

`gptlab-sweep NAME --until-decided --max-seeds N` runs every arm at the sweep's seeds, then at each look of a
compare/statistics/sequential.py plan reads the finished runs here (through compare/reading/runs.py and the
like-with-like check), decides each arm still open against the baseline on its final val loss, and adds seeds only
to the arms still undecided (and the baseline) until each is decided or the cap is reached. The looks are recorded
in <sweep dir>/until_decided.json, from before the first launch on, so a plan stopped half-way is on record too.
gptlab-compare reports how many were taken and each arm's sequential decision, since a plain Welch p on data that
grew until it was decided would overstate the evidence.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from gptlab.compare.reading.like import check_like
from gptlab.compare.reading.runs import Run, load_run
from gptlab.compare.statistics.sequential import Look, Plan, decide
from gptlab.errors import ConfigError
from gptlab.sweep.layout import seed_part
from gptlab.util.io import atomic_write_text

RECORD_FILE = "until_decided.json"  # in the sweep dir


def _final(run: Run) -> float:
    value = run.summary.get("final_val_loss")
    if run.summary.get("status") != "finished" or not isinstance(value, (int, float)):
        raise ConfigError(f"{run.path}: not a finished run with a final val loss; rerun the sweep to finish it")
    return float(value)


def look(sweep_dir: Path, design: Plan, k: int, base: str, arms: list[str], seeds: list[int]) -> dict[str, Look]:
    """Look k: each open arm's final val losses over `seeds` against the baseline arm's, decided by the plan."""
    runs = {arm: [load_run(sweep_dir / arm / seed_part(s)) for s in seeds] for arm in [base, *arms]}
    check_like([r for per in runs.values() for r in per])
    base_values = [_final(r) for r in runs[base]]
    return {arm: decide(design, k, [_final(r) for r in runs[arm]], base_values) for arm in arms}


def write_record(sweep_dir: Path, design: Plan, base: str, looks: list[dict[str, Look]], finished: bool = True) -> Path:
    """until_decided.json: the plan, per look each open arm's test, and whether the plan ran to its end (written
    before the first launch and after every look, so an interrupted plan is on record and only it may continue)."""
    doc = {
        "baseline": base,
        "plan": {**asdict(design), "looks": design.looks},
        "looks": [{arm: asdict(found) for arm, found in taken.items()} for taken in looks],
        "finished": finished,
    }
    path = sweep_dir / RECORD_FILE
    atomic_write_text(path, json.dumps(doc, indent=1) + "\n")
    return path


def read_record(sweep_dir: Path) -> dict[str, Any] | None:
    """The sweep dir's until_decided.json, None when it has none (or it is unreadable)."""
    try:
        doc = json.loads((sweep_dir / RECORD_FILE).read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and isinstance(doc.get("looks"), list) else None

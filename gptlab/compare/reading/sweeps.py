"""Which runs a folder given to gptlab-compare stands for: one sweep, and of a partial sweep the runs that finished.

- several sweeps: a folder that holds runs of more than one sweep (more than one dir with a sweep.yaml, or more
  than one `sweep` name in the runs' configs) is refused with one line that lists them, instead of pooling them;
  naming several folders on the command line compares across sweeps on purpose;
- a partial sweep: a sweep dir whose .plan/plan.json (gptlab-sweep's latest launch) lists runs. Its runs without a
  summary.json (still training, killed before the end, or never started) are left out and named in one warning;
  the runs that finished are compared;
- pruned runs (status "pruned": a tune search's pruner stopped them, `pruned_at_step`): their last val loss is where
  the curve was judged hopeless, not a result, so they are left out of every table and verdict, named in one note.

The layout is gptlab-sweep's, defined in gptlab/sweep/layout.py (.plan/plan.json entries with the run's `subdir`
under the sweep dir, <arm>/seed<k> or <arm>/lr<value>/seed<k>; older plans only `arm` and `seed`): compare imports
that module alone of the launcher.
"""

from __future__ import annotations

import os
from pathlib import Path

from gptlab.compare.reading.runs import Run, is_run_dir
from gptlab.errors import ConfigError
from gptlab.sweep.layout import PLAN_FILE, SWEEP_FILE, planned_subdir, read_plan
from gptlab.util.note import Note, note, warning


def _under(run: Run, root: Path) -> list[Path]:
    """The run's parent folders from its own parent up to root (inclusive)."""
    out = []
    for parent in run.path.parents:
        out.append(parent)
        if parent == root:
            return out
    return []


def _sweep_of(run: Run, root: Path) -> tuple[str, str] | None:
    """(key, label) of the sweep a run belongs to: its nearest folder with a sweep.yaml, else its `sweep` name."""
    for parent in _under(run, root):
        if (parent / SWEEP_FILE).is_file():
            rel = os.path.relpath(parent, root)
            return f"dir:{parent}", f"{'.' if rel == '.' else rel + '/'} ({SWEEP_FILE})"
    name = run.config.get("sweep")
    if isinstance(name, str) and name and "${" not in name:
        return f"name:{name}", f"sweep={name}"
    return None


def check_one_sweep(paths: list[Path], runs: list[Run]) -> None:
    """Refuse a given folder that holds runs of several sweeps (one line listing them)."""
    for given in paths:
        root = given.resolve()
        if not root.is_dir() or is_run_dir(root):
            continue
        found: dict[str, tuple[str, list[Path]]] = {}
        for run in runs:
            if root not in run.path.resolve().parents:  # another folder's run: that folder is checked on its own
                continue
            sweep = _sweep_of(run, root)
            if sweep is not None:
                found.setdefault(sweep[0], (sweep[1], []))[1].append(run.path)
        if len(found) > 1:
            listed = ", ".join(
                f"{label} in {os.path.relpath(os.path.commonpath([str(p) for p in dirs]), root)}"
                if label.startswith("sweep=")
                else label
                for label, dirs in found.values()
            )
            raise ConfigError(
                f"'{given}' holds {len(found)} sweeps: {listed}; compare one of them (give its folder), "
                "or give each folder on the command line to compare across sweeps on purpose"
            )


def _plan(sweep_dir: Path) -> list[Path]:
    """The run dirs .plan/plan.json lists ([] when it is missing or unreadable)."""
    subdirs = [planned_subdir(entry) for entry in read_plan(sweep_dir)]
    return [sweep_dir / subdir for subdir in subdirs if subdir]


def finished_runs(paths: list[Path], runs: list[Run]) -> tuple[list[Run], list[Note]]:
    """(runs to compare, warnings): in a planned sweep dir at or below a given folder, runs without summary.json
    are left out and, with the planned runs never started, named in one warning per sweep dir."""
    sweep_dirs: dict[Path, list[Run]] = {}
    for given in paths:
        root = given.resolve()
        if not root.is_dir() or is_run_dir(root):
            continue
        for run in runs:
            planned = next((p for p in _under(run, root) if (p / PLAN_FILE).is_file()), None)
            if planned is not None:
                sweep_dirs.setdefault(planned, [])
                if run not in sweep_dirs[planned]:
                    sweep_dirs[planned].append(run)
    left_out: set[int] = set()
    warnings = []
    for sweep_dir, members in sweep_dirs.items():
        plan = _plan(sweep_dir)
        unfinished = {r.path: r for r in members if not (r.path / "summary.json").is_file()}
        missing = sorted(
            {p for p in plan if not (p / "summary.json").is_file()} | set(unfinished),
            key=lambda p: str(p),
        )
        if not missing:
            continue
        left_out |= {id(r) for r in unfinished.values()}
        why = [
            f"{os.path.relpath(p, sweep_dir)} ("
            + (
                f"metrics up to step {unfinished[p].last_step}: still training, or killed"
                if p in unfinished
                else "started, no metrics yet"
                if p.is_dir()
                else "not started"
            )
            + ")"
            for p in missing
        ]
        done = len(members) - len(unfinished)
        has, are = ("has", "is") if len(missing) == 1 else ("have", "are")
        warnings.append(
            warning(
                f"sweep {sweep_dir}: {len(missing)} of its runs {has} not finished (no summary.json; {len(plan)} in "
                f"its latest launch) and {are} left out: {', '.join(why)}; compared: the {done} that finished",
                subject=str(sweep_dir),
            )
        )
    kept = [r for r in runs if id(r) not in left_out]
    if not kept:
        where = ", ".join(str(d) for d in sweep_dirs)
        raise ConfigError(
            f"sweep {where}: none of its runs has finished yet (no summary.json); see gptlab-sweep status {where}"
        )
    return kept, warnings


def unpruned(runs: list[Run]) -> tuple[list[Run], list[Note]]:
    """(runs to compare, a note naming the runs a tune pruner stopped, which are left out); every run pruned is a
    one-line ConfigError."""
    pruned = [r for r in runs if r.status == "pruned"]
    if not pruned:
        return runs, []
    kept = [r for r in runs if r.status != "pruned"]
    if not kept:
        raise ConfigError(
            f"all {len(runs)} runs were pruned by a tune search's pruner (status pruned, no final val loss); nothing "
            "to compare: give runs that finished"
        )
    root = os.path.commonpath([str(r.path) for r in runs])
    named = ", ".join(f"{os.path.relpath(r.path, root)} (step {r.summary.get('pruned_at_step', '?')})" for r in pruned)
    return kept, [
        note(
            f"note: {len(pruned)} run(s) pruned by the tune search's pruner are left out (a pruned run has no final "
            f"val loss; it stopped at the step given): {named}"
        )
    ]

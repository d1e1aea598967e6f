"""`gptlab-sweep status DIR`: each run of a sweep in flight, read from what its runs left (the run dir's lock held or
not, its summary.json), the scheduler (sacct / squeue) and the processes the sweep recorded, asked whether they still
live (gptlab/sweep/process.py): never from a record alone, which a launcher killed with kill -9 cannot update.

States: finished; running (its lock is held, or the process the local queue started for it lives: its step and last
val loss); pending (queued, nothing written yet, and the queue or scheduler holding it is there); requeued (SLURM put
it back in the queue: preempted or timed out, it resumes from its checkpoint); stopped (launched, but neither it nor
the gptlab-sweep that launched it lives: the next launch of the sweep starts it, or resumes it from its checkpoint);
failed (with the last line of its log); cancelled; refused (the sweep could not start it, with the reason it gave);
never ran (in the sweep file, never launched).
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

from gptlab.errors import ConfigError
from gptlab.sinks.jsonl import SUMMARY_FILE, read_summary
from gptlab.state.layout import LOCK_FILE, lock_held
from gptlab.sweep.design import parse_ladder
from gptlab.sweep.design import rungs as ladder_rungs
from gptlab.sweep.layout import (
    EARLIER_JOBS_FILE,
    PLAN_DIR,
    QUEUE_FILE,
    SUBMITIT_DIR,
    SWEEP_FILE,
    planned_subdir,
    read_plan,
    read_refused,
    read_sweep,
    run_name,
    run_subdir,
    set_aside,
)
from gptlab.sweep.process import alive
from gptlab.util.stored import Check, read_json

# sacct/squeue states -> ours
SLURM_STATES = {
    "PENDING": "pending",
    "CONFIGURING": "pending",
    "RUNNING": "running",
    "COMPLETING": "running",
    "REQUEUED": "requeued",
    "REQUEUE_HOLD": "requeued",
    "REQUEUE_FED": "requeued",
    "PREEMPTED": "requeued",
    "COMPLETED": "finished",
    "FAILED": "failed",
    "TIMEOUT": "failed",
    "OUT_OF_MEMORY": "failed",
    "NODE_FAIL": "failed",
    "BOOT_FAIL": "failed",
    "DEADLINE": "failed",
    "CANCELLED": "cancelled",
}


QUEUE_STATES = ("pending", "running", "finished", "failed", "cancelled")  # what sweep/queue.py records


def read_queue(sweep_dir: Path) -> dict[str, dict]:
    """queue.json of the sweep dir's local queue (sweep/queue.py; {} where none ran): {run name: its state, pid, exit
    code, ...}; a damaged one is a one-line ConfigError naming it and what to do."""
    path = sweep_dir / PLAN_DIR / QUEUE_FILE
    check = Check(path, f"{set_aside(path)}: status and the next launch then read each run's own dir")
    queue = read_json(check.path, check.fix, missing={})
    if not isinstance(queue, dict):
        raise check.fail(f"expected a mapping of run names to their states, got {type(queue).__name__}")
    for name, entry in queue.items():
        entry = check.mapping(name, entry)
        check.one_of(f"{name}: state", entry.get("state"), QUEUE_STATES)
        check.text(f"{name}: arm", entry.get("arm"), null=True)
        check.number(f"{name}: seed", entry.get("seed"), "", int, null=True)
        check.number(f"{name}: pid", entry.get("pid"), "> 0", int, null=True)
        check.number(f"{name}: returncode", entry.get("returncode"), "", int, null=True)
        for key in ("started", "ended"):
            check.number(f"{name}: {key}", entry.get(key), ">= 0", null=True)
    return queue


@dataclass
class RunStatus:
    name: str
    arm: str
    seed: int
    state: str
    detail: str = ""
    job_id: str | None = None


def _progress(run_dir: Path) -> str:
    """'step 40, val loss 2.531' from metrics.jsonl (the last step and the last val row)."""
    step, val = None, None
    try:
        for line in (run_dir / "metrics.jsonl").read_text().splitlines():
            row = json.loads(line)
            step = row.get("step", step)
            val = row.get("val/loss", val)
    except (OSError, ValueError):
        return "starting"
    if step is None:
        return "starting"  # metrics.jsonl made, no row in it yet
    return f"step {step}" + (f", val loss {val:.4g}" if isinstance(val, (int, float)) else "")


def _at(run_dir: Path) -> str:
    """'at step 40, val loss 2.531', or 'while starting' before its first row."""
    where = _progress(run_dir)
    return "while starting" if where == "starting" else f"at {where}"


def _last_line(*paths: Path) -> str:
    for path in paths:
        try:
            # the run's own last words, not the launcher's ("[submitit][INFO] - Exiting after successful completion")
            lines = [
                line.strip()
                for line in path.read_text(errors="replace").splitlines()
                if line.strip() and "][submitit][" not in line
            ]
        except OSError:
            continue
        if lines:
            return lines[-1][:300]
    return ""


def _job_error(folder: Path) -> str | None:
    """The error a finished submitit job returned: Hydra's launcher catches a run's exception and the job ends
    COMPLETED with a failed JobReturn in <id>_result.pkl (submitit's own file, written by this sweep's job)."""
    import pickle

    for path in folder.glob("*_result.pkl"):
        try:
            outcome, value = pickle.loads(path.read_bytes())
        except Exception:  # noqa: BLE001 - unreadable result: the logs say the rest
            continue
        if outcome == "error":
            return str(value).strip().splitlines()[-1][:300]
        status = getattr(value, "status", None)
        if getattr(status, "name", "") == "FAILED":
            return " ".join(str(getattr(value, "_return_value", "failed")).split())[:300]
    return None


def job_ids(sweep_dir: Path) -> dict[int, str]:
    """The run's index in plan.json -> its SLURM job id, from submitit's folders `<array>_<task>` (arrays in id order,
    their tasks one after another: the plan lists the runs in that order). Only the jobs of the plan's own launch:
    those of earlier launches (earlier_jobs.json, written with the plan) ran an earlier plan."""
    arrays: dict[int, dict[int, str]] = {}
    single = []
    earlier = _earlier_jobs(sweep_dir)
    for folder in (sweep_dir / SUBMITIT_DIR).glob("*"):
        if folder.name in earlier:
            continue
        array, _, task = folder.name.partition("_")
        if array.isdigit() and task.isdigit():
            arrays.setdefault(int(array), {})[int(task)] = folder.name
        elif folder.name.isdigit():
            single.append(folder.name)  # a launch of one run is a plain job, not an array
    ids: dict[int, str] = {}
    offset = 0
    for array_id in sorted(arrays):  # several arrays (one per resource group) were queued in the plan's order
        ids |= {offset + task: name for task, name in arrays[array_id].items()}
        offset += max(arrays[array_id]) + 1
    if not ids and len(single) == 1 and len(read_plan(sweep_dir)) == 1:
        ids[0] = single[0]
    return ids


def _earlier_jobs(sweep_dir: Path) -> set[str]:
    """The .submitit/ folders that predate the plan's launch (none recorded: a sweep dir from before the record)."""
    try:
        names = json.loads((sweep_dir / EARLIER_JOBS_FILE).read_text())
    except (OSError, ValueError):
        return set()
    return {n for n in names if isinstance(n, str)} if isinstance(names, list) else set()


def scheduler_states(ids: list[str]) -> dict[str, str]:
    """SLURM job id -> its state ("REQUEUED" while a requeued job waits or runs again: sacct's history has it); {}
    where no scheduler answers."""
    if not ids:
        return {}
    arrays = ",".join(sorted({i.split("_")[0] for i in ids}))
    if shutil.which("sacct"):
        cmd = ["sacct", "-n", "-P", "-X", "-D", "-o", "JobID,State", "-j", arrays]
    elif shutil.which("squeue"):
        cmd = ["squeue", "-h", "-r", "-o", "%i|%T", "-j", arrays]
    else:
        return {}
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    history: dict[str, list[str]] = {}
    for line in out.splitlines():
        job, _, state = line.partition("|")
        if state.split():
            history.setdefault(job.strip(), []).append(state.split()[0])
    states = {}
    for job, seen in history.items():
        now = seen[-1]
        requeued = "REQUEUED" in seen and SLURM_STATES.get(now) in ("pending", "running", "requeued")
        states[job] = "REQUEUED" if requeued else now
    return states


def sweep_status(
    sweep_dir: Path,
    arms: dict[str, list[int]] | None = None,
    lrs: list[float] | None = None,
    rungs: list[str] | None = None,
) -> list[RunStatus]:
    """The status of every run of the sweep dir's plan (plus `arms`' runs, at every lr of `lrs` or every ladder rung
    of `rungs`, never launched)."""
    plan = read_plan(sweep_dir)
    queue = read_queue(sweep_dir)
    ids = job_ids(sweep_dir) if not queue else {}
    sched = scheduler_states(list(ids.values()))
    refused = read_refused(sweep_dir)  # runs the last plan could not start: named as such, not as "never ran"
    out, seen = [], set()
    for index, entry in enumerate(plan):
        job = ids.get(index)
        seen.add(entry["name"])
        out.append(_one(sweep_dir, entry, queue.get(entry["name"], {}), sched.get(job or ""), job))
    for arm, seeds in (arms or {}).items():
        for seed in seeds:
            grid: list[float | None] = list(lrs) if lrs else [None]
            ladder: list[str | None] = list(rungs) if rungs else [None]
            for lr, rung in [(lr, rung) for lr in grid for rung in ladder]:
                name = run_name(arm, seed, lr, rung)
                if name not in seen:
                    entry = {"name": name, "arm": arm, "seed": seed, "subdir": run_subdir(arm, seed, lr, rung)}
                    status = _one(sweep_dir, entry, queue.get(name, {}), None, None, launched=False)
                    if status.state == "never ran" and entry["subdir"] in refused:
                        status.state, status.detail = "refused", f"cannot start: {refused[entry['subdir']]}"
                    out.append(status)
    return out


def status_of(sweep_dir: Path, more: dict[str, list[int]] | None = None) -> list[RunStatus]:
    """`gptlab-sweep status DIR`: every run its sweep.yaml defines and its plan lists, and each arm's `more` seeds
    (those an until-decided sweep's later looks ran); ConfigError for a folder that is not a sweep dir."""
    sweep = read_sweep(sweep_dir)
    if sweep is None:
        raise ConfigError(f"{sweep_dir}: not a gptlab-sweep dir (no {SWEEP_FILE})")
    ladder = [r.name for r in ladder_rungs(parse_ladder(sweep.ladder))] if sweep.ladder else None
    seeds = {arm: list(dict.fromkeys([*sweep.seeds, *(more or {}).get(arm, [])])) for arm in sweep.arms}
    return sweep_status(sweep_dir.resolve(), seeds, sweep.lrs, ladder)


def _one(sweep_dir: Path, entry: dict, queued: dict, sched: str | None, job: str | None, launched=True) -> RunStatus:
    run_dir = sweep_dir / (planned_subdir(entry) or "")
    status = RunStatus(entry["name"], entry["arm"], int(entry["seed"]), "never ran" if not launched else "pending")
    status.job_id = job
    summary = read_summary(run_dir / SUMMARY_FILE)
    log = sweep_dir / PLAN_DIR / "logs" / f"{entry['name']}.log"
    err_logs = sorted((sweep_dir / SUBMITIT_DIR / job).glob("*_log.err")) if job else []
    if summary.get("status") == "finished":
        status.state = "finished"
        val = summary.get("final_val_loss")
        status.detail = f"{summary.get('steps')} steps" + (f", val loss {val:.4g}" if val is not None else "")
    elif lock_held(run_dir / LOCK_FILE) or _live(queued) == "running":
        status.state, status.detail = "running", _progress(run_dir)
    elif sched in SLURM_STATES and SLURM_STATES[sched] != "finished":
        status.state = SLURM_STATES[sched]
        status.detail = _progress(run_dir) if status.state in ("running", "requeued") else ""
    elif sched == "COMPLETED" or (job and _job_error(sweep_dir / SUBMITIT_DIR / job)):
        # the job ended without a finished run: the launcher caught the run's error
        error = _job_error(sweep_dir / SUBMITIT_DIR / job) if job else None
        status.state, status.detail = "failed", error or _last_line(*err_logs, log, run_dir / "train.log")
    elif queued.get("state") in ("failed", "cancelled") or summary.get("status") in ("failed", "interrupted"):
        status.state = queued.get("state") or "failed"
        status.detail = _last_line(log, *err_logs, run_dir / "train.log")
    elif summary.get("status") == "preempted":
        status.state, status.detail = "requeued" if sched else "failed", "preempted " + _at(run_dir)
    if status.state in ("pending", "never ran"):
        _not_started(status, entry, queued, job, run_dir)
    if status.state == "failed" and not status.detail:
        status.detail = _last_line(log, *err_logs, run_dir / "train.log")
    code = queued.get("returncode")
    if status.state == "failed" and isinstance(code, int) and code < 0:  # a signal ended it: it wrote no error line
        said = f"; its last output: {status.detail}" if status.detail else ""
        status.detail = f"killed by {_signal_name(-code)} {_at(run_dir)}{said}"[:300]
    return status


def _live(queued: dict) -> str | None:
    """What of the local queue's record is still true: "running" while the run's recorded process lives, "pending"
    while the queue holding it unstarted lives; None otherwise (a process of another host counts as live)."""
    state = queued.get("state")
    if state == "running" and alive(queued.get("process", {"pid": queued.get("pid")})) is not False:
        return "running"
    if state == "pending" and alive(queued.get("queue")) is not False:
        return "pending"
    return None


def _not_started(status: RunStatus, entry: dict, queued: dict, job: str | None, run_dir: Path) -> None:
    """A run with nothing live of its own: pending while its queue, its scheduler job or the gptlab-sweep that
    launched it is there (a scheduler that does not answer counts as there), requeued once it has run; else
    stopped when it was launched or has run, and never ran otherwise."""
    ran = (run_dir / "provenance.json").is_file()
    launched = status.state == "pending"
    if _live(queued) == "pending" or job is not None or (launched and alive(entry.get("launcher")) is not False):
        status.state = "requeued" if ran else "pending"
        status.detail = "queued again " + _at(run_dir) if ran else ""  # it ran, and waits again
    elif launched or ran:
        gone = "the gptlab-sweep that launched it is gone"
        status.state = "stopped"
        status.detail = f"stopped {_at(run_dir)}: {gone}" if ran else f"not started: {gone}"


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def format_status(rows: list[RunStatus]) -> str:
    """One line per run, then the counts per state."""
    width = max((len(r.name) for r in rows), default=4)
    lines = [f"{r.name:<{width}}  {r.state:<9}  {r.detail}" + (f"  [job {r.job_id}]" if r.job_id else "") for r in rows]
    order = ("finished", "running", "requeued", "pending", "stopped", "failed", "cancelled", "refused", "never ran")
    counts = [(sum(r.state == state for r in rows), state) for state in order]
    lines.append(", ".join(f"{n} {state}" for n, state in counts if n))
    return "\n".join(lines)

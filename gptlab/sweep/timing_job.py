"""The timing session of a SLURM sweep as ONE job: submitted after the sweep's job arrays with a dependency
(`afterany:` every array, so it starts once every run of the launch ended, whatever their outcome), on one node with
one task and the resources of the baseline arm's runs (one GPU at most: a session times one process), running
`gptlab-sweep time DIR` there: every arm timed alone on that one machine, nothing else of the sweep running.

The job's submitit folder is <sweep dir>/.submitit/timing/<job id>/ (not a folder status maps to a run);
`.plan/timing_job.json` records it (job id, the arrays it waits for) for `status` and for the next launch, which
submits no second job while one is queued or running. The job's parameters are the launcher's (`hydra.launcher.*` as
the sweep's runs compose them: partition, account, qos, time limit, setup, requeue, ...), mapped to submitit the way
hydra-submitit-launcher maps them.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import cast

from gptlab.errors import ConfigError
from gptlab.sweep.layout import TIMING_JOB_DIR, TIMING_JOB_FILE
from gptlab.sweep.status import SLURM_STATES, scheduler_states
from gptlab.util.io import atomic_write_text
from gptlab.util.stored import read_json

JOB_NAME = "gptlab-timing"
# submitit's executor-independent parameters (hydra-submitit-launcher's BaseQueueConf); the others are slurm_<key>
BASE_KEYS = ("timeout_min", "cpus_per_task", "gpus_per_node", "tasks_per_node", "mem_gb", "nodes", "stderr_to_stdout")
# launcher keys that are no job parameter: the plugin's own, the array's, and the requeue count a command cannot use
NOT_JOB_KEYS = ("_target_", "submitit_folder", "array_parallelism", "max_num_timeout", "name")


def time_command(sweep_dir: Path) -> list[str]:
    """What the job runs: `gptlab-sweep time DIR` through this Python (as --detach starts gptlab-sweep)."""
    return [sys.executable, "-m", "gptlab.cli.sweep", "time", str(sweep_dir)]


def job_parameters(sweep_dir: Path, launch: list[str], overrides: list[str], after: list[str]) -> dict:
    """The submitit AutoExecutor parameters of the timing job: the launcher's as `overrides` (the baseline arm's run
    settings) and `launch` compose them, on one node, one task, at most one GPU, named JOB_NAME, and with
    `afterany:` the job ids in `after` (none: no dependency)."""
    from omegaconf import OmegaConf

    from gptlab.config.build import compose

    cfg = compose([*overrides, *launch, f"hydra.sweep.dir={sweep_dir}"])
    launcher = OmegaConf.to_container(cfg.hydra.launcher, resolve=True)  # ${hardware.*} as the runs resolve them
    plain = {str(k): v for k, v in cast(dict, launcher).items() if k not in NOT_JOB_KEYS}
    gpus = plain.get("gpus_per_node")
    plain |= {"nodes": 1, "tasks_per_node": 1, "gpus_per_node": min(int(gpus), 1) if gpus else gpus}
    params = {k if k in BASE_KEYS else f"slurm_{k}": v for k, v in plain.items()}
    params["name"] = JOB_NAME
    if after:
        params["slurm_dependency"] = "afterany:" + ":".join(after)
    return params


def submit(sweep_dir: Path, launch: list[str], overrides: list[str], after: list[str]) -> str:
    """Submit the timing job (job_parameters) and record it in .plan/timing_job.json; its job id. An earlier timing
    job still pending (it waits for an earlier launch's arrays) is cancelled: this one follows every array. Raises
    what submitit raises when sbatch refuses it."""
    import submitit

    earlier = job_state(sweep_dir)
    if earlier is not None and earlier[1] == "pending" and shutil.which("scancel"):  # it waits for older arrays only
        subprocess.run(["scancel", earlier[0]], check=False)
    executor = submitit.AutoExecutor(folder=str(sweep_dir / TIMING_JOB_DIR / "%j"), cluster="slurm")
    executor.update_parameters(**job_parameters(sweep_dir, launch, overrides, after))
    job = executor.submit(submitit.helpers.CommandFunction(time_command(sweep_dir), verbose=True))
    record = {"job": str(job.job_id), "after": list(after), "submitted": time.time()}
    (sweep_dir / TIMING_JOB_FILE).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(sweep_dir / TIMING_JOB_FILE, json.dumps(record) + "\n")
    return str(job.job_id)


def recorded_job(sweep_dir: Path) -> str | None:
    """The job id .plan/timing_job.json records (None: no timing job was submitted, or the record is unreadable)."""
    try:
        record = read_json(sweep_dir / TIMING_JOB_FILE, "it is rewritten at the next submission")
    except ConfigError:  # a damaged record names no job: the next launch submits one and rewrites it
        return None
    job = record.get("job") if isinstance(record, dict) else None
    return job if isinstance(job, str) and job else None


def job_state(sweep_dir: Path) -> tuple[str, str] | None:
    """(job id, its state as status words it: pending, running, requeued, finished, failed, cancelled; 'submitted'
    where no scheduler answers) of the recorded timing job; None without one."""
    job = recorded_job(sweep_dir)
    if job is None:
        return None
    state = scheduler_states([job]).get(job)
    return job, SLURM_STATES.get(state or "", "submitted")


def queued(sweep_dir: Path) -> str | None:
    """The recorded timing job's id while the scheduler says it is queued or running; else None (a job it does not
    know may be submitted again: a second job finds the session running, or finished, and times nothing twice)."""
    found = job_state(sweep_dir)
    return found[0] if found and found[1] in ("pending", "running", "requeued") else None

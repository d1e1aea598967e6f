"""Where a run of a local parallel sweep executes: its own CPU cores and its own GPU(s).

submitit's local executor (launcher=local) starts every run of a sweep at once and gives each the same
CUDA_VISIBLE_DEVICES=0..gpus_per_node-1 and no CPU binding, so without this every run would share GPU 0 and
each would start one torch thread per core of the machine. Run number k of the sweep (Hydra's job.num)
instead gets the k-th slice of `cpus_per_task` cores and of `gpus_per_node` GPUs. GPUs never wrap around: a
sweep with more runs than GPU slices is refused (two runs on one GPU risk running out of memory and measure
each other's speed). CPU cores do wrap around, since refusing would forbid every sweep wider than the machine,
with a warning that the runs sharing cores have incomparable speed figures. Under SLURM the scheduler does
this binding itself.
"""

from __future__ import annotations

import logging
import os
import subprocess

from gptlab.errors import ConfigError

log = logging.getLogger(__name__)

# The launching process (`gptlab-train -m ...`) records the GPUs it may use before submitit overwrites
# CUDA_VISIBLE_DEVICES for its children; the children inherit this variable.
LAUNCH_GPUS = "GPTLAB_LAUNCH_GPUS"


def remember_launch_gpus() -> None:
    """Called in every gptlab-train process; only the launching one (not a submitit child) records its GPUs."""
    if "SUBMITIT_EXECUTOR" not in os.environ and "CUDA_VISIBLE_DEVICES" in os.environ:
        os.environ.setdefault(LAUNCH_GPUS, os.environ["CUDA_VISIBLE_DEVICES"])


def slice_for_job(job_num: int, per_job: int, pool: list) -> list:
    """The job_num-th consecutive slice of `per_job` items from pool, wrapping around; [] if nothing asked."""
    if per_job <= 0 or not pool:
        return []
    per_job = min(per_job, len(pool))
    slots = len(pool) // per_job
    start = (job_num % slots) * per_job
    return pool[start : start + per_job]


def gpus_for_job(job_num: int, per_job: int, pool: list[str]) -> list[str]:
    """The job_num-th slice of `per_job` GPUs; a one-line ConfigError when it would share a GPU with another run."""
    if per_job <= 0 or not pool:
        return []
    slots = len(pool) // per_job
    if job_num >= slots:
        raise ConfigError(
            f"hydra.launcher.gpus_per_node={per_job}: this machine has {len(pool)} GPU(s), room for "
            f"{slots} run(s) at a time, but this is run {job_num + 1} of the local sweep; sweep fewer "
            "runs at once, lower gpus_per_node, or use launcher=slurm"
        )
    return pool[job_num * per_job : (job_num + 1) * per_job]


def cores_for_job(job_num: int, per_job: int, pool: list[int]) -> list[int]:
    """The job_num-th slice of `per_job` cores, wrapping around with a warning (shared cores skew speed figures)."""
    cores = slice_for_job(job_num, per_job, pool)
    if cores and job_num >= len(pool) // len(cores):
        log.warning(
            "local sweep run %d shares CPU cores %s with an earlier run (%d cores, %d per run): its speed "
            "figures are not comparable with runs that had their cores to themselves",
            job_num,
            cores,
            len(pool),
            per_job,
        )
    return cores


def _machine_gpus() -> list[str]:
    """GPUs this sweep may use: the launcher's CUDA_VISIBLE_DEVICES, else every GPU nvidia-smi lists."""
    if os.environ.get(LAUNCH_GPUS) is not None:
        return [g for g in os.environ[LAUNCH_GPUS].split(",") if g.strip()]
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"], capture_output=True, text=True, timeout=20
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in out.stdout.splitlines() if line.strip()] if out.returncode == 0 else []


def place_local_job(job_num: int, cpus_per_task: int | None, gpus_per_node: int | None) -> dict:
    """Bind this process (run `job_num` of a local submitit sweep) to its cores and GPUs; returns what it got.

    Must run before CUDA is initialised (CUDA_VISIBLE_DEVICES is read once, at the first CUDA call).
    """
    placed: dict = {}
    cores = cores_for_job(job_num, int(cpus_per_task or 0), sorted(os.sched_getaffinity(0)))
    if cores:
        os.sched_setaffinity(0, cores)
        placed["cpus"] = cores
    gpus = gpus_for_job(job_num, int(gpus_per_node or 0), _machine_gpus())
    if gpus:
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
        placed["gpus"] = gpus
    if placed:
        log.info("local sweep run %d placed on %s", job_num, placed)
    return placed


def launch_rank() -> int:
    """This process's rank as its launcher set it (torchrun's RANK, a SLURM task's SLURM_PROCID), known before any
    process group exists; 0 for a lone process."""
    return int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")))

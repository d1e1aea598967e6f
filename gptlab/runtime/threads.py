"""How many torch threads one process uses when hardware.threads is unset, and where that number came from.

Apart from gptlab.runtime.hardware (which imports torch) so that a sweep can size its local queue's slots without
importing torch.
"""

from __future__ import annotations

import os


def threads_for_job(local_world: int = 1) -> int:
    """Torch threads for one process when hardware.threads is unset; `local_world` = ranks on this node."""
    return thread_choice(local_world)[0]


def thread_choice(local_world: int = 1) -> tuple[int, str]:
    """(torch threads for one process when hardware.threads is unset, where the number came from).

    GPTLAB_THREADS and OMP_NUM_THREADS are explicit per-process counts (a sweep's local queue sets both for each
    run's slot). SLURM_CPUS_PER_TASK is already per task, i.e. per rank when SLURM starts the ranks, so it is not
    divided again (only torchrun inside one task splits it). Else the CPU affinity mask, split between local ranks.
    """
    for name in ("GPTLAB_THREADS", "OMP_NUM_THREADS"):
        value = os.environ.get(name, "").strip()
        if value.isdigit() and int(value) >= 1:
            return int(value), name
    slurm = os.environ.get("SLURM_CPUS_PER_TASK")
    if slurm and "TORCHELASTIC_RUN_ID" not in os.environ:
        return max(1, int(slurm)), "SLURM_CPUS_PER_TASK"
    total = int(slurm) if slurm else len(os.sched_getaffinity(0))
    why = "SLURM_CPUS_PER_TASK" if slurm else "cores this process may use"
    return max(1, total // max(1, local_world)), why + (f" / {local_world} local ranks" if local_world > 1 else "")

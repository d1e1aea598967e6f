"""Launching a sweep's pending runs and waiting on them: the local queue, one Hydra multirun per resource group (one
job array each under launcher=slurm), and --detach (the sweep in its own session, back once its runs are queued).

`.plan/launched.json` is written once the runs are queued: --detach waits for it and reports its jobs or pid.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from gptlab.errors import ConfigError
from gptlab.runtime.threads import thread_choice
from gptlab.state.layout import check_folder_output, resolve_path, shown
from gptlab.sweep import timing_job
from gptlab.sweep.design import Rung
from gptlab.sweep.layout import PLAN_DIR, run_name, run_subdir
from gptlab.sweep.plan import COMMANDS, PlannedRun, launch_command, write_plan
from gptlab.sweep.queue import Queue, Slots, plan_slots
from gptlab.sweep.status import job_ids, sweep_status
from gptlab.util.io import atomic_write_text
from gptlab.util.paths import SWEEP_RUN_GROUP

LAUNCHED = "launched.json"  # in PLAN_DIR: written once the runs are queued (what --detach waits for)
RESOURCE_KEYS = ("nodes", "tasks_per_node", "cpus_per_task", "gpus_per_node")  # hardware.* the launcher presets read


def check_paths(sweep_dir: Path, arms: list[str], seeds: list[int], lrs=None, ladder: list[Rung] | None = None) -> None:
    """Before anything is written: the sweep dir is neither a run dir nor inside one (resolved: symlinks, '..'), and
    every run's dir and generated config name fits the file system's 255 bytes (else every run would fail); it is
    no file, and it holds no '${' (Hydra would read hydra.sweep.dir=... as an interpolation)."""
    if "${" in str(sweep_dir):
        raise ConfigError(
            f"--out={shown(sweep_dir)}: holds '${{', which Hydra reads as an interpolation in hydra.sweep.dir and each "
            "run's hydra.run.dir; allowed: a path without '${'"
        )
    check_folder_output(sweep_dir, "--out")
    steps: list[str | None] = [rung.name for rung in ladder] if ladder else [None]
    for arm, seed, lr, step in itertools.product(arms, seeds, lrs or [None], steps):
        resolve_path(sweep_dir / run_subdir(arm, seed, lr, step), "arm name")
        resolve_path(sweep_dir / PLAN_DIR / SWEEP_RUN_GROUP / f"{run_name(arm, seed, lr, step)}.yaml", "arm name")


def launcher(launch: list[str]) -> str | None:
    """The launcher preset the launch settings pick (the last launcher=X), None for none."""
    picked = [o.split("=", 1)[1] for o in launch if o.lstrip("+").split("=", 1)[0] == "launcher"]
    return picked[-1] if picked else None


def is_local(launch: list[str]) -> bool:
    """True when the runs go through the local queue (launcher=local, or no launcher at all)."""
    return launcher(launch) in (None, "local")


def local_slots(runs: list[PlannedRun], command: str) -> tuple[Slots, int]:
    """(slots, threads per run) for the local queue, from the environment or the first run's hardware settings."""
    from gptlab.config.build import compose

    cfg = compose(list(runs[0].overrides), COMMANDS[command][2])
    cores = sorted(os.sched_getaffinity(0))
    threads, _ = thread_choice()
    explicit = any(os.environ.get(v) for v in ("GPTLAB_THREADS", "OMP_NUM_THREADS", "SLURM_CPUS_PER_TASK"))
    threads = threads if explicit else int(cfg.hardware.get("threads") or len(cores))
    gpus: list[str] = []
    per_run = 0
    if str(cfg.hardware.get("device", "cpu")).startswith("cuda"):
        import torch

        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        gpus = visible.split(",") if visible else [str(i) for i in range(torch.cuda.device_count())]
        per_run = int(cfg.hardware.get("gpus_per_node") or 1)
    return plan_slots(threads, per_run, cores, gpus), threads


def _write_launched(sweep_dir: Path, record: dict) -> None:
    atomic_write_text(sweep_dir / PLAN_DIR / LAUNCHED, json.dumps(record) + "\n")


def run_local(
    runs: list[PlannedRun],
    sweep_dir: Path,
    slots: Slots,
    threads: int,
    fail_fast: bool,
    command: str,
    warm: bool = True,
) -> list[str]:
    """The local queue: at most as many runs at once as the machine has slots; returns the failed runs' names.
    warm: CPU runs fork from one interpreter that imported torch (gptlab.sweep.queue); False: each starts fresh."""
    queue = Queue(runs, sweep_dir, slots, threads, fail_fast=fail_fast, module=COMMANDS[command][1], warm=warm)
    _write_launched(sweep_dir, {"launcher": "local", "pid": os.getpid(), "runs": [r.name for r in runs]})
    return queue.run()


def _resource_groups(runs: list[PlannedRun], command: str) -> list[tuple[list[str], list[PlannedRun]]]:
    """Runs grouped by the launcher resources their hardware asks for, each with the overrides that request them.

    A launcher sizes one job array once, from the sweep-level config, while each run's hardware comes from its own
    generated config: without these overrides an arm with hardware=ddp would be submitted with the default's
    resources. Usually one group (one array); arms with different resources get one array each, launched together.
    """
    from gptlab.config.build import compose

    groups: dict[tuple, list[PlannedRun]] = {}
    for run in runs:
        hw = compose(list(run.overrides), COMMANDS[command][2]).hardware
        key = tuple((k, hw.get(k)) for k in RESOURCE_KEYS if hw.get(k) is not None)
        groups.setdefault(key, []).append(run)
    return [([f"hardware.{k}={v}" for k, v in key], members) for key, members in groups.items()]


def hydra_launches(
    runs: list[PlannedRun], sweep_dir: Path, launch: list[str], command: str
) -> list[tuple[list[str], list[PlannedRun]]]:
    """One multirun command per resource group, with the runs it launches (in plan order)."""
    return [
        (launch_command(members, sweep_dir, [*launch, *resources], COMMANDS[command][0]), members)
        for resources, members in _resource_groups(runs, command)
    ]


def run_hydra(
    launches: list[tuple[list[str], list[PlannedRun]]],
    sweep_dir: Path,
    launch: list[str],
    fail_fast: bool,
    command: str,
    on_queued: Callable[[list[str]], None] | None = None,
) -> list[str]:
    """Every launch of `hydra_launches` together, polled until they end; fail-fast cancels the rest (and the sweep's
    timing job). Returns the names of the runs that failed (with fail-fast: those seen failed so far).
    `on_queued(arrays)` hears the scheduler job ids of the arrays once every run is queued (the timing job's
    dependency)."""
    runs = [run for _, members in launches for run in members]
    write_plan(sweep_dir, runs)  # plan order = array order
    procs = []
    for cmd, members in launches:
        before = len(job_ids(sweep_dir))
        # the same command through this Python: works without the venv's bin/ on PATH
        procs.append(subprocess.Popen([sys.executable, "-m", COMMANDS[command][1], *cmd[1:]]))
        while len(launches) > 1 and procs[-1].poll() is None and len(job_ids(sweep_dir)) < before + len(members):
            time.sleep(0.5)  # the next array only once this one is queued: array ids follow the plan's order
    launched = False
    while any(proc.poll() is None for proc in procs):
        time.sleep(1.0)
        ids = job_ids(sweep_dir)
        if not launched and len(ids) >= len(runs):
            launched = True
            _queued(sweep_dir, launch, ids, on_queued)
        failed = [s.name for s in sweep_status(sweep_dir) if s.state == "failed"]
        if failed and fail_fast:
            arrays = _arrays(ids) + ([job] if (job := timing_job.queued(sweep_dir)) else [])
            if arrays and shutil.which("scancel"):
                subprocess.run(["scancel", *arrays], check=False)
            for proc in procs:
                proc.terminate()
                proc.wait()
            return failed
    if not launched:  # every run ended before a poll saw them queued
        _queued(sweep_dir, launch, job_ids(sweep_dir), on_queued)
    if any(proc.returncode for proc in procs):
        return [s.name for s in sweep_status(sweep_dir) if s.state != "finished"]
    return []


def _arrays(ids: dict[int, str]) -> list[str]:
    """The scheduler job ids of the arrays (or lone jobs) behind `job_ids`' run ids (<array>_<task>)."""
    return sorted({i.split("_")[0] for i in ids.values()})


def _queued(
    sweep_dir: Path, launch: list[str], ids: dict[int, str], on_queued: Callable[[list[str]], None] | None
) -> None:
    """Every run is queued: launched.json (what --detach waits for) after on_queued heard the arrays."""
    if on_queued is not None:
        on_queued(_arrays(ids))
    _write_launched(sweep_dir, {"launcher": launcher(launch), "jobs": sorted(ids.values())})


def detach(argv: list[str], sweep_dir: Path, timeout_s: float = 600.0) -> tuple[int, str]:
    """Start `gptlab-sweep ARGV` (less --detach) in its own session; back once its runs are queued, its process
    ended, or timeout_s passed, with (exit code, what to tell the user)."""
    folder = sweep_dir / PLAN_DIR
    folder.mkdir(parents=True, exist_ok=True)
    (folder / LAUNCHED).unlink(missing_ok=True)
    log_path = folder / "sweep.log"
    with open(log_path, "ab") as log:
        child = subprocess.Popen(
            [sys.executable, "-m", "gptlab.cli.sweep", *[a for a in argv if a != "--detach"]],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # survives the shell that started it (logout, Ctrl-C)
        )
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (folder / LAUNCHED).is_file():
            record = json.loads((folder / LAUNCHED).read_text())
            where = f"jobs {' '.join(record['jobs'])}" if record.get("jobs") else f"local queue, pid {child.pid}"
            told = f"sweep dir: {sweep_dir}\nqueued: {where}\nlog: {log_path}\nstatus: gptlab-sweep status {sweep_dir}"
            return 0, told
        if child.poll() is not None:
            tail = log_path.read_text(errors="replace").strip().splitlines()[-5:]
            return child.returncode or 0, "\n".join(tail)
        time.sleep(0.2)
    return 0, f"sweep dir: {sweep_dir}\nstill launching (pid {child.pid}); log: {log_path}"

"""The local queue: a sweep's runs on this machine, at most as many at a time as it has slots.

A slot is one GPU per run on a GPU box (a run needing k GPUs takes k), and on a CPU box `threads` cores, so
`floor(cores / threads)` runs share the machine without oversubscribing it (every run taking every core as torch
threads made a sweep of small runs slower all at once than one after another). Each run gets its slot's cores as
its CPU affinity, OMP_NUM_THREADS = GPTLAB_THREADS = threads, and its slot's GPUs as CUDA_VISIBLE_DEVICES; its
output goes to `<sweep dir>/.plan/logs/<arm>__seed<k>.log`. `.plan/queue.json` holds every run's state (pending,
with the queue's own process; running, with the run's process; finished / failed with its exit code), rewritten at
each change, for `gptlab-sweep status`, which believes a "pending" or "running" only while the process recorded
with it lives (gptlab/sweep/process.py): a queue killed with kill -9 records nothing more, and its runs are then
launched again by the next `gptlab-sweep` of the sweep. Entries of runs an earlier launch started are kept.

On a CPU box the runs start from a warm interpreter (gptlab.runtime.forkserver: torch and
Hydra imported once for the whole queue, ~3 s less per run on 2 cores) as `python -m MODULE ARGS` with the same
environment, affinity, log and exit status; `warm=False` (`gptlab-sweep --fresh-interpreters`) starts each as a
fresh interpreter. GPU runs always start fresh: their CUDA_VISIBLE_DEVICES differ per slot, and a process that
owns GPUs is nothing to fork from.

While the sweep's timing session runs (its lock, <sweep dir>/.timing.lock, held: gptlab/study/timing.py), the queue
starts no run: a timing window has the machine to itself (a second launch of the sweep waits for it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from gptlab.errors import ConfigError
from gptlab.runtime.cpu_load import SWEEP_PID_ENV
from gptlab.runtime.forkserver import Forked, ForkServer
from gptlab.state.layout import lock_held
from gptlab.sweep.layout import PLAN_DIR, QUEUE_FILE, TIMING_LOCK
from gptlab.sweep.plan import PlannedRun, single_command
from gptlab.sweep.process import record
from gptlab.sweep.status import read_queue
from gptlab.util.io import atomic_write_text


@dataclass
class Slots:
    """What one run may use: CPU cores (its affinity) and GPU ids; `count` runs fit at once."""

    cores: list[list[int]]
    gpus: list[list[str]] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.gpus) if self.gpus else len(self.cores)


def plan_slots(threads: int, gpus_per_run: int, cores: list[int], gpus: list[str]) -> Slots:
    """Slots for runs of `threads` CPU threads (and `gpus_per_run` GPUs each when > 0) on these cores and GPUs."""
    threads = max(1, min(threads, len(cores)))
    per_core = [cores[i : i + threads] for i in range(0, len(cores) - threads + 1, threads)]
    if gpus_per_run <= 0:
        return Slots(per_core)
    per_gpu = [gpus[i : i + gpus_per_run] for i in range(0, len(gpus) - gpus_per_run + 1, gpus_per_run)]
    if not per_gpu:
        return Slots(per_core[:1])  # fewer GPUs than one run needs: one at a time (it fails with its own message)
    # a GPU run still needs CPU threads: share the cores out between the GPU slots
    share = max(1, len(cores) // len(per_gpu))
    return Slots([cores[i * share : (i + 1) * share] or cores for i in range(len(per_gpu))], per_gpu)


class Queue:
    """Runs `runs` (in order) through `slots`."""

    def __init__(
        self,
        runs: list[PlannedRun],
        sweep_dir: Path,
        slots: Slots,
        threads: int,
        fail_fast: bool = False,
        module: str = "gptlab.cli.train",
        warm: bool = True,
    ):
        self.runs, self.sweep_dir, self.slots, self.threads, self.fail_fast = runs, sweep_dir, slots, threads, fail_fast
        self.module = module  # the run's entry point: gptlab.cli.train, or gptlab.cli.decode for `command: decode`
        # every CPU run of the queue, a lone relaunched one too: forked and fresh runs differ in peak memory
        self.warm = warm and not slots.gpus
        self.server: ForkServer | None = None
        self.told = False  # said once that runs wait for the sweep's timing session
        self.folder = sweep_dir / PLAN_DIR
        (self.folder / "logs").mkdir(parents=True, exist_ok=True)
        mine = record(os.getpid())
        self.state = {r.name: {"state": "pending", "arm": r.arm, "seed": r.seed, "queue": mine} for r in runs}
        self.state = {**self._earlier(), **self.state}

    def _earlier(self) -> dict[str, dict]:
        """The entries an earlier launch left (a run it started may still be live); none where unreadable."""
        try:
            return read_queue(self.sweep_dir)
        except ConfigError:
            return {}  # damaged: this launch's record replaces it

    def _save(self) -> None:
        atomic_write_text(self.folder / QUEUE_FILE, json.dumps(self.state, indent=1) + "\n")

    def _env(self, slot: int) -> dict[str, str]:
        env = dict(os.environ, OMP_NUM_THREADS=str(self.threads), GPTLAB_THREADS=str(self.threads))
        env[SWEEP_PID_ENV] = str(os.getpid())  # siblings' load is counted apart from foreign load (cpu_load.py)
        if self.slots.gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(self.slots.gpus[slot])
        return env

    def _start_server(self) -> None:
        """The warm interpreter every run forks from (started once, before the first run; ~3 s of imports)."""
        self.server = ForkServer(self._env(0))
        if self.server.problem:
            print(f"fork server off ({self.server.problem}): runs start as fresh interpreters", file=sys.stderr)

    def _start(self, run: PlannedRun, slot: int) -> subprocess.Popen | Forked:
        cores, env = self.slots.cores[slot], self._env(slot)
        args = single_command(run, self.sweep_dir)[1:]
        with open(self.folder / "logs" / f"{run.name}.log", "ab") as log:
            proc: subprocess.Popen | Forked | None = None
            if self.server is not None:
                stdio = (0, log.fileno(), log.fileno())  # stdin the queue's own, as Popen leaves it
                proc = self.server.start(self.module, args, cwd=None, env=env, stdio=stdio, cores=cores)
            if proc is None:  # no server, or it went away: a fresh interpreter
                proc = subprocess.Popen(
                    [sys.executable, "-m", self.module, *args],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    preexec_fn=lambda: os.sched_setaffinity(0, cores),
                )
        self.state[run.name] |= {
            "state": "running",
            "pid": proc.pid,
            "process": record(proc.pid),
            "slot": slot,
            "cores": cores,
            "started": time.time(),
        }
        self._save()
        return proc

    def _timing_window(self) -> bool:
        """True while the sweep's timing session runs (its lock held): no run of the sweep starts during a window."""
        held = lock_held(self.sweep_dir / TIMING_LOCK)
        if held and not self.told:
            print(f"waiting for the sweep's timing session to end ({self.sweep_dir / TIMING_LOCK} held)", flush=True)
        self.told = self.told or held
        return held

    def run(self, poll_s: float = 0.2) -> list[str]:
        """Run everything; returns the names of the runs that failed (and, with fail_fast, stops at the first)."""
        waiting, running, failed = list(self.runs), {}, []  # type: list[PlannedRun], dict, list[str]
        free = list(range(self.slots.count))
        self._save()
        if self.warm:
            self._start_server()
        try:
            while waiting or running:
                held = bool(waiting) and self._timing_window()
                while waiting and free and not held and not (failed and self.fail_fast):
                    slot = free.pop(0)
                    run = waiting.pop(0)
                    running[run.name] = (self._start(run, slot), slot)
                if not running and not held:
                    break
                time.sleep(poll_s)
                for name, (proc, slot) in list(running.items()):
                    if proc.poll() is None:
                        continue
                    del running[name]
                    free.append(slot)
                    state = "finished" if proc.returncode == 0 else "failed"
                    self.state[name] |= {"state": state, "returncode": proc.returncode, "ended": time.time()}
                    failed += [name] if state == "failed" else []
                    self._save()
                if failed and self.fail_fast:
                    for proc, _ in running.values():
                        proc.terminate()  # SIGTERM: each run checkpoints and stops ("preempted")
                    for name, (proc, _) in running.items():
                        proc.wait()
                        self.state[name] |= {"state": "cancelled", "returncode": proc.returncode}
                    for run in waiting:
                        self.state[run.name]["state"] = "cancelled"
                    self._save()
                    return failed
        finally:
            for proc, _ in running.values():
                if proc.poll() is None:
                    proc.terminate()
            if self.server is not None:
                self.server.stop()  # the runs it forked are not its children: they end as they would anyway
        return failed

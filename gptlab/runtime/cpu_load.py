"""Outside load: the share of the machine's cores that OTHER processes used while a run trained (Linux /proc).

A run's speed figures are only as good as the machine was quiet; `LoadSampler` lets the loop record how
busy it was, so gptlab-compare can flag speed figures taken under load. Pure stdlib; None off Linux.

A run of gptlab-sweep's local queue shares the machine with its sibling runs on purpose (one slot each, arms
interleaved so siblings are spread over arms). The queue exports its pid as GPTLAB_SWEEP_PID; the sampler then counts
the queue's process tree apart: `outside` is foreign load only (what no sweep design controls), `sibling` the other
runs of the same sweep. Without that split every packed run read as ~90 % "under load" and no noise floor could be
stored on a machine that held nothing but the sweep.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

PROC = Path("/proc")
SWEEP_PID_ENV = "GPTLAB_SWEEP_PID"  # set by gptlab-sweep's local queue for its runs: the root of the sweep's tree
# An interval shorter than this many jiffies per core is too coarse (1 jiffy = 10 ms): keep accumulating.
MIN_TICKS_PER_CORE = 20
# /proc/stat cpu fields counted as busy: user nice system irq softirq steal (idle and iowait are not;
# guest time is already inside user).
_BUSY_FIELDS = (0, 1, 2, 5, 6, 7)


def machine_ticks(proc: Path = PROC) -> tuple[int, int, int] | None:
    """(busy, total, n_cores) jiffies summed over all cores from /proc/stat; None when unreadable."""
    try:
        lines = (proc / "stat").read_text().splitlines()
    except OSError:
        return None
    n_cores = sum(1 for line in lines if line.startswith("cpu") and line[3:4].isdigit())
    head = next((line for line in lines if line.startswith("cpu ")), None)
    if head is None or not n_cores:
        return None
    fields = [int(v) for v in head.split()[1:]]
    return sum(fields[i] for i in _BUSY_FIELDS if i < len(fields)), sum(fields[:8]), n_cores


def _process_ticks(pid: str, proc: Path) -> int:
    """utime + stime + cutime + cstime of one process (waited-for children included); 0 if it is gone."""
    try:
        text = (proc / pid / "stat").read_text()
    except OSError:
        return 0
    # The command name may hold spaces and parentheses: fields start after the last ')'.
    rest = text[text.rfind(")") + 2 :].split()
    return sum(int(v) for v in rest[11:15])  # fields 14..17 of proc(5)


def _children(pid: str, proc: Path) -> list[str]:
    """Live child pids of every thread of a process (CONFIG_PROC_CHILDREN); [] when the kernel lacks it."""
    out: list[str] = []
    try:
        tasks = list((proc / pid / "task").iterdir())
    except OSError:
        return out
    for task in tasks:
        try:
            out += (task / "children").read_text().split()
        except OSError:
            continue
    return out


def own_ticks(proc: Path = PROC, pid: str = "self") -> int:
    """Jiffies used by this process and its live descendants (data workers are ours, not outside load)."""
    total, todo, seen = 0, [pid], set()
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        total += _process_ticks(current, proc)
        todo += _children(current, proc)
    return total


class LoadSampler:
    """`start()`, then `sample()` every few steps; `mean()` = time-weighted outside share of all cores (0..1)."""

    def __init__(
        self,
        machine: Callable[[], tuple[int, int, int] | None] = machine_ticks,
        own: Callable[[], int] = own_ticks,
        sweep: Callable[[], int] | None = None,
    ):
        self._machine, self._own = machine, own
        self._sweep = sweep or own  # the sweep's whole tree (this run's siblings with it); no sweep: just ours
        self._ref: tuple[int, int, int, int, int] | None = None  # (busy, total, n_cores, own, sweep) at the start
        self.outside_ticks = 0  # foreign processes' jiffies over the closed intervals
        self.sibling_ticks = 0  # the same sweep's other runs' jiffies over the closed intervals
        self.total_ticks = 0  # all cores' jiffies (busy + idle) over the closed intervals
        self.own_ticks = 0  # this process tree's jiffies over the closed intervals

    def _read(self) -> tuple[int, int, int, int, int] | None:
        machine = self._machine()
        return None if machine is None else (*machine, self._own(), self._sweep())

    def start(self) -> None:
        """Open the first interval now (call when training starts; earlier intervals are forgotten)."""
        self._ref = self._read()
        self.outside_ticks = self.sibling_ticks = self.total_ticks = self.own_ticks = 0

    def sample(self, force: bool = False) -> None:
        """Close the open interval if it is long enough (or `force`), adding its ticks; cheap: 2-3 small reads."""
        if self._ref is None:
            return
        now = self._read()
        if now is None:
            return
        busy, total, _, own, sweep = (a - b for a, b in zip(now, self._ref))
        if total <= 0 or (not force and total < MIN_TICKS_PER_CORE * now[2]):
            return
        # Our own ticks can exceed the busy delta by a jiffy or two of rounding; never below 0 outside.
        sweep = max(sweep, own)
        self.outside_ticks += max(0, busy - sweep)
        self.sibling_ticks += max(0, min(sweep, busy) - own)
        self.total_ticks += total
        self.own_ticks += max(0, own)
        self._ref = now

    def mean(self) -> float | None:
        """Mean outside share since start() (closing the open interval first); None off Linux or before start()."""
        self.sample(force=True)
        if not self.total_ticks:
            return None
        return min(1.0, self.outside_ticks / self.total_ticks)

    def sibling_share(self) -> float | None:
        """The same sweep's other runs' mean share of all cores over the same intervals (0 outside a sweep)."""
        return min(1.0, self.sibling_ticks / self.total_ticks) if self.total_ticks else None

    def own_share(self) -> float | None:
        """This process tree's mean share of all cores over the same intervals (what `mean()` leaves out)."""
        return self.own_ticks / self.total_ticks if self.total_ticks else None


def job_sampler(local_world: int = 1) -> LoadSampler:
    """A sampler whose "own" is this job: with several local ranks, the launcher's tree (torchrun, slurmstepd).

    Sibling ranks are not our descendants, so counting only our own tree would call them outside load.
    """
    queue = os.environ.get(SWEEP_PID_ENV, "")
    sweep = (lambda: own_ticks(pid=queue)) if queue.isdigit() and (PROC / queue).is_dir() else None
    if local_world > 1:
        parent = str(os.getppid())
        return LoadSampler(own=lambda: own_ticks(pid=parent), sweep=sweep)
    return LoadSampler(sweep=sweep)


def available() -> bool:
    """True where /proc gives the counters the sampler needs (Linux)."""
    return machine_ticks() is not None and os.path.exists(PROC / "self" / "stat")


def load_at_start() -> str:
    """The machine's run-queue load over the last minute per core, as a phrase for a run's first lines (instant:
    /proc/loadavg; a run on a busy machine is slower, and says so before its first step)."""
    try:
        load, cores = os.getloadavg()[0], os.cpu_count() or 1
    except OSError:
        return "machine load unknown"
    busy = "; other processes will slow this run" if load / cores > 0.5 else ""
    return f"machine load {load:.2f} over the last minute on {cores} cores{busy}"

"""gptlab-sweep's commands on a sweep dir, and what a launch says and does of the sweep's timing session.

- `gptlab-sweep status DIR`: each run's state (gptlab/sweep/status.py), then the timing session's;
- `gptlab-sweep time DIR`: the sweep's timing session (gptlab/study/timing.py) run or finished, one line per window
  as it goes, then a summary;
- a launch: the session after the local queue's last run, or as one SLURM job after the arrays
  (gptlab/sweep/timing_job.py), unless --no-timing (or GPTLAB_SWEEP_TIMING=off).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from gptlab.cli import fail
from gptlab.compare.studies.until_decided import seeds_run
from gptlab.errors import ConfigError
from gptlab.study import timing as study
from gptlab.sweep import timing_job
from gptlab.sweep.launch import launcher
from gptlab.sweep.plan import IN_FLIGHT, is_launch_setting, planned_overrides
from gptlab.sweep.status import format_status, status_of

if TYPE_CHECKING:
    from gptlab.sweep.spec import Sweep

TIMING_ENV = "GPTLAB_SWEEP_TIMING"  # off: every launch as with --no-timing (a test suite, a machine for loss only)


def timing_on(no_timing: bool) -> bool:
    """False under --no-timing or GPTLAB_SWEEP_TIMING=off; a value other than on/off is one line, exit 2."""
    value = os.environ.get(TIMING_ENV, "on").strip().lower() or "on"
    if value not in ("on", "off"):
        fail(f"gptlab-sweep: {TIMING_ENV}={value!r}; allowed: on, off")
    return not no_timing and value == "on"


def window_line(name: str, w: dict) -> str:
    """One timed window: round, arm (A/A: the baseline's second window), median step time, outside load."""
    load = w.get("outside_load")
    shown = f"{100 * load:.0f}%" if isinstance(load, (int, float)) else "not measured"
    aa = " (A/A)" if w.get("repeat") else ""
    return f"[{name}] timing round {w['round'] + 1}, {w['arm']}{aa}: {w['step_ms_median']:.2f} ms/step, outside load {shown}"


def summary_lines(name: str, done: study.Timed) -> list[str]:
    """Which arms were timed (baseline first), in how many rounds and windows, what was left out and why, the file."""
    plan, windows = done.doc["plan"], len(done.doc["windows"])
    arms = ", ".join(a.name for a in done.arms)
    lines = [
        f"[{name}] timed {len(done.arms)} arms ({arms}; baseline {done.baseline}): {plan['rounds']} rounds, "
        f"{windows} windows of {plan['steps']} steps after {plan['warmup']} warm-up ({done.timed_now} timed now)"
    ]
    if done.left_out:
        lines.append(f"[{name}] left out (no finished run to build it from): {', '.join(done.left_out)}")
    if done.earlier is not None:
        lines.append(f"[{name}] the earlier session timed other arms or runs: moved to {done.earlier}")
    lines.append(f"[{name}] timing: {done.path} (gptlab-compare reads it)")
    return lines


def run_session(name: str, sweep_dir: Path, **given) -> None:
    """Time the sweep (study.timing.time_sweep) printing each window and the summary; ConfigError propagates."""
    done = study.time_sweep(sweep_dir, **given, on_window=lambda w: print(window_line(name, w), flush=True))
    for line in summary_lines(name, done):
        print(line, flush=True)


def time_main(argv: list[str]) -> int:
    """gptlab-sweep time DIR: run (or finish) the sweep's timing session; one-line errors exit 2."""
    parser = argparse.ArgumentParser(prog="gptlab-sweep time", description=time_main.__doc__)
    parser.error = lambda message: fail(f"gptlab-sweep time: {message}")  # type: ignore[method-assign]
    parser.add_argument("sweep_dir", type=Path)
    parser.add_argument("--rounds", type=int, help="rounds (default 5, or the stored session's; more may be added)")
    parser.add_argument("--steps", type=int, help="timed steps per window (default: 30 on CPU, 50 on CUDA)")
    parser.add_argument("--warmup", type=int, help="untimed steps before each window's (default: 5 CPU, 10 CUDA)")
    parser.add_argument(
        "--baseline", help="the arm speed-ups are against (default: the stored session's, else the sweep's first arm)"
    )
    args = parser.parse_args(argv)
    name = args.sweep_dir.name
    given = {"rounds": args.rounds, "steps": args.steps, "warmup": args.warmup, "baseline": args.baseline}
    try:
        run_session(name, args.sweep_dir, **given)
    except ConfigError as err:
        fail(f"gptlab-sweep time: {err}")
    return 0


def status_main(argv: list[str]) -> int:
    """gptlab-sweep status DIR: each run's state, read from the run dirs, the local queue and the scheduler."""
    parser = argparse.ArgumentParser(prog="gptlab-sweep status", description=status_main.__doc__)
    parser.error = lambda message: fail(f"gptlab-sweep status: {message}")  # type: ignore[method-assign]
    parser.add_argument("sweep_dir", type=Path)
    args = parser.parse_args(argv)
    try:
        rows = status_of(args.sweep_dir, seeds_run(args.sweep_dir))  # an until-decided sweep's later looks too
    except ConfigError as err:
        fail(err)
    print(format_status(rows))
    line = state_line(args.sweep_dir, busy=any(r.state in IN_FLIGHT for r in rows))
    if line is not None:
        print(line)
    return 0


def state_line(sweep_dir: Path, busy: bool) -> str | None:
    """`status`'s line on the timing session: not started / running or unfinished (R of R' rounds, windows) /
    finished / stale for the current arms; the SLURM timing job's state where one was submitted. None for a sweep
    no session is part of (a decode sweep, a ladder)."""
    s = study.session_state(sweep_dir)
    if s.state == study.CANNOT:
        return None
    progress = f"{s.rounds_done} of {s.rounds} rounds, {s.windows_done} of {s.windows} windows"
    again = f"the next gptlab-sweep of the sweep (or gptlab-sweep time {sweep_dir})"
    words = {
        study.NOT_STARTED: "not started: "
        + ("it runs once the sweep's runs end" if busy else f"{again} runs it" if s.ready else "")
        + ("" if s.ready or busy else f"the baseline and another arm need a finished run ({', '.join(s.left_out)})"),
        study.RUNNING: f"running: {progress}",
        study.UNFINISHED: f"unfinished: {progress}; {again} times only the missing windows",
        study.FINISHED: f"finished: {s.rounds} rounds, {s.windows} windows of {', '.join(s.timed)}",
        study.STALE: f"stale: it timed {', '.join(s.timed)}; the sweep now has {', '.join(s.current) or 'none'} "
        f"finished: {again} times every arm again",
        study.DAMAGED: s.detail,
    }
    job = timing_job.job_state(sweep_dir) if s.state != study.FINISHED else None
    return f"timing: {words[s.state]}" + (f"; SLURM timing job {job[0]}: {job[1]}" if job else "")


def plan_line(sweep: Sweep, on: bool) -> str | None:
    """What a dry run says of the session (None for a sweep that trains nothing, or without a session)."""
    if sweep.command != "train" or not on:
        return None
    where = "one SLURM job after the array(s)" if launcher(sweep.launch) == "slurm" else "this machine, after the runs"
    return f"[{sweep.name}] then the timing session, every arm alone on {where}: gptlab-sweep time {sweep.sweep_dir}"


def _baseline_overrides(sweep: Sweep) -> list[str]:
    """The run settings of the sweep's first arm: the resources its runs asked for are the timing job's."""
    first = next(iter(sweep.spec["arms"]))
    return [o for o in planned_overrides(sweep.name, sweep.spec, first, sweep.extra) if not is_launch_setting(o)]


def submit_job(sweep: Sweep, arrays: list[str]) -> None:
    """Submit the SLURM timing job after `arrays` (none: now) and say so; a refused submission is a line on stderr
    (the runs already queued go on)."""
    if study.session_state(sweep.sweep_dir).state == study.CANNOT:
        return
    try:
        job = timing_job.submit(sweep.sweep_dir, sweep.launch, _baseline_overrides(sweep), arrays)
    except Exception as err:  # noqa: BLE001 - sbatch / submitit refusals come in many types; the runs go on
        print(f"[{sweep.name}] timing job not submitted ({' '.join(str(err).split())[:300]}): run gptlab-sweep time "
              f"{sweep.sweep_dir} on a node of the cluster", file=sys.stderr, flush=True)  # fmt: skip
        return
    after = f"after {' '.join(arrays)} (afterany)" if arrays else "now"
    print(f"[{sweep.name}] timing session: SLURM job {job}, {after}: gptlab-sweep time {sweep.sweep_dir}", flush=True)


def job_after(sweep: Sweep) -> Callable[[list[str]], None] | None:
    """What run_hydra calls once the arrays are queued: submit the timing job after them (launcher=slurm, a sweep
    that trains); None otherwise."""
    if launcher(sweep.launch) != "slurm" or sweep.command != "train":
        return None
    return lambda arrays: submit_job(sweep, arrays)


def after_runs(sweep: Sweep, timing: bool) -> None:
    """The sweep's runs ended without failures: its timing session (when `timing`), then an A/A sweep's noise floor."""
    if timing and sweep.command == "train":
        _time_after(sweep)
    if sweep.spec.get("aa"):
        _measure_floor(sweep.name, sweep.sweep_dir)


def _time_after(sweep: Sweep) -> None:
    """The timing session when due, here (the local queue) or as a SLURM job (one already queued is said instead); a
    session that cannot or need not run is one line; errors exit 2."""
    name, sweep_dir = sweep.name, sweep.sweep_dir
    state = study.session_state(sweep_dir)
    if state.state == study.CANNOT:
        print(f"[{name}] no timing session: {state.detail}", flush=True)
        return
    due, slurm = study.session_due(sweep_dir), launcher(sweep.launch) == "slurm"
    if due and slurm and timing_job.queued(sweep_dir) is None:
        submit_job(sweep, [])
    elif due and not slurm:
        print(f"[{name}] timing session: every arm alone on this machine (--no-timing skips it)", flush=True)
        try:
            run_session(name, sweep_dir)
        except ConfigError as err:
            fail(f"gptlab-sweep: timing: {err}")
    else:
        print(f"[{name}] {state_line(sweep_dir, busy=bool(study.in_flight(sweep_dir)))}", flush=True)


def _measure_floor(name: str, sweep_dir: Path) -> None:
    """An A/A sweep's end: its noise floor into the sweep dir and, measured on a quiet machine, the user cache."""
    from gptlab.compare.statistics.noise_floor import cache_dir, measure_sweep

    try:
        lines = measure_sweep(sweep_dir, cache_dir())
    except ConfigError as err:
        print(f"[{name}] noise floor not measured: {err}", file=sys.stderr)
        return
    for line in lines:
        print(f"[{name}] {line}", flush=True)

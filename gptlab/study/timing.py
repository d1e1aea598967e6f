"""The timing session of a sweep, or of a set of run dirs: one finished run picked per arm, the session run by
gptlab/train/timing.py (every arm timed alone, interleaved rounds, the baseline's A/A) into a timing.json, and what it
did returned as a value (nothing printed, no exit code chosen).

- a sweep (`time_sweep`): the arms of its sweep.yaml, the first the baseline (as every verdict of the sweep); each
  arm timed from its finished run of the lowest seed (under an lr grid, the grid's first lr that finished at that
  seed: the lr sets no speed); an arm with no finished run is left out and named; the orders' seed is the sweep's
  lowest seed. The session is written to <sweep dir>/timing.json (gptlab/sweep/layout.py TIMING_FILE: a result of
  the sweep, at its top beside sweep.yaml, where compare finds it; .plan/ holds the latest launch's working files);
  a scale ladder (rungs of different sizes) or a decode sweep is refused;
- run dirs (`time_runs`): grouped as gptlab-compare groups them (one configuration up to seeds), each group named by
  the `arm` its runs share (a sweep's runs), else by compare's label, with compare's baseline (--baseline's spec, or
  compare's default), into a folder the caller gives;
- a session already in the folder continues: its arms keep the run dirs it timed (while they stay finished runs),
  and rounds, steps, warmup and seed not given are the ones it recorded, so a relaunch times only what it lacks;
  more rounds may be asked for, anything else that differs is refused by run_session in one line.

A sweep's session is a stage of the sweep (gptlab-sweep runs it after its local queue, or as one SLURM job after its
arrays): `session_state` says where it stands, read from the sweep dir alone (no torch: gptlab/train/timing.py is
imported only where a session is planned or run), `session_due` whether it should run now. Nothing else of the sweep
runs during a window: a session is refused while any run of the sweep is in flight. A session that timed other arms
or runs than the sweep would time now (the sweep grew, or the baseline changed) is stale: timing the sweep sets it
aside (.plan/earlier_timing/) and times every current arm in a new one.

Defaults, per the baseline run's device (DEFAULT_STEPS): CPU 30 timed steps after 5 warm-up steps (the tiny CPU
models of a laptop sweep step in ~15-30 ms on 2 threads, so a window times >= ~0.5 s; eager CPU steps settle after
one or two); CUDA 50 after 10 (torch.compile compiles on the first step and autotuning settles over a few; 50 steps
of a GPT-2-small step of 100-300 ms time 5-15 s). ROUNDS = 5 rounds: 4 degrees of freedom for the paired t. A test
knob: GPTLAB_TIMING_DEFAULTS=rounds=R,steps=N,warmup=W (any of them) replaces these defaults (a test suite's tiny
sessions); flags and a stored session's plan still win over it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from gptlab.compare.reading.group import Group, assign_labels, find_baseline, group_runs
from gptlab.compare.reading.runs import Run, discover, load_run
from gptlab.errors import ConfigError
from gptlab.sinks.jsonl import SUMMARY_FILE, read_summary
from gptlab.state.layout import lock_held
from gptlab.sweep.layout import (
    EARLIER_TIMING_DIR,
    TIMING_FILE,
    TIMING_LOCK,
    SweepRecord,
    read_sweep,
    run_subdir,
)
from gptlab.sweep.plan import IN_FLIGHT
from gptlab.sweep.status import status_of
from gptlab.util.stored import Check, read_json

if TYPE_CHECKING:
    from gptlab.train.timing import Arm, Plan

ROUNDS = 5
DEFAULT_STEPS = {"cpu": (30, 5), "cuda": (50, 10)}  # device kind -> (timed steps, warm-up steps) per window
CONFIG = Path(".hydra") / "config.yaml"  # what a session builds an arm from (gptlab/state/rundir.py run_config)
DEFAULTS_ENV = "GPTLAB_TIMING_DEFAULTS"  # the test knob: rounds=R,steps=N,warmup=W
# where a sweep's session stands (SessionState.state)
NOT_STARTED, RUNNING, UNFINISHED, FINISHED, STALE, DAMAGED, CANNOT = (
    "not started", "running", "unfinished", "finished", "stale", "damaged", "cannot",
)  # fmt: skip
FIX = "move it aside and time the sweep again (gptlab-sweep time DIR)"


def _runner() -> ModuleType:
    """gptlab/train/timing.py, the session runner: imported where a session is planned or run (it imports torch,
    which reading a sweep's state does not need)."""
    from gptlab.train import timing

    return timing


@dataclass(frozen=True)
class Timed:
    """What a timing call did: the session's file and document, the arms it timed (baseline first), the arms left
    out for want of a finished run, and the windows this call timed (0: the session had them all)."""

    path: Path
    doc: dict
    arms: tuple[Arm, ...]
    left_out: tuple[str, ...]
    timed_now: int
    earlier: Path | None = None  # where a stale session of other arms was set aside before this one began

    @property
    def baseline(self) -> str:
        return self.arms[0].name


def finished_run(run_dir: Path) -> bool:
    """True for a run dir a session can time: a finished run (summary.json) with its saved config."""
    return read_summary(run_dir / SUMMARY_FILE).get("status") == "finished" and (run_dir / CONFIG).is_file()


def device_kind(run_dir: Path) -> str:
    """'cuda' for a run that trained on a CUDA device (its provenance.json), else 'cpu'."""
    provenance = read_json(run_dir / "provenance.json", "time another run of the arm", missing={}) or {}
    device = (provenance.get("hardware") or {}).get("device") if isinstance(provenance, dict) else None
    return "cuda" if str(device).startswith("cuda") else "cpu"


def sweep_record(sweep_dir: Path) -> SweepRecord:
    """The sweep.yaml a session times, or a one-line ConfigError for a folder that is no sweep a session can time."""
    record = read_sweep(sweep_dir)
    if record is None:
        raise ConfigError(f"timing: {sweep_dir} is not a gptlab-sweep dir (no sweep.yaml); give the sweep's --out dir")
    if record.record.get("command", "train") != "train":
        raise ConfigError(f"timing: {sweep_dir} is a {record.record['command']} sweep: it trains nothing to time")
    if record.ladder:
        raise ConfigError(
            f"timing: {sweep_dir} is a scale ladder: its rungs differ in size by design and are timed rung by rung; "
            "give one rung's run dirs"
        )
    return record


def _pick_sweep_run(sweep_dir: Path, record: SweepRecord, arm: str, stored: dict[str, Path]) -> Path | None:
    """The run an arm is timed from: the one the stored session timed while it is still finished, else the finished
    run of the lowest seed (under an lr grid, at the grid's first lr that finished at that seed)."""
    if arm in stored and finished_run(stored[arm]):
        return stored[arm]
    lrs: list[float | None] = [*record.lrs] if record.lrs else [None]
    for seed in sorted(record.seeds):
        for lr in lrs:
            run_dir = sweep_dir / run_subdir(arm, seed, lr)
            if finished_run(run_dir):
                return run_dir
    return None


def _stored_arms(stored: dict | None) -> dict[str, Path]:
    """{arm: the run dir it timed} of a stored session ({} for none)."""
    arms = (stored or {}).get("plan", {}).get("arms") or []
    return {str(a["name"]): Path(a["run_dir"]) for a in arms if isinstance(a, dict) and "run_dir" in a}


def env_defaults() -> dict[str, int]:
    """The defaults GPTLAB_TIMING_DEFAULTS gives ({} when unset): rounds=R,steps=N,warmup=W, any of them."""
    text = os.environ.get(DEFAULTS_ENV, "").strip()
    if not text:
        return {}
    out: dict[str, int] = {}
    for item in text.split(","):
        key, _, value = item.partition("=")
        if key.strip() not in ("rounds", "steps", "warmup") or not value.strip().isdigit() or int(value) < 1:
            raise ConfigError(f"{DEFAULTS_ENV}={text!r}: {item!r}; allowed: rounds=R,steps=N,warmup=W (integers >= 1)")
        out[key.strip()] = int(value)
    return out


def _plan(
    picked: dict[str, Path | None],
    baseline: str,
    stored: dict | None,
    rounds: int | None,
    steps: int | None,
    warmup: int | None,
    seed: int | None,
    default_seed: int,
    where: str,
) -> tuple[Plan, tuple[str, ...]]:
    """(the Plan over the arms with a run, the arms left out); a missing baseline or one arm only is refused."""
    timing = _runner()
    left_out = tuple(name for name, run in picked.items() if run is None)
    base_run = picked.get(baseline)
    if base_run is None:
        raise ConfigError(f"timing: {where}: the baseline {baseline} has no finished run; a speed-up needs it timed")
    arms = [timing.Arm(baseline, base_run)]
    arms += [timing.Arm(n, r) for n, r in picked.items() if r is not None and n != baseline]
    if len(arms) < 2:
        raise ConfigError(
            f"timing: {where}: only the baseline {baseline} has a finished run (left out: {', '.join(left_out) or '-'})"
            "; a session times the baseline and at least one other arm"
        )
    was = (stored or {}).get("plan") or {}
    default_steps, default_warmup = DEFAULT_STEPS[device_kind(arms[0].run_dir)]
    env = env_defaults()
    plan = timing.Plan(
        tuple(arms),
        rounds=rounds if rounds is not None else was.get("rounds", env.get("rounds", ROUNDS)),
        steps=steps if steps is not None else was.get("steps", env.get("steps", default_steps)),
        warmup=warmup if warmup is not None else was.get("warmup", env.get("warmup", default_warmup)),
        seed=seed if seed is not None else was.get("seed", default_seed),
    )
    return plan, left_out


def _baseline(record: SweepRecord, stored: dict | None, baseline: str | None, where: Path) -> str:
    """The arm a sweep's session is timed against: the one named, else the stored session's while it is an arm of
    the sweep, else the sweep's first arm (as every verdict of the sweep)."""
    if baseline is None:
        was = (stored or {}).get("baseline")
        baseline = was if isinstance(was, str) and was in record.arms else record.arms[0]
    if baseline not in record.arms:
        raise ConfigError(f"timing: baseline {baseline!r} is not an arm of {where}; allowed: {', '.join(record.arms)}")
    return baseline


def _picked(sweep_dir: Path, record: SweepRecord, base: str, stored: dict | None) -> dict[str, Path | None]:
    """{arm: the run it is timed from, or None}, the baseline first, then the sweep's arms in order."""
    was = _stored_arms(stored)
    return {arm: _pick_sweep_run(sweep_dir, record, arm, was) for arm in [base, *record.arms]}


def sweep_plan(
    sweep_dir: Path,
    rounds: int | None = None,
    steps: int | None = None,
    warmup: int | None = None,
    seed: int | None = None,
    baseline: str | None = None,
) -> tuple[Plan, tuple[str, ...]]:
    """(the Plan time_sweep runs, the arms it leaves out), read from the sweep dir and any session stored there; the
    baseline is the one named, else the stored session's, else the sweep's first arm. Writes nothing."""
    sweep_dir = Path(sweep_dir).resolve()
    record = sweep_record(sweep_dir)
    stored = _runner().read_session(sweep_dir / TIMING_FILE)
    base = _baseline(record, stored, baseline, sweep_dir)
    picked = _picked(sweep_dir, record, base, stored)
    first_seed = min(record.seeds, default=0)  # the sweep's: its orders are its own
    return _plan(picked, base, stored, rounds, steps, warmup, seed, first_seed, str(sweep_dir))


def in_flight(sweep_dir: Path) -> list[str]:
    """'<run> (<state>)' for every run of the sweep still in flight (running, pending, requeued)."""
    return [f"{run.name} ({run.state})" for run in status_of(Path(sweep_dir)) if run.state in IN_FLIGHT]


def time_sweep(
    sweep_dir: Path,
    rounds: int | None = None,
    steps: int | None = None,
    warmup: int | None = None,
    seed: int | None = None,
    baseline: str | None = None,
    on_window: Callable[[dict], None] | None = None,
) -> Timed:
    """Time the sweep's arms into <sweep dir>/timing.json (continuing a session there, or setting a stale one aside);
    see the module docstring. Refused while a run of the sweep is in flight. `on_window(record)` hears each window as
    it is written."""
    sweep_dir = Path(sweep_dir).resolve()
    plan, left_out = sweep_plan(sweep_dir, rounds, steps, warmup, seed, baseline)
    busy = in_flight(sweep_dir)
    if busy:
        shown = ", ".join(busy[:3]) + (f" and {len(busy) - 3} more" if len(busy) > 3 else "")
        raise ConfigError(
            f"timing: {sweep_dir}: {len(busy)} run(s) of the sweep in flight ({shown}); a timing window has the "
            f"machine to itself: time it once they end (gptlab-sweep status {sweep_dir})"
        )
    earlier = _set_aside_stale(sweep_dir, plan)
    if earlier is not None:  # the new session plans from scratch: no stored rounds, steps or orders carry over
        plan, left_out = sweep_plan(sweep_dir, rounds, steps, warmup, seed, baseline)
    return _run(plan, sweep_dir, left_out, on_window, earlier)


def _set_aside_stale(sweep_dir: Path, plan: Plan) -> Path | None:
    """Move a stored session of other arms (or runs) than `plan`'s to .plan/earlier_timing/timing-<n>.json; its path,
    or None when there is none to move (no session, the same arms, or one still running: run_session says so)."""
    path = sweep_dir / TIMING_FILE
    stored = _runner().read_session(path)
    if stored is None or stored["plan"].get("arms") == plan.to_json()["arms"] or lock_held(sweep_dir / TIMING_LOCK):
        return None
    folder = sweep_dir / EARLIER_TIMING_DIR
    folder.mkdir(parents=True, exist_ok=True)
    n = 1 + sum(1 for _ in folder.glob("timing-*.json"))
    while (folder / f"timing-{n}.json").exists():
        n += 1
    return path.replace(folder / f"timing-{n}.json")


def _run(
    plan: Plan,
    folder: Path,
    left_out: tuple[str, ...],
    on_window: Callable[[dict], None] | None,
    earlier: Path | None = None,
) -> Timed:
    heard: list[dict] = []

    def hear(record: dict) -> None:
        heard.append(record)
        if on_window is not None:
            on_window(record)

    doc = _runner().run_session(plan, folder, on_window=hear)
    return Timed(folder / TIMING_FILE, doc, plan.arms, left_out, len(heard), earlier)


@dataclass(frozen=True)
class SessionState:
    """Where a sweep's timing session stands, read from the sweep dir (nothing built): `state` (NOT_STARTED, RUNNING,
    UNFINISHED, FINISHED, STALE, DAMAGED or CANNOT), the rounds and windows the stored session has of those it plans,
    the arms it timed, the arms the sweep would time now (baseline first) and those it would leave out, and a
    refusal's or a damaged file's line in `detail`."""

    state: str
    rounds_done: int = 0
    rounds: int = 0
    windows_done: int = 0
    windows: int = 0
    timed: tuple[str, ...] = ()
    current: tuple[str, ...] = ()
    left_out: tuple[str, ...] = ()
    detail: str = ""

    @property
    def ready(self) -> bool:
        """True when the sweep has what a session needs: its baseline and another arm finished."""
        return len(self.current) >= 2


def _stored_doc(path: Path) -> dict | None:
    """The stored session as far as its state needs it (plan, windows), without the runner's torch; None for none."""
    check = Check(path, FIX)
    doc = read_json(path, FIX)
    if doc is None:
        return None
    check.mapping("timing.json", doc)
    plan = check.mapping("plan", doc.get("plan"))
    check.number("plan.rounds", plan.get("rounds"), ">= 1", int)
    if not isinstance(plan.get("arms"), list) or not isinstance(doc.get("windows"), list):
        raise check.fail("plan.arms and windows: expected lists")
    for w in doc["windows"]:
        check.number("windows[].round", check.mapping("windows[]", w).get("round"), ">= 0", int)
        check.number("windows[].position", w.get("position"), ">= 0", int)
    return doc


def session_state(sweep_dir: Path) -> SessionState:
    """Where the sweep's timing session stands (see SessionState); reads files only, imports no torch."""
    sweep_dir = Path(sweep_dir).resolve()
    try:
        record = sweep_record(sweep_dir)
    except ConfigError as err:
        return SessionState(CANNOT, detail=str(err))
    try:
        stored = _stored_doc(sweep_dir / TIMING_FILE)
        base = _baseline(record, stored, None, sweep_dir)
    except ConfigError as err:
        return SessionState(DAMAGED, detail=str(err))
    picked = _picked(sweep_dir, record, base, stored)
    now = [(n, str(r.resolve())) for n, r in picked.items() if r is not None]
    current = tuple(n for n, _ in now) if base in dict(now) else ()  # no session without its baseline
    left_out = tuple(n for n, r in picked.items() if r is None)
    if stored is None:
        state = RUNNING if lock_held(sweep_dir / TIMING_LOCK) else NOT_STARTED
        return SessionState(state, current=current, left_out=left_out)
    arms = [(str(a.get("name")), str(a.get("run_dir"))) for a in stored["plan"]["arms"] if isinstance(a, dict)]
    rounds, per_round = stored["plan"]["rounds"], len(arms) + 1
    done = {(w["round"], w["position"]) for w in stored["windows"]}
    full = sum(all((r, p) in done for p in range(per_round)) for r in range(rounds))
    if lock_held(sweep_dir / TIMING_LOCK):
        state = RUNNING
    elif arms != now or not current:
        state = STALE
    else:
        state = FINISHED if stored.get("status") == "finished" and len(done) >= rounds * per_round else UNFINISHED
    figures = (full, rounds, len(done), rounds * per_round, tuple(n for n, _ in arms))
    return SessionState(state, *figures, current=current, left_out=left_out)


def session_due(sweep_dir: Path) -> bool:
    """True when the sweep's timing session should run now (gptlab-sweep asks once its local runs are done): it is
    not started, unfinished or stale, the baseline and another arm finished, and no run of the sweep is in flight. A
    damaged timing.json is not run over: `time_sweep` says why."""
    state = session_state(sweep_dir)
    return state.state in (NOT_STARTED, UNFINISHED, STALE) and state.ready and not in_flight(Path(sweep_dir).resolve())


def _group_name(group: Group, groups: list[Group]) -> str:
    """The `arm` every run of the group recorded, when no other group shares it; else compare's label."""
    arms = {r.config.get("arm") for r in group.runs}
    arm = arms.pop() if len(arms) == 1 else None
    if isinstance(arm, str) and arm and sum(arm in {r.config.get("arm") for r in g.runs} for g in groups) == 1:
        return arm
    return group.label


def _pick_group_run(group: Group, stored: Path | None) -> Path | None:
    """The run a group is timed from: the stored session's while it is one of the group's finished runs, else its
    finished run of the lowest seed (ties: the first found)."""
    done = [r for r in group.runs if finished_run(r.path)]
    if stored is not None and any(r.path == stored.resolve() for r in done):
        return stored.resolve()
    seeds = [(r.config.get("seed") if isinstance(r.config.get("seed"), int) else 2**63, i) for i, r in enumerate(done)]
    return done[min(seeds)[1]].path if done else None


def time_runs(
    run_dirs: list[Path],
    folder: Path,
    baseline: str | None = None,
    rounds: int | None = None,
    steps: int | None = None,
    warmup: int | None = None,
    seed: int | None = None,
    on_window: Callable[[dict], None] | None = None,
) -> Timed:
    """Time the groups of `run_dirs` (run or sweep dirs, as gptlab-compare takes them) into folder/timing.json;
    `baseline` is compare's --baseline spec (a run dir or key=value items; None: compare's default)."""
    folder = Path(folder).resolve()
    runs: list[Run] = [load_run(p) for p in discover([str(d) for d in run_dirs])]
    groups = group_runs(runs)
    base = find_baseline(groups, baseline)
    assign_labels(groups, base)
    names = [_group_name(g, groups) for g in groups]
    if len(set(names)) != len(names):
        names = [f"{name} ({i})" if names.count(name) > 1 else name for i, name in enumerate(names)]
    stored = _runner().read_session(folder / TIMING_FILE)
    was = _stored_arms(stored)
    picked = {name: _pick_group_run(g, was.get(name)) for name, g in zip(names, groups)}
    base_name = names[next(i for i, g in enumerate(groups) if g is base)]
    picked = {base_name: picked[base_name], **picked}
    plan, left_out = _plan(picked, base_name, stored, rounds, steps, warmup, seed, 0, str(folder))
    return _run(plan, folder, left_out, on_window)

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

Defaults, per the baseline run's device (DEFAULT_STEPS): CPU 30 timed steps after 5 warm-up steps (the tiny CPU
models of a laptop sweep step in ~15-30 ms on 2 threads, so a window times >= ~0.5 s; eager CPU steps settle after
one or two); CUDA 50 after 10 (torch.compile compiles on the first step and autotuning settles over a few; 50 steps
of a GPT-2-small step of 100-300 ms time 5-15 s). ROUNDS = 5 rounds: 4 degrees of freedom for the paired t.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gptlab.compare.reading.group import Group, assign_labels, find_baseline, group_runs
from gptlab.compare.reading.runs import Run, discover, load_run
from gptlab.errors import ConfigError
from gptlab.sinks.jsonl import SUMMARY_FILE, read_summary
from gptlab.sweep.layout import TIMING_FILE, SweepRecord, read_sweep, run_subdir
from gptlab.sweep.plan import IN_FLIGHT
from gptlab.sweep.status import status_of
from gptlab.train.timing import Arm, Plan, read_session, run_session
from gptlab.util.stored import read_json

ROUNDS = 5
DEFAULT_STEPS = {"cpu": (30, 5), "cuda": (50, 10)}  # device kind -> (timed steps, warm-up steps) per window
CONFIG = Path(".hydra") / "config.yaml"  # what a session builds an arm from (gptlab/state/rundir.py run_config)


@dataclass(frozen=True)
class Timed:
    """What a timing call did: the session's file and document, the arms it timed (baseline first), the arms left
    out for want of a finished run, and the windows this call timed (0: the session had them all)."""

    path: Path
    doc: dict
    arms: tuple[Arm, ...]
    left_out: tuple[str, ...]
    timed_now: int

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


def _stored_arms(folder: Path) -> tuple[dict | None, dict[str, Path]]:
    """(the session stored in folder or None, {arm: the run dir it timed})."""
    stored = read_session(folder / TIMING_FILE)
    arms = (stored or {}).get("plan", {}).get("arms") or []
    return stored, {str(a["name"]): Path(a["run_dir"]) for a in arms if isinstance(a, dict) and "run_dir" in a}


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
    left_out = tuple(name for name, run in picked.items() if run is None)
    base_run = picked.get(baseline)
    if base_run is None:
        raise ConfigError(f"timing: {where}: the baseline {baseline} has no finished run; a speed-up needs it timed")
    arms = [Arm(baseline, base_run)] + [Arm(n, r) for n, r in picked.items() if r is not None and n != baseline]
    if len(arms) < 2:
        raise ConfigError(
            f"timing: {where}: only the baseline {baseline} has a finished run (left out: {', '.join(left_out) or '-'})"
            "; a session times the baseline and at least one other arm"
        )
    was = (stored or {}).get("plan") or {}
    default_steps, default_warmup = DEFAULT_STEPS[device_kind(arms[0].run_dir)]
    plan = Plan(
        tuple(arms),
        rounds=rounds if rounds is not None else was.get("rounds", ROUNDS),
        steps=steps if steps is not None else was.get("steps", default_steps),
        warmup=warmup if warmup is not None else was.get("warmup", default_warmup),
        seed=seed if seed is not None else was.get("seed", default_seed),
    )
    return plan, left_out


def sweep_plan(
    sweep_dir: Path,
    rounds: int | None = None,
    steps: int | None = None,
    warmup: int | None = None,
    seed: int | None = None,
    baseline: str | None = None,
) -> tuple[Plan, tuple[str, ...]]:
    """(the Plan time_sweep runs, the arms it leaves out), read from the sweep dir and any session stored there; the
    baseline is the sweep's first arm unless named. Writes nothing."""
    sweep_dir = Path(sweep_dir).resolve()
    record = sweep_record(sweep_dir)
    base = baseline if baseline is not None else record.arms[0]
    if base not in record.arms:
        raise ConfigError(f"timing: baseline {base!r} is not an arm of {sweep_dir}; allowed: {', '.join(record.arms)}")
    stored, was = _stored_arms(sweep_dir)
    picked = {arm: _pick_sweep_run(sweep_dir, record, arm, was) for arm in [base, *record.arms]}
    first_seed = min(record.seeds, default=0)  # the sweep's: its orders are its own
    return _plan(picked, base, stored, rounds, steps, warmup, seed, first_seed, str(sweep_dir))


def time_sweep(
    sweep_dir: Path,
    rounds: int | None = None,
    steps: int | None = None,
    warmup: int | None = None,
    seed: int | None = None,
    baseline: str | None = None,
    on_window: Callable[[dict], None] | None = None,
) -> Timed:
    """Time the sweep's arms into <sweep dir>/timing.json (continuing a session there); see the module docstring.
    `on_window(record)` hears each window as it is written."""
    sweep_dir = Path(sweep_dir).resolve()
    plan, left_out = sweep_plan(sweep_dir, rounds, steps, warmup, seed, baseline)
    return _run(plan, sweep_dir, left_out, on_window)


def _run(plan: Plan, folder: Path, left_out: tuple[str, ...], on_window: Callable[[dict], None] | None) -> Timed:
    heard: list[dict] = []

    def hear(record: dict) -> None:
        heard.append(record)
        if on_window is not None:
            on_window(record)

    doc = run_session(plan, folder, on_window=hear)
    return Timed(folder / TIMING_FILE, doc, plan.arms, left_out, len(heard))


def session_due(sweep_dir: Path) -> bool:
    """True when the sweep's timing session should run now (the local queue asks once its runs are done): no run of
    the sweep is in flight, the baseline and another arm finished, and timing.json is missing, or unfinished for the
    same arms. A stored session of other arms (the sweep grew) is not run again on its own: `time_sweep` says why."""
    sweep_dir = Path(sweep_dir).resolve()
    try:
        if any(run.state in IN_FLIGHT for run in status_of(sweep_dir)):
            return False
        plan, _ = sweep_plan(sweep_dir)
    except ConfigError:
        return False
    stored = read_session(sweep_dir / TIMING_FILE)
    if stored is None:
        return True
    same_arms = stored["plan"].get("arms") == plan.to_json()["arms"]
    return same_arms and (stored.get("status") != "finished" or len(stored["windows"]) < plan.windows())


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
    stored, was = _stored_arms(folder)
    picked = {name: _pick_group_run(g, was.get(name)) for name, g in zip(names, groups)}
    base_name = names[next(i for i, g in enumerate(groups) if g is base)]
    picked = {base_name: picked[base_name], **picked}
    plan, left_out = _plan(picked, base_name, stored, rounds, steps, warmup, seed, 0, str(folder))
    return _run(plan, folder, left_out, on_window)

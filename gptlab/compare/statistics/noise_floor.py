"""This machine's noise floor: how far identical runs differ, measured by an A/A sweep, and how a comparison uses it.

An A/A sweep (`gptlab-sweep NAME --aa K`) runs the baseline arm K times as K identical arms x seeds on the same data.
Every difference between its runs is noise, so it measures:
- speed: the standard deviation of log tokens/s (and of log step ms) over all its runs, arms pooled (so the drift
  between arms run one after another is in it), and the largest speed-up between two identical arms' geometric
  means: a "speed-up" this machine shows between identical arms;
- loss: the seed standard deviation of val loss, and the largest |Δ val loss| between arms at one seed (0 where the
  machine is deterministic);
- peak memory: (max - min) / min of the identical runs' peak memory;
- the outside load (other processes' share of the cores) the runs recorded.

The floor is written to <sweep dir>/noise_floor.json and, when the A/A was quiet (outside load <= QUIET_LOAD in every
run), to FLOOR_FILE in the user cache, keyed by the machine id (GPU model, else CPU model, the machine's cores and
the cores of each run's slot: a packed sweep's floor is not a lone run's). Outside load is foreign load only: the
local queue's sibling runs are recorded apart (`sibling_load`), so an A/A packed on a machine that held nothing
else is quiet. A floor measured under load is recorded in the sweep dir only, flagged, and never used.

gptlab-compare looks the floor up by the compared runs' own machine id (never another machine's, never when the runs
name several machines) and, when one exists, uses it instead of the fixed outside-load heuristic:
- a run's tokens/s during training (a record, never a verdict) is "under load" above the A/A's own worst outside
  load plus LOAD_SLACK (instead of speed.OUTSIDE_LOAD_LIMIT);
- peak memory varying between seeds of one config by more than the A/A's spread is flagged (without a floor: more
  than MEM_SPREAD_DEFAULT).
Speed verdicts no longer use it: they come from a timing session, paired per round and held against that session's
own A/A (compare/statistics/rounds.py), which measures the noise of the very windows it judges. Val-loss verdicts keep
the seeds' own spread (seed noise belongs to the config, not to the machine). The speed figures an A/A sweep measures
(speed_sd, max_speedup) are still recorded, as what this machine's training runs vary by.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gptlab.compare.reading.runs import Run, discover, load_run
from gptlab.compare.statistics import speed, stats
from gptlab.errors import ConfigError
from gptlab.util.io import write_json_atomic
from gptlab.util.stored import Check, read_json

FLOOR_FILE = "noise_floors_v1.json"  # in the user cache (GPTLAB_CACHE): {machine id: floor}
RECORD_FILE = "noise_floor.json"  # in the A/A sweep dir
QUIET_LOAD = 0.10  # an A/A any of whose runs saw more outside load than this is not stored as the machine's floor
LOAD_SLACK = 0.05  # with a floor, runs up to (the A/A's worst outside load + this) count as taken under its conditions
MEM_SPREAD_DEFAULT = 0.05  # without a floor: peak memory varying more than this between seeds of one config is flagged
MIN_ARMS, MIN_SEEDS = 2, 2  # an A/A needs identical arms to compare and seeds within each


@dataclass(frozen=True)
class Floor:
    """One A/A measurement (the FLOOR_FILE entry and noise_floor.json); see the module docstring for each figure."""

    machine: str
    measured_at: str  # UTC, ISO 8601
    sweep_dir: str
    runs: int
    arms: int
    seeds: int
    speed_sd: float  # sd of log tokens/s over all runs
    step_sd: float | None  # sd of log step ms over all runs
    max_speedup: float  # largest ratio of two identical arms' geometric-mean tokens/s (>= 1)
    loss_sd: float | None  # sd of val loss over all runs (seed noise of this config)
    same_seed_loss_gap: float | None  # largest |Δ val loss| between arms at one seed
    mem_spread: float | None  # (max - min) / min of peak memory over all runs
    outside_load: float | None  # the worst outside load any run recorded (None: not recorded)
    quiet: bool  # every run recorded its load and none above QUIET_LOAD
    conditions: dict[str, Any] = field(default_factory=dict)  # device, dtype, threads, torch, params, tokens/s

    def load_limit(self) -> float:
        """Outside load above which a run is outside the conditions this floor was measured under."""
        return (self.outside_load or 0.0) + LOAD_SLACK

    def measured(self) -> str:
        """What the A/A measured, in words."""
        mem = f", peak memory within {100 * self.mem_spread:.1f}%" if self.mem_spread is not None else ""
        loss = (
            f"; val loss: same seed gives {'the same loss' if not self.same_seed_loss_gap else f'|Δ| up to {self.same_seed_loss_gap:.2g}'}"
            if self.same_seed_loss_gap is not None
            else ""
        )
        load = "not recorded" if self.outside_load is None else f"≤ {100 * self.outside_load:.0f}%"
        return (
            f"measured on {self.measured_at[:10]} with {self.runs} runs ({self.arms} identical arms × {self.seeds} "
            f"seeds, {self.sweep_dir}) on {self.machine} at outside load {load}: run-to-run sd "
            f"{100 * self.speed_sd:.1f}% of tokens/s, identical arms up to {self.max_speedup:.3f}× apart{mem}{loss}"
        )

    def describe(self) -> str:
        """The report's line: where the floor comes from and what it does."""
        return (
            f"Noise floor: {self.measured()}. Runs above {100 * self.load_limit():.0f}% outside load have their "
            "tokens/s during training marked 'under load'; peak memory is flagged when seeds differ by more than the "
            "floor's spread. Speed verdicts come from a timing session's own A/A, not from this floor."
        )


def cache_dir() -> Path:
    """$GPTLAB_CACHE, else ~/.cache/gptlab: gptlab.data.default_cache_dir's folder (not imported: it loads torch,
    which gptlab-compare never needs; a test checks the two agree)."""
    from gptlab.util.paths import user_cache

    return user_cache(os.environ.get("GPTLAB_CACHE"))


def default_note(reason: str) -> str:
    """The report's line when no measured floor is used."""
    return (
        f"Noise floor: default heuristic ({reason}): runs above {100 * speed.OUTSIDE_LOAD_LIMIT:.0f}% outside load "
        f"have their tokens/s during training marked 'under load', peak memory flagged when seeds differ by more "
        f"than {100 * MEM_SPREAD_DEFAULT:.0f}% (`gptlab-sweep aa` measures this machine's). Speed verdicts come from a "
        "timing session's own A/A."
    )


def machine_id(run: Run) -> str | None:
    """The machine a run timed its speed on and its slot: its GPU model, else its CPU model, the machine's cores and
    the cores its slot had (`AMD EPYC | 2 cores, slots of 1`: a packed sweep's floor is not a lone run's)."""
    hardware = run.provenance.get("hardware")
    if not isinstance(hardware, dict):
        return None
    if hardware.get("gpu"):
        return str(hardware["gpu"])
    cores = hardware.get("cpu_cores")
    if not hardware.get("cpu") or not isinstance(cores, list) or not cores:
        return None
    machine = hardware.get("machine_cores")
    if isinstance(machine, int) and not isinstance(machine, bool) and machine > 0:
        return f"{hardware['cpu']} | {machine} cores, slots of {len(cores)}"
    return f"{hardware['cpu']} | {len(cores)} cores"  # runs from before machine_cores was recorded


def _log_sd(values: Sequence[float]) -> float | None:
    return stats.std([math.log(v) for v in values]) if len(values) > 1 else None


def _final_loss(run: Run, step: int) -> float | None:
    value = run.by_step.get(step, {}).get("val/loss")
    return float(value) if value is not None else None


def _loss_figures(runs: list[Run], arms: dict[str, list[Run]]) -> tuple[float | None, float | None]:
    """(sd of val loss over all runs, largest gap between arms at one seed) at the last step every run evaluated."""
    if not all(r.val_steps() for r in runs):
        return None, None
    step = min(r.val_steps()[-1] for r in runs)
    losses = [loss for r in runs if (loss := _final_loss(r, step)) is not None]
    by_seed: dict[Any, list[float]] = {}
    for members in arms.values():
        for r in members:
            if (loss := _final_loss(r, step)) is not None:
                by_seed.setdefault(r.config.get("seed"), []).append(loss)
    gaps = [max(v) - min(v) for v in by_seed.values() if len(v) > 1]
    return (stats.std(losses) if len(losses) > 1 else None), (max(gaps) if gaps else None)


def _conditions(runs: list[Run], tps: list[float]) -> dict[str, Any]:
    hardware = runs[0].provenance.get("hardware") or {}
    packages = runs[0].provenance.get("packages") or {}
    return {
        "device": hardware.get("device"),
        "dtype": hardware.get("dtype"),
        "threads": hardware.get("cpu_threads"),
        "torch": packages.get("torch"),
        "params": runs[0].summary.get("params"),
        "tokens_per_s": math.exp(stats.mean([math.log(v) for v in tps])),
    }


def _check_identical(runs: list[Run], sweep_dir: Path) -> None:
    """ConfigError unless every run has one config (seed and bookkeeping keys such as arm aside)."""
    from gptlab.compare.reading.group import is_bookkeeping
    from gptlab.util.tree import flatten

    def key(run: Run) -> dict:
        flat = flatten(run.config, empty_as_leaf=True)
        return {k: v for k, v in flat.items() if k != "seed" and not is_bookkeeping(k)}

    first = key(runs[0])
    for run in runs[1:]:
        other = key(run)
        differs = sorted(k for k in set(first) | set(other) if first.get(k) != other.get(k))
        if differs:
            raise ConfigError(
                f"{sweep_dir}: {run.path} differs from {runs[0].path} in {', '.join(differs[:3])}: an A/A's runs must "
                "be one config"
            )


def measure(runs: list[Run], sweep_dir: Path, now: float | None = None) -> Floor:
    """The floor of an A/A sweep's finished runs (grouped by their `arm`); ConfigError when they cannot give one."""
    runs = [r for r in runs if r.status == "finished"]
    machines = {machine_id(r) for r in runs}
    if None in machines or len(machines) != 1:
        raise ConfigError(
            f"{sweep_dir}: the A/A runs must all record one machine in provenance.json (found {sorted(map(str, machines))})"
        )
    if runs:
        _check_identical(runs, sweep_dir)
    arms: dict[str, list[Run]] = {}
    for r in runs:
        arms.setdefault(str(r.config.get("arm")), []).append(r)
    seeds = min((len(v) for v in arms.values()), default=0)
    if len(arms) < MIN_ARMS or seeds < MIN_SEEDS:
        raise ConfigError(
            f"{sweep_dir}: a noise floor needs >= {MIN_ARMS} identical arms x {MIN_SEEDS} finished seeds "
            f"(found {len(arms)} arms, {seeds} seeds in the smallest)"
        )
    per_arm = {a: speed.per_run(v, "tokens_per_s_median", "perf/tokens_per_s") for a, v in arms.items()}
    if any(len(v) != len(arms[a]) for a, v in per_arm.items()):
        raise ConfigError(f"{sweep_dir}: every A/A run must record its tokens/s")
    tps = [v for values in per_arm.values() for v in values]
    means = [stats.mean([math.log(v) for v in values]) for values in per_arm.values()]
    loss_sd, gap = _loss_figures(runs, arms)
    mems = [float(m) for r in runs if (m := r.summary.get("peak_mem_bytes")) is not None and m > 0]
    loads = [speed.run_load(r) for r in runs]
    worst = max((x for x in loads if x is not None), default=None)
    return Floor(
        machine=str(machines.pop()),
        measured_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)),
        sweep_dir=str(sweep_dir),
        runs=len(runs),
        arms=len(arms),
        seeds=seeds,
        speed_sd=float(_log_sd(tps) or 0.0),
        step_sd=_log_sd(speed.per_run(runs, "step_ms_median", "perf/step_ms")),
        max_speedup=math.exp(max(means) - min(means)),
        loss_sd=loss_sd,
        same_seed_loss_gap=gap,
        mem_spread=(max(mems) - min(mems)) / min(mems) if len(mems) == len(runs) else None,
        outside_load=worst,
        quiet=None not in loads and worst is not None and worst <= QUIET_LOAD,
        conditions=_conditions(runs, tps),
    )


def measure_sweep(sweep_dir: Path, cache_dir: Path) -> list[str]:
    """Measure an A/A sweep dir's floor, write noise_floor.json there and, when quiet, store it for the machine;
    the lines to print. A damaged store is refused (read_floors) after noise_floor.json is written: nothing lost."""
    floor = measure([load_run(p) for p in discover([str(sweep_dir)])], sweep_dir)
    path = Path(cache_dir).expanduser() / FLOOR_FILE
    doc = asdict(floor)
    write_json_atomic(sweep_dir / RECORD_FILE, {**doc, "stored": False, "stored_in": None})
    if floor.quiet:
        table = {machine: asdict(stored) for machine, stored in read_floors(path).items()}
        table[floor.machine] = doc
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, table, sort_keys=True)
        write_json_atomic(sweep_dir / RECORD_FILE, {**doc, "stored": True, "stored_in": str(path)})
        where = f"stored for {floor.machine} in {path}: gptlab-compare uses it for runs on this machine"
    else:
        load = "not recorded" if floor.outside_load is None else f"up to {100 * floor.outside_load:.0f}%"
        where = (
            f"NOT stored as this machine's floor: outside load {load} during the A/A (a floor needs <= "
            f"{100 * QUIET_LOAD:.0f}% in every run); rerun it on a quiet machine"
        )
    return [f"noise floor: {floor.measured()}", f"noise floor {where}"]


def _fix(path: Path) -> str:
    return (
        f"move {path.name} aside and measure this machine's floor again (`gptlab-sweep NAME --aa`), or compare "
        "with --noise-floor none"
    )


def _floor_of(doc: Any, machine: str, check: Check, stored: bool = True) -> Floor:
    """The floor of `machine` from its JSON entry, every figure range-checked (`damaged` otherwise); a `stored` one
    (the store's) must have been measured quiet, an A/A's own noise_floor.json records a loaded one too."""
    entry = check.mapping(machine, doc)
    missing = [k for k in Floor.__dataclass_fields__ if k not in entry and k != "conditions"]
    if missing:
        raise check.fail(f"{machine}: no {', '.join(missing)}")
    at = f"{machine}: "
    if check.text(at + "machine", entry["machine"]) != machine:
        raise check.fail(f"{machine}: its entry names machine {entry['machine']!r}")
    check.text(at + "measured_at", entry["measured_at"])
    check.text(at + "sweep_dir", entry["sweep_dir"])
    check.number(at + "arms", entry["arms"], f">= {MIN_ARMS}", int)
    check.number(at + "seeds", entry["seeds"], f">= {MIN_SEEDS}", int)
    check.number(at + "runs", entry["runs"], f">= {MIN_ARMS * MIN_SEEDS}", int)
    check.number(at + "speed_sd", entry["speed_sd"], ">= 0")
    check.number(at + "max_speedup", entry["max_speedup"], ">= 1")  # the faster identical arm over the slower
    for key in ("step_sd", "loss_sd", "same_seed_loss_gap", "mem_spread"):
        check.number(at + key, entry[key], ">= 0", null=True)
    check.number(at + "outside_load", entry["outside_load"], "[0, 1]", null=True)
    check.flag(at + "quiet", entry["quiet"])
    load = entry["outside_load"]
    if stored and (not entry["quiet"] or load is None or load > QUIET_LOAD):
        raise check.fail(
            f"{at}quiet={str(entry['quiet']).lower()} at outside load {load}: only a floor measured at <= "
            f"{100 * QUIET_LOAD:.0f}% outside load in every run is stored"
        )
    conditions = check.mapping(at + "conditions", entry.get("conditions", {}))
    for key in ("params", "threads", "tokens_per_s"):
        check.number(f"{at}conditions.{key}", conditions.get(key), "> 0", null=True)
    return Floor(**{k: entry[k] for k in Floor.__dataclass_fields__ if k in entry})


def read_floors(path: Path) -> dict[str, Floor]:
    """The floor store (FLOOR_FILE): {machine id: Floor}, {} when none was measured; a damaged store (not JSON, a
    figure out of range or NaN, a loaded floor marked quiet) is a one-line ConfigError naming it and what to do."""
    check = Check(Path(path), _fix(Path(path)))
    table = read_json(path, check.fix, missing={})
    if not isinstance(table, dict):
        raise check.fail(f"expected a mapping of machine ids to floors, got {type(table).__name__}")
    return {str(machine): _floor_of(doc, str(machine), check) for machine, doc in table.items()}


# the conditions a floor records (Floor.conditions) that runs record too: a run's own are run_conditions(run)
CONDITIONS = ("device", "dtype", "threads", "torch", "params")


def run_conditions(run: Run) -> dict[str, Any]:
    """The CONDITIONS as one run recorded them (None where it did not)."""
    hardware, packages = (run.provenance.get(k) for k in ("hardware", "packages"))
    hardware, packages = (x if isinstance(x, dict) else {} for x in (hardware, packages))
    return {
        "device": hardware.get("device"),
        "dtype": hardware.get("dtype"),
        "threads": hardware.get("cpu_threads"),
        "torch": packages.get("torch"),
        "params": run.summary.get("params"),
    }


def differences(floor: Floor, runs: list[Run]) -> list[str]:
    """Each condition the floor was measured under that a compared run recorded otherwise: 'params 120000 there,
    250000 here'."""
    out = []
    for key in CONDITIONS:
        there = floor.conditions.get(key)
        here = sorted({str(v) for r in runs if (v := run_conditions(r)[key]) is not None and v != there})
        if there is not None and here:
            out.append(f"{key} {there} there, {' / '.join(here[:3])} here")
    return out


def lookup(runs: list[Run], cache_dir: Path | None) -> tuple[Floor | None, str]:
    """(the stored floor of the machine every run timed its speed on, the report's line); (None, why) otherwise. A
    floor measured under other conditions (model size, dtype, threads, torch) is used, as it only adds caution, with
    a warning naming each difference; a damaged store is a ConfigError (read_floors)."""
    machines = {machine_id(r) for r in runs}
    if cache_dir is None:
        return None, default_note("--noise-floor none")
    if None in machines:
        return None, default_note("a run did not record its machine")
    if len(machines) != 1:
        return None, default_note("the runs trained on different machines")
    machine = str(next(iter(machines)))
    floor = read_floors(Path(cache_dir).expanduser() / FLOOR_FILE).get(machine)
    if floor is None:
        return None, default_note(f"no floor measured for {machine}")
    differ = differences(floor, runs)
    if not differ:
        return floor, floor.describe()
    return floor, (
        f"{floor.describe()} Warning: the floor was measured under other conditions than these runs "
        f"({'; '.join(differ)}): it only adds caution, but their noise may differ from it; measure it again on their "
        "config (`gptlab-sweep NAME --aa`)."
    )


def given(runs: list[Run], path: Path) -> tuple[Floor, str]:
    """--noise-floor PATH: (the floor in an A/A sweep dir's noise_floor.json, that file, or a store's entry for the
    machine the runs trained on, the report's line); used as measured, whatever outside load it was measured under
    (the line names it). ConfigError when PATH holds no floor for these runs; a damaged file is `damaged`."""
    file = Path(path).expanduser() / RECORD_FILE if Path(path).is_dir() else Path(path).expanduser()
    if not file.is_file():
        raise ConfigError(
            f"--noise-floor {path}: no such file; allowed: auto, none, an A/A sweep dir, its {RECORD_FILE} or a "
            f"{FLOOR_FILE}"
        )
    check = Check(file, "measure the floor again (`gptlab-sweep NAME --aa`), or give another --noise-floor")
    doc = check.mapping("the file", read_json(file, check.fix))
    if "speed_sd" in doc:  # one A/A's noise_floor.json
        floor = _floor_of(doc, str(doc.get("machine")), check, stored=False)
    else:
        floors, machines = read_floors(file), sorted({str(machine_id(r)) for r in runs})
        if len(machines) != 1 or machines[0] not in floors:
            raise ConfigError(
                f"--noise-floor {path}: no floor for the machine these runs trained on ({', '.join(machines)}); it "
                f"holds {', '.join(floors) or 'none'}"
            )
        floor = floors[machines[0]]
    quiet = "" if floor.quiet else " It was measured under outside load, not on a quiet machine: used as given."
    elsewhere = {machine_id(r) for r in runs} != {floor.machine}
    differ = differences(floor, runs) + ([f"machine {floor.machine} there"] if elsewhere else [])
    other = f" It was measured under other conditions than these runs ({'; '.join(differ)})." if differ else ""
    return floor, f"{floor.describe()} The floor is read from {file}.{quiet}{other}"


def choose(runs: list[Run], spec: str, sweep_dir: Path | None) -> tuple[Floor | None, str]:
    """gptlab-compare's --noise-floor: `none` the fixed heuristics, a path the floor it holds (given), `auto` an A/A
    sweep dir's own floor (its noise_floor.json) when that dir is compared, else the store's for the runs' machine."""
    if spec == "none":
        return lookup(runs, None)
    if spec != "auto":
        return given(runs, Path(spec))
    if sweep_dir is not None and (sweep_dir / RECORD_FILE).is_file():
        return given(runs, sweep_dir)
    return lookup(runs, cache_dir())


def load_limit(floor: Floor | None) -> float:
    """Outside load above which a run's speed is 'under load': the floor's conditions, else the fixed heuristic."""
    return floor.load_limit() if floor is not None else speed.OUTSIDE_LOAD_LIMIT


def mem_limit(floor: Floor | None) -> float:
    """Relative spread of peak memory between seeds of one config above which it is flagged."""
    return floor.mem_spread if floor is not None and floor.mem_spread is not None else MEM_SPREAD_DEFAULT

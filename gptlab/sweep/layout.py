"""The sweep directory layout, defined once: gptlab-sweep writes it (sweep/), gptlab-compare reads it (compare/).

```
<sweep dir>/sweep.yaml                  the definition as run: arms, seeds, lr grid, ladder, factors, aa, overrides
<sweep dir>/<arm>/seed<k>/              one run
<sweep dir>/<arm>/lr<v>/seed<k>/        under an lr grid (v as `{lr:g}`: lr0.001, lr0.0003, lr1e-05)
<sweep dir>/<arm>/<rung>/seed<k>/       on a scale ladder (rung: d_model64, n_layer2-d_model64, gpt2, ...)
<sweep dir>/<arm>/<rung>/lr<v>/seed<k>/ a ladder with an lr grid at every rung
<sweep dir>/.plan/plan.json             the latest launch: one entry per run with its `subdir` above
<sweep dir>/.plan/queue.json            the local queue's record of each run's state
<sweep dir>/.plan/refused.json          the latest plan's runs that cannot start: {subdir: the one-line reason}
<sweep dir>/timing.json                 the sweep's timing session (gptlab/study/timing.py runs it, compare reads it)
<sweep dir>/.timing.lock                held (flock) by the process running that session
<sweep dir>/.plan/earlier_timing/       sessions set aside when the sweep's arms changed (timing-<n>.json)
<sweep dir>/.plan/timing_job.json       under launcher=slurm: the one job that runs the session after the arrays
<sweep dir>/.submitit/timing/<job id>/  that job's submitit folder (not a run's: status skips it)
```
A factorial's cells are arms: `base` (every factor off) and the factors that are on joined with `+` (`gqa+sdpa`).
In the plan a run is named `<arm>__seed<k>` (`<arm>__lr<v>__seed<k>`, `<arm>__<rung>__seed<k>`,
`<arm>__<rung>__lr<v>__seed<k>`): its generated
config and its log carry that name. Each part has a formatter (used to write) and a parser (used to read) here.

compare/ imports this module, so it imports nothing beyond the standard library, yaml, gptlab.errors and gptlab.util.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import yaml

from gptlab.errors import ConfigError
from gptlab.util.stored import Check, read_json

SWEEP_FILE = "sweep.yaml"
PLAN_DIR = ".plan"  # inside the sweep dir: the generated configs, the plan, the queue, the launch log
PLAN_FILE = Path(PLAN_DIR) / "plan.json"  # relative to the sweep dir
QUEUE_FILE = "queue.json"  # in PLAN_DIR
REFUSED_FILE = Path(PLAN_DIR) / "refused.json"  # relative to the sweep dir
# the timing session: at the top, a result of the sweep like sweep.yaml (.plan/ holds the latest launch's working files)
TIMING_FILE = "timing.json"  # relative to the sweep dir
TIMING_LOCK = ".timing.lock"  # relative to the sweep dir (gptlab/train/timing.py LOCK_FILE in the folder it times into)
EARLIER_TIMING_DIR = Path(PLAN_DIR) / "earlier_timing"  # relative to the sweep dir
TIMING_JOB_FILE = Path(PLAN_DIR) / "timing_job.json"  # relative to the sweep dir
# the scheduler jobs (.submitit/ folders) of earlier launches when plan.json was written: not this plan's runs
EARLIER_JOBS_FILE = Path(PLAN_DIR) / "earlier_jobs.json"  # relative to the sweep dir
SUBMITIT_DIR = ".submitit"  # in the sweep dir: one folder per SLURM job (<array>_<task>, or <id>)
TIMING_JOB_DIR = Path(SUBMITIT_DIR) / "timing"  # relative to the sweep dir: the timing job's submitit folders

ARM_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")  # no '/', no leading '.' (.plan is not an arm)
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")  # a rung or factor name: no '+', no '/'
SEED_PART = re.compile(r"^seed(?P<seed>\d+)$")
LR_PART = re.compile(r"^lr(?P<lr>[0-9.eE+-]+)$")
RUN_SEP = "__"  # between the parts of a run's name in the plan (so '__' is refused in arm names)
BASE_ARM = "base"  # the factorial cell with every factor off
FACTOR_SEP = "+"


def is_arm_name(name: str) -> bool:
    """True for a name an arm may have: letters, digits and _ . + - (no '__', no '/', no leading '.')."""
    return bool(ARM_NAME.match(name)) and RUN_SEP not in name


def seed_part(seed: int) -> str:
    """The run dir of one seed: seed<k>."""
    return f"seed{seed}"


def parse_seed_part(name: str) -> int | None:
    """seed<k> -> k; None for any other name."""
    match = SEED_PART.match(name)
    return int(match["seed"]) if match else None


def lr_part(lr: float) -> str:
    """The folder of one learning rate of a grid: lr<v>, v as `{lr:g}` (the value optimizer.lr is given)."""
    return f"lr{lr:g}"


def parse_lr_part(name: str) -> float | None:
    """lr<v> -> v; None for any other name."""
    match = LR_PART.match(name)
    try:
        return float(match["lr"]) if match else None
    except ValueError:  # lr. or lre: the pattern's characters, not a number
        return None


def rung_name(parts: Iterable[tuple[str, str]]) -> str:
    """A ladder rung's folder from its (key, value) pairs: the preset for `model`, else d_model64, joined with '-'."""
    return "-".join(v if k == "model" else f"{k.rsplit('.', 1)[-1]}{v}" for k, v in parts)


def parse_rung_part(name: str) -> str | None:
    """The rung a folder between an arm and its seeds names; None for an lr grid's folder or another name."""
    return name if NAME.match(name) and not LR_PART.match(name) and not SEED_PART.match(name) else None


def cell_arm(on: Iterable[str]) -> str:
    """A factorial cell's arm from the factors that are on (in the file's order): base, a, a+b, ..."""
    return FACTOR_SEP.join(on) or BASE_ARM


def cell_factors(arm: str) -> list[str]:
    """The factors that are on in a factorial cell's arm (base -> [])."""
    return [] if arm == BASE_ARM else arm.split(FACTOR_SEP)


def run_subdir(arm: str, seed: int, lr: float | None = None, rung: str | None = None) -> str:
    """Where a run lives under the sweep dir: <arm>/seed<k>, <arm>/lr<v>/seed<k>, <arm>/<rung>/seed<k> or
    <arm>/<rung>/lr<v>/seed<k>."""
    return "/".join(_parts(arm, seed, lr, rung))


def run_name(arm: str, seed: int, lr: float | None = None, rung: str | None = None) -> str:
    """A run's name in the plan: <arm>__seed<k>, <arm>__lr<v>__seed<k> or <arm>__<rung>__seed<k>."""
    return RUN_SEP.join(_parts(arm, seed, lr, rung))


def _parts(arm: str, seed: int, lr: float | None, rung: str | None) -> list[str]:
    return [arm, *([rung] if rung is not None else []), *([lr_part(lr)] if lr is not None else []), seed_part(seed)]


GRID_HELP = "comma-separated numbers (3e-4,1e-3,3e-3) or LOW:HIGH:N (1e-4:1e-2:5, N >= 2)"


def parse_lr_grid(text) -> list[float]:
    """`3e-4,1e-3,3e-3`, `1e-4:1e-2:5` (5 log-spaced values, both ends included) or a list of numbers: at least two,
    each positive, finite and run as given (optimizer.lr and the folder get `{lr:g}`, 6 significant digits, so two
    values that format alike would train one lr into one folder)."""
    try:
        if isinstance(text, (list, tuple)):
            if any(isinstance(v, bool) or not isinstance(v, (int, float, str)) for v in text):
                raise ValueError
            values = [float(v) for v in text]
        elif ":" in str(text):
            low, high, count = str(text).split(":")
            n = int(count)
            if n < 2:
                raise ValueError
            a, b = math.log10(float(low)), math.log10(float(high))
            values = [float(f"{10 ** (a + (b - a) * i / (n - 1)):.6g}") for i in range(n)]
        else:
            values = [float(v) for v in str(text).split(",")]
    except (ValueError, TypeError):
        raise ConfigError(f"lr grid {text!r}: allowed: {GRID_HELP}") from None
    bad = next((v for v in values if not (v > 0 and math.isfinite(v))), None)
    if bad is not None:
        raise ConfigError(f"lr grid {text!r}: {bad:g} is not a learning rate; allowed: numbers > 0 and finite")
    if len(values) < 2:
        raise ConfigError(f"lr grid {text!r}: one lr has no best lr to pick; allowed: {GRID_HELP}")
    seen: dict[str, float] = {}
    for value in values:
        part = lr_part(value)
        if part in seen:
            same = "is given twice" if seen[part] == value else f"and {seen[part]!r} both run as {part}"
            raise ConfigError(f"lr grid {text!r}: {value!r} {same}; allowed: distinct learning rates")
        if float(part.removeprefix("lr")) != value:
            raise ConfigError(
                f"lr grid {text!r}: {value!r} would run as {part.removeprefix('lr')} ({part}); give at most 6 "
                "significant digits"
            )
        seen[part] = value
    return values


@dataclass(frozen=True)
class SweepRecord:
    """A sweep dir's sweep.yaml: what gptlab-sweep ran, as it recorded it."""

    arms: list[str]  # in the definition's order (the first is the baseline)
    seeds: list[int]
    lrs: list[float] | None  # the lr grid, None without one
    ladder: dict[str, list[str]] | None  # {size key: its values as text}, None without a ladder
    factors: list[str]  # a factorial's factor names in order, [] otherwise
    aa: int | None  # an A/A sweep's number of identical arms
    record: dict  # the mapping as written (a re-run refuses a different one)


def read_sweep(sweep_dir: Path, strict: bool = True) -> SweepRecord | None:
    """The sweep.yaml of sweep_dir, None when it has none; a damaged one is a ConfigError naming the file, or with
    strict=False None as well (a reader that can do without it reads the folders alone)."""
    path = sweep_dir / SWEEP_FILE
    if not path.is_file():
        return None
    try:
        return _record(path)
    except ConfigError:
        if strict:
            raise
        return None


def _record(path: Path) -> SweepRecord:
    try:
        doc = yaml.safe_load(path.read_text()) or {}
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"{path}: cannot be read ({err})") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML ({' '.join(str(err).split())[:200]})") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"{path}: not a sweep record (a mapping with 'arms', 'seeds', ...)")
    arms, seeds, ladder, factors = doc.get("arms") or {}, doc.get("seeds", [0]), doc.get("ladder"), doc.get("factors")
    if not isinstance(arms, dict):
        raise ConfigError(f"{path}: arms: {arms!r}; allowed: a mapping of arm names to overrides")
    if not isinstance(seeds, list) or not all(type(s) is int for s in seeds):
        raise ConfigError(f"{path}: seeds: {seeds!r}; allowed: a list of integers")
    if ladder is not None and not (isinstance(ladder, dict) and all(isinstance(v, list) for v in ladder.values())):
        raise ConfigError(f"{path}: ladder: {ladder!r}; allowed: a mapping of size keys to lists of values")
    try:
        lrs = parse_lr_grid(doc["lr_grid"]) if doc.get("lr_grid") is not None else None
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from None
    return SweepRecord(
        arms=[str(a) for a in arms],
        seeds=list(seeds),
        lrs=lrs,
        ladder={str(k): [str(v) for v in values] for k, values in ladder.items()} if ladder else None,
        factors=[str(f) for f in factors] if isinstance(factors, dict) else [],
        aa=doc["aa"] if type(doc.get("aa")) is int else None,
        record=doc,
    )


def read_plan(sweep_dir: Path) -> list[dict]:
    """plan.json of the sweep dir's latest launch ([] if it never launched); a damaged one (not JSON, an entry
    without its arm and integer seed) is a one-line ConfigError naming it and what to do; an entry without a name
    gets the one gptlab-sweep gives it."""
    path = sweep_dir / PLAN_FILE
    then = "then launch the sweep again: it reads what each run left in its own dir, keeps the finished runs and writes"
    check = Check(path, f"{set_aside(path)}, {then} a new plan")
    plan = read_json(check.path, check.fix, missing=[])
    if not isinstance(plan, list):
        raise check.fail(f"expected a list of planned runs, got {type(plan).__name__}")
    for i, entry in enumerate(plan):
        entry = check.mapping(f"entry {i}", entry)
        check.text(f"entry {i} name", entry.get("name"), null=True)
        check.text(f"entry {i} arm", entry.get("arm"))
        check.number(f"entry {i} seed", entry.get("seed"), "", int)
        check.text(f"entry {i} subdir", entry.get("subdir"), null=True)
        if entry.get("name") is None:  # a plan written before entries were named: the name gptlab-sweep gives
            entry["name"] = run_name(entry["arm"], entry["seed"], entry.get("lr"), entry.get("rung"))
    return plan


def set_aside(path: Path) -> str:
    """The advice that moves a damaged record out of the way, as a command to paste: `mv <path> <path>.damaged`."""
    return f"move it aside ({shlex.join(['mv', str(path), f'{path}.damaged'])})"


def planned_subdir(entry) -> str | None:
    """The run dir (under the sweep dir) of one plan.json entry: its `subdir`, or <arm>/seed<k> for a plan written
    before entries had one; None for an entry that names no run."""
    if not isinstance(entry, dict):
        return None
    if isinstance(entry.get("subdir"), str) and entry["subdir"]:
        return entry["subdir"]
    if "arm" in entry and "seed" in entry:
        return run_subdir(str(entry["arm"]), entry["seed"])
    return None


def read_refused(sweep_dir: Path) -> dict[str, str]:
    """refused.json of the sweep dir's latest plan: {run subdir: why it cannot start} ({} when none was written); a
    damaged one is a ConfigError naming the file."""
    path = sweep_dir / REFUSED_FILE
    if not path.is_file():
        return {}
    try:
        doc = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise ConfigError(f"{path}: cannot be read ({err}); re-run the sweep to plan it again") from None
    if not isinstance(doc, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in doc.items()):
        raise ConfigError(f"{path}: not a mapping of run dirs to reasons; re-run the sweep to plan it again")
    return doc

"""A sweep as one launch: every pending (arm, seed) run becomes one generated config, and one command runs them all.

The plan: every arm x seed (x lr of a grid, x rung of a ladder) of a sweep, less the runs that finished with the
same config (`finished`) or are in flight; failed and never-run runs are launched again (`pending`). The runs are
launched interleaved (`interleave`): seed-major with the arms shuffled per seed, in the local queue's order and the
SLURM array's index order alike.

For each run the sweep file's shared overrides, the arm's overrides and the command line's extra overrides (in that
order, later wins, as before) are written as `<sweep dir>/.plan/sweep_run/<arm>__seed<k>.yaml`, a `# @package
_global_` config: group choices go into its defaults list (`override /attention: gqa`), keys into its body. One
`gptlab-train -m +sweep_run=a__seed0,b__seed1,... hydra.searchpath=[file://<sweep dir>/.plan]` then composes
exactly the configs the per-arm commands composed (a test checks they are equal), so a SLURM launcher submits one
job array for the whole sweep and run dirs stay `<sweep dir>/<arm>/seed<k>` (gptlab/sweep/layout.py).

Overrides of Hydra itself (hydra.*, launcher=..., hydra/...=...) are launch settings, not run settings: they stay
on the command line.
"""

from __future__ import annotations

import json
import os
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import yaml
from hydra.core.override_parser.overrides_parser import OverridesParser

from gptlab.errors import ConfigError
from gptlab.sweep.design import Rung
from gptlab.sweep.layout import (
    EARLIER_JOBS_FILE,
    PLAN_DIR,
    PLAN_FILE,
    REFUSED_FILE,
    SUBMITIT_DIR,
    run_name,
    run_subdir,
)
from gptlab.sweep.process import record
from gptlab.sweep.status import sweep_status
from gptlab.util.io import atomic_write_text
from gptlab.util.paths import CONF_DIR, SWEEP_RUN_GROUP
from gptlab.util.stored import read_json, read_yaml

LAUNCH_GROUPS = ("launcher", "tune")  # groups that configure Hydra (the launch), not the run
IN_FLIGHT = ("running", "pending", "requeued")  # states of a run that is not launched again

# a sweep file's `command`: (console script, its module, its Hydra config, the file a finished run has written)
COMMANDS = {
    "train": ("gptlab-train", "gptlab.cli.train", "train", "summary.json"),
    "decode": ("gptlab-decode", "gptlab.cli.decode", "decode", "decode.json"),
}


@dataclass(frozen=True)
class PlannedRun:
    """One (arm, seed) run of a sweep, (arm, lr, seed) under an lr grid or (arm, rung, seed) on a scale ladder, and
    the overrides that compose it (seed, arm, optimizer.lr and the rung's sizes included)."""

    arm: str
    seed: int
    overrides: tuple[str, ...]
    lr: float | None = None
    rung: str | None = None  # a ladder rung's name (gptlab/sweep/design.py)

    @property
    def name(self) -> str:
        return run_name(self.arm, self.seed, self.lr, self.rung)

    def subdir(self) -> str:
        """Where the run lives under the sweep dir (gptlab/sweep/layout.py)."""
        return run_subdir(self.arm, self.seed, self.lr, self.rung)

    def run_dir(self, sweep_dir: Path) -> Path:
        return sweep_dir / self.subdir()


def is_launch_setting(override: str) -> bool:
    """hydra.*, hydra/<group>=..., launcher=..., tune=...: how runs are launched, not what they compute."""
    key = override.lstrip("+~").split("=", 1)[0]
    return key.startswith(("hydra.", "hydra/")) or key in LAUNCH_GROUPS


def _primary_groups() -> set[str]:
    """The groups conf/train.yaml's defaults list names (those are `override`n; any other group is added)."""
    defaults = yaml.safe_load((CONF_DIR / "train.yaml").read_text()).get("defaults", [])
    return {next(iter(d)).removeprefix("override ") for d in defaults if isinstance(d, dict)}


def _groups() -> set[str]:
    return {p.name for p in CONF_DIR.iterdir() if p.is_dir() and p.name != "hydra"}


def _set(body: dict, dotted: str, value) -> None:
    node = body
    *parents, leaf = dotted.split(".")
    for part in parents:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"{dotted}: a parent of this key was set to a value earlier in the same run")
    node[leaf] = value


def run_config(run: PlannedRun) -> str:
    """The `# @package _global_` YAML that composes `run` (its overrides) when added with +sweep_run=<name>."""
    groups, primary = _groups(), _primary_groups()
    choices: dict[str, object] = {}
    body: dict = {}
    for override in OverridesParser.create().parse_overrides(list(run.overrides)):
        text = override.input_line or override.key_or_group
        if override.is_delete() or override.is_sweep_override():
            raise ConfigError(
                f"arm '{run.arm}': {text}: a sweep arm cannot delete keys or sweep values; list runs as arms"
            )
        key = override.key_or_group
        if key in groups and override.package is None:
            choices[key] = override.value()  # a group choice (a list for logger=[a,b])
        else:
            _set(body, key, override.value())
    defaults = [
        {f"override /{group}" if group in primary else f"/{group}": choice} for group, choice in choices.items()
    ]
    body.setdefault("hydra", {}).setdefault("sweep", {})["subdir"] = run.subdir()  # this job's run dir
    doc = {"defaults": [*defaults, "_self_"], **body}
    return "# @package _global_\n" + yaml.safe_dump(doc, sort_keys=False)


def write_plan(sweep_dir: Path, runs: list[PlannedRun]) -> Path:
    """The generated configs and plan.json (run order = Hydra job number = array task index; the scheduler jobs of
    earlier launches in earlier_jobs.json); returns the folder to put on hydra.searchpath."""
    folder = sweep_dir / PLAN_DIR
    (folder / SWEEP_RUN_GROUP).mkdir(parents=True, exist_ok=True)
    for run in runs:
        atomic_write_text(folder / SWEEP_RUN_GROUP / f"{run.name}.yaml", run_config(run))
    launcher = record(os.getpid())
    plan = [
        {
            "name": r.name,
            "arm": r.arm,
            "seed": r.seed,
            "lr": r.lr,
            "rung": r.rung,
            "subdir": r.subdir(),
            "overrides": list(r.overrides),
            "launcher": launcher,  # the process that launches it: while it lives, a run not yet started is pending
        }
        for r in runs
    ]
    # the jobs already in .submitit/ belong to earlier launches: status matches this plan's runs to the jobs after them
    earlier = sorted(p.name for p in (sweep_dir / SUBMITIT_DIR).glob("*"))
    atomic_write_text(sweep_dir / EARLIER_JOBS_FILE, json.dumps(earlier) + "\n")
    atomic_write_text(sweep_dir / PLAN_FILE, json.dumps(plan, indent=1) + "\n")
    return folder


def write_refused(sweep_dir: Path, refused: list[tuple[PlannedRun, str]]) -> None:
    """refused.json: the runs of this plan that cannot start, each with its reason (rewritten at every plan, so a
    run that can start again is no longer listed)."""
    (sweep_dir / PLAN_DIR).mkdir(parents=True, exist_ok=True)
    doc = {run.subdir(): why for run, why in refused}
    atomic_write_text(sweep_dir / REFUSED_FILE, json.dumps(doc, indent=1) + "\n")


def cannot_start(overrides: list[str], seed: int, command: str = "train") -> str | None:
    """Why gptlab-train would refuse a run of these overrides at start (every key's range and the rules between keys,
    e.g. lr * weight_decay < 1), else None. Hardware and data are not checked: the launch may run elsewhere, and an
    arm that does not compose is the arm check's (gptlab/sweep/identity.py)."""
    from gptlab.config.build import compose
    from gptlab.config.schema import check_schema
    from gptlab.config.validate import CROSS_RULES

    try:
        cfg = compose([*overrides, f"seed={seed}"], COMMANDS[command][2])
    except Exception:  # noqa: BLE001 - Hydra's composition errors: the arm check words them
        return None
    try:
        check_schema(cfg)
        for rule in CROSS_RULES:
            rule(cfg)
    except ConfigError as err:
        return " ".join(str(err).split())
    return None


# a path Hydra reads back unquoted as this same string (the '/' keeps it from reading as a number, bool or null)
PLAIN_VALUE = re.compile(r"(?=.*/)[\w/.:+@%-]+(?: [\w/.:+@%-]+)*", re.ASCII)


def quoted(value: str) -> str:
    """`value` as a Hydra override value read back exactly, whatever it holds: as it is when Hydra reads it so (a
    plain path, inner spaces too), else single-quoted (commas, '=', brackets, quotes, outer spaces, non-ASCII), a
    quote escaped and so the backslashes before a quote or the end; `${` escaped (`\\${`), which OmegaConf would
    otherwise resolve as an interpolation (a folder named `a${x}` would name another key's value)."""
    if PLAIN_VALUE.fullmatch(value):
        return value
    # OmegaConf reads `\${` as a literal `${`, and `\\` before `${` as one backslash: double those, then escape
    value = re.sub(r"(\\*)\$\{", lambda m: m.group(1) * 2 + "\\${", value)
    return "'" + re.sub(r"(\\*)('|\Z)", lambda m: m.group(1) * 2 + ("\\'" if m.group(2) else ""), value) + "'"


def launch_command(runs: list[PlannedRun], sweep_dir: Path, launch: list[str], script: str = "gptlab-train") -> list:
    """The one multirun command that runs `runs`: +sweep_run=<names> over the generated configs."""
    return [
        script,
        "-m",
        f"+{SWEEP_RUN_GROUP}={','.join(r.name for r in runs)}",
        f"hydra.searchpath=[{quoted(f'file://{sweep_dir / PLAN_DIR}')}]",
        f"hydra.sweep.dir={quoted(str(sweep_dir))}",  # each run's hydra.sweep.subdir is in its generated config
        *launch,
    ]


def single_command(run: PlannedRun, sweep_dir: Path, script: str = "gptlab-train") -> list[str]:
    """One run of the plan on its own (the local queue): its generated config, its own run dir."""
    return [
        script,
        f"+{SWEEP_RUN_GROUP}={run.name}",
        f"hydra.searchpath=[{quoted(f'file://{sweep_dir / PLAN_DIR}')}]",
        f"hydra.run.dir={quoted(str(run.run_dir(sweep_dir)))}",
    ]


def plain_command(run: PlannedRun, sweep_dir: Path, script: str = "gptlab-train") -> list[str]:
    """One run as a plain command, ready to paste: the config its generated file composes, in its own run dir."""
    return [script, *run.overrides, f"hydra.run.dir={quoted(str(run.run_dir(sweep_dir)))}"]


def planned_overrides(name: str, spec: dict, arm: str, extra: list[str]) -> list[str]:
    """The overrides shared by every seed of one arm (seed and Hydra dirs are added per call)."""
    return [*spec["overrides"], *spec["arms"][arm], *extra, f"sweep={name}", f"arm={arm}"]


def finished(run_dir: Path, overrides: list[str], seed: int, command: str = "train") -> bool:
    """True when run_dir holds a finished run whose saved config equals the one these overrides compose."""
    _, _, config_name, result = COMMANDS[command]
    summary, saved = run_dir / result, run_dir / ".hydra" / "config.yaml"
    if not (summary.is_file() and saved.is_file()):
        return False
    fix = f"restore the run from a copy, or move {run_dir} aside and launch the sweep again (it runs it again)"
    done = read_json(summary, fix)
    if command == "train" and (not isinstance(done, dict) or done.get("status") != "finished"):
        return False
    from omegaconf import OmegaConf

    from gptlab.config.build import compose

    cfg = compose([*overrides, f"seed={seed}"], config_name)
    wanted = {k: v for k, v in cast(dict, OmegaConf.to_container(cfg, resolve=False)).items() if k != "hydra"}
    return read_yaml(saved, fix) == wanted


@dataclass
class Pending:
    """What a (re-)run of a sweep launches: the runs, and how many it skips as finished and which as in flight."""

    runs: list[PlannedRun]
    skipped: int  # finished with the same config
    in_flight: list[tuple[str, str]]  # (run name, its state)
    refused: list[tuple[PlannedRun, str]] = field(default_factory=list)  # runs that cannot start, with the reason


def pending(
    name: str,
    spec: dict,
    seeds: list[int],
    sweep_dir: Path,
    extra: list[str],
    lrs: list[float] | None = None,
    ladder: list[Rung] | None = None,
) -> Pending:
    """The runs to launch: every arm x rung x lr x seed but the finished ones and those in flight (live, or queued by
    a launcher that lives: gptlab/sweep/status.py); failed, stopped and never-run runs are launched. Under an lr grid
    a run that cannot start at its lr is planned as refused, with the reason."""
    for arm, overrides in spec["arms"].items():
        if any(is_launch_setting(o) for o in overrides):
            raise ConfigError(f"arm '{arm}': launch settings (hydra.*, launcher=) belong in the sweep's overrides")
    command = spec.get("command", "train")
    # every run of the grid, not only the latest plan's: a run an earlier, killed launch started may still be live
    grid_arms = {arm: list(seeds) for arm in spec["arms"]}
    rung_names = [r.name for r in ladder] if ladder else None
    flight = {s.name: s.state for s in sweep_status(sweep_dir, grid_arms, lrs, rung_names) if s.state in IN_FLIGHT}
    out = Pending([], 0, [])
    grid: list[float | None] = list(lrs) if lrs else [None]
    steps: list[Rung | None] = list(ladder) if ladder else [None]
    why: dict[tuple, str | None] = {}  # (arm, lr, rung) -> why its runs cannot start; checked once per cell
    for arm in spec["arms"]:
        overrides = [o for o in planned_overrides(name, spec, arm, extra) if not is_launch_setting(o)]
        for seed, lr, rung in [(s, lr, r) for r in steps for lr in grid for s in seeds]:
            given = overrides + ([f"optimizer.lr={lr:g}"] if lr else []) + (list(rung.overrides) if rung else [])
            run = PlannedRun(arm, seed, tuple([*given, f"seed={seed}"]), lr, rung.name if rung else None)
            if finished(run.run_dir(sweep_dir), given, seed, command):
                out.skipped += 1
            elif run.name in flight:
                out.in_flight.append((run.name, flight[run.name]))
            elif refusal := _refusal(why, run, given, command):
                out.refused.append((run, refusal))
            else:
                out.runs.append(run)
    out.runs = interleave(out.runs, name)
    return out


def _refusal(cache: dict[tuple, str | None], run: PlannedRun, given: list[str], command: str) -> str | None:
    """Why an lr grid's run cannot start (the lr is what varies: one check per arm, lr and rung), else None."""
    if run.lr is None:
        return None
    key = (run.arm, run.lr, run.rung)
    if key not in cache:
        cache[key] = cannot_start(given, run.seed, command)
    return cache[key]


def interleave(runs: list[PlannedRun], salt: str) -> list[PlannedRun]:
    """Runs in launch order: seed-major (every arm's seed 0, then every arm's seed 1, ...), rungs and lrs next, and
    the arms in an order shuffled per block from the sweep's name and the seed, so neither time nor a load that
    changes during the sweep can stand in for an arm (an arm-major queue made 'MQA 2.1x faster' out of falling load).
    Deterministic: the same sweep gives the same order."""
    arms = list(dict.fromkeys(r.arm for r in runs))
    seeds = list(dict.fromkeys(r.seed for r in runs))
    rungs = list(dict.fromkeys(r.rung for r in runs))
    lrs = list(dict.fromkeys(r.lr for r in runs))
    ranks = {}
    for seed in seeds:
        order = arms[:]
        random.Random(f"{salt}|seed{seed}").shuffle(order)
        ranks[seed] = {arm: i for i, arm in enumerate(order)}
    return sorted(runs, key=lambda r: (seeds.index(r.seed), rungs.index(r.rung), lrs.index(r.lr), ranks[r.seed][r.arm]))

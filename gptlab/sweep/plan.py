"""A sweep as one launch: every pending (arm, seed) run becomes one generated config, and one command runs them all.

For each run the sweep file's shared overrides, the arm's overrides and the command line's extra overrides (in that
order, later wins, as before) are written as `<sweep dir>/.plan/sweep_run/<arm>__seed<k>.yaml`, a `# @package
_global_` config: group choices go into its defaults list (`override /attention: gqa`), keys into its body. One
`gptlab-train -m +sweep_run=a__seed0,b__seed1,... hydra.searchpath=[file://<sweep dir>/.plan]` then composes
exactly the configs the per-arm commands composed (a test checks they are equal), so a SLURM launcher submits one
job array for the whole sweep and run dirs stay `<sweep dir>/<arm>/seed<k>`.

Overrides of Hydra itself (hydra.*, launcher=..., hydra/...=...) are launch settings, not run settings: they stay
on the command line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import yaml
from hydra.core.override_parser.overrides_parser import OverridesParser

from gptlab.config.build import SWEEP_RUN_GROUP
from gptlab.errors import ConfigError
from gptlab.util.io import atomic_write_text
from gptlab.util.paths import CONF_DIR

PLAN_DIR = ".plan"  # inside the sweep dir: the generated configs, the plan, the launch log
LAUNCH_GROUPS = ("launcher", "tune")  # groups that configure Hydra (the launch), not the run


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
        middle = f"__lr{self.lr:g}" if self.lr is not None else f"__{self.rung}" if self.rung is not None else ""
        return f"{self.arm}{middle}__seed{self.seed}"

    def subdir(self) -> str:
        """Where the run lives under the sweep dir: <arm>/seed<k>, <arm>/lr<value>/seed<k> under an lr grid, or
        <arm>/<rung>/seed<k> on a ladder."""
        middle = f"lr{self.lr:g}/" if self.lr is not None else f"{self.rung}/" if self.rung is not None else ""
        return f"{self.arm}/{middle}seed{self.seed}"

    def run_dir(self, sweep_dir: Path) -> Path:
        return sweep_dir / self.subdir()


def parse_lr_grid(text) -> list[float]:
    """`3e-4,1e-3,3e-3`, `1e-4:1e-2:5` (5 log-spaced values, both ends included) or a list of numbers."""
    import math

    try:
        if isinstance(text, (list, tuple)):
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
    except ValueError:
        raise ConfigError(
            f"lr grid {text!r}: allowed: comma-separated numbers (3e-4,1e-3,3e-3) or LOW:HIGH:N (1e-4:1e-2:5, N >= 2)"
        ) from None
    if not values or any(not (v > 0 and math.isfinite(v)) for v in values) or len(set(values)) != len(values):
        raise ConfigError(f"lr grid {text!r}: every learning rate must be a distinct number > 0")
    return values


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
    """The generated configs and plan.json (run order = Hydra job number = array task index); returns the folder
    to put on hydra.searchpath."""
    folder = sweep_dir / PLAN_DIR
    (folder / SWEEP_RUN_GROUP).mkdir(parents=True, exist_ok=True)
    for run in runs:
        atomic_write_text(folder / SWEEP_RUN_GROUP / f"{run.name}.yaml", run_config(run))
    plan = [
        {
            "name": r.name,
            "arm": r.arm,
            "seed": r.seed,
            "lr": r.lr,
            "rung": r.rung,
            "subdir": r.subdir(),
            "overrides": list(r.overrides),
        }
        for r in runs
    ]
    atomic_write_text(folder / "plan.json", json.dumps(plan, indent=1) + "\n")
    return folder


def read_plan(sweep_dir: Path) -> list[dict]:
    """plan.json of the sweep dir's latest launch ([] if it never launched)."""
    try:
        plan = json.loads((sweep_dir / PLAN_DIR / "plan.json").read_text())
    except (OSError, ValueError):
        return []
    return plan if isinstance(plan, list) else []


def launch_command(runs: list[PlannedRun], sweep_dir: Path, launch: list[str], script: str = "gptlab-train") -> list:
    """The one multirun command that runs `runs`: +sweep_run=<names> over the generated configs."""
    return [
        script,
        "-m",
        f"+{SWEEP_RUN_GROUP}={','.join(r.name for r in runs)}",
        f"hydra.searchpath=[file://{sweep_dir / PLAN_DIR}]",
        f"hydra.sweep.dir={sweep_dir}",  # each run's hydra.sweep.subdir is in its generated config
        *launch,
    ]


def single_command(run: PlannedRun, sweep_dir: Path, script: str = "gptlab-train") -> list[str]:
    """One run of the plan on its own (the local queue): its generated config, its own run dir."""
    return [
        script,
        f"+{SWEEP_RUN_GROUP}={run.name}",
        f"hydra.searchpath=[file://{sweep_dir / PLAN_DIR}]",
        f"hydra.run.dir={run.run_dir(sweep_dir)}",
    ]

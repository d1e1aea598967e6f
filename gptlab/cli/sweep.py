"""gptlab-sweep NAME: run an ablation from sweeps/NAME.yaml, every arm x seed in one launch, into one sweep dir.

A sweep file lists `arms` (name -> overrides), `seeds`, and shared `overrides`. Every run lands in
<out>/<arm>/seed<k>/ with `sweep=<name>` (the W&B group), the same data_seed and eval steps. Re-running the same
command skips runs that finished with the same overrides or are still in flight, and launches the failed and
never-run ones (a run resumes from its own checkpoint: train.resume=auto in the same run dir).

One launch (gptlab/sweep/plan.py): each pending run becomes a generated config; `launcher=slurm` (or any Hydra
launcher) gets ONE `gptlab-train -m +sweep_run=...` multirun, i.e. one job array; with no launcher or
`launcher=local` the local queue (gptlab/sweep/queue.py) runs them, as many at once as the machine has slots.
`--detach` returns once the runs are queued; `gptlab-sweep status DIR` shows each run's state. A
`hydra.sweep.dir=DIR` override is the same as `--out DIR`. `command: decode` in the file runs `gptlab-decode`
instead (a run is finished once it wrote decode.json).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import cast

import yaml

from gptlab.cli import fail
from gptlab.errors import ConfigError
from gptlab.runtime.hardware import thread_choice
from gptlab.sweep.aa import aa_spec, parse_aa
from gptlab.sweep.design import Rung, factorial_arms, ladder_conflicts, parse_ladder, rungs
from gptlab.sweep.plan import PLAN_DIR, PlannedRun, is_launch_setting, launch_command, parse_lr_grid, write_plan
from gptlab.sweep.queue import Queue, Slots, plan_slots
from gptlab.sweep.status import format_status, job_ids, sweep_status
from gptlab.util.io import atomic_write_text
from gptlab.util.paths import SWEEPS_DIR

LAUNCHED = "launched.json"  # written once the runs are queued (what --detach waits for)

# a sweep file's `command`: (console script, its module, its Hydra config, the file a finished run has written)
COMMANDS = {
    "train": ("gptlab-train", "gptlab.cli.train", "train", "summary.json"),
    "decode": ("gptlab-decode", "gptlab.cli.decode", "decode", "decode.json"),
}


def load_sweep(name: str) -> tuple[str, dict, Path]:
    """(name, definition, file) for a sweep name in sweeps/ or a path to a sweep YAML."""
    path = Path(name) if name.endswith((".yaml", ".yml")) else SWEEPS_DIR / f"{name}.yaml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in SWEEPS_DIR.glob("*.yaml")))
        raise ConfigError(f"sweep '{name}': no such sweep file; available: {known}")
    try:
        spec = yaml.load(path.read_text(), Loader=_UniqueKeys) or {}  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML ({' '.join(str(err).split())[:200]})") from None
    except ConfigError as err:  # a key given twice: name the file
        raise ConfigError(f"{path}: {err}") from None
    if not isinstance(spec, dict):
        raise ConfigError(f"{path}: a sweep file is a mapping with 'arms' (and optional 'seeds', 'overrides')")
    if "factors" in spec:  # a 2^k factorial: the arms are generated (gptlab/sweep/design.py)
        if "arms" in spec:
            raise ConfigError(f"{path}: give 'factors' (the 2^k arms are generated from them) or 'arms', not both")
        try:
            spec["arms"] = factorial_arms(spec["factors"])
        except ConfigError as err:
            raise ConfigError(f"{path}: {err}") from None
    if not isinstance(spec.get("arms"), dict) or not spec["arms"]:
        raise ConfigError(f"{path}: 'arms' must map arm names to lists of overrides")
    _check_spec(path, spec)
    if spec.get("command", "train") not in COMMANDS:
        raise ConfigError(f"{path}: command: {spec['command']!r} is not allowed; allowed: {', '.join(COMMANDS)}")
    spec.setdefault("seeds", [0])
    spec.setdefault("overrides", [])
    return path.stem, spec, path


SPEC_KEYS = ("description", "seeds", "overrides", "arms", "command", "lr_grid", "ladder", "factors", "aa")
ARM_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")


class _UniqueKeys(yaml.SafeLoader):
    """A YAML loader that refuses a key given twice in one mapping (PyYAML keeps the last without a word)."""


def _no_duplicates(loader, node, deep=False):
    keys = [loader.construct_object(k, deep=deep) for k, _ in node.value]
    twice = sorted({str(k) for k in keys if keys.count(k) > 1})
    if twice:
        raise ConfigError(f"key '{twice[0]}' is given twice in one mapping (line {node.start_mark.line + 1})")
    return loader.construct_mapping(node, deep=deep)


_UniqueKeys.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _no_duplicates)


def _check_spec(path: Path, spec: dict) -> None:
    """A sweep file's keys, arm names, seeds and override lists, before anything runs (one line per refusal)."""
    unknown = sorted(str(k) for k in spec if k not in SPEC_KEYS)
    if unknown:
        raise ConfigError(f"{path}: '{unknown[0]}' is not a sweep file key; allowed: {', '.join(SPEC_KEYS)}")
    for arm, overrides in (spec.get("arms") or {}).items():
        if not isinstance(arm, str) or not ARM_NAME.match(arm) or "__" in arm:
            raise ConfigError(f"{path}: arm name {arm!r}: allowed: letters, digits and _ . + - (no '__', no '/')")
        if not isinstance(overrides, list) or not all(isinstance(o, str) for o in overrides):
            raise ConfigError(f"{path}: arm '{arm}' must be a list of override strings, got {overrides!r}")
    seeds = spec.get("seeds", [0])
    if not isinstance(seeds, list) or not seeds or not all(type(s) is int and 0 <= s < 2**63 for s in seeds):
        raise ConfigError(f"{path}: seeds: {seeds!r}; allowed: a non-empty list of integers in [0, 2**63)")
    if len(set(seeds)) != len(seeds):
        raise ConfigError(f"{path}: seeds: {seeds!r} lists a seed twice (it would count as two seeds)")
    overrides = spec.get("overrides", [])
    if not isinstance(overrides, list) or not all(isinstance(o, str) for o in overrides):
        raise ConfigError(f"{path}: overrides must be a list of override strings, got {overrides!r}")


def config_name(spec: dict) -> str:
    """The Hydra config the sweep's command composes (train, or decode for `command: decode`)."""
    return COMMANDS[spec.get("command", "train")][2]


def planned_overrides(name: str, spec: dict, arm: str, extra: list[str]) -> list[str]:
    """The overrides shared by every seed of one arm (seed and Hydra dirs are added per call)."""
    return [*spec["overrides"], *spec["arms"][arm], *extra, f"sweep={name}", f"arm={arm}"]


def finished(run_dir: Path, overrides: list[str], seed: int, command: str = "train") -> bool:
    """True when run_dir holds a finished run whose saved config equals the one these overrides compose."""
    _, _, config_name, result = COMMANDS[command]
    summary, saved = run_dir / result, run_dir / ".hydra" / "config.yaml"
    if not (summary.is_file() and saved.is_file()):
        return False
    if command == "train" and json.loads(summary.read_text()).get("status") != "finished":
        return False
    from omegaconf import OmegaConf

    from gptlab.config.build import compose

    cfg = compose([*overrides, f"seed={seed}"], config_name)
    wanted = {k: v for k, v in cast(dict, OmegaConf.to_container(cfg, resolve=False)).items() if k != "hydra"}
    return yaml.safe_load(saved.read_text()) == wanted


def arm_identity(overrides: list[str], seed: int, command: str = "train") -> tuple[str, dict, list[str]]:
    """(model fingerprint, flat config without hydra, no-op warnings) of one arm, built on the meta device."""
    from omegaconf import OmegaConf

    from gptlab.config.build import build_model, compose
    from gptlab.config.noop import noop_choices
    from gptlab.model.fingerprint import model_fingerprint
    from gptlab.util.tree import flatten

    cfg = compose([*overrides, f"seed={seed}"], COMMANDS[command][2])
    # The vocabulary comes from the tokenizer at run time; arms of one data setup share it, so any size compares.
    model = build_model(cfg, vocab_size=256, device="meta")
    plain = {k: v for k, v in cast(dict, OmegaConf.to_container(cfg, resolve=False)).items() if k != "hydra"}
    return model_fingerprint(model), flatten(plain, empty_as_leaf=True), noop_choices(cfg)


def identity_warnings(name: str, spec: dict, extra: list[str], seed: int) -> tuple[list[str], list[str]]:
    """(warnings, errors): no-op choices per arm, one line per pair of arms that build the identical model."""
    from gptlab.compare.group import is_bookkeeping
    from gptlab.compare.identical import model_only

    warnings, errors, seen = [], [], {}  # type: list[str], list[str], dict[str, tuple[str, dict]]
    for arm in spec["arms"]:
        try:
            fingerprint, flat, noops = arm_identity(
                planned_overrides(name, spec, arm, extra), seed, spec.get("command", "train")
            )
        except Exception as err:  # noqa: BLE001 - Hydra and build errors alike: name the arm, one line
            errors.append(f"[{name}] arm '{arm}' does not build: {str(err).strip().splitlines()[0]}")
            continue
        warnings += [f"[{name}] warning: arm '{arm}': {line}" for line in noops]
        for other, (their_print, their_flat) in seen.items():
            differs = [
                k
                for k in set(flat) | set(their_flat)
                if flat.get(k, None) != their_flat.get(k, None) and not is_bookkeeping(k)
            ]  # e.g. arm
            if fingerprint == their_print and model_only(differs) and not spec.get("aa"):  # an A/A's are on purpose
                warnings.append(
                    f"[{name}] warning: arms '{other}' and '{arm}' build the identical model "
                    f"(fingerprint {fingerprint}): the same experiment twice, every difference is noise"
                )
        seen[arm] = (fingerprint, flat)
    return warnings, errors


def ladder_errors(name: str, spec: dict, extra: list[str], seed: int, ladder: list[Rung]) -> list[str]:
    """Every arm at every rung builds, and no two rungs of one arm build the same model (a shared override pinning the
    size the ladder moves would make every rung one size: a flat "power law" from one model, silently)."""
    errors = []
    for arm in spec["arms"]:
        seen: dict[str, str] = {}
        for rung in ladder:
            overrides = [*planned_overrides(name, spec, arm, extra), *rung.overrides]
            try:
                fingerprint, _, _ = arm_identity(overrides, seed, spec.get("command", "train"))
            except Exception as err:  # noqa: BLE001 - Hydra and build errors alike: name the arm and rung, one line
                errors.append(
                    f"[{name}] arm '{arm}' at rung {rung.name} does not build: {str(err).strip().splitlines()[0]}"
                )
                continue
            if fingerprint in seen:
                errors.append(
                    f"[{name}] arm '{arm}': rungs {seen[fingerprint]} and {rung.name} build the same model; "
                    "the ladder's key does not change the size here"
                )
            seen[fingerprint] = rung.name
    return errors


def _ladder(args, spec: dict, extra: list[str]) -> dict[str, list[str]] | None:
    """The ladder of --ladder (else the file's `ladder:`), checked against the lr grid and every override."""
    given = args.ladder if args.ladder else spec.get("ladder")
    if given is None:
        return None
    ladder = parse_ladder(given)
    if args.lr_grid is not None or spec.get("lr_grid") is not None:
        raise ConfigError("--ladder with --lr-grid is not supported yet; run the lr grid at one size, then the ladder")
    for arm, overrides in spec["arms"].items():
        clash = ladder_conflicts(ladder, overrides)
        if clash:
            raise ConfigError(
                f"ladder {', '.join(ladder)}: arm '{arm}' sets {clash}, a size the ladder moves (every rung would "
                "override it, or it would pin one size); drop it from the arm"
            )
    for override in [*spec["overrides"], *extra]:
        key = override.lstrip("+~").split("=", 1)[0]
        if key in ladder:
            print(f"note: the ladder's {key} replaces {override} (the sweep's own size) at every rung", flush=True)
        elif "model" in ladder and key.startswith("model."):
            print(f"note: {override} applies on top of every model preset of the ladder", flush=True)
    return ladder


HYDRA_DIR = re.compile(r"^\+{0,2}hydra\.sweep\.(dir|subdir)=(.*)$")


# keys gptlab-sweep sets for each run itself (an extra override of one would be silently replaced): why, what to do
PER_RUN = {
    "seed": "from the sweep file's seeds; use --seeds N,M",
    "sweep": "to the sweep's name; choose where it goes with --out DIR",
    "arm": "to the arm's name in the sweep file",
    "hydra.run.dir": "to <sweep dir>/<arm>/seed<k>; choose the sweep dir with --out DIR",
}


def check_extra(extra: list[str], lr_grid: bool, spec: dict) -> None:
    """Refuse an extra override of a key the sweep sets for each run (seed, arm, ...; optimizer.lr under a grid), and
    one that composes with nothing (a typo would fail every arm): one line, before anything is planned."""
    for override in extra:
        key = override.lstrip("+~").split("=", 1)[0]
        why = PER_RUN.get(key) or (
            "from the lr grid; drop it, or drop the grid" if lr_grid and key == "optimizer.lr" else None
        )
        if why:
            raise ConfigError(f"{override}: gptlab-sweep sets {key} for each run itself ({why})")
    runs = [o for o in extra if not is_launch_setting(o)]
    if runs:
        from gptlab.cli.train import one_line
        from gptlab.config.build import compose

        try:
            compose([*spec.get("overrides", []), *runs], config_name(spec))
        except Exception as err:  # noqa: BLE001 - Hydra's composition errors, as gptlab-train words them
            raise ConfigError(f"extra override: {one_line(err)}") from None


def take_sweep_dir(out: Path | None, extra: list[str]) -> tuple[Path | None, list[str]]:
    """(sweep dir, the other overrides): a user's hydra.sweep.dir=DIR means --out DIR; subdir is gptlab-sweep's."""
    given, rest = [], []  # type: list[str], list[str]
    for override in extra:
        match = HYDRA_DIR.match(override)
        if match and match.group(1) == "subdir":
            raise ConfigError(
                f"{override}: gptlab-sweep puts each run in <sweep dir>/<arm>/seed<k> (re-runs and "
                f"gptlab-compare rely on it); drop it, and choose the sweep dir with --out DIR"
            )
        (given if match else rest).append(match.group(2) if match else override)
    if not given:
        return out, rest
    if "${" in given[-1]:
        raise ConfigError(
            f"hydra.sweep.dir={given[-1]}: gptlab-sweep needs the sweep dir before Hydra runs, so "
            f"no interpolation; give a plain path (hydra.sweep.dir=DIR or --out DIR)"
        )
    if out is not None and out.resolve() != Path(given[-1]).resolve():
        raise ConfigError(
            f"hydra.sweep.dir={given[-1]} and --out {out} name two different sweep dirs; "
            f"give one of them (they mean the same)"
        )
    return Path(given[-1]), rest


def record_definition(sweep_dir: Path, spec: dict, extra: list[str]) -> None:
    """Write sweep.yaml once; refuse to mix a different definition into an existing sweep dir."""
    sweep_dir.mkdir(parents=True, exist_ok=True)
    record = {**spec, "extra_overrides": extra}
    target = sweep_dir / "sweep.yaml"
    if target.is_file():
        if yaml.safe_load(target.read_text()) != record:
            raise ConfigError(f"{target}: this sweep dir holds a different sweep definition; pass --out <new dir>")
        return
    target.write_text(yaml.safe_dump(record, sort_keys=False))


def parse_seeds(text: str) -> list[int]:
    """--seeds "0,1,2" as integers in [0, 2**63) (what gptlab-train accepts as seed), else a one-line ConfigError."""
    try:
        seeds = [int(s) for s in text.split(",")]
    except ValueError:
        raise ConfigError(f"--seeds: {text!r} is not a comma-separated list of integers (e.g. --seeds 0,1,2)") from None
    bad = [s for s in seeds if not 0 <= s < 2**63]
    if bad:
        raise ConfigError(f"--seeds: seed {bad[0]} is out of range; allowed: integers in [0, 2**63)")
    return seeds


def _pending(
    name: str,
    spec: dict,
    seeds: list[int],
    sweep_dir: Path,
    extra: list[str],
    lrs: list[float] | None = None,
    ladder: list[Rung] | None = None,
) -> tuple[list, int, int]:
    """(runs to launch, finished runs skipped, runs in flight skipped): failed and never-run runs are launched."""
    command = spec.get("command", "train")
    flight = {s.name: s.state for s in sweep_status(sweep_dir) if s.state in ("running", "pending", "requeued")}
    runs, done, busy = [], 0, 0
    for arm in spec["arms"]:
        overrides = planned_overrides(name, spec, arm, extra)
        if any(is_launch_setting(o) for o in spec["arms"][arm]):
            raise ConfigError(f"arm '{arm}': launch settings (hydra.*, launcher=) belong in the sweep's overrides")
        grid: list[float | None] = list(lrs) if lrs else [None]
        steps: list[Rung | None] = list(ladder) if ladder else [None]
        for seed, lr, rung in [(s, lr, r) for r in steps for lr in grid for s in seeds]:
            given = [o for o in overrides if not is_launch_setting(o)] + ([f"optimizer.lr={lr:g}"] if lr else [])
            given += list(rung.overrides) if rung else []
            run = PlannedRun(arm, seed, tuple([*given, f"seed={seed}"]), lr, rung.name if rung else None)
            if finished(run.run_dir(sweep_dir), given, seed, command):
                done += 1
            elif run.name in flight:
                busy += 1
                print(f"[{name}] {run.name}: {flight[run.name]} already, not launched again", flush=True)
            else:
                runs.append(run)
    return runs, done, busy


def _launcher(launch: list[str]) -> str | None:
    """The launcher preset the launch settings pick (the last launcher=X), None for none."""
    picked = [o.split("=", 1)[1] for o in launch if o.lstrip("+").split("=", 1)[0] == "launcher"]
    return picked[-1] if picked else None


def _local_slots(runs: list, command: str) -> tuple[Slots, int]:
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


def _run_local(name: str, runs: list, sweep_dir: Path, args, command: str) -> list[str]:
    """The local queue (launcher=local, or none): at most as many runs at once as the machine has slots."""
    slots, threads = _local_slots(runs, command)
    gpu = f", GPUs {slots.gpus}" if slots.gpus else ""
    print(f"[{name}] local queue: {len(runs)} runs, {slots.count} at a time ({threads} threads each{gpu})", flush=True)
    if args.dry_run:
        return []
    queue = Queue(runs, sweep_dir, slots, threads, fail_fast=args.fail_fast, module=COMMANDS[command][1])
    _write_launched(sweep_dir, {"launcher": "local", "pid": os.getpid(), "runs": [r.name for r in runs]})
    return queue.run()


RESOURCE_KEYS = ("nodes", "tasks_per_node", "cpus_per_task", "gpus_per_node")  # hardware.* the launcher presets read


def _resource_groups(runs: list, command: str) -> list[tuple[list[str], list]]:
    """Runs grouped by the launcher resources their hardware asks for, each with the overrides that request them.

    A launcher sizes one job array once, from the sweep-level config, while each run's hardware comes from its own
    generated config: without these overrides an arm with hardware=ddp would be submitted with the default's
    resources. Usually one group (one array); arms with different resources get one array each, launched together.
    """
    from gptlab.config.build import compose

    groups: dict[tuple, list] = {}
    for run in runs:
        hw = compose(list(run.overrides), COMMANDS[command][2]).hardware
        key = tuple((k, hw.get(k)) for k in RESOURCE_KEYS if hw.get(k) is not None)
        groups.setdefault(key, []).append(run)
    return [([f"hardware.{k}={v}" for k, v in key], members) for key, members in groups.items()]


def _run_hydra(name: str, runs: list, sweep_dir: Path, launch: list[str], args, command: str) -> list[str]:
    """One multirun over every pending run (one job array under launcher=slurm) per resource group, launched
    together; fail-fast cancels the rest."""
    groups = _resource_groups(runs, command)
    cmds = [
        launch_command(members, sweep_dir, [*launch, *resources], COMMANDS[command][0]) for resources, members in groups
    ]
    print(
        f"[{name}] {len(runs)} runs in {len(cmds)} launch(es) (the configs above, generated in {sweep_dir / PLAN_DIR}):"
    )
    for cmd in cmds:
        print(f"[{name}] {shlex.join(cmd)}", flush=True)
    if args.dry_run:
        return []
    write_plan(sweep_dir, [run for _, members in groups for run in members])  # plan order = array order
    procs = []
    for cmd, (_, members) in zip(cmds, groups):
        before = len(job_ids(sweep_dir))
        # the same command through this Python: works without the venv's bin/ on PATH
        procs.append(subprocess.Popen([sys.executable, "-m", COMMANDS[command][1], *cmd[1:]]))
        while len(cmds) > 1 and procs[-1].poll() is None and len(job_ids(sweep_dir)) < before + len(members):
            time.sleep(0.5)  # the next array only once this one is queued: array ids follow the plan's order
    launched = False
    while any(proc.poll() is None for proc in procs):
        time.sleep(1.0)
        ids = job_ids(sweep_dir)
        if not launched and len(ids) >= len(runs):
            launched = True
            _write_launched(sweep_dir, {"launcher": _launcher(launch), "jobs": sorted(ids.values())})
        failed = [s.name for s in sweep_status(sweep_dir) if s.state == "failed"]
        if failed and args.fail_fast:
            arrays = sorted({i.split("_")[0] for i in ids.values()})
            if arrays and shutil.which("scancel"):
                subprocess.run(["scancel", *arrays], check=False)
            for proc in procs:
                proc.terminate()
                proc.wait()
            return failed
    if not launched:  # every run ended before a poll saw them queued
        _write_launched(sweep_dir, {"launcher": _launcher(launch), "jobs": sorted(job_ids(sweep_dir).values())})
    if any(proc.returncode for proc in procs):
        return [s.name for s in sweep_status(sweep_dir) if s.state != "finished"]
    return []


def _detach(argv: list[str], sweep_dir: Path, timeout_s: float = 600.0) -> int:
    """Start this sweep in its own session and return once its runs are queued (the sweep log has the rest)."""
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
            print(f"sweep dir: {sweep_dir}\nqueued: {where}\nlog: {log_path}\nstatus: gptlab-sweep status {sweep_dir}")
            return 0
        if child.poll() is not None:
            tail = log_path.read_text(errors="replace").strip().splitlines()[-5:]
            print("\n".join(tail))
            return child.returncode or 0
        time.sleep(0.2)
    print(f"sweep dir: {sweep_dir}\nstill launching (pid {child.pid}); log: {log_path}")
    return 0


def _measure_floor(name: str, sweep_dir: Path) -> None:
    """An A/A sweep's end: its noise floor into the sweep dir and, measured on a quiet machine, the user cache."""
    from gptlab.compare.noise_floor import cache_dir, measure_sweep

    try:
        lines = measure_sweep(sweep_dir, cache_dir())
    except ConfigError as err:
        print(f"[{name}] noise floor not measured: {err}", file=sys.stderr)
        return
    for line in lines:
        print(f"[{name}] {line}", flush=True)


def status_main(argv: list[str]) -> int:
    """gptlab-sweep status DIR: each run's state, read from the run dirs, the local queue and the scheduler."""
    parser = argparse.ArgumentParser(prog="gptlab-sweep status", description=status_main.__doc__)
    parser.error = lambda message: fail(f"gptlab-sweep status: {message}")  # type: ignore[method-assign]
    parser.add_argument("sweep_dir", type=Path)
    args = parser.parse_args(argv)
    definition = args.sweep_dir / "sweep.yaml"
    if not definition.is_file():
        fail(f"{args.sweep_dir}: not a gptlab-sweep dir (no sweep.yaml)")
    spec = yaml.safe_load(definition.read_text()) or {}
    seeds = spec.get("seeds", [0])
    grid = spec.get("lr_grid")
    lrs = parse_lr_grid(grid) if grid is not None else None
    ladder = [r.name for r in rungs(parse_ladder(spec["ladder"]))] if spec.get("ladder") else None
    rows = sweep_status(args.sweep_dir.resolve(), {arm: seeds for arm in spec.get("arms", {})}, lrs, ladder)
    print(format_status(rows))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["status"]:
        return status_main(argv[1:])
    parser = argparse.ArgumentParser(prog="gptlab-sweep", description=__doc__.splitlines()[0])
    parser.error = lambda message: fail(f"gptlab-sweep: {message}")  # type: ignore[method-assign]  # one line, exit 2
    parser.add_argument("sweep", help="a name in sweeps/ (e.g. attention) or a path to a sweep YAML")
    parser.add_argument(
        "overrides", nargs="*", help="extra overrides for every run (e.g. train.max_steps=50 launcher=slurm)"
    )
    parser.add_argument(
        "--out", type=Path, help="sweep dir (default: outputs/sweeps/<name>; hydra.sweep.dir=DIR is the same)"
    )
    parser.add_argument("--seeds", help="comma-separated seeds instead of the file's")
    parser.add_argument("--fail-fast", action="store_true", help="stop (cancel the rest) at the first failed run")
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    parser.add_argument("--detach", action="store_true", help="return once the runs are queued; see `status`")
    parser.add_argument(
        "--lr-grid",
        help="every arm at every lr: 3e-4,1e-3,3e-3 or 1e-4:1e-2:5 (log-spaced); run dirs <arm>/lr<v>/seed<k>",
    )
    parser.add_argument(
        "--ladder",
        action="append",
        metavar="KEY=V1,V2,...",
        help="every arm at every size: model.d_model=64,128,256 (or model.n_layer, model.n_head; repeat to move "
        "several together) or model=tiny,gpt2; run dirs <arm>/<rung>/seed<k>",
    )
    parser.add_argument(
        "--factorial",
        action="store_true",
        help="the sweep file's `factors:` (k binary changes) as the 2^k arms base, a, a+b, ... (the file alone does it "
        "too; the flag refuses a file without factors)",
    )
    parser.add_argument(
        "--aa",
        action="store_true",
        help="A/A: the first arm (baseline) as identical arms x seeds, to measure this machine's noise floor for "
        "gptlab-compare (stored when the machine was quiet)",
    )
    parser.add_argument("--aa-arms", metavar="K", help="identical arms of an A/A sweep (implies --aa; default 3)")
    args = parser.parse_intermixed_args(argv)
    try:
        args.out, args.overrides = take_sweep_dir(args.out, args.overrides)
        name, spec, _ = load_sweep(args.sweep)
        if args.factorial and "factors" not in spec:
            raise ConfigError(f"--factorial: sweep '{name}' has no 'factors:' (name -> overrides of one binary change)")
        ladder = _ladder(args, spec, args.overrides)
        ladder_rungs = rungs(ladder) if ladder else None
        seeds = parse_seeds(args.seeds) if args.seeds else list(spec["seeds"])
        grid = args.lr_grid if args.lr_grid is not None else spec.get("lr_grid")
        lrs = parse_lr_grid(grid) if grid is not None else None
        check_extra(args.overrides, lrs is not None, spec)
        aa = parse_aa(args.aa_arms if args.aa_arms is not None else True if args.aa else spec.get("aa"))
        if aa is not None:  # the baseline as aa identical arms (gptlab/sweep/aa.py); its floor is measured at the end
            if ladder is not None or lrs is not None:
                raise ConfigError("aa: an A/A sweep repeats one config; drop the ladder / lr grid")
            spec = aa_spec(spec, aa, seeds)
        sweep_dir = (args.out or Path("outputs/sweeps") / name).resolve()
        if args.lr_grid is not None:  # recorded, so `status` and re-runs see the grid
            spec = {**spec, "lr_grid": lrs}
        if ladder is not None:  # recorded (its values as text), so `status`, re-runs and compare see the ladder
            spec = {**spec, "ladder": ladder}
            bad = ladder_errors(name, spec, args.overrides, seeds[0], ladder_rungs or [])
            if bad:
                raise ConfigError(bad[0].removeprefix(f"[{name}] "))
        if not args.dry_run:
            record_definition(sweep_dir, spec, args.overrides)
    except (ConfigError, ValueError) as err:
        fail(err)
    if args.detach and not args.dry_run:
        return _detach([*argv, "--out", str(sweep_dir)] if args.out is None else argv, sweep_dir)
    warnings, errors = identity_warnings(name, spec, args.overrides, seeds[0])
    for line in warnings:
        print(line, flush=True)
    for line in errors:
        print(line, file=sys.stderr, flush=True)
    if errors and args.dry_run:
        return 2
    command = spec.get("command", "train")
    try:
        runs, skipped, busy = _pending(name, spec, seeds, sweep_dir, args.overrides, lrs, ladder_rungs)
        launch = [o for o in [*spec["overrides"], *args.overrides] if is_launch_setting(o)]
        if runs and not args.dry_run:
            write_plan(sweep_dir, runs)
    except ConfigError as err:
        fail(err)
    for run in runs:  # each run as a plain command, ready to paste: the config its generated file composes
        plain = [COMMANDS[command][0], *run.overrides, f"hydra.run.dir={run.run_dir(sweep_dir)}"]
        print(f"[{name}] {run.name}: {shlex.join(plain)}", flush=True)
    if not runs:
        print(f"[{name}] all {skipped} runs finished" + (f", {busy} in flight" if busy else "") + ", nothing to launch")
        failures: list[str] = []
    elif _launcher(launch) in (None, "local"):
        failures = _run_local(name, runs, sweep_dir, args, command)
    else:
        failures = _run_hydra(name, runs, sweep_dir, launch, args, command)
    print(f"[{name}] sweep dir: {sweep_dir}  ({skipped} finished runs skipped)")
    for run in failures:
        print(f"[{name}] FAILED {run}: gptlab-sweep status {sweep_dir}", file=sys.stderr)
    if not args.dry_run and not failures:
        print(f"[{name}] compare: gptlab-compare {sweep_dir}")
        if spec.get("aa"):
            _measure_floor(name, sweep_dir)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

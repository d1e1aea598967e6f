"""gptlab-sweep NAME: run an ablation from sweeps/NAME.yaml as Hydra multiruns, one per arm, into one sweep dir.

A sweep file lists `arms` (name -> overrides), `seeds`, and shared `overrides`. Every run lands in
<out>/<arm>/seed<k>/ with `sweep=<name>` (the W&B group), the same data_seed and eval steps. Re-running
the same command skips runs that finished with the same overrides and resumes unfinished ones
(train.resume=auto in the same run dir). Each arm is one `gptlab-train -m` call, printed (shell-quoted, ready
to paste) before it runs, so any launcher works: `gptlab-sweep attention launcher=slurm`. A `hydra.sweep.dir=DIR`
override is the same as `--out DIR`. `command: decode` in the file runs `gptlab-decode -m` instead (a run is
finished once it wrote decode.json).
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import cast

import yaml

from gptlab.cli import fail
from gptlab.errors import ConfigError
from gptlab.util.paths import SWEEPS_DIR

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
        spec = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML ({' '.join(str(err).split())[:200]})") from None
    if not isinstance(spec, dict):
        raise ConfigError(f"{path}: a sweep file is a mapping with 'arms' (and optional 'seeds', 'overrides')")
    if not isinstance(spec.get("arms"), dict) or not spec["arms"]:
        raise ConfigError(f"{path}: 'arms' must map arm names to lists of overrides")
    if spec.get("command", "train") not in COMMANDS:
        raise ConfigError(f"{path}: command: {spec['command']!r} is not allowed; allowed: {', '.join(COMMANDS)}")
    spec.setdefault("seeds", [0])
    spec.setdefault("overrides", [])
    return path.stem, spec, path


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
            if fingerprint == their_print and model_only(differs):
                warnings.append(
                    f"[{name}] warning: arms '{other}' and '{arm}' build the identical model "
                    f"(fingerprint {fingerprint}): the same experiment twice, every difference is noise"
                )
        seen[arm] = (fingerprint, flat)
    return warnings, errors


def arm_command(overrides: list[str], seeds: list[int], sweep_dir: Path, arm: str, command: str = "train") -> list[str]:
    """One `gptlab-train -m` (or gptlab-decode) over the arm's seeds, each into <sweep_dir>/<arm>/seed<k>."""
    return [
        COMMANDS[command][0],
        "-m",
        *overrides,
        f"seed={','.join(map(str, seeds))}",
        f"hydra.sweep.dir={sweep_dir}",
        f"hydra.sweep.subdir={arm}/seed${{seed}}",
    ]


HYDRA_DIR = re.compile(r"^\+{0,2}hydra\.sweep\.(dir|subdir)=(.*)$")


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gptlab-sweep", description=__doc__.splitlines()[0])
    parser.add_argument("sweep", help="a name in sweeps/ (e.g. attention) or a path to a sweep YAML")
    parser.add_argument(
        "overrides", nargs="*", help="extra overrides for every run (e.g. train.max_steps=50 launcher=slurm)"
    )
    parser.add_argument(
        "--out", type=Path, help="sweep dir (default: outputs/sweeps/<name>; hydra.sweep.dir=DIR is the same)"
    )
    parser.add_argument("--seeds", help="comma-separated seeds instead of the file's")
    parser.add_argument("--fail-fast", action="store_true", help="stop at the first failed arm")
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    args = parser.parse_intermixed_args(argv)
    try:
        args.out, args.overrides = take_sweep_dir(args.out, args.overrides)
        name, spec, _ = load_sweep(args.sweep)
        seeds = parse_seeds(args.seeds) if args.seeds else list(spec["seeds"])
        sweep_dir = (args.out or Path("outputs/sweeps") / name).resolve()
        if not args.dry_run:
            record_definition(sweep_dir, spec, args.overrides)
    except (ConfigError, ValueError) as err:
        fail(err)
    warnings, errors = identity_warnings(name, spec, args.overrides, seeds[0])
    for line in warnings:
        print(line, flush=True)
    for line in errors:
        print(line, file=sys.stderr, flush=True)
    if errors and args.dry_run:
        return 2
    failures, skipped, command = [], 0, spec.get("command", "train")
    for arm in spec["arms"]:
        overrides = planned_overrides(name, spec, arm, args.overrides)
        todo = [s for s in seeds if not finished(sweep_dir / arm / f"seed{s}", overrides, s, command)]
        skipped += len(seeds) - len(todo)
        if not todo:
            print(f"[{name}] {arm}: all {len(seeds)} runs finished, skipping", flush=True)
            continue
        cmd = arm_command(overrides, todo, sweep_dir, arm, command)
        print(f"[{name}] {arm}: {shlex.join(cmd)}", flush=True)
        if args.dry_run:
            continue
        # the same command through this Python: works without the venv's bin/ on PATH
        if subprocess.run([sys.executable, "-m", COMMANDS[command][1], *cmd[1:]]).returncode != 0:
            failures.append(arm)
            if args.fail_fast:
                break
    print(f"[{name}] sweep dir: {sweep_dir}  ({skipped} finished runs skipped)")
    for arm in failures:
        print(
            f"[{name}] FAILED arm '{arm}': see the logs in {sweep_dir / arm}/seed*/ (*.log) and .submitit/",
            file=sys.stderr,
        )
    if not args.dry_run and not failures:
        print(f"[{name}] compare: gptlab-compare {sweep_dir}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

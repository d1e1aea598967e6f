"""gptlab-sweep NAME: run an ablation from sweeps/NAME.yaml, every arm x seed in one launch, into one sweep dir.

A sweep file lists `arms` (name -> overrides), `seeds`, and shared `overrides`. Every run lands in
<out>/<arm>/seed<k>/ with `sweep=<name>` (the W&B group), the same data_seed and eval steps. Re-running the same
command skips runs that finished with the same overrides or are still in flight, and launches the failed and
never-run ones (a run resumes from its own checkpoint: train.resume=auto in the same run dir).

One launch (gptlab/sweep/plan.py): each pending run becomes a generated config; `launcher=slurm` (or any Hydra
launcher) gets ONE `gptlab-train -m +sweep_run=...` multirun, i.e. one job array; with no launcher or
`launcher=local` the local queue (gptlab/sweep/queue.py) runs them, as many at once as the machine has slots.
`--detach` returns once the runs are queued; `gptlab-sweep status DIR` shows each run's state. Then the timing
session times every arm alone on one machine (after the local queue, or one SLURM job after the array; `--no-timing`:
none). `hydra.sweep.dir=DIR` is the same as `--out DIR`. `command: decode` in the file runs `gptlab-decode` instead
(a run is finished once it wrote decode.json).

This module parses arguments, prints and picks the exit code; the work is in gptlab/sweep/: the definition
(spec.py), arm identity (identity.py), the plan (plan.py), launching (launch.py) and status (status.py); the
--until-decided looks are gptlab/study/until_decided.py's; `status`, `time` and what a launch does after its runs
(the timing session, an A/A's floor) are gptlab/cli/sweep_subcommands.py's.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from gptlab.cli import fail, sweep_subcommands
from gptlab.cli.train import one_line
from gptlab.errors import ConfigError
from gptlab.sweep.identity import identity_warnings
from gptlab.sweep.launch import check_paths, detach, hydra_launches, is_local, local_slots, run_hydra, run_local
from gptlab.sweep.layout import PLAN_DIR
from gptlab.sweep.plan import COMMANDS, Pending, pending, plain_command, write_plan, write_refused
from gptlab.sweep.spec import Sweep, new_arms, record_definition, resolve

if TYPE_CHECKING:
    from gptlab.compare.statistics.sequential import Look, Plan


def one_experiment(keys: list[str]) -> bool:
    """Arms that build one model and differ only in these config keys are one experiment (compare's rule)."""
    from gptlab.compare.reading.group import is_bookkeeping
    from gptlab.compare.reading.identical import model_only

    return model_only(k for k in keys if not is_bookkeeping(k))  # e.g. arm


def _note(line: str) -> None:
    print(line, flush=True)


def _parser() -> argparse.ArgumentParser:
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
    parser.add_argument("--no-timing", action="store_true", help="no timing session after the runs (loss only)")
    parser.add_argument(
        "--fresh-interpreters",
        action="store_true",
        help="local CPU queue: start each run as a fresh interpreter (default: fork it from one that imported torch)",
    )
    _design_flags(parser)
    return parser


def _design_flags(parser: argparse.ArgumentParser) -> None:
    """The flags that shape the sweep beyond arms x seeds: lr grid, equal FLOPs, ladder, factorial, A/A, until
    decided (added after the run flags, in --help's order)."""
    parser.add_argument(
        "--lr-grid",
        help="every arm at every lr: 3e-4,1e-3,3e-3 or 1e-4:1e-2:5 (log-spaced); run dirs <arm>/lr<v>/seed<k>",
    )
    parser.add_argument(
        "--equal-flops",
        metavar="N",
        help="evaluate every arm at N shared points of cumulative training FLOPs up to the cheapest arm's budget "
        "(train.eval_flops, planned from each arm's cost; the default whenever the arms differ in cost, at as many "
        "points as the cheapest arm's evals), or off: gptlab-compare then reads equal FLOPs where it measured",
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
    parser.add_argument(
        "--until-decided",
        action="store_true",
        help="add seeds to the arms still undecided (val loss vs the first arm) until each is decided or --max-seeds "
        "is reached, with a group-sequential design whose overall false-decision rate stays at alpha",
    )
    parser.add_argument("--max-seeds", type=int, metavar="N", help="with --until-decided: seeds per arm at most")
    parser.add_argument(
        "--seed-step", type=int, metavar="K", help="with --until-decided: seeds added per look (default 1)"
    )
    parser.add_argument(
        "--spending",
        choices=("obrien_fleming", "pocock"),
        help="with --until-decided: the alpha-spending function (default obrien_fleming: spends little early)",
    )


def _launch(sweep: Sweep, todo: Pending, args) -> list[str]:
    """Print each run as a plain command and launch them (nothing under --dry-run); the failed runs' names."""
    name, runs, script = sweep.name, todo.runs, COMMANDS[sweep.command][0]
    for run in runs:  # each run as a plain command, ready to paste: the config its generated file composes
        print(f"[{name}] {run.name}: {shlex.join(plain_command(run, sweep.sweep_dir, script))}", flush=True)
    if not runs:
        busy = f", {len(todo.in_flight)} in flight" if todo.in_flight else ""
        busy += f", {len(todo.refused)} refused (cannot start)" if todo.refused else ""
        print(f"[{name}] {'' if busy else 'all '}{todo.skipped} runs finished{busy}, nothing to launch")
        return []
    if is_local(sweep.launch):
        slots, threads = local_slots(runs, sweep.command)
        each = f"{threads} threads each" + (f", GPUs {slots.gpus}" if slots.gpus else "")
        print(f"[{name}] local queue: {len(runs)} runs, {slots.count} at a time ({each})", flush=True)
        return (
            []
            if args.dry_run
            else run_local(
                runs, sweep.sweep_dir, slots, threads, args.fail_fast, sweep.command, warm=not args.fresh_interpreters
            )
        )
    launches = hydra_launches(runs, sweep.sweep_dir, sweep.launch, sweep.command)
    where = sweep.sweep_dir / PLAN_DIR
    print(f"[{name}] {len(runs)} runs in {len(launches)} launch(es) (the configs above, generated in {where}):")
    for cmd, _ in launches:
        print(f"[{name}] {shlex.join(cmd)}", flush=True)
    if args.dry_run:
        return []
    heard = sweep_subcommands.job_after(sweep) if args.timing else None  # the SLURM timing job, once queued
    return run_hydra(launches, sweep.sweep_dir, sweep.launch, args.fail_fast, sweep.command, heard)


def _design(sweep: Sweep, args) -> Plan:
    """--until-decided's plan (gptlab/study/until_decided.py), refused in one line (exit 2) for flags it cannot run
    with, a sweep it cannot run or a sweep dir that records another plan. Checked before anything is written."""
    if args.lr_grid or args.ladder or args.factorial or sweep.spec.get("aa") or args.detach:
        fail("gptlab-sweep: --until-decided: a plain arms x seeds sweep, run in the foreground (not with --lr-grid, "
             "--ladder, --factorial, --aa or --detach)")  # fmt: skip
    if args.max_seeds is None:
        fail("gptlab-sweep: --until-decided needs --max-seeds N (seeds per arm at most)")
    from gptlab.study.until_decided import plan_for

    try:
        return plan_for(sweep, args.max_seeds, args.seed_step, args.spending)
    except ConfigError as err:
        fail(f"gptlab-sweep: --until-decided: {err}")


def _until_decided(sweep: Sweep, args, design: Plan) -> int:
    """--until-decided: print the plan, each look's runs and decisions, and how it ended; the exit code."""
    from gptlab.compare.render.until_decided import look_lines, plan_line
    from gptlab.study.until_decided import baseline
    from gptlab.study.until_decided import run as run_until_decided

    name, base = sweep.name, baseline(sweep)
    print(f"[{name}] {plan_line(design, base)}", flush=True)

    def heard(found: dict[str, Look]) -> None:
        for line in look_lines(found, base):
            print(f"[{name}] {line}", flush=True)

    try:
        done = run_until_decided(
            sweep, design, lambda todo: _launch(sweep, todo, args), dry_run=args.dry_run, on_look=heard
        )
    except ConfigError as err:
        fail(err)
    if args.dry_run:
        return 0
    if done.failed:
        stopped = f"look {len(done.looks) + 1}: {len(done.failed)} runs failed"
        print(f"[{name}] {stopped}; stopped (gptlab-sweep status {sweep.sweep_dir})")
        return 1
    taken = f"{len(done.looks)} look(s) taken, recorded in {done.record}"
    print(f"[{name}] {taken}; compare: gptlab-compare {sweep.sweep_dir}")
    sweep_subcommands.after_runs(sweep, args.timing)
    return 0


def _record(sweep: Sweep, dry_run: bool) -> None:
    """Record the definition in the sweep dir (checked, not written, under --dry-run); say what grows in place."""
    arms = new_arms(sweep.sweep_dir, sweep.spec)  # before the record takes them in
    lrs = record_definition(sweep.sweep_dir, sweep.spec, sweep.extra, sweep.seeds, write=not dry_run)
    grows = f"[{sweep.name}] the sweep {'would grow' if dry_run else 'grows'} by"
    for what, added in (("arm(s)", arms), ("lr(s)", [f"{lr:g}" for lr in lrs])):
        if added:
            print(f"{grows} {what} {', '.join(added)} in place: finished runs are reused", flush=True)


def _resolve(args) -> tuple[Sweep, Plan | None]:
    """The sweep the command line names, checked and its definition recorded (--until-decided's plan with it)."""
    aa = args.aa_arms if args.aa_arms is not None else True if args.aa else None
    try:
        sweep = resolve(
            args.sweep, args.overrides, out=args.out, seeds=args.seeds, lr_grid=args.lr_grid, ladder=args.ladder,
            factorial=args.factorial, aa=aa, equal_flops=args.equal_flops, note=_note, word=one_line,
        )  # fmt: skip
        check_paths(sweep.sweep_dir, list(sweep.spec["arms"]), sweep.seeds, sweep.lrs, sweep.ladder)
        design = _design(sweep, args) if args.until_decided else None  # refused before anything is written
        # a dry run answers as the launch would (a dir holding another sweep is refused), writing nothing
        _record(sweep, args.dry_run)
    except (ConfigError, ValueError) as err:
        fail(err)
    return sweep, design


def _plan(sweep: Sweep, args) -> Pending:
    """The runs to launch, those in flight and refused named; plan.json and refused.json written (not --dry-run)."""
    name, sweep_dir = sweep.name, sweep.sweep_dir
    try:
        todo = pending(name, sweep.spec, sweep.seeds, sweep_dir, sweep.extra, sweep.lrs, sweep.ladder)
        for run_name, state in todo.in_flight:
            print(f"[{name}] {run_name}: {state} already, not launched again", flush=True)
        for run, why in todo.refused:
            print(f"[{name}] REFUSED {run.name}: cannot start: {why}", file=sys.stderr, flush=True)
        if sweep.lrs and not args.dry_run:
            write_refused(sweep_dir, todo.refused)  # gptlab-compare --lr-grid shows them
        if todo.runs and not args.dry_run:
            write_plan(sweep_dir, todo.runs)
    except ConfigError as err:
        fail(err)
    return todo


def _ended(sweep: Sweep, todo: Pending, failures: list[str], args) -> int:
    """After the launch: failures named, the timing session (when on and nothing failed), what to run next."""
    name, sweep_dir = sweep.name, sweep.sweep_dir
    refused = f", {len(todo.refused)} refused" if todo.refused else ""
    print(f"[{name}] sweep dir: {sweep_dir}  ({todo.skipped} finished runs skipped{refused})")
    for failed in failures:
        print(f"[{name}] FAILED {failed}: gptlab-sweep status {sweep_dir}", file=sys.stderr)
    if args.dry_run and (line := sweep_subcommands.plan_line(sweep, args.timing)):
        print(line)
    if not args.dry_run and not failures:
        sweep_subcommands.after_runs(sweep, args.timing)
        print(f"[{name}] compare: gptlab-compare {sweep_dir}{' --lr-grid' if sweep.lrs else ''}")
    return 1 if failures or todo.refused else 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    sub = {"status": sweep_subcommands.status_main, "time": sweep_subcommands.time_main}.get(argv[0] if argv else "")
    if sub is not None:  # gptlab-sweep status DIR, gptlab-sweep time DIR
        return sub(argv[1:])
    args = _parser().parse_intermixed_args(argv)
    from gptlab.study.until_decided import stray_flag

    if not args.until_decided and (stray := stray_flag(args.max_seeds, args.seed_step, args.spending)):
        fail(f"gptlab-sweep: {stray}")  # refused before anything is written
    args.timing = sweep_subcommands.timing_on(args.no_timing)
    sweep, design = _resolve(args)
    if design is not None:  # --until-decided
        return _until_decided(sweep, args, design)
    if args.detach and not args.dry_run:
        code, told = detach([*argv, "--out", str(sweep.sweep_dir)] if sweep.out is None else argv, sweep.sweep_dir)
        print(told)
        return code
    warnings, errors = identity_warnings(sweep.name, sweep.spec, sweep.extra, sweep.seeds[0], one_experiment)
    for line in warnings:
        print(line, flush=True)
    for line in errors:
        print(line, file=sys.stderr, flush=True)
    if errors and args.dry_run:
        return 2
    todo = _plan(sweep, args)
    return _ended(sweep, todo, _launch(sweep, todo, args), args)


if __name__ == "__main__":
    sys.exit(main())

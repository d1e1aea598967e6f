"""`gptlab-compare PATH...`: compare runs like with like; prints verdicts and a table, writes md/json/html/PNG reports.

Runs scored on different validation sets are refused (or, with --split-by KEY, compared in separate tables, one
folder each under --out); a folder holding several sweeps is refused with their list; of a partial sweep the runs
that finished are compared and the others named; copied run dirs count once.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import NoReturn

from gptlab.compare import modes
from gptlab.compare.render import decode, json_report, terminal, wandb_log, words
from gptlab.compare.render.sections import Document
from gptlab.compare.tables.analysis import Comparison
from gptlab.errors import ConfigError
from gptlab.util.extras import require
from gptlab.util.io import atomic_write_text, strict_json


def build_parser() -> argparse.ArgumentParser:
    """Command-line interface of gptlab-compare."""
    p = argparse.ArgumentParser(
        prog="gptlab-compare",
        description="Compare training runs at the largest step all of them reached: val loss mean ± std over "
        "seeds, Welch-test verdict vs the baseline, speed and memory; writes md/json/html/PNGs.",
    )
    p.add_argument("paths", nargs="+", metavar="PATH", help="run directories, sweep directories or globs")
    p.add_argument(
        "--baseline",
        help="baseline group: `group=choice[, key=value]` items or a run directory "
        "(default: the group with the fewest differences from the others, "
        "ties to the group of the first run)",
    )
    p.add_argument("--step", type=int, help="compare at this step (every run must have val/loss there)")
    p.add_argument("--out", help="output directory (default: <sweep dir>/comparison, else ./comparison)")
    p.add_argument("--claims", help="YAML: label or choice string -> {speedup: 1.25, delta_val_loss: -0.01}")
    p.add_argument(
        "--split-by",
        action="append",
        default=[],
        metavar="KEY",
        help="compare the runs in separate tables, one per value of KEY (repeatable): a validation-set key "
        "(data_fingerprint, data_seed, train.eval_sequences, seq_len), a budget key (train.max_steps, "
        "tokens_per_step), a config group or a dotted config key; each table goes to <out>/<KEY=value>/",
    )
    p.add_argument(
        "--power",
        action="store_true",
        help="also print (and report) the power table: the smallest Δ val loss and speed-up these seeds detect "
        "(α 0.05, power 0.8, Welch t) and the seeds per arm that would decide each undecided arm",
    )
    p.add_argument(
        "--peak-flops",
        metavar="FLOPS",
        help="the machine peak (FLOP/s) every MFU is against (default: the peak most runs recorded); runs "
        "measured against another peak have their MFU recomputed",
    )
    p.add_argument(
        "--noise-floor",
        default="auto",
        metavar="auto|none|PATH",
        help="auto (default): the training records' load limit and peak-memory spread from this machine's floor "
        "(`gptlab-sweep NAME --aa`; an A/A dir's own); none: fixed heuristics; PATH: an A/A dir's or a store's floor",
    )
    p.add_argument("--timing", metavar="PATH", help="the timing session (timing.json or its folder) speed comes from "
                   "(default: the sweep dir's, else the one --time left in --out)")  # fmt: skip
    p.add_argument("--time", action="store_true", help="first time every arm alone (interleaved rounds with an A/A): "
                   "a sweep dir into its timing.json, run dirs into <out>/timing.json")  # fmt: skip
    _add_target_args(p)
    _add_wandb_args(p)
    return p


def _add_target_args(p: argparse.ArgumentParser) -> None:
    """--target, --threshold and --threshold-key: steps to a target, the smallest arm that reaches it."""
    p.add_argument(
        "--target",
        action="append",
        default=[],
        metavar="METRIC=X",
        help="steps, tokens and wall time to first reach X per arm, mean ± std over seeds (repeatable); "
        "METRIC=X means <= X for a *loss* metric and >= X for an *acc* one, or write "
        "METRIC<=X / METRIC>=X for any logged metric",
    )
    p.add_argument(
        "--threshold",
        action="append",
        default=[],
        metavar="METRIC=X",
        help="the smallest value of the key that varies between the arms that reaches the target in "
        "every seed (e.g. the fewest layers reaching val/acc>=0.9); repeatable",
    )
    p.add_argument(
        "--threshold-key",
        metavar="KEY",
        help="the config key or group --threshold minimises when the arms differ in several keys "
        "(e.g. model.n_layer); each arm must have its own value",
    )


def _add_wandb_args(p: argparse.ArgumentParser) -> None:
    """--wandb, --wandb-mode and --workspace: the comparison as a W&B run and workspace."""
    p.add_argument(
        "--wandb",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="log table, native charts and PNGs to a W&B comparison run (default: on when WANDB_MODE is "
        "set and not 'disabled', or when --wandb-mode is given)",
    )
    p.add_argument(
        "--wandb-mode",
        choices=wandb_log.MODES,
        default=None,
        help="auto (default): online with an API key, else offline (`wandb sync` later); "
        "online | offline | disabled force a mode, like training's logger.wandb.mode",
    )
    p.add_argument("--lr-grid", action="store_true", help="a gptlab-sweep --lr-grid sweep dir, or several read as one "
                   "grid: each arm at its own best lr (lr curves, edge warnings, verdicts at each arm's best and at the "
                   "baseline's lr, stability margin)")  # fmt: skip
    p.add_argument("--ladder", action="store_true", help="a gptlab-sweep --ladder sweep dir (auto-detected when it is "
                   "the one path): per arm a power law of final val loss in size, the gap to the baseline (grows / "
                   "shrinks / crosses over) and the ranking at every rung")  # fmt: skip
    p.add_argument(
        "--ladder-x",
        choices=("params", "flops"),
        default="params",
        help="the ladder's size: non-embedding parameters (default) or training FLOPs per token",
    )
    p.add_argument("--factorial", action="store_true", help="a gptlab-sweep --factorial sweep dir (auto-detected "
                   "when it is the one path): main effects and interactions on val loss and speed (statsmodels "
                   "OLS/ANOVA) and whether the parts add up")  # fmt: skip
    p.add_argument(
        "--holdout-seeds",
        help="with --lr-grid: pick each arm's lr on the other seeds and report on these (e.g. 2 or 2,3)",
    )
    p.add_argument("--workspace", action="store_true", help="also write a W&B workspace view of the sweep "
                   "(<out>/workspace.json); saved to W&B and its URL printed when online")  # fmt: skip


def parse_peak(text: str | None) -> float | None:
    """--peak-flops as a positive finite number, else a one-line ConfigError."""
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (value > 0 and value != float("inf")):
        raise ConfigError(
            f"--peak-flops: {text!r} is not allowed; give the machine peak in FLOP/s, a positive number (e.g. 3.12e14)"
        )
    return value


def log_to_wandb(cmp: Comparison, doc: Document, runs: list, out: Path, mode: str | None) -> None:
    """Log the comparison run and print where it went (and the `wandb sync` line when offline)."""
    logged = wandb_log.log_comparison(cmp, doc, runs, out, mode or "auto")
    if logged is None:
        return
    if logged.folder is None:
        print(f"W&B: {logged.mode} (nothing logged)")
        return
    print(f"W&B: logged comparison run to {logged.folder}")
    if logged.sync_command:
        print(f"W&B (offline): upload later with: {logged.sync_command}")
    folders = wandb_log.offline_folders(runs)
    if folders:
        print(
            f"W&B: {len(folders)} offline folders of the compared runs; upload them with: "
            f"wandb sync {' '.join(shlex.quote(f) for f in folders)}"
        )


def _usage_error(message: str) -> NoReturn:
    """A bad flag as the other errors are: one line, exit 2 (argparse would print its usage block first)."""
    print(f"gptlab-compare: error: {message}", file=sys.stderr)
    sys.exit(2)


def request(args: argparse.Namespace) -> modes.Request:
    """The parsed command line as the library's Request (--peak-flops checked here)."""
    return modes.Request(
        paths=args.paths, baseline=args.baseline, step=args.step, out=args.out, claims=args.claims,
        split_by=args.split_by, power=args.power, peak_flops=parse_peak(args.peak_flops), noise_floor=args.noise_floor,
        targets=args.target, thresholds=args.threshold, threshold_key=args.threshold_key, factorial=args.factorial,
        holdout_seeds=args.holdout_seeds, ladder_x=args.ladder_x, ladder=args.ladder, timing=args.timing,
    )  # fmt: skip


def time_arms(req: modes.Request) -> None:
    """--time: the timing session of the runs (gptlab/study/timing.py) before they are compared: one sweep dir's into
    its timing.json, run dirs' into <out>/timing.json (which the comparison then reads)."""
    from gptlab.compare.reading.runs import discover
    from gptlab.study.timing import time_runs, time_sweep
    from gptlab.sweep.layout import read_sweep

    def hear(w: dict) -> None:
        print(f"timing: round {w['round']} {w['arm']}: {w['tokens_per_s']:,.0f} tokens/s", file=sys.stderr)

    sweep = modes.one_sweep_dir(req)
    if sweep is not None and read_sweep(sweep, strict=False) is not None:
        done = time_sweep(sweep, on_window=hear)
    else:
        folder = modes.out_dir(req.out, req.paths[0], discover(req.paths))
        done = time_runs([Path(p) for p in req.paths], folder, req.baseline, on_window=hear)
        req.timing = str(done.path)
    left = f"; left out (no finished run): {', '.join(done.left_out)}" if done.left_out else ""
    print(f"timed {len(done.arms)} arms ({done.timed_now} new windows) into {done.path}{left}", file=sys.stderr)


def _error(exc: ConfigError) -> int:
    print(f"gptlab-compare: error: {exc}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    """Run the comparison; 0 on success, 2 (one-line message on stderr) on bad input."""
    parser = build_parser()
    parser.error = _usage_error  # type: ignore[method-assign]  # one line, exit 2, no usage block
    args = parser.parse_args(argv)
    try:
        req = request(args)
        if args.lr_grid or (modes.is_lr_grid(req) and not args.split_by):
            text, out = modes.lr_grid(req)
            print(text)
            print(f"wrote {out / 'lr_grid.json'} and {out / 'lr_curves.png'}")
            if args.workspace and (failed := modes.workspace(modes.lr_grid_runs(req), out, args.wandb_mode)):
                print(words.note(failed), file=sys.stderr)
            return 0
        if args.ladder or modes.is_ladder(req):
            text, out = modes.ladder(req)
            print(text)
            if args.wandb or args.workspace:
                print("note: W&B logging covers training comparisons; the ladder is in the local files")
            both = f"{out / 'ladder_lr.json'}, " * modes.is_ladder_lr(req) + str(out / "ladder.json")
            print(f"wrote {both} and {out / 'ladder.png'} (per-rung tables: --split-by <the ladder's key>)")
            return 0
        wandb_log.check_mode(args.wandb_mode)
        if args.workspace:
            require("wandb_workspaces", "workspaces", "gptlab-compare --workspace")
        if args.time:
            time_arms(req)
        found = modes.tables(req)
    except ConfigError as exc:
        return _error(exc)
    if isinstance(found, modes.DecodeOnly):
        terminal.print_document(decode.page(found.rows, found.baseline))
        if args.wandb or args.workspace:
            print("note: W&B logging covers training comparisons; this decode-only one is in the local files")
        print(f"wrote {found.out}/comparison.md and comparison.json")
        return 0
    print_tables(found, args)
    return 0


def print_tables(found: modes.Tables, args: argparse.Namespace) -> None:
    """Write each part's reports and print its report document (decode and factorial effects in it), log W&B; then
    the files written."""
    from gptlab.compare.render import factorial

    for n in found.warnings + found.left_out:
        print(words.note(n), file=sys.stderr)
    out, written = found.out, []
    for part, cmp in zip(found.parts, found.comparisons):
        for n in cmp.warnings + cmp.notes:
            print(words.note(n), file=sys.stderr)
        cmp.warnings = found.left_out + cmp.warnings
        where = out / part.slug if found.split_by else out
        studies = [factorial.section(found.effects)] if found.effects is not None else []
        doc, images = modes.write_reports(cmp, where, args.power, studies)
        terminal.print_document(doc)
        if found.effects is not None:
            atomic_write_text(
                where / "factorial.json", json.dumps(strict_json(json_report.plain(found.effects)), indent=1) + "\n"
            )
        if wandb_log.wanted(args.wandb, args.wandb_mode):
            log_to_wandb(cmp, doc, part.runs, where, args.wandb_mode)
        written.append(f"{where}/comparison.md, comparison.json, comparison.html and {len(images)} PNGs")
    if found.split_by:
        modes.write_index(found.parts, found.comparisons, out, found.split_by)
    if args.workspace and (failed := modes.workspace(found.runs, out, args.wandb_mode)):
        print(words.note(failed), file=sys.stderr)
    for line in written:
        print(f"wrote {line}")
    if found.split_by:
        print(
            f"wrote {out}/comparison.md and comparison.json: the {len(found.parts)} tables split by "
            f"{', '.join(found.split_by)}"
        )


if __name__ == "__main__":
    sys.exit(main())

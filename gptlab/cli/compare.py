"""`gptlab-compare PATH...`: compare runs like with like; prints verdicts and a table, writes md/json/html/PNG reports.

Runs scored on different validation sets are refused (or, with --split-by KEY, compared in separate tables, one
folder each under --out); a folder holding several sweeps is refused with their list; of a partial sweep the runs
that finished are compared and the others named; copied run dirs count once.
"""

from __future__ import annotations

import argparse
import html
import json
import shlex
import sys
from pathlib import Path
from typing import NoReturn

from gptlab.compare import decode, noise_floor, wandb_log
from gptlab.compare.analysis import Comparison, add_targets, compare
from gptlab.compare.claims import load_claims
from gptlab.compare.compute import equal_compute
from gptlab.compare.like import Part, split
from gptlab.compare.runs import RUN_MARKERS, discover, expand_paths, load_run
from gptlab.compare.stats import ALPHA
from gptlab.compare.sweeps import check_one_sweep, finished_runs
from gptlab.compare.target import parse_target
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
        choices=("auto", "none"),
        default="auto",
        help="auto (default): speed verdicts against this machine's noise floor measured by `gptlab-sweep aa` "
        "(looked up by the runs' own machine); none: the fixed outside-load heuristic",
    )
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
    p.add_argument(
        "--lr-grid",
        action="store_true",
        help="a gptlab-sweep --lr-grid sweep dir: each arm at its own best lr (lr curves, edge warnings, verdicts at "
        "each arm's best and at the baseline's lr, stability margin)",
    )
    p.add_argument(
        "--ladder",
        action="store_true",
        help="a gptlab-sweep --ladder sweep dir (auto-detected when it is the one path): per arm a power law of final "
        "val loss in size, the gap to the baseline (grows / shrinks / crosses over) and the ranking at every rung",
    )
    p.add_argument(
        "--ladder-x",
        choices=("params", "flops"),
        default="params",
        help="the ladder's size: non-embedding parameters (default) or training FLOPs per token",
    )
    p.add_argument(
        "--factorial",
        action="store_true",
        help="a gptlab-sweep --factorial sweep dir (auto-detected when it is the one path): main effects and "
        "interactions on val loss and speed (statsmodels OLS/ANOVA) and whether the parts add up",
    )
    p.add_argument(
        "--holdout-seeds",
        help="with --lr-grid: pick each arm's lr on the other seeds and report on these (e.g. 2 or 2,3)",
    )
    p.add_argument(
        "--workspace",
        action="store_true",
        help="also write a W&B workspace view of the sweep (<out>/workspace.json); saved to W&B "
        "and its URL printed when online",
    )


def _is_run_dir(path: Path) -> bool:
    return any((path / m).is_file() for m in RUN_MARKERS)


def _is_ladder(path: Path) -> bool:
    from gptlab.compare.ladder import is_ladder

    return is_ladder(path)


def out_dir(arg: str | None, first: str, run_dirs: list[Path]) -> Path:
    """--out, else <first path>/comparison when it is a sweep dir, else ./comparison; never a run dir."""
    first_path = Path(first)
    if arg:
        out = Path(arg)
    elif first_path.is_dir() and not _is_run_dir(first_path):
        out = first_path / "comparison"
    else:
        out = Path("comparison")
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out '{out}' exists and is not a directory")
    if out.is_dir() and (_is_run_dir(out) or out.resolve() in run_dirs):
        raise ConfigError(f"--out '{out}' is a run directory; choose a directory that holds no run files")
    from gptlab.state.rundir import check_output  # here: the guard's module imports torch, compare itself never

    check_output(out / "comparison.json", "--out")  # never inside a run's own folders (checkpoints/, .hydra/, ...)
    return out


def write_reports(
    cmp: Comparison, out: Path, power: bool = False, sections: tuple[str, str] = ("", "")
) -> dict[str, Path]:
    """Write PNGs, comparison.json/.md/.html into out (the --power table in md/html with power; `sections`: more
    (markdown, html) at the end, e.g. factorial effects); returns the PNGs by name."""
    from gptlab.compare.plots import make_plots
    from gptlab.compare.report import html_report, markdown

    out.mkdir(parents=True, exist_ok=True)
    images = make_plots(cmp, out)
    (out / "comparison.json").write_text(json.dumps(strict_json(cmp.to_json()), indent=2) + "\n")
    extra = "\n".join(decode.markdown(cmp.decode)) + "\n" if cmp.decode else ""
    (out / "comparison.md").write_text(markdown(cmp, images, power) + extra + sections[0])
    extra_html = (decode.html(cmp.decode) if cmp.decode else "") + sections[1]
    (out / "comparison.html").write_text(html_report(cmp, images, extra_html, power))
    return images


def write_index(parts: list[Part], comparisons: list[Comparison], out: Path, keys: list[str]) -> None:
    """--split-by: <out>/comparison.json and .md list the parts and the folder each one's reports are in."""
    out.mkdir(parents=True, exist_ok=True)
    doc = {
        "split_by": keys,
        "parts": [
            {"split": part.values, "out": part.slug, "baseline": cmp.baseline, "compared_at": cmp.at()}
            for part, cmp in zip(parts, comparisons)
        ],
    }
    (out / "comparison.json").write_text(json.dumps(doc, indent=2) + "\n")
    lines = [f"# Comparisons split by {', '.join(keys)}", ""]
    lines += [
        f"- [{part.title}]({part.slug}/comparison.md): baseline {cmp.baseline}, at {cmp.at()}"
        for part, cmp in zip(parts, comparisons)
    ]
    (out / "comparison.md").write_text("\n".join(lines) + "\n")


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


def check_mode(mode: str | None) -> None:
    """Refuse --wandb-mode online without an API key before any work, as training refuses logger.wandb.mode."""
    from gptlab.sinks.wandb import api_key_configured

    if mode == "online" and not api_key_configured():
        raise ConfigError(
            "--wandb-mode online needs a W&B API key (set WANDB_API_KEY or run `wandb login`); "
            "allowed without one: auto, offline, disabled"
        )


def log_to_wandb(cmp: Comparison, images: dict[str, Path], runs: list, out: Path, mode: str | None) -> None:
    """Log the comparison run and print where it went (and the `wandb sync` line when offline)."""
    logged = wandb_log.log_comparison(cmp, images, runs, out, mode or "auto")
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


def write_workspace(runs: list, out: Path, mode: str | None) -> None:
    """--workspace: the W&B view of the sweep; a failure here warns and never fails the comparison."""
    try:
        from gptlab.compare.workspace import publish

        publish(runs, out, mode or "auto")
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"warning: W&B workspace not written ({first}); the local report is complete", file=sys.stderr)


def decode_main(runs: list, args: argparse.Namespace, run_dirs: list[Path]) -> int:
    """gptlab-decode run dirs alone: the decode table, comparison.json (`decode`) and comparison.md; no W&B."""
    given = [
        flag
        for flag, value in (
            ("--step", args.step),
            ("--target", args.target),
            ("--threshold", args.threshold),
            ("--claims", args.claims),
        )
        if value not in (None, [])
    ]
    if given:
        raise ConfigError(
            f"{given[0]}: these are gptlab-decode run dirs (decode.json only), with no training curves "
            f"to line up; compare them without it"
        )
    baseline, rows = decode.compare_decode(runs, args.baseline)
    out = out_dir(args.out, args.paths[0], run_dirs)
    decode.print_decode(rows, baseline)
    out.mkdir(parents=True, exist_ok=True)
    doc = {"baseline": baseline, "alpha": ALPHA, "decode": decode.to_json(rows)}
    (out / "comparison.json").write_text(json.dumps(strict_json(doc), indent=2) + "\n")
    (out / "comparison.md").write_text(
        "\n".join([f"# Decode comparison (baseline: {baseline})", *decode.markdown(rows)[1:]]) + "\n"
    )
    title = html.escape(f"Decode comparison (baseline: {baseline})")
    (out / "comparison.html").write_text(
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{title}'
        f"</title></head><body>\n<h1>{title}</h1>\n{decode.html(rows)}</body></html>\n"
    )
    if args.wandb or args.workspace:
        print("note: W&B logging covers training comparisons; this decode-only one is in the local files")
    print(f"wrote {out}/comparison.md and comparison.json")
    return 0


def lr_grid_main(args) -> int:
    """--lr-grid: the arm x lr x seed grid of one sweep dir (gptlab/compare/lr_grid.py), table + lr_grid.json + png."""
    from gptlab.compare import lr_grid

    try:
        if len(args.paths) != 1:
            raise ConfigError("--lr-grid: give one sweep dir (gptlab-sweep NAME --lr-grid ... --out DIR)")
        holdout = None
        if args.holdout_seeds:
            try:
                holdout = {int(s) for s in args.holdout_seeds.split(",")}
            except ValueError:
                raise ConfigError(f"--holdout-seeds {args.holdout_seeds!r}: allowed: seeds, e.g. 2 or 2,3") from None
        sweep = Path(args.paths[0])
        curves = lr_grid.read_grid(sweep)
        doc = lr_grid.report(curves, holdout)
        out = Path(args.out) if args.out else sweep / "comparison"
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out / "lr_grid.json", json.dumps(lr_grid.to_json(doc), indent=1) + "\n")
        lr_grid.plot_curves(curves, out / "lr_curves.png")
    except ConfigError as exc:
        print(f"gptlab-compare: error: {exc}", file=sys.stderr)
        return 2
    print(lr_grid.format_report(doc))
    print(f"wrote {out / 'lr_grid.json'} and {out / 'lr_curves.png'}")
    return 0


def _one_sweep_dir(args) -> Path | None:
    """The sweep dir when exactly one folder (not a run dir) is given and no --split-by: what a ladder or factorial
    sweep is auto-detected from."""
    if len(args.paths) != 1 or args.split_by:
        return None
    path = Path(args.paths[0])
    return path if path.is_dir() and not _is_run_dir(path) else None


def ladder_main(args) -> int:
    """--ladder (or a ladder sweep dir): per-arm power-law fits, gap verdicts, rankings; ladder.json + ladder.png."""
    from gptlab.compare import ladder

    try:
        if len(args.paths) != 1:
            raise ConfigError("--ladder: give one sweep dir (gptlab-sweep NAME --ladder KEY=V1,V2,... --out DIR)")
        unused = [
            flag
            for flag, value in (
                ("--step", args.step), ("--target", args.target), ("--threshold", args.threshold),
                ("--claims", args.claims), ("--split-by", args.split_by), ("--holdout-seeds", args.holdout_seeds),
                ("--factorial", args.factorial), ("--power", args.power),
            )
            if value not in (None, [], False)
        ]  # fmt: skip
        if unused:
            raise ConfigError(
                f"{unused[0]} does not apply to a ladder (final val loss per arm and rung); for one rung's table "
                "give its runs without --ladder"
            )
        sweep = Path(args.paths[0])
        found = ladder.read_ladder(sweep, args.ladder_x, args.baseline)
        doc = ladder.report(found)
        out = Path(args.out) if args.out else sweep / "comparison"
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out / "ladder.json", json.dumps(strict_json(doc), indent=1) + "\n")
        ladder.plot(found, doc, out / "ladder.png")
    except ConfigError as exc:
        print(f"gptlab-compare: error: {exc}", file=sys.stderr)
        return 2
    print(ladder.format_report(doc))
    if args.wandb or args.workspace:
        print("note: W&B logging covers training comparisons; the ladder is in the local files")
    print(f"wrote {out / 'ladder.json'} and {out / 'ladder.png'} (per-rung tables: --split-by <the ladder's key>)")
    return 0


def _factorial(args, runs: list) -> dict | None:
    """--factorial (or a factorial sweep dir): the effects of its factors on these runs; None when not one. An
    auto-detected factorial that cannot be analysed warns; an asked-for one is refused."""
    from gptlab.compare import factorial

    sweep = _one_sweep_dir(args)
    factors = factorial.sweep_factors(sweep) if sweep else []
    if args.factorial and not factors:
        raise ConfigError(
            "--factorial: give one factorial sweep dir (gptlab-sweep NAME --factorial; its sweep.yaml has factors)"
        )
    if not factors:
        return None
    try:
        return factorial.analyse(runs, factors)
    except ConfigError as exc:
        if args.factorial:
            raise
        print(f"warning: factorial effects not computed: {exc}", file=sys.stderr)
        return None


def _usage_error(message: str) -> NoReturn:
    """A bad flag as the other errors are: one line, exit 2 (argparse would print its usage block first)."""
    print(f"gptlab-compare: error: {message}", file=sys.stderr)
    sys.exit(2)


def main(argv: list[str] | None = None) -> int:
    """Run the comparison; 0 on success, 2 (one-line message on stderr) on bad input."""
    parser = build_parser()
    parser.error = _usage_error  # type: ignore[method-assign]  # one line, exit 2, no usage block
    args = parser.parse_args(argv)
    if args.lr_grid:
        return lr_grid_main(args)
    if args.ladder or ((sweep := _one_sweep_dir(args)) is not None and _is_ladder(sweep)):
        return ladder_main(args)
    try:
        check_mode(args.wandb_mode)
        if args.workspace:
            require("wandb_workspaces", "workspaces", "gptlab-compare --workspace")
        targets = [parse_target(s, "--target") for s in args.target]
        thresholds = [parse_target(s, "--threshold") for s in args.threshold]
        if args.threshold_key and not thresholds:
            raise ConfigError("--threshold-key needs --threshold METRIC=X (the target the key's arms must reach)")
        peak = parse_peak(args.peak_flops)
        run_dirs = discover(args.paths)
        runs = [load_run(p) for p in run_dirs]
        if decode.decode_only(runs):
            return decode_main(runs, args, run_dirs)
        given = expand_paths(args.paths)
        check_one_sweep(given, runs)
        runs, left_out = finished_runs(given, runs)
        claims = load_claims(args.claims) if args.claims else None
        floor, floor_note = noise_floor.lookup(runs, noise_floor.cache_dir() if args.noise_floor == "auto" else None)
        parts = split(runs, args.split_by) if args.split_by else [Part({}, runs)]
        comparisons = []
        for part in parts:
            try:
                cmp = compare(part.runs, args.baseline, args.step, claims, peak, floor=floor, floor_note=floor_note)
                add_targets(cmp, part.runs, targets, thresholds, args.threshold_key)
                cmp.compute = equal_compute(cmp)
            except ConfigError as exc:
                raise ConfigError(f"[{part.title}] {exc}" if args.split_by else str(exc)) from None
            cmp.split = part.values
            cmp.decode = decode.decode_rows(cmp.groups) if any(r.decode for r in part.runs) else []
            comparisons.append(cmp)
        effects = _factorial(args, runs) if args.factorial or not args.split_by else None
        out = out_dir(args.out, args.paths[0], run_dirs)
    except ConfigError as exc:
        print(f"gptlab-compare: error: {exc}", file=sys.stderr)
        return 2
    for warning in left_out:
        print(warning, file=sys.stderr)
    from gptlab.compare.report import print_table

    written = []
    for part, cmp in zip(parts, comparisons):
        for line in cmp.warnings + cmp.notes:
            print(line, file=sys.stderr)
        cmp.warnings = left_out + cmp.warnings
        print_table(cmp, power=args.power)
        if cmp.decode:
            decode.print_decode(cmp.decode, cmp.baseline)
        where = out / part.slug if args.split_by else out
        sections = ("", "")
        if effects is not None:
            from gptlab.compare import factorial

            print("\n".join(factorial.lines(effects)))
            sections = (factorial.markdown(effects), factorial.html(effects))
        images = write_reports(cmp, where, args.power, sections)
        if effects is not None:
            atomic_write_text(where / "factorial.json", json.dumps(strict_json(effects), indent=1) + "\n")
        if wandb_log.wanted(args.wandb, args.wandb_mode):
            log_to_wandb(cmp, images, part.runs, where, args.wandb_mode)
        written.append(f"{where}/comparison.md, comparison.json, comparison.html and {len(images)} PNGs")
    if args.split_by:
        write_index(parts, comparisons, out, args.split_by)
    if args.workspace:
        write_workspace(runs, out, args.wandb_mode)
    for line in written:
        print(f"wrote {line}")
    if args.split_by:
        print(
            f"wrote {out}/comparison.md and comparison.json: the {len(parts)} tables split by {', '.join(args.split_by)}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

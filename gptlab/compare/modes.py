"""What gptlab-compare does with the paths it is given, as library calls: the main table (optionally split, with
targets, thresholds, decode columns and factorial effects), a decode-only comparison, an lr grid and a scale ladder.

Each mode reads runs through compare/reading/runs.py and the like-with-like check, raises ConfigError (one line) on bad
input before writing anything, writes its files, and returns what the CLI prints. gptlab/cli/compare.py only parses
arguments, picks the mode, prints and chooses the exit code.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gptlab.compare.reading.claims import load_claims
from gptlab.compare.reading.like import Part, split
from gptlab.compare.reading.runs import Run, discover, expand_paths, is_run_dir, load_run
from gptlab.compare.reading.study import check_parts, split_study
from gptlab.compare.reading.sweeps import check_one_sweep, finished_runs, unpruned
from gptlab.compare.reading.timing import Session, find_timings
from gptlab.compare.render import decode as decode_text
from gptlab.compare.render import document, html_page, json_report, markdown, paper, words
from gptlab.compare.render.sections import Document, Section
from gptlab.compare.render.until_decided import baseline_note, report_lines
from gptlab.compare.statistics import noise_floor
from gptlab.compare.statistics.speed import OUTSIDE_LOAD_LIMIT
from gptlab.compare.statistics.stats import ALPHA
from gptlab.compare.statistics.verdict import Verdict
from gptlab.compare.studies.lr_grid import FINISHED, GridReport
from gptlab.compare.studies.until_decided import planned_baseline, read_record
from gptlab.compare.tables import decode, matrix
from gptlab.compare.tables.analysis import Comparison, add_targets, compare
from gptlab.compare.tables.compute import equal_compute
from gptlab.compare.tables.target import parse_target
from gptlab.compare.tables.timed import command
from gptlab.errors import ConfigError
from gptlab.state.layout import check_output
from gptlab.sweep.layout import TIMING_FILE, read_sweep
from gptlab.util.io import atomic_write_text, strict_json
from gptlab.util.note import Note, note, warning


@dataclass
class Request:
    """A comparison as asked for: the paths and every option of gptlab-compare (plain values, no argparse)."""

    paths: list[str]
    baseline: str | None = None
    step: int | None = None
    out: str | None = None
    claims: str | None = None
    split_by: list[str] = field(default_factory=list)
    power: bool = False
    peak_flops: float | None = None
    noise_floor: str = "auto"  # auto | none | a path holding a floor (noise_floor.choose)
    targets: list[str] = field(default_factory=list)
    thresholds: list[str] = field(default_factory=list)
    threshold_key: str | None = None
    factorial: bool = False
    holdout_seeds: str | None = None
    ladder_x: str = "params"
    ladder: bool = False
    timing: str | None = None  # --timing: a timing.json (or its folder) covering the runs; else found (timings)

    def used(self, *names: str) -> list[str]:
        """The command-line flags among `names` (attribute names) that were given."""
        flags = {"targets": "--target", "thresholds": "--threshold"}
        return [flags.get(n, "--" + n.replace("_", "-")) for n in names if getattr(self, n) not in (None, [], False)]


def one_sweep_dir(req: Request) -> Path | None:
    """The sweep dir when exactly one folder (not a run dir) is given and no --split-by: what a ladder or factorial
    sweep is auto-detected from."""
    if len(req.paths) != 1 or req.split_by:
        return None
    path = Path(req.paths[0])
    return path if path.is_dir() and not is_run_dir(path) else None


def out_dir(arg: str | None, first: str, run_dirs: list[Path]) -> Path:
    """--out, else <first path>/comparison when it is a sweep dir, else ./comparison; never a run dir, never inside
    a run but the compared ones (`run_dirs`), never on a run's own folders; returned resolved (symlinks, '..'), the
    folder every mode writes into."""
    first_path = Path(first)
    if arg:
        given = Path(arg)
    elif first_path.is_dir() and not is_run_dir(first_path):
        given = first_path / "comparison"
    else:
        given = Path("comparison")
    out = check_output(given / "comparison.json", "--out", own=run_dirs).parent  # resolved before any check
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out '{given}' exists and is not a directory")
    if out.is_dir() and (is_run_dir(out) or out in {p.resolve() for p in run_dirs}):
        raise ConfigError(f"--out '{given}' is a run directory; choose a directory that holds no run files")
    return out


def write_reports(
    cmp: Comparison, out: Path, power: bool = False, studies: Sequence[Section] = ()
) -> tuple[Document, dict[str, Path]]:
    """Write PNGs, comparison.json/.md/.html and the paper tables (comparison.csv/.tex) into out (the --power table
    with power; `studies`: more sections at the end, e.g. factorial effects); returns the report document and the
    PNGs by name."""
    from gptlab.compare.render.plots import make_plots

    out.mkdir(parents=True, exist_ok=True)
    images = make_plots(cmp, out)
    (out / "comparison.json").write_text(json.dumps(strict_json(json_report.comparison(cmp)), indent=2) + "\n")
    doc = document.build(cmp, images, power, studies)
    (out / "comparison.md").write_text(markdown.write(doc))
    (out / "comparison.html").write_text(html_page.write(doc))
    (out / "comparison.csv").write_text(paper.write_csv(doc))
    (out / "comparison.tex").write_text(paper.write_tex(doc))
    return doc, images


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


@dataclass
class Tables:
    """The main mode, computed and checked, before anything is written: the runs, one comparison per part, the
    factorial effects (None: not a factorial sweep), the output folder, the runs left out of a partial sweep, the
    warnings met on the way (a factorial that could not be analysed) and the keys the parts are split by (none: one
    table)."""

    runs: list[Run]
    parts: list[Part]
    comparisons: list[Comparison]
    effects: dict[str, Any] | None
    out: Path
    left_out: list[Note]
    warnings: list[Note] = field(default_factory=list)
    split_by: list[str] = field(default_factory=list)  # --split-by's keys, or those the sweeps were split by


@dataclass
class DecodeOnly:
    """gptlab-decode run dirs alone: the baseline and the decode rows, written to `out`."""

    baseline: str
    rows: list[decode.DecodeRow]
    out: Path


def tables(req: Request) -> Tables | DecodeOnly:
    """Read, check and compare the runs of the main mode (or a decode-only one, written here); ConfigError on bad
    input, before any file is written."""
    targets = [parse_target(s, "--target") for s in req.targets]
    thresholds = [parse_target(s, "--threshold") for s in req.thresholds]
    if req.threshold_key and not thresholds:
        raise ConfigError("--threshold-key needs --threshold METRIC=X (the target the key's arms must reach)")
    if req.holdout_seeds is not None:
        raise ConfigError("--holdout-seeds applies to an lr grid (--lr-grid with one gptlab-sweep --lr-grid sweep dir)")
    run_dirs = discover(req.paths)
    runs = [load_run(p) for p in run_dirs]
    if decode.decode_only(runs):
        return decode_only(runs, req, run_dirs)
    given = expand_paths(req.paths)
    check_one_sweep(given, runs)
    runs, left_out = finished_runs(given, runs)
    runs, pruned = unpruned(runs)  # a tune pruner's stopped runs: no result, named and left out
    left_out += pruned
    claims = load_claims(req.claims) if req.claims else None
    floor, floor_note = noise_floor.choose(runs, req.noise_floor, one_sweep_dir(req))
    parts, split_by, study_note = study_parts(runs, req.split_by)
    sessions = timings(req, runs, run_dirs)
    sweep = one_sweep_dir(req)
    record = read_record(sweep) if sweep else None  # until decided: the looks' baseline is the table's by default
    comparisons = []
    for part in parts:
        planned = planned_baseline(sweep, record, part.runs) if sweep and record else None
        try:
            rest = (claims, req.peak_flops, floor, floor_note, sessions, time_paths(req))
            cmp = _against(req, part.runs, planned, *rest)  # an explicit --baseline wins (with a note)
            add_targets(cmp, part.runs, targets, thresholds, req.threshold_key)
            cmp.compute = equal_compute(cmp)
            cmp.warnings += [n for n in cmp.compute.warnings if n.is_warning]
            cmp.notes += [n for n in cmp.compute.warnings if not n.is_warning]
            cmp.matrix = matrix.build(cmp)
        except ConfigError as exc:
            raise ConfigError(f"[{part.title}] {exc}" if split_by else str(exc)) from None
        cmp.warnings += [study_note] if study_note else []
        cmp.split = part.values
        cmp.decode = decode.decode_rows(cmp.groups) if any(r.decode for r in part.runs) else []
        if record:
            cmp.notes += [note(line) for line in report_lines(record)] + _other_baseline(cmp, record, planned)
        comparisons.append(cmp)
    effects, warnings = _factorial(req, runs, comparisons) if req.factorial or not req.split_by else (None, [])
    out = out_dir(req.out, req.paths[0], run_dirs)
    return Tables(runs, parts, comparisons, effects, out, left_out, warnings, split_by)


def _against(req: Request, runs: list[Run], planned: str | None, *rest: Any) -> Comparison:
    """compare() of one part against --baseline, else the until-decided plan's baseline arm (`planned`, its folder),
    else the default: also when the plan's arm has no group of its own (its runs counted once as an identical arm's)."""
    try:
        return compare(runs, req.baseline or planned, req.step, *rest)
    except ConfigError:
        if req.baseline is not None or planned is None:
            raise
        return compare(runs, None, req.step, *rest)


def _other_baseline(cmp: Comparison, record: dict[str, Any], planned: str | None) -> list[Note]:
    """The note when --baseline chose another arm than the until-decided plan's baseline (`planned`: its folder)."""
    if planned is None or any(Path(planned) in r.path.resolve().parents for r in cmp.groups[0].runs):
        return []
    return [note(baseline_note(cmp.baseline, record["baseline"]))]


def study_parts(runs: list[Run], split_by: list[str]) -> tuple[list[Part], list[str], Note | None]:
    """(the parts, the keys they are split by, the note each part carries): --split-by's parts, each refused when it
    still holds sweeps not run alike; without it the runs as one study, or split into the studies their sweeps form
    (compare/reading/study.py), never one table across budgets, schedules, eval grids, code versions or machines."""
    if split_by:
        parts = split(runs, split_by)
        check_parts(parts, split_by)
        return parts, split_by, None
    return split_study(runs)


def timings(req: Request, runs: list[Run], run_dirs: list[Path]) -> list[Session]:
    """The timing sessions covering the runs: --timing's, else each timed sweep dir's timing.json, else the one
    `gptlab-compare PATH... --time` left in the output folder (a set of run dirs of no one sweep)."""
    if req.timing is not None:
        return find_timings(runs, Path(req.timing))
    found = find_timings(runs)
    folder = out_dir(req.out, req.paths[0], run_dirs)
    return found or (find_timings(runs, folder) if (folder / TIMING_FILE).is_file() else [])


def time_paths(req: Request) -> list[str]:
    """What `gptlab-compare ... --time` needs to time these runs and find the session again: the paths and --out."""
    return [*req.paths, *(["--out", req.out] if req.out else [])]


def _factorial(req: Request, runs: list[Run], comparisons: list[Comparison]) -> tuple[dict | None, list[Note]]:
    """--factorial (or a factorial sweep dir): (the effects of its factors on these runs, or None when not one;
    warnings). An auto-detected factorial that cannot be analysed warns; an asked-for one is refused. A copy or replay
    the factorial counted once is named by the comparisons' own line already; one they did not name is added."""
    from gptlab.compare.studies import factorial

    sweep = one_sweep_dir(req)
    factors = factorial.sweep_factors(sweep) if sweep else []
    if req.factorial and not factors:
        raise ConfigError(
            "--factorial: give one factorial sweep dir (gptlab-sweep NAME --factorial; its sweep.yaml has factors)"
        )
    if not factors:
        return None, []
    try:
        limit = comparisons[0].load_limit if comparisons else OUTSIDE_LOAD_LIMIT  # the main table's: one rule
        matching = next((c.timing for c in comparisons if c.timing is not None), None)
        speed = factorial.timed_rates(matching, limit)
        doc = factorial.analyse(runs, factors, speed=speed, not_timed=command(runs, time_paths(req)), load_limit=limit)
    except ConfigError as exc:
        if req.factorial:
            raise
        return None, [warning(f"factorial effects not computed: {exc}")]
    said = {n for cmp in comparisons for n in cmp.warnings}
    return doc, [n for n in doc["warnings"] if n not in said]


def decode_only(runs: list[Run], req: Request, run_dirs: list[Path]) -> DecodeOnly:
    """gptlab-decode run dirs alone: the decode table, comparison.json (`decode`), .md and .html; no W&B."""
    given = req.used("step", "targets", "thresholds", "claims")
    if given:
        raise ConfigError(
            f"{given[0]}: these are gptlab-decode run dirs (decode.json only), with no training curves "
            f"to line up; compare them without it"
        )
    baseline, rows = decode.compare_decode(runs, req.baseline)
    out = out_dir(req.out, req.paths[0], run_dirs)
    out.mkdir(parents=True, exist_ok=True)
    doc = {"baseline": baseline, "alpha": ALPHA, "decode": decode.to_json(rows)}
    (out / "comparison.json").write_text(json.dumps(strict_json(doc), indent=2) + "\n")
    page = decode_text.page(rows, baseline)
    (out / "comparison.md").write_text(markdown.write(page))
    (out / "comparison.html").write_text(html_page.write(page))
    return DecodeOnly(baseline, rows, out)


def lr_grid(req: Request) -> tuple[str, Path]:
    """--lr-grid: the arm x lr x seed grid of one sweep dir, or of several read as one grid (a wider grid run into
    a second dir); writes lr_grid.json and lr_curves.png; (table, out)."""
    from gptlab.compare.render import lr_grid as grid_text
    from gptlab.compare.studies import lr_grid as grid

    if not req.paths:
        raise ConfigError("--lr-grid: give a sweep dir (gptlab-sweep NAME --lr-grid ... --out DIR), or several")
    flags = ("ladder", "baseline", "step", "targets", "thresholds", "threshold_key", "claims", "split_by", "power")
    unused = req.used(*flags, "factorial")
    if unused:
        raise ConfigError(
            f"{unused[0]} does not apply to an lr grid (final val loss per arm and lr, the first arm the baseline); "
            "for one lr's table give its runs without --lr-grid"
        )
    if is_ladder_lr(req):
        raise ConfigError(
            f"--lr-grid: {req.paths[0]} is a ladder with an lr grid at every rung; compare it with --ladder (or no "
            "flag): each arm at its own best lr per rung, and how the best lr moves with size"
        )
    holdout = grid.parse_holdout(req.holdout_seeds)
    dirs = [Path(p) for p in req.paths]
    for given in dirs:
        if not given.is_dir() or is_run_dir(given):
            raise ConfigError(f"--lr-grid: '{given}' is not a sweep dir (gptlab-sweep NAME --lr-grid ... --out DIR)")
    sweep = grid.grid_root(dirs)  # each cell's `where` is relative to it
    out = out_dir(req.out, str(dirs[0]), [])  # the guards of every mode: never into or among a run's files
    curves = grid.read_grid(*dirs)
    grid.check_holdout(holdout, curves, req.holdout_seeds)
    doc = grid.report(curves, holdout)
    at_best = _at_best_lr(sweep, curves, doc, holdout)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "lr_grid.json", json.dumps(strict_json(doc.to_json()), indent=1) + "\n")
    grid_text.plot_curves(curves, out / "lr_curves.png")
    text = grid_text.format_report(doc)
    if at_best is not None:
        write_reports(at_best, out, studies=grid_text.sections(text, out / "lr_curves.png"))
        text += f"\nreport (verdict matrix, each arm at its own best lr, the grid): {out / 'comparison.html'}"
    return text, out


def lr_grid_runs(req: Request) -> list[Run]:
    """The runs of the lr grid --lr-grid reads (every cell with a run dir, once): what its W&B workspace shows."""
    from gptlab.compare.studies import lr_grid as grid

    dirs = [Path(p) for p in req.paths]
    root = grid.grid_root(dirs)
    return [load_run(root / r.where) for c in grid.read_grid(*dirs).values() for r in c.runs if r.where]


def _one_lr(doc: GridReport, own: dict[str, Verdict], shared: dict[str, Verdict]) -> str | None:
    """The baseline's best lr when every arm picked it too (its own-best verdict is then its baseline's-lr verdict):
    the matrix shows one column; None otherwise."""
    base = doc.rows[0].best_lr
    same = all(r.best_lr == base for r in doc.rows) and all(own[k] == shared.get(k) for k in own)
    return f"{base:g}" if base is not None and same else None


def _at_best_lr(sweep: Path, curves: dict, doc: GridReport, holdout: set[int] | None) -> Comparison | None:
    """The main comparison of an lr grid: each arm's finished runs at its own best lr (the verdict seeds), with its
    verdict matrix (equal steps at the baseline's best lr, FLOPs and wall time at each own best, own best lr); None
    when fewer than two arms have a best lr (the grid's table says why)."""
    picked = {
        arm: [(sweep / r.where).resolve() for r in c.at(c.best_lr, holdout) if r.state == FINISHED and r.where]
        for arm, c in curves.items()
        if c.best_lr is not None
    }
    base = next(iter(curves))
    if not picked.get(base) or len([arm for arm, dirs in picked.items() if dirs]) < 2:
        return None
    runs = [load_run(p) for dirs in picked.values() for p in dirs]
    cmp = compare(runs, str(picked[base][0]), timings=find_timings(runs))  # the baseline arm's group, by a run dir
    if len(cmp.groups) != len([dirs for dirs in picked.values() if dirs]):  # runs that record no config (older)
        return None
    cmp.compute = equal_compute(cmp)
    label_of = {
        arm: next(g.label for g in cmp.groups if any(r.path.resolve() == dirs[0] for r in g.runs))
        for arm, dirs in picked.items()
        if dirs
    }
    versus = {label_of[a]: vs for a in label_of if (vs := doc.row(a).versus) is not None}
    own = {label: vs.own_best for label, vs in versus.items()}
    shared = {label: vs.shared_lr for label, vs in versus.items()}
    cmp.matrix = matrix.build(cmp, own_best_lr=own, at_baseline_lr=shared, one_lr=_one_lr(doc, own, shared))
    gone = {a: 0 for a in picked}  # verdict seeds that diverged at the arm's own best lr: this table has survivors only
    for row in doc.rows:
        arm_n, base_n = row.versus.own_best_diverged if row.versus else [0, 0]
        gone[row.arm], gone[base] = gone.get(row.arm, 0) + arm_n, max(gone.get(base, 0), base_n)
    cmp.warnings += [
        warning(
            f"{a}: {n} verdict seed{'s' * (n > 1)} diverged at its best lr {curves[a].best_lr:g}; this table reads the "
            "seeds that finished, the grid's own-best verdict is n/a",
            subject=a,
        )
        for a, n in gone.items()
        if n
    ]
    cmp.notes.append(
        note(
            "note: an lr grid: each arm's runs at its own best lr ("
            + ", ".join(f"{a} {curves[a].best_lr:g}" for a in picked)
            + f"); the grid's own table and curves follow. {words.note(doc.selection)}"
        )
    )
    return cmp


def ladder(req: Request) -> tuple[str, Path]:
    """--ladder (or a ladder sweep dir): per-arm power-law fits, gap trends, rankings; writes ladder.json and
    ladder.png; (the terminal text, out)."""
    from gptlab.compare.render import ladder as scale_text
    from gptlab.compare.studies import ladder as scale
    from gptlab.compare.studies import ladder_lr

    if len(req.paths) != 1:
        raise ConfigError("--ladder: give one sweep dir (gptlab-sweep NAME --ladder KEY=V1,V2,... --out DIR)")
    unused = req.used("step", "targets", "thresholds", "claims", "split_by", "holdout_seeds", "factorial", "power")
    if unused:
        raise ConfigError(
            f"{unused[0]} does not apply to a ladder (final val loss per arm and rung); for one rung's table "
            "give its runs without --ladder"
        )
    sweep = Path(req.paths[0])
    out = out_dir(req.out, str(sweep), [])  # the guards of every mode: never into or among a run's files
    if ladder_lr.is_ladder_lr(sweep):  # an lr grid at every rung: each arm at its own best lr
        grids, found = ladder_lr.read(sweep, req.ladder_x, req.baseline)
        both = ladder_lr.report(grids, found)
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(
            out / "ladder.json", json.dumps(strict_json(json_report.plain(both["ladder"])), indent=1) + "\n"
        )
        atomic_write_text(out / "ladder_lr.json", json.dumps(strict_json(json_report.plain(both)), indent=1) + "\n")
        scale_text.plot(found, both["ladder"], out / "ladder.png")
        return scale_text.format_lr_trend(both), out
    found = scale.read_ladder(sweep, req.ladder_x, req.baseline)
    doc = scale.report(found)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "ladder.json", json.dumps(strict_json(json_report.plain(doc)), indent=1) + "\n")
    scale_text.plot(found, doc, out / "ladder.png")
    return scale_text.format_report(doc), out


def is_lr_grid(req: Request) -> bool:
    """True when the one path given is an lr-grid sweep dir (its sweep.yaml records `lr_grid:` and no ladder: a
    ladder with an lr grid at every rung is a ladder's)."""
    sweep = one_sweep_dir(req)
    recorded = read_sweep(sweep, strict=False) if sweep else None
    return bool(recorded and recorded.lrs and recorded.ladder is None)


def is_ladder_lr(req: Request) -> bool:
    """True when the one path given is a ladder sweep dir with an lr grid at every rung."""
    from gptlab.compare.studies.ladder_lr import is_ladder_lr as recorded

    sweep = one_sweep_dir(req)
    return sweep is not None and recorded(sweep)


def is_ladder(req: Request) -> bool:
    """True when the one path given is a ladder sweep dir (its sweep.yaml records `ladder:`)."""
    from gptlab.compare.studies.ladder import is_ladder as recorded

    sweep = one_sweep_dir(req)
    return sweep is not None and recorded(sweep)


def workspace(runs: list[Run], out: Path, mode: str | None) -> Note | None:
    """--workspace: the W&B view of the sweep; a failure is a warning (returned), never a failed comparison."""
    try:
        from gptlab.compare.render.workspace import publish

        publish(runs, out, mode or "auto")
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return warning(f"W&B workspace not written ({first}); the local report is complete")
    return None

"""Each arm at its own best learning rate: the arm x lr x seed grid `gptlab-sweep NAME --lr-grid ...` writes.

Run dirs are `<sweep>/<arm>/lr<value>/seed<k>`, but each run's arm, lr and seed are read from its own config (the
folder only where a run recorded none), a copied run dir counts once (compare/reading/identity.py), and the grid's
design (sweep.yaml's arms, lrs and seeds) names every cell. Each cell is in one state:

- finished: the run finished with a finite final val loss no worse than DIVERGE_FACTOR x its step-0 val loss;
- diverged: a val or train loss is non-finite, the run stopped on a non-finite loss (its train.log says so: a
  stopped run logs no non-finite row), or its final val loss is above DIVERGE_FACTOR x its step-0 val loss;
- unfinished: it started and has not finished (killed, interrupted, preempted, failed otherwise, still running):
  it says nothing about the lr, so it is neither picked nor counted as diverged;
- refused: gptlab-sweep planned it and it cannot start (.plan/refused.json gives the reason);
- not run: in the design, with no run dir.

Per arm: final val loss vs lr (mean and spread over seeds), the best lr (lowest mean final val loss over the
picking seeds that finished; an lr where one of them diverged is never picked), a warning when the best lr is the
smallest or the largest that ran (the optimum may lie outside; with the lrs beyond it named when they were refused,
not run or unfinished), and the stability margin: the largest lr at which a seed finished and none diverged, with the
spike events (train.spike_factor) and the largest attention logit (train.diagnostics) at the best and at that lr.

Two verdicts per arm against the baseline (the first arm): at each arm's own best lr (the headline) and at the
baseline's best lr (the shared-lr comparison most ablations report). Selection bias: picking the minimum of a noisy
curve and reporting the same seeds' losses flatters the pick. With `holdout` seeds the lr is picked on the other
seeds and the verdicts use only the holdout seeds; without, the report says the figures are optimistic. A verdict
judged at a best lr at the grid's edge (the arm's, or the baseline's) carries that caveat (EDGE_LR).

Several dirs read as one grid: the design (arms, lrs, seeds) comes from the dirs that are lr grids (sweep.yaml records
`lr_grid`, or the folders hold <arm>/lr<v>/seed<k>); a run dir under a given dir that is no cell of the grid (another
sweep's <arm>/seed<k>) is left out and named, with why, in one warning per dir.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from gptlab.compare.reading.group import SEED_KEYS, is_bookkeeping
from gptlab.compare.reading.identity import dedupe
from gptlab.compare.reading.like import check_like
from gptlab.compare.reading.runs import Run, discover, is_run_dir, load_run
from gptlab.compare.statistics import verdict
from gptlab.compare.statistics.stats import ALPHA, mean, std
from gptlab.compare.statistics.verdict import Caveat, Verdict
from gptlab.errors import ConfigError
from gptlab.sweep.layout import parse_lr_part, parse_seed_part, read_refused, read_sweep
from gptlab.util.note import Note, note, warning
from gptlab.util.tree import flatten

DIVERGE_FACTOR = 1.5
FINISHED, DIVERGED, UNFINISHED, REFUSED, NOT_RUN = "finished", "diverged", "unfinished", "refused", "not run"
# what gptlab-train's one-line error says when a run stops on a non-finite loss (gptlab/train/loop.py's
# diverged_message; compare imports nothing of training, so it is named here and a test ties the two)
STOPPED_ON_NONFINITE = "non-finite steps, train.nan_skip="
LOG_TAIL = 65536  # bytes of train.log read for that line (it is among the last)
Cell = tuple[str, float, int]  # (arm, lr, seed)
Found = tuple[Path, str, float, int | None]  # a run dir and the arm, lr and seed its folders name


@dataclass
class GridRun:
    """One cell of the grid: a run as read from its run dir, or a cell with none (refused, not run)."""

    arm: str
    lr: float
    seed: int
    final: float | None  # final val loss of a finished run; None in every other state
    state: str = FINISHED  # FINISHED | DIVERGED | UNFINISHED | REFUSED | NOT_RUN
    spikes: int | None = None  # None: spike detection off (train.spike_factor null), or no run
    max_logit: float | None = None
    where: str = ""  # the run dir, relative to the sweep dir ("" for a cell without one)
    reason: str = ""  # why it is refused, or what left it unfinished

    @property
    def diverged(self) -> bool:
        return self.state == DIVERGED


@dataclass
class ArmCurve:
    """One arm's cells by lr, its pick and its stability margin."""

    arm: str
    runs: list[GridRun]
    lrs: list[float] = field(default_factory=list)
    best_lr: float | None = None
    edge: str | None = None  # "smallest" | "largest": the best lr is at that end of the lrs that ran
    max_stable_lr: float | None = None

    def at(self, lr: float, seeds: set[int] | None = None) -> list[GridRun]:
        return [r for r in self.runs if r.lr == lr and (seeds is None or r.seed in seeds)]

    def ran(self) -> list[float]:
        """The lrs where a run finished or diverged: the ones that say something about the lr."""
        return sorted({r.lr for r in self.runs if r.state in (FINISHED, DIVERGED)})


class Grid(dict):
    """{arm: its curve} in the sweep's order, with the design's lrs and seeds and what reading found on the way
    (copies counted once, runs whose folder named another cell, stray dirs)."""

    def __init__(self, curves: dict[str, ArmCurve], lrs: list[float], seeds: list[int], notes: list[Note]):
        super().__init__(curves)
        self.lrs, self.seeds, self.notes = lrs, seeds, notes


def _stopped_on_nonfinite(run: Run) -> bool:
    """Whether the run's train.log ends with gptlab-train's line for a stop on a non-finite loss."""
    log = run.path / "train.log"
    try:
        with log.open("rb") as handle:
            handle.seek(max(0, log.stat().st_size - LOG_TAIL))
            return STOPPED_ON_NONFINITE in handle.read().decode(errors="replace")
    except OSError:
        return False


def _grid_run(arm: str, lr: float, seed: int, run: Run, where: str) -> GridRun:
    """A grid cell from the one run reader's Run: its state, final val loss, spikes and max logit."""
    rows, summary, status = run.records, run.summary, run.status
    vals = [float(r["val/loss"]) for r in rows if "val/loss" in r and r["val/loss"] is not None]
    train = [float(r["train/loss"]) for r in rows if r.get("train/loss") is not None]
    nonfinite = any(not math.isfinite(v) for v in vals + train)
    final = summary.get("final_val_loss") if status == "finished" else None
    final = float(final) if final is not None else None
    blew_up = final is not None and bool(vals) and math.isfinite(vals[0]) and final > DIVERGE_FACTOR * vals[0]
    reason = ""
    if nonfinite or blew_up or (final is not None and not math.isfinite(final)):
        state = DIVERGED
    elif status == "failed" and _stopped_on_nonfinite(run):
        state = DIVERGED
    elif final is not None:
        state = FINISHED
    else:
        state = UNFINISHED
        reason = "finished without a final val loss" if status == "finished" else (
            "no summary.json: killed, or still running" if status == "missing" else f"status {status}"
        )  # fmt: skip
    logits = [float(v) for r in rows for k, v in r.items() if k.endswith("/max_logit") and v is not None]
    return GridRun(
        arm=arm,
        lr=lr,
        seed=seed,
        final=final if state == FINISHED else None,
        state=state,
        spikes=sum(1 for r in rows if "spike/loss" in r) if _spikes_on(run) else None,
        max_logit=max(logits) if logits else None,
        where=where,
        reason=reason,
    )


def _spikes_on(run: Run) -> bool:
    """Whether the run looked for loss spikes (train.spike_factor set); a run without a config is taken as on."""
    train = run.config.get("train") if isinstance(run.config, dict) else None
    return not isinstance(train, dict) or "spike_factor" not in train or train["spike_factor"] is not None


def _spike_total(runs: list[GridRun]) -> int | None:
    """Spikes over the runs; None when any of them did not look for spikes (a 0 would claim it had)."""
    counts = [r.spikes for r in runs]
    return None if not counts or any(c is None for c in counts) else sum(c for c in counts if c is not None)


def _candidates(sweep_dir: Path, rung: str | None = None) -> list[Found]:
    """(run dir, arm, lr, seed) as the folders name them, for every run dir at <arm>/lr<v>/<seed dir> (with a rung:
    <arm>/<rung>/lr<v>/<seed dir>, one rung of a ladder with an lr grid)."""
    found = []
    for arm_dir in sorted(p for p in sweep_dir.iterdir() if p.is_dir() and not p.name.startswith(".")):
        parent = arm_dir / rung if rung is not None else arm_dir
        if not parent.is_dir():
            continue
        for lr_dir in sorted(p for p in parent.iterdir() if p.is_dir() and parse_lr_part(p.name) is not None):
            lr = parse_lr_part(lr_dir.name)
            for seed_dir in sorted(p for p in lr_dir.iterdir() if p.is_dir() and is_run_dir(p)):
                found.append((seed_dir, arm_dir.name, float(lr or 0), parse_seed_part(seed_dir.name)))
    return found


def _own(run: Run, arm: str, lr: float, seed: int | None) -> tuple[str, float, int | None]:
    """The run's arm, lr and seed from its own config; the folder's for a key it did not record."""
    cfg = run.config if isinstance(run.config, dict) else {}
    optimizer = cfg.get("optimizer")
    own_lr = optimizer.get("lr") if isinstance(optimizer, dict) else None
    own_seed, own_arm = cfg.get("seed"), cfg.get("arm")
    return (
        own_arm if isinstance(own_arm, str) and own_arm else arm,
        float(own_lr) if isinstance(own_lr, (int, float)) and not isinstance(own_lr, bool) else lr,
        own_seed if type(own_seed) is int else seed,
    )


def _refused_cells(sweep_dir: Path, rung: str | None = None) -> dict[Cell, str]:
    """(arm, lr, seed) -> why it cannot start, from the latest plan's refused.json (of one rung, with a rung)."""
    cells = {}
    for subdir, why in read_refused(sweep_dir).items():
        parts = subdir.split("/")
        if rung is not None:
            if len(parts) != 4 or parts[1] != rung:
                continue
            parts = [parts[0], *parts[2:]]
        lr = parse_lr_part(parts[1]) if len(parts) == 3 else None
        seed = parse_seed_part(parts[2]) if len(parts) == 3 else None
        if lr is not None and seed is not None:
            cells[parts[0], lr, seed] = why
    return cells


def grid_root(sweep_dirs: list[Path]) -> Path:
    """The folder every cell's `where` is relative to: the sweep dir, or the common folder of several."""
    if len(sweep_dirs) == 1:
        return sweep_dirs[0]
    return Path(os.path.commonpath([str(d.resolve()) for d in sweep_dirs]))


def _design(sweep_dirs: tuple[Path, ...], rung: str | None) -> tuple[list[Found], dict[Cell, str], list, list, list]:
    """(the run dirs as the folders name them, the refused cells with why, the arms, lrs and seeds sweep.yaml
    records) of every sweep dir read as one grid; a dir that is no lr grid (no lr<v> folders, no refused cell, and
    no lr_grid in its sweep.yaml) adds nothing to the design (its seeds are not the grid's)."""
    found: list[Found] = []
    refused: dict[Cell, str] = {}
    arms: list[str] = []
    lrs: list[float] = []
    seeds: list[int] = []
    for sweep_dir in sweep_dirs:
        recorded = read_sweep(sweep_dir, strict=False)  # none or unreadable: the design is what the folders hold
        cells = _refused_cells(sweep_dir, rung)
        runs = _candidates(sweep_dir, rung) if sweep_dir.is_dir() else []
        if not cells and not runs and not (recorded and recorded.lrs):
            continue
        refused |= cells
        found += runs
        arms += recorded.arms if recorded else []
        lrs += recorded.lrs if recorded and recorded.lrs else []
        seeds += recorded.seeds if recorded and "seeds" in recorded.record else []
    return found, refused, arms, lrs, seeds


def _left_out(sweep_dirs: tuple[Path, ...], found: list[Found], root: Path) -> list[Note]:
    """One warning per given dir holding run dirs that are no cells of the grid: they are left out, named, and why."""
    cells = {path.resolve() for path, _, _, _ in found}
    notes = []
    for sweep_dir in sweep_dirs:
        try:
            runs = [p for p in discover([str(sweep_dir)]) if p not in cells]
        except ConfigError:  # an empty dir, or one without runs: nothing left out
            continue
        if not runs:
            continue
        recorded = read_sweep(sweep_dir, strict=False)
        grid = (recorded is not None and recorded.lrs) or any(sweep_dir.resolve() in p.parents for p in cells)
        why = "not at <arm>/lr<value>/seed<k>" if grid else "not an lr grid sweep dir: its runs are at one lr each"
        named = [os.path.relpath(p, root) for p in runs]
        shown = ", ".join(named[:6]) + (f", ... ({len(named)} in all)" if len(named) > 6 else "")
        notes.append(
            warning(
                f"{sweep_dir}: {len(runs)} run{'s' * (len(runs) > 1)} left out of the lr grid ({why}): {shown}",
                str(sweep_dir),
                "compare them without --lr-grid",
            )
        )
    return notes


def _place(runs: list[Run], folders: dict[int, tuple], root: Path) -> tuple[dict[Cell, GridRun], list[Note]]:
    """Each run in the cell its own config names (the folder's for a key it did not record): (the cells, a warning
    per run counted elsewhere than its folder says or left out); two different runs of one cell are refused."""
    cells: dict[Cell, GridRun] = {}
    notes = []
    for run in runs:
        where = os.path.relpath(run.path, root).replace(os.sep, "/")
        arm, lr, seed = _own(run, *folders[id(run)])
        if seed is None:
            notes.append(warning(f"{where}: not a seed<k> folder and its config records no seed: left out", where))
            continue
        if (arm, lr, seed) != folders[id(run)]:
            notes.append(
                warning(f"{where}: its own config says arm {arm}, lr {lr:g}, seed {seed}: counted there", where)
            )
        if (arm, lr, seed) in cells:
            raise ConfigError(
                f"{root}: {cells[arm, lr, seed].where} and {where} are two different runs of arm {arm} at lr "
                f"{lr:g}, seed {seed}; leave one of them out"
            )
        cells[arm, lr, seed] = _grid_run(arm, lr, seed, run, where)
    return cells, notes


def read_grid(*sweep_dirs: Path, rung: str | None = None) -> Grid:
    """{arm: its curve} of one lr grid sweep dir, or of several read as one grid (arms in sweep.yaml's order when
    it lists them): every cell of the design with its state, each run read by compare/reading/runs.py; runs scored
    on different validation sets are refused (check_like), so are two different runs of one cell and, across
    several dirs, an arm whose runs differ in more than lr and seed. With `rung`, the grid of that rung of a ladder
    with an lr grid (<arm>/<rung>/lr<v>/seed<k>)."""
    root = grid_root(list(sweep_dirs))
    found, refused, design, given_lrs, given = _design(sweep_dirs, rung)
    where_given = " ".join(str(d) for d in sweep_dirs)
    if not found and not refused:
        raise ConfigError(
            f"{where_given}: no lr grid runs (<arm>/lr<value>/seed<k>/); run gptlab-sweep NAME --lr-grid ..."
        )
    runs = [load_run(path) for path, _, _, _ in found]
    folders = {id(run): (arm, lr, seed) for run, (_, arm, lr, seed) in zip(runs, found)}
    kept, copies = dedupe(runs)
    if kept:
        check_like(kept)  # one sweep's runs share their data: only a mixed-in foreign run can differ
    if len(sweep_dirs) > 1:
        _check_arms_agree(kept, folders, root)
    cells, placed = _place(kept, folders, root)
    notes = copies + placed + (_left_out(sweep_dirs, found, root) if rung is None else [])
    arms = list(dict.fromkeys([*design, *(a for a, _, _ in [*cells, *refused])]))
    lrs = sorted({*given_lrs, *(lr for _, lr, _ in [*cells, *refused])})
    seeds = sorted({*given, *(s for _, _, s in [*cells, *refused])})
    for key in [(a, lr, s) for a in arms for lr in lrs for s in seeds if (a, lr, s) not in cells]:
        state = REFUSED if key in refused else NOT_RUN
        cells[key] = GridRun(*key, final=None, state=state, reason=refused.get(key, ""))
    if all(r.state in (REFUSED, NOT_RUN) for r in cells.values()):
        first = next(iter(refused.values()), "")
        raise ConfigError(f"{where_given}: none of the grid's {len(cells)} runs ran ({len(refused)} refused: {first})")
    if len(sweep_dirs) > 1:
        notes.append(warning(f"one grid read from {len(sweep_dirs)} sweep dirs: " + ", ".join(map(str, sweep_dirs))))
    curves = {arm: ArmCurve(arm, sorted((r for r in cells.values() if r.arm == arm), key=lambda r: (r.lr, r.seed)))
              for arm in arms}  # fmt: skip
    return Grid(curves, lrs, seeds, notes)


def _check_arms_agree(runs: list[Run], folders: dict[int, tuple], root: Path) -> None:
    """Across several sweep dirs, one arm's runs may differ only in lr and seed (the grid's axes): an arm trained
    longer, on another model or data in one dir is another arm, and pooling it would bias its curve."""
    seen: dict[str, tuple[dict, Run]] = {}
    for run in runs:
        arm = _own(run, *folders[id(run)])[0]
        setting = _setting(run)
        if arm not in seen:
            seen[arm] = (setting, run)
            continue
        first, other = seen[arm]
        differ = sorted(k for k in first.keys() | setting.keys() if first.get(k) != setting.get(k))
        if differ:
            key = differ[0]
            raise ConfigError(
                f"arm {arm}: {os.path.relpath(other.path, root)} has {key}={first.get(key)!r} and "
                f"{os.path.relpath(run.path, root)} has {key}={setting.get(key)!r}; the runs of one arm may differ "
                "only in optimizer.lr and seed across the sweep dirs of one grid (compare them separately)"
            )


def _setting(run: Run) -> dict:
    """A run's config as flat keys, less its lr, seeds and bookkeeping (paths, names, the sweep's own keys)."""
    cfg = run.config if isinstance(run.config, dict) else {}
    skip = {"optimizer.lr", "sweep", "arm"}
    return {
        k: v for k, v in flatten(cfg, empty_as_leaf=True).items()
        if k not in SEED_KEYS and k not in skip and not is_bookkeeping(k)
    }  # fmt: skip


def parse_holdout(text: str | None) -> set[int] | None:
    """--holdout-seeds as a set of seeds (None when not given); a ConfigError for anything else, empty included."""
    if text is None:
        return None
    try:
        seeds = {int(s) for s in text.split(",")}
    except ValueError:
        raise ConfigError(f"--holdout-seeds {text!r}: allowed: seeds of the sweep, e.g. 2 or 2,3") from None
    return seeds


def check_holdout(holdout: set[int] | None, grid: dict[str, ArmCurve], text: str | None = None) -> None:
    """Holdout seeds must be seeds of the sweep, and leave at least one to pick the lr on: one line, else."""
    if holdout is None:
        return
    seeds = getattr(grid, "seeds", None) or sorted({r.seed for c in grid.values() for r in c.runs})
    given = text if text is not None else ",".join(str(s) for s in sorted(holdout))
    listed = ", ".join(str(s) for s in seeds)
    lacking = sorted(holdout - set(seeds))
    if lacking:
        raise ConfigError(f"--holdout-seeds {given!r}: the sweep has no seed {lacking[0]}; its seeds are {listed}")
    if set(seeds) <= holdout:
        raise ConfigError(
            f"--holdout-seeds {given!r}: holds out every seed of the sweep ({listed}), leaving none to pick the lr "
            "on; allowed: some of them"
        )


def analyse(curves: dict[str, ArmCurve], holdout: set[int] | None = None) -> None:
    """Fill each curve's lrs, best lr (picked on the non-holdout seeds), edge and max stable lr."""
    for curve in curves.values():
        curve.lrs = sorted({r.lr for r in curve.runs})
        pick = {s for s in {r.seed for r in curve.runs} if not holdout or s not in holdout}
        curve.best_lr = best_lr({lr: finals_and_diverged(curve.at(lr, pick)) for lr in curve.lrs})
        ran = curve.ran()
        curve.edge = None
        if curve.best_lr is not None and len(ran) > 1:
            curve.edge = "smallest" if curve.best_lr == ran[0] else "largest" if curve.best_lr == ran[-1] else None
        stable = [
            lr
            for lr in curve.lrs
            if any(r.state == FINISHED for r in curve.at(lr)) and not any(r.diverged for r in curve.at(lr))
        ]
        curve.max_stable_lr = max(stable) if stable else None


def finals_and_diverged(runs: list[GridRun]) -> tuple[list[float], bool]:
    """The finished runs' final val losses of one cell, and whether a run there diverged."""
    return [r.final for r in runs if r.state == FINISHED and r.final is not None], any(r.diverged for r in runs)


def best_lr(cells: dict[float, tuple[list[float], bool]]) -> float | None:
    """The pick: the lr with the lowest mean final val loss over its finished runs, never one where a run diverged."""
    scores = {lr: mean(done) for lr, (done, diverged) in cells.items() if done and not diverged}
    return min(scores, key=lambda lr: scores[lr]) if scores else None


def finals_at(curve: ArmCurve, lr: float | None, seeds: set[int] | None) -> list[float]:
    if lr is None:
        return []
    return [r.final for r in curve.at(lr, seeds) if r.final is not None]


def _verdict(arm: list[float], base: list[float], optimistic: bool) -> Verdict:
    found = verdict.difference("val/loss", arm, base, ALPHA)
    return found.with_caveat(Caveat.OPTIMISTIC) if optimistic else found


def _diverged_at(curve: ArmCurve, lr: float | None, seeds: set[int] | None) -> int:
    """How many of the arm's runs at lr (of the seeds given) diverged: 0 for an lr that is None."""
    return 0 if lr is None else sum(r.state == DIVERGED for r in curve.at(lr, seeds))


def _versus(
    arm: ArmCurve, arm_lr, base: ArmCurve, base_lr, seeds: set[int] | None, optimistic: bool
) -> tuple[Verdict, list[int]]:
    """arm at arm_lr against base at base_lr on the verdict seeds, and how many of them diverged there on each side
    ([arm, base]). A diverged seed leaves no verdict: judged on the seeds that survived, an arm unstable at that lr
    read as a decided "lower"."""
    gone = [_diverged_at(arm, arm_lr, seeds), _diverged_at(base, base_lr, seeds)]
    if any(gone):
        return Verdict("val/loss", verdict.Status.NOT_MEASURED), gone
    return _verdict(finals_at(arm, arm_lr, seeds), finals_at(base, base_lr, seeds), optimistic), gone


def _cells(runs: list[GridRun]) -> str:
    """`lr 0.01 seed 2 (status interrupted), lr 0.01 seed 3 (...)`: the cells, with what left each unfinished."""
    return ", ".join(f"lr {r.lr:g} seed {r.seed}" + (f" ({r.reason})" if r.reason else "") for r in runs)


def _seeds(runs: list[GridRun]) -> str:
    return ", ".join(str(r.seed) for r in runs)


def _edge_warning(curve: ArmCurve) -> Note | None:
    """Why the arm's best lr is no pick, or lies at the edge of the lrs that ran (with the lrs beyond it that did not
    run); None for a pick inside the grid."""
    arm, best, ran = curve.arm, curve.best_lr, curve.ran()
    unfinished = [r for r in curve.runs if r.state == UNFINISHED]
    if best is None and not ran:
        return warning(f"{arm}: no run finished or diverged: no lr to pick", arm)
    if best is None and unfinished:
        fix = "finish them"
        return warning(
            f"{arm}: no lr finished without diverging yet ({len(unfinished)} runs unfinished): {fix}", arm, fix
        )
    if best is None:
        fix = "widen the grid downwards"
        return warning(f"{arm}: no lr trained every seed without diverging: {fix}", arm, fix)
    if len(curve.lrs) == 1:
        fix = "run the grid with 2+ lrs"
        return warning(f"{arm}: one lr ({best:g}) in the grid: it is not a pick; {fix}", arm, fix)
    if len(ran) == 1:
        return warning(f"{arm}'s best lr {best:g} is the only lr that ran: it is not a pick", arm)
    if not curve.edge:
        return None
    way = "larger" if curve.edge == "largest" else "smaller"
    beyond = [lr for lr in curve.lrs if (lr > best if way == "larger" else lr < best) and lr not in ran]
    if not beyond:
        fix = f"extend the grid to {way} lrs"
        return warning(f"{arm}'s best lr {best:g} is the {curve.edge} tried: {fix}", arm, fix)
    near = beyond[0] if way == "larger" else beyond[-1]
    states = ", ".join(f"{lr:g} {'/'.join(sorted({r.state for r in curve.at(lr)}))}" for lr in beyond)
    return warning(
        f"{arm}'s best lr {best:g} is the {curve.edge} that ran ({way} lrs of the grid did not: {states}): the "
        f"optimum may lie between {best:g} and {near:g}",
        arm,
    )


def _arm_warnings(curve: ArmCurve) -> list[Note]:
    """The pick's edge (_edge_warning) and the cells that are not finished or diverged."""
    arm, edge = curve.arm, _edge_warning(curve)
    out = [edge] if edge else []
    unfinished = [r for r in curve.runs if r.state == UNFINISHED]
    if unfinished:
        out.append(
            warning(
                f"{arm}: {len(unfinished)} runs unfinished, neither picked nor counted as diverged: {_cells(unfinished)}",
                arm,
            )
        )
    for lr in curve.lrs:
        refused = [r for r in curve.at(lr) if r.state == REFUSED]
        for why in dict.fromkeys(r.reason for r in refused):
            seeds = _seeds([r for r in refused if r.reason == why])
            out.append(warning(f"{arm}: lr {lr:g} refused at start (seeds {seeds}): {why}", arm))
        missing = [r for r in curve.at(lr) if r.state == NOT_RUN]
        if missing:
            out.append(
                warning(f"{arm}: not run at lr {lr:g} (seeds {_seeds(missing)}): the sweep dir has no run there", arm)
            )
    return out


def _states_at(curve: ArmCurve, lr: float | None, seeds: set[int] | None) -> list[str]:
    """The states of the arm's cells at lr (the seeds given), [] when the lr is None."""
    return [] if lr is None else sorted({r.state for r in curve.at(lr, seeds)} or {NOT_RUN})


@dataclass
class Versus:
    """An arm against the baseline: at its own best lr and at the baseline's, each with how many verdict seeds
    diverged at the lr judged ([arm, baseline]: any leaves that verdict NOT_MEASURED), and the arm's cell states at
    the baseline's best lr."""

    own_best: Verdict
    shared_lr: Verdict
    own_best_diverged: list[int]
    shared_lr_diverged: list[int]
    baseline_lr: float | None
    states_at_baseline_lr: list[str]

    def to_json(self) -> dict[str, Any]:
        """lr_grid.json's keys of a row that is not the baseline's."""
        return {
            "vs_baseline_own_best": self.own_best.to_json(),
            "vs_baseline_shared_lr": self.shared_lr.to_json(),
            "diverged_verdict_seeds": {"own_best": self.own_best_diverged, "shared_lr": self.shared_lr_diverged},
            "at_baseline_lr": {"lr": self.baseline_lr, "states": self.states_at_baseline_lr},
        }


@dataclass
class GridRow:
    """One arm's line of the grid's table: its pick and the loss there (mean and std over the verdict seeds), its
    stability margin, its cells by state, spikes and the largest logit at the pick and at the margin, its curve
    (final val losses by lr) and, for every arm but the baseline, `versus` it."""

    arm: str
    lrs: list[float]
    best_lr: float | None
    val_loss_at_best: float | None
    val_loss_std: float | None
    max_stable_lr: float | None
    diverged_runs: int
    unfinished_runs: int
    refused_runs: int
    not_run: int
    spikes_at_best: int | None
    spikes_at_max_stable: int | None
    max_logit_at_best: float | None
    max_logit_at_max_stable: float | None
    curve: dict[str, list[float]]  # lr as `f"{lr:g}"` -> the finished seeds' final val losses
    cells_not_finished: list[GridRun]
    versus: Versus | None = None

    def to_json(self) -> dict[str, Any]:
        """The row of lr_grid.json: its figures, each cell not finished with its state and reason, the verdicts."""
        doc = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("cells_not_finished", "versus")}
        doc["cells_not_finished"] = [
            {"lr": r.lr, "seed": r.seed, "state": r.state, "reason": r.reason, "run_dir": r.where or None}
            for r in self.cells_not_finished
        ]
        return {**doc, **(self.versus.to_json() if self.versus else {})}


@dataclass
class GridReport:
    """The grid's table (rows: the baseline's first), its warnings and how the lr was picked (`selection`)."""

    baseline: str
    rows: list[GridRow]
    warnings: list[Note]
    selection: Note
    diverge_factor: float = DIVERGE_FACTOR

    def row(self, arm: str) -> GridRow:
        return next(r for r in self.rows if r.arm == arm)

    def to_json(self) -> dict[str, Any]:
        """lr_grid.json: each verdict as its value, each warning and the selection as its text."""
        return {
            "baseline": self.baseline,
            "rows": [r.to_json() for r in self.rows],
            "warnings": [n.text for n in self.warnings],
            "selection": self.selection.text,
            "diverge_factor": self.diverge_factor,
        }


def _logit(runs: list[GridRun]) -> float | None:
    return max((r.max_logit for r in runs if r.max_logit is not None), default=None)


def _row(curve: ArmCurve, verdict_seeds: set[int] | None) -> GridRow:
    """The arm's line of the table, without its verdicts."""
    best_runs = curve.at(curve.best_lr) if curve.best_lr is not None else []
    stable_runs = curve.at(curve.max_stable_lr) if curve.max_stable_lr is not None else []
    finals = finals_at(curve, curve.best_lr, verdict_seeds)
    return GridRow(
        arm=curve.arm,
        lrs=curve.lrs,
        best_lr=curve.best_lr,
        val_loss_at_best=mean(finals) if finals else None,
        val_loss_std=std(finals) if len(finals) > 1 else None,
        max_stable_lr=curve.max_stable_lr,
        diverged_runs=sum(r.state == DIVERGED for r in curve.runs),
        unfinished_runs=sum(r.state == UNFINISHED for r in curve.runs),
        refused_runs=sum(r.state == REFUSED for r in curve.runs),
        not_run=sum(r.state == NOT_RUN for r in curve.runs),
        spikes_at_best=_spike_total(best_runs),
        spikes_at_max_stable=_spike_total(stable_runs),
        max_logit_at_best=_logit(best_runs),
        max_logit_at_max_stable=_logit(stable_runs),
        curve={f"{lr:g}": finals_at(curve, lr, None) for lr in curve.lrs},
        cells_not_finished=[r for r in curve.runs if r.state != FINISHED],
    )


def report(curves: dict[str, ArmCurve], holdout: set[int] | None = None) -> GridReport:
    """The per-arm table and the warnings: picks, edges, both verdicts, stability columns, and the cells that are
    unfinished, refused or not run."""
    analyse(curves, holdout)
    base = next(iter(curves.values()))
    verdict_seeds = holdout or None
    rows, warnings = [], list(getattr(curves, "notes", []))
    for curve in curves.values():
        row = _row(curve, verdict_seeds)
        if curve is not base:
            own, own_gone = _versus(curve, curve.best_lr, base, base.best_lr, verdict_seeds, not holdout)
            shared, shared_gone = _versus(curve, base.best_lr, base, base.best_lr, verdict_seeds, not holdout)
            if curve.edge or base.edge:  # a pick at the grid's edge: the optimum may lie beyond the lrs tried
                own = own.with_caveat(Caveat.EDGE_LR)
            if base.edge:
                shared = shared.with_caveat(Caveat.EDGE_LR)
            states = _states_at(curve, base.best_lr, verdict_seeds)
            row.versus = Versus(own, shared, own_gone, shared_gone, base.best_lr, states)
        rows.append(row)
        warnings += _arm_warnings(curve)
    if holdout:
        selection = note(
            f"lr picked on seeds other than {sorted(holdout)}; verdicts on the holdout seeds {sorted(holdout)}"
        )
    else:
        fix = "use --holdout-seeds"
        selection = note(
            f"lr picked and reported on the same seeds: the minimum of a noisy curve is optimistic ({fix})", fix=fix
        )
    return GridReport(base.arm, rows, warnings, selection)

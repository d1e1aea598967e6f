"""The lr-grid analysis reads runs, not folder names (issue #44, class 1): each run's arm, lr and seed from its own
config, a copied run dir counted once, unfinished != diverged != refused (each shown), cells missing from the
design named as such, --holdout-seeds validated against the sweep, and flags that do not apply refused in one line.
Every test here failed on the analysis that read the folders alone."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from gptlab.cli.compare import main
from gptlab.compare.render.lr_grid import format_report
from gptlab.compare.studies.lr_grid import STOPPED_ON_NONFINITE, GridReport, GridRow, read_grid, report
from gptlab.errors import ConfigError
from gptlab.sweep.layout import REFUSED_FILE


def run_dir(path: Path, arm: str, lr: float, seed: int, final: float | None, status: str | None = "finished") -> Path:
    """A run dir as gptlab-train leaves it, with its own config (arm, optimizer.lr, seed); `final` None: it stopped
    at step 5 with finite losses (summary status `status`, or no summary.json with status None)."""
    path.mkdir(parents=True)
    rows = [{"step": 0, "val/loss": 4.0}, {"step": 5, "train/loss": 3.5}]
    if final is not None:
        rows.append({"step": 10, "val/loss": final})
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if status is not None:
        summary = {"status": status, "final_val_loss": final if status == "finished" else None}
        (path / "summary.json").write_text(json.dumps(summary))
    (path / ".hydra").mkdir()
    config = {"arm": arm, "seed": seed, "optimizer": {"lr": lr}, "train": {"spike_factor": 3.0}}
    (path / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    return path


def sweep(root: Path, table: dict, lrs: list[float] | None = None, seeds: list[int] | None = None) -> Path:
    """table: {arm: {lr: [final per seed]}} (seed k at position k); sweep.yaml records arms, seeds and the grid."""
    root.mkdir(parents=True, exist_ok=True)
    record = {
        "arms": {a: [] for a in table},
        "seeds": seeds or [0, 1, 2],
        "lr_grid": lrs or sorted({*table[next(iter(table))]}),
    }
    (root / "sweep.yaml").write_text(yaml.safe_dump(record, sort_keys=False))
    for arm, by_lr in table.items():
        for lr, finals in by_lr.items():
            for seed, final in enumerate(finals):
                run_dir(root / arm / f"lr{lr:g}" / f"seed{seed}", arm, lr, seed, final)
    return root


def rows(doc: GridReport) -> dict[str, GridRow]:
    return {r.arm: r for r in doc.rows}


def said(doc: GridReport) -> list[str]:
    """The grid's warnings as their texts (what lr_grid.json keeps)."""
    return [w.text for w in doc.warnings]


BASE = {1e-3: [3.0, 3.02, 2.98], 1e-2: [2.5, 2.52, 2.48]}


def test_refused_lrs_are_shown_and_never_read_as_room_to_grow(tmp_path):
    """grid 1e-3,1e-2,10 where every lr-10 run was refused at start: not 'extend the grid to larger lrs'."""
    root = sweep(
        tmp_path / "s", {"base": BASE, "wide": {1e-3: [3.1, 3.1, 3.1], 1e-2: [2.6, 2.6, 2.6]}}, [1e-3, 1e-2, 10]
    )
    why = "optimizer.weight_decay=0.1: with optimizer.lr=10 each step scales the weights by 0; allowed: < 0.1"
    (root / REFUSED_FILE).parent.mkdir()
    (root / REFUSED_FILE).write_text(json.dumps({f"{a}/lr10/seed{s}": why for a in ("base", "wide") for s in range(3)}))
    doc = report(read_grid(root))
    assert not any("extend the grid to larger lrs" in w for w in said(doc))
    assert "base's best lr 0.01 is the largest that ran (larger lrs of the grid did not: 10 refused)" in said(doc)[0]
    assert f"base: lr 10 refused at start (seeds 0, 1, 2): {why}" in said(doc)
    assert doc.warnings[0].subject == "base" and not doc.warnings[0].fix  # the optimum's side: no grid to extend
    assert rows(doc)["base"].refused_runs == 3 and rows(doc)["base"].diverged_runs == 0
    line = next(x for x in format_report(doc).splitlines() if x.startswith("base"))
    assert line.split()[8:11] == ["0", "3", "0"]  # unfinished, refused, not run


def test_a_killed_run_is_unfinished_not_diverged(tmp_path):
    """A run killed at step 5 (finite losses, no summary) neither lowers the margin nor moves the best lr."""
    root = sweep(tmp_path / "s", {"base": {1e-3: [3.0, 3.02, 2.98], 1e-2: [2.5, 2.52, 2.48], 3e-2: [2.4, 2.42, 2.38]}})
    shutil.rmtree(root / "base" / "lr0.03" / "seed2")
    run_dir(root / "base" / "lr0.03" / "seed2", "base", 3e-2, 2, None, status=None)
    doc = report(read_grid(root))
    row = rows(doc)["base"]
    assert (row.diverged_runs, row.unfinished_runs) == (0, 1)
    assert row.max_stable_lr == 3e-2 and row.best_lr == 3e-2  # on the seeds that finished there
    assert any("1 runs unfinished, neither picked nor counted as diverged: lr 0.03 seed 2" in w for w in said(doc))


def test_a_run_stopped_on_a_nonfinite_loss_is_diverged(tmp_path):
    """gptlab-train logs no non-finite row; the one line it leaves in train.log says it diverged."""
    from types import SimpleNamespace

    from gptlab.train.loop import diverged_message

    line = diverged_message(
        float("nan"), float("nan"), 7, 1, SimpleNamespace(nan_skip=0), SimpleNamespace(run_dir=tmp_path)
    )
    assert STOPPED_ON_NONFINITE in line  # the marker the analysis looks for is the one the loop writes
    root = sweep(tmp_path / "s", {"base": BASE})
    stopped = root / "base" / "lr0.01" / "seed1"
    shutil.rmtree(stopped)
    run_dir(stopped, "base", 1e-2, 1, None, status="failed")
    (stopped / "train.log").write_text(f"step 5 ...\nerror: {line}\n")
    row = rows(report(read_grid(root)))["base"]
    assert (row.diverged_runs, row.unfinished_runs, row.best_lr, row.max_stable_lr) == (1, 0, 1e-3, 1e-3)


def test_the_lr_and_seed_are_read_from_the_run_not_its_folder(tmp_path):
    root = sweep(tmp_path / "s", {"base": BASE})
    moved = root / "base" / "lr0.01" / "seed2"  # its folder says lr 0.01; it trained at 0.001 as seed 2
    shutil.rmtree(moved)
    run_dir(moved, "base", 1e-3, 2, 2.99)
    shutil.rmtree(root / "base" / "lr0.001" / "seed2")
    grid = read_grid(root)
    at = {(r.lr, r.seed): r.state for r in grid["base"].runs}
    assert at[1e-3, 2] == "finished" and at[1e-2, 2] == "not run"
    assert any("base/lr0.01/seed2: its own config says arm base, lr 0.001, seed 2" in n.text for n in grid.notes)


def test_a_copied_seed_dir_counts_once(tmp_path):
    root = sweep(tmp_path / "s", {"base": BASE, "wide": BASE})
    shutil.copytree(root / "wide" / "lr0.01" / "seed0", root / "wide" / "lr0.01" / "seed7")
    doc = report(read_grid(root))
    assert rows(doc)["wide"].curve["0.01"] == [2.5, 2.52, 2.48]  # not 4 values: the copy is seed 0 again
    assert any("wide/lr0.01/seed7 is a copy of wide/lr0.01/seed0" in w for w in said(doc))


def test_an_arm_not_run_at_the_baselines_lr_is_named_so(tmp_path):
    root = sweep(tmp_path / "s", {"base": BASE, "other": {1e-3: [2.9, 2.95, 2.92]}})
    doc = report(read_grid(root))
    versus = rows(doc)["other"].versus
    assert rows(doc)["other"].not_run == 3 and versus is not None and versus.states_at_baseline_lr == ["not run"]
    line = next(x for x in format_report(doc).splitlines() if x.startswith("other"))
    assert line.endswith("| n/a (not run at 0.01)") and "needs 2+ seeds" not in line
    assert "other: not run at lr 0.01 (seeds 0, 1, 2): the sweep dir has no run there" in said(doc)


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--holdout-seeds", "0,1,2"], "--holdout-seeds '0,1,2': holds out every seed of the sweep (0, 1, 2)"),
        (["--holdout-seeds", "5"], "--holdout-seeds '5': the sweep has no seed 5; its seeds are 0, 1, 2"),
        (["--holdout-seeds", ""], "--holdout-seeds '': allowed: seeds of the sweep"),
        (["--ladder"], "--ladder does not apply to an lr grid"),
        (["--step", "10"], "--step does not apply to an lr grid"),
    ],
)
def test_lr_grid_flags_are_checked_in_one_line_and_nothing_is_written(tmp_path, capsys, flags, message):
    root = sweep(tmp_path / "s", {"base": BASE, "wide": BASE})
    assert main([str(root), "--lr-grid", *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert not (root / "comparison").exists()


def test_holdout_seeds_without_an_lr_grid_are_refused(tmp_path, capsys):
    root = sweep(tmp_path / "s", {"base": BASE, "wide": BASE})
    assert main([str(root / "base" / "lr0.01"), str(root / "wide" / "lr0.01"), "--holdout-seeds", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--holdout-seeds applies to an lr grid" in err


def test_a_malformed_layout_is_read_cell_by_cell_or_refused_in_one_line(tmp_path, capsys):
    root = sweep(tmp_path / "s", {"base": BASE, "wide": BASE})
    shutil.rmtree(root / "wide" / "lr0.001" / "seed1")  # a missing seed dir: named "not run"
    (root / "wide" / "lr0.001" / "notes").mkdir()  # stray dirs, no run files: not runs
    (root / "wide" / "lrx" / "seed0").mkdir(parents=True)
    (root / "stray").mkdir()
    doc = report(read_grid(root))
    assert rows(doc)["wide"].not_run == 1 and [r.arm for r in doc.rows] == ["base", "wide"]
    assert "wide: not run at lr 0.001 (seeds 1): the sweep dir has no run there" in said(doc)
    other = run_dir(root / "wide" / "lr0.001" / "seed9", "wide", 1e-3, 0, 3.3)  # another run claiming seed 0
    with pytest.raises(ConfigError, match="two different runs of arm wide at lr 0.001, seed 0"):
        read_grid(root)
    shutil.rmtree(other)
    (root / "base" / "lr0.01" / "seed0" / "metrics.jsonl").write_text('{"step": 0, "val/loss": 4.0}\nnot json\n{}\n')
    assert main([str(root), "--lr-grid"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "base/lr0.01/seed0/metrics.jsonl:2: not a JSON object line" in err
    assert not (root / "comparison").exists()


def test_two_sweep_dirs_are_read_as_one_grid_and_an_arm_that_differs_between_them_is_refused(tmp_path):
    """A narrow grid, then a wider one run into a second dir: one grid of the union of their lrs; the best lr found
    past the first grid's edge; a run of one cell in both dirs refused; an arm trained longer in one dir refused."""
    first = sweep(tmp_path / "first", {"base": BASE, "wide": {1e-3: [3.1, 3.1, 3.1], 1e-2: [2.6, 2.6, 2.6]}})
    wider = {"base": {3e-2: [2.3, 2.31, 2.29]}, "wide": {3e-2: [2.2, 2.21, 2.19]}}
    second = sweep(tmp_path / "second", wider)
    alone = report(read_grid(first))
    assert alone.rows[0].best_lr == 1e-2 and "largest" in format_report(alone)  # at the edge of one grid
    grid = read_grid(first, second)
    assert grid.lrs == [1e-3, 1e-2, 3e-2]
    assert grid["wide"].at(3e-2)[0].where == "second/wide/lr0.03/seed0"
    doc = report(grid)
    assert [rows(doc)[a].best_lr for a in ("base", "wide")] == [3e-2, 3e-2]
    assert any("one grid read from 2 sweep dirs" in n.text for n in grid.notes)
    out = tmp_path / "cmp"
    assert main([str(first), str(second), "--lr-grid", "--out", str(out)]) == 0
    assert json.loads((out / "lr_grid.json").read_text())["rows"][0]["best_lr"] == 3e-2

    clash = sweep(tmp_path / "clash", {"base": {1e-2: [2.9, 2.9, 2.9]}})
    with pytest.raises(ConfigError, match=r"two different runs of arm base at lr 0\.01, seed 0"):
        read_grid(first, clash)

    longer = sweep(tmp_path / "longer", {"wide": {3e-2: [2.2, 2.2, 2.2]}})
    for cfg in longer.rglob("config.yaml"):
        cfg.write_text(cfg.read_text().replace("spike_factor: 3.0", "spike_factor: 3.0\n  max_steps: 20"))
    with pytest.raises(ConfigError, match=r"^arm wide: .* has train\.max_steps=None and .* has train\.max_steps=20; "):
        read_grid(first, longer)

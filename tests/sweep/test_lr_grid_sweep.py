"""Grids gptlab-sweep accepts are grids it can run as asked (issue #44, class 2): values positive, finite, at least two
and distinct after formatting (the folder and optimizer.lr get `{lr:g}`); no arm setting the lr the grid sets; no grid
on a sweep that trains nothing; a run that cannot start is planned as refused with its reason, and the analysis
shows it. Every refusal is one line, before anything is written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from gptlab.compare.studies.lr_grid import read_grid, report
from gptlab.config.build import compose
from gptlab.errors import ConfigError
from gptlab.sweep.layout import REFUSED_FILE, parse_lr_grid, read_refused, read_sweep
from gptlab.sweep.plan import pending, write_plan, write_refused
from gptlab.sweep.spec import record_definition, resolve


@pytest.mark.parametrize(
    "grid, message",
    [
        (
            "1e-3,1.0000001e-3",
            "0.0010000001 and 0.001 both run as lr0.001",
        ),  # both lr0.001: one folder, one optimizer.lr
        ("1e-3,1.23456789e-3", "would run as 0.00123457"),
        ("1e-3", "one lr has no best lr to pick"),
        ([1e-3], "one lr has no best lr to pick"),
        ([[1e-3], 2e-3], "allowed: comma-separated numbers"),  # a nested list: was a TypeError traceback
        ([True, 1e-3], "allowed: comma-separated numbers"),
        ("1e-3,nan", "nan is not a learning rate"),
        ("1e-3,inf", "inf is not a learning rate"),
        ("0,1e-3", "0 is not a learning rate"),
        ("1e-3,1e-3", "0.001 is given twice"),
    ],
)
def test_grids_that_cannot_run_as_asked_are_refused_in_one_line(grid, message):
    with pytest.raises(ConfigError) as err:
        parse_lr_grid(grid)
    assert str(err.value).startswith("lr grid ") and "\n" not in str(err.value)
    assert message in str(err.value), str(err.value)


def _file(tmp_path: Path, doc: dict) -> str:
    path = tmp_path / "mini.yaml"
    path.write_text(yaml.safe_dump({"overrides": ["model=tiny"], **doc}, sort_keys=False))
    return str(path)


def _resolve(tmp_path: Path, doc: dict, notes: list | None = None, **given):
    seen = notes if notes is not None else []
    return resolve(_file(tmp_path, doc), [], out=tmp_path / "out", note=seen.append, **given)


def test_an_arm_setting_the_grids_lr_is_refused(tmp_path):
    doc = {"arms": {"base": [], "fast": ["optimizer.lr=3e-3"]}}
    with pytest.raises(ConfigError, match=r"^lr grid: arm 'fast' sets optimizer.lr=3e-3, which the grid would"):
        _resolve(tmp_path, doc, lr_grid="1e-3,1e-2")
    with pytest.raises(ConfigError, match=r"^lr grid: arm 'fast' sets optimizer.lr=3e-3"):
        _resolve(tmp_path, {**doc, "lr_grid": [1e-3, 1e-2]})  # the file's own grid too
    notes: list[str] = []
    shared = {"arms": {"base": []}, "overrides": ["model=tiny", "optimizer.lr=3e-3"]}
    assert _resolve(tmp_path, shared, notes, lr_grid="1e-3,1e-2").lrs == [1e-3, 1e-2]
    assert notes == ["note: the lr grid's optimizer.lr replaces optimizer.lr=3e-3 (the sweep's own lr) at every lr"]


def test_a_sweep_that_trains_nothing_takes_no_grid(tmp_path):
    doc = {"command": "decode", "arms": {"a": [], "b": []}, "overrides": []}
    with pytest.raises(ConfigError, match=r"^lr grid: sweep 'mini' runs gptlab-decode \(command: decode\)"):
        _resolve(tmp_path, doc, lr_grid="1e-3,1e-2")


def test_a_run_that_cannot_start_is_planned_as_refused_and_the_analysis_shows_it(tmp_path):
    """lr 10 with the default weight decay 0.1 is refused by gptlab-train at start (lr * weight_decay >= 1)."""
    sweep = _resolve(tmp_path, {"arms": {"base": [], "wide": []}, "seeds": [0, 1]}, lr_grid="1e-3,1e-2,10")
    record_definition(sweep.sweep_dir, sweep.spec, sweep.extra)
    todo = pending(sweep.name, sweep.spec, sweep.seeds, sweep.sweep_dir, sweep.extra, sweep.lrs)
    assert sorted(r.name for r, _ in todo.refused) == [f"{a}__lr10__seed{s}" for a in ("base", "wide") for s in (0, 1)]
    assert all("optimizer.weight_decay=0.1: with optimizer.lr=10" in why for _, why in todo.refused)
    assert len(todo.runs) == 8 and all(r.lr != 10 for r in todo.runs)
    write_plan(sweep.sweep_dir, todo.runs)
    write_refused(sweep.sweep_dir, todo.refused)
    assert set(read_refused(sweep.sweep_dir)) == {f"{a}/lr10/seed{s}" for a in ("base", "wide") for s in (0, 1)}
    for run in todo.runs:  # every run that could start finished; the best is the largest that ran
        folder = run.run_dir(sweep.sweep_dir)
        folder.mkdir(parents=True)
        final = 3.0 if run.lr == 1e-3 else 2.5
        (folder / "summary.json").write_text(json.dumps({"status": "finished", "final_val_loss": final}))
        (folder / "metrics.jsonl").write_text(json.dumps({"step": 0, "val/loss": 4.0}) + "\n")
    doc = report(read_grid(sweep.sweep_dir))
    assert [r.refused_runs for r in doc.rows] == [2, 2]
    assert not any("extend the grid to larger lrs" in w.text for w in doc.warnings)
    assert any(
        w.text.startswith("base: lr 10 refused at start (seeds 0, 1): optimizer.weight_decay") for w in doc.warnings
    )
    # gptlab-sweep status names them refused, with the reason, not "never ran"
    from gptlab.sweep.status import format_status, status_of

    rows = {r.name: r for r in status_of(sweep.sweep_dir)}
    assert rows["base__lr10__seed0"].state == "refused"
    assert rows["base__lr10__seed0"].detail.startswith("cannot start: optimizer.weight_decay=0.1: with optimizer.lr=10")
    assert format_status(list(rows.values())).splitlines()[-1] == "8 finished, 4 refused"
    (sweep.sweep_dir / REFUSED_FILE).write_text("[1, 2")
    with pytest.raises(ConfigError, match=r"refused.json: cannot be read"):
        read_refused(sweep.sweep_dir)


def _finish(sweep) -> None:
    """Every planned run of `sweep` finished, with the config it composes (a tiny final val loss per lr)."""
    for run in pending(sweep.name, sweep.spec, sweep.seeds, sweep.sweep_dir, sweep.extra, sweep.lrs).runs:
        folder = run.run_dir(sweep.sweep_dir)
        (folder / ".hydra").mkdir(parents=True)
        cfg = OmegaConf.to_container(compose(list(run.overrides), "train"), resolve=False)
        (folder / ".hydra" / "config.yaml").write_text(yaml.safe_dump({k: v for k, v in cfg.items() if k != "hydra"}))
        (folder / "summary.json").write_text(json.dumps({"status": "finished", "final_val_loss": 3.0}))
        (folder / "metrics.jsonl").write_text(json.dumps({"step": 0, "val/loss": 4.0}) + "\n")


def test_the_seeds_launched_are_recorded_not_the_files(tmp_path):
    """`--seeds 0,1` on a 3-seed file records seeds [0, 1]: the grid expects the runs launched (it said "not run
    (seeds 2)" for a seed nobody asked for); a later `--seeds 2` into the same dir grows the record, as a grid does."""
    doc = {"arms": {"base": [], "wide": []}, "seeds": [0, 1, 2]}
    two = _resolve(tmp_path, doc, lr_grid="1e-3,1e-2", seeds="0,1")
    record_definition(two.sweep_dir, two.spec, two.extra, two.seeds)
    assert read_sweep(two.sweep_dir).seeds == [0, 1]
    _finish(two)
    grid = read_grid(two.sweep_dir)
    assert grid.seeds == [0, 1] and not [n for n in grid.notes if "not run" in n.text]
    assert all(r.state != "not run" for c in grid.values() for r in c.runs)
    third = _resolve(tmp_path, doc, lr_grid="1e-3,1e-2", seeds="2")
    assert record_definition(third.sweep_dir, third.spec, third.extra, third.seeds) == []
    assert read_sweep(third.sweep_dir).seeds == [0, 1, 2]  # the union, in launch order
    assert read_grid(third.sweep_dir).seeds == [0, 1, 2]  # seed 2 launched, not finished: expected, so named


def test_a_wider_grid_extends_the_sweep_in_place_and_reuses_finished_runs(tmp_path):
    """The grid is not part of a sweep's identity: the same sweep with a wider grid into its dir records the union
    (compare --lr-grid reads every lr) and plans only the new lrs' runs; another definition is still refused."""
    doc = {"arms": {"base": [], "wide": []}, "seeds": [0]}
    first = _resolve(tmp_path, doc, lr_grid="1e-3,1e-2")
    assert record_definition(first.sweep_dir, first.spec, first.extra) == []
    for run in pending(first.name, first.spec, first.seeds, first.sweep_dir, first.extra, first.lrs).runs:
        folder = run.run_dir(first.sweep_dir)  # every run of the first grid finished, with the config it composes
        (folder / ".hydra").mkdir(parents=True)
        cfg = OmegaConf.to_container(compose(list(run.overrides), "train"), resolve=False)
        (folder / ".hydra" / "config.yaml").write_text(yaml.safe_dump({k: v for k, v in cfg.items() if k != "hydra"}))
        (folder / "summary.json").write_text(json.dumps({"status": "finished", "final_val_loss": 3.0}))
        (folder / "metrics.jsonl").write_text(json.dumps({"step": 0, "val/loss": 4.0}) + "\n")
    wider = _resolve(tmp_path, doc, lr_grid="1e-3,1e-2,1e-1")
    assert record_definition(wider.sweep_dir, wider.spec, wider.extra) == [0.1]
    assert read_sweep(wider.sweep_dir).lrs == [1e-3, 1e-2, 1e-1]
    todo = pending(wider.name, wider.spec, wider.seeds, wider.sweep_dir, wider.extra, wider.lrs)
    assert sorted(r.name for r in todo.runs) == ["base__lr0.1__seed0", "wide__lr0.1__seed0"] and todo.skipped == 4
    between = _resolve(tmp_path, doc, lr_grid="1e-3,3e-3")  # a grid of its own: the record keeps every lr
    assert record_definition(between.sweep_dir, between.spec, between.extra) == [3e-3]
    assert read_sweep(between.sweep_dir).lrs == [1e-3, 3e-3, 1e-2, 1e-1]
    again = _resolve(tmp_path, doc, lr_grid="1e-2,1e-1")
    assert record_definition(again.sweep_dir, again.spec, again.extra) == []  # nothing new: the file is unchanged
    other = _resolve(tmp_path, {**doc, "overrides": ["model=tiny", "train.max_steps=7"]}, lr_grid="1e-3,1e-2")
    with pytest.raises(ConfigError, match="holds a different sweep definition"):
        record_definition(other.sweep_dir, other.spec, other.extra)
    plain = _resolve(tmp_path, doc)
    with pytest.raises(ConfigError, match="holds the same sweep with an lr grid"):
        record_definition(plain.sweep_dir, plain.spec, plain.extra)

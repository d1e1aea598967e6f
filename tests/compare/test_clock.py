"""The comparison's clock: the time plot (the training runs' records) reads training time (train_s) where every run
recorded it, wall time otherwise (never a mix), and says which. Val loss at equal training time and time to a target
read neither: they come from a timing session (steps at each arm's timed step time), so untimed runs get neither."""

from __future__ import annotations

import json
from pathlib import Path

from gptlab.cli.compare import main
from gptlab.compare.reading.clock import TRAIN, WALL, clock_of
from gptlab.compare.reading.runs import load_run
from gptlab.compare.reading.timing import AXIS
from tests.helpers.compare import write_run, write_sweep

EVAL_S = 2.0  # seconds each eval adds to wall time in the baseline's runs (it scores more validation sets)


def _slow_evals(run: Path, extra: float = EVAL_S) -> None:
    """Add `extra` s of wall time at every eval to a run's rows (train_s untouched): what evals, probes and extra val
    sets do to a real run's wall_s."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    evals = 0
    for row in rows:
        if "val/loss" in row:
            evals += 1
        if "wall_s" in row:
            row["wall_s"] += extra * evals
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = json.loads((run / "summary.json").read_text())
    summary["wall_s"] += extra * evals
    (run / "summary.json").write_text(json.dumps(summary))


def _twins(tmp: Path, train_clock: bool = True) -> Path:
    """Baseline (mha) and gqa at the same step time and nearly the same curve; the baseline's evals are slow."""
    specs = [dict(seed=s, loss_at=lambda k, s=s: 1.5 + 2.5 * 0.97**k + 0.01 * s) for s in (0, 1, 2)]
    specs += [
        dict(seed=s, choices={"attention": "gqa"}, loss_at=lambda k, s=s: 1.5 + 2.5 * 0.97**k + 0.01 * s + 0.001)
        for s in (0, 1, 2)
    ]
    for spec in specs:
        spec["train_clock"] = train_clock
    sweep = write_sweep(tmp / "sw", specs)
    for job in (0, 1, 2):
        _slow_evals(sweep / str(job))
    return sweep


def _compare(tmp: Path, capsys, sweep: Path, *args: str) -> dict:
    rc = main([str(sweep), "--out", str(tmp / "out"), "--no-wandb", "--target", "val/loss=1.8", *args])
    err = capsys.readouterr().err
    assert rc == 0, err
    return json.loads((tmp / "out" / "comparison.json").read_text())


def test_time_readings_use_training_time_when_every_run_recorded_it(tmp_path, capsys):
    """Slow evals made the baseline 'slower' on the wall clock (was: gqa decided 2.07x faster to target, and 0.38
    lower at equal wall time); the plot is on training time, and no time reading is made from either clock."""
    doc = _compare(tmp_path, capsys, _twins(tmp_path))
    assert doc["clock"] == TRAIN and not any("wall time" in n for n in doc["notes"])
    (target,) = doc["targets"]
    assert target["time_axis"] is None  # no session: steps to target only, no time to it
    base, arm = target["rows"]
    assert base["time_s_mean"] is None and arm["time_s_mean"] is None and base["steps_mean"] is not None
    assert arm["speedup_time"]["status"] == "not_measured"
    flops, time = doc["equal_compute"]["axes"]
    assert (flops["axis"], time["axis"]) == ("flops", AXIS)  # equal time is the timing session's, not the clock's
    assert time["x"] is None and time["arms"][1]["verdict"]["status"] == "not_measured"  # no session: not timed
    (matrix_arm,) = doc["verdict_matrix"]["arms"]
    assert matrix_arm["cells"]["equal_training_time"]["status"] == "not_measured"
    files = {p.name for p in (tmp_path / "out").iterdir()}
    assert "val_loss_vs_training_time.png" in files and "val_loss_vs_wall_time.png" not in files
    md = (tmp_path / "out" / "comparison.md").read_text()
    assert (
        "| label | seeds reached | steps | tokens | time at the timed step | speed-up (steps) | speed-up (time) |" in md
    )


def test_one_run_without_training_time_puts_every_run_on_wall_time_with_a_note(tmp_path, capsys):
    sweep = _twins(tmp_path)
    old = sweep / "4"
    write_run(old, seed=1, choices={"attention": "gqa"}, train_clock=False)  # a run from before train_s was kept
    doc = _compare(tmp_path, capsys, sweep)
    assert doc["clock"] == WALL and doc["targets"][0]["time_axis"] is None
    assert doc["equal_compute"]["axes"][1]["axis"] == AXIS  # never the wall clock
    assert (
        f"note: time is wall time (evals, probes and checkpoints included), not training time: {old} recorded no "
        "train_s at some step (written before it was kept, or resumed from such a checkpoint)"
    ) in doc["notes"]
    base, arm = doc["targets"][0]["rows"]
    assert base["time_s_mean"] is None and arm["time_s_mean"] is None  # never the wall clock's slow evals
    files = {p.name for p in (tmp_path / "out").iterdir()}
    assert "val_loss_vs_wall_time.png" in files and "val_loss_vs_training_time.png" not in files


def test_a_run_resumed_from_an_older_checkpoint_has_no_training_clock(tmp_path):
    """A resume from a checkpoint written before train_s was kept logs no train_s after it: the run lacks the clock
    (its train_s would restart at 0, or miss the steps before the resume)."""
    full, resumed = write_run(tmp_path / "full"), write_run(tmp_path / "resumed")
    rows = [json.loads(line) for line in (resumed / "metrics.jsonl").read_text().splitlines()]
    for row in rows:
        if row["step"] <= 50:
            row.pop("train_s", None)
    (resumed / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert clock_of([load_run(full)]).key == TRAIN
    assert clock_of([load_run(full), load_run(resumed)]).key == WALL

"""One name per metric: today's rows put every figure in a section (train/ val/ perf/ mem/ diag/ probe/ spike/) beside
the x-axes, and a run dir written with the older bare names is read under today's names by every reader."""

from __future__ import annotations

import json

from gptlab.compare.reading.runs import load_run
from gptlab.compare.statistics.speed import run_speed
from gptlab.util.metric_names import AXES, RENAMED, canonical
from helpers.train import rows, run_inprocess

SECTIONS = ("train/", "val/", "perf/", "mem/", "diag/", "probe/", "spike/")


def test_canonical_renames_the_bare_names_and_leaves_todays_alone():
    old = {"step": 10, "lr": 0.1, "grad_norm": 2.0, "tokens_per_s": 900.0, "mfu": 0.2, "peak_mem_bytes": 5}
    assert canonical(old) == {
        "step": 10, "train/lr": 0.1, "train/grad_norm": 2.0, "perf/tokens_per_s": 900.0, "perf/mfu": 0.2,
        "mem/peak_bytes": 5,
    }  # fmt: skip
    today = {"step": 3, "train/loss": 1.0, "perf/step_ms": 4.0, "diag/embed/grad_norm": 1.0}
    assert canonical(today) == today
    assert all(new.startswith(SECTIONS) for new in RENAMED.values())


def test_every_metric_of_a_real_run_is_in_a_section(tmp_path):
    run_inprocess(tmp_path, "train.diagnostics=true", "probes=[induction]", steps=4, eval_interval=2)
    keys = {k for r in rows(tmp_path) for k in r}
    assert {"train/lr", "train/grad_norm", "perf/tokens_per_s", "perf/step_ms", "perf/mfu", "mem/peak_bytes"} <= keys
    assert {"perf/diag_ms", "perf/probe_ms"} <= keys
    assert [k for k in keys if k not in AXES and not k.startswith(SECTIONS)] == []


def test_an_older_run_dir_with_bare_names_reads_under_todays(tmp_path):
    """A run written before the sections existed: compare sees its figures under today's names (its speed falls back
    to the rows when summary.json lacks the median)."""
    rows_old = [
        {"step": 0, "val/loss": 4.0, "tokens": 0, "wall_s": 0.0},
        {"step": 5, "train/loss": 3.0, "lr": 1e-3, "grad_norm": 1.5, "tokens": 640, "tokens_per_s": 800.0,
         "step_ms": 160.0, "mfu": 0.1, "peak_mem_bytes": 7, "wall_s": 0.8},
        {"step": 10, "train/loss": 2.5, "lr": 1e-3, "grad_norm": 1.2, "tokens": 1280, "tokens_per_s": 1000.0,
         "step_ms": 128.0, "mfu": 0.12, "peak_mem_bytes": 9, "wall_s": 1.5},
        {"step": 10, "val/loss": 2.6, "tokens": 1280, "wall_s": 1.6},
    ]  # fmt: skip
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows_old))
    (tmp_path / "summary.json").write_text(json.dumps({"final_val_loss": 2.6, "steps": 10, "status": "finished"}))
    run = load_run(tmp_path)
    trained = [r for r in run.records if "train/loss" in r]
    assert [r["train/lr"] for r in trained] == [1e-3, 1e-3] and [r["mem/peak_bytes"] for r in trained] == [7, 9]
    assert not any(k in r for r in run.records for k in RENAMED)
    assert run_speed(run, "tokens_per_s_median", "perf/tokens_per_s", max) == 1000.0

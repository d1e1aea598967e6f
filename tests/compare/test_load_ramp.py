"""A real load ramp: a busy loop that stops halfway through real sweeps, on this machine (no synthetic runs).

Two tiny arms x 2 seeds, one run at a time (GPTLAB_THREADS=2 on 2 cores: one slot). Busy processes spin on every
core from the sweep's start until half its runs have finished, so the first half trains slower and records the
outside load it saw. The interleaved launch spreads the loaded runs over both arms: compare finds no run-order
confound, and no speed verdict comes from the loaded training runs (only a timing session's, timed alone). The same
ramp over the arms launched one after another (one sweep per arm, as a user running arms by hand) is named "confounded
with run order" on the training records, which make no speed verdict (tests/compare/test_run_order.py has the logic on
synthetic runs; gptlab/compare/statistics/order.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

from helpers.cli import cli_env, run_cli

pytestmark = pytest.mark.slow

TINY = ["model.n_layer=1", "model.d_model=32", "model.n_head=4", "model.block_size=32", "train.batch_size=4"]
STEPS = ["train.max_steps=30", "train.eval_interval=15", "train.eval_sequences=4", "train.speed_warmup=3"]
ARMS = {"mha": ["attention=mha"], "mqa": ["attention=mqa"]}
SEEDS = [0, 1]


def _sweep_file(tmp: Path, name: str, arms: dict) -> Path:
    path = tmp / f"{name}.yaml"
    spec = {"description": "load ramp", "seeds": SEEDS, "overrides": [*TINY, *STEPS, "logger=none"], "arms": arms}
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def _finished(root: Path) -> int:
    return len(list(root.glob("**/seed*/summary.json")))


@contextmanager
def _busy_until(root: Path, finished: int):
    """Every core spins (foreign processes, outside the sweep's tree) until `finished` runs under root are done."""
    spin = [sys.executable, "-c", "while True: pass"]
    procs = [subprocess.Popen(spin) for _ in range(os.cpu_count() or 2)]
    state = {"stopped_after": None}

    def stop() -> None:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()

    def watch() -> None:
        while any(p.poll() is None for p in procs):
            if _finished(root) >= finished:
                state["stopped_after"] = _finished(root)
                stop()
                return
            time.sleep(0.2)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yield state
    finally:
        stop()
        watcher.join(timeout=5)


def _run_sweep(path: Path, out: Path) -> None:
    env = cli_env(GPTLAB_THREADS="2", OMP_NUM_THREADS="2")  # one slot on 2 cores: the runs go one at a time
    proc = run_cli("gptlab.cli.sweep", str(path), "--out", str(out), env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]


def _compare(*dirs: Path, out: Path) -> tuple[dict, subprocess.CompletedProcess]:
    proc = run_cli("gptlab.cli.compare", *map(str, dirs), "--out", str(out), "--no-wandb", "--noise-floor", "none")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads((out / "comparison.json").read_text()), proc


def _summaries(*roots: Path) -> list[dict]:
    """Every run's summary in start order, with its seed (from its run dir's name)."""
    runs = [
        {**json.loads(p.read_text()), "seed": int(p.parent.name.removeprefix("seed"))}
        for root in roots
        for p in root.glob("**/seed*/summary.json")
    ]
    return sorted(runs, key=lambda s: s["started_at"])


def _no_speed_lead(proc: subprocess.CompletedProcess) -> list[str]:
    """The arm's sentences (verdict matrix and equal steps); none may lead with a speed-up of the training runs."""
    said = [line for line in proc.stdout.splitlines() if line.startswith("attention=mqa")]
    assert said, proc.stdout[-3000:]
    timed = "Speed timed alone:" in proc.stdout  # a timing session's verdict names its source
    for sentence in said:
        for word in ("faster", "slower"):
            if word in sentence:  # a speed word only from a timing session, or with a reason it is no finding
                assert timed or "under outside load" in sentence, sentence
    return said


def test_an_interleaved_sweep_under_a_load_ramp_headlines_no_speed_up(tmp_path):
    out = tmp_path / "interleaved"
    half = len(ARMS) * len(SEEDS) // 2
    with _busy_until(out, half) as ramp:
        _run_sweep(_sweep_file(tmp_path, "ramp", ARMS), out)
    assert ramp["stopped_after"] is not None and ramp["stopped_after"] >= half  # the ramp stopped mid-sweep
    runs = _summaries(out)
    order = [s["seed"] for s in runs]
    assert order == sorted(order)  # seed-major: every arm's seed 0 before any seed 1
    loads = [s["outside_load"] for s in runs]
    assert min(loads[:2]) > 0.3  # the busy loop was outside load for the first seed's runs of both arms
    doc, proc = _compare(out, out=tmp_path / "cmp")
    mqa = doc["rows"][1]
    assert mqa["order_confounded"] is False and "confounded with run order" not in proc.stderr
    assert "confounded" not in mqa["speed"]["caveats"]
    if doc["timing"] is None:  # the loaded training runs make no speed verdict
        assert mqa["speed"]["status"] == "not_measured" and mqa["speedup"] is None
    _no_speed_lead(proc)


def test_the_same_ramp_over_arms_run_one_after_another_is_named_a_confound(tmp_path):
    first, second = tmp_path / "mha", tmp_path / "mqa"
    with _busy_until(first, len(SEEDS)) as ramp:  # the load is on while the first arm's runs train
        _run_sweep(_sweep_file(tmp_path, "first", {"mha": ARMS["mha"]}), first)
    assert ramp["stopped_after"] == len(SEEDS)
    _run_sweep(_sweep_file(tmp_path, "second", {"mqa": ARMS["mqa"]}), second)
    runs = _summaries(first, second)
    assert [s["outside_load"] > 0.3 for s in runs[: len(SEEDS)]] == [True] * len(SEEDS)
    doc, proc = _compare(first, second, out=tmp_path / "cmp")
    mqa = doc["rows"][1]
    assert mqa["order_confounded"] is True  # named on the training records ...
    assert "tokens/s during training is confounded with run order: each arm's runs ran one after another" in (
        proc.stderr
    )
    assert doc["timing"] is None and mqa["speed"]["status"] == "not_measured"  # ... which make no speed verdict
    said = _no_speed_lead(proc)
    assert all("speed not timed" in s for s in said)

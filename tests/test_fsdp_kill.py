"""The SIGKILL harness of test_reliability.py for hardware=fsdp_cpu: both gloo ranks killed at once (a node dying),
at a random moment or while a sharded checkpoint is half-written, then resumed on 2 ranks: every checkpoint a
kill leaves is complete, and the finished curve is bit-identical to an uninterrupted 2-rank run."""

from __future__ import annotations

import json
import random
import signal
import time
from pathlib import Path

import pytest
from test_reliability import freeze, last_step, wait_for_step

from gptlab.state import checkpoint
from helpers.fsdp import curve, launch, wait

KILL = ["train.max_steps=12", "train.eval_interval=4", "train.ckpt_interval=1"]  # a checkpoint after every step
TRIALS = [["write"], ["moment", "write"]]  # the kinds of kill each trial suffers, at random steps and moments


def kill_all(procs) -> None:
    for proc in procs:
        proc.send_signal(signal.SIGKILL)


def kill_at_random(procs, run_dir: Path, rng: random.Random, mode: str) -> dict:
    """SIGKILL both ranks after a random step: at a random moment, or (mode "write") with a checkpoint temp dir present.

    For "write" both ranks are frozen (SIGSTOP) at random moments until a temp dir exists, then killed frozen.
    """
    done = last_step(run_dir)
    if done >= 10 or not wait_for_step(procs[0], run_dir, rng.randint(max(1, done + 1), min(10, done + 5))):
        for proc in procs:
            proc.wait(timeout=240)  # too late to kill: let it finish
        return {"mode": mode, "killed": False}
    if mode == "moment":
        time.sleep(rng.uniform(0, 0.05))
        kill_all(procs)
    while mode == "write" and all(p.poll() is None for p in procs):
        for proc in procs:
            freeze(proc)
        if any(checkpoint.ckpt_dir(run_dir).glob(checkpoint.TMP_GLOB)):
            kill_all(procs)
            break
        for proc in procs:
            proc.send_signal(signal.SIGCONT)
        time.sleep(rng.uniform(0.0005, 0.004))
    for proc in procs:
        proc.wait(timeout=240)
    return {
        "mode": mode,
        "killed": any(p.returncode == -signal.SIGKILL for p in procs),
        "during_write": any(checkpoint.ckpt_dir(run_dir).glob(checkpoint.TMP_GLOB)),
        "after_step": last_step(run_dir),
    }


def assert_checkpoints_complete(run_dir: Path) -> None:
    """Every listed checkpoint loads (all shards whole), and none before the last logged step is missing."""
    found = sorted(checkpoint.ckpt_dir(run_dir).glob("step_*.dcp"))
    states = [checkpoint.load(p) for p in found]  # raises on a missing or short shard, or a torn state.pt
    logged = last_step(run_dir)
    if logged >= 2:
        assert states and states[-1]["step"] >= logged - 1, (logged, [s["step"] for s in states])


@pytest.mark.slow
def test_sigkill_of_both_ranks_then_resume_gives_the_uninterrupted_curve(tmp_path):
    reference = tmp_path / "reference"
    wait(launch(reference, 2, *KILL), reference)
    kills = []
    for i, modes in enumerate(TRIALS):
        run_dir, rng = tmp_path / f"trial{i}", random.Random(2000 + i)
        for mode in modes:
            kills.append(kill_at_random(launch(run_dir, 2, *KILL), run_dir, rng, mode))
            assert_checkpoints_complete(run_dir)
        wait(launch(run_dir, 2, *KILL), run_dir)
        assert curve(run_dir) == curve(reference), f"trial {i} diverged from the uninterrupted run"
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["steps"] == 12 and summary["status"] == "finished"
        assert not list(checkpoint.ckpt_dir(run_dir).glob(checkpoint.TMP_GLOB))  # the next save swept it
    print(f"\n{len(TRIALS)} trials, kills: {kills}")
    assert sum(k["killed"] for k in kills) >= len(TRIALS)
    writes = [k for k in kills if k["killed"] and k["mode"] == "write"]
    assert writes and all(k["during_write"] for k in writes)

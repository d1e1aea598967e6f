"""Helpers for training tests: run gptlab-train in-process (fast) or as a real subprocess (CLI behaviour)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from gptlab.config.build import compose, group_choices
from gptlab.train.run import execute

# A fast configuration: 2 layers, d_model 64, 64-token blocks, fp32 so losses are exactly reproducible.
FAST = ["model.n_layer=2", "model.d_model=64", "model.n_head=4", "model.block_size=64", "train.batch_size=8",
        "train.eval_sequences=16", "train.log_interval=1", "sample.tokens=0", "hardware.dtype=fp32",
        "hardware.peak_flops=1e12", "logger=none", "schedule.warmup_steps=2"]


def run_inprocess(run_dir: Path, *overrides: str, steps: int = 6, eval_interval: int = 3) -> dict:
    """execute() one run into run_dir, exactly as gptlab-train would after Hydra composed the config."""
    args = [*FAST, f"train.max_steps={steps}", f"train.eval_interval={eval_interval}", *overrides]
    cfg = compose(args)
    run_dir.mkdir(parents=True, exist_ok=True)
    return execute(cfg, run_dir, group_choices(cfg), args)


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def cli(tmp_path: Path, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """Run `python -m gptlab.cli.train ARGS` in tmp_path, as a user would run gptlab-train."""
    env = dict(os.environ, OMP_NUM_THREADS="2", HYDRA_FULL_ERROR="0")
    return subprocess.run([sys.executable, "-m", "gptlab.cli.train", *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=timeout)


def workers(parent: int) -> list[int]:
    """The pids of torchrun's worker processes (its children running gptlab.cli.train)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmd = (stat.parent / "cmdline").read_bytes()
        except OSError:
            continue
        if int(fields[1]) == parent and b"gptlab.cli.train" in cmd:
            found.append(int(stat.parent.name))
    return found

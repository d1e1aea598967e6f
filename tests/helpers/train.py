"""Helpers for training tests: a fast config, gptlab-train in-process, the env to run it as a real CLI (run_cli)."""

from __future__ import annotations

import json
from pathlib import Path

from gptlab.config.build import compose, group_choices
from gptlab.train.run import execute
from helpers.cli import cli_env

# A fast configuration: 2 layers, d_model 64, 64-token blocks, fp32 so losses are exactly reproducible.
FAST = [
    "model.n_layer=2",
    "model.d_model=64",
    "model.n_head=4",
    "model.block_size=64",
    "train.batch_size=8",
    "train.eval_sequences=16",
    "train.log_interval=1",
    "sample.tokens=0",
    "hardware.dtype=fp32",
    "hardware.peak_flops=1e12",
    "logger=none",
    "schedule.warmup_steps=2",
]


# The tiniest model that still trains a few real steps (tests that check plumbing, not learning): 1 layer, width 32.
TINY = [
    "model.n_layer=1",
    "model.d_model=32",
    "model.n_head=2",
    "model.block_size=32",
    "train.batch_size=4",
    "train.eval_sequences=8",
]


def run_inprocess(run_dir: Path, *overrides: str, steps: int = 6, eval_interval: int = 3) -> dict:
    """execute() one run into run_dir, exactly as gptlab-train would after Hydra composed the config."""
    args = [*FAST, f"train.max_steps={steps}", f"train.eval_interval={eval_interval}", *overrides]
    cfg = compose(args)
    run_dir.mkdir(parents=True, exist_ok=True)
    return execute(cfg, run_dir, group_choices(cfg), args)


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def train_env(**extra: str) -> dict[str, str]:
    """The environment the tests run gptlab-train in as a user would (run_cli): 2 threads, Hydra's one-line errors."""
    return cli_env(OMP_NUM_THREADS="2", HYDRA_FULL_ERROR="0", **extra)


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

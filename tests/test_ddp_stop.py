"""DDP with real gloo ranks on CPU (torchrun): a signal to ONE rank stops every rank at the same step with one
checkpoint; MFU is per device; a batch the ranks cannot share evenly is refused in one line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from test_reliability import last_step

from gptlab.state import checkpoint
from helpers.cli import cli_env, run_cli
from helpers.train import FAST, workers

TORCHRUN = [  # python -m TORCHRUN ...: 2 gloo ranks of gptlab-train
    "torch.distributed.run",
    "--standalone",
    "--nproc_per_node=2",
    "-m",
    "gptlab.cli.train",
]


@pytest.mark.slow
def test_sigterm_to_one_rank_stops_all_ranks_at_the_same_step(tmp_path):
    run = tmp_path / "run"
    env = dict(os.environ, OMP_NUM_THREADS="1", HYDRA_FULL_ERROR="0")
    args = [
        *FAST,
        "train.max_steps=400",
        "train.eval_interval=100",
        "train.ckpt_interval=0",
        "hardware=ddp_cpu",
        "hardware.dtype=fp32",
        "logger=none",
        f"hydra.run.dir={run}",
    ]
    proc = subprocess.Popen(
        [sys.executable, "-m", *TORCHRUN, *args],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=open(tmp_path / "err", "w"),
    )
    deadline = time.time() + 180
    while last_step(run) < 5 and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    ranks = workers(proc.pid)
    assert len(ranks) == 2, (ranks, (tmp_path / "err").read_text()[-2000:])
    os.kill(max(ranks), signal.SIGTERM)  # the later-started worker: rank 1 in practice, never the only one
    assert proc.wait(timeout=180) == 0, (tmp_path / "err").read_text()[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "preempted" and 5 <= summary["steps"] < 400
    found = sorted(checkpoint.ckpt_dir(run).glob("step_*.pt"))
    assert [p.name for p in found] == [f"step_{summary['steps']:07d}.pt"]  # one checkpoint, at the agreed step
    assert checkpoint.load(found[0])["identity"]["world"] == 2


@pytest.mark.slow
def test_mfu_under_ddp_is_per_device(tmp_path):
    """Two ranks on a 1e12 FLOP/s profile: MFU = FLOPs/token x global tokens/s / 2 / peak, never x world."""
    run = tmp_path / "run"
    out = run_cli(
        *TORCHRUN,
        *FAST,
        "train.max_steps=6",
        "train.eval_interval=6",
        "hardware=ddp_cpu",
        "hardware.dtype=fp32",
        "train.speed_warmup=1",
        f"hydra.run.dir={run}",
        cwd=tmp_path,
        env=cli_env(OMP_NUM_THREADS="1"),
    )
    assert out.returncode == 0, out.stderr[-2000:]
    s = json.loads((run / "summary.json").read_text())
    for row in (json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()):
        if "perf/mfu" in row:
            assert row["perf/mfu"] == pytest.approx(
                s["flops_per_token"] * row["perf/tokens_per_s"] / 2 / 1e12, rel=1e-9
            )


@pytest.mark.slow  # over 2.5 s: make test-fast stays under ~3 min
def test_a_batch_the_ranks_cannot_share_is_refused(tmp_path):
    out = run_cli(
        *TORCHRUN,
        *FAST,
        "train.batch_size=6",
        "train.grad_accum=2",
        "hardware=ddp_cpu",
        f"hydra.run.dir={tmp_path / 'run'}",
        cwd=tmp_path,
        env=cli_env(OMP_NUM_THREADS="1", HYDRA_FULL_ERROR="0"),
    )
    assert out.returncode != 0
    assert (
        "error: train.batch_size=6 must be divisible by train.grad_accum x world size = 2 x 2; allowed: a multiple of 4"
    ) in out.stderr

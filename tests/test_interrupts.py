"""Rough edges through the real CLI: Ctrl-C, a full disk while logging, and a run dir that is someone else's folder."""

from __future__ import annotations

import json
import resource
import signal
from pathlib import Path

import pytest
from test_reliability import launch, wait_for_step
from test_resume import every_row

from gptlab.sinks.jsonl import read_rows
from gptlab.state import checkpoint
from helpers.cli import cli_env, run_cli
from helpers.train import FAST

ARGS = [*FAST, "train.max_steps=30", "train.eval_interval=10", "train.ckpt_interval=0", "hardware.threads=1"]


def last_line(path: str) -> str:
    return [line for line in Path(path).read_text().splitlines() if line.strip()][-1]


@pytest.mark.slow
def test_ctrl_c_checkpoints_the_current_step_and_exits_130(tmp_path):
    assert launch(tmp_path / "straight", *ARGS).wait(timeout=300) == 0
    run = tmp_path / "run"
    proc = launch(run, *ARGS)
    assert wait_for_step(proc, run, 12)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=120) == 130
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "interrupted"
    assert last_line(f"{run}.err") == (
        f"interrupted (Ctrl-C) at step {summary['steps']}: checkpoint written; run the same command to resume ({run})"
    )
    assert "Traceback" not in Path(f"{run}.err").read_text()
    assert checkpoint.latest_path(run).name == f"step_{summary['steps']:07d}.pt"
    assert launch(run, *ARGS).wait(timeout=300) == 0
    assert every_row(run) == every_row(tmp_path / "straight")


@pytest.mark.slow  # over 2.5 s: make test-fast stays under ~3 min
def test_disk_full_while_logging_names_the_file_and_keeps_whole_rows(tmp_path):
    """RLIMIT_FSIZE stands in for a full disk (tests run as root): metrics.jsonl outgrows 8 KiB mid-run."""
    run = tmp_path / "run"

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (8 * 1024, 8 * 1024))

    # GIT_DIR names no repository: a checkout with uncommitted changes would have the run write them to git.diff,
    # which can outgrow 8 KiB first (provenance of a run without git: no git.diff)
    env = cli_env(OMP_NUM_THREADS="1", HYDRA_FULL_ERROR="0", GIT_DIR=str(tmp_path / "no-repository"))
    # First fill the caches (the corpus' token shards, measured peaks) without the limit, so that the limited run's
    # first file to outgrow 8 KiB is metrics.jsonl whatever ran before this test.
    warm = run_cli(
        "gptlab.cli.train", *ARGS, "train.max_steps=1", "logger=none", f"hydra.run.dir={tmp_path / 'warm'}", env=env
    )
    assert warm.returncode == 0, warm.stderr[-2000:]
    proc = run_cli(
        "gptlab.cli.train",
        *ARGS,
        "train.max_steps=60",
        "logger=none",
        f"hydra.run.dir={run}",
        env=env,
        preexec_fn=limit,
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1] == (
        f"error: I/O error '{run}/metrics.jsonl': cannot append to the metrics file (File too large); "
        f"the file size limit (ulimit -f) is too small"
    )
    text = (run / "metrics.jsonl").read_text()
    assert text.endswith("\n") and len(read_rows(run / "metrics.jsonl")) == len(text.splitlines()) > 10
    assert json.loads((run / "summary.json").read_text())["status"] == "failed"


def test_a_folder_of_the_users_own_files_is_refused_untouched(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "metrics.jsonl").write_text("my own numbers\n")
    (mine / "notes.txt").write_text("do not touch\n")
    before = {p.name: p.read_bytes() for p in mine.iterdir()}
    env = cli_env(OMP_NUM_THREADS="1", HYDRA_FULL_ERROR="0")
    proc = run_cli("gptlab.cli.train", *ARGS, "logger=none", f"hydra.run.dir={mine}", env=env, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"error: hydra.run.dir: '{mine}' holds files that are not a gptlab run (metrics.jsonl, notes.txt); "
        f"allowed: a new or empty dir, or a gptlab run dir to resume"
    ]
    assert {p.name: p.read_bytes() for p in mine.iterdir()} == before  # no .hydra/, no lock, nothing rewritten

"""A real two-node SLURM job on this host: scripts/slurm-cluster.sh with GPTLAB_SLURM_NODES=2 runs two slurmd daemons
(node1, node2) beside the suite's one-node cluster (own state dir and ports), and `launcher=slurm hardware=ddp_cpu
hardware.nodes=2` trains one DDP run with one rank on each node, following one process's curve."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from helpers.cli import run_cli
from helpers.train import FAST, rows, run_inprocess

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "slurm-cluster.sh"
PORTS = {"GPTLAB_SLURMCTLD_PORT": "6937", "GPTLAB_SLURMD_PORT": "6938"}  # 6938, 6939: one per node


@pytest.fixture(scope="module")
def two_nodes():
    """The cluster's environment (SLURM_CONF, PATH with its sacct); torn down after the module."""
    if os.geteuid() != 0 or shutil.which("slurmd") is None:
        pytest.skip("a two-node test cluster needs root and slurmd (scripts/slurm-cluster.sh up installs it as root)")
    state = Path(tempfile.mkdtemp(prefix="gptlab-slurm2-"))  # not under pytest's 0700 dirs: munged runs as munge
    state.chmod(0o755)
    env = dict(os.environ, GPTLAB_SLURM_DIR=str(state), GPTLAB_SLURM_NODES="2", **PORTS)
    env.pop("SLURM_CONF", None)
    up = subprocess.run([str(SCRIPT), "up"], env=env, capture_output=True, text=True, timeout=180)
    try:
        if up.returncode != 0:
            pytest.skip(f"two-node cluster did not come up: {(up.stderr.strip().splitlines() or ['?'])[-1]}")
        exports = subprocess.run([str(SCRIPT), "env"], env=env, capture_output=True, text=True, timeout=30).stdout
        cluster = dict(env)
        for part in exports.replace("\n", ";").split(";"):  # export SLURM_CONF=...; export PATH=<bin>:$PATH
            key, _, value = part.strip().removeprefix("export ").partition("=")
            if key:
                cluster[key] = value.strip("'\"").replace("$PATH", env["PATH"])
        yield cluster
    finally:
        subprocess.run([str(SCRIPT), "down"], env=env, capture_output=True, text=True, timeout=120)
        shutil.rmtree(state, ignore_errors=True)


@pytest.mark.slurm
@pytest.mark.timeout(300)
def test_ddp_over_two_slurm_nodes_matches_one_process(two_nodes, tmp_path):
    sweep = tmp_path / "sweep"
    args = [
        "-m",
        "launcher=slurm",
        *FAST,
        "train.max_steps=6",
        "train.eval_interval=3",
        "hardware=ddp_cpu",
        "hardware.dtype=fp32",
        "hardware.nodes=2",
        "hardware.tasks_per_node=1",
        "hardware.cpus_per_task=1",
        "hydra.launcher.timeout_min=5",
        "hydra.launcher.partition=debug",
        # the test nodes are named node1/node2, names no resolver knows; a real cluster's node names resolve
        "hydra.launcher.setup=['export MASTER_ADDR=127.0.0.1']",
        f"hydra.sweep.dir={sweep}",
    ]
    proc = run_cli(
        "gptlab.cli.train",
        *args,
        cwd=tmp_path,
        timeout=280,
        env=dict(two_nodes, OMP_NUM_THREADS="1", HYDRA_FULL_ERROR="0"),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (job,) = [p for p in (sweep / ".submitit").iterdir() if p.name.isdigit()]
    script = next(job.glob("*_submission.sh")).read_text()
    assert "#SBATCH --nodes=2\n" in script and "#SBATCH --ntasks-per-node=1\n" in script
    logs = [(job / f"{job.name}_{task}_log.out").read_text() for task in (0, 1)]
    for task, log in enumerate(logs):  # srun put one rank on each node, and both finished
        assert f"node={task}(2)" in log and f"global_rank={task}(2)" in log, log[-1500:]
        assert "Job completed successfully" in log
    run_dir = sweep / "0"
    assert [r["step"] for r in rows(run_dir) if "train/loss" in r] == [1, 2, 3, 4, 5, 6]  # rank 0 alone writes
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "finished"
    single = run_inprocess(tmp_path / "single", "hardware.threads=1")
    evals = {r["step"]: r["val/loss"] for r in rows(run_dir) if "val/loss" in r}
    for r in rows(tmp_path / "single"):
        if "val/loss" in r:
            assert evals[r["step"]] == pytest.approx(r["val/loss"], abs=1e-4), r["step"]
    assert single["final_val_loss"] == pytest.approx(evals[6], abs=1e-4)

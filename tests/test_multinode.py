"""Multi-node wiring: hardware.nodes reaches sbatch, every SLURM task gets the rank torchrun would give it, and two
torchrun agents on this host (as on two nodes) rendezvous into one run that follows one process's curve."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
import submitit
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
from omegaconf import OmegaConf

from gptlab.state import checkpoint
from helpers.cli import cli_env, run_cli
from helpers.train import FAST, rows, workers

CONF = Path(__file__).resolve().parents[1] / "conf"


def sbatch_text(tmp_path: Path, *overrides: str) -> str:
    """The sbatch script launcher=slurm would submit for these overrides: the real preset composed, its keys turned
    into submitit parameters as hydra-submitit-launcher's launch() does, submitit's own script writer."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        cfg = compose("train", overrides=["launcher=slurm", *overrides], return_hydra_config=True)
    cfg.hydra.launcher.submitit_folder = str(tmp_path)  # it names hydra.sweep.dir, which exists only in a real run
    params = OmegaConf.to_container(cfg.hydra.launcher, resolve=True)
    params.pop("_target_")
    # submitit refuses to build a SLURM executor where `srun` is missing; only the script text is read here, so
    # its srun probe is the one thing mocked (the sbatch text is submitit's own writer)
    with mock.patch.object(submitit.SlurmExecutor, "affinity", classmethod(lambda cls: 1)):
        executor = submitit.AutoExecutor(
            folder=params.pop("submitit_folder"), cluster="slurm", slurm_max_num_timeout=params.pop("max_num_timeout")
        )
    base = set(OmegaConf.structured(BaseQueueConf).keys())
    executor.update_parameters(**{k if k in base else f"slurm_{k}": v for k, v in params.items()})
    return executor._executor._make_submission_file_text("python -m gptlab.cli.train", "uid")


def test_hardware_nodes_and_tasks_reach_sbatch(tmp_path):
    script = sbatch_text(tmp_path, "hardware=fsdp", "hardware.nodes=2", "hardware.tasks_per_node=4")
    assert "#SBATCH --nodes=2\n" in script and "#SBATCH --ntasks-per-node=4\n" in script
    assert "#SBATCH --gpus-per-node=4\n" in script  # one GPU per rank on every node
    single = sbatch_text(tmp_path, "hardware=cpu")
    assert "#SBATCH --nodes=1\n" in single and "#SBATCH --ntasks-per-node=1\n" in single


SLURM_TASK = """\
import json, os
from gptlab.runtime.distributed import export_slurm_env
export_slurm_env()
print(json.dumps({k: os.environ.get(k) for k in
                  ["RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES"]}))
"""


@pytest.mark.slow  # over 2.5 s: make test-fast stays under ~3 min
@pytest.mark.parametrize("submitit_job", [True, False], ids=["submitit", "plain-srun"])
def test_every_task_of_a_two_node_job_gets_torchruns_env(tmp_path, submitit_job):
    """The variables SLURM gives each task of `--nodes=2 --ntasks-per-node=2` (job 4242 on gpu07, gpu08), through
    submitit's TorchDistributedEnvironment: global rank = SLURM_PROCID, local rank = SLURM_LOCALID, the first node
    is the master, one port per job; CUDA_VISIBLE_DEVICES stays as SLURM set it (each rank takes cuda:LOCAL_RANK)."""
    seen = []
    for procid in range(4):
        env = {
            "PATH": os.environ["PATH"],
            "PYTHONPATH": str(CONF.parent),
            "SLURM_JOB_ID": "4242",
            "SLURM_NTASKS": "4",
            "SLURM_JOB_NUM_NODES": "2",
            "SLURM_JOB_NODELIST": "gpu[07-08]",
            "SLURM_NODEID": str(procid // 2),
            "SLURM_PROCID": str(procid),
            "SLURM_LOCALID": str(procid % 2),
            "CUDA_VISIBLE_DEVICES": "0,1",
        }
        if submitit_job:
            env["SUBMITIT_EXECUTOR"] = "slurm"
        out = subprocess.run([sys.executable, "-c", SLURM_TASK], env=env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr[-2000:]
        seen.append(json.loads(out.stdout))
    assert [(s["RANK"], s["LOCAL_RANK"], s["WORLD_SIZE"]) for s in seen] == [
        ("0", "0", "4"),
        ("1", "1", "4"),
        ("2", "0", "4"),
        ("3", "1", "4"),
    ]
    assert {(s["MASTER_ADDR"], s["MASTER_PORT"]) for s in seen} == {("gpu07", seen[0]["MASTER_PORT"])}
    assert all(s["CUDA_VISIBLE_DEVICES"] == "0,1" for s in seen)


def test_a_master_address_the_job_script_exported_is_kept():
    env = {
        "PATH": os.environ["PATH"],
        "PYTHONPATH": str(CONF.parent),
        "SLURM_JOB_ID": "7",
        "SLURM_NTASKS": "2",
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_JOB_NODELIST": "gpu[07-08]",
        "SLURM_NODEID": "1",
        "SLURM_PROCID": "1",
        "SLURM_LOCALID": "0",
        "MASTER_ADDR": "10.0.0.7",
        "MASTER_PORT": "29555",
    }
    out = subprocess.run([sys.executable, "-c", SLURM_TASK], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    seen = json.loads(out.stdout)
    assert (seen["MASTER_ADDR"], seen["MASTER_PORT"], seen["RANK"], seen["WORLD_SIZE"]) == (
        "10.0.0.7",
        "29555",
        "1",
        "2",
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_torchrun_agents_rendezvous_like_two_nodes_and_match_one_process(tmp_path):
    """The documented multi-node torchrun recipe on one host: two agents (`--nnodes=2 --node_rank=0|1`, c10d
    rendezvous at the first "node"), one gloo rank each, train one run; rank 0 alone writes, and the curve is one
    process's with the same global batch."""
    common = [*FAST, "train.max_steps=4", "train.eval_interval=2", "hardware.dtype=fp32"]
    env = cli_env(OMP_NUM_THREADS="1")
    one = run_cli("gptlab.cli.train", *common, f"hydra.run.dir={tmp_path / 'one'}", cwd=tmp_path, env=env)
    assert one.returncode == 0, one.stderr[-2000:]
    port, run = free_port(), tmp_path / "two"
    agents = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes=2",
                f"--node_rank={node}",
                "--nproc_per_node=1",
                "--rdzv_backend=c10d",
                f"--rdzv_endpoint=127.0.0.1:{port}",
                "--rdzv_id=gptlab-test",
                "-m",
                "gptlab.cli.train",
                *common,
                "hardware=ddp_cpu",
                f"hydra.run.dir={run}",
            ],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for node in (0, 1)
    ]
    try:
        results = [a.communicate(timeout=300) for a in agents]
    finally:  # a hung rank outlives a killed agent (torchrun starts workers in their own session): kill both
        for pid in [w for a in agents for w in workers(a.pid)]:
            os.kill(pid, signal.SIGKILL)
        for a in agents:
            a.kill()
    assert [a.returncode for a in agents] == [0, 0], [err[-2000:] for _, err in results]
    assert json.loads((run / "summary.json").read_text())["status"] == "finished"
    newest = max((run / "checkpoints").glob("step_*.pt"))
    assert checkpoint.load(newest)["identity"]["world"] == 2  # one run of two ranks, not two runs of one
    a, b = rows(tmp_path / "one"), rows(run)
    assert [r["step"] for r in a] == [r["step"] for r in b]  # rank 0 alone wrote: no duplicate rows
    for ra, rb in zip(a, b):
        for key in ("train/loss", "val/loss"):
            if key in ra:
                assert rb[key] == pytest.approx(ra[key], abs=1e-4)

"""gptlab-train through the real SLURM cluster: a sweep, a 2-task DDP job, and a requeued run that resumes.

Every test is marked `slurm` and skips with the reason when no cluster answers (scripts/slurm-cluster.sh up).
Runs use tests/helpers/train.py FAST (tiny fp32 model), so losses are exactly reproducible across processes.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from helpers.cli import run_cli
from helpers.slurm import (  # noqa: F401  (slurm_cluster is a fixture)
    job_info,
    probe_cluster,
    requeue_job,
    slurm_cluster,
    wait_for_job,
)
from helpers.train import FAST, rows, run_inprocess, train_env

JOB_MINUTES = "hydra.launcher.timeout_min=5"  # SLURM kills a stuck job instead of leaving it on the node
RESUME_STEPS, RESUME_EVAL, RESUME_CKPT, RESUME_LOG = 160, 40, 20, 10


def _evals(run_dir: Path) -> dict[int, float]:
    """{step: val/loss} of a run dir's metrics.jsonl."""
    return {r["step"]: r["val/loss"] for r in rows(run_dir) if "val/loss" in r}


def _steps(run_dir: Path, key: str) -> list[int]:
    """Steps of the rows carrying `key`, in file order (duplicates kept, so they can be caught)."""
    return [r["step"] for r in rows(run_dir) if key in r]


def _summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def _job_dirs(sweep: Path) -> list[Path]:
    """submitit job folders (<sweep>/.submitit/<job id> or <array id>_<task>), oldest first."""
    folder = sweep / ".submitit"
    found = [p for p in folder.iterdir() if re.fullmatch(r"\d+(_\d+)?", p.name)] if folder.is_dir() else []
    return sorted(found, key=lambda p: [int(x) for x in p.name.split("_")])


def _wait_until(predicate, timeout: float, what: str, proc: subprocess.Popen | None = None):
    """Poll predicate() until truthy (returns its value); fail after `timeout` s or if proc died early."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if proc is not None and proc.poll() is not None and proc.returncode != 0:
            raise AssertionError(f"gptlab-train exited {proc.returncode} while waiting for {what}")
        time.sleep(0.1)
    raise TimeoutError(f"no {what} after {timeout:.0f} s")


# ---- 1. a sweep of two runs ---------------------------------------------------------------------------


@pytest.mark.slurm
@pytest.mark.timeout(180)
def test_slurm_sweep_of_two_runs_finishes(slurm_cluster, tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_PARTITION", slurm_cluster.partition)
    sweep = tmp_path / "sweep"
    proc = run_cli(
        "gptlab.cli.train",
        "-m",
        "launcher=slurm",
        "seed=0,1",
        *FAST,
        "train.max_steps=6",
        "train.eval_interval=3",
        JOB_MINUTES,
        f"hydra.sweep.dir={sweep}",
        cwd=tmp_path,
        env=train_env(),
        timeout=150,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    finals = []
    for num, seed in ((0, 0), (1, 1)):
        run_dir = sweep / str(num)
        assert list(_evals(run_dir)) == [0, 3, 6]
        summary = _summary(run_dir)
        assert summary["status"] == "finished" and summary["steps"] == 6
        assert summary["final_val_loss"] == pytest.approx(_evals(run_dir)[6])
        assert summary["choices"]["launcher"] == "slurm"
        assert f"seed={seed}" in (run_dir / ".hydra" / "overrides.yaml").read_text()
        finals.append(summary["final_val_loss"])
    assert finals[0] != finals[1]  # the seeds really differ: two runs, not one run twice
    # One sbatch array for the sweep: <array>/ holds its script, <array>_<task>/ each run's logs.
    array = _job_dirs(sweep)[0].name
    assert [p.name for p in _job_dirs(sweep)] == [array, f"{array}_0", f"{array}_1"]
    assert "#SBATCH --array=0-1%2\n" in (sweep / ".submitit" / array / f"{array}_submission.sh").read_text()


# ---- 2. a 2-task DDP job ------------------------------------------------------------------------------


@pytest.mark.slurm
@pytest.mark.timeout(180)
def test_slurm_ddp_two_tasks_match_one_process(slurm_cluster, tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_PARTITION", slurm_cluster.partition)
    sweep = tmp_path / "sweep"
    ddp = ["hardware=ddp_cpu", "hardware.dtype=fp32", "hardware.tasks_per_node=2", "hardware.cpus_per_task=1"]
    proc = run_cli(
        "gptlab.cli.train",
        "-m",
        "launcher=slurm",
        *FAST,
        *ddp,
        "train.max_steps=6",
        "train.eval_interval=3",
        JOB_MINUTES,
        f"hydra.sweep.dir={sweep}",
        cwd=tmp_path,
        env=train_env(),
        timeout=150,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (job_dir,) = _job_dirs(sweep)
    script = next(job_dir.glob("*_submission.sh")).read_text()
    assert "#SBATCH --ntasks-per-node=2\n" in script  # the preset's interpolation of hardware.tasks_per_node
    assert "#SBATCH --cpus-per-task=1\n" in script
    for task in (0, 1):  # srun started both ranks and both finished
        assert "Job completed successfully" in (job_dir / f"{job_dir.name}_{task}_log.out").read_text()
    assert sorted(p.name for p in sweep.glob("[0-9]*")) == ["0"]
    assert sorted(p.name for p in sweep.rglob("metrics.jsonl")) == ["metrics.jsonl"]
    run_dir = sweep / "0"
    # Rank 0 alone writes: one train row per step and one val row per eval step, none twice.
    assert _steps(run_dir, "train/loss") == [1, 2, 3, 4, 5, 6]
    assert _steps(run_dir, "val/loss") == [0, 3, 6]
    summary = _summary(run_dir)
    assert summary["status"] == "finished" and summary["choices"]["hardware"] == "ddp_cpu"
    # One process with the same global batch (train.batch_size is global) follows the same curve.
    single = run_inprocess(tmp_path / "single", "hardware.threads=1")
    assert summary["final_val_loss"] == pytest.approx(single["final_val_loss"], abs=1e-4)
    for step, loss in _evals(tmp_path / "single").items():
        assert _evals(run_dir)[step] == pytest.approx(loss, abs=1e-4), step


# ---- 3. a run requeued mid-way resumes from its checkpoint --------------------------------------------


def _hermetic(mp: pytest.MonkeyPatch, base: Path, cluster) -> None:
    """What conftest's function-scoped hermetic_env sets, for this module-scoped fixture (plus the cluster)."""
    for sub in ("wandb", "wandb-cache", "wandb-data", "wandb-artifacts", "wandb-config", "gptlab-cache"):
        (base / sub).mkdir(parents=True, exist_ok=True)
    mp.setenv("WANDB_MODE", "offline")
    mp.setenv("WANDB_SILENT", "true")
    for var, sub in (
        ("WANDB_DIR", "wandb"),
        ("WANDB_CACHE_DIR", "wandb-cache"),
        ("WANDB_DATA_DIR", "wandb-data"),
        ("WANDB_ARTIFACT_DIR", "wandb-artifacts"),
        ("WANDB_CONFIG_DIR", "wandb-config"),
        ("GPTLAB_CACHE", "gptlab-cache"),
    ):
        mp.setenv(var, str(base / sub))
    mp.delenv("WANDB_API_KEY", raising=False)
    mp.setenv("HF_HUB_OFFLINE", "1")
    mp.setenv("HF_DATASETS_OFFLINE", "1")
    mp.setenv("SLURM_CONF", str(cluster.conf))
    mp.setenv("PATH", cluster.path)
    mp.setenv("SLURM_PARTITION", cluster.partition)


def _submit_long_run(tmp: Path) -> subprocess.Popen:
    """Start `gptlab-train -m launcher=slurm` for one W&B-offline run long enough to be requeued mid-way."""
    args = [
        *FAST,
        f"train.max_steps={RESUME_STEPS}",
        f"train.eval_interval={RESUME_EVAL}",
        f"train.ckpt_interval={RESUME_CKPT}",
        f"train.log_interval={RESUME_LOG}",
        "logger=wandb",
        "logger.wandb.mode=offline",
        JOB_MINUTES,
        f"hydra.sweep.dir={tmp / 'sweep'}",
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", HYDRA_FULL_ERROR="0")
    return subprocess.Popen(
        [sys.executable, "-m", "gptlab.cli.train", "-m", "launcher=slurm", *args],
        cwd=tmp,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@pytest.fixture(scope="module")
def requeued_run(tmp_path_factory):
    """Submit a run, requeue its job once a checkpoint exists, wait for it; also an uninterrupted reference."""
    found = probe_cluster()
    if isinstance(found, str):
        pytest.skip(found)
    tmp = tmp_path_factory.mktemp("requeue")
    with pytest.MonkeyPatch.context() as mp:
        _hermetic(mp, tmp / "env", found)
        proc = _submit_long_run(tmp)
        exited: dict[str, float] = {}
        waiter = threading.Thread(target=lambda: (proc.communicate(timeout=150), exited.update(t=time.monotonic())))
        waiter.start()
        job_dir, state = None, None
        try:
            run_dir = tmp / "sweep" / "0"
            job_dir = _wait_until(lambda: _job_dirs(tmp / "sweep"), 60, "submitit job folder", proc)[0]
            _wait_until(lambda: list((run_dir / "checkpoints").glob("step_*.pt")), 60, "checkpoint", proc)
            wandb_id_before = (run_dir / "wandb_run_id").read_text().strip()
            restarts = requeue_job(job_dir.name)
            # The reference trains in this process while the requeued job runs (2 cores).
            reference = run_inprocess(
                tmp / "reference",
                f"train.ckpt_interval={RESUME_CKPT}",
                f"train.log_interval={RESUME_LOG}",
                "hardware.threads=1",
                steps=RESUME_STEPS,
                eval_interval=RESUME_EVAL,
            )
            state = wait_for_job(job_dir.name, timeout=90)
            job_done = time.monotonic()
        finally:
            if job_dir is not None and state is None:  # failed before the job ended: do not leave it running
                subprocess.run(["scancel", job_dir.name], capture_output=True, timeout=15)
            if proc.poll() is None and "t" not in exited:
                waiter.join(timeout=30)
            if proc.poll() is None:
                proc.kill()
            waiter.join(timeout=10)
        yield {
            "run_dir": run_dir,
            "job_dir": job_dir,
            "state": state,
            "restarts": restarts,
            "wandb_id_before": wandb_id_before,
            "reference": reference,
            "reference_dir": tmp / "reference",
            "cli_rc": proc.returncode,
            "cli_exit": exited.get("t"),
            "job_done": job_done,
        }


@pytest.mark.slurm
@pytest.mark.timeout(240)
def test_requeued_slurm_run_resumes_to_the_uninterrupted_result(requeued_run):
    r = requeued_run
    run_dir = r["run_dir"]
    assert r["state"] == "COMPLETED" and r["restarts"] == 1
    assert job_info(r["job_dir"].name)["Restarts"] == "1"
    logs = "".join(p.read_text() for p in r["job_dir"].glob("*_log.*"))
    resumed = re.findall(r"resumed from step (\d+)", logs)
    assert len(resumed) == 1 and 0 < int(resumed[0]) < RESUME_STEPS  # really interrupted mid-way, then resumed
    # Same curve as the uninterrupted run: every eval, and one train row per logged step (none re-logged).
    reference_evals = _evals(r["reference_dir"])
    assert list(reference_evals) == list(range(0, RESUME_STEPS + 1, RESUME_EVAL))
    assert list(_evals(run_dir)) == list(reference_evals)
    for step, loss in reference_evals.items():
        assert _evals(run_dir)[step] == pytest.approx(loss, abs=1e-5), step
    assert _steps(run_dir, "train/loss") == list(range(RESUME_LOG, RESUME_STEPS + 1, RESUME_LOG))
    summary = _summary(run_dir)
    assert summary["status"] == "finished"
    assert summary["steps"] == r["reference"]["steps"] == RESUME_STEPS
    assert summary["tokens"] == r["reference"]["tokens"]
    assert summary["final_val_loss"] == pytest.approx(r["reference"]["final_val_loss"], abs=1e-5)
    # One W&B run across both attempts: the id file is unchanged and every offline run dir carries it.
    wandb_id = (run_dir / "wandb_run_id").read_text().strip()
    assert wandb_id == r["wandb_id_before"]
    offline = sorted((run_dir / "wandb").glob("offline-run-*"))
    assert offline and all(p.name.endswith(f"-{wandb_id}") for p in offline)


@pytest.mark.slurm
@pytest.mark.timeout(240)
def test_sweep_command_waits_for_the_requeued_run(requeued_run):
    r = requeued_run
    assert r["cli_rc"] == 0
    assert r["cli_exit"] is not None and r["cli_exit"] >= r["job_done"] - 2.0

"""The real single-node SLURM cluster (scripts/slurm-cluster.sh) and the conf/launcher presets.

Cluster tests are marked `slurm` and skip with the reason when no cluster answers; the preset composition
and local-launcher tests run everywhere.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.slurm import (  # noqa: F401  (slurm_cluster is a fixture)
    REPO,
    job_info,
    job_states,
    requeue_job,
    sbatch,
    slurm_cluster,
    wait_for_job,
    wait_for_state,
)

LAUNCHER_DIR = REPO / "conf" / "launcher"
SLURM_TARGET = "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"
LOCAL_TARGET = "hydra_plugins.hydra_submitit_launcher.submitit_launcher.LocalLauncher"

APP = '''
import json, os
import hydra
from hydra.core.hydra_config import HydraConfig

@hydra.main(version_base=None, config_path="conf", config_name="config")
def main(cfg):
    """Record what this job saw (its x and the SLURM variables) in its own output dir."""
    env = {k: v for k, v in os.environ.items() if k.startswith("SLURM_")}
    with open(os.path.join(HydraConfig.get().runtime.output_dir, "result.json"), "w") as f:
        json.dump({"x": cfg.x, "env": env}, f)
    return cfg.x * 2

if __name__ == "__main__":
    main()
'''
APP_CONFIG = "defaults:\n  - launcher: null\n  - _self_\nx: 1\nhardware:\n  cpus_per_task: 2\n"


def _write_app(tmp_path: Path) -> Path:
    """A throwaway Hydra app whose config group `launcher` holds copies of the repo's presets."""
    shutil.copytree(LAUNCHER_DIR, tmp_path / "conf" / "launcher")
    (tmp_path / "conf" / "config.yaml").write_text(APP_CONFIG)
    (tmp_path / "app.py").write_text(APP)
    return tmp_path / "app.py"


def _run_sweep(app: Path, sweep_dir: Path, overrides: list[str], env: dict[str, str]) -> list[dict]:
    """Run `app.py -m OVERRIDES` (bounded) and return the result.json of each job, by job number."""
    cmd = [sys.executable, str(app), "-m", *overrides, f"hydra.sweep.dir={sweep_dir}"]
    out = subprocess.run(cmd, cwd=app.parent, env=env, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    return [json.loads(p.read_text()) for p in sorted(sweep_dir.glob("[0-9]*/result.json"))]


def _launcher_cfg(tmp_path: Path, overrides: list[str]):
    """hydra.launcher as composed for the tiny app, resolved against the whole config."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    _write_app(tmp_path)
    with initialize_config_dir(config_dir=str(tmp_path / "conf"), version_base=None):
        cfg = compose("config", overrides=overrides, return_hydra_config=True)
    # hydra.sweep.dir refers to hydra.runtime, which only exists during a real run.
    if "submitit_folder" in cfg.hydra.launcher:
        cfg.hydra.launcher.submitit_folder = "unused"
    OmegaConf.resolve(cfg)
    return cfg.hydra.launcher


# ---- presets (no cluster needed) ---------------------------------------------------------------------


def test_slurm_preset_composes_with_documented_defaults(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_PARTITION", "gpu-big")
    monkeypatch.setenv("SLURM_ACCOUNT", "lab42")
    launcher = _launcher_cfg(tmp_path, ["launcher=slurm"])
    assert launcher._target_ == SLURM_TARGET
    assert (launcher.partition, launcher.account) == ("gpu-big", "lab42")
    assert (launcher.timeout_min, launcher.signal_delay_s, launcher.max_num_timeout) == (240, 120, 3)
    assert launcher.cpus_per_task == 2  # from hardware.cpus_per_task in the app's config
    assert (launcher.tasks_per_node, launcher.gpus_per_node, launcher.mem_gb) == (1, None, None)
    assert launcher.array_parallelism == 32
    assert dict(launcher.additional_parameters) == {"requeue": True}


def test_slurm_preset_without_env_leaves_partition_to_sbatch(tmp_path, monkeypatch):
    monkeypatch.delenv("SLURM_PARTITION", raising=False)
    monkeypatch.delenv("SLURM_ACCOUNT", raising=False)
    launcher = _launcher_cfg(tmp_path, ["launcher=slurm", "hydra.launcher.timeout_min=7"])
    assert (launcher.partition, launcher.account, launcher.timeout_min) == (None, None, 7)


def test_local_preset_and_default_launcher(tmp_path):
    local = _launcher_cfg(tmp_path / "a", ["launcher=local"])
    assert local._target_ == LOCAL_TARGET
    assert (local.timeout_min, local.cpus_per_task, local.gpus_per_node) == (1440, 2, None)
    basic = _launcher_cfg(tmp_path / "b", [])
    assert basic._target_ == "hydra._internal.core_plugins.basic_launcher.BasicLauncher"


def test_local_launcher_runs_a_sweep(tmp_path):
    app = _write_app(tmp_path)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    results = _run_sweep(app, tmp_path / "sweep", ["launcher=local", "x=3,4"], env)
    assert [r["x"] for r in results] == [3, 4]
    assert all("SLURM_JOB_ID" not in r["env"] for r in results)
    assert (tmp_path / "sweep" / "multirun.yaml").is_file()


JOBCOMP = """\
JobId=5 Name=wrap JobState=COMPLETED Partition=debug NodeList=localhost ArrayJobId=2 ArrayTaskId=0 ExitCode=0:0
JobId=2 Name=wrap JobState=FAILED Partition=debug NodeList=localhost ArrayJobId=2 ArrayTaskId=1 ExitCode=1:0
JobId=6 Name=my job JobState=PENDING Partition=debug NodeList=localhost ExitCode=0:0
JobId=6 Name=my job JobState=COMPLETED Partition=debug NodeList=localhost ExitCode=0:0
JobId=7 Name=wrap JobState=PENDING Partition=debug NodeList=localhost ExitCode=0:0
"""


def test_sacct_wrapper_answers_from_jobcomp_log_and_squeue(tmp_path):
    (tmp_path / "jobcomp.txt").write_text(JOBCOMP)
    (tmp_path / "slurm.conf").write_text(f"ClusterName=x\nJobCompLoc={tmp_path / 'jobcomp.txt'}\n")
    fake_squeue = tmp_path / "bin" / "squeue"  # the controller's live view: job 7 runs again after a requeue
    fake_squeue.parent.mkdir()
    fake_squeue.write_text("#!/bin/sh\necho 'Q|7|7|wrap|debug|RUNNING|localhost'\n")
    fake_squeue.chmod(0o755)
    env = dict(os.environ, SLURM_CONF=str(tmp_path / "slurm.conf"), PATH=f"{fake_squeue.parent}:/usr/bin:/bin")

    def sacct(*args: str) -> list[str]:
        out = subprocess.run(
            [str(REPO / "scripts" / "sacct-wrapper"), *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
        return out.stdout.splitlines()

    # submitit's query: array tasks as <array>_<task>; the last record of a requeued job wins;
    # the live view (squeue) beats the log.
    assert sacct("-o", "JobID,State,NodeList", "--parsable2", "-j", "2", "-j", "6", "-j", "7") == [
        "JobID|State|NodeList",
        "2_0|COMPLETED|localhost",
        "2_1|FAILED|localhost",
        "6|COMPLETED|localhost",
        "7|RUNNING|localhost",
    ]
    assert sacct("-n", "-P", "-X", "-o", "JobID%20,JobIDRaw,JobName,ExitCode", "-j", "2_1,6") == [
        "2_1|2|wrap|1:0",
        "6|6|my job|0:0",
    ]


# ---- the real cluster ---------------------------------------------------------------------------------


@pytest.mark.slurm
@pytest.mark.timeout(120)
def test_sbatch_wrap_job_runs_and_writes_output(slurm_cluster, tmp_path):
    job = sbatch("-o", str(tmp_path / "out-%j.txt"), "--wrap", "echo hello-$SLURM_JOB_ID on $SLURM_JOB_PARTITION")
    assert wait_for_job(job, timeout=60) == "COMPLETED"
    out = tmp_path / f"out-{job}.txt"
    assert out.read_text().strip() == f"hello-{job} on {slurm_cluster.partition}"
    assert job_states(job) == {job: "COMPLETED"}


@pytest.mark.slurm
@pytest.mark.timeout(120)
def test_sacct_sees_array_tasks_and_cancelled_jobs(slurm_cluster, tmp_path):
    array = sbatch("-o", str(tmp_path / "arr-%A_%a.txt"), "--array=0-1", "--wrap", "echo task-$SLURM_ARRAY_TASK_ID")
    sleeper = sbatch("-o", str(tmp_path / "sleep-%j.txt"), "--wrap", "sleep 300")
    assert wait_for_job(array, timeout=60) == "COMPLETED"
    assert job_states(array) == {f"{array}_0": "COMPLETED", f"{array}_1": "COMPLETED"}
    assert (tmp_path / f"arr-{array}_1.txt").read_text().strip() == "task-1"
    subprocess.run(["scancel", sleeper], check=True, timeout=15)
    assert wait_for_job(sleeper, timeout=30) == "CANCELLED"


@pytest.mark.slurm
@pytest.mark.timeout(120)
def test_submitit_job_returns_a_value(slurm_cluster, tmp_path):
    import submitit

    executor = submitit.AutoExecutor(folder=tmp_path / "submitit", cluster="slurm")
    executor.update_parameters(timeout_min=5, slurm_partition=slurm_cluster.partition, cpus_per_task=1)
    job = executor.submit(os.getenv, "SLURM_JOB_ID")  # stdlib function: picklable by reference
    deadline = time.monotonic() + 60
    while not job.done(force_check=True) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert job.result() == job.job_id
    assert wait_for_job(job.job_id, timeout=30) == "COMPLETED"
    assert job.get_info(mode="force")["State"] == "COMPLETED"  # submitit reads it through sacct


@pytest.mark.slurm
@pytest.mark.timeout(120)
def test_submitit_sees_a_cancelled_job_end(slurm_cluster, tmp_path):
    import submitit

    executor = submitit.AutoExecutor(folder=tmp_path / "submitit", cluster="slurm")
    executor.update_parameters(timeout_min=5, slurm_partition=slurm_cluster.partition, cpus_per_task=1)
    job = executor.submit(time.sleep, 300)
    wait_for_state(job.job_id, {"RUNNING"}, timeout=30)
    job.cancel(check=True)
    deadline = time.monotonic() + 30
    while not job.done(force_check=True) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert job.done() and job.state.startswith("CANCELLED")  # without sacct submitit would wait forever
    job._results_timeout_s = 1  # submitit waits 15 s for a slow filesystem before it reports a missing result
    with pytest.raises(submitit.core.utils.UncompletedJobError):
        job.result()


@pytest.mark.slurm
@pytest.mark.timeout(200)
def test_hydra_submitit_slurm_multirun_of_two_jobs(slurm_cluster, tmp_path):
    app = _write_app(tmp_path)
    env = slurm_cluster.env(SLURM_PARTITION=slurm_cluster.partition, OMP_NUM_THREADS="1")
    sweep = tmp_path / "sweep"
    results = _run_sweep(app, sweep, ["launcher=slurm", "x=1,2", "hydra.launcher.timeout_min=5"], env)
    assert [r["x"] for r in results] == [1, 2]
    array_ids = {r["env"]["SLURM_ARRAY_JOB_ID"] for r in results}
    assert len(array_ids) == 1  # one sbatch array for the whole sweep
    assert sorted(r["env"]["SLURM_ARRAY_TASK_ID"] for r in results) == ["0", "1"]
    assert all(r["env"]["SLURM_JOB_PARTITION"] == slurm_cluster.partition for r in results)
    script = next(sweep.glob(".submitit/*/*_submission.sh")).read_text()
    for flag in (
        "--requeue",
        f"--partition={slurm_cluster.partition}",
        "--cpus-per-task=2",
        "--time=5",
        "--signal=USR2@120",
        "--array=0-1%2",
    ):
        assert f"#SBATCH {flag}\n" in script, flag


@pytest.mark.slurm
@pytest.mark.timeout(150)
def test_requeued_job_runs_again(slurm_cluster, tmp_path):
    out = tmp_path / "requeue.txt"
    # First run blocks until requeued; the restarted run (SLURM_RESTART_COUNT=1) finishes at once.
    # The first run `exec`s its sleep, so it is one process: proctrack/linuxproc signals a job's processes
    # one by one, and a shell whose child sleep got SIGTERM first printed "Terminated" and "done" before its
    # own signal came (seen once in CI).
    restarts = "${SLURM_RESTART_COUNT:-0}"
    script = f'echo "start restart={restarts}"; [ "{restarts}" -gt 0 ] || exec sleep 300; echo done'
    job = sbatch("-o", str(out), "--open-mode=append", "--requeue", "--wrap", script)
    wait_for_state(job, {"RUNNING"}, timeout=30)
    deadline = time.monotonic() + 30
    while "start restart=0" not in (out.read_text() if out.exists() else "") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert requeue_job(job) == 1
    assert wait_for_job(job, timeout=60) == "COMPLETED"
    lines = [ln for ln in out.read_text().splitlines() if not ln.startswith("slurmstepd")]
    assert lines == ["start restart=0", "start restart=1", "done"]
    assert job_info(job)["Restarts"] == "1"

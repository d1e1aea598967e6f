"""The timing session as part of a sweep: a local sweep times its arms after its last run (nothing of the sweep runs
during a window), `status` shows the session, a session killed mid-way is finished by the relaunch with only the
missing windows, `gptlab-sweep time DIR` times a sweep launched without timing, `--no-timing` is honoured, the local
queue starts no run while a session holds the sweep, and under launcher=slurm the session is one job after the
arrays (submitted through the real submitit; only sbatch, sacct and scancel are stand-ins on PATH).

The suite runs sweeps without a session (tests/conftest.py: GPTLAB_SWEEP_TIMING=off); these turn it on, at tiny
sizes through the test knob GPTLAB_TIMING_DEFAULTS (gptlab/study/timing.py).
"""

from __future__ import annotations

import fcntl
import json
import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from gptlab.cli import sweep_subcommands
from gptlab.state.layout import LOCK_FILE
from gptlab.study.timing import FINISHED, NOT_STARTED, UNFINISHED, session_state
from gptlab.sweep import layout, timing_job
from gptlab.sweep.plan import PlannedRun
from gptlab.sweep.queue import Queue, Slots
from gptlab.sweep.spec import record_definition, resolve
from gptlab.train import timing as runner
from helpers.cli import cli_env, python_bin, run_cli
from helpers.slurm import slurm_cluster, wait_for_job  # noqa: F401  (slurm_cluster is a fixture)

TINY = [
    "model.n_layer=1", "model.d_model=32", "model.n_head=2", "model.block_size=32", "train.batch_size=4",
    "train.eval_sequences=8", "sample.tokens=0", "logger=none", "hardware.dtype=fp32", "hardware.peak_flops=1e12",
    "train.log_interval=1", "hardware.threads=1", "train.max_steps=4", "train.eval_interval=2",
    "schedule.warmup_steps=1",
]  # fmt: skip
ARMS = {"base": [], "relu2": ["mlp=relu2"]}
ROUNDS, STEPS, WARMUP = 2, 3, 1
WINDOWS = ROUNDS * (len(ARMS) + 1)  # every arm once per round, and the baseline's A/A window


def _env(defaults: str = f"rounds={ROUNDS},steps={STEPS},warmup={WARMUP}", **extra: str) -> dict:
    """A CLI's environment with the session on (off in the rest of the suite), at tiny sizes."""
    return cli_env(GPTLAB_SWEEP_TIMING="on", GPTLAB_TIMING_DEFAULTS=defaults, OMP_NUM_THREADS="1", **extra)


def _sweep_file(tmp: Path) -> Path:
    path = tmp / "timed.yaml"
    path.write_text(yaml.safe_dump({"seeds": [0, 1], "overrides": TINY, "arms": ARMS}, sort_keys=False))
    return path


def _sweep(path: Path, out: Path, *flags: str, env: dict) -> subprocess.CompletedProcess:
    done = run_cli("gptlab.cli.sweep", str(path), "--out", str(out), *flags, env=env, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done


def _timing(out: Path) -> dict:
    return json.loads((out / layout.TIMING_FILE).read_text())


def _untimed_copy(swept: Path, to: Path) -> Path:
    """The swept dir's runs without its session: a sweep whose runs finished and that was never timed."""
    shutil.copytree(swept, to, ignore=shutil.ignore_patterns(layout.TIMING_FILE))
    return to


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """A two-arm, two-seed local sweep launched once with its timing session on: (file, sweep dir, its stdout)."""
    tmp = tmp_path_factory.mktemp("sweep_timing")
    path = _sweep_file(tmp)
    out = tmp / "out"
    cache = tmp_path_factory.getbasetemp() / "env" / "gptlab-cache"  # hermetic_env's (not set for a module fixture)
    done = _sweep(path, out, env=_env(GPTLAB_CACHE=str(cache)))
    return path, out, done.stdout


def test_a_local_sweep_times_every_arm_after_its_runs(swept):
    _, out, stdout = swept
    doc = _timing(out)
    assert doc["status"] == "finished" and len(doc["windows"]) == WINDOWS
    assert [a["name"] for a in doc["plan"]["arms"]] == ["base", "relu2"] and doc["baseline"] == "base"
    assert (doc["plan"]["rounds"], doc["plan"]["steps"], doc["plan"]["warmup"]) == (ROUNDS, STEPS, WARMUP)
    assert {a["run_dir"] for a in doc["plan"]["arms"]} == {str(out / "base" / "seed0"), str(out / "relu2" / "seed0")}
    lines = re.findall(r"^\[timed\] timing round (\d+), (\w+)( \(A/A\))?: [\d.]+ ms/step, outside load", stdout, re.M)
    assert sorted((int(r), arm, bool(aa)) for r, arm, aa in lines) == sorted(
        (w["round"] + 1, w["arm"], bool(w["repeat"])) for w in doc["windows"]
    )  # one line per window, as it was timed
    summary = f"[timed] timed 2 arms (base, relu2; baseline base): {ROUNDS} rounds, {WINDOWS} windows"
    assert summary in stdout and f"[timed] timing: {out / layout.TIMING_FILE}" in stdout
    assert stdout.index("timing session: every arm alone") > stdout.index("local queue: 4 runs")


def test_no_run_of_the_sweep_runs_during_a_timing_window(swept):
    _, out, _ = swept
    queue = json.loads((out / ".plan" / layout.QUEUE_FILE).read_text())
    runs = [(e["started"], e["ended"]) for e in queue.values()]  # the queue's own marks: around each run's life
    windows = [(w["started_at"], w["ended_at"]) for w in _timing(out)["windows"]]
    assert len(runs) == 4 and len(windows) == WINDOWS
    for start, end in windows:
        for run_start, run_end in runs:
            assert end <= run_start or run_end <= start, (start, end, run_start, run_end)


def test_status_shows_the_session_and_a_relaunch_times_nothing_again(swept, tmp_path):
    path, out, _ = swept
    shown = run_cli("gptlab.cli.sweep", "status", str(out), env=_env(), timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[-1] == f"timing: finished: {ROUNDS} rounds, {WINDOWS} windows of base, relu2"
    before = (out / layout.TIMING_FILE).read_bytes()
    again = _sweep(path, out, env=_env())
    assert "all 4 runs finished, nothing to launch" in again.stdout
    assert f"[timed] timing: finished: {ROUNDS} rounds" in again.stdout and "timing round" not in again.stdout
    assert (out / layout.TIMING_FILE).read_bytes() == before


def test_no_timing_is_honoured_and_time_times_the_sweep_afterwards(swept, tmp_path):
    path, out, _ = swept
    copy = _untimed_copy(out, tmp_path / "copy")
    env = _env()
    relaunched = _sweep(path, copy, "--no-timing", env=env)  # due, but left out
    assert not (copy / layout.TIMING_FILE).exists() and "[timed] timing" not in relaunched.stdout
    planned = "[timed] then the timing session, every arm alone on this machine, after the runs"
    assert planned not in _sweep(path, copy, "--dry-run", "--no-timing", env=env).stdout
    assert planned in _sweep(path, copy, "--dry-run", env=env).stdout
    state = session_state(copy)
    assert (state.state, state.current, state.ready) == (NOT_STARTED, ("base", "relu2"), True)
    timed = run_cli("gptlab.cli.sweep", "time", str(copy), "--rounds", "1", "--steps", "2", env=env, timeout=600)
    assert timed.returncode == 0, timed.stderr[-2000:]
    doc = _timing(copy)
    assert len(doc["windows"]) == 1 * 3 and doc["plan"]["steps"] == 2 and doc["plan"]["warmup"] == WARMUP
    assert timed.stdout.count("[copy] timing round 1, ") == 3 and "(3 timed now)" in timed.stdout
    refused = run_cli("gptlab.cli.sweep", "time", str(copy), "--steps", "5", env=env, timeout=120)
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1
    assert "the session it records has other steps" in refused.stderr


def test_time_refuses_while_a_run_of_the_sweep_is_in_flight(swept, tmp_path):
    _, out, _ = swept
    copy = _untimed_copy(out, tmp_path / "busy")
    (copy / "base" / "seed1" / "summary.json").unlink()  # base seed 1 trains again, and holds its run dir's lock
    with open(copy / "base" / "seed1" / LOCK_FILE, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        refused = run_cli("gptlab.cli.sweep", "time", str(copy), env=_env(), timeout=120)
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1
    assert "1 run(s) of the sweep in flight (base__seed1 (running))" in refused.stderr
    assert not (copy / layout.TIMING_FILE).exists()


def test_a_session_killed_mid_way_is_finished_by_the_relaunch_with_only_the_missing_windows(swept, tmp_path):
    path, out, _ = swept
    copy = _untimed_copy(out, tmp_path / "killed")
    env = _env(defaults="rounds=3,steps=40,warmup=1")  # 9 windows, slow enough to be caught in between
    sweep = subprocess.Popen(
        [python_bin(), "-m", "gptlab.cli.sweep", str(path), "--out", str(copy)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 600  # a hang guard only
    while time.monotonic() < deadline and sweep.poll() is None:
        try:
            if len(_timing(copy)["windows"]) >= 2:
                break
        except (OSError, ValueError):
            pass
        time.sleep(0.01)
    assert sweep.poll() is None, "the sweep ended before its session could be killed"
    os.kill(sweep.pid, signal.SIGKILL)  # the sweep process itself: it runs the session
    sweep.wait(timeout=60)
    kept = _timing(copy)["windows"]
    assert 2 <= len(kept) < 9 and _timing(copy)["status"] == "running"
    state = session_state(copy)
    assert (state.state, state.windows_done, state.windows) == (UNFINISHED, len(kept), 9)
    shown = run_cli("gptlab.cli.sweep", "status", str(copy), env=env, timeout=120)
    assert f"timing: unfinished: {len(kept) // 3} of 3 rounds, {len(kept)} of 9 windows;" in shown.stdout
    again = _sweep(path, copy, env=env)
    assert "nothing to launch" in again.stdout and f"({9 - len(kept)} timed now)" in again.stdout
    doc = _timing(copy)
    assert doc["status"] == "finished" and len(doc["windows"]) == 9 and doc["windows"][: len(kept)] == kept
    assert sorted((w["round"], w["position"]) for w in doc["windows"]) == [(r, p) for r in range(3) for p in range(3)]


def test_a_grown_sweep_sets_its_stale_session_aside_and_times_every_arm_again(swept, tmp_path):
    _, out, _ = swept
    copy = tmp_path / "grown"
    shutil.copytree(out, copy)
    doc = _timing(copy)
    doc["plan"]["arms"] = doc["plan"]["arms"][:1] + [{"name": "gone", "run_dir": str(copy / "gone" / "seed0")}]
    (copy / layout.TIMING_FILE).write_text(json.dumps(doc))  # a session of other arms than the sweep has now
    state = session_state(copy)
    assert (state.state, state.timed, state.current) == ("stale", ("base", "gone"), ("base", "relu2"))
    timed = run_cli("gptlab.cli.sweep", "time", str(copy), "--rounds", "1", "--steps", "1", env=_env())
    assert timed.returncode == 0, timed.stderr[-2000:]
    aside = copy / layout.EARLIER_TIMING_DIR / "timing-1.json"
    assert json.loads(aside.read_text()) == doc and f"moved to {aside}" in timed.stdout
    assert [a["name"] for a in _timing(copy)["plan"]["arms"]] == ["base", "relu2"]
    assert session_state(copy).state == FINISHED


def test_the_local_queue_starts_no_run_while_the_sweeps_session_holds_it(tmp_path):
    assert layout.TIMING_LOCK == runner.LOCK_FILE and layout.TIMING_FILE == runner.TIMING_FILE
    run = PlannedRun("a", 0, ("seed=0",))
    queue = Queue([run], tmp_path, Slots([[0]]), threads=1, module="json.tool", warm=False)  # a run that ends at once
    lock = os.open(tmp_path / layout.TIMING_LOCK, os.O_RDWR | os.O_CREAT)
    fcntl.flock(lock, fcntl.LOCK_EX)
    worker = threading.Thread(target=queue.run, kwargs={"poll_s": 0.01})
    worker.start()
    try:
        time.sleep(0.5)  # the queue polls 50 times meanwhile
        assert queue.state["a__seed0"]["state"] == "pending" and worker.is_alive()
    finally:
        released = time.time()
        os.close(lock)  # the session ended
    worker.join(timeout=120)
    assert not worker.is_alive() and queue.state["a__seed0"]["started"] >= released
    assert queue.state["a__seed0"]["state"] in ("finished", "failed")  # started once the lock was gone


FAKE_SLURM = {
    "srun": "#!/bin/sh\nexit 0\n",
    # sbatch: keep the script it was given, answer with the next job id
    "sbatch": '#!/bin/sh\nn=$(cat "$FAKE/next")\necho $((n + 1)) > "$FAKE/next"\ncp "$1" "$FAKE/sbatch-$n.sh"\n'
    'echo "Submitted batch job $n"\n',
    "sacct": '#!/bin/sh\necho "4242|PENDING"\n',  # the first timing job still waits for its arrays
    "scancel": '#!/bin/sh\necho "$@" >> "$FAKE/scancel.log"\n',
}


def test_on_slurm_the_session_is_one_job_after_the_arrays(tmp_path, monkeypatch):
    """The real submitit writes the sbatch script; only sbatch, sacct, scancel and srun are stand-ins (no cluster)."""
    fake = tmp_path / "bin"
    fake.mkdir()
    for name, text in FAKE_SLURM.items():
        (fake / name).write_text(text)
        (fake / name).chmod(0o755)
    (fake / "next").write_text("4242\n")
    monkeypatch.setenv("FAKE", str(fake))
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump({"overrides": [*TINY, "hardware.cpus_per_task=3"], "arms": ARMS}))
    launch = ["launcher=slurm", "hydra.launcher.partition=debug", "hydra.launcher.timeout_min=30"]
    sweep = resolve(str(spec), launch, out=tmp_path / "sw", note=lambda line: None)
    record_definition(sweep.sweep_dir, sweep.spec, sweep.extra, sweep.seeds)  # as gptlab-sweep before it launches
    assert sweep_subcommands.job_after(resolve(str(spec), [], out=tmp_path / "x", note=print)) is None  # local
    heard = sweep_subcommands.job_after(sweep)
    assert heard is not None
    heard(["101", "102"])  # what run_hydra calls once both arrays are queued
    script = (fake / "sbatch-4242.sh").read_text()
    for line in ("--dependency=afterany:101:102", "--nodes=1", "--ntasks-per-node=1", "--cpus-per-task=3",
                 "--partition=debug", "--time=30", "--job-name=gptlab-timing", "--requeue"):  # fmt: skip
        assert f"#SBATCH {line}\n" in script, line
    assert "--gpus" not in script and "--array" not in script
    folder = sweep.sweep_dir / layout.TIMING_JOB_DIR / "4242"
    submitted = pickle.loads((folder / "4242_submitted.pkl").read_bytes())
    assert submitted.function.command == [sys.executable, "-m", "gptlab.cli.sweep", "time", str(sweep.sweep_dir)]
    assert json.loads((sweep.sweep_dir / layout.TIMING_JOB_FILE).read_text())["after"] == ["101", "102"]
    assert timing_job.queued(sweep.sweep_dir) == "4242"
    heard(["103"])  # a relaunch's array: the waiting job is replaced, not doubled
    assert (fake / "scancel.log").read_text().split() == ["4242"]
    assert timing_job.recorded_job(sweep.sweep_dir) == "4243"
    assert "#SBATCH --dependency=afterany:103\n" in (fake / "sbatch-4243.sh").read_text()


@pytest.mark.slow  # ~45 s on 2 cores: an array of 4 runs, then the timing job
@pytest.mark.slurm
def test_a_slurm_sweep_times_its_arms_in_one_job_after_its_array(slurm_cluster, tmp_path, monkeypatch):  # noqa: F811
    """The real cluster: the array, then one timing job that waits for it (afterany) and times both arms alone."""
    monkeypatch.setenv("SLURM_PARTITION", slurm_cluster.partition)
    path, out = _sweep_file(tmp_path), tmp_path / "out"
    env = _env(SLURM_CONF=str(slurm_cluster.conf), PATH=slurm_cluster.path, SLURM_PARTITION=slurm_cluster.partition)
    done = _sweep(path, out, "launcher=slurm", "hydra.launcher.timeout_min=5", env=env)
    record = json.loads((out / layout.TIMING_JOB_FILE).read_text())
    arrays = sorted({p.name.split("_")[0] for p in (out / ".submitit").iterdir() if re.fullmatch(r"\d+_\d+", p.name)})
    assert len(arrays) == 1 and record["after"] == arrays  # one array, one timing job after it
    assert f"timing session: SLURM job {record['job']}, after {arrays[0]} (afterany)" in done.stdout
    script = next((out / layout.TIMING_JOB_DIR / record["job"]).glob("*submission*")).read_text()
    assert f"#SBATCH --dependency=afterany:{arrays[0]}\n" in script and "#SBATCH --nodes=1\n" in script
    assert wait_for_job(record["job"], timeout=300) == "COMPLETED"  # a hang guard only
    doc = _timing(out)
    assert doc["status"] == "finished" and len(doc["windows"]) == WINDOWS
    ended = max((out / a / f"seed{s}" / "summary.json").stat().st_mtime for a in ARMS for s in (0, 1))
    assert min(w["started_at"] for w in doc["windows"]) >= ended  # no run of the sweep ran during a window
    shown = run_cli("gptlab.cli.sweep", "status", str(out), env=env, timeout=120)
    assert shown.stdout.splitlines()[-1] == f"timing: finished: {ROUNDS} rounds, {WINDOWS} windows of base, relu2"

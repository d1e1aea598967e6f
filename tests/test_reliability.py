"""Reliability of gptlab-train under the ways cluster jobs die, through the real CLI in real processes.

SIGKILL at random moments (some while a checkpoint is being written), or SIGTERM (pre-emption), then
`train.resume=auto` must give exactly the curve of an uninterrupted run; a truncated newest checkpoint
falls back to the previous one; a NaN stops the run with its step and keeps the last good checkpoint;
runs started in the same second get their own dirs; a second run into a live run's dir is refused; the
W&B backend dying mid-run leaves training and metrics.jsonl whole. Bad input (incl. incompatible
checkpoints) is the table in test_bad_input.py; a real SLURM requeue is in test_slurm_train.py."""

from __future__ import annotations

import json
import logging
import math
import os
import random
import re
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from gptlab.errors import TrainingDiverged
from gptlab.runtime.forkserver import Forked
from gptlab.sinks.jsonl import read_rows
from gptlab.state import checkpoint
from helpers.cli import cli_env, run_cli, start_cli
from helpers.paths import pythonpath_with_tests
from helpers.train import FAST, TINY, rows, run_inprocess

# 30 fp32 steps, a checkpoint after every step (so kills often land in a write), one torch thread
KILL_ARGS = [*FAST, "train.max_steps=30", "train.eval_interval=5", "train.ckpt_interval=1", "hardware.threads=1"]
CURVE = ("step", "train/loss", "val/loss", "train/grad_norm", "train/lr", "tokens")  # what must match exactly
TRIALS = 10


def launch(run_dir: Path, *args: str, logger: str = "logger=none") -> subprocess.Popen | Forked:
    """`python -m gptlab.cli.train` into run_dir, running, its stderr kept in <run_dir>.err: a real process to kill,
    started from the worker's fork server (helpers.cli.start_cli: torch already imported, ~3 s less a start)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", HYDRA_FULL_ERROR="0")
    with open(f"{run_dir}.err", "a") as err:
        args = (*args, logger, f"hydra.run.dir={run_dir}")
        return start_cli("gptlab.cli.train", *args, env=env, stdout=subprocess.DEVNULL, stderr=err)


def curve(run_dir: Path) -> list[dict]:
    return [{k: r[k] for k in CURVE if k in r} for r in rows(run_dir)]


def last_step(run_dir: Path) -> int:
    steps = [r["step"] for r in read_rows(run_dir / "metrics.jsonl")]
    return max(steps, default=-1)


def wait_for_step(proc: subprocess.Popen | Forked, run_dir: Path, step: int) -> bool:
    """Poll metrics.jsonl until a row for `step` (or later) exists; False if the process ended first."""
    while last_step(run_dir) < step:
        if proc.poll() is not None:
            return False
        time.sleep(0.001)
    return True


def freeze(proc: subprocess.Popen | Forked) -> None:
    """SIGSTOP and wait until the kernel reports the process stopped (or gone), so the files no longer move."""
    proc.send_signal(signal.SIGSTOP)
    stat = Path(f"/proc/{proc.pid}/stat")
    while stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] not in ("T", "t", "Z"):
        time.sleep(0.0001)


def kill_at_random(proc: subprocess.Popen | Forked, run_dir: Path, rng: random.Random, last: int = 27) -> dict:
    """SIGKILL after a random step up to `last` (a few before the run's end): at a random moment in it, or (mode
    "write") while a checkpoint is half-written.

    For "write", the process is frozen (SIGSTOP) at random moments until a checkpoint temp file exists,
    then killed frozen: the kill provably lands between the temp file's creation and its rename.
    """
    mode = rng.choice(["moment", "write"])
    done = last_step(run_dir)  # rows of an earlier attempt
    if done >= last or not wait_for_step(proc, run_dir, rng.randint(max(1, done + 1), last)):
        proc.wait()  # too late to kill: let it finish
        return {"mode": mode, "killed": False}
    if mode == "moment":
        time.sleep(rng.uniform(0, 0.02))
        proc.send_signal(signal.SIGKILL)
    while mode == "write" and proc.poll() is None:
        freeze(proc)
        if any(checkpoint.ckpt_dir(run_dir).glob(checkpoint.TMP_GLOB)):
            proc.send_signal(signal.SIGKILL)
            break
        proc.send_signal(signal.SIGCONT)
        time.sleep(rng.uniform(0.0005, 0.004))
    proc.wait()
    during_write = any(checkpoint.ckpt_dir(run_dir).glob(checkpoint.TMP_GLOB))
    return {
        "mode": mode,
        "killed": proc.returncode == -signal.SIGKILL,
        "during_write": during_write,
        "after_step": last_step(run_dir),
    }


def assert_checkpoints_loadable(run_dir: Path) -> None:
    """Every checkpoint file a kill left is complete, and none before the last logged step is missing."""
    found = sorted(checkpoint.ckpt_dir(run_dir).glob("step_*.pt"))
    states = [checkpoint.load(p) for p in found]  # raises on a half-written file
    logged = last_step(run_dir)
    if logged >= 2:
        assert states and states[-1]["step"] >= logged - 1, (logged, [s["step"] for s in states])


def trial(run_dir: Path, seed: int) -> list[dict]:
    """Kill a run once or twice at random, resume each time with train.resume=auto, finish it."""
    rng = random.Random(seed)
    kills = []
    for _ in range(rng.choice([1, 1, 2])):
        kills.append(kill_at_random(launch(run_dir, *KILL_ARGS, "train.resume=auto"), run_dir, rng))
        assert_checkpoints_loadable(run_dir)
    final = launch(run_dir, *KILL_ARGS, "train.resume=auto")
    assert final.wait(timeout=180) == 0, Path(f"{run_dir}.err").read_text()[-2000:]
    return kills


def sigterm_trial(run_dir: Path) -> list[dict]:
    """SIGTERM (a SLURM time limit or pre-emption): checkpoint, status preempted, exit 0; a resume finishes."""
    proc = launch(run_dir, *KILL_ARGS)
    assert wait_for_step(proc, run_dir, 12)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "preempted" and 12 <= summary["steps"] < 30
    assert checkpoint.load(checkpoint.latest_path(run_dir))["step"] == summary["steps"]
    assert launch(run_dir, *KILL_ARGS).wait(timeout=180) == 0
    return []


@pytest.mark.slow
def test_sigkill_at_random_moments_then_resume_gives_the_uninterrupted_curve(tmp_path):
    def reference():
        proc = launch(tmp_path / "reference", *KILL_ARGS)
        assert proc.wait(timeout=180) == 0, Path(f"{tmp_path / 'reference'}.err").read_text()[-2000:]

    with ThreadPoolExecutor(max_workers=2) as pool:  # two at a time: one per core
        jobs = [pool.submit(reference)] + [pool.submit(trial, tmp_path / f"trial{i}", 1000 + i) for i in range(TRIALS)]
        jobs.append(pool.submit(sigterm_trial, tmp_path / f"trial{TRIALS}"))
        results = [job.result() for job in jobs]
    kills = [k for trial_kills in results[1:] for k in trial_kills if k["killed"]]
    writes = sum(k["during_write"] for k in kills)
    print(f"\n{TRIALS} trials, {len(kills)} SIGKILLs, {writes} during a checkpoint write: {kills}")
    assert len(kills) >= TRIALS and writes >= 1
    assert all(k["during_write"] for k in kills if k["mode"] == "write")
    want, want_summary = (
        curve(tmp_path / "reference"),
        json.loads((tmp_path / "reference" / "summary.json").read_text()),
    )
    assert [r["step"] for r in want if "val/loss" in r] == [0, 5, 10, 15, 20, 25, 30] and want[-1]["step"] == 30
    for i in range(TRIALS + 1):  # the last one was stopped by SIGTERM
        run_dir = tmp_path / f"trial{i}"
        assert curve(run_dir) == want, f"trial {i} diverged from the uninterrupted run"
        summary = json.loads((run_dir / "summary.json").read_text())
        for key in ("steps", "tokens", "final_val_loss", "best_val_loss", "status"):
            assert summary[key] == want_summary[key], (i, key)
        assert not list(checkpoint.ckpt_dir(run_dir).glob(checkpoint.TMP_GLOB))  # the next save swept it


def test_truncated_newest_checkpoint_falls_back_to_the_previous_one(tmp_path, caplog):
    """Disk corruption of the newest checkpoint, plus a stale temp file that looks newer: resume from the previous."""
    run = tmp_path / "run"
    run_inprocess(run, "train.ckpt_interval=2", steps=8, eval_interval=2)
    want = curve(run)
    newest, previous = sorted(checkpoint.ckpt_dir(run).glob("step_*.pt"))[::-1]
    assert (newest.name, previous.name) == ("step_0000008.pt", "step_0000006.pt")
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 3])
    stale = checkpoint.ckpt_dir(run) / ".step_0000009.pt.tmp4242"  # a killed writer's leftover: garbage
    stale.write_bytes(b"half a checkpoint")
    with caplog.at_level(logging.WARNING, logger="gptlab.state.checkpoint"):
        summary = run_inprocess(run, "train.ckpt_interval=2", steps=8, eval_interval=2)
    assert [r.getMessage() for r in caplog.records if "skipping" in r.getMessage()] == [
        f"skipping train.resume: checkpoint '{newest}' is unreadable (RuntimeError: PytorchStreamReader failed "
        f"reading zip archive: failed finding central directory)"
    ]
    assert curve(run) == want and summary["steps"] == 8
    assert checkpoint.load(newest)["step"] == 8  # rewritten whole from the redone steps 7-8
    assert not stale.exists()


@pytest.mark.slow  # over 2.5 s: make test-fast stays under ~3 min
def test_nan_loss_stops_with_its_step_and_keeps_the_last_good_checkpoint(tmp_path):
    """SGD at lr 30 without clipping really diverges: loss 4.3 -> 18 -> 8e2 -> 3e6 -> 4.3 (saturated) -> nan."""
    run = tmp_path / "run"
    proc = launch(
        run,
        *FAST,
        "optimizer=sgd",
        "optimizer.lr=30",
        "train.grad_clip=0",
        "train.ckpt_interval=2",
        "train.max_steps=20",
        "train.eval_interval=4",
    )
    assert proc.wait(timeout=120) == 1
    lines = [line for line in Path(f"{run}.err").read_text().splitlines() if line.strip()]
    train_rows = [r for r in rows(run) if "train/loss" in r]
    bad_step = train_rows[-1]["step"]  # rows are logged after a step; the next one went non-finite
    good = bad_step - bad_step % 2  # the newest checkpoint (every 2 steps) before the bad step
    # Which of the two goes non-finite first depends on the CPU's kernels (CI once saw loss 1.7e11, grad norm nan):
    # the line gives both as they were, and at least one of them is not finite.
    found = re.fullmatch(r"error: train: loss (\S+), grad norm (\S+) at step (\d+) (.*)", lines[-1])
    assert found, lines[-1]
    loss, grad_norm = float(found[1]), float(found[2])
    assert not (math.isfinite(loss) and math.isfinite(grad_norm)), lines[-1]
    assert int(found[3]) == bad_step + 1  # named as its row would be: the step after the last good row
    assert found[4] == (
        f"(1 non-finite steps, train.nan_skip=0); last good checkpoint: "
        f"{run}/checkpoints/step_{good:07d}.pt; lower optimizer.lr or raise train.nan_skip"
    )
    assert max(r["train/loss"] for r in train_rows) > 1e6 and all(
        torch.isfinite(torch.tensor([r["train/loss"] for r in train_rows]))
    )
    state = checkpoint.load(run / "checkpoints" / f"step_{good:07d}.pt")
    assert state["step"] == good and all(torch.isfinite(t).all() for t in state["model"].values())
    assert json.loads((run / "summary.json").read_text())["status"] == "failed"


def test_nan_skip_skips_a_bounded_number_of_steps(tmp_path, caplog):
    run = tmp_path / "run"
    with caplog.at_level(logging.WARNING, logger="gptlab.train.loop"), pytest.raises(TrainingDiverged) as err:
        run_inprocess(run, "optimizer=sgd", "optimizer.lr=30", "train.grad_clip=0", "train.nan_skip=2", steps=20)
    skipped = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert [m.split(";")[-1] for m in skipped] == [
        " skipped (1 of train.nan_skip=2)",
        " skipped (2 of train.nan_skip=2)",
    ]
    first_bad = max(r["step"] for r in rows(run) if "train/loss" in r)
    assert f"at step {first_bad + 3} (3 non-finite steps, train.nan_skip=2)" in str(err.value)  # rows' numbering


def children(pid: int) -> list[int]:
    """Direct child processes of pid (Linux /proc)."""
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        out += [int(c) for c in (task / "children").read_text().split()]
    return out


@pytest.mark.slow
def test_wandb_backend_dying_mid_run_leaves_training_and_metrics_whole(tmp_path):
    """The real WandbSink (offline) loses its wandb-core service process mid-run, as when the OOM killer picks it.

    The trainer is frozen while wandb-core is killed at step >= 10, so the loss lands mid-run for sure.
    """
    run = tmp_path / "run"
    proc = launch(run, *FAST, "train.max_steps=60", "train.eval_interval=20", logger="logger=wandb")
    assert wait_for_step(proc, run, 10)
    freeze(proc)
    cores = [c for c in children(proc.pid) if Path(f"/proc/{c}/comm").read_text().strip() == "wandb-core"]
    for pid in cores:
        os.kill(pid, signal.SIGKILL)
    proc.send_signal(signal.SIGCONT)
    assert len(cores) == 1 and proc.wait(timeout=120) == 0
    assert [r["step"] for r in rows(run) if "train/loss" in r] == list(range(1, 61))
    assert [r["step"] for r in rows(run) if "val/loss" in r] == [0, 20, 40, 60]
    assert json.loads((run / "summary.json").read_text())["status"] == "finished"
    log = (run / "train.log").read_text()
    assert log.count("logging sink 'wandb' disabled") == 1, log[-2000:]
    assert "Traceback" not in Path(f"{run}.err").read_text() + log


@pytest.mark.slow
def test_runs_started_in_the_same_second_get_their_own_dirs(tmp_path):
    """Two sweeps of the same name at once. ${now} is pinned to one value so the time part surely collides;
    only gptlab's uid (as in the default hydra.sweep.dir) keeps them apart."""
    env = {k: v for k, v in os.environ.items() if k not in ("SLURM_JOB_ID", "TORCHELASTIC_RUN_ID")}
    args = [
        sys.executable,
        "-m",
        "gptlab.cli.train",
        "-m",
        *FAST,
        "train.max_steps=6",
        "train.eval_interval=3",
        "seed=0,1",
        "sweep=same",
        "hydra.sweep.dir=sweeps/same/2025-01-01_00-00-00-${gptlab_uid:}",
    ]
    procs = [
        subprocess.Popen(
            args,
            cwd=tmp_path,
            env=env | {"OMP_NUM_THREADS": "1"},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    assert [p.wait(timeout=180) for p in procs] == [0, 0], [p.stderr.read()[-2000:] for p in procs]
    sweep_dirs = sorted((tmp_path / "sweeps" / "same").iterdir())
    assert len(sweep_dirs) == 2
    for job in [d / str(num) for d in sweep_dirs for num in (0, 1)]:
        assert json.loads((job / "summary.json").read_text())["steps"] == 6
        assert len([r for r in rows(job) if "train/loss" in r]) == 6  # one run's rows, not two interleaved


@pytest.mark.slow
def test_a_second_run_into_a_live_run_dir_is_refused(tmp_path):
    """Same hydra.run.dir twice (a copy-pasted command): the second is refused and the live run goes on untouched."""
    run = tmp_path / "run"
    args = [*FAST, "train.max_steps=20", "train.eval_interval=10"]
    first = launch(run, *args)
    assert wait_for_step(first, run, 2)
    freeze(first)  # frozen mid-run, holding the run dir
    hydra_files = {p.name: p.read_bytes() for p in (run / ".hydra").iterdir()}
    second = run_cli("gptlab.cli.train", *args, "seed=7", "logger=none", f"hydra.run.dir={run}", timeout=120)
    first.send_signal(signal.SIGCONT)
    assert second.returncode == 2 and second.stderr.strip().splitlines()[-1] == (
        f"error: hydra.run.dir: '{run}' is in use by another running gptlab-train; give this run its own dir"
    )
    assert {p.name: p.read_bytes() for p in (run / ".hydra").iterdir()} == hydra_files  # Hydra's rewrite undone
    assert first.wait(timeout=120) == 0
    assert [r["step"] for r in rows(run) if "train/loss" in r] == list(range(1, 21))


TWIN_ARGS = [*TINY, "train.max_steps=4", "train.eval_interval=2", "train.log_interval=1", "sample.tokens=0",
             "hardware.dtype=fp32", "hardware.peak_flops=1e12", "logger=none"]  # fmt: skip
RUN_FILES = {".gptlab.lock", ".hydra", "train.log", "provenance.json", "tokenizer.json", "metrics.jsonl",
             "summary.json", "checkpoints"}  # fmt: skip


def twin_starts(run_dir: Path, delays: list[float]) -> list[tuple[int, str]]:
    """len(delays) gptlab-train into one new run_dir, released together from a barrier, each after its own delay;
    (exit code, stderr) of each."""
    go = run_dir.parent / f"{run_dir.name}.go"
    env = cli_env(OMP_NUM_THREADS="1", HYDRA_FULL_ERROR="0", PYTHONPATH=pythonpath_with_tests())
    errs = [open(run_dir.parent / f"{run_dir.name}.{i}.err", "w+") for i in range(len(delays))]  # noqa: SIM115
    twins = [
        start_cli(
            "helpers.twin_start",
            str(go),
            f"{delay:.3f}",
            *TWIN_ARGS,
            f"hydra.run.dir={run_dir}",
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )  # fmt: skip
        for delay, err in zip(delays, errs)
    ]
    time.sleep(1.0)  # each has imported the CLI and waits at the barrier (a late one only widens the spread)
    go.touch()
    codes = [twin.wait(timeout=300) for twin in twins]  # a hang guard only
    said = []
    for err in errs:
        err.seek(0)
        said.append(err.read())
        err.close()
    return list(zip(codes, said))


@pytest.mark.slow
def test_twin_starts_into_one_new_run_dir_leave_the_winners_run_whole(tmp_path):
    """Three gptlab-train into one new hydra.run.dir at (nearly) the same moment, over seeded random delays (the
    first trial all at once): one trains and finishes with every run file; each other exits 2 with one line naming
    the dir, and removes nothing (the refused twin's clean-up used to delete the live run's dir)."""
    rng = random.Random(74)
    for trial, delays in enumerate([[0.0, 0.0, 0.0], *([rng.uniform(0, 0.4) for _ in range(3)] for _ in range(2))]):
        run_dir = tmp_path / f"run{trial}"
        outcomes = twin_starts(run_dir, delays)
        winners = [said for code, said in outcomes if code == 0]
        assert len(winners) == 1, (delays, outcomes)
        refusal = (
            f"error: hydra.run.dir: '{run_dir}' is in use by another running gptlab-train; give this run its own dir"
        )
        for code, said in outcomes:
            assert code == 0 or (code, said.strip().splitlines()) == (2, [refusal]), (delays, outcomes)
        assert {p.name for p in run_dir.iterdir()} - {"git.diff"} == RUN_FILES, delays  # git.diff: a dirty checkout
        summary = json.loads((run_dir / "summary.json").read_text())
        assert (summary["status"], summary["steps"]) == ("finished", 4)
        assert [r["step"] for r in rows(run_dir) if "train/loss" in r] == [1, 2, 3, 4]  # one run's rows, once each
        assert {p.name for p in (run_dir / ".hydra").iterdir()} == {"config.yaml", "hydra.yaml", "overrides.yaml"}
        assert [p.name for p in checkpoint.ckpt_dir(run_dir).iterdir()] == ["step_0000004.pt"]


@pytest.mark.slow
def test_torchrun_ranks_of_a_non_distributed_profile_leave_rank_0s_run_dir_whole(tmp_path):
    """torchrun --nproc_per_node=2 with hardware=cpu (not distributed): both ranks are twin runs of one dir. Rank 1
    is refused in one line and removes nothing (it used to delete the dir rank 0 trained in); torchrun then stops
    rank 0 (SIGTERM: preempted), and the same command alone finishes the run in that dir."""
    run_dir = tmp_path / "run"
    args = [*TWIN_ARGS, "train.max_steps=30", "hardware=cpu", f"hydra.run.dir={run_dir}"]  # rank 0 outlives the race
    env = cli_env(OMP_NUM_THREADS="1", HYDRA_FULL_ERROR="0")
    ranks = run_cli("torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "gptlab.cli.train", *args,
                    env=env, timeout=300)  # fmt: skip
    refusal = f"error: hydra.run.dir: '{run_dir}' is in use by another running gptlab-train; give this run its own dir"
    assert ranks.returncode != 0 and refusal in ranks.stderr.splitlines(), ranks.stderr[-3000:]
    assert {".gptlab.lock", ".hydra", "provenance.json", "metrics.jsonl", "summary.json"} <= {
        p.name for p in run_dir.iterdir()
    }
    assert json.loads((run_dir / "summary.json").read_text())["status"] in ("preempted", "finished")
    alone = run_cli("gptlab.cli.train", *args, env=env, timeout=300)
    assert alone.returncode == 0, alone.stderr[-3000:]
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "finished"
    assert [r["step"] for r in rows(run_dir) if "train/loss" in r] == list(range(1, 31))


def val_rows(run_dir: Path) -> list[tuple[int, float]]:
    return [(r["step"], r["val/loss"]) for r in rows(run_dir) if "val/loss" in r]


def test_a_resume_that_ends_at_its_checkpoint_step_reports_that_steps_val_loss(tmp_path):
    """schedule=constant may be cut short: train.resume=<step-6 checkpoint> train.max_steps=6 trains nothing, and its
    final val loss is step 6's (that of a straight 6-step run), not the step-4 eval the checkpoint last saw."""
    flat = ["schedule=constant", "schedule.warmup_steps=0", "train.ckpt_interval=6"]
    run, straight = tmp_path / "run", tmp_path / "straight"
    run_inprocess(run, *flat, steps=10, eval_interval=4)
    step6 = checkpoint.ckpt_dir(run) / "step_0000006.pt"
    old = checkpoint.load(step6)  # a checkpoint written before Progress kept the step of its last val loss
    del old["progress"]["last_val_step"]
    older = checkpoint.save(tmp_path / "older", 6, old)
    want = run_inprocess(straight, *flat, steps=6, eval_interval=4)["final_val_loss"]
    assert val_rows(straight)[-1] == (6, want) and val_rows(run)[1][0] == 4 and val_rows(run)[1][1] != want

    summary = run_inprocess(run, *flat, f"train.resume={step6}", steps=6, eval_interval=4)
    assert summary["steps"] == 6 and summary["final_val_loss"] == want  # bit-identical: fp32, same weights
    assert val_rows(run) == val_rows(straight)  # steps 0, 4, 6, each once
    again = run_inprocess(run, *flat, f"train.resume={step6}", steps=6, eval_interval=4)
    assert again["final_val_loss"] == want and val_rows(run) == val_rows(straight)  # no second step-6 row
    assert (
        run_inprocess(older.parent.parent, *flat, f"train.resume={older}", steps=6, eval_interval=4)["final_val_loss"]
        == want
    )


@pytest.mark.slow
def test_sigkill_then_a_resume_of_another_runs_checkpoint_into_that_dir_is_refused(tmp_path):
    """X holds a run killed at a random moment (maybe mid checkpoint write); `train.resume=<checkpoint of run Y>
    hydra.run.dir=X` is refused in one line with X byte-identical, and X's own resume still gives the uninterrupted
    curve."""

    def finish(run_dir: Path, *args: str) -> None:
        assert launch(run_dir, *KILL_ARGS, *args).wait(timeout=180) == 0, Path(f"{run_dir}.err").read_text()[-2000:]

    with ThreadPoolExecutor(max_workers=2) as pool:  # the uninterrupted reference and run Y, one per core
        done = [pool.submit(finish, tmp_path / "reference"), pool.submit(finish, tmp_path / "y", "seed=1")]
        [job.result() for job in done]
    x, theirs = tmp_path / "x", checkpoint.latest_path(tmp_path / "y")
    killed = kill_at_random(launch(x, *KILL_ARGS, "train.resume=auto"), x, random.Random(29))
    assert killed["killed"], killed
    before = {str(p.relative_to(x)): p.read_bytes() for p in sorted(x.rglob("*")) if p.is_file()}
    done = run_cli(
        "gptlab.cli.train", *KILL_ARGS, "seed=1", f"train.resume={theirs}", "logger=none", f"hydra.run.dir={x}"
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1].startswith(f"error: train.resume='{theirs}': hydra.run.dir '{x}' holds")
    assert "holds another run" in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert {str(p.relative_to(x)): p.read_bytes() for p in sorted(x.rglob("*")) if p.is_file()} == before
    finish(x, "train.resume=auto")
    assert curve(x) == curve(tmp_path / "reference")

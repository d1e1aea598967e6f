"""A sweep survives any kill: after `kill -9` of a local-queue gptlab-sweep (its runs with it, or the launcher alone)
the same command finishes the sweep, and `gptlab-sweep status` says what is left before and that all is done after;
a damaged plan.json is refused with advice that works. The state comes from what the runs left (lock, summary, the
recorded process alive), never from a record the killed launcher could not update."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from gptlab.sweep.layout import PLAN_FILE
from helpers.cli import cli_env, python_bin, run_cli

TINY = [
    "model.n_layer=1", "model.d_model=32", "model.n_head=2", "model.block_size=32", "train.batch_size=4",
    "train.eval_sequences=8", "sample.tokens=0", "logger=none", "hardware.dtype=fp32", "hardware.peak_flops=1e12",
    "train.log_interval=1", "hardware.threads=1",
]  # fmt: skip


def sweep_file(tmp_path: Path, steps: int, seeds=(0, 1)) -> Path:
    path = tmp_path / "sw.yaml"
    overrides = [*TINY, f"train.max_steps={steps}", f"train.eval_interval={steps}", f"train.ckpt_interval={steps // 4}"]
    path.write_text(yaml.safe_dump({"seeds": list(seeds), "overrides": overrides, "arms": {"a": [], "b": []}}))
    return path


def two_cores() -> None:
    """The launched sweep's affinity: two cores, so its queue runs two at a time and the rest wait, on any machine."""
    os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:2])


def statuses(out: Path) -> dict[str, str]:
    shown = run_cli("gptlab.cli.sweep", "status", str(out), timeout=120)
    assert shown.returncode == 0, shown.stderr
    return dict(re.findall(r"^(\S+__seed\d+)\s+(\S+(?: ran)?)", shown.stdout, re.M))


def launch_and_kill(path: Path, out: Path, whole_group: bool) -> None:
    """Start the sweep in its own process group, SIGKILL it once a run has written a row: the group (launcher and
    runs: a node's or a shell's kill) or the launcher alone (its runs, frozen with SIGSTOP, live on as orphans)."""
    sweep = subprocess.Popen(
        [python_bin(), "-m", "gptlab.cli.sweep", str(path), "--out", str(out)],
        env=cli_env(OMP_NUM_THREADS="1"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        preexec_fn=two_cores,
    )
    deadline = time.monotonic() + 300  # a hang guard only
    while not list(out.glob("*/seed*/metrics.jsonl")) and time.monotonic() < deadline and sweep.poll() is None:
        time.sleep(0.01)
    assert sweep.poll() is None, "the sweep ended before it could be killed"
    if whole_group:
        os.killpg(sweep.pid, signal.SIGKILL)
    else:
        for entry in json.loads((out / ".plan" / "queue.json").read_text()).values():
            if entry["state"] == "running":  # frozen, so they are surely live while the relaunch plans
                os.kill(entry["pid"], signal.SIGSTOP)
        sweep.kill()
    sweep.wait(timeout=60)


def finished_once_each(out: Path, steps: int) -> None:
    for run in sorted(out.glob("*/seed*")):
        summary = json.loads((run / "summary.json").read_text())
        assert (summary["status"], summary["steps"]) == ("finished", steps), run
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        trained = [row["step"] for row in rows if "train/loss" in row]
        assert trained == list(range(1, steps + 1)), run  # each step once: no twin wrote there


@pytest.mark.slow
def test_a_sweep_killed_with_its_runs_is_finished_by_launching_it_again(tmp_path):
    """kill -9 of the sweep's process group mid-way (two runs training, two queued): status shows nothing pending
    or running (the record said so for ever), and the same command launches every unfinished run and finishes."""
    steps = 40
    path, out = sweep_file(tmp_path, steps), tmp_path / "out"
    launch_and_kill(path, out, whole_group=True)
    before = statuses(out)
    assert len(before) == 4 and not {"pending", "running"} & set(before.values()), before
    assert "stopped" in before.values(), before
    again = run_cli("gptlab.cli.sweep", str(path), "--out", str(out), env=cli_env(OMP_NUM_THREADS="1"), timeout=600)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    assert "nothing to launch" not in again.stdout
    assert statuses(out) == {f"{arm}__seed{seed}": "finished" for arm in "ab" for seed in (0, 1)}
    finished_once_each(out, steps)


@pytest.mark.slow
def test_a_relaunch_after_the_launcher_alone_was_killed_leaves_its_live_runs_alone(tmp_path):
    """kill -9 of the launcher only: its two runs live on as orphans (frozen while the relaunch plans), its two
    queued runs are stranded. The relaunch starts exactly the stranded ones (the live ones are in flight, never
    twinned); the orphans, let go, finish too, every run with each step once."""
    steps = 60
    path, out = sweep_file(tmp_path, steps), tmp_path / "out"
    launch_and_kill(path, out, whole_group=False)
    queued = json.loads((out / ".plan" / "queue.json").read_text())
    stranded = {name for name, entry in queued.items() if entry["state"] == "pending"}
    assert len(stranded) == 2 and len(queued) == 4, queued
    again = run_cli("gptlab.cli.sweep", str(path), "--out", str(out), env=cli_env(OMP_NUM_THREADS="1"), timeout=600)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    assert set(re.findall(r"^\[sw\] (\S+): gptlab-train", again.stdout, re.M)) == stranded, again.stdout
    live = set(queued) - stranded
    assert set(re.findall(r"^\[sw\] (\S+): running already, not launched again", again.stdout, re.M)) == live
    for name in live:
        os.kill(queued[name]["pid"], signal.SIGCONT)
    deadline = time.monotonic() + 300  # the orphans end on their own; a hang guard only
    while set(statuses(out).values()) != {"finished"} and time.monotonic() < deadline:
        time.sleep(0.5)
    assert statuses(out) == {f"{arm}__seed{seed}": "finished" for arm in "ab" for seed in (0, 1)}
    finished_once_each(out, steps)


@pytest.mark.slow
def test_a_damaged_plan_is_refused_with_advice_that_works(tmp_path):
    """A plan.json cut short: status and the relaunch refuse it in one line whose advice (a command to paste, then
    the launch again) works: the finished run is kept, the other launched, and status says both finished."""
    path, out = sweep_file(tmp_path, 4, seeds=(0,)), tmp_path / "out"
    first = run_cli("gptlab.cli.sweep", str(path), "--out", str(out), "--seeds", "0", timeout=600)
    assert first.returncode == 0, first.stderr[-2000:]
    plan = out / PLAN_FILE
    plan.write_text(plan.read_text()[:40])
    refused = [
        run_cli("gptlab.cli.sweep", "status", str(out), timeout=120),
        run_cli("gptlab.cli.sweep", str(path), "--out", str(out), "--seeds", "0,1", timeout=120),
    ]
    for proc in refused:
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert proc.stderr.startswith(f"error: {plan}: not valid JSON"), proc.stderr
    advice = re.search(r"move it aside \((mv .+?)\), then launch the sweep again", refused[0].stderr)
    assert advice is not None and advice.group(1) in refused[1].stderr, refused[0].stderr
    subprocess.run(["bash", "-c", advice.group(1)], check=True)
    again = run_cli("gptlab.cli.sweep", str(path), "--out", str(out), "--seeds", "0,1", timeout=600)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "(2 finished runs skipped)" in again.stdout and "a__seed1: gptlab-train" in again.stdout
    assert "a__seed0: gptlab-train" not in again.stdout
    assert statuses(out) == {f"{arm}__seed{seed}": "finished" for arm in "ab" for seed in (0, 1)}

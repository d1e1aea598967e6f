"""gptlab-sweep at cluster scale: every arm x seed in one launch (one SLURM job array), a shell that returns
(--detach), `gptlab-sweep status`, a re-invocation that launches only what failed or never ran, and a local queue
that packs the machine (threads x concurrent runs <= cores; one GPU per run, GPUs mocked by their ids)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from gptlab.config.build import compose, group_choices
from gptlab.runtime.threads import thread_choice
from gptlab.sweep.plan import PlannedRun, planned_overrides, single_command, write_plan
from gptlab.sweep.queue import Queue, plan_slots
from gptlab.sweep.spec import load_sweep
from gptlab.sweep.status import sweep_status
from gptlab.util.paths import SWEEP_RUN_GROUP, SWEEPS_DIR
from helpers.cli import cli_env, python_bin, run_cli
from helpers.slurm import requeue_job, slurm_cluster  # noqa: F401  (slurm_cluster is a fixture)

TINY = [
    "model.n_layer=1", "model.d_model=32", "model.n_head=4", "model.block_size=32", "train.batch_size=4",
    "train.eval_sequences=8", "sample.tokens=0", "logger=none", "hardware.dtype=fp32", "hardware.peak_flops=1e12",
]  # fmt: skip


def sweep_file(tmp_path: Path, arms: dict, steps: int = 3, seeds=(0, 1)) -> Path:
    path = tmp_path / "sw.yaml"
    spec = {"seeds": list(seeds), "overrides": [*TINY, f"train.max_steps={steps}", f"train.eval_interval={steps}"]}
    path.write_text(yaml.safe_dump({**spec, "arms": arms}))
    return path


def plain(cfg) -> dict:
    return {k: v for k, v in OmegaConf.to_container(cfg, resolve=False).items() if k != "hydra"}


@pytest.mark.slow  # composes every shipped sweep's arms twice (~20 s)
def test_generated_run_configs_compose_exactly_the_plain_overrides(tmp_path):
    for path in sorted(SWEEPS_DIR.glob("*.yaml")):
        name, spec, _ = load_sweep(str(path))
        root = "decode" if spec.get("command") == "decode" else "train"
        runs = [
            PlannedRun(arm, spec["seeds"][0], (*planned_overrides(name, spec, arm, ["seed=5"]),))
            for arm in spec["arms"]
        ]
        folder = write_plan(tmp_path / name, runs)
        for run in runs:
            made = compose([f"+{SWEEP_RUN_GROUP}={run.name}", f"hydra.searchpath=[file://{folder}]"], root)
            given = compose(list(run.overrides), root)
            assert plain(made) == plain(given), (name, run.name)
            assert group_choices(made) == group_choices(given), (name, run.name)  # sweep_run is not a choice


def test_slots_pack_cpu_cores_and_give_each_gpu_run_its_own_gpus():
    assert [s for s in plan_slots(1, 0, [0, 1], []).cores] == [[0], [1]]
    assert plan_slots(2, 0, [0, 1], []).cores == [[0, 1]]  # 2 threads per run on 2 cores: one at a time
    assert plan_slots(4, 0, [0, 1], []).count == 1  # more threads than cores: still one run, never zero
    one = plan_slots(1, 1, list(range(8)), ["0", "1", "2", "3"])
    assert one.count == 4 and one.gpus == [["0"], ["1"], ["2"], ["3"]] and one.cores[3] == [6, 7]
    two = plan_slots(1, 2, list(range(8)), ["0", "1", "2", "3", "4"])
    assert two.count == 2 and two.gpus == [["0", "1"], ["2", "3"]]  # GPU 4 alone cannot hold a 2-GPU run


def test_threads_per_run_follow_the_environment(monkeypatch):
    for name in ("GPTLAB_THREADS", "OMP_NUM_THREADS", "SLURM_CPUS_PER_TASK"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert thread_choice() == (1, "OMP_NUM_THREADS")
    monkeypatch.setenv("GPTLAB_THREADS", "3")
    assert thread_choice() == (3, "GPTLAB_THREADS")
    monkeypatch.delenv("GPTLAB_THREADS")
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert thread_choice() == (len(os.sched_getaffinity(0)), "cores this process may use")


def test_the_local_queue_never_oversubscribes_the_cores(tmp_path):
    """OMP_NUM_THREADS=1: floor(cores / 1) runs at once, each with 1 torch thread and its own core."""
    cores = len(os.sched_getaffinity(0))
    path = sweep_file(tmp_path, {"mha": ["attention=mha"], "mqa": ["attention=mqa"]})
    done = run_cli("gptlab.cli.sweep", str(path), "--out", str(tmp_path / "out"), env=cli_env(OMP_NUM_THREADS="1"))
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"local queue: 4 runs, {min(cores, 4)} at a time (1 threads each)" in done.stdout
    queue = json.loads((tmp_path / "out" / ".plan" / "queue.json").read_text())
    spans = [(r["started"], r["ended"], tuple(r["cores"])) for r in queue.values()]
    overlap = max(sum(1 for s, e, _ in spans if s <= t < e) for t, _, _ in spans)
    assert overlap <= cores and all(len(c) == 1 for _, _, c in spans)
    for run in (tmp_path / "out").glob("*/seed*"):
        record = json.loads((run / "provenance.json").read_text())["hardware"]
        assert record["cpu_threads"] == 1 and record["cpu_threads_source"] == "GPTLAB_THREADS"
        assert len(record["cpu_cores"]) == 1  # its slot's core as its affinity


QUEUE_PROBE = """
import json, os, sys
print(json.dumps({"torch_before": "torch" in sys.modules, "cores": sorted(os.sched_getaffinity(0)),
                  "threads": [os.environ["OMP_NUM_THREADS"], os.environ["GPTLAB_THREADS"]],
                  "argv": sys.argv[1:], "main": __name__, "path0": sys.path[0]}))
sys.exit(3 if any("bad" in a for a in sys.argv) else 0)
"""


def test_the_local_queue_forks_cpu_runs_from_a_warm_interpreter_with_their_slot_and_status(tmp_path, monkeypatch):
    """Warm (the default) and fresh: the same argv, threads, slot cores, `__main__` and exit status per run; only
    whether torch was imported before the run's module differs."""
    (tmp_path / "gptlab_queue_probe.py").write_text(QUEUE_PROBE)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    runs = [PlannedRun("ok", 0, ()), PlannedRun("bad", 0, ()), PlannedRun("ok", 1, ())]
    slots = plan_slots(1, 0, sorted(os.sched_getaffinity(0)), [])
    for warm in (True, False):
        sweep_dir = tmp_path / f"warm-{warm}"
        assert Queue(runs, sweep_dir, slots, 1, module="gptlab_queue_probe", warm=warm).run(0.05) == ["bad__seed0"]
        state = json.loads((sweep_dir / ".plan" / "queue.json").read_text())
        for run in runs:
            seen = json.loads((sweep_dir / ".plan" / "logs" / f"{run.name}.log").read_text())
            assert seen == {
                "torch_before": warm,
                "cores": state[run.name]["cores"],
                "threads": ["1", "1"],
                "argv": single_command(run, sweep_dir)[1:],
                "main": "__main__",
                "path0": str(tmp_path),
            }, (warm, run.name)
            assert state[run.name]["state"] == ("failed" if run.arm == "bad" else "finished")
            assert state[run.name]["returncode"] == (3 if run.arm == "bad" else 0)


def test_a_warm_queue_trains_exactly_what_fresh_interpreters_train(tmp_path):
    """The same tiny sweep through the default queue (runs forked from a warm interpreter) and with
    --fresh-interpreters: the same losses at every step, the same threads and affinity; each run records how it
    started (its CPU peak memory depends on it), even where the sweep itself ran forked (the test's fork server):
    the mark does not pass to the processes a gptlab process starts."""
    path = sweep_file(tmp_path, {"mha": ["attention=mha"]}, steps=4)
    curves = {}
    for how in ("warm", "fresh"):
        out = tmp_path / how
        flags = ["--fresh-interpreters"] if how == "fresh" else []
        done = run_cli("gptlab.cli.sweep", str(path), "--out", str(out), *flags, env=cli_env(OMP_NUM_THREADS="1"))
        assert done.returncode == 0, done.stderr[-2000:]
        for seed in (0, 1):
            run = out / "mha" / f"seed{seed}"
            rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
            kept = [{k: v for k, v in r.items() if k == "step" or "loss" in k or k.endswith("lr")} for r in rows]
            hardware = json.loads((run / "provenance.json").read_text())["hardware"]
            assert hardware["process_start"] == {"warm": "forked", "fresh": "fresh"}[how]
            curves[how, seed] = ([r for r in kept if len(r) > 1], hardware["cpu_threads"], len(hardware["cpu_cores"]))
    for seed in (0, 1):
        assert curves["warm", seed][0], "no loss rows"
        assert curves["warm", seed] == curves["fresh", seed]
    assert curves["warm", 0][0] != curves["warm", 1][0]  # two seeds, two curves: the comparison can fail


def test_a_failed_run_is_named_in_status_and_only_it_is_launched_again(tmp_path):
    path = sweep_file(tmp_path, {"ok": ["attention=mha"], "bad": ["train.grad_clip=-1"]}, seeds=(0,))
    out = tmp_path / "out"
    first = run_cli("gptlab.cli.sweep", str(path), "--out", str(out))
    assert first.returncode == 1 and "FAILED bad__seed0" in first.stderr
    states = {s.name: s for s in sweep_status(out)}
    assert states["ok__seed0"].state == "finished"
    assert states["bad__seed0"].state == "failed" and "train.grad_clip=-1" in states["bad__seed0"].detail
    shown = run_cli("gptlab.cli.sweep", "status", str(out)).stdout
    assert "bad__seed0  failed" in shown and "1 finished, 1 failed" in shown
    # status reads files and the queue: neither it nor the CLI module imports torch (~1.5 s per fresh interpreter)
    code = (
        "import sys, contextlib, io; from gptlab.cli.sweep import main\n"
        "with contextlib.redirect_stdout(io.StringIO()): main(['status', sys.argv[1]])\n"
        "print(sorted(m for m in ('torch', 'wandb', 'datasets', 'submitit') if m in sys.modules))"
    )
    imported = subprocess.run([python_bin(), "-c", code, str(out)], capture_output=True, text=True, env=cli_env())
    assert imported.stdout.strip() == "[]", imported.stderr[-2000:]
    again = run_cli("gptlab.cli.sweep", str(path), "--out", str(out), "--dry-run")
    assert "bad__seed0: gptlab-train" in again.stdout and "ok__seed0: gptlab-train" not in again.stdout


def test_detach_returns_before_the_first_run_ends(tmp_path):
    path = sweep_file(tmp_path, {"mha": ["attention=mha"]}, steps=60, seeds=(0,))
    out = tmp_path / "out"
    done = run_cli("gptlab.cli.sweep", str(path), "--out", str(out), "--detach", timeout=120)
    assert done.returncode == 0, done.stderr
    returned_before_end = not (out / "mha" / "seed0" / "summary.json").exists()
    assert "queued: local queue" in done.stdout and f"gptlab-sweep status {out}" in done.stdout
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and sweep_status(out)[0].state != "finished":
        time.sleep(1)
    assert sweep_status(out)[0].state == "finished"
    assert returned_before_end


@pytest.mark.slow  # ~95 s in CI: four arrays on one node, a requeue mid-run
@pytest.mark.slurm
def test_one_array_detach_status_requeue_and_relaunch_on_slurm(slurm_cluster, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setenv("SLURM_PARTITION", slurm_cluster.partition)
    short = ["train.max_steps=40", "train.eval_interval=40"]  # only mha needs to be running when requeued
    arms = {"mha": ["attention=mha"], "mqa": ["attention=mqa", *short], "bad": ["train.grad_clip=-1"]}
    path = sweep_file(tmp_path, arms, steps=4000)  # mha ~10 s each: still running when requeued
    out = tmp_path / "out"
    done = run_cli("gptlab.cli.sweep", str(path), "--out", str(out), "--detach", "launcher=slurm", timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    jobs = done.stdout.split("queued: jobs ", 1)[1].splitlines()[0].split()
    assert len(jobs) == 6 and len({j.split("_")[0] for j in jobs}) == 1  # one sbatch: one array of 6 tasks
    assert not all((out / a / f"seed{s}" / "summary.json").exists() for a in arms for s in (0, 1))

    def states() -> dict[str, str]:
        return {s.name: s.state for s in sweep_status(out)}

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # running, and past its first steps (its run files written)
        mha = next(s for s in sweep_status(out) if s.name == "mha__seed0")
        if mha.state == "running" and mha.detail.startswith("step ") and not mha.detail.startswith("step 0"):
            break
        time.sleep(0.5)
    index = [p["name"] for p in json.loads((out / ".plan" / "plan.json").read_text())].index("mha__seed0")
    requeue_job(next(j for j in jobs if j.endswith(f"_{index}")))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and states()["mha__seed0"] != "requeued":
        time.sleep(0.5)
    assert states()["mha__seed0"] == "requeued"
    deadline = time.monotonic() + 400
    while time.monotonic() < deadline and any(s in ("pending", "running", "requeued") for s in states().values()):
        time.sleep(2)
    final = {s.name: s for s in sweep_status(out)}
    assert {n: s.state for n, s in final.items()} == {
        "mha__seed0": "finished", "mha__seed1": "finished", "mqa__seed0": "finished", "mqa__seed1": "finished",
        "bad__seed0": "failed", "bad__seed1": "failed",
    }  # fmt: skip
    assert "train.grad_clip=-1" in final["bad__seed0"].detail
    again = run_cli("gptlab.cli.sweep", str(path), "--out", str(out), "--dry-run", "launcher=slurm")
    planned = [line.split(":")[0] for line in again.stdout.splitlines() if ": gptlab-train " in line]
    assert planned == ["[sw] bad__seed0", "[sw] bad__seed1"]


def test_the_launch_asks_each_arms_own_resources(tmp_path):
    """A launcher sizes a job array from the sweep-level config, not from each run's generated config: every launch
    carries its runs' hardware resources, and arms asking for different ones get one array each."""
    arms = {"one": ["hardware.cpus_per_task=1"], "two": ["hardware.cpus_per_task=2"], "also1": ["attention=mqa"]}
    arms["also1"].append("hardware.cpus_per_task=1")
    path = sweep_file(tmp_path, arms, seeds=(0,))
    done = run_cli("gptlab.cli.sweep", str(path), "--out", str(tmp_path / "o"), "--dry-run", "launcher=slurm")
    assert done.returncode == 0, done.stderr
    launches = [line for line in done.stdout.splitlines() if "gptlab-train -m " in line]
    assert len(launches) == 2 and "3 runs in 2 launch(es)" in done.stdout
    by_cpus = {("cpus_per_task=1" in line): line for line in launches}

    def runs(line: str) -> set[str]:
        return set(line.split("+sweep_run=")[1].split()[0].split(","))

    assert runs(by_cpus[True]) == {"one__seed0", "also1__seed0"} and "hardware.cpus_per_task=1" in by_cpus[True]
    assert runs(by_cpus[False]) == {"two__seed0"} and "hardware.cpus_per_task=2" in by_cpus[False]


def test_status_names_the_signal_that_killed_a_run_and_where_it_stopped(tmp_path):
    """A SIGKILLed run writes no error line: status said "failed" with whatever it printed last (a step row), or
    nothing; now it names the signal, the run's last step and what it last said."""
    import json

    from gptlab.sweep.status import _one

    run = tmp_path / "mha" / "seed0"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text(json.dumps({"step": 40, "train/loss": 2.6}) + "\n")
    (run / "train.log").write_text("step 40/100 | loss 2.600\n")
    entry = {"name": "mha__seed0", "arm": "mha", "seed": 0, "subdir": "mha/seed0"}
    killed = _one(tmp_path, entry, {"state": "failed", "returncode": -9}, None, None)
    assert (killed.state, killed.detail) == (
        "failed",
        "killed by SIGKILL at step 40; its last output: step 40/100 | loss 2.600",
    )
    exited = _one(tmp_path, entry, {"state": "failed", "returncode": 1}, None, None)
    assert exited.detail == "step 40/100 | loss 2.600"  # an exit code is the run's own: its last line is its error


def test_status_matches_a_relaunched_run_to_its_own_array(tmp_path):
    # .submitit/ keeps the first launch's array 100 (a__seed0 failed there); the relaunch plans b__seed1 alone and
    # queues array 200: numbering every array from the oldest matched b__seed1 to 100_0 and called it failed
    import pickle

    from gptlab.sweep.status import job_ids

    out = tmp_path / "out"
    out.mkdir()
    (out / "sweep.yaml").write_text(yaml.safe_dump({"arms": {"a": [], "b": []}, "seeds": [0, 1], "overrides": []}))
    runs = [PlannedRun(arm, seed, (f"seed={seed}",)) for seed in (0, 1) for arm in ("a", "b")]
    write_plan(out, runs)
    for task in range(4):
        (out / ".submitit" / f"100_{task}").mkdir(parents=True)
    (out / ".submitit/100_0/100_0_0_result.pkl").write_bytes(pickle.dumps(("error", "RuntimeError: CUDA OOM")))
    assert job_ids(out) == {0: "100_0", 1: "100_1", 2: "100_2", 3: "100_3"}  # the first launch, as before
    write_plan(out, [runs[3]])  # the relaunch: b__seed1 only
    (out / ".submitit/200_0").mkdir()
    assert job_ids(out) == {0: "200_0"}
    relaunched = next(s for s in sweep_status(out) if s.name == "b__seed1")
    assert (relaunched.job_id, relaunched.state) == ("200_0", "pending"), relaunched

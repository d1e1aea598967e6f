"""Sweeps: every sweep file composes, a local submitit sweep runs and re-runs skip, DDP matches one process."""

from __future__ import annotations

import json
import os

import pytest
import yaml

from gptlab.config.build import compose
from gptlab.runtime.placement import slice_for_job
from gptlab.sweep.plan import planned_overrides
from gptlab.sweep.spec import config_name, load_sweep
from gptlab.util.paths import SWEEPS_DIR
from helpers.cli import cli_env, run_cli
from helpers.train import FAST, rows, run_inprocess

SWEEPS = sorted(p.stem for p in SWEEPS_DIR.glob("*.yaml"))


def torch_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


SEEDS_SHORT = ["--seeds", "0"]


@pytest.mark.parametrize("name", SWEEPS)
def test_every_sweep_arm_composes(name):
    """Each arm of each shipped sweep is a valid run config with the shared seeds/steps/data."""
    _, spec, _ = load_sweep(name)
    assert len(spec["seeds"]) == 3
    configs = [compose(planned_overrides(name, spec, arm, []), config_name(spec)) for arm in spec["arms"]]
    assert len({c.train.max_steps for c in configs}) == 1 and len({c.data_seed for c in configs}) == 1
    assert len({c.train.eval_interval for c in configs}) == 1
    assert all(c.sweep == name for c in configs)


# Shortening that keeps every arm's own choices (run_inprocess's small FAST model applies only where the sweep
# does not set the shape itself).
SHORT = [
    "train.max_steps=2",
    "train.eval_interval=1",
    "train.eval_sequences=2",
    "train.batch_size=2",
    "train.log_interval=1",
    "sample.tokens=0",
    "logger=none",
    "hardware.peak_flops=1e12",
]


DECODE_SHORT = ["batch_sizes=1", "contexts=8", "new_tokens=2", "repeats=1", "warmup=0"]


@pytest.mark.parametrize("name", SWEEPS)
def test_every_sweep_runs_end_to_end(tmp_path, name):
    """Every arm of every shipped sweep trains (seed 0, 2 steps) with the sweep's own overrides."""
    _, spec, _ = load_sweep(name)
    every = [*spec["overrides"], *(o for arm in spec["arms"].values() for o in arm)]
    needs = [o for o in every if o.startswith(("hardware=cuda", "hardware=ddp", "data=hf"))]
    if needs and not torch_cuda():
        pytest.skip(
            f"sweep '{name}' is for a GPU machine ({', '.join(sorted(set(needs)))}); "
            "its arms compose and build in test_every_sweep_arm_composes, its CPU twin trains in tests"
        )
    if config_name(spec) == "decode":  # gptlab-decode sweeps: each arm measures one tiny point
        from gptlab.cli.decode import execute

        for arm in spec["arms"]:
            cfg = compose(planned_overrides(name, spec, arm, DECODE_SHORT), "decode")
            assert [p["status"] for p in execute(cfg, {}, [])["points"]] == ["measured"] * len(cfg.cache), arm
        return
    val_steps, summaries = set(), {}
    for arm in spec["arms"]:
        run = tmp_path / arm
        overrides = planned_overrides(name, spec, arm, SHORT)
        summary = run_inprocess(run, *overrides, "seed=0", steps=2, eval_interval=1)
        assert summary["status"] == "finished" and summary["steps"] == 2, arm
        val_steps.add(tuple(r["step"] for r in rows(run) if "val/loss" in r))
        summaries[arm] = summary
    assert val_steps == {(0, 1, 2)}  # every arm evaluated at the same steps
    assert all(s["final_val_loss"] > 0 for s in summaries.values())


def test_local_job_slices():
    """CPU-core slices wrap around (GPU slices never do: tests/test_gpu_path.py); the CPU path is real below."""
    cores = [0, 1, 2, 3]
    assert [slice_for_job(k, 1, cores) for k in range(5)] == [[0], [1], [2], [3], [0]]
    assert [slice_for_job(k, 2, cores) for k in range(3)] == [[0, 1], [2, 3], [0, 1]]
    assert slice_for_job(1, 3, cores) == [0, 1, 2]  # 3-core slices: only one fits, every run gets it
    assert slice_for_job(0, 8, cores) == cores and slice_for_job(3, 0, cores) == [] and slice_for_job(0, 1, []) == []


@pytest.mark.slow
def test_local_launcher_sweep_runs_then_skips(tmp_path):
    sweep_file = tmp_path / "mini.yaml"
    sweep_file.write_text(
        yaml.safe_dump(
            {
                "description": "test",
                "seeds": [0, 1, 2],
                "overrides": [*FAST, "train.max_steps=4", "train.eval_interval=2", "hardware.cpus_per_task=1"],
                "arms": {"base": ["mlp.ratio=2"]},
            }
        )
    )
    out = tmp_path / "sweep"
    first = run_cli(
        "gptlab.cli.sweep",
        str(sweep_file),
        "launcher=local",
        "--out",
        str(out),
        cwd=tmp_path,
        env=cli_env(OMP_NUM_THREADS="1"),
        timeout=600,
    )
    assert first.returncode == 0, first.stderr[-3000:]
    for seed in range(3):
        run = out / "base" / f"seed{seed}"
        assert json.loads((run / "summary.json").read_text())["status"] == "finished"
        assert [r["step"] for r in rows(run) if "val/loss" in r] == [0, 2, 4]
        cfg = yaml.safe_load((run / ".hydra" / "config.yaml").read_text())
        assert cfg["sweep"] == "mini" and cfg["seed"] == seed
        # the local queue (OMP_NUM_THREADS=1): one run per core at a time, each pinned to its slot's core, 1 thread
        hw = json.loads((run / "provenance.json").read_text())["hardware"]
        cores = sorted(os.sched_getaffinity(0))
        assert len(hw["cpu_cores"]) == 1 and hw["cpu_cores"][0] in cores and hw["cpu_threads"] == 1
    queue = json.loads((out / ".plan" / "queue.json").read_text())
    assert (out / "sweep.yaml").is_file() and {q["state"] for q in queue.values()} == {"finished"} and len(queue) == 3
    again = run_cli(
        "gptlab.cli.sweep",
        str(sweep_file),
        "launcher=local",
        "--out",
        str(out),
        cwd=tmp_path,
        env=cli_env(OMP_NUM_THREADS="1"),
        timeout=600,
    )
    assert again.returncode == 0 and "all 3 runs finished, nothing to launch" in again.stdout
    assert "3 finished runs skipped" in again.stdout


def test_unknown_sweep_is_one_line(tmp_path):
    proc = run_cli("gptlab.cli.sweep", "nope", cwd=tmp_path, env=cli_env(OMP_NUM_THREADS="1"), timeout=600)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("error: sweep 'nope': no such sweep file; available: ")


def test_dry_run_prints_every_run_of_the_one_launch(tmp_path):
    proc = run_cli(
        "gptlab.cli.sweep",
        "attention",
        "--dry-run",
        "train.max_steps=10",
        cwd=tmp_path,
        env=cli_env(OMP_NUM_THREADS="1"),
        timeout=600,
    )
    assert proc.returncode == 0
    # one launch: one plain gptlab-train command per (arm, seed), ready to paste, and the local queue for all 12
    lines = [l for l in proc.stdout.splitlines() if l.startswith("[attention] ") and ": gptlab-train " in l]
    runs = {(l.split("arm=")[1].split()[0], l.split(" seed=")[1].split()[0]) for l in lines}
    assert len(lines) == 12 and runs == {(a, s) for a in ("mha", "gqa4", "gqa2", "mqa") for s in "012"}
    assert all("sweep=attention" in l and "train.max_steps=10" in l for l in lines)
    assert "[attention] local queue: 12 runs" in proc.stdout


@pytest.mark.slow
def test_ddp_two_processes_match_one(tmp_path):
    """torchrun with 2 gloo ranks and the same global batch gives the same losses as 1 process."""
    common = [*FAST, "train.max_steps=4", "train.eval_interval=2", "hardware.dtype=fp32"]
    env = cli_env(OMP_NUM_THREADS="1")
    one = run_cli("gptlab.cli.train", *common, f"hydra.run.dir={tmp_path / 'one'}", cwd=tmp_path, env=env)
    assert one.returncode == 0, one.stderr[-2000:]
    two = run_cli(
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        "-m",
        "gptlab.cli.train",
        *common,
        "hardware=ddp_cpu",
        f"hydra.run.dir={tmp_path / 'two'}",
        cwd=tmp_path,
        env=env,
    )
    assert two.returncode == 0, two.stderr[-3000:]
    a, b = rows(tmp_path / "one"), rows(tmp_path / "two")
    assert [r["step"] for r in a] == [r["step"] for r in b]  # rank 0 alone wrote: no duplicate rows
    for ra, rb in zip(a, b):
        for key in ("train/loss", "val/loss"):
            if key in ra:
                assert rb[key] == pytest.approx(ra[key], abs=1e-4)


@pytest.mark.slow
def test_optuna_sweeper_minimises_final_val_loss(tmp_path):
    """`+tune=lr` runs Hydra's Optuna sweeper; its objective is the final val loss each run returns."""
    out = tmp_path / "tune"
    env = cli_env(OMP_NUM_THREADS="2")
    proc = run_cli(
        "gptlab.cli.train",
        "-m",
        "+tune=lr",
        "hydra.sweeper.n_trials=3",
        *FAST,
        "train.max_steps=3",
        "train.eval_interval=3",
        f"hydra.sweep.dir={out}",
        cwd=tmp_path,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = yaml.safe_load((out / "optimization_results.yaml").read_text())
    runs = sorted(p for p in out.iterdir() if (p / "summary.json").is_file())
    losses = {json.loads((r / "summary.json").read_text())["final_val_loss"]: r for r in runs}
    assert len(runs) == 3 and len(losses) == 3  # three distinct learning rates, three distinct results
    assert result["best_value"] == pytest.approx(min(losses))
    best_cfg = yaml.safe_load((losses[min(losses)] / ".hydra" / "config.yaml").read_text())
    assert best_cfg["optimizer"]["lr"] == pytest.approx(result["best_params"]["optimizer.lr"])
    assert 3e-4 <= best_cfg["optimizer"]["lr"] <= 3e-2 and best_cfg["sweep"] == "tune-lr"


def test_dry_run_into_a_dir_holding_another_sweep_is_refused_as_the_launch_is(tmp_path):
    """The dry run planned every run into a dir that the launch then refused; now it answers as the launch would,
    and writes nothing (a fresh dir stays empty)."""
    env, out = cli_env(OMP_NUM_THREADS="1"), tmp_path / "sweep"
    fresh = run_cli("gptlab.cli.sweep", "attention", "--dry-run", "--out", str(out), cwd=tmp_path, env=env)
    assert fresh.returncode == 0 and not out.exists()
    out.mkdir()
    (out / "sweep.yaml").write_text("description: another\nseeds: [0]\narms:\n  a: [mlp.ratio=2]\n")
    other = run_cli("gptlab.cli.sweep", "attention", "--dry-run", "--out", str(out), cwd=tmp_path, env=env)
    assert other.returncode == 2 and ": gptlab-train " not in other.stdout
    assert other.stderr.strip().endswith("holds a different sweep definition; pass --out <new dir>")

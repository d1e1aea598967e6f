"""Sweeps: every sweep file composes, a local submitit sweep runs and re-runs skip, DDP matches one process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gptlab.build import compose
from gptlab.cli.sweep import load_sweep, planned_overrides
from gptlab.paths import SWEEPS_DIR
from train_helpers import FAST, rows

SWEEPS = sorted(p.stem for p in SWEEPS_DIR.glob("*.yaml"))
SEEDS_SHORT = ["--seeds", "0"]


@pytest.mark.parametrize("name", SWEEPS)
def test_every_sweep_arm_composes(name):
    """Each arm of each shipped sweep is a valid run config with the shared seeds/steps/data."""
    _, spec, _ = load_sweep(name)
    assert len(spec["seeds"]) == 3
    configs = [compose(planned_overrides(name, spec, arm, [])) for arm in spec["arms"]]
    assert len({c.train.max_steps for c in configs}) == 1 and len({c.data_seed for c in configs}) == 1
    assert len({c.train.eval_interval for c in configs}) == 1
    assert all(c.sweep == name for c in configs)


def _sweep(tmp_path, *args, timeout=600):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "gptlab.cli.sweep", *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_local_launcher_sweep_runs_then_skips(tmp_path):
    sweep_file = tmp_path / "mini.yaml"
    sweep_file.write_text(yaml.safe_dump({"description": "test", "seeds": [0, 1, 2],
                                          "overrides": [*FAST, "train.max_steps=4", "train.eval_interval=2"],
                                          "arms": {"base": ["mlp.ratio=2"]}}))
    out = tmp_path / "sweep"
    first = _sweep(tmp_path, str(sweep_file), "launcher=local", "--out", str(out))
    assert first.returncode == 0, first.stderr[-3000:]
    for seed in range(3):
        run = out / "base" / f"seed{seed}"
        assert json.loads((run / "summary.json").read_text())["status"] == "finished"
        assert [r["step"] for r in rows(run) if "val/loss" in r] == [0, 2, 4]
        cfg = yaml.safe_load((run / ".hydra" / "config.yaml").read_text())
        assert cfg["sweep"] == "mini" and cfg["seed"] == seed
    assert (out / "sweep.yaml").is_file() and list((out / ".submitit").iterdir())
    again = _sweep(tmp_path, str(sweep_file), "launcher=local", "--out", str(out))
    assert again.returncode == 0 and "all 3 runs finished, skipping" in again.stdout
    assert "3 finished runs skipped" in again.stdout


def test_unknown_sweep_is_one_line(tmp_path):
    proc = _sweep(tmp_path, "nope")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("error: sweep 'nope': no such sweep file; available: ")


def test_dry_run_prints_one_multirun_per_arm(tmp_path):
    proc = _sweep(tmp_path, "attention", "--dry-run", "train.max_steps=10")
    assert proc.returncode == 0
    lines = [l for l in proc.stdout.splitlines() if l.startswith("[attention] ") and "-m" in l]
    assert len(lines) == 4 and all("seed=0,1,2" in l and "sweep=attention" in l for l in lines)


@pytest.mark.slow
def test_ddp_two_processes_match_one(tmp_path):
    """torchrun with 2 gloo ranks and the same global batch gives the same losses as 1 process."""
    common = [*FAST, "train.max_steps=4", "train.eval_interval=2", "hardware.dtype=fp32"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    one = subprocess.run([sys.executable, "-m", "gptlab.cli.train", *common, f"hydra.run.dir={tmp_path / 'one'}"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert one.returncode == 0, one.stderr[-2000:]
    two = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                          "-m", "gptlab.cli.train", *common, "hardware=ddp", "hardware.device=cpu",
                          f"hydra.run.dir={tmp_path / 'two'}"], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=300)
    assert two.returncode == 0, two.stderr[-3000:]
    a, b = rows(tmp_path / "one"), rows(tmp_path / "two")
    assert [r["step"] for r in a] == [r["step"] for r in b]  # rank 0 alone wrote: no duplicate rows
    for ra, rb in zip(a, b):
        for key in ("train/loss", "val/loss"):
            if key in ra:
                assert rb[key] == pytest.approx(ra[key], abs=1e-4)

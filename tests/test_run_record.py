"""A run dir describes its own run: a later launch into it that is refused cannot relabel its figures."""

from __future__ import annotations

import json

import pytest
import yaml

from gptlab.compare.reading.runs import load_run
from helpers.cli import cli_env, run_cli
from helpers.train import FAST, run_inprocess


@pytest.mark.slow
def test_refused_multirun_job_rewrites_hydra_but_not_the_runs_own_config(tmp_path):
    sweep = tmp_path / "sweep"
    run = sweep / "job"
    summary = run_inprocess(run, steps=2, eval_interval=2)
    assert summary["status"] == "finished"
    own = json.loads((run / "provenance.json").read_text())["config"]
    assert own["attention"]["n_kv_head"] is None and own["train"]["max_steps"] == 2
    # the same dir as job `job` of a multirun with another attention: Hydra writes .hydra/, gptlab refuses to resume
    args = [
        *FAST,
        "train.max_steps=2",
        "train.eval_interval=2",
        "attention=gqa",
        "attention.n_kv_head=2",
        f"hydra.sweep.dir={sweep}",
        "hydra.sweep.subdir=job",
    ]
    proc = run_cli("gptlab.cli.train", "-m", *args, env=cli_env(OMP_NUM_THREADS="1"))
    assert proc.returncode != 0 and "attention=mha there, gqa here" in proc.stderr
    rewritten = yaml.safe_load((run / ".hydra" / "config.yaml").read_text())
    assert rewritten["attention"]["n_kv_head"] == 2  # Hydra's copy now describes the refused launch
    loaded = load_run(run)
    assert loaded.config["attention"]["n_kv_head"] is None and loaded.choices["attention"] == "mha"
    assert "attention=gqa" not in loaded.overrides
    assert loaded.summary["final_val_loss"] == summary["final_val_loss"]

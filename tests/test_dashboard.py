"""What a dashboard sees of a run: the flat groupable config, group and name, x-axes on every row, run files,
the offline resume hint, the checkpoint artifact and several loggers at once. W&B runs are real offline runs
read back with `wandb leet inspect`; TensorBoard files are read back with TensorBoard's own reader."""

from __future__ import annotations

import csv
import json
import os
import subprocess
from collections import defaultdict
from pathlib import Path

import pytest
import yaml

from gptlab.config.build import compose, group_choices, plain_config
from gptlab.sinks.dashboard import Launch, _sweep_keys, flat_config, run_group, run_name, tags
from helpers.cli import run_cli
from helpers.train import FAST, run_inprocess
from helpers.train import TINY as TINY_MODEL
from helpers.wandb_read import config, history, inspect_records, of_type

TINY = [o for o in FAST if not o.startswith("logger=")] + [*TINY_MODEL, "train.log_interval=2"]
OFFLINE = dict(os.environ, WANDB_MODE="offline", OMP_NUM_THREADS="1", HYDRA_FULL_ERROR="0")


def train(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """gptlab-train as a user runs it, W&B offline (no key), in cwd."""
    flags = [a for a in args if a.startswith("-")]  # Hydra's flags go before the overrides
    overrides = [a for a in args if not a.startswith("-")]
    proc = run_cli("gptlab.cli.train", *flags, *TINY, *overrides, cwd=cwd, env=OFFLINE, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


# ---------------------------------------------------------------- pure pieces
def test_flat_config_has_every_choice_and_no_wiring_or_logger_keys():
    cfg = compose(["attention=gqa", "attention.n_kv_head=2", "logger=[wandb,csv]", "arm=gqa", "sweep=attn"])
    flat = flat_config(plain_config(cfg), group_choices(cfg), {"params": 123, "git_commit": "abc"})
    assert flat["choice/attention"] == "gqa" and flat["choice/mlp"] == "gelu" and flat["choice/logger"] == "wandb+csv"
    assert (flat["arm"], flat["sweep"], flat["seed"], flat["data_seed"]) == ("gqa", "attn", 0, 1337)
    assert flat["params"] == 123 and flat["git_commit"] == "abc" and flat["attention.n_kv_head"] == 2
    assert flat["train.max_steps"] == cfg.train.max_steps and flat["model.d_model"] == cfg.model.d_model
    assert not [k for k in flat if k.startswith("logger") or k.endswith(("_target_", "_partial_"))]


def test_tags_name_only_the_choices_that_differ_from_the_defaults():
    """Tags repeat nothing every run shares: only non-default choices (never the logger), after the user's own."""
    cfg = compose(["attention=gqa", "attention.n_kv_head=2", "logger=[wandb,csv]", "norm=rmsnorm", "mlp=swiglu"])
    assert tags(["mine"], group_choices(cfg)) == ["mine", "attention=gqa", "mlp=swiglu"]
    assert tags(None, group_choices(compose([]))) == []  # the default run: no tag at all


def test_names_and_groups():
    groups = {"attention", "mlp"}
    assert run_name(None, "gqa", 2, ["seed=2"], Launch(), groups) == "gqa s2"
    assert run_name("mine", "gqa", 2, [], Launch(), groups) == "mine"
    launch = Launch("2026-01-01_00-00-00-abc", ["attention", "mlp.ratio", "seed"])
    overrides = ["train.max_steps=5", "attention=mqa", "mlp.ratio=3", "seed=1"]
    assert run_name(None, None, 1, overrides, launch, groups) == "mqa mlp.ratio=3 s1"
    assert run_name(None, None, 0, ["norm=layernorm", "hydra.run.dir=x"], Launch(), groups) == "norm=layernorm"
    assert run_group(None, "attn", launch) == "attn"
    assert run_group(None, None, launch) == "2026-01-01_00-00-00-abc"
    assert run_group("mine", "attn", launch) == "mine" and run_group(None, None, Launch()) == "default"


def test_sweep_keys_come_from_multirun_yaml(tmp_path):
    task = ["attention=mha,gqa", "mlp.ratio=3", "seed=range(0,3)", "norm=choice(layernorm,rmsnorm)"]
    (tmp_path / "multirun.yaml").write_text(yaml.safe_dump({"hydra": {"overrides": {"task": task}}}))
    assert _sweep_keys(tmp_path / "multirun.yaml") == ["attention", "seed", "norm"]
    assert _sweep_keys(tmp_path / "missing.yaml") == []


# ---------------------------------------------------------------- real runs
@pytest.mark.slow
def test_multirun_groups_by_choice_and_plots_against_step_tokens_and_wall_time(tmp_path):
    """The issue's check: mha / gqa / mqa x 3 seeds, read back from the offline W&B files."""
    out = train(
        tmp_path,
        "-m",
        "attention=mha,gqa,mqa",
        "model.n_head=8",
        "seed=0,1,2",  # gqa: 4 KV heads of 8
        "train.max_steps=4",
        "train.eval_interval=2",
    )
    runs = sorted((tmp_path / "outputs" / "sweeps" / "multirun").glob("*/*/wandb/offline-run-*"))
    assert len(runs) == 9, out.stdout[-2000:]
    by_choice, groups = defaultdict(list), set()
    for folder in runs:
        records = inspect_records(folder)
        run = of_type(records, "run")[0]
        cfg = config(records)
        by_choice[cfg["choice/attention"]].append(cfg["seed"])
        groups.add(run["run_group"])
        assert run["display_name"] == f"{cfg['choice/attention']} s{cfg['seed']}"
        assert cfg["params"] > 0 and cfg["flops_per_token"] > 0 and len(cfg["git_commit"]) == 40
        rows = history(records)
        assert rows and all({"step", "tokens", "wall_s", "flops"} <= set(r) for r in rows)  # every row: all x-axes
        assert all(r["flops"] == r["tokens"] * cfg["flops_per_token"] for r in rows)  # loss against compute
        evals = [r for r in rows if "val/loss" in r]
        assert [r["step"] for r in evals] == [0, 2, 4] and [r["tokens"] for r in evals] == [0, 2 * 128, 4 * 128]
        walls = [r["wall_s"] for r in rows]
        assert walls == sorted(walls) and walls[0] >= 0
        declared = {m.get("name") for m in of_type(records, "metric")}
        assert {"step", "tokens", "wall_s", "flops"} <= declared
        saved = {f["path"] for r in of_type(records, "files") for f in r["files"]}
        assert {"provenance.json", ".hydra/config.yaml", ".hydra/overrides.yaml"} <= saved
    assert {k: sorted(v) for k, v in by_choice.items()} == {"mha": [0, 1, 2], "gqa": [0, 1, 2], "mqa": [0, 1, 2]}
    sweep_dir = runs[0].parents[2]
    assert groups == {sweep_dir.name}  # one multirun, one group: its own id


@pytest.mark.slow
def test_offline_resume_lists_every_folder_and_both_halves_read_back(tmp_path):
    run = tmp_path / "run"
    base = [
        "schedule=constant",
        "train.eval_interval=2",
        "train.ckpt_interval=2",
        "logger=wandb",
        "logger.wandb.log_checkpoints=true",
        f"hydra.run.dir={run}",
    ]
    first = train(tmp_path, *base, "train.max_steps=2")
    second = train(tmp_path, *base, "train.max_steps=4")
    summary = json.loads((run / "summary.json").read_text())
    folders = [Path(f) for f in summary["wandb"]["folders"]]
    assert len(folders) == 2 and folders == sorted(folders) and all(f.is_dir() for f in folders)
    assert f"upload later with: wandb sync {folders[0]} {folders[1]}" in second.stdout
    assert f"wandb sync {folders[0]}\n" in first.stdout
    halves = [inspect_records(f) for f in folders]
    ids = {of_type(r, "run")[0]["run_id"] for r in halves}
    assert ids == {summary["wandb"]["id"]} == {(run / "wandb_run_id").read_text().strip()}
    steps = [[row["step"] for row in history(r)] for r in halves]
    assert steps[0] == [0, 2, 2] and steps[1] == [4, 4]  # rows after the checkpoint only: nothing twice
    artifacts = of_type(halves[1], "artifact")
    assert len(artifacts) == 1 and sorted(artifacts[0]["aliases"]) == ["latest", "step4"]
    assert artifacts[0]["type"] == "model" and artifacts[0]["manifest"]["contents"][0]["path"].endswith("4.pt")
    assert sorted(of_type(halves[0], "artifact")[0]["aliases"]) == ["latest", "step2"]


def test_several_loggers_at_once(tmp_path):
    run = tmp_path / "run"
    summary = run_inprocess(run, "logger=[tensorboard,csv]", steps=4, eval_interval=2)
    assert summary["status"] == "finished" and summary["wandb"] is None
    with open(run / "metrics.csv", newline="") as fh:
        table = list(csv.DictReader(fh))
    evals = [(int(r["step"]), float(r["val/loss"])) for r in table if r["val/loss"]]
    jsonl = [
        (r["step"], r["val/loss"])
        for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
        if "val/loss" in r
    ]
    assert [s for s, _ in evals] == [s for s, _ in jsonl] == [0, 2, 4]
    assert [v for _, v in evals] == pytest.approx([v for _, v in jsonl], rel=1e-12)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    val = [(e.step, e.value) for e in events.Scalars("val/loss")]
    assert [s for s, _ in val] == [0, 2, 4] and [v for _, v in val] == pytest.approx([v for _, v in jsonl], rel=1e-6)
    assert {"tokens", "wall_s", "train/loss"} <= set(events.Tags()["scalars"])


def test_a_logger_that_fails_to_start_does_not_stop_training(tmp_path, caplog):
    run = tmp_path / "run"
    run.mkdir()
    (run / "blocker").write_text("a file where the TensorBoard folder should go")
    summary = run_inprocess(
        run, "logger=[tensorboard,csv]", "logger.tensorboard.log_dir=blocker/tb", steps=2, eval_interval=2
    )
    assert summary["status"] == "finished"
    assert "tensorboard" in caplog.text and "disabled" in caplog.text
    assert (run / "metrics.csv").read_text().count("\n") >= 2  # the other logger went on

"""Metric sinks: local files, W&B offline read back through `wandb leet inspect`, progress lines, isolation."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path

import pytest
import torch
import yaml

from gptlab.errors import ConfigError
from gptlab.sinks import Sink
from gptlab.sinks.jsonl import JsonlSink
from gptlab.sinks.progress import ProgressSink, format_duration
from gptlab.sinks.safe import SafeSink
from gptlab.sinks.wandb import RUN_ID_FILE, WandbSink, api_key_configured, resolve_mode
from helpers.wandb_read import history, inspect_records, of_type

CONF_LOGGER = Path(__file__).resolve().parents[1] / "conf" / "logger"


def rows_of(run_dir: Path) -> list[dict]:
    """Every line of metrics.jsonl parsed (a torn line would fail the test)."""
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


# ---------------------------------------------------------------- JsonlSink
def test_jsonl_lines_are_flushed_and_summary_is_merged(tmp_path):
    sink = JsonlSink(tmp_path, resume=False)
    assert isinstance(sink, Sink)
    sink.log({"train/loss": torch.tensor(2.5), "lr": 1e-3, "tokens": 512}, step=1)
    sink.log({"val/loss": float("nan"), "val/acc": 0.25}, step=2)
    # readable before close: each line is flushed as it is written
    assert rows_of(tmp_path) == [
        {"step": 1, "train/loss": 2.5, "lr": 1e-3, "tokens": 512},
        {"step": 2, "val/loss": None, "val/acc": 0.25},
    ]
    sink.summary({"final_val_loss": 2.0, "choices": {"attention": "gqa"}, "status": "running"})
    sink.summary({"final_val_loss": 1.5, "steps": 2})
    sink.close("finished")
    sink.close("failed")  # second close is a no-op
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary == {"final_val_loss": 1.5, "steps": 2, "choices": {"attention": "gqa"}, "status": "finished"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl", "summary.json"]  # no temp files left
    with pytest.raises(RuntimeError, match="closed"):
        sink.log({"lr": 1.0}, step=3)


def test_jsonl_resume_truncates_and_continues_the_same_curve(tmp_path):
    first = JsonlSink(tmp_path)
    for step in range(1, 9):
        first.log({"train/loss": 10.0 - step}, step)
    first.summary({"best_val_loss": 3.0})
    # killed mid-write: a torn last line must not break the resumed file
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 9, "train/lo')

    resumed = JsonlSink(tmp_path, resume=True)
    assert resumed.truncate_after(5) == 5
    for step in (6, 7):
        resumed.log({"train/loss": 100.0 + step}, step)
    resumed.close()
    rows = rows_of(tmp_path)
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6, 7]
    assert rows[4]["train/loss"] == 5.0 and rows[5]["train/loss"] == 106.0
    assert json.loads((tmp_path / "summary.json").read_text()) == {"best_val_loss": 3.0, "status": "finished"}


def test_jsonl_fresh_start_drops_stale_files(tmp_path):
    old = JsonlSink(tmp_path)
    old.log({"lr": 1.0}, 1)
    old.close("failed")
    fresh = JsonlSink(tmp_path, resume=False)
    assert (tmp_path / "metrics.jsonl").read_text() == ""
    assert not (tmp_path / "summary.json").exists()
    fresh.close()


# ---------------------------------------------------------------- WandbSink (offline, read back)
def test_a_resume_logs_each_step_to_wandb_once(tmp_path):
    """An attempt logs steps 5-20 and stops; its checkpoint was at step 10, so the resume redoes 15 and 20. W&B keeps
    what was logged (each offline start is a folder `wandb sync` replays), so the W&B run held steps 15 and 20
    twice, beside metrics.jsonl's once. The resume now leaves W&B's steps alone and logs from 25 on."""
    first = WandbSink(tmp_path, mode="offline")
    for step in (5, 10, 15, 20):
        first.log({"train/loss": 4.0 - step / 10}, step)
    first.close("preempted")
    again = WandbSink(tmp_path, mode="offline", resumed=True)
    again.truncate_after(10)  # what the loop calls on a resume from step 10
    for step in (15, 20, 25, 30):
        again.log({"train/loss": 4.01 - step / 10}, step)
    again.close("finished")
    steps = [h["step"] for folder in again.offline_folders() for h in history(inspect_records(folder))]
    assert steps == [5, 10, 15, 20, 25, 30]
    fresh = WandbSink(tmp_path, mode="offline")  # a fresh start in the dir: a new W&B run, every row its own
    fresh.truncate_after(-1)
    fresh.log({"train/loss": 9.0}, 5)
    fresh.close("finished")
    assert [h["step"] for h in history(inspect_records(fresh.run_dir_path))] == [5]


def test_every_offline_folder_of_a_run_is_found_in_start_order(tmp_path):
    """A start in the same second as the last one gets W&B's numbered folder `offline-run-<time>-<id>-1`; the glob
    `offline-run-*-<id>` missed it, so `wandb sync` and summary.json's folders left that attempt's rows out (seen
    when a test resumed within the second)."""
    from gptlab.sinks.wandb import offline_folders

    names = [
        "offline-run-20261129_210704-abcd1234",
        "offline-run-20261129_210703-abcd1234-1",
        "offline-run-20261129_210703-abcd1234",
        "offline-run-20261129_210703-abcd1234-2",
        "offline-run-20261129_210703-other999",
        "offline-run-20261129_210703-xabcd1234",
    ]
    for name in names:
        (tmp_path / name).mkdir()
    assert [p.name for p in offline_folders(tmp_path, "abcd1234")] == [
        "offline-run-20261129_210703-abcd1234",
        "offline-run-20261129_210703-abcd1234-1",
        "offline-run-20261129_210703-abcd1234-2",
        "offline-run-20261129_210704-abcd1234",
    ]


def test_wandb_offline_round_trip_and_run_id_reuse(tmp_path):
    config = {"seed": 3, "model": {"n_layer": 2, "d_model": 64}, "train": {"max_steps": 30}}
    sink = WandbSink(
        tmp_path,
        config=config,
        project="gptlab-test",
        group="sweep-a",
        name="gqa-s3",
        tags=["attention=gqa", "mlp=gelu", "attention=gqa"],
        mode="offline",
    )
    assert sink.mode == "offline"
    run_id = (tmp_path / RUN_ID_FILE).read_text().strip()
    assert sink.run_id == run_id and sink.run_dir_path.parent == tmp_path / "wandb"
    assert sink.sync_command == f"wandb sync {sink.run_dir_path}"
    losses = {10: 4.0, 20: 3.25, 30: 2.5}
    for step, loss in losses.items():
        sink.log({"train/loss": loss, "lr": 1e-3}, step)
    sink.log({"val/loss": 2.75}, 30)
    sink.summary({"final_val_loss": 2.75, "steps": 30})
    sink.close("finished")
    first_folder = sink.run_dir_path

    records = inspect_records(first_folder)
    run = of_type(records, "run")[0]
    assert run["run_id"] == run_id and run["run_group"] == "sweep-a" and run["display_name"] == "gqa-s3"
    assert run["tags"] == ["attention=gqa", "mlp=gelu"] and run["project"] == "gptlab-test"
    assert {k: v for k, v in run["config"]["update"].items() if k != "_wandb"} == config
    history = [h["item"] for h in of_type(records, "history")]
    assert [(h["step"], h.get("train/loss")) for h in history] == [(10, 4.0), (20, 3.25), (30, 2.5), (30, None)]
    assert history[-1]["val/loss"] == 2.75
    assert {"glob_name": "*", "step_metric": "step"}.items() <= of_type(records, "metric")[-1].items()
    summary = {}
    for update in of_type(records, "summary"):
        summary.update(update.get("update", {}))
    assert summary["final_val_loss"] == 2.75 and summary["steps"] == 30
    assert of_type(records, "exit")[-1]["exit_code"] == 0

    # a resumed/requeued job in the same run dir continues the same W&B run
    again = WandbSink(tmp_path, config=config, group="sweep-a", mode="offline", resumed=True)
    assert again.run_id == run_id and again.run_dir_path != first_folder
    again.log({"train/loss": 2.0}, 40)
    again.close("failed")
    records = inspect_records(again.run_dir_path)
    assert of_type(records, "run")[0]["run_id"] == run_id
    # opened with resume="allow" (recorded as resume: true): online, W&B reopens the run id instead of refusing it
    assert of_type(records, "run")[0].get("resume") is True
    assert [h["item"]["step"] for h in of_type(records, "history")] == [40]
    assert of_type(records, "exit")[-1]["exit_code"] == 1


def test_a_fresh_start_in_a_dir_with_an_old_wandb_id_opens_a_new_wandb_run(tmp_path):
    """An attempt killed before its first checkpoint leaves wandb_run_id; the next start is fresh (metrics.jsonl
    starts afresh), and reusing the id mixed the old attempt's rows into the new run and its sync command."""
    old = WandbSink(tmp_path, config={"optimizer": {"lr": 0.01}}, mode="offline")
    old.log({"train/loss": 9.0}, 1)
    old.close("failed")
    new = WandbSink(tmp_path, config={"optimizer": {"lr": 0.001}}, mode="offline")
    assert new.run_id != old.run_id and (tmp_path / RUN_ID_FILE).read_text().strip() == new.run_id
    assert new.offline_folders() == [new.run_dir_path] and new.sync_command == f"wandb sync {new.run_dir_path}"
    new.close("finished")


def test_a_pruned_run_finishes_its_wandb_run_as_a_success(tmp_path):
    """A tune pruner stops a run on purpose: W&B shows it finished (exit 0) with status "pruned", not failed."""
    sink = WandbSink(tmp_path, config={"a": 1}, mode="offline")
    sink.log({"val/loss": 4.0}, 2)
    sink.summary({"status": "pruned", "pruned_at_step": 2})
    sink.close("pruned")
    records = inspect_records(sink_dir := next((tmp_path / "wandb").glob("offline-run-*")))
    assert of_type(records, "exit")[-1]["exit_code"] == 0, sink_dir
    summary = {}
    for update in of_type(records, "summary"):
        summary.update(update.get("update", {}))
    assert summary["status"] == "pruned" and summary["pruned_at_step"] == 2


def test_wandb_disabled_mode_is_a_no_op(tmp_path):
    sink = WandbSink(tmp_path, config={"a": 1}, mode="disabled")
    sink.log({"train/loss": 1.0}, 1)
    sink.summary({"x": 1})
    sink.close()
    assert sink.run is None and sink.run_dir_path is None and not any(tmp_path.iterdir())


def test_wandb_start_failure_degrades_with_one_warning(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    modes = []

    def broken_init(self, mode, init_args):
        modes.append(mode)
        raise OSError("network is unreachable\nsecond line")

    monkeypatch.setattr(WandbSink, "_init", broken_init)
    with caplog.at_level(logging.WARNING, logger="gptlab.sinks"):
        sink = WandbSink(tmp_path, config={}, mode="online")
    assert modes == ["online", "offline"] and sink.mode == "disabled" and sink.run is None
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2 and "logging offline instead" in messages[0] and "W&B disabled" in messages[1]
    assert all("\n" not in m and "network is unreachable second line" in m for m in messages)
    sink.log({"train/loss": 1.0}, 1)
    sink.close()


# ---------------------------------------------------------------- mode resolution
def test_mode_auto_without_key_is_offline(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("NETRC", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc here
    assert not api_key_configured()
    assert resolve_mode("auto") == "offline"
    sink = WandbSink(tmp_path / "run", config={"a": 1}, mode="auto")
    assert sink.mode == "offline" and sink.run.settings.mode == "offline"
    sink.close()


def test_mode_resolution_rules(tmp_path):
    netrc_file = tmp_path / "netrc"
    netrc_file.write_text("machine api.wandb.ai\n  login user\n  password " + "a" * 40 + "\n")
    empty = {"HOME": str(tmp_path)}
    assert resolve_mode("auto", {**empty, "WANDB_API_KEY": "x" * 40}) == "online"
    assert resolve_mode("auto", {**empty, "NETRC": str(netrc_file)}) == "online"
    assert (
        resolve_mode("auto", {**empty, "NETRC": str(netrc_file), "WANDB_BASE_URL": "https://wb.example"}) == "offline"
    )
    assert resolve_mode("auto", {**empty, "WANDB_API_KEY": "x" * 40, "WANDB_MODE": "disabled"}) == "disabled"
    assert resolve_mode("auto", {**empty, "WANDB_MODE": "dryrun"}) == "offline"
    assert resolve_mode("offline", {**empty, "WANDB_API_KEY": "x" * 40}) == "offline"
    with pytest.raises(ConfigError) as err:
        resolve_mode("online", empty)
    assert "logger.wandb.mode=online" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(
        ConfigError, match=r"logger.wandb.mode=.cloud. is not valid; allowed: auto, online, offline, disabled"
    ):
        resolve_mode("cloud", empty)


# ---------------------------------------------------------------- SafeSink
class Recorder:
    def __init__(self):
        self.rows, self.summaries, self.closed = [], [], []

    def log(self, metrics, step):
        self.rows.append((step, dict(metrics)))

    def summary(self, values):
        self.summaries.append(dict(values))

    def close(self, status="finished"):
        self.closed.append(status)


class Exploding(Recorder):
    def log(self, metrics, step):
        super().log(metrics, step)
        raise ConnectionError("upload failed:\n  503")


def test_safe_sink_warns_once_and_other_sinks_continue(caplog):
    bad, good = Exploding(), Recorder()
    sinks = [SafeSink(bad, "wandb"), SafeSink(good, "jsonl")]
    with caplog.at_level(logging.WARNING, logger="gptlab.sinks"):
        for step in (1, 2, 3):
            for s in sinks:
                s.log({"train/loss": float(step)}, step)
        for s in sinks:
            s.summary({"steps": 3})
            s.close("finished")
    assert [r.getMessage() for r in caplog.records] == [
        "logging sink 'wandb' disabled after log() failed: ConnectionError: upload failed: 503"
    ]
    assert [step for step, _ in bad.rows] == [1] and bad.summaries == [] and bad.closed == []
    assert [step for step, _ in good.rows] == [1, 2, 3] and good.summaries == [{"steps": 3}]
    assert good.closed == ["finished"] and sinks[0].disabled and not sinks[1].disabled
    assert sinks[1].rows is good.rows  # extras of the inner sink stay reachable


# ---------------------------------------------------------------- ProgressSink
def test_progress_plain_lines_for_logs():
    out, now = io.StringIO(), [100.0]
    bar = ProgressSink(total_steps=100, stream=out, interval_s=10.0, clock=lambda: now[0])
    assert bar.tty is False  # StringIO is not a terminal
    for step in range(1, 101):
        now[0] += 0.5  # 0.5 s per step
        metrics = {"train/loss": 5.0 - step / 50, "perf/tokens_per_s": 4100.0, "perf/step_ms": 500.0}
        if step == 50:
            metrics["val/loss"] = 4.2
        bar.log(metrics, step)
    bar.close("finished")
    lines = out.getvalue().splitlines()
    # first row, then every 10 s (20 steps) counted from the last printed line (the eval row too), last step
    assert [int(l.split()[1].split("/")[0]) for l in lines] == [1, 21, 41, 50, 70, 90, 100]
    assert lines[0] == "step 1/100 | loss 4.98 | 4,100 tok/s | eta 50s"
    assert lines[3] == "step 50/100 | loss 4 | val 4.2 | 4,100 tok/s | eta 25s"
    assert lines[-1].startswith("step 100/100 | loss 3 | val 4.2 |") and lines[-1].endswith("eta 0s")


def test_progress_close_prints_last_row_and_failure_status():
    out, now = io.StringIO(), [100.0]
    bar = ProgressSink(total_steps=1000, stream=out, interval_s=60.0, clock=lambda: now[0])
    for step in (1, 2, 3):
        now[0] += 1.0
        bar.log({"train/loss": 2.0}, step)
    bar.close("failed")
    assert out.getvalue().splitlines() == [
        "step 1/1000 | loss 2",
        "step 3/1000 | loss 2 | eta 16m37s",
        "stopped at step 3/1000: failed",
    ]


def test_progress_stop_line_reports_the_steps_the_run_completed_not_the_last_logged():
    """A run preempted at step 48 with log_interval 10 last logged step 40; its stop line says 48 (where its
    checkpoint is), while the last progress row keeps step 40's figures under step 40."""
    out = io.StringIO()
    bar = ProgressSink(total_steps=500, stream=out, interval_s=0.0, clock=lambda: 0.0)
    bar.log({"train/loss": 2.0}, 40)
    bar.summary({"steps": 48, "status": "preempted"})
    bar.close("preempted")
    lines = out.getvalue().splitlines()
    assert lines[-1] == "stopped at step 48/500: preempted"
    assert all(line.startswith("step 40/500") for line in lines[:-1])


def test_progress_tty_mode_uses_a_bar_and_keeps_eval_lines():
    out = io.StringIO()
    bar = ProgressSink(total_steps=4, stream=out, tty=True)
    for step in range(1, 5):
        bar.log({"train/loss": 1.0, **({"val/loss": 0.5} if step == 2 else {})}, step)
    bar.close()
    assert "step 2/4 | loss 1 | val 0.5" in out.getvalue()


def test_format_duration():
    assert [format_duration(s) for s in (0, 45.4, 72, 3600 + 180)] == ["0s", "45s", "1m12s", "1h03m"]


# ---------------------------------------------------------------- conf/logger wiring
def test_logger_configs_build_sinks(tmp_path):
    from hydra.utils import instantiate

    choices = sorted(p.stem for p in CONF_LOGGER.glob("*.yaml"))
    assert {"none", "wandb"} <= set(choices)
    runtime = dict(config={"seed": 1}, name="run", group="default", tags=["norm=rmsnorm"], resumed=False)
    assert (CONF_LOGGER / "none.yaml").read_text().startswith("# @package _global_")  # selects no logger at all
    assert (CONF_LOGGER / "wandb.yaml").read_text().startswith("# @package logger.wandb")  # one key per logger
    cfg = yaml.safe_load((CONF_LOGGER / "wandb.yaml").read_text())
    assert cfg["mode"] == "auto" and cfg["project"] is None and cfg["group"] is None and cfg["tags"] == []
    sink = instantiate(cfg)(run_dir=tmp_path / "b", **runtime)
    assert isinstance(sink, WandbSink) and sink.mode == "offline"  # the test env has WANDB_MODE=offline, no key
    assert sink.project == "gptlab"  # project: null and no WANDB_PROJECT
    sink.close()
    assert (tmp_path / "b" / RUN_ID_FILE).read_text().strip() == sink.run_id


def test_an_empty_wandb_mode_variable_counts_as_unset(tmp_path, monkeypatch):
    """WANDB_MODE= (set but empty, e.g. by a job script) is no mode: auto resolves and the run starts offline."""
    monkeypatch.setenv("WANDB_MODE", "")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    sink = WandbSink(tmp_path / "run", config={"seed": 1}, mode="auto")
    assert sink.mode == "offline" and sink.run is not None  # wandb's own Settings refuse an empty mode
    sink.log({"train/loss": 1.5}, 1)
    sink.close()
    assert [h["item"]["train/loss"] for h in of_type(inspect_records(sink.run_dir_path), "history")] == [1.5]

"""TensorBoard and CSV sinks: event files and CSV text read back, resume truncation, write failures."""

from __future__ import annotations

import logging
import math
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from tensorboard.backend.event_processing import event_accumulator, plugin_event_accumulator
from tensorboard.summary.writer import event_file_writer

from gptlab.sinks import Sink
from gptlab.sinks.csv import CsvSink
from gptlab.sinks.safe import SafeSink
from gptlab.sinks.tensorboard import TensorboardSink, markdown_table


def scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar tag -> [(step, value)] as TensorBoard's event reader sees it (purges applied)."""
    acc = event_accumulator.EventAccumulator(str(log_dir), size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def texts(log_dir: Path) -> dict[str, list[tuple[int, str]]]:
    """add_text tag -> [(step, markdown)], read like the TensorBoard server does (purges applied)."""
    acc = plugin_event_accumulator.EventAccumulator(str(log_dir), size_guidance={"tensors": 0})
    acc.Reload()
    tags = acc.PluginTagToContent("text")  # stored as "<tag>/text_summary"
    read = {tag: [(e.step, e.tensor_proto.string_val[0].decode()) for e in acc.Tensors(tag)] for tag in tags}
    return {tag.removesuffix("/text_summary"): rows for tag, rows in read.items()}


# ---------------------------------------------------------------- TensorboardSink
def test_tensorboard_scalars_config_and_summary_read_back(tmp_path):
    config = {"choice/attention": "gqa", "model.n_layer": 2, "optimizer.lr": 0.001, "name": "a|b"}
    sink = TensorboardSink(tmp_path, config=config, name="ignored", group="g", tags=["t"], resumed=False)
    assert isinstance(sink, Sink)
    sink.truncate_after(-1)  # what the loop does for a fresh run
    for step in range(0, 30, 10):
        sink.log({"train/loss": torch.tensor(4.0 - step / 10), "lr": np.float32(0.5), "note": "skip me"}, step)
    sink.log({"val/loss": 2.25, "tokens": 640, "step": 99}, step=20)
    sink.summary({"final_val_loss": 2.25, "choices": {"attention": "gqa"}, "git_dirty": False})
    sink.summary({"params": 1234})
    sink.close("finished")
    sink.close("failed")  # a second close does nothing

    got = scalars(tmp_path / "tensorboard")
    assert got == {
        "train/loss": [(0, 4.0), (10, 3.0), (20, 2.0)],
        "lr": [(0, 0.5), (10, 0.5), (20, 0.5)],
        "val/loss": [(20, 2.25)],
        "tokens": [(20, 640.0)],
        "summary/final_val_loss": [(20, 2.25)],
        "summary/params": [(20, 1234.0)],
    }
    text = texts(tmp_path / "tensorboard")
    assert text["config"] == [(0, markdown_table(config))]
    assert text["config"][0][1].splitlines() == [
        "| key | value |",
        "|---|---|",
        "| choice/attention | gqa |",
        "| model.n_layer | 2 |",
        "| name | a\\|b |",
        "| optimizer.lr | 0.001 |",
    ]
    assert text["summary"] == [
        (20, "| key | value |\n|---|---|\n| choices.attention | gqa |\n| git_dirty | False |\n| status | finished |")
    ]


def test_tensorboard_hparams_read_back(tmp_path):
    """The HParams dashboard gets the run's choices and key settings against its final numbers (read back with
    TensorBoard's own reader and the hparams plugin's protobufs)."""
    from tensorboard.plugins.hparams import metadata

    config = {"choice/attention": "gqa", "choice/logger": "tensorboard", "optimizer.lr": 0.001, "seed": 1, "x": 5}
    sink = TensorboardSink(tmp_path, config=config)
    sink.log({"train/loss": 3.0}, 10)
    sink.summary({"final_val_loss": 2.5, "params": 1234, "choices": {"mlp": "swiglu"}, "status": "finished"})
    sink.close("finished")

    acc = plugin_event_accumulator.EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"tensors": 0})
    acc.Reload()
    content = acc.PluginTagToContent(metadata.PLUGIN_NAME)
    start = metadata.parse_session_start_info_plugin_data(content[metadata.SESSION_START_INFO_TAG])
    got = {k: (v.string_value or v.number_value) for k, v in start.hparams.items()}
    assert got == {"choice/attention": "gqa", "choice/mlp": "swiglu", "optimizer.lr": 0.001, "seed": 1}
    experiment = metadata.parse_experiment_plugin_data(content[metadata.EXPERIMENT_TAG])
    tags = {m.name.tag for m in experiment.metric_infos}
    assert tags == {"summary/final_val_loss", "summary/params"}
    assert {t: v for t, v in scalars(tmp_path / "tensorboard").items() if t in tags} == {
        "summary/final_val_loss": [(10, 2.5)],
        "summary/params": [(10, 1234.0)],
    }  # the metric values HParams shows are these scalars


def test_tensorboard_non_finite_values_are_logged_as_they_are(tmp_path):
    sink = TensorboardSink(tmp_path, log_dir="tb", flush_secs=5)
    sink.log({"train/loss": float("nan")}, 1)
    sink.log({"train/loss": float("inf")}, 2)
    sink.log({"train/loss": 1.5}, 3)
    sink.close()
    (s1, nan), (s2, inf), last = scalars(tmp_path / "tb")["train/loss"]
    assert (s1, s2, last) == (1, 2, (3, 1.5))
    assert math.isnan(nan) and inf == math.inf
    assert not (tmp_path / "tensorboard").exists()  # log_dir is honoured


def test_tensorboard_resume_hides_the_stale_tail(tmp_path, monkeypatch):
    # the 10th and 11th writers of a process in one second name their files "...9" and "...10", which
    # sort the wrong way round: the sink must make the resumed file sort last all the same
    monkeypatch.setattr(event_file_writer, "_global_uid", event_file_writer.AtomicCounter(9))
    log_dir = tmp_path / "tensorboard"
    first = TensorboardSink(tmp_path, config={"train.max_steps": 10})
    first.truncate_after(-1)
    for step in range(11):
        first.log({"train/loss": 10.0 - step, "val/loss": 20.0 - step}, step)
    first.summary({"final_val_loss": 10.0})
    first.close("preempted")

    second = TensorboardSink(tmp_path, config={"train.max_steps": 12}, resumed=True)
    second.truncate_after(5)  # the checkpoint was at step 5: steps 6.. are redone
    for step in range(6, 9):
        second.log({"train/loss": 100.0 + step}, step)
    second.summary({"final_val_loss": 3.5})
    second.close("finished")

    assert len(list(log_dir.glob("events.out.tfevents.*"))) == 2  # resume keeps the first file
    got = scalars(log_dir)
    assert got["train/loss"] == [(s, 10.0 - s) for s in range(6)] + [(6, 106.0), (7, 107.0), (8, 108.0)]
    assert got["val/loss"] == [(s, 20.0 - s) for s in range(6)]  # nothing from the old 6..10
    assert got["summary/final_val_loss"] == [(8, 3.5)]  # the old run's summary at step 10 is purged
    text = texts(log_dir)
    assert [step for step, _ in text["config"]] == [0, 6]
    assert "| train.max_steps | 12 |" in text["config"][1][1]
    assert text["summary"] == [(8, "| key | value |\n|---|---|\n| status | finished |")]


def test_tensorboard_fresh_start_deletes_old_event_files(tmp_path):
    old = TensorboardSink(tmp_path)
    old.log({"train/loss": 9.0}, 7)
    old.close()
    new = TensorboardSink(tmp_path, resumed=False)
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*")) == []
    new.log({"train/loss": 1.0}, 0)
    new.close()
    assert scalars(tmp_path / "tensorboard") == {"train/loss": [(0, 1.0)]}


def test_tensorboard_write_failure_raises_out_and_safe_sink_warns_once(tmp_path, caplog):
    # tests run as root, which ignores read-only permissions: a file where the folder should be stands in
    (tmp_path / "tensorboard").write_text("not a folder")
    with pytest.raises(OSError):
        TensorboardSink(tmp_path).log({"train/loss": 1.0}, 0)
    safe = SafeSink(TensorboardSink(tmp_path), "tensorboard")
    with caplog.at_level(logging.WARNING, logger="gptlab.sinks"):
        for step in range(3):
            safe.log({"train/loss": 1.0}, step)
        safe.close()
    assert safe.disabled and len(caplog.records) == 1
    assert "'tensorboard' disabled after log() failed" in caplog.records[0].getMessage()


# ---------------------------------------------------------------- CsvSink
def test_csv_header_grows_and_rows_append(tmp_path):
    sink = CsvSink(tmp_path, config={"ignored": 1}, name="n", resumed=False)
    assert isinstance(sink, Sink)
    path = tmp_path / "metrics.csv"
    assert path.read_text() == "step\n"
    sink.log({"train/loss": torch.tensor(2.5), "lr": 0.001}, 0)
    inode = path.stat().st_ino
    sink.log({"train/loss": 2.0, "lr": np.float64(0.0005)}, 1)
    assert path.stat().st_ino == inode  # same columns: appended, not rewritten
    sink.log({"val/loss": float("nan"), "note": "a,b", "ok": True, "step": 99}, 2)
    assert path.stat().st_ino != inode  # new columns: atomic rewrite
    sink.log({"train/loss": float("-inf"), "tokens": 1536}, 3)
    sink.summary({"final_val_loss": 1.0})  # summary.json's job: nothing here
    sink.close()
    sink.close()
    assert path.read_text() == (
        "step,train/loss,lr,val/loss,note,ok,tokens\n"
        "0,2.5,0.001,,,,\n"
        "1,2.0,0.0005,,,,\n"
        '2,,,nan,"a,b",true,\n'
        "3,-inf,,,,,1536\n"
    )
    assert list(tmp_path.glob(".*.tmp")) == []


def test_csv_one_row_per_step_train_and_eval_merged(tmp_path):
    """The loop logs a step's train metrics, then its eval metrics: one CSV row holds both (no half-empty twins)."""
    sink = CsvSink(tmp_path)
    sink.log({"train/loss": 3.0, "lr": 0.1}, 10)
    sink.log({"val/loss": 2.5}, 10)  # same step, new column: the row is completed, not duplicated
    sink.log({"train/loss": 2.0, "lr": 0.1}, 11)
    sink.log({"train/loss": 1.5, "lr": 0.1}, 12)
    sink.log({"val/loss": 1.25}, 12)  # same step, known column
    sink.close()
    assert (tmp_path / "metrics.csv").read_text() == (
        "step,train/loss,lr,val/loss\n10,3.0,0.1,2.5\n11,2.0,0.1,\n12,1.5,0.1,1.25\n"
    )
    again = CsvSink(tmp_path, resumed=True)  # a resumed sink completes the last row it read back too
    again.log({"diag/x": 7}, 12)
    again.close()
    assert (tmp_path / "metrics.csv").read_text().splitlines()[-1] == "12,1.5,0.1,1.25,7"


def test_csv_of_a_real_run_has_one_row_per_logged_step(tmp_path):
    from helpers.train import rows, run_inprocess

    run_inprocess(tmp_path, "logger=csv", steps=6, eval_interval=3)
    table = (tmp_path / "metrics.csv").read_text().splitlines()
    header, steps = table[0].split(","), [line.split(",")[0] for line in table[1:]]
    assert steps == sorted(set(steps), key=int)  # each step once
    assert steps == [str(s) for s in sorted({r["step"] for r in rows(tmp_path)})]
    at3 = dict(zip(header, table[1 + steps.index("3")].split(",")))
    assert at3["train/loss"] and at3["val/loss"]  # step 3 trained and evaluated: both in one row


def test_csv_resume_truncates_and_continues(tmp_path):
    first = CsvSink(tmp_path, filename="m.csv")
    for step in range(11):
        first.log({"train/loss": 10.0 - step, **({"val/loss": 1.0 * step} if step % 5 == 0 else {})}, step)
    first.log({"late": 1}, 11)
    first.close()
    path = tmp_path / "m.csv"
    with open(path, "a") as f:
        f.write("12,0.5,")  # a row torn by a kill mid-append

    second = CsvSink(tmp_path, filename="m.csv", resumed=True)
    assert second.truncate_after(5) == 6
    second.log({"train/loss": 100.0}, 6)
    second.close()
    assert path.read_text() == (
        "step,train/loss,val/loss\n"  # "late" only appeared after step 5: dropped with its rows
        "0,10.0,0.0\n1,9.0,\n2,8.0,\n3,7.0,\n4,6.0,\n5,5.0,5.0\n"
        "6,100.0,\n"
    )


def test_csv_fresh_start_and_truncate_to_nothing(tmp_path):
    old = CsvSink(tmp_path)
    old.log({"train/loss": 1.0}, 3)
    old.close()
    assert CsvSink(tmp_path).columns == ["step"] and (tmp_path / "metrics.csv").read_text() == "step\n"
    again = CsvSink(tmp_path, resumed=True)
    assert again.truncate_after(-1) == 0
    again.log({"lr": 0.1}, 0)
    again.close()
    assert (tmp_path / "metrics.csv").read_text() == "step,lr\n0,0.1\n"


def test_csv_write_failure_raises_out(tmp_path, caplog):
    # root ignores read-only permissions: the run dir replaced by a file makes the next rewrite fail
    run_dir = tmp_path / "run"
    sink = CsvSink(run_dir)
    sink.log({"train/loss": 1.0}, 0)
    shutil.rmtree(run_dir)
    run_dir.write_text("not a folder")
    with pytest.raises(OSError):
        sink.log({"train/loss": 0.5, "val/loss": 0.7}, 1)
    with pytest.raises(OSError):
        CsvSink(run_dir)
    safe = SafeSink(CsvSink(tmp_path / "ok"), "csv")
    (tmp_path / "ok").rename(tmp_path / "moved")
    (tmp_path / "ok").write_text("in the way")
    with caplog.at_level(logging.WARNING, logger="gptlab.sinks"):
        safe.log({"a": 1.0}, 0)
        safe.log({"a": 2.0}, 1)
    assert safe.disabled and len(caplog.records) == 1 and "'csv' disabled after log() failed" in caplog.text


FULL_DISK = """
import resource, signal, sys
from gptlab.sinks.csv import CsvSink
sink = CsvSink(sys.argv[1])
sink.log({"train/loss": 1.0}, 0)
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # past the limit, write() fails with EFBIG, like ENOSPC
soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
resource.setrlimit(resource.RLIMIT_FSIZE, (sink.path.stat().st_size + 20, hard))
try:
    for step in range(1, 100):
        sink.log({"train/loss": 0.123456789}, step)
except OSError as err:
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    print(err)
"""


def test_csv_failed_append_keeps_whole_rows_and_names_the_file(tmp_path):
    # a subprocess, so the file size limit cannot touch pytest's own files
    done = subprocess.run(
        [sys.executable, "-c", FULL_DISK, str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
        timeout=60,
    )
    path = tmp_path / "metrics.csv"
    assert done.stdout == f"[Errno 27] cannot append to the CSV file (File too large): '{path}'\n", done.stderr
    assert path.read_text() == "step,train/loss\n0,1.0\n1,0.123456789\n"  # the torn third row is cut off

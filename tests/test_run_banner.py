"""A run's first line says where and how it computes: device, dtype and why (the user's key or what auto found),
threads and where that count came from, and the machine's load at start."""

from __future__ import annotations

import os
import re

import pytest

from gptlab.runtime import cpu_load
from gptlab.runtime.hardware import cpu_has_bf16, dtype_reason
from helpers.cli import run_cli
from helpers.train import FAST, train_env


def test_dtype_reason_names_the_key_or_what_auto_found():
    assert dtype_reason("cpu", "fp32", "fp32") == "hardware.dtype"
    assert dtype_reason("cpu", "bf16", "auto") == "auto: this CPU multiplies bf16 natively (avx512_bf16/amx)"
    assert dtype_reason("cpu", "fp32", "auto").startswith("auto: this CPU has no native bf16")
    assert dtype_reason("cuda:0", "fp16", "auto") == "auto: no native bf16 on this GPU"


@pytest.mark.parametrize(("load", "busy"), [(0.4, False), (1.5, True)])
def test_load_at_start_reads_the_load_average_per_core(monkeypatch, load, busy):
    monkeypatch.setattr(cpu_load.os, "getloadavg", lambda: (load, 0.0, 0.0))
    monkeypatch.setattr(cpu_load.os, "cpu_count", lambda: 2)
    text = cpu_load.load_at_start()
    assert text.startswith(f"machine load {load:.2f} over the last minute on 2 cores")
    assert text.endswith("other processes will slow this run") is busy


def test_a_runs_first_line_says_device_dtype_why_threads_and_load(tmp_path):
    run_dir = tmp_path / "run"
    args = [a for a in FAST if not a.startswith("hardware.dtype")]
    proc = run_cli(
        "gptlab.cli.train", *args, "hardware.dtype=auto", "train.max_steps=1", f"hydra.run.dir={run_dir}",
        env=train_env(), timeout=180,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    dtype = "bf16" if cpu_has_bf16() else "fp32"
    line = next(line for line in (run_dir / "train.log").read_text().splitlines() if "torch threads" in line)
    assert f"device cpu, dtype {dtype} ({dtype_reason('cpu', dtype, 'auto')}), 2 torch threads (" in line
    assert re.search(rf"machine load \d+\.\d\d over the last minute on {os.cpu_count()} cores", line), line

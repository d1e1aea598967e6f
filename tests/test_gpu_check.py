"""`make gpu-check` / `python -m benchmarks --gpu`: one line and exit 0 without CUDA; CUDA-only checks skip here."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import torch

from benchmarks import gpu
from helpers.cli import run_cli

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-CUDA path")
def test_gpu_check_without_cuda_says_so_in_one_line(tmp_path):
    docs = (REPO / "docs" / "GPU.md").read_text()
    # env: this process's as it is (not cli_env's OMP_NUM_THREADS=1 default), as a user runs a benchmark
    proc = run_cli("benchmarks", "--gpu", "--out", str(tmp_path), cwd=REPO, timeout=120, env=dict(os.environ))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.splitlines() == [
        f"gpu-check: no CUDA device here (torch {torch.__version__}); nothing measured, docs/GPU.md left as it is"
    ]
    assert not list(tmp_path.iterdir()) and (REPO / "docs" / "GPU.md").read_text() == docs


def test_makefile_target_and_placeholder_page():
    # the test may itself run under `make test ARGS=...`: keep the caller's make variables out
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS", "ARGS")}
    make = subprocess.run(
        ["make", "-s", "-n", "gpu-check", "ARGS="], cwd=REPO, capture_output=True, text=True, timeout=30, env=env
    )
    assert make.returncode == 0 and make.stdout.strip().endswith("-m benchmarks --gpu")
    page = (REPO / "docs" / "GPU.md").read_text()
    assert "Not yet measured on a GPU" in page or "Measured by" in page
    assert all(f"| {name} |" in page for name, _ in gpu.CHECKS)  # every check is described


def test_report_lists_every_check_with_device_and_date():
    doc = {
        "meta": {
            "command": "python -m benchmarks --gpu",
            "device": "NVIDIA H100 80GB HBM3",
            "count": 1,
            "date": "2026-01-01 00:00 UTC",
            "torch": "2.13.0",
            "cuda": "12.8",
        },
        "checks": {
            "device": {"ok": True, "detail": "x"},
            "ddp": {"ok": True, "skipped": True, "detail": "1 GPU"},
            "tf32_mfu": {"ok": False, "detail": "exit 1: a|b"},
        },
    }
    page = gpu.markdown(doc)
    assert "**NVIDIA H100 80GB HBM3**" in page and "2026-01-01 00:00 UTC" in page
    assert "| device | ok | x | this run |" in page and "| ddp | skipped | 1 GPU | this run |" in page
    assert "| tf32_mfu | **FAILED** | exit 1: a/b | this run |" in page


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_check_quick_on_this_gpu(tmp_path):
    proc = run_cli(
        "benchmarks", "--gpu", "--quick", "--out", str(tmp_path), cwd=REPO, timeout=3600, env=dict(os.environ)
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert torch.cuda.get_device_name(0) in (tmp_path / "GPU.md").read_text()

"""What a run was: code version, packages, hardware, command line (written to provenance.json)."""

from __future__ import annotations

import importlib.metadata as md
import os
import platform
import subprocess
import sys

import torch

import gptlab
from gptlab.runtime.peak import machine_name
from gptlab.util.paths import PACKAGE_DIR

PACKAGES = (
    "gptlab",
    "torch",
    "hydra-core",
    "omegaconf",
    "submitit",
    "wandb",
    "datasets",
    "tiktoken",
    "tokenizers",
    "numpy",
)


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(PACKAGE_DIR), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def code_diff() -> str | None:
    """`git diff HEAD` of the checkout the code runs from (tracked files), or None outside git or when clean."""
    return _git("diff", "HEAD", "--no-color") or None


def collect(overrides: list[str], hardware) -> dict:
    """Provenance record for the run directory."""
    versions: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            versions[name] = md.version(name)
        except md.PackageNotFoundError:
            versions[name] = None
    commit = _git("rev-parse", "HEAD")
    dirty = None if commit is None else bool(_git("status", "--porcelain", "--untracked-files=no"))
    return {
        "git": {"commit": commit, "dirty": dirty},
        "packages": versions,
        "python": sys.version.split()[0],
        "hardware": {
            "device": hardware.device,
            "dtype": hardware.dtype,
            "cpu": machine_name("cpu"),
            "cpu_threads": torch.get_num_threads(),
            "cpu_cores": sorted(os.sched_getaffinity(0)),  # this run's slot
            "machine_cores": os.cpu_count(),
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "platform": platform.platform(),
            "hostname": platform.node(),  # which machine of a cluster ran it (the timing session records its own)
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
            # forked from a warm interpreter (a local sweep's run) or a fresh one: a CPU run's peak memory differs
            "process_start": "forked" if gptlab.FORKED else "fresh",
        },
        "command": sys.argv,
        "overrides": overrides,
    }

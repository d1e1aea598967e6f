"""Atomic checkpoints in <run_dir>/checkpoints: write to a temp file, fsync, rename; load with weights_only."""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

import torch

from gptlab.errors import ConfigError

log = logging.getLogger(__name__)
KEEP = 2  # the newest two, so a corrupt newest file still leaves one to resume from
PATTERN = re.compile(r"step_(\d+)\.pt$")


def ckpt_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def save(run_dir: Path, step: int, state: dict) -> Path:
    """Write checkpoint `step` atomically (a reader never sees a half-written file) and prune old ones."""
    folder = ckpt_dir(run_dir)
    folder.mkdir(parents=True, exist_ok=True)
    final = folder / f"step_{step:07d}.pt"
    tmp = folder / f".step_{step:07d}.pt.tmp{os.getpid()}"
    with open(tmp, "wb") as fh:
        torch.save(state, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, final)
    dir_fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    for old in sorted(_listed(folder))[:-KEEP]:
        old[1].unlink(missing_ok=True)
    return final


def _listed(folder: Path) -> list[tuple[int, Path]]:
    out = []
    for path in folder.glob("step_*.pt"):
        m = PATTERN.search(path.name)
        if m:
            out.append((int(m.group(1)), path))
    return out


def load(path: Path) -> dict:
    """Load one checkpoint with weights_only=True (no code runs from the file)."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise ConfigError(f"train.resume: checkpoint '{path}' does not exist") from None
    except Exception as err:  # truncated zip, bad pickle opcodes, ...
        raise ConfigError(f"train.resume: checkpoint '{path}' is unreadable ({type(err).__name__}: {str(err).splitlines()[0][:120]})") from None


def load_latest(run_dir: Path) -> dict | None:
    """The newest readable checkpoint of a run dir (skipping corrupt ones with a warning), or None."""
    for _, path in sorted(_listed(ckpt_dir(run_dir)), reverse=True):
        try:
            return load(path)
        except ConfigError as err:
            log.warning("skipping %s", err)
    return None


def check_compatible(saved: dict, current: dict, source: str) -> None:
    """Refuse a checkpoint made for another model/tokenizer, naming the first mismatch in one line."""
    for key, want in current.items():
        have = saved.get(key)
        if have != want:
            raise ConfigError(f"train.resume: checkpoint {source} was made with {key}={have}, this run has {key}={want}; start a new run dir or use train.resume=never")

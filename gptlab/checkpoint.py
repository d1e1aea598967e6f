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
TMP_GLOB = ".step_*.pt.tmp*"  # a save in progress, or one a killed process left behind; never loaded


def ckpt_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


class _KeepWriteError:
    """File wrapper that remembers the OSError (disk full, ...) torch.save turns into an opaque RuntimeError."""

    def __init__(self, fh):
        self.fh, self.error = fh, None

    def write(self, data):
        try:
            return self.fh.write(data)
        except OSError as err:
            self.error = err
            raise

    def flush(self):
        self.fh.flush()


def save(run_dir: Path, step: int, state: dict) -> Path:
    """Write checkpoint `step` atomically (a reader never sees a half-written file) and prune old ones.

    A failed write (disk full, file size limit) removes its temp file, leaves the older checkpoints
    as they were and raises OSError naming the checkpoint.
    """
    folder = ckpt_dir(run_dir)
    folder.mkdir(parents=True, exist_ok=True)
    for stale in folder.glob(TMP_GLOB):  # left by a killed run; one writer per run dir (see cli/train.py)
        stale.unlink(missing_ok=True)
    final = folder / f"step_{step:07d}.pt"
    tmp = folder / f".step_{step:07d}.pt.tmp{os.getpid()}"
    try:
        with open(tmp, "wb") as fh:
            writer = _KeepWriteError(fh)
            try:
                torch.save(state, writer)
            except RuntimeError:
                if writer.error is None:
                    raise
                raise writer.error from None
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, final)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise OSError(err.errno, f"cannot write checkpoint ({err.strerror or err})", str(final)) from None
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


def latest_path(run_dir: Path) -> Path | None:
    """The newest checkpoint file of a run dir (readable or not), or None."""
    found = sorted(_listed(ckpt_dir(run_dir)))
    return found[-1][1] if found else None


def load(path: Path) -> dict:
    """Load one checkpoint with weights_only=True (no code runs from the file)."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise ConfigError(f"train.resume: checkpoint '{path}' does not exist") from None
    except Exception as err:  # truncated zip, bad pickle opcodes, a pickled call weights_only refuses, ...
        raise ConfigError(f"train.resume: checkpoint '{path}' is unreadable ({_reason(err)})") from None
    if not isinstance(state, dict) or "model" not in state or "step" not in state:
        raise ConfigError(f"train.resume: '{path}' is not a gptlab checkpoint (no model/step entries)")
    return state


def _reason(err: Exception) -> str:
    """The gist of a torch.load failure in a few words (torch's messages run to paragraphs)."""
    text = " ".join(str(err).split())
    if "WeightsUnpickler error:" in text:  # the file wants to run code: never a gptlab checkpoint
        text = "weights_only=True refused it: " + text.split("WeightsUnpickler error:")[1].strip()
    return f"{type(err).__name__}: {text.split('. ')[0][:160]}"


def load_latest(run_dir: Path) -> dict | None:
    """The newest readable checkpoint of a run dir (skipping corrupt ones with a warning), or None if there is none.

    If checkpoints exist but none is readable, refuse: starting over would silently replace the run.
    """
    found = sorted(_listed(ckpt_dir(run_dir)), reverse=True)
    for _, path in found:
        try:
            return load(path)
        except ConfigError as err:
            log.warning("skipping %s", err)
    if found:
        raise ConfigError(f"train.resume=auto: none of the {len(found)} checkpoints in {ckpt_dir(run_dir)} is readable; "
                          f"move them away to start over, or pass train.resume=never")
    return None

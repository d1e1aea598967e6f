"""Atomic checkpoints in <run_dir>/checkpoints, in one of two formats, listed and pruned together.

Single file (`step_N.pt`, rank 0 writes): temp file, fsync, rename; loaded with weights_only. Sharded
(`step_N.dcp/`, hardware.strategy=fsdp): every rank writes its shards with torch.distributed.checkpoint (DCP) into
a temp dir, rank 0 adds `state.pt` (everything but the model and optimizer tensors) and renames the dir once all
ranks are done. A kill at any moment leaves either the complete checkpoint or a `.step_*.tmp*` entry that is never
listed and is swept by the next save.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import warnings
from pathlib import Path

import torch

from gptlab.errors import ConfigError

log = logging.getLogger(__name__)
KEEP = 2  # the newest two, so a corrupt newest file still leaves one to resume from
PATTERN = re.compile(r"step_(\d+)\.(pt|dcp)$")
TMP_GLOB = ".step_*.tmp*"  # a save in progress (file or DCP dir), or one a killed process left behind; never loaded
STATE_FILE = "state.pt"  # in a DCP dir: step, progress, RNGs, scaler, identity (torch.save, read with weights_only)


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
    _sweep(folder)
    final = folder / f"step_{step:07d}.pt"
    tmp = folder / f".step_{step:07d}.pt.tmp{os.getpid()}"
    try:
        _write_file(tmp, state)
        os.replace(tmp, final)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise OSError(err.errno, f"cannot write checkpoint ({err.strerror or err})", str(final)) from None
    _fsync_dir(folder)
    _prune(folder)
    return final


def _write_file(path: Path, state: dict) -> None:
    """torch.save `state` to `path` and fsync it; a write error (disk full, ...) is raised as that OSError."""
    with open(path, "wb") as fh:
        writer = _KeepWriteError(fh)
        try:
            torch.save(state, writer)  # type: ignore[arg-type]  # a file-like wrapper; torch's stub names IO[bytes]
        except RuntimeError:
            if writer.error is None:
                raise
            raise writer.error from None
        fh.flush()
        os.fsync(fh.fileno())


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _sweep(folder: Path) -> None:
    """Remove what killed saves left (one writer per run dir: see cli/train.py)."""
    for stale in folder.glob(TMP_GLOB):
        _remove(stale)


def _fsync_dir(folder: Path) -> None:
    dir_fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _prune(folder: Path) -> None:
    for old in sorted(_listed(folder))[:-KEEP]:
        _remove(old[1])


def save_sharded(run_dir: Path, step: int, tensors: dict, state: dict, rank: int, world: int) -> Path:
    """Collective: write DCP checkpoint `step` (every rank's shards of `tensors`, rank 0's `state`) atomically.

    Every rank writes into one temp dir, in rank 0's run dir (on a shared file system when ranks span nodes); rank
    0 renames it to step_N.dcp only after DCP's own collective finish and its STATE_FILE are on disk, then prunes. A
    failure on any rank is raised on every rank as one OSError naming the checkpoint, and the temp dir is removed.
    """
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    folder = ckpt_dir(run_dir)
    if rank == 0:
        folder.mkdir(parents=True, exist_ok=True)
        _sweep(folder)
    if world > 1:
        # Rank 0's folder for all: the default hydra.run.dir holds the second each rank started, on its own node's
        # clock, so ranks started a second apart name different run dirs. Also the barrier: nobody writes into a
        # temp dir rank 0 is still sweeping.
        where = [str(folder)]
        dist.broadcast_object_list(where, src=0)
        folder = Path(where[0])
    final, tmp = folder / f"step_{step:07d}.dcp", folder / f".step_{step:07d}.dcp.tmp"
    error = None
    try:
        with single_process_quiet():
            dcp.save(tensors, checkpoint_id=tmp, no_dist=world == 1)
    except (OSError, CheckpointException) as err:  # DCP raises CheckpointException (a BaseException) on every rank
        error = first_line(err)
    if rank == 0 and error is None:
        error = _finish_sharded(folder, tmp, final, state)
    if world > 1:
        shared = [error]
        dist.broadcast_object_list(shared, src=0)  # rank 0's verdict, also the barrier after the rename
        error = error or shared[0]
    if error:
        if rank == 0:
            _remove(tmp)
        raise OSError(0, f"cannot write checkpoint ({error})", str(final))
    return final


@contextlib.contextmanager
def single_process_quiet():
    """Silence DCP's warning that one process (no process group) saves or loads alone: here that is intended."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
        yield


def _finish_sharded(folder: Path, tmp: Path, final: Path, state: dict) -> str | None:
    """Rank 0: STATE_FILE, fsync, rename the temp dir to its final name, prune; the error as one line, or None.

    Every shard the metadata names must be in rank 0's temp dir first: ranks on nodes that do not share the run dir's
    file system each write into their own copy of it, and DCP's save succeeds all the same, leaving a checkpoint
    that no resume can read (tests/test_multinode_fsdp.py)."""
    missing = _incomplete_shards(tmp)
    if missing:
        return f"{missing} in {tmp.name} on rank 0: the ranks do not share the run dir's file system"
    try:
        _write_file(tmp / STATE_FILE, state)
        _fsync_dir(tmp)
        if final.exists():  # a step redone after its checkpoint was skipped as unreadable: replace it
            _remove(final)
        os.replace(tmp, final)
        _fsync_dir(folder)
    except OSError as err:
        return err.strerror or str(err)
    _prune(folder)
    return None


def first_line(err: BaseException) -> str:
    """`Type: message` in one line; for DCP's CheckpointException, the first failing rank's own error."""
    failures = getattr(err, "failures", None)  # {rank: (exception, stack)}
    if isinstance(failures, dict) and failures:
        rank, failed = min(failures.items())
        inner = failed[0] if isinstance(failed, tuple) else failed
        return f"rank {rank}: {first_line(inner)}"
    return f"{type(err).__name__}: {' '.join(str(err).split())[:200]}"


def _listed(folder: Path) -> list[tuple[int, Path]]:
    out = []
    for path in folder.glob("step_*"):
        m = PATTERN.search(path.name)
        if m:
            out.append((int(m.group(1)), path))
    return out


def latest_path(run_dir: Path) -> Path | None:
    """The newest checkpoint (file or DCP dir) of a run dir (readable or not), or None."""
    found = sorted(_listed(ckpt_dir(run_dir)))
    return found[-1][1] if found else None


def load(path: Path, key: str = "train.resume") -> dict:
    """Load one checkpoint with weights_only=True (no code runs from a single file).

    A DCP dir gives its STATE_FILE plus {"dcp": dir}; its model and optimizer tensors are read later, by
    gptlab.state.sharded.load, into whatever world size runs then. (DCP itself reads its .metadata with pickle, so
    resume DCP checkpoints only from runs you trust.)
    """
    path = Path(path)
    if path.is_dir():
        return _load_sharded(path, key)
    state = _read(path, path, key)
    if "model" not in state:
        raise ConfigError(f"{key}: '{path}' is not a gptlab checkpoint (no model/step entries)")
    return state


def _read(path: Path, shown: Path, key: str) -> dict:
    """torch.load(path, weights_only=True) as a dict with a step; failures name the checkpoint `shown` and `key`, what
    asked for it (train.resume, or a reader of a finished run)."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        what = "does not exist" if path == shown else f"has no {path.name}"
        raise ConfigError(f"{key}: checkpoint '{shown}' {what}") from None
    except Exception as err:  # truncated zip, bad pickle opcodes, a pickled call weights_only refuses, ...
        raise ConfigError(f"{key}: checkpoint '{shown}' is unreadable ({_reason(err)})") from None
    if not isinstance(state, dict) or "step" not in state:
        raise ConfigError(f"{key}: '{shown}' is not a gptlab checkpoint (no model/step entries)")
    return state


def _load_sharded(path: Path, key: str) -> dict:
    """A DCP dir's STATE_FILE, after checking that every shard file its metadata names is there in full."""
    missing = _incomplete_shards(path)
    if missing:
        raise ConfigError(f"train.resume: checkpoint '{path}' is unreadable ({missing})")
    return _read(path / STATE_FILE, path, key) | {"dcp": str(path)}


def _incomplete_shards(path: Path) -> str | None:
    """What is missing or short in a DCP dir (its .metadata, or a shard file), or None when all is there."""
    from torch.distributed.checkpoint import FileSystemReader

    if not (path / ".metadata").is_file():
        return "no .metadata"
    try:
        meta = FileSystemReader(str(path)).read_metadata()
    except Exception as err:  # noqa: BLE001 - a truncated or foreign .metadata
        return f".metadata: {_reason(err)}"
    ends: dict = {}
    for info in (meta.storage_data or {}).values():
        ends[info.relative_path] = max(ends.get(info.relative_path, 0), info.offset + info.length)
    for name, end in sorted(ends.items()):
        size = (path / name).stat().st_size if (path / name).is_file() else None
        if size is None or size < end:
            return f"shard {name}: {'missing' if size is None else f'{size} bytes, the metadata says {end}'}"
    return None


def _reason(err: Exception) -> str:
    """The gist of a torch.load failure in a few words (torch's messages run to paragraphs)."""
    text = " ".join(str(err).split())
    if "WeightsUnpickler error:" in text:  # the file wants to run code: never a gptlab checkpoint
        text = "weights_only=True refused it: " + text.split("WeightsUnpickler error:")[1].strip()
    return f"{type(err).__name__}: {text.split('. ')[0][:160]}"


def load_latest(run_dir: Path, resume: bool = True) -> dict | None:
    """The newest readable checkpoint of a run dir (skipping corrupt ones with a warning), or None if there is none.

    If checkpoints exist but none is readable, refuse: starting over would silently replace the run. resume=False:
    a reader of a finished run (eval, decode, export), told what it can do instead, not how to train afresh.
    """
    found = sorted(_listed(ckpt_dir(run_dir)), reverse=True)
    key = "train.resume" if resume else "checkpoint"
    for _, path in found:
        try:
            return load(path, key)
        except ConfigError as err:
            log.warning("skipping %s", err)
    if found and resume:
        raise ConfigError(
            f"train.resume=auto: none of the {len(found)} checkpoints in {ckpt_dir(run_dir)} is readable; "
            f"move them away to start over, or pass train.resume=never"
        )
    if found:
        raise ConfigError(
            f"{run_dir}: none of the {len(found)} checkpoints in {ckpt_dir(run_dir)} is readable, so this run has no "
            "weights to load; train it again or give another run"
        )
    return None

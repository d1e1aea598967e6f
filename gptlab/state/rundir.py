"""The run dir guards of gptlab-train: one live run per dir (a lock file), and no training into a folder that holds
someone's own files."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from pathlib import Path

from gptlab.errors import ConfigError

log = logging.getLogger("gptlab")
LOCK_FILE = ".gptlab.lock"


@contextlib.contextmanager
def run_dir_lock(run_dir: Path):
    """Hold an exclusive lock on run_dir while training: a second live run there is refused (freed on any exit)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(run_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise ConfigError(
            f"hydra.run.dir: '{run_dir}' is in use by another running gptlab-train; give this run its own dir"
        ) from None
    except OSError as err:  # a file system without flock (some NFS/Lustre mounts): run unguarded
        log.warning("cannot lock %s (%s); a second run in this dir would not be refused", run_dir, err.strerror)
    try:
        yield
    finally:
        os.close(fd)


RUN_MARKERS = (".hydra", "provenance.json", "checkpoints", LOCK_FILE)  # what a gptlab run dir holds
HYDRA_WRITES = {".hydra", "train.log"}  # what Hydra writes into the run dir before gptlab runs


def check_run_dir(run_dir: Path, ignore: set[str] | frozenset[str] = frozenset()) -> None:
    """Refuse a run dir that holds files but is not a gptlab run dir (`/`, a folder of the user's own files)."""
    if not run_dir.is_dir():
        return
    try:
        names = {p.name for p in run_dir.iterdir()} - set(ignore)
    except OSError:
        return  # unreadable: the write that follows names the problem
    if names and not names & set(RUN_MARKERS):
        shown = ", ".join(sorted(names)[:3]) + (", ..." if len(names) > 3 else "")
        raise ConfigError(
            f"hydra.run.dir: '{run_dir}' holds files that are not a gptlab run ({shown}); "
            f"allowed: a new or empty dir, or a gptlab run dir to resume"
        )

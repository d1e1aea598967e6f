"""The run dir lock: one live run per dir, and only the process holding a dir's lock creates, cleans or removes it.

An exclusive flock on `<run dir>/.gptlab.lock`, freed by the kernel on any exit (kill -9 too). gptlab-train takes it
before Hydra writes anything into a dir it was pointed at (hydra.run.dir=...), so a twin started at the same moment
is refused before it touches the dir; the run keeps that hold (run_dir_lock is reentrant within a process). A lock
taken on a file that a refused run's clean-up unlinked meanwhile is dropped and taken again on the dir's new lock
file, so two processes can never both believe they hold one dir. Standard library only.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from collections.abc import Iterator
from pathlib import Path

from gptlab.errors import ConfigError
from gptlab.state.layout import LOCK_FILE

log = logging.getLogger("gptlab")

_HELD: dict[str, int | None] = {}  # realpath of a run dir -> this process's locked fd (None: no flock there)


def _key(run_dir: Path) -> str:
    return os.path.realpath(run_dir)


def holds(run_dir: Path) -> bool:
    """True while this process holds run_dir's lock."""
    return _key(run_dir) in _HELD


def _same_file(fd: int, path: Path) -> bool:
    """The locked fd is still the file at `path` (not one a clean-up unlinked after it was opened)."""
    try:
        here, there = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def _acquire(run_dir: Path, create: bool) -> int | None:
    """Lock run_dir without waiting; BlockingIOError when another process holds it, FileNotFoundError when the
    dir (create=False: or its lock file) is missing; None where the file system has no flock (runs unguarded)."""
    path = run_dir / LOCK_FILE
    while True:
        if create:
            run_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, (os.O_RDWR | os.O_CREAT) if create else os.O_RDONLY, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise
        except OSError as err:  # a file system without flock (some NFS/Lustre mounts): run unguarded
            os.close(fd)
            log.warning("cannot lock %s (%s); a second run in this dir would not be refused", run_dir, err.strerror)
            return None
        if _same_file(fd, path):
            return fd
        os.close(fd)  # the dir was removed under us by the process that held it: lock what is there now


def _release(key: str) -> None:
    fd = _HELD.pop(key, None)
    if fd is not None:
        os.close(fd)


@contextlib.contextmanager
def run_dir_lock(run_dir: Path) -> Iterator[None]:
    """Hold run_dir's lock (the dir made when missing) while the body runs: a dir another process holds is refused
    in one line (ConfigError); a hold this process already has is kept, and released by whoever took it."""
    key = _key(run_dir)
    if key in _HELD:
        yield
        return
    try:
        _HELD[key] = _acquire(run_dir, create=True)
    except BlockingIOError:
        raise ConfigError(
            f"hydra.run.dir: '{run_dir}' is in use by another running gptlab-train; give this run its own dir"
        ) from None
    try:
        yield
    finally:
        _release(key)


@contextlib.contextmanager
def owned(run_dir: Path) -> Iterator[bool]:
    """Inside: True when this process may change run_dir (it holds the lock, takes it now without waiting, or the
    dir has no lock file: no run ever held it); False while another process holds it: leave the dir alone then.
    Creates nothing."""
    key = _key(run_dir)
    if key in _HELD:
        yield True
        return
    try:
        fd = _acquire(run_dir, create=False)
    except BlockingIOError:
        yield False
        return
    except FileNotFoundError:
        fd = None
    except OSError:  # a lock file this process cannot open: whose it is cannot be told, so it is not ours
        yield False
        return
    _HELD[key] = fd
    try:
        yield True
    finally:
        _release(key)

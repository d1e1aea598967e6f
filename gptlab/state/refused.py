"""A run refused for bad input leaves its run dir as it was: Hydra writes .hydra/ and the log before gptlab can
check anything, so an existing run dir's files are saved first and put back, and a folder made for the refused run
alone is removed. Both only by a process that holds the dir's lock (gptlab/state/lock.py): a dir another process
holds is that run's, and a refusal never touches it (standard library only)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from gptlab.state.layout import HYDRA_WRITES, LOCK_FILE
from gptlab.state.lock import owned


@dataclass(frozen=True)
class HydraFiles:
    """An existing run dir's .hydra/ files and its train.log's length, as they were before Hydra rewrote them."""

    folder: Path  # <run dir>/.hydra
    files: dict[str, bytes]
    log_size: int | None  # None: no train.log


def save_hydra_files(run_dir: Path | None) -> HydraFiles | None:
    """The .hydra/ files of an existing run dir and its train.log's length: Hydra rewrites the first and appends to
    the second before gptlab can check anything. None for no dir, or one that holds nothing but its lock (made for
    this run: a refusal removes it); ask it while holding the dir's lock, so no other run writes there meanwhile."""
    if run_dir is None or not run_dir.is_dir() or {p.name for p in run_dir.iterdir()} <= {LOCK_FILE}:
        return None
    folder, log = run_dir / ".hydra", run_dir / "train.log"
    files = {p.name: p.read_bytes() for p in folder.glob("*") if p.is_file()}
    return HydraFiles(folder, files, log.stat().st_size if log.is_file() else None)


def put_back(saved: HydraFiles) -> None:
    """Restore the .hydra/ files and train.log save_hydra_files saw (the refused run's own lines go); nothing while
    another process holds the run dir's lock."""
    folder, files = saved.folder, saved.files
    log = folder.parent / "train.log"
    with owned(folder.parent) as mine:
        if not mine:
            return  # a live run's dir: its files are its own
        if saved.log_size is None:
            log.unlink(missing_ok=True)
        elif log.is_file():
            os.truncate(log, saved.log_size)  # the run the dir holds keeps its log
        for path in folder.glob("*"):
            if path.is_file() and path.name not in files:
                path.unlink()
        for name, data in files.items():
            (folder / name).write_bytes(data)
        if not files and folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()


def remove_refused(run_dir: Path | None, made: Collection[str] = HYDRA_WRITES) -> None:
    """A run refused before gptlab wrote anything leaves no folder behind: remove its run dir when it holds only
    `made` (the names Hydra wrote for it) and its lock, and only while no other process holds that lock. The lock
    file goes last, so no other run can take the dir before it is gone."""
    if run_dir is None or not run_dir.is_dir():
        return
    with owned(run_dir) as mine:
        names = {p.name for p in run_dir.iterdir()}
        if not mine or not names <= {*made, LOCK_FILE}:
            return
        for name in names - {LOCK_FILE}:
            path = run_dir / name
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        (run_dir / LOCK_FILE).unlink(missing_ok=True)
        try:
            run_dir.rmdir()
        except OSError:
            pass  # another run made its lock there once ours was unlinked: the dir is its own now

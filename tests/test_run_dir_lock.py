"""The run dir lock (gptlab/state/lock.py) and the refusal clean-up it guards (gptlab/state/refused.py): only the
process holding a dir's lock creates, cleans or removes it. Another process's hold is stood for by a flock on a
second open of the lock file (flock locks belong to the open file, so this process's own lock conflicts with it as
another process's would); the twin starts through the real CLI are in test_reliability.py."""

from __future__ import annotations

import fcntl
import os
import socket

import pytest

from gptlab.errors import ConfigError
from gptlab.state.layout import LOCK_FILE, lock_held
from gptlab.state.lock import holds, owned, run_dir_lock
from gptlab.state.refused import put_back, remove_refused, save_hydra_files
from gptlab.sweep.process import alive, record


def held_elsewhere(run_dir):
    """A flock on run_dir's lock file as another process would hold it (close the returned fd to free it)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(run_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return fd


def hydra_made(run_dir):
    (run_dir / ".hydra").mkdir(parents=True, exist_ok=True)
    (run_dir / ".hydra" / "config.yaml").write_text("seed: 0\n")
    (run_dir / "train.log").write_text("a line\n")


def test_the_lock_is_reentrant_in_its_process_and_refuses_another(tmp_path):
    run_dir = tmp_path / "run"
    with run_dir_lock(run_dir):
        assert holds(run_dir) and lock_held(run_dir / LOCK_FILE)
        with run_dir_lock(tmp_path / "." / "run"):  # the same dir, spelled otherwise: the hold is kept
            assert holds(run_dir)
        assert holds(run_dir)  # the inner one took nothing, so it released nothing
    assert not holds(run_dir) and not lock_held(run_dir / LOCK_FILE)
    fd = held_elsewhere(run_dir)
    try:
        with pytest.raises(ConfigError, match="is in use by another running gptlab-train"), run_dir_lock(run_dir):
            pass
    finally:
        os.close(fd)


def test_a_refusal_removes_nothing_of_a_dir_another_process_holds(tmp_path):
    """The twin-start loss: a refused run's clean-up saw only Hydra's files and the lock, and removed the dir a live
    run had just locked. Now it removes nothing there, and restores nothing either."""
    run_dir = tmp_path / "run"
    fd = held_elsewhere(run_dir)
    hydra_made(run_dir)
    try:
        remove_refused(run_dir)
        saved = save_hydra_files(run_dir)
        assert saved is not None
        (run_dir / ".hydra" / "config.yaml").write_text("seed: 1\n")  # the live run's own, written since
        put_back(saved)
        assert (run_dir / ".hydra" / "config.yaml").read_text() == "seed: 1\n"
        assert sorted(p.name for p in run_dir.iterdir()) == [".gptlab.lock", ".hydra", "train.log"]
        with owned(run_dir) as mine:
            assert not mine
    finally:
        os.close(fd)
    remove_refused(run_dir)  # free now, and holding only what Hydra made: gone
    assert not run_dir.exists()


def test_a_refusal_cleans_a_dir_it_holds_or_that_is_free(tmp_path):
    run_dir = tmp_path / "run"
    with run_dir_lock(run_dir):  # a new dir: the lock made it; nothing to put back, so it is removed
        assert save_hydra_files(run_dir) is None
        hydra_made(run_dir)
        remove_refused(run_dir)
    assert not run_dir.exists()
    hydra_made(run_dir)
    (run_dir / "summary.json").write_text("{}")
    saved = save_hydra_files(run_dir)
    assert saved is not None
    (run_dir / ".hydra" / "config.yaml").write_text("seed: 9\n")
    with open(run_dir / "train.log", "a") as log:
        log.write("the refused run's line\n")
    put_back(saved)  # no lock file: no run ever held it, so it is free
    assert (run_dir / ".hydra" / "config.yaml").read_text() == "seed: 0\n"
    assert (run_dir / "train.log").read_text() == "a line\n"
    remove_refused(run_dir)  # a run's files: never removed
    assert (run_dir / "summary.json").is_file()


def test_a_recorded_process_lives_only_as_itself():
    """pid + start time: a pid now used by another process (another start time) is gone; a process of another host
    cannot be told from here."""
    mine = record(os.getpid())
    assert alive(mine) is True
    assert alive({**mine, "start": (mine["start"] or 0) + 1}) is False  # the pid reused since
    assert alive({**mine, "pid": 2**22 + 12345}) is False  # beyond pid_max: no such process
    assert alive(None) is False and alive({"pid": "7"}) is False
    assert alive({**mine, "host": socket.gethostname() + "-elsewhere"}) is None

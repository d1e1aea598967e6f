"""What a gptlab run dir holds and the guards every writer asks before it writes there (standard library only, so
gptlab-compare and the sweep tools can ask them without loading the training stack).

A run dir's own files (RUN_OWN) are written only by that run: a logger file, a decode result, an export, a report or
a dump never lands on them, on the lock, outside the dir it belongs in, or on a folder of the user's own files.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from gptlab.errors import ConfigError

LOCK_FILE = ".gptlab.lock"
TOKENIZER_FILE = "tokenizer.json"  # the tokenizer the run trained with (gptlab/data/tokenizer_file.py)
RUN_MARKERS = (".hydra", "provenance.json", "checkpoints", LOCK_FILE)  # what a gptlab run dir holds
# every name a training run writes in its dir: no other writer may land on one of them
RUN_OWN = (
    "metrics.jsonl",
    "summary.json",
    "provenance.json",
    "wandb_run_id",
    "git.diff",
    "train.log",
    ".hydra",
    "checkpoints",
    "wandb",
    "diagnostics",
    "profile.json",
    "profile_trace.json",
    TOKENIZER_FILE,
    LOCK_FILE,
)
HYDRA_WRITES = {".hydra", "train.log"}  # what Hydra writes into the run dir before gptlab runs


def lock_held(path: Path) -> bool:
    """True while another process holds an exclusive flock on `path` (a live run's lock, a cache build's lock)."""
    if not path.is_file():
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)  # closing drops a lock this probe took
    return False


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


def enclosing_run(path: Path) -> Path | None:
    """The gptlab run dir `path` lies in (the nearest of its parents, or itself, holding run markers), if any."""
    for folder in [path, *path.parents] if path.is_dir() else list(path.parents):
        if folder.is_dir() and any((folder / marker).exists() for marker in RUN_MARKERS):
            return folder
    return None


def check_inside(value: str, key: str) -> Path:
    """A file name a run writes inside its own dir (a logger's file): relative, no '..', not hidden, not one of the
    run's own files; returns it as a Path."""
    path = Path(value)
    if path.is_absolute() or ".." in path.parts or not path.parts or path.parts[0] in RUN_OWN or value.startswith("."):
        raise ConfigError(
            f"{key}='{value}': must be a new name inside the run dir; not absolute, no '..', not hidden, "
            f"not one of the run's own files ({', '.join(RUN_OWN)})"
        )
    return path


def check_output(path: Path, key: str) -> None:
    """A tool's output file (decode out=, an export) may not land on a run's own files or the lock."""
    run = enclosing_run(path.resolve())
    if run is None:
        return
    first = path.resolve().relative_to(run).parts[:1]
    if first and first[0] in RUN_OWN:
        raise ConfigError(
            f"{key}={path}: that is the run dir {run}'s own {first[0]}; write beside it under another name "
            f"(the run's own files are {', '.join(RUN_OWN)})"
        )

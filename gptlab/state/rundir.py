"""The run directory: one live run per dir (a lock file), the one guard every writer asks before it writes
(`check_output`), the tokenizer a run saves when it starts (`save_run_tokenizer`) and reading a run's saved files back
(`run_config`, `saved_tokenizer`); rebuilding a trained run from them is gptlab/config/trained.py's.

A run dir's own files (RUN_OWN) are written only by that run: a logger file, a decode result, an export or a dump
never lands on them, on the lock, outside the dir it belongs in, or on a folder of the user's own files.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
from pathlib import Path

from omegaconf import OmegaConf

from gptlab.data.tokenizer_file import from_doc, to_doc
from gptlab.errors import ConfigError
from gptlab.util.io import atomic_write_text

log = logging.getLogger("gptlab")
LOCK_FILE = ".gptlab.lock"
TOKENIZER_FILE = "tokenizer.json"  # the tokenizer the run trained with (gptlab/data/tokenizer_file.py)


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


def run_config(run_dir: Path):
    """The config a run was composed with (its .hydra/config.yaml)."""
    saved = run_dir / ".hydra" / "config.yaml"
    if not saved.is_file():
        raise ConfigError(f"{run_dir}: not a run directory (no .hydra/config.yaml)")
    return OmegaConf.load(saved)


def save_run_tokenizer(run_dir: Path, tokenizer, data_fingerprint: str) -> None:
    """Save the tokenizer a run trains with as run_dir/tokenizer.json, when it starts (rank 0, before any step).

    An existing valid file saved for the same data (a resume) is kept byte for byte; a tokenizer that is not char,
    byte, bpe or gpt2 (a synthetic task's, set by its config) is not saved.
    """
    doc = to_doc(tokenizer, data_fingerprint)
    if doc is None:
        return
    path = run_dir / TOKENIZER_FILE
    try:
        kept = json.loads(path.read_text())
        from_doc(kept, str(path))
        if kept.get("data") == data_fingerprint:
            return
    except (OSError, ValueError, ConfigError):
        pass  # absent, damaged or another run's: this run's own replaces it
    atomic_write_text(path, json.dumps(doc) + "\n")


def saved_tokenizer(run_dir: Path, trained_on: str | None):
    """The tokenizer run_dir/tokenizer.json holds, or None for a run saved before runs kept their tokenizer."""
    path = run_dir / TOKENIZER_FILE
    if not path.exists():
        return None
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ConfigError(f"{path}: unreadable ({err}); restore it from a copy of the run") from None
    tok = from_doc(doc, str(path))
    if trained_on is not None and doc.get("data") != trained_on:
        raise ConfigError(
            f"{path}: saved for data {str(doc.get('data'))[:24]}, but the run's newest checkpoint trained on "
            f"{trained_on[:24]}: this is another run's tokenizer; restore the run's own tokenizer.json"
        )
    return tok

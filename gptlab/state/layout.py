"""What a gptlab run dir holds and the guards every writer asks before it writes there (standard library only, so
gptlab-compare and the sweep tools can ask them without loading the training stack).

A run dir's own files (RUN_OWN) are written only by that run: a logger file, a decode result, an export, a report or
a dump never lands on them, on the lock, outside the dir it belongs in, or on a folder of the user's own files.
Every path is resolved first (resolve_path: symlinks, '..', trailing separators; names over 255 bytes, paths of
PATH_MAX bytes and symlink loops refused), so no spelling gets past a guard: check_output for a tool's output (never
inside another run, never where a file stands in for a folder), check_folder_output for a folder a tool fills (a sweep
dir), check_run_path for a run's own dir (never inside another run, asked before Hydra writes there), check_run_dir
for what that dir may already hold (a gptlab run, judged by is_run: a user's folder that merely holds `checkpoints/`
is not one), check_cache for GPTLAB_CACHE (never inside a run dir).
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterable
from pathlib import Path

from gptlab.errors import ConfigError

# Curve keys added after run dirs were first written, each with the value that trains as the code did before it: a
# saved config without the key is read as holding that value, by resume (state/resume.py) and by compare's grouping
# (any other absent key is a difference).
ADDED_KEYS = {"data.doc_mask": False, "model.parametrization": "sp", "model.mup_base_width": None}
LOCK_FILE = ".gptlab.lock"
TOKENIZER_FILE = "tokenizer.json"  # the tokenizer the run trained with (gptlab/data/tokenizer_file.py)
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
    """Refuse a run dir that holds files but is not a gptlab run dir (`/`, a folder of the user's own files, one that
    merely holds a `checkpoints/`): judged by is_run, on what it holds besides `ignore` (what Hydra just wrote)."""
    if not run_dir.is_dir():
        return
    try:
        names = {p.name for p in run_dir.iterdir()} - set(ignore)
    except OSError:
        return  # unreadable: the write that follows names the problem
    if names and not names <= HYDRA_WRITES and not is_run(run_dir, names):
        shown_names = ", ".join(sorted(names)[:3]) + (", ..." if len(names) > 3 else "")
        raise ConfigError(
            f"hydra.run.dir: '{run_dir}' holds files that are not a gptlab run ({shown_names}); "
            f"allowed: a new or empty dir, or a gptlab run dir to resume"
        )


NAME_MAX = 255  # bytes in one file or folder name on Linux and macOS file systems: a longer one cannot be made
PATH_MAX = os.pathconf("/", "PC_PATH_MAX") if hasattr(os, "pathconf") else 4096  # bytes in a whole path, with its NUL
RUN_EVIDENCE = ("checkpoints", "summary.json", "metrics.jsonl", "decode.json")  # beside .hydra/config.yaml: a run


def shown(path: Path | str) -> str:
    """A path as one line of a message: control characters (a newline in a name) written as escapes."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(path))


def _too_long(text: str, key: str, what: str) -> ConfigError | None:
    """The one-line refusal for a path of PATH_MAX bytes or more (the OS refuses it at the first call), else None."""
    size = len(os.fsencode(text))
    if size < PATH_MAX:
        return None
    return ConfigError(
        f"{key}: {what} is {size} bytes ('{shown(text[:40])}...'); the system allows at most {PATH_MAX - 1} bytes in a "
        "path: choose a shorter one"
    )


def _unresolved_link(real: str) -> str | None:
    """The symlink a resolved path still holds (a loop, or a link the resolution gave up on), else None."""
    for folder in [real, *map(str, Path(real).parents)]:
        if os.path.islink(folder):
            return folder
    return None


def resolve_path(path: Path | str, key: str) -> Path:
    """`path` as a write finds it: absolute, symlinks followed, '.', '..' and trailing separators gone (the walk the
    OS makes once the missing folders exist); a name over NAME_MAX bytes, a path of PATH_MAX bytes or more and a
    symlink loop are refused in one line (nothing could be written there, and a late OSError would leave half a
    result behind)."""
    text = os.fspath(path)
    for name in Path(text).parts:
        size = len(os.fsencode(name))
        if size > NAME_MAX:
            short = shown(name[:40]) + "..."
            raise ConfigError(
                f"{key}: the name '{short}' is {size} bytes; the file system allows at most {NAME_MAX} bytes per "
                f"file or folder name: choose a shorter one"
            )
    too_long = _too_long(os.path.abspath(text), key, "the path")
    if too_long is None:
        real = os.path.realpath(text)
        too_long = _too_long(real, key, "the path its symlinks lead to")
    if too_long is not None:
        raise too_long
    loop = _unresolved_link(real)
    if loop is not None:
        raise ConfigError(
            f"{key}={shown(text)}: the symlink {shown(loop)} never reaches a file or folder (a symlink loop); allowed: "
            "a path whose symlinks resolve"
        )
    return Path(real)


def is_run(folder: Path, names: set[str] | None = None) -> bool:
    """A gptlab run dir (a training run, a gptlab-decode run, an export): its lock or provenance, or Hydra's saved
    config beside checkpoints or results (`names`: judge by these entries only). A folder of the user's that merely
    holds a `checkpoints/` is not one."""
    has = (lambda n: n in names) if names is not None else (lambda n: (folder / n).exists())
    if has(LOCK_FILE) or has("provenance.json"):
        return True
    return has(".hydra") and (folder / ".hydra" / "config.yaml").is_file() and any(has(n) for n in RUN_EVIDENCE)


def enclosing_run(path: Path) -> Path | None:
    """The gptlab run dir `path` lies in (the nearest of its existing parents, or itself, that is a run), if any;
    give it resolved (resolve_path)."""
    for folder in [path, *path.parents]:
        if folder.is_dir() and is_run(folder):
            return folder
    return None


def _same(a: Path, b: Path) -> bool:
    """The same folder, however spelled (symlinks, '..', letter case on a case-insensitive file system)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return Path(os.path.realpath(a)) == Path(os.path.realpath(b))


def check_run_path(run_dir: Path | str, key: str = "hydra.run.dir") -> Path:
    """Where a run (gptlab-train, gptlab-decode) may have its dir, asked before Hydra writes anything there: resolved
    first; never inside another run's dir (its checkpoints/, .hydra/, lock, or beside its files); a run dir itself
    (a resume) or a new folder is fine (what it may hold is check_run_dir's). Returns the resolved dir."""
    real = resolve_path(run_dir, key)
    outer = enclosing_run(real.parent) if real.parent != real else None
    if outer is not None:
        inside = real.relative_to(outer).parts[0]
        raise ConfigError(
            f"{key}={shown(run_dir)}: lies inside the run dir {shown(outer)} (its {shown(inside)}); a run gets a dir "
            f"of its own, outside every other run's dir"
        )
    return real


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


def _check_folders(real: Path, key: str, given: Path | str, folder: bool) -> None:
    """The output's existing folders are folders: no file stands where a folder must be (a write would fail late,
    after the work); a `folder` output is not an existing file either."""
    for up in [real, *real.parents] if folder else real.parents:
        if up.exists():
            if not up.is_dir():
                where = "it" if up == real else shown(up)
                raise ConfigError(
                    f"{key}={shown(given)}: {where} is a file, not a folder; allowed: a new folder or an existing one"
                )
            return


def check_folder_output(path: Path | str, key: str) -> Path:
    """check_output for a folder a tool fills (a sweep dir): never an existing file, never a run dir or inside one;
    returns it resolved."""
    real = check_output(path, key)
    _check_folders(real, key, path, folder=True)
    return real


def check_cache(path: Path | str) -> Path:
    """The cache folder (GPTLAB_CACHE), resolved: never inside a run dir (a run's files would hold a cache that
    gptlab-cache prunes) and never a file; returns it resolved."""
    real = resolve_path(path, "GPTLAB_CACHE")
    _check_folders(real, "GPTLAB_CACHE", path, folder=True)
    run = enclosing_run(real)
    if run is not None:
        raise ConfigError(
            f"GPTLAB_CACHE={shown(path)}: lies inside the run dir {shown(run)}; allowed: a folder outside every run "
            "dir (default ~/.cache/gptlab)"
        )
    return real


def check_output(path: Path | str, key: str, own: Iterable[Path] = (), folder: bool = False) -> Path:
    """The one guard of a tool's output (decode out=, an export, a report folder, eval.json): `path` resolved first
    (symlinks, '..', trailing separators, long names), then refused inside any run dir but `own` (the runs the tool
    reads), and inside those refused on the run's own files, its lock or the run dir itself. `folder`: the output is
    a folder the tool makes a run-like dir of its own (an export), judged by where it lies; whether an existing one
    may be replaced is the tool's call. Returns the resolved path: the write goes there, so the check and the write
    see the same place."""
    real = resolve_path(path, key)
    _check_folders(real, key, path, folder)
    run = enclosing_run(real.parent if folder else real)
    if run is None:
        return real
    inside = real.relative_to(run).parts
    if not inside:
        raise ConfigError(f"{key}={shown(path)}: that is the run dir {shown(run)} itself; write into a new folder")
    if not any(_same(run, mine) for mine in own):
        raise ConfigError(
            f"{key}={shown(path)}: lies inside the run dir {shown(run)}, another run's; write outside every run dir "
            f"(or inside a run this command reads)"
        )
    if inside[0].casefold() in {name.casefold() for name in RUN_OWN}:
        raise ConfigError(
            f"{key}={shown(path)}: that is the run dir {shown(run)}'s own {shown(inside[0])}; write beside it under "
            f"another name (the run's own files are {', '.join(RUN_OWN)})"
        )
    return real

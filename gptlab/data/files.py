"""Local text files (.txt, .jsonl/.json, .parquet): resolve globs, validate, hash, load as one Dataset."""

from __future__ import annotations

import codecs
import errno
import glob
import hashlib
import os
import stat
from pathlib import Path

from gptlab.errors import ConfigError

# suffix -> HF datasets builder; each .txt file is one document, each json/parquet row is one document
BUILDERS = {".txt": "text", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}
TEXT_SUFFIXES = {".txt", ".jsonl", ".json"}  # files that must be UTF-8
_CHUNK = 1 << 20
# what a path that is not a regular file is (reading a FIFO blocks forever, /dev/zero never ends)
_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO, i.e. a named pipe"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))
_ALLOWED = "regular .txt, .jsonl/.json or .parquet files"


def _refuse_mode(path, mode: int) -> None:
    if not stat.S_ISREG(mode):
        kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
        raise ConfigError(f"data.paths: '{path}' is not a regular file ({kind}); allowed: {_ALLOWED}")


def check_regular(path: Path) -> None:
    """One-line ConfigError for a FIFO, a device, a socket, a symlink loop or a dangling symlink (no read needed)."""
    try:
        mode = os.stat(path).st_mode
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise ConfigError(f"data.paths: '{path}' is a symlink loop (it never reaches a file); point it at a "
                              f"file") from None
        if os.path.islink(path):
            raise ConfigError(f"data.paths: '{path}' is a broken symlink (its target '{os.readlink(path)}' does "
                              f"not exist)") from None
        raise ConfigError(f"data.paths: cannot read '{path}' ({err.strerror})") from None
    _refuse_mode(path, mode)


def resolve_paths(paths) -> list[Path]:
    """Files named by `paths` (a path/glob or a list of them), in the given order, globs sorted, no duplicates."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    if not paths:
        raise ConfigError("data.paths: no files given; set data.paths=[...] to .txt, .jsonl/.json or .parquet "
                          "files or globs")
    files: list[Path] = []
    for pattern in map(str, paths):
        expanded = str(Path(pattern).expanduser())
        if glob.has_magic(expanded):  # directories a glob matches are skipped; anything else it matches is checked
            found = [Path(p) for p in sorted(glob.glob(expanded, recursive=True)) if not Path(p).is_dir()]
        else:
            found = [Path(expanded)] if os.path.lexists(expanded) else []
        if not found:
            raise ConfigError(f"data.paths: no file matches {pattern!r}")
        if found[0].is_dir():
            raise ConfigError(f"data.paths: {pattern!r} is a directory; name files or a glob like "
                              f"'{pattern.rstrip('/')}/*.txt'")
        for path in found:
            check_regular(path)
        files.extend(p.resolve() for p in found)
    return list(dict.fromkeys(files))


def check_file(path: Path) -> str:
    """sha256 of the file's bytes, after checking its type, that it is not empty and (text types) valid UTF-8."""
    suffix = path.suffix.lower()
    if suffix not in BUILDERS:
        raise ConfigError(f"data.paths: unsupported file type {suffix or '(none)'!r} for '{path}'; "
                          f"allowed: {', '.join(BUILDERS)}")
    decoder = codecs.getincrementaldecoder("utf-8")() if suffix in TEXT_SUFFIXES else None
    digest, offset, has_text, only_nul = hashlib.sha256(), 0, False, True
    with _open_regular(path) as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
            only_nul = only_nul and chunk.count(0) == len(chunk)
            if only_nul and decoder is not None and len(chunk) == _CHUNK:  # a text file never starts with 1 MiB of NULs
                raise ConfigError(f"data.paths: file '{path}' contains no text in its first MiB (only NUL bytes); "
                                  f"allowed: {_ALLOWED}")
            if decoder is not None:
                pending = len(decoder.getstate()[0])
                try:
                    has_text = bool(decoder.decode(chunk).strip()) or has_text
                except UnicodeDecodeError as e:
                    raise ConfigError(f"data.paths: file '{path}' is not valid UTF-8 (bad byte near offset "
                                      f"{offset - pending + e.start}); convert it to UTF-8") from None
            offset += len(chunk)
    if decoder is not None:
        try:
            decoder.decode(b"", final=True)
        except UnicodeDecodeError:
            raise ConfigError(f"data.paths: file '{path}' is not valid UTF-8 (truncated character at the end); "
                              f"convert it to UTF-8") from None
    if offset == 0:
        raise ConfigError(f"data.paths: file '{path}' is empty")
    if only_nul:
        raise ConfigError(f"data.paths: file '{path}' contains no text (only NUL bytes)")
    if decoder is not None and not has_text:
        raise ConfigError(f"data.paths: file '{path}' is empty")
    return digest.hexdigest()


def _open_regular(path: Path):
    """The file opened for reading, refused first (without blocking on a FIFO) when it is not a regular file or
    holds no data at all (a sparse file of NULs, found by SEEK_DATA without reading it)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        info = os.fstat(fd)
        _refuse_mode(path, info.st_mode)
        if info.st_size and not _has_data(fd):
            raise ConfigError(f"data.paths: file '{path}' contains no text (only NUL bytes: a sparse file of "
                              f"{info.st_size:,} bytes)")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _has_data(fd: int) -> bool:
    """False when the file is one hole (only NULs on disk); True when it has data or the file system cannot tell."""
    try:
        os.lseek(fd, 0, os.SEEK_DATA)
    except OSError as err:
        return err.errno != errno.ENXIO
    finally:
        os.lseek(fd, 0, os.SEEK_SET)
    return True


def _load_group(builder: str, files: list[Path], column: str, hf_cache_dir: Path):
    """One builder's files as a Dataset with a single string column "text"."""
    from datasets import Value, load_dataset
    from datasets.utils import logging as hf_logging
    hf_logging.disable_progress_bar()  # gptlab prints its own progress

    extra = {"sample_by": "document", "keep_linebreaks": True} if builder == "text" else {}
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity(hf_logging.CRITICAL)  # its own multi-line error log would precede ours
    try:
        ds = load_dataset(builder, data_files=[str(f) for f in files], split="train",
                          cache_dir=str(hf_cache_dir), **extra)
    except Exception as err:  # malformed json/parquet: report which files and why (the root cause), in one line
        root = err
        while root.__cause__ is not None:
            root = root.__cause__
        first = (str(root).strip().splitlines() or [type(root).__name__])[0]
        raise ConfigError(f"data.paths: cannot read {builder} file(s) {', '.join(f.name for f in files)}: "
                          f"{first}") from None
    finally:
        hf_logging.set_verbosity(verbosity)
    name = "text" if builder == "text" else column
    if name not in ds.column_names:
        raise ConfigError(f"data.column: column {name!r} not found in {', '.join(f.name for f in files)}; "
                          f"columns: {', '.join(ds.column_names)}")
    ds = ds.select_columns([name])
    if ds.features[name] not in (Value("string"), Value("large_string")):
        raise ConfigError(f"data.column: column {name!r} holds {ds.features[name]}, not text")
    if name != "text":
        ds = ds.rename_column(name, "text")
    return ds.cast_column("text", Value("large_string"))


def load_documents(files: list[Path], column: str, hf_cache_dir: Path):
    """All files as one Dataset of documents ("text" column), grouped by file type in order of first appearance."""
    from datasets import concatenate_datasets
    from datasets.utils.logging import disable_progress_bar
    disable_progress_bar()  # gptlab prints its own progress

    groups: dict[str, list[Path]] = {}
    for f in files:
        groups.setdefault(BUILDERS[f.suffix.lower()], []).append(f)
    parts = [_load_group(builder, group, column, hf_cache_dir) for builder, group in groups.items()]
    return parts[0] if len(parts) == 1 else concatenate_datasets(parts)


def source_key(files: list[Path], hashes: list[str], column: str) -> str:
    """Cache identity of a file set: content hashes and types in order (not paths, so moved files still hit)."""
    parts = [f"{f.suffix.lower()}:{h}" for f, h in zip(files, hashes)]
    return "files:v1:column=" + column + ":txt=document:" + ",".join(parts)

"""Local text files (.txt, .jsonl/.json, .parquet): resolve globs, validate, hash (once per file version)."""

from __future__ import annotations

import codecs
import errno
import glob
import hashlib
import json
import os
import stat
from pathlib import Path

from gptlab.errors import ConfigError

# the file types gptlab reads (sources.py); each .txt file is one document, each json/parquet row is one document
SUFFIXES = (".txt", ".jsonl", ".json", ".parquet")
TEXT_SUFFIXES = {".txt", ".jsonl", ".json"}  # files that must be UTF-8
_CHUNK = 1 << 20
# what a path that is not a regular file is (reading a FIFO blocks forever, /dev/zero never ends)
_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO, i.e. a named pipe"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)
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
            raise ConfigError(
                f"data.paths: '{path}' is a symlink loop (it never reaches a file); point it at a file"
            ) from None
        if os.path.islink(path):
            raise ConfigError(
                f"data.paths: '{path}' is a broken symlink (its target '{os.readlink(path)}' does not exist)"
            ) from None
        raise ConfigError(f"data.paths: cannot read '{path}' ({err.strerror})") from None
    _refuse_mode(path, mode)


def resolve_paths(paths) -> list[Path]:
    """Files named by `paths` (a path/glob or a list of them), in the given order, globs sorted, no duplicates."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    if not paths:
        raise ConfigError(
            "data.paths: no files given; set data.paths=[...] to .txt, .jsonl/.json or .parquet files or globs"
        )
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
            raise ConfigError(
                f"data.paths: {pattern!r} is a directory; name files or a glob like '{pattern.rstrip('/')}/*.txt'"
            )
        for path in found:
            check_regular(path)
        files.extend(p.resolve() for p in found)
    return list(dict.fromkeys(files))


def check_file(path: Path) -> str:
    """sha256 of the file's bytes, after checking its type, that it is not empty and (text types) valid UTF-8."""
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise ConfigError(
            f"data.paths: unsupported file type {suffix or '(none)'!r} for '{path}'; allowed: {', '.join(SUFFIXES)}"
        )
    decoder = codecs.getincrementaldecoder("utf-8")() if suffix in TEXT_SUFFIXES else None
    digest, offset, has_text, only_nul = hashlib.sha256(), 0, False, True
    with _open_regular(path) as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
            only_nul = only_nul and chunk.count(0) == len(chunk)
            if only_nul and decoder is not None and len(chunk) == _CHUNK:  # a text file never starts with 1 MiB of NULs
                raise ConfigError(
                    f"data.paths: file '{path}' contains no text in its first MiB (only NUL bytes); allowed: {_ALLOWED}"
                )
            if decoder is not None:
                pending = len(decoder.getstate()[0])
                try:
                    has_text = bool(decoder.decode(chunk).strip()) or has_text
                except UnicodeDecodeError as e:
                    raise ConfigError(
                        f"data.paths: file '{path}' is not valid UTF-8 (bad byte near offset "
                        f"{offset - pending + e.start}); convert it to UTF-8"
                    ) from None
            offset += len(chunk)
    if decoder is not None:
        try:
            decoder.decode(b"", final=True)
        except UnicodeDecodeError:
            raise ConfigError(
                f"data.paths: file '{path}' is not valid UTF-8 (truncated character at the end); convert it to UTF-8"
            ) from None
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
            raise ConfigError(
                f"data.paths: file '{path}' contains no text (only NUL bytes: a sparse file of {info.st_size:,} bytes)"
            )
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


def source_key(files: list[Path], hashes: list[str], column: str) -> str:
    """Cache identity of a file set: content hashes and types in order (not paths, so moved files still hit)."""
    parts = [f"{f.suffix.lower()}:{h}" for f, h in zip(files, hashes)]
    return "files:v1:column=" + column + ":txt=document:" + ",".join(parts)


def quick_identity(path: Path, blocks: int = 16, block: int = 1 << 16) -> str:
    """A cheap stand-in for the content hash: path, size, mtime and `blocks` evenly spaced sampled blocks."""
    info = os.stat(path)
    digest = hashlib.sha256(f"{path}:{info.st_size}:{info.st_mtime_ns}".encode())
    with open(path, "rb") as f:
        for i in range(blocks):
            f.seek(max(0, info.st_size - block) * i // max(1, blocks - 1))
            digest.update(f.read(block))
    return digest.hexdigest()


def content_hashes(files: list[Path], cache_dir: Path, verify: bool = False) -> list[str]:
    """Each file's full sha256 (check_file: validated), computed once and then found by its quick identity.

    A file whose size, mtime and sampled blocks are unchanged is not read again; verify=True (data.verify)
    re-reads and re-hashes every file and replaces a stale record.
    """
    from gptlab.util.io import write_json_atomic

    known = Path(cache_dir) / "sources"
    known.mkdir(parents=True, exist_ok=True)
    hashes = []
    for f in files:
        record = known / f"{quick_identity(f)[:40]}.json"
        stored = None
        if record.is_file() and not verify:
            try:
                stored = json.loads(record.read_text())["sha256"]
            except (OSError, ValueError, KeyError, TypeError):
                stored = None
        if stored is None:
            stored = check_file(f)
            write_json_atomic(record, {"path": str(f), "sha256": stored})
        hashes.append(stored)
    return hashes

"""Files every part of gptlab writes the same way: strict JSON values and atomic replacement."""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
from pathlib import Path
from typing import Any


def strict_json(value: Any) -> Any:
    """A JSON-safe copy: tensors and numpy scalars become Python numbers, NaN/inf become None (strict JSON has no
    NaN: null in a present key means "measured, not finite"), tuples become lists, paths strings, keys strings."""
    if hasattr(value, "item") and callable(value.item):
        value = value.item()  # 0-d torch tensor or numpy scalar
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): strict_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


def temp_beside(path: Path, tag: str = "tmp") -> Path:
    """The temp name a write of `path` goes through: `.<name>.<pid>.<tag>` beside it; for a name too long to take
    that (any name the file system allows must stay writable), its head and a hash of the whole name instead."""
    path = Path(path)
    tail = f".{os.getpid()}.{tag}"
    name = f".{path.name}{tail}"
    try:
        most = os.pathconf(path.parent, "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):  # a folder not made yet, or no pathconf: Linux's and macOS's limit
        most = 255
    if len(os.fsencode(name)) > most:
        digest = hashlib.sha256(os.fsencode(path.name)).hexdigest()[:16]
        head = os.fsencode(path.name)[: most - len(tail) - len(digest) - 2].decode("utf-8", "ignore")
        name = f".{head}~{digest}{tail}"
    return path.with_name(name)


def atomic_write_text(path: Path, text: str) -> None:
    """Write `text` to `path` so readers see the old or the new file, never a half-written one (temp file beside it,
    fsync, rename). On an OSError (disk full) the temp file is removed and the old file stays."""
    path = Path(path)
    tmp = temp_beside(path)
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        if err.filename:
            raise
        raise OSError(err.errno, err.strerror, str(path)) from None  # name the file the user knows, not the temp


def write_json_atomic(path: Path, obj: Any, indent: int = 1, sort_keys: bool = False) -> None:
    """`obj` as strict JSON, written atomically (see atomic_write_text)."""
    atomic_write_text(path, json.dumps(strict_json(obj), indent=indent, sort_keys=sort_keys) + "\n")


def append_whole(file, path: Path, text: str, what: str) -> None:
    """Write and flush `text` at the end of `file` (open on `path` for appending). If that fails (a full disk), close
    the file, cut it back to where `text` began so no torn line is left, and raise an OSError naming `what` and the
    path; the caller then drops its handle."""
    end = file.tell()
    try:
        file.write(text)
        file.flush()
    except OSError as err:
        with contextlib.suppress(OSError):
            file.close()  # its flush fails again, but the descriptor is closed
        with contextlib.suppress(OSError):
            os.truncate(path, end)
        raise OSError(err.errno, f"cannot append to {what} ({err.strerror})", str(path)) from None

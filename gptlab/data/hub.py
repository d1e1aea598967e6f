"""A Hugging Face dataset (a hub name, the local HF cache, or a local dataset folder) as a document source: its text
column as a HubSource, refused at once when offline and absent (data=hf, and a validation set's `dataset`)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

from gptlab.data import default_cache_dir
from gptlab.data.sources import HubSource
from gptlab.errors import ConfigError
from gptlab.util.io import atomic_write_text

_TRUE = {"1", "ON", "YES", "TRUE"}


def _offline_var() -> str | None:
    """The environment variable that puts HF in offline mode, if any."""
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        if os.environ.get(var, "").upper() in _TRUE:
            return var
    return None


def _is_cached(name: str) -> bool:
    """Whether `datasets` has a local copy of hub dataset `name` (checked without touching the network)."""
    if Path(name).expanduser().is_dir():
        return True
    try:
        from datasets.load import CachedDatasetModuleFactory

        CachedDatasetModuleFactory(name).get_module()
        return True
    except ImportError:
        return True  # internal API moved: let load_dataset decide, its errors are caught below
    except Exception:
        return False


def _local_identity(folder: Path) -> str:
    """A local dataset folder's identity: every file's relative path, size and mtime."""
    digest = hashlib.sha256()
    for f in sorted(p for p in folder.rglob("*") if p.is_file()):
        info = f.stat()
        digest.update(f"{f.relative_to(folder)}:{info.st_size}:{info.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def local_split_files(folder: Path, config_name: str | None, split: str) -> list[Path]:
    """The files `datasets` reads for `split` of a local dataset folder (its own data-file patterns), resolved; []
    when it has no such split or cannot say."""
    from datasets import load_dataset_builder

    try:
        found = load_dataset_builder(str(folder), config_name).config.data_files or {}
    except Exception:  # a folder datasets cannot read fails where it is loaded, with its own message
        return []
    return [Path(f).resolve() for name, files in found.items() if str(name) == split for f in files]


def _text_column(ds, name: str, column: str):
    """The dataset cut to `column`, renamed "text"; a one-line error naming the columns there are."""
    names = list(ds.column_names or ds.features or [])
    if not names and hasattr(ds, "take"):  # a stream whose columns this datasets does not know before a read (3.0)
        first = next(iter(ds.take(1)), None)
        names = list(first or {})
    if column not in names:
        raise ConfigError(f"data.column: column {column!r} not found in {name!r}; columns: {', '.join(names)}")
    ds = ds.select_columns([column])
    return ds if column == "text" else ds.rename_column(column, "text")


def _local_folder_source(folder: Path, name: str, config_name, split: str, column: str, cache_dir: Path) -> HubSource:
    """A local dataset folder, known by its files (path, size, mtime) rather than by a load: a token-cache hit reads
    nothing, and a miss converts the folder to Arrow in a scratch dir under gptlab's cache that close() removes
    (datasets would otherwise keep a second copy of the folder in its own cache for good)."""
    from datasets import load_dataset

    scratch = Path(cache_dir) / "hf-scratch" / f"{os.getpid()}-{hashlib.sha256(str(folder).encode()).hexdigest()[:12]}"
    key = f"hub-local:{config_name}:{split}:{column}:{_local_identity(folder)}"
    # Its text's size (the BPE fit sample's bound, part of the token-cache key) is recorded at the first load, so
    # a later run finds its tokens without converting the folder again.
    sized = Path(cache_dir) / "sources" / f"hf-{hashlib.sha256(key.encode()).hexdigest()}.json"
    known = json.loads(sized.read_text())["text_bytes"] if sized.is_file() else None

    def load():
        scratch.mkdir(parents=True, exist_ok=True)
        ds = _text_column(load_dataset(str(folder), config_name, split=split, cache_dir=str(scratch)), name, column)
        nbytes = int(ds.data.nbytes)
        sized.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(sized, json.dumps({"key": key, "text_bytes": nbytes}) + "\n")
        return ds, nbytes

    return HubSource(None, key, known, load=load, cleanup=lambda: shutil.rmtree(scratch, ignore_errors=True))


def load_hub_source(
    name: str, config_name: str | None, split: str, column: str, streaming: bool, cache_dir: Path | None = None
) -> HubSource:
    """The dataset's `column` as a HubSource; fails at once when offline and absent. A local folder (not streamed)
    is loaded only if its tokens are not cached yet, into a scratch dir under cache_dir (the HubSource's close())."""
    from datasets import load_dataset
    from datasets.utils.logging import disable_progress_bar

    if not sys.stderr.isatty():
        disable_progress_bar()  # datasets' download bars on a terminal only; gptlab logs tokenizing progress

    offline = _offline_var()
    unavailable = ConfigError(
        f"data.name: hub dataset {name!r} is not available offline ({offline}=1); use data=text with local files"
    )
    if offline and not _is_cached(name):
        raise unavailable
    local = Path(name).expanduser()
    if local.is_dir() and not streaming:
        return _local_folder_source(local.resolve(), name, config_name, split, column, cache_dir or default_cache_dir())
    try:
        ds = load_dataset(str(local) if local.is_dir() else name, config_name, split=split, streaming=streaming)
    except (ConnectionError, FileNotFoundError) as e:
        if offline:
            raise unavailable from None
        raise ConfigError(
            f"data.name: cannot load hub dataset {name!r}: {str(e).splitlines()[0] if str(e) else e!r}"
        ) from None
    ds = _text_column(ds, name, column)
    if streaming:  # no fingerprint without reading it all: a local folder by its files, a hub dataset by name
        ident = _local_identity(local) if local.is_dir() else "hub"
        return HubSource(ds, f"hub-stream:{name}:{config_name}:{split}:{column}:{ident}", None)
    return HubSource(ds, f"hub:{name}:{config_name}:{split}:{column}:{ds._fingerprint}", int(ds.data.nbytes))

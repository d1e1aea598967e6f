"""Language-model data from a Hugging Face dataset (hub name or local folder): downloaded whole, or streamed
(data.streaming=true, capped by data.max_tokens) straight into the same token shards as data=text."""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

from gptlab.data.corpus import build_token_splits
from gptlab.data.lm import LMData
from gptlab.data.sources import HubSource
from gptlab.errors import ConfigError

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


def load_hub_source(name: str, config_name: str | None, split: str, column: str, streaming: bool) -> HubSource:
    """The dataset's `column` as a HubSource; fails at once when offline and absent."""
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
    try:
        ds = load_dataset(str(local) if local.is_dir() else name, config_name, split=split, streaming=streaming)
    except (ConnectionError, FileNotFoundError) as e:
        if offline:
            raise unavailable from None
        raise ConfigError(
            f"data.name: cannot load hub dataset {name!r}: {str(e).splitlines()[0] if str(e) else e!r}"
        ) from None
    names = list(ds.column_names or ds.features or [])
    if column not in names:
        raise ConfigError(f"data.column: column {column!r} not found in {name!r}; columns: {', '.join(names)}")
    ds = ds.select_columns([column])
    if column != "text":
        ds = ds.rename_column(column, "text")
    if streaming:  # no fingerprint without reading it all: a local folder by its files, a hub dataset by name
        ident = _local_identity(local) if local.is_dir() else "hub"
        return HubSource(ds, f"hub-stream:{name}:{config_name}:{split}:{column}:{ident}", None)
    return HubSource(ds, f"hub:{name}:{config_name}:{split}:{column}:{ds._fingerprint}", int(ds.data.nbytes))


class HFData(LMData):
    """Dataset `name` (config, split, column) -> token shards -> last `val_fraction` of tokens is val."""

    def __init__(
        self,
        *,
        seed: int,
        block_size: int,
        cache_dir: Path | str | None = None,
        name: str | None = None,
        config_name: str | None = None,
        split: str = "train",
        column: str = "text",
        tokenizer: str = "gpt2",
        bpe_vocab_size: int = 8192,
        val_fraction: float = 0.01,
        num_proc: int | None = None,
        streaming: bool = False,
        max_tokens: int | None = None,
        bpe_sample_bytes: int = 100_000_000,
        verify: bool = False,
    ):
        if not name or not isinstance(name, str):
            raise ConfigError(
                f"data.name: got {name!r}; allowed: a hub dataset name like 'roneneldan/TinyStories' "
                f"or a local dataset folder"
            )
        source = load_hub_source(name, config_name, split, column, streaming)
        splits = build_token_splits(
            source,
            tokenizer=tokenizer,
            bpe_vocab_size=bpe_vocab_size,
            val_fraction=val_fraction,
            cache_dir=cache_dir,
            num_proc=num_proc,
            bpe_sample_bytes=bpe_sample_bytes,
            max_tokens=max_tokens,
            verify=verify,
        )
        self.dataset_name = name
        self._open_splits("hf", splits, seed, block_size)

"""Language-model data from a Hugging Face hub dataset (downloaded or already cached), then as data=text."""

from __future__ import annotations

import os
from pathlib import Path

from gptlab.data import default_cache_dir
from gptlab.data.corpus import build_token_splits
from gptlab.data.lm import LMData
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
    try:
        from datasets.load import CachedDatasetModuleFactory

        CachedDatasetModuleFactory(name).get_module()
        return True
    except ImportError:
        return True  # internal API moved: let load_dataset decide, its errors are caught below
    except Exception:
        return False


def load_hub_documents(name: str, config_name: str | None, split: str, column: str):
    """The hub dataset's `column` as a Dataset with one string column "text"; fails at once when offline and absent."""
    from datasets import Value, load_dataset

    offline = _offline_var()
    unavailable = ConfigError(f"data.name: hub dataset {name!r} is not available offline ({offline}=1); "
                              f"use data=text with local files")
    if offline and not _is_cached(name):
        raise unavailable
    try:
        ds = load_dataset(name, config_name, split=split)
    except (ConnectionError, FileNotFoundError) as e:
        if offline:
            raise unavailable from None
        raise ConfigError(f"data.name: cannot load hub dataset {name!r}: {str(e).splitlines()[0] if str(e) else e!r}") from None
    if column not in ds.column_names:
        raise ConfigError(f"data.column: column {column!r} not found in {name!r}; columns: {', '.join(ds.column_names)}")
    ds = ds.select_columns([column])
    if column != "text":
        ds = ds.rename_column(column, "text")
    return ds.cast_column("text", Value("large_string"))


class HFData(LMData):
    """Hub dataset `name` (config, split, column) -> same split/tokenize/cache path as data=text."""

    def __init__(self, *, seed: int, block_size: int, cache_dir: Path | str | None = None, name: str | None = None,
                 config_name: str | None = None, split: str = "train", column: str = "text",
                 tokenizer: str = "gpt2", bpe_vocab_size: int = 8192, val_fraction: float = 0.01,
                 num_proc: int | None = None):
        if not name or not isinstance(name, str):
            raise ConfigError(f"data.name: got {name!r}; allowed: a hub dataset name like 'roneneldan/TinyStories'")
        docs = load_hub_documents(name, config_name, split, column)
        key = f"hub:{name}:{config_name}:{split}:{column}:{docs._fingerprint}"
        splits = build_token_splits(
            docs, source_key=key, tokenizer=tokenizer, bpe_vocab_size=bpe_vocab_size, val_fraction=val_fraction,
            cache_dir=Path(cache_dir) if cache_dir is not None else default_cache_dir(), num_proc=num_proc,
        )
        self.dataset_name = name
        self.cache_path, self.from_cache = splits.cache_path, splits.from_cache
        super().__init__(name="hf", tokenizer=splits.tokenizer, train=splits.train, val=splits.val,
                         seed=seed, block_size=block_size,
                         fingerprint=splits.cache_path.name)

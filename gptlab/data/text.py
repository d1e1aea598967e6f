"""Language-model data from local files (.txt, .jsonl/.json, .parquet), tokenized once and cached."""

from __future__ import annotations

from pathlib import Path

from gptlab.data import default_cache_dir
from gptlab.data.corpus import build_token_splits
from gptlab.data.files import check_file, load_documents, resolve_paths, source_key
from gptlab.data.lm import LMData


class TextData(LMData):
    """Files in order -> documents -> last `val_fraction` of characters is val; cache keyed by file contents."""

    def __init__(self, *, seed: int, block_size: int, cache_dir: Path | str | None = None, paths=None,
                 column: str = "text", tokenizer: str = "gpt2", bpe_vocab_size: int = 8192,
                 val_fraction: float = 0.1, num_proc: int | None = None):
        cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        files = resolve_paths(list(paths) if paths is not None and not isinstance(paths, str) else paths)
        hashes = [check_file(f) for f in files]  # validates every file before any loading
        docs = load_documents(files, column, cache_dir / "hf-datasets")
        splits = build_token_splits(
            docs, source_key=source_key(files, hashes, column), tokenizer=tokenizer,
            bpe_vocab_size=bpe_vocab_size, val_fraction=val_fraction, cache_dir=cache_dir, num_proc=num_proc,
        )
        self.files = files
        self.cache_path, self.from_cache = splits.cache_path, splits.from_cache
        super().__init__(name="text", tokenizer=splits.tokenizer, train=splits.train, val=splits.val,
                         seed=seed, block_size=block_size,
                         fingerprint=splits.cache_path.name)

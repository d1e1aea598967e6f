"""Language-model data from local files (.txt, .jsonl/.json, .parquet), tokenized once into cached shards."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from gptlab.data import default_cache_dir
from gptlab.data.corpus_data import CorpusData
from gptlab.data.files import content_hashes, resolve_paths, source_key
from gptlab.data.lm import (
    BpeSampleBytes,
    BpeVocabSize,
    DocMask,
    MaxTokens,
    NumProc,
    TokenizerName,
    ValFraction,
    Verify,
)
from gptlab.data.sources import FileSource
from gptlab.data.val_sets import ValSets, check_apart
from gptlab.util.checks import Text, rule


class TextData(CorpusData):
    """Files in order -> one token stream -> last `val_fraction` of tokens is val; cache keyed by file contents."""

    def __init__(
        self,
        *,
        seed: int,
        block_size: int,
        cache_dir: Path | str | None = None,
        paths: Annotated[list[str] | str | None, rule(check=Text(many=True))] = None,
        column: str = "text",
        tokenizer: TokenizerName = "gpt2",
        bpe_vocab_size: BpeVocabSize = 8192,
        val_fraction: ValFraction = 0.1,
        num_proc: NumProc = None,
        bpe_sample_bytes: BpeSampleBytes = 100_000_000,
        max_tokens: MaxTokens = None,
        verify: Verify = False,
        val_sets: ValSets = None,
        doc_mask: DocMask = False,
    ):
        cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        files = resolve_paths(list(paths) if paths is not None and not isinstance(paths, str) else paths)
        hashes = content_hashes(files, cache_dir, verify)  # validates each file version once, before any tokenizing
        check_apart(val_sets, files, hashes, cache_dir)  # a val set of training text: refused before tokenizing
        source = FileSource(files, column, source_key(files, hashes, column))
        self.files = files
        self._open_source(
            "text", source, seed=seed, block_size=block_size, cache_dir=cache_dir, num_proc=num_proc, verify=verify,
            val_sets=val_sets, doc_mask=doc_mask, tokenizer=tokenizer, bpe_vocab_size=bpe_vocab_size, val_fraction=val_fraction,
            bpe_sample_bytes=bpe_sample_bytes, max_tokens=max_tokens,
        )  # fmt: skip

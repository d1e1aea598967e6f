"""Language-model data from a Hugging Face dataset (hub name or local folder): downloaded whole, or streamed
(data.streaming=true, capped by data.max_tokens) straight into the same token shards as data=text."""

from __future__ import annotations

from pathlib import Path

from gptlab.data.corpus_data import CorpusData
from gptlab.data.hub import load_hub_source
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
from gptlab.data.val_sets import ValSets, check_apart
from gptlab.errors import ConfigError


class HFData(CorpusData):
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
        tokenizer: TokenizerName = "gpt2",
        bpe_vocab_size: BpeVocabSize = 8192,
        val_fraction: ValFraction = 0.01,
        num_proc: NumProc = None,
        streaming: bool = False,
        max_tokens: MaxTokens = None,
        bpe_sample_bytes: BpeSampleBytes = 100_000_000,
        verify: Verify = False,
        val_sets: ValSets = None,
        doc_mask: DocMask = False,
    ):
        if not name or not isinstance(name, str):
            raise ConfigError(
                f"data.name: got {name!r}; allowed: a hub dataset name like 'roneneldan/TinyStories' "
                f"or a local dataset folder"
            )
        check_apart(val_sets, [], hub=(name, config_name, split))  # the training split as a val set: refused
        source = load_hub_source(name, config_name, split, column, streaming, Path(cache_dir) if cache_dir else None)
        self.dataset_name = name
        self._open_source(
            "hf", source, seed=seed, block_size=block_size, cache_dir=cache_dir, num_proc=num_proc, verify=verify,
            val_sets=val_sets, doc_mask=doc_mask, tokenizer=tokenizer, bpe_vocab_size=bpe_vocab_size, val_fraction=val_fraction,
            bpe_sample_bytes=bpe_sample_bytes, max_tokens=max_tokens,
        )  # fmt: skip

"""The text choices' one path (shakespeare, text, hf): a document source -> cached token splits -> LM data, plus the
run's extra validation sets scored with its tokenizer."""

from __future__ import annotations

from pathlib import Path

from gptlab.data.corpus import build_token_splits
from gptlab.data.lm import LMData
from gptlab.data.val_sets import ValSets, check_held_out, open_val_sets

TRAINING_TEXT = {"shakespeare": "the bundled corpus, data=shakespeare", "text": "data.paths", "hf": "data.name"}


class CorpusData(LMData):
    """LMData over a document source tokenized into the token cache; each subclass builds only its source."""

    cache_path: Path
    from_cache: bool

    def _open_source(
        self,
        name: str,
        source,
        *,
        seed: int,
        block_size: int,
        cache_dir: Path | str | None,
        num_proc: int | None,
        verify: bool,
        val_sets: ValSets,
        doc_mask: bool = False,
        **tokens,
    ) -> None:
        """Tokenize `source` (build_token_splits with `tokens`: tokenizer, bpe_vocab_size, val_fraction, ...), open
        its train/val views as data `name` (`doc_mask`: with where each document starts), then open `val_sets` with the
        fitted tokenizer (each held out from the train split by content)."""
        try:
            splits = build_token_splits(
                source, cache_dir=cache_dir, num_proc=num_proc, verify=verify, documents=doc_mask, **tokens
            )
        finally:
            if hasattr(source, "close"):  # a hub source's Arrow copy is removed as soon as its tokens are cached
                source.close()
        self.cache_path, self.from_cache = splits.cache_path, splits.from_cache
        LMData.__init__(
            self,
            name=name,
            tokenizer=splits.tokenizer,
            train=splits.train,
            val=splits.val,
            seed=seed,
            block_size=block_size,
            fingerprint=splits.fingerprint,
            capped_at=splits.capped_at,
            documents=splits.documents,  # data.doc_mask: where each document starts, else None
        )
        self.val_sets = open_val_sets(
            val_sets, self.tokenizer, seed, self.seq_len, cache_dir, num_proc, verify, documents=doc_mask
        )
        check_held_out(self.val_sets, splits.train, splits.fingerprint, TRAINING_TEXT.get(name, f"data={name}"))

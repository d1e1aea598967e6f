"""The bundled Shakespeare corpus (nine plays, ~1.15 MB, see scripts/make_shakespeare_asset.py) as LM data."""

from __future__ import annotations

import gzip
import hashlib
from pathlib import Path

from gptlab.data.corpus_data import CorpusData
from gptlab.data.lm import BpeVocabSize, NumProc, TokenizerName, ValFraction, Verify
from gptlab.data.sources import TextSource
from gptlab.data.val_sets import ValSets
from gptlab.util.paths import ASSETS_DIR

ASSET = ASSETS_DIR / "shakespeare.txt.gz"


def load_shakespeare_text() -> str:
    """The whole bundled corpus as one string."""
    return gzip.decompress(ASSET.read_bytes()).decode("utf-8")


class ShakespeareData(CorpusData):
    """Bundled corpus as one document; val = the last `val_fraction` of its tokens."""

    def __init__(
        self,
        *,
        seed: int,
        block_size: int,
        cache_dir: Path | str | None = None,
        tokenizer: TokenizerName = "char",
        bpe_vocab_size: BpeVocabSize = 2048,
        val_fraction: ValFraction = 0.1,
        num_proc: NumProc = None,
        verify: Verify = False,
        val_sets: ValSets = None,
    ):
        raw = ASSET.read_bytes()
        source = TextSource(gzip.decompress(raw).decode("utf-8"), f"shakespeare:{hashlib.sha256(raw).hexdigest()}")
        self._open_source(
            "shakespeare", source, seed=seed, block_size=block_size, cache_dir=cache_dir, num_proc=num_proc,
            verify=verify, val_sets=val_sets, tokenizer=tokenizer, bpe_vocab_size=bpe_vocab_size,
            val_fraction=val_fraction,
        )  # fmt: skip

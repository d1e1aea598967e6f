"""The bundled Shakespeare corpus (nine plays, ~1.15 MB, see scripts/make_shakespeare_asset.py) as LM data."""

from __future__ import annotations

import gzip
import hashlib
import re
from pathlib import Path

from gptlab.data.corpus_data import CorpusData
from gptlab.data.lm import BpeVocabSize, DocMask, NumProc, TokenizerName, ValFraction, Verify
from gptlab.data.sources import TextSource
from gptlab.data.val_sets import ValSets
from gptlab.util.paths import ASSETS_DIR

ASSET = ASSETS_DIR / "shakespeare.txt.gz"


# each work opens with its title line, a blank line and "by William Shakespeare" (scripts/make_shakespeare_asset.py)
WORK_TITLE = re.compile(r"^[^\n]+(?=\n\nby William Shakespeare\n)", re.MULTILINE)


def load_shakespeare_text() -> str:
    """The whole bundled corpus as one string."""
    return gzip.decompress(ASSET.read_bytes()).decode("utf-8")


def work_starts(text: str) -> tuple[int, ...]:
    """Character offsets of each work's title line: the corpus's documents (data.doc_mask)."""
    return tuple(m.start() for m in WORK_TITLE.finditer(text))


class ShakespeareData(CorpusData):
    """Bundled corpus as one token stream (its nine works are its documents for data.doc_mask); val = the last
    `val_fraction` of its tokens."""

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
        doc_mask: DocMask = False,
    ):
        raw = ASSET.read_bytes()
        text = gzip.decompress(raw).decode("utf-8")
        source = TextSource(
            text, f"shakespeare:{hashlib.sha256(raw).hexdigest()}", work_starts(text) if doc_mask else ()
        )
        self._open_source(
            "shakespeare", source, seed=seed, block_size=block_size, cache_dir=cache_dir, num_proc=num_proc,
            verify=verify, val_sets=val_sets, doc_mask=doc_mask, tokenizer=tokenizer, bpe_vocab_size=bpe_vocab_size,
            val_fraction=val_fraction,
        )  # fmt: skip

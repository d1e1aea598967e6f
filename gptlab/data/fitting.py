"""The tokenizers fitted on the corpus itself (char, bpe): the sample they are fitted on, never reaching into the
validation tail, and how a fitted tokenizer is saved into a token-cache entry and opened again (gptlab/data/corpus.py)."""

from __future__ import annotations

from pathlib import Path

from gptlab.data.tokenizers import BPETokenizer, CharTokenizer, make_tokenizer
from gptlab.errors import ConfigError

FITTED = ("char", "bpe")  # tokenizers fitted on the corpus (on the fit sample)


def check_val_fraction(val_fraction) -> float:
    """`val_fraction` as a float in (0, 1), else a ConfigError."""
    if isinstance(val_fraction, bool) or not isinstance(val_fraction, (int, float)) or not 0 < val_fraction < 1:
        raise ConfigError(f"data.val_fraction: got {val_fraction!r}; allowed: a number strictly between 0 and 1")
    return float(val_fraction)


class FitSample:
    """The text a char/bpe tokenizer is fitted on: whole segments from the start, up to `limit` UTF-8 bytes (the
    first segment's prefix where even it is longer).

    Lazy and re-iterable (BPE hashes it, then trains on it); `segments` is how many segments it holds.
    """

    def __init__(self, source, limit: int):
        self.source, self.limit, self.segments = source, limit, 0
        self.prefix: str | None = None  # the first segment's prefix, when even it is past the limit

    def __iter__(self):
        used, n = 0, 0
        for text, _ in self.source.segments():
            size = len(text.encode("utf-8"))
            if used + size > self.limit:
                if n == 0:  # a corpus whose first segment is past the limit: its prefix, never an empty fit
                    n = 1  # (an empty fit gave a one-symbol vocabulary: every token id 0, a loss of 0)
                    self.prefix = text.encode("utf-8")[: self.limit].decode("utf-8", "ignore")
                    yield self.prefix
                break
            used, n = used + size, n + 1
            yield text
        self.segments = n


def fit_limit(source, bpe_sample_bytes: int, val_fraction: float) -> int:
    """Bytes of the fit sample: data.bpe_sample_bytes, never more than the share of the input before val."""
    total = source.total_bytes
    return bpe_sample_bytes if total is None else min(bpe_sample_bytes, int(total * (1 - val_fraction)))


def save_tokenizer(tok, folder: Path) -> dict:
    """What reopens a fitted tokenizer: its characters, or its tokenizer.json written into folder (index.json
    keeps the returned dict as tokenizer_state); {} for the fixed ones."""
    if isinstance(tok, CharTokenizer):
        return {"chars": tok.chars}
    if isinstance(tok, BPETokenizer):
        tok._tok.save(str(folder / "tokenizer.json"))
        return {"train_sha256": tok.train_sha256}
    return {}


def load_tokenizer(name: str, folder: Path, state: dict, cache_dir: Path):
    """The tokenizer save_tokenizer recorded (char, bpe), or the fixed one of that name."""
    if name == "char":
        return CharTokenizer(state["chars"])
    if name == "bpe":
        from tokenizers import Tokenizer

        return BPETokenizer(Tokenizer.from_file(str(folder / "tokenizer.json")), state["train_sha256"])
    return make_tokenizer(name, "", cache_dir)

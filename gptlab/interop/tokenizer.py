"""A run's tokenizer as a Hugging Face fast tokenizer (tokenizer.json + tokenizer_config.json), checked to encode and
decode exactly as gptlab's does.

- gpt2: GPT-2's own BPE from the vocab files gptlab ships (encoder.json + vocab.bpe = HF's vocab.json + merges.txt);
- bpe: the run's trained byte-level BPE itself (HF `tokenizers`);
- byte: a byte-level model with 256 ids, id = the UTF-8 byte, no merges;
- char: one id per character of the run's vocabulary, U+FFFD (its unknown character) for any other.

One difference is known and documented: gptlab encodes the text "<|endoftext|>" as ordinary characters (gpt2, bpe),
where an HF tokenizer reads it as the special token.
"""

from __future__ import annotations

from gptlab.data.tokenizers import END_OF_TEXT, UNKNOWN_CHAR, BPETokenizer, ByteTokenizer, CharTokenizer, GPT2Tokenizer
from gptlab.errors import ConfigError
from gptlab.util.extras import require

# text the HF tokenizer must encode and decode exactly as gptlab's: ASCII, digits, runs of spaces, tabs, newlines,
# accents, CJK, an emoji (4 UTF-8 bytes), contractions
PROBE = "Hello world! It's 2026: 3.14 café, naïve —  東京 🙂\n\n\tx  y\r\nshe'll've THE end."


def _gpt2_files():
    from gptlab.data import tokenizers

    return tokenizers._gpt2_files()  # checked against GPT-2's published hashes


def _byte_level_chars() -> dict[int, str]:
    """GPT-2's byte -> printable character table (what HF's ByteLevel pre-tokenizer maps each byte to)."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return bytes_to_unicode()


def _backend(tok):
    """The `tokenizers.Tokenizer` computing `tok`'s ids, and its special tokens (eos, unk)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    if isinstance(tok, GPT2Tokenizer):
        files = _gpt2_files()
        bpe = models.BPE.from_file(str(files["encoder.json"]), str(files["vocab.bpe"]))
        backend = Tokenizer(bpe)
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        backend.decoder = decoders.ByteLevel()
        return backend, {"eos_token": END_OF_TEXT, "bos_token": END_OF_TEXT, "unk_token": END_OF_TEXT}
    if isinstance(tok, BPETokenizer):
        return Tokenizer.from_str(tok._tok.to_str()), {"eos_token": END_OF_TEXT}
    if isinstance(tok, ByteTokenizer):
        chars = _byte_level_chars()
        backend = Tokenizer(models.BPE({chars[b]: b for b in range(256)}, []))
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        backend.decoder = decoders.ByteLevel()
        return backend, {}
    if isinstance(tok, CharTokenizer):
        vocab = {c: i for i, c in enumerate(tok.chars)}
        backend = Tokenizer(models.BPE(vocab, [], unk_token=UNKNOWN_CHAR))
        backend.decoder = decoders.Fuse()
        return backend, {"unk_token": UNKNOWN_CHAR}
    raise ConfigError(f"tokenizer {tok!r}: no Hugging Face form (allowed: char, byte, bpe, gpt2)")


def to_hf_tokenizer(tok):
    """A transformers PreTrainedTokenizerFast that maps text to the ids `tok` does (checked on PROBE)."""
    require("transformers", "hf", "a Hugging Face tokenizer")
    from transformers import PreTrainedTokenizerFast

    backend, special = _backend(tok)
    hf = PreTrainedTokenizerFast(tokenizer_object=backend, clean_up_tokenization_spaces=False, **special)
    hf.model_max_length = 10**9  # the model's length lives in its config (n_positions)
    check_same(hf, tok, f"data.tokenizer={tok.name}")
    return hf


def check_same(hf, tok, what: str) -> None:
    """One-line ConfigError unless `hf` encodes PROBE to `tok`'s ids and decodes them back to the same text."""
    ids = tok.encode(PROBE)
    got = hf(PROBE, add_special_tokens=False)["input_ids"]
    if got != ids:
        first = next((i for i, (a, b) in enumerate(zip(got, ids)) if a != b), min(len(got), len(ids)))
        raise ConfigError(
            f"{what}: the Hugging Face tokenizer encodes differently from gptlab's (first at token {first})"
        )
    if hf.decode(ids) != tok.decode(ids):
        raise ConfigError(f"{what}: the Hugging Face tokenizer decodes differently from gptlab's")

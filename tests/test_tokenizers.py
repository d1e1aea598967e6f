"""Tokenizers: the real GPT-2 BPE offline, exact round-trips on real text, vocabularies, bpe caching, errors."""

from __future__ import annotations

import pytest

from gptlab.data import Tokenizer
from gptlab.data import tokenizers as tk
from gptlab.data.shakespeare import load_shakespeare_text
from gptlab.data.tokenizers import make_tokenizer
from gptlab.errors import ConfigError


@pytest.fixture(scope="module")
def corpus() -> str:
    """~120 KB of real text from the bundled corpus (the start of Hamlet)."""
    return load_shakespeare_text()[:120_000]


def test_gpt2_is_the_real_gpt2_bpe(tmp_path):
    tok = make_tokenizer("gpt2", "", tmp_path)
    assert tok.encode("Hello world") == [15496, 995]
    assert tok.encode(" the") == [262]
    assert (tok.vocab_size, tok.eot_id) == (50257, 50256)
    assert tok.decode([15496, 995]) == "Hello world"
    # the special token's text is ordinary text inside data, never the special id
    assert 50256 not in tok.encode("a <|endoftext|> b")


@pytest.mark.parametrize("name", ["char", "byte", "gpt2", "bpe"])
def test_round_trip_on_real_text(name, corpus, tmp_path):
    tok = make_tokenizer(name, corpus, tmp_path, bpe_vocab_size=600)
    assert isinstance(tok, Tokenizer)
    ids = tok.encode(corpus)
    assert tok.decode(ids) == corpus
    assert all(0 <= i < tok.vocab_size for i in ids)
    assert tok.encode_batch([corpus[:500], corpus[500:900]]) == [tok.encode(corpus[:500]), tok.encode(corpus[500:900])]
    if name in ("gpt2", "bpe"):
        assert len(ids) < 0.6 * len(corpus)  # subword merges really happened


@pytest.mark.parametrize("name", ["byte", "gpt2", "bpe"])
def test_byte_level_tokenizers_round_trip_any_unicode(name, corpus, tmp_path):
    tok = make_tokenizer(name, corpus, tmp_path, bpe_vocab_size=400)
    text = "Grüße, 世界 — naïve café\n\ttabs  and  spaces 🙂"
    assert tok.decode(tok.encode(text)) == text


def test_char_vocabulary_is_sorted_corpus_chars_plus_replacement(tmp_path):
    tok = make_tokenizer("char", ["hello ", "world"], tmp_path)
    assert tok.chars == "".join(sorted(set("hello world"))) + "\ufffd"
    assert tok.vocab_size == 9
    assert tok.encode("hold") == [tok.chars.index(c) for c in "hold"]
    # characters never seen in the fitting text map to U+FFFD instead of failing
    assert tok.decode(tok.encode("hex!")) == "he\ufffd\ufffd"
    assert tok.identity() != make_tokenizer("char", "hello", tmp_path).identity()


def test_byte_tokenizer_is_utf8():
    tok = make_tokenizer("byte", "", ".")
    assert tok.vocab_size == 256 and tok.eot_id is None
    assert tok.encode("é!") == [0xC3, 0xA9, 0x21]


def test_bpe_vocab_size_and_eot(corpus, tmp_path):
    tok = make_tokenizer("bpe", corpus, tmp_path, bpe_vocab_size=500)
    assert tok.vocab_size == 500
    assert tok.eot_id == 0 and tok.decode([0]) == tk.END_OF_TEXT
    assert len(tok.encode(corpus)) < 0.6 * len(corpus)  # merges learned from the text compress it


def test_bpe_is_cached_by_text_hash_and_vocab_size(corpus, tmp_path, monkeypatch):
    first = make_tokenizer("bpe", corpus, tmp_path, bpe_vocab_size=400)
    files = sorted(p.name for p in (tmp_path / "tokenizers").iterdir())
    assert files == [f"bpe-400-{tk.text_sha256(corpus)[:24]}.json"]

    def no_training(*args, **kwargs):
        raise AssertionError("retrained although a cached tokenizer exists")

    monkeypatch.setattr(tk, "_train_bpe", no_training)
    again = make_tokenizer("bpe", corpus, tmp_path, bpe_vocab_size=400)
    assert again.identity() == first.identity()
    assert again.encode(corpus[:2000]) == first.encode(corpus[:2000])
    with pytest.raises(AssertionError, match="retrained"):
        make_tokenizer("bpe", corpus, tmp_path, bpe_vocab_size=401)  # another size is another key
    with pytest.raises(AssertionError, match="retrained"):
        make_tokenizer("bpe", corpus[:-1], tmp_path, bpe_vocab_size=400)  # other text, other key


def test_text_hash_counts_piece_boundaries():
    assert tk.text_sha256(["ab", "c"]) != tk.text_sha256(["a", "bc"])
    assert tk.text_sha256("abc") == tk.text_sha256(["abc"])


def test_unknown_tokenizer_message(tmp_path):
    with pytest.raises(ConfigError) as err:
        make_tokenizer("x", "", tmp_path)
    assert str(err.value) == "data.tokenizer: unknown tokenizer 'x'; allowed: bpe, byte, char, gpt2"


@pytest.mark.parametrize("bad", [0, 256, 12.5, "big"])
def test_bad_bpe_vocab_size(bad, tmp_path):
    with pytest.raises(ConfigError, match=r"^data\.bpe_vocab_size: got .*; allowed: an integer >= 257$"):
        make_tokenizer("bpe", "some text", tmp_path, bpe_vocab_size=bad)


@pytest.mark.parametrize("name", ["gpt2", "bpe"])
@pytest.mark.parametrize("limit", [64, 300, 4096])
def test_segments_tokenize_as_the_whole_text_does(name, limit, corpus, tmp_path):
    """Text is tokenized segment by segment (data/sources.py): every cut must fall where GPT-2's pre-tokenizer splits
    the whole text anyway. Cut after any newline, "\\n\\n" before an indented line gave 198 198 for GPT-2's 628: the
    bundled corpus in 71 segments read 360,574 tokens, the whole text 360,579 (now equal)."""
    from gptlab.data.sources import cut_segments

    tok = make_tokenizer(name, corpus, tmp_path, bpe_vocab_size=600)
    text = corpus[:60_000] + "one\n\n  two\n\n\nthree   four\r\nfive\n \n six \n\n\n"
    segments = [s for s, _ in cut_segments(text, True, limit)]
    assert "".join(segments) == text and max(map(len, segments)) <= limit and len(segments) > 60_000 // limit
    assert [i for s in segments for i in tok.encode(s)] == tok.encode(text)


def test_a_window_without_a_safe_cut_is_cut_at_its_limit():
    """One word longer than a segment has no point where the pre-tokenizer splits: it is cut where the window ends
    (the one place segments can tokenize differently from the whole text)."""
    from gptlab.data.sources import cut_segments

    assert list(cut_segments("x" * 10, True, 4)) == [("xxxx", False), ("xxxx", False), ("xx", True)]
    assert list(cut_segments("ab cd\nef", False, 6)) == [("ab cd\n", False), ("ef", False)]  # after the line
    assert list(cut_segments("ab cd  ef", False, 6)) == [("ab cd ", False), (" ef", False)]  # before the word

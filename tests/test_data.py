"""Data choices: deterministic pure batches, LM shift, local files + token cache, MQAR targets, one-line errors."""

from __future__ import annotations

import gzip
import json
import logging
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from gptlab.data import Data, encode
from gptlab.data.assoc_recall import AssocRecallData
from gptlab.data.hf import HFData
from gptlab.data.shakespeare import ASSET, ShakespeareData, load_shakespeare_text
from gptlab.data.text import TextData
from gptlab.errors import ConfigError
from helpers.paths import CONF_DIR

PLAY = "\n".join(f"Line {i}: to be, or not to be, that is the question {i % 7}." for i in range(400)) + "\n"


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """One token cache for the module, so the bundled corpus is tokenized once."""
    return tmp_path_factory.mktemp("gptlab-cache")


def shakespeare(cache, seed=0, **kw) -> ShakespeareData:
    return ShakespeareData(seed=seed, block_size=32, cache_dir=cache, **kw)


def assert_same_batches(a, b):
    assert len(a) == len(b)
    for (xa, ya), (xb, yb) in zip(a, b):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)


def one_line_error(fn, *patterns) -> str:
    """Run fn, expect a ConfigError whose single-line message contains every pattern."""
    with pytest.raises(ConfigError) as err:
        fn()
    msg = str(err.value)
    assert "\n" not in msg
    for p in patterns:
        assert p in msg, msg
    return msg


def test_bundled_corpus_and_split(cache):
    text = load_shakespeare_text()
    assert 1_100_000 < len(text) < 1_200_000 and text.startswith("HAMLET, PRINCE OF DENMARK")
    assert gzip.decompress(ASSET.read_bytes()).decode() == text
    d = shakespeare(cache)
    train, val = d.train_tokens, d.val_tokens
    assert isinstance(d, Data) and d.reports_accuracy is False
    assert (d.vocab_size, d.seq_len, train.dtype) == (len(set(text)) + 1, 32, np.uint16)  # + U+FFFD
    # char tokens == characters: val is the last 10% of the token stream (no end-of-text token for char)
    assert len(train) + len(val) == len(text) and len(val) == int(0.1 * len(text))
    assert d.tokenizer.decode(val[:40].tolist()) == text[len(train) : len(train) + 40]
    assert d.sample_prompt() == text[len(train) :].splitlines()[0]


def test_same_seed_same_samples_other_seed_differs(cache):
    a, b, c = shakespeare(cache, seed=3), shakespeare(cache, seed=3), shakespeare(cache, seed=4)
    assert b.from_cache and a.fingerprint == c.fingerprint  # the seed picks samples, the fingerprint names the data
    for first in (0, 28, 123456):
        assert_same_batches([a.train_samples(first, 4)], [b.train_samples(first, 4)])
        assert not torch.equal(a.train_samples(first, 4)[0], c.train_samples(first, 4)[0])
    assert_same_batches([a.val_samples(12)], [b.val_samples(12)])
    assert not torch.equal(a.val_samples(4)[0], c.val_samples(4)[0])
    assert not torch.equal(a.train_samples(4, 4)[0], a.train_samples(8, 4)[0])


@pytest.mark.parametrize("make", ["shakespeare", "assoc_recall"])
def test_sample_i_depends_only_on_seed_and_i(cache, make):
    """The training stream is a pure function of the global sample index: any split into micro-batches or ranks
    (grad_accum, world size, batch size) sees the same sequences in the same order; val sets are prefixes."""
    d = shakespeare(cache, seed=1) if make == "shakespeare" else AssocRecallData(seed=1, block_size=64)
    whole_x, whole_y = d.train_samples(40, 24)
    for parts in ([24], [12, 12], [6, 6, 6, 6], [8, 4, 12], [1] * 24):
        first, xs, ys = 40, [], []
        for n in parts:
            x, y = d.train_samples(first, n)
            xs.append(x), ys.append(y)
            first += n
        assert torch.equal(torch.cat(xs), whole_x) and torch.equal(torch.cat(ys), whole_y)
    vx, vy = d.val_samples(16)
    assert torch.equal(d.val_samples(5)[0], vx[:5]) and torch.equal(d.val_samples(5)[1], vy[:5])
    assert not any(torch.equal(vx[i], whole_x[j]) for i in range(16) for j in range(24))


def test_train_samples_are_pure_and_lm_shifted(cache):
    d = shakespeare(cache, seed=1)
    later = d.train_samples(400, 8)
    for first in range(5):  # other calls in between change nothing
        d.train_samples(first * 8, 8)
        d.val_samples(16)
    x, y = d.train_samples(400, 8)
    assert torch.equal(x, later[0]) and torch.equal(y, later[1])
    assert x.shape == y.shape == (8, 32) and x.dtype == y.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])  # y is x shifted by one
    text = load_shakespeare_text()
    window = d.tokenizer.decode(x[0].tolist()) + d.tokenizer.decode([y[0, -1].item()])
    assert window in text  # a real contiguous window of the corpus
    assert int(x.max()) < d.vocab_size and int(y.min()) >= 0


@pytest.mark.parametrize("tokenizer", ["byte", "gpt2", "bpe"])
def test_shakespeare_other_tokenizers(cache, tokenizer):
    d = shakespeare(cache, tokenizer=tokenizer, bpe_vocab_size=512)
    x, y = d.train_samples(0, 2)
    assert x.shape == (2, 32) and int(x.max()) < d.vocab_size
    assert d.vocab_size == {"byte": 256, "gpt2": 50257, "bpe": 512}[tokenizer]
    assert d.tokenizer.decode(d.val_tokens[:64].tolist()) in load_shakespeare_text()


def write_files(tmp_path):
    """The same three documents as .txt files, one .jsonl and one .parquet (column 'body')."""
    docs = [PLAY, PLAY.upper(), PLAY.replace("question", "answer")]
    for i, doc in enumerate(docs):
        (tmp_path / f"doc{i}.txt").write_text(doc)
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps({"body": d, "id": i}) + "\n" for i, d in enumerate(docs)))
    pq.write_table(pa.table({"body": docs, "id": [0, 1, 2]}), tmp_path / "docs.parquet")
    return docs


@pytest.mark.parametrize("pattern,column", [("doc*.txt", "text"), ("docs.jsonl", "body"), ("docs.parquet", "body")])
def test_text_files_give_lm_batches(tmp_path, pattern, column):
    docs = write_files(tmp_path)
    d = TextData(
        seed=0,
        block_size=16,
        cache_dir=tmp_path / "cache",
        paths=[str(tmp_path / pattern)],
        column=column,
        tokenizer="gpt2",
    )
    assert isinstance(d, Data) and d.vocab_size == 50257 and d.seq_len == 16
    x, y = d.train_samples(0, 4)
    assert x.shape == y.shape == (4, 16) and torch.equal(x[:, 1:], y[:, :-1])
    assert d.train_tokens.dtype == np.uint16
    # every document ends with <|endoftext|>; the split reassembles the documents in order
    all_ids = np.concatenate([d.train_tokens, d.val_tokens]).tolist()
    assert all_ids.count(50256) == 3
    assert d.tokenizer.decode(all_ids) == "<|endoftext|>".join(docs) + "<|endoftext|>"


def test_token_cache_is_reused(tmp_path, monkeypatch):
    write_files(tmp_path)
    kw = dict(
        seed=0,
        block_size=16,
        cache_dir=tmp_path / "cache",
        paths=[str(tmp_path / "*.txt")],
        tokenizer="bpe",
        bpe_vocab_size=300,
    )
    first = TextData(**kw)
    assert not first.from_cache
    assert first.cache_path.parent == tmp_path / "cache" / "tokens"
    index = json.loads((first.cache_path / "index.json").read_text())
    assert index["tokens"] == len(first.train_tokens) + len(first.val_tokens) == sum(index["lengths"])

    def no_tokenizing(*args, **kwargs):
        raise AssertionError("tokenized again")

    monkeypatch.setattr(encode, "tokenize_source", no_tokenizing)
    second = TextData(**kw)
    assert second.from_cache and second.cache_path == first.cache_path
    assert np.array_equal(second.train_tokens, first.train_tokens)
    assert_same_batches([second.val_samples(6)], [first.val_samples(6)])
    assert second.fingerprint == first.fingerprint
    (tmp_path / "doc2.txt").write_text(PLAY + "one more line\n")  # new content -> new key -> tokenizes
    with pytest.raises(AssertionError, match="tokenized again"):
        TextData(**kw)
    monkeypatch.undo()
    assert TextData(**kw).fingerprint != first.fingerprint  # a resume can tell the corpus changed


def test_mixed_file_types_and_char_tokenizer(tmp_path):
    docs = write_files(tmp_path)
    d = TextData(
        seed=0,
        block_size=16,
        cache_dir=tmp_path / "c",
        paths=[str(tmp_path / "doc0.txt"), str(tmp_path / "docs.parquet")],
        column="body",
        tokenizer="char",
    )
    ids = np.concatenate([d.train_tokens, d.val_tokens]).tolist()
    text = PLAY + "".join(docs)  # .txt first, then parquet rows; char has no end token
    # char is fitted on whole segments inside the first 90 %: "w" (only in the last document, "answer") is unseen
    fitted = set(d.tokenizer.chars) - {"\ufffd"}
    assert fitted <= set(text[: len(d.train_tokens)]) and "w" not in fitted
    assert d.tokenizer.decode(ids) == "".join(c if c in fitted else "\ufffd" for c in text)


def test_assoc_recall_targets():
    d = AssocRecallData(seed=0, block_size=64, num_keys=20, num_values=10, num_pairs=6, num_queries=4, seq_len=24)
    assert isinstance(d, Data) and d.reports_accuracy and (d.vocab_size, d.seq_len) == (31, 24)
    x, y = d.train_samples(160, 32)
    assert x.shape == y.shape == (32, 24)
    for row_x, row_y in zip(x.tolist(), y.tolist()):
        keys, values = row_x[0:12:2], row_x[1:12:2]
        assert len(set(keys)) == 6 and all(k < 20 for k in keys) and all(20 <= v < 30 for v in values)
        pairs = dict(zip(keys, values))
        queries = row_x[12:20:2]
        assert len(set(queries)) == 4 and all(q in pairs for q in queries)
        assert row_x[13:20:2] == [pairs[q] for q in queries]  # each query is followed by its answer
        assert row_x[20:] == [30] * 4  # padding
        expected = [-100] * 24
        for pos in range(12, 20, 2):
            expected[pos] = pairs[row_x[pos]]
        assert row_y == expected
    again = AssocRecallData(seed=0, block_size=64, num_keys=20, num_values=10, num_pairs=6, num_queries=4, seq_len=24)
    assert_same_batches([again.train_samples(160, 32)], [(x, y)])
    assert_same_batches([again.val_samples(16)], [d.val_samples(16)])
    assert not torch.equal(d.val_samples(32)[0], x)


def test_yaml_choices_instantiate(cache):
    names = sorted(p.stem for p in (CONF_DIR / "data").glob("*.yaml"))
    assert names == ["assoc_recall", "hf", "shakespeare", "text"]
    for name in ("shakespeare", "assoc_recall"):
        cfg = OmegaConf.load(CONF_DIR / "data" / f"{name}.yaml")
        assert cfg._partial_ is True
        d = instantiate(cfg)(seed=0, block_size=64, cache_dir=cache)
        assert d.name == name and d.train_samples(0, 2)[0].shape == (2, d.seq_len)


def test_file_errors(tmp_path):
    mk = lambda **kw: TextData(seed=0, block_size=16, cache_dir=tmp_path / "c", **kw)  # noqa: E731
    one_line_error(lambda: mk(paths=[]), "data.paths: no files given")
    one_line_error(lambda: mk(paths=None), "data.paths: no files given")
    one_line_error(lambda: mk(paths=[str(tmp_path / "nope*.txt")]), "data.paths: no file matches", "nope*.txt")
    one_line_error(lambda: mk(paths=[str(tmp_path / "missing.txt")]), "no file matches", "missing.txt")
    (tmp_path / "empty.txt").write_text("")
    one_line_error(lambda: mk(paths=[str(tmp_path / "empty.txt")]), "empty.txt' is empty")
    (tmp_path / "latin1.txt").write_bytes("caf\xe9 au lait".encode("latin-1"))
    one_line_error(lambda: mk(paths=[str(tmp_path / "latin1.txt")]), "latin1.txt' is not valid UTF-8", "offset 3")
    (tmp_path / "data.csv").write_text("a,b\n")
    one_line_error(lambda: mk(paths=[str(tmp_path / "data.csv")]), "unsupported file type '.csv'", ".parquet")
    (tmp_path / "short.txt").write_text("tiny text\n" * 3)
    one_line_error(
        lambda: mk(paths=[str(tmp_path / "short.txt")], tokenizer="byte"),
        "split of 'text' has",
        "tokens but model.block_size=16 needs at least 17",
    )
    write_files(tmp_path)
    one_line_error(
        lambda: mk(paths=[str(tmp_path / "docs.jsonl")], column="content"),
        "data.column: column 'content' not found",
        "body",
    )
    one_line_error(lambda: mk(paths=[str(tmp_path / "doc0.txt")], val_fraction=1.5), "data.val_fraction: got 1.5")


def test_assoc_recall_errors():
    mk = lambda **kw: AssocRecallData(seed=0, **{"block_size": 64, **kw})  # noqa: E731
    one_line_error(lambda: mk(seq_len=128), "data.seq_len", "model.block_size=64")
    one_line_error(lambda: mk(num_pairs=20, num_queries=20, seq_len=64), "data.seq_len: got 64", "80")
    one_line_error(lambda: mk(num_keys=4, num_pairs=5), "data.num_pairs")
    one_line_error(lambda: mk(num_pairs=3, num_queries=4), "data.num_queries")
    one_line_error(lambda: mk(num_values=0), "data.num_values: got 0")


def test_assoc_recall_default_needs_recall_and_queries_equal_to_pairs_warn(caplog):
    """The shipped default asks fewer queries than pairs (no query answerable by elimination); asking every key
    logs one warning that names both keys; fewer queries log none."""
    cfg = OmegaConf.load(CONF_DIR / "data" / "assoc_recall.yaml")
    assert (cfg.num_pairs, cfg.num_queries) == (16, 8)
    with caplog.at_level(logging.WARNING, logger="gptlab.data.assoc_recall"):
        instantiate(cfg)(seed=0, block_size=64)
        AssocRecallData(seed=0, block_size=64)  # the class's own defaults agree with the YAML
        assert caplog.records == []
        AssocRecallData(seed=0, block_size=64, num_pairs=8, num_queries=8, seq_len=32)
    (record,) = caplog.records
    assert record.levelno == logging.WARNING
    assert record.getMessage().startswith("data.num_queries == data.num_pairs (8): every key is asked")
    assert "data.num_queries=4" in record.getMessage()


def test_hub_dataset_offline_fails_at_once(tmp_path):
    start = time.monotonic()
    msg = one_line_error(lambda: HFData(seed=0, block_size=16, cache_dir=tmp_path, name="nobody/no-such-set"))
    assert msg == (
        "data.name: hub dataset 'nobody/no-such-set' is not available offline (HF_HUB_OFFLINE=1); "
        "use data=text with local files"
    )
    assert time.monotonic() - start < 5


def jsonl(path, *texts: str):
    """A .jsonl file whose rows are written as JSON spells them (so a lone surrogate stays \\ud800 on disk)."""
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return path


@pytest.mark.parametrize("suffix", [".jsonl", ".json"])
def test_a_lone_surrogate_in_json_text_is_refused_naming_its_row(tmp_path, suffix):
    rows = [PLAY, "fine text, é ✓", "half a pair \ud83d here"]
    path = tmp_path / f"docs{suffix}"
    if suffix == ".json":
        path.write_text(json.dumps([{"text": t} for t in rows]))
    else:
        jsonl(path, *rows)
    assert "\\ud83d" in path.read_text()
    with pytest.raises(ConfigError) as err:
        TextData(seed=0, block_size=16, cache_dir=tmp_path / "c", paths=[str(path)], tokenizer="byte")
    assert str(err.value) == (
        f"data.paths: docs{suffix} row 3: column 'text' holds a lone surrogate (\\ud83d at character 12), which is "
        f"not text; fix or drop that row"
    )
    assert not [p for p in (tmp_path / "c" / "tokens").iterdir() if p.is_dir()]  # no entry, no partial build


@pytest.mark.parametrize(
    "tokenizer, max_tokens, message",
    [
        ("byte", 10, "data: the train split of 'text' has 9 tokens but model.block_size=16 needs at least 17; "),
        ("byte", 100, "data: the val split of 'text' has 10 tokens but model.block_size=16 needs at least 17; "),
        ("char", 500, "data.max_tokens=500: the char tokenizer is fitted on the first "),
    ],
)
def test_a_tiny_max_tokens_is_refused_naming_it(tmp_path, tokenizer, max_tokens, message):
    path = tmp_path / "play.txt"
    path.write_text(PLAY)
    with pytest.raises(ConfigError) as err:
        TextData(
            seed=0,
            block_size=16,
            cache_dir=tmp_path / "c",
            paths=[str(path)],
            tokenizer=tokenizer,
            max_tokens=max_tokens,
        )
    assert str(err.value).startswith(message) and "\n" not in str(err.value)
    assert "data.max_tokens" in str(err.value)
    enough = TextData(
        seed=0, block_size=16, cache_dir=tmp_path / "c", paths=[str(path)], tokenizer="byte", max_tokens=400
    )
    assert (len(enough.train_tokens), len(enough.val_tokens)) == (360, 40)


def test_max_tokens_stopping_inside_the_fitting_text_is_refused_not_leaked(tmp_path, monkeypatch):
    """4 KB chunks, a 90 KB corpus, the char tokenizer fitted on its first 90%: data.max_tokens=5000 stops the stream
    two chunks in, before the fitting text's end is seen. That end was then recorded as 0, so neither the refusal
    nor the train extension fired, and all 500 val tokens were text the tokenizer was fitted on."""
    monkeypatch.setattr(encode, "CHUNK_CHARS", 1 << 12)
    path = tmp_path / "play.txt"
    path.write_text(PLAY * (90_000 // len(PLAY) + 1))
    with pytest.raises(ConfigError) as err:
        TextData(seed=0, block_size=16, cache_dir=tmp_path / "c", paths=[str(path)], tokenizer="char", max_tokens=5000)
    assert str(err.value) == (
        "data.max_tokens=5000: the char tokenizer is fitted on text that runs past all 5,000 tokens kept and keeps "
        "that text out of validation, so no val text is left; allowed: null, more tokens than its fitting text "
        "holds, or a lower data.bpe_sample_bytes"
    )


def test_token_ids_out_of_range_in_a_cache_shard_are_refused_naming_the_entry(tmp_path, monkeypatch, capsys):
    from gptlab.cli import cache as cache_cli

    monkeypatch.setenv("GPTLAB_CACHE", str(tmp_path / "c"))
    path = tmp_path / "play.txt"
    path.write_text(PLAY)
    kw = dict(seed=0, block_size=16, cache_dir=tmp_path / "c", paths=[str(path)], tokenizer="char")
    data = TextData(**kw)
    want = data.train_samples(0, 64)
    key = data.cache_path.name
    shard = np.memmap(data.cache_path / "shard_00000.bin", dtype=np.uint16, mode="r+")
    hint = f"delete that folder and run again to rebuild it (gptlab-cache rm {key[:12]})"

    shard[len(shard) // 2] = 60000  # one bit-flipped id mid-shard: index.json's max_id still says all is well
    shard.flush()
    corrupt = TextData(**kw)  # opens (its first windows are fine) ...
    with pytest.raises(ConfigError) as err:  # ... and refuses the window that reaches the bad id
        for first in range(0, 20_000, 256):
            corrupt.train_samples(first, 256)
    assert str(err.value) == (
        f"data: the token cache '{data.cache_path}' is corrupt (shard_00000.bin holds token id 60000, the tokenizer "
        f"has {data.vocab_size} ids); {hint}"
    )
    shard[:] = 60000  # the whole shard overwritten: refused when the data is built, before any run file
    shard.flush()
    with pytest.raises(ConfigError, match=rf"holds token id 60000, the tokenizer has {data.vocab_size} ids\); "):
        TextData(**kw)
    assert cache_cli.main(["rm", key[:12]]) == 0 and "removed" in capsys.readouterr().out  # the hint works
    rebuilt = TextData(**kw)
    assert not rebuilt.from_cache
    assert all(torch.equal(a, b) for a, b in zip(rebuilt.train_samples(0, 64), want))

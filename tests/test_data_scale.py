"""Data at scale: token shards (windows across boundaries), kill -9 resume, cheap cache hits, verify, progress,
streaming from a local dataset folder, bad input mid-stream, flat memory on a large generated corpus."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from gptlab.data import encode, files
from gptlab.data.hf import HFData
from gptlab.data.shards import ShardWriter, TokenStream, open_shards
from gptlab.data.text import TextData
from gptlab.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]
WORDS = "the of and to in is that it was for on are with as his they be at one have this from or had by".split()


def write_corpus(path: Path, n_lines: int, seed: int = 0) -> str:
    """A generated .txt of n_lines lines of random words (one document)."""
    rng = np.random.default_rng(seed)
    words = np.array(WORDS)[rng.integers(0, len(WORDS), size=(n_lines, 12))]
    text = "\n".join(" ".join(row) for row in words) + "\n"
    path.write_text(text)
    return text


def test_token_stream_windows_match_one_array(tmp_path):
    """Windows gathered across shard boundaries equal fancy indexing into the concatenated array."""
    writer = ShardWriter(tmp_path / "s", np.uint16, shard_tokens=7)
    ids = np.arange(50, dtype=np.uint16) * 3
    writer.append(ids[:20], {"chunk": 0})
    writer.append(ids[20:], {"chunk": 1})
    writer.finish({})
    shards, index = open_shards(tmp_path / "s")
    assert index["lengths"] == [7] * 7 + [1] and index["max_id"] == 147
    view = TokenStream(shards, 5, 45)  # (40,) tokens 5..44
    starts = np.array([0, 1, 2, 6, 13, 20, 30])
    expected = ids[5:45][starts[:, None] + np.arange(10)]
    assert np.array_equal(view.windows(starts, 10), expected)
    assert np.array_equal(np.asarray(view), ids[5:45]) and view[3] == ids[8] and list(view[:3]) == list(ids[5:8])


def test_small_shards_give_the_same_batches(tmp_path, monkeypatch):
    write_corpus(tmp_path / "a.txt", 3000)
    kw = dict(seed=3, block_size=64, paths=[str(tmp_path / "a.txt")], tokenizer="gpt2")
    one = TextData(cache_dir=tmp_path / "c1", **kw)
    monkeypatch.setenv("GPTLAB_SHARD_TOKENS", "1000")
    many = TextData(cache_dir=tmp_path / "c2", **kw)
    assert len(list(many.cache_path.glob("shard_*.bin"))) > 20 and len(list(one.cache_path.glob("shard_*.bin"))) == 1
    assert many.fingerprint == one.fingerprint  # same stream, same split: shard size is storage only
    for a, b in ((one.train_samples(0, 64), many.train_samples(0, 64)), (one.val_samples(32), many.val_samples(32))):
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_cache_hit_does_not_reread_files_unless_verify(tmp_path, monkeypatch):
    path = tmp_path / "a.txt"
    write_corpus(path, 50_000)  # ~3 MB: 16 sampled blocks of 64 KiB cover a third of it
    kw = dict(seed=0, block_size=32, cache_dir=tmp_path / "c", paths=[str(path)], tokenizer="gpt2")
    first = TextData(**kw)
    calls = []
    real = files.check_file
    monkeypatch.setattr(files, "check_file", lambda p: calls.append(p) or real(p))
    second = TextData(**kw)
    assert second.from_cache and calls == [] and second.fingerprint == first.fingerprint
    TextData(**kw, verify=True)
    assert calls == [path.resolve()]  # verify re-hashes in full
    # the same size and mtime, one byte changed between the sampled blocks: only verify notices
    info = path.stat()
    raw = bytearray(path.read_bytes())
    middle = len(raw) // 30 + 70_000  # between the first and second sampled blocks
    raw[middle] = ord("X") if raw[middle] != ord("X") else ord("Y")
    path.write_bytes(bytes(raw))
    os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns))
    assert TextData(**kw).fingerprint == first.fingerprint  # documented limit of the quick identity
    changed = TextData(**kw, verify=True)
    assert changed.fingerprint != first.fingerprint and not changed.from_cache


def test_changing_val_fraction_reuses_the_tokens(tmp_path, monkeypatch):
    write_corpus(tmp_path / "a.txt", 2000)
    kw = dict(seed=0, block_size=32, cache_dir=tmp_path / "c", paths=[str(tmp_path / "a.txt")], tokenizer="gpt2")
    a = TextData(**kw, val_fraction=0.1)
    monkeypatch.setattr(encode, "tokenize_source", lambda *a, **k: pytest.fail("tokenized again"))
    b = TextData(**kw, val_fraction=0.2)
    total = len(a.train_tokens) + len(a.val_tokens)
    assert b.from_cache and len(b.val_tokens) == int(0.2 * total) and len(a.val_tokens) == int(0.1 * total)
    assert b.fingerprint != a.fingerprint  # a resume can tell the split moved


def test_bpe_never_fits_on_validation_text(tmp_path):
    text = write_corpus(tmp_path / "a.txt", 4000)
    d = TextData(
        seed=0,
        block_size=32,
        cache_dir=tmp_path / "c",
        paths=[str(tmp_path / "a.txt")],
        tokenizer="bpe",
        bpe_vocab_size=300,
        bpe_sample_bytes=1_000_000,
    )
    index = json.loads((d.cache_path / "index.json").read_text())
    assert 0 < index["fit_end"] <= len(d.train_tokens)
    assert (
        d.tokenizer.decode(np.asarray(d.train_tokens).tolist() + np.asarray(d.val_tokens).tolist())
        == text + "<|endoftext|>"
    )


def test_progress_is_logged(tmp_path, caplog):
    write_corpus(tmp_path / "a.txt", 2000)
    with caplog.at_level(logging.INFO, logger="gptlab.data.progress"):
        d = TextData(seed=0, block_size=32, cache_dir=tmp_path / "c", paths=[str(tmp_path / "a.txt")], tokenizer="gpt2")
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("tokenizing (gpt2)"))
    size = (tmp_path / "a.txt").stat().st_size
    assert f": {size / 1e3:.1f} KB of {size / 1e3:.1f} KB (100 %), " in line and "/s, " in line and "done in" in line
    tokens = int(line.split("/s, ")[1].split(" tokens")[0].replace(",", ""))
    assert tokens == len(np.asarray(d.train_tokens)) + len(np.asarray(d.val_tokens))


def test_progress_of_a_jsonl_file_ends_at_100_percent_of_its_text(tmp_path, caplog):
    """The file's size (its JSON included) is only the estimate; the last line gives the text bytes read."""
    texts = [f'row {i} said "hi"\n' * 20 for i in range(300)]
    (tmp_path / "d.jsonl").write_text("\n".join(json.dumps({"text": t}) for t in texts) + "\n")
    with caplog.at_level(logging.INFO, logger="gptlab.data.progress"):
        TextData(seed=0, block_size=32, cache_dir=tmp_path / "c", paths=[str(tmp_path / "d.jsonl")], tokenizer="gpt2")
    line = [r.getMessage() for r in caplog.records if r.getMessage().startswith("tokenizing (gpt2)")][-1]
    text = sum(len(t.encode("utf-8")) for t in texts)
    assert text < (tmp_path / "d.jsonl").stat().st_size
    assert f": {text / 1e3:.1f} KB of {text / 1e3:.1f} KB (100 %), " in line and "done in" in line


def test_bad_row_mid_stream_is_one_line_and_leaves_nothing(tmp_path):
    rows = [json.dumps({"text": f"row {i} " * 50}) for i in range(400)] + ["{broken"]
    (tmp_path / "d.jsonl").write_text("\n".join(rows) + "\n")
    with pytest.raises(ConfigError, match=r"cannot read json file\(s\) d.jsonl: line 401: Expecting"):
        TextData(seed=0, block_size=16, cache_dir=tmp_path / "c", paths=[str(tmp_path / "d.jsonl")])
    assert [p.name for p in (tmp_path / "c" / "tokens").iterdir() if not p.name.endswith(".lock")] == []


def test_streaming_a_local_dataset_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    folder = tmp_path / "ds"
    folder.mkdir()
    (folder / "train.jsonl").write_text(
        "".join(json.dumps({"body": f"document {i}: " + " ".join(WORDS)}) + "\n" for i in range(500))
    )
    kw = dict(
        seed=0,
        block_size=32,
        cache_dir=tmp_path / "c",
        name=str(folder),
        column="body",
        tokenizer="gpt2",
        val_fraction=0.1,
    )
    whole = HFData(**kw)
    streamed = HFData(**kw, streaming=True, max_tokens=5000)
    assert len(streamed.train_tokens) + len(streamed.val_tokens) == 5000 and len(streamed.val_tokens) == 500
    stream = np.asarray(streamed.train_tokens)
    assert np.array_equal(stream, np.asarray(whole.train_tokens)[: len(stream)])  # same tokens, in order
    assert HFData(**kw, streaming=True, max_tokens=5000).from_cache


def test_a_local_dataset_folder_leaves_no_arrow_copy_and_a_cache_hit_loads_nothing(tmp_path, monkeypatch):
    """data=hf on a local folder: the Arrow conversion lives in a scratch dir that is removed once the tokens are
    cached (datasets' own cache gets nothing); the next run finds its tokens without loading the folder; an edited
    file is a new source."""
    import datasets
    import datasets.config

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    folder = tmp_path / "ds"
    folder.mkdir()
    rows = [json.dumps({"body": f"document {i}: " + " ".join(WORDS)}) for i in range(300)]
    (folder / "train.jsonl").write_text("\n".join(rows) + "\n")
    hf_cache = Path(datasets.config.HF_DATASETS_CACHE)
    before = sorted(hf_cache.rglob("*")) if hf_cache.exists() else []
    kw = dict(seed=0, block_size=32, cache_dir=tmp_path / "c", name=str(folder), column="body", tokenizer="gpt2")
    first = HFData(**kw)
    assert not first.from_cache
    assert list((tmp_path / "c" / "hf-scratch").iterdir()) == []  # the Arrow copy is gone
    assert (sorted(hf_cache.rglob("*")) if hf_cache.exists() else []) == before  # and never went to datasets' cache
    with pytest.raises(ConfigError, match=r"^data.column: column 'nope' not found in .*; columns: body$"):
        HFData(**(kw | {"column": "nope"}))
    assert list((tmp_path / "c" / "hf-scratch").iterdir()) == []  # a refused load cleans up too

    def refuse(*a, **k):
        raise AssertionError("a token-cache hit loaded the folder")

    monkeypatch.setattr(datasets, "load_dataset", refuse)
    again = HFData(**kw)
    assert again.from_cache
    assert np.array_equal(np.asarray(again.train_tokens), np.asarray(first.train_tokens))
    monkeypatch.undo()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with open(folder / "train.jsonl", "a") as f:
        f.write(json.dumps({"body": "one more document " * 20}) + "\n")
    edited = HFData(**kw)
    assert not edited.from_cache
    assert len(edited.train_tokens) + len(edited.val_tokens) > len(first.train_tokens) + len(first.val_tokens)


KILL_SCRIPT = textwrap.dedent("""
    import sys
    from gptlab.data import encode
    encode.CHUNK_CHARS = 1 << 15
    from gptlab.data.text import TextData
    TextData(seed=0, block_size=32, cache_dir=sys.argv[1], paths=[sys.argv[2]], tokenizer="gpt2", num_proc=1)
""")


@pytest.mark.slow
def test_kill_9_during_tokenization_resumes_from_the_last_shard(tmp_path, monkeypatch, caplog):
    """A real SIGKILL of a tokenizing process; the next build keeps its complete shards and tokenizes the rest."""
    path = tmp_path / "big.txt"
    write_corpus(path, 120_000)  # ~7 MB, ~1.5M gpt2 tokens
    env = {**os.environ, "GPTLAB_SHARD_TOKENS": "100000", "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", KILL_SCRIPT, str(tmp_path / "c"), str(path)], env=env)
    try:
        deadline = time.monotonic() + 120
        progress = None
        while time.monotonic() < deadline and proc.poll() is None:
            found = list((tmp_path / "c" / "tokens").glob("*.partial/progress.json"))
            if found and len(json.loads(found[0].read_text())["lengths"]) >= 3:
                progress = found[0]
                break
            time.sleep(0.05)
        assert progress is not None, "the build finished or stalled before three shards were written"
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait()
    saved = json.loads(progress.read_text())["lengths"]
    monkeypatch.setenv("GPTLAB_SHARD_TOKENS", "100000")
    monkeypatch.setattr(encode, "CHUNK_CHARS", 1 << 15)
    encoded = []
    real = encode._encode
    monkeypatch.setattr(encode, "_encode", lambda tok, segs, dtype: encoded.append(1) or real(tok, segs, dtype))
    with caplog.at_level(logging.INFO, logger="gptlab.data.corpus"):
        resumed = TextData(
            seed=0, block_size=32, cache_dir=tmp_path / "c", paths=[str(path)], tokenizer="gpt2", num_proc=1
        )
    assert any("resuming tokenization at" in r.getMessage() for r in caplog.records)
    n_chunks = -(-path.stat().st_size // (1 << 15))
    assert len(encoded) < n_chunks - 10  # the chunks behind the saved shards were not tokenized again
    clean = TextData(
        seed=0, block_size=32, cache_dir=tmp_path / "fresh", paths=[str(path)], tokenizer="gpt2", num_proc=1
    )
    assert json.loads((resumed.cache_path / "index.json").read_text())["lengths"][: len(saved)] == saved
    assert np.array_equal(np.asarray(resumed.train_tokens), np.asarray(clean.train_tokens))
    assert np.array_equal(np.asarray(resumed.val_tokens), np.asarray(clean.val_tokens))


MEMORY_SCRIPT = textwrap.dedent("""
    import sys
    from gptlab.data.text import TextData
    d = TextData(seed=0, block_size=64, cache_dir=sys.argv[1], paths=[sys.argv[2]], tokenizer="gpt2")
    # VmHWM: this process image's peak (ru_maxrss would carry the forking parent's peak across exec)
    hwm = next(line for line in open("/proc/self/status") if line.startswith("VmHWM:"))
    print(len(d.train_tokens) + len(d.val_tokens), hwm.split()[1])
""")


@pytest.mark.slow
def test_peak_memory_stays_flat_on_a_large_single_document(tmp_path):
    """A ~45 MB .txt (one document) stays far under the old whole-document path (934 MiB for 50 MB in issue 16)."""
    path = tmp_path / "big.txt"
    write_corpus(path, 1_000_000)  # ~45 MB
    out = subprocess.run(
        [sys.executable, "-c", MEMORY_SCRIPT, str(tmp_path / "c"), str(path)],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=600,
    )
    tokens, peak_kib = map(int, out.stdout.split())
    assert tokens > 10_000_000
    assert peak_kib * 1024 < 600 * 2**20, f"peak RSS {peak_kib / 1024:.0f} MiB"

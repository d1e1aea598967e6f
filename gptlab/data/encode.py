"""Streaming tokenization of a document source into a ShardWriter (the build step of gptlab/data/corpus.py): the
segments are grouped into chunks of ~CHUNK_CHARS characters, encoded by `num_proc` threads (tiktoken and HF
tokenizers run outside the GIL) with at most 2 * num_proc chunks in flight, and appended in order; a build killed
part-way resumes at the chunk its writer's progress marker names, and the fit sample's end in the token stream is
recorded on the way. Also the default thread count (the cores this process may use)."""

from __future__ import annotations

import itertools
import os
from collections import deque
from collections.abc import Generator
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from gptlab.data.progress import DataProgress
from gptlab.data.shards import ShardWriter

CHUNK_CHARS = 1 << 22  # characters per tokenization task (~4 MB of text)


def source_chunks(source, skip_chunks: int) -> Generator[tuple[int, int, list[tuple[str, bool]]], None, None]:
    """(chunk index, index of its first segment, segments) from chunk `skip_chunks` on (earlier ones read, not kept)."""
    chunk, size, index, first = [], 0, 0, 0
    for seg_index, seg in enumerate(source.segments()):
        if index >= skip_chunks:
            chunk.append(seg)
        size += len(seg[0])
        if size >= CHUNK_CHARS:
            if index >= skip_chunks:
                yield index, first, chunk
            chunk, size, index, first = [], 0, index + 1, seg_index + 1
    if chunk:
        yield index, first, chunk


def _encode(tok, segments: list[tuple[str, bool]], dtype) -> tuple[np.ndarray, np.ndarray, int]:
    """(ids, tokens per segment, UTF-8 bytes): each segment's ids, plus end-of-text after a document's last."""
    rows = tok.encode_batch([text for text, _ in segments])
    if tok.eot_id is not None:
        for row, (_, ends) in zip(rows, segments):
            if ends:
                row.append(tok.eot_id)
    counts = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
    ids = np.fromiter(itertools.chain.from_iterable(rows), dtype=dtype, count=int(counts.sum()))
    return ids, counts, sum(len(text.encode("utf-8")) for text, _ in segments)


class _Stream:
    """Feeds tokenized chunks, in order, into a ShardWriter; resumes from the writer's marker."""

    def __init__(self, writer: ShardWriter, fit_segments: int, max_tokens: int | None, bar: DataProgress):
        marker = writer.state
        self.writer, self.fit_segments, self.max_tokens, self.bar = writer, fit_segments, max_tokens, bar
        self.resume_chunk = marker.get("chunk", 0)
        self.resume_skip = marker.get("base_skip", 0) + marker.get("skip", 0)  # ids of that chunk already saved
        self.fit_end = marker.get("fit_end") if fit_segments else 0  # None until the fit sample's end is seen

    def full(self) -> bool:
        return self.max_tokens is not None and self.writer.tokens >= self.max_tokens

    def take(self, index: int, first: int, ids: np.ndarray, counts: np.ndarray, nbytes: int) -> None:
        skip = self.resume_skip if index == self.resume_chunk else 0
        start = self.writer.tokens - skip  # the stream offset of this chunk's first id
        if self.fit_end is None and first + len(counts) >= self.fit_segments:
            self.fit_end = start + int(counts[: self.fit_segments - first].sum())
        out = ids[skip:]
        if self.max_tokens is not None:
            out = out[: max(0, self.max_tokens - self.writer.tokens)]
        self.writer.append(out, {"chunk": index, "base_skip": skip, "fit_end": self.fit_end})
        self.bar.update(nbytes, len(out))


def tokenize_source(
    source, tok, writer: ShardWriter, fit_segments: int, num_proc: int, max_tokens, what: str
) -> int | None:
    """Stream the source through `tok` into `writer`, `num_proc` chunks at a time; returns the fit sample's end (0
    without one), None when data.max_tokens stopped the stream before it: the fitting text covers every kept token."""
    bar = DataProgress(what, source.total_bytes, done_tokens=writer.tokens)
    stream = _Stream(writer, fit_segments, max_tokens, bar)
    chunks = source_chunks(source, stream.resume_chunk)
    pending: deque = deque()  # (chunk index, first segment, future), oldest first; at most 2*num_proc
    with ThreadPoolExecutor(max_workers=num_proc) as pool:
        try:
            for index, first, segments in chunks:
                pending.append((index, first, pool.submit(_encode, tok, segments, writer.dtype)))
                while len(pending) > 2 * num_proc or (pending and pending[0][2].done()):
                    index0, first0, fut = pending.popleft()
                    stream.take(index0, first0, *fut.result())
                if stream.full():
                    break
            while pending:
                index0, first0, fut = pending.popleft()
                stream.take(index0, first0, *fut.result())
        finally:
            chunks.close()
            for *_, fut in pending:
                fut.cancel()
    bar.close()
    return stream.fit_end


def default_num_proc() -> int:
    """The cores this process may use."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)

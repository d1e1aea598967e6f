"""Where documents start in a token-cache entry (data.doc_mask=true), and the document ids of a training window.

A cache entry's token stream concatenates documents: a .txt file, a jsonl/parquet row, a dataset row (the segments
that end a document, sources.py), and, within one text, the places its source names (`source.document_starts`:
character offsets, e.g. each of the bundled corpus's nine works). The entry records them only when a run asks:
`documents.npy` beside the shards, int64 token offsets of every document's first token (0 first, ascending). It is
derived, never part of the cache key or the data fingerprint: the shards, index.json and every x, y stay as they
were, so an entry written before this file existed stays valid and gets the file the first time a run asks.

Deriving it reads the source again and counts each segment's tokens exactly as the build did (the same tokenizer,
the same segments, end-of-text after a document's last segment where the tokenizer has one), in threads, chunk by
chunk; the counts must add up to the entry's length (all of it, or data.max_tokens' cap), else the entry is refused
in one line. A start inside a segment is the first token whose decoded text reaches it. The file is written
atomically: two runs deriving it at once write the same bytes.
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from gptlab.data import encode
from gptlab.data.shards import rebuild_hint
from gptlab.errors import ConfigError

log = logging.getLogger(__name__)
DOCUMENTS_FILE = "documents.npy"


def _counts(tok, segments: list[tuple[str, bool]]) -> list[int]:
    """Tokens per segment as the build wrote them: its ids, plus end-of-text after a document's last segment."""
    rows = tok.encode_batch([text for text, _ in segments])
    eot = int(tok.eot_id is not None)
    return [len(r) + (eot if ends else 0) for r, (_, ends) in zip(rows, segments)]


def _token_index(tok, text: str, chars: int) -> int:
    """How many of `text`'s tokens come before character `chars`: the fewest whose decoded text reaches it."""
    ids = tok.encode(text)
    lo, hi = 0, len(ids)
    while lo < hi:
        mid = (lo + hi) // 2
        if len(tok.decode(ids[:mid])) >= chars:
            hi = mid
        else:
            lo = mid + 1
    return lo


class _Walk:
    """Token offsets of document starts, walked segment by segment in stream order."""

    def __init__(self, tok, inner: list[int]):
        self.tok, self.inner = tok, sorted(inner)  # character offsets of starts inside the text
        self.starts, self.tokens, self.chars, self.next_inner = [0], 0, 0, 0

    def take(self, segments: list[tuple[str, bool]], counts: list[int]) -> None:
        for (text, ends), n in zip(segments, counts):
            end = self.chars + len(text)
            while self.next_inner < len(self.inner) and self.inner[self.next_inner] < end:
                at = self.inner[self.next_inner] - self.chars
                self.starts.append(self.tokens + (_token_index(self.tok, text, at) if at > 0 else 0))
                self.next_inner += 1
            self.tokens, self.chars = self.tokens + n, end
            if ends:
                self.starts.append(self.tokens)


def count_document_starts(source, tok, num_proc: int | None = None, limit: int | None = None) -> tuple[np.ndarray, int]:
    """(token offset of every document's first token, the stream's length) for `source` tokenized by `tok`; the
    walk stops once `limit` tokens are counted (data.max_tokens' cap), the length then the tokens counted so far."""
    walk = _Walk(tok, list(getattr(source, "document_starts", ())))
    workers = num_proc or encode.default_num_proc()
    pending: deque = deque()
    chunks = encode.source_chunks(source, 0)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        try:
            for _, _, segments in chunks:
                pending.append((segments, pool.submit(_counts, tok, segments)))
                while len(pending) > 2 * workers:
                    done, fut = pending.popleft()
                    walk.take(done, fut.result())
                if limit is not None and walk.tokens >= limit:
                    break
            while pending:
                done, fut = pending.popleft()
                walk.take(done, fut.result())
        finally:
            chunks.close()
            for _, fut in pending:
                fut.cancel()
    starts = np.unique(np.asarray(walk.starts, dtype=np.int64))
    return starts, walk.tokens


def _refuse(folder: Path, why: str) -> ConfigError:
    return ConfigError(f"data.doc_mask: the token cache '{folder}' {why}; {rebuild_hint(folder)}")


def _load(path: Path, total: int) -> np.ndarray:
    """documents.npy checked: 1-D int64, 0 first, ascending, inside the stream."""
    try:
        starts = np.load(path)
    except (OSError, ValueError) as err:
        raise _refuse(path.parent, f"has an unreadable {DOCUMENTS_FILE} ({err})") from None
    ok = starts.ndim == 1 and starts.dtype == np.int64 and len(starts) and starts[0] == 0
    if not ok or (len(starts) > 1 and (np.diff(starts) <= 0).any()) or starts[-1] >= max(total, 1):
        raise _refuse(path.parent, f"has a damaged {DOCUMENTS_FILE}")
    return starts


def document_starts(folder: Path, source, tok, total: int, capped: bool, num_proc: int | None = None) -> np.ndarray:
    """The entry's document starts (int64 token offsets, 0 first), read from documents.npy or derived once from
    `source` (module doc) and saved there; `total` tokens kept, `capped` when data.max_tokens cut the stream."""
    path = Path(folder) / DOCUMENTS_FILE
    if path.is_file():
        return _load(path, total)
    started = time.monotonic()
    starts, counted = count_document_starts(source, tok, num_proc, limit=total if capped else None)
    if counted < total or (counted > total and not capped):
        raise _refuse(
            Path(folder), f"holds {total:,} tokens but its source tokenizes to {counted:,} (the source changed)"
        )
    starts = starts[starts < total]
    tmp = path.with_name(f".{DOCUMENTS_FILE}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        np.save(f, starts)
    os.replace(tmp, path)
    log.info(
        "data.doc_mask: %s documents recorded in %s (%.1f s)", f"{len(starts):,}", path, time.monotonic() - started
    )
    return starts


def window_documents(starts: np.ndarray, first_tokens: np.ndarray, T: int) -> torch.Tensor:
    """(count, T) int32 document ids of the windows whose first tokens are `first_tokens` (offsets in the stream
    `starts` indexes): 0 for the document each window opens in, +1 at every document that starts inside it."""
    pos = np.asarray(first_tokens, dtype=np.int64)[:, None] + np.arange(T)  # (count, T)
    ids = np.searchsorted(starts, pos, side="right")  # documents started at or before each position
    return torch.from_numpy((ids - ids[:, :1]).astype(np.int32))

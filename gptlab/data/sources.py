"""Where documents come from, read as a stream of bounded text segments: local files or a hub dataset.

A segment is (text, ends_document). A .txt file is one document cut into segments of at most SEGMENT_CHARS
characters, so memory stays flat whatever the file size; each jsonl/json/parquet row is one document, cut the same
way when it is long. Only a segment that ends a document is followed by the end-of-text token.

Segments are tokenized one by one, so a cut must fall where the byte-level BPEs' pre-tokenizer (GPT-2's pattern)
splits the whole text anyway, or the tokens differ: a cut inside "\n\n word" gave 198 198 where GPT-2 has 628.
A cut goes after a lone newline that sits between two non-space characters, else before a space followed by a
non-space (the space that starts a word); at either point the whole text's pre-token ends, whatever follows. Only a
window with neither (one word longer than a segment) is cut where it ends.
"""

from __future__ import annotations

import codecs
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

from gptlab.errors import ConfigError

SEGMENT_CHARS = 1 << 14
_READ = 1 << 20


_AFTER_LINE = re.compile(r"(?<=\S\n)(?=\S)")  # after "x\n", before "y": the newline is its own pre-token
_BEFORE_WORD = re.compile(r"(?= \S)")  # before " y": " y" starts a pre-token (a run of spaces before it ends there)


def _last_cut(pattern: re.Pattern, text: str, lo: int, hi: int) -> int | None:
    """The last position in (lo, hi] where `pattern` matches (its lookarounds read up to two characters past hi)."""
    found = None
    for m in pattern.finditer(text, lo + 1, hi + 2):
        if m.start() <= hi:
            found = m.start()
    return found


def cut_segments(text: str, ends_document: bool, limit: int = SEGMENT_CHARS) -> Iterator[tuple[str, bool]]:
    """`text` as segments of <= limit characters, each cut where the pre-tokenizer splits anyway (module doc)."""
    pos = 0
    while len(text) - pos > limit:
        hi = pos + limit
        cut = _last_cut(_AFTER_LINE, text, pos, hi) or _last_cut(_BEFORE_WORD, text, pos, hi) or hi
        yield text[pos:cut], False
        pos = cut
    yield text[pos:], ends_document


def _txt_segments(path: Path) -> Iterator[tuple[str, bool]]:
    decoder = codecs.getincrementaldecoder("utf-8")()
    pending = ""
    with open(path, "rb") as f:
        while block := f.read(_READ):
            pending += decoder.decode(block)
            if len(pending) > SEGMENT_CHARS:
                *full, tail = cut_segments(pending, False)  # the tail may grow with the next block
                yield from full
                pending = tail[0]
    yield from cut_segments(pending + decoder.decode(b"", final=True), True)


def _row_text(row, column: str, path: Path, line: int):
    if not isinstance(row, dict) or column not in row:
        keys = ", ".join(row) if isinstance(row, dict) else type(row).__name__
        raise ConfigError(f"data.column: column {column!r} not found in {path.name}; columns: {keys}")
    text = row[column]
    if text is not None and not isinstance(text, str):
        raise ConfigError(
            f"data.column: column {column!r} holds {type(text).__name__} in {path.name} row {line}, not text"
        )
    _check_encodable(text or "", column, path, line)
    return text or ""


def _check_encodable(text: str, column: str, path: Path, line: int) -> None:
    """JSON can spell a lone UTF-16 surrogate (\\ud800), which is no character: refuse the row, naming it."""
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise ConfigError(
            f"data.paths: {path.name} row {line}: column {column!r} holds a lone surrogate "
            f"(\\u{ord(text[err.start]):04x} at character {err.start}), which is not text; fix or drop that row"
        ) from None


def _json_segments(path: Path, column: str) -> Iterator[tuple[str, bool]]:
    """JSON lines (one object per line); a .json file holding one array of objects is read whole."""
    with open(path, encoding="utf-8") as f:
        head = f.read(4096).lstrip()
    if path.suffix.lower() == ".json" and head.startswith("["):
        try:
            rows = json.loads(path.read_text(encoding="utf-8"))
        except ValueError as err:
            raise ConfigError(f"data.paths: cannot read json file(s) {path.name}: {err}") from None
        for i, row in enumerate(rows, 1):
            yield from cut_segments(_row_text(row, column, path, i), True)
        return
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as err:
                raise ConfigError(f"data.paths: cannot read json file(s) {path.name}: line {i}: {err}") from None
            yield from cut_segments(_row_text(row, column, path, i), True)


def _parquet_segments(path: Path, column: str) -> Iterator[tuple[str, bool]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except (OSError, pa.ArrowException) as err:
        raise ConfigError(f"data.paths: cannot read parquet file(s) {path.name}: {str(err).splitlines()[0]}") from None
    names = pf.schema_arrow.names
    if column not in names:
        raise ConfigError(f"data.column: column {column!r} not found in {path.name}; columns: {', '.join(names)}")
    kind = pf.schema_arrow.field(column).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise ConfigError(f"data.column: column {column!r} holds {kind}, not text")
    for batch in pf.iter_batches(batch_size=1024, columns=[column]):
        for text in batch.column(0).to_pylist():
            yield from cut_segments(text or "", True)


def file_segments(path: Path, column: str) -> Iterator[tuple[str, bool]]:
    """The segments of one local file (.txt one document; .jsonl/.json/.parquet one per row)."""
    suffix = path.suffix.lower()
    if suffix == ".txt":
        return _txt_segments(path)
    if suffix == ".parquet":
        return _parquet_segments(path, column)
    return _json_segments(path, column)


def text_bytes(path: Path) -> int:
    """About how many bytes of text a file holds: its size, or a parquet file's uncompressed column data."""
    if path.suffix.lower() != ".parquet":
        return os.path.getsize(path)
    import pyarrow.parquet as pq

    try:
        meta = pq.ParquetFile(path).metadata
    except Exception:  # unreadable: the reader names the file and the reason when it gets there
        return os.path.getsize(path)
    return sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))


class FileSource:
    """Local files in order; `key` is their content identity (see files.content_key)."""

    def __init__(self, files: list[Path], column: str, key: str):
        self.files, self.column, self.key = files, column, key
        self.total_bytes = sum(map(text_bytes, files))  # for progress and the fit sample's bound

    def segments(self) -> Iterator[tuple[str, bool]]:
        for f in self.files:
            yield from file_segments(f, self.column)


class HubSource:
    """Rows of a datasets Dataset or IterableDataset (column "text"); total_bytes None when streaming.

    `load` instead of a dataset: a function returning (dataset, total_bytes), called on first use, so a token-cache
    hit never loads anything; `close()` runs `cleanup` (what the load wrote: a local folder's Arrow copy)."""

    def __init__(self, ds, key: str, total_bytes: int | None, load=None, cleanup=None):
        self._ds, self.key, self._total_bytes, self._load, self._cleanup = ds, key, total_bytes, load, cleanup

    def _loaded(self) -> None:
        if self._load is not None:
            self._ds, self._total_bytes = self._load()
            self._load = None

    @property
    def ds(self):
        self._loaded()
        return self._ds

    @property
    def total_bytes(self) -> int | None:
        if self._total_bytes is None:  # known without a load when the loader's caller recorded it before
            self._loaded()
        return self._total_bytes

    def close(self) -> None:
        if self._cleanup is not None:
            self._cleanup()
            self._cleanup = None

    def segments(self) -> Iterator[tuple[str, bool]]:
        for batch in self.ds.iter(batch_size=256):
            for text in batch["text"]:
                yield from cut_segments(text or "", True)


class TextSource:
    """One in-memory text (the bundled corpus); `document_starts`: character offsets where a document starts inside
    it (the corpus's works), read only by data.doc_mask (gptlab/data/documents.py), never by the tokens."""

    def __init__(self, text: str, key: str, document_starts: tuple[int, ...] = ()):
        self.text, self.key, self.total_bytes = text, key, len(text.encode("utf-8"))
        self.document_starts = document_starts

    def segments(self) -> Iterator[tuple[str, bool]]:
        return cut_segments(self.text, True)

"""Token shards on disk: a writer that appends ids into fixed-size raw shards (resumable after a kill), and a
read-only view that memory-maps them as one token stream and gathers windows across shard boundaries.

Layout of a finished entry <cache>/tokens/<key>/:
    shard_00000.bin ... shard_NNNNN.bin   raw uint16 ids (uint32 when the vocabulary needs it), shard_tokens each but
                                          the last; written as a stream, so RAM stays flat
    index.json                            written last: shard lengths, dtype, max id, what produced them
An unfinished entry is <key>.partial/ with progress.json (rewritten after every complete shard): on a restart the
writer keeps the complete shards and the producer skips the input it already covers.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import IO

import numpy as np

from gptlab.errors import ConfigError
from gptlab.util.io import write_json_atomic


def shard_name(i: int) -> str:
    """Raw ids, native byte order; dtype and length are in index.json."""
    return f"shard_{i:05d}.bin"


class ShardWriter:
    """Appends ids to shards of `shard_tokens` each in `folder`, resumable.

    After every complete shard, progress.json records the shard lengths and the caller's marker of where the
    next id comes from, so a restarted producer reads `state` and begins there (the buffer's ids are redone).
    """

    def __init__(self, folder: Path, dtype, shard_tokens: int):
        self.folder, self.dtype, self.shard_tokens = Path(folder), np.dtype(dtype), int(shard_tokens)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.lengths: list[int] = []
        self.high = -1  # the largest id written
        self.state: dict = {}  # the marker of the last saved shard ({} = start from the beginning)
        progress = self.folder / "progress.json"
        if progress.is_file():
            saved = json.loads(progress.read_text())
            if saved.get("dtype") == self.dtype.name and saved.get("shard_tokens") == self.shard_tokens:
                self.lengths, self.high, self.state = saved["lengths"], saved["high"], saved["state"]
        for stale in self.folder.glob("*shard_*"):  # shards after the last recorded one are torn
            if stale.name.startswith(".") or int(stale.name[6:11]) >= len(self.lengths):
                stale.unlink()
        self._file: IO[bytes] | None = None  # the shard being written (streamed to disk: RAM stays flat)
        self._fill = 0

    @property
    def tokens(self) -> int:
        """Ids accepted so far (saved shards + the shard being written)."""
        return sum(self.lengths) + self._fill

    def append(self, ids: np.ndarray, marker: dict) -> None:
        """Add `ids` (1-D), the output of the input piece that `marker` names (e.g. {"chunk": 7}).

        A shard that fills inside `ids` is saved with {**marker, "skip": n}: a restart redoes that piece and
        drops its first n ids, which the saved shards already hold.
        """
        ids = np.asarray(ids, dtype=self.dtype)
        if ids.size:
            self.high = max(self.high, int(ids.max()))
        pos = 0
        while pos < ids.size:
            if self._file is None:
                self._file = open(self._tmp_path(), "wb")
            take = min(ids.size - pos, self.shard_tokens - self._fill)
            self._file.write(ids[pos : pos + take].tobytes())
            self._fill, pos = self._fill + take, pos + take
            if self._fill == self.shard_tokens:
                self._flush({**marker, "skip": pos})

    def _tmp_path(self) -> Path:
        return self.folder / f".{shard_name(len(self.lengths))}.tmp"

    def _flush(self, state: dict) -> None:
        assert self._file is not None  # called once a shard is full, so one is open
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        os.replace(self._tmp_path(), self.folder / shard_name(len(self.lengths)))
        self._file = None
        self.lengths.append(self._fill)
        self._fill = 0
        write_json_atomic(
            self.folder / "progress.json",
            {
                "dtype": self.dtype.name,
                "shard_tokens": self.shard_tokens,
                "lengths": self.lengths,
                "high": self.high,
                "state": state,
            },
        )

    def finish(self, meta: dict) -> dict:
        """Save the last partial shard, then index.json (last); returns the index."""
        if self._fill:  # a kill after this flush finds {"done"} and only writes index.json
            self._flush({"done": True, "meta": meta})
        index = {
            **meta,
            "dtype": self.dtype.name,
            "shard_tokens": self.shard_tokens,
            "lengths": self.lengths,
            "tokens": sum(self.lengths),
            "max_id": self.high,
        }
        (self.folder / "progress.json").unlink(missing_ok=True)
        write_json_atomic(self.folder / "index.json", index)
        return index


def rebuild_hint(folder: Path) -> str:
    """How to rebuild a corrupt token-cache entry (gptlab-cache rm takes a key prefix of 6+ characters)."""
    return f"delete that folder and run again to rebuild it (gptlab-cache rm {Path(folder).name[:12]})"


class TokenStream:
    """Read-only view of tokens [start, stop) of a shard set, indexable like a 1-D array.

    With `vocab_size` (and the entry's `folder`), every window drawn is range-checked: an id a corrupted shard holds
    is refused naming the entry and how to rebuild it, never passed to the embedding.
    """

    def __init__(
        self,
        shards: list[np.ndarray],
        start: int = 0,
        stop: int | None = None,
        vocab_size: int | None = None,
        folder: Path | None = None,
    ):
        self.shards, self.vocab_size, self.folder = shards, vocab_size, folder
        self.ends = np.cumsum([len(s) for s in shards], dtype=np.int64)  # (n_shards,) end offset of each shard
        total = int(self.ends[-1]) if len(shards) else 0
        self.start, self.stop = start, total if stop is None else stop
        self.dtype = shards[0].dtype if shards else np.dtype(np.uint16)

    def __len__(self) -> int:
        return self.stop - self.start

    def windows(self, starts: np.ndarray, length: int) -> np.ndarray:
        """(len(starts), length) ids; window i is tokens[starts[i] : starts[i] + length] of this view."""
        starts = np.asarray(starts, dtype=np.int64) + self.start  # (n,) absolute offsets
        out = np.empty((len(starts), length), dtype=self.dtype)
        shard = np.searchsorted(self.ends, starts, side="right")  # (n,) shard holding each window's first token
        for k in np.unique(shard):
            rows = np.nonzero(shard == k)[0]
            base = int(self.ends[k]) - len(self.shards[k])
            local = starts[rows] - base
            inside = local + length <= len(self.shards[k])
            if inside.any():
                out[rows[inside]] = self.shards[k][local[inside, None] + np.arange(length)]
            for r in rows[~inside]:  # a window across a shard boundary: read it piece by piece
                out[r] = self._read(int(starts[r]), length)
        if self.vocab_size is not None and out.size and int(out.max()) >= self.vocab_size:
            self._refuse(out, starts)
        return out

    def _refuse(self, out: np.ndarray, starts: np.ndarray) -> None:
        """The one-line error for a window holding an id >= vocab_size: which shard, which id."""
        row, col = (int(i[0]) for i in np.nonzero(out >= self.vocab_size))
        shard = int(np.searchsorted(self.ends, int(starts[row]) + col, side="right"))
        raise ConfigError(
            f"data: the token cache '{self.folder}' is corrupt ({shard_name(shard)} holds token id "
            f"{int(out[row, col])}, the tokenizer has {self.vocab_size} ids); {rebuild_hint(Path(str(self.folder)))}"
        )

    def _read(self, first: int, length: int) -> np.ndarray:
        """Absolute tokens [first, first+length) (any number of shards)."""
        parts, pos, end = [], first, first + length
        while pos < end:
            k = int(np.searchsorted(self.ends, pos, side="right"))
            base = int(self.ends[k]) - len(self.shards[k])
            stop = min(end, int(self.ends[k]))
            parts.append(self.shards[k][pos - base : stop - base])
            pos = stop
        return np.concatenate(parts) if parts else np.empty(0, dtype=self.dtype)

    def __getitem__(self, key):
        if isinstance(key, slice):
            first, last, step = key.indices(len(self))
            return self._read(self.start + first, max(0, last - first))[::step]
        i = int(key) + (len(self) if int(key) < 0 else 0)
        if not 0 <= i < len(self):
            raise IndexError(key)
        return self._read(self.start + i, 1)[0]

    def __array__(self, dtype=None, copy=None):
        arr = self._read(self.start, len(self))
        return arr if dtype is None else arr.astype(dtype)


def open_shards(folder: Path) -> tuple[list[np.ndarray], dict]:
    """(memmapped shards, index) of a finished entry; None when it is not finished; one-line error when damaged.

    Cheap checks only (index, shard count, each shard's length and dtype): a hit on a 10 GB corpus opens in
    milliseconds. The ids were range-checked when written (index max_id); data.verify=true re-checks them.
    """
    folder = Path(folder)

    def corrupt(why: str) -> ConfigError:
        return ConfigError(f"data: the token cache '{folder}' is corrupt ({why}); {rebuild_hint(folder)}")

    try:
        index = json.loads((folder / "index.json").read_text())
        dtype, lengths = np.dtype(index["dtype"]), [int(n) for n in index["lengths"]]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise corrupt(f"index.json: {' '.join(str(err).split()) or type(err).__name__}") from None
    shards = []
    for i, n in enumerate(lengths):
        path = folder / shard_name(i)
        size = path.stat().st_size if path.is_file() else -1
        if size != n * dtype.itemsize:
            raise corrupt(
                f"{shard_name(i)} "
                + (
                    "is missing"
                    if size < 0
                    else f"has {size} bytes, index.json says {n} {dtype} ids = {n * dtype.itemsize} bytes"
                )
            )
        shards.append(np.memmap(path, dtype=dtype, mode="r", shape=(n,)) if n else np.empty(0, dtype))
    return shards, index


def check_ids(folder: Path, shards: list[np.ndarray], vocab_size: int) -> None:
    """Full scan: every id < vocab_size (data.verify=true), else a one-line error naming the cache folder."""
    for i, arr in enumerate(shards):
        high = max((int(arr[j : j + (1 << 24)].max()) for j in range(0, len(arr), 1 << 24)), default=-1)
        if high >= vocab_size:
            raise ConfigError(
                f"data: the token cache '{folder}' is corrupt ({shard_name(i)} holds token id {high}, "
                f"the tokenizer has {vocab_size} ids); {rebuild_hint(folder)}"
            )

"""Documents -> train/val split -> tokenizer -> token arrays cached as .npy under cache_dir/tokens/<key>/."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gptlab.data.tokenizers import make_tokenizer
from gptlab.errors import ConfigError

CACHE_FORMAT = 1  # bump when the on-disk layout or the split rule changes


@dataclass
class TokenSplits:
    """A fitted tokenizer and the train/val token arrays (read-only memmaps)."""

    tokenizer: object
    train: np.ndarray
    val: np.ndarray
    cache_path: Path
    from_cache: bool


class TextColumn:
    """Re-iterable view of a Dataset's "text" column (None rows read as "")."""

    def __init__(self, ds, batch_size: int = 1000):
        self.ds, self.batch_size = ds, batch_size

    def __iter__(self):
        for batch in self.ds.iter(batch_size=self.batch_size):
            for text in batch["text"]:
                yield text or ""


def check_val_fraction(val_fraction) -> float:
    """`val_fraction` as a float in (0, 1), else a ConfigError."""
    if isinstance(val_fraction, bool) or not isinstance(val_fraction, (int, float)) or not 0 < val_fraction < 1:
        raise ConfigError(f"data.val_fraction: got {val_fraction!r}; allowed: a number strictly between 0 and 1")
    return float(val_fraction)


def _one_row(text: str, features):
    from datasets import Dataset
    from datasets.utils.logging import disable_progress_bar
    disable_progress_bar()  # gptlab prints its own progress

    return Dataset.from_dict({"text": [text]}, features=features)


def split_documents(ds, val_fraction: float):
    """(train_ds, val_ds, train_ends_mid_document): the last `val_fraction` of characters is val.

    The cut falls at the first line start at or after the character offset, inside whichever document
    holds that offset; the documents before go to train and those after to val, in their order.
    """
    from datasets import concatenate_datasets
    from datasets.utils.logging import disable_progress_bar
    disable_progress_bar()  # gptlab prints its own progress

    lengths = ds.map(lambda texts: {"n": [len(t or "") for t in texts]}, batched=True, input_columns="text",
                     remove_columns=ds.column_names, desc="measuring documents")["n"]
    cum = np.cumsum(np.asarray(lengths, dtype=np.int64))  # (n_docs,) characters up to each doc's end
    total = int(cum[-1]) if len(cum) else 0
    if total == 0:
        raise ConfigError("data: the corpus contains no text (every document is empty)")
    target = int(total * (1.0 - val_fraction))
    i = min(int(np.searchsorted(cum, target, side="right")), len(cum) - 1)  # doc holding the offset
    doc = ds[i]["text"] or ""
    local = target - (int(cum[i]) - len(doc))
    nl = doc.find("\n", local - 1) if local > 0 else -1
    cut = 0 if local == 0 else (nl + 1 if nl >= 0 else local)
    before = [ds.select(range(i))] if i > 0 else []
    after = [ds.select(range(i + 1, len(ds)))] if i + 1 < len(ds) else []
    train_parts = before + ([_one_row(doc[:cut], ds.features)] if cut > 0 else [])
    val_parts = ([_one_row(doc[cut:], ds.features)] if cut < len(doc) else []) + after
    train_parts = train_parts or [_one_row("", ds.features)]
    val_parts = val_parts or [_one_row("", ds.features)]
    return concatenate_datasets(train_parts), concatenate_datasets(val_parts), 0 < cut < len(doc)


def _tokenize_split(ds, tokenizer, ends_mid_document: bool, num_proc: int | None, fingerprint: str):
    """Dataset of rows {"ids", "n"}: each document's ids, followed by the end-of-text id when it ends there."""
    eot, last = tokenizer.eot_id, len(ds) - 1

    def encode(texts, indices):
        ids = tokenizer.encode_batch([t or "" for t in texts])
        if eot is not None:
            for row, index in zip(ids, indices):
                if not (ends_mid_document and index == last):  # a cut document does not end here
                    row.append(eot)
        return {"ids": ids, "n": [len(row) for row in ids]}

    return ds.map(encode, batched=True, with_indices=True, input_columns="text", remove_columns=ds.column_names,
                  num_proc=num_proc, new_fingerprint=fingerprint, desc="tokenizing")


def _write_tokens(ids_ds, path: Path, dtype) -> int:
    """Concatenate the "ids" rows into a .npy file at `path`; returns the token count."""
    total = int(sum(ids_ds["n"]))
    out = np.lib.format.open_memmap(path, mode="w+", dtype=dtype, shape=(total,))
    pos = 0
    for table in ids_ds.with_format("arrow").iter(batch_size=4096):
        flat = table.column("ids").combine_chunks().flatten().to_numpy(zero_copy_only=False)
        out[pos:pos + len(flat)] = flat
        pos += len(flat)
    out.flush()
    del out
    return total


def cache_key(source_key: str, tokenizer_identity: str, val_fraction: float) -> str:
    """sha256 over what determines the token arrays: source content, tokenizer identity and split rule."""
    spec = {"format": CACHE_FORMAT, "source": source_key, "tokenizer": tokenizer_identity,
            "val_fraction": val_fraction, "split": "char-offset-next-line"}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()


def _load_cached(folder: Path, vocab_size: int) -> tuple[np.ndarray, np.ndarray] | None:
    """(train, val) memmaps when `folder` holds a complete cache entry, else None; a corrupt entry is refused.

    meta.json is written last, so a folder without it is unfinished. With it, each array must have the
    recorded length and dtype and hold only ids < vocab_size (one streaming max per array); anything else
    (a truncated .npy, ids a tokenizer cannot decode) is refused in one line rather than rebuilt: runs of a
    sweep share the entry, and replacing it under them would race with their reads and rebuilds.
    """
    if not (folder / "meta.json").is_file():
        return None

    def corrupt(why: str) -> ConfigError:
        return ConfigError(f"data: the token cache '{folder}' is corrupt ({why}); delete that folder and run again "
                           f"to rebuild it")

    arrays = []
    try:
        meta = json.loads((folder / "meta.json").read_text())
        dtype = np.dtype(meta["dtype"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise corrupt(f"meta.json: {' '.join(str(err).split()) or type(err).__name__}") from None
    for split in ("train", "val"):
        try:
            expected = (int(meta["tokens"][split]),), dtype
            tokens = np.load(folder / f"{split}.npy", mmap_mode="r")
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise corrupt(f"{split}.npy: {' '.join(str(err).split()) or type(err).__name__}") from None
        if (tokens.shape, tokens.dtype) != expected:
            raise corrupt(f"{split}.npy holds {tokens.size} {tokens.dtype} ids, meta.json says {expected[0][0]} {dtype}")
        high = max((int(tokens[i:i + (1 << 24)].max()) for i in range(0, len(tokens), 1 << 24)), default=-1)
        if high >= vocab_size:
            raise corrupt(f"{split}.npy holds token id {high}, the tokenizer has {vocab_size} ids")
        arrays.append(tokens)
    return arrays[0], arrays[1]


def build_token_splits(docs, *, source_key: str, tokenizer: str, bpe_vocab_size: int, val_fraction: float,
                       cache_dir: Path, num_proc: int | None = None) -> TokenSplits:
    """Split `docs` (Dataset with a "text" column), fit the tokenizer on train, tokenize both splits once."""
    val_fraction = check_val_fraction(val_fraction)
    train_ds, val_ds, cut = split_documents(docs, val_fraction)
    tok = make_tokenizer(tokenizer, TextColumn(train_ds), cache_dir, bpe_vocab_size=bpe_vocab_size)
    key = cache_key(source_key, tok.identity(), val_fraction)
    folder = Path(cache_dir) / "tokens" / key
    cached = _load_cached(folder, tok.vocab_size)
    if cached is not None:
        return TokenSplits(tok, cached[0], cached[1], folder, True)
    dtype = np.uint16 if tok.vocab_size < 2**16 else np.uint32
    tmp = folder.with_name(f"{key}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    tmp.mkdir(parents=True)
    try:
        counts = {}
        for split, ds, ends_mid in (("train", train_ds, cut), ("val", val_ds, False)):
            ids = _tokenize_split(ds, tok, ends_mid, num_proc if (num_proc or 1) > 1 else None, f"{key[:40]}{split}")
            counts[split] = _write_tokens(ids, tmp / f"{split}.npy", dtype)
        meta = {"source": source_key, "tokenizer": tok.identity(), "val_fraction": val_fraction,
                "dtype": np.dtype(dtype).name, "tokens": counts, "format": CACHE_FORMAT}
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
        try:
            os.rename(tmp, folder)  # atomic publish; fails if a concurrent run published first
        except OSError:
            if _load_cached(folder, tok.vocab_size) is None:
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    train, val = _load_cached(folder, tok.vocab_size)
    return TokenSplits(tok, train, val, folder, False)

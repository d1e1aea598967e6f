"""A document source -> a fitted tokenizer -> token shards cached under cache_dir/tokens/<key>/ -> train/val views.

Streaming end to end: segments are grouped into chunks of ~CHUNK_CHARS characters, tokenized by `num_proc`
threads (tiktoken and HF tokenizers run outside the GIL) with a bounded number of chunks in flight (encode.py), and
written into shards (shards.py). Peak memory is set by the chunk size and the fit sample, not by the corpus. A
killed build resumes from its last complete shard; concurrent runs of a sweep wait on one lock and share the entry.

The split: the token stream's last `val_fraction` of tokens is val, the rest train (so changing val_fraction never
re-tokenizes). char/bpe tokenizers are fitted on whole segments from the start of the stream, at most
`bpe_sample_bytes` and never more than the first (1 - val_fraction) of the input's bytes; should the val tail
still reach into the fitted text, train is extended to cover it and a warning says so: the tokenizer never sees
validation text.

`tokenize_with` caches a whole source tokenized by a tokenizer fitted elsewhere (a validation set scored with the
run's own tokenizer), keyed by the tokenizer's identity instead of a fit.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gptlab.data import default_cache_dir, encode
from gptlab.data.documents import document_starts
from gptlab.data.fitting import FITTED, FitSample, check_val_fraction, fit_limit, load_tokenizer, save_tokenizer
from gptlab.data.shards import ShardWriter, TokenStream, check_ids, open_shards, rebuild_hint
from gptlab.data.sources import SEGMENT_CHARS
from gptlab.data.tokenizers import make_tokenizer
from gptlab.errors import ConfigError

log = logging.getLogger(__name__)
CACHE_FORMAT = 4  # bump when the on-disk layout, the segment rule, the split rule or the fit rule changes
# (4: segments are cut where GPT-2's pre-tokenizer splits, not after any newline; 3: a first segment longer than the
# fit limit contributes its prefix; 2 fitted nothing there: vocabulary 1)
SHARD_TOKENS = 1 << 27  # ids per shard (256 MiB as uint16)


@dataclass
class TokenSplits:
    """A fitted tokenizer and the train/val token views."""

    tokenizer: object
    train: TokenStream
    val: TokenStream
    cache_path: Path
    from_cache: bool
    fingerprint: str  # the entry's key plus the split point: changes whenever any sample could change
    capped_at: int | None = None  # data.max_tokens, when it stopped the stream (a split too short names it)
    documents: np.ndarray | None = None  # data.doc_mask: token offsets where each document starts (documents.py)


def cache_key(source_key: str, tokenizer: str, bpe_vocab_size: int, fit_limit: int, max_tokens) -> str:
    """sha256 over what determines the token stream: source content, tokenizer and its fit, segment rule, cap."""
    from gptlab.data.tokenizers import ByteTokenizer, GPT2Tokenizer

    fixed = {"gpt2": GPT2Tokenizer, "byte": ByteTokenizer}
    spec = {
        "format": CACHE_FORMAT,
        "source": source_key,
        "segment_chars": SEGMENT_CHARS,
        "chunk_chars": encode.CHUNK_CHARS,
        "tokenizer": fixed[tokenizer]().identity() if tokenizer in fixed else tokenizer,
        "fit": {"limit": fit_limit, **({"vocab": bpe_vocab_size} if tokenizer == "bpe" else {})}
        if tokenizer in FITTED
        else None,
        "max_tokens": max_tokens,
    }
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()


def given_cache_key(source_key: str, tok, max_tokens) -> str:
    """sha256 over what determines a stream tokenized by an already fitted tokenizer (another corpus's): the source
    content, the tokenizer's identity (its vocabulary), the segment rule and the cap."""
    spec = {
        "format": CACHE_FORMAT,
        "source": source_key,
        "segment_chars": SEGMENT_CHARS,
        "chunk_chars": encode.CHUNK_CHARS,
        "tokenizer": tok.identity(),
        "fit": "given",
        "max_tokens": max_tokens,
    }
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()


def _tokenizer_for(tokenizer: str, fit: FitSample | None, given, cache_dir: Path, bpe_vocab_size: int):
    """The `given` tokenizer, else `tokenizer` made (and fitted on `fit`'s sample when it is fitted)."""
    if given is not None:
        return given
    started = time.monotonic()
    tok = make_tokenizer(tokenizer, fit if fit is not None else "", cache_dir, bpe_vocab_size=bpe_vocab_size)
    if fit is not None:
        log.info(
            "fitted the %s tokenizer on %d segments (at most %s bytes, data.bpe_sample_bytes) in %.1f s",
            tokenizer,
            fit.segments,
            f"{fit.limit:,}",
            time.monotonic() - started,
        )
    return tok


def _tokenize(
    source, tok, writer: ShardWriter, fit: FitSample | None, tokenizer: str, num_proc: int, max_tokens
) -> dict:
    """Tokenize `source` into `writer` from its last complete shard on -> the entry's index metadata."""
    if writer.lengths:
        log.info(
            "resuming tokenization at %s tokens (%d complete shards in %s)",
            f"{writer.tokens:,}",
            len(writer.lengths),
            writer.folder,
        )
    fit_segments = fit.segments if fit is not None else 0
    fit_end = encode.tokenize_source(
        source, tok, writer, fit_segments, num_proc, max_tokens, f"tokenizing ({tokenizer})"
    )
    if fit is not None and fit.prefix is not None:  # fitted on part of the first segment: val may follow it
        prefix = len(tok.encode(fit.prefix))
        fit_end = prefix if fit_end is None else min(fit_end, prefix)
    return {
        "format": CACHE_FORMAT,
        "source": source.key,
        "tokenizer": tokenizer,
        "identity": tok.identity(),
        "tokenizer_state": save_tokenizer(tok, writer.folder),
        "fit_end": fit_end,
        "vocab_size": tok.vocab_size,
    }


def _build(
    source,
    folder: Path,
    partial: Path,
    *,
    tokenizer: str,
    fit: FitSample | None,
    bpe_vocab_size: int,
    cache_dir: Path,
    num_proc: int,
    max_tokens,
    given=None,
) -> None:
    """Fit the tokenizer (or take the `given` one), tokenize into `partial` (resuming what a killed build left),
    publish as `folder`."""
    partial.mkdir(parents=True, exist_ok=True)
    try:
        tok = _tokenizer_for(tokenizer, fit, given, cache_dir, bpe_vocab_size)
        writer = ShardWriter(partial, np.uint16 if tok.vocab_size < 2**16 else np.uint32, shard_tokens())
        if writer.state.get("done"):  # killed after the last shard, before index.json
            meta = writer.state["meta"]
        else:
            meta = _tokenize(source, tok, writer, fit, tokenizer, num_proc, max_tokens)
    except ConfigError:  # bad input: nothing worth resuming (a kill or Ctrl-C keeps the complete shards)
        shutil.rmtree(partial, ignore_errors=True)
        raise
    writer.finish(meta)
    os.rename(partial, folder)  # atomic publish


def _build_once(source, tokens_dir: Path, key: str, **build) -> None:
    """_build under the entry's lock: one run of a sweep tokenizes, the others wait and then find index.json."""
    folder, partial = tokens_dir / key, tokens_dir / f"{key}.partial"
    with open(tokens_dir / f"{key}.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("waiting for another run that is tokenizing the same corpus (%s)", partial)
            fcntl.flock(lock, fcntl.LOCK_EX)
        if not (folder / "index.json").is_file():
            _build(source, folder, partial, **build)
            (tokens_dir / f"{key}.lock").unlink(missing_ok=True)  # waiters wake, find index.json


def _entry(source, cache_dir: Path, key: str, num_proc: int | None, **build) -> tuple[Path, bool]:
    """Token cache entry `key`: (its folder, whether it was there already), tokenizing `source` into it first when
    it was not."""
    tokens_dir = cache_dir / "tokens"
    tokens_dir.mkdir(parents=True, exist_ok=True)
    folder = tokens_dir / key
    from_cache = (folder / "index.json").is_file()
    if not from_cache:
        _build_once(
            source, tokens_dir, key, cache_dir=cache_dir, num_proc=num_proc or encode.default_num_proc(), **build
        )
    return folder, from_cache


def _check_ids(folder: Path, shards, index: dict, vocab_size: int, verify: bool) -> None:
    """Every id below the tokenizer's vocabulary: each shard read (verify), else the index's recorded max id."""
    if verify:
        check_ids(folder, shards, vocab_size)
    elif index.get("max_id", -1) >= vocab_size:
        raise ConfigError(
            f"data: the token cache '{folder}' is corrupt (token id {index['max_id']}, the tokenizer "
            f"has {vocab_size} ids); {rebuild_hint(folder)}"
        )


LAST_USED = "last_used"  # an empty file whose mtime is when a run last opened the entry (gptlab-cache list / prune)


def touch_last_used(folder: Path) -> None:
    """Mark the cache entry as used now (best effort: a read-only cache stays usable)."""
    try:
        (folder / LAST_USED).touch()
    except OSError:
        pass


def shard_tokens() -> int:
    """Ids per shard: SHARD_TOKENS, or $GPTLAB_SHARD_TOKENS (tests use small shards to cross boundaries)."""
    return int(os.environ.get("GPTLAB_SHARD_TOKENS", SHARD_TOKENS))


def build_token_splits(
    source,
    *,
    tokenizer: str,
    bpe_vocab_size: int,
    val_fraction: float,
    cache_dir: Path | str | None = None,
    num_proc: int | None = None,
    bpe_sample_bytes: int = 100_000_000,
    max_tokens: int | None = None,
    verify: bool = False,
    documents: bool = False,
) -> TokenSplits:
    """Tokenize `source` once into cached shards (or open them) and split the stream into train and val
    (`cache_dir` None: gptlab.data.default_cache_dir()); `documents`: with where each document starts."""
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    val_fraction = check_val_fraction(val_fraction)
    if tokenizer not in ("bpe", "byte", "char", "gpt2"):
        make_tokenizer(tokenizer, "", cache_dir)  # the one-line unknown-tokenizer error
    limit = fit_limit(source, bpe_sample_bytes, val_fraction)
    key = cache_key(source.key, tokenizer, bpe_vocab_size, limit, max_tokens)
    fit = FitSample(source, limit) if tokenizer in FITTED else None
    folder, from_cache = _entry(
        source, cache_dir, key, num_proc, tokenizer=tokenizer, fit=fit, bpe_vocab_size=bpe_vocab_size,
        max_tokens=max_tokens,
    )  # fmt: skip
    shards, index = open_shards(folder)
    touch_last_used(folder)
    tok = load_tokenizer(tokenizer, folder, index.get("tokenizer_state", {}), Path(cache_dir))
    _check_ids(folder, shards, index, tok.vocab_size, verify)
    total = int(index["tokens"])
    n_train, capped = _train_end(total, index.get("fit_end"), tokenizer, val_fraction, max_tokens)
    train = TokenStream(shards, 0, n_train, tok.vocab_size, folder)
    val = TokenStream(shards, n_train, total, tok.vocab_size, folder)
    starts = document_starts(folder, source, tok, total, capped is not None, num_proc) if documents else None
    return TokenSplits(tok, train, val, folder, from_cache, f"{key}:{n_train}/{total}", capped, starts)


def _train_end(total: int, fitted, tokenizer: str, val_fraction: float, max_tokens) -> tuple[int, int | None]:
    """Where train ends in a stream of `total` tokens whose first `fitted` were the fitting text -> (that token,
    data.max_tokens if it stopped the stream): the last `val_fraction`, moved later so val never holds fitting text."""
    # fitted None: data.max_tokens stopped the stream inside the fitting text, before its end was seen (a cache
    # written before that was told apart recorded 0, which no fitted tokenizer has)
    past = tokenizer in FITTED and not fitted
    fit_end = total if past else min(int(fitted or 0), total)  # data.max_tokens may stop inside the fitting text
    n_train = total - int(total * val_fraction)
    capped = max_tokens if max_tokens is not None and total >= max_tokens else None
    if capped is not None and fit_end >= total:
        raise _no_val_left(total, fitted, past, tokenizer, max_tokens)
    if n_train < fit_end:
        log.warning(
            "data: the validation tail would overlap the %s tokenizer's fitting text; train is extended to "
            "token %s, val keeps %s tokens (lower data.bpe_sample_bytes for a larger val split)",
            tokenizer,
            f"{fit_end:,}",
            f"{total - fit_end:,}",
        )
        n_train = fit_end
    return n_train, capped


def _no_val_left(total: int, fitted, past: bool, tokenizer: str, max_tokens) -> ConfigError:
    """The one-line error for a data.max_tokens cap that leaves only fitting text (`past`: the cap cut inside it)."""
    where, allowed = (
        (
            f"text that runs past all {total:,} tokens kept",
            "null, more tokens than its fitting text holds, or a lower data.bpe_sample_bytes",
        )
        if past
        else (
            f"the first {fitted:,} tokens of the stream",
            f"null, or more than {fitted:,} (or lower data.bpe_sample_bytes)",
        )
    )
    return ConfigError(
        f"data.max_tokens={max_tokens}: the {tokenizer} tokenizer is fitted on {where} and keeps that text out "
        f"of validation, so no val text is left; allowed: {allowed}"
    )


@dataclass
class TokenStreamEntry:
    """A whole source tokenized by a given tokenizer: the token view, its cache entry and fingerprint."""

    tokens: TokenStream
    cache_path: Path
    from_cache: bool
    fingerprint: str  # the entry's key plus its length: changes whenever any token could change
    documents: np.ndarray | None = None  # data.doc_mask: token offsets where each document starts (documents.py)


def tokenize_with(
    source,
    tok,
    *,
    cache_dir: Path | str | None = None,
    num_proc: int | None = None,
    max_tokens: int | None = None,
    verify: bool = False,
    documents: bool = False,
) -> TokenStreamEntry:
    """Tokenize all of `source` with `tok` (fitted elsewhere, e.g. the run's own corpus: a validation set,
    gptlab/data/val_sets.py) once into cached shards, or open them; no split, nothing fitted; `documents`: with
    where each document starts."""
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    key = given_cache_key(source.key, tok, max_tokens)
    folder, from_cache = _entry(
        source, cache_dir, key, num_proc, tokenizer=tok.name, fit=None, bpe_vocab_size=0, max_tokens=max_tokens,
        given=tok,
    )  # fmt: skip
    shards, index = open_shards(folder)
    touch_last_used(folder)
    _check_ids(folder, shards, index, tok.vocab_size, verify)
    total = int(index["tokens"])
    capped = max_tokens is not None and total >= max_tokens
    starts = document_starts(folder, source, tok, total, capped, num_proc) if documents else None
    stream = TokenStream(shards, 0, total, tok.vocab_size, folder)
    return TokenStreamEntry(stream, folder, from_cache, f"{key}:{total}", starts)

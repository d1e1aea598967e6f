"""Named extra validation sets (`data.val_sets`): the loss per domain (prose, code, a held-out corpus) beside the
pooled val loss, which can hide a change that helps one domain and hurts another.

Each set is one list entry that describes its source as data=text or data=hf describe theirs:

    {name: code, paths: [corpus/code/*.txt]}                         local files (+ column for jsonl/json/parquet)
    {name: stories, dataset: roneneldan/TinyStories, split: validation}   a hub dataset or a local dataset folder

plus its size: `sequences` (the fixed windows scored; null = train.eval_sequences) and `max_tokens` (keep only the
first tokens). The whole source is validation: it is tokenized with the run's own tokenizer (fitted on the run's
corpus, never on a val set) into the token cache (gptlab/data/corpus.py tokenize_with), and its windows are drawn
from data_seed on a stream of their own, like the main val split's: every arm of a sweep is scored on the same
tokens. The name names the metric, `val/<name>/loss`; the set's fingerprint (content, tokenizer, cap) and size go
into summary.json, so gptlab-compare pools a set only over runs that scored the same one.

A set is held-out text by content, not by file name: once the run's train split is tokenized, a set more than
SHARED_LIMIT of whose K-token passages occur in it (the bundled corpus, a prefix of a training file, a copy) is
refused, naming the set (gptlab/data/overlap.py; the verdict is cached in the set's cache entry per train split).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import torch

from gptlab.data import default_cache_dir
from gptlab.data.corpus import tokenize_with
from gptlab.data.documents import window_documents
from gptlab.data.files import content_hashes, resolve_paths, source_key
from gptlab.data.hub import load_hub_source, local_split_files
from gptlab.data.lm import token_windows, window_starts
from gptlab.data.overlap import K, shared_fraction
from gptlab.data.sources import FileSource
from gptlab.errors import ConfigError
from gptlab.util.checks import Bool, Number, Text, rule, show

STREAM = "val-set"  # the windows' stream (gptlab/data/streams.py): apart from training, val and the probes
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
FILE_KEYS = ("paths", "column")
HUB_KEYS = ("dataset", "config_name", "split", "column", "streaming")
SIZE_KEYS = ("sequences", "max_tokens")
KEYS = ("name", "paths", "dataset", "config_name", "split", "column", "streaming", *SIZE_KEYS)
CHECKS: dict[str, Callable[[str, Any], None]] = {
    "paths": Text(many=True),
    "dataset": Text(),
    "config_name": Text(null=True),
    "split": Text(),
    "column": Text(),
    "streaming": Bool(),
    "sequences": Number(">= 1", int, null=True, note="null = train.eval_sequences"),
    "max_tokens": Number(">= 1", int, null=True, note="null = all"),
}
ALLOWED = (
    "a list of sets, each {name: NAME, paths: [files or globs]} (as data=text) or {name: NAME, dataset: <hub name "
    "or local folder>} (as data=hf), with optional sequences and max_tokens"
)
SHARED_LIMIT = 0.05  # the share of a set's K-token passages that may occur in the training text (honest prose: <0.1%)
_SOURCE_KEY = {"name": "dataset"}  # data=hf's data.name is a set's `dataset` (its `name` names the set)


@dataclass(frozen=True)
class ValSetSpec:
    """One entry of data.val_sets, checked: its name and its source (files or a hub dataset) and size."""

    name: str
    paths: tuple[str, ...] = ()
    dataset: str | None = None
    config_name: str | None = None
    split: str = "train"
    column: str = "text"
    streaming: bool = False
    sequences: int | None = None
    max_tokens: int | None = None

    @property
    def key(self) -> str:
        """`data.val_sets.<name>`: how errors name the set."""
        return f"data.val_sets.{self.name}"

    def describe(self) -> Any:
        """The source as summary.json records it: the paths given, or the hub dataset (config, split)."""
        if self.dataset is None:
            return list(self.paths)
        return {"dataset": self.dataset, "config_name": self.config_name, "split": self.split}


def _name(i: int, entry: Any, seen: dict[str, int]) -> str:
    """The entry's name, checked: a mapping with a simple identifier for a name, given once."""
    if not isinstance(entry, dict):
        raise ConfigError(f"data.val_sets[{i}]={show(entry)}: expected a mapping; allowed: {ALLOWED}")
    name = entry.get("name")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"data.val_sets[{i}]: no name; allowed: {ALLOWED}")
    if not NAME.fullmatch(name):
        raise ConfigError(
            f"data.val_sets.{name}: not a simple identifier; allowed: letters, digits and _, not starting with a "
            f"digit (it names the metric val/<name>/loss)"
        )
    if name in seen:
        raise ConfigError(
            f"data.val_sets.{name}: named twice (entries {seen[name]} and {i}); allowed: each name once (it names "
            f"the metric val/{name}/loss)"
        )
    seen[name] = i
    return name


def _spec(name: str, entry: dict) -> ValSetSpec:
    """The entry's keys checked against what a files set or a hub set takes."""
    key = f"data.val_sets.{name}"
    unknown = [k for k in entry if k not in KEYS]
    if unknown:
        raise ConfigError(f"{key}.{unknown[0]}: not a key of a validation set; allowed: {', '.join(KEYS)}")
    for k, check in CHECKS.items():
        if k in entry:
            check(f"{key}.{k}", entry[k])
    files, hub = entry.get("paths") is not None, entry.get("dataset") is not None
    if files == hub:
        why = "both paths and dataset" if files else "no source"
        raise ConfigError(
            f"{key}: {why}; allowed: paths=[files or globs] (as data=text) or dataset=<hub name or local folder> "
            f"(as data=hf)"
        )
    own = FILE_KEYS if files else HUB_KEYS
    stray = [k for k in entry if k not in (*own, *SIZE_KEYS, "name")]
    if stray:
        kind = "paths (files)" if files else "dataset (a hub set)"
        raise ConfigError(
            f"{key}.{stray[0]}: not a key of a set read from {kind}; allowed: {', '.join(('name', *own, *SIZE_KEYS))}"
        )
    paths = entry.get("paths")
    fields = {k: v for k, v in entry.items() if k not in ("name", "paths")}
    spec = ValSetSpec(name, tuple([paths] if isinstance(paths, str) else paths or ()), **fields)
    if files and not spec.paths:
        raise ConfigError(f"{key}.paths: no files given (an empty set); allowed: .txt, .jsonl/.json or .parquet files")
    return spec


def _plain(value: Any) -> Any:
    """Mappings as dicts and lists as lists (instantiate hands OmegaConf containers on, which data/ does not import)."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        return [_plain(v) for v in value]
    return value


def parse_val_sets(value: Any) -> list[ValSetSpec]:
    """data.val_sets as checked specs (null or [] = none); one ConfigError line naming the set and what is allowed."""
    value = _plain(value)
    if value is None:
        return []
    if not isinstance(value, (list, tuple)):
        raise ConfigError(f"data.val_sets={show(value)}: expected {ALLOWED}")
    seen: dict[str, int] = {}
    return [_spec(_name(i, entry, seen), entry) for i, entry in enumerate(value)]


def rekeyed(err: ConfigError, spec: ValSetSpec) -> ConfigError:
    """A data error (`data.paths: ...`, `data: ...`) as the set's own (`data.val_sets.<name>.paths: ...`)."""
    text = str(err)
    head, sep, rest = text.partition(": ")
    if sep and head.startswith("data.") and " " not in head:
        sub = head[len("data.") :].split(".", 1)[0]
        return ConfigError(f"{spec.key}.{_SOURCE_KEY.get(sub, sub)}: {rest}")
    if sep and head == "data":
        return ConfigError(f"{spec.key}: {rest}")
    return ConfigError(f"{spec.key}: {text}")


@dataclass(frozen=True)
class ValSetsCheck:
    """The schema check of data.val_sets (gptlab/config/schema.py): the entries, and that every path names files,
    before anything is built (the files' content is checked when the set is tokenized)."""

    def __call__(self, key: str, value: Any) -> None:
        for spec in parse_val_sets(value):
            if spec.paths:
                try:
                    resolve_paths(list(spec.paths))
                except ConfigError as err:
                    raise rekeyed(err, spec) from None


ValSets = Annotated[list | None, rule(check=ValSetsCheck())]


def check_apart(
    value: Any,
    files: Sequence[Path],
    hashes: Sequence[str] | None = None,
    cache_dir=None,
    hub: tuple[str, str | None, str] | None = None,
) -> None:
    """No set may score training text: not a training file (data.paths), as given in `paths` or read from a local
    dataset folder's split, and not the training hub dataset's own split (`hub`: data=hf's name, config_name,
    split). Files are compared by resolved path and, with the training files' content `hashes`, by content (a copy
    elsewhere)."""
    train = {Path(f).resolve(): i for i, f in enumerate(files)}
    by_hash = {h: Path(files[i]) for i, h in enumerate(hashes or ())}
    apart = "allowed: files apart from the training corpus (a val set scores text the model never trained on)"
    for spec in parse_val_sets(value):
        if spec.dataset is not None and hub is not None and (spec.dataset, spec.config_name, spec.split) == hub:
            raise ConfigError(
                f"{spec.key}.dataset: {spec.dataset} (config {spec.config_name}, split {spec.split}) is the training "
                "data (data.name, data.config_name, data.split); allowed: another split or dataset (a val set scores "
                "text the model never trained on)"
            )
        field, own = "paths", []  # type: str, list[Path]
        if spec.paths:
            try:
                own = resolve_paths(list(spec.paths))
            except ConfigError as err:
                raise rekeyed(err, spec) from None
        elif spec.dataset is not None and train and Path(spec.dataset).expanduser().is_dir():
            field, own = "dataset", local_split_files(Path(spec.dataset).expanduser(), spec.config_name, spec.split)
        for f in own:
            if f in train:
                raise ConfigError(f"{spec.key}.{field}: {f} is a training file (data.paths); {apart}")
        if by_hash and own:
            cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
            try:
                own_hashes = content_hashes(own, cache)
            except ConfigError as err:
                raise rekeyed(err, spec) from None
            for f, h in zip(own, own_hashes, strict=True):
                if h in by_hash:
                    raise ConfigError(
                        f"{spec.key}.{field}: {f} has the content of training file {by_hash[h]} (data.paths); {apart}"
                    )


class ValSet:
    """One named validation set: all of its source's tokens, its fingerprint, and its fixed windows."""

    def __init__(
        self, spec: ValSetSpec, tokens, fingerprint: str, seed: int, seq_len: int, cache_path=None, documents=None
    ):
        self.spec, self.name, self.tokens, self.seed, self.seq_len = spec, spec.name, tokens, int(seed), int(seq_len)
        self.documents = documents  # data.doc_mask: token offsets where each document starts, else None
        self.cache_path = cache_path  # its token cache entry (where held_out() keeps its verdicts), None: not cached
        self.fingerprint = f"val_set:{fingerprint}"  # content, the tokenizer's identity and the cap
        self.sequences = spec.sequences  # None: train.eval_sequences
        if len(tokens) < self.seq_len + 1:
            raise ConfigError(
                f"{spec.key}: holds {len(tokens)} tokens, too few for one window of model.block_size={self.seq_len}; "
                f"allowed: a set of at least {self.seq_len + 1} tokens (add text, raise max_tokens or lower "
                f"model.block_size)"
            )
        if hasattr(tokens, "windows"):  # a corrupt cache entry's first window is refused before any run file
            tokens.windows(np.zeros(1, dtype=np.int64), self.seq_len + 1)

    @property
    def metric(self) -> str:
        """Its loss's name in every sink: val/<name>/loss."""
        return f"val/{self.name}/loss"

    def count(self, eval_sequences: int) -> int:
        """How many windows are scored: the set's `sequences`, else train.eval_sequences."""
        return self.sequences or eval_sequences

    def samples(self, count: int) -> tuple[torch.Tensor, ...]:
        """The set's first `count` fixed windows (x, y), (count, T) each: a pure function of (data_seed, index), a
        prefix of any larger count; + their (count, T) document ids with data.doc_mask."""
        xy = token_windows(self.tokens, self.seed, STREAM, 0, count, self.seq_len)
        if self.documents is None:
            return xy
        starts = window_starts(self.tokens, self.seed, STREAM, 0, count, self.seq_len)
        return (*xy, window_documents(self.documents, starts, self.seq_len))

    def record(self, eval_sequences: int, loss: float | None) -> dict:
        """summary.json's entry: the final loss, the fingerprint and the size it was measured on, and the source."""
        return {
            "final_loss": loss,
            "fingerprint": self.fingerprint,
            "tokens": len(self.tokens),
            "sequences": self.count(eval_sequences),
            "source": self.spec.describe(),
        }

    def __repr__(self) -> str:
        return f"<ValSet {self.name} tokens={len(self.tokens):,} {self.fingerprint[:24]}>"


def _source(spec: ValSetSpec, cache_dir: Path, verify: bool):
    """The set's documents: its files (validated and hashed once per file version) or its hub dataset."""
    if spec.dataset is not None:
        return load_hub_source(spec.dataset, spec.config_name, spec.split, spec.column, spec.streaming, cache_dir)
    files = resolve_paths(list(spec.paths))
    hashes = content_hashes(files, cache_dir, verify)
    return FileSource(files, spec.column, source_key(files, hashes, spec.column))


def open_val_set(
    spec: ValSetSpec,
    tokenizer,
    seed: int,
    block_size: int,
    cache_dir: Path,
    num_proc=None,
    verify: bool = False,
    documents: bool = False,
) -> ValSet:
    """One set tokenized with `tokenizer` (cached) and opened (`documents`: with where each document starts, for
    data.doc_mask); its errors name data.val_sets.<name>."""
    try:
        source = _source(spec, cache_dir, verify)
        try:
            entry = tokenize_with(
                source, tokenizer, cache_dir=cache_dir, num_proc=num_proc, max_tokens=spec.max_tokens, verify=verify,
                documents=documents,
            )  # fmt: skip
        finally:
            getattr(source, "close", lambda: None)()  # a local hub folder's Arrow copy
    except ConfigError as err:
        raise rekeyed(err, spec) from None
    return ValSet(spec, entry.tokens, entry.fingerprint, seed, block_size, entry.cache_path, entry.documents)


def open_val_sets(
    value: Any,
    tokenizer,
    seed: int,
    block_size: int,
    cache_dir=None,
    num_proc=None,
    verify: bool = False,
    documents: bool = False,
) -> tuple[ValSet, ...]:
    """Every set of data.val_sets (null or [] = none), tokenized with the run's own `tokenizer`, windows of
    `block_size` tokens drawn from `seed` (`documents`: with their document ids, data.doc_mask)."""
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return tuple(
        open_val_set(spec, tokenizer, seed, block_size, cache, num_proc, verify, documents)
        for spec in parse_val_sets(value)
    )


def _shared(val_set: ValSet, train, train_fingerprint: str) -> float:
    """The share of the set's passages found in `train`, read from the set's cache entry when this train split was
    measured before (only a passing verdict is kept)."""
    key = hashlib.sha256(f"{K}:{SHARED_LIMIT}:{train_fingerprint}".encode()).hexdigest()[:24]
    marker = Path(val_set.cache_path) / f"held_out_{key}.json" if val_set.cache_path is not None else None
    if marker is not None and marker.is_file():
        try:
            return float(json.loads(marker.read_text())["shared"])
        except (OSError, ValueError, KeyError, TypeError):
            pass  # damaged: measured again
    share = shared_fraction(val_set.tokens, train, K, stop_above=SHARED_LIMIT)
    if marker is not None and share <= SHARED_LIMIT:
        try:
            marker.write_text(json.dumps({"shared": share, "train": train_fingerprint}))
        except OSError:
            pass  # a read-only cache: measured again next time
    return share


def check_held_out(val_sets: Sequence[ValSet], train, train_fingerprint: str, source: str) -> None:
    """Every set is text apart from the run's training text `train` (its train split's tokens) by content: at most
    SHARED_LIMIT of the set's K-token passages may occur in it; else one ConfigError line naming the set."""
    for val_set in val_sets:
        share = _shared(val_set, train, train_fingerprint)
        if share > SHARED_LIMIT:
            raise ConfigError(
                f"{val_set.spec.key}: {share:.0%} of its {K}-token passages occur in the training text ({source}); "
                f"allowed: text apart from the training corpus, sharing at most {SHARED_LIMIT:.0%} of its passages "
                "(a val set scores text the model never trained on)"
            )

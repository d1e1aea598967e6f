"""Data for training runs: every data choice builds an object satisfying the `Data` protocol below.

build.py calls `factory(seed=data_seed, block_size=model.block_size, cache_dir=Path)` on the partial
that Hydra instantiates from conf/data/<choice>.yaml; from a notebook, call the class directly, e.g.
`ShakespeareData(seed=0, block_size=256)` (cache_dir defaults to default_cache_dir()).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:  # annotations only: `gptlab-train --help` answers without importing torch
    import torch


def default_cache_dir() -> Path:
    """$GPTLAB_CACHE, else ~/.cache/gptlab: where tokenizers and token arrays are cached (a file there: refused)."""
    from gptlab.util.paths import user_cache

    return user_cache(os.environ.get("GPTLAB_CACHE"))


@runtime_checkable
class Tokenizer(Protocol):
    """Text <-> ids."""

    name: str
    vocab_size: int

    def encode(self, text: str) -> list[int]:
        """Text -> token ids."""

    def decode(self, ids: list[int]) -> str:
        """Token ids -> text."""

    def identity(self) -> str:
        """A string that changes whenever the mapping could change (used in cache keys)."""


@runtime_checkable
class Data(Protocol):
    """What the training loop needs from a data choice; samples depend only on the data seed and their index."""

    name: str  # the choice name, e.g. "shakespeare"
    tokenizer: Tokenizer
    vocab_size: int  # ids in every batch are < vocab_size
    seq_len: int  # T of every batch; <= model.block_size
    reports_accuracy: bool  # True when y marks only answer positions (accuracy is meaningful)
    fingerprint: str  # changes whenever any sample could change (content, tokenizer, split, generator)
    val_sets: tuple  # extra named validation sets (data.val_sets, gptlab/data/val_sets.py); () for none
    # data.doc_mask: the windows pack several documents; then `train_documents(first, count)` and `val_documents(count)`
    # give each sample's (count, T) document ids beside train_samples / val_samples (gptlab/data/documents.py)
    doc_mask: bool

    def train_samples(self, first: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(x, y) int64 CPU tensors (count, T) for global training samples first..first+count-1.

        Sample i is a pure function of (seed, i): the global batch of step s is samples [s·B, (s+1)·B)
        whatever grad_accum, world size or micro-batch size; y = -100 is unscored.
        """

    def val_samples(self, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The first `count` sequences of the fixed validation set (a prefix of any larger count), (count, T)."""

"""Language-model samples from train/val token arrays: random windows, each a pure function of (seed, sample index)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import numpy as np
import torch

from gptlab.data.documents import window_documents
from gptlab.data.streams import indexed_ints
from gptlab.data.tokenizers import tokenizer_names
from gptlab.errors import ConfigError
from gptlab.util.checks import OneOf, rule

if TYPE_CHECKING:
    from gptlab.data.shards import TokenStream

# the keys the LMData choices (shakespeare, text, hf) share, with their rules (gptlab/config/schema.py reads them off
# the constructors' signatures)
TokenizerName = Annotated[str, rule(check=OneOf(tuple(tokenizer_names())))]
BpeVocabSize = Annotated[int, rule(">= 257")]  # the 256 bytes and at least one merge
BpeSampleBytes = Annotated[int, rule(">= 1000000")]
ValFraction = Annotated[float, rule("(0, 1)")]
MaxTokens = Annotated[int | None, rule(">= 1")]
NumProc = Annotated[int | None, rule(">= 1", curve=False)]  # tokenizer processes: the same tokens
Verify = Annotated[bool, rule(curve=False)]  # the cache's full re-check: the same tokens
# packed documents: attention within each document, positions restarting at each (the batches then carry document ids)
DocMask = Annotated[bool, rule(note="true: attention stays inside each document of a window (block-causal)")]


def check_positive_int(key: str, value) -> int:
    """`value` if it is an int >= 1, else a ConfigError naming `key`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{key}: got {value!r}; allowed: an integer >= 1")
    return value


def window_starts(
    tokens: np.ndarray | TokenStream, seed: int, stream: str, first: int, count: int, T: int
) -> np.ndarray:
    """(count,) first token of samples first..first+count-1 of `stream`: a pure function of (seed, stream, index)."""
    check_positive_int("sample count", count)
    return indexed_ints(seed, stream, np.arange(first, first + count), len(tokens) - T)


def token_windows(
    tokens: np.ndarray | TokenStream, seed: int, stream: str, first: int, count: int, T: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Samples first..first+count-1 of `stream`: windows of T+1 tokens at starts that are a pure function of
    (seed, stream, sample index) -> (x, y), each (count, T) int64."""
    starts = window_starts(tokens, seed, stream, first, count, T)  # (count,)
    if hasattr(tokens, "windows"):  # token shards (TokenStream): windows may cross a shard boundary
        window = torch.from_numpy(tokens.windows(starts, T + 1).astype(np.int64))  # (count, T+1)
    else:
        window = torch.from_numpy(np.asarray(tokens[starts[:, None] + np.arange(T + 1)], dtype=np.int64))
    return window[:, :-1].contiguous(), window[:, 1:].contiguous()


class LMData:
    """Next-token data over token arrays: x = tokens[s:s+T], y = tokens[s+1:s+T+1] with T = block_size."""

    reports_accuracy = False
    doc_mask = False  # True when built with documents: the batches then carry document ids (train_documents)
    val_sets: tuple = ()  # extra named validation sets (data.val_sets, gptlab/data/val_sets.py): the text choices set it

    def __init__(
        self,
        *,
        name: str,
        tokenizer,
        train: np.ndarray | TokenStream,
        val: np.ndarray | TokenStream,
        seed: int,
        block_size: int,
        fingerprint: str,
        capped_at: int | None = None,
        documents: np.ndarray | None = None,
    ):
        """`documents`: token offsets of every document's first token in the stream train + val (data.doc_mask;
        gptlab/data/documents.py); None = the batches carry no document ids."""
        self.name = name
        self.fingerprint = f"{name}:{fingerprint}"  # the token arrays' cache key: changes with content or tokenizer
        self.tokenizer = tokenizer
        self.vocab_size = int(tokenizer.vocab_size)
        self.seed = int(seed)
        self.seq_len = check_positive_int("model.block_size", block_size)
        self.train_tokens = train  # (N_train,) uint16/uint32: a TokenStream over memmapped shards, or an array
        self.val_tokens = val  # (N_val,)
        self.doc_mask = documents is not None
        if documents is not None:  # each split's own starts, offsets into it (val begins where train ends)
            n = len(train)
            self.train_starts = documents[documents < n]
            self.val_starts = np.concatenate([[0], documents[documents > n] - n]).astype(np.int64)
        for split, tokens in (("train", train), ("val", val)):
            if len(tokens) < self.seq_len + 1:
                fix = (
                    f"data.max_tokens={capped_at} keeps too few tokens; raise it or lower model.block_size"
                    if capped_at is not None
                    else "add text, lower model.block_size or change data.val_fraction"
                )
                raise ConfigError(
                    f"data: the {split} split of '{name}' has {len(tokens)} tokens but model.block_size="
                    f"{self.seq_len} needs at least {self.seq_len + 1}; {fix}"
                )
            if hasattr(tokens, "windows"):  # a corrupt cache entry's first window is refused before any run file
                tokens.windows(np.zeros(1, dtype=np.int64), self.seq_len + 1)

    def _windows(
        self, tokens: np.ndarray | TokenStream, stream: str, first: int, count: int, length: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Samples first..first+count-1 of `stream` (T = `length`, else the training length): see token_windows."""
        return token_windows(tokens, self.seed, stream, first, count, length or self.seq_len)

    def train_samples(self, first: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Training samples first..first+count-1: (x, y) int64 (count, T); sample i depends only on (seed, i)."""
        return self._windows(self.train_tokens, "train", first, count)

    def val_samples(self, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The fixed validation set's first `count` sequences (count, T): the same for every batch size."""
        return self._windows(self.val_tokens, "val", 0, count)

    def train_documents(self, first: int, count: int) -> torch.Tensor:
        """Document ids (count, T) int32 of training samples first..first+count-1 (data.doc_mask): 0 for the
        document each window opens in, +1 at each document that starts inside it."""
        starts = window_starts(self.train_tokens, self.seed, "train", first, count, self.seq_len)
        return window_documents(self.train_starts, starts, self.seq_len)

    def val_documents(self, count: int) -> torch.Tensor:
        """Document ids (count, T) int32 of the fixed validation set's first `count` sequences (data.doc_mask)."""
        starts = window_starts(self.val_tokens, self.seed, "val", 0, count, self.seq_len)
        return window_documents(self.val_starts, starts, self.seq_len)

    def long_val_samples(self, count: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """`count` windows of `length` tokens (count, length) from the val split, on their own stream (the length
        probe's fixed set, gptlab.train.probes.length); the split must hold more than `length` tokens."""
        if len(self.val_tokens) <= length:
            raise ConfigError(
                f"data: the val split of '{self.name}' has {len(self.val_tokens)} tokens, too few for windows of "
                f"{length}; add text or raise data.val_fraction"
            )
        return self._windows(self.val_tokens, "val-long", 0, count, length)

    def sample_prompt(self) -> str:
        """The first non-empty line at the start of the val split, for sampling demos."""
        head = self.tokenizer.decode(np.asarray(self.val_tokens[:256], dtype=np.int64).tolist())
        lines = [line for line in head.splitlines() if line.strip()]
        return lines[0] if lines else head

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} {self.name} tokenizer={self.tokenizer.identity()} "
            f"train={len(self.train_tokens):,} val={len(self.val_tokens):,} tokens T={self.seq_len}>"
        )

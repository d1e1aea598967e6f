"""Synthetic multi-query associative recall (MQAR, as in Zoology): recall the value paired with a key seen earlier.

One sequence of length seq_len:
    k1 v1 k2 v2 ... kP vP | q1 a1 q2 a2 ... qQ aQ | pad ...
keys are distinct within a sequence, values are drawn with replacement, each query q_j is one of the
sequence's keys (distinct queries) and a_j is its value. Scored positions are the queries: y = a_j there,
-100 everywhere else, so loss and accuracy measure recall only. With as many queries as pairs the last query is
the one key not yet asked and can be answered by elimination, without recall: the default asks half the pairs,
and num_queries == num_pairs logs a warning.
Token ids: keys 0..num_keys-1, values num_keys..num_keys+num_values-1, pad = num_keys+num_values.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import torch

from gptlab.data.lm import check_positive_int
from gptlab.data.streams import stream_generator
from gptlab.errors import ConfigError
from gptlab.util.checks import rule

log = logging.getLogger(__name__)

IGNORE = -100
Count = Annotated[int, rule(">= 1")]  # each of the task's sizes


class RecallTokenizer:
    """Readable names for MQAR ids: k<i>, v<j>, <pad>."""

    name = "assoc_recall"

    def __init__(self, num_keys: int, num_values: int):
        self.num_keys, self.num_values = num_keys, num_values
        self.vocab_size = num_keys + num_values + 1
        self.symbols = [f"k{i}" for i in range(num_keys)] + [f"v{j}" for j in range(num_values)] + ["<pad>"]
        self._ids = {s: i for i, s in enumerate(self.symbols)}

    def encode(self, text: str) -> list[int]:
        """Space-separated symbols -> ids."""
        return [self._ids[s] for s in text.split()]

    def decode(self, ids: list[int]) -> str:
        """Ids -> space-separated symbols."""
        return " ".join(self.symbols[i] for i in ids)

    def identity(self) -> str:
        """Name and vocabulary layout."""
        return f"assoc_recall:{self.num_keys}:{self.num_values}"


class AssocRecallData:
    """MQAR sequences generated on the fly, each from (seed, index); val from a separate stream."""

    name = "assoc_recall"
    reports_accuracy = True
    val_sets: tuple = ()  # generated sequences: no extra validation sets (data.val_sets is not one of its keys)
    doc_mask = False  # each sequence is one document already (data.doc_mask is not one of its keys)

    def __init__(
        self,
        *,
        seed: int,
        block_size: int,
        cache_dir: Path | str | None = None,
        num_keys: Count = 128,
        num_values: Count = 128,
        num_pairs: Count = 16,
        num_queries: Count = 8,
        seq_len: Count = 64,
    ):
        for key, value in (
            ("num_keys", num_keys),
            ("num_values", num_values),
            ("num_pairs", num_pairs),
            ("num_queries", num_queries),
            ("seq_len", seq_len),
        ):
            check_positive_int(f"data.{key}", value)
        if num_pairs > num_keys:
            raise ConfigError(
                f"data.num_pairs: got {num_pairs}; allowed: <= data.num_keys ({num_keys}), "
                f"keys are distinct within a sequence"
            )
        if num_queries > num_pairs:
            raise ConfigError(f"data.num_queries: got {num_queries}; allowed: <= data.num_pairs ({num_pairs})")
        if 2 * (num_pairs + num_queries) > seq_len:
            raise ConfigError(
                f"data.seq_len: got {seq_len}; needs >= 2*(num_pairs + num_queries) = {2 * (num_pairs + num_queries)}"
            )
        if seq_len > check_positive_int("model.block_size", block_size):
            raise ConfigError(
                f"data.seq_len: got {seq_len} > model.block_size={block_size}; allowed: "
                f"data.seq_len <= model.block_size"
            )
        if num_queries == num_pairs > 1:
            log.warning(
                "data.num_queries == data.num_pairs (%d): every key is asked, so the last query can be answered by "
                "elimination without recall and val/acc overstates recall; ask fewer (e.g. data.num_queries=%d)",
                num_pairs,
                num_pairs // 2,
            )
        self.seed = int(seed)
        self.num_keys, self.num_values = num_keys, num_values
        self.num_pairs, self.num_queries, self.seq_len = num_pairs, num_queries, seq_len
        self.tokenizer = RecallTokenizer(num_keys, num_values)
        self.vocab_size = self.tokenizer.vocab_size
        self.pad_id = num_keys + num_values
        self.fingerprint = f"assoc_recall:v2:{self.tokenizer.identity()}:{num_pairs}:{num_queries}:{seq_len}"

    def _sequence(self, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """One sequence -> (x, y) int64 (seq_len,)."""
        P, Q = self.num_pairs, self.num_queries
        keys = torch.rand(self.num_keys, generator=gen).argsort()[:P]  # (P,) distinct
        values = torch.randint(0, self.num_values, (P,), generator=gen) + self.num_keys  # (P,)
        picks = torch.rand(P, generator=gen).argsort()[:Q]  # (Q,) which pairs are queried
        x = torch.full((self.seq_len,), self.pad_id, dtype=torch.int64)
        y = torch.full((self.seq_len,), IGNORE, dtype=torch.int64)
        x[0 : 2 * P : 2], x[1 : 2 * P : 2] = keys, values
        q0 = 2 * P  # first query position
        answers = values[picks]  # (Q,)
        x[q0 : q0 + 2 * Q : 2], x[q0 + 1 : q0 + 2 * Q : 2] = keys[picks], answers
        y[q0 : q0 + 2 * Q : 2] = answers  # predict a_j at the position of q_j
        return x, y

    def _samples(self, stream: str, first: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Sequences first..first+count-1 of `stream`, each from its own generator: (x, y) (count, seq_len)."""
        check_positive_int("sample count", count)
        rows = [self._sequence(stream_generator(self.seed, stream, i)) for i in range(first, first + count)]
        return torch.stack([r[0] for r in rows]), torch.stack([r[1] for r in rows])

    def train_samples(self, first: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Training sequences first..first+count-1: (x, y) int64 (count, seq_len); sequence i depends only on (seed, i)."""
        return self._samples("recall-train", first, count)

    def val_samples(self, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The fixed validation set's first `count` sequences (its own stream, apart from training)."""
        return self._samples("recall-val", 0, count)

    def probe_samples(self, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The recall probe's fixed set (gptlab.train.probes.recall): its own stream, apart from training and val."""
        return self._samples("recall-probe", 0, count)

    def __repr__(self) -> str:
        return (
            f"<AssocRecallData keys={self.num_keys} values={self.num_values} pairs={self.num_pairs} "
            f"queries={self.num_queries} T={self.seq_len}>"
        )

"""Associative recall in the run's own vocabulary: accuracy by number of key/value pairs and by key-query distance.

The sequences are the MQAR task's (gptlab.data.assoc_recall, its `probe_samples` stream): `k1 v1 ... kP vP q1 a1 ...
qQ aQ`, scored at each query (target: its value), with Q = max(1, P // 2) queries per sequence so no query can be
answered by elimination alone. P runs over 2, 4, 8, ... up to `max_pairs` (and what the training length and the
vocabulary allow). Key and value ids are mapped into the run's vocabulary by a permutation drawn from data_seed, so
the probe speaks the tokens the model was trained on. Keys: `probe/recall/acc` (every query), `.../pairsNN/acc`
and `.../distLO-HI/acc` (queries whose key stood LO..HI tokens earlier). Chance for a model that knows nothing is
1/vocab_size; for one that only learned "answer with a value", 1/(number of value tokens).
"""

from __future__ import annotations

from typing import Annotated

import torch

from gptlab.data.assoc_recall import IGNORE, AssocRecallData
from gptlab.data.streams import stream_generator
from gptlab.errors import ConfigError
from gptlab.train.probes.score import answers, set_fingerprint
from gptlab.util.checks import rule


def pair_counts(max_pairs: int, keys: int, seq_len: int) -> list[int]:
    """2, 4, 8, ... while P <= max_pairs, P <= keys and a sequence (2·(P + P//2) tokens) fits seq_len."""
    out, p = [], 2
    while p <= min(max_pairs, keys) and 2 * (p + max(1, p // 2)) <= seq_len:
        out.append(p)
        p *= 2
    return out


def key_distance(x: torch.Tensor) -> torch.Tensor:
    """(N, T) ids -> (N, T): t minus the first position holding x[t] (0 where x[t] is its own first occurrence)."""
    T = x.size(1)
    same = x[:, :, None] == x[:, None, :]  # (N, T, T): position j holds the token at t
    first = same.int().argmax(-1)  # (N, T) the first such j
    return torch.arange(T)[None, :] - first


def bucket(d: int, width: int) -> str:
    """`dist004-007`: the power-of-two range [lo, 2·lo) that holds distance d."""
    lo = 1 << (d.bit_length() - 1)
    return f"dist{lo:0{width}d}-{2 * lo - 1:0{width}d}"


class RecallProbe:
    """MQAR accuracy per pair count and key-query distance on a fixed set from data_seed."""

    name = "recall"

    def __init__(
        self,
        *,
        seed: int,
        data,
        model=None,
        max_pairs: Annotated[int, rule(">= 2")] = 16,
        queries: Annotated[int, rule(">= 1")] = 128,
        max_keys: Annotated[int, rule(">= 2")] = 64,
    ):
        vocab, seq_len = int(data.vocab_size), int(data.seq_len)
        keys = min(max_keys, (vocab - 1) // 2)  # keys and values apart, one id left for the generator's pad
        self.pairs = pair_counts(max_pairs, keys, seq_len)
        if not self.pairs:
            raise ConfigError(
                f"probes.recall: needs a training length >= 6 and a vocabulary of >= 5 tokens (2 pairs, 1 query); "
                f"this run has length {seq_len} and {vocab} tokens; allowed: drop recall from probes"
            )
        # the generator's ids 0..2·keys (keys, values, pad) -> distinct ids of the run's vocabulary
        ids = torch.randperm(vocab, generator=stream_generator(seed, "probe-recall-vocab"))[: 2 * keys + 1]
        self.sets = {}  # P -> (x, y, distance), each (n, 2·(P+Q))
        for p in self.pairs:
            q = max(1, p // 2)
            gen = AssocRecallData(
                seed=seed,
                block_size=seq_len,
                num_keys=keys,
                num_values=keys,
                num_pairs=p,
                num_queries=q,
                seq_len=2 * (p + q),
            )
            x, y = gen.probe_samples(-(-queries // q))  # ceil: at least `queries` scored queries per P
            self.sets[p] = (ids[x], torch.where(y == IGNORE, IGNORE, ids[y.clamp(min=0)]), key_distance(x))
        self.width = len(str(seq_len))
        self.fingerprint = set_fingerprint("recall", *(t for s in self.sets.values() for t in s[:2]))

    def measure(self, model, hardware, tokens_per_forward: int) -> dict[str, float]:
        """{probe/recall/...: accuracy} over the fixed set."""
        per_pairs: dict[int, tuple[int, int]] = {}  # P -> (hits, queries)
        hits: dict[str, int] = {}  # distance bucket -> hits
        counts: dict[str, int] = {}  # distance bucket -> queries
        for p, (x, y, dist) in self.sets.items():
            correct = answers(model, x, y, hardware, tokens_per_forward)  # (n, T)
            scored = y != IGNORE
            per_pairs[p] = (int(correct[scored].sum()), int(scored.sum()))
            for d, ok in zip(dist[scored].tolist(), correct[scored].tolist()):
                b = bucket(d, self.width)
                hits[b], counts[b] = hits.get(b, 0) + ok, counts.get(b, 0) + 1
        wide = len(str(max(self.pairs)))
        out = {"probe/recall/acc": sum(h for h, _ in per_pairs.values()) / sum(n for _, n in per_pairs.values())}
        out |= {f"probe/recall/pairs{p:0{wide}d}/acc": h / n for p, (h, n) in per_pairs.items()}
        out |= {f"probe/recall/{b}/acc": hits[b] / counts[b] for b in sorted(counts)}
        return out

"""How much of one token stream occurs in another, by content: every K-token passage (shingle) is hashed, and the
share of the held-out stream's distinct passages found anywhere in the other stream is counted.

Both streams are read in chunks (memory stays flat on a corpus of any size); a held-out stream of more than
HELD_CAP passages keeps a content-defined sample of them (the hashes whose low bits are 0), taken alike on both
sides, so a passage is sampled in both streams or in neither.
"""

from __future__ import annotations

import numpy as np

K = 32  # tokens per passage: long enough that honest held-out prose shares almost none, short enough for any set
HELD_CAP = 1 << 20  # distinct held-out passages kept before sampling
CHUNK = 1 << 22  # tokens of the other stream read at a time
_BASE = np.uint64(0x100000001B3)
_PAIR = np.uint64(0x9E3779B97F4A7C15)
_BITS = 24
_SHIFT = np.uint64(64 - _BITS)
_MIX = (np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB))


def _mix(h: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser in place: every bit depends on every input bit, so low bits sample fairly."""
    with np.errstate(over="ignore"):
        h ^= h >> np.uint64(30)
        h *= _MIX[0]
        h ^= h >> np.uint64(27)
        h *= _MIX[1]
        h ^= h >> np.uint64(31)
    return h


def shingles(tokens, k: int) -> np.ndarray:
    """(len(tokens) - k + 1,) uint64: a hash of every window of `k` tokens. The polynomial hash of windows of a
    power of two p <= k is built by doubling (log2(k) passes); a k-window is the pair of p-windows at its ends."""
    h = np.asarray(tokens).astype(np.uint64) + np.uint64(1)
    n = len(h) - k + 1
    if n <= 0:
        return np.empty(0, np.uint64)
    p, scale = 1, _BASE  # scale: _BASE ** p (mod 2**64)
    with np.errstate(over="ignore"):
        while 2 * p <= k:  # h[i]: the hash of tokens[i : i + p] -> of tokens[i : i + 2p]
            h = h[: len(h) - p] * scale + h[p:]
            p, scale = 2 * p, scale * scale
        if p < k:
            h = h[:n] * _PAIR + h[k - p : k - p + n]
    return _mix(h[:n] ^ np.uint64(k))


def _chunks(stream, k: int, mask: np.uint64):
    """The sampled passage hashes of `stream` (an array or a TokenStream), chunk by chunk."""
    for start in range(0, max(len(stream) - k + 1, 1), CHUNK):
        h = shingles(stream[start : start + CHUNK + k - 1], k)
        yield h[(h & mask) == 0]


def shared_fraction(held, stream, k: int = K, stop_above: float | None = None) -> float:
    """The share of `held`'s distinct k-token passages (k cut to its length) that occur in `stream`; reading stops
    early once the share is above `stop_above`."""
    k = max(1, min(k, len(held)))
    step = 1
    while len(held) > HELD_CAP * step:
        step *= 2
    mask = np.uint64(step - 1)
    mine = np.unique(np.concatenate([np.empty(0, np.uint64), *_chunks(held, k, mask)]))
    if not len(mine):
        return 0.0
    found = np.zeros(len(mine), bool)
    seen = np.zeros(1 << _BITS, bool)  # a one-hash Bloom filter: most of a chunk's passages miss it at one lookup
    seen[mine >> _SHIFT] = True
    for h in _chunks(stream, k, mask):
        h = np.sort(h[seen[h >> _SHIFT]])  # sorted: the search walks `mine` once
        at = np.minimum(np.searchsorted(mine, h), len(mine) - 1)
        found[at[mine[at] == h]] = True
        if stop_above is not None and found.sum() > stop_above * len(mine):
            break
    return float(found.mean())

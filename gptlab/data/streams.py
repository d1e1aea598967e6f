"""Independent, reproducible random streams: one torch.Generator per (seed, stream name, indices),
and counter-based integers that are a pure function of (seed, stream, index) for whole index arrays."""

from __future__ import annotations

import hashlib

import numpy as np
import torch


def stream_seed(seed: int, stream: str, *indices: int) -> int:
    """A 63-bit seed that is a pure function of its arguments; different streams never share a seed by design."""
    key = ":".join([str(int(seed)), stream, *(str(int(i)) for i in indices)])
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little") >> 1


def stream_generator(seed: int, stream: str, *indices: int) -> torch.Generator:
    """A CPU generator seeded by stream_seed (e.g. stream_generator(seed, "recall-train", sample_index))."""
    return torch.Generator().manual_seed(stream_seed(seed, stream, *indices))


def indexed_ints(seed: int, stream: str, indices: np.ndarray, high: int) -> np.ndarray:
    """Integers in [0, high), one per index, each a pure function of (seed, stream, index) (splitmix64 hash).

    Counter-based, so sample i is the same whichever batch, micro-batch or rank asks for it.
    """
    with np.errstate(over="ignore"):  # uint64 arithmetic wraps by design
        z = np.uint64(stream_seed(seed, stream)) + (np.asarray(indices, dtype=np.uint64) + np.uint64(1)) * np.uint64(
            0x9E3779B97F4A7C15
        )
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z % np.uint64(high)).astype(np.int64)  # modulo bias < high / 2**64: negligible

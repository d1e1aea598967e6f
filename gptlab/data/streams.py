"""Independent, reproducible random streams: one torch.Generator per (seed, stream name, indices)."""

from __future__ import annotations

import hashlib

import torch


def stream_seed(seed: int, stream: str, *indices: int) -> int:
    """A 63-bit seed that is a pure function of its arguments; different streams never share a seed by design."""
    key = ":".join([str(int(seed)), stream, *(str(int(i)) for i in indices)])
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little") >> 1


def stream_generator(seed: int, stream: str, *indices: int) -> torch.Generator:
    """A CPU generator seeded by stream_seed (e.g. stream_generator(seed, "train", step, micro))."""
    return torch.Generator().manual_seed(stream_seed(seed, stream, *indices))

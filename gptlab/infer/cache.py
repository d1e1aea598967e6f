"""KV caches for decoding, one per layer. Every cache answers `update(k, v) -> (k, v, k_start)`: the keys/values
the new queries attend to, (B, n_kv_head, Tk, head_dim), of which key j sits at absolute position k_start + j.

- `StaticCache`: preallocated for (B, n_kv_head, max_len, head_dim), written in place; reads are views, so a
  decode step moves the new token's K/V only (the growing `KVCache` in model/base.py copies the whole cache
  with torch.cat at every step: quadratic traffic over a generation).
- `RingCache`: a sliding-window layer keeps only its last `window` positions: memory bounded by the window
  whatever the generation length.
- `quant="int8"` (either cache): K and V stored as int8 with one scale per (token, head) (symmetric, absmax/127),
  dequantised on read; about half the bytes of a bf16 cache (head_dim bytes + a 2-byte fp16 scale vs 2·head_dim).
"""

from __future__ import annotations

import torch

QUANTS = (None, "int8")


def quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(..., hd) float -> int8 values (..., hd) and scales (..., 1) in fp16 (per token and head)."""
    amax = x.abs().amax(dim=-1, keepdim=True).float()
    # stored as fp16 (> 0: its smallest normal); quantised with the stored value, so the error stays <= half a step
    scale = (amax / 127.0).to(torch.float16).clamp(min=torch.finfo(torch.float16).tiny)
    return torch.round(x.float() / scale.float()).clamp(-127, 127).to(torch.int8), scale


def dequantize(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return (q.float() * scale.float()).to(dtype)


class _Store:
    """(B, H, L, hd) storage for K or V, plain or int8 + scales; `write` in place, `read` a prefix as `dtype`."""

    def __init__(self, shape: tuple[int, int, int, int], dtype: torch.dtype, device, quant: str | None):
        if quant not in QUANTS:
            raise ValueError(f"kv cache quant={quant!r}; allowed: none, int8")
        self.dtype, self.quant = dtype, quant
        if quant == "int8":
            self.data = torch.zeros(shape, dtype=torch.int8, device=device)
            self.scale: torch.Tensor | None = torch.zeros(shape[:3] + (1,), dtype=torch.float16, device=device)
        else:
            self.data, self.scale = torch.zeros(shape, dtype=dtype, device=device), None

    def write(self, start: int, x: torch.Tensor) -> None:
        end = start + x.size(2)
        if self.scale is None:
            self.data[:, :, start:end] = x
        else:
            self.data[:, :, start:end], self.scale[:, :, start:end] = quantize(x)

    def as_stored(self, x: torch.Tensor) -> torch.Tensor:
        """x as a read returns it after a write: in the store's dtype, through int8 and back where quantised."""
        if self.scale is None:
            return x.to(self.dtype)
        return dequantize(*quantize(x), self.dtype)

    def read(self, start: int, end: int) -> torch.Tensor:
        if self.scale is None:
            return self.data[:, :, start:end]
        return dequantize(self.data[:, :, start:end], self.scale[:, :, start:end], self.dtype)

    def nbytes(self) -> int:
        return self.data.nbytes + (0 if self.scale is None else self.scale.nbytes)


class _LayerCache:
    """One layer's K and V stores of `slots` positions each; `length` counts the positions seen so far."""

    def __init__(
        self,
        batch: int,
        n_kv_head: int,
        slots: int,
        head_dim: int,
        *,
        dtype=torch.float32,
        device="cpu",
        quant: str | None = None,
    ):
        shape = (batch, n_kv_head, slots, head_dim)
        self.k, self.v = _Store(shape, dtype, device, quant), _Store(shape, dtype, device, quant)
        self.slots, self.length = slots, 0

    def nbytes(self) -> int:
        """Bytes the cache's tensors hold (every slot: they are preallocated)."""
        return self.k.nbytes() + self.v.nbytes()


class StaticCache(_LayerCache):
    """Every position of one layer up to max_len (its slots), preallocated and written in place."""

    @property
    def max_len(self) -> int:
        return self.slots

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
        end = self.length + k.size(2)
        if end > self.max_len:
            raise ValueError(f"KV cache full: {end} positions > its max_len {self.max_len}")
        self.k.write(self.length, k)
        self.v.write(self.length, v)
        self.length = end
        return self.k.read(0, end), self.v.read(0, end), 0


class RingCache(_LayerCache):
    """The last `window` positions (its slots) of a sliding-window layer: memory bounded by the window; `length` is
    also the next position's absolute index."""

    @property
    def window(self) -> int:
        return self.slots

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
        kept = min(self.length, self.window)  # positions held, the oldest at slot (length - kept) % window
        old_k, old_v = self._ordered(kept)
        # the new positions as stored (int8: quantised), as a StaticCache returns them: both caches give one answer
        new_k, new_v = self.k.as_stored(k), self.v.as_stored(v)
        keys, values = torch.cat([old_k, new_k], dim=2), torch.cat([old_v, new_v], dim=2)  # (B, H, kept + T, hd)
        k_start, first = self.length - kept, self.length  # first: the absolute position of k[:, :, 0]
        self.length += k.size(2)
        tail = min(self.window, k.size(2))  # only the new positions need a slot; older ones already hold theirs
        for pos in range(self.length - tail, self.length):  # slot by slot: at most `window` (usually 1) writes
            j = pos - first
            self.k.write(pos % self.window, k[:, :, j : j + 1])
            self.v.write(pos % self.window, v[:, :, j : j + 1])
        return keys, values, k_start

    def _ordered(self, kept: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The held positions, oldest first: (B, H, kept, hd) each."""
        first = (self.length - kept) % self.window
        idx = [(first + i) % self.window for i in range(kept)]
        if not idx:
            empty = self.k.read(0, 0)
            return empty, empty
        order = torch.tensor(idx, device=self.k.data.device)
        return (
            torch.index_select(self.k.read(0, self.window), 2, order),
            torch.index_select(self.v.read(0, self.window), 2, order),
        )


def make_caches(model, batch: int, max_len: int, *, dtype=None, device=None, quant: str | None = None) -> list:
    """One cache per block of `model` for generating up to max_len positions: a RingCache where the layer has a
    window shorter than max_len, else a StaticCache. dtype/device default to the model's parameters'."""
    param = next(model.parameters())
    dtype, device = dtype or param.dtype, device or param.device
    caches: list[_LayerCache] = []
    for block in model.blocks:
        attn = block.attn
        ring = attn.window is not None and attn.window < max_len
        cls, slots = (RingCache, attn.window) if ring else (StaticCache, max_len)
        caches.append(cls(batch, attn.n_kv_head, slots, attn.head_dim, dtype=dtype, device=device, quant=quant))
    return caches


def cache_nbytes(caches: list) -> int:
    """Bytes held by a list of caches (measured from their tensors)."""
    return sum(c.nbytes() for c in caches)

"""Rotary position embeddings (RoPE) applied to queries and keys."""

from __future__ import annotations

from typing import Annotated

import torch

from gptlab.errors import ConfigError
from gptlab.model.base import Position
from gptlab.util.checks import rule


class RotaryPosition(Position):
    """Rotates each (even, odd)-half pair of q/k channels by pos·base^(-2i/hd)."""

    def __init__(
        self, d_model: int, n_head: int, head_dim: int, block_size: int, base: Annotated[float, rule("> 0")] = 10000.0
    ):
        super().__init__(d_model, n_head, head_dim, block_size)
        if head_dim % 2:
            raise ConfigError(f"position=rope needs an even head dim; model.d_model/model.n_head = {head_dim}")
        if base <= 0:
            raise ConfigError(f"position.base={base} must be > 0")
        self.base = float(base)  # a plain attribute, so the model fingerprint sees it (the buffer is not hashed)
        inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)  # (hd/2,)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.float().chunk(2, dim=-1)  # (B, H, T, hd/2) each
        out = torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)
        return out.to(x.dtype)

    def rotate(self, q, k, pos):
        angles = pos.float()[..., None] * self.inv_freq  # (T, hd/2), or (B, T, hd/2) for packed documents
        if angles.dim() == 3:
            angles = angles[:, None]  # (B, 1, T, hd/2): one rotation per row, shared by the heads
        cos, sin = angles.cos(), angles.sin()
        return self._rotate(q, cos, sin), self._rotate(k, cos, sin)

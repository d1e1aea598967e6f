"""Fixed sinusoidal position encodings added to the token embeddings (the original Transformer): no parameters.

Amplitude: Vaswani et al. multiplied embeddings of ~unit scale by √d_model and added the ±1 table, so token and
position signals started at about the same size. gptlab's token embeddings start at std 0.02 (GPT-2's init), so the
table is added times `scale` (default 0.02) to keep that balance; scale=1.0 adds the raw ±1 table, which swamps the
tokens (measured: +0.96 val loss against rope on the position_probes study, docs/BENCHMARKS.md).
"""

import math
from typing import Annotated

import torch

from gptlab.errors import ConfigError
from gptlab.model.base import Position
from gptlab.util.checks import rule


class SinusoidalPosition(Position):
    """PE[p, 2i] = sin(p / base^(2i/d)), PE[p, 2i+1] = cos(p / base^(2i/d)), added to the input; nothing learned."""

    def __init__(
        self,
        d_model: int,
        n_head: int,
        head_dim: int,
        block_size: int,
        base: Annotated[float, rule("> 0")] = 10000.0,
        scale: Annotated[float, rule("> 0")] = 0.02,
    ):
        super().__init__(d_model, n_head, head_dim, block_size)
        if d_model % 2:
            raise ConfigError(f"position=sinusoidal needs an even model.d_model (sin/cos pairs); got {d_model}")
        if base <= 1:
            raise ConfigError(f"position.base={base} must be > 1")
        if not scale > 0:
            raise ConfigError(f"position.scale={scale} must be > 0 (the table's amplitude; 1.0 = the raw ±1 table)")
        self.base = float(base)
        self.scale = float(scale)  # plain attributes, so the model fingerprint sees them

    def table(self, pos: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """(T,) or (B, T) positions -> (T, d_model) or (B, T, d_model) encodings, computed in fp32 then cast."""
        half = torch.arange(0, self.d_model, 2, device=pos.device, dtype=torch.float32)  # 2i
        inv_freq = torch.exp(-math.log(self.base) * half / self.d_model)  # base^(-2i/d), (d/2,)
        angles = pos.float()[..., None] * inv_freq  # (..., T, d/2)
        return (
            torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(-2).to(dtype)
        )  # (..., T, d): sin, cos interleaved

    def embed(self, x, pos):
        return x + self.scale * self.table(pos, x.dtype)  # (B, T, d) + scale · (T, d) or (B, T, d)

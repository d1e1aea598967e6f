"""ALiBi: no embeddings; each head adds -slope·distance to its attention scores."""

from __future__ import annotations

import math

import torch

from gptlab.model.base import Position


def alibi_slopes(n_head: int) -> torch.Tensor:
    """Geometric slopes 2^(-8i/n) for i = 1..n (interleaved for non-powers of two, as in the paper)."""

    def pow2(n):
        start = 2 ** (-8 / n)
        return [start ** (i + 1) for i in range(n)]

    if math.log2(n_head).is_integer():
        return torch.tensor(pow2(n_head))
    closest = 2 ** math.floor(math.log2(n_head))
    extra = pow2(2 * closest)[0::2][: n_head - closest]
    return torch.tensor(pow2(closest) + extra)


class AlibiPosition(Position):
    """Linear distance penalty per head on the attention scores."""

    has_score_bias = True

    def __init__(self, d_model: int, n_head: int, head_dim: int, block_size: int):
        super().__init__(d_model, n_head, head_dim, block_size)
        self.register_buffer("slopes", alibi_slopes(n_head), persistent=False)

    def score_bias(self, q_pos, k_pos):
        distance = (q_pos[..., :, None] - k_pos[..., None, :]).clamp(min=0).float()  # (Tq, Tk) or (B, Tq, Tk)
        return -self.slopes[:, None, None] * distance.unsqueeze(-3)  # (H, Tq, Tk) or (B, H, Tq, Tk)

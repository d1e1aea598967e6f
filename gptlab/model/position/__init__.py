"""Position choices. Each is a `Position`: it may add to the input, rotate q/k, or bias the scores."""

from __future__ import annotations

import torch
import torch.nn as nn


class Position(nn.Module):
    """Identity on all three hooks; a variant overrides the one it needs."""

    has_score_bias = False  # True when score_bias returns a tensor (attention then needs an explicit mask)

    def __init__(self, d_model: int, n_head: int, head_dim: int, block_size: int):
        super().__init__()
        self.block_size = block_size

    def embed(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Token embeddings (B, T, d) at absolute positions pos (T,) -> (B, T, d)."""
        return x

    def rotate(self, q: torch.Tensor, k: torch.Tensor, pos: torch.Tensor):
        """q (B, H, T, hd), k (B, Hkv, T, hd) at positions pos (T,) -> rotated q, k."""
        return q, k

    def score_bias(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor | None:
        """Additive attention-score bias (H, Tq, Tk), or None."""
        return None

    def init_weights(self, std: float) -> None:
        """Initialise learned parameters, if any."""

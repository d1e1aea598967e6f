"""Learned absolute position embeddings added to the token embeddings (GPT-2)."""

import torch.nn as nn

from gptlab.model.base import Position


class LearnedPosition(Position):
    """A (block_size, d_model) table added to the input."""

    def __init__(self, d_model: int, n_head: int, head_dim: int, block_size: int):
        super().__init__(d_model, n_head, head_dim, block_size)
        self.wpe = nn.Embedding(block_size, d_model)

    def init_weights(self, std: float) -> None:
        nn.init.normal_(self.wpe.weight, std=std)

    def embed(self, x, pos):
        return x + self.wpe(pos)  # (B, T, d) + (T, d) or (B, T, d)

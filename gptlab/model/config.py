"""Plain size/shape settings of a GPT (the `model` config group), free of Hydra."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GPTConfig:
    """Sizes shared by every block; component choices are passed to GPT separately."""

    n_layer: int = 4
    n_head: int = 4
    d_model: int = 128
    block_size: int = 256
    vocab_size: int = 50257
    tie_embeddings: bool = True
    bias: bool = False
    dropout: float = 0.0
    init_std: float = 0.02

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

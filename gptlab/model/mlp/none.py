"""No MLP (mlp=none): attention-only blocks, the block builds no second norm and adds nothing after attention."""

import torch

from gptlab.model.base import MLP


class NoMLP(MLP):
    """The empty feed-forward: no parameters, hidden width 0; GPT's Block skips it (and its norm) entirely."""

    empty = True

    def __init__(self, d_model: int, bias: bool = False):
        super().__init__(d_model, hidden=0, dropout=0.0)

    def init_weights(self, n_layer: int, std: float) -> None:
        """Nothing to initialise."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(x)  # (B, T, d): adds nothing; Block never calls it

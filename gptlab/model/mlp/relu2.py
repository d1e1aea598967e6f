"""The squared-ReLU MLP (Primer): d_model -> ratio·d_model -> relu(x)² -> d_model."""

from __future__ import annotations

import torch
import torch.nn as nn

from gptlab.model.mlp import check_ratio, init_mlp


class Relu2MLP(nn.Module):
    """Two matrices with relu(x)² between them."""

    def __init__(self, d_model: int, bias: bool = False, ratio: float = 4, dropout: float = 0.0):
        super().__init__()
        check_ratio(ratio)
        self.hidden = int(round(ratio * d_model))
        self.up = nn.Linear(d_model, self.hidden, bias=bias)
        self.down = nn.Linear(self.hidden, d_model, bias=bias)
        self.drop = nn.Dropout(dropout)

    def init_weights(self, n_layer: int, std: float) -> None:
        init_mlp([self.up], self.down, n_layer, std)

    def forward(self, x):
        return self.drop(self.down(torch.relu(self.up(x)).square()))

"""Feed-forward choices; each is a `gptlab.model.base.MLP`: (B, T, d_model) -> (B, T, d_model), exposing `hidden`."""

import math
from typing import Annotated

import torch.nn as nn

from gptlab.errors import ConfigError
from gptlab.model.base import MLP
from gptlab.util.checks import rule

# the keys every MLP choice takes, with their rules (gptlab/config/schema.py reads them off the signatures)
Ratio = Annotated[float, rule("> 0")]
Dropout = Annotated[float, rule("[0, 1)")]


def check_ratio(ratio: float) -> None:
    """mlp.ratio must be a positive number."""
    if not ratio > 0:
        raise ConfigError(f"mlp.ratio={ratio} must be > 0 (hidden width = ratio * model.d_model)")


def init_mlp(up: list[nn.Linear], down: nn.Linear, n_layer: int, std: float) -> None:
    """GPT-2 init for an MLP: input matrices N(0, std), the residual projection scaled by 1/√(2·n_layer)."""
    for lin in up:
        nn.init.normal_(lin.weight, std=std)
    nn.init.normal_(down.weight, std=std / math.sqrt(2 * n_layer))
    for lin in [*up, down]:
        if lin.bias is not None:
            nn.init.zeros_(lin.bias)


class TwoMatrixMLP(MLP):
    """d_model -> hidden (= ratio·d_model) -> activation -> d_model; subclasses define `activation`."""

    def __init__(self, d_model: int, bias: bool = False, ratio: Ratio = 4, dropout: Dropout = 0.0):
        check_ratio(ratio)
        super().__init__(d_model, int(round(ratio * d_model)), dropout)
        self.up = nn.Linear(d_model, self.hidden, bias=bias)
        self.down = nn.Linear(self.hidden, d_model, bias=bias)
        self.drop = nn.Dropout(dropout)

    def activation(self, h):
        raise NotImplementedError

    def init_weights(self, n_layer: int, std: float) -> None:
        init_mlp([self.up], self.down, n_layer, std)

    def residual_projections(self) -> list[nn.Linear]:
        return [self.down]

    def forward(self, x):
        return self.drop(self.down(self.activation(self.up(x))))  # (B, T, d) -> (B, T, hidden) -> (B, T, d)

"""Feed-forward choices; each maps (B, T, d_model) -> (B, T, d_model) and exposes `hidden`."""

import math

import torch.nn as nn

from gptlab.errors import ConfigError


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

"""LayerNorm with an optional bias (torch's nn.LayerNorm)."""

import torch.nn as nn


def layernorm(dim: int, bias: bool = True, eps: float = 1e-5) -> nn.LayerNorm:
    """nn.LayerNorm over the last dimension."""
    return nn.LayerNorm(dim, eps=eps, bias=bias)

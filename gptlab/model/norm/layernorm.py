"""LayerNorm with an optional bias: (x - mean) / √(var + eps) · weight (+ bias) over the last dimension."""

from typing import Annotated

import torch
import torch.nn as nn
import torch.nn.functional as F

from gptlab.model.base import Norm
from gptlab.util.checks import rule


class LayerNorm(Norm):
    """Centred, scaled normalisation with a gain and an optional bias (torch's layer_norm kernel)."""

    def __init__(self, dim: int, eps: float = 1e-5, bias: bool = True):
        super().__init__(dim, eps, centered=True)
        self.weight = nn.Parameter(torch.ones(dim))
        self.register_parameter("bias", nn.Parameter(torch.zeros(dim)) if bias else None)

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)  # type: ignore[arg-type]  # registered via register_parameter: typed Tensor | Module

    def forward(self, x):
        return F.layer_norm(x, (self.dim,), self.weight, self.bias, self.eps)


def layernorm(dim: int, bias: bool = True, eps: Annotated[float, rule("> 0")] = 1e-5) -> LayerNorm:
    """The norm factory conf/norm/layernorm.yaml names."""
    return LayerNorm(dim, eps=eps, bias=bias)

"""RMSNorm: x / √(mean(x²) + eps) · weight over the last dimension; no mean subtraction, no bias."""

from typing import Annotated

import torch
import torch.nn as nn
import torch.nn.functional as F

from gptlab.model.base import Norm
from gptlab.util.checks import rule


class RMSNorm(Norm):
    """Scale-only normalisation with a gain (torch's rms_norm kernel)."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__(dim, eps, centered=False)
        self.weight = nn.Parameter(torch.ones(dim))

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)

    def forward(self, x):
        return F.rms_norm(x, (self.dim,), self.weight, self.eps)


def rmsnorm(dim: int, eps: Annotated[float, rule("> 0")] = 1e-6) -> RMSNorm:
    """The norm factory conf/norm/rmsnorm.yaml names."""
    return RMSNorm(dim, eps=eps)

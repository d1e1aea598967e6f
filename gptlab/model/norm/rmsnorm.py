"""RMSNorm (torch's nn.RMSNorm): scale only, no mean subtraction, no bias."""

import torch.nn as nn


def rmsnorm(dim: int, eps: float = 1e-6) -> nn.RMSNorm:
    """nn.RMSNorm over the last dimension."""
    return nn.RMSNorm(dim, eps=eps)

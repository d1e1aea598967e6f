"""SGD with (Nesterov) momentum and weight decay on matrices only."""

from __future__ import annotations

import torch

from gptlab.optim import param_groups


def sgd(
    model, lr: float = 0.1, momentum: float = 0.9, nesterov: bool = True, weight_decay: float = 0.0
) -> torch.optim.SGD:
    """torch.optim.SGD over decay/no-decay groups."""
    return torch.optim.SGD(param_groups(model, weight_decay), lr=lr, momentum=momentum, nesterov=nesterov)

"""SGD with (Nesterov) momentum and weight decay on matrices only."""

from __future__ import annotations

import torch

from gptlab.model import parametrization
from gptlab.optim import LR, Momentum, WeightDecay, param_groups


def sgd(
    model, lr: LR = 0.1, momentum: Momentum = 0.9, nesterov: bool = True, weight_decay: WeightDecay = 0.0
) -> torch.optim.SGD:
    """torch.optim.SGD over decay/no-decay groups; refused under model.parametrization=mup (muP's SGD lr rule differs
    per role from Adam's and is not implemented)."""
    parametrization.refuse(model, "sgd")
    return torch.optim.SGD(param_groups(model, weight_decay), lr=lr, momentum=momentum, nesterov=nesterov)

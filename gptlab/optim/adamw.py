"""AdamW with decoupled weight decay on matrices only; fused/foreach kernels where torch has them."""

from __future__ import annotations

from typing import Annotated

import torch

from gptlab.optim import LR, Betas, WeightDecay, param_groups
from gptlab.util.checks import rule


def adamw(
    model,
    lr: LR = 1e-3,
    betas: Betas = (0.9, 0.95),
    weight_decay: WeightDecay = 0.1,
    eps: Annotated[float, rule("> 0")] = 1e-8,
    fused: bool | None = None,
) -> torch.optim.AdamW:
    """torch.optim.AdamW; fused=None lets torch pick fused (CUDA/CPU) when every parameter supports it."""
    device = next(model.parameters()).device.type
    if fused is None:
        fused = device in ("cuda", "cpu")
    return torch.optim.AdamW(param_groups(model, weight_decay), lr=lr, betas=tuple(betas), eps=eps, fused=fused)

"""AdamW with decoupled weight decay on matrices only; fused/foreach kernels where torch has them."""

from __future__ import annotations

from typing import Annotated

import torch

from gptlab.errors import ConfigError
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
    """torch.optim.AdamW; fused=None lets torch pick fused (CUDA/CPU) when every parameter supports it. On the meta
    device (a cost estimate counting optimizer state) there is no kernel to pick: fused is ignored there; where
    torch refuses fused=true for these parameters, one ConfigError line says so."""
    device = next(model.parameters()).device.type
    if fused is None or device == "meta":
        fused = device in ("cuda", "cpu")
    try:
        return torch.optim.AdamW(param_groups(model, weight_decay, lr), lr=lr, betas=tuple(betas), eps=eps, fused=fused)
    except RuntimeError as err:  # torch's check of the parameters' devices and dtypes for the fused kernel
        if not fused:
            raise
        raise ConfigError(
            f"optimizer.fused=true: torch has no fused AdamW for these parameters ({' '.join(str(err).split())[:200]}); "
            "allowed: null (torch picks) or false"
        ) from None

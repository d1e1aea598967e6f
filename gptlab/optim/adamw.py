"""AdamW with decoupled weight decay on matrices only; fused/foreach kernels where torch has them."""

from __future__ import annotations

import torch

from gptlab.optim import param_groups


def adamw(
    model, lr: float = 1e-3, betas=(0.9, 0.95), weight_decay: float = 0.1, eps: float = 1e-8, fused: bool | None = None
) -> torch.optim.AdamW:
    """torch.optim.AdamW; fused=None lets torch pick fused (CUDA/CPU) when every parameter supports it."""
    device = next(model.parameters()).device.type
    if fused is None:
        fused = device in ("cuda", "cpu")
    return torch.optim.AdamW(param_groups(model, weight_decay), lr=lr, betas=tuple(betas), eps=eps, fused=fused)

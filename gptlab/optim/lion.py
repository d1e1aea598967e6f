"""Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms"): sign of an interpolated momentum."""

from __future__ import annotations

import torch

from gptlab.optim import param_groups


class Lion(torch.optim.Optimizer):
    """update = sign(β1·m + (1-β1)·g); m <- β2·m + (1-β2)·g; decoupled weight decay."""

    def __init__(self, params, lr: float = 1e-4, betas=(0.9, 0.99), weight_decay: float = 0.0):
        super().__init__(params, dict(lr=lr, betas=tuple(betas), weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "exp_avg" not in state:
                    state["exp_avg"] = torch.zeros_like(p)
                m = state["exp_avg"]
                p.mul_(1 - group["lr"] * group["weight_decay"])
                p.add_(torch.sign(m.lerp(p.grad, 1 - beta1)), alpha=-group["lr"])
                m.lerp_(p.grad, 1 - beta2)
        return loss


def lion(model, lr: float = 3e-4, betas=(0.9, 0.99), weight_decay: float = 0.1) -> Lion:
    """Lion over decay/no-decay groups (use ~3-10x smaller lr than AdamW)."""
    return Lion(param_groups(model, weight_decay), lr=lr, betas=betas)

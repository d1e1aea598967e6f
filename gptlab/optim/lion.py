"""Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms"): sign of an interpolated momentum."""

from __future__ import annotations

import torch

from gptlab.optim import LR, Betas, WeightDecay, param_groups


class Lion(torch.optim.Optimizer):
    """update = sign(β1·m + (1-β1)·g); m <- β2·m + (1-β2)·g; decoupled weight decay."""

    def __init__(self, params, lr: float = 1e-4, betas=(0.9, 0.99), weight_decay: float = 0.0):
        super().__init__(params, dict(lr=lr, betas=tuple(betas), weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if params:
                self._update(params, group)
        return loss

    def _update(self, params: list, group: dict) -> None:
        """One group's update as a few multi-tensor (foreach) kernels instead of a Python loop per parameter."""
        beta1, beta2 = group["betas"]
        grads = [p.grad for p in params]
        for p in params:
            if "exp_avg" not in self.state[p]:
                self.state[p]["exp_avg"] = torch.zeros_like(p)
        moms = [self.state[p]["exp_avg"] for p in params]
        torch._foreach_mul_(params, 1 - group["lr"] * group["weight_decay"])
        updates = torch._foreach_lerp(moms, grads, 1 - beta1)  # β1·m + (1-β1)·g
        torch._foreach_sign_(updates)
        torch._foreach_add_(params, updates, alpha=-group["lr"])
        torch._foreach_lerp_(moms, grads, 1 - beta2)


def lion(model, lr: LR = 3e-4, betas: Betas = (0.9, 0.99), weight_decay: WeightDecay = 0.1) -> Lion:
    """Lion over decay/no-decay groups (use ~3-10x smaller lr than AdamW); muP scales its lr as Adam's (sign updates:
    entry-wise normalised, like Adam's)."""
    return Lion(param_groups(model, weight_decay, lr), lr=lr, betas=betas)

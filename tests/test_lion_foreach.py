"""Lion's multi-tensor (foreach) update equals the per-parameter loop it replaced, bit for bit (issue 12, item 15)."""

from __future__ import annotations

import copy

import torch

from gptlab.optim.lion import Lion, lion
from helpers.model import tiny_model, tokens


class LoopLion(torch.optim.Optimizer):
    """The reference: Lion as it was, one Python iteration per parameter."""

    def __init__(self, params, lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0):
        super().__init__(params, dict(lr=lr, betas=tuple(betas), weight_decay=weight_decay))

    @torch.no_grad()
    def step(self):
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


def _train(model, optimizer, steps=4):
    for step in range(steps):
        idx = tokens(B=2, T=16, seed=step)
        _, loss = model(idx[:, :-1], idx[:, 1:])
        loss.backward()
        if step == 1:
            model.lm_head.weight.grad = None  # a parameter without a gradient this step is left alone
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def test_foreach_lion_equals_the_loop_exactly():
    a = tiny_model("position=rope").train()
    b = copy.deepcopy(a)
    fast = lion(a, lr=3e-3, betas=(0.9, 0.99), weight_decay=0.1)  # decay and no-decay groups
    params_b = dict(b.named_parameters())
    ref = LoopLion(
        [{"params": [params_b[n] for n in _names(a, g)], "weight_decay": g["weight_decay"]} for g in fast.param_groups],
        lr=3e-3,
        betas=(0.9, 0.99),
    )
    assert isinstance(fast, Lion) and {g["weight_decay"] for g in fast.param_groups} == {0.0, 0.1}
    _train(a, fast)
    _train(b, ref)
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(pa, pb), name
        assert torch.equal(fast.state[pa]["exp_avg"], ref.state[pb]["exp_avg"]), name


def _names(model, group) -> list[str]:
    ids = {id(p): n for n, p in model.named_parameters()}
    return [ids[id(p)] for p in group["params"]]

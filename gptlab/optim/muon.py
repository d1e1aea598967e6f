"""Muon (torch.optim.Muon) for 2-D hidden weight matrices, AdamW for embeddings, head, norms and biases."""

from __future__ import annotations

import torch
import torch.nn as nn

from gptlab.model import parametrization
from gptlab.optim import LR, Betas, Momentum, WeightDecay


class OptimizerSet(torch.optim.Optimizer):
    """Several optimizers stepped together; exposes their param_groups so one LR schedule drives all."""

    def __init__(self, optimizers: list[torch.optim.Optimizer]):
        self.optimizers = optimizers
        self.defaults = {}
        self.state = {}  # type: ignore[assignment]  # per-optimizer state lives in the members

    @property
    def param_groups(self) -> list[dict]:  # type: ignore[override]  # torch types it as a plain attribute
        """The members' live group dicts (load_state_dict replaces them, so never cache this list)."""
        return [g for opt in self.optimizers for g in opt.param_groups]

    def step(self, closure=None):
        for opt in self.optimizers:
            opt.step()

    def zero_grad(self, set_to_none: bool = True):
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=set_to_none)

    def state_dict(self):
        return {"members": [opt.state_dict() for opt in self.optimizers]}

    def load_state_dict(self, state):
        for opt, sd in zip(self.optimizers, state["members"]):
            opt.load_state_dict(sd)


def _hidden_matrices(model: nn.Module) -> set[int]:
    """ids of 2-D weights inside the transformer blocks (not embeddings or the LM head)."""
    embeds = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    head = getattr(model, "lm_head", None)
    if head is not None:
        embeds.add(id(head.weight))
    return {id(p) for p in model.parameters() if p.dim() == 2 and id(p) not in embeds}


def muon(
    model,
    lr: LR = 0.02,
    momentum: Momentum = 0.95,
    weight_decay: WeightDecay = 0.0,
    adamw_lr: LR = 1e-3,
    adamw_betas: Betas = (0.9, 0.95),
    adamw_weight_decay: WeightDecay = 0.1,
) -> OptimizerSet:
    """Muon on hidden matrices (torch's default shape scaling of lr), AdamW on the rest; refused under
    model.parametrization=mup (Muon's orthogonalised updates carry their own width scaling)."""
    parametrization.refuse(model, "muon")
    hidden = _hidden_matrices(model)
    mats = [p for p in model.parameters() if id(p) in hidden]
    rest = [p for p in model.parameters() if id(p) not in hidden]
    muon_opt = torch.optim.Muon(mats, lr=lr, momentum=momentum, weight_decay=weight_decay)
    decay = [p for p in rest if p.dim() >= 2]
    no_decay = [p for p in rest if p.dim() < 2]
    adam = torch.optim.AdamW(
        [{"params": decay, "weight_decay": adamw_weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=adamw_lr,
        betas=tuple(adamw_betas),
    )
    return OptimizerSet([muon_opt, adam])

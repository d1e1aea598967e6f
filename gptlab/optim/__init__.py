"""Optimizer and LR-schedule choices. An optimizer YAML names a factory `f(model) -> Optimizer`."""

from __future__ import annotations

from typing import Annotated, Any

import torch.nn as nn

from gptlab.model import parametrization
from gptlab.util.checks import Number, Seq, rule

# the keys the optimizer choices share, with their rules (gptlab/config/schema.py reads them off the signatures)
LR = Annotated[float, rule("> 0")]
Betas = Annotated[Any, rule(check=Seq(Number("[0, 1)"), length=2))]  # two: a list from the config, a tuple from Python
WeightDecay = Annotated[float, rule(">= 0")]  # and lr * weight_decay < 1: gptlab/config/validate.py
Momentum = Annotated[float, rule("[0, 1)")]


def split_decay(model: nn.Module) -> tuple[list, list]:
    """Parameters with >= 2 dims (matrices, embeddings) get weight decay; biases and norm gains don't."""
    decay, no_decay = [], []  # type: list, list
    for p in model.parameters():
        if p.requires_grad:
            (decay if p.dim() >= 2 else no_decay).append(p)
    return decay, no_decay


def param_groups(model: nn.Module, weight_decay: float, lr: float | None = None) -> list[dict]:
    """Two AdamW-style groups: decayed matrices and undecayed vectors. Under model.parametrization=mup the hidden
    matrices get their own group with muP's lr and decay multipliers (gptlab/model/parametrization.py lr_groups:
    every group then carries its `lr` and `lr_mult`, so an Adam-like optimizer passes `lr` here)."""
    decay, no_decay = split_decay(model)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return parametrization.lr_groups(model, groups, lr)

"""Optimizer and LR-schedule choices. An optimizer YAML names a factory `f(model) -> Optimizer`."""

from __future__ import annotations

import torch.nn as nn


def split_decay(model: nn.Module) -> tuple[list, list]:
    """Parameters with >= 2 dims (matrices, embeddings) get weight decay; biases and norm gains don't."""
    decay, no_decay = [], []  # type: list, list
    for p in model.parameters():
        if p.requires_grad:
            (decay if p.dim() >= 2 else no_decay).append(p)
    return decay, no_decay


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two AdamW-style groups: decayed matrices and undecayed vectors."""
    decay, no_decay = split_decay(model)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]

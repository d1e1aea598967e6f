"""A copy of a model's weights, optimizer state and RNG states on the CPU, and putting it back: what lets
profile=true take real training steps and leave the run's curve unchanged (gptlab/train/profile/steps.py)."""

from __future__ import annotations

import torch
import torch.nn as nn


def to_cpu(value):
    """A copy of value with every tensor moved (copied) to the CPU; dicts, lists and tuples recursed."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: to_cpu(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(to_cpu(v) for v in value)
    return value


def snapshot_state(model: nn.Module, optimizer) -> dict:
    """Weights, optimizer state and RNG states, copied to the CPU.

    A copy kept on the GPU would hold another model + optimizer state (~19 GB for gpt2-xl) through the whole
    run and show up in every later peak-memory figure. The CUDA RNG is saved too: dropout on the GPU draws from it.
    """
    saved = {
        "model": to_cpu(model.state_dict()),
        "optimizer": to_cpu(optimizer.state_dict()),
        "cpu_rng": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        saved["cuda_rng"] = torch.cuda.get_rng_state_all()
    return saved


def restore_state(model: nn.Module, optimizer, saved: dict) -> None:
    """Put back what snapshot_state() saved (load_state_dict copies into the tensors on their own devices)."""
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    torch.set_rng_state(saved["cpu_rng"])
    if "cuda_rng" in saved:
        torch.cuda.set_rng_state_all(saved["cuda_rng"])

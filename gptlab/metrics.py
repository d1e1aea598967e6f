"""Measurements the loop reports: peak memory, medians, and model FLOP utilisation."""

from __future__ import annotations

import resource
import statistics

import torch


def peak_memory_bytes(device: str) -> int:
    """Peak allocated bytes on a GPU; on CPU the process's peak resident set size."""
    if device.startswith("cuda"):
        return int(torch.cuda.max_memory_allocated())
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux reports KiB


def median(values: list[float]) -> float | None:
    return float(statistics.median(values)) if values else None


def mfu(flops_per_token: float, tokens_per_s: float, peak_flops: float | None) -> float | None:
    """Model FLOP utilisation: useful training FLOP/s over the hardware peak."""
    if not peak_flops:
        return None
    return flops_per_token * tokens_per_s / peak_flops

"""Measured FLOPs via torch's FlopCounterMode, with the CPU SDPA kernel that torch leaves uncounted."""

from __future__ import annotations

from collections.abc import Callable

import torch

# isort: off
from torch.utils.flop_counter import (
    FlopCounterMode,
    flop_registry,
    register_flop_formula,
    sdpa_backward_flop_count,
    sdpa_flop_count,
)
# isort: on

_registered = False


def _heads_of(query: tuple, kv: tuple) -> tuple:
    """A K/V shape (B, Hkv, Tk, hd) with the query's head count: GQA's (enable_gqa) scores and outputs cost what
    MHA's do, and torch 2.9's formulas assert equal head counts."""
    return (kv[0], query[1], *kv[2:])


def register_cpu_sdpa_flops() -> None:
    """Count torch's CPU flash SDPA ops like the CUDA ones (dense Tq×Tk; backward recomputes scores).

    FlopCounterMode has formulas for the CUDA SDPA backends only; on CPU, SDPA runs
    `_scaled_dot_product_flash_attention_for_cpu`, which it would count as 0 FLOPs. Idempotent.
    """
    global _registered
    if _registered:
        return
    aten = torch.ops.aten
    fwd = getattr(aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    bwd = getattr(aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)
    if fwd is not None and fwd not in flop_registry:  # a newer torch may count them already

        @register_flop_formula(fwd)
        def _cpu_sdpa(query, key, value, *args, out_shape=None, **kwargs) -> int:
            return sdpa_flop_count(query, _heads_of(query, key), _heads_of(query, value))

    if bwd is not None and bwd not in flop_registry:

        @register_flop_formula(bwd)
        def _cpu_sdpa_bwd(grad_out, query, key, value, *args, out_shape=None, **kwargs) -> int:
            return sdpa_backward_flop_count(grad_out, query, _heads_of(query, key), _heads_of(query, value))

    _registered = True


def count_flops(fn: Callable[[], object]) -> tuple[int, dict[str, int]]:
    """Run fn() under FlopCounterMode; (total FLOPs, FLOPs per aten op name)."""
    register_cpu_sdpa_flops()
    counter = FlopCounterMode(display=False)
    with counter:
        fn()
    per_op = {str(op): int(n) for op, n in counter.get_flop_counts().get("Global", {}).items()}
    return int(counter.get_total_flops()), per_op

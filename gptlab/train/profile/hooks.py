"""The module hooks behind gptlab/train/profile/steps.py: which modules of a GPT are timed and under which kind
(`module_kinds`, `layer_of`), the `Timer` that turns nested forward/backward frames into exclusive seconds per
kind and per layer (each frame also a record_function region in the trace), and `hook_modules`, which puts the
forward and backward hooks on a model and returns their handles for removal."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn

from gptlab.costs.ops import GROUPS


def module_kinds(model: Any) -> list[tuple[str, nn.Module, str]]:
    """(name, module, kind) for every hooked module; parents are timed exclusive of hooked children."""
    out = [("model", model, "other"), ("wte", model.wte, "embedding")]
    out += [(f"position.{n}", m, "embedding") for n, m in model.position.named_modules() if isinstance(m, nn.Embedding)]
    for i, b in enumerate(model.blocks):
        out.append((f"blocks.{i}", b, "other"))  # residual adds and dropout
        out += [(f"blocks.{i}.{n}", getattr(b, n), "norms") for n in ("norm1", "norm2") if getattr(b, n) is not None]
        out.append((f"blocks.{i}.attn", b.attn, "attention kernel"))  # minus its projections below
        out += [
            (f"blocks.{i}.attn.{n}", m, "attention projections")
            for n, m in b.attn.named_modules()
            if isinstance(m, nn.Linear)
        ]
        out.append((f"blocks.{i}.mlp", b.mlp, "mlp"))  # mlp=none: hooked, measures ~0
    return out + [("norm_f", model.norm_f, "norms"), ("lm_head", model.lm_head, "lm_head")]


def layer_of(name: str) -> int | None:
    """The block index of a hooked module's name ('blocks.3.attn' -> 3), None outside the blocks."""
    parts = name.split(".")
    return int(parts[1]) if len(parts) > 1 and parts[0] == "blocks" else None


class Timer:
    """A stack of open module frames; on close, the frame's time minus its children's goes to its kind (and layer)."""

    def __init__(self, sync: Callable[[], None], n_layer: int = 0):
        self.sync, self.seconds = sync, dict.fromkeys(GROUPS, 0.0)
        self.stack: list = []
        self.layers = [dict.fromkeys(GROUPS, 0.0) for _ in range(n_layer)]

    def open(self, kind: str, label: str, layer: int | None = None) -> None:
        self.sync()
        region = torch.profiler.record_function(label)
        region.__enter__()
        self.stack.append([kind, time.perf_counter(), 0.0, region, layer])

    def close(self) -> None:
        self.sync()
        now = time.perf_counter()
        kind, start, children, region, layer = self.stack.pop()
        region.__exit__(None, None, None)
        self.seconds[kind] += (now - start) - children
        if layer is not None:
            self.layers[layer][kind] += (now - start) - children
        if self.stack:
            self.stack[-1][2] += now - start

    def close_all(self) -> None:
        while self.stack:
            self.close()


def hook_modules(model: nn.Module, timer: Timer) -> list:
    """Forward and backward hooks on every module of module_kinds (the root only forward: it returns a tuple)."""
    handles = []
    for name, module, kind in module_kinds(model):
        layer = layer_of(name)
        handles.append(
            module.register_forward_pre_hook(lambda m, a, k=kind, n=name, i=layer: timer.open(k, f"{k}:{n}", i))
        )
        handles.append(module.register_forward_hook(lambda m, a, o: timer.close()))
        if module is model:
            continue
        handles.append(
            module.register_full_backward_pre_hook(
                lambda m, g, k=kind, n=name, i=layer: timer.open(k, f"{k}:{n}.backward", i)  # type: ignore[misc]
            )
        )  # (the ignore: torch's hook typing cannot infer a lambda with default arguments)
        handles.append(module.register_full_backward_hook(lambda m, gi, go: timer.close()))
    return handles

"""Grouped-query causal self-attention: n_head query heads share n_kv_head key/value heads."""

from __future__ import annotations

import math
from typing import Annotated

import torch
import torch.nn as nn

from gptlab.errors import ConfigError
from gptlab.model.attention.kernels import IMPLS
from gptlab.model.base import WINDOW, Attention, KVCache, Position
from gptlab.util.checks import Number, OneOf, Seq, rule

__all__ = ["GroupedQueryAttention", "KVCache", "layer_window"]


def layer_window(layer_idx: int, window, global_every, global_layers) -> int | None:
    """The window this layer uses: None (full causal) for global layers, else `window`."""
    if window is None:
        return None
    if global_layers is not None and layer_idx in set(global_layers):
        return None
    if global_every is not None and (layer_idx + 1) % global_every == 0:
        return None
    return int(window)


class GroupedQueryAttention(Attention):
    """Causal attention with n_kv_head K/V heads, an optional sliding window and an optional QK-norm."""

    # model.parametrization=mup sets 1/√head_dim (gptlab/model/parametrization.py): q scaled by it before the kernel's
    # own 1/√head_dim makes the scores q·k/head_dim; None (sp) multiplies nothing
    mup_q_scale: float | None = None

    def __init__(
        self,
        d_model: int,
        n_head: int,
        block_size: int,
        layer_idx: int,
        norm,
        n_kv_head: Annotated[int | None, rule(">= 1")] = None,
        impl: Annotated[str, rule(check=OneOf(IMPLS))] = "sdpa",
        window: Annotated[int | None, rule(check=WINDOW)] = None,
        global_every: Annotated[int | None, rule(">= 1")] = None,
        global_layers: Annotated[list[int] | None, rule(check=Seq(Number(">= 0", int), null=True))] = None,
        qk_norm: bool = False,
        dropout: Annotated[float, rule("[0, 1)")] = 0.0,
        bias: bool = False,
    ):
        if global_every is not None and global_every < 1:
            raise ConfigError(f"attention.global_every={global_every} must be >= 1 (or null)")
        WINDOW("attention.window", window)  # the key as given: every layer may be global (the base sees None)
        super().__init__(
            d_model,
            n_head,
            block_size,
            layer_idx,
            n_kv_head=n_kv_head,
            impl=impl,
            dropout=dropout,
            window=layer_window(layer_idx, window, global_every, global_layers),
        )
        self.qkv = nn.Linear(d_model, (self.n_head + 2 * self.n_kv_head) * self.head_dim, bias=bias)
        self.proj = nn.Linear(self.n_head * self.head_dim, d_model, bias=bias)
        self.q_norm = norm(self.head_dim) if qk_norm else None
        self.k_norm = norm(self.head_dim) if qk_norm else None

    @classmethod
    def layer_key(cls, layer_idx: int, window=None, global_every=None, global_layers=None, **_) -> int | None:
        """Layers differ only in their window (global or windowed)."""
        return layer_window(layer_idx, window, global_every, global_layers)

    def init_weights(self, n_layer: int, std: float) -> None:
        """GPT-2 init; the residual projection is scaled by 1/√(2·n_layer)."""
        nn.init.normal_(self.qkv.weight, std=std)
        nn.init.normal_(self.proj.weight, std=std / math.sqrt(2 * n_layer))
        for lin in (self.qkv, self.proj):
            if lin.bias is not None:
                nn.init.zeros_(lin.bias)

    def residual_projections(self) -> list[nn.Linear]:
        return [self.proj]

    def forward(self, x: torch.Tensor, position: Position, cache: KVCache | None = None) -> torch.Tensor:
        B, T, _ = x.shape
        hd, H, Hkv = self.head_dim, self.n_head, self.n_kv_head
        q, k, v = self.qkv(x).split([H * hd, Hkv * hd, Hkv * hd], dim=-1)
        q = q.view(B, T, H, hd).transpose(1, 2)  # (B, H, T, hd)
        k = k.view(B, T, Hkv, hd).transpose(1, 2)  # (B, Hkv, T, hd)
        v = v.view(B, T, Hkv, hd).transpose(1, 2)
        if self.q_norm is not None:
            assert self.k_norm is not None  # q_norm and k_norm are made together (qk_norm)
            q, k = self.q_norm(q), self.k_norm(k)
        if self.mup_q_scale is not None:
            q = q * self.mup_q_scale
        y = self.attend(q, k, v, position, cache)  # (B, H, T, hd)
        return self.proj(y.transpose(1, 2).reshape(B, T, H * hd))  # (B, T, H·hd) -> (B, T, d)

"""Grouped-query causal self-attention: n_head query heads share n_kv_head key/value heads."""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from gptlab.errors import ConfigError
from gptlab.model.attention.kernels import KERNELS, check_impl_name, prepare_flex


class KVCache:
    """Per-layer key/value cache for generation: grows along T, (B, n_kv_head, T, head_dim)."""

    def __init__(self) -> None:
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return 0 if self.k is None else self.k.size(2)

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.k = k if self.k is None else torch.cat([self.k, k], dim=2)
        self.v = v if self.v is None else torch.cat([self.v, v], dim=2)
        return self.k, self.v


def layer_window(layer_idx: int, window, global_every, global_layers) -> int | None:
    """The window this layer uses: None (full causal) for global layers, else `window`."""
    if window is None:
        return None
    if global_layers is not None and layer_idx in set(global_layers):
        return None
    if global_every is not None and (layer_idx + 1) % global_every == 0:
        return None
    return int(window)


def check_attention(d_model, n_head, n_kv_head, window, global_every, dropout) -> None:
    """One-line ConfigErrors for impossible head/window settings."""
    if d_model % n_head:
        raise ConfigError(f"model.d_model={d_model} is not divisible by model.n_head={n_head}; pick n_head dividing d_model")
    if n_kv_head is not None and (n_kv_head < 1 or n_head % n_kv_head):
        raise ConfigError(f"attention.n_kv_head={n_kv_head} must be >= 1 and divide model.n_head={n_head}")
    if window is not None and window < 1:
        raise ConfigError(f"attention.window={window} must be >= 1 (or null for full causal attention)")
    if global_every is not None and global_every < 1:
        raise ConfigError(f"attention.global_every={global_every} must be >= 1 (or null)")
    if not 0.0 <= dropout < 1.0:
        raise ConfigError(f"attention.dropout={dropout} must be in [0, 1)")


class GroupedQueryAttention(nn.Module):
    """Causal attention with n_kv_head K/V heads, an optional sliding window and an optional QK-norm."""

    def __init__(self, d_model: int, n_head: int, block_size: int, layer_idx: int, norm,
                 n_kv_head: int | None = None, impl: str = "sdpa", window: int | None = None,
                 global_every: int | None = None, global_layers: list[int] | None = None,
                 qk_norm: bool = False, dropout: float = 0.0, bias: bool = False):
        super().__init__()
        check_attention(d_model, n_head, n_kv_head, window, global_every, dropout)
        self.n_head = n_head
        self.n_kv_head = n_head if n_kv_head is None else n_kv_head
        self.head_dim = d_model // n_head
        self.window = layer_window(layer_idx, window, global_every, global_layers)
        self.impl = impl
        self.dropout = dropout
        self.layer_idx = layer_idx
        self.kernel = KERNELS[check_impl_name(impl)]
        if impl == "flex":  # the training-shape block mask, built here rather than inside a (compiled) forward
            prepare_flex(block_size, self.window, torch.empty(0).device)
        self.uses_score_bias = False  # set by GPT when the position choice adds a score bias
        self.qkv = nn.Linear(d_model, (self.n_head + 2 * self.n_kv_head) * self.head_dim, bias=bias)
        self.proj = nn.Linear(self.n_head * self.head_dim, d_model, bias=bias)
        self.q_norm = norm(self.head_dim) if qk_norm else None
        self.k_norm = norm(self.head_dim) if qk_norm else None

    def init_weights(self, n_layer: int, std: float) -> None:
        """GPT-2 init; the residual projection is scaled by 1/√(2·n_layer)."""
        nn.init.normal_(self.qkv.weight, std=std)
        nn.init.normal_(self.proj.weight, std=std / math.sqrt(2 * n_layer))
        for lin in (self.qkv, self.proj):
            if lin.bias is not None:
                nn.init.zeros_(lin.bias)

    def forward(self, x: torch.Tensor, position, cache: KVCache | None = None) -> torch.Tensor:
        B, T, _ = x.shape
        hd, H, Hkv = self.head_dim, self.n_head, self.n_kv_head
        q, k, v = self.qkv(x).split([H * hd, Hkv * hd, Hkv * hd], dim=-1)
        q = q.view(B, T, H, hd).transpose(1, 2)  # (B, H, T, hd)
        k = k.view(B, T, Hkv, hd).transpose(1, 2)  # (B, Hkv, T, hd)
        v = v.view(B, T, Hkv, hd).transpose(1, 2)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        offset = 0 if cache is None else cache.length
        pos = torch.arange(offset, offset + T, device=x.device)
        q, k = position.rotate(q, k, pos)
        if cache is not None:
            k, v = cache.append(k, v)  # (B, Hkv, offset + T, hd)
        k_pos = torch.arange(k.size(2), device=x.device)
        bias = position.score_bias(pos, k_pos)  # (H, T, Tk) or None
        dropout_p = self.dropout if self.training else 0.0
        y = self.kernel(q, k, v, window=self.window, q_offset=offset, bias=bias, dropout_p=dropout_p)
        y = y.transpose(1, 2).reshape(B, T, H * hd)  # (B, T, H·hd)
        return self.proj(y)

"""An attention variant written only from docs/VARIANTS.md's "Adding a variant" contract (used by test_contracts.py).

Plain multi-head attention with separate q/k/v projections, so it shares no code with the shipped
GroupedQueryAttention beyond what the contract offers (the `Attention` base and its `attend`).
"""

from __future__ import annotations

import math

import torch.nn as nn

from gptlab.model.base import Attention


class ReadmeAttention(Attention):
    """Multi-head causal attention: q, k, v and an output projection."""

    def __init__(self, d_model, n_head, block_size, layer_idx, norm, *, bias=False, impl="sdpa", dropout=0.0):
        super().__init__(d_model, n_head, block_size, layer_idx, impl=impl, dropout=dropout)
        self.q = nn.Linear(d_model, d_model, bias=bias)
        self.k = nn.Linear(d_model, d_model, bias=bias)
        self.v = nn.Linear(d_model, d_model, bias=bias)
        self.out = nn.Linear(d_model, d_model, bias=bias)

    def init_weights(self, n_layer, std):
        for lin in (self.q, self.k, self.v):
            nn.init.normal_(lin.weight, std=std)
        nn.init.normal_(self.out.weight, std=std / math.sqrt(2 * n_layer))

    def forward(self, x, position, cache=None):
        B, T, _ = x.shape
        q, k, v = (lin(x).view(B, T, self.n_head, self.head_dim).transpose(1, 2) for lin in (self.q, self.k, self.v))
        y = self.attend(q, k, v, position, cache)  # (B, n_head, T, head_dim)
        return self.out(y.transpose(1, 2).reshape(B, T, self.n_head * self.head_dim))

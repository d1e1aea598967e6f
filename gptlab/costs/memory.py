"""Memory estimates: saved activations for backward (naive vs fused attention, checkpointing), KV cache."""

from __future__ import annotations

import torch

from gptlab.costs.scores import dense_pairs
from gptlab.costs.structure import BlockShape, ModelShape


def _layer_elements_per_token(b: BlockShape, rotates: bool) -> int:
    """Activation elements one block saves per token, excluding the score matrix."""
    a, m = b.attn, b.mlp
    qkv = (a.n_head + 2 * a.n_kv_head) * a.head_dim
    n = sum(norm.dim for norm in b.norms)  # norm inputs
    n += sum(lin.d_in for lin in a.linears) + qkv + a.n_head * a.head_dim  # linear inputs, q/k/v, attn out
    qk = (a.n_head + a.n_kv_head) * a.head_dim
    n += qk * int(rotates) + qk * int(a.qk_norm is not None)  # pre-rotation / pre-norm q and k
    n += sum(lin.d_in for lin in m.linears) + m.act_inputs  # linear inputs and pre-activation values
    return n


def _layer_bytes(b: BlockShape, rotates: bool, batch: int, seq: int, s: int, materialized: bool) -> float:
    """Bytes one block saves for a (batch, seq) micro-batch."""
    per_seq = s * seq * _layer_elements_per_token(b, rotates)
    if materialized:
        per_seq += 2 * s * b.attn.n_head * dense_pairs(seq, seq)  # scores and probabilities (B, H, T, T)
    else:
        per_seq += 4 * b.attn.n_head * seq  # fp32 log-sum-exp per query row
    return batch * per_seq


def activation_bytes(m: ModelShape, batch: int, seq: int, s: int, materialized: bool,
                     checkpointing: bool = False) -> float:
    """Saved activations of one training micro-batch; checkpointing keeps only block inputs plus one block."""
    layers = [_layer_bytes(b, m.position_rotates, batch, seq, s, materialized) for b in m.blocks]
    tokens = batch * seq
    # embedding output, final-norm input and LM-head input (d each) + logits in s bytes and an fp32 copy
    outside = tokens * (3 * s * m.d_model + m.vocab_size * (s + 4))
    if checkpointing:
        return outside + len(layers) * tokens * s * m.d_model + max(layers, default=0)
    return outside + sum(layers)


def kv_cache(m: ModelShape, batch: int, seq: int, s: int) -> dict:
    """KV-cache sizes: bytes per token (2·Σ n_kv_head·head_dim·s), for B×T, and with windowed layers capped."""
    per_layer = [2 * b.attn.n_kv_head * b.attn.head_dim * s for b in m.blocks]
    per_token = sum(per_layer)
    windowed = sum(p * (seq if b.attn.window is None else min(seq, b.attn.window))
                   for p, b in zip(per_layer, m.blocks))
    return {"bytes_per_token": per_token, "total_bytes": batch * seq * per_token,
            "total_bytes_windowed": batch * windowed}


def _members(optimizer) -> list:
    """The optimizer plus any member optimizers it steps together (e.g. Muon + AdamW)."""
    return [optimizer, *getattr(optimizer, "optimizers", [])]


def optimizer_state_bytes_per_param(model, optimizer) -> float:
    """Per-element optimizer state bytes / parameter, found by stepping `optimizer` once (meta device is free).

    Sets every gradient to ones, steps, and counts state tensors shaped like their parameter
    (scalar step counters are ignored).
    """
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.grad = torch.ones_like(p)
    optimizer.step()
    state_bytes = 0
    for opt in _members(optimizer):
        for p, state in opt.state.items():
            state_bytes += sum(t.numel() * t.element_size() for t in state.values()
                               if isinstance(t, torch.Tensor) and t.shape == p.shape)
    for p in params:
        p.grad = None
    return state_bytes / max(1, sum(p.numel() for p in params))

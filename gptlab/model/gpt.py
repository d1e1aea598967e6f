"""GPT: token embedding -> n_layer blocks -> final norm -> LM head, built from component factories."""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from gptlab.errors import ConfigError
from gptlab.model.base import KVCache, Norm, check_contract
from gptlab.model.config import GPTConfig


class Block(nn.Module):
    """One transformer block; pre-norm: x + attn(norm(x)), then x + mlp(norm(x)). Post-norm: norm(x + f(x)).

    An empty MLP (mlp=none) makes it attention-only: no second norm (None), no second residual add.
    """

    def __init__(self, cfg: GPTConfig, layer_idx: int, attention, mlp, norm, placement: str):
        super().__init__()
        self.placement = placement
        self.norm1 = norm(cfg.d_model)
        self.attn = attention(cfg.d_model, cfg.n_head, cfg.block_size, layer_idx, norm, bias=cfg.bias)
        ffn = mlp(cfg.d_model, bias=cfg.bias)
        self.norm2 = None if ffn.empty else norm(cfg.d_model)  # an unused norm would only add parameters
        self.mlp = ffn
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x, position, cache: KVCache | None = None):
        if self.placement == "pre":
            x = x + self.drop(self.attn(self.norm1(x), position, cache))
            return x if self.norm2 is None else x + self.drop(self.mlp(self.norm2(x)))
        x = self.norm1(x + self.drop(self.attn(x, position, cache)))
        return x if self.norm2 is None else self.norm2(x + self.drop(self.mlp(x)))


def check_components(model: GPT) -> None:
    """Every component honours its family's base class (gptlab.model.base); one-line ConfigError otherwise."""
    check_contract("position", model.position)
    check_contract("norm", model.norm_f)
    for block in model.blocks:
        check_contract("attention", block.attn)
        check_contract("mlp", block.mlp)
        check_contract("norm", block.norm1)
        if block.norm2 is not None:
            check_contract("norm", block.norm2)


class GPT(nn.Module):
    """A decoder-only transformer; `forward(idx, targets)` -> (logits (B, T, vocab), loss or None).

    `layer_counts` ({layer index: how many layers it stands for}) builds a cost-model skeleton instead:
    one block per distinct layer kind (see gptlab.model.base.layer_kinds); it can be costed, not run.
    """

    def __init__(
        self,
        cfg: GPTConfig,
        attention: Callable,
        mlp: Callable,
        norm: Callable,
        position: Callable,
        norm_placement: str = "pre",
        layer_counts: dict[int, int] | None = None,
        activation_checkpointing: bool = False,
    ):
        super().__init__()
        if norm_placement not in ("pre", "post"):
            raise ConfigError(f"norm.placement: '{norm_placement}' is not allowed; allowed: pre, post")
        self.cfg = cfg
        self.activation_checkpointing = activation_checkpointing  # recompute each block in backward (training only)
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.position = position(cfg.d_model, cfg.n_head, cfg.head_dim, cfg.block_size)
        self.drop = nn.Dropout(cfg.dropout)
        layers = range(cfg.n_layer) if layer_counts is None else list(layer_counts)
        self.blocks = nn.ModuleList(Block(cfg, i, attention, mlp, norm, norm_placement) for i in layers)
        self.layer_counts = None if layer_counts is None else tuple(layer_counts.values())
        # post-norm blocks already end in a norm; a final norm keeps the head's input scale the same
        self.norm_f = norm(cfg.d_model)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.wte.weight
        check_components(self)
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """GPT-2 init: N(0, init_std), residual projections scaled by 1/√(2·n_layer), norms to identity."""
        std = self.cfg.init_std
        if self.wte.weight.device.type == "meta":
            return
        nn.init.normal_(self.wte.weight, std=std)
        if not self.cfg.tie_embeddings:
            nn.init.normal_(self.lm_head.weight, std=std)
        self.position.init_weights(std)
        for block in cast(list[Block], self.blocks):
            block.attn.init_weights(self.cfg.n_layer, std)
            block.mlp.init_weights(self.cfg.n_layer, std)
        for m in self.modules():
            if isinstance(m, Norm):
                m.reset_parameters()

    def num_params(self, non_embedding: bool = False) -> int:
        """Parameter count (shared tensors once); non_embedding drops token and position tables."""
        total = sum(p.numel() for p in self.parameters())
        for block, count in zip(self.blocks, self.layer_counts or ()):  # a skeleton's block stands for `count`
            total += (count - 1) * sum(p.numel() for p in block.parameters())
        if non_embedding:
            total -= self.wte.weight.numel()
            total -= sum(p.numel() for p in self.position.parameters())
        return total

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None, caches: list[KVCache] | None = None):
        if self.layer_counts is not None:
            raise RuntimeError(
                "this GPT is a cost-model skeleton (one block per layer kind); build it without layer_counts to run it"
            )
        B, T = idx.shape
        offset = 0 if caches is None else caches[0].length
        if offset + T > self.cfg.block_size and not self._extrapolates():
            raise ValueError(f"sequence of {offset + T} tokens exceeds model.block_size={self.cfg.block_size}")
        pos = torch.arange(offset, offset + T, device=idx.device)
        x = self.drop(self.position.embed(self.wte(idx), pos))  # (B, T, d)
        for i, block in enumerate(self.blocks):
            cache = None if caches is None else caches[i]
            if self.activation_checkpointing and self.training and cache is None:
                x = checkpoint(block, x, self.position, use_reentrant=False)
            else:
                x = block(x, self.position, cache)
        logits = self.lm_head(self.norm_f(x))  # (B, T, vocab)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-100)
        return logits, loss

    def _extrapolates(self) -> bool:
        return not any(isinstance(m, nn.Embedding) for m in self.position.modules())

    @torch.no_grad()
    def generate(
        self,
        idx: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        use_cache: bool = True,
        generator: torch.Generator | None = None,
        kv_quant: str | None = None,
    ):
        """Append max_new_tokens sampled tokens to idx (B, T); temperature 0 = greedy.

        With use_cache, K/V live in preallocated caches (a ring of `window` positions on sliding-window layers;
        int8 with kv_quant="int8"); past model.block_size a model without length extrapolation recomputes its last
        block_size tokens each step instead.
        """
        from gptlab.infer.cache import make_caches

        caches = None
        for i in range(max_new_tokens):
            fits = idx.size(1) <= self.cfg.block_size
            if use_cache and fits and caches is not None:
                logits, _ = self(idx[:, -1:], caches=caches)  # one new token against the cache
            else:
                context = idx[:, -self.cfg.block_size :]
                max_len = min(self.cfg.block_size, idx.size(1) + max_new_tokens - i)
                caches = make_caches(self, idx.size(0), max_len, quant=kv_quant) if use_cache and fits else None
                logits, _ = self(context, caches=caches)
            idx = torch.cat([idx, self._sample(logits[:, -1, :], temperature, top_k, generator)], dim=1)
        return idx

    @staticmethod
    def _sample(logits, temperature, top_k, generator):
        if temperature == 0:
            return logits.argmax(dim=-1, keepdim=True)
        logits = logits / temperature
        if top_k is not None:
            kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, [-1]]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = F.softmax(logits.float(), dim=-1)
        return torch.multinomial(probs, 1, generator=generator)

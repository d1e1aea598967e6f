"""GPT: token embedding -> n_layer blocks -> final norm -> LM head, built from component factories.

The loss is next-token cross-entropy, the mean over scored targets (target -100 = unscored), as
`F.cross_entropy(logits.float(), targets, ignore_index=-100)` defines it. For fp32 logits it is exactly that call.
For bf16/fp16 logits (autocast) it is `chunked_cross_entropy`: the same value and gradient computed a slice of rows
at a time, so no fp32 copy of all the logits is ever made and backward keeps only the logits themselves. Under
torch.compile it is that call again: inductor fuses the upcast into its softmax kernels by itself.

`model.vocab_multiple` pads the embedding and LM head to `cfg.padded_vocab` rows; the padded ids are never predicted:
`forward` returns logits over the real `cfg.vocab_size` ids only, and the loss never sees the padded columns (as if
their logits were -inf: zero probability, never the argmax, zero gradient).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from typing import Annotated, cast

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from gptlab.errors import ConfigError
from gptlab.model import parametrization
from gptlab.model.base import KVCache, Norm, Position, check_contract
from gptlab.model.config import GPTConfig
from gptlab.model.documents import Documents
from gptlab.util.checks import OneOf, rule

# norm.placement, a key of the norm group that the blocks read: pre = x + f(norm(x)), post = norm(x + f(x)); the
# schema takes its rule from GPT's signature, and GPT applies it to a caller's plain Python argument
PLACEMENT = OneOf(("pre", "post"))

IGNORE_INDEX = -100  # a target that is not scored (prompt tokens, padding)
# Logits upcast at once by the chunked loss: 2**26 fp32 elements = 256 MiB per chunk (~1,335 rows at GPT-2's vocab).
LOSS_CHUNK_ELEMENTS = 2**26


class _ChunkedCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy over scored rows of `logits[:, :vocab]`, upcast to fp32 `rows` rows at a time.

    Saves for backward only the logits (the caller's tensor, no copy); backward recomputes each chunk's softmax. The
    upcast happens inside log_softmax / softmax (`dtype=float32`): one pass over a chunk, where a separate `.float()`
    copy, max, subtract and exp took four (1.35x the fwd+bwd time on a 2-core CPU in bf16, N 4096 x 50,257).
    Columns past `vocab` (a padded vocabulary) take no part: their gradient is 0.
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor, vocab: int, rows: int):
        # logits (N, V_alloc) in their own dtype, V_alloc >= vocab; targets (N,) int64
        n = logits.size(0)
        scored = targets != IGNORE_INDEX  # (N,)
        ids = torch.where(scored, targets, 0).unsqueeze(1)  # (N, 1): a valid column for unscored rows too
        total = torch.zeros((), dtype=torch.float32, device=logits.device)
        for start in range(0, n, rows):
            end = min(n, start + rows)
            logp = torch.log_softmax(logits[start:end, :vocab], dim=1, dtype=torch.float32)  # (c, vocab) fp32
            nll = logp.gather(1, ids[start:end]).squeeze(1).neg_()  # (c,)
            total = total + torch.where(scored[start:end], nll, 0.0).sum()
        count = scored.sum()
        ctx.save_for_backward(logits, ids, scored, count)
        ctx.vocab, ctx.rows = vocab, rows
        return total / count  # 0 scored targets: 0/0 = nan, as F.cross_entropy's mean

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor):
        logits, ids, scored, count = ctx.saved_tensors
        vocab, rows = ctx.vocab, ctx.rows
        grad = torch.empty_like(logits)  # (N, V_alloc) in the logits' dtype
        grad[:, vocab:] = 0  # padded columns: never predicted, no gradient
        # d loss / d nll_row = grad_loss / count for a scored row, 0 for an unscored one; (N, 1)
        row_scale = torch.where(scored, grad_loss.float() / count, 0.0).unsqueeze(1)
        for start in range(0, logits.size(0), rows):
            end = min(logits.size(0), start + rows)
            p = torch.softmax(logits[start:end, :vocab], dim=1, dtype=torch.float32)  # (c, vocab) fp32
            p.scatter_add_(1, ids[start:end], torch.full_like(p[:, :1], -1.0))  # softmax - one-hot(target)
            grad[start:end, :vocab] = p.mul_(row_scale[start:end])
        return grad, None, None, None


def chunked_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, vocab: int | None = None) -> torch.Tensor:
    """`F.cross_entropy(logits[:, :vocab].float(), targets, ignore_index=-100)` (mean over scored targets) without
    an fp32 copy of all of `logits` (N, V_alloc): LOSS_CHUNK_ELEMENTS logits are upcast at a time."""
    vocab = logits.size(-1) if vocab is None else vocab
    rows = max(1, LOSS_CHUNK_ELEMENTS // vocab)
    return cast(torch.Tensor, _ChunkedCrossEntropy.apply(logits, targets, vocab, rows))


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


def _pad_rows(module: nn.Embedding | nn.Linear, size_attr: str, rows: int) -> None:
    """Grow `module.weight` (V, d) to (rows, d) with zero rows (model.vocab_multiple), its size attribute with it.

    The module is built at its real size first, so it draws from the RNG exactly what an unpadded model's does; the
    padded rows draw nothing (every later weight of the model starts as it would without padding)."""
    weight = module.weight
    if rows == weight.size(0):
        return
    pad = torch.zeros(rows - weight.size(0), weight.size(1), dtype=weight.dtype, device=weight.device)
    module.weight = nn.Parameter(torch.cat([weight.detach(), pad]))
    setattr(module, size_attr, rows)


def _redraw_residual(block: Block, std: float) -> None:
    """model.residual_init_std: the block's residual projections drawn again from N(0, std), or zeroed (std 0).

    Runs after the components' own init, so every other weight (and, at std 0, the RNG stream) is as without it."""
    for part, name in ((block.attn, "attention"), (block.mlp, "mlp")):
        projections = part.residual_projections()
        if not projections and not (name == "mlp" and part.empty):
            raise ConfigError(
                f"model.residual_init_std: {type(part).__name__} names no residual projections "
                f"(define residual_projections() on the {name} choice); allowed: null"
            )
        for lin in projections:
            if std == 0:
                nn.init.zeros_(lin.weight)
            else:
                nn.init.normal_(lin.weight, std=std)


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
        norm_placement: Annotated[str, rule(check=PLACEMENT, key="norm.placement")] = "pre",
        layer_counts: dict[int, int] | None = None,
        activation_checkpointing: bool = False,
    ):
        super().__init__()
        PLACEMENT("norm.placement", norm_placement)
        self.cfg = cfg
        self.activation_checkpointing = activation_checkpointing  # recompute each block in backward (training only)
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)
        _pad_rows(self.wte, "num_embeddings", cfg.padded_vocab)  # model.vocab_multiple
        self.position = position(cfg.d_model, cfg.n_head, cfg.head_dim, cfg.block_size)
        self.drop = nn.Dropout(cfg.dropout)
        layers = range(cfg.n_layer) if layer_counts is None else list(layer_counts)
        self.blocks = nn.ModuleList(Block(cfg, i, attention, mlp, norm, norm_placement) for i in layers)
        self.layer_counts = None if layer_counts is None else tuple(layer_counts.values())
        # post-norm blocks already end in a norm; a final norm keeps the head's input scale the same
        self.norm_f = norm(cfg.d_model)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        _pad_rows(self.lm_head, "out_features", cfg.padded_vocab)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.wte.weight
        check_components(self)
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """GPT-2 init: N(0, init_std), residual projections scaled by 1/√(2·n_layer), norms to identity; under
        model.parametrization=mup the hidden matrices then x 1/√m, the logits x 1/m, attention scores q·k/head_dim.

        Padded vocabulary rows (model.vocab_multiple) start at 0 and draw nothing from the RNG: every other weight
        starts exactly as without padding, and the padded rows stay 0 (no gradient reaches them; decay keeps 0)."""
        std, vocab = self.cfg.init_std, self.cfg.vocab_size
        self._readout_mult = parametrization.prepare(self)  # None under sp: forward multiplies nothing
        if self.wte.weight.device.type == "meta":
            return
        for table in (self.wte.weight, None if self.cfg.tie_embeddings else self.lm_head.weight):
            if table is not None:
                nn.init.normal_(table[:vocab], std=std)  # the leading rows: contiguous, the unpadded draws
                table[vocab:].zero_()
        self.position.init_weights(std)
        for block in cast(list[Block], self.blocks):
            block.attn.init_weights(self.cfg.n_layer, std)
            block.mlp.init_weights(self.cfg.n_layer, std)
            if self.cfg.residual_init_std is not None:
                _redraw_residual(block, self.cfg.residual_init_std)
        for m in self.modules():
            if isinstance(m, Norm):
                m.reset_parameters()
        parametrization.rescale_init(self)  # mup: after every draw, so the RNG stream is sp's

    def num_params(self, non_embedding: bool = False) -> int:
        """Parameter count as allocated (shared tensors once): padded vocabulary rows (model.vocab_multiple) count;
        non_embedding drops token and position tables."""
        total = sum(p.numel() for p in self.parameters())
        for block, count in zip(self.blocks, self.layer_counts or ()):  # a skeleton's block stands for `count`
            total += (count - 1) * sum(p.numel() for p in block.parameters())
        if non_embedding:
            total -= self.wte.weight.numel()
            total -= sum(p.numel() for p in self.position.parameters())
        return total

    def forward(
        self,
        idx: torch.Tensor,
        targets: torch.Tensor | None = None,
        caches: list[KVCache] | None = None,
        docs: torch.Tensor | None = None,
    ):
        """`docs` (B, T) document ids of packed rows (data.doc_mask): attention stays inside each document and
        positions restart at each (gptlab/model/documents.py); None: one sequence per row, as always."""
        if self.layer_counts is not None:
            raise RuntimeError(
                "this GPT is a cost-model skeleton (one block per layer kind); build it without layer_counts to run it"
            )
        B, T = idx.shape
        offset = 0 if caches is None else caches[0].length
        if offset + T > self.cfg.block_size and not self._extrapolates():
            raise ValueError(f"sequence of {offset + T} tokens exceeds model.block_size={self.cfg.block_size}")
        position: Position | Documents = self.position
        if docs is None:
            pos = torch.arange(offset, offset + T, device=idx.device)
        else:
            position = self._documents(docs, caches)
            pos = position.pos  # (B, T): positions within each document
        x = self.drop(self.position.embed(self.wte(idx), pos))  # (B, T, d)
        for i, block in enumerate(self.blocks):
            cache = None if caches is None else caches[i]
            if self.activation_checkpointing and self.training and cache is None:
                x = checkpoint(block, x, position, use_reentrant=False)
            else:
                x = block(x, position, cache)
        logits = self.lm_head(self.norm_f(x) if self._readout_mult is None else self.norm_f(x) * self._readout_mult)
        loss = None
        if targets is not None:
            loss = self.loss(logits.view(B * T, -1), targets.reshape(-1))
        vocab = self.cfg.vocab_size
        # padded ids are never predicted: the logits returned cover the real vocabulary only (a view, no copy)
        return (logits if logits.size(-1) == vocab else logits[..., :vocab]), loss

    def _documents(self, docs: torch.Tensor, caches) -> Documents:
        """The blocks' view of packed documents (B, T) ids: what attention masks and positions restart by."""
        if caches is not None:
            raise ValueError("document ids (docs) take no KV caches: generation is one document")
        return Documents(docs, self.position)

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy of (N, padded_vocab) logits against (N,) targets, -100 unscored (module docstring)."""
        vocab = self.cfg.vocab_size
        if logits.dtype == torch.float32 and logits.size(-1) == vocab:
            # already fp32, so no copy to save: torch's own kernel, bit for bit the loss this model always had
            return F.cross_entropy(logits, targets, ignore_index=IGNORE_INDEX)
        if torch.compiler.is_compiling():
            # inductor fuses the upcast into its own softmax kernels; the chunked Function's slice writes would be
            # functionalized into one whole-gradient copy per chunk (10 ms of a 47 ms d12 step on an H200)
            return F.cross_entropy(logits[:, :vocab].float(), targets, ignore_index=IGNORE_INDEX)
        return chunked_cross_entropy(logits, targets, vocab)

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
        block_size tokens each step instead. Runs eager even on a model compiled in place (hardware.compile): the
        shapes change every token, and each would be a recompilation (or a CUDA graph re-recorded).
        """
        # torch._dynamo not imported: nothing was compiled, and importing it for set_stance would cost ~1 s
        eager = torch.compiler.set_stance("force_eager") if "torch._dynamo" in sys.modules else contextlib.nullcontext()
        with eager:
            return self._generate(idx, max_new_tokens, temperature, top_k, use_cache, generator, kv_quant)

    def _generate(self, idx, max_new_tokens, temperature, top_k, use_cache, generator, kv_quant):
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

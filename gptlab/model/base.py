"""The contract of each component family as code: one base class per family (see `gptlab.model`).

Each base sets, in its constructor, every attribute the rest of gptlab reads (the GPT, the cost model,
the build-time checks), so a variant that subclasses it and calls `super().__init__` cannot fail later
for want of one. `GPT` refuses, in one line, a component that does not honour its family's base.
"""

from __future__ import annotations

import abc
import functools
import math
from collections.abc import Callable, Hashable

import torch
import torch.nn as nn

from gptlab.errors import ConfigError
from gptlab.model.attention.kernels import KERNELS, check_impl_name, prepare_flex
from gptlab.model.documents import Documents
from gptlab.util.checks import Number

# attention.window's one range: the schema checks the key with it (gqa.py's rule), every Attention its layer's window
WINDOW = Number(">= 1", int, null=True)


class KVCache:
    """Per-layer key/value cache that grows along T by torch.cat, (B, n_kv_head, T, head_dim): the simplest
    cache (every step copies it whole). gptlab.infer.cache has the preallocated, ring and int8 caches; all answer
    `update(k, v) -> (keys, values, k_start)`, key j of the answer sitting at absolute position k_start + j."""

    def __init__(self) -> None:
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    @property
    def length(self) -> int:
        """Positions seen so far: the absolute position of the next token."""
        return 0 if self.k is None else self.k.size(2)

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
        self.k = k if self.k is None else torch.cat([self.k, k], dim=2)
        self.v = v if self.v is None else torch.cat([self.v, v], dim=2)
        return self.k, self.v, 0


def check_heads(d_model: int, n_head: int, n_kv_head: int | None, window: int | None, dropout: float) -> None:
    """One-line ConfigErrors for impossible head, window or dropout settings."""
    if d_model % n_head:
        raise ConfigError(
            f"model.d_model={d_model} is not divisible by model.n_head={n_head}; pick n_head dividing d_model"
        )
    if n_kv_head is not None and (n_kv_head < 1 or n_head % n_kv_head):
        raise ConfigError(f"attention.n_kv_head={n_kv_head} must be >= 1 and divide model.n_head={n_head}")
    WINDOW("attention.window", window)
    if not 0.0 <= dropout < 1.0:
        raise ConfigError(f"attention.dropout={dropout} must be in [0, 1)")


class Attention(nn.Module, abc.ABC):
    """Causal self-attention: `forward(x, position, cache=None)` maps (B, T, d_model) -> (B, T, d_model)."""

    def __init__(
        self,
        d_model: int,
        n_head: int,
        block_size: int,
        layer_idx: int,
        *,
        n_kv_head: int | None = None,
        window: int | None = None,
        impl: str = "sdpa",
        dropout: float = 0.0,
    ):
        super().__init__()
        check_heads(d_model, n_head, n_kv_head, window, dropout)
        self.d_model = d_model
        self.n_head = n_head
        self.n_kv_head = n_head if n_kv_head is None else n_kv_head
        self.head_dim = d_model // n_head
        self.block_size = block_size
        self.layer_idx = layer_idx
        self.window = window  # this layer's window; None = full causal
        self.impl = check_impl_name(impl)
        self.kernel = KERNELS[impl]
        self.dropout = dropout  # on attention probabilities, training only
        if impl == "flex":  # the training-shape block mask, built here rather than inside a (compiled) forward
            prepare_flex(block_size, window, torch.empty(0).device)

    @classmethod
    def layer_key(cls, layer_idx: int, **choice_keys) -> Hashable:
        """What sets layer `layer_idx` apart; layers with equal keys are identical (the cost model builds one)."""
        return layer_idx  # unknown: every layer its own kind

    @abc.abstractmethod
    def init_weights(self, n_layer: int, std: float) -> None:
        """Initialise the weights (GPT-2: residual projections scaled by 1/√(2·n_layer))."""

    def residual_projections(self) -> list[nn.Linear]:
        """The matrices that write into the residual stream (model.residual_init_std re-draws them); [] = unknown."""
        return []

    @abc.abstractmethod
    def forward(self, x: torch.Tensor, position: Position, cache: KVCache | None = None) -> torch.Tensor:
        """(B, T, d_model) -> (B, T, d_model), causal."""

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        position: Position | Documents,
        cache: KVCache | None = None,
    ) -> torch.Tensor:
        """q (B, n_head, T, hd), k/v (B, n_kv_head, T, hd) -> (B, n_head, T, hd): positions, cache, mask, dropout.

        `position` is a Documents (gptlab.model.documents) when the batch packs several documents per row
        (data.doc_mask): then no query sees another document's keys, and positions restart at each document."""
        if isinstance(position, Documents):
            return self._attend_documents(q, k, v, position, cache)
        offset = 0 if cache is None else cache.length
        pos = torch.arange(offset, offset + q.size(2), device=q.device)
        q, k = position.rotate(q, k, pos)
        k_start = 0
        if cache is not None:
            k, v, k_start = cache.update(k, v)  # (B, Hkv, Tk, hd), key j at position k_start + j
        bias = position.score_bias(pos, torch.arange(k_start, k_start + k.size(2), device=q.device))  # (H, T, Tk)
        dropout_p = self.dropout if self.training else 0.0
        # the kernels place key j at position j: shift the queries by k_start (masks and ALiBi use differences)
        return self.kernel(q, k, v, window=self.window, q_offset=offset - k_start, bias=bias, dropout_p=dropout_p)

    def _attend_documents(self, q, k, v, docs: Documents, cache: KVCache | None) -> torch.Tensor:
        """attend() over packed documents: the position hooks get each token's position within its document (B, T),
        and the kernel `docs`, whose mask keeps every query inside its document. Training shapes, no KV cache."""
        if cache is not None:
            raise ValueError("packed documents (document ids) take no KV cache: generation is one document")
        pos = docs.pos  # (B, T)
        q, k = docs.position.rotate(q, k, pos)
        # (B, H, T, T), (H, T, T) or None: the same in every layer, so computed once per forward
        bias = docs.cached("score_bias", lambda: docs.position.score_bias(pos, pos))
        dropout_p = self.dropout if self.training else 0.0
        return self.kernel(q, k, v, window=self.window, bias=bias, dropout_p=dropout_p, docs=docs)


def check_mlp(hidden: int, dropout: float, empty: bool = False) -> None:
    """One-line ConfigErrors for an empty hidden layer (unless the MLP is `empty`) or an impossible dropout."""
    if hidden < (0 if empty else 1):
        raise ConfigError(f"mlp: hidden width {hidden} must be >= 1; raise mlp.ratio")
    if not 0.0 <= dropout < 1.0:
        raise ConfigError(f"mlp.dropout={dropout} must be in [0, 1)")


class MLP(nn.Module, abc.ABC):
    """Position-wise feed-forward: (B, T, d_model) -> (B, T, d_model), token by token."""

    empty = False  # True: adds nothing (mlp=none); the block then builds no second norm and skips the MLP

    def __init__(self, d_model: int, hidden: int, dropout: float = 0.0):
        super().__init__()
        check_mlp(hidden, dropout, type(self).empty)
        self.d_model = d_model
        self.hidden = hidden  # width the activation runs on
        self.dropout = dropout

    @abc.abstractmethod
    def init_weights(self, n_layer: int, std: float) -> None:
        """Initialise the weights (GPT-2: the residual projection scaled by 1/√(2·n_layer))."""

    def residual_projections(self) -> list[nn.Linear]:
        """The matrices that write into the residual stream (model.residual_init_std re-draws them); [] = none."""
        return []

    @abc.abstractmethod
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, d_model) -> (B, T, d_model)."""


class Norm(nn.Module, abc.ABC):
    """Normalises the last dimension: (..., dim) -> (..., dim)."""

    def __init__(self, dim: int, eps: float | None = None, centered: bool = False):
        super().__init__()
        if eps is not None and not (0.0 < eps < math.inf):  # eps: for norms that divide by a statistic (not DyT)
            raise ConfigError(f"norm.eps={eps} must be a positive finite number (e.g. 1e-5)")
        self.dim = dim
        self.eps = eps
        self.centered = centered  # subtracts the mean (LayerNorm) rather than only scaling by the RMS

    @abc.abstractmethod
    def reset_parameters(self) -> None:
        """Affine parameters to the identity."""

    @abc.abstractmethod
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(..., dim) -> (..., dim)."""


class Position(nn.Module):
    """Identity on all three hooks; a variant overrides the one it needs.

    `pos` is (T,) absolute positions, or (B, T) with packed documents (data.doc_mask): each token's position within
    its own document, restarting at 0 at every document. A hook must take both (index with `pos[..., None]`, not
    `pos[:, None]`); score_bias then returns (B, H, Tq, Tk) or (H, Tq, Tk) (pairs across documents are masked
    anyway). tests/test_doc_mask.py checks every conf/position choice for it.
    """

    has_score_bias = False  # a variant whose score_bias returns a tensor sets True (attention then needs a mask)

    def __init__(self, d_model: int, n_head: int, head_dim: int, block_size: int):
        super().__init__()
        self.d_model = d_model
        self.n_head = n_head
        self.head_dim = head_dim
        self.block_size = block_size
        self.has_score_bias = type(self).has_score_bias

    def embed(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Token embeddings (B, T, d) at positions pos (T,) or (B, T) -> (B, T, d)."""
        return x

    def rotate(self, q: torch.Tensor, k: torch.Tensor, pos: torch.Tensor):
        """q (B, H, T, hd), k (B, Hkv, T, hd) at positions pos (T,) or (B, T) -> rotated q, k."""
        return q, k

    def score_bias(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor | None:
        """Additive attention-score bias (H, Tq, Tk) (positions (B, T): (B, H, Tq, Tk) allowed), or None."""
        return None

    def init_weights(self, std: float) -> None:
        """Initialise learned parameters, if any."""


# family -> (base class, attributes the rest of gptlab reads)
CONTRACTS: dict[str, tuple[type, tuple[str, ...]]] = {
    "attention": (
        Attention,
        ("n_head", "n_kv_head", "head_dim", "window", "impl", "kernel", "dropout"),
    ),
    "mlp": (MLP, ("hidden", "dropout")),
    "norm": (Norm, ("dim", "eps", "centered")),
    "position": (Position, ("has_score_bias", "block_size")),
}


def check_contract(family: str, module: object) -> None:
    """One-line ConfigError unless `module` is its family's base with the base's attributes set."""
    base, names = CONTRACTS[family]
    name = f"{type(module).__module__}.{type(module).__qualname__}"
    if not isinstance(module, base):
        raise ConfigError(
            f"{family}: {name} is not a {base.__module__}.{base.__qualname__}; subclass it and call "
            f"super().__init__ (contract: gptlab/model/__init__.py)"
        )
    missing = [n for n in names if not hasattr(module, n)]
    if missing:
        raise ConfigError(
            f"{family}: {name} has no {', '.join(missing)}; call {base.__qualname__}.__init__ "
            f"from its constructor (contract: gptlab/model/__init__.py)"
        )


def layer_kinds(attention: Callable, n_layer: int) -> dict[int, int]:
    """{first layer of each distinct kind: layers of that kind}, by the attention class's `layer_key`."""
    func = attention.func if isinstance(attention, functools.partial) else attention
    keywords = dict(attention.keywords) if isinstance(attention, functools.partial) else {}
    key = getattr(func, "layer_key", None)
    if key is None:  # a plain factory function: nothing known, every layer its own kind
        return dict.fromkeys(range(n_layer), 1)
    first: dict = {}
    counts: dict[int, int] = {}
    for i in range(n_layer):
        rep = first.setdefault(key(i, **keywords), i)
        counts[rep] = counts.get(rep, 0) + 1
    return counts

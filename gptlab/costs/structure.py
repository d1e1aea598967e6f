"""Read a GPT's shape from its module tree (plain numbers), so costing needs no variant names."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch.nn as nn

from gptlab.costs.scores import KernelTraits, traits_for


@dataclass(frozen=True)
class LinearShape:
    """One nn.Linear applied once per token: y = x·Wᵀ (+ b)."""

    name: str
    d_in: int
    d_out: int
    bias: bool


@dataclass(frozen=True)
class NormShape:
    """A normalisation over the last `dim` elements with `n_affine` per-element parameter vectors."""

    dim: int
    n_affine: int
    centered: bool  # subtracts the mean (LayerNorm) rather than only scaling by the RMS

    @property
    def flops_per_element(self) -> int:
        """Approximate: square+sum+scale (3), mean+subtract (+2 if centered), +1 per affine vector."""
        return 3 + 2 * int(self.centered) + self.n_affine


@dataclass(frozen=True)
class AttnShape:
    """One layer's attention: heads, window, kernel traits and its per-token linears."""

    n_head: int
    n_kv_head: int
    head_dim: int
    window: int | None
    traits: KernelTraits
    uses_score_bias: bool
    linears: tuple[LinearShape, ...]
    qk_norm: NormShape | None


@dataclass(frozen=True)
class MLPShape:
    """One layer's feed-forward: its linears (found generically) and the activation's width."""

    linears: tuple[LinearShape, ...]
    hidden: int
    act_inputs: int  # elements per token entering the activation (outputs of non-final linears)


@dataclass(frozen=True)
class BlockShape:
    """One transformer block."""

    attn: AttnShape
    mlp: MLPShape
    norms: tuple[NormShape, ...]


@dataclass(frozen=True)
class ModelShape:
    """Everything the cost model needs, as plain numbers."""

    d_model: int
    vocab_size: int
    block_size: int
    blocks: tuple[BlockShape, ...]
    norm_f: NormShape
    lm_head: LinearShape
    tied: bool
    position_adds: bool     # the position choice adds a vector to the token embeddings (learned)
    position_rotates: bool  # the position choice rotates q and k (RoPE)
    params: dict            # per component, shared tensors counted once
    n_params: int


def _linears(module: nn.Module, prefix: str) -> tuple[LinearShape, ...]:
    return tuple(LinearShape(f"{prefix}.{name}", m.in_features, m.out_features, m.bias is not None)
                 for name, m in module.named_modules() if isinstance(m, nn.Linear))


def _norm(module: nn.Module) -> NormShape:
    shape = getattr(module, "normalized_shape", None)
    dim = math.prod(shape) if shape else 0
    n_affine = sum(1 for _ in module.parameters(recurse=False))
    return NormShape(dim=dim, n_affine=n_affine, centered=isinstance(module, nn.LayerNorm))


def _overrides(obj, method: str) -> bool:
    """True if obj's class overrides `method` of the base class that first defines it (not the identity hook)."""
    owners = [c for c in type(obj).__mro__ if method in c.__dict__]
    return len(owners) > 1


def _attn(attn: nn.Module) -> AttnShape:
    q_norm = getattr(attn, "q_norm", None)
    return AttnShape(n_head=attn.n_head, n_kv_head=attn.n_kv_head, head_dim=attn.head_dim,
                     window=attn.window, traits=traits_for(attn),
                     uses_score_bias=bool(getattr(attn, "uses_score_bias", False)),
                     linears=_linears(attn, "attn"), qk_norm=None if q_norm is None else _norm(q_norm))


def _mlp(mlp: nn.Module, d_model: int) -> MLPShape:
    linears = _linears(mlp, "mlp")
    # outputs that do not go back to the residual width feed the activation (up, gate, ...)
    act_inputs = sum(lin.d_out for lin in linears if lin.d_out != d_model)
    return MLPShape(linears=linears, hidden=int(getattr(mlp, "hidden", act_inputs)), act_inputs=act_inputs)


def _block_norms(block: nn.Module) -> tuple[NormShape, ...]:
    return tuple(_norm(getattr(block, n)) for n in ("norm1", "norm2") if getattr(block, n, None) is not None)


def count_params(model: nn.Module) -> dict:
    """Parameters per component (embedding, position, attention, mlp, norm, lm_head, other), each tensor once."""
    seen: set[int] = set()

    def take(modules) -> int:
        n = 0
        for m in modules:
            for p in m.parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    n += p.numel()
        return n

    blocks = list(model.blocks)
    out = {
        "embedding": take([model.wte]),
        "position": take([model.position]),
        "attention": take([b.attn for b in blocks]),
        "mlp": take([b.mlp for b in blocks]),
        "norm": take([getattr(b, n) for b in blocks for n in ("norm1", "norm2")] + [model.norm_f]),
        "lm_head": take([model.lm_head]),  # 0 when tied to the token embedding
    }
    out["other"] = take([model])
    return out


def describe(model: nn.Module) -> ModelShape:
    """The ModelShape of a GPT honouring the gptlab.model contract (works on the meta device)."""
    cfg = model.cfg
    d = cfg.d_model
    params = count_params(model)
    head = model.lm_head
    return ModelShape(
        d_model=d, vocab_size=head.out_features, block_size=cfg.block_size,
        blocks=tuple(BlockShape(_attn(b.attn), _mlp(b.mlp, d), _block_norms(b)) for b in model.blocks),
        norm_f=_norm(model.norm_f),
        lm_head=LinearShape("lm_head", head.in_features, head.out_features, head.bias is not None),
        tied=head.weight is model.wte.weight,
        position_adds=any(isinstance(m, nn.Embedding) for m in model.position.modules())
        or _overrides(model.position, "embed"),
        position_rotates=_overrides(model.position, "rotate"),
        params=params, n_params=sum(params.values()))


def non_embedding_params(shape: ModelShape) -> int:
    """Total minus the token table and the position module's tables (an untied LM head stays in)."""
    return shape.n_params - shape.params["embedding"] - shape.params["position"]

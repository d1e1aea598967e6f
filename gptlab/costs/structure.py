"""Read a GPT's shape from its module tree (plain numbers), so costing needs no variant names."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch.nn as nn

from gptlab.costs.scores import KernelTraits, traits_for

# A module read through the gptlab.model contract's attributes (cfg, blocks, attn, mlp, dim, n_head, ...): duck-typed,
# since nn.Module's attribute lookup is typed Tensor | Module.
Contract = Any


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
    """Everything the cost model needs, as plain numbers; `blocks` are the distinct block shapes, `counts` their layers."""

    d_model: int
    vocab_size: int
    block_size: int
    blocks: tuple[BlockShape, ...]
    counts: tuple[int, ...]  # layers of each distinct block shape (sum = n_layer)
    norm_f: NormShape
    lm_head: LinearShape
    tied: bool
    position_adds: bool  # the position choice adds a vector to the token embeddings (learned)
    position_rotates: bool  # the position choice rotates q and k (RoPE)
    params: dict  # per component, shared tensors counted once
    n_params: int
    matmul_weights: int  # elements of the nn.Linear weights (a tied LM head once): what autocast casts

    @property
    def n_layer(self) -> int:
        return sum(self.counts)

    def layers(self) -> list[tuple[BlockShape, int]]:
        """(distinct block shape, how many layers have it), in order of first appearance."""
        return list(zip(self.blocks, self.counts))


def _linears(module: nn.Module, prefix: str) -> tuple[LinearShape, ...]:
    return tuple(
        LinearShape(f"{prefix}.{name}", m.in_features, m.out_features, m.bias is not None)
        for name, m in module.named_modules()
        if isinstance(m, nn.Linear)
    )


def _norm(module: Contract) -> NormShape:
    """A gptlab.model.base.Norm: its dim, centring and per-element parameter vectors."""
    n_affine = sum(1 for _ in module.parameters(recurse=False))
    return NormShape(dim=module.dim, n_affine=n_affine, centered=module.centered)


def _overrides(obj, method: str) -> bool:
    """True if obj's class overrides `method` of the base class that first defines it (not the identity hook)."""
    owners = [c for c in type(obj).__mro__ if method in c.__dict__]
    return len(owners) > 1


def _attn(attn: Contract, uses_score_bias: bool) -> AttnShape:
    q_norm = getattr(attn, "q_norm", None)
    return AttnShape(
        n_head=attn.n_head,
        n_kv_head=attn.n_kv_head,
        head_dim=attn.head_dim,
        window=attn.window,
        traits=traits_for(attn),
        uses_score_bias=uses_score_bias,
        linears=_linears(attn, "attn"),
        qk_norm=None if q_norm is None else _norm(q_norm),
    )


def _mlp(mlp: Contract, d_model: int) -> MLPShape:
    linears = _linears(mlp, "mlp")
    # every linear but the residual projection (down) feeds the activation (up, gate, ...): found by identity, so a
    # hidden width equal to d_model counts too; an MLP naming no residual projection falls back to the widths
    residual = {id(lin) for lin in mlp.residual_projections()}
    if residual:
        act_inputs = sum(m.out_features for m in mlp.modules() if isinstance(m, nn.Linear) and id(m) not in residual)
    else:
        act_inputs = sum(lin.d_out for lin in linears if lin.d_out != d_model)
    return MLPShape(linears=linears, hidden=int(mlp.hidden), act_inputs=act_inputs)


def _block_norms(block: nn.Module) -> tuple[NormShape, ...]:
    return tuple(_norm(getattr(block, n)) for n in ("norm1", "norm2") if getattr(block, n, None) is not None)


def block_shape(block: Contract, d_model: int, uses_score_bias: bool) -> BlockShape:
    """The BlockShape of one built transformer block (`uses_score_bias`: the model's position adds a score bias)."""
    return BlockShape(_attn(block.attn, uses_score_bias), _mlp(block.mlp, d_model), _block_norms(block))


def layer_counts(model: Contract) -> tuple[int, ...]:
    """How many layers each built block stands for: all 1, or a cost-model skeleton's `layer_counts`."""
    return tuple(getattr(model, "layer_counts", None) or (1,) * len(model.blocks))


def param_weights(model: Contract) -> dict[int, int]:
    """id(parameter) -> layers it stands for: a cost-model skeleton's block counts, else 1."""
    weights = {id(p): 1 for p in model.parameters()}
    for block, count in zip(model.blocks, layer_counts(model)):
        weights.update({id(p): count for p in block.parameters()})
    return weights


def matmul_weights(model: Contract) -> int:
    """Elements of every nn.Linear weight (a tied LM head once, a skeleton's blocks once per layer they stand for):
    the weights autocast casts to the compute dtype (costs.memory.autocast_copy_bytes)."""
    weights = param_weights(model)
    linear = {id(m.weight): m.weight for m in model.modules() if isinstance(m, nn.Linear)}
    return sum(weights[i] * w.numel() for i, w in linear.items())


def count_params(model: Contract) -> dict:
    """Parameters per component (embedding, position, attention, mlp, norm, lm_head, other), each tensor once."""
    seen: set[int] = set()

    def take(modules, times: int = 1) -> int:
        n = 0
        for m in modules:
            for p in m.parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    n += p.numel()
        return n * times

    layers = list(zip(model.blocks, layer_counts(model)))
    out = {
        "embedding": take([model.wte]),
        "position": take([model.position]),
        "attention": sum(take([b.attn], c) for b, c in layers),
        "mlp": sum(take([b.mlp], c) for b, c in layers),
        "norm": sum(take([n for n in (b.norm1, b.norm2) if n is not None], c) for b, c in layers)
        + take([model.norm_f]),  # an attention-only block (mlp=none) has no norm2
        "lm_head": take([model.lm_head]),  # 0 when tied to the token embedding
    }
    out["other"] = sum(take([b], c) for b, c in layers) + take([model])
    return out


def _grouped(blocks: list[BlockShape], counts: tuple[int, ...]) -> dict[BlockShape, int]:
    """Equal block shapes merged, first appearance first: 10⁵ identical layers are costed once."""
    out: dict[BlockShape, int] = {}
    for block, count in zip(blocks, counts):
        out[block] = out.get(block, 0) + count
    return out


def describe(model: Contract) -> ModelShape:
    """The ModelShape of a GPT honouring the gptlab.model contract (works on the meta device)."""
    cfg = model.cfg
    d = cfg.d_model
    params = count_params(model)
    head = model.lm_head
    bias = bool(model.position.has_score_bias)
    kinds = _grouped([block_shape(b, d, bias) for b in model.blocks], layer_counts(model))
    return ModelShape(
        d_model=d,
        vocab_size=head.out_features,
        block_size=cfg.block_size,
        blocks=tuple(kinds),
        counts=tuple(kinds.values()),
        norm_f=_norm(model.norm_f),
        lm_head=LinearShape("lm_head", head.in_features, head.out_features, head.bias is not None),
        tied=head.weight is model.wte.weight,
        position_adds=any(isinstance(m, nn.Embedding) for m in model.position.modules())
        or _overrides(model.position, "embed"),
        position_rotates=_overrides(model.position, "rotate"),
        params=params,
        n_params=sum(params.values()),
        matmul_weights=matmul_weights(model),
    )


def non_embedding_params(shape: ModelShape) -> int:
    """Total minus the token table and the position module's tables (an untied LM head stays in)."""
    return shape.n_params - shape.params["embedding"] - shape.params["position"]

"""Per-rank training memory and communication bytes of data-parallel training over N ranks: ddp and fsdp.

ddp: DistributedDataParallel (gradient_as_bucket_view: grads live in the all-reduce buckets) keeps fp32
weights, grads and optimizer state whole on every rank, and autocast saves a compute-dtype copy of every
matmul weight for backward. fsdp: FSDP2 `fully_shard` on every block and at the root (embeddings, final norm,
LM head), mixed precision: each rank keeps ceil(rows / N) dim-0 rows of every fp32 parameter, its grads and
optimizer state; parameters are all-gathered in the compute dtype, grads reduce-scattered in the reduce dtype.
Formulas and a worked gpt2-xl example: docs/COSTS.md ("Sharding").
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch.nn as nn

from gptlab.costs.memory import activation_bytes, autocast_copy_bytes
from gptlab.costs.structure import Contract, ModelShape, describe, matmul_weights, param_weights
from gptlab.errors import ConfigError

STRATEGIES = ("ddp", "fsdp")


@dataclass(frozen=True)
class Sharding:
    """How one optimizer step is spread over ranks; reduce_bytes is fsdp's reduce-scatter dtype (ddp reduces fp32)."""

    strategy: str
    world_size: int
    reshard_after_forward: bool = True  # fsdp blocks: free the gathered params after forward, gather again in backward
    reduce_bytes: int = 4
    cpu_offload: bool = False  # fsdp: sharded params, grads and optimizer state live in (pinned) host memory

    def __post_init__(self):
        if self.strategy not in STRATEGIES:
            raise ConfigError(f"strategy={self.strategy}: not allowed; allowed: {', '.join(STRATEGIES)}")
        n = self.world_size
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigError(f"world_size={n!r}: expected a positive integer (ranks)")
        if self.cpu_offload and self.strategy != "fsdp":
            raise ConfigError(f"hardware.cpu_offload=true needs strategy=fsdp (here {self.strategy}); allowed: false")


@dataclass(frozen=True)
class ParamLayout:
    """Every parameter tensor as (dim-0 rows, elements per row, layers it stands for, inside a block)."""

    tensors: tuple[tuple[int, int, int, bool], ...]
    largest_block: int  # parameters of the largest transformer block: one FSDP2 unit
    matmul_weights: int  # elements of the nn.Linear weights (a tied LM head once): what autocast casts and saves

    @property
    def total(self) -> int:
        return sum(rows * row * layers for rows, row, layers, _ in self.tensors)

    @property
    def root(self) -> int:
        """Parameters outside every block (embeddings, final norm, untied LM head): the FSDP2 root unit."""
        return sum(rows * row * layers for rows, row, layers, inside in self.tensors if not inside)

    def sharded(self, n: int, blocks_only: bool = False) -> int:
        """Elements one rank keeps: ceil(rows / n) dim-0 rows of each tensor (FSDP2 pads dim 0 to a multiple of n)."""
        return sum(
            -(-rows // n) * row * layers for rows, row, layers, inside in self.tensors if inside or not blocks_only
        )


def param_layout(model: Contract) -> ParamLayout:
    """The ParamLayout of a GPT (a cost-model skeleton's blocks count once per layer they stand for)."""
    weights = param_weights(model)
    inside = {id(p) for block in model.blocks for p in block.parameters()}
    tensors = tuple(
        (p.shape[0] if p.dim() else 1, math.prod(p.shape[1:]), weights[id(p)], id(p) in inside)
        for p in model.parameters()
    )
    return ParamLayout(
        tensors=tensors,
        largest_block=max((sum(p.numel() for p in b.parameters()) for b in model.blocks), default=0),
        matmul_weights=matmul_weights(model),
    )


def _unsharded(layout: ParamLayout, sh: Sharding, s: int) -> float:
    """fsdp's transient peak: gathered params in the compute dtype (s), unsharded grads and the reduce-scatter input.

    The root stays gathered from forward to the end of backward (FSDP2 never reshards the root after forward) and
    its grads accumulate from the LM head's backward on; in a block's backward that block and the one FSDP2
    prefetches are gathered (every block, with reshard_after_forward=false), and the block's grads exist in s and
    as the reduce-scatter's input in the reduce dtype. At the end the root's own grads are reduce-scattered.
    """
    root, block, r = layout.root, layout.largest_block, sh.reduce_bytes
    blocks = layout.total - root
    gathered = min(2 * block, blocks) if sh.reshard_after_forward else blocks
    during_blocks = s * (root + gathered) + s * root + (s + r) * block
    return max(during_blocks, (2 * s + r) * root)


def memory_per_rank(
    layout: ParamLayout,
    sh: Sharding,
    activations: float,
    *,
    compute_bytes: int,
    state_bytes_per_param: float,
    param_bytes: int = 4,
) -> dict:
    """Bytes one rank's device holds at its peak: weights, grads, optimizer state, compute copies, activations.

    gptlab runs fsdp on one rank unwrapped (gptlab.runtime.distributed.shard), so fsdp at N=1 costs what ddp at N=1 does.
    With cpu_offload the sharded weights, grads and state are `host_bytes`, outside the device's total.
    """
    ddp = sh.strategy == "ddp" or sh.world_size == 1
    kept = layout.total if ddp else layout.sharded(sh.world_size)
    state = (2 * param_bytes + state_bytes_per_param) * kept
    on_device = 0 if sh.cpu_offload and not ddp else 1
    rows = {
        "params_bytes": on_device * param_bytes * kept,
        "grads_bytes": on_device * param_bytes * kept,
        "optimizer_bytes": on_device * state_bytes_per_param * kept,
        "autocast_copy_bytes": autocast_copy_bytes(layout.matmul_weights, compute_bytes, param_bytes) if ddp else 0,
        "unsharded_bytes": 0 if ddp else _unsharded(layout, sh, compute_bytes),
        "activations_bytes": activations,
    }
    return {**rows, "total_bytes": sum(rows.values()), "params_per_rank": kept, "host_bytes": (1 - on_device) * state}


def communication(
    layout: ParamLayout, sh: Sharding, *, compute_bytes: int, grad_accum: int, param_bytes: int = 4
) -> list[dict]:
    """Bytes one rank sends per optimizer step, per collective (ring algorithms; receives are the same)."""
    n, s, r = sh.world_size, compute_bytes, sh.reduce_bytes
    if sh.strategy == "ddp":  # the loop's no_sync: one all-reduce per step, on the last micro-step
        sent = 2 * (n - 1) / n * param_bytes * layout.total
        return [_collective("all-reduce grads", f"2·(N-1)/N · {param_bytes}·P", sent, 1, param_bytes)]
    sharded, blocks = layout.sharded(n), layout.sharded(n, blocks_only=True)
    # backward gathers the blocks again (the root is never resharded after forward), unless they were kept
    regather = (
        (f"(N-1) · {s}·Ps_blocks", (n - 1) * s * blocks) if sh.reshard_after_forward else ("0 (kept gathered)", 0)
    )
    return [
        _collective("all-gather params (forward)", f"(N-1) · {s}·Ps", (n - 1) * s * sharded, grad_accum, s),
        _collective("all-gather params (backward)", *regather, grad_accum, s),
        _collective("reduce-scatter grads", f"(N-1) · {r}·Ps", (n - 1) * r * sharded, grad_accum, r),
    ]


def _collective(name: str, formula: str, nbytes: float, calls: int, dtype_bytes: int) -> dict:
    return {
        "name": name,
        "formula": formula,
        "dtype_bytes": dtype_bytes,
        "bytes_per_call": nbytes,
        "calls_per_step": calls,
        "bytes_per_step": nbytes * calls,
    }


def world_sizes(batch_size: int, grad_accum: int) -> list[int]:
    """The world sizes training accepts for this batch: N with batch_size divisible by grad_accum·N."""
    return [n for n in range(1, batch_size // grad_accum + 1) if batch_size % (grad_accum * n) == 0]


def micro_batch(batch_size: int, grad_accum: int, world_size: int) -> int:
    """Sequences per rank and micro-step, refused (one line) where training would refuse the split."""
    if batch_size % (grad_accum * world_size):
        raise ConfigError(
            f"batch_size={batch_size} must be divisible by train.grad_accum x world_size = "
            f"{grad_accum} x {world_size}; allowed: a multiple of {grad_accum * world_size}"
        )
    return batch_size // (grad_accum * world_size)


def _activations(m: ModelShape, micro: int, seq: int, s: int, checkpointing: bool) -> float:
    """The single-device activation estimate (CostReport.memory['activations_bytes']) at one rank's micro-batch."""
    materialized = any(b.attn.traits.materializes_scores for b in m.blocks)
    return activation_bytes(m, micro, seq, s, materialized, checkpointing)


def _param_counts(layout, world_size: int) -> dict:
    """per_rank's parameter counts: the whole model, its root and largest block, and one rank's sharded share."""
    return {
        "total": layout.total,
        "root": layout.root,
        "largest_block": layout.largest_block,
        "matmul_weights": layout.matmul_weights,
        "sharded": layout.sharded(world_size),
        "sharded_blocks": layout.sharded(world_size, blocks_only=True),
    }


def per_rank(
    model: nn.Module,
    sh: Sharding,
    *,
    batch_size: int,
    grad_accum: int,
    seq_len: int,
    compute_bytes: int,
    state_bytes_per_param: float,
    activation_checkpointing: bool = False,
    device: dict | None = None,
    param_bytes: int = 4,
) -> dict:
    """Per-rank memory, the verdict against `device` and the smallest N that fits, and the bytes sent per step.

    `device`: {"name", "memory_bytes", "shared_by_ranks" (ranks on one host share it), "link_bandwidth"} or None.
    """
    layout, shape = param_layout(model), describe(model)

    def memory(n: int) -> dict:
        one = Sharding(sh.strategy, n, sh.reshard_after_forward, sh.reduce_bytes, sh.cpu_offload)
        acts = _activations(
            shape, micro_batch(batch_size, grad_accum, n), seq_len, compute_bytes, activation_checkpointing
        )
        return memory_per_rank(
            layout,
            one,
            acts,
            compute_bytes=compute_bytes,
            state_bytes_per_param=state_bytes_per_param,
            param_bytes=param_bytes,
        )

    mem = memory(sh.world_size)
    comm = communication(layout, sh, compute_bytes=compute_bytes, grad_accum=grad_accum, param_bytes=param_bytes)
    sent = sum(c["bytes_per_step"] for c in comm)
    link = (device or {}).get("link_bandwidth")
    return {
        **asdict(sh),
        "batch_size": batch_size,
        "grad_accum": grad_accum,
        "seq_len": seq_len,
        "micro_batch": micro_batch(batch_size, grad_accum, sh.world_size),
        "compute_bytes": compute_bytes,
        "param_bytes": param_bytes,
        "state_bytes_per_param": state_bytes_per_param,
        "params": _param_counts(layout, sh.world_size),
        "memory": mem,
        "device": _verdict(device, mem, sh.world_size, memory, batch_size, grad_accum),
        "communication": {
            "collectives": comm,
            "bytes_per_step": sent,
            "link_bandwidth": link,
            "time_s": sent / link if link else None,
        },
    }


def _verdict(device: dict | None, mem: dict, n: int, memory, batch_size: int, grad_accum: int) -> dict | None:
    """Fits or not at N, and the smallest N training accepts (N | batch_size/grad_accum) whose ranks fit."""
    if device is None or device.get("memory_bytes") is None:
        return device

    def need(ranks: int, total: float) -> float:  # ranks sharing one host's memory add up
        return total * (ranks if device.get("shared_by_ranks") else 1)

    tried = world_sizes(batch_size, grad_accum)
    smallest = next((k for k in tried if need(k, memory(k)["total_bytes"]) <= device["memory_bytes"]), None)
    return {
        **device,
        "need_bytes": need(n, mem["total_bytes"]),
        "fits": need(n, mem["total_bytes"]) <= device["memory_bytes"],
        "smallest_world_size": smallest,
        "world_sizes_tried": tried,
    }

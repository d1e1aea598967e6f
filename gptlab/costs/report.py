"""analyze(): params, FLOPs, bytes, intensity, KV cache, memory and a roofline verdict for one GPT."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch.nn as nn

from gptlab.costs.accounting import Accounting, intensity
from gptlab.costs.memory import activation_bytes, autocast_copy_bytes, kv_cache
from gptlab.costs.ops import Op, Shape, block_ops, forward_ops, loss_op, optimizer_op
from gptlab.costs.sharding import micro_batch
from gptlab.costs.structure import Contract, ModelShape, block_shape, describe, non_embedding_params
from gptlab.errors import ConfigError

MODES = ("train", "prefill", "decode")
# Placeholder roofline when no hardware profile is given (about this project's 2-core AMX CPU in bf16).
DEFAULT_PEAK_FLOPS = 2.0e12
DEFAULT_MEM_BANDWIDTH = 2.0e10
_DTYPE_BYTES = {
    "fp32": 4,
    "float32": 4,
    "float": 4,
    "bf16": 2,
    "bfloat16": 2,
    "fp16": 2,
    "float16": 2,
    "half": 2,
    "fp8": 1,
    "float8": 1,
}


def element_bytes(dtype) -> int:
    """Bytes per element of a dtype given as int, torch.dtype or name (fp32, bf16, fp16, ...)."""
    if isinstance(dtype, int):
        return dtype
    if hasattr(dtype, "itemsize"):
        return int(dtype.itemsize)
    name = str(dtype).replace("torch.", "").lower()
    if name not in _DTYPE_BYTES:
        raise ConfigError(f"dtype: unknown dtype '{dtype}'; allowed: {', '.join(_DTYPE_BYTES)}")
    return _DTYPE_BYTES[name]


def _shape(model_or_shape) -> ModelShape:
    return model_or_shape if isinstance(model_or_shape, ModelShape) else describe(model_or_shape)


def _matmul(ops: list[Op], key: str) -> float:
    return sum(getattr(op, key) for op in ops if op.kind == "matmul")


def train_flops_per_token(model: nn.Module | ModelShape, seq_len: int, accounting: Accounting = Accounting()) -> float:
    """Useful training FLOPs per token, the MFU numerator: 3 × forward matmul FLOPs (backward = 2× forward).

    Forward matmul FLOPs per token = 2·Σ(d_in·d_out) over every nn.Linear applied per token (attention
    and MLP projections and the LM head; embedding lookups cost none) + per layer 4·n_head·head_dim·c̄,
    c̄ = (1/T)·Σ_{t=1..T} min(t, window): the mean number of keys a query really sees (causal- and
    window-aware; GQA shrinks only the K/V projection). Norms, softmax, activations and the optimizer
    are excluded, and so are masked scores a kernel computes anyway and fused-kernel recomputation.
    `accounting.blocks_only` drops the LM head; the other switches move bytes only.
    """
    ops = forward_ops(_shape(model), Shape(batch=1, tq=seq_len, tk=seq_len, s=2), accounting)
    return 3.0 * _matmul(ops, "flops_useful") / seq_len


def _step_cost(op: Op, mode: str, fused: bool, checkpointing: bool) -> tuple[float, float]:
    """(FLOPs, bytes) of this op in one step of `mode`: forward only, or forward + backward (+ recompute)."""
    nbytes = op.bytes_fused if fused else op.bytes_naive
    if mode != "train":
        return op.flops, nbytes
    passes = 1 + int(checkpointing and op.in_block)  # checkpointing runs block forwards twice
    flops = op.flops * (passes + op.backward_factor)
    return flops, nbytes * (passes + 2 * int(op.in_backward))


@dataclass
class CostReport:
    """The cost model's answer for one (model, batch, sequence, mode, hardware) question."""

    mode: str
    batch_size: int
    seq_len: int
    tokens: int
    dtype_bytes: int
    attention_path: str  # "materialized" | "fused": which bytes model the model's own kernel follows
    params: dict
    flops: dict
    bytes: dict
    kv_cache: dict
    weights: dict
    memory: dict
    hardware: dict
    time: dict
    bound: str
    ops: list[dict] = field(default_factory=list)
    intensity: dict = field(default_factory=dict)  # forward FLOP/byte, whole and per op class (accounting.intensity)
    accounting: dict = field(default_factory=dict)  # the conventions counted with (accounting.Accounting)
    sharding: dict | None = None  # per-rank memory and communication over N ranks (sharding.per_rank), when asked
    documents: dict | None = None  # data.doc_mask: attention FLOPs with the document mask (costs.documents), when set

    def to_dict(self) -> dict:
        """The JSON contract (gptlab-flops --json, docs/COSTS.md): nested dicts plus the per-op list."""
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def _op_rows(ops: list[Op], mode: str, fused: bool, ckpt: bool, peak: float, bw: float, tokens: int) -> list[dict]:
    rows = []
    for op in ops:
        step_flops, step_bytes = _step_cost(op, mode, fused, ckpt)
        nbytes = op.bytes_fused if fused else op.bytes_naive
        t_compute, t_memory = step_flops / peak, step_bytes / bw
        rows.append(
            {
                "name": op.name,
                "kind": op.kind,
                "group": op.group,
                "layers": op.layers,
                "flops": op.flops,
                "flops_dense": op.flops_dense,
                "flops_useful": op.flops_useful,
                "flops_per_token": op.flops / tokens,
                "flops_step": step_flops,
                "bytes_naive": op.bytes_naive,
                "bytes_fused": op.bytes_fused,
                "bytes_step": step_bytes,
                "intensity": op.flops / nbytes if nbytes else None,
                "intensity_naive": op.flops / op.bytes_naive if op.bytes_naive else None,
                "intensity_fused": op.flops / op.bytes_fused if op.bytes_fused else None,
                "time_lower_bound_s": max(t_compute, t_memory),
                "bound": "compute" if t_compute >= t_memory else "memory",
            }
        )
    return rows


def _check(mode: str, batch_size: int, seq_len: int, grad_accum: int = 1) -> None:
    if mode not in MODES:
        raise ConfigError(f"mode: '{mode}' is not allowed; allowed: {', '.join(MODES)}")
    for key, value in (("batch_size", batch_size), ("seq_len", seq_len), ("train.grad_accum", grad_accum)):
        if not isinstance(value, int) or value < 1:
            raise ConfigError(f"{key}={value!r} must be a positive integer")


def _memory(
    m: ModelShape,
    batch: int,
    seq: int,
    s: int,
    materialized: bool,
    checkpointing: bool,
    param_bytes: int,
    state_bytes: float,
) -> dict:
    """Training memory: weights, grads, optimizer state, autocast's compute-dtype weight copies (`s` bytes each when
    narrower than `param_bytes`) and saved activations (all three attention/ckpt cases) of one `batch`-sequence
    micro-batch: what costs.sharding.memory_per_rank holds at N=1."""
    acts = {
        f"activations_{k}_bytes": activation_bytes(m, batch, seq, s, mat, ck)
        for k, mat, ck in (("naive", True, False), ("fused", False, False), ("checkpointed", materialized, True))
    }
    act = (
        acts["activations_checkpointed_bytes"]
        if checkpointing
        else (acts["activations_naive_bytes"] if materialized else acts["activations_fused_bytes"])
    )
    held = {
        "weights_bytes": param_bytes * m.n_params,
        "grads_bytes": param_bytes * m.n_params,
        "optimizer_bytes": state_bytes * m.n_params,
        "autocast_copy_bytes": autocast_copy_bytes(m.matmul_weights, s, param_bytes),
    }
    return {
        **held,
        **acts,
        "activations_bytes": act,
        "train_estimate_bytes": sum(held.values()) + act,
        "micro_batch": batch,
    }


def _flops(
    ops: list, rows: list[dict], m: ModelShape, x: Shape, batch_size: int, seq_len: int, acc: Accounting
) -> dict:
    """CostReport.flops: useful, kernel and dense matmul FLOPs of the forward, training per token, attention's share."""
    fwd_useful, per_token_train = _matmul(ops, "flops_useful"), train_flops_per_token(m, seq_len, acc)
    attn = [op for op in ops if op.name in ("attn.scores", "attn.av")]
    return {
        "forward_per_token": fwd_useful / x.tokens,
        "forward_total": fwd_useful,
        "train_per_token": per_token_train,
        "train_total": per_token_train * batch_size * seq_len,
        "forward_total_kernel": _matmul(ops, "flops"),
        "forward_total_dense": _matmul(ops, "flops_dense"),
        "attention_kernel": sum(op.flops for op in attn),
        "attention_useful": sum(op.flops_useful for op in attn),
        "elementwise_total": sum(op.flops for op in ops if op.kind != "matmul"),
        "step_total_kernel": sum(r["flops_step"] for r in rows),
    }


def analyze(
    model: nn.Module | ModelShape,
    batch_size: int,
    seq_len: int,
    mode: str = "train",
    dtype_bytes: int | str = 2,
    peak_flops: float | None = None,
    mem_bandwidth: float | None = None,
    optimizer_state_bytes_per_param: float = 8,
    activation_checkpointing: bool = False,
    param_bytes: int = 4,
    accounting: Accounting | None = None,
    kv_quant: str | None = None,
    grad_accum: int = 1,
) -> CostReport:
    """Cost of one step of `mode` on batch_size sequences of seq_len tokens (decode: 1 new token each).

    Activations and the KV cache are in `dtype_bytes` per element; training keeps `param_bytes` weights
    and grads plus `optimizer_state_bytes_per_param`. Backward is modelled as 2× forward bytes.
    `accounting` picks the conventions (mask pass, element-wise fusion, blocks only); None = the default.
    `kv_quant` ("int8" or None) sizes the KV cache as gptlab.infer.cache stores it. In train mode `grad_accum`
    splits the batch as training does: activations are sized on one micro-batch (costs.sharding.micro_batch, as
    training's own memory check), the FLOP totals on the whole batch; other modes run the batch in one piece.
    The inference estimate is the weights plus the KV cache as gptlab.infer.cache holds it (windowed layers keep
    only their window: kv_cache's total_bytes_windowed).
    """
    _check(mode, batch_size, seq_len, grad_accum)
    acc = accounting or Accounting()
    s = element_bytes(dtype_bytes)
    m = _shape(model)
    peak = float(peak_flops or DEFAULT_PEAK_FLOPS)
    bw = float(mem_bandwidth or DEFAULT_MEM_BANDWIDTH)
    x = Shape(batch=batch_size, tq=1 if mode == "decode" else seq_len, tk=seq_len, s=s)
    ops = _step_ops(m, x, mode, acc, param_bytes, optimizer_state_bytes_per_param)
    materialized = any(b.attn.traits.materializes_scores for b in m.blocks)
    rows = _op_rows(ops, mode, not materialized, activation_checkpointing, peak, bw, x.tokens)
    flops = _flops(ops, rows, m, x, batch_size, seq_len, acc)
    micro = micro_batch(batch_size, grad_accum, 1) if mode == "train" else batch_size
    memory = _memory(
        m, micro, seq_len, s, materialized, activation_checkpointing, param_bytes, optimizer_state_bytes_per_param
    )
    kv = {**kv_cache(m, batch_size, seq_len, s, kv_quant), "quant": kv_quant}
    return CostReport(
        mode=mode,
        batch_size=batch_size,
        seq_len=seq_len,
        tokens=x.tokens,
        dtype_bytes=s,
        attention_path="materialized" if materialized else "fused",
        params={"total": m.n_params, "non_embedding": non_embedding_params(m), "per_component": dict(m.params)},
        flops=flops,
        bytes=_traffic(ops, rows),
        kv_cache=kv,
        weights={"bytes": s * m.n_params, "train_bytes": param_bytes * m.n_params},
        memory={**memory, "inference_estimate_bytes": s * m.n_params + kv["total_bytes_windowed"]},
        ops=rows,
        intensity=intensity(ops, not materialized, peak / bw),
        accounting=asdict(acc),
        **_roofline(rows, peak, bw, assumed=peak_flops is None or mem_bandwidth is None),
    )


def _step_ops(m: ModelShape, x: Shape, mode: str, acc: Accounting, param_bytes: int, state_bytes: float) -> list[Op]:
    """The step's ops: the forward's, plus in train mode (unless the accounting counts blocks only) the loss and the
    optimizer update."""
    ops = forward_ops(m, x, acc)
    if mode == "train" and not acc.blocks_only:
        ops += [loss_op(m, x.tokens, x.s), optimizer_op(m.n_params, param_bytes, state_bytes)]
    return ops


def _traffic(ops: list, rows: list[dict]) -> dict:
    """CostReport.bytes: the forward's traffic unfused vs fused (their difference is the score matrix's) and the step's."""
    naive, fused = sum(op.bytes_naive for op in ops), sum(op.bytes_fused for op in ops)
    return {
        "naive_total": naive,
        "fused_total": fused,
        "score_matrix_traffic": naive - fused,
        "step_total": sum(r["bytes_step"] for r in rows),
    }


def _roofline(rows: list[dict], peak: float, bw: float, assumed: bool) -> dict:
    """CostReport's hardware, time and bound: the step's FLOPs over the peak vs its bytes over the bandwidth."""
    compute_s = sum(r["flops_step"] for r in rows) / peak
    memory_s = sum(r["bytes_step"] for r in rows) / bw
    return {
        "hardware": {"peak_flops": peak, "mem_bandwidth": bw, "ridge_point": peak / bw, "assumed": assumed},
        "time": {
            "lower_bound_s": sum(r["time_lower_bound_s"] for r in rows),
            "compute_s": compute_s,
            "memory_s": memory_s,
        },
        "bound": "compute" if compute_s >= memory_s else "memory",
    }


def layer_times(model: Contract, report: CostReport | dict, checkpointing: bool = False) -> list[float]:
    """Step time lower bound of each block (by index) under the report's shape, mode, roofs, dtype and accounting."""
    d = report if isinstance(report, dict) else report.to_dict()
    given = d.get("accounting") or {}
    acc = Accounting(**{**given, "unfused": tuple(given.get("unfused", Accounting().unfused))})
    m, mode = describe(model), d["mode"]
    x = Shape(batch=d["batch_size"], tq=1 if mode == "decode" else d["seq_len"], tk=d["seq_len"], s=d["dtype_bytes"])
    peak, bw, fused = d["hardware"]["peak_flops"], d["hardware"]["mem_bandwidth"], d["attention_path"] == "fused"
    bias, out = bool(model.position.has_score_bias), []
    for block in model.blocks:
        costs = [
            _step_cost(op, mode, fused, checkpointing)
            for op in block_ops(block_shape(block, m.d_model, bias), m, x, acc)
        ]
        out.append(sum(max(f / peak, b / bw) for f, b in costs))
    return out

"""Memory estimates: saved activations for backward (naive vs fused attention, checkpointing), KV cache."""

from __future__ import annotations

from pathlib import Path

import torch

from gptlab.costs.scores import dense_pairs
from gptlab.costs.structure import BlockShape, ModelShape, param_weights
from gptlab.errors import ConfigError


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


def activation_bytes(
    m: ModelShape, batch: int, seq: int, s: int, materialized: bool, checkpointing: bool = False
) -> float:
    """Saved activations of one training micro-batch; checkpointing keeps only block inputs plus one block."""
    layers = [(_layer_bytes(b, m.position_rotates, batch, seq, s, materialized), c) for b, c in m.layers()]
    tokens = batch * seq
    # embedding output, final-norm input and LM-head input (d each) + what the loss keeps (gptlab.model.gpt):
    # fp32 logits go through torch's cross-entropy, which keeps an fp32 log-softmax beside them (4 + 4 bytes per
    # logit); bf16/fp16 logits go through the chunked loss, which keeps the logits alone (s bytes per logit) and one
    # fp32 log-sum-exp per token, its fp32 upcast one chunk at a time (not counted: <= 256 MiB, freed per chunk)
    outside = tokens * (3 * s * m.d_model + (m.vocab_size * (s + 4) if s >= 4 else m.vocab_size * s + 4))
    if checkpointing:
        return outside + m.n_layer * tokens * s * m.d_model + max((b for b, _ in layers), default=0)
    return outside + sum(b * c for b, c in layers)


def autocast_copy_bytes(matmul_weights: int, compute_bytes: int, param_bytes: int = 4) -> int:
    """autocast's compute-dtype copy of every matmul weight, held from its cast in forward to backward (autocast's
    weight cache, autograd's saved inputs): compute_bytes per element when the compute dtype is narrower than the
    parameters (bf16/fp16 over fp32), 0 where the weights are used as they are (fp32)."""
    return compute_bytes * matmul_weights if compute_bytes < param_bytes else 0


def kv_cache(m: ModelShape, batch: int, seq: int, s: int, quant: str | None = None) -> dict:
    """KV-cache sizes: bytes per token (2·Σ n_kv_head·head_dim·s), for B×T, and with windowed layers capped.

    quant="int8" (gptlab.infer.cache): 1 byte per element plus a 2-byte fp16 scale per (token, head):
    2·Σ n_kv_head·(head_dim + 2) bytes per token.
    """
    if quant not in (None, "int8"):
        raise ConfigError(f"kv_quant={quant}: not allowed; allowed: int8 or null (the activation dtype)")
    per_head = (lambda hd: hd * s) if quant is None else (lambda hd: hd + 2)
    per_layer = [(2 * b.attn.n_kv_head * per_head(b.attn.head_dim), b, c) for b, c in m.layers()]
    per_token = sum(p * c for p, _, c in per_layer)
    windowed = sum(p * c * (seq if b.attn.window is None else min(seq, b.attn.window)) for p, b, c in per_layer)
    return {
        "bytes_per_token": per_token,
        "total_bytes": batch * seq * per_token,
        "total_bytes_windowed": batch * windowed,
    }


def _members(optimizer) -> list:
    """The optimizer plus any member optimizers it steps together (e.g. Muon + AdamW)."""
    return [optimizer, *getattr(optimizer, "optimizers", [])]


def optimizer_state_bytes_per_param(model, optimizer) -> float:
    """Per-element optimizer state bytes / parameter, found by stepping `optimizer` once (meta device is free).

    Sets every gradient to ones, steps, and counts state tensors shaped like their parameter
    (scalar step counters are ignored); a skeleton's block parameters count once per layer they stand for.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.grad = torch.ones_like(p)
    optimizer.step()
    weights = param_weights(model)
    state_bytes = 0
    for opt in _members(optimizer):
        for p, state in opt.state.items():
            state_bytes += weights.get(id(p), 1) * sum(
                t.numel() * t.element_size()
                for t in state.values()
                if isinstance(t, torch.Tensor) and t.shape == p.shape
            )
    for p in params:
        p.grad = None
    return state_bytes / max(1, sum(weights[id(p)] * p.numel() for p in params))


GIB = 2**30


def available_memory(device: str) -> tuple[int, str] | None:
    """(free bytes, where that figure comes from) on `device`: CPU MemAvailable, CUDA mem_get_info; None if unknown."""
    kind = torch.device(device).type
    if kind == "cuda":
        free, _total = torch.cuda.mem_get_info(torch.device(device))
        return int(free), "torch.cuda.mem_get_info"
    if kind != "cpu":
        return None
    try:
        lines = Path("/proc/meminfo").read_text().splitlines()
    except OSError:  # not Linux: nothing to compare with
        return None
    kib = next((line.split()[1] for line in lines if line.startswith("MemAvailable:")), None)
    return (int(kib) * 1024, "MemAvailable") if kib is not None else None


def _gib(nbytes: float) -> str:
    return f"{nbytes / GIB:.3g} GiB"


def check_fits(
    report, device: str, available_bytes: int | None = None, *, label: str = "this run", processes: int = 1
) -> None:
    """One-line ConfigError when the training-memory estimate (x processes sharing the device) exceeds what is free.

    `report` is a CostReport (or its dict), optionally with memory.eval_bytes (the fixed validation set the run
    holds); `available_bytes` defaults to what `device` has free now.
    """
    d = report if isinstance(report, dict) else report.to_dict()
    mem = d["memory"]
    need = (mem["train_estimate_bytes"] + mem.get("eval_bytes", 0)) * processes
    source = "given"
    if available_bytes is None:
        found = available_memory(device)
        if found is None:
            return
        available_bytes, source = found
    if need <= available_bytes:
        return
    each = f" ({processes} processes x {_gib(need // processes)})" if processes > 1 else ""
    copies = f", autocast copies {_gib(mem['autocast_copy_bytes'])}" if mem.get("autocast_copy_bytes") else ""
    copies += f", gathered for compute {_gib(mem['unsharded_bytes'])}" if mem.get("unsharded_bytes") else ""
    held = f", validation set {_gib(mem['eval_bytes'])}" if mem.get("eval_bytes") else ""
    raise ConfigError(
        f"{label} needs ~{_gib(need)}{each} for training at batch {d['batch_size']} x {d['seq_len']} tokens "
        f"(weights+grads {_gib(mem['weights_bytes'] + mem['grads_bytes'])}, optimizer {_gib(mem['optimizer_bytes'])}"
        f"{copies}, activations {_gib(mem['activations_bytes'])}{held}); {_gib(available_bytes)} available on {device} "
        f"({source}); "
        "lower train.batch_size (or raise train.grad_accum) or train.eval_sequences, turn on "
        "hardware.activation_checkpointing, or pick a smaller model"
    )

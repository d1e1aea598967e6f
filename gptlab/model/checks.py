"""Build-time checks of a built model against its data and hardware (gptlab-train and the tests run the same)."""

from __future__ import annotations

import torch

from gptlab.errors import ConfigError
from gptlab.model.attention.kernels import check_impl


def check_model(
    model,
    *,
    vocab_size: int,
    seq_len: int,
    device: str,
    dtype: torch.dtype,
    data_name: str = "data",
    training: bool = True,
    doc_mask: bool = False,
) -> None:
    """One-line ConfigErrors when `model` cannot train on this data/device: vocabulary, sequence length, kernels
    (`doc_mask`: with the data's packed-document masks)."""
    cfg = model.cfg
    if cfg.vocab_size < vocab_size:
        raise ConfigError(
            f"model.vocab_size={cfg.vocab_size} is smaller than the {data_name} tokenizer's vocabulary "
            f"({vocab_size}); set model.vocab_size=null"
        )
    if seq_len > cfg.block_size:
        raise ConfigError(f"data sequences of {seq_len} tokens exceed model.block_size={cfg.block_size}")
    seen = set()
    bias = bool(model.position.has_score_bias)  # the position's score bias reaches every layer's kernel
    for block in model.blocks:
        a = block.attn
        kind = (a.impl, a.window, a.dropout)
        if kind not in seen:  # the kernel probes run once per distinct layer kind
            seen.add(kind)
            check_impl(
                a.impl,
                device=device,
                dtype=dtype,
                window=a.window,
                uses_bias=bias,
                dropout=a.dropout,
                training=training,
                documents=doc_mask,
            )

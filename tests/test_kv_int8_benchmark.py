"""benchmarks/kv_int8.py's measuring function on a tiny untrained model: the figures' structure and real invariants.

The model is untrained with init_std 0.1 (not 0.02: at 0.02 the logits are so flat that even a K/V scaled 2x moves
the NLL by only 0.003 nats). The int8-vs-bf16 NLL bound, 5e-3 nats, is loose on purpose: int8 rounds each K/V
entry by at most half a step, absmax/254 of its (token, head) vector (~0.4 %), the same order as bf16's own rounding
(2^-9 relative), and here the two caches' NLLs differ by ~6e-4 nats (bf16 vs fp32: ~3e-4), so the bound is ~10x
the measured gap; a dequantisation off by 1.5x moves the NLL by 0.015 nats (checked by hand) and fails it.
"""

from __future__ import annotations

import math

import pytest
import torch

from benchmarks.kv_int8 import KINDS, cache_bytes, measure, teacher_forced
from gptlab.config.build import build_model, compose

VOCAB = 65
SMALL = [
    "model.n_layer=2",
    "model.d_model=64",
    "model.n_head=4",
    "model.block_size=64",
    "model.init_std=0.1",
    "hardware.dtype=fp32",
]


def tiny(*overrides: str):
    torch.manual_seed(0)
    return build_model(compose([*SMALL, *overrides]), vocab_size=VOCAB, device="cpu").eval()


@pytest.fixture(scope="module")
def figures():
    gen = torch.Generator().manual_seed(0)
    seq = torch.randint(0, VOCAB, (10, 33), generator=gen)
    x, y = seq[:6, :32], seq[:6, 1:]
    prompts = seq[6:, :24]
    return tiny(), measure(tiny(), x, y, prompts, new_tokens=16)


def test_structure(figures):
    _, doc = figures
    assert set(doc["kinds"]) == set(KINDS)
    assert (doc["sequences"], doc["seq_len"], doc["prompts"], doc["prompt_len"], doc["new_tokens"]) == (
        6,
        32,
        4,
        24,
        16,
    )
    for fig in doc["kinds"].values():
        assert set(fig["nll_per_sequence"]) == {"mean", "std", "min", "max"}
        for ref in ("bf16", "fp32"):
            assert 0.0 <= fig[f"argmax_vs_{ref}"]["min"] <= fig[f"argmax_vs_{ref}"]["share"] <= 1.0
            for part in ("before_divergence", "overall"):
                g = fig[f"greedy_vs_{ref}"][part]
                assert 0.0 <= g["min"] <= g["mean"] <= g["max"] <= 1.0
            # identical before the first divergence is a subset of identical overall
            assert fig[f"greedy_vs_{ref}"]["before_divergence"]["mean"] <= fig[f"greedy_vs_{ref}"]["overall"]["mean"]


def test_invariants(figures):
    _, doc = figures
    kinds = doc["kinds"]
    for ref in ("bf16", "fp32"):
        assert kinds[ref][f"argmax_vs_{ref}"] == {"share": 1.0, "min": 1.0, "max": 1.0}
        assert kinds[ref][f"greedy_vs_{ref}"]["before_divergence"]["min"] == 1.0
    for fig in kinds.values():
        assert math.isfinite(fig["nll"]) and fig["nll"] > 0
    # token by token through an fp32 cache = one full-context forward (the measuring path is exact)
    assert kinds["fp32"]["nll"] == pytest.approx(doc["fp32_full_context_nll"], abs=1e-5)
    assert abs(kinds["int8"]["nll"] - kinds["bf16"]["nll"]) < 5e-3  # the bound of the module docstring
    assert abs(kinds["int8_fp32"]["nll"] - kinds["fp32"]["nll"]) < 5e-3


def test_bytes_exact(figures):
    model, doc = figures
    b = doc["bytes"]
    hd = model.blocks[0].attn.head_dim
    assert hd == 16
    assert b["ratio"] == b["ratio_expected"] == (hd + 2) / (2 * hd)  # 18/32: head_dim int8 + fp16 scale vs bf16
    assert (b["bf16_bytes"], b["int8_bytes"]) == (b["bf16_bytes_expected"], b["int8_bytes_expected"])
    assert b["bf16_bytes"] == 2 * 2 * 6 * 4 * 32 * hd * 2  # layers, K+V, B, heads, max_len, head_dim, bf16


def test_sliding_ring_bytes():
    model = tiny("attention=sliding", "attention.window=16")
    b = cache_bytes(model, batch=3, max_len=64)
    assert b["cache_types"] == ["RingCache"]
    assert b["bf16_bytes"] == 2 * 2 * 3 * 4 * 16 * 16 * 2  # the window's 16 positions, not max_len
    assert b["ratio"] == b["ratio_expected"] == 18 / 32


def test_bf16_pass_is_deterministic():
    model = tiny().to(torch.bfloat16)
    x = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(1))
    for quant in (None, "int8"):
        assert torch.equal(teacher_forced(model, x, quant), teacher_forced(model, x, quant))

"""Static, ring and int8 KV caches: exact against recomputing the full context for every attention x position
choice, in-place writes (no copy of the cache per step), bounded memory for sliding windows, int8's size and cost."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.testing import assert_close

from gptlab.infer.cache import RingCache, StaticCache, cache_nbytes, dequantize, make_caches, quantize
from helpers.model import choices, tiny_model, tokens

WINDOW = ["attention.window=5"]  # shorter than the prompt, so ring buffers wrap during prefill and decoding
CASES = list(itertools.product(choices("attention"), choices("position")))


def model_for(attention: str, position: str):
    extra = WINDOW if attention in ("sliding", "hybrid") else []
    if attention == "hybrid":
        extra = [*extra, "attention.global_every=2"]
    return tiny_model(f"attention={attention}", f"position={position}", "attention.impl=sdpa", *extra)


@torch.no_grad()
def stepwise(model, x: torch.Tensor, prompt: int, caches) -> torch.Tensor:
    """Logits of prefill + one token at a time through `caches`: (B, T, vocab)."""
    steps = [model(x[:, :prompt], caches=caches)[0]]
    steps += [model(x[:, t : t + 1], caches=caches)[0] for t in range(prompt, x.size(1))]
    return torch.cat(steps, dim=1)


@pytest.mark.parametrize("attention,position", CASES, ids=[f"{a}-{p}" for a, p in CASES])
@torch.no_grad()
def test_static_and_ring_caches_match_the_full_forward(attention, position):
    model = model_for(attention, position)
    x = tokens(T=30)
    full, _ = model(x)
    caches = make_caches(model, batch=2, max_len=30)
    if attention in ("sliding", "hybrid"):
        assert any(isinstance(c, RingCache) for c in caches)
    assert_close(stepwise(model, x, 9, caches), full, atol=1e-5, rtol=1e-4)
    start = x[:, :9]
    cached = model.generate(start, max_new_tokens=20, temperature=0, use_cache=True)
    assert torch.equal(cached, model.generate(start, max_new_tokens=20, temperature=0, use_cache=False))


@torch.no_grad()
def test_static_cache_writes_in_place():
    """The cache's storage is allocated once: the same tensors before and after 10 decode steps."""
    model = tiny_model()
    caches = make_caches(model, batch=2, max_len=20)
    before = [(c.k.data.data_ptr(), c.v.data.data_ptr()) for c in caches]
    size = cache_nbytes(caches)
    x = tokens(T=20)
    stepwise(model, x, 10, caches)
    assert [(c.k.data.data_ptr(), c.v.data.data_ptr()) for c in caches] == before
    assert cache_nbytes(caches) == size == 2 * 2 * 2 * 4 * 20 * 8 * 4  # layers, K+V, B, Hkv, max_len, hd, fp32
    assert all(c.length == 20 for c in caches)


@torch.no_grad()
def test_ring_cache_memory_is_bounded_by_the_window():
    model = model_for("sliding", "rope")
    ring = make_caches(model, batch=1, max_len=32)
    static = [StaticCache(1, b.attn.n_kv_head, 32, b.attn.head_dim) for b in model.blocks]
    assert cache_nbytes(ring) * 32 == cache_nbytes(static) * 5  # 5 of 32 positions per layer
    x = tokens(B=1, T=32)
    stepwise(model, x, 3, ring)
    assert cache_nbytes(ring) * 32 == cache_nbytes(static) * 5 and ring[0].length == 32


def test_a_full_ring_writes_only_the_new_positions_slots(monkeypatch):
    """A decode step into a full ring writes one slot per K and V, not all `window` of them (the old cost)."""
    from gptlab.infer import cache as cache_mod

    ring = RingCache(1, 1, 4, 2)
    ring.update(torch.randn(1, 1, 6, 2), torch.randn(1, 1, 6, 2))  # prefill past the window: the ring is full
    writes = []
    real_write = cache_mod._Store.write
    monkeypatch.setattr(
        cache_mod._Store, "write", lambda self, start, x: writes.append(start) or real_write(self, start, x)
    )
    k, v = torch.randn(1, 1, 1, 2), torch.randn(1, 1, 1, 2)
    keys, values, k_start = ring.update(k, v)
    assert writes == [6 % 4, 6 % 4] and k_start == 2  # position 6 goes to slot 2; keys are positions 2..6 (mask: 3..6)
    torch.testing.assert_close(keys[:, :, -1:], k)
    torch.testing.assert_close(ring._ordered(4)[0][:, :, -1:], k)  # the newest held position is the new key


@pytest.mark.parametrize("quant,dtype", [("int8", torch.float32), (None, torch.bfloat16)])
def test_a_ring_returns_what_a_static_cache_returns_for_the_positions_it_holds(quant, dtype):
    """Both caches hand attention the stored K/V, the new positions too. The ring returned the step's own K/V as
    given (unquantised under int8, fp32 in a bf16 cache) where the static cache returns them as stored: the same
    positions read differently by the cache type."""
    ring, static = RingCache(1, 2, 4, 8, dtype=dtype, quant=quant), StaticCache(1, 2, 12, 8, dtype=dtype, quant=quant)
    gen = torch.Generator().manual_seed(0)
    for T in (6, 1, 1, 3):  # prefill past the window, decode steps, a chunk
        k, v = torch.randn(1, 2, T, 8, generator=gen), torch.randn(1, 2, T, 8, generator=gen)
        rk, rv, start = ring.update(k, v)
        sk, sv, _ = static.update(k, v)
        assert rk.dtype == sk.dtype == dtype
        torch.testing.assert_close(rk, sk[:, :, start:], rtol=0, atol=0)
        torch.testing.assert_close(rv, sv[:, :, start:], rtol=0, atol=0)


def test_cache_refuses_to_overflow():
    cache = StaticCache(1, 1, 4, 2)
    cache.update(torch.zeros(1, 1, 3, 2), torch.zeros(1, 1, 3, 2))
    with pytest.raises(ValueError, match="KV cache full: 5 positions > its max_len 4"):
        cache.update(torch.zeros(1, 1, 2, 2), torch.zeros(1, 1, 2, 2))


def test_int8_round_trip_error_is_within_half_a_step():
    x = torch.randn(2, 3, 7, 16) * torch.linspace(0.1, 10, 7)[:, None]  # per-token scales differ
    q, scale = quantize(x)
    assert q.dtype == torch.int8 and scale.shape == (2, 3, 7, 1)
    step = x.abs().amax(-1, keepdim=True) / 127
    assert ((dequantize(q, scale, torch.float32) - x).abs() <= step * 0.5 + 1e-6).all()


@torch.no_grad()
def test_int8_cache_halves_bf16_bytes_and_stays_close():
    model = tiny_model()
    bf16 = make_caches(model, batch=2, max_len=24, dtype=torch.bfloat16)
    int8 = make_caches(model, batch=2, max_len=24, quant="int8")
    hd = model.blocks[0].attn.head_dim
    assert cache_nbytes(int8) / cache_nbytes(bf16) == pytest.approx((hd + 2) / (2 * hd))  # 8 + 2 of 16 bytes
    x = tokens(T=24)
    exact = stepwise(model, x, 8, make_caches(model, batch=2, max_len=24))
    approx = stepwise(model, x, 8, int8)
    assert (approx - exact).abs().max() < 0.05 * exact.std()
    agree = (approx.argmax(-1) == exact.argmax(-1)).float().mean().item()
    assert agree > 0.9, agree


@pytest.mark.parametrize("quant,dtype,s", [(None, torch.float32, 4), (None, torch.bfloat16, 2), ("int8", None, 4)])
def test_cost_model_predicts_the_measured_cache_bytes(quant, dtype, s):
    """gptlab-flops' KV-cache bytes (kv_quant=) equal the bytes the caches' tensors hold, for gqa too."""
    from gptlab.costs.memory import kv_cache
    from gptlab.costs.structure import describe

    model = tiny_model("attention=gqa", "attention.n_kv_head=2")
    caches = make_caches(model, batch=3, max_len=20, dtype=dtype, quant=quant)
    assert cache_nbytes(caches) == kv_cache(describe(model), 3, 20, s, quant)["total_bytes"]

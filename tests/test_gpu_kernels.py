"""Attention kernel paths (issue 12, items 5-6): no masked GQA into SDPA, flex compiled once, block masks prebuilt.

Numerics run for real on this CPU; the CUDA-side choices (flash's GQA domain, compiling flex on CUDA) are
checked with torch.cuda / torch.compile mocked, as each test says.
"""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from gptlab.model.attention import kernels
from helpers.model import tiny_model, tokens

H, HD, TK = 4, 8, 20
# (Tq, q_offset): training (square), one decode step, a chunk of queries after a cache
SHAPES = [(TK, 0), (1, TK - 1), (5, TK - 5)]
CASES = list(itertools.product([4, 2, 1], [None, 6], [False, True], SHAPES))


def _inputs(hkv, tq, bias, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, H, tq, HD, generator=g)
    k, v = (torch.randn(2, hkv, TK, HD, generator=g) for _ in range(2))
    b = torch.randn(H, tq, TK, generator=g) if bias else None
    return q, k, v, b


def _spy(monkeypatch) -> list[dict]:
    """Wrap F.scaled_dot_product_attention; each call records its head counts, mask and enable_gqa."""
    calls, real = [], F.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, **kw):
        calls.append(
            {"hq": q.size(1), "hk": k.size(1), "masked": attn_mask is not None, "gqa": kw.get("enable_gqa", False)}
        )
        return real(q, k, v, attn_mask=attn_mask, **kw)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    return calls


@pytest.mark.parametrize("hkv,window,bias,shape", CASES)
def test_sdpa_and_flex_match_naive(hkv, window, bias, shape, monkeypatch):
    """Every GQA x window x bias x query shape: sdpa and flex equal naive; no masked call asks SDPA for GQA."""
    tq, off = shape
    q, k, v, b = _inputs(hkv, tq, bias)
    ref = kernels.naive(q, k, v, window=window, q_offset=off, bias=b)
    calls = _spy(monkeypatch)
    out = kernels.sdpa(q, k, v, window=window, q_offset=off, bias=b)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    (call,) = calls
    if call["masked"]:
        assert not call["gqa"] and call["hk"] == call["hq"]  # K/V expanded: the efficient kernel can take it
    assert call["masked"] == (window is not None or bias or not (off == 0 or tq == 1))
    torch.testing.assert_close(kernels.flex(q, k, v, window=window, q_offset=off, bias=b), ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("hkv,window,bias", [(2, None, False), (1, 6, False), (2, 6, True)])
def test_sdpa_gradients_match_naive(hkv, window, bias):
    q, k, v, b = _inputs(hkv, TK, bias, seed=1)
    grads = []
    for fn in (kernels.naive, kernels.sdpa):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        fn(*leaves, window=window, bias=b).square().sum().backward()
        grads.append([t.grad for t in leaves])
    for got, ref in zip(grads[1], grads[0]):
        torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)


def _fake_q(device_type, dtype, head_dim=64):
    return SimpleNamespace(
        device=torch.device(device_type, 0) if device_type == "cuda" else torch.device("cpu"),
        dtype=dtype,
        size=lambda dim: head_dim,
    )


@pytest.mark.parametrize(
    "device,dtype,head_dim,major,masked,native",
    [
        ("cuda", torch.bfloat16, 64, 9, False, True),  # flash: takes GQA natively
        ("cuda", torch.bfloat16, 64, 9, True, False),  # a mask rules flash out; efficient has no GQA
        ("cuda", torch.float32, 64, 9, False, False),  # fp32: no flash
        ("cuda", torch.float16, 64, 7, False, False),  # V100: no flash
        ("cuda", torch.bfloat16, 512, 9, False, False),  # head_dim > 256: no flash
        ("cpu", torch.float32, 64, None, False, True),  # the CPU flash kernel takes GQA
        ("cpu", torch.float32, 64, None, True, False),
    ],
)
def test_native_gqa_only_where_flash_runs(monkeypatch, device, dtype, head_dim, major, masked, native):
    """torch.cuda mocked (device properties): enable_gqa is used only where a fused kernel takes it."""
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: SimpleNamespace(major=major))
    assert kernels.native_gqa(_fake_q(device, dtype, head_dim), masked) is native


def test_flex_is_compiled_once_on_cuda(monkeypatch):
    """torch.compile mocked: CUDA training shapes share one flex compiled with dynamic=False; CPU stays eager."""
    from torch.nn.attention.flex_attention import flex_attention

    compiled = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: compiled.append((fn, kw)) or ("compiled", fn))
    monkeypatch.setattr(kernels, "_COMPILED_FLEX", None)
    cuda = torch.device("cuda", 0)
    first = kernels._flex_function(cuda, square=True)
    assert kernels._flex_function(cuda, square=True) is first == ("compiled", flex_attention)
    assert compiled == [(flex_attention, {"dynamic": False})]
    assert kernels._flex_function(cuda, square=False) is flex_attention  # decoding: a new Tk every step
    assert kernels._flex_function(torch.device("cpu"), square=True) is flex_attention


@pytest.mark.parametrize(
    "device, dtype, bias, small",
    [
        ("cuda", torch.bfloat16, False, False),  # plain causal bf16: torch's own tiles ran on the H100
        ("cuda", torch.bfloat16, True, True),  # ALiBi score_mod: the default tiles asked the H100 for 240 KiB
        ("cuda", torch.float32, False, True),  # fp32: twice bf16's tile memory
        ("cpu", torch.float32, True, False),  # the CPU path takes no Triton tiles
    ],
)
def test_flex_passes_small_tiles_where_default_ones_overflow(monkeypatch, device, dtype, bias, small):
    """The CUDA side mocked (the flex function and its block mask; no GPU here): the kernel_options flex is called
    with, per device, dtype and score bias. The H100 figures behind the rule are in docs/GPU.md."""
    seen = {}
    monkeypatch.setattr(kernels, "block_mask", lambda *a: "mask")
    monkeypatch.setattr(kernels, "_flex_function", lambda dev, square: lambda *a, **kw: seen.update(kw))
    q, k, v, b = _inputs(4, TK, bias)
    q = SimpleNamespace(size=q.size, device=torch.device(device), dtype=dtype)
    kernels.flex(q, k, v, bias=b)
    assert seen["kernel_options"] == (kernels.SMALL_TILES if small else None)
    assert seen["kernel_options"] is not kernels.SMALL_TILES  # a copy: torch may add keys to the dict it gets


def test_flex_block_masks_are_built_at_construction_not_in_forward(monkeypatch):
    """The training-shape block mask exists once the model is built; forward only looks it up."""
    model = tiny_model("attention=sliding", "attention.impl=flex", "attention.window=8", "position=alibi")
    windows = {b.attn.window for b in model.blocks}
    assert all((32, 32, 0, w, "cpu") in kernels._BLOCK_MASKS for w in windows)

    def refuse(*args):
        raise AssertionError("block mask built inside forward")

    monkeypatch.setattr(kernels, "_build_block_mask", refuse)
    idx = tokens(T=32)
    with torch.no_grad():  # this CPU torch has no flex backward
        logits, _ = model(idx)
    ref = tiny_model("attention=sliding", "attention.impl=naive", "attention.window=8", "position=alibi")(idx)[0]
    torch.testing.assert_close(logits, ref, atol=1e-4, rtol=1e-4)


def test_flex_model_traces_without_graph_breaks():
    """torch._dynamo.explain over a flex model: one graph, no breaks (no warning filters, no mask building)."""
    model = tiny_model("attention=sliding", "attention.impl=flex", "attention.window=8")
    torch._dynamo.reset()
    with torch.no_grad():
        explained = torch._dynamo.explain(model)(tokens(T=32))
    assert explained.graph_break_count == 0 and explained.graph_count == 1, explained.break_reasons

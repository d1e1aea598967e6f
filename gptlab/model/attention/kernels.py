"""Attention kernels: the same causal (optionally windowed, optionally biased) attention, four ways.

All take q (B, H, Tq, hd), k and v (B, Hkv, Tk, hd) with H % Hkv == 0; query i sits at absolute position
`q_offset + i`, key j at position j. A query sees keys at positions p with
`q_pos - window < p <= q_pos` (window None = all earlier positions). `bias` is an additive
(H, Tq, Tk) score bias (ALiBi) or None. Output: (B, H, Tq, hd).

`docs` (gptlab.model.documents.Documents, training shapes only: Tq == Tk, q_offset 0) packs several documents per
row: a query then also sees only keys of its own document, and `bias` may be (B, H, T, T). naive and sdpa take the
dense (B, 1, T, T) mask (every score is computed, then masked: no work saved); flex a block mask built from the
document ids, which skips every tile that holds no pair of one document.
"""

from __future__ import annotations

import math
import warnings
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from gptlab.errors import ConfigError

if TYPE_CHECKING:
    from gptlab.model.documents import Documents

IMPLS = ("naive", "sdpa", "flash", "flex")


def allowed_mask(tq: int, tk: int, q_offset: int, window: int | None, device) -> torch.Tensor:
    """Boolean (Tq, Tk) mask, True where a query may attend to a key."""
    q_pos = torch.arange(q_offset, q_offset + tq, device=device)[:, None]
    k_pos = torch.arange(tk, device=device)[None, :]
    ok = k_pos <= q_pos
    if window is not None:
        ok = ok & (k_pos > q_pos - window)
    return ok


def naive(q, k, v, *, window=None, q_offset=0, bias=None, dropout_p=0.0, docs: Documents | None = None):
    """Materialised reference: scores = Q·Kᵀ/√d, mask, softmax, ·V (writes the full Tq×Tk matrix)."""
    groups = q.size(1) // k.size(1)
    k = k.repeat_interleave(groups, dim=1)  # (B, H, Tk, hd)
    v = v.repeat_interleave(groups, dim=1)
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.size(-1)))  # (B, H, Tq, Tk)
    if bias is not None:
        scores = scores + bias
    if docs is None:
        mask = allowed_mask(q.size(2), k.size(2), q_offset, window, q.device)
    else:
        mask = docs.allowed(window)  # (B, 1, T, T)
    scores = scores.masked_fill(~mask, float("-inf"))
    probs = F.softmax(scores.float(), dim=-1).to(q.dtype)
    if dropout_p > 0.0:
        probs = F.dropout(probs, p=dropout_p)
    return probs @ v


def expand_kv(k: torch.Tensor, n_head: int) -> torch.Tensor:
    """(B, Hkv, T, hd) -> (B, n_head, T, hd): each K/V head repeated for the query heads of its group."""
    return k if k.size(1) == n_head else k.repeat_interleave(n_head // k.size(1), dim=1)


def native_gqa(q: torch.Tensor, masked: bool) -> bool:
    """Whether SDPA can take fewer K/V heads than query heads (enable_gqa) without its math fallback.

    In torch 2.13 enable_gqa runs fused only on the flash kernels: CUDA flash (fp16/bf16, sm_80+, head_dim <= 256,
    no mask) and the CPU flash kernel. CUDA's memory-efficient kernel, the one that takes a mask (sliding window,
    ALiBi) or fp32, has no GQA, so such a call falls back to math and builds the full (B, H, Tq, Tk) scores.
    Expanding K/V first costs (B, H, Tk, hd) memory instead; one rule for masked calls on every device.
    """
    if masked:
        return False
    if q.device.type == "cpu":
        return True
    if q.device.type != "cuda" or q.dtype not in (torch.float16, torch.bfloat16) or q.size(-1) > 256:
        return False
    return torch.cuda.get_device_properties(q.device).major >= 8  # constant-folded under torch.compile


def _sdpa_mask(tq, tk, q_offset, window, bias, q):
    """None when is_causal or no mask suffices, else a boolean (Tq, Tk) mask or a (1, H, Tq, Tk) float bias."""
    if window is None and bias is None and ((tq == tk and q_offset == 0) or (tq == 1 and q_offset == tk - 1)):
        return None
    mask = allowed_mask(tq, tk, q_offset, window, q.device)
    if bias is not None:
        # (1, H, Tq, Tk) float mask: 4-D keeps CPU SDPA on its fused kernel (3-D falls back to math)
        mask = bias.to(q.dtype).masked_fill(~mask, float("-inf"))[None]
    return mask


def _document_mask(docs: Documents, window, bias, q):
    """The (B, 1, T, T) boolean mask of packed documents, or with a bias (H or B, H, T, T) the (B, H, T, T) float
    mask (-inf where masked)."""
    mask = docs.allowed(window)
    if bias is not None:  # the bias is the forward's one (Documents.cached): so is its masked form, per window
        return docs.cached(("float", window, q.dtype), lambda: bias.to(q.dtype).masked_fill(~mask, float("-inf")))
    return mask


def _sdpa_call(q, k, v, window, q_offset, bias, dropout_p, docs=None):
    tq, tk = q.size(2), k.size(2)
    if docs is None:
        mask = _sdpa_mask(tq, tk, q_offset, window, bias, q)
    else:
        mask = _document_mask(docs, window, bias, q)
    # no mask: plain causal (Tq == Tk), or one decode step that sees the whole cache (keeps flash usable)
    causal = mask is None and tq == tk and q_offset == 0
    gqa = k.size(1) != q.size(1)
    if gqa and not native_gqa(q, masked=mask is not None):
        k, v, gqa = expand_kv(k, q.size(1)), expand_kv(v, q.size(1)), False  # (B, H, Tk, hd)
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, is_causal=causal, dropout_p=dropout_p, enable_gqa=gqa
    )


def sdpa(q, k, v, *, window=None, q_offset=0, bias=None, dropout_p=0.0, docs: Documents | None = None):
    """torch SDPA, letting torch pick the backend; is_causal when no explicit mask is needed."""
    return _sdpa_call(q, k, v, window, q_offset, bias, dropout_p, docs)


def flash(q, k, v, *, window=None, q_offset=0, bias=None, dropout_p=0.0, docs: Documents | None = None):
    """SDPA pinned to the flash backend (build-time checks guarantee it is available; it takes no mask, so no
    `docs`: check_impl refuses data.doc_mask with it)."""
    if docs is not None:
        raise ValueError("attention.impl=flash takes no mask, so no packed documents; use sdpa or flex")
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        return _sdpa_call(q, k, v, window, q_offset, bias, dropout_p)


# Block masks by (Tq, Tk, q_offset, window, device), built eagerly: at model construction for the training shape
# (prepare_flex) or at the first eager call of a new shape, so a compiled forward only looks them up. A shape
# first met inside a compiled region is built in the graph (correct, but redone every call) and not stored.
_BLOCK_MASKS: dict = {}
_MAX_MASKS = 64
_COMPILED_FLEX = None


def _build_block_mask(tq: int, tk: int, q_offset: int, window: int | None, device: str):
    from torch.nn.attention.flex_attention import create_block_mask

    def mask_mod(b, h, qi, kj):
        q_pos = qi + q_offset
        ok = kj <= q_pos
        if window is not None:
            ok = ok & (kj > q_pos - window)
        return ok

    return create_block_mask(mask_mod, None, None, tq, tk, device=device)


def block_mask(tq: int, tk: int, q_offset: int, window: int | None, device):
    """The flex BlockMask of the causal/window rule for this shape: built once per process, then looked up."""
    key = (tq, tk, q_offset, window, str(device))
    mask = _BLOCK_MASKS.get(key)
    if mask is None:
        mask = _build_block_mask(tq, tk, q_offset, window, str(device))
        if not torch.compiler.is_compiling():
            if len(_BLOCK_MASKS) >= _MAX_MASKS:  # generation meets many shapes: drop the oldest
                _BLOCK_MASKS.pop(next(iter(_BLOCK_MASKS)))
            _BLOCK_MASKS[key] = mask
    return mask


def prepare_flex(seq_len: int, window: int | None, device) -> None:
    """Build the (seq_len, seq_len) training block mask now, outside any forward (and any compiled graph)."""
    if torch.device(device).type != "meta":
        block_mask(seq_len, seq_len, 0, window, torch.device(device))


def _flex_function(device: torch.device, square: bool):
    """flex_attention compiled once per process for CUDA training shapes; plain flex_attention otherwise.

    Uncompiled, flex materialises the full score matrix; inside a compiled model it is compiled with the model.
    dynamic=False: training shapes are fixed. Decoding (a new Tk every step) stays eager: recompiling per step
    would cost more than its small (1, Tk) score rows, and the CPU runs flex forward-only, uncompiled.
    """
    global _COMPILED_FLEX
    from torch.nn.attention.flex_attention import flex_attention

    if device.type != "cuda" or not square or torch.compiler.is_compiling():
        return flex_attention
    if _COMPILED_FLEX is None:
        _COMPILED_FLEX = torch.compile(flex_attention, dynamic=False)
    return _COMPILED_FLEX


# Smaller flex tiles on CUDA where torch's default ones overflow shared memory. Seen on an H100 (227 KiB per block;
# torch 2.11, head_dim 64): the bf16 forward with the ALiBi score_mod (a captured (H, T, T) bias) asked for 240 KiB
# ("No valid triton configs ... out of resource"), and fp32 needs twice bf16's tile memory. Forward (M, N) and
# backward (M1, N1, M2, N2) halved, one pipeline stage; with them the fp32 ALiBi forward+backward ran there.
# Everything else keeps torch's own choice (plain causal/window bf16 ran with it).
SMALL_TILES = {
    "BLOCK_M": 64,
    "BLOCK_N": 64,
    "BLOCK_M1": 32,
    "BLOCK_N1": 64,
    "BLOCK_M2": 64,
    "BLOCK_N2": 32,
    "num_stages": 1,
}


def document_block_mask(ids: torch.Tensor, window: int | None):
    """The flex BlockMask of packed documents (B, T) ids: causal (within `window`) and within one document; tiles
    with no pair of one document are skipped."""
    from torch.nn.attention.flex_attention import create_block_mask

    def mask_mod(b, h, qi, kj):
        ok = (kj <= qi) & (ids[b, qi] == ids[b, kj])
        if window is not None:
            ok = ok & (kj > qi - window)
        return ok

    T = ids.size(1)
    return create_block_mask(mask_mod, ids.size(0), None, T, T, device=str(ids.device))


def flex(q, k, v, *, window=None, q_offset=0, bias=None, dropout_p=0.0, docs: Documents | None = None):
    """flex_attention with a block mask built from the causal/window rule (never a dense mask tensor)."""
    tq, tk = q.size(2), k.size(2)
    if docs is None:
        mask = block_mask(tq, tk, q_offset, window, q.device)
    else:  # built once per forward, shared by the layers with this window
        mask = docs.cached(("flex", window), lambda: document_block_mask(docs.ids, window))
    score_mod = None
    if bias is not None and bias.dim() == 4:  # (B, H, T, T): per-row positions (packed documents)

        def score_mod(score, b, h, qi, kj):
            return score + bias[b, h, qi, kj]

    elif bias is not None:

        def score_mod(score, b, h, qi, kj):
            return score + bias[h, qi, kj]

    attend = _flex_function(q.device, square=tq == tk and q_offset == 0)
    small = q.device.type == "cuda" and (q.dtype == torch.float32 or bias is not None)
    options = dict(SMALL_TILES) if small else None
    return attend(q, k, v, score_mod=score_mod, block_mask=mask, enable_gqa=True, kernel_options=options)


KERNELS = {"naive": naive, "sdpa": sdpa, "flash": flash, "flex": flex}


def check_impl_name(impl: str) -> str:
    """The impl name, or a one-line ConfigError listing the allowed ones."""
    if impl not in KERNELS:
        raise ConfigError(f"attention.impl: unknown impl '{impl}'; allowed: {', '.join(IMPLS)}")
    return impl


def check_impl(
    impl: str,
    *,
    device: str,
    dtype: torch.dtype,
    window,
    uses_bias: bool,
    dropout: float,
    training: bool = True,
    documents: bool = False,
) -> None:
    """Fail at build time, in one line, when `impl` cannot run this attention on this device/dtype (`documents`:
    with packed documents' masks, data.doc_mask)."""
    check_impl_name(impl)
    if impl == "flash":
        if window is not None or uses_bias or documents:
            what = (
                "a sliding window"
                if window is not None
                else "an ALiBi score bias"
                if uses_bias
                else "the document mask of data.doc_mask=true"
            )
            raise ConfigError(
                f"attention.impl=flash: the flash backend takes no mask, so it cannot run {what}; use attention.impl=flex or sdpa"
            )
        if not flash_available(device, dtype):
            raise ConfigError(
                f"attention.impl=flash: the flash SDPA backend is not available on {device}/{str(dtype).replace('torch.', '')}; use attention.impl=sdpa"
            )
    if impl == "flex" and dropout > 0:
        raise ConfigError(
            "attention.impl=flex: flex_attention has no attention dropout; set attention.dropout=0 or use impl=sdpa"
        )
    if impl == "flex" and training and not flex_trainable(device, dtype):
        raise ConfigError(
            f"attention.impl=flex: this torch has no flex_attention backward on {device}; train with attention.impl=sdpa (flex runs forward-only here)"
        )


def flash_available(device: str, dtype: torch.dtype) -> bool:
    """Run a tiny causal SDPA call pinned to the flash backend; True if torch accepted it."""
    if device == "meta":
        return True
    q = torch.randn(1, 2, 8, 16, device=device, dtype=dtype)
    try:
        with warnings.catch_warnings(), sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            warnings.simplefilter("ignore")
            F.scaled_dot_product_attention(q, q, q, is_causal=True)
        return True
    except RuntimeError:
        return False


def flex_trainable(device: str, dtype: torch.dtype) -> bool:
    """Run a tiny flex_attention forward+backward; True if torch supports it on this device."""
    if device == "meta":
        return True
    q = torch.randn(1, 1, 16, 16, device=device, dtype=dtype, requires_grad=True)
    try:
        flex(q, q, q).sum().backward()
        return True
    except (NotImplementedError, RuntimeError):
        return False

"""Attention kernels: the same causal (optionally windowed, optionally biased) attention, four ways.

All take q (B, H, Tq, hd), k and v (B, Hkv, Tk, hd) with H % Hkv == 0; query i sits at absolute position
`q_offset + i`, key j at position j. A query sees keys at positions p with
`q_pos - window < p <= q_pos` (window None = all earlier positions). `bias` is an additive
(H, Tq, Tk) score bias (ALiBi) or None. Output: (B, H, Tq, hd).
"""

from __future__ import annotations

import math
import warnings
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from gptlab.errors import ConfigError

IMPLS = ("naive", "sdpa", "flash", "flex")


def allowed_mask(tq: int, tk: int, q_offset: int, window: int | None, device) -> torch.Tensor:
    """Boolean (Tq, Tk) mask, True where a query may attend to a key."""
    q_pos = torch.arange(q_offset, q_offset + tq, device=device)[:, None]
    k_pos = torch.arange(tk, device=device)[None, :]
    ok = k_pos <= q_pos
    if window is not None:
        ok = ok & (k_pos > q_pos - window)
    return ok


def naive(q, k, v, *, window=None, q_offset=0, bias=None, dropout_p=0.0):
    """Materialised reference: scores = Q·Kᵀ/√d, mask, softmax, ·V (writes the full Tq×Tk matrix)."""
    groups = q.size(1) // k.size(1)
    k = k.repeat_interleave(groups, dim=1)  # (B, H, Tk, hd)
    v = v.repeat_interleave(groups, dim=1)
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.size(-1)))  # (B, H, Tq, Tk)
    if bias is not None:
        scores = scores + bias
    mask = allowed_mask(q.size(2), k.size(2), q_offset, window, q.device)
    scores = scores.masked_fill(~mask, float("-inf"))
    probs = F.softmax(scores.float(), dim=-1).to(q.dtype)
    if dropout_p > 0.0:
        probs = F.dropout(probs, p=dropout_p)
    return probs @ v


def _sdpa_call(q, k, v, window, q_offset, bias, dropout_p):
    tq, tk = q.size(2), k.size(2)
    plain_causal = window is None and bias is None and q_offset == 0 and tq == tk
    if plain_causal:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout_p, enable_gqa=True)
    if window is None and bias is None and tq == 1 and q_offset == tk - 1:
        # one decode step sees the whole cache: no mask needed (keeps flash usable for decoding)
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, enable_gqa=True)
    mask = allowed_mask(tq, tk, q_offset, window, q.device)
    if bias is not None:
        # (1, H, Tq, Tk) float mask: 4-D keeps CPU SDPA on its fused kernel (3-D falls back to math)
        mask = bias.to(q.dtype).masked_fill(~mask, float("-inf"))[None]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, enable_gqa=True)


def sdpa(q, k, v, *, window=None, q_offset=0, bias=None, dropout_p=0.0):
    """torch SDPA, letting torch pick the backend; is_causal when no explicit mask is needed."""
    return _sdpa_call(q, k, v, window, q_offset, bias, dropout_p)


def flash(q, k, v, *, window=None, q_offset=0, bias=None, dropout_p=0.0):
    """SDPA pinned to the flash backend (build-time checks guarantee it is available)."""
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        return _sdpa_call(q, k, v, window, q_offset, bias, dropout_p)


@lru_cache(maxsize=32)
def _flex_block_mask(tq: int, tk: int, q_offset: int, window: int | None, device: str):
    from torch.nn.attention.flex_attention import create_block_mask

    def mask_mod(b, h, qi, kj):
        q_pos = qi + q_offset
        ok = kj <= q_pos
        if window is not None:
            ok = ok & (kj > q_pos - window)
        return ok

    return create_block_mask(mask_mod, None, None, tq, tk, device=device)


def flex(q, k, v, *, window=None, q_offset=0, bias=None, dropout_p=0.0):
    """flex_attention with a block mask built from the causal/window rule (never a dense mask tensor)."""
    from torch.nn.attention.flex_attention import flex_attention

    block_mask = _flex_block_mask(q.size(2), k.size(2), q_offset, window, str(q.device))
    score_mod = None
    if bias is not None:
        def score_mod(score, b, h, qi, kj):
            return score + bias[h, qi, kj]
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")
        return flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, enable_gqa=True)


KERNELS = {"naive": naive, "sdpa": sdpa, "flash": flash, "flex": flex}


def check_impl_name(impl: str) -> str:
    """The impl name, or a one-line ConfigError listing the allowed ones."""
    if impl not in KERNELS:
        raise ConfigError(f"attention.impl: unknown impl '{impl}'; allowed: {', '.join(IMPLS)}")
    return impl


def check_impl(impl: str, *, device: str, dtype: torch.dtype, window, uses_bias: bool, dropout: float,
               training: bool = True) -> None:
    """Fail at build time, in one line, when `impl` cannot run this attention on this device/dtype."""
    check_impl_name(impl)
    if impl == "flash":
        if window is not None or uses_bias:
            what = "a sliding window" if window is not None else "an ALiBi score bias"
            raise ConfigError(f"attention.impl=flash: the flash backend takes no mask, so it cannot run {what}; use attention.impl=flex or sdpa")
        if not flash_available(device, dtype):
            raise ConfigError(f"attention.impl=flash: the flash SDPA backend is not available on {device}/{str(dtype).replace('torch.', '')}; use attention.impl=sdpa")
    if impl == "flex" and dropout > 0:
        raise ConfigError("attention.impl=flex: flex_attention has no attention dropout; set attention.dropout=0 or use impl=sdpa")
    if impl == "flex" and training and not flex_trainable(device, dtype):
        raise ConfigError(f"attention.impl=flex: this torch has no flex_attention backward on {device}; train with attention.impl=sdpa (flex runs forward-only here)")


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

"""How many (query, key) score pairs an attention kernel touches: dense, block-skipping, or only the useful ones."""

from __future__ import annotations

from dataclasses import dataclass

# Tile edge (queries and keys) assumed for kernels that skip fully masked tiles: flex's default and a
# typical flash tile. Only the diagonal/window-edge tiles do wasted work, so the exact size matters little.
SKIP_BLOCK = 128


@dataclass(frozen=True)
class KernelTraits:
    """What an attention kernel does, for costing: memory traffic and which score tiles it computes."""

    materializes_scores: bool  # writes the Tq×Tk score matrix to memory and reads it back (naive)
    skips_masked_blocks: bool  # never computes key tiles that are fully masked (flash, flex on GPU)
    recomputes_scores: bool  # backward recomputes Q·Kᵀ instead of storing it (all fused kernels)


# Per `attention.impl`. "sdpa" is costed as dense: that is what the math/efficient backends and
# FlopCounterMode do (torch's CPU flash backend also skips tiles above the diagonal for is_causal,
# so on CPU its real work lies between "kernel" and "useful"). A kernel function may override this
# by carrying a `cost_traits` attribute, so a new impl needs no edit here.
KERNEL_TRAITS = {
    "naive": KernelTraits(materializes_scores=True, skips_masked_blocks=False, recomputes_scores=False),
    "sdpa": KernelTraits(materializes_scores=False, skips_masked_blocks=False, recomputes_scores=True),
    "flash": KernelTraits(materializes_scores=False, skips_masked_blocks=True, recomputes_scores=True),
    "flex": KernelTraits(materializes_scores=False, skips_masked_blocks=True, recomputes_scores=True),
}
DEFAULT_TRAITS = KERNEL_TRAITS["sdpa"]


def traits_for(attn) -> KernelTraits:
    """The kernel traits of an attention module: its kernel's `cost_traits`, else the table by `impl`."""
    own = getattr(getattr(attn, "kernel", None), "cost_traits", None)
    if isinstance(own, KernelTraits):
        return own
    return KERNEL_TRAITS.get(getattr(attn, "impl", "sdpa"), DEFAULT_TRAITS)


def prefix_useful(n: int, window: int | None) -> int:
    """Σ_{p=0}^{n-1} min(p+1, window): visible keys summed over the first n positions."""
    if window is None or n <= window:
        return n * (n + 1) // 2
    return window * (window + 1) // 2 + (n - window) * window


def useful_pairs(tq: int, tk: int, window: int | None) -> int:
    """Unmasked pairs when the tq queries are the last tq of tk positions (causal, optional window)."""
    offset = tk - tq
    return prefix_useful(tk, window) - prefix_useful(offset, window)


def dense_pairs(tq: int, tk: int) -> int:
    """Every pair: what a kernel that computes the whole Tq×Tk matrix and then masks it does."""
    return tq * tk


def blocked_pairs(tq: int, tk: int, window: int | None, block: int = SKIP_BLOCK) -> int:
    """Pairs computed by a kernel that skips (block × block) tiles with no visible key."""
    offset, total = tk - tq, 0
    for r0 in range(0, tq, block):
        r1 = min(r0 + block, tq)
        first_q, last_q = offset + r0, offset + r1 - 1  # absolute positions of this query tile
        lo = 0 if window is None else max(0, first_q - window + 1)
        hi = min(tk - 1, last_q)
        k0, k1 = (lo // block) * block, min(tk, (hi // block + 1) * block)
        total += (r1 - r0) * (k1 - k0)
    return total


@dataclass(frozen=True)
class Pairs:
    """Score pairs per (sequence, head) for one layer: what runs, the dense count, and the useful count."""

    kernel: int
    dense: int
    useful: int


def score_pairs(tq: int, tk: int, window: int | None, traits: KernelTraits) -> Pairs:
    """Pairs for one layer's attention given its window and kernel."""
    dense = dense_pairs(tq, tk)
    useful = useful_pairs(tq, tk, window)
    kernel = blocked_pairs(tq, tk, window) if traits.skips_masked_blocks else dense
    return Pairs(kernel=kernel, dense=dense, useful=useful)

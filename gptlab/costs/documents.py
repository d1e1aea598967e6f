"""What data.doc_mask does to attention's cost: keeping each query inside its own document, per kernel.

A window of T tokens that packs documents of L tokens has fewer useful (query, key) pairs than the causal window: the
causal sum of min(t, window) restarts at every document. A kernel that skips tiles with no visible pair (flex: its
block mask is built from the document ids; `KernelTraits.skips_masked_blocks`) computes fewer tiles, so its attention
FLOPs fall with the share of cross-document pairs; a kernel that computes every score and then masks (sdpa with its
dense (B, 1, T, T) mask, naive) computes as many as without the mask: it saves nothing.

MFU and the FLOPs per token keep their definition: the causal FLOPs of the unmasked model (what every run of a sweep
is costed at, masked or not, so equal-FLOPs readings line arms up on one axis). This section says what the mask saves
beside them; windows are averaged over where they start inside a document (up to OFFSETS evenly spaced starts).
"""

from __future__ import annotations

from gptlab.costs.scores import SKIP_BLOCK, blocked_pairs, prefix_useful, useful_pairs
from gptlab.costs.structure import ModelShape

OFFSETS = 64  # window starts inside a document averaged over (all of them for documents of up to OFFSETS tokens)


def _pieces(T: int, doc_len: int, offset: int) -> list[int]:
    """Lengths of the documents a window of T tokens holds when it starts `offset` tokens into one of doc_len."""
    first = min(T, doc_len - offset)
    rest, full = T - first, []
    full += [doc_len] * (rest // doc_len)
    return [first, *full, *([rest % doc_len] if rest % doc_len else [])]


def _useful(T: int, window: int | None, doc_len: int, offset: int) -> int:
    """Visible pairs of the window: causal (within `window`) and inside one document."""
    return sum(prefix_useful(n, window) for n in _pieces(T, doc_len, offset))


def _blocked(T: int, window: int | None, doc_len: int, offset: int, block: int) -> int:
    """Pairs a tile-skipping kernel computes: for each query tile, the key tiles from the first key its first query
    sees (its document's start, or the window's edge) to the tile's last query (every key between is visible to one
    of the tile's queries: documents are contiguous)."""
    total = 0
    for r0 in range(0, T, block):
        r1 = min(r0 + block, T)
        lo = max(0, r0 - (r0 + offset) % doc_len)  # where the first query's document starts in the window
        if window is not None:
            lo = max(lo, r0 - window + 1)
        k0, k1 = (lo // block) * block, min(T, ((r1 - 1) // block + 1) * block)
        total += (r1 - r0) * (k1 - k0)
    return total


def document_pairs(
    T: int, window: int | None, doc_len: int, skips_blocks: bool, block: int = SKIP_BLOCK
) -> tuple[float, float]:
    """(pairs the kernel computes, useful pairs) per (sequence, head) with the document mask, averaged over window
    starts inside a document; a dense kernel computes T² either way."""
    step = max(1, doc_len // OFFSETS)
    offsets = range(0, doc_len, step)
    useful = sum(_useful(T, window, doc_len, o) for o in offsets) / len(offsets)
    if not skips_blocks:
        return float(T * T), useful
    return sum(_blocked(T, window, doc_len, o, block) for o in offsets) / len(offsets), useful


def documents_cost(model: ModelShape, batch: int, seq_len: int, doc_len: int | None) -> dict:
    """The report's `documents` section: forward attention FLOPs (scores and A·V) of the step without and with the
    document mask at documents of `doc_len` tokens (None: unknown, the kernels' behaviour only)."""
    skips = [b.attn.traits.skips_masked_blocks for b in model.blocks]
    out: dict = {"doc_length": doc_len, "skips_masked_blocks": all(skips), "mfu_counts": "unmasked causal FLOPs"}
    if doc_len is None:
        return out
    kernel = kernel_doc = useful = useful_doc = 0.0
    for b, count in model.layers():
        a, T = b.attn, seq_len
        per_pair = batch * a.n_head * 4 * a.head_dim * count  # scores and A·V: 2·head_dim FLOPs each per pair
        unmasked = blocked_pairs(T, T, a.window) if a.traits.skips_masked_blocks else T * T
        masked, useful_masked = document_pairs(T, a.window, doc_len, a.traits.skips_masked_blocks)
        kernel, kernel_doc = kernel + per_pair * unmasked, kernel_doc + per_pair * masked
        useful, useful_doc = useful + per_pair * useful_pairs(T, T, a.window), useful_doc + per_pair * useful_masked
    return out | {
        "attention_kernel": kernel,
        "attention_kernel_documents": kernel_doc,
        "attention_useful": useful,
        "attention_useful_documents": useful_doc,
        "kernel_saved_share": 1 - kernel_doc / kernel if kernel else 0.0,
    }

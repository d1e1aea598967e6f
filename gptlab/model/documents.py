"""Packed documents (data.doc_mask=true): a window holds the end of one document and the start of the next, and
attention must not cross from one into the other.

GPT.forward(idx, targets, docs=ids) with document ids (B, T) (non-decreasing along T: position t belongs to document
ids[b, t]) hands its blocks a `Documents` in place of its Position. `Attention.attend` sees it and (1) gives the
position hooks each token's position within its own document, (B, T), so positions restart at every document for
every position scheme, and (2) hands it to the kernel, which keeps each query inside its document (block-causal).
The masks are built once per forward and shared by every layer (one per window size and kernel kind).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

import torch


def positions_in_documents(ids: torch.Tensor) -> torch.Tensor:
    """(B, T) document ids -> (B, T) each token's position within its document (0 at every document's first token;
    the document a window opens in counts from the window's start)."""
    t = torch.arange(ids.size(1), device=ids.device)  # (T,)
    first = torch.ones_like(ids, dtype=torch.bool)
    first[:, 1:] = ids[:, 1:] != ids[:, :-1]  # (B, T): a document starts here
    start = torch.where(first, t, 0).cummax(dim=1).values  # (B, T): where this token's document starts
    return t - start


class Documents:
    """A batch's packed documents, seen through the model's Position: ids (B, T), positions within each document
    (B, T), and the masks that keep every query inside its document (built on first use, then shared)."""

    def __init__(self, ids: torch.Tensor, position: Any):
        if ids.dim() != 2:
            raise ValueError(f"document ids must be (B, T); got shape {tuple(ids.shape)}")
        self.ids = ids  # (B, T)
        self.position = position  # the model's Position (gptlab.model.base), whose hooks get `pos`
        self.pos = positions_in_documents(ids)  # (B, T)
        self._built: dict[Hashable, Any] = {}

    @property
    def has_score_bias(self) -> bool:
        return bool(self.position.has_score_bias)

    def cached(self, key: Hashable, build: Callable[[], Any]) -> Any:
        """`build()` once per forward for `key` (a mask for one window size and kernel kind), then the same object."""
        if key not in self._built:
            self._built[key] = build()
        return self._built[key]

    def allowed(self, window: int | None) -> torch.Tensor:
        """Boolean (B, 1, T, T), True where a query may attend to a key: causal (within `window`) and same document."""
        return self.cached(("dense", window), lambda: self._allowed(window))

    def _allowed(self, window: int | None) -> torch.Tensor:
        t = torch.arange(self.ids.size(1), device=self.ids.device)
        ok = t[None, :] <= t[:, None]  # (T, T) causal
        if window is not None:
            ok = ok & (t[None, :] > t[:, None] - window)
        same = self.ids[:, :, None] == self.ids[:, None, :]  # (B, T, T)
        return (ok & same)[:, None]  # (B, 1, T, T)

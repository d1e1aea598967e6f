"""Deliberately broken components: each honours its base class but lets future tokens leak into the past."""

from __future__ import annotations

from gptlab.model.base import Position
from gptlab.model.mlp.gelu import GeluMLP


class LeakyMLP(GeluMLP):
    """The GELU MLP plus the mean over the sequence: output t sees tokens after t."""

    def forward(self, x):
        return super().forward(x) + x.mean(dim=1, keepdim=True)  # (B, 1, d) broadcast over T


class LeakyPosition(Position):
    """Adds the sequence mean of the token embeddings to every position."""

    def embed(self, x, pos):
        return x + x.mean(dim=1, keepdim=True)  # (B, T, d) + (B, 1, d)

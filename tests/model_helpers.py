"""Helpers shared by model tests: compose the real config, build a tiny model, glob the choices."""

from __future__ import annotations

from pathlib import Path

import torch

from gptlab.build import build_model, compose

CONF = Path(__file__).resolve().parents[1] / "conf"
TINY = ["~data", "model.n_layer=2", "model.n_head=4", "model.d_model=32", "model.block_size=32"]
VOCAB = 61


def choices(group: str) -> list[str]:
    """Every option of a config group, found by globbing conf/<group>/*.yaml."""
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def tiny_model(*overrides: str, seed: int = 0, vocab: int = VOCAB):
    """A 2-layer d_model-32 GPT for the given overrides, deterministic weights per seed."""
    cfg = compose([*TINY, *overrides])
    torch.manual_seed(seed)
    return build_model(cfg, vocab_size=vocab).eval()


def tokens(B: int = 2, T: int = 24, vocab: int = VOCAB, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (B, T), generator=g)

"""Helpers shared by model tests: compose the real config, build a tiny model, glob the choices."""

from __future__ import annotations

import torch

from gptlab.config.build import build_model, compose
from helpers.paths import CONF_DIR

TINY = ["~data", "model.n_layer=2", "model.n_head=4", "model.d_model=32", "model.block_size=32"]
VOCAB = 61


def choices(group: str) -> list[str]:
    """Every option of a config group, found by globbing conf/<group>/*.yaml."""
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def tiny_model(*overrides: str, seed: int = 0, vocab: int = VOCAB):
    """A 2-layer d_model-32 GPT for the given overrides, deterministic weights per seed."""
    cfg = compose([*TINY, *overrides])
    torch.manual_seed(seed)
    return build_model(cfg, vocab_size=vocab).eval()


def tokens(B: int = 2, T: int = 24, vocab: int = VOCAB, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (B, T), generator=g)


def least_disturbed_profile(profile, attempts: int = 3, coverage: float = 0.9):
    """Call profile() (-> ProfileResult) until its labelled regions cover `coverage` of the measured step.

    Regions are timed inside the step with the same clock, so attributed_s <= step_s always (asserted here);
    a busy machine can only pre-empt the process in the gaps between regions and lower the coverage, never
    raise it. Best of a few attempts is the measurement a quiet machine would give (one-sided noise).
    """
    best = None
    for _ in range(attempts):
        result = profile()
        assert result.attributed_s <= result.step_s * (1 + 1e-9), (result.attributed_s, result.step_s)
        if best is None or result.attributed_s / result.step_s > best.attributed_s / best.step_s:
            best = result
        if best.attributed_s >= coverage * best.step_s:
            break
    return best
